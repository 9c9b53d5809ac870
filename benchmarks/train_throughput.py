"""Training throughput (samples/s) of the runner's train step for the tasks' models, on one GPU.

Runs the real pipeline (background data workers -> device -> the Trainer's step with bf16 autocast, fused
AdamW, clipping) for each task x mechanism x encoding x batch size x step kind and records samples/s after
warm-up, and each row's ratio to the fastest softmax + RoPE row of its task and batch size in the same run.
Where softmax + RoPE is the first of several cells, it runs again after the others: ``baseline_drift`` (its
closing samples/s over its first) says whether the machine held steady through the run, and ``halves`` (a cell's
first half of timed steps over its second) whether the cell did; the summary marks a run that drifted, or a cell
whose halves differ, by more than 10% ``unsteady``, and shows a cell's newest row measured steady where there is
one; ``--retries`` measures a cell again while its halves differ by more than 10% (the row keeps the first
measurement's ``warmup_s``: a retry finds the cell compiled). After ``--warm-jobs`` this process
compiles in one thread: on an H200, Copy at batch 512 ran the first cells of a run slow for their first seconds, up
to 66% below the closing softmax + RoPE row, with 20 to 60 warm-up steps and in one run with 600 too (67,855 against
91,639 samples/s), while Inductor's pool of compile workers started beside them; in one thread the same command held
within 2% (91,972 and 93,496), no cell measured again (one run each: results/benchmarks/gpu_logs/
train_throughput_copy_b512_warmup.txt, ab_entmax_newton_tol.txt, tda_kept_threshold_copy_b512.txt).

    python benchmarks/train_throughput.py --tasks mqmtar,mqrar,copy --preset paper --batch-sizes 128,512 \
        --attns softmax,entmax,asentmax --pes rope,nape --train-steps graph,compiled --out results/benchmarks

``--train-steps``: ``graph-compiled`` (the default step: the whole step in one CUDA graph with Inductor's kernels,
lengthbench/graph_step.py), ``graph`` (the same with eager kernels), ``compiled`` (torch.compile per bucket width
where the model has no fused op, with ``--compile-modes``; else the fused ops, eagerly). For ``compiled``, ``--pad-multiples`` sets the bucket widths and ``--compile-modes eager`` gives the
eager step.

``--warm-jobs N`` first runs every cell for a few steps in N processes at once, so that the timed pass finds
Inductor's kernels compiled (on a 16-core machine it shortens a 30-cell command several times over; the rows'
``warmup_s`` is then not a fresh machine's, and they say ``cache_warmed``). Each row's ``first_warmup_s`` is then
its cell's warm-up in that first pass: construction, compilation and graph capture with the caches the command
found (empty on a fresh machine), N cells compiling at once, each measured once. ``--fresh-caches`` gives each
warm process empty Inductor and Triton caches of its own: with ``--warm-jobs 1`` each row's ``first_warmup_s`` is
then its cell's warm-up alone on a fresh machine (the rows say ``fresh_caches``)::

    python benchmarks/train_throughput.py --preset paper --tasks copy --attns asentmax,tda --pes rope \
        --batch-sizes 512 --warm-jobs 1 --fresh-caches --out results/benchmarks

Run it alone on its machine: its data workers need the host's cores. Four commands at once on a host of four
GPUs, one GPU each, left 19 of their 69 cells at batch 128 waiting 40-82% of the timed seconds for data, and
MQRAR's batch-512 cells at 0.37-0.65 of their speed alone (results/benchmarks/gpu_logs/train_throughput_four_at_once.txt).

Writes ``<out>/train_throughput.parquet`` and ``.md`` with the device, date, commit and command. Each row records
the library's default Inductor options (``inductor_defaults``, ``lengthbench/compile_policy.py``) and any a lever set
through ``LENGTHBENCH_INDUCTOR_OPTIONS`` (``inductor_options``): the summary table keeps the rows of today's step
only, and lists the ``--fresh-caches`` rows' warm-ups apart from its ratios (they time 30 steps).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from lengthbench import compile_policy, kernels
from lengthbench.config import build_config
from lengthbench.data import BatchProducer, default_workers
from lengthbench.devices import git_sha
from lengthbench.kernels import _sdpa
from lengthbench.leaderboard import frame_markdown
from lengthbench.runner import Trainer, attention_kernels, device_description, to_device
from lengthbench.tasks import get_task


def measure(task: str, attn: str, pe: str, preset: str, batch_size: int, compile_mode: str, steps: int,
            warmup: int, pad_multiple: int, dynamic: str, trace: bool = False, train_attention: str = "fused",
            train_step: str = "graph-compiled") -> dict:
    built = time.perf_counter()
    config = build_config(task, attn, pe, preset, batch_size=batch_size, compile=compile_mode != "eager",
                          train_attention=train_attention, train_step=train_step,
                          compile_mode=compile_mode if compile_mode != "eager" else "default",
                          train_samples=batch_size * (steps + warmup), eval_every=10**9, checkpoint_every=10**9)
    task_obj = get_task(task)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the tests' tiny cells
    Trainer.pad_multiple = pad_multiple if pad_multiple > 0 else 10**6  # 0: every batch at the widest
    Trainer.max_widths = 64  # the multiple as asked (the runner doubles it past 6 widths)
    Trainer.compile_dynamic = {"auto": None, "static": False, "dynamic": True}[dynamic]
    torch._dynamo.reset()
    said: list[str] = []

    def log(line: str) -> None:
        said.append(line)
        print("  " + line, flush=True)

    trainer = Trainer(config, task_obj, device, Path("/tmp/throughput"), progress=False, log=log)
    trainer_compiled, trainer_dense = trainer.compiled, trainer.dense
    stream = trainer.train_stream()
    started_at = time.perf_counter()
    widths = stream.widths()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    # One producer for the warm-up and the timed steps, as in a training run: the timed steps find its workers
    # started and its queue full (a producer started for them put its workers' start-up in the timed seconds)
    producer = BatchProducer(stream, 0, warmup + steps, workers=default_workers(device.type))
    batches = iter(producer)

    def run(first: int, count: int, trace: bool = False) -> tuple[float, float, float, float]:
        """Seconds for the next ``count`` steps (from step ``first``), the mean padded width, the seconds spent
        waiting for the data workers' next batch, and the seconds of the first half of the steps (the device
        drained at the half)."""
        tokens = 0
        waited = 0.0
        sync()
        started = time.perf_counter()
        # as Trainer.train: models with fused ops train on their dense references where the step compiles
        dense = attention_kernels(trainer.model, False) if trainer.dense else contextlib.nullcontext()
        half = started
        with dense:
            for index in range(count):
                if index == count // 2:
                    sync()
                    half = time.perf_counter()
                asked = time.perf_counter()
                input_ids, labels, features = next(batches)
                waited += time.perf_counter() - asked
                tokens += input_ids.shape[1]
                before = time.perf_counter()
                trainer.step_fn(to_device(input_ids, device), to_device(labels, device),
                                to_device(features, device, torch.float32))
                if trace:  # where the warm-up's time goes: each step's width and seconds (compilations stand out)
                    sync()
                    print(f"  warm-up step {first + index}: width {input_ids.shape[1]}, "
                          f"{time.perf_counter() - before:.2f} s", flush=True)
        sync()
        return time.perf_counter() - started, tokens / max(count, 1), waited, half - started

    # Warm-up: compile (and record CUDA graphs for) every padded width before timing; the model's construction
    # counts in it (a fresh cell pays both)
    try:
        compile_seconds = run(0, warmup, trace)[0]
        compile_seconds += started_at - built
        seconds, mean_width, waited, first_half = run(warmup, steps)
    finally:
        producer.close()
    params = sum(p.numel() for p in trainer.model.parameters())
    # whether the model's fused ops were nodes of the compiled graph (kernels/_bridge.py) or graph breaks
    ops = {name for module in trainer.model.modules() if hasattr(module, "kernel_names")
           for name in module.kernel_names()}
    in_graph = train_step == "graph-compiled" and not trainer_dense and bool(ops & kernels.IN_GRAPH)
    captured = getattr(trainer.step_fn, "graph", None) is not None
    failed = getattr(trainer.step_fn, "failed", "")
    trainer.step_fn = None  # the captured graph's memory goes with it
    # a step that could not compile records the uncompiled one: the row says so
    note = "; ".join(line for line in said if "torch.compile of the training forward failed" in line)
    return dict(note=note, task=task, attn=attn, pe=pe, preset=preset, batch_size=batch_size, train_step=train_step,
                train_attention=train_attention, in_graph=in_graph, fused_ops=",".join(sorted(ops)),
                narrow_tuning=os.environ.get("LENGTHBENCH_NARROW_TUNING", ""),
                inductor_options=os.environ.get("LENGTHBENCH_INDUCTOR_OPTIONS", ""),
                inductor_defaults=today_inductor_defaults(),
                capture_stick=kernels.CAPTURE_STICK,
                capture_tuning=os.environ.get("LENGTHBENCH_CAPTURE_TUNING", ""), sdpa_alibi=_sdpa.SDPA_ALIBI,
                sdpa_backend=_sdpa.SDPA_BACKEND, views=kernels.VIEWS if kernels.takes_views(ops) else "",
                capture_settings=today_capture(",".join(sorted(ops))),
                entmax_backward=kernels.entmax_backward_setting(), captured=captured, capture_error=failed,
                rowwise_fused=bool(_narrow_settings(os.environ.get("LENGTHBENCH_NARROW_TUNING")).get(
                    "rowwise_fused", kernels.ROWWISE_FUSED)),
                compile_mode=compile_mode if train_step == "compiled" else "", pad_multiple=pad_multiple,
                dynamic=dynamic, compiled=trainer_compiled, dense_attention=trainer_dense, steps=steps,
                samples_per_s=steps * batch_size / seconds,
                step_ms=1000 * seconds / steps, data_wait_share=waited / seconds, producer="shared",
                halves=first_half / max(seconds - first_half, 1e-9), warmup_s=compile_seconds,
                parameters=params,
                tokens_per_sample=task_obj.max_tokens(config.train_length), mean_padded_width=mean_width,
                widths=",".join(map(str, widths)), layers=config.n_layers, d_model=config.d_model,
                heads=config.n_heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", "--task", default="mqmtar")
    parser.add_argument("--attns", default="softmax")
    parser.add_argument("--pes", default="rope,nape")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch-sizes", default="128,512")
    parser.add_argument("--train-steps", default="graph-compiled", help="graph-compiled (one CUDA graph a step, "
                        "Inductor's kernels in it: the default), graph (eager kernels in it), compiled (torch.compile "
                        "per bucket width where the model allows, else the fused ops eagerly)")
    parser.add_argument("--compile-modes", default="default", help="for --train-steps compiled")
    parser.add_argument("--pad-multiples", default="8", help="bucket widths for --train-steps compiled (0: pad "
                        "every batch to the widest)")
    parser.add_argument("--dynamic", default="static", help="torch.compile shapes: static (the runner's), auto "
                        "or dynamic")
    parser.add_argument("--train-attentions", "--train-attention", default="fused",
                        help="models with fused ops: train on them (fused, the default) or on their dense references "
                        "(reference); comma-separated for both side by side")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=60, help="untimed steps first (compiles every width, "
                        "captures the graph)")
    parser.add_argument("--trace", action="store_true", help="print each warm-up step's width and time")
    parser.add_argument("--stacks-after", type=float, default=0, help="print every thread's stack after this "
                        "many seconds and exit (a warm-up that hangs shows where)")
    parser.add_argument("--merge", default="", help="comma-separated parquet files of earlier runs: write them "
                        "together to --out (each row keeps its device, date, commit and command) and measure nothing")
    parser.add_argument("--in-graph", default="", help="the fused ops that the default step calls as nodes of its "
                        "compiled graph rather than graph breaks (kernels.IN_GRAPH): all, none or a comma-separated "
                        "list; default: the library's")
    parser.add_argument("--warm-jobs", type=int, default=0, help="first compile every cell in this many processes at "
                        "once, a few steps each (Inductor keeps what it compiles on disk), so that the timed pass finds "
                        "its kernels compiled; its warmup_s is then not a fresh machine's (the rows say cache_warmed)")
    parser.add_argument("--fresh-caches", action="store_true", help="with --warm-jobs: each cell's warm process "
                        "starts with empty Inductor and Triton caches of its own, so that its first_warmup_s is a fresh "
                        "machine's (with --warm-jobs 1, the cell's alone)")
    parser.add_argument("--retries", type=int, default=2, help="measure a cell again, up to this many times, while its "
                        "halves differ by more than 10%% (the row keeps the last measurement, with the first one's warmup_s, and says "
                        "how many it took)")
    parser.add_argument("--baseline", action="store_true", help="measure softmax + RoPE first (and again last) even "
                        "where --attns or --pes leave it out, e.g. --pes nape: the ratios' baseline")
    parser.add_argument("--out", default="results/throughput")
    args = parser.parse_args()
    if args.fresh_caches and args.warm_jobs < 1:
        parser.error("--fresh-caches: the caches are the warm processes' (--warm-jobs 1 or more)")
    if args.in_graph:
        try:
            kernels.IN_GRAPH = kernels.in_graph_set(args.in_graph)
        except ValueError as error:
            sys.exit(f"--in-graph: {error}")
    if args.merge:
        frame = pd.concat([pd.read_parquet(path) for path in args.merge.split(",")], ignore_index=True)
        # a file merged twice (or into a table that holds it already) adds its rows once
        frame = frame.loc[~frame.astype(str).duplicated()].reset_index(drop=True)
        write_frame(frame, Path(args.out))
        return
    if args.stacks_after > 0:
        faulthandler.dump_traceback_later(args.stacks_after, exit=True)
    first_warmups = warm(args) if args.warm_jobs > 0 else {}
    if args.warm_jobs > 0:
        # the warm processes compiled every cell: this one compiles in its own thread rather than starting a pool of
        # compile workers beside its first timed steps (their start takes the host's cores for seconds)
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    rows = []
    for task in args.tasks.split(","):
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            for train_step in args.train_steps.split(","):
                modes = args.compile_modes.split(",") if train_step == "compiled" else ["default"]
                pads = [int(p) for p in args.pad_multiples.split(",")] if train_step == "compiled" else [0]
                cells = [(attn, pe, mode, pad, path) for attn, pe in cell_pairs(args)
                         for mode in modes for pad in pads for path in args.train_attentions.split(",")]
                # softmax + RoPE again after the others (where it ran first and others followed): the run's baseline
                # at its start and its end, whose ratio (``baseline_drift``) says whether the run was steady
                first = cells[0]
                closing = len(cells) > 1 and first[:2] == ("softmax", "rope") and first[4] == "fused"
                group = len(rows)
                for index, (attn, pe, mode, pad, path) in enumerate(cells + ([first] if closing else [])):
                    if path not in ("fused", "reference"):
                        sys.exit(f"--train-attentions: unknown path {path!r}; choose from fused, reference")
                    retries = max(0, args.retries)
                    for attempt in range(retries + 1):
                        row = measure(task, attn, pe, args.preset, batch_size, mode, args.steps, args.warmup, pad,
                                      args.dynamic, args.trace, path, train_step)
                        if attempt == 0:  # the cell's warm-up is its first build's: a retry finds it compiled
                            first_build = row["warmup_s"]
                        row["warmup_s"] = first_build
                        row["attempts"] = attempt + 1
                        if abs(row["halves"] - 1) <= UNSTEADY or attempt == retries:
                            break
                        print(f"  {attn} {pe}: halves {row['halves']:.2f} ({row['samples_per_s']:,.0f} samples/s), "
                              "measured again", flush=True)
                    row["closing"] = index == len(cells)
                    row["cache_warmed"] = args.warm_jobs > 0
                    row["fresh_caches"] = args.fresh_caches
                    row["first_warmup_s"] = first_warmups.get((task, str(batch_size), train_step, attn, pe, path))
                    rows.append(row)
                    if row["closing"]:
                        drift = row["samples_per_s"] / rows[group]["samples_per_s"]
                        for earlier in rows[group:]:
                            earlier["baseline_drift"] = drift
                    gc.collect()
                    torch.cuda.empty_cache()
                    label = train_step if train_step != "compiled" else f"{train_step}/{mode}/pad {pad}"
                    print(f"{task:7s} {attn:13s} {pe:5s} {label:24s} {path:9s} batch {batch_size:4d}: "
                          f"{row['samples_per_s']:9,.0f} samples/s ({row['step_ms']:.2f} ms/step, "
                          f"mean width {row['mean_padded_width']:.1f}, warm-up {row['warmup_s']:.1f} s, data wait "
                          f"{row['data_wait_share']:.0%}, halves {row['halves']:.2f}"
                          f"{', not captured: ' + row['capture_error'] if row['capture_error'] else ''})",
                          flush=True)
                    write(rows, Path(args.out))  # after every row: a run cut short keeps what it has


def cell_pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (mechanism, encoding) pairs that ``args`` measures: every ``--attns`` with every ``--pes``, after softmax +
    RoPE where ``--baseline`` asks for it and they leave it out."""
    pairs = [(attn, pe) for attn in args.attns.split(",") for pe in args.pes.split(",")]
    if getattr(args, "baseline", False) and ("softmax", "rope") not in pairs:
        pairs.insert(0, ("softmax", "rope"))
    return pairs


