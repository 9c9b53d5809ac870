"""benchmarks/train_throughput.py without a GPU: its table (one row per configuration), ``--merge``, its Markdown,
its baseline, retries and warm processes (CPU, fast)."""

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import train_throughput  # noqa: E402


def rows(command, created, entmax_speed, commit="abc1234", task="mqrar", **columns):
    """A command's rows: softmax + RoPE at 50,000 samples/s and entmax + RoPE at ``entmax_speed``."""
    base = dict(task=task, pe="rope", preset="paper", batch_size=128, train_step="graph-compiled", step_ms=1.0,
                warmup_s=5.0, layers=4, d_model=256, tokens_per_sample=83, device="NVIDIA H200", created_at=created,
                commit=commit, command=command, note="", **columns)
    frame = pd.DataFrame([dict(base, attn="softmax", samples_per_s=50_000.0),
                          dict(base, attn="entmax", samples_per_s=entmax_speed)])
    return frame.assign(softmax_rope_samples_per_s=50_000.0,
                        vs_softmax_rope=frame["samples_per_s"] / 50_000.0)


def run_script(monkeypatch, *argv: str) -> None:
    """``benchmarks/train_throughput.py ARGV`` in this process (its ``main``)."""
    monkeypatch.setattr(sys, "argv", ["benchmarks/train_throughput.py", *argv])
    train_throughput.main()


def merged(tmp_path, monkeypatch, *frames) -> tuple[pd.DataFrame, str]:
    """``train_throughput.py --merge`` of ``frames`` (each its own parquet file) into an empty folder: the table and
    its Markdown."""
    paths = []
    for index, frame in enumerate(frames):
        frame.to_parquet(tmp_path / f"{index}.parquet")
        paths.append(str(tmp_path / f"{index}.parquet"))
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    run_script(monkeypatch, "--merge", ",".join(paths), "--out", str(out))
    return pd.read_parquet(out / "train_throughput.parquet"), (out / "train_throughput.md").read_text()


def test_the_table_keeps_the_newest_row_of_each_configuration(tmp_path, monkeypatch):
    older = rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00", 30_000.0,
                 commit="aaa1111")
    newer = rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 30", "2026-11-27T09:00:00",
                 40_000.0, commit="bbb2222")
    copy = rows("python benchmarks/train_throughput.py --tasks copy", "2026-11-27T08:00:00", 45_000.0, task="copy")
    table, text = merged(tmp_path, monkeypatch, older, newer, copy)
    assert len(table) == 4 and list(table.columns) == train_throughput.COLUMNS
    mqrar = table[table["task"] == "mqrar"].set_index("attn")
    assert mqrar.loc["entmax", "samples_per_s"] == 40_000.0 and set(mqrar["commit"]) == {"bbb2222"}
    assert "| entmax | 0.90 | 0.80 |" in text  # copy's 45,000 / 50,000 and mqrar's newer 40,000 / 50,000
    assert "0.60" not in text
    assert "softmax + RoPE, samples/s: copy b128 50,000; mqrar b128 50,000." in text
    assert ("- NVIDIA H200, 2026-11-27, commit bbb2222: `python benchmarks/train_throughput.py --attns softmax,entmax "
            "--steps 30`; mqrar b128 rope") in text
    assert "aaa1111" not in text


def test_a_command_that_gave_part_of_a_column_names_its_cells(tmp_path, monkeypatch):
    first = rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00", 30_000.0)
    again = rows("python benchmarks/train_throughput.py --attns softmax", "2026-11-28T07:00:00", 30_000.0).iloc[:1]
    _, text = merged(tmp_path, monkeypatch, first, again)
    assert "`python benchmarks/train_throughput.py --attns softmax,entmax`; mqrar b128 rope (entmax)" in text
    assert "`python benchmarks/train_throughput.py --attns softmax`; mqrar b128 rope (softmax)" in text


def test_a_newer_unsteady_row_does_not_replace_a_steady_one(tmp_path, monkeypatch):
    """``halves`` (a cell's first half of timed steps over its second) or the command's ``baseline_drift`` more
    than 10% from 1 marks a row unsteady: a configuration keeps its newest steady row, and an unsteady one only where
    none was steady (marked so in the Markdown)."""
    steady = rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00", 40_000.0,
                  halves=1.02)
    unsteady = rows("python benchmarks/train_throughput.py --attns softmax,entmax --steps 30", "2026-11-27T09:00:00",
                    30_000.0, halves=0.76)
    drifting = rows("python benchmarks/train_throughput.py --tasks copy", "2026-11-27T10:00:00", 25_000.0,
                    task="copy", halves=1.0, baseline_drift=1.2)
    table, text = merged(tmp_path, monkeypatch, steady, unsteady, drifting)
    assert table.set_index(["task", "attn"]).loc[("mqrar", "entmax"), "samples_per_s"] == 40_000.0
    assert "| entmax | 0.50 unsteady | 0.80 |" in text and "`unsteady`" in text
    flags = train_throughput.unsteady(pd.DataFrame({"halves": [1.0, 0.89, 1.11, None],
                                                    "baseline_drift": [1.2, 1.0, None, 1.05]}))
    assert list(flags) == [True, True, True, False]


