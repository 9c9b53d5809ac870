"""Stick-breaking's forward kernel (``op.py`` describes the walk): one program per query tile walks the key
tiles right to left from the diagonal, carrying the softplus sum of the keys passed, until every row's stick is
spent; with a filter (Sieve's two forms) the keys or the weights restricted to those above a threshold.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lengthbench.kernels.stickbreaking.stick import LN2, LOG2E, _key_tile, _softplus_e, _stick, _stick_ones
from lengthbench.kernels.utils.common import score_tile


@triton.jit
def _fwd_kernel(Q, K, V, Out, O32, REM, LSE, START, SL, RS, TAU, sm_scale, T, H, exit_at, eps,
                SAVE: tl.constexpr, FILTER: tl.constexpr, ROWMAX: tl.constexpr, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr,
                SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr, EXP2: tl.constexpr,
                LOG1P: tl.constexpr, SKIP: tl.constexpr, FULL: tl.constexpr,
                PREFETCH: tl.constexpr, EVERY: tl.constexpr, BNR: tl.constexpr, DROP: tl.constexpr):
    """The forward of a query tile. ``SAVE`` 3 keeps the softplus sum ``L_r`` (nats) and the first key walked, per
    row (for the backward). ``DROP``: the remainder goes nowhere (else on the diagonal). ``ROWMAX``: the
    filter's threshold is Algorithm 1's, ``(max_{j<r} z_rj - eps) / 2``, found here over the row's earlier keys
    and stored in ``TAU`` (else read from it), over key tiles of ``BNR`` keys."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.zeros([BM], dtype=tl.float32)
    if FILTER:
        if ROWMAX:
            tau = _rowmax_tau(q, K, base, offs_m, offs_d, dmask, row_ok, pid_m, T, sm_scale, slope, rs, eps,
                              HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BNR)
            tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)
        else:
            tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    scale = sm_scale
    if EXP2:  # the scores, the filter and the exit in bits
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        exit_at = exit_at * LOG2E
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    acc, lsum, t = _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, scale, slope, rs, tau, n_tiles,
                                   exit_at, tl.zeros([BM, BD], dtype=tl.float32), tl.zeros([BM], dtype=tl.float32),
                                   offs_m, n_tiles, FILTER, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC, D, BD, BM, BN, CUMSUM,
                                   EXP2, LOG1P, SKIP, FULL, PREFETCH, EVERY)
    if EXP2:
        lsum = lsum * LN2
    if SAVE == 3:
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, D, 0, D, DROP)
        tl.store(LSE + bh * T + offs_m, lsum, mask=row_ok)
        tl.store(START + bh * T + offs_m, tl.zeros([BM], dtype=tl.int32) + (n_tiles - t) * BN, mask=row_ok)
    else:
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, D, SAVE, D, DROP)


@triton.jit
def row_max_earlier(q, K, base, offs_m, offs_d, dmask, pid_m, T, sm_scale, slope, rs, HAS_SLOPES: tl.constexpr,
                    HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr):
    """``max_{j<r} z_rj`` of a query tile's rows (-inf for row 0): Algorithm 1's row maxima (``sieve/``). The key
    tiles before the query tile's first row take no causal masks; without ALiBi slopes or row scales their maximum is
    that of the raw products, scaled once (for ``sm_scale > 0`` the rounding of a product by it is monotone: the
    same value as the maximum of the scaled ones)."""
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    before = (pid_m * BM) // BN * BN  # the keys before every row of the tile
    if not HAS_SLOPES and not HAS_RS:
        if sm_scale > 0:
            raw = tl.full([BM], float("-inf"), dtype=tl.float32)
            for start_n in range(0, before, BN):
                offs_n = start_n + tl.arange(0, BN)
                k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
                raw = tl.maximum(raw, tl.max(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), 1))
            best = raw * sm_scale
        else:
            best = _max_scores(q, K, base, offs_m, offs_d, dmask, before, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                               DOT_PREC, D, BM, BN)
    else:
        best = _max_scores(q, K, base, offs_m, offs_d, dmask, before, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                           DOT_PREC, D, BM, BN)
    for start_n in range(before, tl.minimum((pid_m + 1) * BM, T), BN):  # the tiles the diagonal crosses
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        earlier = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        best = tl.maximum(best, tl.max(tl.where(earlier, z, float("-inf")), 1))
    return best


