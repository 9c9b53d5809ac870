"""Adaptive temperature (Velickovic et al. 2024): ``softmax(theta_r z_r)`` with ``theta_r = max(1, poly(H_r))``
where the entropy ``H_r`` of ``softmax(z_r)`` exceeds 0.5, else 1.

Two stages, both O(L) memory:

- the entropy, by its own kernel: one program per query tile walks the key tiles up to the diagonal keeping,
  per row, the running max ``m``, ``l = sum e^(z - m)`` and ``t = sum e^(z - m) z`` (rescaled as
  FlashAttention's running sums), then ``H = m + log l - t / l``. Its backward reuses the shared pointwise
  kernels (``utils/rowwise.py``, map ``ENTROPY``): ``dH_r/dz_rj = -p_rj (log p_rj + H_r)``, recomputed from ``m``,
  ``l`` and ``H``. The reference (``attention_weights("adatemp", ...)``, as the authors' code) takes
  ``log(p + 1e-9)``; this is the exact entropy (they differ by less than ``1e-9 * n_r * 21``).
- the output: softmax of the row-scaled scores through torch SDPA (``utils/sdpa.py``), ``theta`` (times any
  ``row_scale``) on the queries and on the ALiBi bias. The gradient flows through ``theta`` and ``H`` as in
  the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels.utils.common import Problem, head_slope, rows_scale, score_tile, tile_rows
from lengthbench.kernels.utils.rowwise import ENTROPY, _bwd_dkdv_kernel, _bwd_dq_kernel, _sum_to
from lengthbench.kernels.utils.sdpa import sdpa_attend, temperature


@triton.jit
def _entropy_tile(m2, l_i, t_i, q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope, rs,
                  MASKED: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr,
                  D: tl.constexpr, BN: tl.constexpr):
    """One key tile of the running sums, in base 2: ``m2`` the max of ``z log2(e)``, ``l = sum 2^(z log2 e -
    m2)``, ``t = sum 2^(...) z``. Masked scores are -1e30 (finite): their terms are exactly zero."""
    offs_n = start_n + tl.arange(0, BN)
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    if MASKED:
        z = tl.where((offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T), z, -1.0e30)
    z2 = z * 1.4426950408889634
    m_new = tl.maximum(m2, tl.max(z2, 1))
    e = tl.exp2(z2 - m_new[:, None])
    alpha = tl.exp2(m2 - m_new)
    return m_new, l_i * alpha + tl.sum(e, 1), t_i * alpha + tl.sum(e * z, 1)


@triton.jit
def _entropy_kernel(Q, K, SL, RS, M, L, HS, sm_scale, T, H, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                    DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m, offs_d, row_ok, dmask, rmask, roff = tile_rows(pid_m * BM, T, D, BD, BM)
    q = tl.load(Q + base + roff, mask=rmask, other=0.0)
    slope = head_slope(SL, bh, H, HAS_SLOPES)
    rs = rows_scale(RS, bh, T, offs_m, row_ok, HAS_RS, BM)
    m2 = tl.full([BM], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    t_i = tl.zeros([BM], dtype=tl.float32)
    diag = pid_m * BM  # key tiles before the tile's first row: no mask
    hi = tl.minimum((pid_m + 1) * BM, T)
    for start_n in range(0, diag, BN):
        m2, l_i, t_i = _entropy_tile(m2, l_i, t_i, q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope,
                                     rs, False, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN)
    for start_n in range(diag, hi, BN):
        m2, l_i, t_i = _entropy_tile(m2, l_i, t_i, q, K, base, start_n, offs_m, offs_d, dmask, T, sm_scale, slope,
                                     rs, True, HAS_SLOPES, HAS_RS, DOT_PREC, D, BN)
    l_out = tl.where(row_ok & (l_i > 0), l_i, 1.0)
    m_out = tl.where(row_ok, m2 * 0.6931471805599453, 0.0)  # back to natural units
    # H = log l + m - t / l
    entropy = tl.log(l_out) + m_out - tl.where(row_ok, t_i, 0.0) / l_out
    tl.store(M + bh * T + offs_m, m_out, mask=row_ok)
    tl.store(L + bh * T + offs_m, l_out, mask=row_ok)
    tl.store(HS + bh * T + offs_m, tl.maximum(entropy, 0.0), mask=row_ok)


class SoftmaxEntropy(torch.autograd.Function):
    """``H`` ``[B, H, T]``: the entropy of each causal softmax row of ``z = row_scale * (q.k * sm_scale - slope
    (r - j))``, with gradients to q, k, ``slopes`` and ``row_scale``."""

    @staticmethod
    def forward(ctx, q, k, slopes, row_scale, sm_scale):
        pb = Problem(q, k, k, slopes, row_scale, sm_scale)
        m, den, entropy = pb.rows(), pb.rows(), pb.rows()
        grid = (triton.cdiv(pb.tokens, pb.fwd_block), pb.bh)
        _entropy_kernel[grid](pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), m, den, entropy, pb.sm_scale,
                              pb.tokens, pb.heads, HAS_SLOPES=pb.slopes is not None,
                              HAS_RS=pb.row_scale is not None, DOT_PREC=pb.dot_prec, D=pb.head_dim,
                              BD=pb.block_d, BM=pb.fwd_block, BN=pb.block, num_warps=pb.fwd_warps, num_stages=2)
        ctx.sm_scale = pb.sm_scale
        ctx.rs_shape = None if row_scale is None else row_scale.shape
        ctx.save_for_backward(pb.q, pb.k, pb.slopes, pb.row_scale, m, den, entropy)
        return entropy

    @staticmethod
    def backward(ctx, d_entropy):
        q, k, slopes, row_scale, m, den, entropy = ctx.saved_tensors
        pb = Problem(q, k, k, slopes, row_scale, ctx.sm_scale)
        g = d_entropy.float().contiguous()
        grad_rs = row_scale is not None and ctx.needs_input_grad[3]
        grad_sl = slopes is not None and ctx.needs_input_grad[2]
        dq, dk, unused_dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(k)
        d_rs = pb.rows() if grad_rs else None
        d_sl = pb.rows() if grad_sl else None
        common = dict(MECH=ENTROPY, POWER=1.0, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                      DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=pb.block, BN=pb.block,
                      num_warps=pb.num_warps, num_stages=2)
        grid = (triton.cdiv(pb.tokens, pb.block), pb.bh)
        # The values and the output gradient are not read by the entropy's map: k stands in for both.
        _bwd_dq_kernel[grid](q, k, k, k, dq, pb.opt(slopes), pb.opt(row_scale), entropy, m, den, g,
                             pb.opt(d_rs), pb.opt(d_sl), pb.dummy, ctx.sm_scale, pb.tokens, pb.heads,
                             GRAD_RS=grad_rs, GRAD_SL=grad_sl, GRAD_TAU=False, **common)
        _bwd_dkdv_kernel[grid](q, k, k, k, dk, unused_dv, pb.opt(slopes), pb.opt(row_scale), entropy, m, den, g,
                               *(pb.dummy,) * 4, ctx.sm_scale, pb.tokens, pb.heads, FUSED=False, GRAD_RS=False,
                               GRAD_SL=False, GRAD_TAU=False, **common)
        g_sl = d_sl.sum(dim=(0, 2)) if grad_sl else None
        g_rs = _sum_to(d_rs, ctx.rs_shape) if grad_rs else None
        return dq, dk, g_sl, g_rs, None


def adatemp_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None):
    """Adaptive-temperature softmax attention, ``[B, H, T, D]`` causal."""
    entropy = SoftmaxEntropy.apply(q, k, slopes, row_scale, sm_scale)
    scale = temperature(entropy)
    if row_scale is not None:
        scale = scale * row_scale.to(scale.dtype).expand_as(scale)
    return sdpa_attend(q, k, v, slopes, scale=sm_scale, row_scale=scale)
