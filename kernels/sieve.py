"""Sieve attention (seed 004): stick-breaking over the support of 1.5-entmax of the earlier keys.

Two stages, as Appendix C: the threshold kernel of ``entmax.py`` finds ``tau_r`` of 1.5-entmax over
``z_{r, j<r}`` (Newton passes over the key tiles, no score matrix kept); the stick-breaking kernels of
``stickbreaking.py`` then run with the filter ``z_rj / 2 > tau_r`` (the support: its weights
``(z/2 - tau)_+^2`` are positive exactly there), the remainder on the diagonal. This is the definition
(Section 3.1), not Algorithm 1's ``z >= rowmax - eps``. No gradient flows through the support; ``row_scale``
and ``slopes`` receive gradients through the stick-breaking stage.

``sieve_alg1_attention`` is Algorithm 1 itself (``sieve-alg1``): a row-max pass over ``j < r``, then the
stick-breaking kernels with the stick over every earlier key and the weights kept within ``eps`` of the max.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, head_slope, rows_scale, score_tile, softplus, tile_rows
from lengthbench.kernels.entmax import _list_rows, _lists_apply, _lists_start, entmax_threshold
from lengthbench.kernels.stickbreaking import EXIT_AT, StickBreakingAttention, _fwd_store, _fwd_walk


@triton.jit
def _lists_kernel(Q, K, V, Out, O32, REM, SL, RS, TAU, NCAND, LIST, sm_scale, T, H, n_iter,
                  SAVE: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr, BR: tl.constexpr, C: tl.constexpr):
    """Sieve on the listed rows (``NCAND > 0``, certified by the strict first stage: their support, the keys
    ``j < r`` with ``z / 2 > tau``, lies among their candidates), ``BR`` a program: ``tau`` over the candidates
    (``_list_rows``), then the stick broken over the support from the latest key down, as the stick-breaking
    forward's filtered walk does: ``a_j = exp(z_j - sum_{k in S, k >= j} softplus(z_k))`` (an ``O(C^2)`` suffix
    sum over the keys' order), remainder ``exp(-sum_S softplus)`` on the diagonal. Writes what
    ``StickBreakingAttention``'s backward reads: the output, its fp32 copy, the remainder and ``TAU``."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    offs_r = pid * BR + tl.arange(0, BR)
    row_ok = offs_r < T
    ncand = tl.load(NCAND + bh * T + offs_r, mask=row_ok, other=0)
    listed = ncand > 0
    if tl.max(listed.to(tl.int32), 0) > 0:
        base, offs_d, dmask, keep, idx, gather, gmask, z, x, tau = _list_rows(
            Q, K, SL, RS, TAU, LIST, sm_scale, T, H, n_iter, bh, offs_r, row_ok, ncand, listed, HAS_SLOPES, HAS_RS,
            D, BD, BR, C, 0.5)
        support = keep & (z * 0.5 > tau[:, None])  # the filter of the stick-breaking kernels
        sp = tl.where(support, softplus(z), 0.0)
        later = (idx[:, None, :] >= idx[:, :, None]) & support[:, None, :]  # [row, j, k]: k in S, k >= j
        suffix = tl.sum(tl.where(later, sp[:, None, :], 0.0), 2)
        a = tl.where(support, tl.exp(z - suffix), 0.0)
        v = tl.load(V + base + gather, mask=gmask, other=0.0).to(tl.float32)
        acc = tl.sum(a[:, :, None] * v, 1)
        rmask = listed[:, None] & dmask[None, :]
        _fwd_store(acc, tl.sum(sp, 1), V, Out, O32, REM, base, offs_r, offs_d, rmask, listed, bh, T, SAVE, D)
        tl.store(TAU + bh * T + offs_r, tau, mask=listed)


@triton.jit
def _open_kernel(Q, K, V, Out, O32, REM, SL, RS, TAU, ROWS, COUNT, sm_scale, T, H, exit_at,
                 SAVE: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, SPLIT: tl.constexpr,
                 DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Sieve on the rows left open (``ROWS[bh, :COUNT[bh]]``, gathered as in ``entmax._newton_kernel``): the
    stick-breaking forward's filtered walk (``FILTER`` 1) over the keys before their last row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    n_open = tl.load(COUNT + bh)
    if pid_m * BM < n_open:
        base = bh.to(tl.int64) * T * D
        slots = pid_m * BM + tl.arange(0, BM)
        row_ok = slots < n_open
        offs_m = tl.load(ROWS + bh.to(tl.int64) * (T + 1) + slots, mask=row_ok, other=0)
        offs_d = tl.arange(0, BD)
        dmask = offs_d < D
        rmask = row_ok[:, None] & dmask[None, :]
        q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
        slope = head_slope(SL, bh, H, HAS_SLOPES)
        rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
        last = tl.max(tl.where(row_ok, offs_m, 0), 0)
        acc, lsum = _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau,
                              tl.cdiv(last, BN), exit_at, 1, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC, D, BD, BM, BN)
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, SAVE, D)