def warm_commands(args: argparse.Namespace) -> list[list[str]]:
    """One command per cell of ``args`` (each task, batch size, step, mechanism, encoding and path) that runs it
    for a few untimed steps, for :func:`warm`."""
    commands = []
    # a folder of this command's own: commands on one machine at once do not read each other's warm rows
    scratch = Path(tempfile.mkdtemp(prefix="lengthbench-warm-"))
    for task in args.tasks.split(","):
        for batch_size in args.batch_sizes.split(","):
            for train_step in args.train_steps.split(","):
                for attn, pe in cell_pairs(args):
                    for path in args.train_attentions.split(","):
                        commands.append([
                            sys.executable, str(Path(__file__).resolve()), "--tasks", task, "--attns", attn,
                            "--pes", pe, "--preset", args.preset, "--batch-sizes", batch_size,
                            "--train-steps", train_step, "--train-attentions", path,
                            "--compile-modes", args.compile_modes, "--pad-multiples", args.pad_multiples,
                            "--dynamic", args.dynamic, "--steps", "2", "--warmup", str(args.warmup),
                            # a retry would build the cell again in the caches just filled: its warm-up, a
                            # second's, would stand for the cell's (two timed steps are unsteady by nature)
                            "--retries", "0",
                            *(["--in-graph", args.in_graph] if args.in_graph else []),
                            "--out", str(scratch / f"{len(commands)}")])
    return commands


