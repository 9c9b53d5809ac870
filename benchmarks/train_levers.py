"""Levers of the training step side by side: one ``train_throughput.py`` command per lever, on one GPU.

A lever is a set of the path variables (``train_throughput.PATH_VARIABLES``: ``LENGTHBENCH_CAPTURE_TUNING``,
``LENGTHBENCH_NARROW_TUNING``, ``LENGTHBENCH_SDPA_ALIBI``, ...). ``--levers`` names them in a JSON object, name ->
variables; a variable's value is a string or a JSON object (written out as JSON). The library's own step runs
first as ``default``. Each command measures softmax + RoPE first and last beside ``--attns``, so each lever's
ratios are over its own baseline, and they compare::

    python benchmarks/train_levers.py --tasks copy,mqrar --attns stickbreaking,sieve-window --levers \\
        '{"fwd64": {"LENGTHBENCH_CAPTURE_TUNING": {"stickbreaking": {"fwd": [64, 32, 4, 2]}}}}' --out OUT

Prints each mechanism's ratio per lever and task, and writes ``<out>/train_levers.md`` and every command's
``<out>/<task>/<lever>/train_throughput.parquet`` (merge those into the table of record with
``train_throughput.py --merge``: rows of a lever that is not the library's stay out of its summary).
Run it alone on its machine, as ``train_throughput.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from lengthbench.leaderboard import frame_markdown

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import PATH_VARIABLES  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_levers(text: str) -> dict[str, dict[str, str]]:
    """``--levers``: name -> {variable: value as a string}; a ``ValueError`` says what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--levers is not JSON ({error.msg})") from None
    if not isinstance(value, dict) or not value or not all(isinstance(v, dict) and v for v in value.values()):
        raise ValueError("--levers must be a JSON object of lever name -> object of variables, each lever with one")
    levers = {}
    for name, variables in value.items():
        if not name or name == "default" or "/" in name:
            raise ValueError(f"--levers: {name!r} is not a lever name (not empty, not 'default', no '/')")
        unknown = sorted(set(variables) - set(PATH_VARIABLES))
        if unknown:
            raise ValueError(f"--levers: {name} sets {', '.join(unknown)}; the variables are "
                             f"{', '.join(PATH_VARIABLES)}")
        levers[name] = {var: v if isinstance(v, str) else json.dumps(v) for var, v in variables.items()}
    return levers


def commands(args: argparse.Namespace, levers: dict[str, dict[str, str]]) -> list[tuple[str, str, dict, list]]:
    """``(task, lever, environment, command)`` of every run, the library's step first in each task."""
    out = []
    pes = args.pes.split(",")
    pes = ",".join(pes if "rope" in pes else ["rope", *pes])  # softmax + RoPE: the baseline of every ratio
    for task in args.tasks.split(","):
        for name, variables in {"default": {}, **levers}.items():
            env = {k: v for k, v in os.environ.items() if k not in PATH_VARIABLES}
            command = [sys.executable, str(HERE / "train_throughput.py"), "--tasks", task, "--preset", args.preset,
                       "--pes", pes, "--batch-sizes", str(args.batch_size), "--attns", f"softmax,{args.attns}",
                       "--steps", str(args.steps), "--warmup", str(args.warmup), "--warm-jobs", str(args.warm_jobs),
                       "--out", str(Path(args.out) / task / name)]
            out.append((task, name, {**env, **variables}, command))
    return out


def comparison(frames: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """One row per task, mechanism and encoding; one column per lever: ``vs_softmax_rope`` (closing rows out)."""
    rows = []
    for (task, lever), frame in frames.items():
        if "closing" in frame:
            frame = frame[frame["closing"].fillna(False).astype(bool) == False]  # noqa: E712
        for _, row in frame.iterrows():
            rows.append(dict(task=task, attn=row["attn"], pe=row["pe"], lever=lever, ratio=row["vs_softmax_rope"]))
    table = pd.DataFrame(rows).pivot_table(index=["task", "attn", "pe"], columns="lever", values="ratio",
                                           sort=False, dropna=False)
    levers = ["default"] + [c for c in table.columns if c != "default"]
    return table[[c for c in levers if c in table.columns]].reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levers", required=True, help="JSON: lever name -> {path variable: value}")
    parser.add_argument("--tasks", default="copy")
    parser.add_argument("--attns", required=True, help="mechanisms beside softmax, comma-separated")
    parser.add_argument("--pes", default="rope", help="encodings (softmax + RoPE, the baseline, always runs)")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--warm-jobs", type=int, default=6)
    parser.add_argument("--out", default="results/levers")
    args = parser.parse_args()
    try:
        levers = parse_levers(args.levers)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    frames = {}
    for task, lever, env, command in commands(args, levers):
        print(f"== {task} {lever}: " + " ".join(f"{k}={v}" for k, v in env.items() if k in PATH_VARIABLES),
              flush=True)
        done = subprocess.run(command, env=env, check=False)
        path = Path(args.out) / task / lever / "train_throughput.parquet"
        if done.returncode != 0 or not path.exists():
            print(f"{task} {lever}: the command failed (exit {done.returncode})", flush=True)
            continue
        frames[(task, lever)] = pd.read_parquet(path)
    if not frames:
        sys.exit("no lever measured")
    table = comparison(frames)
    text = frame_markdown(table, floatfmt=".2f")
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train_levers.md").write_text(
        "# Training-step levers (each lever's samples/s over its own softmax + RoPE)\n\n"
        + "\n".join(f"- {name}: `{json.dumps(variables)}`" for name, variables in levers.items())
        + "\n\n" + text + "\n")


if __name__ == "__main__":
    main()
