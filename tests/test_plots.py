"""Figures: one curve figure per task and a reach heat map, each as PNG and SVG."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from lengthbench.leaderboard import build_leaderboard, load_store
from lengthbench.plots import plot_all
from lengthbench.store import CONTRACT_COLUMNS, write_run


def synthetic_run(results, task, attn, pe, seed, curve, metric="exact_match"):
    run_id = f"{task}-{attn}-{pe}-smoke-s{seed}-synthetic"
    rows = []
    for multiplier, score in curve.items():
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=run_id, task=task, attn=attn, pe=pe, seed=seed, preset="smoke", train_length=64,
                   eval_length=64 * multiplier, multiplier=multiplier, exact_match=score, token_accuracy=score,
                   created_at="2026-01-01T00:00:00+00:00", metric=metric, score=score,
                   config_json=json.dumps({"task": task}))
        rows.append(row)
    write_run(results, run_id, rows)


@pytest.fixture
def store(tmp_path):
    results = tmp_path / "store"
    for attn in ("softmax", "entmax"):
        for pe in ("rope", "nape"):
            for seed in (0, 1):
                good = 0.99 if pe == "nape" else 0.3
                synthetic_run(results, "copy", attn, pe, seed, {1: 1.0, 2: good, 4: good / 2 + 0.01 * seed})
    synthetic_run(results, "2back", "softmax", "nape", 0, {1: 0.97, 2: 0.95}, metric="token_accuracy")
    return results


def test_plot_all_writes_png_and_svg_per_task_and_a_heat_map(store, tmp_path):
    paths = plot_all(build_leaderboard(load_store(store)[0]), tmp_path / "figures")
    names = sorted(p.name for p in paths)
    assert names == sorted(f"{stem}.{ext}" for stem in ("curves_copy", "curves_2back", "reach_heatmap")
                           for ext in ("png", "svg"))
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000
        assert data.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in data[:2000]
    svg = (tmp_path / "figures" / "curves_copy.svg").read_text()
    assert "exact match" in svg or "exact" in svg  # the axis names the metric


def test_plot_cli_and_its_bad_input(store, tmp_path, monkeypatch, capsys):
    from lengthbench.cli import main

    def cli(*args) -> int:
        monkeypatch.setattr(sys, "argv", ["lengthbench", *map(str, args)])
        try:
            main()
        except SystemExit as exit_:
            return int(exit_.code or 0)
        return 0

    assert cli("plot", "--results", store, "--out", tmp_path / "out", "--task", "copy") == 0
    assert (tmp_path / "out" / "curves_copy.png").exists() and not (tmp_path / "out" / "curves_2back.png").exists()
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    assert cli("plot", "--results", tmp_path / "empty", "--out", tmp_path / "out2") == 2
    assert cli("plot", "--results", tmp_path / "nowhere", "--out", tmp_path / "out2") == 2
    (store / "runs" / "bad.parquet").write_bytes(b"not parquet")
    before = hashlib.sha256((store / "runs" / "bad.parquet").read_bytes()).hexdigest()
    assert cli("plot", "--results", store, "--out", tmp_path / "out2") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "bad.parquet" in err
    assert hashlib.sha256((store / "runs" / "bad.parquet").read_bytes()).hexdigest() == before
    assert not (tmp_path / "out2").exists()


def test_the_same_board_gives_byte_identical_figures(store, tmp_path):
    """Regenerating the published figures changes no file unless a curve changed (SVG ids were random)."""
    board = build_leaderboard(load_store(store)[0])
    first = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in plot_all(board, tmp_path / "a")}
    second = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in plot_all(board, tmp_path / "b")}
    assert first == second


def test_plot_removes_the_figures_of_tasks_the_board_no_longer_has(store, tmp_path, monkeypatch, capsys):
    """A task whose runs leave the store loses its figures at the next full plot, so none stays behind looking
    current; a plot of some tasks only removes nothing, and the user's own files stay."""
    from cli_helpers import cli

    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "notes.png").write_bytes(b"the user's own file")
    assert cli(monkeypatch, "plot", "--results", store, "--out", figures) == 0
    assert (figures / "curves_2back.png").exists()
    for path in (store / "runs").glob("2back-*.parquet"):
        path.unlink()
    capsys.readouterr()
    assert cli(monkeypatch, "plot", "--results", store, "--out", figures, "--task", "copy") == 0
    assert (figures / "curves_2back.png").exists()
    assert cli(monkeypatch, "plot", "--results", store, "--out", figures) == 0
    names = {p.name for p in figures.iterdir()}
    assert "curves_2back.png" not in names and "curves_2back.svg" not in names
    assert "curves_copy.png" in names and "reach_heatmap.svg" in names
    assert (figures / "notes.png").read_bytes() == b"the user's own file"
    assert "removed" in capsys.readouterr().err


def test_a_task_with_several_protocols_gets_one_figure_of_its_best_rows(store, tmp_path):
    """A second protocol of copy adds no figure: each mechanism x encoding keeps its furthest-reaching row."""
    import pandas as pd

    from lengthbench.plots import best_rows

    path = next((store / "runs").glob("copy-softmax-rope-smoke-s0-*.parquet"))
    frame = pd.read_parquet(path).assign(preset="quick", run_id="copy-softmax-rope-quick-s0-synthetic",
                                         exact_match=1.0, score=1.0)
    write_run(store, "copy-softmax-rope-quick-s0-synthetic", frame.to_dict("records"))
    board = build_leaderboard(load_store(store)[0])
    rows = best_rows(board)
    softmax_rope = rows[(rows.task == "copy") & (rows.attn == "softmax") & (rows.pe == "rope")]
    assert len(softmax_rope) == 1 and softmax_rope.iloc[0]["preset"] == "quick" and softmax_rope.iloc[0]["reach"] == 4
    names = sorted(p.name for p in plot_all(board, tmp_path / "figures"))
    assert names == sorted(f"{stem}.{ext}" for stem in ("curves_copy", "curves_2back", "reach_heatmap")
                           for ext in ("png", "svg"))


def test_a_named_variant_of_a_task_is_not_the_task():
    """MQRAR's inline layout is another task: its rows stay out of MQRAR's figure, a curriculum's stages do not."""
    from lengthbench.plots import _task_variant

    assert _task_variant("1.28M samples, batch 128, lr 0.0003, layout=inline, selection at 8x")
    assert not _task_variant("0.64M samples, batch 128, lr 0.001, after mqrar (layout=inline) at n 16, 0.96M samples")
    assert not _task_variant("4M samples, batch 512, lr 0.001") and not _task_variant("")


def test_a_long_title_is_wrapped_and_keeps_every_word():
    """A long label on one line squeezes the axes of the saved figure to a sliver."""
    from lengthbench.plots import TITLE_WIDTH, wrap_title

    stages = " -> ".join(f"mqrar (layout=inline) at n 16, 0.96M samples, warm-up 2,000 steps, init torch {i}"
                         for i in range(4))
    title = f"mqrar (paper, 0.64M samples, model 3 x d 256, after {stages}, n=64): exact match against length"
    wrapped = wrap_title(title)
    lines = wrapped.split("\n")
    assert len(lines) > 1 and all(len(line) <= TITLE_WIDTH for line in lines)
    assert wrapped.split() == title.split()
    assert wrap_title("copy: exact match against length") == "copy: exact match against length"
