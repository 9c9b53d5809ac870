"""Figures: one curve figure per task and a reach heat map, each as PNG and SVG."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pandas as pd
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


# -- a figure per paper table --------------------------------------------------------------------------------------

TABLE = """# A test table, Table 9: copy (the title of its figure).
cells = ["copy:softmax:rope", "copy:entmax(alpha=2):nape", "copy:ssmax:nape", "copy:ssmax(s_init=0.5):nape"]
seeds = [0]
preset = "smoke"

[overrides]
train_samples = 640
eval_samples = 8
max_multiplier = 4
"""


def _config_store(tmp_path):
    """A config's four cells (softmax + rope twice, two seeds) and one run of another protocol that is better."""
    from lengthbench.protocols import config_cells

    path = tmp_path / "table9.toml"
    path.write_text(TABLE)
    store = tmp_path / "table_store"
    cells, _ = config_cells(path, [0, 1])
    curves = {1: 1.0, 2: 0.5, 4: 0.25}
    for config in cells:
        _write_config_run(store, config, curves)
    off = next(c for c in cells if c.attn == "softmax").__class__.from_dict(
        {**json.loads(cells[0].to_json()), "train_samples": 1280})
    _write_config_run(store, off, {1: 1.0, 2: 1.0, 4: 1.0})
    return path, store, cells, off


def _write_config_run(store, config, curve):
    rows = []
    for multiplier, score in curve.items():
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=config.run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
                   preset=config.preset, train_length=64, eval_length=64 * multiplier, multiplier=multiplier,
                   exact_match=score, token_accuracy=score, created_at="2026-01-01T00:00:00+00:00",
                   metric="exact_match", score=score, config_json=config.to_json())
        rows.append(row)
    write_run(store, config.run_id, rows)


def test_a_config_figure_draws_its_protocols_rows_only(tmp_path):
    from lengthbench.plots import config_board, config_title, plot_configs

    path, store, cells, off = _config_store(tmp_path)
    frame = load_store(store)[0]
    board = config_board(frame, path)
    assert set(board["best_run_id"]) <= {c.run_id for c in cells} and off.run_id not in set(board["best_run_id"])
    assert len(board) == 4 and set(board["seeds"]) == {2}
    names = sorted(p.name for p in plot_configs(frame, [path], tmp_path / "figures"))
    assert names == ["reach_heatmap.png", "reach_heatmap.svg", "table9.png", "table9.svg"]
    assert config_title(path) == "A test table, Table 9"
    svg = (tmp_path / "figures" / "table9.svg").read_text()
    assert "A test table, Table 9" in svg and "alpha" not in svg  # names only in the legend


def test_equal_curves_stay_apart_with_a_colour_per_mechanism_and_a_style_per_encoding(tmp_path):
    import matplotlib.pyplot as plt

    from lengthbench.plots import config_board, draw_table, mechanism_colours

    path, store, _, _ = _config_store(tmp_path)
    board = config_board(load_store(store)[0], path)
    fig, ax = plt.subplots()
    draw_table(ax, board, "title", mechanism_colours(["softmax", "entmax", "ssmax"]))
    lines = {text.get_text(): line for text, line in zip(ax.get_legend().get_texts(), ax.get_lines(), strict=False)}
    plt.close(fig)
    assert sorted(lines) == ["entmax + nape (best of 2)", "softmax + rope (best of 2)",
                             "ssmax (s_init=0.5) + nape (best of 2)", "ssmax + nape (best of 2)"]
    curves = list(lines.values())
    # the four curves are equal: each is drawn a little apart, with its own marker
    assert all(np.allclose(line.get_ydata(), [100, 50, 25]) for line in curves)
    assert len({tuple(np.round(line.get_xdata(), 6)) for line in curves}) == 4
    assert len({line.get_marker() for line in curves}) == 4
    colour = {label: line.get_color() for label, line in lines.items()}
    assert colour["ssmax + nape (best of 2)"] == colour["ssmax (s_init=0.5) + nape (best of 2)"]
    assert len({colour[k] for k in ("entmax + nape (best of 2)", "softmax + rope (best of 2)",
                                    "ssmax + nape (best of 2)")}) == 3
    style = {label: line.get_linestyle() for label, line in lines.items()}
    assert style["entmax + nape (best of 2)"] == style["ssmax + nape (best of 2)"] != style["softmax + rope (best of 2)"]


