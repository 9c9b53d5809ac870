"""1.5-entmax attention: ``w_rj = (z_rj / 2 - tau_r)_+^2`` with ``tau_r`` making row ``r`` sum to 1; and
sparsemax (alpha = 2): ``w_rj = (z_rj - tau_r)_+``.

The threshold comes from its own kernel (``entmax_threshold``, which Sieve reuses for its support): one
program per query tile. A first pass over the key tiles keeps, per row, the ``TOPK`` (16) largest of the
tile maxima of ``X = z / 2``; the exact threshold of that subset, found in registers, is a lower bound on
``tau*`` (a subset's sum ``sum (X - t)_+^2`` is never larger) and at least ``X_max - 1``. Passes then each
accumulate, per row, ``s1 = sum (X - tau)_+``, ``s2 = sum (X - tau)_+^2``, the support size and the least
``X`` in the support. From them either the exact root of ``sum_S (X - t)^2 = 1`` on the current support
``S`` (accepted when no element of ``S`` falls below it: then it is ``tau*``), or a Newton step on
``h(tau) = ||(X - tau)_+||_2 - 1``: ``tau <- tau + (s2 - sqrt(s2)) / s1``. ``h`` is convex and decreasing
and the iteration starts below ``tau*``, so the Newton steps rise monotonically to ``tau*`` without
overshooting, and the exact step ends the search once the support is found. For 64k Gaussian scores
(`benchmarks/entmax_passes.py`) the subset start takes the passes after the first from 5-6 to 2-3. The tile stops when every row
is exact or moves by less than ``tol``.

Sparsemax runs the same search on ``X = z`` for the root of ``sum (X - tau)_+ = 1``, piecewise linear: its
Newton step from below is the exact root on the current support, accepted as ``tau*`` once no element of the
support falls below it.

The output and gradients then use the shared pointwise kernels (``_rowwise.py``), the forward also keeping
``u_r = sum_j (X_rj - tau_r)_+ v_j`` for the backward: ``dz_rj = s_rj (do_r.v_j - do_r.u_r / sum_j s_rj)``
with ``s = (X - tau)_+``. No gradient flows through ``tau`` other than this (it is the exact entmax
Jacobian). For sparsemax the backward's weights are the support's indicator: ``dz_rj = 1[s_rj > 0] (do_r.v_j -
do_r.u_r / |S_r|)`` with ``u_r = sum_{j in S_r} v_j``. ``row_scale`` and ``slopes`` receive gradients.
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
                 D: tl.constexpr, BN: tl.constexpr, XS: tl.constexpr):
    """Per row of one key tile: sum of ``s = (X - tau)_+``, of ``s^2``, the count of ``s > 0`` and the least
    ``X`` above ``tau``."""
    offs_n = start_n + tl.arange(0, BN)
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    x = z * XS
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
def _exact(s1, s2, cnt):
    """The exact root of ``sum_S (X - t)^2 = 1`` on the current support ``S = {X > tau}``, as a step from
    ``tau`` (rationalised form)."""
    disc = tl.maximum(s1 * s1 - cnt * (s2 - 1.0), 0.0)
    return (s2 - 1.0) / tl.where(s1 > 0, s1 + tl.sqrt(disc), 1.0)


@triton.jit
def _exact_ok(s1, s2, cnt, x_low, tau, XS: tl.constexpr):
    """Whether the exact root on the current support is ``tau*``: no element of the support falls below it.
    (sparsemax, ``XS == 1``: the root of ``sum_S (X - t) = 1`` is ``tau + (s1 - 1) / cnt``.)"""
    if XS == 1.0:
        ok = (cnt > 0) & (tau + (s1 - 1.0) / tl.where(cnt > 0, cnt, 1.0) < x_low)
    else:
        ok = (cnt > 0) & (s1 * s1 - cnt * (s2 - 1.0) >= 0) & (tau + _exact(s1, s2, cnt) < x_low)
    return ok


@triton.jit
def _step(s1, s2, cnt, x_low, tau, XS: tl.constexpr):
    """The step from ``tau`` towards ``tau*``: the exact root when it is ``tau*``, else a Newton step on ``h``;
    never negative (a rounding below zero must not leave the lower side). For sparsemax the Newton step on the
    piecewise-linear ``sum (X - tau)_+ - 1`` is the exact root on the current support."""
    if XS == 1.0:
        step = tl.where(cnt > 0, (s1 - 1.0) / tl.where(cnt > 0, cnt, 1.0), 0.0)
    else:
        newton = tl.where(s1 > 0, (s2 - tl.sqrt(s2)) / tl.where(s1 > 0, s1, 1.0), 0.0)
        step = tl.where(_exact_ok(s1, s2, cnt, x_low, tau, XS), _exact(s1, s2, cnt), newton)
    return tl.maximum(step, 0.0)


@triton.jit
def _threshold_kernel(Q, K, SL, RS, TAU, sm_scale, T, H, tol, max_iter,
                      STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                      DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, TOPK: tl.constexpr, SUBSET_ITERS: tl.constexpr, XS: tl.constexpr):
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
    # First pass: per row, the largest X of each key tile, keeping the TOPK largest of those (a subset of the
    # row's scores, so the exact threshold of that subset is a lower bound on tau*, usually a close one).
    cols = tl.arange(0, TOPK)
    top = tl.full([BM, TOPK], float("-inf"), dtype=tl.float32)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        if STRICT:
            valid = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        else:
            valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
        tile_max = tl.max(tl.where(valid, z * XS, float("-inf")), 1)
        low = tl.min(top, 1)
        pos = tl.argmin(top, 1)
        top = tl.where((cols[None, :] == pos[:, None]) & (tile_max > low)[:, None], tile_max[:, None], top)
    x_max = tl.max(top, 1)
    empty = x_max == float("-inf")
    # The subset's threshold, by the same exact/Newton steps in registers, from X_max - 1 (below it).
    tau = tl.where(empty, 0.0, x_max - 1.0)
    for _ in tl.static_range(SUBSET_ITERS):
        s = tl.maximum(top - tau[:, None], 0.0)
        inside = s > 0
        s1 = tl.sum(s, 1)
        s2 = tl.sum(s * s, 1)
        cnt = tl.sum(inside.to(tl.float32), 1)
        x_low = tl.min(tl.where(inside, top, float("inf")), 1)
        tau += _step(s1, s2, cnt, x_low, tau, XS)
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
                                          tau, False, STRICT, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN, XS)
            s1 += a1
            s2 += a2
            cnt += a3
            x_low = tl.minimum(x_low, a4)
        for start_n in range(diag, hi, BN):
            a1, a2, a3, a4 = _newton_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
                                          tau, True, STRICT, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN, XS)
            s1 += a1
            s2 += a2
            cnt += a3
            x_low = tl.minimum(x_low, a4)
        exact_ok = _exact_ok(s1, s2, cnt, x_low, tau, XS)
        step = _step(s1, s2, cnt, x_low, tau, XS)
        tau += step
        done = exact_ok | (step <= tol * (1.0 + tl.abs(tau))) | empty | (offs_m >= T)
        pending = tl.sum((done == 0).to(tl.int32), 0)
        it += 1
    tau = tl.where(empty, float("inf"), tau)
    tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)


# alpha -> the factor X = (alpha - 1) z of the threshold kernel; the output pass's POWER is 1 / (alpha - 1).
_ALPHAS = {1.5: 0.5, 2.0: 1.0}


def _check_alpha(alpha) -> float:
    alpha = float(alpha)
    if alpha not in _ALPHAS:
        raise ValueError(f"the entmax kernels implement alpha = 1.5 and 2 (sparsemax) only, got {alpha}")
    return alpha


def entmax_threshold(q, k, *, slopes=None, row_scale=None, sm_scale=None, strict=False, tol=1e-6,
                     max_iter=40, alpha=1.5) -> torch.Tensor:
    """``tau`` ``[B, H, T]`` fp32 of alpha-entmax (1.5 or 2) over each row's visible keys (``j < r`` when
    ``strict``; ``+inf`` for a row with no key), on the scale ``X = (alpha - 1) z``. No gradient."""
    xs = _ALPHAS[_check_alpha(alpha)]
    pb = Problem(q, k, k, slopes, row_scale, sm_scale)
    tau = pb.rows()
    grid = (triton.cdiv(pb.tokens, pb.fwd_block), pb.bh)
    _threshold_kernel[grid](pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), tau, pb.sm_scale, pb.tokens,
                            pb.heads, float(tol), int(max_iter), STRICT=bool(strict),
                            HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                            DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=pb.fwd_block, BN=pb.block,
                            TOPK=16, SUBSET_ITERS=8, XS=xs, num_warps=pb.fwd_warps, num_stages=2)
    return tau


def entmax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """alpha-entmax attention (``alpha`` 1.5 or 2), ``[B, H, T, D]`` causal."""
    alpha = _check_alpha(alpha)
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=alpha)
    return rowwise(q, k, v, mech=ENTMAX, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale,
                   power=1.0 / (alpha - 1.0))


def sparsemax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None):
    """sparsemax (2-entmax) attention, ``[B, H, T, D]`` causal: ``w = (z - tau)_+`` summing to one."""
    return entmax_attention(q, k, v, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=2.0)
