"""benchmarks/train_throughput.py without a GPU: ``--merge`` and its Markdown summary (CPU, fast)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lengthbench import compile_policy

ROOT = Path(__file__).resolve().parents[1]


def rows(command, created, entmax_speed, commit="abc1234"):
    base = dict(task="mqrar", pe="rope", batch_size=128, train_step="graph-compiled", train_attention="fused",
                compile_mode="", captured=True, step_ms=1.0, mean_padded_width=83.0, warmup_s=5.0,
                device="NVIDIA H200", created_at=created, commit=commit, command=command,
                inductor_defaults=json.dumps(compile_policy.INDUCTOR_OPTIONS, sort_keys=True))
    from lengthbench import kernels

    # entmax's fused op on today's views (``kernels.VIEWS``); softmax calls none
    return [dict(base, attn="softmax", samples_per_s=50_000.0, views=""),
            dict(base, attn="entmax", samples_per_s=entmax_speed, views=kernels.VIEWS)]


def merged_markdown(tmp_path, *frames) -> str:
    """``train_throughput.py --merge`` of ``frames`` (each written as its own parquet file): the Markdown it writes."""
    paths = []
    for index, frame in enumerate(frames):
        frame.to_parquet(tmp_path / f"{index}.parquet")
        paths.append(str(tmp_path / f"{index}.parquet"))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--merge",
                           ",".join(paths), "--out", str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return (tmp_path / "out" / "train_throughput.md").read_text()


def test_merge_summarises_the_newest_run_of_each_cell(tmp_path):
    older = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    newer = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 30",
                              "2026-11-27T09:00:00", 40_000.0))
    summary = merged_markdown(tmp_path, older, newer).split("Runs (device")[0]
    assert "| entmax | 0.80 (2) |" in summary  # the newer run's 40,000 / 50,000, not the older 0.60
    assert "0.60" not in summary
    assert "mqrar b128 50,000 (run 2)" in summary
    merged = pd.read_parquet(tmp_path / "out" / "train_throughput.parquet")
    assert sorted(merged["vs_softmax_rope"].round(2)) == [0.6, 0.8, 1.0, 1.0]


def test_the_same_command_run_twice_is_two_runs(tmp_path):
    """Two processes with one command line (another commit, another day) are two runs: each its own number and its
    own softmax + RoPE baseline."""
    command = "python benchmarks/train_throughput.py --attns softmax,entmax"
    first = pd.DataFrame(rows(command, "2026-11-27T07:00:00", 45_000.0, commit="aaa1111"))  # softmax 50,000
    second = pd.DataFrame(rows(command, "2026-11-28T07:00:00", 30_000.0, commit="bbb2222"))
    second.loc[second["attn"] == "softmax", "samples_per_s"] = 40_000.0
    summary, runs = merged_markdown(tmp_path, first, second).split("Runs (device")
    assert "| entmax | 0.75 (2) |" in summary  # 30,000 over its own run's 40,000, not over both runs' fastest
    assert "1. NVIDIA H200, 2026-11-27T07:00:00, commit aaa1111" in runs
    assert "2. NVIDIA H200, 2026-11-28T07:00:00, commit bbb2222" in runs


def test_a_run_whose_closing_baseline_drifted_is_marked_unsteady(tmp_path):
    steady = pd.DataFrame(rows("python benchmarks/train_throughput.py --tasks mqrar", "2026-11-27T07:00:00",
                               40_000.0) + [dict(rows("x", "", 0.0)[0], attn="softmax", samples_per_s=51_000.0,
                                                 created_at="2026-11-27T07:00:00", closing=True,
                                                 command="python benchmarks/train_throughput.py --tasks mqrar")])
    steady["baseline_drift"] = 51_000.0 / 50_000.0
    drifting = pd.DataFrame(rows("python benchmarks/train_throughput.py --tasks mqrar --steps 30",
                                 "2026-11-27T09:00:00", 40_000.0))
    drifting.loc[1, "task"] = drifting.loc[0, "task"] = "copy"
    closing = dict(drifting.iloc[0].to_dict(), samples_per_s=80_000.0, closing=True)
    drifting = pd.concat([drifting, pd.DataFrame([closing])], ignore_index=True)
    drifting["baseline_drift"] = 80_000.0 / 50_000.0
    summary = merged_markdown(tmp_path, steady, drifting).split("Runs (device")[0]
    # the ratios take the faster softmax + RoPE row of the run (the closing one where it was faster)
    assert "| entmax | 0.50 (2, unsteady) | 0.78 (1) |" in summary, summary
    # the speed shown is the ratios' baseline: the faster of the first and closing rows
    assert "`unsteady`" in summary and "mqrar b128 51,000 (run 1)" in summary and "copy b128 80,000 (run 2)" in summary


def test_a_cell_whose_halves_differ_is_unsteady_and_an_older_steady_row_is_shown(tmp_path):
    """``halves`` (a cell's first half of timed steps over its second) more than 10% from 1 marks that row unsteady;
    the summary then shows the cell's newest steady row (one that recorded its halves), and an unsteady row only
    where no steady one exists."""
    older = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              40_000.0))
    older["halves"] = [1.0, 1.02]
    newer = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 30",
                              "2026-11-27T09:00:00", 30_000.0))
    newer["halves"] = [1.0, 0.76]
    alone = pd.DataFrame(rows("python benchmarks/train_throughput.py --tasks copy", "2026-11-27T10:00:00", 25_000.0))
    alone["task"] = "copy"
    alone["halves"] = [0.99, 1.15]
    summary = merged_markdown(tmp_path, older, newer, alone).split("Runs (device")[0]
    assert "| entmax | 0.50 (3, unsteady) | 0.80 (1) |" in summary, summary
    assert "`halves`" in summary and "newest row measured steady" in summary
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    flags = train_throughput.unsteady_rows(pd.DataFrame({"halves": [1.0, 0.89, 1.11, None],
                                                         "baseline_drift": [1.2, 1.0, None, 1.05]}))
    assert list(flags) == [True, True, True, False]
    assert not train_throughput.unsteady_rows(pd.DataFrame({"attn": ["softmax"]})).any()


def test_warm_commands_run_each_cell_for_a_few_steps():
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    args = argparse.Namespace(tasks="mqrar,copy", attns="softmax,sieve", pes="rope", preset="paper",
                              batch_sizes="128", train_steps="graph-compiled", train_attentions="fused",
                              compile_modes="default", pad_multiples="8", dynamic="static", warmup=6, in_graph="none")
    commands = train_throughput.warm_commands(args)
    assert len(commands) == 4  # two tasks x two mechanisms
    cells = [(c[c.index("--tasks") + 1], c[c.index("--attns") + 1]) for c in commands]
    assert cells == [("mqrar", "softmax"), ("mqrar", "sieve"), ("copy", "softmax"), ("copy", "sieve")]
    for command in commands:
        assert command[command.index("--steps") + 1] == "2" and command[command.index("--warmup") + 1] == "6"
        assert command[command.index("--in-graph") + 1] == "none"  # the timed pass's path, compiled
        assert "--warm-jobs" not in command  # a warm process warms nothing further
        # nor measures its cell again: a retry's warm-up (the cell compiled by then) would stand for the cell's
        assert command[command.index("--retries") + 1] == "0"
    assert len({c[c.index("--out") + 1] for c in commands}) == 4


def test_the_summary_keeps_the_stick_family_rows_of_the_ops_taken_now(tmp_path):
    def run(command, created, speed, capture):
        frame = pd.DataFrame(rows(command, created, speed))
        frame.loc[1, "attn"] = "sieve-window"
        if capture is not None:
            frame["capture_stick"] = capture
        return frame

    runs = [run("python benchmarks/train_throughput.py --attns softmax,sieve-window", "2026-11-27T07:00:00", 30_000.0, None),
            run("LENGTHBENCH_CAPTURE_STICK=wide ...", "2026-11-27T08:00:00", 40_000.0, "wide"),
            run("LENGTHBENCH_CAPTURE_STICK=narrow ...", "2026-11-27T09:00:00", 35_000.0, "narrow")]
    text = merged_markdown(tmp_path, *runs)
    summary = text.split("Runs (device")[0]
    assert "| sieve-window | 0.80 (2) |" in summary, summary  # the wide run's, not the newer narrow one nor the oldest
    assert "`capture_stick` not `wide`" in summary
    assert "| capture_stick |" in text.split("Runs (device")[1]


def test_one_producer_feeds_the_warm_up_and_the_timed_steps(monkeypatch):
    """A cell on the CPU (the smoke model): one data producer from step 0 through the warm-up and the timed steps, so
    the timed seconds hold no worker start-up; every batch it makes is taken."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    made = []
    real = train_throughput.BatchProducer

    class Recording(real):
        def __init__(self, stream, start_step, stop_step, **kwargs):
            made.append((start_step, stop_step))
            super().__init__(stream, start_step, stop_step, **kwargs)

    monkeypatch.setattr(train_throughput, "BatchProducer", Recording)
    row = train_throughput.measure("2back", "softmax", "nape", "smoke", 8, "default", 6, 2, 0, "static")
    assert made == [(0, 8)]
    assert row["steps"] == 6 and row["samples_per_s"] > 0
    assert 0 <= row["data_wait_share"] < 1 and row["halves"] > 0


def test_a_cell_whose_halves_differ_is_measured_again(monkeypatch, tmp_path):
    """``--retries``: a cell whose timed halves differ by more than 10% is measured again, up to the given number of
    times; the row written is the last measurement and says how many there were, with the first one's warm-up (a
    retry finds the cell compiled)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    halves = {"softmax": [1.75, 1.4, 1.3, 1.0], "entmax": [1.02]}
    taken = []

    def fake_measure(task, attn, pe, *args, **kwargs):
        taken.append(attn)
        return dict(task=task, attn=attn, pe=pe, batch_size=512, train_step="graph-compiled",
                    train_attention="fused", samples_per_s=1000.0 * len(taken), step_ms=1.0, mean_padded_width=131.0,
                    warmup_s=30.0 if taken.count(attn) == 1 else 1.0, data_wait_share=0.0,
                    halves=halves[attn].pop(0), capture_error="")

    written = {}
    monkeypatch.setattr(train_throughput, "measure", fake_measure)
    monkeypatch.setattr(train_throughput, "write", lambda rows, out: written.update(rows=[dict(r) for r in rows]))
    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--tasks", "copy", "--attns", "softmax,entmax", "--pes",
                                      "rope", "--batch-sizes", "512", "--retries", "2", "--out", str(tmp_path)])
    train_throughput.main()
    # softmax: its first three measurements unsteady (two retries, the third kept as it is); entmax: steady at once;
    # then the closing softmax row, steady
    assert taken == ["softmax", "softmax", "softmax", "entmax", "softmax"]
    got = [(row["attn"], row["attempts"], row["halves"]) for row in written["rows"]]
    assert got == [("softmax", 3, 1.3), ("entmax", 1, 1.02), ("softmax", 1, 1.0)]
    # each row's warm-up the cell's first build's; the closing softmax row's its own (the cell compiled by then)
    assert [row["warmup_s"] for row in written["rows"]] == [30.0, 30.0, 1.0]


def test_warm_returns_each_cells_first_warm_up(monkeypatch):
    """``--warm-jobs``: each warm process's ``warmup_s`` comes back keyed by its cell (the rows' ``first_warmup_s``);
    a process that failed gives none and is named."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    def fake_run(command, **kwargs):
        attn = command[command.index("--attns") + 1]
        if attn == "sieve":
            return subprocess.CompletedProcess(command, 1, "", "RuntimeError: no kernel")
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([dict(task=command[command.index("--tasks") + 1], batch_size=128, train_step="graph-compiled",
                           attn=attn, pe="rope", train_attention="fused", warmup_s=42.5)]).to_parquet(
            out / "train_throughput.parquet")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(train_throughput.subprocess, "run", fake_run)
    args = argparse.Namespace(tasks="mqrar", attns="softmax,sieve", pes="rope", preset="paper", batch_sizes="128",
                              train_steps="graph-compiled", train_attentions="fused", compile_modes="default",
                              pad_multiples="8", dynamic="static", warmup=6, in_graph="", warm_jobs=2)
    first = train_throughput.warm(args)
    assert first == {("mqrar", "128", "graph-compiled", "softmax", "rope", "fused"): 42.5}


