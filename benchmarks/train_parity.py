"""Does the default training step learn what the step before it learned? Short trainings side by side.

For each ``--cells`` entry (``task:attn:pe``) and seed, trains the same configuration (the ``quick`` preset,
``--train-samples`` samples) with each ``--train-steps`` entry: ``graph-compiled`` (the default: the whole
step in one CUDA graph, the attention on the training-width fused ops) and ``compiled`` (the step before it:
for models with fused ops, those ops eagerly, one launch at a time). Each run is the runner's (``run_cell``:
validation, checkpoint selection in distribution, scoring), scored at 1x and 2x. Records the in-distribution
(1x) token accuracy and exact match of the selected model, the final validation score and the training time,
and per cell the difference of the steps' seed means against the spread of the seeds:

    python benchmarks/train_parity.py --cells mqmtar:asentmax:nape,mqrar:stickbreaking:none --seeds 0,1 \
        --train-samples 1000000 --jobs 4 --out results/benchmarks

Runs go in parallel (``--jobs`` processes, each run its own, on the one GPU: their training times are not a throughput
measurement; results/benchmarks/train_throughput.md is). Writes ``<out>/train_parity.parquet`` and ``.md``
with the device, date, commit and command; the runs themselves go to ``--results`` (a scratch store).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import PATH_VARIABLES, command_line  # noqa: E402


def train_one(task: str, attn: str, pe: str, seed: int, train_step: str, train_samples: int, eval_samples: int,
              results: str, preset: str = "quick", device: str = "cuda") -> dict:
    """One run of the runner; the row of its 1x score and its training record."""
    import torch

    from lengthbench.checkpoints import checkpoint_dir
    from lengthbench.config import build_config
    from lengthbench.runner import run_cell

    config = build_config(task, attn, pe, preset, seed=seed, train_step=train_step, train_samples=train_samples,
                          max_multiplier=2, eval_samples=eval_samples, val_samples=512)
    frame = run_cell(config, results, device=device, progress=False)
    row = frame[frame["multiplier"] == 1].iloc[0]
    state = torch.load(checkpoint_dir(results, config.run_id) / "model.pt", map_location="cpu",
                       weights_only=False)["state"]
    return dict(cell=f"{task}:{attn}:{pe}", seed=seed, train_step=train_step, run_id=config.run_id,
                train_samples=train_samples, batch_size=config.batch_size, id_token_accuracy=float(row["token_accuracy"]),
                id_exact_match=float(row["exact_match"]), best_val=float(state["best_score"]),
                train_seconds=float(row["train_seconds"]))


def summary(rows: pd.DataFrame, steps: list[str]) -> pd.DataFrame:
    """Per cell: each step's seed mean of the 1x token accuracy, the difference to the reference's (``reference``:
    the first of ``steps`` that ran the cell, so that merged runs of other cells leave it its own), and the largest
    spread between two seeds of one step (what the difference is compared with)."""
    out = []
    for cell, group in rows.groupby("cell", sort=False):
        ran = [step for step in steps if (group["train_step"] == step).any()]
        means = {step: group[group["train_step"] == step]["id_token_accuracy"].mean() for step in steps}
        spread = max(float(group[group["train_step"] == step]["id_token_accuracy"].agg(lambda s: s.max() - s.min()))
                     for step in ran)
        entry = {"cell": cell, "seeds": group["seed"].nunique(), "reference": ran[0]}
        entry.update({f"{step} 1x token acc": means[step] for step in steps})
        entry.update({f"{step} - reference": means[step] - means[ran[0]] for step in steps[1:]
                      if step != ran[0]})
        entry["seed spread"] = spread
        out.append(entry)
    return pd.DataFrame(out).dropna(axis=1, how="all")  # a difference no cell has


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="mqmtar:asentmax:nape,mqrar:stickbreaking:none")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--train-steps", default="graph-compiled,compiled")
    parser.add_argument("--train-samples", type=int, default=1_000_000)
    parser.add_argument("--eval-samples", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=4, help="runs at once on the GPU")
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--device", default="cuda", help="cuda (the comparison) or cpu (a check of this script)")
    parser.add_argument("--results", default="/tmp/lengthbench-parity", help="the runs' store (scratch)")
    parser.add_argument("--out", default="results/benchmarks")
    parser.add_argument("--merge", default="", help="comma-separated parquet files of earlier runs: write them "
                        "together to --out (each row keeps its device, date, commit and command) and train nothing")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # one run, in its own process (JSON)
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        answer = Path(spec.pop("answer"))
        answer.write_text(json.dumps(train_one(**spec)))
        return
    if args.merge:
        write(pd.concat([pd.read_parquet(path) for path in args.merge.split(",")], ignore_index=True),
              Path(args.out), args.preset)
        return
    import torch

    from lengthbench.devices import provenance

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: benchmarks/train_parity.py needs a CUDA GPU (or --device cpu)")
    cells = [cell.split(":") for cell in args.cells.split(",")]
    if any(len(cell) != 3 for cell in cells):
        parser.error("--cells takes task:attn:pe entries, comma-separated")
    steps = args.train_steps.split(",")
    jobs = [(task, attn, pe, int(seed), step) for task, attn, pe in cells for seed in args.seeds.split(",")
            for step in steps]
    info = provenance(torch.device(args.device), sys.argv)
    info["command"] = command_line()  # (with the path variables it ran under: LENGTHBENCH_VIEWS and the like)
    rows = []
    scratch = Path(args.results)
    scratch.mkdir(parents=True, exist_ok=True)
    pending = list(jobs)
    running: list[tuple[tuple, subprocess.Popen, Path]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            job = pending.pop(0)
            task, attn, pe, seed, step = job
            answer = scratch / f"{task}-{attn}-{pe}-s{seed}-{step}.json"
            answer.unlink(missing_ok=True)
            spec = dict(task=task, attn=attn, pe=pe, seed=seed, train_step=step, train_samples=args.train_samples,
                        eval_samples=args.eval_samples, results=args.results, preset=args.preset,
                        device=args.device, answer=str(answer))
            running.append((job, subprocess.Popen([sys.executable, __file__, "--one", json.dumps(spec)],
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                            answer))
        job, process, answer = running.pop(0)
        output, _ = process.communicate()
        if process.returncode != 0 or not answer.exists():
            tail = "\n".join(line for line in output.splitlines() if "warn" not in line.lower())[-1500:]
            print(f"{job}: failed (exit {process.returncode}):\n{tail}", flush=True)
            continue
        row = json.loads(answer.read_text())
        print(f"{row['cell']} s{row['seed']} {row['train_step']}: 1x token accuracy "
              f"{row['id_token_accuracy']:.4f}, exact match {row['id_exact_match']:.3f}, "
              f"{row['train_seconds']:.0f} s", flush=True)
        rows.append(dict(row, **info))
    if not rows:
        sys.exit("error: no run finished")
    frame = pd.DataFrame(rows)
    print(summary(frame, steps).to_string(index=False))
    write(frame, Path(args.out), args.preset)


def path_variables(command: str) -> str:
    """The path variables a recorded command set before ``python`` (``train_throughput.PATH_VARIABLES``), as they
    were written: ``"LENGTHBENCH_VIEWS=compiled"``; empty where it set none."""
    words = str(command).split()
    ahead = words[:words.index("python")] if "python" in words else []
    return " ".join(word for word in ahead if word.split("=", 1)[0] in PATH_VARIABLES)


def labelled(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows with a ``step`` column: the training step, with the path variables its command set, and its commit
    where the rows come from several runs (newest run first); and the steps in that order."""
    frame = frame.copy()
    runs = frame.drop_duplicates("command").sort_values("created_at", ascending=False)
    several = len(runs) > 1
    frame["step"] = [" ".join(filter(None, [step, f"({path_variables(command)})" if path_variables(command) else "",
                                            f"at {sha}" if several else ""]))
                     for step, sha, command in zip(frame["train_step"], frame["git_sha"], frame["command"],
                                                   strict=True)]
    order = []
    for command in runs["command"]:
        order += [step for step in dict.fromkeys(frame[frame["command"] == command]["step"]) if step not in order]
    return frame, order


