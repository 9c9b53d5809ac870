"""1.5-entmax attention over short rows (at most :data:`SHORT_ROWS_MAX_TOKENS` keys), each row's keys whole in
registers, and Sieve's Section 3 threshold so found.

At the papers' training lengths (64: 66-131 tokens a sample) a training batch is thousands of short heads
(``batch x heads``, 2,048 at the MQMTAR paper model's batch 128). The long-context op (``entmax/op.py``) searches
thresholds over key tiles it never holds at once; on such heads its per-program overheads dominate. Here the keys
and values of a head stay in registers and the query rows go through in blocks of ``BM`` against all ``TP`` keys a
causal row of their range can see at once: rows ``[0, 32)``, ``[32, 64)``, ``[64, 128)`` and ``[128, 256)`` are
separate launches against 32, 64, 128 and 256 keys. A range that the tokens cut short goes against two tiles: the
keys before its first row, and its own rows' keys rounded up to a power of two (Copy's rows ``[128, 131)`` against
128 + 16 keys rather than 256, MQRAR's ``[64, 83)`` against 64 + 32). So

- 1.5-entmax's threshold is found on the row itself: Newton's steps on ``||(X - tau)_+||_2 = 1`` from ``max X -
  1`` (below the root: convex and decreasing, so the steps rise to it without overshooting), then the exact root
  on the support they found;
- a forward program takes one row block of one head (``BM`` rows: 2,048 scores a tile, kept in registers without
  spilling), so that a batch is thousands of short programs; a backward program takes one row block and adds its
  shares of ``dk`` and ``dv`` to fp32 buffers by atomic adds (where the rows are one launch, ``backward = "head"``
  takes one head a program instead, its row blocks in turn, ``dk`` and ``dv`` summed in registers); every launch
  is sized by the shapes alone (a CUDA graph records it).

The forward keeps one fp32 number per row for the backward (``tau``, the threshold); everything else is recomputed.
Where there is a row scale (ASEntmax, SSMax-scaled entmax) and the rows are :data:`ROWWISE_FROM` keys or wider, the
backward is instead the key-tiled one of ``utils/rowwise.py``, the forward then also keeping ``sum s``, ``sum
s^2`` and ``sum s v`` a row (``entmax_backward``). Gradients, with ``g_j = do_r.v_j``, ``s = (z / 2 - tau)_+``,
``w = s^2``: ``dz = s (g - sum(s g) / sum(s))``; ``dq = sm_scale rs dz k``, ``dk = sm_scale sum_r rs_r dz_r
q_r``, ``dv = w^T do``; ``row_scale`` and the ALiBi slopes take ``dz`` times the biased score and ``-rs (r -
j)``.

The long-context op stays what validation and scoring call; ``entmax_attention(..., tuning={"short_rows":
True})`` takes these kernels where the rows fit them (the training step's launch settings,
``lengthbench/compile_policy.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.defaults import ENTMAX_ALPHA
from lengthbench.kernels.utils.common import Problem, reduce_slopes, score_tile
from lengthbench.kernels.utils.rowwise import ENTMAX, launch_settings, rowwise_backward

# The widest rows these kernels take: a [BM, TP] fp32 tile a tensor, BM * TP = 4,096 elements.
SHORT_ROWS_MAX_TOKENS = 256
NEWTON_STEPS = tl.constexpr(16)  # at most (``_entmax_tau``)
# The step of Newton's below which ``_entmax_tau`` tries the exact root on the support that step found (and where
# that root fails on a row, steps on to 1e-6 and tries again; the thresholds are those of steps to 1e-6): the tuning
# key ``newton_tol``.
NEWTON_TOL = 1e-2
# The backward (``entmax_backward``): ``narrow`` (a row block a program against all keys), ``rowwise`` (the
# forward also keeps ``sum s``, ``sum s^2`` and ``sum s v`` a row, and the dq and dk/dv kernels of
# ``utils/rowwise.py`` run on them, key tiles against query tiles as in FlashAttention's backward) or ``auto``:
# ``rowwise`` where there is a row scale and the rows are ``ROWWISE_FROM`` keys or wider, else ``narrow``.
ENTMAX_BACKWARD = "auto"
ROWWISE_FROM = 129
# The ``rowwise`` backward without its dq kernel (``rowwise_fused``): the dk/dv kernel adds each (query tile, key
# tile) pair's share of dq and of the per-row gradients atomically, so the scores and their gradients are computed
# once instead of twice.
ROWWISE_FUSED = True


def entmax_backward_taken(setting: str, row_scale: bool, tokens: int) -> str:
    """``narrow`` or ``rowwise``: the backward that ``setting`` (``narrow``, ``rowwise``, ``auto`` (bounded by
    :data:`ROWWISE_FROM`) or ``auto:<keys>``) gives rows of ``tokens`` keys, with or without a row scale."""
    mode, _, start = str(setting).partition(":")
    if mode == "auto":
        return "rowwise" if row_scale and tokens >= int(start or ROWWISE_FROM) else "narrow"
    if mode not in ("narrow", "rowwise"):
        raise ValueError(f"entmax_backward must be auto, narrow or rowwise, got {mode!r}")
    return mode


def _row_block(width: int, block_d: int) -> tuple[int, int]:
    """(query rows a program, warps) for ``width`` padded keys: over at most 128 keys 16 rows and 2 warps (on an
    H200 at 128 x 16 heads x 83 tokens x 16, forward+backward 0.44 ms against 0.56-0.77 with 32 rows and 4 warps);
    wider, 2,048 scores a tile (no register spills; 16 rows at least, 32 at head dims under 32) and 4 warps (at 256
    keys the 2-warp backward spills)."""
    if width <= 128:
        return 16, 2
    return max(16 if block_d >= 32 else 32, min(64, 2048 // width)), 4


@triton.jit
def _power_sums(x, tau):
    """``sum s`` and ``sum s^2`` a row, ``s = (x - tau)_+`` (``x`` is ``-inf`` where a key is not seen)."""
    s = tl.maximum(x - tau[:, None], 0.0)
    return tl.sum(s, 1), tl.sum(s * s, 1)


@triton.jit
def _support_sums(x, tau):
    """Over the entries of the support (above ``tau``): their count, sum, sum of squares and least value a row."""
    sup = x > tau[:, None]
    xs = tl.where(sup, x, 0.0)
    return (tl.sum(sup.to(tl.float32), 1), tl.sum(xs, 1), tl.sum(xs * xs, 1),
            tl.min(tl.where(sup, x, float("inf")), 1))


@triton.jit
def _newton(x, x2, tau, some, steps, moved, tol, TW: tl.constexpr):
    """Newton's steps on ``sqrt(sum (X - tau)_+^2) = 1`` from ``tau`` (below the root: the steps rise to it), until
    no row's threshold moves by more than ``tol`` or :data:`NEWTON_STEPS` are taken: ``(tau, steps, moved)``."""
    while (steps < NEWTON_STEPS) & (moved > tol):
        s1, s2 = _power_sums(x, tau)
        if TW > 0:
            t1, t2 = _power_sums(x2, tau)
            s1 += t1
            s2 += t2
        step = tl.where(some & (s1 > 0), (s2 - tl.sqrt(s2)) / tl.where(s1 > 0, s1, 1.0), 0.0)
        tau = tau + step
        moved = tl.max(step, 0)
        steps += 1
    return tau, steps, moved


