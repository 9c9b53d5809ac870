"""Stick-breaking attention ("Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth Study",
Tan et al., 2025), log-space, with the remainder on the diagonal.

For query row ``r`` and key ``j < r``: ``log a_rj = z_rj - sum_{j <= k < r} softplus(z_rk)``
(= logsigmoid(z_rj) - sum_{j<k<r} softplus(z_rk)); ``o_r = sum_j a_rj v_j + (1 - sum_j a_rj) v_r``.

Forward (``forward.py``): one program per query tile walks the key tiles right to left from the diagonal,
carrying the fp32 sum of softplus of the keys already passed; inside a tile the sums over the keys after each one
come from one product of the softplus in bf16 with a (negated) triangular ones matrix on the tensor cores,
accumulated onto the log weights less that carried sum (a key's own softplus stays outside it, in fp32, so its
rounding only touches weights that those sums make small), softplus in base 2 with its ``log1p`` a degree-4
polynomial on the FMA units (degree 6 for fp32 inputs). The tiles are 64 query rows by 32 keys, with the registers
capped (``maxnreg``) so that several programs share a multiprocessor; each tile loads the next one's keys and values
before its own work. Once every row of the tile has accumulated more than ``EXIT_AT`` (60) nats the remaining
weights are below ``e^-60`` and the walk stops (tested after every eighth tile): the O(L^2) work shrinks to O(L x
reach). The forward keeps per row only its softplus sum ``L_r`` and the first key walked.

Backward (``backward.py``, one kernel, a walk from the left over the very keys the forward walked): with ``g_j =
do_r.v_j`` and ``c_j = (g_j - g_r) a_j``, ``dz_rk = c_k (1 - sigma(z_k)) - sigma(z_k) sum_{j < k} c_j``, the
weights recomputed as ``a_j = exp(z_j - (L_r - sum_{k<j} softplus z_k))`` and the prefix sums accumulated as the
walk goes; ``sigma`` from the softplus's ``exp(-|z|)``. dq accumulates in registers; dk and dv in fp32 buffers by
atomic adds; the diagonal's ``dv_r += (1 - sum_j a_rj) do_r`` is added outside. Gradients flow to q, k, v,
``row_scale`` and ``slopes``.

``FILTER`` restricts the keys to ``{j : z_rj / 2 > tau_r}`` (Sieve: ``tau`` the 1.5-entmax threshold of the row
over ``j < r``), without gradient through the filter; see ``sieve/``. Its third mode (``sieve-window``) breaks
the stick over every earlier key and keeps only the weights inside the filter (their log weights set to -inf
where they are formed); the backward then takes the general form ``c_j = g_j a_j`` with the remainder's share on
the prefix (the weights no longer sum to one with the remainder). ``drop`` (Sieve's Eq. 7: the weights cover the
earlier keys only) leaves the remainder out: the forward adds no ``rem_r v_r``, the backward takes ``g_r = 0`` and
adds no ``dv_r`` (``DROP`` of both kernels).

What the above describes are the defaults (``TUNING``); ``tuning`` (``launch_config``) selects other forms of the
same quantities, for the training step (``lengthbench/compile_policy.py``) and the tests.
"""

from __future__ import annotations

import torch
import triton

from lengthbench.kernels.stickbreaking.backward import _bwd_prefix_kernel, grad_buffers, param_grads
from lengthbench.kernels.stickbreaking.forward import _fwd_kernel
from lengthbench.kernels.stickbreaking.stick import EXIT_AT, max_registers
from lengthbench.kernels.utils.common import Problem

# The levers of ``tuning`` (``stickbreaking_attention``, ``sieve_window_attention``) and their defaults; see
# ``launch_config``.
TUNING = dict(fwd=None, bwd=None, rowmax=None, cumsum="bf16", exp2=True, log1p=None, split=False, sigmoid="reuse",
              skip_empty=False, full_tiles=True, prefetch=True, exit_every=8)
_CHOICES = dict(cumsum=("scan", "bf16"), sigmoid=("exp", "reuse"), log1p=(None, "log", "poly", "poly4"),
                exit_every=(1, 2, 4, 8))
# the kernels' codes of ``cumsum`` (CUMSUM; 6: ``bf16``'s form with fp32 inputs, on two tf32 products) and
# ``log1p`` (LOG1P)
_CUMSUM = {"scan": 0, "bf16": 5}
_LOG1P = {"log": 0, "poly": 1, "poly4": 4}


