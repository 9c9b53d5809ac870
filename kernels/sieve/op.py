"""Sieve attention ("Sieve Attention"): stick-breaking over the support of 1.5-entmax of the earlier keys.

Two stages, as that paper's Appendix C: the threshold search of ``entmax/threshold.py`` finds ``tau_r`` of 1.5-entmax over
``z_{r, j<r}`` (Newton passes over the key tiles, no score matrix kept); the stick-breaking kernels of
``stickbreaking/`` then run with the filter ``z_rj / 2 > tau_r`` (the support: its weights
``(z/2 - tau)_+^2`` are positive exactly there), what is left of the stick on the query's own value
(``remainder="diagonal"``) or nowhere (``"drop"``: Eq. 7, the weights over the earlier tokens only). This is the
definition (Section 3.1), not Algorithm 1's ``z >= rowmax - eps``. No gradient flows through the support; ``row_scale``
and ``slopes`` receive gradients through the stick-breaking stage.

By candidate lists (where ``lists._lists_apply``, the default), forward and backward take the rows
in two sets. The listed rows, certified by entmax's list first stage with their support among at most ``C``
(64) candidates, are finished in registers, ``BR`` rows a program (``_lists_kernel``; with ``sieve_scan``, the
default, their candidates sorted by key and the stick's suffix sums a cumulative sum, as the backward does,
instead of ``[BR, C, C]`` comparisons: Sieve's forward 34.4 -> 31.9 ms at L 65,536, D 32 on the H100;
``sieve_open`` gives the open rows' walk tiles of their own (64 x 32 at head dims up to 64, where the Newton passes
take 64-key tiles), and ``sieve_open_few``, on, where the open
rows are few: ``few_open`` of ``utils/open_rows.py``); the forward keeps their supports in place of the candidates, so the backward (``_lists_bwd_kernel``) takes the very support the
forward used. The open rows (the others, row 0 among them) are gathered per head and walked over all their
keys by the filtered stick-breaking kernels (``_open_kernel``, ``_open_bwd_kernel``); where they are many, the
forward's walk runs in phases (``sieve_phases``, ``utils/open_rows.py``), the rows whose stick is not yet spent
gathered again after each.

The listed rows' gradient: with ``sigma_k = sigmoid(z_k)``, ``a_j = sigma_j prod_{k in S, k > j} (1 -
sigma_k)`` and ``rem = prod_S (1 - sigma_k)``, ``d log a_j / dz_k = [k = j] - sigma_k [k >= j]`` and ``d log
rem / dz_k = -sigma_k`` (``d softplus = sigmoid``); so with ``g_j = do_r.v_j``, ``dz_k = a_k g_k - sigma_k
(sum_{j in S, j <= k} a_j g_j + rem g_r)``. As ``sum_{j <= k} a_j + rem = a_k / sigma_k`` (the stick left
when key ``k`` takes its share) this is ``c_k (1 - sigma_k) - sigma_k sum_{j in S, j < k} c_j`` with ``c_j =
a_j (g_j - g_r)``: the stick-breaking backward's form, which the kernel uses (no cancellation where one key
takes nearly the whole stick, and no fp32 output needed). Then ``dq_r = sm_scale rs_r sum_k dz_k k_k``,
``dk_k += sm_scale rs_r dz_k q_r``, ``dv_k += a_k do_r`` and ``dv_r += rem do_r``; ``row_scale`` and the
slopes take ``dz`` times the biased score and times ``-rs_r (r - k)``. With the remainder dropped the output
is ``sum_S a_j v_j``: the same forms with ``g_r = 0`` and no ``dv_r`` (``DROP`` of every kernel here).

What the list forward keeps for the backward (``_lists_forward``): the lists (the supports), their sizes,
``tau`` and the remainder per row, the open rows' indices, and only the open rows' fp32 outputs (the open
backward's ``C_r = do_r.o_r - g_r``), in their own unused list slots where a row fits (``D <= C``; else a
``[B, H, T, D]`` fp32 buffer). At L 65,536, H 16, D 32 the lists (256 MiB) so take the place of the fp32
output (128 MiB) and the fp32 copy of ``do`` (128 MiB) that the stick-breaking backward holds.

``window.py``'s ``sieve_window_attention`` is Algorithm 1's window filter (``sieve-window``): the row maxima over
``j < r``, then the stick-breaking kernels with the stick over every earlier key and the weights kept within ``eps``
of the max.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.defaults import REMAINDERS, SIEVE_ALPHA, SIEVE_REMAINDER
from lengthbench.kernels.entmax.config import launch_config
from lengthbench.kernels.entmax.lists import _list_keys, _list_rows, _list_scores, _lists_apply, _lists_start
from lengthbench.kernels.entmax.short_rows import SHORT_ROWS_MAX_TOKENS, sieve_threshold
from lengthbench.kernels.entmax.threshold import entmax_threshold
from lengthbench.kernels.stickbreaking.backward import _bwd_store, _bwd_walk, grad_buffers, param_grads
from lengthbench.kernels.stickbreaking.forward import _fwd_store, _fwd_walk
from lengthbench.kernels.stickbreaking.op import StickBreakingAttention
from lengthbench.kernels.stickbreaking.stick import EXIT_AT
from lengthbench.kernels.utils.common import (
    Problem,
    gathered_rows,
    softplus,
)
from lengthbench.kernels.utils.open_rows import _open_rows, _phases


@triton.jit
def _lists_kernel(Q, K, V, Out, REM, SL, RS, TAU, NCAND, LIST, NSUP, sm_scale, T, H, n_iter,
                  SAVE: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr, BR: tl.constexpr, C: tl.constexpr, SCAN: tl.constexpr, DROP: tl.constexpr):
    """Sieve on the listed rows (``NCAND > 0``, certified by the strict first stage: their support, the keys
    ``j < r`` with ``z / 2 > tau``, lies among their candidates), ``BR`` a program: ``tau`` over the candidates
    (``_list_rows``), then the stick broken over the support from the latest key down, as the stick-breaking
    forward's filtered walk does: ``a_j = exp(z_j - sum_{k in S, k >= j} softplus(z_k))`` (an ``O(C^2)`` suffix
    sum over the keys' order; with ``SCAN`` the candidates sorted in registers, the latest key first, and the
    sum a cumulative sum over the slots, as in ``_lists_bwd_kernel``), remainder ``exp(-sum_S softplus)`` on
    the diagonal (``DROP``: nowhere). Writes the output and
    ``TAU``; with ``SAVE``, for ``_lists_bwd_kernel``, the remainder, the support itself in place of the
    candidates (``LIST[row, :n]``, in the candidates' order) and ``NSUP`` its size ``n`` (-1 on the rows not
    listed). The backward so takes the very support this forward used, whatever its own rounding of the
    scores."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    offs_r = pid * BR + tl.arange(0, BR)
    row_ok = offs_r < T
    ncand = tl.load(NCAND + bh * T + offs_r, mask=row_ok, other=0)
    listed = ncand > 0
    nsup = tl.full([BR], -1, dtype=tl.int32)
    if tl.max(listed.to(tl.int32), 0) > 0:
        base, offs_d, dmask, keep, idx, gather, gmask, z, x, tau = _list_rows(
            Q, K, SL, RS, TAU, LIST, sm_scale, T, H, n_iter, bh, offs_r, row_ok, ncand, listed, HAS_SLOPES, HAS_RS,
            D, BD, BR, C, 0.5, SCAN)
        support = keep & (z * 0.5 > tau[:, None])  # the filter of the stick-breaking kernels
        sp = tl.where(support, softplus(z), 0.0)
        if SCAN:  # the slots in descending key order: the keys k >= j are the slots up to j's
            suffix = tl.cumsum(sp, 1)
        else:
            later = (idx[:, None, :] >= idx[:, :, None]) & support[:, None, :]  # [row, j, k]: k in S, k >= j
            suffix = tl.sum(tl.where(later, sp[:, None, :], 0.0), 2)
        a = tl.where(support, tl.exp(z - suffix), 0.0)
        v = tl.load(V + base + gather, mask=gmask, other=0.0).to(tl.float32)
        acc = tl.sum(a[:, :, None] * v, 1)
        rmask = listed[:, None] & dmask[None, :]
        _fwd_store(acc, tl.sum(sp, 1), V, Out, Out, REM, base, offs_r, offs_d, rmask, listed, bh, T, 0,
                   2 if SAVE else 0, D, DROP)
        tl.store(TAU + bh * T + offs_r, tau, mask=listed)
        if SAVE:
            slot = tl.cumsum(support.to(tl.int32), 1) - 1  # at or left of the candidate's own slot
            # every thread has loaded its candidates before any slot is overwritten
            tl.debug_barrier()
            tl.store(LIST + (bh * T + offs_r).to(tl.int64)[:, None] * C + slot, idx, mask=support)
            nsup = tl.where(listed, tl.sum(support.to(tl.int32), 1), -1)
    if SAVE:
        tl.store(NSUP + bh * T + offs_r, nsup, mask=row_ok)