@triton.jit
def _exact_root(x, x2, tau, some, TW: tl.constexpr):
    """The exact root on the support above ``tau`` (the entries above it): ``(root, good)``, ``good`` where it
    leaves no element of that support below it (then that support is the root's own: from below the root, a
    support with an entry too many puts the root of its quadratic above that entry)."""
    cnt, s1, s2, low = _support_sums(x, tau)
    if TW > 0:
        c2, t1, t2, low2 = _support_sums(x2, tau)
        cnt += c2
        s1 += t1
        s2 += t2
        low = tl.minimum(low, low2)
    disc = s1 * s1 - cnt * (s2 - 1.0)
    exact = (s1 - tl.sqrt(tl.maximum(disc, 0.0))) / tl.where(cnt > 0, cnt, 1.0)
    good = some & (cnt > 0) & (disc >= 0) & (exact < low) & (exact >= tau - 1e-3)
    return exact, good


@triton.jit
def _entmax_tau(x, x2, TW: tl.constexpr, NT: tl.constexpr):
    """The 1.5-entmax threshold of each row of ``x`` (``X = z / 2``), and where ``TW`` over the second tile ``x2``
    too: ``tau`` with ``sum (X - tau)_+^2 = 1``; ``+inf`` for a row that sees no key. Newton's steps from ``max X -
    1`` until no row's threshold moves by ``NT``, then the exact root on the support found; where ``NT`` is above
    1e-6 and that root does not hold on every row, more steps until none moves by 1e-6, then the exact root again
    (the same threshold as ``NT`` 1e-6 gives: the root depends on the support only).

    ``x`` and ``x2`` hold ``-inf`` on the keys a row does not see, so that no pass masks them again (``(x - tau)_+``
    is 0 there); with the weights divided on the output's ``[BM, D]`` rather than on ``[BM, TP]``
    (``_fwd_kernel``), that took Copy's training step at batch 512 (paper model, H200) from 78,191 to 84,091
    samples/s with 1.5-entmax, 71,279 to 77,048 with ASEntmax and 73,774 to 76,003 with Sieve's Section 3 form
    (whose threshold kernel is this; softmax + RoPE 93,746 and 93,176 beside them)."""
    top = tl.max(x, 1)
    if TW > 0:
        top = tl.maximum(top, tl.max(x2, 1))
    some = top > float("-inf")
    tau = tl.where(some, top - 1.0, 0.0)
    # quadratic near the root: 3-6 steps on most rows to 1e-6
    steps = tl.full([], 0, tl.int32)  # (tensors: loop-carried through _newton)
    moved = tl.full([], 1.0, tl.float32)
    tau, steps, moved = _newton(x, x2, tau, some, steps, moved, NT, TW)
    exact, good = _exact_root(x, x2, tau, some, TW)
    if NT > 1e-6:
        if tl.min(tl.where(some & ~good, 0, 1), 0) == 0:
            tau, steps, moved = _newton(x, x2, tau, some, steps, moved, 1e-6, TW)
            exact, good = _exact_root(x, x2, tau, some, TW)
    tau = tl.where(good, exact, tau)
    return tl.where(some, tau, float("inf"))


