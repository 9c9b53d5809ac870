"""1.5-entmax attention: ``w_rj = (z_rj / 2 - tau_r)_+^2`` with ``tau_r`` making row ``r`` sum to 1.

The threshold comes from its own kernel (``entmax_threshold``, which Sieve reuses for its support): one
program per query tile, a pass over the key tiles for the row max ``X_max`` of ``X = z / 2``, then passes
that each accumulate, per row, ``s1 = sum (X - tau)_+``, ``s2 = sum (X - tau)_+^2``, the support size and the
least ``X`` in the support. From them either the exact root of ``sum_S (X - t)^2 = 1`` on the current
support ``S`` (accepted when no element of ``S`` falls below it: then it is ``tau*``), or a Newton step on
``h(tau) = ||(X - tau)_+||_2 - 1``: ``tau <- tau + (s2 - sqrt(s2)) / s1``. ``h`` is convex and decreasing and
the iteration starts at ``X_max - 1 <= tau*``, so the Newton steps rise monotonically to ``tau*`` without
overshooting, and the exact step ends the search once the support is found (about 5 passes for 64k
Gaussian scores). The tile stops when every row is exact or moves by less than ``tol``.

The output and gradients then use the shared pointwise kernels (``_rowwise.py``), the forward also keeping
``u_r = sum_j (X_rj - tau_r)_+ v_j`` for the backward: ``dz_rj = s_rj (do_r.v_j - do_r.u_r / sum_j s_rj)``
with ``s = (X - tau)_+``. No gradient flows through ``tau`` other than this (it is the exact entmax
Jacobian). ``row_scale`` and ``slopes`` receive gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, score_tile
from lengthbench.kernels._rowwise import ENTMAX, rowwise


@triton.jit
def _newton_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, tau, MASKED: tl.constexpr,
                 STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr,
                 D: tl.constexpr, BN: tl.constexpr):
    """Per row of one key tile: sum of ``s = (X - tau)_+``, of ``s^2``, the count of ``s > 0`` and the least
    ``X`` above ``tau``."""
    offs_n = start_n + tl.arange(0, BN)
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    x = z * 0.5
    if MASKED:
        if STRICT:
            valid = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        else:
            valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
        x = tl.where(valid, x, float("-inf"))
    s = tl.maximum(x - tau[:, None], 0.0)
    inside = s > 0
    return (tl.sum(s, 1), tl.sum(s * s, 1), tl.sum(inside.to(tl.float32), 1),
            tl.min(tl.where(inside, x, float("inf")), 1))


@triton.jit
def _threshold_kernel(Q, K, SL, RS, TAU, sm_scale, T, H, tol, max_iter,
                      STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                      DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & dmask[None, :], other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    # Keys visible to row r: j <= r, or j < r when STRICT (Sieve).
    hi = tl.minimum((pid_m + 1) * BM, T)
    if STRICT:
        hi = tl.minimum((pid_m + 1) * BM - 1, T - 1)
    x_max = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        if STRICT:
            valid = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        else:
            valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
        x_max = tl.maximum(x_max, tl.max(tl.where(valid, z * 0.5, float("-inf")), 1))
    empty = x_max == float("-inf")
    tau = tl.where(empty, 0.0, x_max - 1.0)
    pending = tl.sum(row_ok.to(tl.int32), 0)
    it = 0
    diag = pid_m * BM  # key tiles before the tile's first row are fully visible: no mask there
    while (it < max_iter) & (pending > 0):
        s1 = tl.zeros([BM], dtype=tl.float32)
        s2 = tl.zeros([BM], dtype=tl.float32)
        cnt = tl.zeros([BM], dtype=tl.float32)
        x_low = tl.full([BM], float("inf"), dtype=tl.float32)
        for start_n in range(0, diag, BN):
            a1, a2, a3, a4 = _newton_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
                                          tau, False, STRICT, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN)
            s1 += a1
            s2 += a2
            cnt += a3
            x_low = tl.minimum(x_low, a4)
        for start_n in range(diag, hi, BN):
            a1, a2, a3, a4 = _newton_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
                                          tau, True, STRICT, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN)
            s1 += a1
            s2 += a2
            cnt += a3
            x_low = tl.minimum(x_low, a4)
        # Exact root of sum_S (X - t)^2 = 1 on the current support S = {X > tau} (rationalised form); it
        # is tau* itself when no element of S falls below it. Otherwise a Newton step on h.
        disc = tl.maximum(s1 * s1 - cnt * (s2 - 1.0), 0.0)
        exact = (s2 - 1.0) / tl.where(s1 > 0, s1 + tl.sqrt(disc), 1.0)
        exact_ok = (cnt > 0) & (s1 * s1 - cnt * (s2 - 1.0) >= 0) & (tau + exact < x_low)
        newton = tl.where(s1 > 0, (s2 - tl.sqrt(s2)) / tl.where(s1 > 0, s1, 1.0), 0.0)
        step = tl.maximum(tl.where(exact_ok, exact, newton), 0.0)
        tau += step
        done = exact_ok | (step <= tol * (1.0 + tl.abs(tau))) | empty | (offs_m >= T)
        pending = tl.sum((done == 0).to(tl.int32), 0)
        it += 1
    tau = tl.where(empty, float("inf"), tau)
    tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)


def entmax_threshold(q, k, *, slopes=None, row_scale=None, sm_scale=None, strict=False, tol=1e-6,
                     max_iter=40) -> torch.Tensor:
    """``tau`` ``[B, H, T]`` fp32 of 1.5-entmax over each row's visible keys (``j < r`` when ``strict``;
    ``+inf`` for a row with no key). No gradient."""
    pb = Problem(q, k, k, slopes, row_scale, sm_scale)
    tau = pb.rows()
    grid = (triton.cdiv(pb.tokens, pb.fwd_block), pb.bh)
    _threshold_kernel[grid](pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), tau, pb.sm_scale, pb.tokens,
                            pb.heads, float(tol), int(max_iter), STRICT=bool(strict),
                            HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                            DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=pb.fwd_block, BN=pb.block,
                            num_warps=pb.fwd_warps, num_stages=2)
    return tau


def entmax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """1.5-entmax attention (``alpha`` must be 1.5), ``[B, H, T, D]`` causal."""
    if float(alpha) != 1.5:
        raise ValueError(f"the entmax kernel implements alpha = 1.5 only, got {alpha}")
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale)
    return rowwise(q, k, v, mech=ENTMAX, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale)
