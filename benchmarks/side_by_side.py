"""Cells side by side on one GPU: samples/s per GPU with 1, 2, 3 training processes at once, with and without
NVIDIA MPS; the factors ``lengthbench sweep --budget`` plans with and ``--per-gpu auto`` chooses by.

Each measurement starts ``cells`` copies of ``benchmarks/train_throughput.py`` (the runner's training step on the
task's `paper` model, batch 128, softmax, ``--steps`` timed steps after ``--warmup``) at once and reads each one's
samples/s; with ``--mps on`` an MPS control daemon runs for the measurement (started and stopped here, as the sweep
does). ``slowdown`` is a process's time over the one alone (how much longer each cell takes beside the others),
``speedup`` the GPU's samples/s over one alone. The timed windows of the copies overlap, not exactly: the copies
finish their warm-ups seconds apart (``spread_s``, the difference of their ends).

    python benchmarks/side_by_side.py --tasks copy,mqrar,mqmtar --cells 1,2,3 --mps off,on --out results/benchmarks

Writes ``<out>/side_by_side.parquet`` and ``.md`` (rows of other tasks, counts or devices already there are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from lengthbench.devices import provenance
from lengthbench.leaderboard import frame_markdown
from lengthbench.mps import daemon_running, mps_for_sweep

HERE = Path(__file__).resolve().parent
KEYS = ["task", "pe", "cells", "mps", "device"]


def measure(task: str, pe: str, cells: int, steps: int, warmup: int) -> list[dict]:
    """Start ``cells`` training processes at once; each one's train_throughput row plus its end time."""
    with tempfile.TemporaryDirectory() as folder:
        processes = []
        for index in range(cells):
            out = Path(folder) / str(index)
            command = [sys.executable, str(HERE / "train_throughput.py"), "--tasks", task, "--attns", "softmax",
                       "--pes", pe, "--preset", "paper", "--batch-sizes", "128", "--steps", str(steps), "--warmup",
                       str(warmup), "--retries", "0", "--out", str(out)]
            env = dict(os.environ, LENGTHBENCH_DATA_WORKERS=str(max(1, (os.cpu_count() or 2) // cells - 1)))
            processes.append((subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                               text=True), out))
        rows = []
        for process, out in processes:
            _, stderr = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"{task} x {cells}: a process failed: {stderr.strip().splitlines()[-1:]}")
            row = pd.read_parquet(out / "train_throughput.parquet").iloc[-1].to_dict()
            row["ended"] = (out / "train_throughput.parquet").stat().st_mtime
            rows.append(row)
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="copy,mqrar,mqmtar")
    parser.add_argument("--pe", default="rope")
    parser.add_argument("--cells", default="1,2,3")
    parser.add_argument("--mps", default="off,on")
    parser.add_argument("--steps", type=int, default=3000, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--out", default="results/benchmarks")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("side_by_side.py measures cells sharing a GPU: it needs one")
    if daemon_running():
        sys.exit("an MPS daemon runs already: stop it first (echo quit | nvidia-cuda-mps-control), so that the "
                 "measurements without MPS are without it")
    stamp = provenance(torch.device("cuda"), sys.argv)
    rows = []
    for task in args.tasks.split(","):
        alone = None
        for mode in args.mps.split(","):
            for cells in (int(c) for c in args.cells.split(",")):
                if cells == 1 and mode == "on":
                    continue  # one process alone: MPS changes nothing to share
                with mps_for_sweep("on" if mode == "on" else "off", True, say=lambda line: print(line, flush=True)):
                    started = time.perf_counter()
                    measured = measure(task, args.pe, cells, args.steps, args.warmup)
                each = sum(r["samples_per_s"] for r in measured) / cells
                if cells == 1:
                    alone = each
                ends = [r["ended"] for r in measured]
                row = dict(task=task, attn="softmax", pe=args.pe, d_model=int(measured[0]["d_model"]),
                           layers=int(measured[0]["layers"]), batch_size=128, cells=cells, mps=mode == "on",
                           samples_per_s_each=each, samples_per_s_gpu=each * cells,
                           alone_samples_per_s=alone, slowdown=alone / each if alone else float("nan"),
                           speedup=each * cells / alone if alone else float("nan"),
                           spread_s=max(ends) - min(ends), wall_s=time.perf_counter() - started, **stamp)
                print(json.dumps({k: row[k] for k in ("task", "cells", "mps", "samples_per_s_gpu", "slowdown",
                                                       "speedup")}, default=str), flush=True)
                rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    path = out / "side_by_side.parquet"
    if path.exists():
        old = pd.read_parquet(path)
        keep = ~old.set_index(KEYS).index.isin(frame.set_index(KEYS).index)
        frame = pd.concat([old[keep], frame], ignore_index=True)
    frame = frame.sort_values(["task", "mps", "cells"]).reset_index(drop=True)
    frame.to_parquet(path, index=False)
    columns = ["task", "d_model", "layers", "cells", "mps", "samples_per_s_gpu", "slowdown", "speedup", "spread_s",
               "device", "created_at", "git_sha"]
    table = frame[columns].copy()
    table["created_at"] = table["created_at"].str[:10]
    (out / "side_by_side.md").write_text(
        "# Cells side by side on one GPU\n\n"
        "Training processes of the task's `paper` model (softmax, batch 128) at once on one GPU: the GPU's "
        "samples/s, each process's `slowdown` against one alone, the GPU's `speedup`; `mps`: under an NVIDIA MPS "
        "daemon. Measured by `benchmarks/side_by_side.py` (its docstring says how); `lengthbench sweep --budget` "
        "plans with `slowdown` and `--per-gpu auto` chooses by `speedup`.\n\n"
        + frame_markdown(table, ".2f") + "\n\nCommands: "
        + "; ".join(f"`{c}`" for c in frame["command"].unique()) + "\n")


if __name__ == "__main__":
    main()