def test_fresh_caches_give_each_warm_process_empty_caches_of_its_own(monkeypatch):
    """``--fresh-caches``: every warm process runs with Inductor and Triton cache folders of its own, empty when it
    starts (a fresh machine's warm-up) and gone when it ends; without it the processes share the command's."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    seen = []

    def fake_run(command, env=None, **kwargs):
        seen.append(env)
        if env is not None:
            for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
                folder = Path(env[variable])
                assert folder.parent.is_dir() and not folder.exists()  # nothing compiled there yet
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([dict(task="copy", batch_size=512, train_step="graph-compiled",
                           attn=command[command.index("--attns") + 1], pe="rope", train_attention="fused",
                           warmup_s=30.0)]).to_parquet(out / "train_throughput.parquet")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(train_throughput.subprocess, "run", fake_run)
    args = argparse.Namespace(tasks="copy", attns="softmax,asentmax", pes="rope", preset="paper", batch_sizes="512",
                              train_steps="graph-compiled", train_attentions="fused", compile_modes="default",
                              pad_multiples="8", dynamic="static", warmup=6, in_graph="", warm_jobs=1,
                              fresh_caches=True)
    assert len(train_throughput.warm(args)) == 2
    folders = [Path(env[variable]) for env in seen for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")]
    assert len(set(folders)) == 4 and not any(folder.parent.exists() for folder in folders)
    seen.clear()
    args.fresh_caches = False
    train_throughput.warm(args)
    assert seen == [None, None]


@pytest.mark.parametrize("variable, column, value, said", [
    ("LENGTHBENCH_CAPTURE_TUNING", "capture_tuning", '{"entmax": {"split": true}}', "capture settings other than today's"),
    ("LENGTHBENCH_INDUCTOR_OPTIONS", "inductor_options", '{"triton.mix_order_reduction": true}',
     "`LENGTHBENCH_INDUCTOR_OPTIONS` set"),
])
def test_rows_of_a_lever_set_from_the_environment_stay_out_of_the_summary(tmp_path, variable, column, value, said):
    """A newer run with a path variable set (``LENGTHBENCH_CAPTURE_TUNING``, ``LENGTHBENCH_INDUCTOR_OPTIONS``)
    compares a lever: the summary keeps the library's path."""
    plain = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    plain[column] = ""
    lever = pd.DataFrame(rows(f"{variable}='{{...}}' python benchmarks/train_throughput.py",
                              "2026-11-27T08:00:00", 45_000.0))
    lever[column] = value
    summary, table = merged_markdown(tmp_path, plain, lever).split("Runs (device")
    assert "| entmax | 0.60 (1) |" in summary and said in summary
    assert f"| {column} |" in table