def warm(args: argparse.Namespace) -> dict[tuple, float]:
    """Runs :func:`warm_commands` ``args.warm_jobs`` at a time (their compilations use the CPU's cores at once,
    where one process compiles one cell after another); with ``args.fresh_caches`` each in empty Inductor and Triton
    caches of its own (the timed pass then compiles again, in the command's caches). Returns each warmed cell's
    ``warmup_s`` by ``(task, batch size, step, attn, pe, path)``, the strings of the command line."""
    commands = warm_commands(args)
    started = time.perf_counter()

    def one(command: list[str]) -> tuple[str, dict]:
        # --fresh-caches: a fresh machine's, nothing compiled on disk for this cell
        fresh = getattr(args, "fresh_caches", False)
        with tempfile.TemporaryDirectory(prefix="lengthbench-caches-") if fresh else contextlib.nullcontext() as caches:
            env = None if caches is None else {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
                                               "TRITON_CACHE_DIR": f"{caches}/triton"}
            done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        if done.returncode == 0:
            table = Path(command[command.index("--out") + 1]) / "train_throughput.parquet"
            row = pd.read_parquet(table).iloc[0]
            return "", {(row["task"], str(row["batch_size"]), row["train_step"], row["attn"], row["pe"],
                         row["train_attention"]): float(row["warmup_s"])}
        said = [line for line in done.stderr.splitlines() if line.strip() and "warn" not in line.lower()]
        return f"{' '.join(command[2:8])}: exit {done.returncode}" + (f" ({said[-1][:200]})" if said else ""), {}

    with ThreadPoolExecutor(max_workers=args.warm_jobs) as pool:
        done = list(pool.map(one, commands))
    failed = [message for message, _ in done if message]
    print(f"warmed {len(commands) - len(failed)} of {len(commands)} cells in {time.perf_counter() - started:.0f} s "
          f"({args.warm_jobs} at a time)" + "".join(f"\n  not warmed: {message}" for message in failed), flush=True)
    return {key: seconds for _, seconds in done for key, seconds in seconds.items()}


