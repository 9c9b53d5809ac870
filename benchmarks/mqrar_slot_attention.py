"""Where MQRAR's answer slots look, layer by layer, in a trained model (seeds' layout: queries, <sep>, answers).

For every answer slot (the ``<q>`` after ``<sep>`` whose next token is answer ``j``) of ``--samples`` test samples,
each head's attention weight on four positions:

- ``own key``: the key of query ``j`` (the fetch a slot needs without positions);
- ``other keys``: the keys of the other queries (summed);
- ``value``: the value of the most recent assignment of that key (the recall);
- ``assigned key``: that assignment's key token.

At the query's key token it reads the same heads' weight on the value and its key (``key: value``, ``key:
assigned key``): a recall made at the key, as in the inline layout, whose result a slot can then fetch. Per layer
it reports the head with the largest mean weight on each, that mean, and how often that head's largest weight
lands on the position (top-1). Session 29 asked whether a 3-layer NoPE model fetches a slot's
query key in a layer of its own before the recall (REPRODUCTION.md, protocol ``d29``).

    python benchmarks/mqrar_slot_attention.py --results RESULTS --run RUN_ID [--length 16] [--samples 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from lengthbench.inspect import attention_maps, load_run

TARGETS = ("own key", "other keys", "value", "assigned key")
KEY_TARGETS = ("value", "assigned key")  # read at the query's key token: a recall made there, as inline


def slot_positions(input_ids: np.ndarray, n: int, queries: int) -> list[dict]:
    """Per answer slot of one sample (seeds' layout, one-token values, even ``n``): the slot and its targets."""
    ids = np.asarray(input_ids)
    slots = []
    for j in range(queries):
        own = 2 + n + 2 * j  # the key of query j
        slot = 2 + n + 2 * queries + 2 * j  # the <q> whose next token is answer j
        key = ids[own]
        assigned = max(p for p in range(1, n + 1, 2) if ids[p] == key)  # its most recent assignment
        others = [2 + n + 2 * i for i in range(queries) if i != j]
        slots.append({"slot": slot, "own key": [own], "other keys": others, "value": [assigned + 1],
                      "assigned key": [assigned]})
    return slots


def measure(model, task, config, length: int, samples: int, seed: int | None = None) -> dict:
    """Mean weight and top-1 rate per layer, head and target over every answer slot of ``samples`` samples."""
    params = task.params
    if getattr(params, "layout", "separate") != "separate" or getattr(params, "value_tokens", 1) != 1 or length % 2:
        raise SystemExit("the seeds' layout with one-token values and an even length only")
    seed = config.seed if seed is None else seed
    batch = task.batch(list(range(samples)), length, "test", seed)
    weight = None  # [layers, heads, targets] sums; at the slot rows, then (last two) at the query-key rows
    top1 = None
    count = 0
    columns = TARGETS + tuple(f"key: {name}" for name in KEY_TARGETS)
    for b in range(samples):
        end = int(batch.realised_tokens[b])
        ids = batch.input_ids[b, :end]
        maps, _, _ = attention_maps(model, torch.as_tensor(ids[None]), None, max_tokens=max(512, end))
        layers, heads = len(maps), maps[0].shape[0]
        if weight is None:
            weight = np.zeros((layers, heads, len(columns)))
            top1 = np.zeros_like(weight)
        for slot in slot_positions(ids, length, params.queries):
            for layer, w in enumerate(maps):
                for row, names, offset in ((slot["slot"], TARGETS, 0), (slot["own key"][0], KEY_TARGETS, len(TARGETS))):
                    rows = np.nan_to_num(w[:, row, :])  # [H, K]
                    best = rows.argmax(axis=1)
                    for t, name in enumerate(names, start=offset):
                        weight[layer, :, t] += rows[:, slot[name]].sum(axis=1)
                        top1[layer, :, t] += np.isin(best, slot[name])
            count += 1
    weight, top1 = weight / count, top1 / count
    report = {"slots": count, "samples": samples, "length": length, "layers": []}
    for layer in range(weight.shape[0]):
        entry = {}
        for t, name in enumerate(columns):
            head = int(weight[layer, :, t].argmax())
            entry[name] = {"head": head, "mean_weight": round(float(weight[layer, head, t]), 4),
                           "top1": round(float(top1[layer, head, t]), 4)}
        report["layers"].append(entry)
    return report


def markdown(report: dict, run: str) -> str:
    columns = list(report["layers"][0])
    lines = [f"`{run}`, n {report['length']}: {report['slots']} answer slots of {report['samples']} test samples. "
             "Per layer, the head with the largest mean weight on each position: that weight, and how often "
             "the head's largest weight is there (top-1). Read at the answer slot, and (`key: ...`) at the "
             "slot's query key.", "",
             "| layer | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for layer, entry in enumerate(report["layers"], start=1):
        cells = [f"head {entry[t]['head']}: {entry[t]['mean_weight']:.3f} (top-1 {100 * entry[t]['top1']:.1f}%)"
                 for t in columns]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, help="results store whose checkpoints/RUN/model.pt to load")
    parser.add_argument("--run", required=True, help="run id")
    parser.add_argument("--length", type=int, default=None, help="nominal length (default: the run's n_train)")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--out", default=None, help="folder for slot_attention-RUN.md and .json")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    model, task, config = load_run(args.results, args.run)
    if config.task != "mqrar":
        parser.error(f"run {args.run} is {config.task}, not mqrar")
    length = config.train_length if args.length is None else args.length
    with torch.no_grad():
        report = measure(model, task, config, length, args.samples)
    report.update(run=args.run, attn=config.attn, pe=config.pe, n_layers=config.n_layers)
    text = markdown(report, args.run)
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"slot_attention-{args.run}-n{length}.md").write_text(text)
        (out / f"slot_attention-{args.run}-n{length}.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
