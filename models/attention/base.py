"""The attention sublayer every mechanism shares, and its dense, query-chunked reference path.

A mechanism is an :class:`AttentionLayer` subclass registered by name. The simplest ones only give a
weight function (``weights``); the layer computes raw scores ``z = q.k / sqrt(d) - slope_h (r - j)``,
hands each block of query rows to it, and multiplies by the values. Query blocks keep memory at
O(query_chunk x L), so a CPU can evaluate 65,536-token sequences; the result equals the unchunked path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from lengthbench.models.positional import PositionalEncoding
from lengthbench.models.registry import Registry

WeightFunction = Callable[..., torch.Tensor]
WEIGHT_FUNCTIONS: Registry[WeightFunction] = Registry("attention weight function")


def causal_mask(query_positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """``[Lq, n_keys]`` bool: key ``j`` is visible to the query at position ``r`` iff ``j <= r``."""
    keys = torch.arange(n_keys, device=query_positions.device)
    return keys[None, :] <= query_positions[:, None]


def visible_counts(query_positions: torch.Tensor) -> torch.Tensor:
    """``n_r = r + 1``, the keys visible to each query, as float ``[Lq, 1]``."""
    return (query_positions + 1).to(torch.float32)[:, None]


class AttentionLayer(nn.Module):
    """Multi-head causal self-attention: ``x [B, T, d_model] -> [B, T, d_model]``.

    Subclasses set ``name`` (by registering) and override ``weights`` (a map of one score matrix), or
    ``scores``/``attend`` where the mechanism needs more (two views, an output norm, a gate).
    ``query_chunk`` (None: all rows at once) bounds the memory of the reference path; ``use_kernels``
    lets a mechanism call its fused kernel on CUDA.
    """

    name: ClassVar[str] = "abstract"

    def __init__(self, d_model: int, n_heads: int, pe: PositionalEncoding, **params):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
        if params:
            raise ValueError(f"attention {self.name!r} takes no parameter {sorted(params)[0]!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.pe = pe
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.query_chunk: int | None = None
        self.use_kernels = True

    # -- the pieces a mechanism may override -------------------------------------------------------
    def project(self, x: torch.Tensor):
        """``q, k, v`` as ``[B, H, T, head_dim]``, positions applied."""
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        positions = torch.arange(tokens, device=x.device)
        q, k = self.pe.rotate(q, k, positions)
        return q, k, v

    def scores(self, q_rows: torch.Tensor, k: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """Raw scores ``[B, H, Lq, Lk]`` (float32) of the query rows at ``query_positions`` against keys
        ``0 .. Lk-1``; the causal mask is not applied here."""
        z = torch.matmul(q_rows.float(), k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        slopes = self.pe.slopes()
        if slopes is not None:
            distance = query_positions[:, None] - torch.arange(k.shape[-2], device=k.device)[None, :]
            z = z - slopes.to(z.device)[:, None, None] * distance.to(z.dtype)
        return z

    def weights(self, scores: torch.Tensor, query_positions: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """The weight map ``[B, H, Lq, Lk]`` of the mechanism for these raw scores; zero where masked."""
        raise NotImplementedError

    def attend(self, q, k, v, x) -> torch.Tensor:
        """Per-head outputs ``[B, H, T, head_dim]``. Mechanisms with a kernel dispatch here."""
        return self.reference_attend(q, k, v, x)

    def finish_heads(self, heads: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Hook on the per-head outputs before they are merged (output norms, gates)."""
        return heads

    # -- shared machinery --------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.project(x)
        heads = self.finish_heads(self.attend(q, k, v, x), x)
        return self.out(heads.transpose(1, 2).reshape(batch, tokens, self.d_model).to(x.dtype))

    def reference_attend(self, q, k, v, x) -> torch.Tensor:
        tokens = q.shape[-2]
        chunk = self.query_chunk or tokens
        outputs = []
        for start in range(0, tokens, chunk):
            stop = min(tokens, start + chunk)
            positions = torch.arange(start, stop, device=q.device)
            w = self.weights(self.scores(q[:, :, start:stop], k[:, :, :stop], positions), positions,
                             x[:, start:stop])
            outputs.append(torch.matmul(w, v[:, :, :stop].float()))
        return torch.cat(outputs, dim=2).to(v.dtype)

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Weights ``[B, H, len(rows), T]`` of the query rows ``rows`` (default: all) over all keys.

        Only the requested rows are computed (memory O(len(rows) x T)), for diagnostics and plots.
        Mechanisms whose output is not one weight map (e.g. two views) return their effective map.
        """
        q, k, _ = self.project(x)
        if rows is None:
            rows = torch.arange(x.shape[1], device=x.device)
        rows = rows.to(x.device)
        return self.weights(self.scores(q[:, :, rows], k, rows), rows, x[:, rows])


def masked_fill_zero(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact zeros outside the mask (and no NaN leaking from masked entries)."""
    return torch.where(mask, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
