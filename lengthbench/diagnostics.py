"""Attention diagnostics of a trained decoder at one evaluation length: the numbers the papers argue with.

Per layer and head, over the causal part of the weight map (keys ``j <= r`` of query row ``r``, which
sees ``n_r = r + 1`` keys):

- **sparsity**: exact zeros / causal entries, pooled over rows (Threshold Differential Attention's "> 99 %", Softpick's
  "Spars. %"). For softmax-like maps zeros come only from float32 underflow.
- **first-token weight**: the mean over query rows of ``w[r, 0]`` (Gu et al. 2024's ``alpha_1``);
  the **sink rate** is the share of all heads of all layers whose first-token weight exceeds 0.3
  (``sink_rate``), or 0.2 (``sink_rate_0.2``) (Softpick). Signed maps use the signed weight.
- **entropy**: the Shannon entropy of each row over its visible keys divided by ``log n_r``, so a
  uniform row scores 1 and a one-hot row 0 (Long-Context Generalization with Sparse Attention), averaged over rows. It is computed on
  ``p = |w| / sum |w|``: identical to ``w`` for maps whose rows sum to one, the distribution of
  absolute mass for signed (``tda``, ``diffsoftmax``) and unnormalised (``rela``, ``tra``, ``softpick``)
  maps. Rows with one visible key (``r = 0``; entropy 0/0) and all-zero rows (nothing attended)
  are left out; a head with no row left has entropy NaN.
- **support**: non-zero weights per row, averaged over rows.

Long sequences never materialise the full ``T x T`` map: ``sample_rows`` picks query rows (all of them
when ``T <= rows``), ``AttentionLayer.attention_map`` computes those rows only, and every average
weights a sampled row by the number of rows it stands for, so the estimates are unbiased for the full
map and exact when every row is taken. Summary values average heads and layers equally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

SINK_THRESHOLD = 0.3  # Gu et al. 2024's epsilon, as in Softpick
SINK_THRESHOLD_LOW = 0.2
PAD_ID = 0  # every task's <pad> (tasks/base.py)
HEAD_FIELDS = ("sparsity", "first_token_weight", "entropy", "support")
# Largest number of weights one attention_map call may return (heads x rows x keys), ~256 MiB of fp32.
MAX_MAP_ELEMENTS = 1 << 26


def sample_rows(n_tokens: int, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows to measure in a sequence of ``n_tokens`` real tokens, and how many rows each stands for.

    With ``n_tokens <= rows`` every row is taken (weight 1). Otherwise the last ``max(1, rows // 8)``
    rows are always taken (the rows that see the most keys, where extrapolation fails first) and the
    remaining rows are one uniform draw from each of ``rows - late`` equal strata of the earlier
    positions, weighted by the size of their stratum. Deterministic in ``(n_tokens, rows, seed)``.

    >>> positions, weights = sample_rows(100, 8, seed=0)
    >>> len(positions), int(positions[-1]), float(weights.sum())
    (8, 99, 100.0)
    """
    if n_tokens < 1:
        raise ValueError(f"a sequence needs at least one token, got {n_tokens}")
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    if n_tokens <= rows:
        return torch.arange(n_tokens), torch.ones(n_tokens, dtype=torch.float64)
    late = max(1, rows // 8)
    early_tokens, strata = n_tokens - late, rows - late
    if strata == 0:  # rows == 1: the last row stands for the whole sequence
        return torch.tensor([n_tokens - 1]), torch.tensor([float(n_tokens)], dtype=torch.float64)
    bounds = np.linspace(0, early_tokens, strata + 1).round().astype(np.int64)
    rng = np.random.default_rng([int(seed), int(n_tokens), int(rows)])
    draws = bounds[:-1] + np.floor(rng.random(strata) * (bounds[1:] - bounds[:-1])).astype(np.int64)
    positions = np.concatenate([draws, np.arange(early_tokens, n_tokens)])
    weights = np.concatenate([(bounds[1:] - bounds[:-1]).astype(np.float64), np.ones(late)])
    return torch.from_numpy(positions), torch.from_numpy(weights)


def row_statistics(weights: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row quantities of a weight map ``[..., R, T]`` whose row ``i`` is query position ``positions[i]``.

    Returns tensors of shape ``[..., R]``: ``visible`` (``n_r``), ``zeros`` and ``support`` (exact
    zeros and non-zeros among the visible keys), ``first`` (the weight on key 0) and ``entropy``
    (normalised, NaN where undefined: one visible key or an all-zero row).
    """
    weights = weights.float()
    positions = positions.to(weights.device)
    visible_mask = torch.arange(weights.shape[-1], device=weights.device)[None, :] <= positions[:, None]
    visible = visible_mask.sum(-1).to(torch.float64).expand(weights.shape[:-1])
    mass = torch.where(visible_mask, weights.abs(), torch.zeros((), device=weights.device))
    support = (mass > 0).sum(-1).to(torch.float64)
    total = mass.sum(-1, keepdim=True)
    p = mass / total.clamp_min(torch.finfo(torch.float32).tiny)
    shannon = -torch.special.xlogy(p, p).sum(-1).to(torch.float64)
    entropy = shannon / torch.log(visible.clamp_min(2.0))
    entropy = torch.where((visible > 1) & (total.squeeze(-1) > 0), entropy, torch.nan)
    return {
        "visible": visible,
        "zeros": visible - support,
        "support": support,
        "first": weights[..., 0].to(torch.float64),
        "entropy": entropy,
    }


class HeadAccumulator:
    """Row-weighted sums per (layer, head), filled one block of rows at a time."""

    def __init__(self, n_layers: int, n_heads: int):
        shape = (n_layers, n_heads)
        self.sums = {k: torch.zeros(shape, dtype=torch.float64)
                     for k in ("rows", "visible", "zeros", "support", "first", "entropy", "entropy_rows")}

    def add(self, layer: int, weights: torch.Tensor, positions: torch.Tensor, row_weights: torch.Tensor) -> None:
        """``weights [B, H, R, T]`` of rows ``positions [R]``, each standing for ``row_weights [R]`` rows."""
        stats = row_statistics(weights, positions)
        rw = row_weights.to(torch.float64).to(stats["visible"].device)
        defined = ~torch.isnan(stats["entropy"])

        def weighted(x):  # [B, H, R] -> [H]
            return (x * rw).sum(dim=(0, 2)).cpu()

        self.sums["rows"][layer] += weighted(torch.ones_like(stats["visible"]))
        for key in ("visible", "zeros", "support", "first"):
            self.sums[key][layer] += weighted(stats[key])
        self.sums["entropy"][layer] += weighted(torch.nan_to_num(stats["entropy"], nan=0.0))
        self.sums["entropy_rows"][layer] += weighted(defined.to(torch.float64))

    def per_head(self) -> dict[str, np.ndarray]:
        s = self.sums
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "sparsity": (s["zeros"] / s["visible"]).numpy(),
                "first_token_weight": (s["first"] / s["rows"]).numpy(),
                "entropy": (s["entropy"] / s["entropy_rows"]).numpy(),  # 0/0 = NaN: no defined row
                "support": (s["support"] / s["rows"]).numpy(),
            }


def summarise(per_head: dict[str, np.ndarray], diagnostic_rows: int) -> dict:
    """Layer-and-head means, sink rates, and the per-head values as JSON-ready nested lists."""

    def mean(values: np.ndarray) -> float:
        finite = values[~np.isnan(values)]
        return float(finite.mean()) if finite.size else math.nan

    first = per_head["first_token_weight"]
    return {
        "sparsity": mean(per_head["sparsity"]),
        "sink_rate": float((first > SINK_THRESHOLD).mean()),
        "sink_rate_0.2": float((first > SINK_THRESHOLD_LOW).mean()),
        "entropy": mean(per_head["entropy"]),
        "support": mean(per_head["support"]),
        "diagnostic_rows": int(diagnostic_rows),
        # [layer][head]; NaN becomes None so that the result is strict JSON.
        "per_head": {key: [[None if math.isnan(v) else float(v) for v in layer] for layer in per_head[key]]
                     for key in HEAD_FIELDS},
    }


def map_diagnostics(weights: torch.Tensor, positions: torch.Tensor | None = None,
                    row_weights: torch.Tensor | None = None) -> dict:
    """The diagnostics of given weight maps ``[L, H, R, T]`` (or ``[H, R, T]`` for one layer).

    ``positions`` are the query positions of the rows (default ``0 .. R-1``, a full square map) and
    ``row_weights`` how many rows each stands for (default 1). For hand-made maps and
    ``attention_weights`` output.
    """
    if weights.dim() == 3:
        weights = weights.unsqueeze(0)
    if weights.dim() != 4:
        raise ValueError(f"weights must be [layers, heads, rows, keys], got {tuple(weights.shape)}")
    n_layers, n_heads, n_rows, _ = weights.shape
    positions = torch.arange(n_rows) if positions is None else torch.as_tensor(positions)
    row_weights = torch.ones(n_rows, dtype=torch.float64) if row_weights is None else torch.as_tensor(row_weights)
    acc = HeadAccumulator(n_layers, n_heads)
    for layer in range(n_layers):
        acc.add(layer, weights[layer].unsqueeze(0), positions, row_weights)
    return summarise(acc.per_head(), n_rows)


def real_lengths(input_ids: torch.Tensor) -> torch.Tensor:
    """Tokens before the trailing ``<pad>`` run of each row (batches are padded at the end)."""
    not_pad = input_ids != PAD_ID
    last = torch.where(not_pad, torch.arange(input_ids.shape[1], device=input_ids.device), -1).amax(dim=1)
    return (last + 1).clamp_min(1)


@torch.no_grad()
def measure_attention(model, input_ids, features=None, rows: int = 64, seed: int = 0, *,
                      realised_tokens: Sequence[int] | None = None, max_sequences: int | None = 8) -> dict:
    """Attention diagnostics of ``model`` (a :class:`~lengthbench.models.decoder.Decoder`) on one batch.

    ``rows`` query rows are sampled per sequence (see :func:`sample_rows`; seed ``seed + b`` for
    sequence ``b``) within its real tokens (``realised_tokens``, or the tokens before the trailing
    ``<pad>``). Only the first ``max_sequences`` sequences are measured (None: all). Returns
    ``sparsity, sink_rate, sink_rate_0.2, entropy, support`` (means over layers and heads; sink rates
    are shares of all heads), ``diagnostic_rows`` (rows measured per sequence, at most ``rows``) and
    ``per_head`` (``{field: [layer][head]}``). Runs in float32 without gradients; memory is
    O(heads x rows x T) per layer beyond the model's own forward pass.
    """
    device = next(model.parameters()).device
    input_ids = torch.as_tensor(np.asarray(input_ids) if not torch.is_tensor(input_ids) else input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    input_ids = input_ids.to(device=device, dtype=torch.long)
    if features is not None:
        features = torch.as_tensor(np.asarray(features) if not torch.is_tensor(features) else features)
        features = features.reshape(input_ids.shape).to(device)
    if realised_tokens is None:
        lengths = real_lengths(input_ids).tolist()
    else:
        lengths = [min(max(1, int(n)), input_ids.shape[1]) for n in np.asarray(realised_tokens).reshape(-1)]
    if max_sequences is not None:
        input_ids, lengths = input_ids[:max_sequences], lengths[:max_sequences]
        features = None if features is None else features[:max_sequences]
    input_ids = input_ids[:, : max(lengths)]
    features = None if features is None else features[:, : input_ids.shape[1]]

    layers = list(model.attention_layers)
    n_heads = layers[0].n_heads
    tokens = input_ids.shape[1]
    # The hidden states need one forward pass; bound the memory of the reference path while it runs.
    saved_chunks = [layer.query_chunk for layer in layers]
    for layer in layers:
        if layer.query_chunk is None:
            layer.query_chunk = max(16, MAX_MAP_ELEMENTS // (n_heads * tokens * input_ids.shape[0]))
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            states = model.hidden_states(input_ids, features)
            acc = HeadAccumulator(len(layers), n_heads)
            measured = 0
            for b, length in enumerate(lengths):
                positions, row_weights = sample_rows(length, rows, seed + b)
                measured = max(measured, len(positions))
                chunk = max(1, MAX_MAP_ELEMENTS // (n_heads * length))
                for layer_index, (layer, x) in enumerate(zip(layers, states, strict=True)):
                    x_b = x[b : b + 1, :length]
                    for start in range(0, len(positions), chunk):
                        block = positions[start : start + chunk]
                        weights = layer.attention_map(x_b, block.to(device))
                        acc.add(layer_index, weights, block, row_weights[start : start + chunk])
    finally:
        for layer, chunk in zip(layers, saved_chunks, strict=True):
            layer.query_chunk = chunk
    return summarise(acc.per_head(), measured)