@pytest.mark.parametrize("variable, column, plain_has_column", [
    ("LENGTHBENCH_SDPA_ALIBI", "sdpa_alibi", True),
    ("LENGTHBENCH_SDPA_BACKEND", "sdpa_backend", False),  # rows from before the column: torch's own backend
])
def test_rows_with_another_sdpa_path_stay_out_of_the_summary(tmp_path, variable, column, plain_has_column):
    """A newer run whose SDPA took the ALiBi bias (``sdpa_alibi``) or a backend (``sdpa_backend``: its softmax
    baseline too) other than the library's compares a lever."""
    from lengthbench.kernels import _sdpa

    library = {"sdpa_alibi": _sdpa.SDPA_ALIBI, "sdpa_backend": _sdpa.SDPA_BACKEND}[column]
    other = {"sdpa_alibi": "mask" if library == "keys" else "keys",
             "sdpa_backend": "flash" if library != "flash" else "cudnn"}[column]
    plain = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    if plain_has_column:
        plain[column] = library
    lever = pd.DataFrame(rows(f"{variable}=... python benchmarks/train_throughput.py", "2026-11-27T08:00:00",
                              45_000.0))
    lever[column] = other
    summary, table = merged_markdown(tmp_path, plain, lever).split("Runs (device")
    assert "| entmax | 0.60 (1) |" in summary and f"`{column}` other than `{library}`" in summary
    assert f"| {column} |" in table


