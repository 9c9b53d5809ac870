"""alpha-entmax attention (``alpha`` 1.5): ``w_rj = (z_rj / 2 - tau_r)_+^2`` with ``tau_r`` making row ``r`` sum
to 1; and sparsemax (alpha = 2): ``w_rj = (z_rj - tau_r)_+`` ("Long-Context Generalization with Sparse
Attention", Section 3). The fused op, ``[B, H, T, D]`` causal.

The threshold comes from the search of ``entmax/threshold.py``. With ``lists`` (the default) the forward
finishes the certified rows from their candidate lists (``entmax/lists.py``): ``_lists_output_kernel``
gathers a listed row's candidates, recomputes their scores, finds ``tau*`` over them in registers and writes
its output; ``_open_output_kernel`` writes the other rows' output over all their keys, gathered. Both write
what ``RowwiseAttention``'s backward reads, which runs unchanged.

Without ``lists`` (or past 12 bits of key tiles), and always for the gradients, the shared pointwise kernels
(``utils/rowwise.py``) compute the output over all keys, the forward also keeping ``u_r = sum_j (X_rj - tau_r)_+
v_j`` for the backward: ``dz_rj = s_rj (do_r.v_j - do_r.u_r / sum_j s_rj)`` with ``s = (X - tau)_+``. No
gradient flows through ``tau`` other than this (it is the exact entmax Jacobian). For sparsemax the
backward's weights are the support's indicator: ``dz_rj = 1[s_rj > 0] (do_r.v_j - do_r.u_r / |S_r|)`` with
``u_r = sum_{j in S_r} v_j``. ``row_scale`` and ``slopes`` receive gradients.

``tuning`` (every function here): launch settings replacing the defaults, for benchmarks and tests
(``entmax/config.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.defaults import ENTMAX_ALPHA
from lengthbench.kernels.entmax.config import ALPHAS, check_alpha
from lengthbench.kernels.entmax.lists import _list_rows, _lists_apply, _lists_start
from lengthbench.kernels.entmax.short_rows import SHORT_ROWS_MAX_TOKENS, entmax_short_rows
from lengthbench.kernels.entmax.threshold import entmax_threshold
from lengthbench.kernels.utils.common import Problem, gathered_rows
from lengthbench.kernels.utils.rowwise import ENTMAX, _fwd_loops, rowwise, rowwise_backward

__all__ = ["EntmaxListsAttention", "entmax_attention", "entmax_threshold", "sparsemax_attention"]

# The registers a thread of the open rows' output pass without ``STORE_U``, up to head dim 32 (``_lists_forward``).
_OPEN_OUTPUT_REGS = 96


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
                        BN: tl.constexpr, POWER: tl.constexpr, FOLD: tl.constexpr):
    """The output of the rows left open (``ROWS[bh, :COUNT[bh]]``, gathered as in ``_newton_kernel``) over all
    their keys, by the forward tiles of ``utils/rowwise.py`` (``ENTMAX``; ``FOLD`` as the search's), with the same
    side outputs (``M`` only with ``STORE_U``: no backward follows without it)."""
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
        # (MECH 4 is utils.rowwise.ENTMAX; the keys below the tile's first row are visible to all its rows)
        acc, acc_u, m_i, l_i, s_i = _fwd_loops(acc, acc, zero, zero, zero, q, K, V, base, (first // BN) * BN,
                                               last + 1, offs_m, offs_d, dmask, T, sm_scale, slope, rs, tau, False,
                                               4, POWER, STORE_U, HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BN, FOLD,
                                               STORE_U)
        out_off = base + offs_m[:, None] * D + offs_d[None, :]
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + out_off, acc.to(Out.dtype.element_ty), mask=rmask)
        if STORE_U:
            tl.store(U + out_off, acc_u, mask=rmask)
            tl.store(M + bh * T + offs_m, s_i, mask=row_ok)
        tl.store(L + bh * T + offs_m, l_i, mask=row_ok)


def _lists_forward(pb: Problem, alpha: float, store_u: bool, tol=1e-6, max_iter=40, tuning: dict | None = None):
    """The list forward of alpha-entmax attention (causal): ``(out, tau, m, den, u, ncand, lists)``, ``m, den,
    u`` as ``RowwiseAttention.forward`` keeps them for ``ENTMAX`` (``u`` None and ``m`` unset on the open rows
    unless ``store_u``: the backward needs both, and ``store_u`` is on wherever one follows), ``ncand``
    ``[BH, T]`` int32 the number of candidates of the rows finished from their lists (0: the rows left open)
    and ``lists`` ``[BH, T, C]`` their keys (the first ``ncand`` of a row; for tests).

    Four launches: the first stage with the lists (``_lists_start_kernel``), the Newton passes over the open
    rows (``_newton_kernel``), the listed rows' threshold and output (``_lists_output_kernel``), the open
    rows' output over all their keys (``_open_output_kernel``). The last two write disjoint rows. From
    ``sample``'s length on, a launch before them gives the tiles of wide rows a start from a sample of their
    keys instead of the first stage (``lists._sample_kernel``)."""
    xs = ALPHAS[alpha]
    tau, ncand, lists, rows, count, config, _ = _lists_start(pb, xs, False, tol, max_iter, tuning, sample=True)
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
    # Without a backward to follow (no row sums of s), the compiler takes 117 registers a thread for the 64 x 64
    # tiles at head dim 32 (sm_90), and 91 with no spill under a cap of 96: the occupancy of the pass with them
    # (93 registers), with 216 instructions a key tile instead of 288 (results/benchmarks/sass_entmax_loops.txt).
    cap = {"maxnreg": _OPEN_OUTPUT_REGS} if not store_u and pb.block_d <= 32 and nbm * nbn <= 64 * 64 else {}
    _open_output_kernel[(triton.cdiv(pb.tokens, nbm), pb.bh)](
        pb.q, pb.k, pb.v, out, pb.opt(u), sl, rs, tau, m, den, rows, count, pb.sm_scale, pb.tokens, pb.heads,
        STORE_U=store_u, DOT_PREC=pb.dot_prec, BM=nbm, BN=nbn, POWER=1.0 / (alpha - 1.0),
        FOLD=bool(config["fold"]) and pb.slopes is None, num_warps=nwarps, num_stages=nstages, **common, **cap)
    return out, tau, m, den, u, ncand, lists


class EntmaxListsAttention(torch.autograd.Function):
    """alpha-entmax attention by ``_lists_forward``; it saves the state ``RowwiseAttention`` saves for
    ``ENTMAX`` (with ``tau`` as its ``[B, H, T]`` threshold, no gradient), so the backward is its own
    (``rowwise_backward``). Gradients flow to q, k, v, ``slopes`` and ``row_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, sm_scale, alpha, tuning=None):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        # the backward's delta needs u whatever it differentiates
        store_u = any(ctx.needs_input_grad[:5])
        out, tau, m, den, u, _, _ = _lists_forward(pb, alpha, store_u, tuning=tuning)
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
        return dq, dk, dv, g_sl, g_rs, None, None, None