def _lists_forward(pb: Problem, save: bool):
    """Sieve's forward by candidate lists: ``(out, o32, rem, tau, ncand)`` (``o32, rem`` None unless
    ``save``), ``ncand`` as ``entmax._lists_forward``'s. The first stage and the Newton passes of entmax's
    list forward with the strict keys ``j < r``, then ``_lists_kernel`` on the listed rows and ``_open_kernel``
    on the others (among them row 0, which sees no key: ``tau = +inf``, the whole stick on the diagonal)."""
    tau, ncand, lists, rows, count, config = _lists_start(pb, 0.5, True)
    nbm, nbn, nwarps, nstages = config["newton"]
    rows_per, finish_warps = config["finish"]
    size = lists.shape[-1]
    rows_per = max(1, min(rows_per, 8192 // (size * size)))  # the [rows, C, C] suffix sums in registers
    out = torch.empty_like(pb.q)
    o32 = torch.empty(pb.q.shape, device=pb.q.device, dtype=torch.float32) if save else None
    rem = pb.rows() if save else None
    sl, rs = pb.opt(pb.slopes), pb.opt(pb.row_scale)
    common = dict(SAVE=save, HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, D=pb.head_dim,
                  BD=pb.block_d)
    _lists_kernel[(triton.cdiv(pb.tokens, rows_per), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(o32), pb.opt(rem), sl, rs, tau, ncand, lists, pb.sm_scale, pb.tokens,
        pb.heads, 2 * size + 8, BR=rows_per, C=size, num_warps=finish_warps, **common)
    _open_kernel[(triton.cdiv(pb.tokens, nbm), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(o32), pb.opt(rem), sl, rs, tau, rows, count, pb.sm_scale, pb.tokens,
        pb.heads, EXIT_AT, SPLIT=pb.q.dtype != torch.float32, DOT_PREC=pb.dot_prec, BM=nbm, BN=nbn,
        num_warps=nwarps, num_stages=nstages, **common)
    return out, o32, rem, tau, ncand


class SieveListsAttention(StickBreakingAttention):
    """Sieve by ``_lists_forward``, saving what ``StickBreakingAttention`` saves for its filter (mode 1):
    its backward runs unchanged. Called as ``StickBreakingAttention`` with ``tau`` None."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, weights_only=False):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        save = any(ctx.needs_input_grad[:5])
        out, o32, rem, tau, _ = _lists_forward(pb, save)
        ctx.mode = 1
        if save:
            ctx.save_for_backward(pb.q, pb.k, pb.v, o32, rem, pb.slopes, pb.row_scale, tau)
            ctx.sm_scale = pb.sm_scale
            ctx.rs_shape = None if row_scale is None else row_scale.shape
        return out


def sieve_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=1.5):
    """Sieve attention, ``[B, H, T, D]`` causal (``alpha`` must be 1.5). By candidate lists where entmax's
    list forward applies (``entmax.TUNING``'s ``lists``), else the threshold, then the filtered
    stick-breaking forward over all keys."""
    if float(alpha) != 1.5:
        raise ValueError(f"the sieve kernel implements alpha = 1.5 only, got {alpha}")
    if _lists_apply(q):
        return SieveListsAttention.apply(q, k, v, slopes, row_scale, None, sm_scale, False)
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, strict=True)
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, False)


@triton.jit
def _rowmax_kernel(Q, K, SL, RS, OUT, sm_scale, T, H, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                   DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``max_{j<r} z_rj`` per row (-inf for row 0)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, roff = tile_rows(pid_m * BM, T, D, BD, BM)
    q = tl.load(Q + base + roff, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start_n in range(0, tl.minimum((pid_m + 1) * BM, T), BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        earlier = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        best = tl.maximum(best, tl.max(tl.where(earlier, z, float("-inf")), 1))
    tl.store(OUT + bh * T + offs_m, best, mask=row_ok)


def sieve_alg1_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, eps=2.0):
    """Sieve as the seed's Algorithm 1, ``[B, H, T, D]`` causal: stick-breaking over every earlier key, the
    weights kept where ``z_rj >= max_{k<r} z_rk - eps`` (strictly above, ties at the boundary aside)."""
    pb = Problem(q, k, v, slopes, row_scale, sm_scale)
    rowmax = pb.rows()
    grid = (triton.cdiv(pb.tokens, pb.fwd_block), pb.bh)
    _rowmax_kernel[grid](pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), rowmax, pb.sm_scale, pb.tokens,
                         pb.heads, HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                         DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=pb.fwd_block, BN=pb.block,
                         num_warps=pb.fwd_warps, num_stages=2)
    # the stick-breaking kernels keep the weights where z / 2 > tau; a sliver below eps keeps z = max - eps
    tau = (rowmax - float(eps)) * 0.5 - 1e-6
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, True)