@triton.jit
def _row_weights(z, z2, offs_m, offs_n, offs_t, T, tau_in, FROM_TAU: tl.constexpr, TW: tl.constexpr,
                 NT: tl.constexpr):
    """The 1.5-entmax weights of a row block against keys ``offs_n`` (scores ``z``) and, where ``TW``, the keys
    ``offs_t`` after them (``z2``): ``(w, s, in_row, w2, s2, in_row2, den, tau)``, the first three of the first
    tile, the next three of the second (the first's again where there is none): ``s = (z / 2 - tau)_+``, ``w =
    s^2`` before its division by ``den``, the sum of ``s^2`` (each caller divides), ``in_row`` the keys the row
    sees, ``tau`` the threshold (taken from ``tau_in`` where ``FROM_TAU``, else computed)."""
    in_row = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T)
    if TW > 0:
        in_row2 = (offs_t[None, :] <= offs_m[:, None]) & (offs_t[None, :] < T)
    else:
        in_row2 = in_row
    tau = tau_in
    x = tl.where(in_row, z * 0.5, float("-inf"))
    x2 = tl.where(in_row2, z2 * 0.5, float("-inf"))
    if not FROM_TAU:
        tau = _entmax_tau(x, x2, TW, NT)
    s = tl.maximum(x - tau[:, None], 0.0)
    w = s * s
    den = tl.sum(w, 1)
    if TW > 0:
        s2 = tl.maximum(x2 - tau[:, None], 0.0)
        w2 = s2 * s2
        den += tl.sum(w2, 1)
    else:
        s2, w2 = s, w
    return w, s, in_row, w2, s2, in_row2, den, tau


