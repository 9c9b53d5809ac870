"""Stick-breaking attention (Tan et al. 2025), log-space, with the remainder on the diagonal.

For query row ``r`` and key ``j < r``: ``log a_rj = z_rj - sum_{j <= k < r} softplus(z_rk)``
(= logsigmoid(z_rj) - sum_{j<k<r} softplus(z_rk)); ``o_r = sum_j a_rj v_j + (1 - sum_j a_rj) v_r``.

Forward: one program per query tile walks the key tiles right to left from the diagonal, carrying the
fp32 sum of softplus of the keys already passed; inside a tile the suffix sums come from a reverse
cumulative sum. Once every row of the tile has accumulated more than ``EXIT_AT`` (60) nats the remaining
weights are below ``e^-60`` and the walk stops: the Out(L^2) work shrinks to Out(L x reach). The products of
the weights with the values are split into two bf16/fp16 halves (hi + lo), so the fp32 output kept for the
backward is accurate to fp32 rounding.

Backward (one kernel, the same walk): with ``g_j = do_r.v_j``, ``c_j = (g_j - g_r) a_j`` and
``C_r = do_r.(o_r - v_r) = sum_j c_j``, ``dz_rk = c_k (1 - sigma(z_k)) - sigma(z_k) (C_r - sum_{j >= k} c_j)``.
dq accumulates in registers; dk and dv in fp32 buffers by atomic adds (as in Sieve's Algorithm 1); the
diagonal's ``dv_r += (1 - sum_j a_rj) do_r`` is added outside. Gradients flow to q, k, v, ``row_scale`` and
``slopes``.

``FILTER`` restricts the keys to ``{j : z_rj / 2 > tau_r}`` (Sieve: ``tau`` the 1.5-entmax threshold of the row
over ``j < r``), without gradient through the filter; see ``sieve.py``. Its third mode (``sieve-alg1``) breaks
the stick over every earlier key and keeps only the weights inside the filter; the backward then takes the
general form ``c_j = g_j a_j``, ``C_r = do_r.o_r`` (the weights no longer sum to one with the remainder).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, reduce_slopes, score_tile, softplus

EXIT_AT = 60.0


@triton.jit
def _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau, upto, FILTER: tl.constexpr,
              HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr):
    """Loads a key tile; its scores, biased scores, the keys each row breaks the stick over (those before
    ``upto``: ``offs_m``, or where a phase of Sieve's open walk stopped) and those whose weights it keeps (``FILTER``: 0 every earlier key; 1 Sieve, both only where ``z / 2 > tau``; 2
    ``sieve-alg1``, the stick over every earlier key, the weights only where ``z / 2 > tau``)."""
    kv_mask = (offs_n < T)[:, None] & dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    valid = offs_n[None, :] < upto[:, None]
    keep = valid
    if FILTER == 1:
        valid = valid & (z * 0.5 > tau[:, None])
        keep = valid
    elif FILTER == 2:
        keep = valid & (z * 0.5 > tau[:, None])
    return k, z, zb, valid, keep


@triton.jit
def _stick(z, valid, lsum):
    """Softplus of the tile's active scores and their weights, given the softplus sum to the right."""
    sp = tl.where(valid, softplus(z), 0.0)
    suffix = tl.cumsum(sp, 1, reverse=True)
    a = tl.where(valid, tl.exp(z - lsum[:, None] - suffix), 0.0)
    return sp, a


@triton.jit
def _fwd_kernel(Q, K, V, Out, O32, REM, SL, RS, TAU, sm_scale, T, H, exit_at,
                SAVE: tl.constexpr, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
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
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    acc, lsum, _ = _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles,
                             exit_at, tl.zeros([BM, BD], dtype=tl.float32), tl.zeros([BM], dtype=tl.float32), offs_m,
                             n_tiles, FILTER, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC, D, BD, BM, BN)
    _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, D, SAVE, D)


