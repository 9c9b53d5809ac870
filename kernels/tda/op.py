"""Threshold differential attention (Threshold Differential Attention, Section 4.2), fused: both views in one pass.

``o_r = sum_j (a1_rj - lam_h * a2_rj) v_j`` with ``a_i = (z_i - tau_r)_+^power`` the TRA weights of view
``i`` (``z_i`` from ``q_i``, ``k_i``: unit-norm, ``sm_scale=1``, the same ALiBi ``slopes``/``row_scale`` and
the same threshold ``tau_r`` of ``tra.tra_threshold``, its ``tau_index`` convention included, for both views), shared values ``v``, no normaliser.
The RMSNorm on the output is the module's (``models/attention/threshold.py``).

Four kernels, each visiting a (query tile, key tile) pair once for both views:

- forward, one program per query tile (its height a multiple of the key tile's): both score tiles, the
  combined weight tile, one product with ``v``. When a backward may follow it also writes the activity
  map: one int8 per tile of 128 query rows x 64 keys, 1 where either view has an entry above the threshold;
- dq, one program per query tile: ``dq1`` and ``dq2`` together, with the per-row gradients of ``tau``
  (``-sum_j dL/dz1 + dL/dz2``), ``lam`` (``-sum_j a2_rj do_r.v_j``), ``row_scale`` and ``slopes``;
- dk/dv, one program per key tile: ``dk1``, ``dk2`` and ``dv`` together (with the launch setting ``fused_bwd``, the
  training step's, also the dq kernel's sums, added atomically; the dq kernel then does not run);
- whole rows (the launch setting ``rows``, ``[BM, BN, warps]``), one program per head where its ``T <= BM`` rows
  fit one query tile: each key tile's dk1, dk2 and dv whole, dq1, dq2 and the per-row gradients summed over the
  key tiles in registers; dq1, dq2, dk1, dk2 and dv stored once (no atomics, no casts after), the slopes', ``beta``'s
  and ``lam``'s summed over the head's rows and added atomically to small zeroed buffers: the short rows of
  training.

The dq and dk/dv kernels visit only the tiles the map lists (``_tile_lists``): an inactive tile has zero
weights and zero gradients in both views, so skipping it is exact, and TRA's thresholds leave most tiles
inactive at long lengths (random unit inputs at 65,536 tokens: almost all but the diagonal's). Without a map
(head dims above 64) they test every tile by a branch.

The pointwise maps (weights, their derivative, the activity test) are ``utils/rowwise.py``'s for code ``TRA``.
The rows' threshold ``tau_r = beta_h base_r`` is formed in the kernels from ``beta`` (float, 0-d or ``[H]`` tensor)
and the ``[T]`` ``tra.tau_base``, kept per shape, and ``lam`` (the same forms) is read where it lies: the op makes
no tensor of its own before its forward kernel. ``beta`` and ``lam`` get their gradients from the kernels' per-row
sums (``dL/dbeta_h = sum_r base_r dL/dtau_r``). Formed outside them (the threshold's small kernels a layer, and the
per-row sums reduced after: 20 reductions a step of the paper MQMTAR model), TDA trained at 0.81x and 0.797x
softmax + RoPE's samples/s on MQMTAR at batch 128 (RoPE, NAPE; H200), 0.84x and 0.82x here; on MQRAR at batch 512,
0.86x against 0.90x.

Tests against the dense reference (``tests/test_kernels.py``, GPU): fp32/bf16, lengths 1 to 4,096, head dims
16 to 128, ALiBi, row scale, per-head lam/beta, power 1.5, rows with nothing active, every launch variant
and the map itself; both ``tau_index`` conventions under the Triton interpreter on CPU
(``tests/test_fidelity.py``). The TDA module runs this op rather than two ``tra`` passes (on the H100 at L 65,536,
D 32: 18.2 ms forward and 32.7 ms forward+backward, against 23.9 and 123.0 ms).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lengthbench.kernels.defaults import TDA_LAM, TRA_BETA, TRA_KAPPA, TRA_POWER, TRA_TAU_INDEX
from lengthbench.kernels.tra import tau_base
from lengthbench.kernels.utils.common import (
    Problem,
    head_slope,
    reduce_slopes,
    rows_scale,
    score_tile,
    tile_rows,
)
from lengthbench.kernels.utils.rowwise import TRA, _any_active, _score_grad, _sum_to, _weights

_TRA = tl.constexpr(TRA)
# The activity map's tile: MAP_M query rows x MAP_N keys (the forward's query tile when it writes the map).
MAP_M = tl.constexpr(128)
MAP_N = tl.constexpr(64)


@triton.jit
def _view_weights(z, valid, tau, POWER: tl.constexpr):
    """``(z - tau)_+^power`` of one view's tile, zero where not ``valid``."""
    return _weights(z, valid, tau, tau, tau, _TRA, POWER)


@triton.jit
def _view_dz(z, valid, g, tau, POWER: tl.constexpr):
    """``d(z - tau)_+^power / dz * g`` of one view's tile."""
    return _score_grad(z, valid, g, tau, tau, tau, tau, _TRA, POWER)


@triton.jit
def _row_tau(BETA, BASE, bh, H, offs_m, row_ok, BETA_SH):
    """The rows' thresholds ``beta_h * base_r`` (``BETA_SH`` 1: a ``beta`` per head, 0: one for all)."""
    return tl.load(BETA + (bh % H) * BETA_SH) * tl.load(BASE + offs_m, mask=row_ok, other=0.0)