@triton.jit
def _open_kernel(Q, K, V, Out, O32, REM, SL, RS, TAU, ROWS, COUNT, STATE, PEND, sm_scale, T, H, o32_stride,
                 state_stride, exit_at, max_tiles, SAVE: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                 SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr, DROP: tl.constexpr):
    """Sieve on the rows left open (``ROWS[bh, :COUNT[bh]]``, gathered as in ``threshold._newton_kernel``): the
    stick-breaking forward's filtered walk (``FILTER`` 1) over the keys before each row, in one launch
    (``FIRST`` and ``LAST``) or a phase of at most ``max_tiles`` key tiles (``sieve_phases``; all that are left
    where ``LAST``), from the row's diagonal (``FIRST``) or from where its last phase stopped. A row whose stick
    is spent (``exit_at`` nats) or whose keys are all walked is finished: its output and, with ``SAVE``, the
    remainder and the fp32 output at ``O32 + (bh T + r) o32_stride`` for ``_open_bwd_kernel``. Where not
    ``LAST``, the others keep ``[acc (D), lsum, keys left]`` at ``STATE + (bh T + r) state_stride`` and ``PEND``
    1 (0 on the rows finished), for the next phase."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    n_open = tl.load(COUNT + bh)
    if pid_m * BM < n_open:
        base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs = gathered_rows(
            Q, SL, RS, ROWS, n_open, pid_m, bh, T, H, HAS_SLOPES, HAS_RS, D, BD, BM)
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
        srow = (bh * T + offs_m).to(tl.int64) * state_stride
        if FIRST:
            acc = tl.zeros([BM, BD], dtype=tl.float32)
            lsum = tl.zeros([BM], dtype=tl.float32)
            upto = offs_m  # the keys j < r
        else:
            acc = tl.load(STATE + srow[:, None] + offs_d[None, :], mask=rmask, other=0.0)
            lsum = tl.load(STATE + srow + D, mask=row_ok, other=0.0)
            upto = tl.load(STATE + srow + D + 1, mask=row_ok, other=0.0).to(tl.int32)
        upto = tl.where(row_ok, upto, 0)
        n_tiles = tl.cdiv(tl.max(upto, 0), BN)
        limit = max_tiles
        if LAST:
            limit = n_tiles
        acc, lsum, t = _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles,
                                 exit_at, acc, lsum, upto, limit, 1, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC, D, BD, BM,
                                 BN)
        if LAST:  # every row's keys are walked or its stick spent
            done = row_ok
        else:
            upto = tl.minimum(upto, (n_tiles - t) * BN)  # the keys from there on are walked
            done = row_ok & ((lsum >= exit_at) | (upto <= 0))
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask & done[:, None], done, bh, T,
                   o32_stride, 1 if SAVE else 0, D, DROP)
        if not LAST:
            left = row_ok & (done == 0)
            tl.store(STATE + srow[:, None] + offs_d[None, :], acc, mask=left[:, None] & dmask[None, :])
            tl.store(STATE + srow + D, lsum, mask=left)
            tl.store(STATE + srow + D + 1, upto.to(tl.float32), mask=left)
            tl.store(PEND + bh * T + offs_m, left.to(tl.int32), mask=row_ok)


def _open_walk(pb: Problem, config, tiles, few: bool, out, o32, o32_stride, rem, tau, rows, count, lists, save,
               drop):
    """Sieve's open rows' forward walk: ``_open_kernel`` in one launch, or with ``sieve_phases`` (keys a phase;
    not where the open rows are ``few``) a phase a launch, the rows still walking gathered again after each: a
    tile walks as far as its farthest row, and the rows whose stick is spent early then stop sharing tiles with
    the far ones. Their state waits in their own unused list slots (``D + 2 <= C``) or in a buffer of its own."""
    nbm, nbn, nwarps, nstages = tiles
    common = dict(SAVE=save, HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                  SPLIT=pb.q.dtype != torch.float32, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=nbm,
                  BN=nbn, DROP=drop, num_warps=nwarps, num_stages=nstages)
    grid = (triton.cdiv(pb.tokens, nbm), pb.bh)
    phases = _phases(config, "sieve_phases", pb.tokens)
    if not phases or few or pb.tokens >= 1 << 24:  # (the keys left are kept as fp32)
        phases, state, stride, pend = [], None, 0, None
    elif pb.head_dim + 2 <= lists.shape[-1]:
        state, stride = lists.view(torch.float32), lists.shape[-1]
    else:
        state, stride = torch.empty(pb.bh, pb.tokens, pb.head_dim + 2, device=pb.q.device,
                                    dtype=torch.float32), pb.head_dim + 2
    if phases:
        pend = torch.zeros(pb.bh, pb.tokens, device=pb.q.device, dtype=torch.int32)
    for i, keys in enumerate(phases + [0]):
        last = i == len(phases)
        _open_kernel[grid](pb.q, pb.k, pb.v, out, pb.opt(o32), pb.opt(rem), pb.opt(pb.slopes), pb.opt(pb.row_scale),
                           tau, rows, count, pb.opt(state), pb.opt(pend), pb.sm_scale, pb.tokens, pb.heads, o32_stride,
                           stride, EXIT_AT, triton.cdiv(keys, nbn), FIRST=i == 0, LAST=last, **common)
        if not last:
            rows, count = _open_rows(pend == 0)


@triton.jit
def _lists_bwd_kernel(Q, K, V, DO, DQ, DK, DV, SL, RS, DRS, DSL, NSUP, LIST, sm_scale, T, H,
                      HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr,
                      GRAD_SL: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
                      C: tl.constexpr, DROP: tl.constexpr):
    """The backward of the listed rows (``NSUP >= 0``), ``BR`` a program, from the supports
    ``_lists_kernel`` kept (``LIST[row, :NSUP]``), sorted in registers, the latest key first: the keys and
    values gathered, the scores recomputed (``_list_scores``), then in slot order ``a_j = exp(z_j -
    cumsum(softplus z)_j)`` (the softplus of the support keys at or after ``j``) and, with ``g_j = do_r.v_j``
    and ``c_j = a_j (g_j - g_r)``,

        ``dz_k = c_k sigma(-z_k) - sigma(z_k) sum_{j in S, j < k} c_j``

    (the sum a reverse cumulative sum over the slots after ``k``): the stick-breaking backward's ``c_k (1 -
    sigma_k) - sigma_k (C_r - sum_{j >= k} c_j)`` with ``C_r = sum_S c_j`` taken over the support in
    registers, so no fp32 output is needed. Row ``r``'s ``dq`` is stored; ``dk_k += sm_scale rs_r dz_k q_r``
    and ``dv_k += a_k do_r`` go to the fp32 buffers by atomic adds on the support's slots only; the
    remainder's ``dv_r`` is added by the caller. A row with an empty support has ``dz = 0`` and ``dq = 0``.
    ``DROP`` (the remainder nowhere): ``g_r = 0``, the same forms with the remainder's value zero."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    offs_r = pid * BR + tl.arange(0, BR)
    row_ok = offs_r < T
    nsup = tl.load(NSUP + bh * T + offs_r, mask=row_ok, other=-1)
    listed = nsup >= 0
    if tl.max(listed.to(tl.int32), 0) > 0:
        support, idx = _list_keys(LIST, bh, T, offs_r, listed, nsup, C)
        idx = tl.sort(idx, 1, descending=True)  # the keys first, latest first, then the -1 of the empty slots
        base, offs_d, dmask, gather, gmask, q, k, zb, z, rs = _list_scores(
            Q, K, SL, RS, idx, support, listed, sm_scale, T, H, bh, offs_r, row_ok, HAS_SLOPES, HAS_RS, D, BD,
            BR)
        rmask = listed[:, None] & dmask[None, :]
        roff = base + offs_r[:, None] * D + offs_d[None, :]
        do = tl.load(DO + roff, mask=rmask, other=0.0).to(tl.float32)
        g_r = tl.zeros([BR], dtype=tl.float32)  # do_r.v_r, the remainder's value (none where DROP)
        if not DROP:
            g_r = tl.sum(do * tl.load(V + roff, mask=rmask, other=0.0).to(tl.float32), 1)
        v = tl.load(V + base + gather, mask=gmask, other=0.0).to(tl.float32)
        sp = tl.where(support, softplus(z), 0.0)
        a = tl.where(support, tl.exp(z - tl.cumsum(sp, 1)), 0.0)
        c = tl.where(support, a * (tl.sum(do[:, None, :] * v, 2) - g_r[:, None]), 0.0)
        before = tl.cumsum(c, 1, reverse=True) - c
        dz = tl.where(support, c * tl.sigmoid(-z) - tl.sigmoid(z) * before, 0.0)
        dzs = dz * (rs * sm_scale)[:, None]
        tl.store(DQ + roff, tl.sum(dzs[:, :, None] * k, 1).to(DQ.dtype.element_ty), mask=rmask)
        tl.atomic_add(DK + base + gather, dzs[:, :, None] * q[:, None, :], mask=gmask, sem="relaxed")
        tl.atomic_add(DV + base + gather, a[:, :, None] * do[:, None, :], mask=gmask, sem="relaxed")
        if GRAD_RS:
            tl.store(DRS + bh * T + offs_r, tl.sum(dz * zb, 1), mask=listed)
        if GRAD_SL:
            d_sl = tl.sum(dz * (offs_r[:, None] - idx).to(tl.float32), 1)
            tl.store(DSL + bh * T + offs_r, -d_sl * rs, mask=listed)