def test_alibi_path_of_rows_from_before_the_column():
    """Rows without ``sdpa_alibi``: softmax/SSMax with NAPE or ALiBi took the mask; others the library's path."""
    from lengthbench.kernels import _sdpa

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    frame = pd.DataFrame(dict(attn=["softmax", "ssmax", "entmax", "softmax", "softmax"],
                              pe=["nape", "alibi", "nape", "rope", "nape"],
                              sdpa_alibi=[None, None, None, None, "keys"]))
    assert list(train_throughput.alibi_path(frame)) == ["mask", "mask", _sdpa.SDPA_ALIBI, _sdpa.SDPA_ALIBI, "keys"]
    assert list(train_throughput.alibi_path(frame.drop(columns="sdpa_alibi")))[:3] == ["mask", "mask",
                                                                                       _sdpa.SDPA_ALIBI]


def test_stick_family_rows_count_with_todays_capture_settings(tmp_path):
    """The stick-breaking family's rows count where their capture settings are today's: a row from before the
    settings were recorded ran 32-row tiles and stays out, and so does a lever row of then whose keys are today's
    (today's tiles are the op's own, which the row's step took as those 32-row tiles); a row that recorded today's
    settings counts."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    stick = "stickbreaking"
    old = dict(attn=stick, fused_ops=stick, capture_stick="wide", capture_tuning="")
    lever = dict(old, capture_tuning=json.dumps({stick: kernels.CAPTURE_TUNING[stick]}))
    recorded = dict(old, capture_settings=train_throughput.today_capture(stick))
    frame = pd.DataFrame([old, lever, recorded])
    settings = train_throughput.capture_settings(frame)
    today = train_throughput.today_capture(stick)
    assert "fwd" not in kernels.CAPTURE_TUNING[stick]
    assert list(settings == today) == [False, False, True]


def test_stick_rows_before_the_one_bf16_sums_are_not_todays_step():
    """Rows recorded without the pinned keys ran two-bf16 sums (and Sieve's ops' masked tiles): with the 64 x 32
    tiles and uncapped registers they recorded, they are not today's step (the long-context op's tiles, registers
    and one-bf16 sums); a row that recorded today's settings is, and so is one of today's keys in another order."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    before = {"stickbreaking": {"fwd": [64, 32, 4, 2], "bwd": [64, 32, 4, 2], "full_tiles": True},
              "sieve-window": {"fwd": [64, 32, 4, 2], "bwd": [64, 32, 4, 2]},
              "sieve": {"lists": False, "split": False, "threshold": "narrow",
                               "walk": {"fwd": [64, 32, 4, 2], "bwd": [64, 32, 4, 2]}}}
    lever = {"stickbreaking": {**before["stickbreaking"], "cumsum": "bf16"}}
    today = {op: kernels.CAPTURE_TUNING[op] for op in ("sieve-window", "sieve")}
    reordered = {"sieve-window": dict(reversed(list(kernels.CAPTURE_TUNING["sieve-window"].items())))}
    cases = [*before.items(), *lever.items(), *today.items(), *reordered.items()]
    rows = pd.DataFrame([dict(attn=op, fused_ops=op, capture_stick="wide", capture_settings=json.dumps({op: tuning}))
                         for op, tuning in cases])
    expected = [train_throughput.today_capture(op) for op in rows["fused_ops"]]
    assert list(train_throughput.capture_settings(rows) == expected) == [False, False, False, False, True, True, True]
    assert "fwd" not in kernels.CAPTURE_TUNING["stickbreaking"] and kernels.CAPTURE_TUNING["sieve-window"]["cumsum"] == "bf16"