@triton.jit
def _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at, acc,
              lsum, upto, max_tiles, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr):
    """``(acc, lsum, t)``: the weighted values and the softplus sum of the rows ``offs_m``, from ``acc`` and
    ``lsum``, over their keys before ``upto`` in the key tiles ``n_tiles - 1`` down, stopping once every row
    (``row_ok``) has passed ``exit_at`` nats, or after ``max_tiles`` tiles; ``t`` the tiles
    walked (Sieve's gathered open rows reuse it, a phase at a time: ``sieve._open_kernel``)."""
    t = 0
    lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    while (t < n_tiles) & (lmin < exit_at) & (t < max_tiles):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau,
                                          upto, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        # Sieve's supports are small: most tiles hold none of them and cost only the score product.
        if tl.max(valid.to(tl.int32)) > 0:
            v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :],
                        mask=(offs_n < T)[:, None] & dmask[None, :], other=0.0)
            sp, a = _stick(z, valid, lsum)
            if FILTER == 2:
                a = tl.where(keep, a, 0.0)
            if SPLIT:
                a_hi = a.to(v.dtype)
                acc += tl.dot(a_hi, v)
                acc += tl.dot((a - a_hi.to(tl.float32)).to(v.dtype), v)
            else:
                acc += tl.dot(a.to(v.dtype), v, input_precision=DOT_PREC)
            lsum += tl.sum(sp, 1)
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
        t += 1
    return acc, lsum, t