def test_legends_name_parameters_only_to_tell_twins_apart():
    from lengthbench.plots import legend_labels

    rows = pd.DataFrame({"attn": ["ssmax (log_offset=0, s_init=0.43)", "ssmax (log_offset=0, s_init=1.0)",
                                  "entmax (alpha=4)", "softmax"],
                         "pe": ["nape", "nape", "none", "rope (factor=1)"]})
    assert legend_labels(rows) == ["ssmax (s_init=0.43) + nape", "ssmax (s_init=1.0) + nape", "entmax + none",
                                   "softmax + rope"]


def test_a_mechanism_keeps_its_colour_from_figure_to_figure():
    from lengthbench.plots import PALETTE, mechanism_colours

    one, other = mechanism_colours(["softmax", "entmax"]), mechanism_colours(["entmax", "sieve", "softmax"])
    assert one["softmax"] == other["softmax"] and one["entmax"] == other["entmax"]
    many = mechanism_colours(["softmax", "ssmax", "entmax", "asentmax", "sieve", "stickbreaking", "tda", "tra",
                              "softpick", "adatemp"])
    assert len(set(many.values())) == 10 and set(many.values()) <= set(PALETTE)


def test_plot_cli_takes_configs(store, tmp_path, monkeypatch, capsys):
    from cli_helpers import cli

    path, config_store, _, _ = _config_store(tmp_path)
    assert cli(monkeypatch, "plot", "--results", config_store, "--out", tmp_path / "a", "--config", path) == 0
    assert sorted(p.name for p in (tmp_path / "a").glob("*.png")) == ["reach_heatmap.png", "table9.png"]
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "table9.toml").write_text(TABLE)
    monkeypatch.chdir(tmp_path)  # configs/ of the working folder is the default
    assert cli(monkeypatch, "plot", "--results", config_store, "--out", tmp_path / "b") == 0
    assert sorted(p.name for p in (tmp_path / "b").glob("*.png")) == ["reach_heatmap.png", "table9.png"]
    # a store without the config's runs: a figure per task, and a line saying why
    assert cli(monkeypatch, "plot", "--results", store, "--out", tmp_path / "c") == 0
    assert "no run here carries out a config of configs/" in capsys.readouterr().err
    assert (tmp_path / "c" / "curves_copy.png").exists()
    assert cli(monkeypatch, "plot", "--results", store, "--out", tmp_path / "d", "--config", path) == 2
    err = capsys.readouterr().err
    assert "no run in" in err and len(err.strip().splitlines()) == 1
    assert cli(monkeypatch, "plot", "--results", store, "--out", tmp_path / "d", "--config", "nowhere.toml") == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_a_curve_carries_its_wilson_interval_at_each_length():
    """The best run's 95% Wilson interval over the samples scored: a vertical bar at each length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lengthbench.leaderboard import wilson
    from lengthbench.plots import draw_table

    rows = []
    for multiplier, score in ((1, 1.0), (2, 0.5)):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id="r", task="copy", attn="softmax", pe="rope", seed=0, preset="quick", train_length=64,
                   eval_length=64 * multiplier, multiplier=multiplier, exact_match=score, n_samples=200,
                   metric="exact_match", score=score, created_at="2026-12-06T00:00:00+00:00")
        rows.append(row)
    board = build_leaderboard(pd.DataFrame(rows))
    fig, ax = plt.subplots()
    draw_table(ax, board, "copy", {"softmax": "C0"})
    segments = [seg for collection in ax.collections for seg in collection.get_segments()]
    plt.close(fig)
    spans = sorted((round(seg[0][1], 6), round(seg[1][1], 6)) for seg in segments)
    expected = sorted((round(100 * wilson(score, 200)[0], 6), round(100 * wilson(score, 200)[1], 6))
                      for score in (1.0, 0.5))
    assert spans == expected