def test_a_file_merged_twice_adds_its_rows_once(tmp_path, monkeypatch):
    first = rows("python benchmarks/train_throughput.py --attns softmax,entmax", "2026-11-27T07:00:00", 30_000.0)
    once = merged(tmp_path, monkeypatch, first)
    twice = merged(tmp_path, monkeypatch, first, first)
    assert once[1] == twice[1] and len(twice[0]) == 2


def test_a_command_rewriting_its_rows_replaces_them(tmp_path):
    """A command writes its rows after every cell: its rows written before are replaced by the new ones (a row whose
    drift became known later is not kept twice, nor in its earlier form); other commands' rows stay."""
    other = rows("python benchmarks/train_throughput.py --tasks copy", "2026-11-26T07:00:00", 45_000.0, task="copy")
    train_throughput.write_table(other, tmp_path)
    command = "python benchmarks/train_throughput.py --attns softmax,entmax"
    train_throughput.write_table(rows(command, "2026-11-27T07:00:00", 30_000.0, halves=1.0), tmp_path)
    train_throughput.write_table(rows(command, "2026-11-27T07:00:00", 30_000.0, halves=1.0, baseline_drift=1.5),
                                 tmp_path)
    table = pd.read_parquet(tmp_path / "train_throughput.parquet")
    assert len(table) == 4
    assert table[table["task"] == "mqrar"]["baseline_drift"].tolist() == [1.5, 1.5]


def test_the_baseline_is_the_faster_softmax_rope_and_the_closing_row_gives_the_drift():
    group = [dict(attn="softmax", pe="rope", samples_per_s=50_000.0), dict(attn="entmax", pe="rope",
                                                                          samples_per_s=40_000.0),
             dict(attn="softmax", pe="rope", samples_per_s=55_000.0)]
    closed = train_throughput.with_baseline(group, closed=True)
    assert [row["attn"] for row in closed] == ["softmax", "entmax"]  # the closing measurement is not a row
    assert [row["vs_softmax_rope"] for row in closed] == [pytest.approx(50 / 55), pytest.approx(40 / 55)]
    assert all(row["baseline_drift"] == pytest.approx(1.1) for row in closed)
    open_group = train_throughput.with_baseline(group[:2], closed=False)
    assert [row["vs_softmax_rope"] for row in open_group] == [1.0, 0.8]
    assert all(pd.isna(row["baseline_drift"]) for row in open_group)
    assert group[0] == dict(attn="softmax", pe="rope", samples_per_s=50_000.0)  # the measurements untouched


def test_baseline_puts_softmax_rope_first_where_the_encodings_leave_it_out():
    args = argparse.Namespace(tasks="mqrar", attns="softmax,sieve", pes="nape", preset="paper", batch_sizes="512",
                              train_steps="graph-compiled", warmup=6, baseline=True)
    assert train_throughput.cell_pairs(args) == [("softmax", "rope"), ("softmax", "nape"), ("sieve", "nape")]
    args.pes = "rope,nape"
    assert train_throughput.cell_pairs(args) == [("softmax", "rope"), ("softmax", "nape"), ("sieve", "rope"),
                                                 ("sieve", "nape")]
    args.pes, args.baseline = "nape", False
    assert train_throughput.cell_pairs(args) == [("softmax", "nape"), ("sieve", "nape")]


def test_warm_commands_run_each_cell_for_a_few_steps():
    args = argparse.Namespace(tasks="mqrar,copy", attns="softmax,sieve", pes="rope", preset="paper",
                              batch_sizes="128", train_steps="graph-compiled", warmup=6)
    commands = train_throughput.warm_commands(args)
    cells = [(c[c.index("--tasks") + 1], c[c.index("--attns") + 1]) for c in commands]
    assert cells == [("mqrar", "softmax"), ("mqrar", "sieve"), ("copy", "softmax"), ("copy", "sieve")]
    for command in commands:
        assert command[command.index("--steps") + 1] == "2" and command[command.index("--warmup") + 1] == "6"
        assert "--warm-jobs" not in command  # a warm process warms nothing further
        # nor measures its cell again: a retry's warm-up (the cell compiled by then) would stand for the cell's
        assert command[command.index("--retries") + 1] == "0"
    assert len({c[c.index("--out") + 1] for c in commands}) == 4


def test_warm_returns_each_cells_first_warm_up(monkeypatch):
    """``--warm-jobs``: each warm process's ``warmup_s`` comes back keyed by its cell (the rows' ``first_warmup_s``);
    a process that failed gives none."""
    def fake_run(command, **kwargs):
        attn = command[command.index("--attns") + 1]
        if attn == "sieve":
            return subprocess.CompletedProcess(command, 1, "", "RuntimeError: no kernel")
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([dict(task=command[command.index("--tasks") + 1], batch_size=128, train_step="graph-compiled",
                           attn=attn, pe="rope", warmup_s=42.5)]).to_parquet(out / "train_throughput.parquet")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(train_throughput.subprocess, "run", fake_run)
    args = argparse.Namespace(tasks="mqrar", attns="softmax,sieve", pes="rope", preset="paper", batch_sizes="128",
                              train_steps="graph-compiled", warmup=6, warm_jobs=2)
    assert train_throughput.warm(args) == {("mqrar", 128, "graph-compiled", "softmax", "rope"): 42.5}


