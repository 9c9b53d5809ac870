"""The threshold search of alpha-entmax (1.5 and 2, sparsemax) over each causal row of scores: ``tau_r`` with
``sum_j (X_rj - tau_r)_+^(1 / (alpha - 1)) = 1`` on the scale ``X = (alpha - 1) z``. Not an op: entmax's and
Sieve's forwards start from it (``entmax_threshold``, and the list forward of ``entmax/lists.py``).

One program per query tile, in two stages. The first stage, one pass over the key tiles, keeps a subset of
each row's ``X``: the ``d`` (4) largest of every column ``c`` of the key tiles (the keys ``j = c mod BN``),
merged elementwise in registers (``m_1 >= .. >= m_d``, no reduction per tile; with ``pairs``, two key tiles a
step, ``_insert_pair``: 6 minima and maxima a score instead of 7, the stage being bound by the ALU pipe that
runs them). The exact threshold of any subset, found in registers, is a lower bound on ``tau*`` (a subset's
sum ``sum (X - t)_+^2`` is never larger) and at least ``X_max - 1``; and here every key left out lies at or
below its column's ``m_d``. So a row whose ``m_d`` are all at or below the subset's threshold (or that has at
most ``d`` keys per column) is certified: no left-out key is above that threshold, which is then ``tau*``
itself. That fails only where ``d`` keys of one column are in the support: for rows of 65,536 N(0, 1) scores
(supports of ~30 keys; a numpy model of this stage) in ~12% of the rows, and only ~1.6% of all rows then need
a step that moves ``tau``. (``subset`` 0 keeps the 16 largest tile maxima instead and certifies nothing: every
row then takes the 2-3 full passes.)

The Newton passes then run on the rows left open only, gathered per head into tiles of their own (a second
kernel; ``split``). With ``lean`` (the default) a pass accumulates only ``s1 = sum (X - tau)_+``, ``s2 =
sum (X - tau)_+^2`` and the support size, and takes Newton's step below; the support's quadratic bounds
``tau*`` from above (``_bracket``), so a row also ends once that bracket is narrower than ``tol``, a pass
before its step would fall below ``tol``. The count costs instructions and registers: a pass takes longer, and
wide rows (a fresh model's) take one pass fewer. The lean passes also take a start above ``tau*`` (entmax's
sampled start, ``lists._sample_kernel``): there ``f(tau) < 1``, and both Newton's step and the
current support's root (the larger one taken) land below ``tau*``, within the step of it; from there the
passes go on from below. Without ``lean`` a pass accumulates, per
row, ``s1``, ``s2``, the support size and the least ``X`` in the support; from them either the exact root of
``sum_S (X - t)^2 = 1`` on the current support ``S`` (accepted when no element of ``S`` falls below it: then
it is ``tau*``), or a Newton step on ``h(tau) = ||(X - tau)_+||_2 - 1``: ``tau <- tau + (s2 - sqrt(s2)) /
s1``. ``h`` is convex and decreasing and the iteration starts below ``tau*``, so the Newton steps rise
monotonically to ``tau*`` without overshooting, and the exact step ends the search once the support is found.
A tile stops when every row is exact or moves by less than ``tol``. On the H100 at L 65,536, H 16, D 32,
bf16, N(0, 1) q and k: 27 ms for the threshold against 90 ms with the top-16 start and three full passes;
with q and k times 0.7 (wider supports, more rows left open) 59 against 114 ms.

Sparsemax runs the same search on ``X = z`` for the root of ``sum (X - tau)_+ = 1``, piecewise linear: its
Newton step from below is the exact root on the current support, accepted as ``tau*`` once no element of the
support falls below it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.entmax.config import ALPHAS, check_alpha, launch_config
from lengthbench.kernels.utils.common import (
    Problem,
    folded_scores,
    gathered_rows,
    head_slope,
    rows_scale,
    score_tile,
    tile_rows,
)
from lengthbench.kernels.utils.open_rows import _open_rows, _phases


@triton.jit
def _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, MASKED: tl.constexpr,
            STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
            DOT_PREC: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, XS: tl.constexpr):
    """``X = XS * z`` of the key tile at ``start_n``, ``-inf`` on the keys a row does not see (tested only when
    ``MASKED``: the tiles that cross the diagonal; the others lie wholly below ``T`` and the diagonal).
    ``FOLD`` (no slopes): one product a score, by the row's ``sm_scale * XS`` (times its row scale;
    ``folded_scores``)."""
    offs_n = start_n + tl.arange(0, BN)
    if MASKED:
        kmask = (offs_n < T)[:, None] & dmask[None, :]
    else:  # a tile before the diagonal lies below T: no bound test per key
        kmask = dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kmask, other=0.0)
    if FOLD:
        x = folded_scores(q, k, sm_scale, rs, XS, HAS_RS, DOT_PREC)
    else:
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        x = z * XS
    if MASKED:
        if STRICT:
            valid = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        else:
            valid = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
        x = tl.where(valid, x, float("-inf"))
    return x


@triton.jit
def _accumulate(a1, a2, a3, a4, x, tau):
    """Add a ``[BM, BN]`` tile of ``X`` to elementwise partial sums of ``s = (X - tau)_+``, of ``s^2``, of
    ``1[s > 0]`` and to the least ``X`` with ``s > 0`` (reduced over the columns by the caller)."""
    s = tl.maximum(x - tau[:, None], 0.0)
    inside = s > 0
    return a1 + s, a2 + s * s, a3 + inside.to(tl.float32), tl.minimum(a4, tl.where(inside, x, float("inf")))


@triton.jit
def _lean_accumulate(a1, a2, a3, x, tau, XS: tl.constexpr, COUNT: tl.constexpr):
    """Add a ``[BM, BN]`` tile of ``X`` to elementwise partial sums of ``s = (X - tau)_+``, of ``s^2`` and, with
    ``COUNT``, of ``1[s > 0]`` (sparsemax, ``XS == 1``: of ``s`` and ``1[s > 0]``; ``a3`` unchanged)."""
    s = tl.maximum(x - tau[:, None], 0.0)
    if XS == 1.0:
        return a1 + s, a2 + (s > 0).to(tl.float32), a3
    if COUNT:
        a3 += (s > 0).to(tl.float32)
    return a1 + s, a2 + s * s, a3


@triton.jit
def _newton_tile(x, tau):
    """Per row of one key tile of ``X``: sum of ``s = (X - tau)_+``, of ``s^2``, the count of ``s > 0`` and the
    least ``X`` above ``tau``."""
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
def _bracket(s1, s2, cnt):
    """An upper bound on ``tau* - tau`` (1.5-entmax; ``+inf`` where there is none) from the sums of ``s = (X -
    tau)_+`` over the current support ``S``, for ``tau <= tau*``: the root of the support's quadratic ``g(t) =
    sum_S (X - t)^2 = 1`` (``_exact``), where it has one. ``f(t) = sum (X - t)_+^2`` is at most ``g(t)`` for
    every ``t >= tau`` (``g`` also counts, squared, the keys of ``S`` that ``t`` has passed), so at that root
    ``f <= 1 = f(tau*)``, and ``f`` decreasing puts the root at or above ``tau*``."""
    disc = s1 * s1 - cnt * (s2 - 1.0)
    return tl.where((disc >= 0) & (s1 > 0), _exact(s1, s2, cnt), float("inf"))


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
def _insert(m1, m2, m3, m4, x, DEPTH: tl.constexpr):
    """Merge a tile of ``X`` into the per-column running top ``DEPTH`` (``m1 >= m2 >= m3 >= m4``, elementwise;
    the levels past ``DEPTH`` stay as they are)."""
    if DEPTH >= 4:
        m4 = tl.maximum(m4, tl.minimum(m3, x))
    if DEPTH >= 3:
        m3 = tl.maximum(m3, tl.minimum(m2, x))
    if DEPTH >= 2:
        m2 = tl.maximum(m2, tl.minimum(m1, x))
    m1 = tl.maximum(m1, x)
    return m1, m2, m3, m4


@triton.jit
def _insert_pair(m1, m2, m3, m4, x, y):
    """Merge two tiles of ``X`` into the per-column running top 4 (``m1 >= .. >= m4``, elementwise): 12 minima
    and maxima for the two scores, against 14 for two ``_insert``. The pair sorted (``hi >= lo``), the
    elementwise maxima of the top 4 and the pair reversed, ``(m1, m2, max(m3, lo), max(m4, hi))``, hold the top 4
    of the six values and form a bitonic sequence (a descending sequence against an ascending one), which a
    bitonic sorter of four puts in order."""
    hi = tl.maximum(x, y)
    lo = tl.minimum(x, y)
    c3 = tl.maximum(m3, lo)
    c4 = tl.maximum(m4, hi)
    a1 = tl.maximum(m1, c3)
    a3 = tl.minimum(m1, c3)
    a2 = tl.maximum(m2, c4)
    a4 = tl.minimum(m2, c4)
    return tl.maximum(a1, a2), tl.minimum(a1, a2), tl.maximum(a3, a4), tl.minimum(a3, a4)


@triton.jit
def _column_stats(m1, m2, m3, m4, tau, DEPTH: tl.constexpr):
    """``s1, s2``, count and least ``X`` above ``tau`` per row of the column subset (its ``DEPTH`` levels)."""
    a1, a2, a3, a4 = _accumulate(tl.zeros_like(m1), tl.zeros_like(m1), tl.zeros_like(m1),
                                 tl.full(m1.shape, float("inf"), tl.float32), m1, tau)
    if DEPTH >= 2:
        a1, a2, a3, a4 = _accumulate(a1, a2, a3, a4, m2, tau)
    if DEPTH >= 3:
        a1, a2, a3, a4 = _accumulate(a1, a2, a3, a4, m3, tau)
    if DEPTH >= 4:
        a1, a2, a3, a4 = _accumulate(a1, a2, a3, a4, m4, tau)
    return tl.sum(a1, 1), tl.sum(a2, 1), tl.sum(a3, 1), tl.min(a4, 1)


@triton.jit
def _pack(x, tile, PACK: tl.constexpr, MASKED: tl.constexpr):
    """``X`` with its low ``PACK`` mantissa bits replaced by the key tile's index ``tile`` (one logical
    operation; ``-inf`` kept: its low bits set would make a NaN). The merges of ``_insert`` then carry each
    kept value's key along: key ``tile * BNS + c`` in column ``c``. The packed value differs from ``X`` by at
    most ``|X| 2^(PACK - 23) + 2^(PACK - 149)``, and it is a distinct value per key of a column (so the merges
    keep no duplicates). A zero (or tiny) ``X`` packs into a subnormal number: the comparisons, minima and
    maxima that then handle it keep subnormals (Triton emits them without ``.ftz``; ``test_lists_zero_queries``
    and ``test_pack_keeps_zero_scores`` check the lists where every score is 0). Only the ``MASKED`` tiles
    (across the diagonal) hold ``-inf``."""
    bits = x.to(tl.int32, bitcast=True)
    packed = ((bits & (-1 << PACK)) | tile).to(tl.float32, bitcast=True)
    if MASKED:
        packed = tl.where(x == float("-inf"), x, packed)
    return packed


@triton.jit
def _column_top(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, lo, diag, hi, STRICT: tl.constexpr,
                HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, SUBSET: tl.constexpr, XS: tl.constexpr,
                PACK: tl.constexpr, PAIRS: tl.constexpr):
    """The ``SUBSET`` largest ``X`` of every column ``c`` of the key tiles (keys ``j = c mod BNS``) from key
    ``lo`` (a multiple of ``2 BNS``, at most ``diag``) per row, ``m1 >= .. >= m4`` (``-inf`` where a column has
    fewer keys); ``PACK`` > 0: of the packed values (``_pack``), which carry their key tile."""
    m1 = tl.full([BM, BNS], float("-inf"), dtype=tl.float32)
    m2 = m1
    m3 = m1
    m4 = m1
    start = lo
    if PAIRS and SUBSET == 4:
        # Two key tiles a step (``_insert_pair``); an odd one left before the diagonal goes alone below.
        start = diag - diag % (2 * BNS)
        for start_n in range(lo, start, 2 * BNS):
            x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                        HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
            y = _x_tile(q, K, base, start_n + BNS, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                        HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
            if PACK > 0:
                x = _pack(x, start_n // BNS, PACK, False)
                # (start_n + BNS) // BNS, not start_n // BNS + 1: knowing start_n // BNS even, the compiler turns
                # "+ 1" into "| 1" and packs y in two logical instructions instead of one (sm_90 SASS).
                y = _pack(y, (start_n + BNS) // BNS, PACK, False)
            m1, m2, m3, m4 = _insert_pair(m1, m2, m3, m4, x, y)
    for start_n in range(start, diag, BNS):
        x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                    HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
        if PACK > 0:
            x = _pack(x, start_n // BNS, PACK, False)
        m1, m2, m3, m4 = _insert(m1, m2, m3, m4, x, SUBSET)
    for start_n in range(diag, hi, BNS):
        x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                    HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
        if PACK > 0:
            x = _pack(x, start_n // BNS, PACK, True)
        m1, m2, m3, m4 = _insert(m1, m2, m3, m4, x, SUBSET)
    return m1, m2, m3, m4


@triton.jit
def _subset_root(m1, m2, m3, m4, x_max, empty, row_ok, SUBSET: tl.constexpr, SUBSET_ITERS: tl.constexpr,
                 XS: tl.constexpr):
    """``(tau, solved)``: the threshold of the column subset by the exact/Newton steps from ``X_max - 1``
    (below it), ``solved`` where its exact root was accepted (then ``tau`` is that subset's threshold)."""
    tau = tl.where(empty, 0.0, x_max - 1.0)
    solved = empty != empty  # all False
    pending = tl.sum((row_ok & (empty == 0)).to(tl.int32), 0)
    it = 0
    while (it < SUBSET_ITERS) & (pending > 0):
        s1, s2, cnt, x_low = _column_stats(m1, m2, m3, m4, tau, SUBSET)
        solved = solved | _exact_ok(s1, s2, cnt, x_low, tau, XS)
        tau += _step(s1, s2, cnt, x_low, tau, XS)
        pending = tl.sum((row_ok & (empty == 0) & (solved == 0)).to(tl.int32), 0)
        it += 1
    return tau, solved


@triton.jit
def _bottom(m1, m2, m3, m4, SUBSET: tl.constexpr):
    """The lowest kept level, ``m_SUBSET``: every key left out of column ``c`` lies at or below it."""
    bottom = m1
    if SUBSET == 2:
        bottom = m2
    if SUBSET == 3:
        bottom = m3
    if SUBSET == 4:
        bottom = m4
    return bottom


@triton.jit
def _n_keys(offs_m, STRICT: tl.constexpr):
    """The number of keys row ``r`` sees: ``r + 1``, or ``r`` when ``STRICT``."""
    n_keys = offs_m + 1
    if STRICT:
        n_keys = offs_m
    return n_keys


@triton.jit
def _query_tile(Q, SL, RS, T, H, pid_m, bh, STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    """A query tile: ``(base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi)``, the keys visible to its
    rows being ``[0, hi)`` and those below ``diag`` visible to all of them."""
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, roff = tile_rows(pid_m * BM, T, D, BD, BM)
    q = tl.load(Q + base + roff, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    # Keys visible to row r: j <= r, or j < r when STRICT (Sieve).
    hi = tl.minimum((pid_m + 1) * BM, T)
    if STRICT:
        hi = tl.minimum((pid_m + 1) * BM - 1, T - 1)
    diag = pid_m * BM  # key tiles before the tile's first row are fully visible: no mask there
    return base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi


@triton.jit
def _first_stage(q, K, base, offs_m, offs_d, row_ok, dmask, T, sm_scale, slope, rs, diag, hi,
                 STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                 DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr,
                 SUBSET: tl.constexpr, TOPK: tl.constexpr, SUBSET_ITERS: tl.constexpr, XS: tl.constexpr,
                 PAIRS: tl.constexpr):
    """``(tau, empty, certified)`` per row: the subset's threshold (a lower bound on ``tau*``, and ``tau*``
    where ``certified``), whether the row sees no key. ``SUBSET`` 0: the ``TOPK`` largest maxima of the key
    tiles (of ``BNS`` keys), ``SUBSET_ITERS`` steps on them; ``SUBSET`` d in 1..4: the d largest ``X`` of every
    column (keys ``j = c mod BNS``), steps until their exact root is accepted (at most ``SUBSET_ITERS``) and
    the certificate."""
    certified = offs_m < 0
    if SUBSET == 0:
        # Per row, the largest X of each key tile, keeping the TOPK largest of those (a subset of the row's
        # scores, so the exact threshold of that subset is a lower bound on tau*, usually a close one).
        cols = tl.arange(0, TOPK)
        top = tl.full([BM, TOPK], float("-inf"), dtype=tl.float32)
        for start_n in range(0, hi, BNS):
            x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                        HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
            tile_max = tl.max(x, 1)
            low = tl.min(top, 1)
            pos = tl.argmin(top, 1)
            top = tl.where((cols[None, :] == pos[:, None]) & (tile_max > low)[:, None], tile_max[:, None], top)
        x_max = tl.max(top, 1)
        empty = x_max == float("-inf")
        # The subset's threshold, by the same exact/Newton steps in registers, from X_max - 1 (below it).
        tau = tl.where(empty, 0.0, x_max - 1.0)
        for _ in tl.static_range(SUBSET_ITERS):
            s1, s2, cnt, x_low = _newton_tile(top, tau)
            tau += _step(s1, s2, cnt, x_low, tau, XS)
    else:
        # Per row and column c, the SUBSET largest X, merged elementwise in registers (no reduction per tile).
        # Every key left out lies at or below its column's SUBSET-th largest, so where all of those are at or
        # below the subset's threshold (or no key is left out: at most SUBSET per column), no left-out key is
        # in the support and the subset's threshold is tau* itself (the row is certified).
        m1, m2, m3, m4 = _column_top(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, 0, diag, hi, STRICT,
                                     HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BM, BNS, SUBSET, XS, 0, PAIRS)
        x_max = tl.max(m1, 1)
        empty = x_max == float("-inf")
        tau, solved = _subset_root(m1, m2, m3, m4, x_max, empty, row_ok, SUBSET, SUBSET_ITERS, XS)
        certified = solved & ((tl.max(_bottom(m1, m2, m3, m4, SUBSET), 1) <= tau) |
                              (_n_keys(offs_m, STRICT) <= SUBSET * BNS))
    return tau, empty, certified


@triton.jit
def _newton_passes(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, diag, hi, tau, fixed, tol, it0,
                   max_iter, STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                   ACC: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   XS: tl.constexpr, LEAN: tl.constexpr):
    """``tau`` after the Newton passes, which run while a row not ``fixed`` (certified, empty or past ``T``:
    kept as they are) is neither exact nor still (with ``LEAN``, from a start on either side of ``tau*``; without
    it, from below). ``ACC``: elementwise ``[BM, BN]`` partial sums, reduced once
    per pass, instead of reducing every key tile. ``LEAN`` 1 or 2 (2 the default): Newton's steps alone, from
    elementwise sums (``s1``, ``s2``, and with 2 the support size), which a pass computes in under half the
    instructions; a row is done when its step (or with 2 its bracket, ``_bracket``) falls below ``tol``, or
    after 8 passes when its step falls below ``1e-5`` (rounding noise). ``(tau, done)``: ``done``
    the rows that ended (or are ``fixed``); the passes count from ``it0`` to ``max_iter`` at most (a later launch
    of ``newton_phases`` goes on from where an earlier one stopped)."""
    start = tau
    pending = tl.sum((fixed == 0).to(tl.int32), 0)
    done = fixed
    it = it0
    while (it < max_iter) & (pending > 0):
        if LEAN:
            # Only the sums Newton's step needs, elementwise: s1 and s2 (1.5-entmax) or s1 and the count
            # (sparsemax). No exact root: no least X of the support, no count for 1.5-entmax.
            a1 = tl.zeros([BM, BN], dtype=tl.float32)
            a2 = tl.zeros([BM, BN], dtype=tl.float32)
            a3 = tl.zeros([BM, BN], dtype=tl.float32)
            for start_n in range(0, diag, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3 = _lean_accumulate(a1, a2, a3, x, tau, XS, LEAN == 2)
            for start_n in range(diag, hi, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3 = _lean_accumulate(a1, a2, a3, x, tau, XS, LEAN == 2)
            s1 = tl.sum(a1, 1)
            s2 = tl.sum(a2, 1)
            if XS == 1.0:  # s2 holds the count
                step = tl.where(s2 > 0, (s1 - 1.0) / tl.where(s2 > 0, s2, 1.0), 0.0)
                above = s1 < 1.0
            else:
                step = tl.where(s1 > 0, (s2 - tl.sqrt(s2)) / tl.where(s1 > 0, s1, 1.0), 0.0)
                above = s2 < 1.0
            width = step + float("inf")
            if XS != 1.0 and LEAN == 2:
                # The bracket: tau* lies between Newton's step (below it) and the root of the current support's
                # quadratic, where it has one (above it; ``_bracket``). Its width bounds the error of the step.
                quad = _bracket(s1, s2, tl.sum(a3, 1))
                width = quad - step
                # From above (a sampled start), the quadratic's root is a lower bound too, and the closer one.
                step = tl.where(above & (quad < float("inf")), tl.maximum(step, quad), step)
            # Below tau* a step never goes down (a rounding below zero must not leave the lower side). Above it
            # (a sampled start, ``f(tau) < 1``) the step lands below tau*, and tau* lies within -step of the new
            # tau; rounding near tau* may take a row there too, by a step within ``tol``.
            step = tl.where(above, step, tl.maximum(step, 0.0))
            width = tl.where(above, -step, width)
            tau += step
            # Newton's steps from below shrink (by at least 0.6 a step far from tau* in a float64 model, then
            # quadratically; 8 passes at most to 1e-9 there), so a row still stepping after 8 passes is stepping
            # on rounding noise: from then on a step below 1e-5 ends it too. A row also ends once its bracket is
            # narrower than ``tol``: its new ``tau`` is then within ``tol`` of ``tau*``, without the pass that
            # would find the next step small.
            scale = 1.0 + tl.abs(tau)
            size = tl.abs(step)
            done = (size <= tol * scale) | (width <= tol * scale) | ((it >= 8) & (size <= 1e-5 * scale)) | fixed
            pending = tl.sum((done == 0).to(tl.int32), 0)
            it += 1
        elif ACC:
            a1 = tl.zeros([BM, BN], dtype=tl.float32)
            a2 = tl.zeros([BM, BN], dtype=tl.float32)
            a3 = tl.zeros([BM, BN], dtype=tl.float32)
            a4 = tl.full([BM, BN], float("inf"), dtype=tl.float32)
            for start_n in range(0, diag, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3, a4 = _accumulate(a1, a2, a3, a4, x, tau)
            for start_n in range(diag, hi, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3, a4 = _accumulate(a1, a2, a3, a4, x, tau)
            s1 = tl.sum(a1, 1)
            s2 = tl.sum(a2, 1)
            cnt = tl.sum(a3, 1)
            x_low = tl.min(a4, 1)
        else:
            s1 = tl.zeros([BM], dtype=tl.float32)
            s2 = tl.zeros([BM], dtype=tl.float32)
            cnt = tl.zeros([BM], dtype=tl.float32)
            x_low = tl.full([BM], float("inf"), dtype=tl.float32)
            for start_n in range(0, diag, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3, a4 = _newton_tile(x, tau)
                s1 += a1
                s2 += a2
                cnt += a3
                x_low = tl.minimum(x_low, a4)
            for start_n in range(diag, hi, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2, a3, a4 = _newton_tile(x, tau)
                s1 += a1
                s2 += a2
                cnt += a3
                x_low = tl.minimum(x_low, a4)
        if not LEAN:
            exact_ok = _exact_ok(s1, s2, cnt, x_low, tau, XS)
            step = _step(s1, s2, cnt, x_low, tau, XS)
            tau += step
            done = exact_ok | (step <= tol * (1.0 + tl.abs(tau))) | fixed
            pending = tl.sum((done == 0).to(tl.int32), 0)
            it += 1
    return tl.where(fixed, start, tau), done


@triton.jit
def _threshold_kernel(Q, K, SL, RS, TAU, sm_scale, T, H, tol, max_iter,
                      STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                      DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BNS: tl.constexpr, SUBSET: tl.constexpr, TOPK: tl.constexpr,
                      SUBSET_ITERS: tl.constexpr, ACC: tl.constexpr, XS: tl.constexpr, LEAN: tl.constexpr,
                      PAIRS: tl.constexpr):
    """Both stages in one program per query tile (``+inf`` for a row with no key)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi = _query_tile(
        Q, SL, RS, T, H, pid_m, bh, STRICT, HAS_SLOPES, HAS_RS, D, BD, BM)
    tau, empty, certified = _first_stage(q, K, base, offs_m, offs_d, row_ok, dmask, T, sm_scale, slope, rs, diag,
                                         hi, STRICT, HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BM, BNS, SUBSET, TOPK,
                                         SUBSET_ITERS, XS, PAIRS)
    tau, _ = _newton_passes(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, diag, hi, tau,
                            certified | empty | (row_ok == 0), tol, 0, max_iter, STRICT, HAS_SLOPES, HAS_RS, FOLD, ACC,
                         DOT_PREC, D, BM, BN, XS, LEAN)
    tau = tl.where(empty, float("inf"), tau)
    tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)


@triton.jit
def _start_kernel(Q, K, SL, RS, TAU, DONE, sm_scale, T, H,
                  STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                  DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr,
                  SUBSET: tl.constexpr, TOPK: tl.constexpr, SUBSET_ITERS: tl.constexpr, XS: tl.constexpr,
                  PAIRS: tl.constexpr):
    """The first stage alone (the split launch): ``TAU`` the start (``+inf`` for a row with no key), ``DONE``
    1 where it is final (certified or empty)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi = _query_tile(
        Q, SL, RS, T, H, pid_m, bh, STRICT, HAS_SLOPES, HAS_RS, D, BD, BM)
    tau, empty, certified = _first_stage(q, K, base, offs_m, offs_d, row_ok, dmask, T, sm_scale, slope, rs, diag,
                                         hi, STRICT, HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BM, BNS, SUBSET, TOPK,
                                         SUBSET_ITERS, XS, PAIRS)
    tl.store(TAU + bh * T + offs_m, tl.where(empty, float("inf"), tau), mask=row_ok)
    tl.store(DONE + bh * T + offs_m, (certified | empty).to(tl.int8), mask=row_ok)


@triton.jit
def _newton_kernel(Q, K, SL, RS, TAU, ROWS, COUNT, PEND, sm_scale, T, H, tol, it0, max_iter,
                   STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                   ACC: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, XS: tl.constexpr, LEAN: tl.constexpr, PHASED: tl.constexpr):
    """The Newton passes alone (the split launch) over the rows ``_start_kernel`` left open, gathered:
    ``ROWS[bh, :COUNT[bh]]`` (ascending, ``T + 1`` a head), ``BM`` of them a program; ``TAU`` in place. The
    keys below the tile's first row are visible to all its rows, the rest up to its last row are masked.
    Passes ``it0`` to ``max_iter``; ``PHASED``: ``PEND`` 1 on the rows not done by then, 0 on the others."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    n_open = tl.load(COUNT + bh)
    if pid_m * BM < n_open:
        base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs = gathered_rows(
            Q, SL, RS, ROWS, n_open, pid_m, bh, T, H, HAS_SLOPES, HAS_RS, D, BD, BM)
        first = tl.min(tl.where(row_ok, offs_m, T), 0)
        last = tl.max(tl.where(row_ok, offs_m, 0), 0)
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=0.0)
        tau, done = _newton_passes(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, (first // BN) * BN,
                                   last + 1, tau, row_ok == 0, tol, it0, max_iter, STRICT, HAS_SLOPES, HAS_RS, FOLD,
                                   ACC, DOT_PREC, D, BM, BN, XS, LEAN)
        tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)
        if PHASED:
            tl.store(PEND + bh * T + offs_m, (done == 0).to(tl.int32), mask=row_ok)


def entmax_threshold(q, k, *, slopes=None, row_scale=None, sm_scale=None, strict=False, tol=1e-6,
                     max_iter=40, alpha=1.5, tuning: dict | None = None) -> torch.Tensor:
    """``tau`` ``[B, H, T]`` fp32 of alpha-entmax (1.5 or 2) over each row's visible keys (``j < r`` when
    ``strict``; ``+inf`` for a row with no key), on the scale ``X = (alpha - 1) z``. No gradient. ``tuning``:
    launch settings replacing the defaults (``entmax/config.py``)."""
    xs = ALPHAS[check_alpha(alpha)]
    pb = Problem(q, k, k, slopes, row_scale, sm_scale)
    config = launch_config(pb.block_d, tuning)
    bm, bn, bns, split = config["bm"], config["bn"], config["bn_subset"], config["split"]
    subset = int(config["subset"])
    nbm, nbn, nwarps, nstages = config["newton"]
    if bm % bns or (not split and bm % bn) or (split and nbm % nbn) or not 0 <= subset <= 4:
        raise ValueError(f"entmax threshold: bad launch settings {config}")
    tau = pb.rows()
    args = (pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), tau)
    common = dict(STRICT=bool(strict), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                  FOLD=bool(config["fold"]) and pb.slopes is None, DOT_PREC=pb.dot_prec,
                  D=pb.head_dim, BD=pb.block_d, XS=xs)
    first = dict(BNS=bns, SUBSET=subset, TOPK=16, SUBSET_ITERS=16 if subset else 8, PAIRS=bool(config["pairs"]))
    grid = (triton.cdiv(pb.tokens, bm), pb.bh)
    if not split:
        _threshold_kernel[grid](*args, pb.sm_scale, pb.tokens, pb.heads, float(tol), int(max_iter), BM=bm, BN=bn,
                                ACC=bool(config["acc"]), LEAN=_lean(config), num_warps=config["warps"],
                                num_stages=config["stages"], **first, **common)
        return tau
    done = torch.empty(tau.shape, device=tau.device, dtype=torch.int8)
    _start_kernel[grid](*args, done, pb.sm_scale, pb.tokens, pb.heads, BM=bm, num_warps=config["warps"],
                        num_stages=config["stages"], **first, **common)
    rows, count = _open_rows(done.view(pb.bh, pb.tokens))
    _newton_launch(pb, args, rows, count, tol, max_iter, config, (nbm, nbn, nwarps, nstages), common)
    return tau


def _lean(config: dict) -> int:
    """The Newton passes' ``LEAN``: 0 (``lean`` off: the exact root), 1 (Newton's steps) or 2 (with the bracket,
    ``bracket`` on)."""
    if not config["lean"]:
        return 0
    return 2 if config["bracket"] else 1


def _newton_launch(pb: Problem, args, rows, count, tol, max_iter, config, tiles, common):
    """The Newton passes over the open rows ``rows, count``: one launch, or with ``newton_phases`` (passes a
    launch) one launch a phase over the rows not yet done, gathered again after each (a tile runs as many
    passes as its slowest row: regathered, the rows that end early stop taking a tile's passes), the last
    phase up to ``max_iter``."""
    nbm, nbn, nwarps, nstages = tiles
    phases = _phases(config, "newton_phases", pb.tokens)
    launch = dict(ACC=bool(config["acc"]), LEAN=_lean(config), BM=nbm, BN=nbn, num_warps=nwarps,
                  num_stages=nstages, **common)
    grid = (triton.cdiv(pb.tokens, nbm), pb.bh)
    pend = torch.zeros(pb.bh, pb.tokens, device=pb.q.device, dtype=torch.int32) if phases else pb.dummy
    it0 = 0
    for passes in phases:
        if it0 >= max_iter:
            return
        _newton_kernel[grid](*args, rows, count, pend, pb.sm_scale, pb.tokens, pb.heads, float(tol), it0,
                             min(it0 + passes, int(max_iter)), PHASED=True, **launch)
        it0 += passes
        rows, count = _open_rows(pend == 0)
    if it0 < max_iter:
        _newton_kernel[grid](*args, rows, count, pend, pb.sm_scale, pb.tokens, pb.heads, float(tol), it0,
                             int(max_iter), PHASED=False, **launch)