@triton.jit
def _open_bwd_kernel(Q, K, V, DO, DQ, DK, DV, O32, SL, RS, TAU, DRS, DSL, ROWS, COUNT, sm_scale, T, H,
                     o32_stride, exit_at, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                     GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                     BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DROP: tl.constexpr):
    """The backward of the open rows (``ROWS[bh, :COUNT[bh]]``, gathered as in ``_open_kernel``): the
    stick-breaking backward's filtered walk (``_bwd_walk``, ``FILTER`` 1) over the keys before their last row,
    with ``g_r = do_r.v_r`` (``DROP``: 0) and ``C_r = do_r.o_r - g_r`` from the fp32 output ``_open_kernel``
    kept."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    n_open = tl.load(COUNT + bh)
    if pid_m * BM < n_open:
        base, offs_m, offs_d, row_ok, dmask, rmask, q, slope, rs = gathered_rows(
            Q, SL, RS, ROWS, n_open, pid_m, bh, T, H, HAS_SLOPES, HAS_RS, D, BD, BM)
        roff = base + offs_m[:, None] * D + offs_d[None, :]
        do = tl.load(DO + roff, mask=rmask, other=0.0)
        do32 = do.to(tl.float32)
        g_r = tl.zeros([BM], dtype=tl.float32)  # do_r.v_r, the remainder's value (none where DROP)
        if not DROP:
            g_r = tl.sum(do32 * tl.load(V + roff, mask=rmask, other=0.0).to(tl.float32), 1)
        o32_rows = (bh * T + offs_m).to(tl.int64) * o32_stride
        o32 = tl.load(O32 + o32_rows[:, None] + offs_d[None, :], mask=rmask, other=0.0)
        c_total = tl.sum(do32 * o32, 1) - g_r
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
        last = tl.max(tl.where(row_ok, offs_m, 0), 0)
        dq, d_rs, d_sl = _bwd_walk(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale,
                                   slope, rs, tau, c_total, g_r, tl.cdiv(last, BN), exit_at, 1, HAS_SLOPES,
                                   HAS_RS, GRAD_RS, GRAD_SL, DOT_PREC, D, BD, BM, BN)
        _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
                   GRAD_RS, GRAD_SL, D)


def _lists_forward(pb: Problem, save: bool, tuning: dict | None = None, drop: bool = False):
    """Sieve's forward by candidate lists (``drop``: the remainder nowhere, else on the diagonal): ``(out, ncand,
    saved)``, ``ncand`` as ``entmax._lists_forward``'s,
    ``saved`` None unless ``save``, else what ``SieveListsAttention.backward`` reads: ``(rem, tau, lists,
    nsup, rows, count, o32, o32_stride)``. The first stage and the Newton passes of entmax's list forward
    with the strict keys ``j < r``, then ``_lists_kernel`` on the listed rows and ``_open_kernel`` on the
    others (among them row 0, which sees no key: ``tau = +inf``, the whole stick on the diagonal, or with
    ``drop`` an output of zeros).

    What the backward keeps: the lists, which then hold the listed rows' supports (``_lists_kernel``); and
    only the open rows' fp32 outputs (the listed rows' backward needs none), kept in the open rows' own unused
    list slots where a row fits in them (``D <= C``: ``o32_stride`` C), else in a ``[BH, T, D]`` buffer."""
    tau, ncand, lists, rows, count, config, opened = _lists_start(pb, 0.5, True, tuning=tuning)  # checks them
    usual = config["sieve_open"] or config["newton"]
    rows_per, finish_warps = config["finish"]
    size = lists.shape[-1]
    scan = bool(config["sieve_scan"])
    if not scan:
        rows_per = max(1, min(rows_per, 8192 // (size * size)))  # the [rows, C, C] suffix sums in registers
    out = torch.empty_like(pb.q)
    rem = pb.rows() if save else None
    nsup = torch.empty(pb.bh, pb.tokens, device=pb.q.device, dtype=torch.int32) if save else None
    o32, o32_stride = None, 0
    if save:
        if pb.head_dim <= size:
            o32, o32_stride = lists.view(torch.float32), size
        else:
            o32, o32_stride = torch.empty(pb.bh, pb.tokens, pb.head_dim, device=pb.q.device,
                                          dtype=torch.float32), pb.head_dim
    sl, rs = pb.opt(pb.slopes), pb.opt(pb.row_scale)
    common = dict(SAVE=save, HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, D=pb.head_dim,
                  BD=pb.block_d)
    _lists_kernel[(triton.cdiv(pb.tokens, rows_per), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(rem), sl, rs, tau, ncand, lists, pb.opt(nsup), pb.sm_scale, pb.tokens,
        pb.heads, 2 * size + 8, BR=rows_per, C=size, SCAN=scan, DROP=drop, num_warps=finish_warps, **common)
    # read only now (the lists kernel queued): the few-rows tiles where the open rows are few (``few_open``)
    few = bool(config["sieve_open_few"] or _phases(config, "sieve_phases", pb.tokens)) and opened.few()
    tiles = tuple(config["sieve_open_few"] if few and config["sieve_open_few"] else usual)
    _open_walk(pb, config, tiles, few, out, o32, o32_stride, rem, tau, rows, count, lists, save, drop)
    saved = (rem, tau, lists, nsup, rows, count, o32, o32_stride) if save else None
    return out, ncand, saved


class SieveListsAttention(torch.autograd.Function):
    """Sieve by ``_lists_forward``, with its backward by the same lists: ``_lists_bwd_kernel`` on the listed
    rows, ``_open_bwd_kernel`` on the open ones (disjoint rows: each row's ``dq`` is stored once; dk and dv
    add up in fp32 buffers). Called as ``StickBreakingAttention`` with ``tau`` None; gradients flow to q, k,
    v, ``slopes`` and ``row_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, weights_only=False, tuning=None, drop=False):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        save = any(ctx.needs_input_grad[:5])
        drop = bool(drop)
        out, _, saved = _lists_forward(pb, save, tuning, drop)
        if save:
            rem, tau, lists, nsup, rows, count, o32, o32_stride = saved
            ctx.save_for_backward(pb.q, pb.k, pb.v, pb.slopes, pb.row_scale, rem, tau, lists, nsup, rows,
                                  count, o32)
            ctx.consts = (pb.sm_scale, o32_stride, drop)
            config = launch_config(pb.block_d, tuning)
            ctx.launch = (config["list_backward"], config["open_backward"])
            ctx.rs_shape = None if row_scale is None else row_scale.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, slopes, row_scale, rem, tau, lists, nsup, rows, count, o32 = ctx.saved_tensors
        sm_scale, o32_stride, drop = ctx.consts
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        do = dout.contiguous()
        grad_rs, grad_sl, dq, dk32, dv32, d_rs, d_sl = grad_buffers(ctx, pb)
        size = lists.shape[-1]
        (elements, warps), (bm, bn, open_warps, stages) = ctx.launch
        rows_per = 1 << max(0, (elements // (size * pb.block_d)).bit_length() - 1)  # a power of two
        warps *= max(1, rows_per * size * pb.block_d // elements)  # one row past the budget: more warps
        common = dict(HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None, GRAD_RS=grad_rs,
                      GRAD_SL=grad_sl, D=pb.head_dim, BD=pb.block_d, DROP=drop)
        sl, rs = pb.opt(slopes), pb.opt(row_scale)
        _lists_bwd_kernel[(triton.cdiv(pb.tokens, rows_per), pb.bh)](
            q, k, v, do, dq, dk32, dv32, sl, rs, pb.opt(d_rs), pb.opt(d_sl), nsup, lists, sm_scale, pb.tokens,
            pb.heads, BR=rows_per, C=size, num_warps=warps, **common)
        _open_bwd_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
            q, k, v, do, dq, dk32, dv32, o32, sl, rs, tau, pb.opt(d_rs), pb.opt(d_sl), rows, count, sm_scale,
            pb.tokens, pb.heads, o32_stride, EXIT_AT, DOT_PREC=pb.dot_prec, BM=bm, BN=bn,
            num_warps=open_warps, num_stages=stages, **common)
        if not drop:
            dv32.addcmul_(rem.unsqueeze(-1), do)
        dk = dk32.to(k.dtype)
        del dk32  # the next cast's buffer takes its place
        dv = dv32.to(v.dtype)
        del dv32
        g_sl, g_rs = param_grads(d_sl, d_rs, ctx.rs_shape)
        return dq, dk, dv, g_sl, g_rs, None, None, None, None, None


# How the path without lists finds Sieve's threshold (``sieve_attention``'s tuning key ``threshold``)
THRESHOLDS = ("search", "short_rows")


def sieve_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=SIEVE_ALPHA,
                    remainder=SIEVE_REMAINDER, tuning: dict | None = None):
    """Sieve attention, ``[B, H, T, D]`` causal (``alpha`` must be 1.5); what is left of the stick goes on the
    query's own value (``remainder="diagonal"``) or nowhere (``"drop"``: Eq. 7, the weights over the earlier keys
    only; row 0 gives zeros). By candidate lists where entmax's
    list forward applies (``lists`` of the launch settings, ``entmax/config.py``; ``tuning`` replaces some of
    them), else the threshold, then the filtered stick-breaking forward over all keys; there ``tuning``'s
    ``walk`` (a dict of ``stickbreaking.op.launch_config``'s keys, e.g. ``{"fwd": [64, 32, 4, 2]}``) sets that walk's
    launch settings, and ``threshold`` how ``tau`` is found: ``search`` (``threshold.entmax_threshold``, its
    Newton passes over key tiles) or ``short_rows`` (``entmax.short_rows.sieve_threshold``, every row's keys in
    registers, up to :data:`entmax.short_rows.SHORT_ROWS_MAX_TOKENS` tokens; the search past them). The training step
    takes ``short_rows`` (``lengthbench/compile_policy.py``)."""
    if float(alpha) != 1.5:
        raise ValueError(f"the sieve kernel implements alpha = 1.5 only, got {alpha}")
    if remainder not in REMAINDERS:
        raise ValueError(f"sieve: remainder must be one of {list(REMAINDERS)}, got {remainder!r}")
    drop = remainder == "drop"
    tuning = dict(tuning or {})
    walk = tuning.pop("walk", None)
    threshold = tuning.pop("threshold", "search")
    if walk is not None and not isinstance(walk, dict):
        raise ValueError(f"sieve tuning: walk must be a dict of stick-breaking launch settings, got {walk!r}")
    if threshold not in THRESHOLDS:
        raise ValueError(f"sieve tuning: threshold must be one of {list(THRESHOLDS)}, got {threshold!r}")
    if _lists_apply(q, tuning):
        if walk is not None or threshold != "search":
            raise ValueError("sieve tuning: walk and threshold set the path without lists (the threshold, then the "
                             "walk), which the list path does not take (set lists to false, or sieve_open for the "
                             "list path's open rows)")
        return SieveListsAttention.apply(q, k, v, slopes, row_scale, None, sm_scale, False, tuning, drop)
    with torch.no_grad():
        if threshold == "short_rows" and q.shape[-2] <= SHORT_ROWS_MAX_TOKENS:
            tau = sieve_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale)
        else:
            tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, strict=True,
                                   tuning=tuning)
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, False, walk, drop)