def write(frame: pd.DataFrame, out: Path, preset: str) -> None:
    """``<out>/train_parity.parquet`` and ``.md``: every run's rows and per cell the steps side by side."""
    from lengthbench.leaderboard import frame_markdown

    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "train_parity.parquet", index=False)
    shown, steps = labelled(frame)
    table = summary(shown.assign(train_step=shown["step"]), steps)
    runs = "\n".join(f"- {row.device}, {row.created_at}, commit {row.git_sha}: `{row.command}`"
                     for row in frame.drop_duplicates("command").sort_values("created_at").itertuples())
    columns = ["cell", "seed", "step", "train_samples", "batch_size", "id_token_accuracy", "id_exact_match",
               "best_val", "train_seconds"]
    (out / "train_parity.md").write_text(
        "# Training parity: the default step against the step before it\n\n"
        f"{runs}\n\n"
        f"Each run: the `{preset}` preset with the samples shown, selected in distribution, scored on the task's "
        "held-out samples at 1x. `reference`: the newest step that ran the cell; `X - reference`: step X's seed mean less "
        "the reference's. `seed spread`: the largest difference between two seeds of one step."
        + (" A step's commit follows its name where the rows come from several runs."
           if frame["command"].nunique() > 1 else "")
        + "\n\n" + frame_markdown(table.round(4)) + "\n\n"
        + frame_markdown(shown.sort_values(["cell", "seed"], kind="stable")[columns].round(4)) + "\n")

if __name__ == "__main__":
    main()
