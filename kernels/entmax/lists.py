"""The candidate lists of the entmax search: where the first stage certifies a row, the keys that may be in
its support, so that a row's output needs those keys only. Not an op: ``entmax/op.py`` and ``sieve/`` finish
the listed rows from them (``_list_rows``) and the other rows by the Newton passes and a pass over all their
keys.

The first stage (``_lists_start_kernel``) packs each key tile's index into the low mantissa bits of ``X``
(``_pack``: 10 bits at 65,536 keys), so the kept values carry their keys through the merges, and certifies with
a margin ``eps`` of the packing's perturbation (the argument is in the kernel's docstring). A certified row's
candidates (kept values above ``tau_sub - 2 eps``, which hold its support) go to a list of at most ``C`` (64)
keys, which the finishing kernels gather, recomputing their scores and finding ``tau*`` over them in
registers. The other rows (not certified, or more than ``C`` candidates) take the Newton passes and then an
output pass over all their keys, gathered. In a float64 model of the stage at L 65,536 (400 rows that see
every key, N(0, 1) q and k, D 32) 81% of those rows are listed (82% certified without the margin), with
supports of 34 keys and 32 candidates on average; q and k times 0.7: 2%.

``alibi_skip``: on ALiBi heads the first stage starts each query tile past the keys that cannot come within 1
of a row's own score (``_alibi_skip``: a Cauchy-Schwarz bound with the head's largest key norm), which lie
below ``tau*`` and every subset's support. A CPU model of a trained MQMTAR ASEntmax + NAPE model (at 1,024
tokens) found 78-88% of the key tiles of its eight ALiBi heads (slopes 1 to 1/8) below ``X_max - 1`` and none
of its NoPE heads'; on the H100 at 65,536 tokens the skip takes the first stage of that model's sample from
99.9 to 54.0 ms, the sample from 185.5 to 140.3 ms, and 1,000 samples to 131.3 s (1.56x softmax + RoPE's 84 s,
against 2.08x without).

``rescue``: a row that is not certified has at most a few saturated columns (``m4' + 2 eps > tau_sub``), the
only columns whose left-out keys may lie above ``tau_sub - eps``. In a numpy model of the first stage (N(0, 1)
scores at L 65,536, D 32) 15.7% of rows are open, with 1.2 saturated columns on average, and 94% of those have
at most 64 candidates once every key of their saturated columns above ``tau_sub`` is added (1.9% of the keys
scanned). ``_rescue_kernel`` scans those columns for such rows and completes their lists, so they are finished
from their lists instead of by the Newton passes and the output pass over all their keys. With wider supports
(scores times 0.7) most open rows overflow the lists and stay open. On the H100 (L 65,536, D 32, N(0, 1)
inputs) 99.0% of rows are listed instead of 86.9%, entmax's forward takes 30.5 ms instead of 34.0 (1.53x
SDPA's 19.9) and Sieve's 34.7 instead of 50.5.

``sample`` (entmax's forward, from 8,192 tokens): rows of hundreds of keys, as a freshly initialised model's
(the MQMTAR ``paper`` model's first layer at 61,193 tokens: supports of 465 keys, median over sampled rows),
are certified by no subset, so the first stage only gives their Newton passes a start. ``_sample_kernel``
estimates ``tau*`` from every 8th key instead; a query tile with three quarters of its rows wider than the
lists keeps those estimates and skips the first stage. In a float64 model of that layer's rows the lean
passes end in 2.2 passes from the estimate (2.0 from the first stage's start). On the H100 (where a tile
needed every row wide) that model's layers took 42.7 and 39.3 ms instead of 50.9 and 52.7, and the sample's first look, every 32nd key, added
1.2 ms to N(0, 1) rows' 26.2 (no tile wide). With ASEntmax's row scale the supports halve (about 200 keys):
in a float64 model of the decision a tile then kept its estimates in 1 of 64 cases when every row had to look
wide, in 64 of 64 with three quarters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.entmax.config import launch_config
from lengthbench.kernels.entmax.threshold import (
    _column_stats,
    _column_top,
    _exact_ok,
    _insert,
    _lean,
    _n_keys,
    _newton_launch,
    _newton_tile,
    _query_tile,
    _step,
    _subset_root,
)
from lengthbench.kernels.utils.common import Problem, folded_scores, head_slope, rows_scale, score_tile
from lengthbench.kernels.utils.open_rows import _open_rows, _OpenCount, _phases


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


# The sampled start's first look: every ``_SAMPLE_COARSE * stride``-th key, on which a tile of narrow rows stops.
_SAMPLE_COARSE = 4


@triton.jit
def _sample_top(m1, m2, m3, m4, q, K, base, offs_m, offs_d, dmask, diag, first, step, sm_scale, slope, rs,
                HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BNS: tl.constexpr, XS: tl.constexpr):
    """The running top 4 of every column (``m1 >= .. >= m4``) merged with the ``X`` of the keys ``first + step i``
    below ``diag`` (visible to every row of the tile), ``BNS`` a step."""
    for start in range(first, diag, step * BNS):
        offs_n = start + tl.arange(0, BNS) * step
        inside = offs_n < diag
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=inside[:, None] & dmask[None, :],
                    other=0.0)
        if FOLD:
            x = folded_scores(q, k, sm_scale, rs, XS, HAS_RS, DOT_PREC)
        else:
            z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
            x = z * XS
        m1, m2, m3, m4 = _insert(m1, m2, m3, m4, tl.where(inside[None, :], x, float("-inf")), 4)
    return m1, m2, m3, m4


@triton.jit
def _sample_root(m1, m2, m3, m4, row_ok, root, stride, limit, XS: tl.constexpr):
    """``(estimate, wide)`` from the top 4 of every column of a sample of every ``stride``-th key: the threshold
    of the kept values with every value standing for ``stride`` (``stride sum (X - t)_+^p = sum (root (X -
    t))_+^p``, ``root = stride^(1 / p)``, ``p = 1 / (alpha - 1)``), by the exact/Newton steps of ``_subset_root``
    on the sums scaled by ``root`` (not on scaled copies of the values: four more register tiles); ``wide`` 1
    where at least three quarters of the tile's rows are wide: their kept values above it, ``stride`` times
    over, outnumber ``limit``. (Per row the count is noisy: a tile whose every row had to pass would fall to
    the first stage at supports of about a hundred keys. A narrow row of a wide tile takes the Newton passes
    from its estimate, as the rows the lists cannot hold do.)"""
    x_max = tl.max(m1, 1)
    empty = x_max == float("-inf")
    tau = tl.where(empty, 0.0, x_max - 1.0 / root)
    solved = empty | (row_ok == 0)
    pending = tl.sum((solved == 0).to(tl.int32), 0)
    it = 0
    while (it < 16) & (pending > 0):
        s1, s2, cnt, x_low = _column_stats(m1, m2, m3, m4, tau, 4)
        s1 = s1 * root
        s2 = s2 * (root * root)
        solved = solved | _exact_ok(s1, s2, cnt, x_low * root, tau * root, XS)
        tau += _step(s1, s2, cnt, x_low * root, tau * root, XS) / root
        pending = tl.sum((solved == 0).to(tl.int32), 0)
        it += 1
    kept = (tl.sum((m1 > tau[:, None]).to(tl.int32), 1) + tl.sum((m2 > tau[:, None]).to(tl.int32), 1)
            + tl.sum((m3 > tau[:, None]).to(tl.int32), 1) + tl.sum((m4 > tau[:, None]).to(tl.int32), 1))
    wide = (kept * stride > limit) & row_ok
    return tau, (4 * tl.sum(wide.to(tl.int32), 0) >= 3 * tl.sum(row_ok.to(tl.int32), 0)).to(tl.int32)


@triton.jit
def _sample_start(q, K, TAU, NCAND, base, bh, offs_m, offs_d, row_ok, dmask, T, sm_scale, slope, rs, diag, sample_min,
                  root, coarse_root, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                  DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, XS: tl.constexpr,
                  S: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """A query tile's start from a sample of its keys, when its rows are wide: 1 where the tile is finished so
    (``TAU`` the estimates, ``NCAND`` 0: every row open), 0 where the first stage must run.

    The keys ``j = S i`` below the tile's first row (``diag``, at least ``sample_min``) stand for the ``S``
    keys around each (``_sample_root``); first every ``G``-th of them (``coarse_root`` their root), on which a
    tile of narrow rows stops (wide there: estimated supports above ``C / 2``), then the others (wide: above
    ``C``). The estimate of ``tau*`` is no bound (the Newton passes take a start on either side,
    ``_newton_passes``); it lies below the sample's largest ``X``, so every pass from it sees a key above it. A
    tile of wide rows (supports the lists cannot hold) skips the first stage, whose subset would certify none
    of them."""
    finished = diag * 0
    if diag >= sample_min:
        m1 = tl.full([BM, BNS], float("-inf"), dtype=tl.float32)
        m1, m2, m3, m4 = _sample_top(m1, m1, m1, m1, q, K, base, offs_m, offs_d, dmask, diag, 0, S * G, sm_scale,
                                     slope, rs, HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
        tau, wide = _sample_root(m1, m2, m3, m4, row_ok, coarse_root, S * G, C // 2, XS)
        if wide > 0:
            for part in tl.static_range(1, G):
                m1, m2, m3, m4 = _sample_top(m1, m2, m3, m4, q, K, base, offs_m, offs_d, dmask, diag, part * S, S * G,
                                             sm_scale, slope, rs, HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BNS, XS)
            tau, wide = _sample_root(m1, m2, m3, m4, row_ok, root, S, C, XS)  # wider than the lists
            if wide > 0:
                tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)
                tl.store(NCAND + bh * T + offs_m, tl.zeros([BM], dtype=tl.int32), mask=row_ok)
                finished = diag * 0 + 1
    return finished


@triton.jit
def _sample_kernel(Q, K, SL, RS, TAU, NCAND, FLAG, sm_scale, T, H, sample_min, root, coarse_root,
                   HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr, DOT_PREC: tl.constexpr,
                   D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BNS: tl.constexpr, XS: tl.constexpr,
                   S: tl.constexpr, C: tl.constexpr, G: tl.constexpr):
    """``_sample_start`` over the query tiles of ``_lists_start_kernel``, ``FLAG[bh, tile]`` 1 where it finished
    the tile. A launch of its own: in the first stage's kernel its registers made that stage spill (784 bytes of
    stack a thread against 176, sm_90)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base, offs_m, offs_d, row_ok, dmask, q, slope, rs, diag, hi = _query_tile(
        Q, SL, RS, T, H, pid_m, bh, False, HAS_SLOPES, HAS_RS, D, BD, BM)
    finished = _sample_start(q, K, TAU, NCAND, base, bh, offs_m, offs_d, row_ok, dmask, T, sm_scale, slope, rs, diag,
                             sample_min, root, coarse_root, HAS_SLOPES, HAS_RS, FOLD, DOT_PREC, D, BM, BNS, XS, S, C, G)
    tl.store(FLAG + bh * tl.num_programs(0) + pid_m, finished)


