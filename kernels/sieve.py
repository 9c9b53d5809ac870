"""Sieve attention (seed 004): stick-breaking over the support of 1.5-entmax of the earlier keys.

Two stages, as Appendix C: the threshold kernel of ``entmax.py`` finds ``tau_r`` of 1.5-entmax over
``z_{r, j<r}`` (Newton passes over the key tiles, no score matrix kept); the stick-breaking kernels of
``stickbreaking.py`` then run with the filter ``z_rj / 2 > tau_r`` (the support: its weights
``(z/2 - tau)_+^2`` are positive exactly there), the remainder on the diagonal. This is the definition
(Section 3.1), not Algorithm 1's ``z >= rowmax - eps``. No gradient flows through the support; ``row_scale``
and ``slopes`` receive gradients through the stick-breaking stage.

``sieve_alg1_attention`` is Algorithm 1 itself (``sieve-alg1``): a row-max pass over ``j < r``, then the
stick-breaking kernels with the stick over every earlier key and the weights kept within ``eps`` of the max.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, head_slope, rows_scale, score_tile, tile_rows
from lengthbench.kernels.entmax import entmax_threshold
from lengthbench.kernels.stickbreaking import StickBreakingAttention


def sieve_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """Sieve attention, ``[B, H, T, D]`` causal (``alpha`` must be 1.5)."""
    if float(alpha) != 1.5:
        raise ValueError(f"the sieve kernel implements alpha = 1.5 only, got {alpha}")
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, strict=True)
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, False)


@triton.jit
def _rowmax_kernel(Q, K, SL, RS, OUT, sm_scale, T, H, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                   DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``max_{j<r} z_rj`` per row (-inf for row 0)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, roff = tile_rows(pid_m * BM, T, D, BD, BM)
    q = tl.load(Q + base + roff, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start_n in range(0, tl.minimum((pid_m + 1) * BM, T), BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        earlier = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        best = tl.maximum(best, tl.max(tl.where(earlier, z, float("-inf")), 1))
    tl.store(OUT + bh * T + offs_m, best, mask=row_ok)


def sieve_alg1_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, eps=2.0):
    """Sieve as the seed's Algorithm 1, ``[B, H, T, D]`` causal: stick-breaking over every earlier key, the
    weights kept where ``z_rj >= max_{k<r} z_rk - eps`` (strictly above, ties at the boundary aside)."""
    pb = Problem(q, k, v, slopes, row_scale, sm_scale)
    rowmax = pb.rows()
    grid = (triton.cdiv(pb.tokens, pb.fwd_block), pb.bh)
    _rowmax_kernel[grid](pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), rowmax, pb.sm_scale, pb.tokens,
                         pb.heads, HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                         DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=pb.fwd_block, BN=pb.block,
                         num_warps=pb.fwd_warps, num_stages=2)
    # the stick-breaking kernels keep the weights where z / 2 > tau; a sliver below eps keeps z = max - eps
    tau = (rowmax - float(eps)) * 0.5 - 1e-6
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, True)