@triton.jit
def _max_scores(q, K, base, offs_m, offs_d, dmask, upto, sm_scale, slope, rs, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The rows' maximum score over the keys before ``upto`` (a multiple of ``BN``, before every row), unmasked."""
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start_n in range(0, upto, BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        best = tl.maximum(best, tl.max(z, 1))
    return best


@triton.jit
def _rowmax_tau(q, K, base, offs_m, offs_d, dmask, row_ok, pid_m, T, sm_scale, slope, rs, eps,
                HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    """Algorithm 1's threshold of a query tile's rows, ``(max_{j<r} z_rj - eps) / 2`` less a sliver (so that
    ``z = max - eps`` stays in; -inf for row 0, +inf past the last row): ``sieve_window_attention``'s."""
    best = row_max_earlier(q, K, base, offs_m, offs_d, dmask, pid_m, T, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                           DOT_PREC, D, BM, BN)
    return tl.where(row_ok, (best - eps) * 0.5 - 1e-6, float("inf"))


@triton.jit
def _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at, acc,
              lsum, upto, max_tiles, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr):
    """``_fwd_walk_tuned`` with the default levers (Sieve's gathered open rows call it)."""
    acc, lsum, t = _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles,
                                   exit_at, acc, lsum, upto, max_tiles, FILTER, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC,
                                   D, BD, BM, BN, 0, False, False, False, False)
    return acc, lsum, t


@triton.jit
def _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at,
                    acc, lsum, upto, max_tiles, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr,
                    HAS_RS: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                    EXP2: tl.constexpr, LOG1P: tl.constexpr, SKIP: tl.constexpr,
                    FULL: tl.constexpr, PREFETCH: tl.constexpr = False, EVERY: tl.constexpr = 1):
    """``(acc, lsum, t)``: the weighted values and the softplus sum of the rows ``offs_m``, from ``acc`` and
    ``lsum``, over their keys before ``upto`` in the key tiles ``n_tiles - 1`` down, stopping once every row
    (``row_ok``) has passed ``exit_at`` nats (bits with ``EXP2``), or after ``max_tiles`` tiles; ``t`` the tiles
    walked (Sieve's gathered open rows reuse it, a phase at a time: ``sieve._open_kernel``). ``CUMSUM``,
    ``EXP2``, ``LOG1P``, ``SKIP``, ``FULL``, ``PREFETCH``, ``EVERY``: the levers ``cumsum``, ``exp2``, ``log1p``,
    ``skip_empty``, ``full_tiles``, ``prefetch`` and ``exit_every`` of ``launch_config``."""
    t = 0
    lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    lowest = tl.min(upto, 0)
    ones = _stick_ones(CUMSUM, BN)
    thr = None
    if FILTER == 2:  # sieve-window's filter, applied where the weights are formed (``_stick``)
        thr = tau * 2.0
    if PREFETCH:  # the first tile's keys and values; each tile then loads the next one's before its own work
        k_next, v_next = _kv_tile(K, V, base, (n_tiles - 1) * BN + tl.arange(0, BN), offs_d, dmask, T, D)
    while (t < n_tiles) & (lmin < exit_at) & (t < max_tiles):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k_here = None
        v_here = None
        if PREFETCH:
            k_here = k_next
            v_here = v_next
            k_next, v_next = _kv_tile(K, V, base, offs_n - BN, offs_d, dmask, T, D)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau,
                                          upto, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D, k_here)
        full = 0
        if FULL:  # every key of the tile is before every row's limit: no masks
            full = (n_tiles - t) * BN <= lowest
        if full:
            kept = 1
            if SKIP:
                if FILTER == 2:  # every key of the tile is earlier: the filter alone
                    keep = z > thr[:, None]
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = _value_tile(V, base, offs_n, offs_d, dmask[None, :], D, v_here)
                acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, EXP2,
                                    LOG1P, False, ones, thr)
            else:  # no kept key: the stick alone
                sp, _ = _softplus_e(z, EXP2, LOG1P)
            lsum += tl.sum(sp, 1)
            lmin = _exit_sum(lsum, row_ok, lmin, t, EVERY)
        # Sieve's supports are small: most tiles hold none of them and cost only the score product.
        elif tl.max(valid.to(tl.int32)) > 0:
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = _value_tile(V, base, offs_n, offs_d, (offs_n < T)[:, None] & dmask[None, :], D, v_here)
                acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, EXP2,
                                    LOG1P, True, ones, thr)
            else:  # no kept key: the stick alone
                sp, _ = _softplus_e(z, EXP2, LOG1P)
                sp = tl.where(valid, sp, 0.0)
            lsum += tl.sum(sp, 1)
            lmin = _exit_sum(lsum, row_ok, lmin, t, EVERY)
        t += 1
    return acc, lsum, t


