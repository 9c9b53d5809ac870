"""1.5-entmax attention: ``w_rj = (z_rj / 2 - tau_r)_+^2`` with ``tau_r`` making row ``r`` sum to 1; and
sparsemax (alpha = 2): ``w_rj = (z_rj - tau_r)_+``.

The threshold comes from its own kernels (``entmax_threshold``, which Sieve reuses for its support), one
program per query tile, in two stages.

The first stage, one pass over the key tiles, keeps a subset of each row's ``X = z / 2``: the ``d`` (4)
largest of every column ``c`` of the key tiles (the keys ``j = c mod BN``), merged elementwise in registers
(``m_1 >= .. >= m_d``, no reduction per tile; by default two key tiles a step, ``_insert_pair``: 6 minima and
maxima a score instead of 7, the stage being bound by the ALU pipe that runs them, ``pairs``, session 15). The exact threshold of any subset, found in registers, is a
lower bound on ``tau*`` (a subset's sum ``sum (X - t)_+^2`` is never larger) and at least ``X_max - 1``;
and here every key left out lies at or below its column's ``m_d``. So a row whose ``m_d`` are all at or
below the subset's threshold (or that has at most ``d`` keys per column) is certified: no left-out key is
above that threshold, which is then ``tau*`` itself. That fails only where ``d`` keys of one column are in
the support: for rows of 65,536 N(0, 1) scores (supports of ~30 keys; a numpy model of this stage) in ~12%
of the rows, and only ~1.6% of all rows then need a step that moves ``tau``. (The older first stage,
``subset`` 0, keeps the ``TOPK`` (16) largest tile maxima and certifies nothing: every row then takes the
2-3 full passes.)

The Newton passes then run on the rows left open only, gathered per head into tiles of their own (a second
kernel; ``split``). By default (``lean``, session 14) a pass accumulates only ``s1 = sum (X - tau)_+`` and ``s2 =
sum (X - tau)_+^2`` and takes Newton's step below, 4 instructions a score; ``lean`` False gives the passes with
the exact root that follow. Such a pass accumulates, per row, ``s1 = sum (X - tau)_+``, ``s2 = sum (X - tau)_+^2``, the
support size and the least ``X`` in the support. From them either the exact root of ``sum_S (X - t)^2 = 1``
on the current support ``S`` (accepted when no element of ``S`` falls below it: then it is ``tau*``), or a
Newton step on ``h(tau) = ||(X - tau)_+||_2 - 1``: ``tau <- tau + (s2 - sqrt(s2)) / s1``. ``h`` is convex
and decreasing and the iteration starts below ``tau*``, so the Newton steps rise monotonically to ``tau*``
without overshooting, and the exact step ends the search once the support is found. A tile stops when every
row is exact or moves by less than ``tol``. On the H100 at L 65,536, H 16, D 32, bf16, N(0, 1) q and k
(``benchmarks/entmax_variants.py``): 27 ms for the threshold against 90 ms with the top-16 start and three
full passes; with q and k times 0.7 (wider supports, more rows left open) 59 against 114 ms.

Sparsemax runs the same search on ``X = z`` for the root of ``sum (X - tau)_+ = 1``, piecewise linear: its
Newton step from below is the exact root on the current support, accepted as ``tau*`` once no element of the
support falls below it.

The forward of ``entmax_attention`` (``lists``, the default) then avoids a second pass over all keys for the
certified rows. Its first stage (``_lists_start_kernel``) packs each key tile's index into the low mantissa
bits of ``X`` (``_pack``: 10 bits at 65,536 keys), so the kept values carry their keys through the merges, and
certifies with a margin ``eps`` of the packing's perturbation (the argument is in the kernel's docstring).
A certified row's candidates (kept values above ``tau_sub - 2 eps``, which hold its support) go to a list of
at most ``C`` (64) keys; ``_lists_output_kernel`` gathers them, recomputes their scores, finds ``tau*`` over
them in registers and writes the output. The other rows (not certified, or more than ``C`` candidates) take
the Newton passes and then an output pass over all their keys, gathered (``_open_output_kernel``). Both write
what ``RowwiseAttention``'s backward reads, which runs unchanged. In a float64 model of the stage at L
65,536 (400 rows that see every key, N(0, 1) q and k, D 32) 81% of those rows are listed (82% certified
without the margin), with supports of 34 keys and 32 candidates on average; q and k times 0.7: 2%.

``alibi_skip`` (the default since session 22; session 21 wrote it): on ALiBi heads the first stage starts
each query tile past the keys that cannot come within 1 of a row's own score (``_alibi_skip``: a
Cauchy-Schwarz bound with the head's largest key norm), which lie below ``tau*`` and every subset's support.
A CPU model of session 20's trained MQMTAR ASEntmax + NAPE model (session 21, at 1,024 tokens) found 78-88%
of the key tiles of its eight ALiBi heads (slopes 1 to 1/8) below ``X_max - 1`` and none of its NoPE heads';
the first stage was 54% of the model's evaluation time on the H100 at 65,536 tokens. With the skip (session 22,
H100) the first stage of that model's sample takes 54.0 ms instead of 99.9, the sample 140.3 ms instead of
185.5, and 1,000 samples 131.3 s (1.56x softmax + RoPE's 84 s, against 2.08x without).

``rescue`` (session 22; the default since session 23): a row that is not certified has at most a few
saturated columns (``m4' + 2 eps > tau_sub``), the only columns whose left-out keys may lie above ``tau_sub -
eps``. In a numpy model of the first stage (``benchmarks/rescue_model.py``: N(0, 1) scores at L 65,536, D 32)
15.7% of rows are open, with 1.2 saturated columns on average, and 94% of those have at most 64 candidates
once every key of their saturated columns above ``tau_sub`` is added (1.9% of the keys scanned).
``_rescue_kernel`` scans those columns (keys ``j = c mod BNS``) for such rows and completes their lists, so
they are finished from their lists instead of by the Newton passes and the output pass over all their keys
(8.9 of the 34 ms of the forward, session 14).
With wider supports (scores times 0.7) most open rows overflow the lists and stay open. On the H100 (session
23, L 65,536, D 32, N(0, 1) inputs) 99.0% of rows are listed instead of 86.9%, entmax's forward takes 30.5 ms
instead of 34.0 (1.53x SDPA's 19.9) and Sieve's 34.7 instead of 50.5; the trained MQMTAR ASEntmax + NAPE
model's sample 137.0 ms instead of 140.3.

``few_open`` (session 24): where the open rows are few (at most 256 a multiprocessor, from 16,384 tokens), a
launch over them may take tiles of its own (``newton_few``, off; Sieve's ``sieve_open_few``, 16 rows, on). Such
rows all run at once, and the last rows' walk over every key is then the critical path, which smaller tiles
shorten; their count comes to the host behind the first stage (``_OpenCount``). Sieve's forward at L 65,536,
D 32 on the H100: 30.7 -> 29.3 ms. ``_open_rows`` scans in chunks (``_row_cumsum``): 84 -> ~6 us a call.

``newton_phases`` and ``sieve_phases`` (session 25, on by default from ``phases_from``, 8,192 tokens, where the
open rows are not few): a tile of gathered open rows runs as long as its slowest row, so the rows still going
are gathered again between launches, the Newton kernel's after 2 passes (``_newton_launch``), Sieve's open walk
after 512, 2,048 and 8,192 keys (``sieve._open_walk``, the walk's state kept in the row's unused list slots). A
row census of a trained MQMTAR Sieve + NoPE model (``benchmarks/row_census.py``, H100, 65,536 tokens) found its
open rows (23%) open for ties: supports of 261 keys (median; 9,011 at p90) with 2 distinct values (a NoPE
model scores a key by its token alone in its first layer), not certifiable by a column's top 4 and too many for
the lists; their walks end 2,149 keys back (median) but 35,897 at p90, and every 64-row tile holds such a row.
That model's sample took 206.7 ms in one launch each; 167.5 ms with the walk's phases (the walk 68.7 -> 28.5
ms), 202.2 with the Newton kernel's (37.1 -> 31.6 ms), 163.5 with both (the walk's (2048, 8192)); 1,000 samples
with the defaults 150 s instead of 196 (1.80x softmax + RoPE's 83 s).

Without ``lists`` (or with ``old``, or past 12 bits of key tiles), and always for the gradients, the shared
pointwise kernels (``_rowwise.py``) compute the output over all keys, the forward also keeping
``u_r = sum_j (X_rj - tau_r)_+ v_j`` for the backward: ``dz_rj = s_rj (do_r.v_j - do_r.u_r / sum_j s_rj)``
with ``s = (X - tau)_+``. No gradient flows through ``tau`` other than this (it is the exact entmax
Jacobian). For sparsemax the backward's weights are the support's indicator: ``dz_rj = 1[s_rj > 0] (do_r.v_j -
do_r.u_r / |S_r|)`` with ``u_r = sum_{j in S_r} v_j``. ``row_scale`` and ``slopes`` receive gradients.
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, gathered_rows, head_slope, rows_scale, score_tile, tile_rows
from lengthbench.kernels._rowwise import ENTMAX, _fwd_loops, rowwise, rowwise_backward


@triton.jit
def _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, MASKED: tl.constexpr,
            STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
            DOT_PREC: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, XS: tl.constexpr):
    """``X = XS * z`` of the key tile at ``start_n``, ``-inf`` on the keys a row does not see (tested only when
    ``MASKED``: the tiles that cross the diagonal; the others lie wholly below ``T`` and the diagonal).
    ``FOLD`` (no slopes, no row scale): one product by ``sm_scale * XS`` instead of two; ``XS`` is a power of two, so ``(q.k * sm_scale) * XS`` is the same
    number (the GPU's fused multiply-adds may round it differently in the last place)."""
    offs_n = start_n + tl.arange(0, BN)
    if MASKED:
        kmask = (offs_n < T)[:, None] & dmask[None, :]
    else:  # a tile before the diagonal lies below T: no bound test per key
        kmask = dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kmask, other=0.0)
    if FOLD:
        x = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * (sm_scale * XS)
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
def _lean_accumulate(a1, a2, x, tau, XS: tl.constexpr):
    """Add a ``[BM, BN]`` tile of ``X`` to elementwise partial sums of ``s = (X - tau)_+`` and of ``s^2``
    (sparsemax, ``XS == 1``: of ``1[s > 0]``): one fused multiply-add, one maximum, two adds a score."""
    s = tl.maximum(x - tau[:, None], 0.0)
    if XS == 1.0:
        return a1 + s, a2 + (s > 0).to(tl.float32)
    return a1 + s, a2 + s * s


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
    (across the diagonal) hold ``-inf``. (Before session 14, magnitudes below 2^-100 were first raised to
    2^-100: three more instructions a score, a third of what this stage spends on each one besides the
    merge.)"""
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
    kept as they are) is neither exact nor still. ``ACC``: elementwise ``[BM, BN]`` partial sums, reduced once
    per pass, instead of reducing every key tile. ``LEAN`` (the default): Newton's steps alone, from the two
    sums they need (elementwise), which a pass computes in a quarter of the instructions; a row is done when
    its step falls below ``tol``, or after 8 passes below ``1e-5`` (rounding noise). ``(tau, done)``: ``done``
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
            for start_n in range(0, diag, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, False, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2 = _lean_accumulate(a1, a2, x, tau, XS)
            for start_n in range(diag, hi, BN):
                x = _x_tile(q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs, True, STRICT,
                            HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BN, XS)
                a1, a2 = _lean_accumulate(a1, a2, x, tau, XS)
            s1 = tl.sum(a1, 1)
            s2 = tl.sum(a2, 1)
            if XS == 1.0:  # s2 holds the count
                step = tl.where(s2 > 0, (s1 - 1.0) / tl.where(s2 > 0, s2, 1.0), 0.0)
            else:
                step = tl.where(s1 > 0, (s2 - tl.sqrt(s2)) / tl.where(s1 > 0, s1, 1.0), 0.0)
            step = tl.maximum(step, 0.0)
            tau += step
            # Newton's steps from below shrink (by at least 0.6 a step far from tau* in a float64 model, then
            # quadratically; 8 passes at most to 1e-9 there), so a row still stepping after 8 passes is stepping
            # on rounding noise: from then on a step below 1e-5 ends it too.
            scale = 1.0 + tl.abs(tau)
            done = (step <= tol * scale) | ((it >= 8) & (step <= 1e-5 * scale)) | fixed
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


@triton.jit
def _store_level(LIST, row_off, m, cand, offset, cols, PACK: tl.constexpr, BNS: tl.constexpr):
    """Append the candidates ``cand`` of one level ``m`` (packed) to the rows' lists from slot ``offset``: the
    slot of a candidate is ``offset`` plus the number of candidates left of it in its row; the key is decoded
    from the packed bits."""
    pos = offset[:, None] + tl.cumsum(cand.to(tl.int32), 1) - 1
    bits = m.to(tl.int32, bitcast=True)
    key = (bits - ((bits >> PACK) << PACK)) * BNS + cols[None, :]  # the low PACK bits: the key tile
    tl.store(LIST + row_off[:, None] + pos, key, mask=cand)
    return offset + tl.sum(cand.to(tl.int32), 1)


@triton.jit
def _alibi_skip(q, K, KMAX, base, offs_m, offs_d, row_ok, rmask, bh, diag, sm_scale, slope, rs, D: tl.constexpr,
                XS: tl.constexpr, STEP: tl.constexpr):
    """The first key (a multiple of ``STEP``, at most ``diag``) from which a query tile's first stage must
    look, for an ALiBi head (``slope > 0``; 0 otherwise). The keys below it lie more than 1 below every row's
    own score ``X_rr`` (and a margin), so below ``X_max - 1``: outside the support, and outside any subset's
    support too (a set's threshold is at least its largest value minus 1). Left out, they change neither the
    subset's threshold nor the certificate nor the candidates (``_lists_start_kernel``'s argument, these keys
    lying below ``tau_sub - 2 eps``). Key ``j`` of row ``r`` has ``X_rj <= XS rs_r (|q_r| K_max sm_scale -
    slope (r - j))`` (Cauchy-Schwarz; ``KMAX`` the head's largest key norm), below ``X_rr - 1 - margin`` from
    some distance on; a row with ``rs_r <= 0`` allows no skip. The margin, ``2^-8 (|X_rr| + 1)``, is over six
    times the packing's ``2 eps`` and covers the rounding of these bounds; one more key is kept for the
    rounding of the distance."""
    lo = diag * 0
    if slope > 0:
        qf = q.to(tl.float32)
        kr = tl.load(K + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0).to(tl.float32)
        scale = XS * rs
        own = scale * tl.sum(qf * kr, 1) * sm_scale  # X_rr
        reach = tl.sqrt(tl.sum(qf * qf, 1)) * tl.load(KMAX + bh) * sm_scale
        bound = own - 1.0 - 0.00390625 * (tl.abs(own) + 1.0)
        # the distance from which X_rj <= bound: slope d >= reach - bound / scale
        dist = (reach - bound / tl.where(scale > 0, scale, 1.0)) / slope
        # per row, keys j <= last may be skipped (none where the scale is not positive; rows past T do not count)
        last = tl.where(row_ok, tl.where(scale > 0, offs_m.to(tl.float32) - dist, -1.0), float("inf"))
        # keys 0 .. n_skip - 1: one fewer than j <= last allows
        n_skip = tl.floor(tl.minimum(tl.maximum(tl.min(last, 0), 0.0), diag.to(tl.float32))).to(tl.int32)
        lo = (n_skip // STEP) * STEP
    return lo


@triton.jit
def _lists_start_kernel(Q, K, SL, RS, KMAX, TAU, NCAND, LIST, SAT, sm_scale, eps_scale, T, H,
                        STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                        DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                        BNS: tl.constexpr, SUBSET_ITERS: tl.constexpr, XS: tl.constexpr, PACK: tl.constexpr,
                        C: tl.constexpr, PAIRS: tl.constexpr, SKIP: tl.constexpr, RESCUE: tl.constexpr,
                        MAX_SAT: tl.constexpr):
    """The first stage (top 4 of every column, the keys ``j <= r``, or ``j < r`` when ``STRICT``) on packed
    values (``_pack``), and the candidate lists.

    Per row: ``NCAND`` the number ``n`` of candidates where the row is certified with at most ``C`` of them
    (listed), their keys in ``LIST[row, :n]``; 0 where it is left open; ``TAU`` a start below ``tau*``
    (``tau_sub - 2 eps``) for the open rows' Newton passes and the lists' own search.

    The packed values ``X'`` differ from the scores ``X`` by ``|X' - X| <= delta = |X| 2^(PACK - 23)`` (plus
    2^-100). The threshold ``tau(.)`` of a set of values is monotone in them and 1-Lipschitz in the sup norm
    (raise every value by ``delta``: ``tau`` rises by exactly ``delta``; monotonicity does the rest); only
    the values near the threshold count (those below it may be raised to it without changing it), so the
    ``delta`` that matters is that of ``|X| <= max(|X_max|, |tau|)``, up to terms of order ``delta^2``. With
    ``eps = (2^(PACK - 22) + 2^-14) max(|X'_max|, |tau_sub|) + 2^-90`` (twice the bound, to cover those
    terms, plus an allowance for the rounding differences between this kernel's scores and the finishing
    kernel's), ``tau_sub`` the threshold of the kept packed values:

    - the true subset's threshold ``tau_S`` lies within ``eps`` of ``tau_sub``; so ``tau_sub - 2 eps`` is
      below ``tau* >= tau_S`` (the start);
    - a key left out of column ``c`` has ``X <= m4'(c) + eps``; where ``max_c m4' + 2 eps <= tau_sub`` (or
      no key is left out), every left-out key is at or below ``tau_sub - eps <= tau_S``, outside the
      subset's support: then ``tau_S = tau*`` (certified);
    - a key of the support of a certified row, ``X > tau* >= tau_sub - eps``, is a kept value with ``X' >
      tau_sub - 2 eps``: the candidates (the kept values above that) hold the support, and every other key
      lies at least about ``eps`` below ``tau*``, so the finishing kernel's exact threshold over the
      candidates, from its own scores, is ``tau*``.

    ``SKIP`` (ALiBi heads, not ``STRICT``): the first stage starts at the key ``_alibi_skip`` gives, the keys
    below it lying below ``tau_sub - 2 eps`` (``KMAX`` the largest key norm of each head).

    ``RESCUE``: a row whose subset threshold is solved but that is not certified, with at most ``MAX_SAT``
    saturated columns (``m4' + 2 eps > tau_sub``: the only columns whose left-out keys may lie above
    ``tau_sub - eps``), is left for ``_rescue_kernel``: the candidates of its other columns go to its list,
    ``NCAND`` is ``-1 - n`` (``n`` of them), ``SAT`` the bit mask of its saturated columns. Every key left out
    of the other columns lies at or below ``tau_sub - eps``, so once the rescue adds every key of the saturated
    columns above ``tau_sub - 2 eps`` the list holds the support, and the argument above carries over.
    """
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi = _query_tile(
        Q, SL, RS, T, H, pid_m, bh, STRICT, HAS_SLOPES, HAS_RS, D, BD, BM)
    lo = diag * 0
    if SKIP:
        lo = _alibi_skip(q, K, KMAX, base, offs_m, offs_d, row_ok, row_ok[:, None] & dmask[None, :], bh, diag,
                         sm_scale, slope, rs, D, XS, 2 * BNS)
    m1, m2, m3, m4 = _column_top(q, K, base, offs_m, offs_d, dmask, T, sm_scale, slope, rs, lo, diag, hi, STRICT,
                                 HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BM, BNS, 4, XS, PACK, PAIRS)
    x_max = tl.max(m1, 1)
    empty = x_max == float("-inf")
    tau, solved = _subset_root(m1, m2, m3, m4, x_max, empty, row_ok, 4, SUBSET_ITERS, XS)
    eps = tl.where(empty, 0.0, eps_scale * tl.maximum(tl.abs(x_max), tl.abs(tau)) + 8.077935669463161e-28)
    low = tau - 2.0 * eps
    certified = solved & (empty == 0) & row_ok & ((tl.max(m4, 1) + 2.0 * eps <= tau) |
                                                  (_n_keys(offs_m, STRICT) <= 4 * BNS))
    # The columns whose left-out keys may matter, and the rows the rescue may finish (RESCUE).
    sat = (m4 + 2.0 * eps[:, None] > tau[:, None]) & (certified[:, None] == 0)
    rescuable = certified != certified  # all False
    if RESCUE:
        n_sat = tl.sum(sat.to(tl.int32), 1)
        rescuable = solved & (empty == 0) & row_ok & (certified == 0) & (n_sat <= MAX_SAT)
    kept = certified[:, None] | (rescuable[:, None] & (sat == 0))
    # The candidates per level (-inf never passes: ``low`` is finite on a non-empty row), counted first so
    # that a row with more than C of them stores nothing and stays open.
    c1 = (m1 > low[:, None]) & kept
    c2 = (m2 > low[:, None]) & kept
    c3 = (m3 > low[:, None]) & kept
    c4 = (m4 > low[:, None]) & kept
    total = (tl.sum(c1.to(tl.int32), 1) + tl.sum(c2.to(tl.int32), 1) + tl.sum(c3.to(tl.int32), 1) +
             tl.sum(c4.to(tl.int32), 1))
    listed = certified & (total <= C)
    pending = rescuable & (total <= C)
    stored = listed | pending
    if tl.max(stored.to(tl.int32), 0) > 0:
        cols = tl.arange(0, BNS)
        row_off = (bh * T + offs_m).to(tl.int64) * C
        slot = tl.zeros([BM], dtype=tl.int32)
        slot = _store_level(LIST, row_off, m1, c1 & stored[:, None], slot, cols, PACK, BNS)
        slot = _store_level(LIST, row_off, m2, c2 & stored[:, None], slot, cols, PACK, BNS)
        slot = _store_level(LIST, row_off, m3, c3 & stored[:, None], slot, cols, PACK, BNS)
        slot = _store_level(LIST, row_off, m4, c4 & stored[:, None], slot, cols, PACK, BNS)
    tl.store(TAU + bh * T + offs_m, tl.where(empty, float("inf"), low), mask=row_ok)
    tl.store(NCAND + bh * T + offs_m, tl.where(listed, total, tl.where(pending, -1 - total, 0)), mask=row_ok)
    if RESCUE:
        bit = tl.full([BM, BNS], 1, tl.int64) << tl.arange(0, BNS).to(tl.int64)[None, :]
        tl.store(SAT + bh * T + offs_m, tl.sum(tl.where(sat, bit, 0), 1), mask=row_ok)


@triton.jit
def _rescue_kernel(Q, K, SL, RS, TAU, NCAND, LIST, SAT, ROWS, COUNT, sm_scale, T, H, STRICT: tl.constexpr,
                   HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                   BNS: tl.constexpr, C: tl.constexpr, XS: tl.constexpr, RB: tl.constexpr, NK: tl.constexpr):
    """The rows ``_lists_start_kernel`` left to the rescue (``NCAND = -1 - n``; ``ROWS[bh, :COUNT[bh]]``
    gathered), ``RB`` a program, one at a time: every visible key of each saturated column (``SAT``'s bits;
    keys ``j = c mod BNS``), ``NK`` at a time, its score computed as ``_list_scores`` does, appended to the
    row's list where ``X > TAU`` (``tau_sub - 2 eps``). ``NCAND`` becomes the list's length, or 0 (the row
    stays open for the Newton passes) past ``C``."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    count = tl.load(COUNT + bh)
    base = bh.to(tl.int64) * T * D
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    offs_k = tl.arange(0, NK)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    for i in range(RB):
        slot = pid * RB + i
        if slot < count:
            r = tl.load(ROWS + bh * (T + 1) + slot)
            q = tl.load(Q + base + r * D + offs_d, mask=dmask, other=0.0).to(tl.float32)
            low = tl.load(TAU + bh * T + r)
            n = -1 - tl.load(NCAND + bh * T + r)
            mask = tl.load(SAT + bh * T + r)
            rs = 1.0
            if HAS_RS:
                rs = tl.load(RS + bh * T + r)
            n_vis = r + 1
            if STRICT:
                n_vis = r
            row_off = (bh * T + r).to(tl.int64) * C
            for c in range(BNS):
                if ((mask >> c) & 1) != 0:
                    for start in range(0, n_vis, BNS * NK):
                        idx = start + c + BNS * offs_k
                        keep = idx < n_vis
                        k = tl.load(K + base + idx[:, None] * D + offs_d[None, :],
                                    mask=keep[:, None] & dmask[None, :], other=0.0).to(tl.float32)
                        z = tl.sum(q[None, :] * k, 1) * sm_scale
                        if HAS_SLOPES:
                            z = z - slope * (r - idx).to(tl.float32)
                        if HAS_RS:
                            z = z * rs
                        cand = keep & (z * XS > low)
                        pos = n + tl.cumsum(cand.to(tl.int32), 0) - 1
                        tl.store(LIST + row_off + pos, idx, mask=cand & (pos < C))
                        n += tl.sum(cand.to(tl.int32), 0)
            tl.store(NCAND + bh * T + r, tl.where(n <= C, n, 0))


@triton.jit
def _list_keys(LIST, bh, T, offs_r, rows_in, count, C: tl.constexpr):
    """``(keep, idx)``: the first ``count`` slots of the lists of the rows ``offs_r`` where ``rows_in``
    (``[BR, C]``) and their keys (-1 elsewhere)."""
    slots = tl.arange(0, C)
    keep = rows_in[:, None] & (slots[None, :] < count[:, None])
    idx = tl.load(LIST + (bh * T + offs_r).to(tl.int64)[:, None] * C + slots[None, :], mask=keep, other=-1)
    return keep, idx


@triton.jit
def _list_scores(Q, K, SL, RS, idx, keep, rows_in, sm_scale, T, H, bh, offs_r, row_ok,
                 HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                 BR: tl.constexpr):
    """The keys ``idx`` (``[BR, C]``, where ``keep``) of the rows ``offs_r``, gathered, and their scores:
    ``(base, offs_d, dmask, gather, gmask, q, k, zb, z, rs)``, ``gather``/``gmask`` the offsets and mask of
    their ``[BR, C, BD]`` key (and value) rows, ``q`` (the rows ``rows_in``) and ``k`` in fp32, ``z`` the
    scores recomputed (``score_tile``'s arithmetic, in fp32 products) and ``zb`` before the row scale
    ``rs``."""
    base = bh.to(tl.int64) * T * D
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    q = tl.load(Q + base + offs_r[:, None] * D + offs_d[None, :], mask=rows_in[:, None] & dmask[None, :],
                other=0.0).to(tl.float32)
    gather = idx[:, :, None] * D + offs_d[None, None, :]
    gmask = keep[:, :, None] & dmask[None, None, :]
    k = tl.load(K + base + gather, mask=gmask, other=0.0).to(tl.float32)
    zb = tl.sum(q[:, None, :] * k, 2) * sm_scale
    if HAS_SLOPES:
        zb = zb - tl.load(SL + bh % H) * (offs_r[:, None] - idx).to(tl.float32)
    rs = rows_scale(RS, bh, T, offs_r, row_ok, HAS_RS, BR)
    z = zb
    if HAS_RS:
        z = zb * rs[:, None]
    return base, offs_d, dmask, gather, gmask, q, k, zb, z, rs


@triton.jit
def _list_rows(Q, K, SL, RS, TAU, LIST, sm_scale, T, H, n_iter, bh, offs_r, row_ok, ncand, listed,
               HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
               C: tl.constexpr, XS: tl.constexpr, SORT: tl.constexpr = False):
    """The listed rows ``offs_r`` (``ncand > 0`` candidates; shared with Sieve's list kernel):
    ``(base, offs_d, dmask, keep, idx, gather, gmask, z, x, tau)``: the candidates (``_list_keys``; with
    ``SORT`` in descending key order, the latest first, the empty slots' -1 last), their scores
    (``_list_scores``), ``x = XS z`` (``-inf`` off ``keep``) and ``tau`` the threshold over them: the
    exact/Newton steps of the Newton passes from the larger of the two lower bounds ``TAU`` and ``X_max - 1``,
    a row stopping once its exact root is accepted (0 off ``listed``)."""
    keep, idx = _list_keys(LIST, bh, T, offs_r, listed, ncand, C)
    if SORT:  # keep is the first ncand slots either way: the keys are >= 0, the empty slots -1
        idx = tl.sort(idx, 1, descending=True)
    base, offs_d, dmask, gather, gmask, q, k, zb, z, rs = _list_scores(
        Q, K, SL, RS, idx, keep, listed, sm_scale, T, H, bh, offs_r, row_ok, HAS_SLOPES, HAS_RS, D, BD, BR)
    x = tl.where(keep, z * XS, float("-inf"))
    x_max = tl.max(x, 1)
    start = tl.load(TAU + bh * T + offs_r, mask=listed, other=0.0)
    tau = tl.where(listed, tl.maximum(start, x_max - 1.0), 0.0)
    solved = listed == 0
    pending = tl.sum(listed.to(tl.int32), 0)
    it = 0
    while (it < n_iter) & (pending > 0):
        s1, s2, cnt, x_low = _newton_tile(x, tau)
        ok = _exact_ok(s1, s2, cnt, x_low, tau, XS)
        tau = tl.where(solved, tau, tau + _step(s1, s2, cnt, x_low, tau, XS))
        solved = solved | ok
        pending = tl.sum((solved == 0).to(tl.int32), 0)
        it += 1
    return base, offs_d, dmask, keep, idx, gather, gmask, z, x, tau


@triton.jit
def _lists_output_kernel(Q, K, V, Out, U, SL, RS, TAU, M, L, NCAND, LIST, sm_scale, T, H, n_iter,
                         STORE_U: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr,
                         BD: tl.constexpr, BR: tl.constexpr, C: tl.constexpr, XS: tl.constexpr):
    """The listed rows (``NCAND > 0``), ``BR`` a program: their candidates' keys gathered, the exact scores
    recomputed and ``tau*`` over them in registers (``_list_rows``), then the output and what the backward of
    ``RowwiseAttention`` reads: ``M = sum s``, ``L = sum w`` (sparsemax: ``M = |S|``, ``L = sum s``), ``U =
    sum s v`` (sparsemax: the support's indicator for ``s``) and ``TAU``."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    offs_r = pid * BR + tl.arange(0, BR)
    row_ok = offs_r < T
    ncand = tl.load(NCAND + bh * T + offs_r, mask=row_ok, other=0)
    listed = ncand > 0
    if tl.max(listed.to(tl.int32), 0) > 0:
        base, offs_d, dmask, keep, idx, gather, gmask, z, x, tau = _list_rows(
            Q, K, SL, RS, TAU, LIST, sm_scale, T, H, n_iter, bh, offs_r, row_ok, ncand, listed, HAS_SLOPES, HAS_RS,
            D, BD, BR, C, XS, False)
        s = tl.maximum(x - tau[:, None], 0.0)
        if XS == 1.0:  # sparsemax: the weights are s, the backward's are the support's indicator
            w = s
            s = (s > 0).to(tl.float32)
        else:
            w = s * s
        den = tl.sum(w, 1)
        v = tl.load(V + base + gather, mask=gmask, other=0.0).to(tl.float32)
        out = tl.sum(w[:, :, None] * v, 1) / tl.where(den > 0, den, 1.0)[:, None]
        out_off = base + offs_r[:, None] * D + offs_d[None, :]
        out_mask = listed[:, None] & dmask[None, :]
        tl.store(Out + out_off, out.to(Out.dtype.element_ty), mask=out_mask)
        if STORE_U:
            tl.store(U + out_off, tl.sum(s[:, :, None] * v, 1), mask=out_mask)
        tl.store(M + bh * T + offs_r, tl.sum(s, 1), mask=listed)
        tl.store(L + bh * T + offs_r, den, mask=listed)
        tl.store(TAU + bh * T + offs_r, tau, mask=listed)


@triton.jit
def _open_output_kernel(Q, K, V, Out, U, SL, RS, TAU, M, L, ROWS, COUNT, sm_scale, T, H,
                        STORE_U: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                        DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, POWER: tl.constexpr):
    """The output of the rows left open (``ROWS[bh, :COUNT[bh]]``, gathered as in ``_newton_kernel``) over all
    their keys, by the forward tiles of ``_rowwise.py`` (``ENTMAX``), with the same side outputs."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    n_open = tl.load(COUNT + bh)
    if pid_m * BM < n_open:
        base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs = gathered_rows(
            Q, SL, RS, ROWS, n_open, pid_m, bh, T, H, HAS_SLOPES, HAS_RS, D, BD, BM)
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=0.0)
        first = tl.min(tl.where(row_ok, offs_m, T), 0)
        last = tl.max(tl.where(row_ok, offs_m, 0), 0)
        zero = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        # (MECH 4 is _rowwise.ENTMAX; the keys below the tile's first row are visible to all its rows)
        acc, acc_u, m_i, l_i, s_i = _fwd_loops(acc, acc, zero, zero, zero, q, K, V, base, (first // BN) * BN,
                                               last + 1, offs_m, offs_d, dmask, T, sm_scale, slope, rs, tau, False,
                                               4, POWER, STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN)
        out_off = base + offs_m[:, None] * D + offs_d[None, :]
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + out_off, acc.to(Out.dtype.element_ty), mask=rmask)
        if STORE_U:
            tl.store(U + out_off, acc_u, mask=rmask)
        tl.store(M + bh * T + offs_m, s_i, mask=row_ok)
        tl.store(L + bh * T + offs_m, l_i, mask=row_ok)


# alpha -> the factor X = (alpha - 1) z of the threshold kernel; the output pass's POWER is 1 / (alpha - 1).
_ALPHAS = {1.5: 0.5, 2.0: 1.0}


def _check_alpha(alpha) -> float:
    alpha = float(alpha)
    if alpha not in _ALPHAS:
        raise ValueError(f"the entmax kernels implement alpha = 1.5 and 2 (sparsemax) only, got {alpha}")
    return alpha


# Launch settings of the threshold search per head-dim block (``Problem.block_d``). ``split`` False: one
# kernel, query tile ``bm``, key tiles ``bn`` in the Newton passes and ``bn_subset`` in the first stage (the
# subset's columns), ``warps``, ``stages``. ``split`` True: the first stage with those settings, then the
# Newton passes over the open rows only, gathered, with ``newton = (bm, bn, warps, stages)``. The search:
# ``subset`` (0 the ``TOPK`` largest tile maxima, d in 1..4 the top d of every column), ``acc`` (elementwise
# partial sums in the Newton passes) and ``fold`` (one product by ``sm_scale * XS`` where there are no slopes
# and no row scale). ``TUNING`` (None, or a dict of some of these keys, which replace the defaults) overrides
# them: for benchmarks and tests; with ``old`` True it starts from the search and launch settings before
# session 11 (one kernel, the top-16 start, 128-row tiles of 8 warps up to head dim 64) instead. A query tile
# must be a multiple of its kernel's key tiles. ``lists`` (True by default, False with ``old``): the forward of
# ``entmax_attention`` finishes the certified rows from their candidate lists (``_lists_forward``); False:
# the threshold, then the output pass of ``_rowwise.py`` over all keys (the path before session 12). ``lean``
# (True by default, False with ``old``): the Newton passes accumulate only what Newton's step needs (session
# 14; before, also the count and least score of the support, for the exact root). ``pairs`` (True by default,
# False with ``old``): the top-4 first stage merges two key tiles a step (``_insert_pair``, session 15); the
# kept values are the same, bit for bit.
TUNING: dict | None = None
_OLD = dict(old=True)
# ``LENGTHBENCH_ENTMAX_DEFAULTS`` (a JSON object of some of these keys) changes the defaults themselves, under
# ``TUNING``: to run the GPU tests, which set ``TUNING`` of their own, with a setting that is not yet the default.
_ENV = "LENGTHBENCH_ENTMAX_DEFAULTS"


def _env_defaults() -> dict:
    text = os.environ.get(_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{_ENV} is not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{_ENV} must be a JSON object of entmax tuning keys, got {text!r}")
    return value


def _config(block_d: int) -> dict:
    tuning = dict(TUNING or {})
    small = block_d <= 64
    old = tuning.pop("old", False)
    if old:
        config = dict(bm=128, bn=64, bn_subset=64, warps=8) if small else dict(bm=32, bn=32, bn_subset=32, warps=4)
        config.update(stages=2, newton=(128, 64, 8, 2) if small else (32, 32, 4, 2), split=False, subset=0,
                      acc=False, fold=False, lists=False, lean=False, pairs=False)
    elif small:
        # Chosen on the H100 by benchmarks/entmax_variants.py (session 11): the four levels of 64 columns
        # spill 16 bytes here, which costs less than 8-warp tiles without spills (21 against 25 ms for the
        # first stage at D 32).
        # newton: 3 stages since session 23 (the open rows' walks: entmax's forward 30.2 -> 29.0 ms, Sieve's
        # 34.4 -> 33.1 at L 65,536, D 32; 32-row tiles were slower on a trained model's wider rows)
        config = dict(bm=64, bn=64, bn_subset=64, warps=4, stages=2, newton=(64, 32, 4, 3), split=True, subset=4,
                      acc=False, fold=True, lean=True, pairs=True)
    else:  # the single-view kernels' tiles, not measured
        config = dict(bm=32, bn=32, bn_subset=32, warps=4, stages=2, newton=(32, 32, 4, 2), split=True, subset=4,
                      acc=False, fold=True, lean=True, pairs=True)
    if not old:
        # The forward of entmax_attention (alpha 1.5 and 2) by candidate lists: ``list_size`` C slots a row,
        # ``finish`` (rows a program, warps) of the kernel that finishes the listed rows (not yet measured).
        # Sieve's backward: ``list_backward`` (elements of a program's [rows, C, BD] blocks, warps) over the
        # listed rows (``sieve._lists_bwd_kernel``), ``open_backward`` (bm, bn, warps, stages) over the open
        # ones (``sieve._open_bwd_kernel``: the stick-breaking backward's tiles); these defaults measured in
        # session 13 (``results/kernels/session13/``: the backward 52 ms at L 65,536), no other setting tried.
        config.update(lists=True, list_size=64, finish=(max(1, 128 // block_d), 4), list_backward=(4096, 4),
                      open_backward=(64, 64, 4, 2) if small else (32, 32, 4, 2),
                      alibi_skip=True,  # ALiBi heads: the first stage skips the keys below X_rr - 1 (session 22)
                      # rows not certified with at most max_sat saturated columns: those columns' keys scanned
                      # into the lists (_rescue_kernel; session 22; the default since session 23: entmax's
                      # forward 34.0 -> 30.5 ms, Sieve's 50.5 -> 34.7 at L 65,536, D 32 on the H100); (rows a
                      # program, keys a step, warps)
                      rescue=True, max_sat=4, rescue_launch=(16, 64, 2),
                      # Sieve's listed rows: the candidates sorted by key and the stick's suffix sums a
                      # cumulative sum (``finish`` rows a program) instead of [rows, C, C] comparisons (2 rows a
                      # program at C 64); session 23: Sieve's forward 34.4 -> 31.9 ms at L 65,536, D 32
                      sieve_scan=True,
                      # Sieve's open rows' forward walk (_open_kernel): (bm, bn, warps, stages), None: ``newton``'s
                      sieve_open=None,
                      # Few open rows (session 24): where at least ``few_open[1]`` tokens and at most
                      # ``few_open[0]`` open rows a multiprocessor (all heads together), the open rows' kernels
                      # take the ``*_few`` tiles (None: their usual ones). A tile's walk over its keys is then the
                      # critical path (the longest walk, the last rows', alone on its multiprocessor), so
                      # fewer rows a tile finish sooner; with many open rows larger tiles share each key tile
                      # among more rows. The count is copied to the host behind the first stage and read
                      # before the first launch that needs it (``_OpenCount``); None: never read.
                      few_open=(256, 16384), newton_few=None,
                      # session 24 (benchmarks/entmax_variants.py, L 65,536, D 32): Sieve's forward 30.68 -> 29.26
                      # ms; 32-row tiles 29.71; the Newton kernel's few-row tiles were slower (30.3-32.4 ms)
                      sieve_open_few=(16, 16, 2, 3),
                      # Many open rows (session 25): a tile runs as long as its slowest row, so the open rows are
                      # gathered again between phases. ``newton_phases``: passes a launch of the Newton kernel
                      # (``_newton_launch``); ``sieve_phases``: keys a launch of Sieve's open walk
                      # (``sieve._open_walk``); None: one launch. Not where the open rows are few, nor below
                      # ``phases_from`` tokens (short rows: a launch more costs more than it saves).
                      # session 25, a trained MQMTAR Sieve + NoPE model's sample at 65,536 tokens on the H100:
                      # 206.7 ms -> (2,) 202.2 (the Newton kernel 37.1 -> 31.6 ms); the walk (512, 2048, 8192)
                      # 167.5 (68.7 -> 28.5 ms); (2,) with (2048, 8192) 163.5
                      newton_phases=(2,), sieve_phases=(512, 2048, 8192), phases_from=8192)
    defaults = {} if old else _env_defaults()
    unknown = sorted(set(defaults) - set(config))
    if unknown:
        raise ValueError(f"{_ENV}: unknown keys {unknown}; the keys are {sorted(config)}")
    return {**config, **defaults, **tuning}


_PINNED: dict = {}  # a pinned host int64 a device, for _OpenCount's copy
_SMS: dict = {}  # multiprocessors a device


class _OpenCount:
    """Whether a launch's open rows (``count`` [BH], ``_open_rows``) are few (``few_open``): their total is
    copied to a pinned host buffer behind the kernels queued so far, without waiting, and read at the first
    :meth:`few`, which waits for that copy only (the kernels queued after it keep the device busy). Never read
    (always not few) off CUDA, below ``few_open[1]`` tokens, while a CUDA graph is captured, or without
    ``few_open``."""

    def __init__(self, count: torch.Tensor, tokens: int, config: dict):
        self._few, self._event, self._limit = False, None, 0
        setting = config.get("few_open")
        if not setting or not count.is_cuda or tokens < int(setting[1]):
            return
        if torch.cuda.is_current_stream_capturing():
            return
        device = count.device
        if device not in _PINNED:
            _PINNED[device] = torch.empty((), dtype=torch.int64, pin_memory=True)
            _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
        self._limit = int(setting[0]) * _SMS[device]
        self._host = _PINNED[device]
        self._host.copy_(count.sum(dtype=torch.int64), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def few(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
            self._few, self._event = int(self._host) <= self._limit, None
        return self._few



# _row_cumsum's chunk: one scan along rows this long, one along the chunks' totals
_SCAN_CHUNK = 256


def _row_cumsum(flags: torch.Tensor) -> torch.Tensor:
    """``torch.cumsum(flags, 1)`` as int32, for ``[BH, T]`` with few rows and long ones: in chunks of
    ``_SCAN_CHUNK`` and then over the chunks' totals. A scan along a long innermost dimension takes a block a row
    (84 us for 16 rows of 65,536 on the H100); chunked, the rows' work is spread over many blocks."""
    heads, tokens = flags.shape
    if tokens <= 4 * _SCAN_CHUNK:
        return torch.cumsum(flags, 1, dtype=torch.int32)
    chunks = -(-tokens // _SCAN_CHUNK)
    padded = torch.zeros(heads, chunks * _SCAN_CHUNK, device=flags.device, dtype=torch.int32)
    padded[:, :tokens] = flags
    inner = torch.cumsum(padded.view(heads, chunks, _SCAN_CHUNK), 2, dtype=torch.int32)
    totals = inner[:, :, -1]
    inner += (torch.cumsum(totals, 1, dtype=torch.int32) - totals).unsqueeze(2)  # the chunks before each
    return inner.view(heads, -1)[:, :tokens]


def _open_rows(done: torch.Tensor):
    """The rows left open (``done == 0``) per head, gathered in order: ``(rows [BH, T + 1] int32, count [BH]
    int32)``, ``rows[bh, :count[bh]]`` the open rows of head ``bh`` (the last column takes the others). On the
    device, no synchronisation."""
    heads, tokens = done.shape
    open_ = done == 0
    slot = torch.where(open_, _row_cumsum(open_) - 1, tokens)
    rows = torch.zeros(heads, tokens + 1, device=done.device, dtype=torch.int32)
    order = torch.arange(tokens, device=done.device, dtype=torch.int32).expand(heads, tokens)
    rows.scatter_(1, slot.long(), order)
    return rows, open_.sum(1, dtype=torch.int32)


def entmax_threshold(q, k, *, slopes=None, row_scale=None, sm_scale=None, strict=False, tol=1e-6,
                     max_iter=40, alpha=1.5) -> torch.Tensor:
    """``tau`` ``[B, H, T]`` fp32 of alpha-entmax (1.5 or 2) over each row's visible keys (``j < r`` when
    ``strict``; ``+inf`` for a row with no key), on the scale ``X = (alpha - 1) z``. No gradient."""
    xs = _ALPHAS[_check_alpha(alpha)]
    pb = Problem(q, k, k, slopes, row_scale, sm_scale)
    config = _config(pb.block_d)
    bm, bn, bns, split = config["bm"], config["bn"], config["bn_subset"], config["split"]
    subset = int(config["subset"])
    nbm, nbn, nwarps, nstages = config["newton"]
    if bm % bns or (not split and bm % bn) or (split and nbm % nbn) or not 0 <= subset <= 4:
        raise ValueError(f"entmax threshold: bad launch settings {config}")
    tau = pb.rows()
    args = (pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), tau)
    common = dict(STRICT=bool(strict), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                  FOLD=bool(config["fold"]) and pb.slopes is None and pb.row_scale is None, DOT_PREC=pb.dot_prec,
                  D=pb.head_dim, BD=pb.block_d, XS=xs)
    first = dict(BNS=bns, SUBSET=subset, TOPK=16, SUBSET_ITERS=16 if subset else 8, PAIRS=bool(config["pairs"]))
    grid = (triton.cdiv(pb.tokens, bm), pb.bh)
    if not split:
        _threshold_kernel[grid](*args, pb.sm_scale, pb.tokens, pb.heads, float(tol), int(max_iter), BM=bm, BN=bn,
                                ACC=bool(config["acc"]), LEAN=bool(config["lean"]), num_warps=config["warps"],
                                num_stages=config["stages"], **first, **common)
        return tau
    done = torch.empty(tau.shape, device=tau.device, dtype=torch.int8)
    _start_kernel[grid](*args, done, pb.sm_scale, pb.tokens, pb.heads, BM=bm, num_warps=config["warps"],
                        num_stages=config["stages"], **first, **common)
    rows, count = _open_rows(done.view(pb.bh, pb.tokens))
    _newton_launch(pb, args, rows, count, tol, max_iter, config, (nbm, nbn, nwarps, nstages), common)
    return tau


def _phases(config: dict, key: str, tokens: int) -> list[int]:
    """The phases of ``config[key]`` (``newton_phases``, ``sieve_phases``) at ``tokens``: none below
    ``phases_from`` tokens (short rows: a launch more costs more than it saves)."""
    if tokens < int(config.get("phases_from") or 0):
        return []
    return [int(p) for p in (config.get(key) or ())]


def _newton_launch(pb: Problem, args, rows, count, tol, max_iter, config, tiles, common):
    """The Newton passes over the open rows ``rows, count``: one launch, or with ``newton_phases`` (passes a
    launch) one launch a phase over the rows not yet done, gathered again after each (a tile runs as many
    passes as its slowest row: regathered, the rows that end early stop taking a tile's passes), the last
    phase up to ``max_iter``."""
    nbm, nbn, nwarps, nstages = tiles
    phases = _phases(config, "newton_phases", pb.tokens)
    launch = dict(ACC=bool(config["acc"]), LEAN=bool(config["lean"]), BM=nbm, BN=nbn, num_warps=nwarps,
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


# The packed key-tile index takes at most this many mantissa bits (the margin eps grows as 2^bits: 12 bits is
# a relative 2^-10); longer sequences take the threshold and output pass instead.
_PACK_MAX = 12


def _pack_bits(tokens: int, bns: int) -> int:
    """Mantissa bits that hold the index of every key tile of ``bns`` keys (at least 1)."""
    return max(1, (triton.cdiv(tokens, bns) - 1).bit_length())


# The packed bits the kernels are compiled for: ``PACK`` is a constant of the list kernels (one instruction a
# score), so every value is a compilation of its own, and the needed bits change at every doubling of the
# length. Session 15's logs show 7-8 s at each of MQMTAR's scored lengths up to 256x (200 samples), where the
# runs before the lists (session 14) took 0.1 s at 2x-16x; with these widths session 18's took 0.05-0.3 s at
# 2x-32x (the H100, 200 samples; 7.9-14.5 s at 1x, 64x and 256x where a width compiled). Rounding up keeps
# four; more bits than a length needs are as exact (the packed values move by at most 2^-17 relative up to
# 4,096 tokens, within the lists' margin of 2^-14).
_PACK_WIDTHS = (6, 8, 10, _PACK_MAX)


def _pack_launch(bits: int) -> int:
    """The compiled ``PACK`` for ``bits`` needed bits (:data:`_PACK_WIDTHS`; ``bits`` itself past them)."""
    return next((width for width in _PACK_WIDTHS if width >= bits), bits)


def _lists_apply(q) -> bool:
    """Whether ``entmax_attention`` takes the list forward for ``q``: ``lists`` on, the split search with the
    top-4 first stage, and key tiles that fit in ``_PACK_MAX`` bits."""
    if q.dim() != 4 or q.shape[-1] < 1 or q.shape[-2] < 1:
        return False
    config = _config(max(16, triton.next_power_of_2(q.shape[-1])))
    return (bool(config.get("lists")) and bool(config["split"]) and int(config["subset"]) == 4
            and _pack_bits(q.shape[-2], config["bn_subset"]) <= _PACK_MAX)


def _lists_start(pb: Problem, xs: float, strict: bool, tol=1e-6, max_iter=40):
    """The first stage with the lists and the Newton passes over the open rows (shared with Sieve):
    ``(tau, ncand, lists, rows, count, config, opened)``, ``tau`` ``[B, H, T]`` final on the open rows and a
    start below ``tau*`` on the listed ones, ``ncand`` ``[BH, T]`` int32 the number of candidates of the listed
    rows (0 on the open rows, and the rows that see no key), ``lists`` ``[BH, T, C]`` their keys, ``rows,
    count`` the open rows (``_open_rows``), ``opened`` their ``_OpenCount``. Every launch setting is checked
    before the first launch."""
    config = _config(pb.block_d)
    bm, bns, size = config["bm"], config["bn_subset"], int(config["list_size"])
    pack = _pack_launch(_pack_bits(pb.tokens, bns))
    # open-row tiles: (rows, keys a step, warps, stages), the rows a multiple of the keys
    tiles = [config[key] for key in ("newton", "newton_few", "sieve_open", "sieve_open_few") if config[key]]
    if (bm % bns or pack > _PACK_MAX or size & (size - 1) or any(len(t) != 4 or t[0] % t[1] for t in tiles)
            or (config["few_open"] and len(config["few_open"]) != 2)
            or any(int(p) < 1 for key in ("newton_phases", "sieve_phases") for p in (config[key] or ()))):
        raise ValueError(f"entmax lists: bad launch settings {config} for T {pb.tokens}")
    tau = pb.rows()
    ncand = torch.empty(pb.bh, pb.tokens, device=tau.device, dtype=torch.int32)
    lists = torch.empty(pb.bh, pb.tokens, size, device=tau.device, dtype=torch.int32)
    sl, rs = pb.opt(pb.slopes), pb.opt(pb.row_scale)
    common = dict(STRICT=bool(strict), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                  FOLD=bool(config["fold"]) and pb.slopes is None and pb.row_scale is None, DOT_PREC=pb.dot_prec,
                  D=pb.head_dim, BD=pb.block_d, XS=xs)
    skip = bool(config["alibi_skip"]) and pb.slopes is not None and not strict
    # the largest key norm of each head, for _alibi_skip's bound
    kmax = pb.k.float().norm(dim=-1).amax(-1).reshape(-1) if skip else tau
    rescue = bool(config["rescue"])
    sat = torch.empty(pb.bh, pb.tokens, device=tau.device, dtype=torch.int64) if rescue else tau
    _lists_start_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
        pb.q, pb.k, sl, rs, kmax, tau, ncand, lists, sat, pb.sm_scale, 2.0 ** (pack - 22) + 2.0 ** -14,
        pb.tokens, pb.heads, BM=bm, BNS=bns, SUBSET_ITERS=16, PACK=pack, C=size, PAIRS=bool(config["pairs"]),
        SKIP=skip, RESCUE=rescue, MAX_SAT=int(config["max_sat"]), num_warps=config["warps"],
        num_stages=config["stages"], **common)
    if rescue:
        rb, nk, rwarps = config["rescue_launch"]
        pending, n_pending = _open_rows(ncand >= 0)  # the rows left to the rescue (NCAND < 0)
        _rescue_kernel[(triton.cdiv(pb.tokens, rb), pb.bh)](
            pb.q, pb.k, sl, rs, tau, ncand, lists, sat, pending, n_pending, pb.sm_scale, pb.tokens, pb.heads,
            STRICT=bool(strict), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, D=pb.head_dim,
            BD=pb.block_d, BNS=bns, C=size, XS=xs, RB=rb, NK=nk, num_warps=rwarps)
    rows, count = _open_rows(ncand != 0)
    newton_asks = bool(config["newton_few"] or _phases(config, "newton_phases", pb.tokens))
    wanted = newton_asks or (strict and (config["sieve_open_few"] or _phases(config, "sieve_phases", pb.tokens)))
    opened = _OpenCount(count, pb.tokens, config if wanted else {})
    # few open rows (read once, where a setting asks): their own tiles, and no phases (they all run at once)
    few = newton_asks and opened.few()
    tiles = tuple(config["newton_few"] if few and config["newton_few"] else config["newton"])
    newton_config = dict(config, newton_phases=None) if few else config
    _newton_launch(pb, (pb.q, pb.k, sl, rs, tau), rows, count, tol, max_iter, newton_config, tiles, common)
    return tau, ncand, lists, rows, count, config, opened


def _lists_forward(pb: Problem, alpha: float, store_u: bool, tol=1e-6, max_iter=40):
    """The list forward of alpha-entmax attention (causal): ``(out, tau, m, den, u, ncand, lists)``, ``m, den,
    u`` as ``RowwiseAttention.forward`` keeps them for ``ENTMAX`` (``u`` None unless ``store_u``), ``ncand``
    ``[BH, T]`` int32 the number of candidates of the rows finished from their lists (0: the rows left open)
    and ``lists`` ``[BH, T, C]`` their keys (the first ``ncand`` of a row; for tests).

    Four launches: the first stage with the lists (``_lists_start_kernel``), the Newton passes over the open
    rows (``_newton_kernel``), the listed rows' threshold and output (``_lists_output_kernel``), the open
    rows' output over all their keys (``_open_output_kernel``). The last two write disjoint rows."""
    xs = _ALPHAS[alpha]
    tau, ncand, lists, rows, count, config, _ = _lists_start(pb, xs, False, tol, max_iter)
    nbm, nbn, nwarps, nstages = config["newton"]
    rows_per, finish_warps = config["finish"]
    sl, rs = pb.opt(pb.slopes), pb.opt(pb.row_scale)
    common = dict(HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, D=pb.head_dim,
                  BD=pb.block_d)
    out = torch.empty_like(pb.q)
    m, den = pb.rows(), pb.rows()
    u = torch.empty(pb.q.shape, device=pb.q.device, dtype=torch.float32) if store_u else None
    _lists_output_kernel[(triton.cdiv(pb.tokens, rows_per), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(u), sl, rs, tau, m, den, ncand, lists, pb.sm_scale, pb.tokens, pb.heads,
        2 * lists.shape[-1] + 8, STORE_U=store_u, BR=rows_per, C=lists.shape[-1], XS=xs,
        num_warps=finish_warps, **common)
    _open_output_kernel[(triton.cdiv(pb.tokens, nbm), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(u), sl, rs, tau, m, den, rows, count, pb.sm_scale, pb.tokens, pb.heads,
        STORE_U=store_u, DOT_PREC=pb.dot_prec, BM=nbm, BN=nbn, POWER=1.0 / (alpha - 1.0), num_warps=nwarps,
        num_stages=nstages, **common)
    return out, tau, m, den, u, ncand, lists


class EntmaxListsAttention(torch.autograd.Function):
    """alpha-entmax attention by ``_lists_forward``; it saves the state ``RowwiseAttention`` saves for
    ``ENTMAX`` (with ``tau`` as its ``[B, H, T]`` threshold, no gradient), so the backward is its own
    (``rowwise_backward``). Gradients flow to q, k, v, ``slopes`` and ``row_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, sm_scale, alpha):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        # the backward's delta needs u whatever it differentiates
        store_u = any(ctx.needs_input_grad[:5])
        out, tau, m, den, u, _, _ = _lists_forward(pb, alpha, store_u)
        ctx.consts = (pb.sm_scale, 1.0 / (alpha - 1.0))
        ctx.rs_shape = None if row_scale is None else row_scale.shape
        ctx.save_for_backward(pb.q, pb.k, pb.v, out, pb.slopes, pb.row_scale, tau, m, den, u)
        return out

    @staticmethod
    def backward(ctx, dout):
        sm_scale, power = ctx.consts
        dq, dk, dv, g_sl, g_rs, _ = rowwise_backward(
            dout, ctx.saved_tensors, sm_scale, ENTMAX, power, grad_slopes=ctx.needs_input_grad[3],
            grad_rs=ctx.needs_input_grad[4], grad_tau=False, rs_shape=ctx.rs_shape, tau_shape=None)
        return dq, dk, dv, g_sl, g_rs, None, None


def entmax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """alpha-entmax attention (``alpha`` 1.5 or 2), ``[B, H, T, D]`` causal. By the candidate lists where
    ``_lists_apply`` (the default), else the threshold and the output pass of ``_rowwise.py``."""
    alpha = _check_alpha(alpha)
    if _lists_apply(q):
        return EntmaxListsAttention.apply(q, k, v, slopes, row_scale, sm_scale, alpha)
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=alpha)
    return rowwise(q, k, v, mech=ENTMAX, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale,
                   power=1.0 / (alpha - 1.0))


def sparsemax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None):
    """sparsemax (2-entmax) attention, ``[B, H, T, D]`` causal: ``w = (z - tau)_+`` summing to one."""
    return entmax_attention(q, k, v, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=2.0)
