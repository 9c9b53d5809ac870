"""How much of the entmax first stage a trained model's scores let a tile skip (``kernels/entmax.py``,
``alibi_skip``), on the CPU: the model's dense reference forward on one test sample, each layer's ``X = z / 2``
(the scaled scores entmax sees) cut into tiles of 64 query rows x 64 keys, and per head the share of the visible
key tiles in which every visible ``X`` lies at or below its row's running bound, ``max X - 1`` over the key tiles
before it ("in order": key tiles from 0), over them and the diagonal tile ("diagonal first"), or over the whole
row ("oracle"). Such values lie below ``tau*`` and are never in the support.

    python benchmarks/alibi_skip_model.py --results DIR --run RUN_ID --n 1024
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import lengthbench.models.attention.entmax as attention_entmax
from lengthbench.runner import load_model

TILE = 64


def skippable(scores: torch.Tensor, mask: torch.Tensor) -> dict[str, np.ndarray]:
    """Per head, the share of the visible (query tile, key tile) pairs whose values all lie at or below the bound."""
    x = (scores.float() * 0.5).masked_fill(~mask, float("-inf"))[0]  # [H, L, L]
    heads, length, _ = x.shape
    tiles = -(-length // TILE)
    pad = tiles * TILE - length
    x = torch.nn.functional.pad(x, (0, pad, 0, pad), value=float("-inf"))
    tile_max = x.view(heads, tiles * TILE, tiles, TILE).amax(-1)  # [H, rows, key tiles]
    running = torch.cummax(tile_max, -1).values
    before = torch.cat([torch.full_like(running[..., :1], float("-inf")), running[..., :-1]], -1)
    diagonal = (torch.arange(tiles * TILE) // TILE).view(1, -1, 1).expand(heads, -1, 1)
    with_diagonal = torch.maximum(before, tile_max.gather(-1, diagonal))
    visible = torch.tril(torch.ones(tiles, tiles, dtype=torch.bool))
    below_diagonal = torch.tril(torch.ones(tiles, tiles, dtype=torch.bool), -1)
    shares = {}
    for name, bound, pairs in (("in order", before - 1, visible), ("diagonal first", with_diagonal - 1, below_diagonal),
                               ("oracle", tile_max.amax(-1, keepdim=True) - 1, below_diagonal)):
        ok = (tile_max <= bound) | (tile_max == float("-inf"))
        ok = ok.view(heads, tiles, TILE, tiles).all(2) & pairs  # [H, query tile, key tile]
        shares[name] = (ok.sum((1, 2)).float() / visible.sum()).numpy()
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="a results directory with the run's model.pt")
    parser.add_argument("--run", required=True)
    parser.add_argument("--n", type=int, default=1024, help="the task length of the test sample")
    args = parser.parse_args()
    layers = []
    entmax_map = attention_entmax.entmax_map

    def recording(scores, mask, alpha):
        layers.append(skippable(scores, mask))
        return entmax_map(scores, mask, alpha)

    attention_entmax.entmax_map = recording
    model, task, _ = load_model(args.results, args.run)
    model.set_query_chunk(None)
    batch = task.batch([0], args.n, split="test", seed=0)
    features = None if batch.features is None else torch.as_tensor(batch.features)
    start = time.time()
    with torch.no_grad():
        model(torch.as_tensor(batch.input_ids), features)
    print(f"{args.run}: n {args.n}, {batch.input_ids.shape[1]} tokens, {time.time() - start:.0f} s")
    for i, shares in enumerate(layers):
        print(f"layer {i}: " + "; ".join(f"{name} {v.mean():.3f} (heads {' '.join(f'{s:.2f}' for s in v)})"
                                         for name, v in shares.items()))


if __name__ == "__main__":
    main()
