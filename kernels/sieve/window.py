"""Sieve's window as "Sieve Attention"'s Algorithm 1 (``sieve-window``): stick-breaking over every earlier key, the
weights kept within ``eps`` of the row's largest earlier score. The row maxima by the stick-breaking forward kernel
itself before its walk (``rowmax_pass`` ``fused``, the default) or by a pass of their own (``_rowmax_kernel``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from lengthbench.kernels.defaults import SIEVE_WINDOW_EPS
from lengthbench.kernels.stickbreaking.forward import row_max_earlier
from lengthbench.kernels.stickbreaking.op import StickBreakingAttention, launch_config
from lengthbench.kernels.stickbreaking.stick import max_registers
from lengthbench.kernels.utils.common import Problem, head_slope, rows_scale, tile_rows


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
    best = row_max_earlier(q, K, base, offs_m, offs_d, dmask, pid_m, T, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                           DOT_PREC, D, BM, BN)
    tl.store(OUT + bh * T + offs_m, best, mask=row_ok)


def sieve_window_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, eps=SIEVE_WINDOW_EPS,
                           masked=True, tuning: dict | None = None):
    """Sieve's window as "Sieve Attention"'s Algorithm 1 (``sieve-window``), ``[B, H, T, D]`` causal: stick-breaking
    over every earlier key, the weights kept where ``z_rj >= max_{k<r} z_rk - eps`` (strictly above, ties at the
    boundary aside; default eps 2, ``defaults.SIEVE_WINDOW_EPS``).
    ``masked=False``: the stick broken over the kept keys only, as Sieve's definition breaks it over its
    filter. ``tuning``: the stick-breaking kernels' launch settings and levers (``stickbreaking.op.launch_config``;
    ``rowmax`` the row-max pass's tiles, ``rowmax_pass`` ``fused`` that pass inside the forward kernel)."""
    pb = Problem(q, k, v, slopes, row_scale, sm_scale)
    config = launch_config(pb, tuning)
    if config["rowmax_pass"] == "fused":  # the forward kernel finds the row maxima before its walk
        return StickBreakingAttention.apply(q, k, v, slopes, row_scale, float(eps), sm_scale, bool(masked), tuning)
    bm, bn, warps, stages, regs = config["rowmax"]
    rowmax = pb.rows()
    _rowmax_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
        pb.q, pb.k, pb.opt(pb.slopes), pb.opt(pb.row_scale), rowmax, pb.sm_scale, pb.tokens, pb.heads,
        HAS_SLOPES=pb.slopes is not None, HAS_RS=pb.row_scale is not None, DOT_PREC=pb.dot_prec, D=pb.head_dim,
        BD=pb.block_d, BM=bm, BN=bn, num_warps=warps, num_stages=stages, **max_registers(regs))
    # the stick-breaking kernels keep the weights where z / 2 > tau; a sliver below eps keeps z = max - eps
    tau = (rowmax - float(eps)) * 0.5 - 1e-6
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, tau, sm_scale, bool(masked), tuning)