@triton.jit
def _either_active(z1, z2, valid, tau):
    return tl.maximum(_any_active(z1, valid, tau, _TRA, 2.0), _any_active(z2, valid, tau, _TRA, 2.0))


@triton.jit
def _fwd_tile(acc, q1, q2, K1, K2, V, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, tau, lam,
              MASKED: tl.constexpr, POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              SKIP: tl.constexpr, ACTIVITY: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    """One key tile of the forward; ``MASKED`` only for the tiles that cross the diagonal. ``SKIP``: a tile
    where neither view is active skips the value load and product (a branch in the loop); ``ACTIVITY``: also
    return whether the tile is active (for the activity map), else 0."""
    offs_n = start_n + tl.arange(0, BN)
    kv_mask = (offs_n < T)[:, None] & dmask[None, :]
    kv_off = base + offs_n[:, None] * D + offs_d[None, :]
    k1 = tl.load(K1 + kv_off, mask=kv_mask, other=0.0)
    k2 = tl.load(K2 + kv_off, mask=kv_mask, other=0.0)
    z1, _ = score_tile(q1, k1, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    z2, _ = score_tile(q2, k2, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    if MASKED:
        valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
    else:
        valid = tl.full([BM, BN], 1, tl.int1)
    act = tl.zeros([], dtype=tl.int32)
    if SKIP or ACTIVITY:
        act = _either_active(z1, z2, valid, tau)
    if SKIP:
        if act > 0:
            v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
            w = _view_weights(z1, valid, tau, POWER) - lam * _view_weights(z2, valid, tau, POWER)
            acc += tl.dot(w.to(v.dtype), v, input_precision=DOT_PREC)
    else:
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        w = _view_weights(z1, valid, tau, POWER) - lam * _view_weights(z2, valid, tau, POWER)
        acc += tl.dot(w.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, act


@triton.jit
def _fwd_kernel(Q1, K1, Q2, K2, V, Out, SL, RS, BETA, BASE, LAM, MAP, sm_scale, T, H, NQ, NK, BETA_SH, LAM_SH,
                POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, SKIP: tl.constexpr,
                MAP_MODE: tl.constexpr, NKT: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``MAP_MODE`` 1 or 2: write the activity map, one int8 per (``MAP_M`` query rows, ``MAP_N`` keys) tile
    (``BM == MAP_M``), 1 where either view has an entry above the threshold; 1 keeps it in registers (a
    ``[NKT]`` vector, ``NKT >= NK``) and stores it once, 2 stores each tile's flag in the loop (``BN ==
    MAP_N``)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, q_off = tile_rows(pid_m * BM, T, D, BD, BM)
    q_off += base
    q1 = tl.load(Q1 + q_off, mask=rmask, other=0.0)
    q2 = tl.load(Q2 + q_off, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    tau = _row_tau(BETA, BASE, bh, H, offs_m, row_ok, BETA_SH)
    lam = tl.load(LAM + (bh % H) * LAM_SH)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    diag = pid_m * BM
    map_row = MAP + (bh.to(tl.int64) * NQ + pid_m) * NK
    kidx = tl.arange(0, NKT)
    flags = tl.zeros([NKT], dtype=tl.int32)
    # Keys before the tile's first row (``diag``) are visible to all its rows: no mask there.
    for start_n in range(0, diag, BN):
        acc, act = _fwd_tile(acc, q1, q2, K1, K2, V, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope,
                             rs, tau, lam, False, POWER, HAS_SLOPES, HAS_RS, SKIP, MAP_MODE > 0, DOT_PREC, D, BM, BN)
        if MAP_MODE == 1:
            flags = tl.where(kidx == start_n // MAP_N, tl.maximum(flags, act), flags)
        if MAP_MODE == 2:
            tl.store(map_row + start_n // MAP_N, act.to(tl.int8))
    for start_n in range(diag, hi, BN):
        acc, act = _fwd_tile(acc, q1, q2, K1, K2, V, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope,
                             rs, tau, lam, True, POWER, HAS_SLOPES, HAS_RS, SKIP, MAP_MODE > 0, DOT_PREC, D, BM, BN)
        if MAP_MODE == 1:
            flags = tl.where(kidx == start_n // MAP_N, tl.maximum(flags, act), flags)
        if MAP_MODE == 2:
            tl.store(map_row + start_n // MAP_N, act.to(tl.int8))
    if MAP_MODE == 1:
        tl.store(map_row + kidx, flags.to(tl.int8), mask=kidx < NK)
    tl.store(Out + q_off, acc.to(Out.dtype.element_ty), mask=rmask)


@triton.jit
def _dq_tile(dq1, dq2, d_rs, d_sl, d_tau, d_lam, q1, q2, do, K1, K2, V, base, start_n, offs_m, offs_d, dmask, T,
             sm_scale, slope, rs, tau, lam, POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
             GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, GRAD_TAU: tl.constexpr, GRAD_LAM: tl.constexpr,
             SKIP: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One key tile of dq1/dq2 and the per-row gradients. ``SKIP``: test the tile's activity first (a
    branch); without it the caller knows the tile is active (the activity map)."""
    offs_n = start_n + tl.arange(0, BN)
    kv_mask = (offs_n < T)[:, None] & dmask[None, :]
    kv_off = base + offs_n[:, None] * D + offs_d[None, :]
    k1 = tl.load(K1 + kv_off, mask=kv_mask, other=0.0)
    k2 = tl.load(K2 + kv_off, mask=kv_mask, other=0.0)
    z1, zb1 = score_tile(q1, k1, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    z2, zb2 = score_tile(q2, k2, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
    go = 1
    if SKIP:
        go = _either_active(z1, z2, valid, tau)
    if go > 0:
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        dz1 = _view_dz(z1, valid, g, tau, POWER)
        dz2 = -lam * _view_dz(z2, valid, g, tau, POWER)
        if GRAD_RS:
            d_rs += tl.sum(dz1 * zb1 + dz2 * zb2, 1)
        if GRAD_SL:
            d_sl += tl.sum((dz1 + dz2) * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
        if GRAD_TAU:
            d_tau -= tl.sum(dz1 + dz2, 1)
        if GRAD_LAM:
            d_lam -= tl.sum(_view_weights(z2, valid, tau, POWER) * g, 1)
        dq1 += tl.dot((dz1 * rs[:, None]).to(k1.dtype), k1, input_precision=DOT_PREC)
        dq2 += tl.dot((dz2 * rs[:, None]).to(k2.dtype), k2, input_precision=DOT_PREC)
    return dq1, dq2, d_rs, d_sl, d_tau, d_lam


@triton.jit
def _bwd_dq_kernel(Q1, K1, Q2, K2, V, DO, DQ1, DQ2, SL, RS, BETA, BASE, LAM, DRS, DSL, DTAU, DLAM, STARTS, LIST,
                   sm_scale, T, H, NQ, BETA_SH, LAM_SH,
                   POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr,
                   GRAD_SL: tl.constexpr, GRAD_TAU: tl.constexpr, GRAD_LAM: tl.constexpr, USE_MAP: tl.constexpr,
                   DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``USE_MAP``: visit only the key tiles of the activity map's list for this query tile (``LIST[STARTS[r]
    : STARTS[r + 1]]``, ``r`` its map row; ``BM`` divides ``MAP_M``, ``BN`` divides ``MAP_N``), no branch;
    else every key tile up to the diagonal, each tested first."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, q_off = tile_rows(pid_m * BM, T, D, BD, BM)
    q_off += base
    q1 = tl.load(Q1 + q_off, mask=rmask, other=0.0)
    q2 = tl.load(Q2 + q_off, mask=rmask, other=0.0)
    do = tl.load(DO + q_off, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    tau = _row_tau(BETA, BASE, bh, H, offs_m, row_ok, BETA_SH)
    lam = tl.load(LAM + (bh % H) * LAM_SH)
    dq1 = tl.zeros([BM, BD], dtype=tl.float32)
    dq2 = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    d_tau = tl.zeros([BM], dtype=tl.float32)
    d_lam = tl.zeros([BM], dtype=tl.float32)
    if USE_MAP:
        row = bh * NQ + (pid_m * BM) // MAP_M
        lo = tl.load(STARTS + row)
        hi = tl.load(STARTS + row + 1)
        for i in range(lo, hi):
            tile = tl.load(LIST + i)
            for sub in tl.static_range(MAP_N // BN):
                dq1, dq2, d_rs, d_sl, d_tau, d_lam = _dq_tile(
                    dq1, dq2, d_rs, d_sl, d_tau, d_lam, q1, q2, do, K1, K2, V, base, tile * MAP_N + sub * BN,
                    offs_m, offs_d, dmask, T, sm_scale, slope, rs, tau, lam, POWER, HAS_SLOPES, HAS_RS, GRAD_RS,
                    GRAD_SL, GRAD_TAU, GRAD_LAM, False, DOT_PREC, D, BM, BN)
    else:
        hi = tl.minimum((pid_m + 1) * BM, T)
        for start_n in range(0, hi, BN):
            dq1, dq2, d_rs, d_sl, d_tau, d_lam = _dq_tile(
                dq1, dq2, d_rs, d_sl, d_tau, d_lam, q1, q2, do, K1, K2, V, base, start_n, offs_m, offs_d, dmask,
                T, sm_scale, slope, rs, tau, lam, POWER, HAS_SLOPES, HAS_RS, GRAD_RS, GRAD_SL, GRAD_TAU, GRAD_LAM,
                True, DOT_PREC, D, BM, BN)
    tl.store(DQ1 + q_off, (dq1 * sm_scale).to(DQ1.dtype.element_ty), mask=rmask)
    tl.store(DQ2 + q_off, (dq2 * sm_scale).to(DQ2.dtype.element_ty), mask=rmask)
    if GRAD_RS:
        tl.store(DRS + bh * T + offs_m, d_rs, mask=row_ok)
    if GRAD_SL:
        tl.store(DSL + bh * T + offs_m, -d_sl * rs, mask=row_ok)
    if GRAD_TAU:
        tl.store(DTAU + bh * T + offs_m, d_tau, mask=row_ok)
    if GRAD_LAM:
        tl.store(DLAM + bh * T + offs_m, d_lam, mask=row_ok)


@triton.jit
def _dkdv_tile(dk1, dk2, dv, k1, k2, v, Q1, Q2, DO, RS, BASE, beta, DQ1, DQ2, DRS, DSL, DTAU, DLAM, base, bh, start_m,
               offs_n, T, sm_scale, slope, lam, POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
               SKIP: tl.constexpr, FUSED: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr,
               GRAD_TAU: tl.constexpr, GRAD_LAM: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
               BD: tl.constexpr, BM: tl.constexpr):
    """One query tile of dk1/dk2/dv (``SKIP`` as in ``_dq_tile``). ``FUSED``: also this tile's share of dq1/dq2
    (unscaled, fp32) and of the per-row gradients, added atomically to ``DQ1``, ``DQ2``, ``DRS``, ``DSL``
    (before its ``-row_scale`` factor), ``DTAU`` and ``DLAM``, as ``_dq_tile`` sums them."""
    offs_m, _m_d, row_ok, _m_dmask, rmask, q_off = tile_rows(start_m, T, D, BD, BM)
    q_off += base
    q1 = tl.load(Q1 + q_off, mask=rmask, other=0.0)
    q2 = tl.load(Q2 + q_off, mask=rmask, other=0.0)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    tau = beta * tl.load(BASE + offs_m, mask=row_ok, other=0.0)
    z1, zb1 = score_tile(q1, k1, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    z2, zb2 = score_tile(q2, k2, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    valid = (offs_n[None, :] <= offs_m[:, None]) & row_ok[:, None] & (offs_n[None, :] < T)
    go = 1
    if SKIP:
        go = _either_active(z1, z2, valid, tau)
    if go > 0:
        do = tl.load(DO + q_off, mask=rmask, other=0.0)
        w2 = _view_weights(z2, valid, tau, POWER)
        w = _view_weights(z1, valid, tau, POWER) - lam * w2
        dv += tl.dot(tl.trans(w).to(do.dtype), do, input_precision=DOT_PREC)
        g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        e1 = _view_dz(z1, valid, g, tau, POWER)
        e2 = -lam * _view_dz(z2, valid, g, tau, POWER)
        dz1 = e1 * rs[:, None]
        dz2 = e2 * rs[:, None]
        dk1 += tl.dot(tl.trans(dz1).to(q1.dtype), q1, input_precision=DOT_PREC)
        dk2 += tl.dot(tl.trans(dz2).to(q2.dtype), q2, input_precision=DOT_PREC)
        if FUSED:
            tl.atomic_add(DQ1 + q_off, tl.dot(dz1.to(k1.dtype), k1, input_precision=DOT_PREC), mask=rmask,
                          sem="relaxed")
            tl.atomic_add(DQ2 + q_off, tl.dot(dz2.to(k2.dtype), k2, input_precision=DOT_PREC), mask=rmask,
                          sem="relaxed")
            rows = bh * T + offs_m
            if GRAD_RS:
                tl.atomic_add(DRS + rows, tl.sum(e1 * zb1 + e2 * zb2, 1), mask=row_ok, sem="relaxed")
            if GRAD_SL:
                tl.atomic_add(DSL + rows, tl.sum((e1 + e2) * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1),
                              mask=row_ok, sem="relaxed")
            if GRAD_TAU:
                tl.atomic_add(DTAU + rows, -tl.sum(e1 + e2, 1), mask=row_ok, sem="relaxed")
            if GRAD_LAM:
                tl.atomic_add(DLAM + rows, -tl.sum(w2 * g, 1), mask=row_ok, sem="relaxed")
    return dk1, dk2, dv


@triton.jit
def _bwd_dkdv_kernel(Q1, K1, Q2, K2, V, DO, DK1, DK2, DV, SL, RS, BETA, BASE, LAM, STARTS, LIST, DQ1, DQ2, DRS, DSL,
                     DTAU, DLAM, sm_scale, T, H, NK, BETA_SH, LAM_SH,
                     POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, USE_MAP: tl.constexpr,
                     FUSED: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, GRAD_TAU: tl.constexpr,
                     GRAD_LAM: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr):
    """``USE_MAP``: visit only the query tiles of the activity map's list for this key tile (``BN ==
    MAP_N``, ``BM`` divides ``MAP_M``), no branch; else every query tile from the diagonal, each tested.
    ``FUSED``: dq and the per-row gradients too (``_dkdv_tile``), each (query tile, key tile) pair visited once."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_n, offs_d, _n_ok, dmask, kv_mask, kv_off = tile_rows(pid_n * BN, T, D, BD, BN)
    kv_off += base
    k1 = tl.load(K1 + kv_off, mask=kv_mask, other=0.0)
    k2 = tl.load(K2 + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    lam = tl.load(LAM + (bh % H) * LAM_SH)
    beta = tl.load(BETA + (bh % H) * BETA_SH)
    dk1 = tl.zeros([BN, BD], dtype=tl.float32)
    dk2 = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BD], dtype=tl.float32)
    if USE_MAP:
        row = bh * NK + pid_n
        lo = tl.load(STARTS + row)
        hi = tl.load(STARTS + row + 1)
        for i in range(lo, hi):
            tile = tl.load(LIST + i)
            for sub in tl.static_range(MAP_M // BM):
                dk1, dk2, dv = _dkdv_tile(dk1, dk2, dv, k1, k2, v, Q1, Q2, DO, RS, BASE, beta, DQ1, DQ2, DRS, DSL, DTAU,
                                          DLAM, base, bh, tile * MAP_M + sub * BM, offs_n, T, sm_scale, slope, lam,
                                          POWER, HAS_SLOPES, HAS_RS, False, FUSED, GRAD_RS, GRAD_SL, GRAD_TAU,
                                          GRAD_LAM, DOT_PREC, D, BD, BM)
    else:
        lo = (pid_n * BN // BM) * BM
        for start_m in range(lo, T, BM):
            dk1, dk2, dv = _dkdv_tile(dk1, dk2, dv, k1, k2, v, Q1, Q2, DO, RS, BASE, beta, DQ1, DQ2, DRS, DSL, DTAU, DLAM,
                                      base, bh, start_m, offs_n, T, sm_scale, slope, lam, POWER, HAS_SLOPES, HAS_RS,
                                      True, FUSED, GRAD_RS, GRAD_SL, GRAD_TAU, GRAD_LAM, DOT_PREC, D, BD, BM)
    tl.store(DK1 + kv_off, (dk1 * sm_scale).to(DK1.dtype.element_ty), mask=kv_mask)
    tl.store(DK2 + kv_off, (dk2 * sm_scale).to(DK2.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_rows_kernel(Q1, K1, Q2, K2, V, DO, DQ1, DQ2, DK1, DK2, DV, SL, RS, BETA, BASE, LAM, DRS, DSL, DBETA, DLAM,
                     sm_scale, T, H, BETA_SH, LAM_SH,
                     POWER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr,
                     GRAD_SL: tl.constexpr, GRAD_BETA: tl.constexpr, GRAD_LAM: tl.constexpr, DOT_PREC: tl.constexpr,
                     D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The whole backward of one head whose ``T <= BM`` rows fit one query tile: each key tile's dk1, dk2 and dv
    whole (every query row is here), stored once; dq1, dq2 and the per-row gradients summed in registers over the
    key tiles, dq1, dq2 and the row scale's stored once. The gradients of the slopes, ``beta`` and ``lam`` are summed
    over the head's rows here and added atomically to theirs (zeroed fp32, one number per head or one for all: the
    op makes no per-row buffers for them and sums none after)."""
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, q_off = tile_rows(0, T, D, BD, BM)
    q_off += base
    q1 = tl.load(Q1 + q_off, mask=rmask, other=0.0)
    q2 = tl.load(Q2 + q_off, mask=rmask, other=0.0)
    do = tl.load(DO + q_off, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    tau = _row_tau(BETA, BASE, bh, H, offs_m, row_ok, BETA_SH)
    lam = tl.load(LAM + (bh % H) * LAM_SH)
    dq1 = tl.zeros([BM, BD], dtype=tl.float32)
    dq2 = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    d_tau = tl.zeros([BM], dtype=tl.float32)
    d_lam = tl.zeros([BM], dtype=tl.float32)
    for start_n in range(0, T, BN):
        offs_n = start_n + tl.arange(0, BN)
        kv_mask = (offs_n < T)[:, None] & dmask[None, :]
        kv_off = base + offs_n[:, None] * D + offs_d[None, :]
        k1 = tl.load(K1 + kv_off, mask=kv_mask, other=0.0)
        k2 = tl.load(K2 + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        z1, zb1 = score_tile(q1, k1, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        z2, zb2 = score_tile(q2, k2, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        valid = (offs_n[None, :] <= offs_m[:, None]) & row_ok[:, None] & (offs_n[None, :] < T)
        w2 = _view_weights(z2, valid, tau, POWER)
        w = _view_weights(z1, valid, tau, POWER) - lam * w2
        g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        e1 = _view_dz(z1, valid, g, tau, POWER)
        e2 = -lam * _view_dz(z2, valid, g, tau, POWER)
        dz1 = (e1 * rs[:, None]).to(q1.dtype)
        dz2 = (e2 * rs[:, None]).to(q2.dtype)
        dv = tl.dot(tl.trans(w).to(do.dtype), do, input_precision=DOT_PREC)
        dk1 = tl.dot(tl.trans(dz1), q1, input_precision=DOT_PREC)
        dk2 = tl.dot(tl.trans(dz2), q2, input_precision=DOT_PREC)
        tl.store(DK1 + kv_off, (dk1 * sm_scale).to(DK1.dtype.element_ty), mask=kv_mask)
        tl.store(DK2 + kv_off, (dk2 * sm_scale).to(DK2.dtype.element_ty), mask=kv_mask)
        tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)
        dq1 += tl.dot(dz1, k1, input_precision=DOT_PREC)
        dq2 += tl.dot(dz2, k2, input_precision=DOT_PREC)
        if GRAD_RS:
            d_rs += tl.sum(e1 * zb1 + e2 * zb2, 1)
        if GRAD_SL:
            d_sl += tl.sum((e1 + e2) * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
        if GRAD_BETA:
            d_tau -= tl.sum(e1 + e2, 1)
        if GRAD_LAM:
            d_lam -= tl.sum(w2 * g, 1)
    tl.store(DQ1 + q_off, (dq1 * sm_scale).to(DQ1.dtype.element_ty), mask=rmask)
    tl.store(DQ2 + q_off, (dq2 * sm_scale).to(DQ2.dtype.element_ty), mask=rmask)
    if GRAD_RS:
        tl.store(DRS + bh * T + offs_m, d_rs, mask=row_ok)
    if GRAD_SL:
        tl.atomic_add(DSL + bh % H, tl.sum(-d_sl * rs, 0), sem="relaxed")
    if GRAD_BETA:  # (d tau_r / d beta = base_r)
        base_rows = tl.load(BASE + offs_m, mask=row_ok, other=0.0)
        tl.atomic_add(DBETA + (bh % H) * BETA_SH, tl.sum(d_tau * base_rows, 0), sem="relaxed")
    if GRAD_LAM:
        tl.atomic_add(DLAM + (bh % H) * LAM_SH, tl.sum(d_lam, 0), sem="relaxed")


# Launch settings per head-dim block: (BM, BN, num_warps) per kernel, and for the forward whether it skips
# inactive tiles by a branch (``skip``) and how it writes the activity map when gradients are needed
# (``map``: 0 none, 1 in registers, 2 stored per tile; ``fwd_map``: the forward's tiles then). With a map
# the backward visits only the active tiles; without one it tests every tile by a branch. Without gradients
# no map is written. Measured on the H100 at L 65,536, H 16, D 32, bf16, unit q/k: the forward without the skip branch 18.2 ms (with it 32.8; SDPA 19.4); with
# the register map 30.3 ms at 4 warps (35.8 at 8), the backward over the map's tiles then ~2.5 ms, against
# 222 ms testing every tile. Two views hold about twice the tiles of ``utils/rowwise.py``; the tile shapes are
# those that ptxas compiled for sm_90 without spilling (bf16; at head dim 128 the backward still spills ~88
# bytes). ``tda_attention(tuning=...)`` (a dict of the same form) overrides them: for benchmarks and tests.
# ``fused_bwd`` (off here): no dq kernel; the dk/dv kernel, which visits each (query tile, key tile) pair once,
# also adds each pair's share of dq1, dq2 and the per-row gradients atomically into zeroed fp32 buffers, so the
# backward computes both views' scores and their gradients once instead of twice. The training step's settings
# take it (``lengthbench.compile_policy.CAPTURE_TUNING``, where it is measured: the short rows of training, where the dq
# kernel was about half of TDA's backward); at long lengths, where each
# query tile would take the atomic adds of every active key tile, it is not measured. ``rows`` (off here; the
# training step's settings take ``[128, 32, 4]``): where a head's rows fit ``BM``, :func:`_bwd_rows_kernel` alone
# runs the backward (``fused_bwd`` then has no effect).
# ``rows``: the largest query tile (BM x head-dim block) it takes; 256 x 64 asks for more than the H200's shared
# memory (270,336 bytes against 232,448), and the fused backward runs there instead
ROWS_MAX_TILE = 128 * 64
MAX_MAP_TILES = 8192  # key tiles of MAP_N a register map covers (T up to 524,288); beyond, map 2


def _config(block_d: int, tuning: dict | None = None) -> dict:
    """The launch settings for head-dim block ``block_d``, ``tuning``'s keys replacing the defaults' (a
    ``fwd`` without ``fwd_map`` sets both)."""
    if block_d <= 32:
        config = dict(fwd=(128, 64, 8), fwd_map=(128, 64, 4), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1)
    elif block_d <= 64:  # at D 64: 24.6 / 42.8 ms against 26.0 / 75.4 with the BN 32, 8-warp tiles
        config = dict(fwd=(128, 64, 4), fwd_map=(128, 64, 4), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1)
    else:
        config = dict(fwd=(32, 32, 8), fwd_map=(32, 32, 8), dq=(32, 32, 8), dkdv=(32, 32, 8), skip=True, map=0)
    config["fused_bwd"] = False
    config["rows"] = None
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(config))
    if unknown:
        raise ValueError(f"tda tuning: unknown keys {unknown}; the keys are {sorted(config)}")
    if not isinstance(tuning.get("fused_bwd", False), bool):
        raise ValueError(f"tda tuning: fused_bwd must be true or false, got {tuning['fused_bwd']!r}")
    rows = tuning.get("rows")
    if rows is not None and not (isinstance(rows, (list, tuple)) and len(rows) == 3
                                 and all(isinstance(x, int) and x > 0 and x & (x - 1) == 0 for x in rows)):
        raise ValueError(f"tda tuning: rows must be null or [BM, BN, warps], powers of two, got {rows!r}")
    if "fwd" in tuning and "fwd_map" not in tuning:
        tuning["fwd_map"] = tuning["fwd"]
    return {**config, **tuning}


def _map_fits(config: dict) -> bool:
    """Whether ``config``'s tiles fit the activity map's (``MAP_M`` x ``MAP_N``)."""
    (fm, fn, _), (qm, qn, _), (km, kn, _) = config["fwd_map"], config["dq"], config["dkdv"]
    return (fm == MAP_M.value and MAP_N.value % fn == 0 and MAP_M.value % qm == 0 and MAP_N.value % qn == 0
            and kn == MAP_N.value and MAP_M.value % km == 0 and (config["map"] != 2 or fn == MAP_N.value))


def _tile_lists(amap: torch.Tensor):
    """The activity map ``[BH, NQ, NK]`` as lists: per query tile the active key tiles, per key tile the
    active query tiles, each as (starts ``[rows + 1]``, tiles) int32, in increasing order."""
    out = []
    for act in (amap != 0, (amap != 0).transpose(1, 2).contiguous()):
        counts = act.sum(-1, dtype=torch.int32).view(-1)
        starts = torch.zeros(counts.numel() + 1, device=amap.device, dtype=torch.int32)
        torch.cumsum(counts, 0, out=starts[1:])
        tiles = (act.view(-1).nonzero().squeeze(1) % act.shape[-1]).to(torch.int32)
        out.append((starts, tiles if tiles.numel() else starts))
    return out


def _second_view(pb: Problem, q2, k2):
    """``q2``, ``k2`` checked against the first view's problem, contiguous."""
    if q2.shape != pb.q.shape or k2.shape != pb.q.shape:
        raise ValueError(f"both views must be [B, H, T, D] alike, got {tuple(pb.q.shape)}, "
                         f"{tuple(q2.shape)}, {tuple(k2.shape)}")
    if q2.dtype != pb.q.dtype or k2.dtype != pb.q.dtype:
        raise TypeError(f"both views must share the dtype {pb.q.dtype}, got {q2.dtype}, {k2.dtype}")
    return q2.contiguous(), k2.contiguous()


class TDAAttention(torch.autograd.Function):
    """``o = sum_j (a1_rj - lam_h a2_rj) v_j`` with the rows' threshold ``tau_r = beta_h base_r``; ``beta`` and
    ``lam`` are fp32 tensors, 0-d or ``[H]``, ``base`` the ``[T]`` fp32 ``tra.tau_base``. Gradients flow to both
    views' q and k, v, ``beta``, ``lam``, ``row_scale`` and ``slopes``."""

    @staticmethod
    def forward(ctx, q1, k1, q2, k2, v, slopes, row_scale, beta, lam, base, sm_scale, power, want_map=True,
                tuning=None):
        pb = Problem(q1, k1, v, slopes, row_scale, sm_scale)
        q2, k2 = _second_view(pb, q2, k2)
        out = torch.empty_like(pb.q)
        beta, lam = beta.detach().contiguous(), lam.detach().contiguous()
        config = _config(pb.block_d, tuning)
        mode = config["map"] if want_map else 0
        bm, bn, warps = config["fwd_map" if mode else "fwd"]
        if mode and not _map_fits(config):
            raise ValueError(f"tda: tiles {config} do not fit the activity map's {MAP_M.value}x{MAP_N.value}")
        nq, nk = triton.cdiv(pb.tokens, MAP_M.value), triton.cdiv(pb.tokens, MAP_N.value)
        if mode == 1 and nk > MAX_MAP_TILES:
            mode = 2 if bn == MAP_N.value else 0
        amap = None
        if mode:
            amap = torch.zeros(pb.bh, nq, nk, device=q1.device, dtype=torch.int8)
        _fwd_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
            pb.q, pb.k, q2, k2, pb.v, out, pb.opt(pb.slopes), pb.opt(pb.row_scale), beta, base, lam,
            pb.opt(amap), pb.sm_scale, pb.tokens, pb.heads, nq, nk, int(beta.dim() == 1), int(lam.dim() == 1),
            POWER=float(power), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
            SKIP=bool(config["skip"]), MAP_MODE=mode, NKT=triton.next_power_of_2(nk) if mode == 1 else 1,
            DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm, BN=bn, num_warps=warps, num_stages=2)
        ctx.amap = amap
        ctx.config = config
        ctx.consts = (pb.sm_scale, float(power))
        ctx.rs_shape = None if row_scale is None else row_scale.shape
        ctx.save_for_backward(pb.q, pb.k, q2, k2, pb.v, pb.slopes, pb.row_scale, beta, lam, base)
        return out

    @staticmethod
    def backward(ctx, dout):
        q1, k1, q2, k2, v, slopes, row_scale, beta, lam, base = ctx.saved_tensors
        sm_scale, power = ctx.consts
        pb = Problem(q1, k1, v, slopes, row_scale, sm_scale)
        do = dout.contiguous()
        grad_sl = slopes is not None and ctx.needs_input_grad[5]
        grad_rs = row_scale is not None and ctx.needs_input_grad[6]
        grad_beta, grad_lam = ctx.needs_input_grad[7], ctx.needs_input_grad[8]
        config = ctx.config
        fused = bool(config["fused_bwd"])
        dk1, dk2, dv = (torch.empty_like(t) for t in (k1, k2, v))
        rows = (pb.batch, pb.heads, pb.tokens)
        shared = (beta, base, lam)
        strides = (int(beta.dim() == 1), int(lam.dim() == 1))
        whole = config.get("rows")
        if whole is not None and pb.tokens <= whole[0] and whole[0] * pb.block_d <= ROWS_MAX_TILE:
            # every row in one query tile: one kernel; the per-head gradients summed into zeroed fp32 tensors
            dq1, dq2 = torch.empty_like(q1), torch.empty_like(q2)
            d_rs = torch.empty(rows, device=q1.device, dtype=torch.float32) if grad_rs else None
            # (each its own zeroed tensor: gradients that share memory may not leave an op of a compiled graph)
            g_sl, g_beta, g_lam = (torch.zeros(size, device=q1.device, dtype=torch.float32) if wanted else None
                                   for wanted, size in ((grad_sl, pb.heads), (grad_beta, beta.numel()),
                                                        (grad_lam, lam.numel())))
            bm, bn, warps = whole
            _bwd_rows_kernel[(1, pb.bh)](
                q1, k1, q2, k2, v, do, dq1, dq2, dk1, dk2, dv, pb.opt(slopes), pb.opt(row_scale), *shared,
                *(pb.opt(t) for t in (d_rs, g_sl, g_beta, g_lam)), sm_scale, pb.tokens, pb.heads, *strides,
                POWER=power, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None, GRAD_RS=grad_rs,
                GRAD_SL=grad_sl, GRAD_BETA=grad_beta, GRAD_LAM=grad_lam, DOT_PREC=pb.dot_prec, D=pb.head_dim,
                BD=pb.block_d, BM=bm, BN=bn, num_warps=warps, num_stages=2)
            g_rs = _sum_to(d_rs, ctx.rs_shape) if d_rs is not None else None
            return (dq1, dk1, dq2, dk2, dv, g_sl, g_rs, _like(g_beta, beta), _like(g_lam, lam),
                    None, None, None, None, None)
        grads = dict(GRAD_RS=grad_rs, GRAD_SL=grad_sl, GRAD_TAU=grad_beta, GRAD_LAM=grad_lam)
        if fused:
            # dq of both views and the per-row gradients are sums of atomic adds, from zero: one fp32 buffer, one
            # fill (the row gradients that leave reduced share it; the row scale's, returned whole, has its own)
            size, reduced = q1.numel(), (grad_sl, grad_beta, grad_lam)
            zeros = torch.zeros(2 * size + sum(reduced) * pb.bh * pb.tokens, device=q1.device, dtype=torch.float32)
            dq1, dq2 = zeros[:size].view(q1.shape), zeros[size:2 * size].view(q1.shape)
            parts = iter(zeros[2 * size:].view(-1, *rows))
            d_sl, d_tau, d_lam = (next(parts) if wanted else None for wanted in reduced)
            d_rs = torch.zeros(rows, device=q1.device, dtype=torch.float32) if grad_rs else None
        else:
            d_sl, d_rs, d_tau, d_lam = (torch.empty(rows, device=q1.device, dtype=torch.float32) if wanted else None
                                        for wanted in (grad_sl, grad_rs, grad_beta, grad_lam))
        use_map = ctx.amap is not None
        common = dict(POWER=power, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                      USE_MAP=use_map, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, num_stages=2)
        (q_starts, q_tiles), (k_starts, k_tiles) = _tile_lists(ctx.amap) if use_map else ((pb.dummy,) * 2,) * 2
        nq, nk = (ctx.amap.shape[1], ctx.amap.shape[2]) if use_map else (0, 0)
        inputs = (q1, k1, q2, k2, v, do)
        row_grads = tuple(pb.opt(t) for t in (d_rs, d_sl, d_tau, d_lam))
        if not fused:
            dq1, dq2 = torch.empty_like(q1), torch.empty_like(q2)
            bm, bn, warps = config["dq"]
            _bwd_dq_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
                *inputs, dq1, dq2, pb.opt(slopes), pb.opt(row_scale), *shared, *row_grads, q_starts,
                q_tiles, sm_scale, pb.tokens, pb.heads, nq, *strides, BM=bm, BN=bn, num_warps=warps, **grads,
                **common)
        bm, bn, warps = config["dkdv"]
        _bwd_dkdv_kernel[(triton.cdiv(pb.tokens, bn), pb.bh)](
            *inputs, dk1, dk2, dv, pb.opt(slopes), pb.opt(row_scale), *shared, k_starts, k_tiles,
            *((dq1, dq2, *row_grads) if fused else (pb.dummy,) * 6), sm_scale, pb.tokens, pb.heads, nk, *strides,
            FUSED=fused, **(grads if fused else {key: False for key in grads}), BM=bm, BN=bn, num_warps=warps,
            **common)
        if fused:  # (TDA's cosine scores take sm_scale 1: the casts alone, copies that share no memory)
            dq1, dq2 = ((dq if sm_scale == 1.0 else dq * sm_scale).to(q1.dtype, copy=True) for dq in (dq1, dq2))
        g_sl = None
        if d_sl is not None:
            g_sl = reduce_slopes(d_sl) if not fused else -reduce_slopes(d_sl if row_scale is None else d_sl * row_scale)
        g_rs = _sum_to(d_rs, ctx.rs_shape) if d_rs is not None else None
        g_beta = (d_tau * base).sum(dim=(0, 2)) if d_tau is not None else None
        g_lam = d_lam.sum(dim=(0, 2)) if d_lam is not None else None
        return (dq1, dk1, dq2, dk2, dv, g_sl, g_rs, _like(g_beta, beta), _like(g_lam, lam),
                None, None, None, None, None)


def _like(per_head: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor | None:
    """A gradient summed per head (``[H]``) or over all heads, as ``param``'s shape (0-d: the sum)."""
    if per_head is None:
        return None
    return per_head.reshape(param.shape) if per_head.numel() == param.numel() else per_head.sum().reshape(param.shape)


def _per_head(value, heads: int, device, name: str) -> torch.Tensor:
    """``value`` (float, 0-d, ``[1]`` or ``[H]`` tensor) as the fp32 tensor the op reads: 0-d or ``[H]``."""
    if not torch.is_tensor(value):
        return torch.full((), float(value), device=device, dtype=torch.float32)
    if value.dim() > 1 or (value.dim() == 1 and value.numel() not in (1, heads)):
        raise ValueError(f"tda {name} must be a float, a 0-d tensor or one of {heads} heads, got shape "
                         f"{tuple(value.shape)}")
    value = value.to(device, torch.float32)
    return value.reshape(()) if value.dim() == 1 and value.numel() == 1 and heads != 1 else value


def tda_attention(q1, k1, q2, k2, v, *, lam=TDA_LAM, slopes=None, row_scale=None, sm_scale=1.0, beta=TRA_BETA,
                  kappa=TRA_KAPPA, power=TRA_POWER, tau_index=TRA_TAU_INDEX, tuning: dict | None = None):
    """TDA, ``[B, H, T, D]`` causal: ``tra(q1, k1, v) - lam * tra(q2, k2, v)`` in one pass; ``q_i``, ``k_i``
    unit-norm (cosine scores with ``sm_scale=1``). ``lam`` and ``beta``: float, 0-d or ``[H]`` tensor.
    ``tuning``: launch settings in place of :func:`_config`'s (benchmarks, tests)."""
    if sm_scale is None:
        sm_scale = 1.0
    if not math.isfinite(float(power)) or float(power) <= 0:
        raise ValueError(f"tda power must be positive, got {power}")
    heads = q1.shape[1]
    base = tau_base(q1.shape[-2], q1.shape[-1], float(kappa), q1.device, tau_index)
    beta_h = _per_head(beta, heads, q1.device, "beta")
    lam_h = _per_head(lam, heads, q1.device, "lam")
    # The activity map costs the forward time; it is only written when a backward may follow.
    want_map = torch.is_grad_enabled() and any(
        torch.is_tensor(t) and t.requires_grad for t in (q1, k1, q2, k2, v, slopes, row_scale, beta_h, lam_h))
    return TDAAttention.apply(q1, k1, q2, k2, v, slopes, row_scale, beta_h, lam_h, base, sm_scale, float(power),
                              want_map, tuning)
