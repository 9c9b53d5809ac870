"""Stick-breaking's backward kernels (``op.py`` gives the gradient): the ``prefix`` walk from the left over the
keys the forward walked, and the right-to-left walk from the diagonal that Sieve's gathered open rows take.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.stickbreaking.stick import (
    LN2,
    LOG2E,
    _cumsum,
    _exp,
    _key_tile,
    _sigmoids,
    _softplus_e,
    _tri_ones,
)
from lengthbench.kernels.utils.common import Problem, reduce_slopes


@triton.jit
def _bwd_walk(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, c_total,
              g_r, n_tiles, exit_at, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
              BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``_bwd_walk_tuned`` with the default levers (Sieve's gathered open rows call it)."""
    dq, d_rs, d_sl = _bwd_walk_tuned(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope,
                                     rs, tau, c_total, g_r, n_tiles, exit_at, FILTER, HAS_SLOPES, HAS_RS, GRAD_RS,
                                     GRAD_SL, DOT_PREC, D, BD, BM, BN, 0, False, False, 0, False)
    return dq, d_rs, d_sl


@triton.jit
def _bwd_walk_tuned(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, c_total,
                    g_r, n_tiles, exit_at, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                    GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                    EXP2: tl.constexpr, LOG1P: tl.constexpr, SIG: tl.constexpr, SKIP: tl.constexpr):
    """``(dq, d_rs, d_sl)`` of the rows ``offs_m`` (before ``sm_scale`` and the slopes' sign and row scale)
    over the key tiles ``n_tiles - 1`` down to 0, the forward's walk (Sieve's gathered open rows reuse it);
    dk and dv go to ``DK``/``DV`` by atomic adds. ``sm_scale``, ``slope``, ``tau`` and ``exit_at`` in nats;
    ``CUMSUM``, ``EXP2``, ``SIG``, ``SKIP``: the levers of ``launch_config``."""
    scale = sm_scale
    if EXP2:
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        exit_at = exit_at * LOG2E
    lsum = tl.zeros([BM], dtype=tl.float32)
    c_acc = tl.zeros([BM], dtype=tl.float32)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    t = 0
    lmin = tl.min(tl.zeros([BM], dtype=tl.float32), 0)
    while (t < n_tiles) & (lmin < exit_at):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, scale, slope, rs, tau,
                                          offs_m, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        if tl.max(valid.to(tl.int32)) > 0:
            kv_mask = (offs_n < T)[:, None] & dmask[None, :]
            sp, e = _softplus_e(z, EXP2, LOG1P)
            sp = tl.where(valid, sp, 0.0)
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
                if CUMSUM >= 5:  # (``_stick``'s form)
                    a = _exp((z - sp) - lsum[:, None] - _cumsum(sp, 2, CUMSUM, BM, BN), EXP2)
                else:
                    a = _exp(z - lsum[:, None] - _cumsum(sp, 0, CUMSUM, BM, BN), EXP2)
                a = tl.where(valid, a, 0.0)
                if FILTER == 2:
                    a = tl.where(keep, a, 0.0)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
                c = tl.where(valid, (g - g_r[:, None]) * a, 0.0)
                before = c_total[:, None] - c_acc[:, None] - _cumsum(c, 0, CUMSUM, BM, BN)
                s, sn = _sigmoids(z, e, SIG, EXP2)
                dz = tl.where(valid, c * sn - s * before, 0.0)
                dv_tile = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=DOT_PREC)
                tl.atomic_add(DV + base + offs_n[:, None] * D + offs_d[None, :], dv_tile, mask=kv_mask,
                              sem="relaxed")
                c_acc += tl.sum(c, 1)
            else:  # no kept key (sieve-window): c = 0 on the tile
                s, sn = _sigmoids(z, e, SIG, EXP2)
                dz = tl.where(valid, -s * (c_total - c_acc)[:, None], 0.0)
            dzs = dz * rs[:, None]
            dq += tl.dot(dzs.to(k.dtype), k, input_precision=DOT_PREC)
            if GRAD_RS:
                if EXP2:
                    zb = zb * LN2
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            dk_tile = tl.dot(tl.trans(dzs).to(q.dtype), q, input_precision=DOT_PREC) * sm_scale
            tl.atomic_add(DK + base + offs_n[:, None] * D + offs_d[None, :], dk_tile, mask=kv_mask, sem="relaxed")
            lsum += tl.sum(sp, 1)
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
        t += 1
    return dq, d_rs, d_sl