@triton.jit
def _lists_start_kernel(Q, K, SL, RS, KMAX, TAU, NCAND, LIST, SAT, FLAG, sm_scale, eps_scale, T, H,
                        STRICT: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, FOLD: tl.constexpr,
                        DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                        BNS: tl.constexpr, SUBSET_ITERS: tl.constexpr, XS: tl.constexpr, PACK: tl.constexpr,
                        C: tl.constexpr, PAIRS: tl.constexpr, SKIP: tl.constexpr, RESCUE: tl.constexpr,
                        MAX_SAT: tl.constexpr, SAMPLE: tl.constexpr):
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

    ``SAMPLE`` (entmax's forward, not ``STRICT``): a tile that ``_sample_kernel`` finished (``FLAG``: its rows
    mostly wide, their starts its estimates, all open) skips the first stage.

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
    finished = 0
    if SAMPLE:  # the tiles _sample_kernel finished
        finished = tl.load(FLAG + bh * tl.num_programs(0) + pid_m)
    if finished == 0:
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


# The packed key-tile index takes at most this many mantissa bits (the margin eps grows as 2^bits: 12 bits is
# a relative 2^-10); longer sequences take the threshold and output pass instead.
_PACK_MAX = 12


def _pack_bits(tokens: int, bns: int) -> int:
    """Mantissa bits that hold the index of every key tile of ``bns`` keys (at least 1)."""
    return max(1, (triton.cdiv(tokens, bns) - 1).bit_length())