def entmax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, alpha=ENTMAX_ALPHA,
                     tuning: dict | None = None):
    """alpha-entmax attention (``alpha`` 1.5 or 2), ``[B, H, T, D]`` causal. By the candidate lists where
    ``_lists_apply`` (the default), else the threshold and the output pass of ``utils/rowwise.py``. ``tuning``'s
    ``short_rows`` (true): 1.5-entmax over at most :data:`short_rows.SHORT_ROWS_MAX_TOKENS` keys by the kernels of
    ``short_rows.py`` (each row's keys in registers; the training step's), wider rows as without it."""
    alpha = check_alpha(alpha)
    tuning = dict(tuning or {})
    if tuning.pop("short_rows", False) and q.shape[-2] <= SHORT_ROWS_MAX_TOKENS and alpha == 1.5:
        return entmax_short_rows(q, k, v, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale)
    if _lists_apply(q, tuning):
        return EntmaxListsAttention.apply(q, k, v, slopes, row_scale, sm_scale, alpha, tuning)
    with torch.no_grad():
        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=alpha,
                               tuning=tuning)
    return rowwise(q, k, v, mech=ENTMAX, slopes=slopes, row_scale=row_scale, tau=tau, sm_scale=sm_scale,
                   power=1.0 / (alpha - 1.0))


def sparsemax_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None):
    """sparsemax (2-entmax) attention, ``[B, H, T, D]`` causal: ``w = (z - tau)_+`` summing to one."""
    return entmax_attention(q, k, v, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=2.0,
                            tuning=tuning)