def test_tda_rows_before_the_capture_column_ran_the_dq_kernel():
    """TDA's rows from before ``capture_settings`` ran its backward with the dq kernel (``fused_bwd`` came later):
    they stay out of today's path; a row recording today's settings counts, and so does a lever row of that
    setting from before it was the library's."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    assert kernels.CAPTURE_TUNING["tda"]["fused_bwd"] is True
    old = dict(attn="tda", fused_ops="tda", capture_tuning="")
    lever = dict(old, capture_tuning=json.dumps({"tda": {"fused_bwd": True}}))
    recorded = dict(old, capture_settings=train_throughput.today_capture("tda"))
    older = dict(attn="tda", fused_ops=None, capture_tuning="")  # (from before the fused_ops column too)
    rows = [old, lever, recorded, older]
    settings = train_throughput.capture_settings(pd.DataFrame(rows))
    today = [train_throughput.today_capture(row["fused_ops"], row["attn"]) for row in rows]
    assert today == [train_throughput.today_capture("tda")] * 4
    assert list(settings == today) == [False, True, True, False]


def test_softpick_rows_before_the_capture_column_ran_their_own_defaults():
    """softpick's and TRA's rows from before ``capture_settings`` ran the ops' own tiles (no tuning): they stay out
    of today's path, whose capture tiles are ``kernels.ROWWISE_CAPTURE``; rows that record today's count."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    rows = []
    for op in ("softpick", "tra"):
        rows += [dict(attn=op, fused_ops=op, capture_tuning=""),
                 dict(attn=op, fused_ops=op, capture_tuning="", capture_settings=train_throughput.today_capture(op)),
                 dict(attn=op, fused_ops=None, capture_tuning="")]  # (from before the fused_ops column too)
    settings = train_throughput.capture_settings(pd.DataFrame(rows))
    assert kernels.CAPTURE_TUNING["softpick"]["fwd"] == kernels.ROWWISE_CAPTURE["fwd"]
    today = {op: train_throughput.today_capture(op) for op in ("softpick", "tra")}
    assert list(settings) == ['{"softpick": {}}', today["softpick"], '{"softpick": {}}', '{"tra": {}}', today["tra"],
                              '{"tra": {}}']
    assert [train_throughput.today_capture(row["fused_ops"], row["attn"]) for row in rows] == [
        today["softpick"]] * 3 + [today["tra"]] * 3


