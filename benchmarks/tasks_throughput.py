"""Generation throughput of every registered task, on one CPU core.

    python benchmarks/tasks_throughput.py [--tasks copy,mqmtar] [--repeats 3] [--out results/benchmarks]

For each task: samples/s and tokens/s (realised tokens, padding excluded) at n = 64 (one batch of
512), n = 4,096 (512 samples in chunks) and n = 65,536 (1,000 samples in chunks of ``--chunk-tokens``
tokens). The target (TASKS.md, "Throughput"): 1,000 samples at n = 65,536 in under 5 s on one core.
Writes ``tasks_throughput.parquet`` and ``.md`` (each row with its device, date, commit and command) under ``--out``; the best
of ``--repeats`` timings is kept, each timed from a fresh stream position.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

TARGET_SECONDS = 5.0
# (nominal length, samples, samples per call)
POINTS = [(64, 512, 512), (4096, 512, None), (65_536, 1000, None)]


def pin_to_one_core() -> str:
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        return f"pinned to core {core}"
    return "not pinned"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}; {os.cpu_count()} logical CPUs; Python {platform.python_version()}; numpy {np.__version__}"


def time_point(task, n: int, samples: int, per_call: int, repeats: int) -> tuple[float, int]:
    best, tokens = float("inf"), 0
    for repeat in range(repeats):
        first = repeat * samples  # fresh samples each repeat
        start, tokens = time.perf_counter(), 0
        for offset in range(0, samples, per_call):
            batch = task.batch(np.arange(first + offset, first + min(samples, offset + per_call)), n, "test", 0)
            tokens += int(batch.realised_tokens.sum())
        best = min(best, time.perf_counter() - start)
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-tokens", type=int, default=1 << 18, help="tokens per call beyond n = 64")
    parser.add_argument("--out", default="results/benchmarks")
    args = parser.parse_args()

    pinned = pin_to_one_core()
    from lengthbench.tasks import get_task, task_names

    names = [t for t in args.tasks.split(",") if t] or task_names()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for name in names:
        task = get_task(name)
        for nominal, samples, per_call in POINTS:
            n = max(nominal, task.min_length())  # passkey-multi starts at 65
            per_call = per_call or max(1, args.chunk_tokens // task.max_tokens(n))
            task.batch([0], n, "test", 0)  # warm-up
            seconds, tokens = time_point(task, n, samples, per_call, args.repeats)
            rows.append(dict(task=name, point=nominal, n=n, samples=samples, samples_per_call=per_call, seconds=seconds,
                             samples_per_s=samples / seconds, tokens_per_s=tokens / seconds,
                             tokens_per_sample=tokens / samples))
            print(f"{name:16s} n={n:6d} {samples:5d} samples in {seconds:7.3f} s  "
                  f"{samples / seconds:10.1f} samples/s  {tokens / seconds / 1e6:7.2f} M tokens/s", flush=True)

    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    frame = pd.DataFrame(rows)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    from lengthbench.devices import git_sha  # after the timings: it imports torch, the generators none

    sha, command = git_sha(), "python " + " ".join([sys.argv[0], *sys.argv[1:]])
    frame["device"], frame["created_at"], frame["git_sha"], frame["command"] = machine(), now, sha, command
    frame["load_average"] = f"{load_before} / {load_after}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "tasks_throughput.parquet", index=False)

    big = frame[frame.point == 65_536]
    missing = big[big.seconds > TARGET_SECONDS].task.tolist()
    lines = [
        "# Task generation throughput",
        "",
        f"- Machine: {machine()}; {pinned} (one core); load average before / after: {load_before} / {load_after}"
        " (other jobs share this machine: timings on an idle core are lower).",
        f"- Date: {now}; git {sha}.",
        f"- Command: `{command}`",
        f"- Best of {args.repeats}; tokens are realised tokens (no padding); n = 64 in one batch of 512,",
        f"  n = 4,096 and 65,536 in calls of about {args.chunk_tokens:,} tokens.",
        f"- Target: 1,000 samples at n = 65,536 in under {TARGET_SECONDS:.0f} s on one core: "
        + ("met by every task." if not missing else f"missed by {', '.join(missing)}."),
        "",
        "| task | n=64 samples/s | n=64 Mtok/s | n=4096 samples/s | n=4096 Mtok/s "
        "| n=65536 samples/s | n=65536 Mtok/s | 1,000 at 65,536 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, group in frame.groupby("task", sort=False):
        cells = []
        for point, _, _ in POINTS:
            row = group[group.point == point].iloc[0]
            cells += [f"{row.samples_per_s:,.0f}", f"{row.tokens_per_s / 1e6:.1f}"]
        big_row = group[group.point == 65_536].iloc[0]
        note = "" if (group.n == group.point).all() else " (n = 64 point run at its minimum, n = 65)"
        lines.append(f"| {name}{note} | " + " | ".join(cells) + f" | {big_row.seconds * 1000 / big_row.samples:.2f} |")
    (out / "tasks_throughput.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'tasks_throughput.parquet'} and {out / 'tasks_throughput.md'}")


if __name__ == "__main__":
    main()