@triton.jit
def _bwd_prefix_kernel(Q, K, V, DO, DQ, DK, DV, LSE, START, SL, RS, TAU, DRS, DSL, sm_scale, T, H,
                       FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                       GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                       BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                       EXP2: tl.constexpr, LOG1P: tl.constexpr, SIG: tl.constexpr, SKIP: tl.constexpr,
                       DROP: tl.constexpr):
    """The ``prefix`` backward of a query tile: left to right over the keys the forward walked, ``[START_r,
    r)``, with the forward's softplus sum ``L_r = LSE_r``. With ``P_j`` the softplus sum of the walked keys
    before ``j``, ``a_j = exp(z_j - (L_r - P_j))``; with ``c_j = (g_j - g_r) a_j`` (``FILTER`` 2: ``c_j = g_j
    a_j`` on the kept keys, and ``g_r rem_r`` added to the running sum, the remainder's share),
    ``dz_k = c_k sigma(-z_k) - sigma(z_k) sum_{j < k} c_j``: the ``suffix`` backward's form with ``C_r -
    sum_{j >= k} c_j`` summed from the left. The diagonal's ``dv_r += rem_r do_r`` is added here. ``DROP``
    (the remainder nowhere): ``g_r = 0`` and no ``dv_r`` (the same forms with the remainder's value zero)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    roff = base + offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(Q + roff, mask=rmask, other=0.0)
    do = tl.load(DO + roff, mask=rmask, other=0.0)
    do32 = do.to(tl.float32)
    g_r = tl.zeros([BM], dtype=tl.float32)  # do_r.v_r, the remainder's value (none where DROP)
    if not DROP:
        g_r = tl.sum(do32 * tl.load(V + roff, mask=rmask, other=0.0).to(tl.float32), 1)
    lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)
    first = tl.load(START + bh * T + offs_m, mask=row_ok, other=T)
    rem = tl.exp(-lse)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.zeros([BM], dtype=tl.float32)
    if FILTER:
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    scale = sm_scale
    if EXP2:
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        lse = lse * LOG2E
    psum = tl.zeros([BM], dtype=tl.float32)  # P: the softplus sum of the keys walked
    csum = tl.zeros([BM], dtype=tl.float32)  # sum_{j < k} c_j (and the remainder's share)
    if FILTER == 2:
        csum = g_r * rem
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    ones_sp = _tri_ones(2 if CUMSUM >= 5 else 1, CUMSUM, BN)
    ones_c = _tri_ones(1, CUMSUM, BN)
    for tile in range(tl.min(first, 0) // BN, n_tiles):
        offs_n = tile * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, scale, slope, rs, tau,
                                          offs_m, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        walked = offs_n[None, :] >= first[:, None]
        valid = valid & walked
        keep = keep & walked
        kv_mask = (offs_n < T)[:, None] & dmask[None, :]
        if not SKIP:  # loaded beside the keys, where the loop's pipelining can issue it ahead
            v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        if tl.max(valid.to(tl.int32)) > 0:
            sp, e = _softplus_e(z, EXP2, LOG1P)
            sp = tl.where(valid, sp, 0.0)
            s, sn = _sigmoids(z, e, SIG, EXP2)
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                if SKIP:
                    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
                if CUMSUM >= 5:  # ``_stick``'s form: the walked keys after the tile, then those after j in it
                    after = lse - psum - tl.sum(sp, 1)
                    a = _exp((z - sp) - after[:, None] - _cumsum(sp, 2, CUMSUM, BM, BN, ones_sp), EXP2)
                else:
                    a = _exp(z - (lse - psum)[:, None] + _cumsum(sp, 1, CUMSUM, BM, BN, ones_sp), EXP2)
                a = tl.where(valid, a, 0.0)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
                if FILTER == 2:
                    a = tl.where(keep, a, 0.0)
                    c = g * a
                else:
                    c = tl.where(valid, (g - g_r[:, None]) * a, 0.0)
                before = csum[:, None] + _cumsum(c, 1, CUMSUM, BM, BN, ones_c)
                dz = tl.where(valid, c * sn - s * before, 0.0)
                dv_tile = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=DOT_PREC)
                tl.atomic_add(DV + base + offs_n[:, None] * D + offs_d[None, :], dv_tile, mask=kv_mask,
                              sem="relaxed")
                csum += tl.sum(c, 1)
            else:  # no kept key (sieve-window): c = 0 on the tile
                dz = tl.where(valid, -s * csum[:, None], 0.0)
            dzs = dz * rs[:, None]
            dq += tl.dot(dzs.to(k.dtype), k, input_precision=DOT_PREC)
            if GRAD_RS:
                if EXP2:
                    zb = zb * LN2
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            dk_tile = tl.dot(tl.trans(dzs).to(q.dtype), q, input_precision=DOT_PREC) * sm_scale
            tl.atomic_add(DK + base + offs_n[:, None] * D + offs_d[None, :], dk_tile, mask=kv_mask, sem="relaxed")
            psum += tl.sum(sp, 1)
    if not DROP:
        tl.atomic_add(DV + roff, rem[:, None] * do32, mask=rmask, sem="relaxed")
    _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
               GRAD_RS, GRAD_SL, D)


@triton.jit
def _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
               GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, D: tl.constexpr):
    """A query tile's ``dq`` and its per-row gradients of ``row_scale`` and (before ``reduce_slopes``) the
    slopes."""
    tl.store(DQ + base + offs_m[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rmask)
    if GRAD_RS:
        tl.store(DRS + bh * T + offs_m, d_rs, mask=row_ok)
    if GRAD_SL:
        tl.store(DSL + bh * T + offs_m, -d_sl * rs, mask=row_ok)


def grad_buffers(ctx, pb: Problem):
    """What a backward of these kernels writes into: ``(grad_rs, grad_sl, dq, dk32, dv32, d_rs, d_sl)``, whether
    the row scale and the slopes take gradients, ``dq`` in the input dtype, ``dk``/``dv`` as fp32 buffers for
    the atomic adds (zeroed), and the per-row gradients of the row scale and slopes (None where not asked for)."""
    q = pb.q
    grad_rs = pb.row_scale is not None and ctx.needs_input_grad[4]
    grad_sl = pb.slopes is not None and ctx.needs_input_grad[3]
    dk32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    dv32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    return (grad_rs, grad_sl, torch.empty_like(q), dk32, dv32, pb.rows() if grad_rs else None,
            pb.rows() if grad_sl else None)


def param_grads(d_sl, d_rs, rs_shape):
    """``(d slopes, d row_scale)`` from the backward kernels' per-row gradients (None where not asked for),
    reduced to the shapes of the slopes and the row scale."""
    g_rs = None
    if d_rs is not None:
        g_rs = d_rs
        while g_rs.dim() > len(rs_shape):
            g_rs = g_rs.sum(0)
        g_rs = g_rs.sum_to_size(rs_shape)
    g_sl = None if d_sl is None else reduce_slopes(d_sl)
    return g_sl, g_rs
