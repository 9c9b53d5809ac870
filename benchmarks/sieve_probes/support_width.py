"""Why `sieve-temp` (Sieve's entmax filter on z / T) stops extrapolating on MQRAR's inline variant where
Algorithm 1's eps filter does not: the filter each answer row keeps, measured on a trained model at several
lengths (REPRODUCTION.md, session 27).

For every scored answer row (its input is the queried key; the target is the value after that key's most
recent assignment) and every head, on the model's own forward pass (the dense reference, so on a CPU):
- ``kept``: keys the model's filter keeps (the 1.5-entmax support of z / T over the earlier keys);
- ``width``: the row's maximum score minus the smallest kept score (at most 2 T);
- ``hit``: the filter keeps the target assignment (its key or its value position);
- ``stale``: it keeps an older assignment of the same key;
- ``eps_hit``, ``eps_kept``: the same for Algorithm 1's window ``z >= max - 2 T`` on the same scores.
Per layer, the table gives the head that keeps the target most often at the first length (the retrieval head).

    PYTHONPATH=benchmarks/sieve_probes python benchmarks/sieve_probes/support_width.py --results DIR \
        --run RUN_ID --lengths 64,128,256,512 --samples 32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import sieve_variants  # noqa: F401  (registers sieve-temp)
import torch

from lengthbench.models.attention import causal_mask
from lengthbench.models.attention.base import as_compute, diagonal_and_earlier
from lengthbench.models.attention.stickbreaking import sieve_support
from lengthbench.runner import load_model


def targets(input_ids: np.ndarray, labels: np.ndarray, sep: int):
    """Per sample: (row, target positions, stale positions) of each scored answer (not ``<eos>``)."""
    out = []
    for b in range(len(input_ids)):
        ids = input_ids[b]
        boundary = int(np.nonzero(ids == sep)[0][0])
        rows = []
        for t in np.nonzero(labels[b] >= 0)[0]:
            if t <= boundary or ids[t] == ids[t - 1]:
                continue
            key = ids[t]
            found = [j for j in range(1, boundary) if ids[j] == key and (j - 1) % 2 == 0]
            if not found:
                continue
            last = found[-1]
            stale = [p for j in found[:-1] for p in (j, j + 1)]
            rows.append((int(t), [last, last + 1], stale))
        out.append(rows)
    return out


def measure(model, task, n: int, samples: int, seed: int) -> list[dict]:
    batch = task.batch(np.arange(samples), n, "test", seed)
    sep = task.token_id("<sep>")
    answers = targets(batch.input_ids, batch.labels, sep)
    records: list[dict] = []
    layers = list(model.attention_layers)

    def recorder(layer_index, layer):
        def weights(scores, query_positions, x_rows):
            mask = causal_mask(query_positions, scores.shape[-1])
            z = as_compute(scores)
            _, earlier = diagonal_and_earlier(mask, query_positions)
            keep = sieve_support(z / layer.T, earlier, layer.alpha)
            neg = torch.full((), float("-inf"), dtype=z.dtype)
            rowmax = torch.where(earlier, z, neg).amax(-1, keepdim=True)
            window = earlier & (z >= rowmax - 2 * layer.T)
            lowest = torch.where(keep, z, torch.full((), float("inf"), dtype=z.dtype)).amin(-1, keepdim=True)
            width = (rowmax - lowest).squeeze(-1)
            for b, rows in enumerate(answers):
                for row, target, stale in rows:
                    r = int((query_positions == row).nonzero()[0]) if (query_positions == row).any() else None
                    if r is None:
                        continue
                    k, w = keep[b, :, r], window[b, :, r]
                    records.append({
                        "n": n, "layer": layer_index, "sample": b, "row": row,
                        "kept": k.sum(-1).tolist(), "width": width[b, :, r].tolist(),
                        "hit": k[:, target].any(-1).tolist(),
                        "stale": (k[:, stale].any(-1) if stale else torch.zeros(k.shape[0], dtype=torch.bool)).tolist(),
                        "eps_kept": w.sum(-1).tolist(), "eps_hit": w[:, target].any(-1).tolist(),
                    })
            return type(layer).weights(layer, scores, query_positions, x_rows)
        return weights

    for index, layer in enumerate(layers):
        layer.weights = recorder(index, layer)
        layer.use_kernels = False
    with torch.no_grad():
        model.set_query_chunk(None)
        model(torch.as_tensor(batch.input_ids))
    for layer in layers:
        del layer.weights
    return records


def summarise(records: list[dict], lengths: list[int]) -> str:
    lines = ["| layer | head | n | kept (mean) | width (mean) | target kept % | stale kept % | eps window: kept | "
             "eps window: target kept % |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for layer in sorted({r["layer"] for r in records}):
        first = [r for r in records if r["layer"] == layer and r["n"] == lengths[0]]
        head = int(np.argmax(np.mean([r["hit"] for r in first], axis=0)))
        for n in lengths:
            rows = [r for r in records if r["layer"] == layer and r["n"] == n]

            def pick(key, rows=rows, head=head):
                return np.array([r[key][head] for r in rows], dtype=float)

            lines.append(f"| {layer} | {head} | {n} | {pick('kept').mean():.1f} | {pick('width').mean():.2f} | "
                         f"{100 * pick('hit').mean():.1f} | {100 * pick('stale').mean():.1f} | "
                         f"{pick('eps_kept').mean():.1f} | {100 * pick('eps_hit').mean():.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--lengths", default="64,128,256,512")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="folder for support_width-<run>.{md,json}")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, task, config = load_model(args.results, args.run, "cpu")
    lengths = [int(n) for n in args.lengths.split(",")]
    records = []
    for n in lengths:
        records += measure(model, task, n, args.samples, config.seed)
    table = summarise(records, lengths)
    header = (f"# Filter of `{config.attn}` ({json.dumps(config.attn_params)}) on answer rows, run `{args.run}`\n\n"
              f"{args.samples} test samples a length; the retrieval head of each layer (the head keeping the "
              f"target most often at n = {lengths[0]}); eps window: Algorithm 1's `z >= max - 2 T` on the same "
              f"scores.\n\nCommand: `python benchmarks/sieve_probes/support_width.py --results {args.results} "
              f"--run {args.run} --lengths {args.lengths} --samples {args.samples}`\n\n")
    print(header + table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"support_width-{args.run}.md").write_text(header + table + "\n")
        (args.out / f"support_width-{args.run}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