@triton.jit
def _exit_sum(lsum, row_ok, lmin, t, EVERY: tl.constexpr):
    """The smallest softplus sum of the tile's rows (``row_ok``), the walk's exit test, taken after every ``EVERY``-th
    tile (``t`` the tile just walked; else ``lmin`` as it was): a reduction over the rows of every warp of the
    program, through shared memory and three barriers."""
    if EVERY == 1:
        lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    else:
        if t % EVERY == EVERY - 1:
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    return lmin


@triton.jit
def _value_tile(V, base, offs_n, offs_d, mask, D: tl.constexpr, v=None):
    """The value tile of keys ``offs_n`` (``mask`` its load mask), or ``v`` where the walk loaded it ahead."""
    if v is None:
        v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=mask, other=0.0)
    return v


@triton.jit
def _kv_tile(K, V, base, offs_n, offs_d, dmask, T, D: tl.constexpr):
    """The key and value tile of keys ``offs_n`` (zeros outside ``[0, T)``)."""
    kv_mask = ((offs_n >= 0) & (offs_n < T))[:, None] & dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def _fwd_tile(z, valid, keep, v, acc, lsum, FILTER: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr, EXP2: tl.constexpr,
              LOG1P: tl.constexpr, MASKED: tl.constexpr, ones=None, thr=None):
    """``(acc, sp)``: a key tile's weighted values added to ``acc``, and its softplus (``MASKED``, ``ones``,
    ``thr``: see ``_stick``; ``FILTER`` 2 without ``thr``: the weights kept where ``keep``)."""
    sp, a = _stick(z, valid, lsum, CUMSUM, EXP2, LOG1P, BM, BN, MASKED, ones, thr)
    if FILTER == 2 and thr is None:
        a = tl.where(keep, a, 0.0)
    if SPLIT:
        a_hi = a.to(v.dtype)
        acc += tl.dot(a_hi, v)
        acc += tl.dot((a - a_hi.to(tl.float32)).to(v.dtype), v)
    else:
        acc += tl.dot(a.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, sp


@triton.jit
def _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, o32_stride,
               SAVE: tl.constexpr, D: tl.constexpr, DROP: tl.constexpr):
    """The remainder on the diagonal (``DROP``: nowhere), then the output and, for the backward (``SAVE``), the
    remainder and the output's fp32 copy, row ``r`` of head ``bh`` at ``O32 + (bh T + r) o32_stride`` (``SAVE`` 2:
    the remainder alone)."""
    rem = tl.exp(-lsum)
    if not DROP:
        v_r = tl.load(V + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
        acc += rem[:, None] * v_r.to(tl.float32)
    tl.store(Out + base + offs_m[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=rmask)
    if SAVE:
        tl.store(REM + bh * T + offs_m, rem, mask=row_ok)
    if SAVE == 1:
        o32_rows = (bh * T + offs_m).to(tl.int64) * o32_stride
        tl.store(O32 + o32_rows[:, None] + offs_d[None, :], acc, mask=rmask)
