"""Evaluation time at the longest length: a task's model (by default the ``paper`` MQMTAR model: 4 layers,
d 512, 16 heads) scoring samples at n = 65,536 through the runner's Evaluator (adaptive batch, fused
kernels), per mechanism.

    python benchmarks/eval_time.py --attns softmax,sieve --samples 1000,50 --out results/benchmarks

``--samples`` gives one count per mechanism (or one for all). The model is freshly initialised: timing does
not depend on what it learned, except in the sparse kernels, whose work depends on the scores (the entmax
threshold search certifies and lists narrow rows, and leaves wide ones, such as an untrained model's
near-uniform rows, to full passes over their keys). ``--runs RESULTS`` times trained models instead: for each
``--attns`` entry (``attn`` or ``attn:pe``) the finished run of that task, mechanism and encoding in
``RESULTS`` (its selected checkpoint, ``checkpoints/<run_id>/model.pt``):

    python benchmarks/eval_time.py --runs /tmp/gres --attns entmax:rope,asentmax:nape --samples 200

Each mechanism gets one untimed warm-up sample first (compilation of the kernels). Rows record the samples
actually timed; ``s_per_1000`` scales the measured rate to 1,000 samples and ``projected`` says when it is
such a projection rather than a 1,000-sample run.
Writes ``<out>/eval_time.parquet`` and ``.md`` (each row with its device, date, commit and command); the rows
of earlier commands there stay, except those measured again (same task, mechanism, encoding, n and kind of
weights, fresh or trained). A trained row also carries its run's in-distribution token accuracy. ``bash
benchmarks/gpu_checks.sh eval-trained`` trains the models of the committed trained rows and times them.
``--device cpu`` with a small ``--n`` checks a setup on a machine without a GPU (the dense references; no peak
memory).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from lengthbench.config import build_config
from lengthbench.devices import provenance
from lengthbench.errors import UsageError
from lengthbench.leaderboard import frame_markdown
from lengthbench.runner import (
    Evaluator,
    build_model,
    load_model,
    newest_trained_run,
)
from lengthbench.store import load_results
from lengthbench.tasks import get_task


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(task_name: str, attn: str, pe: str, n: int, samples: int, runs: Path | None = None,
            device: torch.device = torch.device("cuda"), run_id: str = "") -> dict:
    """Seconds to score ``samples`` samples at ``n``: the fresh ``paper`` model, or run ``run_id`` of ``runs``."""
    if runs is None:
        task = get_task(task_name)
        config = build_config(task_name, attn, pe, "paper")
        torch.manual_seed(0)
        model = build_model(config, task).to(device)
        weights = "fresh"
        accuracy = float("nan")
    else:
        model, task, config = load_model(runs, run_id, str(device))
        weights = f"trained: {run_id}"
        accuracy = in_distribution_accuracy(runs, run_id)
    evaluator = Evaluator(model, task, device, seed=0)
    evaluator.score(n, 1)  # warm-up: kernel compilation
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    scores = evaluator.score(n, samples)
    synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return dict(task=task_name, attn=attn, pe=pe, n=n, tokens=scores.realised_tokens, samples=samples,
                seconds=seconds, s_per_1000=seconds * 1000 / samples, projected=samples != 1000,
                peak_mem_gib=peak, layers=config.n_layers,
                d_model=config.d_model, heads=config.n_heads, weights=weights, accuracy_1x=accuracy,
                train_samples=config.train_samples if runs is not None else 0)


def in_distribution_accuracy(runs: Path, run_id: str) -> float:
    """The token accuracy run ``run_id`` scored at 1x (NaN where the store has none)."""
    frame = load_results(runs)
    rows = frame[(frame["run_id"] == run_id) & (frame["multiplier"] == 1)]
    return float(rows["token_accuracy"].iloc[-1]) if len(rows) else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mqmtar")
    parser.add_argument("--attns", default="softmax")
    parser.add_argument("--pe", default="rope", help="positional encoding (none for the position-free mechanisms)")
    parser.add_argument("--n", type=int, default=65_536)
    parser.add_argument("--samples", default="1000", help="samples per mechanism: one count, or one per --attns")
    parser.add_argument("--out", default="results/benchmarks")
    parser.add_argument("--runs", type=Path, default=None,
                        help="a results directory: time the trained models of its finished runs (attn or attn:pe)")
    parser.add_argument("--device", default="auto", help="auto (CUDA where there is one), cuda or cpu (small --n only)")
    args = parser.parse_args()
    args.device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                               "cpu" if args.device == "auto" else args.device)
    attns = args.attns.split(",")
    counts = [int(c) for c in args.samples.split(",")]
    if len(counts) == 1:
        counts = counts * len(attns)
    if len(counts) != len(attns):
        print("error: --samples takes one count or one per mechanism", file=sys.stderr)
        sys.exit(2)
    entries = [(attn, pe or args.pe) for attn, _, pe in (entry.partition(":") for entry in attns)]
    try:  # every trained run is found before anything is timed
        run_ids = [newest_trained_run(args.runs, args.task, attn, pe) if args.runs else "" for attn, pe in entries]
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    rows = []
    for (attn, pe), run_id, count in zip(entries, run_ids, counts, strict=True):
        try:
            row = measure(args.task, attn, pe, args.n, count, args.runs, args.device, run_id)
        except Exception as error:  # noqa: BLE001 - one mechanism's failure must not lose the others' rows
            print(f"{attn:14s} failed: {type(error).__name__}: {error}", flush=True)
            rows.append(dict(task=args.task, attn=attn, pe=pe, n=args.n, samples=count,
                             error=f"{type(error).__name__}: {error}"))
        else:
            rows.append(row)
            print(f"{attn:14s} {count:5d} samples at {row['tokens']:,.0f} tokens: {row['seconds']:8.1f} s "
                  f"({row['s_per_1000']:.0f} s per 1,000{' projected' if row['projected'] else ''}; peak "
                  f"{row['peak_mem_gib']:.1f} GiB)", flush=True)
        save(rows, args)
        if args.device.type == "cuda":
            torch.cuda.empty_cache()
    print((Path(args.out) / "eval_time.md").read_text())


KEY = ["task", "attn", "pe", "n", "kind"]


def save(rows: list[dict], args) -> None:
    """Rewritten after every mechanism, so a crash or a time limit keeps what was measured. The rows of an
    earlier command in ``<out>/eval_time.parquet`` stay, except those this command measured again (the same
    task, mechanism, encoding, length and kind of weights)."""
    frame = pd.DataFrame(rows)
    if "error" not in frame:
        frame["error"] = None
    frame["kind"] = "trained" if args.runs else "fresh"
    base = frame.loc[frame["attn"] == "softmax", "s_per_1000"] if "s_per_1000" in frame else frame.iloc[:0]
    frame["vs_softmax"] = frame["s_per_1000"] / base.iloc[0] if len(base) else float("nan")
    for key, value in provenance(args.device, sys.argv).items():
        frame[key] = value
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "eval_time.parquet"
    if path.exists():
        earlier = pd.read_parquet(path)
        for key, default in (("task", "mqmtar"), ("n", 65_536), ("kind", None)):
            if key not in earlier:
                earlier[key] = default
        if earlier["kind"].isna().any():
            earlier["kind"] = earlier["kind"].fillna(
                earlier["weights"].astype(str).str.startswith("trained").map({True: "trained", False: "fresh"}))
        again = earlier[KEY].astype(str).agg("|".join, axis=1).isin(frame[KEY].astype(str).agg("|".join, axis=1))
        frame = pd.concat([earlier[~again], frame], ignore_index=True)
    frame.to_parquet(path, index=False)
    (out / "eval_time.md").write_text(markdown(frame))


def markdown(frame: pd.DataFrame) -> str:
    """One table: per task, length, kind of weights and mechanism, the seconds per 1,000 samples and the ratio to
    softmax + RoPE of the same command, each row with its device, date and commit; the commands after."""
    columns = ["task", "n", "weights", "attn", "pe", "accuracy_1x", "samples", "s_per_1000", "vs_softmax",
               "peak_mem_gib", "error", "device", "date", "commit"]
    frame = frame.assign(date=frame["created_at"].astype(str).str[:10], commit=frame["git_sha"])
    frame = frame.sort_values(["task", "n", "kind", "created_at"], kind="stable")
    table = frame.reindex(columns=columns).dropna(axis=1, how="all")
    lines = ["# Scoring time of whole samples at long lengths, per mechanism", "",
             "Measured by `benchmarks/eval_time.py` through the runner's Evaluator (adaptive batch, fused kernels): "
             "`s_per_1000` is the seconds to score 1,000 samples of `n` tokens, projected from the `samples` timed; "
             "`vs_softmax` its ratio to softmax + RoPE timed by the same command. `fresh`: the task's `paper` "
             "model freshly initialised; `trained`: the model of the finished run named (`bash "
             "benchmarks/gpu_checks.sh eval-trained` trains them), "
             "`accuracy_1x` its in-distribution token accuracy. A trained model's time depends on its scores (how "
             "far stick-breaking walks, how many entmax rows stay open): read it beside `accuracy_1x`.", "",
             frame_markdown(table), "", "Commands:", ""]
    lines += [f"- `{command}`" for command in frame["command"].dropna().unique()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