def test_entmax_rows_count_with_todays_training_width_backward():
    """1.5-entmax rows count where the backward their rule gave them is today's: rows from before the column took
    the narrow backward; a rule that took the rowwise one at every width differs from today's below 129 tokens."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    frame = pd.DataFrame(dict(attn=["asentmax", "asentmax", "asentmax", "entmax", "softmax"],
                              tokens_per_sample=[131, 83, 83, float("nan"), 131],
                              entmax_backward=[None, None, "auto:0", None, None]))
    own = list(train_throughput.entmax_backward(frame))
    today = list(train_throughput.entmax_backward(frame, kernels.entmax_backward_setting()))
    assert own == ["narrow", "narrow", "rowwise", "narrow", ""]
    assert today == ["rowwise", "narrow", "narrow", "narrow", ""]
    assert kernels.entmax_backward_taken("rowwise", False, 10) == "rowwise"
    assert kernels.entmax_backward_taken(f"auto:{kernels.ROWWISE_FROM}", True, kernels.ROWWISE_FROM) == "rowwise"


def test_rowwise_entmax_rows_count_with_todays_dq_kernel_choice():
    """Rows of the rowwise 1.5-entmax backward count where they ran it as the library does now (``rowwise_fused``):
    rows from before the column ran the dq kernel unless their narrow tuning said otherwise; a narrow tuning that
    sets only today's value is the library's path, one that sets anything else is a lever."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    fused = json.dumps({"rowwise_fused": kernels.ROWWISE_FUSED})
    other = json.dumps({"rowwise_fused": not kernels.ROWWISE_FUSED})
    frame = pd.DataFrame(dict(narrow_tuning=["", fused, other, "", json.dumps({"bm": 32}), ""],
                              rowwise_fused=[None, None, None, True, None, False]))
    assert list(train_throughput.rowwise_fused(frame)) == [False, kernels.ROWWISE_FUSED, not kernels.ROWWISE_FUSED,
                                                           True, False, False]
    assert list(train_throughput.narrow_tuned(frame)) == [False, False, True, False, True, False]
    assert list(train_throughput.rowwise_fused(frame.drop(columns="rowwise_fused"))) == [
        False, kernels.ROWWISE_FUSED, not kernels.ROWWISE_FUSED, False, False, False]


def test_a_file_merged_twice_adds_its_rows_once(tmp_path):
    first = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    once = merged_markdown(tmp_path, first)
    twice = merged_markdown(tmp_path, first, first)
    assert once == twice
    frame = pd.read_parquet(tmp_path / "out" / "train_throughput.parquet")
    assert len(frame) == 2