def launch_config(pb: Problem, tuning: dict | None = None) -> dict:
    """The kernels' launch settings and levers for problem ``pb``: ``TUNING`` with ``tuning``'s keys replacing
    theirs (a ``ValueError`` names an unknown key or value).

    - ``fwd``, ``bwd``: the forward's and the backward's tiles ``(bm, bn, warps, stages[, maxnreg])`` (None: 64
      query rows and 32 keys, 32 x 32 past head dim 64, ``Problem.num_warps``; the forward up to head dim 32 with 3
      stages (the fused row-max pass's loads) and its registers capped at 96 (five programs a multiprocessor), up to
      64 with 2 stages and 128 (four); the backward with 2 stages, its registers capped at 168 up to head dim 32);
      ``rowmax`` the key tiles of ``sieve_window_attention``'s row-max pass, which the forward kernel runs before
      its walk (None: 128 keys up to head dim 64, past it ``Problem.block``; only its keys count). ``maxnreg`` caps
      the kernel's registers a thread (``max_registers``; 0 or left out: the compiler's choice).
    - ``cumsum``: the in-tile cumulative sums of softplus (and of the backward's ``c``): ``scan`` (``tl.cumsum``) or
      ``bf16``, one product with a triangular ones matrix on the tensor cores (8 bits, each key's own softplus kept
      out of it: ``_stick``; with fp32 inputs two tf32 products, about 21 bits). Only the sums inside a key tile
      are so computed (the sum carried across tiles stays fp32).
    - ``exp2``: the stick in bits, ``log2 e`` folded into the scale.
    - ``log1p``: softplus's ``log(1 + exp(-|z|))`` by ``log`` or a polynomial on the FMA units (``_log1p_ratio``:
      ``poly`` degree 6, ``poly4`` degree 4); None: ``poly4`` for 16-bit inputs, ``poly`` for fp32 ones (held to
      fp32's tolerance).
    - ``exit_every``: the forward's exit test (every row of the query tile past ``EXIT_AT`` nats) after every
      that-many key tiles (a reduction over the program's warps); the walk then takes at most ``exit_every - 1``
      tiles more than it needs (their weights below ``e^-60``). Not Sieve's, whose filter leaves tiles without a
      key that would skip the test.
    - ``split``: the forward's products of the weights with 16-bit values as two dots (hi + lo); False: one dot.
    - ``sigmoid``: the backward's ``sigma(z)`` and ``sigma(-z)`` by ``tl.sigmoid`` (``exp``) or from the
      softplus's ``exp(-|z|)`` (``reuse``).
    - ``skip_empty``: with the filter on the weights alone (``sieve-window``), key tiles without a kept key skip
      the values (their load, products and ``dv``), the stick still broken over them.
    - ``prefetch``: the forward's walk loads the next key tile's keys and values before the work on its own.
    - ``full_tiles``: the forward takes the key tiles that lie before every row of its query tile without the causal
      masks' selects (stick-breaking's and ``sieve-window``'s, not Sieve's, whose filter decides which keys break
      the stick).
    """
    tuning = dict(tuning or {})
    unknown = sorted(set(tuning) - set(TUNING))
    if unknown:
        raise ValueError(f"stick-breaking tuning: unknown keys {unknown}; the keys are {sorted(TUNING)}")
    config = {**TUNING, **tuning}
    for key, choices in _CHOICES.items():
        if config[key] not in choices:
            raise ValueError(f"stick-breaking tuning: {key} must be one of {list(choices)}, got {config[key]!r}")
    # 32-key tiles; the forward's registers capped at 96 a thread up to head dim 32 (five programs a
    # multiprocessor; 3 stages for its fused row-max pass), at 128 up to 64 (four, not two); the backward's at 168 up
    # to 32 (three)
    narrow = (64, 32, pb.num_warps, 2) if pb.block_d <= 64 else (32, 32, pb.num_warps, 2)
    fwd = (64, 32, pb.num_warps, 3, 96) if pb.block_d <= 32 else (*narrow, 128 if pb.block_d <= 64 else 0)
    defaults = dict(fwd=fwd, bwd=(*narrow, 168 if pb.block_d <= 32 else 0),
                    rowmax=(64, 128, 4, 3) if pb.block_d <= 64 else (pb.fwd_block, pb.block, pb.fwd_warps, 2))
    for key, default in defaults.items():
        tiles = tuple(int(x) for x in (config[key] or default))
        bm, bn, warps, stages, regs = (*tiles, 0) if len(tiles) == 4 else tiles if len(tiles) == 5 else (0,) * 5
        if not (_power_of_two(bm) and _power_of_two(bn) and bm >= 16 and bn >= 16 and _power_of_two(warps)
                and warps <= 16 and stages >= 1 and (regs == 0 or 24 <= regs <= 255)):
            raise ValueError(f"stick-breaking tuning: {key} must be (bm, bn, warps, stages[, maxnreg]), bm and bn "
                             f"powers of two >= 16, warps a power of two <= 16, maxnreg 24 to 255 (0: the "
                             f"compiler's choice), got {config[key]!r}")
        config[key] = (bm, bn, warps, stages, regs)
    if config["log1p"] is None:  # fp32 inputs keep fp32's accuracy
        config["log1p"] = "poly" if pb.q.dtype == torch.float32 else "poly4"
    config["log1p"] = _LOG1P[config["log1p"]]
    config["cumsum"] = _CUMSUM[config["cumsum"]]
    if pb.q.dtype == torch.float32 and config["cumsum"] == 5:
        config["cumsum"] = 6
    config["sigmoid"] = _CHOICES["sigmoid"].index(config["sigmoid"])
    for key in ("split", "skip_empty", "full_tiles", "prefetch"):
        config[key] = bool(config[key])
    config["exp2"] = int(bool(config["exp2"]))  # the kernels' EXP2: 0 natural exp and log, 1 powers of two
    return config


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