@triton.jit
def _head_rows(Q, SL, RS, base, bh, pid_m, T, R_END, H, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
               D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    """Row block ``pid_m`` of head ``bh``: ``(offs_m, offs_d, row_ok, rmask, q, slope, rs)``."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < R_END
    rmask = row_ok[:, None] & (offs_d < D)[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    return offs_m, offs_d, row_ok, rmask, q, slope, rs


@triton.jit
def _weights_dot(w, v, DOT_PREC: tl.constexpr):
    """``w @ v`` for fp32 weights ``w``: in fp32 for fp32 inputs, else with the weights in two halves (hi + lo), as
    accurate as the fp32 weights give it."""
    if DOT_PREC == "ieee":
        out = tl.dot(w, v.to(tl.float32), input_precision=DOT_PREC)
    else:
        w_hi = w.to(v.dtype)
        out = tl.dot(w_hi, v) + tl.dot((w - w_hi.to(tl.float32)).to(v.dtype), v)
    return out


@triton.jit
def _fwd_kernel(Q, K, V, Out, TAU, SL, RS, M, L, U, sm_scale, T, H, M0, R_END, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr, SAVE: tl.constexpr, STATS: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, TP: tl.constexpr, TW: tl.constexpr,
                NT: tl.constexpr):
    """One row block against the keys ``[0, TP)`` and, where ``TW``, ``[TP, TP + TW)``: the output, ``tau`` where
    ``SAVE``; with ``STATS`` (1.5-entmax) also what ``utils/rowwise.py``'s backward reads: ``M = sum s``, ``L = sum
    s^2`` and ``U = sum s v`` (fp32)."""
    pid_m = tl.program_id(0) + M0
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, rmask, q, slope, rs = _head_rows(Q, SL, RS, base, bh, pid_m, T, R_END, H, HAS_SLOPES,
                                                             HAS_RS, D, BD, BM)
    k, v, offs_n, _, _ = _head_keys(K, V, base, 0, T, D, BD, TP)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    if TW > 0:
        k2, v2, offs_t, _, _ = _head_keys(K, V, base, TP, T, D, BD, TW)
        z2, zb2 = score_tile(q, k2, offs_m, offs_t, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    else:
        k2, v2, offs_t, z2 = k, v, offs_n, z
    w, a, active, w2, a2, active2, rem, tau = _row_weights(z, z2, offs_m, offs_n, offs_t, T, rs, False, TW, NT)
    acc = _weights_dot(w, v, DOT_PREC)
    if TW > 0:
        acc += _weights_dot(w2, v2, DOT_PREC)
    # (the weights come undivided: the division on the output's [BM, D], not on [BM, TP])
    acc = acc / tl.where(rem > 0, rem, 1.0)[:, None]
    tl.store(Out + base + offs_m[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=rmask)
    if SAVE:
        tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)
    if STATS:  # (``a`` holds s = (z / 2 - tau)_+, ``rem`` the sum of s^2 before the division)
        u = _weights_dot(a, v, DOT_PREC)
        s_sum = tl.sum(a, 1)
        if TW > 0:
            u += _weights_dot(a2, v2, DOT_PREC)
            s_sum += tl.sum(a2, 1)
        tl.store(U + base + offs_m[:, None] * D + offs_d[None, :], u, mask=rmask)
        tl.store(M + bh * T + offs_m, s_sum, mask=row_ok)
        tl.store(L + bh * T + offs_m, rem, mask=row_ok)


@triton.jit
def _tau_kernel(Q, K, TAU, SL, RS, sm_scale, T, H, M0, R_END, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, TP: tl.constexpr,
                TW: tl.constexpr, NT: tl.constexpr):
    """Sieve's filter threshold of one row block (Section 3): ``tau`` of 1.5-entmax over the keys ``j < r``
    (``_entmax_tau`` on ``X = z / 2``, the keys ``[0, TP)`` and, where ``TW``, ``[TP, TP + TW)`` in registers);
    ``+inf`` on a row that sees no key."""
    pid_m = tl.program_id(0) + M0
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, rmask, q, slope, rs = _head_rows(Q, SL, RS, base, bh, pid_m, T, R_END, H, HAS_SLOPES,
                                                             HAS_RS, D, BD, BM)
    offs_n = tl.arange(0, TP)
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :],
                mask=(offs_n < T)[:, None] & (offs_d < D)[None, :], other=0.0)
    z, _ = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    earlier = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
    if TW > 0:
        offs_t = TP + tl.arange(0, TW)
        k2 = tl.load(K + base + offs_t[:, None] * D + offs_d[None, :],
                     mask=(offs_t < T)[:, None] & (offs_d < D)[None, :], other=0.0)
        z2, _ = score_tile(q, k2, offs_m, offs_t, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        earlier2 = (offs_t[None, :] < offs_m[:, None]) & (offs_t[None, :] < T)
    else:
        z2, earlier2 = z, earlier
    tau = _entmax_tau(tl.where(earlier, z * 0.5, float("-inf")), tl.where(earlier2, z2 * 0.5, float("-inf")), TW, NT)
    tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)


@triton.jit
def _tile_grads(dz, w, q, k, do, rs, DOT_PREC: tl.constexpr):
    """For one tile of keys ``k``: ``(dq, dk, dv)`` from the score gradients ``dz`` and weights ``w`` (``dk``
    before ``sm_scale``), fp32."""
    dzs = dz * rs[:, None]
    if DOT_PREC == "ieee":
        dq = tl.dot(dzs, k.to(tl.float32), input_precision=DOT_PREC)
        dk = tl.dot(tl.trans(dzs), q.to(tl.float32), input_precision=DOT_PREC)
        dv = tl.dot(tl.trans(w), do.to(tl.float32), input_precision=DOT_PREC)
    else:
        dq = tl.dot(dzs.to(k.dtype), k)
        dk = tl.dot(tl.trans(dzs).to(q.dtype), q)
        dv = tl.dot(tl.trans(w).to(do.dtype), do)
    return dq, dk, dv


@triton.jit
def _bwd_block(Q, DO, DQ, TAU, RS, DRS, DSL, k, v, k2, v2, slope, base, bh, pid_m, sm_scale, T, R_END,
               HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr,
               DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, TP: tl.constexpr,
               TW: tl.constexpr):
    """Row block ``pid_m`` of head ``bh`` against the keys ``k`` (``[0, TP)``) and values ``v``, and where ``TW``
    ``k2``/``v2`` (``[TP, TP + TW)``): stores its ``dq`` (and the per-row gradients of the row scale and slopes),
    returns its shares of ``dk`` (before ``sm_scale``) and ``dv`` of each tile, ``(dk, dv, dk2, dv2)``, fp32 (the
    second pair the first again where there is no second tile)."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, TP)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < R_END
    rmask = row_ok[:, None] & (offs_d < D)[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    do = tl.load(DO + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    if TW > 0:
        offs_t = TP + tl.arange(0, TW)
        z2, zb2 = score_tile(q, k2, offs_m, offs_t, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    else:
        offs_t, z2, zb2 = offs_n, z, zb
    w, a, active, w2, a2, active2, rem, tau = _row_weights(z, z2, offs_m, offs_n, offs_t, T, tau, True, TW, 1e-6)
    g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
    if TW > 0:
        g2 = tl.dot(do, tl.trans(v2), input_precision=DOT_PREC)
    else:
        g2 = g
    norm = tl.where(rem > 0, rem, 1.0)[:, None]
    w = w / norm
    if TW > 0:
        w2 = w2 / norm
    else:
        w2 = w
    s_sum = tl.sum(a, 1)
    sg = tl.sum(a * g, 1)
    if TW > 0:
        s_sum += tl.sum(a2, 1)
        sg += tl.sum(a2 * g2, 1)
    mean = sg / tl.where(s_sum > 0, s_sum, 1.0)
    dz = tl.where(active, a * (g - mean[:, None]), 0.0)
    dz2 = tl.where(active2, a2 * (g2 - mean[:, None]), 0.0)
    dz = tl.where(row_ok[:, None], dz, 0.0)
    w = tl.where(row_ok[:, None], w, 0.0)
    dq, dk, dv = _tile_grads(dz, w, q, k, do, rs, DOT_PREC)
    drs = tl.sum(dz * zb, 1)
    dsl = tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
    if TW > 0:
        dz2 = tl.where(row_ok[:, None], dz2, 0.0)
        w2 = tl.where(row_ok[:, None], w2, 0.0)
        dq2, dk2, dv2 = _tile_grads(dz2, w2, q, k2, do, rs, DOT_PREC)
        dq += dq2
        drs += tl.sum(dz2 * zb2, 1)
        dsl += tl.sum(dz2 * (offs_m[:, None] - offs_t[None, :]).to(tl.float32), 1)
    else:
        dk2, dv2 = dk, dv
    tl.store(DQ + base + offs_m[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rmask)
    if GRAD_RS:
        tl.store(DRS + bh * T + offs_m, drs, mask=row_ok)
    if GRAD_SL:
        tl.store(DSL + bh * T + offs_m, -dsl * rs, mask=row_ok)
    return dk, dv, dk2, dv2


@triton.jit
def _head_keys(K, V, base, start, T, D: tl.constexpr, BD: tl.constexpr, TP: tl.constexpr):
    """Keys and values ``[start, start + TP)`` of the head at ``base`` (``[TP, BD]``, zero past ``T``), their
    offsets, element offsets and mask."""
    offs_n = start + tl.arange(0, TP)
    offs_d = tl.arange(0, BD)
    kv_mask = (offs_n < T)[:, None] & (offs_d < D)[None, :]
    kv_off = base + offs_n[:, None] * D + offs_d[None, :]
    k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    return k, v, offs_n, kv_off, kv_mask


@triton.jit
def _bwd_kernel(Q, K, V, DO, DQ, DK, DV, TAU, SL, RS, DRS, DSL, sm_scale, T, H, M0, R_END, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, TP: tl.constexpr, TW: tl.constexpr):
    """``blocks`` layout: one row block a program; its shares of ``dk``/``dv`` added to the fp32 ``DK``/``DV``
    (atomic adds, only the keys up to the block's last row)."""
    pid_m = tl.program_id(0) + M0
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    k, v, offs_n, kv_off, kv_mask = _head_keys(K, V, base, 0, T, D, BD, TP)
    if TW > 0:
        k2, v2, offs_t, kv_off2, kv_mask2 = _head_keys(K, V, base, TP, T, D, BD, TW)
    else:
        k2, v2 = k, v
    dk, dv, dk2, dv2 = _bwd_block(Q, DO, DQ, TAU, RS, DRS, DSL, k, v, k2, v2, slope, base, bh, pid_m, sm_scale, T,
                                  R_END, HAS_SLOPES, HAS_RS, GRAD_RS, GRAD_SL, DOT_PREC, D, BD, BM, TP, TW)
    last = pid_m * BM + BM - 1
    kv_mask = kv_mask & (offs_n <= last)[:, None]
    tl.atomic_add(DK + kv_off, dk * sm_scale, mask=kv_mask, sem="relaxed")
    tl.atomic_add(DV + kv_off, dv, mask=kv_mask, sem="relaxed")
    if TW > 0:
        kv_mask2 = kv_mask2 & (offs_t <= last)[:, None]
        tl.atomic_add(DK + kv_off2, dk2 * sm_scale, mask=kv_mask2, sem="relaxed")
        tl.atomic_add(DV + kv_off2, dv2, mask=kv_mask2, sem="relaxed")


@triton.jit
def _bwd_head_kernel(Q, K, V, DO, DQ, DK, DV, TAU, SL, RS, DRS, DSL, sm_scale, T, H, HAS_SLOPES: tl.constexpr,
                     HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr,
                     D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, TP: tl.constexpr, TW: tl.constexpr):
    """``head`` layout (every row against all keys, one tile: ``TW`` 0): one head a program, its row blocks in
    turn, ``dk``/``dv`` summed in registers and stored once in the inputs' dtype (no atomics, no fp32 buffers to
    zero and cast)."""
    bh = tl.program_id(0)
    base = bh.to(tl.int64) * T * D
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    k, v, offs_n, kv_off, kv_mask = _head_keys(K, V, base, 0, T, D, BD, TP)
    dk = tl.zeros([TP, BD], dtype=tl.float32)
    dv = tl.zeros([TP, BD], dtype=tl.float32)
    for pid_m in range(0, tl.cdiv(T, BM)):
        dk_part, dv_part, _, _ = _bwd_block(Q, DO, DQ, TAU, RS, DRS, DSL, k, v, k, v, slope, base, bh, pid_m,
                                            sm_scale, T, T, HAS_SLOPES, HAS_RS, GRAD_RS, GRAD_SL, DOT_PREC, D, BD, BM,
                                            TP, 0)
        dk += dk_part
        dv += dv_part
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


def _row_ranges(tokens: int, split: bool, tail: bool = True) -> list[tuple[int, int, int, int]]:
    """``(first row, end row, keys, tail keys)`` of each launch: with ``split``, rows ``[0, 32)``, ``[32, 64)``,
    ``[64, 128)`` and ``[128, 256)`` (clipped to ``tokens``) against the 32, 64, 128 and 256 keys that causal rows
    below their end can see; else every row against all keys (the width rounded up to a power of two). With
    ``tail``, a range that ``tokens`` cuts short (rows ``[lo, hi)``, ``hi - lo`` at most half of ``lo``) goes against
    two tiles instead: the ``lo`` keys before its first row and the ``hi - lo`` from it, rounded up to a power of
    two (at least 16): Copy's rows ``[128, 131)`` against 128 + 16 keys rather than 256."""
    width = max(16, triton.next_power_of_2(tokens))
    if not split or width <= 32:
        return [(0, tokens, width, 0)]
    ranges, lo = [], 0
    for hi in (32, 64, 128, 256):
        if lo < tokens:
            end = min(hi, tokens)
            rest = max(16, triton.next_power_of_2(end - lo))
            if tail and lo and rest < lo:
                ranges.append((lo, end, lo, rest))
            else:
                ranges.append((lo, end, hi, 0))
        lo = hi
    return ranges


_LAUNCH_KEYS = ("bm", "warps", "stages", "bwd_bm", "bwd_warps", "bwd_stages")


def _launch(pb: Problem, tuning: dict | None) -> tuple[list[dict], list[dict] | tuple, str]:
    """Per launch (``_row_ranges``) the forward's and the backward's settings (``M0``, ``R_END``, ``BM``, ``TP``,
    ``TW``, ``BD``, ``NT``, warps, stages), and the backward's layout (``head`` or ``blocks``;
    ``blocks`` wherever the rows are split; ``rowwise`` where ``entmax_backward`` takes it, by default
    :data:`ENTMAX_BACKWARD`: the backward of ``utils/rowwise.py``, its launch settings its own).
    Tuning keys: ``bm``, ``warps``, ``stages`` (the forward's), ``bwd_bm``, ``bwd_warps``,
    ``bwd_stages`` (the backward's; None: the forward's), ``widths`` (``{keys: {those keys}}``: settings for the
    launch against that many keys only), ``bd`` (the head dim the tiles are padded to, a power of two at least the
    head dim's), ``backward``, ``entmax_backward``, ``rows`` (``split``: each row range against the keys it can
    see; ``whole``: one launch over every row and all keys), ``tail`` (a range cut short against two tiles,
    ``_row_ranges``; its ``widths`` entry is that of its whole range's keys), ``rowwise_bwd`` (``[BM, BN, warps]`` of the ``rowwise`` backward's kernels,
    ``utils.rowwise.launch_settings``; with that layout the backward's settings returned are these), ``rowwise_fused``
    (that backward without its dq kernel; by default :data:`ROWWISE_FUSED`), ``newton_tol`` (the
    step below which 1.5-entmax's threshold, ``_entmax_tau``, tries the exact root on its support: ``NT``;
    :data:`NEWTON_TOL` by default)."""
    config = dict(bm=None, warps=None, stages=None, bwd_bm=None, bwd_warps=None, bwd_stages=None, backward="head",
                  rows="split", tail=True, bd=None, widths=None, entmax_backward=ENTMAX_BACKWARD, rowwise_bwd=None,
                  rowwise_fused=ROWWISE_FUSED, newton_tol=NEWTON_TOL)
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(config))
    if unknown:
        raise ValueError(f"short-rows kernels: unknown tuning keys {unknown}; the keys are {sorted(config)}")
    config.update(tuning)
    if config["backward"] not in ("head", "blocks"):
        raise ValueError(f"short-rows kernels: backward must be head or blocks, got {config['backward']!r}")
    if config["entmax_backward"] not in ("auto", "narrow", "rowwise"):
        raise ValueError("short-rows kernels: entmax_backward must be auto, narrow or rowwise, got "
                         f"{config['entmax_backward']!r}")
    if config["rows"] not in ("split", "whole"):
        raise ValueError(f"short-rows kernels: rows must be split or whole, got {config['rows']!r}")
    widths = {int(width): dict(settings) for width, settings in (config["widths"] or {}).items()}
    for width, settings in widths.items():
        bad = sorted(set(settings) - set(_LAUNCH_KEYS))
        if bad:
            raise ValueError(f"short-rows kernels: widths[{width}] takes {list(_LAUNCH_KEYS)}, got {bad}")
    for settings in (config, *widths.values()):
        for key in ("bm", "bwd_bm"):
            value = settings.get(key)
            if value is not None and (int(value) < 16 or int(value) & (int(value) - 1)):
                raise ValueError(f"short-rows kernels: {key} must be a power of two >= 16, got {value!r}")
    block_d = pb.block_d
    if config["bd"] is not None:
        block_d = int(config["bd"])
        if block_d < pb.block_d or block_d & (block_d - 1):
            raise ValueError(f"short-rows kernels: bd must be a power of two >= {pb.block_d}, got {config['bd']!r}")
    rowwise_bwd = launch_settings(pb, {"bwd": config["rowwise_bwd"]})[1]
    if not isinstance(config["rowwise_fused"], bool):
        raise ValueError(f"short-rows kernels: rowwise_fused must be true or false, got {config['rowwise_fused']!r}")
    if not isinstance(config["tail"], bool):
        raise ValueError(f"short-rows kernels: tail must be true or false, got {config['tail']!r}")
    newton_tol = config["newton_tol"]
    if isinstance(newton_tol, bool) or not isinstance(newton_tol, (int, float)) or not 1e-6 <= newton_tol < 1:
        raise ValueError(f"short-rows kernels: newton_tol must be a number in [1e-6, 1), got {newton_tol!r}")
    ranges = _row_ranges(pb.tokens, config["rows"] == "split", config["tail"])
    fwd, bwd = [], []
    for lo, hi, width, rest in ranges:
        # a tail launch: the row block of its whole range's launch (2 lo keys; its rows capped to its own) and the
        # warps of one against its first tile (on an H100, Copy's rows [128, 131) with 1.5-entmax: 2 warps, as
        # against 128 keys, gave the training step 56,382 samples/s against 53,412 with the 4 of 256 keys)
        bm = _row_block(2 * lo if rest else width, block_d)[0]
        warps = _row_block(width, block_d)[1]
        # a row block stays inside its range (lo and the blocks are powers of two), and within a tail's rows
        cap = rest if rest else (lo if lo else width)
        own = widths.get(2 * lo if rest else width, {})  # (a tail launch: its range's keys, 2 lo)

        def setting(key, _own=own):
            return _own.get(key) if _own.get(key) is not None else config[key]

        for kind, out in (("", fwd), ("bwd_", bwd)):
            rows = int(setting(f"{kind}bm") or setting("bm") or bm)
            rows = min(rows, max(16, cap))
            launch = dict(M0=lo // rows, R_END=hi, BM=rows, TP=width, TW=rest, BD=block_d,
                          num_warps=int(setting(f"{kind}warps") or setting("warps") or warps))
            if not kind:  # (the forward finds the thresholds; the backward reads them)
                launch["NT"] = float(newton_tol)
            stages = setting(f"{kind}stages") if setting(f"{kind}stages") is not None else setting("stages")
            if stages is not None:
                launch["num_stages"] = int(stages)
            out.append(launch)
    layout = config["backward"] if len(ranges) == 1 else "blocks"
    if entmax_backward_taken(config["entmax_backward"], pb.row_scale is not None, pb.tokens) == "rowwise":
        layout, bwd = "rowwise", rowwise_bwd
    return fwd, bwd, layout


class EntmaxShortRowsAttention(torch.autograd.Function):
    """1.5-entmax over rows of at most :data:`SHORT_ROWS_MAX_TOKENS` keys. Gradients flow to q, k, v, ``slopes``
    and ``row_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, sm_scale, tuning):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        if pb.tokens > SHORT_ROWS_MAX_TOKENS:
            raise ValueError(f"the short-rows kernels take at most {SHORT_ROWS_MAX_TOKENS} tokens, got {pb.tokens}")
        launch, bwd_launch, layout = _launch(pb, tuning)
        save = any(ctx.needs_input_grad[:5])
        stats = save and layout == "rowwise"
        out = torch.empty_like(pb.q)
        tau = pb.rows()
        m, den = (pb.rows(), pb.rows()) if stats else (None, None)
        u = torch.empty(pb.q.shape, device=pb.q.device, dtype=torch.float32) if stats else None
        common = dict(HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, DOT_PREC=pb.dot_prec,
                      D=pb.head_dim)
        for part in launch:
            grid = (triton.cdiv(part["R_END"] - part["M0"] * part["BM"], part["BM"]), pb.bh)
            _fwd_kernel[grid](pb.q, pb.k, pb.v, out, tau, pb.opt(pb.slopes), pb.opt(pb.row_scale), pb.opt(m),
                              pb.opt(den), pb.opt(u), pb.sm_scale, pb.tokens, pb.heads, SAVE=save,
                              STATS=stats, **common, **part)
        if save:
            ctx.rs_shape = None if row_scale is None else row_scale.shape
            fused = bool((tuning or {}).get("rowwise_fused", ROWWISE_FUSED))
            ctx.consts = (pb.sm_scale, common, bwd_launch, layout, fused)
            if stats:  # the state RowwiseAttention keeps for ENTMAX: its backward runs on it
                ctx.save_for_backward(pb.q, pb.k, pb.v, out, pb.slopes, pb.row_scale, tau, m, den, u)
            else:
                ctx.save_for_backward(pb.q, pb.k, pb.v, tau, pb.slopes, pb.row_scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        sm_scale, common, launch, layout, fused = ctx.consts
        if layout == "rowwise":
            dq, dk, dv, g_sl, g_rs, _ = rowwise_backward(
                dout, ctx.saved_tensors, sm_scale, ENTMAX, 2.0, grad_slopes=ctx.needs_input_grad[3],
                grad_rs=ctx.needs_input_grad[4], grad_tau=False, rs_shape=ctx.rs_shape, tau_shape=None,
                launch=launch, fused=fused)
            return dq, dk, dv, g_sl, g_rs, None, None
        q, k, v, tau, slopes, row_scale = ctx.saved_tensors
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        grad_sl = slopes is not None and ctx.needs_input_grad[3]
        grad_rs = row_scale is not None and ctx.needs_input_grad[4]
        dq = torch.empty_like(q)
        d_sl = pb.rows() if grad_sl else None
        d_rs = pb.rows() if grad_rs else None
        args = (pb.opt(d_rs), pb.opt(d_sl), sm_scale, pb.tokens, pb.heads)
        flags = dict(GRAD_RS=grad_rs, GRAD_SL=grad_sl, **common)
        do = dout.contiguous()
        if layout == "head":
            (part,) = launch
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            _bwd_head_kernel[(pb.bh,)](q, k, v, do, dq, dk, dv, tau, pb.opt(slopes), pb.opt(row_scale), *args,
                                       **flags, **{key: value for key, value in part.items()
                                                   if key not in ("M0", "R_END")})
        else:
            # dk and dv accumulate in one fp32 buffer (one fill a call, not two); cast apart, as outputs that share no
            # memory (the compiled graph's custom op refuses aliased outputs)
            dkv = torch.zeros((2, *q.shape), device=q.device, dtype=torch.float32)
            for part in launch:  # each row range adds its shares of dk and dv
                grid = (triton.cdiv(part["R_END"] - part["M0"] * part["BM"], part["BM"]), pb.bh)
                _bwd_kernel[grid](q, k, v, do, dq, dkv[0], dkv[1], tau, pb.opt(slopes), pb.opt(row_scale), *args,
                                  **flags, **part)
            dk, dv = dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        g_sl = reduce_slopes(d_sl) if grad_sl else None
        g_rs = None
        if grad_rs:
            g_rs = d_rs
            while g_rs.dim() > len(ctx.rs_shape):
                g_rs = g_rs.sum(0)
            g_rs = g_rs.sum_to_size(ctx.rs_shape)
        return dq, dk, dv, g_sl, g_rs, None, None


# the keys of a forward launch (``_launch``) that the threshold kernel takes
_TAU_LAUNCH = ("M0", "R_END", "BD", "BM", "TP", "TW", "NT", "num_warps", "num_stages")


def sieve_threshold(q, k, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None) -> torch.Tensor:
    """Sieve's filter threshold (Section 3) over at most :data:`SHORT_ROWS_MAX_TOKENS` tokens: ``tau`` ``[B, H, T]``
    fp32 of 1.5-entmax over each row's keys ``j < r`` on the scale ``X = z / 2`` (``+inf`` for row 0), as
    ``threshold.entmax_threshold(..., strict=True)`` finds it, with every row's keys in registers
    (``_entmax_tau``: Newton's steps, then the exact root on the support) in the row ranges and row blocks of
    1.5-entmax's forward (``_launch``; ``tuning`` its keys). No gradient."""
    pb = Problem(q, k, k, slopes, row_scale, sm_scale)
    if pb.tokens > SHORT_ROWS_MAX_TOKENS:
        raise ValueError(f"the short-rows kernels take at most {SHORT_ROWS_MAX_TOKENS} tokens, got {pb.tokens}")
    launch, _, _ = _launch(pb, tuning)
    tau = pb.rows()
    for part in launch:
        grid = (triton.cdiv(part["R_END"] - part["M0"] * part["BM"], part["BM"]), pb.bh)
        _tau_kernel[grid](pb.q, pb.k, tau, pb.opt(pb.slopes), pb.opt(pb.row_scale), pb.sm_scale, pb.tokens, pb.heads,
                          HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, DOT_PREC=pb.dot_prec,
                          D=pb.head_dim, **{key: value for key, value in part.items() if key in _TAU_LAUNCH})
    return tau


def entmax_short_rows(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=ENTMAX_ALPHA,
                                tuning: dict | None = None):
    """1.5-entmax attention over at most :data:`SHORT_ROWS_MAX_TOKENS` tokens, ``[B, H, T, D]`` causal."""
    if float(alpha) != 1.5:
        raise ValueError(f"the short-rows kernels implement alpha = 1.5 only, got {alpha}")
    return EntmaxShortRowsAttention.apply(q, k, v, slopes, row_scale, sm_scale, tuning)