@pytest.mark.parametrize("attn, ops", [("tda", "tda"), ("softpick", "softpick"), ("sieve", "sieve")])
def test_rows_on_other_views_stay_out_of_the_summary(tmp_path, attn, ops):
    """Rows whose model took its query, key and value views other than today's (``views``; rows from before the
    column: compiled, TDA's as its older ``unit_views`` column says) are a comparison; the column does not concern
    the models without a fused op (softmax's rows stay)."""
    from lengthbench import kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    other = "compiled" if kernels.VIEWS == "op" else "op"

    def run(command, created, speed, views, column="views"):
        frame = pd.DataFrame(rows(command, created, speed))
        frame["attn"] = ["softmax", attn]
        frame["fused_ops"] = ["softmax", ops]
        frame["in_graph"] = [False, True]
        frame["capture_settings"] = [train_throughput.today_capture(names) for names in frame["fused_ops"]]
        frame = frame.drop(columns="views")  # a run from before the column, unless
        if views is not None:
            frame[column] = ["", views]
        return frame

    today = run(f"python benchmarks/train_throughput.py --attns softmax,{attn}", "2026-11-27T07:00:00", 30_000.0,
                kernels.VIEWS)
    lever = run("LENGTHBENCH_VIEWS=... python benchmarks/train_throughput.py", "2026-11-27T08:00:00", 45_000.0, other)
    summary, table = merged_markdown(tmp_path, today, lever).split("Runs (device")
    assert f"| {attn} | 0.60 (1) |" in summary and "value views other than" in summary
    assert "| softmax | 1.00 (2) |" in summary  # the lever's softmax row is the library's path
    assert "| views |" in table
    older = run(f"python benchmarks/train_throughput.py --attns softmax,{attn}", "2026-11-27T09:00:00", 40_000.0, None)
    summary = merged_markdown(tmp_path, today, older).split("Runs (device")[0]
    assert (f"| {attn} | 0.60 (1) |" if kernels.VIEWS == "op" else f"| {attn} | 0.80 (2) |") in summary
    if attn == "tda":  # TDA's rows of the older column say which views they took
        older = run("python benchmarks/train_throughput.py --attns softmax,tda", "2026-11-27T09:00:00", 40_000.0,
                    kernels.VIEWS, column="unit_views")
        summary = merged_markdown(tmp_path, today, older).split("Runs (device")[0]
        assert "| tda | 0.80 (" in summary


def test_baseline_puts_softmax_rope_first_where_the_encodings_leave_it_out():
    """``--baseline`` with ``--pes nape``: softmax + RoPE (the ratios' baseline) is warmed and measured first, once;
    without it, or where the cells hold it already, the cells are every mechanism with every encoding."""
    import argparse

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import train_throughput

    args = argparse.Namespace(tasks="mqrar", attns="softmax,sieve", pes="nape", preset="paper", batch_sizes="512",
                              train_steps="graph-compiled", train_attentions="fused", compile_modes="default",
                              pad_multiples="8", dynamic="static", warmup=6, in_graph="", baseline=True)
    assert train_throughput.cell_pairs(args) == [("softmax", "rope"), ("softmax", "nape"), ("sieve", "nape")]
    commands = train_throughput.warm_commands(args)
    assert [(c[c.index("--attns") + 1], c[c.index("--pes") + 1]) for c in commands] == [
        ("softmax", "rope"), ("softmax", "nape"), ("sieve", "nape")]
    args.pes = "rope,nape"
    assert train_throughput.cell_pairs(args) == [("softmax", "rope"), ("softmax", "nape"), ("sieve", "rope"),
                                                 ("sieve", "nape")]
    args.pes, args.baseline = "nape", False
    assert train_throughput.cell_pairs(args) == [("softmax", "nape"), ("sieve", "nape")]


def test_rows_under_older_default_inductor_options_stay_out_of_the_summary(tmp_path):
    """A run under the library's default Inductor options of another commit (or before the rows recorded them)
    measured another step: the summary keeps the rows of today's options, and says why the others are left out."""
    today = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    older = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 30",
                              "2026-11-27T08:00:00", 45_000.0))
    older["inductor_defaults"] = json.dumps({"triton.mix_order_reduction": False})
    before = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 40",
                               "2026-11-27T09:00:00", 40_000.0)).drop(columns="inductor_defaults")
    summary = merged_markdown(tmp_path, today, older, before).split("Runs (device")[0]
    assert "| entmax | 0.60 (1) |" in summary, summary
    assert "default Inductor options other than today's" in summary


def test_fresh_cache_rows_give_the_warm_up_line_not_the_ratios(tmp_path):
    """Rows of ``--fresh-caches`` time a few steps after a fresh machine's warm-up: their warm-ups are listed, the
    slowest first, and the ratios come from the timed runs."""
    timed = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00",
                              30_000.0))
    fresh = pd.DataFrame(rows("python benchmarks/train_throughput.py --attns softmax,entmax --fresh-caches",
                              "2026-11-27T08:00:00", 45_000.0))
    fresh["fresh_caches"] = True
    fresh["first_warmup_s"] = [41.2, 52.5]
    summary = merged_markdown(tmp_path, timed, fresh).split("Runs (device")[0]
    assert "| entmax | 0.60 (1) |" in summary, summary
    assert "mqrar b128 entmax + rope 52.5 s (run 2); mqrar b128 softmax + rope 41.2 s (run 2)." in summary
