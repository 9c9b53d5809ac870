"""The leaderboard: summaries, best-of-seeds, formats, and bad stores (never modified)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import zlib

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthbench.leaderboard import auc, build_leaderboard, load_store, reach, to_markdown
from lengthbench.store import CONTRACT_COLUMNS, write_run


def synthetic_run(results, task, attn, pe, seed, curve, *, preset="smoke", metric="exact_match", config=None):
    """Write one run's rows, as the runner would, with the scores of ``curve`` ({multiplier: fraction})."""
    config = {"task": task, **(config or {})}
    run_id = f"{task}-{attn}-{pe}-{preset}-s{seed}-synthetic{zlib.crc32(json.dumps(config, sort_keys=True).encode()) % 997}"
    rows = []
    for multiplier, score in curve.items():
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=run_id, task=task, attn=attn, pe=pe, seed=seed, preset=preset, train_length=64,
                   eval_length=64 * multiplier, multiplier=multiplier, exact_match=score, token_accuracy=score,
                   n_samples=16, realised_tokens=64 * multiplier, selection="id", train_steps=1,
                   train_seconds=0.0, eval_seconds=0.0, device="cpu", lengthbench_version="0", git_sha="x",
                   created_at="2026-01-01T00:00:00+00:00", sparsity=float("nan"), sink_rate=float("nan"),
                   entropy=float("nan"), metric=metric, score=score, config_json=json.dumps(config))
        rows.append(row)
    return write_run(results, run_id, rows)


def cli(monkeypatch, *args: str) -> int:
    """Run ``lengthbench ARGS`` in this process; its exit code."""
    from lengthbench.cli import main

    monkeypatch.setattr(sys, "argv", ["lengthbench", *map(str, args)])
    try:
        main()
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


@pytest.fixture
def store(tmp_path):
    results = tmp_path / "store"
    decay = {0: [1.0, 0.95, 0.5, 0.1], 1: [1.0, 1.0, 0.92, 0.3], 2: [0.9, 0.2, 0.0, 0.0]}
    for seed, values in decay.items():
        synthetic_run(results, "copy", "softmax", "nape", seed, dict(zip([1, 2, 4, 8], values, strict=True)))
    synthetic_run(results, "copy", "softmax", "rope", 0, {1: 1.0, 2: 0.03, 4: 0.0, 8: 0.0})
    synthetic_run(results, "2back", "softmax", "nape", 0, {1: 0.99, 2: 0.98}, metric="token_accuracy")
    return results


def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_reach_and_auc():
    curve = pd.Series({1: 1.0, 2: 0.95, 4: 0.5, 8: 0.95})
    assert reach(curve) == 8  # the largest multiplier at >= 90%, as documented (not the first drop)
    assert reach(pd.Series({1: 0.89, 2: 0.1})) == 0
    assert auc(pd.Series({1: 1.0, 2: 1.0, 4: 1.0})) == pytest.approx(1.0)
    assert auc(pd.Series({1: 1.0, 2: 0.0})) == pytest.approx(0.5)
    assert auc(pd.Series({1: 0.7})) == pytest.approx(0.7)
    # Trapezoids over log2: (1+0)/2 over [0,1], 0 over [1,2] -> 0.5 / 2.
    assert auc(pd.Series({1: 1.0, 2: 0.0, 4: 0.0})) == pytest.approx(0.25)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=11))
def test_auc_is_a_normalised_area(scores):
    curve = pd.Series({2**k: s for k, s in enumerate(scores)})
    assert min(scores) - 1e-12 <= auc(curve) <= max(scores) + 1e-12


def test_best_of_seeds_is_one_whole_run_and_mean_std_are_over_seeds(store):
    frame, notes = load_store(store)
    assert notes == []
    board = build_leaderboard(frame)
    row = board[(board.task == "copy") & (board.pe == "nape")].iloc[0]
    assert row["seeds"] == 3 and row["best_seed"] == 1  # seed 1 has the largest AUC
    assert [row[f"{m}x"] for m in (1, 2, 4, 8)] == pytest.approx([100, 100, 92, 30])
    assert row["reach"] == 4
    assert row["1x_mean"] == pytest.approx(100 * (1.0 + 1.0 + 0.9) / 3)
    assert row["2x_std"] == pytest.approx(100 * pd.Series([0.95, 1.0, 0.2]).std(ddof=1))
    one_seed = board[(board.task == "copy") & (board.pe == "rope")].iloc[0]
    assert one_seed["seeds"] == 1 and pd.isna(one_seed["1x_std"]) and one_seed["reach"] == 1


