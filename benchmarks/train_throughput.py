"""Training throughput (samples/s) of the runner's training step for the tasks' models, on one GPU.

Runs the runner's pipeline (background data workers -> device -> the Trainer's step, as ``lengthbench run``
configures it) for each task x mechanism x encoding x batch size x training step, and records samples/s over the
timed steps after ``--warmup`` untimed ones (compilation, graph capture), and each row's ratio to softmax + RoPE
of the same task and batch size measured by the same command (``vs_softmax_rope``):

    python benchmarks/train_throughput.py --tasks mqmtar,mqrar,copy --preset paper --batch-sizes 128,512 \
        --attns softmax,entmax,asentmax --pes rope,nape --out results/benchmarks

Steadiness: where softmax + RoPE is the first of several cells it runs again after the others, and
``baseline_drift`` (its closing samples/s over its first) says whether the machine held steady through the
command; ``halves`` (a cell's first half of timed steps over its second) says whether the cell did. A cell whose
halves differ by more than 10% is measured again, up to ``--retries`` times. The ratios' baseline is the faster of
softmax + RoPE's first and closing measurements.

``--warm-jobs N`` first runs every cell for a few steps in N processes at once, so that the timed pass finds
Inductor's kernels compiled (each row's ``first_warmup_s`` is its cell's warm-up there, N cells compiling at
once in the caches the command found; its ``warmup_s`` is then the timed pass's, with the kernels compiled). The
timed pass then compiles in one thread, so that no pool of compile workers shares the host's cores with its
timed steps. Run it alone on its machine: its data workers need the host's cores.

The table in ``--out`` (``train_throughput.parquet`` and ``.md``) holds one row per configuration (task,
mechanism, encoding, batch size, training step): its newest row where the halves and the command's drift were
within 10%, else its newest. Each row carries the device, date, commit and command (with the ``LENGTHBENCH_``
variables it ran under) that measured it. ``--merge A.parquet,B.parquet`` joins tables measured elsewhere into
``--out``'s by the same rule, measuring nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from lengthbench.compile_policy import attention_kernels
from lengthbench.config import TRAIN_STEPS, build_config
from lengthbench.data import BatchProducer, default_workers
from lengthbench.devices import device_description, git_sha, to_device
from lengthbench.leaderboard import frame_markdown
from lengthbench.tasks import get_task
from lengthbench.training import Trainer

# A configuration: one row of the table
KEY = ["task", "attn", "pe", "batch_size", "train_step"]
# a command: its rows share its command line and start
RUN = ["command", "created_at"]
# a command whose closing softmax + RoPE row differs from its first by more than this share, or a row whose timed
# steps' two halves do, is unsteady
UNSTEADY = 0.10
# the columns of the table (budget.py reads task, attn, pe, batch_size, train_step, d_model, layers, device,
# commit, created_at, samples_per_s, warmup_s, tokens_per_sample)
COLUMNS = ["task", "attn", "pe", "preset", "batch_size", "train_step", "samples_per_s", "vs_softmax_rope",
           "softmax_rope_samples_per_s", "step_ms", "warmup_s", "first_warmup_s", "halves", "baseline_drift",
           "data_wait_share", "steps", "mean_padded_width", "tokens_per_sample", "parameters", "layers", "d_model",
           "heads", "note", "device", "created_at", "commit", "command"]


def measure(task: str, attn: str, pe: str, preset: str, batch_size: int, steps: int, warmup: int,
            train_step: str = "graph-compiled") -> dict:
    """One cell: the model's construction and ``warmup`` untimed steps, then ``steps`` timed ones."""
    built = time.perf_counter()
    config = build_config(task, attn, pe, preset, batch_size=batch_size, train_step=train_step,
                          train_samples=batch_size * (steps + warmup), eval_every=10**9, checkpoint_every=10**9)
    task_obj = get_task(task)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the tests' tiny cells
    torch._dynamo.reset()
    said: list[str] = []

    def log(line: str) -> None:
        said.append(line)
        print("  " + line, flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="lengthbench-throughput-"))  # the trainer's checkpoint folder, unused
    trainer = Trainer(config, task_obj, device, scratch, progress=False, log=log)
    stream = trainer.train_stream()
    started_at = time.perf_counter()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    # One producer for the warm-up and the timed steps, as in a training run: the timed steps find its workers
    # started and its queue full
    producer = BatchProducer(stream, 0, warmup + steps, workers=default_workers(device.type))
    batches = iter(producer)

    def run(count: int) -> tuple[float, float, float, float]:
        """Seconds for the next ``count`` steps, the mean padded width, the seconds spent waiting for the data
        workers' next batch, and the seconds of the first half of the steps (the device drained at the half)."""
        tokens, waited = 0, 0.0
        sync()
        started = half = time.perf_counter()
        # as Trainer.train: a model that trains on its dense references takes them here too
        dense = attention_kernels(trainer.model, False) if trainer.dense else contextlib.nullcontext()
        with dense:
            for index in range(count):
                if index == count // 2:
                    sync()
                    half = time.perf_counter()
                asked = time.perf_counter()
                input_ids, labels, features = next(batches)
                waited += time.perf_counter() - asked
                tokens += input_ids.shape[1]
                trainer.step_fn(to_device(input_ids, device), to_device(labels, device),
                                to_device(features, device, torch.float32))
        sync()
        return time.perf_counter() - started, tokens / max(count, 1), waited, half - started

    try:
        warmup_seconds = run(warmup)[0] + started_at - built  # the construction counts: a fresh cell pays it
        seconds, mean_width, waited, first_half = run(steps)
    finally:
        producer.close()
        shutil.rmtree(scratch, ignore_errors=True)
    parameters = sum(p.numel() for p in trainer.model.parameters())
    failed = getattr(trainer.step_fn, "failed", "")
    trainer.step_fn = None  # the captured graph's memory goes with it
    # a step that could not compile or capture trained on the uncompiled one: the row says so
    note = "; ".join([line for line in said if "torch.compile of the training forward failed" in line]
                     + ([f"not captured: {failed}"] if failed else []))
    return dict(task=task, attn=attn, pe=pe, preset=preset, batch_size=batch_size, train_step=train_step,
                samples_per_s=steps * batch_size / seconds, step_ms=1000 * seconds / steps, warmup_s=warmup_seconds,
                halves=first_half / max(seconds - first_half, 1e-9), data_wait_share=waited / seconds, steps=steps,
                mean_padded_width=mean_width, tokens_per_sample=task_obj.max_tokens(config.train_length),
                parameters=parameters, layers=config.n_layers, d_model=config.d_model, heads=config.n_heads,
                note=note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mqmtar")
    parser.add_argument("--attns", default="softmax")
    parser.add_argument("--pes", default="rope,nape")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch-sizes", default="128,512")
    parser.add_argument("--train-steps", default="graph-compiled",
                        help=f"the training steps to measure, comma-separated, of {', '.join(TRAIN_STEPS)}")
    parser.add_argument("--steps", type=int, default=200, help="timed steps")
    parser.add_argument("--warmup", type=int, default=60, help="untimed steps first (compilation, graph capture)")
    parser.add_argument("--baseline", action="store_true", help="measure softmax + RoPE first (and again last) "
                        "where --attns or --pes leave it out, e.g. --pes nape: the ratios' baseline")
    parser.add_argument("--retries", type=int, default=2, help="measure a cell again, up to this many times, while "
                        "its halves differ by more than 10%% (the row keeps the first measurement's warm-up)")
    parser.add_argument("--warm-jobs", type=int, default=0, help="first compile every cell in this many processes "
                        "at once, a few steps each, so that the timed pass finds its kernels compiled")
    parser.add_argument("--merge", default="", help="comma-separated parquet files of tables measured elsewhere: "
                        "join them into --out's table (newest steady row per configuration) and measure nothing")
    parser.add_argument("--out", default="results/benchmarks")
    args = parser.parse_args()
    unknown = sorted(set(args.train_steps.split(",")) - set(TRAIN_STEPS))
    if unknown:
        usage_error(f"--train-steps: unknown {unknown}; choose from {', '.join(TRAIN_STEPS)}")
    if args.merge:
        try:
            frames = [pd.read_parquet(path) for path in args.merge.split(",")]
        except (OSError, ValueError) as error:
            usage_error(f"--merge: {error}")
        write_table(pd.concat(frames, ignore_index=True), Path(args.out))
        return
    first_warmups = warm(args) if args.warm_jobs > 0 else {}
    if args.warm_jobs > 0:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    stamp = dict(device=device_description(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
                 created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=git_sha(),
                 command=command_line())
    rows: list[dict] = []
    for task in args.tasks.split(","):
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            for train_step in args.train_steps.split(","):
                cells = cell_pairs(args)
                # softmax + RoPE again after the others, where it ran first: the command's drift
                closing = len(cells) > 1 and cells[0] == ("softmax", "rope")
                group: list[dict] = []
                for attn, pe in cells + ([cells[0]] if closing else []):
                    for attempt in range(max(0, args.retries) + 1):
                        row = measure(task, attn, pe, args.preset, batch_size, args.steps, args.warmup, train_step)
                        if attempt == 0:  # a retry finds the cell compiled: the warm-up is the first build's
                            first_build = row["warmup_s"]
                        row["warmup_s"] = first_build
                        if abs(row["halves"] - 1) <= UNSTEADY or attempt == max(0, args.retries):
                            break
                        print(f"  {attn} {pe}: halves {row['halves']:.2f}, measured again", flush=True)
                    row["first_warmup_s"] = first_warmups.get((task, batch_size, train_step, attn, pe))
                    group.append(row)
                    gc.collect()
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                    print(f"{task:7s} {attn:13s} {pe:5s} {train_step:15s} batch {batch_size:4d}: "
                          f"{row['samples_per_s']:9,.0f} samples/s ({row['step_ms']:.2f} ms/step, warm-up "
                          f"{row['warmup_s']:.1f} s, data wait {row['data_wait_share']:.0%}, halves "
                          f"{row['halves']:.2f}){' ' + row['note'] if row['note'] else ''}", flush=True)
                    closed = closing and len(group) == len(cells) + 1
                    # after every cell: a command cut short keeps what it measured
                    write_table(pd.DataFrame(rows + with_baseline(group, closed)).assign(**stamp), Path(args.out))
                rows += with_baseline(group, closing)


def usage_error(message: str) -> None:
    """A one-line error and exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def with_baseline(group: list[dict], closed: bool) -> list[dict]:
    """The rows of one task, batch size and step, each with its ratio to softmax + RoPE's faster measurement and,
    where the group is ``closed`` (its last row softmax + RoPE measured again), the command's drift: the closing
    measurement over the first (the closing row itself is not a row of the table)."""
    group = [dict(row) for row in group]
    base = [row["samples_per_s"] for row in group if (row["attn"], row["pe"]) == ("softmax", "rope")]
    drift = group[-1]["samples_per_s"] / group[0]["samples_per_s"] if closed else float("nan")
    for row in group:
        row["softmax_rope_samples_per_s"] = max(base) if base else float("nan")
        row["vs_softmax_rope"] = row["samples_per_s"] / row["softmax_rope_samples_per_s"]
        row["baseline_drift"] = drift
    return group[:-1] if closed else group


def cell_pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (mechanism, encoding) pairs that ``args`` measures: every ``--attns`` with every ``--pes``, after softmax +
    RoPE where ``--baseline`` asks for it and they leave it out."""
    pairs = [(attn, pe) for attn in args.attns.split(",") for pe in args.pes.split(",")]
    if getattr(args, "baseline", False) and ("softmax", "rope") not in pairs:
        pairs.insert(0, ("softmax", "rope"))
    return pairs


def warm_commands(args: argparse.Namespace) -> list[list[str]]:
    """One command per cell of ``args`` that runs it for a few untimed steps, for :func:`warm`."""
    commands = []
    scratch = Path(tempfile.mkdtemp(prefix="lengthbench-warm-"))  # this command's own: others' rows stay apart
    for task in args.tasks.split(","):
        for batch_size in args.batch_sizes.split(","):
            for train_step in args.train_steps.split(","):
                for attn, pe in cell_pairs(args):
                    commands.append([
                        sys.executable, str(Path(__file__).resolve()), "--tasks", task, "--attns", attn,
                        "--pes", pe, "--preset", args.preset, "--batch-sizes", batch_size,
                        "--train-steps", train_step, "--steps", "2", "--warmup", str(args.warmup),
                        # a retry would build the cell again in the caches just filled: its warm-up would stand
                        # for the cell's
                        "--retries", "0", "--out", str(scratch / f"{len(commands)}")])
    return commands


def warm(args: argparse.Namespace) -> dict[tuple, float]:
    """Runs :func:`warm_commands` ``args.warm_jobs`` at a time (their compilations use the CPU's cores at once).
    Returns each warmed cell's ``warmup_s`` by ``(task, batch size, step, attn, pe)``."""
    commands = warm_commands(args)
    started = time.perf_counter()

    def one(command: list[str]) -> tuple[str, dict]:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            row = pd.read_parquet(Path(command[command.index("--out") + 1]) / "train_throughput.parquet").iloc[0]
            return "", {(row["task"], int(row["batch_size"]), row["train_step"], row["attn"], row["pe"]):
                        float(row["warmup_s"])}
        said = [line for line in done.stderr.splitlines() if line.strip() and "warn" not in line.lower()]
        return f"{' '.join(command[2:8])}: exit {done.returncode}" + (f" ({said[-1][:200]})" if said else ""), {}

    with ThreadPoolExecutor(max_workers=args.warm_jobs) as pool:
        done = list(pool.map(one, commands))
    failed = [message for message, _ in done if message]
    print(f"warmed {len(commands) - len(failed)} of {len(commands)} cells in {time.perf_counter() - started:.0f} s "
          f"({args.warm_jobs} at a time)" + "".join(f"\n  not warmed: {message}" for message in failed), flush=True)
    return {key: seconds for _, seconds in done for key, seconds in seconds.items()}


def command_line() -> str:
    """This process's command, after the ``LENGTHBENCH_`` variables it ran under (a row measured under one says
    so)."""
    env = [f"{name}={shlex.quote(value)}" for name, value in sorted(os.environ.items())
           if name.startswith("LENGTHBENCH_") and value]
    return " ".join([*env, "python", *sys.argv])


def unsteady(frame: pd.DataFrame) -> pd.Series:
    """Whether each row's ``halves`` or its command's ``baseline_drift`` is more than :data:`UNSTEADY` from 1
    (a missing value counts as steady)."""
    flags = pd.Series(False, index=frame.index)
    for column in ("halves", "baseline_drift"):
        if column in frame:
            flags |= (pd.to_numeric(frame[column], errors="coerce") - 1).abs() > UNSTEADY
    return flags


def current(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (:data:`KEY`): its newest steady row, else its newest; the table's columns."""
    frame = frame.reindex(columns=COLUMNS)
    frame = frame.assign(_steady=~unsteady(frame)).sort_values(["_steady", "created_at"], kind="stable")
    frame = frame.drop_duplicates(KEY, keep="last").drop(columns="_steady")
    return frame.sort_values(["task", "batch_size", "train_step", "pe", "attn"]).reset_index(drop=True)


def write_table(rows: pd.DataFrame, out: Path) -> None:
    """``rows`` joined into the table in ``out`` (``train_throughput.parquet``, where there is one) by
    :func:`current`; the Parquet and its Markdown summary written."""
    path = out / "train_throughput.parquet"
    if path.exists():  # the rows there, less those of the commands in ``rows`` (written again as they go)
        table = pd.read_parquet(path)
        again = table.set_index(RUN).index.isin(rows.set_index(RUN).index)
        rows = pd.concat([table[~again], rows], ignore_index=True)
    table = current(rows)
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(path, index=False)
    (out / "train_throughput.md").write_text(markdown(table))


def markdown(table: pd.DataFrame) -> str:
    """The summary: per training step, each mechanism's ratio to softmax + RoPE by task, batch size and encoding;
    softmax + RoPE's samples/s; the commands that measured the cells, each with its device, date and commit."""
    table = table.assign(column=table["task"] + " b" + table["batch_size"].astype(str) + " " + table["pe"])
    flags = unsteady(table)
    lines = ["# Training throughput", "",
             "Samples/s of the runner's training step on one GPU, each mechanism over softmax + RoPE of the same "
             "task and batch size measured by the same command (`vs_softmax_rope`; every row's samples/s, warm-up "
             "and provenance are in `train_throughput.parquet`). Measured by `benchmarks/train_throughput.py`."
             + (" `unsteady`: the cell's timed halves, or its command's softmax + RoPE at its start and end, "
                f"differ by more than {UNSTEADY:.0%}." if flags.any() else ""), ""]
    for step, part in table.groupby("train_step", sort=False):
        cells = part.assign(cell=[f"{ratio:.2f}{' unsteady' if flag else ''}" for ratio, flag
                                  in zip(part["vs_softmax_rope"], flags[part.index], strict=True)])
        pivot = cells.pivot(index="attn", columns="column", values="cell").fillna("-")
        base = part[(part["attn"] == "softmax") & (part["pe"] == "rope")].sort_values(["task", "batch_size"])
        speeds = "; ".join(f"{row.task} b{row.batch_size} {row.samples_per_s:,.0f}" for row in base.itertuples())
        lines += [f"## `{step}` step", "", f"softmax + RoPE, samples/s: {speeds}." if speeds else "", "",
                  frame_markdown(pivot[sorted(pivot.columns)].reset_index()), ""]
    lines += ["Measured by (device, date, commit: command; the cells it gave):", ""]
    for command, part in table.sort_values("created_at").groupby("command", sort=False):
        first = part.iloc[0]
        given = []
        for column, cells in part.groupby("column", sort=False):
            whole = len(cells) == int((table["column"] == column).sum())
            given.append(column if whole else f"{column} ({', '.join(cells['attn'])})")
        lines.append(f"- {first['device']}, {str(first['created_at'])[:10]}, commit {first['commit']}: `{command}`; "
                     + "; ".join(given))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