def test_a_cell_whose_halves_differ_is_measured_again(monkeypatch, tmp_path):
    """``--retries``: a cell whose timed halves differ by more than 10% is measured again, up to the given number of
    times; the row written is the last measurement, with the first one's warm-up (a retry finds the cell compiled).
    The closing softmax + RoPE measurement gives the drift and is no row of the table."""
    halves = {"softmax": [1.75, 1.4, 1.3, 1.0], "entmax": [1.02]}
    taken = []

    def fake_measure(task, attn, pe, preset, batch_size, steps, warmup, train_step):
        taken.append(attn)
        return dict(task=task, attn=attn, pe=pe, preset=preset, batch_size=batch_size, train_step=train_step,
                    samples_per_s=1000.0 * len(taken), step_ms=1.0, warmup_s=30.0 if taken.count(attn) == 1 else 1.0,
                    data_wait_share=0.0, halves=halves[attn].pop(0), note="")

    monkeypatch.setattr(train_throughput, "measure", fake_measure)
    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--tasks", "copy", "--attns", "softmax,entmax", "--pes",
                                      "rope", "--batch-sizes", "512", "--retries", "2", "--out", str(tmp_path)])
    train_throughput.main()
    # softmax: its first three measurements unsteady (two retries, the third kept as it is); entmax: steady at once;
    # then the closing softmax measurement, steady
    assert taken == ["softmax", "softmax", "softmax", "entmax", "softmax"]
    table = pd.read_parquet(tmp_path / "train_throughput.parquet").set_index("attn")
    assert table["halves"].to_dict() == {"entmax": 1.02, "softmax": 1.3}
    assert table["warmup_s"].to_dict() == {"entmax": 30.0, "softmax": 30.0}
    assert table.loc["softmax", "baseline_drift"] == pytest.approx(5000 / 3000)
    assert table.loc["entmax", "vs_softmax_rope"] == pytest.approx(4000 / 5000)  # over the faster softmax row
    assert table.loc["entmax", "command"].endswith("python train_throughput.py --tasks copy --attns softmax,entmax "
                                                   f"--pes rope --batch-sizes 512 --retries 2 --out {tmp_path}")


def test_the_command_names_the_lengthbench_variables_it_ran_under(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/train_throughput.py", "--tasks", "copy"])
    for name in [name for name in list(__import__("os").environ) if name.startswith("LENGTHBENCH_")]:
        monkeypatch.delenv(name)
    assert train_throughput.command_line() == "python benchmarks/train_throughput.py --tasks copy"
    monkeypatch.setenv("LENGTHBENCH_DATA_WORKERS", "4")
    monkeypatch.setenv("LENGTHBENCH_EXAMPLE", "{\"a\": 1}")
    assert train_throughput.command_line() == ("LENGTHBENCH_DATA_WORKERS=4 LENGTHBENCH_EXAMPLE='{\"a\": 1}' "
                                               "python benchmarks/train_throughput.py --tasks copy")


def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """An unknown training step or a --merge file that is not there: one line, exit code 2, nothing written."""
    for argv, said in ((["--train-steps", "graph-compiled,nope"], "error: --train-steps: unknown ['nope']"),
                       (["--merge", str(tmp_path / "none.parquet")], "error: --merge: ")):
        with pytest.raises(SystemExit) as stop:
            run_script(monkeypatch, *argv, "--out", str(tmp_path / "out"))
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(said) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_one_producer_feeds_the_warm_up_and_the_timed_steps(monkeypatch):
    """A cell on the CPU (the smoke model): one data producer from step 0 through the warm-up and the timed steps, so
    the timed seconds hold no worker start-up; every batch it makes is taken."""
    made = []
    real = train_throughput.BatchProducer

    class Recording(real):
        def __init__(self, stream, start_step, stop_step, **kwargs):
            made.append((start_step, stop_step))
            super().__init__(stream, start_step, stop_step, **kwargs)

    monkeypatch.setattr(train_throughput, "BatchProducer", Recording)
    row = train_throughput.measure("2back", "softmax", "nape", "smoke", 8, 6, 2)
    assert made == [(0, 8)]
    assert row["steps"] == 6 and row["samples_per_s"] > 0 and row["train_step"] == "graph-compiled"
    assert 0 <= row["data_wait_share"] < 1 and row["halves"] > 0
    assert set(row) | {"softmax_rope_samples_per_s", "vs_softmax_rope", "first_warmup_s", "baseline_drift", "device",
                       "created_at", "commit", "command"} == set(train_throughput.COLUMNS)
