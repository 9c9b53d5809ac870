"""The tiled forward/backward shared by mechanisms whose weight is a pointwise map of the score, at most
divided by one per-row sum: softpick, rectified, rela, tra and the output pass of entmax and sparsemax
(``ENTMAX`` with ``POWER`` 2 and 1), and the backward of adatemp's entropy (``ENTROPY``: no values, dz only;
``adatemp.py``). ``tda/op.py``'s two-view kernels reuse its pointwise maps.

Each op module (``softpick.py``, ...) owns its mechanism code ``MECH`` and its autograd entry; this file holds
the three kernels they share (forward; dq; dk/dv), specialised per mechanism at compile time:

- forward, one program per query tile, keys left to right up to the diagonal (tiles above it skipped),
  fp32 accumulators, the running max ``m`` for the normalised maps (online rescaling as in FlashAttention);
- dq, one program per query tile over the same keys; dk/dv, one program per key tile over the query tiles
  at or below it. Both recompute the weights from the per-row statistics the forward kept (Out(L) memory).

Per-row statistics (``[B, H, T]`` fp32): ``M`` and ``L`` (softpick: max shift and shifted denominator;
rectified: max shift and shifted sum; entmax: sum of (z/2 - tau)_+ and sum of weights; sparsemax: support
size and sum of weights; entropy: max and shifted sum), ``TAU`` (tra: threshold; entmax: the alpha-entmax
threshold; entropy: H) and, for the backward, ``DELTA`` (softpick/rectified: do.o; entmax: do.u / sum
(z/2 - tau)_+; entropy: dLoss/dH).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.utils.common import Problem, folded_scores, reduce_slopes, score_tile

SOFTPICK, RECTIFIED, RELA, TRA, ENTMAX, ENTROPY = 0, 1, 2, 3, 4, 5


@triton.jit
def _weights(z, valid, m, den, tau, MECH: tl.constexpr, POWER: tl.constexpr):
    """The weights of a tile as the output uses them (normalised, fp32); zero where not ``valid``."""
    if MECH == 0:
        diff = tl.exp(tl.where(valid, z, float("-inf")) - m[:, None]) - tl.exp(-m)[:, None]
        w = tl.where(valid, tl.maximum(diff, 0.0), 0.0) / den[:, None]
    elif MECH == 1:
        sel = valid & (z >= 0)
        w = tl.where(sel, tl.exp(tl.where(sel, z, 0.0) - m[:, None]), 0.0) / tl.where(den > 0, den, 1.0)[:, None]
    elif MECH == 2:
        w = tl.where(valid, tl.maximum(z, 0.0), 0.0)
    elif MECH == 3:
        x = tl.where(valid, tl.maximum(z - tau[:, None], 0.0), 0.0)
        if POWER == 2.0:
            w = x * x
        else:
            w = tl.where(x > 0, tl.exp2(POWER * tl.log2(tl.maximum(x, 1e-30))), 0.0)
    elif MECH == 4:
        s = tl.where(valid, tl.maximum(z / POWER - tau[:, None], 0.0), 0.0)
        if POWER == 2.0:
            w = s * s / den[:, None]
        else:
            w = s / den[:, None]
    else:
        w = tl.zeros_like(z)
    return w


@triton.jit
def _score_grad(z, valid, g, m, den, tau, delta, MECH: tl.constexpr, POWER: tl.constexpr):
    """dLoss/dz of a tile from ``g = do . v_j``."""
    if MECH == 0:
        e = tl.exp(tl.where(valid, z, float("-inf")) - m[:, None]) / den[:, None]
        sign = tl.where(z > 0, 1.0, tl.where(z < 0, -1.0, 0.0))
        dz = tl.where(valid, e * (tl.where(z > 0, g, 0.0) - delta[:, None] * sign), 0.0)
    elif MECH == 1:
        sel = valid & (z >= 0)
        p = tl.where(sel, tl.exp(tl.where(sel, z, 0.0) - m[:, None]), 0.0) / tl.where(den > 0, den, 1.0)[:, None]
        dz = p * (g - delta[:, None])
    elif MECH == 2:
        dz = tl.where(valid & (z > 0), g, 0.0)
    elif MECH == 3:
        x = tl.where(valid, tl.maximum(z - tau[:, None], 0.0), 0.0)
        if POWER == 2.0:
            dw = 2.0 * x
        else:
            dw = tl.where(x > 0, POWER * tl.exp2((POWER - 1.0) * tl.log2(tl.maximum(x, 1e-30))), 0.0)
        dz = dw * g
    elif MECH == 4:
        s = tl.where(valid, tl.maximum(z / POWER - tau[:, None], 0.0), 0.0)
        if POWER != 2.0:
            s = (s > 0).to(tl.float32)
        dz = s * (g - delta[:, None]) / den[:, None]
    else:
        # The entropy of softmax (adatemp): dH_r/dz_rj = -p_rj (log p_rj + H_r), times dLoss/dH_r in ``delta``.
        zv = tl.where(valid, z, float("-inf"))
        p = tl.exp(zv - m[:, None]) / den[:, None]
        logp = tl.where(valid, z - m[:, None] - tl.log(den)[:, None], 0.0)
        dz = tl.where(valid, -delta[:, None] * p * (logp + tau[:, None]), 0.0)
    return dz


@triton.jit
def _any_active(z, valid, tau, MECH: tl.constexpr, POWER: tl.constexpr):
    """Whether any entry of the tile has a non-zero weight or gradient (tra and entmax are sparse: their
    tiles without one skip the value loads and products)."""
    if MECH == 3:
        act = valid & (z - tau[:, None] > 0)
    elif MECH == 4:
        act = valid & (z / POWER - tau[:, None] > 0)
    else:
        act = valid
    return tl.max(act.to(tl.int32))


@triton.jit
def _row_stats(M, L, TAU, DELTA, idx, row_ok, MECH: tl.constexpr, BM: tl.constexpr):
    """The per-row statistics the backward of ``MECH`` reads (zeros/ones for those it has none of)."""
    m = tl.zeros([BM], dtype=tl.float32)
    den = tl.full([BM], 1.0, dtype=tl.float32)
    tau = tl.zeros([BM], dtype=tl.float32)
    delta = tl.zeros([BM], dtype=tl.float32)
    if MECH == 0 or MECH == 1 or MECH == 4 or MECH == 5:
        m = tl.load(M + idx, mask=row_ok, other=0.0)
        den = tl.load(L + idx, mask=row_ok, other=1.0)
        delta = tl.load(DELTA + idx, mask=row_ok, other=0.0)
    if MECH == 3 or MECH == 4 or MECH == 5:
        tau = tl.load(TAU + idx, mask=row_ok, other=0.0)
    return m, den, tau, delta


@triton.jit
def _fwd_tile(acc, acc_u, m_i, l_i, s_i, q, K, V, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
              tau, MASKED: tl.constexpr, FIXED: tl.constexpr, MECH: tl.constexpr, POWER: tl.constexpr,
              STORE_U: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr,
              D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, FOLD: tl.constexpr = False,
              ROW_SUMS: tl.constexpr = True):
    """One key tile of the forward. ``MASKED`` only for the tiles that cross the diagonal; ``FIXED``: the
    shift ``m_i`` of softpick/rectified is a fixed upper bound of the row's scores (no running max, no
    rescaling). ``FOLD`` (``ENTMAX``, no slopes): ``z / POWER`` in one product a score (``folded_scores``).
    ``ROW_SUMS`` False (``ENTMAX`` with no backward to follow): no ``s_i``, the backward's ``sum s``."""
    offs_n = start_n + tl.arange(0, BN)
    if MASKED:
        kv_mask = (offs_n < T)[:, None] & dmask[None, :]
    else:  # a tile before the diagonal lies below T: no bound test per key
        kv_mask = dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    if FOLD:
        x = folded_scores(q, k, sm_scale, rs, 1.0 / POWER, HAS_RS, DOT_PREC)  # z / POWER
    else:
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        x = z / POWER
    if MASKED:
        valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
    else:
        valid = tl.full([BM, BN], 1, tl.int1)
    if MECH == 0 or MECH == 1:
        m_new = m_i
        if not FIXED:
            m_new = tl.maximum(m_i, tl.max(tl.where(valid, z, float("-inf")), 1))
            alpha = tl.exp(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
        if MECH == 0:
            diff = tl.exp(tl.where(valid, z, float("-inf")) - m_new[:, None]) - tl.exp(-m_new)[:, None]
            p = tl.where(valid, tl.maximum(diff, 0.0), 0.0)
            l_i += tl.sum(tl.where(valid, tl.abs(diff), 0.0), 1)
        else:
            sel = valid & (z >= 0)
            p = tl.where(sel, tl.exp(tl.where(sel, z, 0.0) - m_new[:, None]), 0.0)
            l_i += tl.sum(p, 1)
        m_i = m_new
    elif MECH == 4:
        # (A branch that skips the value products of tiles with no positive weight, as the backward does,
        # made tra's forward 1.8x slower on the H100, 2026-11-22: the loop loses its software pipelining.)
        s = tl.where(valid, tl.maximum(x - tau[:, None], 0.0), 0.0)
        if POWER == 2.0:
            p = s * s
        else:  # sparsemax: the weights are s, the backward's are the support's indicator
            p = s
            s = (s > 0).to(tl.float32)
        l_i += tl.sum(p, 1)
        if ROW_SUMS:
            s_i += tl.sum(s, 1)
        if STORE_U:
            acc_u += tl.dot(s.to(v.dtype), v, input_precision=DOT_PREC)
    else:
        p = _weights(z, valid, m_i, l_i, tau, MECH, POWER)
    acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, acc_u, m_i, l_i, s_i


@triton.jit
def _fwd_loops(acc, acc_u, m_i, l_i, s_i, q, K, V, base, diag, hi, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
               tau, FIXED: tl.constexpr, MECH: tl.constexpr, POWER: tl.constexpr, STORE_U: tl.constexpr,
               HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, FOLD: tl.constexpr = False, ROW_SUMS: tl.constexpr = True):
    # Keys before the tile's first row (``diag``) are visible to all its rows: no mask there.
    for start_n in range(0, diag, BN):
        acc, acc_u, m_i, l_i, s_i = _fwd_tile(acc, acc_u, m_i, l_i, s_i, q, K, V, base, start_n, offs_m, offs_d,
                                              dmask, T, sm_scale, slope, rs, tau, False, FIXED, MECH, POWER,
                                              STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN, FOLD,
                                              ROW_SUMS)
    for start_n in range(diag, hi, BN):
        acc, acc_u, m_i, l_i, s_i = _fwd_tile(acc, acc_u, m_i, l_i, s_i, q, K, V, base, start_n, offs_m, offs_d,
                                              dmask, T, sm_scale, slope, rs, tau, True, FIXED, MECH, POWER,
                                              STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN, FOLD,
                                              ROW_SUMS)
    return acc, acc_u, m_i, l_i, s_i


@triton.jit
def _fwd_kernel(Q, K, V, Out, U, SL, RS, TAU, SHIFT, M, L, sm_scale, eps, shift_max, T, H,
                MECH: tl.constexpr, POWER: tl.constexpr, STORE_U: tl.constexpr,
                HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
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
    rs = tl.zeros([BM], dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.zeros([BM], dtype=tl.float32)
    if MECH >= 3:
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=0.0)
    m_i = tl.zeros([BM], dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    s_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    acc_u = tl.zeros([BM, BD], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    diag = pid_m * BM
    if MECH == 1:
        # Rectified: a fixed shift (an upper bound of the row's scores, from the norms) saves the running max
        # and the rescaling, as long as it cannot underflow every term (bound <= 60); otherwise the online
        # form. (Softpick stays online: with a loose shift its bf16 gradients at head dim 128 lost accuracy,
        # 5e-2 against 3e-3, in the test run of 2026-11-22.) ``shift_max`` is 60, or -1 for fp16 values: the
        # weights go into the value product in fp16, where exp(z - shift) under a loose shift falls below its
        # normal range (6e-5) and loses its digits (out 7e-2 off the reference on the H100, 2026-11-26).
        shift = tl.load(SHIFT + bh * T + offs_m, mask=row_ok, other=0.0)
        if tl.max(shift, 0) <= shift_max:
            acc, acc_u, m_i, l_i, s_i = _fwd_loops(acc, acc_u, shift, l_i, s_i, q, K, V, base, diag, hi, offs_m,
                                                   offs_d, dmask, T, sm_scale, slope, rs, tau, True, MECH, POWER,
                                                   STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN)
        else:
            acc, acc_u, m_i, l_i, s_i = _fwd_loops(acc, acc_u, m_i, l_i, s_i, q, K, V, base, diag, hi, offs_m,
                                                   offs_d, dmask, T, sm_scale, slope, rs, tau, False, MECH, POWER,
                                                   STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN)
    else:
        acc, acc_u, m_i, l_i, s_i = _fwd_loops(acc, acc_u, m_i, l_i, s_i, q, K, V, base, diag, hi, offs_m, offs_d,
                                               dmask, T, sm_scale, slope, rs, tau, False, MECH, POWER, STORE_U,
                                               HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN)
    out_mask = row_ok[:, None] & dmask[None, :]
    if MECH == 0:
        l_i = l_i + eps * tl.exp(-m_i)
        acc = acc / l_i[:, None]
    elif MECH == 1:
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    elif MECH == 4:
        acc = acc / l_i[:, None]
        m_i = s_i
        if STORE_U:
            tl.store(U + base + offs_m[:, None] * D + offs_d[None, :], acc_u, mask=out_mask)
    tl.store(Out + base + offs_m[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=out_mask)
    if MECH == 0 or MECH == 1 or MECH == 4:
        tl.store(M + bh * T + offs_m, m_i, mask=row_ok)
        tl.store(L + bh * T + offs_m, l_i, mask=row_ok)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, DQ, SL, RS, TAU, M, L, DELTA, DRS, DSL, DTAU, sm_scale, T, H,
                   MECH: tl.constexpr, POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                   GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, GRAD_TAU: tl.constexpr,
                   DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    do = tl.load(DO + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    m, den, tau, delta = _row_stats(M, L, TAU, DELTA, bh * T + offs_m, row_ok, MECH, BM)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    d_tau = tl.zeros([BM], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        kv_mask = (offs_n < T)[:, None] & dmask[None, :]
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
        if _any_active(z, valid, tau, MECH, POWER) > 0:
            if MECH == 5:  # the entropy's gradient needs no values
                g = tl.zeros([BM, BN], dtype=tl.float32)
            else:
                v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            dz = _score_grad(z, valid, g, m, den, tau, delta, MECH, POWER)
            if GRAD_RS:
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            if GRAD_TAU:
                d_tau -= tl.sum(dz, 1)
            dq += tl.dot((dz * rs[:, None]).to(k.dtype), k, input_precision=DOT_PREC)
    tl.store(DQ + base + offs_m[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rmask)
    if GRAD_RS:
        tl.store(DRS + bh * T + offs_m, d_rs, mask=row_ok)
    if GRAD_SL:
        tl.store(DSL + bh * T + offs_m, -d_sl * rs, mask=row_ok)
    if GRAD_TAU:
        tl.store(DTAU + bh * T + offs_m, d_tau, mask=row_ok)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, SL, RS, TAU, M, L, DELTA, DQ, DRS, DSL, DTAU, sm_scale, T, H,
                     MECH: tl.constexpr, POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                     FUSED: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, GRAD_TAU: tl.constexpr,
                     DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr):
    """``FUSED``: also each (query tile, key tile) pair's share of dq (unscaled, fp32) and of the per-row gradients
    that ``_bwd_dq_kernel`` sums, added atomically to ``DQ``, ``DRS``, ``DSL`` (before its ``-row_scale`` factor) and
    ``DTAU``; the programs visit each pair once."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    kv_mask = (offs_n < T)[:, None] & dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BD], dtype=tl.float32)
    lo = (pid_n * BN // BM) * BM
    for start_m in range(lo, T, BM):
        offs_m = start_m + tl.arange(0, BM)
        row_ok = offs_m < T
        rmask = row_ok[:, None] & dmask[None, :]
        q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
        rs = tl.full([BM], 1.0, dtype=tl.float32)
        if HAS_RS:
            rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
        m, den, tau, delta = _row_stats(M, L, TAU, DELTA, bh * T + offs_m, row_ok, MECH, BM)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        valid = (offs_n[None, :] <= offs_m[:, None]) & row_ok[:, None] & (offs_n[None, :] < T)
        if _any_active(z, valid, tau, MECH, POWER) > 0:
            if MECH == 5:
                g = tl.zeros([BM, BN], dtype=tl.float32)
            else:
                do = tl.load(DO + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
                w = _weights(z, valid, m, den, tau, MECH, POWER)
                dv += tl.dot(tl.trans(w).to(do.dtype), do, input_precision=DOT_PREC)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            dz = _score_grad(z, valid, g, m, den, tau, delta, MECH, POWER)
            dk += tl.dot(tl.trans(dz * rs[:, None]).to(q.dtype), q, input_precision=DOT_PREC)
            if FUSED:
                tl.atomic_add(DQ + base + offs_m[:, None] * D + offs_d[None, :],
                              tl.dot((dz * rs[:, None]).to(k.dtype), k, input_precision=DOT_PREC), mask=rmask,
                              sem="relaxed")
                rows = bh * T + offs_m
                if GRAD_RS:
                    tl.atomic_add(DRS + rows, tl.sum(dz * zb, 1), mask=row_ok, sem="relaxed")
                if GRAD_SL:
                    tl.atomic_add(DSL + rows, tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1),
                                  mask=row_ok, sem="relaxed")
                if GRAD_TAU:
                    tl.atomic_add(DTAU + rows, -tl.sum(dz, 1), mask=row_ok, sem="relaxed")
    tl.store(DK + base + offs_n[:, None] * D + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + base + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _delta_kernel(DO, OUT, M, DELTA, R, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, DIVIDE: tl.constexpr):
    """``DELTA[r] = sum_d DO[r, d] * OUT[r, d]`` over ``R`` rows (fp32), divided by ``max(M[r], 1e-30)`` with
    ``DIVIDE``: the backward's per-row term in one pass over ``do`` (entmax: ``OUT`` is ``u``, ``M`` its sum)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    ok = rows < R
    mask = ok[:, None] & (offs_d[None, :] < D)
    offs = rows.to(tl.int64)[:, None] * D + offs_d[None, :]
    do = tl.load(DO + offs, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(OUT + offs, mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(do * o, 1)
    if DIVIDE:
        delta = delta / tl.maximum(tl.load(M + rows, mask=ok, other=1.0), 1e-30)
    tl.store(DELTA + rows, delta, mask=ok)


def row_delta(do: torch.Tensor, o: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """``(do * o).sum(-1)`` in fp32 as ``[B, H, T]`` (divided by ``max(m, 1e-30)`` where ``m`` is given), one
    kernel: in eager ATen it took a cast of each operand, a product and a reduction (four launches a layer;
    softpick's training step on the paper MQMTAR model at batch 128 spent 400 us of its 3.9 ms on them). ``do`` and
    ``o`` contiguous, alike."""
    *lead, head_dim = do.shape
    delta = torch.empty(lead, device=do.device, dtype=torch.float32)
    n_rows = delta.numel()
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_rows = max(1, 4096 // block_d)
    _delta_kernel[(triton.cdiv(n_rows, block_rows),)](do, o, do if m is None else m, delta, n_rows, D=head_dim,
                                                     BD=block_d, BR=block_rows, DIVIDE=m is not None,
                                                     num_warps=4)
    return delta


def _score_bound(pb: Problem) -> torch.Tensor:
    """``[B, H, T]``: ``max(0, bound)`` with ``bound >= z_rj`` for every visible key: Cauchy-Schwarz on the dot
    product, plus the largest distance bias of the sign the row factor turns upwards."""
    key_norm = pb.k.float().norm(dim=-1).amax(-1, keepdim=True)
    bound = pb.q.float().norm(dim=-1) * key_norm * pb.sm_scale
    below = bound
    if pb.slopes is not None:
        reach = float(pb.tokens - 1)
        bound, below = (bound + (-pb.slopes).clamp_min(0)[None, :, None] * reach,
                        bound + pb.slopes.clamp_min(0)[None, :, None] * reach)
    if pb.row_scale is not None:
        bound = torch.where(pb.row_scale >= 0, pb.row_scale * bound, -pb.row_scale * below)
    return bound.clamp_min(0).contiguous()


ROWWISE_TUNING_KEYS = ("fwd", "bwd", "fused_bwd")


def launch_settings(pb: Problem, tuning: dict | None) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``((BM, BN, warps) of the forward, (BM, BN, warps) of the dq and dk/dv kernels)``: the defaults of ``pb``
    (forward 128 query rows x 64 keys, 8 warps, backward 64 x 64, 4 warps, for head dims up to 64), or those
    ``tuning`` gives (``{"fwd": [BM, BN, warps], "bwd": [...]}``: the training step's, ``lengthbench.compile_policy.CAPTURE_TUNING``,
    and the tests'). Tiles are powers of two of at least 16; the forward's
    rows a multiple of its keys (its tiles before the diagonal go unmasked). ``fused_bwd`` (true or false, read by
    :func:`fused_backward`) is checked here too."""
    fwd = (pb.fwd_block, pb.block, pb.fwd_warps)
    bwd = (pb.block, pb.block, pb.num_warps)
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(ROWWISE_TUNING_KEYS))
    if unknown:
        raise ValueError(f"rowwise kernels: unknown tuning keys {unknown}; the keys are {list(ROWWISE_TUNING_KEYS)}")
    fused_backward(tuning)
    out = {"fwd": fwd, "bwd": bwd}
    for key in ("fwd", "bwd"):
        if tuning.get(key) is None:
            continue
        value = tuple(tuning[key])
        if len(value) != 3 or not all(isinstance(x, int) for x in value):
            raise ValueError(f"rowwise kernels: {key} must be [BM, BN, warps] (integers), got {tuning[key]!r}")
        bm, bn, warps = value
        if any(x < 16 or x & (x - 1) for x in (bm, bn)) or warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"rowwise kernels: {key} tiles must be powers of two >= 16 and warps 1-16, "
                             f"got {list(value)}")
        if key == "fwd" and bm % bn:
            raise ValueError(f"rowwise kernels: the forward's rows must be a multiple of its keys, got {list(value)}")
        out[key] = value
    return out["fwd"], out["bwd"]


def fused_backward(tuning: dict | None) -> bool:
    """``tuning``'s ``fused_bwd`` (off by default): the backward without its dq kernel, the dk/dv kernel adding each
    (query tile, key tile) pair's share of dq and of the per-row gradients atomically (``_bwd_dkdv_kernel``'s
    ``FUSED``), so the scores and their gradients are computed once instead of twice. 1.5-entmax's rowwise backward
    takes it by default (``entmax.short_rows.ROWWISE_FUSED``, measured there); for softpick and TRA it passes the training step's
    gradient test on the GPU (``tests/test_train_step_gpu.py``), and its throughput is not measured."""
    value = (tuning or {}).get("fused_bwd", False)
    if not isinstance(value, bool):
        raise ValueError(f"rowwise kernels: fused_bwd must be true or false, got {value!r}")
    return value


class RowwiseAttention(torch.autograd.Function):
    """``o = sum_j w_rj v_j`` for the pointwise mechanisms; ``tau`` ([B, H, T] or None) may need a gradient.

    Gradients flow to q, k, v, ``tau`` (tra), ``row_scale`` and ``slopes``.
    """

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, mech, power, eps, tuning=None):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        (fwd_bm, fwd_bn, fwd_warps), ctx.bwd = launch_settings(pb, tuning)
        ctx.fused = fused_backward(tuning)
        out = torch.empty_like(pb.q)
        m, den = pb.rows(), pb.rows()
        tau_rows = None
        if tau is not None:
            tau_rows = tau.detach().to(torch.float32).expand(pb.batch, pb.heads, pb.tokens).contiguous()
        store_u = mech == ENTMAX and any(ctx.needs_input_grad[:3])
        u = torch.empty(pb.q.shape, device=q.device, dtype=torch.float32) if store_u else None
        grid = (triton.cdiv(pb.tokens, fwd_bm), pb.bh)
        shift = _score_bound(pb) if mech == RECTIFIED else None
        _fwd_kernel[grid](pb.q, pb.k, pb.v, out, pb.opt(u), pb.opt(pb.slopes), pb.opt(pb.row_scale),
                          pb.opt(tau_rows), pb.opt(shift), m, den, pb.sm_scale, float(eps),
                          -1.0 if pb.v.dtype == torch.float16 else 60.0, pb.tokens, pb.heads,
                          MECH=mech, POWER=float(power), STORE_U=store_u, HAS_SLOPES=pb.slopes is not None,
                          HAS_RS=pb.row_scale is not None, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d,
                          BM=fwd_bm, BN=fwd_bn, num_warps=fwd_warps, num_stages=2)
        ctx.pb_consts = (pb.sm_scale, mech, float(power))
        ctx.tau_shape = None if tau is None else tau.shape
        ctx.rs_shape = None if row_scale is None else row_scale.shape
        ctx.has = (slopes is not None, row_scale is not None)
        ctx.save_for_backward(pb.q, pb.k, pb.v, out, pb.slopes, pb.row_scale, tau_rows, m, den, u)
        return out

    @staticmethod
    def backward(ctx, dout):
        sm_scale, mech, power = ctx.pb_consts
        needs = ctx.needs_input_grad
        dq, dk, dv, g_sl, g_rs, g_tau = rowwise_backward(
            dout, ctx.saved_tensors, sm_scale, mech, power, grad_slopes=needs[3], grad_rs=needs[4],
            grad_tau=needs[5], rs_shape=ctx.rs_shape, tau_shape=ctx.tau_shape, launch=ctx.bwd, fused=ctx.fused)
        return dq, dk, dv, g_sl, g_rs, g_tau, None, None, None, None, None


def rowwise_backward(dout, saved, sm_scale, mech, power, *, grad_slopes, grad_rs, grad_tau, rs_shape, tau_shape,
                     launch=None, fused=False):
    """``(dq, dk, dv, d_slopes, d_row_scale, d_tau)`` from the state ``RowwiseAttention.forward`` saves,
    ``saved = (q, k, v, out, slopes, row_scale, tau_rows, m, den, u)`` (entmax's list forward builds the same
    state and shares this backward). A gradient is None where its input is None or not asked for. ``launch``:
    ``(BM, BN, warps)`` of both kernels (None: 64 x 64, 4 warps, for head dims up to 64). ``fused``: the dk/dv
    kernel alone, dq and the per-row gradients added atomically (:func:`fused_backward`)."""
    q, k, v, out, slopes, row_scale, tau_rows, m, den, u = saved
    pb = Problem(q, k, v, slopes, row_scale, sm_scale)
    do = dout.contiguous()
    if mech in (SOFTPICK, RECTIFIED):
        delta = row_delta(do, out.contiguous())
    elif mech == ENTMAX:
        delta = row_delta(do, u, m)
    else:
        delta = None
    if mech not in (SOFTPICK, RECTIFIED, ENTMAX):
        m = den = None
    grad_tau = tau_rows is not None and grad_tau
    grad_rs = row_scale is not None and grad_rs
    grad_sl = slopes is not None and grad_slopes
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # fused: dq and the per-row gradients are sums of atomic adds, from zero
    new = torch.zeros if fused else torch.empty
    d_rs, d_sl, d_tau = (new(pb.batch, pb.heads, pb.tokens, device=q.device, dtype=torch.float32) if wanted else None
                         for wanted in (grad_rs, grad_sl, grad_tau))
    bm, bn, warps = launch or launch_settings(pb, None)[1]
    common = dict(MECH=mech, POWER=power, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                  DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm, BN=bn, num_warps=warps, num_stages=2)
    stats = (pb.opt(slopes), pb.opt(row_scale), pb.opt(tau_rows), pb.opt(m), pb.opt(den), pb.opt(delta))
    row_grads = (pb.opt(d_rs), pb.opt(d_sl), pb.opt(d_tau))
    grads = dict(GRAD_RS=grad_rs, GRAD_SL=grad_sl, GRAD_TAU=grad_tau)
    if fused:
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    else:
        dq = torch.empty_like(q)
        _bwd_dq_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](q, k, v, do, dq, *stats, *row_grads, sm_scale, pb.tokens,
                                                             pb.heads, **grads, **common)
    _bwd_dkdv_kernel[(triton.cdiv(pb.tokens, bn), pb.bh)](
        q, k, v, do, dk, dv, *stats, *((dq, *row_grads) if fused else (pb.dummy,) * 4), sm_scale, pb.tokens,
        pb.heads, FUSED=fused, **(grads if fused else {key: False for key in grads}), **common)
    if fused:
        dq = (dq * sm_scale).to(q.dtype)
        if grad_sl:  # as the dq kernel stores it
            d_sl = -d_sl if row_scale is None else -d_sl * row_scale
    g_sl = reduce_slopes(d_sl) if grad_sl else None
    g_rs = None if d_rs is None else _sum_to(d_rs, rs_shape)
    g_tau = _sum_to(d_tau, tau_shape) if grad_tau else None
    return dq, dk, dv, g_sl, g_rs, g_tau


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """Reduce a ``[B, H, T]`` gradient to the (broadcastable) ``shape`` of its input."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for dim, size in enumerate(shape):
        if size == 1 and grad.shape[dim] != 1:
            grad = grad.sum(dim, keepdim=True)
    return grad.reshape(shape)


def rowwise(q, k, v, *, mech, slopes=None, row_scale=None, tau=None, sm_scale=None, power=2.0, eps=0.0,
            tuning=None):
    return RowwiseAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, mech, power, eps, tuning)