@triton.jit
def _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, o32_stride,
               SAVE: tl.constexpr, D: tl.constexpr):
    """The remainder on the diagonal, then the output and, for the backward (``SAVE``), the remainder and
    the output's fp32 copy, row ``r`` of head ``bh`` at ``O32 + (bh T + r) o32_stride`` (``SAVE`` 2: the
    remainder alone)."""
    rem = tl.exp(-lsum)
    v_r = tl.load(V + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    acc += rem[:, None] * v_r.to(tl.float32)
    tl.store(Out + base + offs_m[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=rmask)
    if SAVE:
        tl.store(REM + bh * T + offs_m, rem, mask=row_ok)
    if SAVE == 1:
        o32_rows = (bh * T + offs_m).to(tl.int64) * o32_stride
        tl.store(O32 + o32_rows[:, None] + offs_d[None, :], acc, mask=rmask)


@triton.jit
def _bwd_kernel(Q, K, V, DO, DQ, DK, DV, CT, GR, SL, RS, TAU, DRS, DSL, sm_scale, T, H, exit_at,
                FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, GRAD_RS: tl.constexpr,
                GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    do = tl.load(DO + base + offs_m[:, None] * D + offs_d[None, :], mask=rmask, other=0.0)
    c_total = tl.load(CT + bh * T + offs_m, mask=row_ok, other=0.0)
    g_r = tl.load(GR + bh * T + offs_m, mask=row_ok, other=0.0)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.zeros([BM], dtype=tl.float32)
    if FILTER:
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    dq, d_rs, d_sl = _bwd_walk(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope,
                               rs, tau, c_total, g_r, n_tiles, exit_at, FILTER, HAS_SLOPES, HAS_RS, GRAD_RS,
                               GRAD_SL, DOT_PREC, D, BD, BM, BN)
    _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
               GRAD_RS, GRAD_SL, D)


@triton.jit
def _bwd_walk(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, c_total,
              g_r, n_tiles, exit_at, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
              BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``(dq, d_rs, d_sl)`` of the rows ``offs_m`` (before ``sm_scale`` and the slopes' sign and row scale)
    over the key tiles ``n_tiles - 1`` down to 0, the forward's walk (Sieve's gathered open rows reuse it);
    dk and dv go to ``DK``/``DV`` by atomic adds."""
    lsum = tl.zeros([BM], dtype=tl.float32)
    c_acc = tl.zeros([BM], dtype=tl.float32)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    t = 0
    lmin = tl.min(tl.zeros([BM], dtype=tl.float32), 0)
    while (t < n_tiles) & (lmin < exit_at):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau,
                                          offs_m, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        if tl.max(valid.to(tl.int32)) > 0:
            kv_mask = (offs_n < T)[:, None] & dmask[None, :]
            v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
            sp, a = _stick(z, valid, lsum)
            if FILTER == 2:
                a = tl.where(keep, a, 0.0)
            g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            c = tl.where(valid, (g - g_r[:, None]) * a, 0.0)
            before = c_total[:, None] - c_acc[:, None] - tl.cumsum(c, 1, reverse=True)
            dz = tl.where(valid, c * tl.sigmoid(-z) - tl.sigmoid(z) * before, 0.0)
            dzs = dz * rs[:, None]
            dq += tl.dot(dzs.to(k.dtype), k, input_precision=DOT_PREC)
            if GRAD_RS:
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            dv_tile = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=DOT_PREC)
            dk_tile = tl.dot(tl.trans(dzs).to(q.dtype), q, input_precision=DOT_PREC) * sm_scale
            tl.atomic_add(DV + base + offs_n[:, None] * D + offs_d[None, :], dv_tile, mask=kv_mask, sem="relaxed")
            tl.atomic_add(DK + base + offs_n[:, None] * D + offs_d[None, :], dk_tile, mask=kv_mask, sem="relaxed")
            lsum += tl.sum(sp, 1)
            c_acc += tl.sum(c, 1)
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
        t += 1
    return dq, d_rs, d_sl


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


class StickBreakingAttention(torch.autograd.Function):
    """Stick-breaking (``tau`` None) or its filtered forms (``tau`` ``[B, H, T]``): Sieve, or with
    ``weights_only`` the filter on the weights alone (``sieve-alg1``)."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, weights_only=False):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        save = any(ctx.needs_input_grad[:5])
        out = torch.empty_like(pb.q)
        o32 = torch.empty(pb.q.shape, device=q.device, dtype=torch.float32) if save else None
        rem = pb.rows() if save else None
        tau = None if tau is None else tau.detach().to(torch.float32).expand(pb.batch, pb.heads, pb.tokens).contiguous()
        mode = 0 if tau is None else (2 if weights_only else 1)
        ctx.mode = mode
        grid = (triton.cdiv(pb.tokens, pb.block), pb.bh)
        _fwd_kernel[grid](pb.q, pb.k, pb.v, out, pb.opt(o32), pb.opt(rem), pb.opt(pb.slopes), pb.opt(pb.row_scale),
                          pb.opt(tau), pb.sm_scale, pb.tokens, pb.heads, EXIT_AT, SAVE=save, FILTER=mode,
                          HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None,
                          SPLIT=q.dtype != torch.float32, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d,
                          BM=pb.block, BN=pb.block, num_warps=pb.num_warps, num_stages=2)
        if save:
            ctx.save_for_backward(pb.q, pb.k, pb.v, o32, rem, pb.slopes, pb.row_scale, tau)
            ctx.sm_scale = pb.sm_scale
            ctx.rs_shape = None if row_scale is None else row_scale.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o32, rem, slopes, row_scale, tau = ctx.saved_tensors
        pb = Problem(q, k, v, slopes, row_scale, ctx.sm_scale)
        do = dout.contiguous()
        do32 = do.float()
        # c_j = (g_j - g_r) a_j and C_r = do_r.(o_r - v_r) use that the weights and the remainder sum to one;
        # with weights dropped outside the filter (mode 2) the general form: c_j = g_j a_j, C_r = do_r.o_r.
        if ctx.mode == 2:
            g_r = torch.zeros(do.shape[:-1], device=do.device, dtype=torch.float32)
            c_total = (do32 * o32).sum(-1)
        else:
            g_r = (do32 * v.float()).sum(-1)
            c_total = (do32 * o32).sum(-1) - g_r
        grad_rs, grad_sl, dq, dk32, dv32, d_rs, d_sl = grad_buffers(ctx, pb)
        grid = (triton.cdiv(pb.tokens, pb.block), pb.bh)
        _bwd_kernel[grid](q, k, v, do, dq, dk32, dv32, c_total, g_r, pb.opt(slopes), pb.opt(row_scale),
                          pb.opt(tau), pb.opt(d_rs), pb.opt(d_sl), pb.sm_scale, pb.tokens, pb.heads, EXIT_AT,
                          FILTER=ctx.mode, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                          GRAD_RS=grad_rs, GRAD_SL=grad_sl, DOT_PREC=pb.dot_prec, D=pb.head_dim,
                          BD=pb.block_d, BM=pb.block, BN=pb.block, num_warps=pb.num_warps, num_stages=2)
        dv32.addcmul_(rem.unsqueeze(-1), do32)
        g_sl, g_rs = param_grads(d_sl, d_rs, ctx.rs_shape)
        return dq, dk32.to(k.dtype), dv32.to(v.dtype), g_sl, g_rs, None, None, None


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


def stickbreaking_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None):
    """Stick-breaking attention, ``[B, H, T, D]`` causal, remainder on the diagonal."""
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, None, sm_scale, False)