# The packed bits the kernels are compiled for: ``PACK`` is a constant of the list kernels (one instruction a
# score), so every value is a compilation of its own, and the needed bits change at every doubling of the
# length. One compilation per width took 7-8 s at each of MQMTAR's scored lengths up to 256x (200 samples, the
# H100); with these widths the lengths 2x-32x took 0.05-0.3 s (7.9-14.5 s at 1x, 64x and 256x, where a width
# compiled). Rounding up keeps four; more bits than a length needs are as exact (the packed values move by at
# most 2^-17 relative up to 4,096 tokens, within the lists' margin of 2^-14).
_PACK_WIDTHS = (6, 8, 10, _PACK_MAX)


def _pack_launch(bits: int) -> int:
    """The compiled ``PACK`` for ``bits`` needed bits (:data:`_PACK_WIDTHS`; ``bits`` itself past them)."""
    return next((width for width in _PACK_WIDTHS if width >= bits), bits)


def _lists_apply(q, tuning: dict | None = None) -> bool:
    """Whether ``entmax_attention`` takes the list forward for ``q``: ``lists`` on, the split search with the
    top-4 first stage, and key tiles that fit in ``_PACK_MAX`` bits."""
    if q.dim() != 4 or q.shape[-1] < 1 or q.shape[-2] < 1:
        return False
    config = launch_config(max(16, triton.next_power_of_2(q.shape[-1])), tuning)
    return (bool(config.get("lists")) and bool(config["split"]) and int(config["subset"]) == 4
            and _pack_bits(q.shape[-2], config["bn_subset"]) <= _PACK_MAX)