# a run: one process, its command and the time it wrote its rows (the same command run twice is two runs)
RUN_KEYS = ["command", "created_at"]


def with_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """``vs_softmax_rope``: each row's samples/s over the fastest softmax + RoPE row of its task and batch size
    measured by the same run (side by side in one process; NaN where it measured none)."""
    keys = [*RUN_KEYS, "task", "batch_size"]
    baseline = frame[(frame["attn"] == "softmax") & (frame["pe"] == "rope")].groupby(keys)[
        "samples_per_s"].max().rename("softmax_rope_samples_per_s")
    frame = frame.drop(columns=["softmax_rope_samples_per_s", "vs_softmax_rope"], errors="ignore")
    frame = frame.join(baseline, on=keys)
    frame["vs_softmax_rope"] = frame["samples_per_s"] / frame["softmax_rope_samples_per_s"]
    return frame


def write(rows: list[dict], out: Path) -> None:
    frame = pd.DataFrame(rows)
    frame["device"] = device_description(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    frame["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    frame["commit"] = git_sha()
    frame["command"] = command_line()
    write_frame(frame, out)


# the environment variables that choose the ops a training step takes: a command that set one names it
PATH_VARIABLES = ("LENGTHBENCH_IN_GRAPH", "LENGTHBENCH_CAPTURE_STICK", "LENGTHBENCH_NARROW_TUNING",
                  "LENGTHBENCH_CAPTURE_TUNING", "LENGTHBENCH_SDPA_ALIBI", "LENGTHBENCH_SDPA_BACKEND",
                  "LENGTHBENCH_INDUCTOR_OPTIONS", "LENGTHBENCH_VIEWS")


def command_line() -> str:
    """This process's command, after the path-choosing environment variables it ran with."""
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in PATH_VARIABLES if os.environ.get(name)]
    return " ".join([*env, "python", *sys.argv])


# a run whose closing softmax + RoPE row differs from its first by more than this share, or a row whose timed
# steps' two halves do, is marked unsteady
UNSTEADY = 0.10


def unsteady_rows(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's ratio is an unsteady measurement: its run's ``baseline_drift`` or its own ``halves``
    (rows without the columns count as steady) more than :data:`UNSTEADY` away from 1."""
    flags = pd.Series(False, index=rows.index)
    for column in ("baseline_drift", "halves"):
        if column in rows:
            flags |= (pd.to_numeric(rows[column], errors="coerce") - 1).abs() > UNSTEADY
    return flags


# the mechanisms whose training step calls torch SDPA (kernels/_sdpa.py) in the throughput table
SDPA_MECHANISMS = ("softmax", "ssmax", "gated", "diffsoftmax", "assmax", "adatemp")


def today_inductor_defaults() -> str:
    """The library's default Inductor options as a row records them (``inductor_defaults``)."""
    return json.dumps(compile_policy.INDUCTOR_OPTIONS, sort_keys=True)


def inductor_defaults(rows: pd.DataFrame) -> pd.Series:
    """Each row's default Inductor options; rows from before the column ran older ones (``""``)."""
    return _column(rows, "inductor_defaults", "").fillna("").astype(str)


def fresh_warmups(rows: pd.DataFrame) -> str:
    """Markdown: each cell's newest warm-up alone in empty caches (``first_warmup_s`` of ``fresh_caches`` rows),
    the slowest first; empty where there is none."""
    rows = rows[rows["first_warmup_s"].notna()] if "first_warmup_s" in rows else rows[:0]
    if rows.empty:
        return ""
    rows = rows.sort_values("created_at", kind="stable").drop_duplicates(
        ["task", "attn", "pe", "batch_size"], keep="last").sort_values("first_warmup_s", ascending=False)
    cells = "; ".join(f"{r.task} b{r.batch_size} {r.attn} + {r.pe} {r.first_warmup_s:.1f} s (run {r.run})"
                      for r in rows.itertuples())
    return ("Warm-up of one cell alone in empty Inductor and Triton caches (a fresh machine's: its warm process "
            "built the model, compiled and captured the step; `first_warmup_s` of `--warm-jobs 1 --fresh-caches`), "
            "under today's settings: " + cells + ".\n\n")


def _column(rows: pd.DataFrame, name: str, fill=None) -> pd.Series:
    """``rows[name]``, or for frames from before that column, ``fill`` in every row."""
    return rows[name] if name in rows else pd.Series(fill, index=rows.index, dtype=object)


def alibi_path(rows: pd.DataFrame) -> pd.Series:
    """How each row's SDPA took an ALiBi bias: its ``sdpa_alibi``, and for rows from before that column "mask"
    where an SDPA mechanism ran with a biased encoding; elsewhere the library's path (no bias to take)."""
    path = _column(rows, "sdpa_alibi")
    older = rows["attn"].isin(SDPA_MECHANISMS) & rows["pe"].isin(("nape", "alibi"))
    return path.where(path.notna(), older.map({True: "mask", False: _sdpa.SDPA_ALIBI}))


def sdpa_backend(rows: pd.DataFrame) -> pd.Series:
    """Each row's SDPA backend (``LENGTHBENCH_SDPA_BACKEND``): its ``sdpa_backend``; rows from before that column took
    torch's own (``auto``)."""
    return _column(rows, "sdpa_backend").fillna("auto")


def entmax_backward(rows: pd.DataFrame, setting: str | None = None) -> pd.Series:
    """The training-width 1.5-entmax backward (``narrow`` or ``rowwise``) each row's mechanism took under
    ``setting``, or under its own ``entmax_backward`` (rows from before that column: ``narrow``); empty for the
    mechanisms that do not run it."""
    recorded = _column(rows, "entmax_backward")
    out = []
    for attn, tokens, own in zip(rows["attn"], rows.get("tokens_per_sample", pd.Series(0, index=rows.index)),
                                 recorded, strict=True):
        if attn not in ("entmax", *kernels.ROW_SCALED_ENTMAX):
            out.append("")
            continue
        rule = setting or (own if isinstance(own, str) and own else "narrow")
        tokens = 0 if tokens is None or pd.isna(tokens) else int(tokens)
        out.append(kernels.entmax_backward_taken(rule, attn in kernels.ROW_SCALED_ENTMAX, tokens))
    return pd.Series(out, index=rows.index, dtype=object)


def _narrow_settings(text) -> dict:
    return json.loads(text) if isinstance(text, str) and text else {}


def rowwise_fused(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's rowwise 1.5-entmax backward ran without its dq kernel: its ``rowwise_fused``, or for rows
    from before that column its ``narrow_tuning``'s key, else false (the dq kernel ran)."""
    recorded = _column(rows, "rowwise_fused")
    tunings = _column(rows, "narrow_tuning", "")
    out = [bool(own) if own is not None and not pd.isna(own) else
           bool(_narrow_settings(tuning).get("rowwise_fused", False)) for own, tuning in zip(recorded, tunings, strict=True)]
    return pd.Series(out, index=rows.index, dtype=bool)


def views(rows: pd.DataFrame) -> pd.Series:
    """Where each row's model took its query, key and value views (``kernels.VIEWS``): its ``views``; for rows from
    before that column, TDA's ``unit_views`` (TDA alone took the op then), else "compiled" (the model's prologue under
    Inductor); "" for the models that call no fused op (SDPA's)."""
    recorded, older = _column(rows, "views"), _column(rows, "unit_views")
    names = [[*row_ops(ops, attn), attn] for ops, attn in zip(_column(rows, "fused_ops"), rows["attn"], strict=True)]
    out = []
    for own, old, ops in zip(recorded, older, names, strict=True):
        if not (kernels.takes_views(ops) or ops[-1] in kernels.ROW_SCALED_ENTMAX):
            out.append("")
        else:
            out.append(next((value for value in (own, old) if isinstance(value, str) and value), "compiled"))
    return pd.Series(out, index=rows.index, dtype=object)


def narrow_tuned(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's ``narrow_tuning`` set anything other than today's default (a key set to the library's
    value, e.g. ``rowwise_fused`` measured before it became the default, is the library's path)."""
    today = {"rowwise_fused": kernels.ROWWISE_FUSED}
    tunings = _column(rows, "narrow_tuning", "")
    return pd.Series([any(key not in today or value != today[key] for key, value in _narrow_settings(tuning).items())
                      for tuning in tunings], index=rows.index, dtype=bool)


# the stick-breaking family's capture tiles before rows recorded their capture settings (capture_stick "wide")
STICK_CAPTURE_BEFORE = {"fwd": [32, 32, 4, 2], "bwd": [32, 32, 4, 2]}
# the ops whose capture settings were their own defaults (no tuning) before rows recorded them
OWN_DEFAULTS_BEFORE = ("softpick", "tra")
# capture settings the library took after rows recorded theirs: rows from before ran without them
CAPTURE_KEYS_SINCE = {"tda": ("fused_bwd",)}
# keys the stick-breaking family's capture settings took later, with what rows recorded without them ran (the
# kernels' defaults then: two-bf16 sums, the causal masks on every tile, no loads ahead, empty tiles' values skipped);
# Sieve takes them in its ``walk``
PINNED_BEFORE = {"cumsum": "bf16x2", "full_tiles": False, "prefetch": False, "skip_empty": True}


def _pinned(settings: dict) -> dict:
    """``settings`` (op -> capture settings) with the keys of :data:`PINNED_BEFORE` that a stick-breaking op (or
    Sieve's walk) lacks filled with what it ran."""
    out = {}
    for op, tuning in settings.items():
        if op in kernels.STICK_FAMILY:
            tuning = {**PINNED_BEFORE, **tuning}
        elif op == "sieve" and isinstance(tuning.get("walk"), dict):
            tuning = {**tuning, "walk": {**PINNED_BEFORE, **tuning["walk"]}}
        out[op] = tuning
    return out


def _settings_json(settings: dict) -> str:
    return json.dumps(json.loads(json.dumps(settings)), sort_keys=True)  # tuples as lists, keys sorted


def row_ops(fused_ops, attn=None) -> list[str]:
    """A row's fused ops: its ``fused_ops``, or for rows from before that column, softpick's, TRA's and TDA's own op
    (:data:`OWN_DEFAULTS_BEFORE`, :data:`CAPTURE_KEYS_SINCE`; the others' rows then are told apart by other columns)."""
    if fused_ops is None or pd.isna(fused_ops):
        return [attn] if attn in OWN_DEFAULTS_BEFORE or attn in CAPTURE_KEYS_SINCE else []
    return [op for op in str(fused_ops).split(",") if op]


def today_capture(fused_ops, attn=None) -> str:
    """The library's capture settings (``kernels.CAPTURE_TUNING``) of a row's fused ops (:func:`row_ops`), as JSON."""
    return _settings_json({op: kernels.CAPTURE_TUNING.get(op, {}) for op in row_ops(fused_ops, attn)})


def capture_settings(rows: pd.DataFrame) -> pd.Series:
    """The capture settings each row's fused ops ran with, as JSON: its ``capture_settings``, or for rows from before
    that column the library's with ``capture_tuning``'s keys joined (the stick-breaking family's "wide" ops on 32-row
    tiles then, softpick and TRA on their own defaults, TDA without the keys of :data:`CAPTURE_KEYS_SINCE`)."""
    out = []
    for _, row in rows.iterrows():
        recorded = row.get("capture_settings")
        if isinstance(recorded, str) and recorded:
            out.append(_settings_json(_pinned(json.loads(recorded))))
            continue
        ops = row_ops(row.get("fused_ops"), row.get("attn"))
        tuning = row.get("capture_tuning")
        overrides = kernels.capture_tuning_overrides(tuning) if isinstance(tuning, str) and tuning else {}
        settings = {}
        for op in ops or sorted(overrides):  # (a row without fused_ops: the ops its tuning names)
            base = dict(kernels.CAPTURE_TUNING.get(op, {}))
            if op in kernels.STICK_FAMILY and row.get("capture_stick") == "wide":
                base = dict(STICK_CAPTURE_BEFORE)
            elif op in OWN_DEFAULTS_BEFORE:
                base = {}
            base = {key: value for key, value in base.items() if key not in CAPTURE_KEYS_SINCE.get(op, ())}
            settings[op] = {**base, **overrides.get(op, {})}
        out.append(_settings_json(_pinned(settings)))
    return pd.Series(out, index=rows.index, dtype=object)


def newest_summary(frame: pd.DataFrame) -> str:
    """Markdown: for the default step (``graph-compiled`` on the fused ops, those of ``kernels.IN_GRAPH`` as nodes of
    its graph), each mechanism's ``vs_softmax_rope`` per task, batch size and encoding from the newest run that
    measured it (its run number beside it), and
    softmax + RoPE's samples/s; empty where no row is of the default step."""
    rows = frame[(frame["train_step"] == "graph-compiled") & (frame["train_attention"] == "fused")]
    if "fused_ops" in rows:  # rows of the path the library takes now (kernels.IN_GRAPH), where a row says
        now = [None if pd.isna(ops) else bool(set(str(ops).split(",")) & kernels.IN_GRAPH) for ops in rows["fused_ops"]]
        rows = rows[[seen is None or pd.isna(seen) or bool(seen) == taken
                     for seen, taken in zip(rows["in_graph"], now, strict=True)]]
    # the stick-breaking family's ops as the library takes them now (kernels.CAPTURE_STICK); rows from before the
    # capture_stick column ran the training-width kernels (narrow)
    taken = _column(rows, "capture_stick").fillna("narrow")
    other = rows["attn"].isin(kernels.STICK_FAMILY) & (taken != kernels.CAPTURE_STICK)
    # rows of a lever set from the environment (a tuning that is not the library's) are comparisons, not the path
    tuned = pd.Series(False, index=rows.index)
    if "inductor_options" in rows:
        tuned |= rows["inductor_options"].fillna("").astype(str).str.len().gt(0)
    tuned |= narrow_tuned(rows)
    tuned |= capture_settings(rows) != [today_capture(ops, attn) for ops, attn in
                                        zip(rows.get("fused_ops", [None] * len(rows)), rows["attn"], strict=True)]
    tuned |= inductor_defaults(rows) != today_inductor_defaults()
    tuned |= alibi_path(rows) != _sdpa.SDPA_ALIBI
    tuned |= sdpa_backend(rows) != _sdpa.SDPA_BACKEND
    prologue = views(rows)
    tuned |= (prologue != "") & (prologue != kernels.VIEWS)
    tuned |= entmax_backward(rows) != entmax_backward(rows, kernels.entmax_backward_setting())
    tuned |= (entmax_backward(rows) == "rowwise") & (rowwise_fused(rows) != kernels.ROWWISE_FUSED)
    rows = rows[~other & ~tuned]
    # each cell's warm-up alone in empty caches (a fresh machine's), where a run measured it under today's settings;
    # such runs time a few steps only (their ratios are not the table's)
    fresh = _column(rows, "fresh_caches", False).fillna(False).astype(bool)
    warmups = fresh_warmups(rows[fresh])
    rows = rows[~fresh]
    if rows.empty:
        return ""
    if "closing" in rows:  # a run's closing softmax + RoPE row counts in its ratios (with_ratios), not here
        rows = rows[rows["closing"].fillna(False).astype(bool) == False]  # noqa: E712
    unsteady = unsteady_rows(rows)
    # a cell's newest row measured steady (its halves recorded, and they and its run's drift within bounds); where
    # there is none, its newest row
    halves = _column(rows, "halves", float("nan"))
    rows = rows.assign(unsteady=unsteady, steady=halves.notna() & ~unsteady)
    rows = rows.sort_values(["steady", "created_at"], kind="stable").drop_duplicates(
        ["task", "attn", "pe", "batch_size"], keep="last")
    unsteady = rows["unsteady"]
    rows = rows.assign(column=rows["task"] + " b" + rows["batch_size"].astype(str) + " " + rows["pe"],
                       cell=[f"{ratio:.2f} ({run}{', unsteady' if flag else ''})" for ratio, run, flag
                             in zip(rows["vs_softmax_rope"], rows["run"], unsteady, strict=True)])
    table = rows.pivot(index="attn", columns="column", values="cell")
    missing = bool(table.isna().to_numpy().any())
    table = table.fillna("-")
    table = table[sorted(table.columns)].reset_index()
    base = rows[(rows["attn"] == "softmax") & (rows["pe"] == "rope")]
    # the baseline of the ratios: the faster of a run's first and closing softmax + RoPE rows
    speeds = "; ".join(f"{r.task} b{r.batch_size} {r.softmax_rope_samples_per_s:,.0f} (run {r.run})"
                       for r in base.sort_values(["task", "batch_size"]).itertuples())
    # rows measured before the runs said which path their fused ops took: they describe the path of their commit
    unsaid = rows[rows["in_graph"].isna() & ~rows["attn"].isin(["softmax", "ssmax"])] if "in_graph" in rows else rows[:0]
    older = ""
    if not unsaid.empty:
        older = (" Cells from runs " + ", ".join(map(str, sorted(unsaid["run"].unique()))) + " predate the `in_graph` "
                 "column: they measured the fused ops of their commit's path (graph breaks, TDA's op in the graph from "
                 "commit f5bbe7d on), not the default step of today, where every fused op is a node of the graph.")
    if other.any():
        older += (f" Rows of {', '.join(kernels.STICK_FAMILY)} measured with their ops other than today's "
                  f"(`capture_stick` not `{kernels.CAPTURE_STICK}`; rows without the column ran the training-width "
                  "kernels) are left out of this table.")
    if tuned.any():
        older += (" Rows measured with `LENGTHBENCH_NARROW_TUNING` (other than today's settings) or `LENGTHBENCH_INDUCTOR_OPTIONS` set, with capture settings other than today's "
                  "(`LENGTHBENCH_CAPTURE_TUNING`, or the stick-breaking family's 32-row tiles before 64), or with "
                  f"`sdpa_alibi` other than `{_sdpa.SDPA_ALIBI}` or `sdpa_backend` other than `{_sdpa.SDPA_BACKEND}` "
                  "(rows without the column took torch's own), or whose 1.5-entmax backward at the training widths "
                  f"is not the one `{kernels.entmax_backward_setting()}` gives them (`entmax_backward`; rows without "
                  "the column took the narrow one), or whose rowwise backward ran "
                  f"{'with' if kernels.ROWWISE_FUSED else 'without'} its dq kernel (`rowwise_fused`; rows without "
                  f"the column and its tuning key ran it), or whose model with a fused op took its query, key and value "
                  f"views other than `{kernels.VIEWS}` (`views`; rows without the column took them compiled, TDA's "
                  "as its `unit_views` says) (levers compared against the library's settings; softmax and SSMax "
                  "with NAPE before the column took the bias as a mask), or under default Inductor options other "
                  f"than today's `{today_inductor_defaults()}` (`inductor_defaults`; rows without the column ran "
                  "older ones), are left out of this table.")
    if unsteady.any():
        older += (f" `unsteady`: the run measured softmax + RoPE at its start and again at its end, and the two differ "
                  f"by more than {UNSTEADY:.0%} (`baseline_drift`), or the cell's own timed steps ran more than "
                  f"{UNSTEADY:.0%} faster or slower in their first half than in their second (`halves`): its ratio is "
                  "not a steady measurement. A cell shows its newest row measured steady, and its newest row only where "
                  "no run measured it steady.")
    if missing:
        older += " `-`: no run measured the cell on today's path."
    return ("The default step (one CUDA graph, compiled, fused ops): each mechanism's samples/s over softmax + "
            "RoPE's in the same run, from the newest run that measured it (its number in brackets; the runs are "
            "listed below). softmax + RoPE, samples/s (the faster of a run's first and closing rows): " + speeds + "." + older + "\n\n" + frame_markdown(table)
            + "\n\n" + warmups)


def write_frame(frame: pd.DataFrame, out: Path) -> None:
    """``<out>/train_throughput.parquet`` and ``.md``: every row, its ratio to softmax + RoPE, and per command
    the device, date and commit it ran with."""
    frame = with_ratios(frame)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "train_throughput.parquet", index=False)
    commands = frame.drop_duplicates(RUN_KEYS)
    number = {tuple(key): index + 1 for index, key in enumerate(commands[RUN_KEYS].itertuples(index=False))}
    frame["run"] = [number[tuple(key)] for key in frame[RUN_KEYS].itertuples(index=False)]
    runs = "\n".join(f"{index + 1}. {row.device}, {row.created_at}, commit {row.commit}: `{row.command}`"
                     for index, row in enumerate(commands.itertuples()))
    if "train_attention" not in frame:  # rows measured before the column: the graph steps ran the references
        frame["train_attention"] = None
    if "note" not in frame:
        frame["note"] = ""
    if "in_graph" not in frame:
        frame["in_graph"] = None
    columns = ["run", "task", "attn", "pe", "batch_size", "train_step", "train_attention", "in_graph", "compile_mode",
               "captured",
               "samples_per_s",
               "vs_softmax_rope", "step_ms", "mean_padded_width", "warmup_s"]
    if "data_wait_share" in frame and frame["data_wait_share"].notna().any():
        columns.append("data_wait_share")
    if "capture_stick" in frame and frame["capture_stick"].notna().any():
        columns.insert(columns.index("in_graph") + 1, "capture_stick")
    for column in ("narrow_tuning", "capture_tuning", "inductor_options"):  # the levers a comparison set, where one did
        if column in frame and frame[column].fillna("").astype(str).str.len().gt(0).any():
            columns.insert(columns.index("in_graph") + 1, column)
    if "sdpa_alibi" in frame and frame["sdpa_alibi"].notna().any():
        columns.insert(columns.index("in_graph") + 1, "sdpa_alibi")
    if "sdpa_backend" in frame and frame["sdpa_backend"].fillna("auto").ne("auto").any():
        columns.insert(columns.index("in_graph") + 1, "sdpa_backend")
    for column in ("unit_views", "views"):
        if column in frame and frame[column].fillna("").astype(str).str.len().gt(0).any():
            columns.insert(columns.index("in_graph") + 1, column)
    if "halves" in frame and frame["halves"].notna().any():
        columns.append("halves")
    if "attempts" in frame and frame["attempts"].fillna(1).gt(1).any():
        columns.append("attempts")
    if "producer" in frame and frame["producer"].notna().any():
        columns.append("producer")
    if "cache_warmed" in frame and frame["cache_warmed"].fillna(False).astype(bool).any():
        columns.append("cache_warmed")
    if "first_warmup_s" in frame and frame["first_warmup_s"].notna().any():
        columns.insert(columns.index("warmup_s") + 1, "first_warmup_s")
    if "fresh_caches" in frame and frame["fresh_caches"].fillna(False).astype(bool).any():
        columns.insert(columns.index("first_warmup_s") + 1, "fresh_caches")
    if "baseline_drift" in frame and frame["baseline_drift"].notna().any():
        columns.append("baseline_drift")
    if frame["note"].fillna("").str.len().gt(0).any():  # what a row's numbers alone do not say
        columns.append("note")
    (out / "train_throughput.md").write_text(
        "# Training throughput\n\n" + newest_summary(frame) + "Runs (device, date, commit, command):\n\n" + runs + "\n\n"
        "`vs_softmax_rope`: samples/s over the fastest softmax + RoPE row of the same task and batch size measured "
        "by the same run. `warmup_s`: the model's construction and the untimed first steps (compilation, graph "
        "capture); with `cache_warmed`, Inductor's caches were filled first by `--warm-jobs` processes, and "
        "`first_warmup_s` is the cell's warm-up in its own such process (with the caches the command found, several "
        "cells compiling at once; with `fresh_caches`, empty caches of its own: a fresh machine's). `data_wait_share`: "
        "the share of the timed seconds spent waiting for the data workers' next "
        "batch (`producer` `shared`: the producer that fed the warm-up feeds the timed steps, as in a training run; "
        "rows without it started one for the timed steps, and its workers' start-up fell in their timed seconds). "
        "`halves`: "
        "the seconds of the timed steps' first half over their second's (1: steady within the cell); `attempts`: "
        "the measurements a cell took (`--retries`: measured again while its halves differed by more than 10%; the "
        "row is the last)."
        "\n\n" + frame_markdown(frame[columns], ".2f") + "\n")


if __name__ == "__main__":
    main()