def test_markdown_has_the_papers_layout(store):
    board = build_leaderboard(load_store(store)[0])
    text = to_markdown(board)
    assert "## copy" in text and "## 2back" in text
    assert "| pe | attn | 1× | 2× | 4× | 8× | reach | AUC | seeds |" in text
    from lengthbench.leaderboard import wilson

    def shown(score, bold=False):  # best of seeds with its 95% Wilson interval over the 16 samples scored
        low, high = wilson(score, 16)
        text = f"{100 * score:.1f} ({100 * low:.1f}–{100 * high:.1f})"
        return f"**{text}**" if bold else text

    assert (f"| nape | softmax | {shown(1.0, True)} | {shown(1.0, True)} | {shown(0.92, True)} | "
            f"{shown(0.3, True)} | 4× |") in text
    assert "token accuracy (%)" in text  # 2back reports its own metric
    assert f"| nape | softmax | {shown(0.99)} | {shown(0.98)} | 2× |" in text  # 2back has 1x and 2x columns only


def test_presets_never_share_a_table(tmp_path):
    results = tmp_path / "store"
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5}, preset="smoke")
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 1.0, 2: 1.0}, preset="quick")
    board = build_leaderboard(load_store(results)[0])
    assert sorted(board["preset"]) == ["quick", "smoke"]
    assert to_markdown(board).count("## copy") == 2


def test_training_protocols_never_share_a_table(tmp_path):
    from lengthbench.plots import best_rows, plot_curves

    results = tmp_path / "store"
    short = {"train_samples": 1_000_000, "batch_size": 256, "lr": 1e-3}
    long = {"train_samples": 8_000_000, "batch_size": 512, "lr": 1e-3}
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 0.2, 2: 0.0}, preset="quick", config=short)
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.9}, preset="quick", config=long)
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.8}, preset="quick",
                  config={**long, "task_params": {"symbols": 8}})
    board = build_leaderboard(load_store(results)[0])
    assert sorted(board["protocol"]) == ["1M samples, batch 256, lr 0.001", "8M samples, batch 512, lr 0.001",
                                         "8M samples, batch 512, lr 0.001, symbols=8"]
    text = to_markdown(board)
    assert text.count("## copy") == 3 and "preset `quick` (8M samples, batch 512, lr 0.001)" in text
    # the figure is one per task: each mechanism x encoding's furthest-reaching row of the task itself (the
    # `symbols=8` variant is another task)
    names = sorted(p.name for p in plot_curves(board, tmp_path / "plots") if p.suffix == ".png")
    assert names == ["curves_copy.png"]
    assert best_rows(board)["protocol"].tolist() == ["8M samples, batch 512, lr 0.001"]


def test_cli_formats_and_publish(store, tmp_path, monkeypatch, capsys):
    assert cli(monkeypatch, "leaderboard", "--results", store, "--task", "copy", "--all") == 0
    printed = capsys.readouterr().out
    assert "## copy" in printed and "## 2back" not in printed
    assert cli(monkeypatch, "leaderboard", "--results", store, "--format", "csv", "--out", tmp_path / "b.csv", "--all") == 0
    assert len(pd.read_csv(tmp_path / "b.csv")) == 3
    assert cli(monkeypatch, "leaderboard", "--results", store, "--format", "parquet", "--out", tmp_path / "b.pq", "--all") == 0
    assert set(pd.read_parquet(tmp_path / "b.pq")["task"]) == {"copy", "2back"}
    assert cli(monkeypatch, "leaderboard", "--results", store, "--publish", tmp_path / "pub", "--all") == 0
    assert (tmp_path / "pub" / "leaderboard.md").read_text().startswith("# lengthbench leaderboard")
    assert len(pd.read_parquet(tmp_path / "pub" / "leaderboard.parquet")) == 3