class StickBreakingAttention(torch.autograd.Function):
    """Stick-breaking (``tau`` None) or its filtered forms (``tau`` ``[B, H, T]``): Sieve, or with
    ``weights_only`` the filter on the weights alone (``sieve-window``); ``tuning`` the levers of
    ``launch_config``. ``tau`` a float ``eps``: the threshold is Algorithm 1's, ``(max_{j<r} z_rj - eps) / 2``,
    found by the forward kernel before its walk. ``drop``: the remainder goes nowhere (Sieve's Eq. 7), else on
    the diagonal."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, weights_only=False, tuning=None, drop=False):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        config = launch_config(pb, tuning)
        save = any(ctx.needs_input_grad[:5])
        out = torch.empty_like(pb.q)
        lse = pb.rows() if save else None
        start = torch.empty(pb.batch, pb.heads, pb.tokens, device=q.device, dtype=torch.int32) if save else None
        eps = 0.0
        if isinstance(tau, float):  # the forward kernel finds the threshold and writes it here
            eps, tau = tau, pb.rows()
            rowmax = True
        else:
            rowmax = False
            tau = None if tau is None else tau.detach().to(torch.float32).expand(
                pb.batch, pb.heads, pb.tokens).contiguous()
        mode = 0 if tau is None else (2 if weights_only else 1)
        ctx.mode = mode
        ctx.drop = bool(drop)
        bm, bn, warps, stages, regs = config["fwd"]
        _fwd_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
            pb.q, pb.k, pb.v, out, None, None, pb.opt(lse), pb.opt(start), pb.opt(pb.slopes),
            pb.opt(pb.row_scale), pb.opt(tau), pb.sm_scale, pb.tokens, pb.heads, EXIT_AT, eps,
            SAVE=3 if save else 0, FILTER=mode, ROWMAX=rowmax, HAS_SLOPES=pb.slopes is not None,
            HAS_RS=pb.row_scale is not None, SPLIT=config["split"] and q.dtype != torch.float32,
            DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm, BN=bn, CUMSUM=config["cumsum"],
            EXP2=config["exp2"], LOG1P=config["log1p"], SKIP=config["skip_empty"] and mode == 2,
            FULL=config["full_tiles"] and mode != 1, PREFETCH=config["prefetch"],
            EVERY=config["exit_every"] if mode != 1 else 1,  # (Sieve's empty tiles skip the test's place)
            BNR=config["rowmax"][1] if rowmax else bn, DROP=ctx.drop, num_warps=warps, num_stages=stages, **max_registers(regs))
        if save:
            ctx.save_for_backward(pb.q, pb.k, pb.v, lse, start, pb.slopes, pb.row_scale, tau)
            ctx.sm_scale = pb.sm_scale
            ctx.config = config
            ctx.rs_shape = None if row_scale is None else row_scale.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lse, start, slopes, row_scale, tau = ctx.saved_tensors
        pb = Problem(q, k, v, slopes, row_scale, ctx.sm_scale)
        config = ctx.config
        do = dout.contiguous()
        grad_rs, grad_sl, dq, dk32, dv32, d_rs, d_sl = grad_buffers(ctx, pb)
        bm, bn, warps, stages, regs = config["bwd"]
        common = dict(FILTER=ctx.mode, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                      GRAD_RS=grad_rs, GRAD_SL=grad_sl, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm,
                      BN=bn, CUMSUM=config["cumsum"], EXP2=config["exp2"],
                      LOG1P=config["log1p"],
                      SIG=config["sigmoid"],
                      SKIP=config["skip_empty"] and ctx.mode == 2, DROP=ctx.drop, num_warps=warps, num_stages=stages,
                      **max_registers(regs))
        grid = (triton.cdiv(pb.tokens, bm), pb.bh)
        _bwd_prefix_kernel[grid](q, k, v, do, dq, dk32, dv32, lse, start, pb.opt(slopes), pb.opt(row_scale),
                                 pb.opt(tau), pb.opt(d_rs), pb.opt(d_sl), pb.sm_scale, pb.tokens, pb.heads, **common)
        dk = dk32.to(k.dtype)
        del dk32  # the next cast's buffer takes its place
        dv = dv32.to(v.dtype)
        del dv32
        g_sl, g_rs = param_grads(d_sl, d_rs, ctx.rs_shape)
        return dq, dk, dv, g_sl, g_rs, None, None, None, None, None


def stickbreaking_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None):
    """Stick-breaking attention, ``[B, H, T, D]`` causal, remainder on the diagonal; ``tuning`` replaces some of
    the launch settings and levers (``launch_config``)."""
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, None, sm_scale, False, tuning)
