"""A trained model's exact match through its fused ops and through its dense references, side by side.

The runner scores on the fused ops; models with fused ops that train on CUDA with a compiled step train on the
dense references instead (``trains_dense``). The two are tested to agree on random weights; this scores a
trained model both ways, at the lengths given, so that a curve that falls where another seed's holds can be
told apart: a model that did not learn to extrapolate falls on both paths, a kernel that disagrees with the
reference on a trained model's scores falls on one.

    python benchmarks/score_paths.py --results /tmp/gres --run RUN_ID --multipliers 1,2,4,8 --samples 200

The dense references hold ``[batch, heads, rows, T]`` scores (the Evaluator chunks the rows): keep the
multipliers small (8x is 8 times the training length). On a CPU both paths are the references. Prints a table
and writes ``<out>/score_paths-<run>.json``. A plugin's mechanism loads as in the CLI: ``LENGTHBENCH_PLUGINS``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from lengthbench.cli import load_plugins
from lengthbench.errors import UsageError
from lengthbench.runner import Evaluator, attention_kernels, device_description, load_model


def score_paths(results: Path, run_id: str, multipliers: list[int], samples: int, device: str) -> list[dict]:
    model, task, config = load_model(results, run_id, device)
    torch_device = torch.device(device)
    evaluator = Evaluator(model, task, torch_device, seed=config.seed)
    flags = [block.attn.use_kernels for block in model.blocks]
    rows = []
    for multiplier in multipliers:
        n = config.train_length * multiplier
        row = {"run_id": run_id, "multiplier": multiplier, "n": n, "samples": samples}
        for path, enabled in (("fused", flags), ("reference", False)):
            started = time.perf_counter()
            with attention_kernels(model, enabled):
                scores = evaluator.score(n, samples)
            row[f"{path}_exact_match"] = scores.exact_match
            row[f"{path}_token_accuracy"] = scores.token_accuracy
            row[f"{path}_seconds"] = round(time.perf_counter() - started, 2)
        rows.append(row)
        print(f"{multiplier}x (n = {n}): exact match fused {row['fused_exact_match']:.3f} / reference "
              f"{row['reference_exact_match']:.3f}; token accuracy fused {row['fused_token_accuracy']:.4f} / "
              f"reference {row['reference_token_accuracy']:.4f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="results directory holding checkpoints/RUN")
    parser.add_argument("--run", required=True, help="run id (checkpoints/<run>/model.pt)")
    parser.add_argument("--multipliers", default="1,2,4", help="comma-separated multiples of the training length")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON (default: none written)")
    args = parser.parse_args(argv)
    try:
        multipliers = [int(m) for m in args.multipliers.split(",")]
    except ValueError:
        parser.error(f"--multipliers: comma-separated integers, not {args.multipliers!r}")
    try:
        load_plugins([])  # LENGTHBENCH_PLUGINS: a plugin's mechanism (e.g. benchmarks/sieve_probes' sieve-temp)
        rows = score_paths(args.results, args.run, multipliers, args.samples, args.device)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except LookupError as error:  # a run of a plugin's mechanism, task or encoding, the plugin not loaded
        print(f"error: {error.args[0] if error.args else error} (a plugin's? load it: LENGTHBENCH_PLUGINS=MODULE)",
              file=sys.stderr)
        sys.exit(2)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"device": device_description(torch.device(args.device)),
                  "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}
        (args.out / f"score_paths-{args.run}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