@pytest.mark.parametrize("args, message", [
    (["--results", "{missing}"], "does not exist"),
    (["--results", "{empty}"], "the store is empty"),
    (["--results", "{store}", "--task", "nosuchtask"], "no runs of task 'nosuchtask'"),
    (["--results", "{store}", "--format", "html"], "unknown format 'html'"),
    (["--results", "{store}", "--format", "parquet"], "needs --out"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message, store, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "store": store}
    before = digest(store)
    code = cli(monkeypatch, "leaderboard", *[a.format(**paths) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert digest(store) == before


def test_empty_store_publishes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    assert cli(monkeypatch, "leaderboard", "--results", tmp_path / "empty", "--publish", tmp_path / "pub") == 2
    assert "empty" in capsys.readouterr().err
    assert not (tmp_path / "pub").exists()


def test_corrupt_file_is_reported_and_left_byte_identical(store, tmp_path, monkeypatch, capsys):
    corrupt = store / "runs" / "broken.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    before = digest(store)
    assert cli(monkeypatch, "leaderboard", "--results", store) == 2
    err = capsys.readouterr().err
    assert "broken.parquet" in err and "Traceback" not in err
    assert digest(store) == before
    # Asked to, it leaves the file out with a warning and goes on, still touching nothing.
    assert cli(monkeypatch, "leaderboard", "--results", store, "--skip-unreadable", "--all") == 0
    captured = capsys.readouterr()
    assert "## copy" in captured.out and "broken.parquet" in captured.err
    assert digest(store) == before


def test_a_non_default_init_is_part_of_the_protocol():
    from lengthbench.leaderboard import protocol_label

    budget = {"train_samples": 4_000_000, "batch_size": 512, "lr": 1e-3}
    assert protocol_label(json.dumps(budget)) == "4M samples, batch 512, lr 0.001"  # stored before the field
    assert protocol_label(json.dumps({**budget, "init": "normal-0.02"})) == "4M samples, batch 512, lr 0.001"
    assert protocol_label(json.dumps({**budget, "init": "torch"})) == "4M samples, batch 512, lr 0.001, init torch"


def test_selection_and_block_layout_are_part_of_the_protocol(tmp_path):
    """A run selected at 8x (the papers' rule) or built with the Gemma 2 layout is not another seed of the default
    protocol's cell: each gets a table of its own, and rows stored before the fields keep theirs."""
    from lengthbench.leaderboard import protocol_label

    budget = {"train_samples": 2_000_000, "batch_size": 256, "lr": 1e-3}
    assert protocol_label(json.dumps(budget)) == "2M samples, batch 256, lr 0.001"
    assert protocol_label(json.dumps({**budget, "selection": "id", "arch": "prenorm"})) == \
        "2M samples, batch 256, lr 0.001"
    assert protocol_label(json.dumps({**budget, "selection": "8x", "arch": "gemma2"})) == \
        "2M samples, batch 256, lr 0.001, selection at 8x, arch gemma2"
    assert protocol_label(json.dumps({**budget, "selection": "2x", "selection_metric": "bleu"})) == \
        "2M samples, batch 256, lr 0.001, selection at 2x by bleu"
    assert protocol_label(json.dumps({**budget, "selection": "4x", "selection_metric": "task"})) == \
        "2M samples, batch 256, lr 0.001, selection at 4x"
    assert protocol_label(json.dumps({**budget, "selection_metric": "token_accuracy"})) == \
        "2M samples, batch 256, lr 0.001, selection by token accuracy"
    results = tmp_path / "store"
    synthetic_run(results, "flipflop-sparse", "softmax", "rope", 0, {1: 1.0, 2: 0.78}, preset="quick", config=budget)
    synthetic_run(results, "flipflop-sparse", "softmax", "rope", 0, {1: 1.0, 2: 0.9}, preset="quick",
                  config={**budget, "selection": "8x"})
    board = build_leaderboard(load_store(results)[0])
    assert sorted(board["protocol"]) == ["2M samples, batch 256, lr 0.001",
                                         "2M samples, batch 256, lr 0.001, selection at 8x"]
    assert to_markdown(board).count("## flipflop-sparse") == 2


def test_runs_with_mechanism_or_encoding_parameters_are_rows_of_their_own(tmp_path):
    """Max Retrieval's entmax at alpha 1.5 and 4 (Sparse Attention, Table 5) are two rows, not one best-of pick."""
    from lengthbench.plots import plot_curves

    results = tmp_path / "store"
    budget = {"train_samples": 2_000_000, "batch_size": 256, "lr": 1e-3}
    synthetic_run(results, "maxretrieval", "entmax", "none", 0, {1: 0.99, 2: 0.9}, preset="quick", config=budget)
    synthetic_run(results, "maxretrieval", "entmax", "none", 0, {1: 0.99, 2: 0.95}, preset="quick",
                  config={**budget, "attn_params": {"alpha": 4.0}})
    synthetic_run(results, "maxretrieval", "entmax", "rope", 0, {1: 0.5, 2: 0.1}, preset="quick",
                  config={**budget, "attn_params": {"alpha": 16}, "pe_params": {"factor": 1.0}})
    board = build_leaderboard(load_store(results)[0])
    assert sorted(zip(board["pe"], board["attn"], strict=True)) == [
        ("none", "entmax"), ("none", "entmax (alpha=4)"), ("rope (factor=1)", "entmax (alpha=16)")]
    assert board.set_index("attn").loc["entmax (alpha=4)", "2x"] == pytest.approx(95.0)
    text = to_markdown(board)
    assert "| none | entmax (alpha=4) | **99.0" in text and "| **95.0" in text.split("entmax (alpha=4) |")[1]
    assert len([p for p in plot_curves(board, tmp_path / "plots") if p.suffix == ".png"]) == 1


def test_a_model_other_than_the_presets_is_part_of_the_protocol():
    """An MQRAR run with the sparse-attention paper's MQMTAR model (4 x d 512): not the same table as the papers' model."""
    from lengthbench.config import build_config
    from lengthbench.leaderboard import protocol_label

    usual = build_config("mqrar", "softmax", "rope", "paper", train_samples=2_000_000)
    assert protocol_label(usual.to_json()) == "2M samples, batch 128, lr 0.001"
    bigger = build_config("mqrar", "softmax", "rope", "paper", train_samples=2_000_000, d_model=512, n_layers=4,
                          ffn=1024)
    assert protocol_label(bigger.to_json()) == (
        "2M samples, batch 128, lr 0.001, model 4 x d 512, 16 heads, FFN 1024")
    # a mechanism this version does not know: the budget alone, no error
    assert protocol_label(json.dumps({**json.loads(bigger.to_json()), "attn": "plugin-attn"})) == "2M samples, batch 128, lr 0.001"


def test_a_warmup_other_than_the_presets_is_part_of_the_protocol():
    """Curriculum stages that took 1,000 warm-up steps on the `paper` preset (10,000): another table."""
    from lengthbench.config import build_config
    from lengthbench.leaderboard import protocol_label

    usual = build_config("mqmtar", "softmax", "rope", "paper", train_samples=1_280_000)
    assert protocol_label(usual.to_json()) == "1.28M samples, batch 128, lr 0.001"
    short = build_config("mqmtar", "softmax", "rope", "paper", train_samples=1_280_000, warmup_steps=1000)
    assert protocol_label(short.to_json()) == "1.28M samples, batch 128, lr 0.001, warm-up 1,000 steps"
    quick = build_config("copy", "softmax", "nape", "quick", train_samples=4_000_000, batch_size=512)
    assert protocol_label(quick.to_json()) == "4M samples, batch 512, lr 0.001"  # its 5% of the steps
    assert protocol_label(build_config("copy", "softmax", "nape", "quick", warmup_steps=7).to_json()).endswith(
        ", warm-up 7 steps")


def test_a_scoring_count_other_than_the_presets_is_a_table_of_its_own(tmp_path):
    """Three `paper` cells scored on the papers' 1,000 samples per length; runs of the same
    cells and seeds had 200. One table would keep, per seed, whichever scoring had the larger AUC."""
    from lengthbench.config import build_config
    from lengthbench.leaderboard import protocol_label

    paper = build_config("mqrar", "stickbreaking", "none", "paper", train_samples=640_000)
    assert protocol_label(paper.to_json()) == "0.64M samples, batch 128, lr 0.001"  # its 1,000
    fewer = build_config("mqrar", "stickbreaking", "none", "paper", train_samples=640_000, eval_samples=200)
    assert protocol_label(fewer.to_json()) == "0.64M samples, batch 128, lr 0.001, scored on 200 samples per length"
    assert protocol_label(build_config("copy", "softmax", "nape", "quick", eval_samples=100).to_json()).endswith(
        ", scored on 100 samples per length")
    assert protocol_label(build_config("copy", "softmax", "nape", "quick").to_json()) == "2M samples, batch 256, lr 0.001"
    # a rescored run names its count once, as rescored
    rescored = {**json.loads(fewer.to_json()), "rescored_from": "x", "eval_samples": 1000}
    assert protocol_label(json.dumps(rescored)).endswith("lr 0.001, rescored on 1,000 samples per length")

    results = tmp_path / "store"
    budget = {"train_samples": 640_000, "batch_size": 128, "lr": 1e-3, "preset": "paper"}
    synthetic_run(results, "mqrar", "stickbreaking", "none", 5, {1: 1.0, 2: 1.0}, preset="paper",
                  config={**budget, "eval_samples": 200})
    synthetic_run(results, "mqrar", "stickbreaking", "none", 5, {1: 1.0, 2: 0.99}, preset="paper",
                  config={**budget, "eval_samples": 1000})
    board = build_leaderboard(load_store(results)[0])
    assert sorted(board["protocol"]) == ["0.64M samples, batch 128, lr 0.001",
                                         "0.64M samples, batch 128, lr 0.001, scored on 200 samples per length"]
    assert sorted(board["2x"]) == [99.0, 100.0]


def test_mean_reach_is_written_without_an_exponent():
    from lengthbench.leaderboard import _reach_mean_text

    assert [_reach_mean_text(v) for v in (1024.0, 322.5, 1.33333, 0.0, float("nan"))] == [
        "1,024×", "322×", "1.33×", "0×", "–"]


def test_run_curves_has_one_row_per_run_however_many_distinct_keys(tmp_path):
    """A row per run, also when every run differs in every key (the store's reality: each protocol,
    encoding, seed and length adds values). ``run_curves`` once built the cartesian product of the keys'
    values, 24 GB at 164 runs."""
    from lengthbench.leaderboard import run_curves, with_score

    results = tmp_path / "store"
    tasks, attns, pes = ["copy", "sort", "reverse", "mqrar"], ["softmax", "entmax", "ssmax", "sieve"], ["rope", "nape"]
    for i in range(12):
        synthetic_run(results, tasks[i % 4], attns[(i // 2) % 4], pes[i % 2], i, {1: 1.0, 2: i / 12},
                      preset=["smoke", "quick", "paper"][i % 3], config={"train_samples": 1000 * (i + 1)})
    curves = run_curves(with_score(load_store(results)[0]))
    assert len(curves) == 12 and curves["run_id"].is_unique
    assert sorted(curves[2].round(4)) == sorted(round(i / 12, 4) for i in range(12))


def test_a_curriculum_is_named_by_its_stages_so_its_runs_share_a_table(tmp_path):
    """Runs started from earlier stages (``init_from``) are labelled by what those stages trained, from their
    rows in the store: two mechanisms and two seeds of one curriculum share one table, a run whose source is
    not in the store keeps the source's run id, and the stages' rows are tables of their own."""
    results = tmp_path / "store"
    budget = {"batch_size": 128, "lr": 1e-3, "warmup_steps": 10_000, "init": "torch"}
    for attn, seed in (("softmax", 0), ("entmax", 0), ("softmax", 1)):
        first = {**budget, "train_samples": 1_280_000, "train_length": 16, "task_params": {"layout": "inline"}}
        path = synthetic_run(results, "mqrar", attn, "rope", seed, {1: 0.99, 2: 0.8}, preset="paper", config=first)
        second = {**budget, "train_samples": 640_000, "train_length": 16, "init_from": path.stem}
        path = synthetic_run(results, "mqrar", attn, "rope", seed, {1: 0.97, 2: 0.7}, preset="paper", config=second)
        final = {**budget, "train_samples": 1_280_000, "train_length": 64, "init_from": path.stem}
        synthetic_run(results, "mqrar", attn, "rope", seed, {1: 1.0, 2: 0.5 + seed / 10}, preset="paper", config=final)
    orphan = {**budget, "train_samples": 1_280_000, "init_from": "mqrar-gone-s0-abc"}
    synthetic_run(results, "mqrar", "sieve", "none", 0, {1: 0.0, 2: 0.0}, preset="paper", config=orphan)
    board = build_leaderboard(load_store(results)[0])
    after = board[board["protocol"].str.contains(" after ") & board["protocol"].str.startswith("1.28M")]
    assert sorted(after["attn"]) == ["entmax", "softmax"] and after["protocol"].nunique() == 1
    assert after["protocol"].iloc[0] == (
        "1.28M samples, batch 128, lr 0.001, init torch, after mqrar (layout=inline) at n 16, 1.28M samples, "
        "init torch -> mqrar at n 16, 0.64M samples, init torch")
    assert int(after.loc[after["attn"] == "softmax", "seeds"].iloc[0]) == 2
    assert board["protocol"].str.endswith(", from mqrar-gone-s0-abc").sum() == 1
    assert len(board) == 2 + 2 + 2 + 1  # each stage its own table; the orphan alone


def test_a_stage_with_other_mechanism_parameters_names_them(tmp_path):
    """A curriculum that widens Sieve's filter early (a stage's ``attn_params``) says so in its protocol."""
    results = tmp_path / "store"
    budget = {"attn": "sieve", "batch_size": 128, "lr": 1e-3, "warmup_steps": 10_000, "train_length": 16}
    first = {**budget, "train_samples": 1_280_000, "attn_params": {"alpha": 1.1}}
    path = synthetic_run(results, "mqrar", "sieve", "none", 0, {1: 0.9, 2: 0.8}, preset="paper", config=first)
    second = {**budget, "train_samples": 640_000, "attn_params": {"alpha": 1.5}, "init_from": path.stem}
    path = synthetic_run(results, "mqrar", "sieve", "none", 0, {1: 0.5, 2: 0.1}, preset="paper", config=second)
    final = {**budget, "train_samples": 1_280_000, "attn_params": {"alpha": 1.5}, "init_from": path.stem}
    synthetic_run(results, "mqrar", "sieve", "none", 0, {1: 0.0, 2: 0.0}, preset="paper", config=final)
    board = build_leaderboard(load_store(results)[0])
    protocol = board.loc[board["protocol"].str.contains(" -> "), "protocol"].iloc[0]
    assert protocol.endswith("after mqrar at n 16, 1.28M samples, sieve (alpha=1.1) -> mqrar at n 16, 0.64M samples")


def test_a_stage_with_its_own_warm_up_names_it_in_steps(tmp_path):
    """A stage whose warm-up differs from the final stage's names it in steps, as a run's own warm-up is named."""
    results = tmp_path / "store"
    budget = {"batch_size": 128, "lr": 1e-3, "train_length": 16}
    first = {**budget, "train_samples": 1_280_000, "warmup_steps": 10_000}
    path = synthetic_run(results, "mqrar", "stickbreaking", "none", 0, {1: 0.9, 2: 0.8}, preset="paper", config=first)
    final = {**budget, "train_samples": 640_000, "warmup_steps": 1_000, "init_from": path.stem}
    synthetic_run(results, "mqrar", "stickbreaking", "none", 0, {1: 0.0, 2: 0.0}, preset="paper", config=final)
    board = build_leaderboard(load_store(results)[0])
    protocol = board.loc[board["protocol"].str.contains(" after "), "protocol"].iloc[0]
    assert protocol.endswith("after mqrar at n 16, 1.28M samples, warm-up 10,000 steps")


def test_wilson_intervals_against_hand_worked_values():
    from lengthbench.leaderboard import wilson

    low, high = wilson(0.5, 200)  # centre 0.5, half-width z sqrt(0.25/200 + z^2/160000) / (1 + z^2/200)
    assert (low, high) == pytest.approx((0.43136, 0.56864), abs=1e-5)
    assert wilson(0.0, 1000)[0] == pytest.approx(0.0, abs=1e-12) and wilson(0.0, 1000)[1] == pytest.approx(0.0038268, abs=1e-6)
    assert wilson(1.0, 1000) == pytest.approx((0.9961732, 1.0), abs=1e-6)
    assert all(math.isnan(v) for v in wilson(0.5, 0)) and all(math.isnan(v) for v in wilson(float("nan"), 10))


def test_all_reads_the_metric_asked_for(tmp_path, monkeypatch, capsys):
    results = tmp_path / "study"
    synthetic_run(results, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5})
    path = next((results / "runs").glob("*.parquet"))
    frame = pd.read_parquet(path)
    frame["token_accuracy"] = [0.9, 0.25]  # a run that copies most tokens and few whole samples
    frame.to_parquet(path, index=False)
    assert cli(monkeypatch, "leaderboard", "--results", results, "--all", "--metric", "token_accuracy",
               "--format", "csv", "--out", tmp_path / "t.csv") == 0
    board = pd.read_csv(tmp_path / "t.csv")
    assert board["metric"].tolist() == ["token_accuracy"] and board["1x"].tolist() == [90.0]
    assert board["2x"].tolist() == [25.0]
    assert cli(monkeypatch, "leaderboard", "--results", results, "--all", "--publish", tmp_path / "pub",
               "--metric", "token_accuracy") == 0
    text = (tmp_path / "pub" / "leaderboard.md").read_text()
    assert "token accuracy (%)" in text and "--all --metric token_accuracy --publish" in text
    capsys.readouterr()
    assert cli(monkeypatch, "leaderboard", "--results", results, "--metric", "token_accuracy") == 2
    assert "--metric needs --all" in capsys.readouterr().err
    assert cli(monkeypatch, "leaderboard", "--results", results, "--all", "--metric", "bleu") == 2
    assert "unknown --metric 'bleu'" in capsys.readouterr().err