def _lists_start(pb: Problem, xs: float, strict: bool, tol=1e-6, max_iter=40, tuning: dict | None = None,
                 sample: bool = False):
    """The first stage with the lists and the Newton passes over the open rows (shared with Sieve):
    ``(tau, ncand, lists, rows, count, config, opened)``, ``tau`` ``[B, H, T]`` final on the open rows and a
    start below ``tau*`` on the listed ones, ``ncand`` ``[BH, T]`` int32 the number of candidates of the listed
    rows (0 on the open rows, and the rows that see no key), ``lists`` ``[BH, T, C]`` their keys, ``rows,
    count`` the open rows (``_open_rows``), ``opened`` their ``_OpenCount``. Every launch setting is checked
    before the first launch. ``tuning``: launch settings replacing the defaults (``entmax/config.py``).
    ``sample`` (entmax's forward): the tiles of wide rows start from a sample of their keys (``_sample_start``;
    ``sample`` setting, with the lean Newton passes, not ``strict``)."""
    config = launch_config(pb.block_d, tuning)
    bm, bns, size = config["bm"], config["bn_subset"], int(config["list_size"])
    pack = _pack_launch(_pack_bits(pb.tokens, bns))
    # open-row tiles: (rows, keys a step, warps, stages), the rows a multiple of the keys
    tiles = [config[key] for key in ("newton", "newton_few", "sieve_open", "sieve_open_few") if config[key]]
    if (bm % bns or pack > _PACK_MAX or size & (size - 1) or any(len(t) != 4 or t[0] % t[1] for t in tiles)
            or (config["few_open"] and len(config["few_open"]) != 2)
            or any(int(p) < 1 for key in ("newton_phases", "sieve_phases") for p in (config[key] or ()))
            or (config["sample"] and (len(config["sample"]) != 3 or int(config["sample"][0]) < 2))):
        raise ValueError(f"entmax lists: bad launch settings {config} for T {pb.tokens}")
    tau = pb.rows()
    ncand = torch.empty(pb.bh, pb.tokens, device=tau.device, dtype=torch.int32)
    lists = torch.empty(pb.bh, pb.tokens, size, device=tau.device, dtype=torch.int32)
    sl, rs = pb.opt(pb.slopes), pb.opt(pb.row_scale)
    common = dict(STRICT=bool(strict), HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                  FOLD=bool(config["fold"]) and pb.slopes is None, DOT_PREC=pb.dot_prec,
                  D=pb.head_dim, BD=pb.block_d, XS=xs)
    skip = bool(config["alibi_skip"]) and pb.slopes is not None and not strict
    # the largest key norm of each head, for _alibi_skip's bound
    kmax = pb.k.float().norm(dim=-1).amax(-1).reshape(-1) if skip else tau
    rescue = bool(config["rescue"])
    sat = torch.empty(pb.bh, pb.tokens, device=tau.device, dtype=torch.int64) if rescue else tau
    setting = config["sample"]
    stride, least = 0, 0  # the sampled start (_sample_start): every stride-th key, from `least` of them
    if sample and setting and not strict and _lean(config) and pb.tokens >= int(setting[2]):
        stride, least = int(setting[0]), int(setting[1])
    grid = (triton.cdiv(pb.tokens, bm), pb.bh)
    flag = tau
    if stride:
        flag = torch.empty(pb.bh, grid[0], device=tau.device, dtype=torch.int32)
        _sample_kernel[grid](pb.q, pb.k, sl, rs, tau, ncand, flag, pb.sm_scale, pb.tokens, pb.heads, stride * least,
                             float(stride) ** xs, float(stride * _SAMPLE_COARSE) ** xs, HAS_SLOPES=common["HAS_SLOPES"],
                             HAS_RS=common["HAS_RS"], FOLD=common["FOLD"], DOT_PREC=pb.dot_prec, D=pb.head_dim,
                             BD=pb.block_d, BM=bm, BNS=bns, XS=xs, S=stride, C=size, G=_SAMPLE_COARSE,
                             num_warps=config["warps"], num_stages=config["stages"])
    _lists_start_kernel[grid](
        pb.q, pb.k, sl, rs, kmax, tau, ncand, lists, sat, flag, pb.sm_scale, 2.0 ** (pack - 22) + 2.0 ** -14,
        pb.tokens, pb.heads, BM=bm, BNS=bns, SUBSET_ITERS=16, PACK=pack, C=size, PAIRS=bool(config["pairs"]),
        SKIP=skip, RESCUE=rescue, MAX_SAT=int(config["max_sat"]), SAMPLE=bool(stride), num_warps=config["warps"],
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
