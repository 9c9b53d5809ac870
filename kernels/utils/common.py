"""Pieces every fused op shares: argument checks, tile sizes and the biased score tile.

Not an op. Scores follow ``kernels/__init__.py``: ``z = row_scale_r * (q.k * sm_scale - slope_h * (r - j))``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
               DOT_PREC: tl.constexpr):
    """``(z, zb)``: the scores of a ``[BM, BN]`` tile and the biased scores before ``row_scale``."""
    zb = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale
    if HAS_SLOPES:
        zb = zb - slope * (offs_m[:, None] - offs_n[None, :]).to(tl.float32)
    z = zb
    if HAS_RS:
        z = zb * rs[:, None]
    return z, zb


@triton.jit
def folded_scores(q, k, sm_scale, rs, factor: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr):
    """``factor * z`` of a ``[BM, BN]`` tile without slopes, in one product a score: ``q.k`` times the row's
    ``sm_scale * factor`` (times its ``row_scale``), instead of ``score_tile``'s products and then ``factor``.
    Without a row scale and with a power-of-two ``factor`` it is the same number; with one, ``(q.k sm_scale) rs``
    and ``q.k (sm_scale rs)`` may differ by a rounding (a few 1e-8 of the score). The product then fuses with
    the subtraction that follows it (``X - tau``): the threshold search's passes take one instruction a score
    for it (sm_90 SASS) instead of three with a row scale."""
    c = sm_scale * factor
    if HAS_RS:
        return tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * (rs * c)[:, None]
    return tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * c


@triton.jit
def tile_rows(start, T, D: tl.constexpr, BD: tl.constexpr, B: tl.constexpr):
    """A tile of ``B`` rows from ``start`` of one ``[T, D]`` head: ``(offs, offs_d, row_ok, dmask, mask, off)``
    with ``mask``/``off`` the ``[B, BD]`` load mask and element offsets (add the head's base)."""
    offs = start + tl.arange(0, B)
    offs_d = tl.arange(0, BD)
    row_ok = offs < T
    dmask = offs_d < D
    return offs, offs_d, row_ok, dmask, row_ok[:, None] & dmask[None, :], offs[:, None] * D + offs_d[None, :]


@triton.jit
def gathered_rows(Q, SL, RS, ROWS, n_open, pid_m, bh, T, H, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                  D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    """Tile ``pid_m`` of the rows gathered per head in ``ROWS[bh, :n_open]`` (``T + 1`` a head; the open rows
    of ``entmax._open_rows``): ``(base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs)``, ``offs_m`` the
    rows (0 past ``n_open``), ``rmask`` the ``[BM, BD]`` load mask, ``q`` in its own dtype."""
    base = bh.to(tl.int64) * T * D
    slots = pid_m * BM + tl.arange(0, BM)
    row_ok = slots < n_open
    offs_m = tl.load(ROWS + bh.to(tl.int64) * (T + 1) + slots, mask=row_ok, other=0)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    return base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs


@triton.jit
def head_slope(SL, bh, H, HAS_SLOPES: tl.constexpr):
    """The ALiBi slope of program ``bh``'s head (0 without slopes)."""
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    return slope


@triton.jit
def rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS: tl.constexpr, BM: tl.constexpr):
    """The ``row_scale`` factors of a query tile (ones without them)."""
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    return rs


@triton.jit
def softplus(z):
    return tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))


class Problem:
    """Validated, contiguous inputs of one call, with the launch constants derived from them."""

    def __init__(self, q, k, v, slopes, row_scale, sm_scale):
        if q.dim() != 4 or q.shape != k.shape or q.shape[:3] != v.shape[:3]:
            raise ValueError(f"q, k, v must be [B, H, T, D] alike, got {tuple(q.shape)}, {tuple(k.shape)}, "
                             f"{tuple(v.shape)}")
        if v.shape[-1] != q.shape[-1]:
            raise ValueError("these kernels need the value head dim equal to the query head dim")
        if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"q, k, v must share one of fp32/fp16/bf16, got {q.dtype}, {k.dtype}, {v.dtype}")
        self.batch, self.heads, self.tokens, self.head_dim = q.shape
        if not 1 <= self.head_dim <= 128:
            raise ValueError(f"head_dim {self.head_dim} outside 1..128")
        self.q, self.k, self.v = q.contiguous(), k.contiguous(), v.contiguous()
        self.sm_scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.slopes = None if slopes is None else slopes.detach().to(q.device, torch.float32).contiguous()
        self.row_scale = None
        if row_scale is not None:
            self.row_scale = row_scale.detach().to(q.device, torch.float32).expand(
                self.batch, self.heads, self.tokens).contiguous()
        self.block_d = max(16, triton.next_power_of_2(self.head_dim))
        self.block = 64 if self.block_d <= 64 else 32
        self.num_warps = 4
        # Forward-only passes (no dk/dv tile of their own) take taller query tiles.
        self.fwd_block = 128 if self.block_d <= 64 else self.block
        self.fwd_warps = 8 if self.block_d <= 64 else 4
        self.dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
        # Unused pointer arguments still need a tensor; this one is never read.
        self.dummy = torch.empty(1, device=q.device, dtype=torch.float32)

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    def rows(self) -> torch.Tensor:
        """A fresh fp32 ``[B, H, T]`` per-row buffer."""
        return torch.empty(self.batch, self.heads, self.tokens, device=self.q.device, dtype=torch.float32)

    def opt(self, tensor):
        return self.dummy if tensor is None else tensor


def reduce_slopes(per_row: torch.Tensor) -> torch.Tensor:
    """``[B, H, T]`` per-row slope gradients -> ``[H]``."""
    return per_row.sum(dim=(0, 2))
