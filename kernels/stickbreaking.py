"""Stick-breaking attention (Tan et al. 2025), log-space, with the remainder on the diagonal.

For query row ``r`` and key ``j < r``: ``log a_rj = z_rj - sum_{j <= k < r} softplus(z_rk)``
(= logsigmoid(z_rj) - sum_{j<k<r} softplus(z_rk)); ``o_r = sum_j a_rj v_j + (1 - sum_j a_rj) v_r``.

Forward: one program per query tile walks the key tiles right to left from the diagonal, carrying the
fp32 sum of softplus of the keys already passed; inside a tile the sums over the keys after each one come from
one product of the softplus in bf16 with a (negated) triangular ones matrix on the tensor cores, accumulated
onto the log weights less that carried sum (a key's own softplus stays outside it, in fp32: ``log a_j =
logsigmoid(z_j) - ...``, so its rounding only touches weights that those sums make small; the triangular matrix
built once, before the walk), softplus in base 2 with its ``log1p`` a degree-4 polynomial on the FMA units
(degree 6 for fp32 inputs). The tiles are 64 query rows by 32 keys, with the registers capped (``maxnreg``) so
that several programs share a multiprocessor; each tile loads the next one's keys and values before its own
work. Once every row of the tile has accumulated more than ``EXIT_AT`` (60) nats the remaining weights are below
``e^-60`` and the walk stops (tested after every eighth tile): the Out(L^2) work shrinks to Out(L x reach). The
forward keeps per row only its softplus sum ``L_r`` and the first key walked.

Backward (one kernel, a walk from the left over the very keys the forward walked): with ``g_j = do_r.v_j`` and
``c_j = (g_j - g_r) a_j``, ``dz_rk = c_k (1 - sigma(z_k)) - sigma(z_k) sum_{j < k} c_j``, the weights
recomputed as ``a_j = exp(z_j - (L_r - sum_{k<j} softplus z_k))`` and the prefix sums accumulated as the walk
goes (no fp32 output, no fp32 copy of ``do``); ``sigma`` from the softplus's ``exp(-|z|)``. dq accumulates in
registers; dk and dv in fp32 buffers by atomic adds (as in Sieve's Algorithm 1); the diagonal's ``dv_r += (1 -
sum_j a_rj) do_r`` is added outside. Gradients flow to q, k, v, ``row_scale`` and ``slopes``.

``FILTER`` restricts the keys to ``{j : z_rj / 2 > tau_r}`` (Sieve: ``tau`` the 1.5-entmax threshold of the row
over ``j < r``), without gradient through the filter; see ``sieve.py``. Its third mode (``sieve-window``) breaks
the stick over every earlier key and keeps only the weights inside the filter (their log weights set to -inf
where they are formed); the backward then takes the
general form ``c_j = g_j a_j`` with the remainder's share on the prefix (the weights no longer sum to one with the
remainder).

What the above describes are the defaults (``TUNING``); ``tuning`` (``launch_config``) selects the other forms
of the same quantities: the right-to-left ``suffix`` backward from the forward's fp32 output (split in two
bf16 dots), ``tl.cumsum`` scans or tf32 sums, natural-log arithmetic, other tiles and loops. Long walks (scores
that stay negative, as in trained models that recall far back) are where they matter: the stick is then not
spent within a few keys and every key tile of a row is visited. On an H200 at 65,536 tokens, scores shifted by
-8 (``benchmarks/kernels.py --inputs walk8``), head dim 32, SDPA 19.9 / 73.0 ms forward / forward+backward:
stick-breaking 163 / 495 ms on the first forms (the ``previous`` rows of results/benchmarks/kernels.md), 75.7 /
297 on 64 x 64 tiles with two-bf16 sums (``bf16x2-64x64``), 39.2 / 191 on 32-key tiles with one-bf16 sums and
the next tile's loads ahead; sieve-window 123 / 405 -> 49.6 / 196 (its row-max pass on 64 x 128 tiles). Nsight
Compute put the 64 x 64 kernels at 255 registers a thread, two programs a multiprocessor and under half the issue
slots busy, the backward spilling (results/benchmarks/gpu_logs/long_walks_bf16_sums.txt); the steps since are in
results/benchmarks/gpu_logs/long_walks_prefetch.txt, sieve_alg1_rowmax_tiles.txt and long_walks_filter_sums_exit.txt.
On these defaults, on an H100 (2026-12-05, commit b7e368a, SDPA 19.7 / 71.5 ms): stick-breaking 31.8 / 176,
sieve-window 37.4 / 179; at head dim 64 (SDPA 27.5 / 105.1) 40.0 / 232 and 49.5 / 245; the defaults before them
(``log1p`` ``poly5``, the exit test every second tile, the row-max pass a kernel of its own, 128 registers) 34.5 /
184, 42.4 / 184, 42.8 / 233 and 52.6 / 251 (results/benchmarks/gpu_logs/long_walks_fused_rowmax_poly4.txt). The
forward's full tile there is about 330 instructions a thread for 16 scores (Triton 3.6's SASS for sm_90): per score
two ``MUFU.EX2``, five FMAs for softplus, four adds, a max, the scale and half of each of two bf16 conversions;
sieve-window's filter two more (a compare and a select). Nsight Compute puts the kernel's issue slots at about 62%
busy (that log's section 4).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lengthbench.kernels._common import Problem, reduce_slopes, score_tile
from lengthbench.kernels._rowwise import row_delta

EXIT_AT = 60.0
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# The levers of ``tuning`` (``stickbreaking_attention``, ``sieve_alg1_attention``) and their defaults; see
# ``launch_config``.
TUNING = dict(fwd=None, bwd=None, rowmax=None, cumsum="bf16", cumsum_width=None, exp2=True, exp2_soft="none",
              log1p=None, split=False, backward="prefix", sigmoid="reuse", skip_empty=False, loop="while",
              full_tiles=True, prefetch=True, rowmax_pass="fused", exit_every=8)
_CHOICES = dict(cumsum=("scan", "dot", "dot2", "bf16x2", "bf16x3", "bf16"), backward=("suffix", "prefix"),
                rowmax_pass=("kernel", "fused"), exp2_soft=("none", "weights", "all"),
                sigmoid=("exp", "reuse"), loop=("while", "for"),
                log1p=(None, "log", "poly", "poly8", "poly5", "poly4"), exit_every=(1, 2, 4, 8))


def launch_config(pb: Problem, tuning: dict | None = None) -> dict:
    """The kernels' launch settings and levers for problem ``pb``: ``TUNING`` with ``tuning``'s keys replacing
    theirs (a ``ValueError`` names an unknown key or value).

    - ``fwd``, ``bwd``: the forward's and the backward's tiles ``(bm, bn, warps, stages[, maxnreg])`` (None:
      64 query rows and 32 keys, 32 x 32 past head dim 64, ``Problem.num_warps``; the forward up to head dim 32 with
      3 stages (the fused row-max pass's loads) and its registers capped at 96 (five programs a multiprocessor), up
      to 64 with 2 stages and 128 (four); the backward with 2 stages, its registers capped at 168 up to head dim 32:
      in the forward at 96, sieve-window's forward on walk8 inputs at 65,536 tokens, D 32, took 40.4 ms against 42.6
      at 128, at 80 41.7, stick-breaking's within 0.6 ms (H100, 2026-12-05, commit fe4ae45); with the other new
      defaults, 96 registers with 3 stages against 128 with 2 37.6 against 41.1 ms at D 32, and at D 64 54.3
      against 49.4, where 128 stays (results/benchmarks/gpu_logs/long_walks_fused_rowmax_poly4.txt, section 3));
      ``rowmax`` those of
      ``sieve_alg1_attention``'s row-max pass (None: 64 query rows, 128 keys, 4 warps and 3 stages up to head dim
      64, past it ``Problem.fwd_block`` rows, ``Problem.block`` keys, ``Problem.fwd_warps``, 2; with ``rowmax_pass``
      ``fused`` only its keys a tile count, the forward kernel's own settings taking the rest). ``maxnreg`` caps
      the kernel's registers a thread (``max_registers``; 0 or left out: the compiler's choice).
    - ``cumsum``: the in-tile cumulative sums of softplus (and of the backward's ``c``): ``scan``
      (``tl.cumsum``), or products with a triangular ones matrix on the tensor cores: ``dot`` (the operand in
      tf32: 10 bits), ``dot2`` (two products, the operand split into its tf32 head and the rest: about 21
      bits), ``bf16x2`` (two bf16 parts: 16 bits, at bf16's rate), ``bf16x3`` (three: 24 bits), ``bf16`` (one
      product: 8 bits, each key's own softplus kept out of it: ``_stick``; the ``prefix`` backward only). With
      fp32 inputs ``dot`` and ``bf16x2`` run as ``dot2``, and ``bf16`` keeps its form on ``dot2``'s products (the
      fp32 ops keep fp32 accuracy, as their ``ieee`` dots do). Only the sums inside a key tile are so computed
      (the sum carried across tiles stays fp32): a weight's relative error from them is about ``2^-bits`` times
      its in-tile suffix sum (``bf16``: the sum over the keys after it, which bounds that error by ``2^-bits /
      e`` in absolute terms).
    - ``cumsum_width``: the width of the triangular blocks (None: the key tile ``bn``; 16 or 32: the tile's
      blocks of that many keys, their own sums added after in fp32; a power of two <= ``bn``).
    - ``exp2``: the stick in bits, ``log2 e`` folded into the scale: ``exp2``/``log2`` in place of
      ``exp``/``log``, ``softplus_2(x) = max(x, 0) + log2(1 + 2^-|x|)``.
    - ``exp2_soft`` (with ``exp2``): powers of two on the FMA units (``_exp2_soft``: a degree-5 polynomial and the
      exponent's bits) in place of the special-function unit's, for the weights (``weights``) or for the weights
      and softplus's ``2^-|z|`` too (``all``); ``none`` keeps the hardware's. A lever for long walks, measured
      slower there: at 65,536 tokens on walk8 inputs (every key of a row walked), D 32, fwd / fwd+bwd ms, none
      75.8 / 296, weights 100.9 / 365, all 107.9 / 413; D 64 84.7 / 376, 102.7 / 418, 126.0 / 456; sieve-window
      alike (H200, 2026-11-28, commit 77e1f96, results/benchmarks/gpu_logs/long_walks_exp2_soft.txt). The
      special-function unit does not bound these kernels.
    - ``log1p``: softplus's ``log(1 + exp(-|z|))`` by ``log`` (Triton's ``log``/``log2``: libdevice's full-precision
      functions, some twenty instructions each), or on the FMA units (``_log1p_ratio``): ``poly`` a degree-6
      polynomial in the stick's base (seven FMAs with softplus's own add), ``poly5`` a degree-5 one (six; relative
      error below 1e-5, below 1.4e-7 for the scores far below zero of a long walk), ``poly8`` a degree-8 one in
      nats (ten), ``poly4`` a degree-4 one (five; below 6.7e-5: walk8 inputs at D 32, side by side with
      ``poly5``, stick-breaking 32.8 / 175 ms against 34.2 / 182, sieve-window 41.6 / 180 against 42.4 / 183, and with
      the forward's registers at 96 40.4 / 179; H100, 2026-12-05, commit 51dadab). None: ``poly4`` for 16-bit
      inputs, ``poly`` for fp32 ones (held to fp32's tolerance). ``poly5`` with ``exit_every`` 2 against ``poly``
      and 1, side by side: the forward on walk8 inputs at 65,536 tokens, D 32 / 64, stick-breaking 34.6 / 42.9
      ms against 37.5 / 45.9, sieve-window 42.5 / 52.1 against 45.9 / 56.7; random and walk4 inputs within 0.5 ms
      (H100, 2026-12-05, commit 55a0756, results/benchmarks/gpu_logs/long_walks_filter_sums_exit.txt).
    - ``exit_every``: the forward's exit test (every row of the query tile past ``EXIT_AT`` nats) after every
      that-many key tiles, not after each: a reduction over the program's warps, through shared memory with three
      barriers, that a long walk otherwise pays on every tile; the walk then takes at most ``exit_every - 1``
      tiles more than it needs (their weights below ``e^-60``). The ``while`` loop's (``loop``), and not Sieve's,
      whose filter leaves tiles without a key that would skip the test. Measured with ``log1p`` above; the default
      8: with ``poly4`` and 96 registers, sieve-window's forward on walk8 inputs at 65,536 tokens, D 32, took 38.7 ms
      against 39.7 every fourth tile (H100, 2026-12-05, results/benchmarks/gpu_logs/
      long_walks_fused_rowmax_poly4.txt, section 2).
    - ``split``: the forward's products of the weights with 16-bit values as two dots (hi + lo), so its fp32
      output is accurate to fp32 rounding; False: one dot (the weights rounded to the values' dtype), with the
      ``prefix`` backward only (the ``suffix`` one reads that output: on an H200 its dq and ALiBi slope
      gradients then missed the float64 tests' 5e-2, up to 4.0).
    - ``backward``: ``suffix`` walks right to left from the diagonal, with ``C_r = do_r.(o_r - v_r)`` from the
      forward's fp32 output; ``prefix`` walks left to right over the very keys the forward walked (it keeps
      per row the softplus sum ``L_r`` and the first key walked), the weights as ``exp(z_j - (L_r -
      sum_{k<j} softplus z_k))`` and ``sum_{j<k} c_j`` a running prefix: no fp32 output, no fp32 copy of
      ``do``.
    - ``sigmoid``: the backward's ``sigma(z)`` and ``sigma(-z)`` by ``tl.sigmoid`` (``exp``) or from the
      softplus's ``exp(-|z|)`` (``reuse``: one division, no other exponential).
    - ``skip_empty``: with the filter on the weights alone (``sieve-window``), key tiles without a kept key
      skip the values (their load, products and ``dv``), the stick still broken over them. Off by default: the
      test is a reduction over the whole tile, and the tiles it would skip are few. sieve-window's forward at
      65,536 tokens, D 32, with and without it (loads ahead): walk8 72.4 / 61.9 ms, random 17.2 / 17.1 (commit
      178cbc3); a trained MQRAR model's inputs (D 16) 17.2 / 14.7 (commit 30d1207; H200, 2026-11-28,
      results/benchmarks/gpu_logs/long_walks_prefetch.txt).
    - ``loop``: the forward's walk as a ``while`` loop that ends once the stick is spent, or a counted ``for``
      loop over every key tile whose loads ``num_stages`` can pipeline (masked off once the stick is spent);
      the ``prefix`` backward's walk is a counted loop either way, the ``suffix`` one a ``while`` loop.
    - ``prefetch``: the forward's ``while`` walk loads the next key tile's keys and values before the work on
      its own (a pipeline the compiler does not build for a ``while`` loop; the values loaded even where
      ``skip_empty`` then skips them). stick-breaking's forward at 65,536 tokens on walk8 inputs, with and
      without: D 32 39.2 / 44.2 ms, D 64 47.7 / 51.0 (H200, 2026-11-28, commit 570715b).
    - ``full_tiles``: the forward takes the key tiles that lie before every row of its query tile (all but the
      diagonal's) without the causal masks' selects: stick-breaking's and ``sieve-window``'s, whose stick is broken
      over every earlier key (not Sieve's, whose filter decides which keys break it).
    - ``rowmax_pass``: ``sieve_alg1_attention``'s row maxima by a pass of their own (``kernel``: one more launch,
      and the threshold's arithmetic as PyTorch ops) or by the forward kernel itself before its walk
      (``fused``, the default: the same scores, each query tile's keys read once more by the same program, on key
      tiles of ``rowmax``'s keys), which stores the threshold for the backward. On 128-key tiles the fused pass took
      sieve-window's forward on walk8 inputs at 65,536 tokens, D 32, from 39.5 ms (the pass a kernel of its own) to
      38.0, on 64-key tiles 39.5, on the forward's 32-key tiles 43.0; random inputs 5.3 ms either way (with
      ``poly4``, 96 registers and the exit test every 8 tiles; H100, 2026-12-05, results/benchmarks/gpu_logs/
      long_walks_fused_rowmax_poly4.txt, section 3). The pass (``row_max_earlier``) takes the key tiles before its
      query tile's rows without masks: at 65,536 tokens, head dim 32, sieve-window's whole forward on random inputs
      went from 17.0 ms (most of it the pass) to 5.8 (H200, 2026-11-28, commits 570715b and ee3ddb6). Before that
      change ``fused`` (on the forward's key tiles) took 21.4 ms against 17.2, and no other tiles of the pass beat
      its defaults (commit 08d3a61, results/benchmarks/gpu_logs/long_walks_bf16_sums.txt). After it, side by side
      (65,536 tokens, H200, 2026-11-29, commit 82b7899, results/benchmarks/gpu_logs/sieve_alg1_rowmax_tiles.txt): the
      pass on 64 x 128 tiles (4 warps, 3 stages) against the 128 x 64 before (8 warps, 2 stages) took sieve-window's
      forward on random inputs from 5.79 to 5.36 ms at head dim 32 and from 8.98 to 8.33 at 64, on walk8 inputs
      from 50.7 to 49.7 and 62.9 to 62.6; 128 x 128 and 256 x 64 tiles were slower, ``fused`` on the forward's key
      tiles slower still (random 11.6 and 15.0 ms, walk8 55.9 and 69.6).
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
    if config["exp2_soft"] != "none" and not config["exp2"]:
        raise ValueError("stick-breaking tuning: exp2_soft needs exp2 (the software powers are of two)")
    if config["cumsum"] == "bf16" and config["backward"] == "suffix":
        raise ValueError("stick-breaking tuning: cumsum bf16 needs backward prefix (the suffix backward takes the sums "
                         "before each key as its row's total less those from it, which one bf16 product leaves too "
                         "coarse for the gradients)")
    if not config["split"] and config["backward"] == "suffix":
        raise ValueError("stick-breaking tuning: split False needs backward prefix (the suffix backward reads the "
                         "forward's output, which one 16-bit dot leaves too coarse for the gradients)")
    width = config["cumsum_width"]
    if width is not None and not (_power_of_two(int(width)) and 16 <= int(width)):
        raise ValueError(f"stick-breaking tuning: cumsum_width must be a power of two >= 16, got {width!r}")
    if pb.q.dtype == torch.float32 and config["cumsum"] in ("dot", "bf16x2"):
        config["cumsum"] = "dot2"
    if config["log1p"] is None:  # fp32 inputs keep fp32's accuracy
        config["log1p"] = "poly" if pb.q.dtype == torch.float32 else "poly4"
    config["loop"] = _CHOICES["loop"].index(config["loop"])
    # the kernels' LOG1P: 0 log, 1 poly, 2 poly8, 3 poly5, 4 poly4
    config["log1p"] = _CHOICES["log1p"].index(config["log1p"]) - 1
    # the kernels' CUMSUM: the choice's index; 6 is bf16's form (each key's own softplus outside the sums) with
    # fp32 inputs, whose sums take two tf32 products (dot2)
    config["cumsum"] = _CHOICES["cumsum"].index(config["cumsum"])
    if pb.q.dtype == torch.float32 and config["cumsum"] == 5:
        config["cumsum"] = 6
    config["sigmoid"] = _CHOICES["sigmoid"].index(config["sigmoid"])
    for key in ("exp2", "split", "skip_empty", "full_tiles", "prefetch"):
        config[key] = bool(config[key])
    # the kernels' EXP2: 0 natural exp/log, 1 the hardware's powers of two, 2 the weights' in software, 3 all
    config["exp2"] = int(config["exp2"]) + _CHOICES["exp2_soft"].index(config.pop("exp2_soft"))
    return config


def max_registers(regs: int) -> dict:
    """The launch option that caps a kernel's registers a thread at ``regs`` (Triton's ``maxnreg``; 0: none, the
    compiler's choice). Fewer registers let more programs share a multiprocessor, at the price of spills."""
    return {"maxnreg": regs} if regs else {}


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@triton.jit
def _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau, upto, FILTER: tl.constexpr,
              HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, k=None):
    """Loads a key tile (``k``: loaded already); its scores, biased scores, the keys each row breaks the stick
    over (those before ``upto``: ``offs_m``, or where a phase of Sieve's open walk stopped) and those whose weights
    it keeps (``FILTER``: 0 every earlier key; 1 Sieve, both only where ``z / 2 > tau``; 2 ``sieve-window``, the
    stick over every earlier key, the weights only where ``z / 2 > tau``)."""
    if k is None:
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
    z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
    valid = offs_n[None, :] < upto[:, None]
    keep = valid
    if FILTER == 1:
        valid = valid & (z > (tau * 2.0)[:, None])  # z / 2 > tau, one multiply a row
        keep = valid
    elif FILTER == 2:
        keep = valid & (z > (tau * 2.0)[:, None])
    return k, z, zb, valid, keep


@triton.jit
def _exp2_soft(x):
    """``2^x`` on the FMA and integer units: ``x = n + f`` (``n`` the nearest integer, by the float addition of
    ``1.5 * 2^23``; ``|f| <= 1/2``), ``2^f`` by a degree-5 polynomial (a minimax fit; relative error below 2.4e-7
    in fp32, as the special-function unit's ``ex2.approx``), ``n`` added to its exponent bits; 0 below
    ``2^-125``."""
    xc = tl.minimum(tl.maximum(x, -125.0), 127.0)
    t = xc + 12582912.0
    f = xc - (t - 12582912.0)
    p = 0.001327647129073739 * f + 0.009675540961325169
    p = p * f + 0.05550713092088699
    p = p * f + 0.24022120237350464
    p = p * f + 0.6931469440460205
    p = p * f + 1.0000001192092896
    n = t.to(tl.int32, bitcast=True) - 0x4B400000
    out = (p.to(tl.int32, bitcast=True) + (n << 23)).to(tl.float32, bitcast=True)
    return tl.where(x < -125.0, 0.0, out)


@triton.jit
def _softplus_e(z, EXP2: tl.constexpr, LOG1P: tl.constexpr):
    """``(softplus(z), exp(-|z|))`` (``softplus`` of ``_common``); with ``EXP2`` the scores in bits and both in
    base 2: ``(max(z, 0) + log2(1 + 2^-|z|), 2^-|z|)`` (``EXP2`` 3: ``2^-|z|`` by ``_exp2_soft``)."""
    if EXP2 == 3:
        e = _exp2_soft(-tl.abs(z))
    elif EXP2:
        e = tl.exp2(-tl.abs(z))
    else:
        e = tl.exp(-tl.abs(z))
    if LOG1P:
        lg = e * _log1p_ratio(e, EXP2, LOG1P)
    elif EXP2:
        lg = tl.log2(1.0 + e)
    else:
        lg = tl.log(1.0 + e)
    return tl.maximum(z, 0.0) + lg, e


@triton.jit
def _log1p_ratio(x, EXP2: tl.constexpr, LOG1P: tl.constexpr):
    """``log(1 + x) / x`` on ``[0, 1]`` (``log2(1 + x) / x`` with ``EXP2``) on the FMA units, where ``log(1 + x)``
    in fp32 loses ``x``'s low bits to the rounding of ``1 + x``. ``LOG1P`` 1: a degree-6 polynomial fitted to the
    ratio in bits (relative error below 1.5e-6 in fp32, so that softplus in bits takes one FMA after it; in nats
    one more multiply by ``ln 2``); 2: a degree-8 one in nats (below 2.5e-7; in bits one more multiply by ``log2
    e``); 3: a degree-5 one in bits (below 9.8e-6; its constant term ``1 / ln 2`` itself, so that near ``x = 0``,
    the scores far below zero of a long walk, the error is below 1.4e-7); 4: a degree-4 one so made (below 6.7e-5;
    near ``x = 0`` below 1e-6)."""
    if LOG1P == 2:  # in nats
        p = _horner(x, _LOG1P_POLY8, 9)
        if EXP2:
            p = p * LOG2E
    else:  # in bits
        if LOG1P == 4:
            p = _horner(x, _LOG1P_POLY4, 5)
        elif LOG1P == 3:
            p = _horner(x, _LOG1P_POLY5, 6)
        else:
            p = _horner(x, _LOG1P_POLY6, 7)
        if not EXP2:
            p = p * LN2
    return p


# ``_log1p_ratio``'s polynomials, highest power first (minimax fits of the relative error in fp32)
_LOG1P_POLY6 = tl.constexpr((0.020413657650351524, -0.0958419069647789, 0.21534417569637299, -0.3391266167163849,
                             0.4776794910430908, -0.7211607694625854, 1.4426932334899902))
_LOG1P_POLY8 = tl.constexpr((0.005253490526229143, -0.029588690027594566, 0.07836206257343292, -0.13674813508987427,
                             0.19111457467079163, -0.24844379723072052, 0.33319273591041565, -0.49999502301216125,
                             1.0))
_LOG1P_POLY5 = tl.constexpr((-0.03568429872393608, 0.1494523584842682, -0.30643430352211, 0.47064468264579773,
                             -0.7206830978393555, 1.4426950216293335))
_LOG1P_POLY4 = tl.constexpr((0.0621890164911747, -0.23279733955860138, 0.4461168348789215, -0.7181367874145508,
                             1.4426950216293335))


@triton.jit
def _horner(x, C: tl.constexpr, N: tl.constexpr):
    """The polynomial with the ``N`` coefficients ``C`` (highest power first) at ``x``, one FMA a term (``N`` given:
    the interpreter takes no ``len`` of a constexpr)."""
    p = C[0] * x + C[1]
    for i in tl.static_range(2, N):
        p = p * x + C[i]
    return p


@triton.jit
def _exp(x, EXP2: tl.constexpr):
    if EXP2 >= 2:
        out = _exp2_soft(x)
    elif EXP2:
        out = tl.exp2(x)
    else:
        out = tl.exp(x)
    return out


@triton.jit
def _sigmoids(z, e, SIG: tl.constexpr, EXP2: tl.constexpr):
    """``(sigma(z), sigma(-z))`` of natural-log scores ``z`` (in bits with ``EXP2``); ``SIG`` 1 from ``e =
    exp(-|z|)`` of ``_softplus_e``."""
    if SIG:
        r = 1.0 / (1.0 + e)
        pos = z >= 0
        s = tl.where(pos, r, e * r)
        sn = tl.where(pos, e * r, r)
    else:
        zn = z
        if EXP2:
            zn = z * LN2
        s = tl.sigmoid(zn)
        sn = tl.sigmoid(-zn)
    return s, sn


@triton.jit
def _cumsum(x, PREFIX: tl.constexpr, CUMSUM: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CW: tl.constexpr,
            ones=None):
    """Along the keys of a ``[BM, BN]`` fp32 tile: the suffix sums ``sum_{k >= j} x_k`` (``PREFIX`` 0), the
    prefix sums ``sum_{k < j} x_k`` (1) or the suffix sums without the key's own, ``sum_{k > j} x_k`` (2).
    ``CUMSUM`` 0 a scan; else products with a triangular ones matrix on the tensor cores (``_tri_dot``; ``ones``
    that matrix, ``_tri_ones(PREFIX, CUMSUM, CW)``, where a walk built it before its loop), over blocks of ``CW``
    keys (the blocks' own sums added after, in fp32)."""
    if CUMSUM == 0:
        if PREFIX == 1:
            out = tl.cumsum(x, 1) - x
        elif PREFIX == 2:
            out = tl.cumsum(x, 1, reverse=True) - x
        else:
            out = tl.cumsum(x, 1, reverse=True)
    elif CW == BN:
        out = _tri_dot(x, PREFIX, CUMSUM, CW, ones)
    else:
        NB: tl.constexpr = BN // CW
        inner = tl.reshape(_tri_dot(tl.reshape(x, [BM * NB, CW]), PREFIX, CUMSUM, CW, ones), [BM, NB, CW])
        totals = tl.sum(tl.reshape(x, [BM, NB, CW]), 2)
        if PREFIX == 1:  # the blocks before
            offs = tl.cumsum(totals, 1) - totals
        else:  # the blocks after
            offs = tl.cumsum(totals, 1, reverse=True) - totals
        out = tl.reshape(inner + offs[:, :, None], [BM, BN])
    return out


@triton.jit
def _tri_ones(PREFIX: tl.constexpr, CUMSUM: tl.constexpr, W: tl.constexpr):
    """``_tri_dot``'s ``[W, W]`` triangular ones matrix, in its products' dtype (fp32 for the tf32 ones, bf16 for
    the others). A walk builds it once before its loop: built inside, the compiler stores it to shared memory
    again for every tile."""
    rows = tl.arange(0, W)[:, None]
    cols = tl.arange(0, W)[None, :]
    if PREFIX == 1:
        tri = rows < cols
    elif PREFIX == 2:
        tri = rows > cols
    else:
        tri = rows >= cols
    if CUMSUM == 1 or CUMSUM == 2 or CUMSUM == 6:
        out = tri.to(tl.float32)
    else:
        out = tri.to(tl.bfloat16)
    return out


@triton.jit
def _tri_dot(x, PREFIX: tl.constexpr, CUMSUM: tl.constexpr, W: tl.constexpr, ones=None):
    """``_cumsum`` of a ``[M, W]`` fp32 block as a product with the ``[W, W]`` triangular ones matrix (exact in
    every format; ``ones``, else ``_tri_ones``): ``CUMSUM`` 1 ``x`` in tf32 (10 bits); 2 ``x`` split into its tf32
    head (the top 10 mantissa bits, cut by a mask) and the rest, two products (about 21 bits); 3 ``x`` split into
    two bf16 parts (16 bits); 4 into three (24 bits); 5 ``x`` in bf16 (8 bits); 6 as 2. ``PREFIX`` as
    ``_cumsum``'s."""
    if ones is None:
        ones = _tri_ones(PREFIX, CUMSUM, W)
    if CUMSUM == 1:
        out = tl.dot(x, ones, input_precision="tf32")
    elif CUMSUM == 2 or CUMSUM == 6:
        hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        out = tl.dot(hi, ones, input_precision="tf32")
        out = tl.dot(x - hi, ones, out, input_precision="tf32")
    elif CUMSUM == 5:
        out = tl.dot(x.to(tl.bfloat16), ones)
    else:
        hi = x.to(tl.bfloat16)
        rest = x - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        out = tl.dot(hi, ones)
        out = tl.dot(mid, ones, out)
        if CUMSUM == 4:
            out = tl.dot((rest - mid.to(tl.float32)).to(tl.bfloat16), ones, out)
    return out


@triton.jit
def _stick(z, valid, lsum, CUMSUM: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, CW: tl.constexpr, MASKED: tl.constexpr, ones=None, thr=None):
    """Softplus of the tile's active scores and their weights, given the softplus sum to the right (without
    ``MASKED`` every key of the tile is active; ``ones``: ``_stick_ones``). ``CUMSUM`` 5 and 6: a key's own
    softplus stays outside the products (``log a_j = (z_j - softplus z_j) - sum_{k > j}``), so that their rounding
    touches only the sums over the keys between it and the row, which make its weight small where they are
    large. ``thr`` (``[BM]``, sieve-window's filter): the weights only where ``z > thr``, the others' log weight
    set to -inf where it is formed (a compare and a select beside each other: a filter kept as a mask from the
    scores to the weights holds its predicates across the sums' product, packed into registers and out again)."""
    sp, _ = _softplus_e(z, EXP2, LOG1P)
    if MASKED:
        sp = tl.where(valid, sp, 0.0)
    zs = z  # the log weight before the sums: with CUMSUM 5 and 6 less the key's own softplus
    if CUMSUM >= 5:
        zs = z - sp
    if thr is not None:
        zs = tl.where(z > thr[:, None], zs, float("-inf"))
    if CUMSUM == 5 and CW == BN:  # the product adds the sums to its accumulator, log a_j less the sum to the right
        if ones is None:
            ones = _stick_ones(CUMSUM, CW, BN)
        a = _exp(tl.dot(sp.to(tl.bfloat16), ones, zs - lsum[:, None]), EXP2)
    else:
        a = _exp(zs - lsum[:, None] - _cumsum(sp, 2 if CUMSUM >= 5 else 0, CUMSUM, BM, BN, CW, ones), EXP2)
    if MASKED:
        a = tl.where(valid, a, 0.0)
    return sp, a


@triton.jit
def _stick_ones(CUMSUM: tl.constexpr, CW: tl.constexpr, BN: tl.constexpr):
    """The triangular ones matrix of ``_stick``'s sums (``_tri_ones``), for a walk to build before its loop; with
    one bf16 product over the whole key tile (``CUMSUM`` 5, ``CW`` = ``BN``) its negative, so that the product
    subtracts the sums from the log weights in its accumulator (no subtraction after it)."""
    ones = _tri_ones(2 if CUMSUM >= 5 else 0, CUMSUM, CW)
    if CUMSUM == 5 and CW == BN:
        ones = -ones
    return ones


@triton.jit
def _fwd_kernel(Q, K, V, Out, O32, REM, LSE, START, SL, RS, TAU, sm_scale, T, H, exit_at, eps,
                SAVE: tl.constexpr, FILTER: tl.constexpr, ROWMAX: tl.constexpr, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr,
                SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr, CW: tl.constexpr, EXP2: tl.constexpr,
                LOG1P: tl.constexpr, SKIP: tl.constexpr, LOOP: tl.constexpr, FULL: tl.constexpr,
                PREFETCH: tl.constexpr, EVERY: tl.constexpr, BNR: tl.constexpr):
    """The forward of a query tile. ``SAVE`` 1 keeps the remainder and the fp32 output (``suffix`` backward);
    3 the softplus sum ``L_r`` (nats) and the first key walked, per row (``prefix`` backward). ``ROWMAX``: the
    filter's threshold is Algorithm 1's, ``(max_{j<r} z_rj - eps) / 2``, found here over the row's earlier keys
    and stored in ``TAU`` (else read from it), over key tiles of ``BNR`` keys."""
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
        if ROWMAX:
            tau = _rowmax_tau(q, K, base, offs_m, offs_d, dmask, row_ok, pid_m, T, sm_scale, slope, rs, eps,
                              HAS_SLOPES, HAS_RS, DOT_PREC, D, BM, BNR)
            tl.store(TAU + bh * T + offs_m, tau, mask=row_ok)
        else:
            tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    scale = sm_scale
    if EXP2:  # the scores, the filter and the exit in bits
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        exit_at = exit_at * LOG2E
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    if LOOP:
        acc, lsum, t = _fwd_walk_for(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, scale, slope, rs, tau, n_tiles,
                                     exit_at, FILTER, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC, D, BD, BM, BN, CUMSUM,
                                     CW, EXP2, LOG1P, SKIP, FULL)
    else:
        acc, lsum, t = _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, scale, slope, rs, tau,
                                       n_tiles, exit_at, tl.zeros([BM, BD], dtype=tl.float32),
                                       tl.zeros([BM], dtype=tl.float32), offs_m, n_tiles, FILTER, HAS_SLOPES, HAS_RS,
                                       SPLIT, DOT_PREC, D, BD, BM, BN, CUMSUM, CW, EXP2, LOG1P, SKIP, FULL,
                                       PREFETCH, EVERY)
    if EXP2:
        lsum = lsum * LN2
    if SAVE == 3:
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, D, 0, D)
        tl.store(LSE + bh * T + offs_m, lsum, mask=row_ok)
        tl.store(START + bh * T + offs_m, tl.zeros([BM], dtype=tl.int32) + (n_tiles - t) * BN, mask=row_ok)
    else:
        _fwd_store(acc, lsum, V, Out, O32, REM, base, offs_m, offs_d, rmask, row_ok, bh, T, D, SAVE, D)


@triton.jit
def row_max_earlier(q, K, base, offs_m, offs_d, dmask, pid_m, T, sm_scale, slope, rs, HAS_SLOPES: tl.constexpr,
                    HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr):
    """``max_{j<r} z_rj`` of a query tile's rows (-inf for row 0): Algorithm 1's row maxima (``sieve.py``). The key
    tiles before the query tile's first row take no causal masks; without ALiBi slopes or row scales their maximum is
    that of the raw products, scaled once (for ``sm_scale > 0`` the rounding of a product by it is monotone: the
    same value as the maximum of the scaled ones)."""
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    before = (pid_m * BM) // BN * BN  # the keys before every row of the tile
    if not HAS_SLOPES and not HAS_RS:
        if sm_scale > 0:
            raw = tl.full([BM], float("-inf"), dtype=tl.float32)
            for start_n in range(0, before, BN):
                offs_n = start_n + tl.arange(0, BN)
                k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
                raw = tl.maximum(raw, tl.max(tl.dot(q, tl.trans(k), input_precision=DOT_PREC), 1))
            best = raw * sm_scale
        else:
            best = _max_scores(q, K, base, offs_m, offs_d, dmask, before, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                               DOT_PREC, D, BM, BN)
    else:
        best = _max_scores(q, K, base, offs_m, offs_d, dmask, before, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                           DOT_PREC, D, BM, BN)
    for start_n in range(before, tl.minimum((pid_m + 1) * BM, T), BN):  # the tiles the diagonal crosses
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=(offs_n < T)[:, None] & dmask[None, :],
                    other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        earlier = (offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T)
        best = tl.maximum(best, tl.max(tl.where(earlier, z, float("-inf")), 1))
    return best


@triton.jit
def _max_scores(q, K, base, offs_m, offs_d, dmask, upto, sm_scale, slope, rs, HAS_SLOPES: tl.constexpr,
                HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The rows' maximum score over the keys before ``upto`` (a multiple of ``BN``, before every row), unmasked."""
    best = tl.full([BM], float("-inf"), dtype=tl.float32)
    for start_n in range(0, upto, BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
        z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
        best = tl.maximum(best, tl.max(z, 1))
    return best


@triton.jit
def _rowmax_tau(q, K, base, offs_m, offs_d, dmask, row_ok, pid_m, T, sm_scale, slope, rs, eps,
                HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    """Algorithm 1's threshold of a query tile's rows, ``(max_{j<r} z_rj - eps) / 2`` less a sliver (so that
    ``z = max - eps`` stays in; -inf for row 0, +inf past the last row), as ``sieve_alg1_attention`` computes it
    from its row-max pass."""
    best = row_max_earlier(q, K, base, offs_m, offs_d, dmask, pid_m, T, sm_scale, slope, rs, HAS_SLOPES, HAS_RS,
                           DOT_PREC, D, BM, BN)
    return tl.where(row_ok, (best - eps) * 0.5 - 1e-6, float("inf"))


@triton.jit
def _fwd_walk(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at, acc,
              lsum, upto, max_tiles, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr):
    """``_fwd_walk_tuned`` with the default levers (Sieve's gathered open rows call it)."""
    acc, lsum, t = _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles,
                                   exit_at, acc, lsum, upto, max_tiles, FILTER, HAS_SLOPES, HAS_RS, SPLIT, DOT_PREC,
                                   D, BD, BM, BN, 0, BN, False, False, False, False)
    return acc, lsum, t


@triton.jit
def _fwd_walk_tuned(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at,
                    acc, lsum, upto, max_tiles, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr,
                    HAS_RS: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                    CW: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, SKIP: tl.constexpr,
                    FULL: tl.constexpr, PREFETCH: tl.constexpr = False, EVERY: tl.constexpr = 1):
    """``(acc, lsum, t)``: the weighted values and the softplus sum of the rows ``offs_m``, from ``acc`` and
    ``lsum``, over their keys before ``upto`` in the key tiles ``n_tiles - 1`` down, stopping once every row
    (``row_ok``) has passed ``exit_at`` nats (bits with ``EXP2``), or after ``max_tiles`` tiles; ``t`` the tiles
    walked (Sieve's gathered open rows reuse it, a phase at a time: ``sieve._open_kernel``). ``CUMSUM``,
    ``EXP2``, ``LOG1P``, ``SKIP``, ``FULL``, ``PREFETCH``, ``EVERY``: the levers ``cumsum``, ``exp2``, ``log1p``,
    ``skip_empty``, ``full_tiles``, ``prefetch`` and ``exit_every`` of ``launch_config``."""
    t = 0
    lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    lowest = tl.min(upto, 0)
    ones = _stick_ones(CUMSUM, CW, BN)
    thr = None
    if FILTER == 2:  # sieve-window's filter, applied where the weights are formed (``_stick``)
        thr = tau * 2.0
    if PREFETCH:  # the first tile's keys and values; each tile then loads the next one's before its own work
        k_next, v_next = _kv_tile(K, V, base, (n_tiles - 1) * BN + tl.arange(0, BN), offs_d, dmask, T, D)
    while (t < n_tiles) & (lmin < exit_at) & (t < max_tiles):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k_here = None
        v_here = None
        if PREFETCH:
            k_here = k_next
            v_here = v_next
            k_next, v_next = _kv_tile(K, V, base, offs_n - BN, offs_d, dmask, T, D)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, sm_scale, slope, rs, tau,
                                          upto, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D, k_here)
        full = 0
        if FULL:  # every key of the tile is before every row's limit: no masks
            full = (n_tiles - t) * BN <= lowest
        if full:
            kept = 1
            if SKIP:
                if FILTER == 2:  # every key of the tile is earlier: the filter alone
                    keep = z > thr[:, None]
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = _value_tile(V, base, offs_n, offs_d, dmask[None, :], D, v_here)
                acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, CW, EXP2,
                                    LOG1P, False, ones, thr)
            else:  # no kept key: the stick alone
                sp, _ = _softplus_e(z, EXP2, LOG1P)
            lsum += tl.sum(sp, 1)
            lmin = _exit_sum(lsum, row_ok, lmin, t, EVERY)
        # Sieve's supports are small: most tiles hold none of them and cost only the score product.
        elif tl.max(valid.to(tl.int32)) > 0:
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = _value_tile(V, base, offs_n, offs_d, (offs_n < T)[:, None] & dmask[None, :], D, v_here)
                acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, CW, EXP2,
                                    LOG1P, True, ones, thr)
            else:  # no kept key: the stick alone
                sp, _ = _softplus_e(z, EXP2, LOG1P)
                sp = tl.where(valid, sp, 0.0)
            lsum += tl.sum(sp, 1)
            lmin = _exit_sum(lsum, row_ok, lmin, t, EVERY)
        t += 1
    return acc, lsum, t


@triton.jit
def _exit_sum(lsum, row_ok, lmin, t, EVERY: tl.constexpr):
    """The smallest softplus sum of the tile's rows (``row_ok``), the walk's exit test, taken after every ``EVERY``-th
    tile (``t`` the tile just walked; else ``lmin`` as it was): a reduction over the rows of every warp of the
    program, through shared memory and three barriers."""
    if EVERY == 1:
        lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    else:
        if t % EVERY == EVERY - 1:
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
    return lmin


@triton.jit
def _value_tile(V, base, offs_n, offs_d, mask, D: tl.constexpr, v=None):
    """The value tile of keys ``offs_n`` (``mask`` its load mask), or ``v`` where the walk loaded it ahead."""
    if v is None:
        v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=mask, other=0.0)
    return v


@triton.jit
def _kv_tile(K, V, base, offs_n, offs_d, dmask, T, D: tl.constexpr):
    """The key and value tile of keys ``offs_n`` (zeros outside ``[0, T)``)."""
    kv_mask = ((offs_n >= 0) & (offs_n < T))[:, None] & dmask[None, :]
    k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def _fwd_tile(z, valid, keep, v, acc, lsum, FILTER: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr, CW: tl.constexpr, EXP2: tl.constexpr,
              LOG1P: tl.constexpr, MASKED: tl.constexpr, ones=None, thr=None):
    """``(acc, sp)``: a key tile's weighted values added to ``acc``, and its softplus (``MASKED``, ``ones``,
    ``thr``: see ``_stick``; ``FILTER`` 2 without ``thr``: the weights kept where ``keep``)."""
    sp, a = _stick(z, valid, lsum, CUMSUM, EXP2, LOG1P, BM, BN, CW, MASKED, ones, thr)
    if FILTER == 2 and thr is None:
        a = tl.where(keep, a, 0.0)
    if SPLIT:
        a_hi = a.to(v.dtype)
        acc += tl.dot(a_hi, v)
        acc += tl.dot((a - a_hi.to(tl.float32)).to(v.dtype), v)
    else:
        acc += tl.dot(a.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, sp


@triton.jit
def _fwd_walk_for(q, K, V, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, n_tiles, exit_at,
                  FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr, SPLIT: tl.constexpr,
                  DOT_PREC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  CUMSUM: tl.constexpr, CW: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, SKIP: tl.constexpr,
                  FULL: tl.constexpr):
    """``_fwd_walk_tuned``'s walk from a query tile's diagonal (``loop`` ``for``) as a counted loop over every
    key tile, so that the keys' and values' loads can be software-pipelined (``num_stages``): once the stick
    is spent (``exit_at``) the loads are masked off and the tiles left cost only the loop."""
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    lsum = tl.zeros([BM], dtype=tl.float32)
    t = 0
    lmin = tl.min(tl.zeros([BM], dtype=tl.float32), 0)
    lowest = tl.min(offs_m, 0)
    ones = _stick_ones(CUMSUM, CW, BN)
    for i in range(0, n_tiles):
        walking = lmin < exit_at
        offs_n = (n_tiles - 1 - i) * BN + tl.arange(0, BN)
        kv_mask = (offs_n < tl.where(walking, T, 0))[:, None] & dmask[None, :]
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        if walking:
            z, zb = score_tile(q, k, offs_m, offs_n, sm_scale, slope, rs, HAS_SLOPES, HAS_RS, DOT_PREC)
            valid = offs_n[None, :] < offs_m[:, None]
            keep = valid
            if FILTER == 1:
                valid = valid & (z > (tau * 2.0)[:, None])
                keep = valid
            elif FILTER == 2:
                keep = valid & (z > (tau * 2.0)[:, None])
            full = 0
            if FULL:  # every key of the tile is before every row: no masks
                full = (n_tiles - i) * BN <= lowest
            if full:
                acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, CW,
                                    EXP2, LOG1P, False, ones)
                lsum += tl.sum(sp, 1)
                lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
            elif tl.max(valid.to(tl.int32)) > 0:
                kept = 1
                if SKIP:
                    kept = tl.max(keep.to(tl.int32))
                if kept > 0:
                    acc, sp = _fwd_tile(z, valid, keep, v, acc, lsum, FILTER, SPLIT, DOT_PREC, BM, BN, CUMSUM, CW,
                                        EXP2, LOG1P, True, ones)
                else:
                    sp, _ = _softplus_e(z, EXP2, LOG1P)
                    sp = tl.where(valid, sp, 0.0)
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
                BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr, CW: tl.constexpr, EXP2: tl.constexpr,
                LOG1P: tl.constexpr, SIG: tl.constexpr, SKIP: tl.constexpr):
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
    dq, d_rs, d_sl = _bwd_walk_tuned(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope,
                                     rs, tau, c_total, g_r, n_tiles, exit_at, FILTER, HAS_SLOPES, HAS_RS, GRAD_RS,
                                     GRAD_SL, DOT_PREC, D, BD, BM, BN, CUMSUM, CW, EXP2, LOG1P, SIG, SKIP)
    _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
               GRAD_RS, GRAD_SL, D)


@triton.jit
def _bwd_walk(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, c_total,
              g_r, n_tiles, exit_at, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
              GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
              BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``_bwd_walk_tuned`` with the default levers (Sieve's gathered open rows call it)."""
    dq, d_rs, d_sl = _bwd_walk_tuned(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope,
                                     rs, tau, c_total, g_r, n_tiles, exit_at, FILTER, HAS_SLOPES, HAS_RS, GRAD_RS,
                                     GRAD_SL, DOT_PREC, D, BD, BM, BN, 0, BN, False, False, 0, False)
    return dq, d_rs, d_sl


@triton.jit
def _bwd_walk_tuned(q, do, K, V, DK, DV, base, offs_m, offs_d, dmask, row_ok, T, sm_scale, slope, rs, tau, c_total,
                    g_r, n_tiles, exit_at, FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                    GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                    CW: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, SIG: tl.constexpr, SKIP: tl.constexpr):
    """``(dq, d_rs, d_sl)`` of the rows ``offs_m`` (before ``sm_scale`` and the slopes' sign and row scale)
    over the key tiles ``n_tiles - 1`` down to 0, the forward's walk (Sieve's gathered open rows reuse it);
    dk and dv go to ``DK``/``DV`` by atomic adds. ``sm_scale``, ``slope``, ``tau`` and ``exit_at`` in nats;
    ``CUMSUM``, ``EXP2``, ``SIG``, ``SKIP``: the levers of ``launch_config``."""
    scale = sm_scale
    if EXP2:
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        exit_at = exit_at * LOG2E
    lsum = tl.zeros([BM], dtype=tl.float32)
    c_acc = tl.zeros([BM], dtype=tl.float32)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    t = 0
    lmin = tl.min(tl.zeros([BM], dtype=tl.float32), 0)
    while (t < n_tiles) & (lmin < exit_at):
        offs_n = (n_tiles - 1 - t) * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, scale, slope, rs, tau,
                                          offs_m, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        if tl.max(valid.to(tl.int32)) > 0:
            kv_mask = (offs_n < T)[:, None] & dmask[None, :]
            sp, e = _softplus_e(z, EXP2, LOG1P)
            sp = tl.where(valid, sp, 0.0)
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
                if CUMSUM >= 5:  # (``_stick``'s form)
                    a = _exp((z - sp) - lsum[:, None] - _cumsum(sp, 2, CUMSUM, BM, BN, CW), EXP2)
                else:
                    a = _exp(z - lsum[:, None] - _cumsum(sp, 0, CUMSUM, BM, BN, CW), EXP2)
                a = tl.where(valid, a, 0.0)
                if FILTER == 2:
                    a = tl.where(keep, a, 0.0)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
                c = tl.where(valid, (g - g_r[:, None]) * a, 0.0)
                before = c_total[:, None] - c_acc[:, None] - _cumsum(c, 0, CUMSUM, BM, BN, CW)
                s, sn = _sigmoids(z, e, SIG, EXP2)
                dz = tl.where(valid, c * sn - s * before, 0.0)
                dv_tile = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=DOT_PREC)
                tl.atomic_add(DV + base + offs_n[:, None] * D + offs_d[None, :], dv_tile, mask=kv_mask,
                              sem="relaxed")
                c_acc += tl.sum(c, 1)
            else:  # no kept key (sieve-window): c = 0 on the tile
                s, sn = _sigmoids(z, e, SIG, EXP2)
                dz = tl.where(valid, -s * (c_total - c_acc)[:, None], 0.0)
            dzs = dz * rs[:, None]
            dq += tl.dot(dzs.to(k.dtype), k, input_precision=DOT_PREC)
            if GRAD_RS:
                if EXP2:
                    zb = zb * LN2
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            dk_tile = tl.dot(tl.trans(dzs).to(q.dtype), q, input_precision=DOT_PREC) * sm_scale
            tl.atomic_add(DK + base + offs_n[:, None] * D + offs_d[None, :], dk_tile, mask=kv_mask, sem="relaxed")
            lsum += tl.sum(sp, 1)
            lmin = tl.min(tl.where(row_ok, lsum, float("inf")), 0)
        t += 1
    return dq, d_rs, d_sl


@triton.jit
def _bwd_prefix_kernel(Q, K, V, DO, DQ, DK, DV, LSE, START, SL, RS, TAU, DRS, DSL, sm_scale, T, H,
                       FILTER: tl.constexpr, HAS_SLOPES: tl.constexpr, HAS_RS: tl.constexpr,
                       GRAD_RS: tl.constexpr, GRAD_SL: tl.constexpr, DOT_PREC: tl.constexpr, D: tl.constexpr,
                       BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CUMSUM: tl.constexpr,
                       CW: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, SIG: tl.constexpr,
                       SKIP: tl.constexpr):
    """The ``prefix`` backward of a query tile: left to right over the keys the forward walked, ``[START_r,
    r)``, with the forward's softplus sum ``L_r = LSE_r``. With ``P_j`` the softplus sum of the walked keys
    before ``j``, ``a_j = exp(z_j - (L_r - P_j))``; with ``c_j = (g_j - g_r) a_j`` (``FILTER`` 2: ``c_j = g_j
    a_j`` on the kept keys, and ``g_r rem_r`` added to the running sum, the remainder's share),
    ``dz_k = c_k sigma(-z_k) - sigma(z_k) sum_{j < k} c_j``: the ``suffix`` backward's form with ``C_r -
    sum_{j >= k} c_j`` summed from the left. The diagonal's ``dv_r += rem_r do_r`` is added here."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * T * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    row_ok = offs_m < T
    dmask = offs_d < D
    rmask = row_ok[:, None] & dmask[None, :]
    roff = base + offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(Q + roff, mask=rmask, other=0.0)
    do = tl.load(DO + roff, mask=rmask, other=0.0)
    do32 = do.to(tl.float32)
    g_r = tl.sum(do32 * tl.load(V + roff, mask=rmask, other=0.0).to(tl.float32), 1)
    lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)
    first = tl.load(START + bh * T + offs_m, mask=row_ok, other=T)
    rem = tl.exp(-lse)
    slope = 0.0
    if HAS_SLOPES:
        slope = tl.load(SL + bh % H)
    rs = tl.full([BM], 1.0, dtype=tl.float32)
    if HAS_RS:
        rs = tl.load(RS + bh * T + offs_m, mask=row_ok, other=1.0)
    tau = tl.zeros([BM], dtype=tl.float32)
    if FILTER:
        tau = tl.load(TAU + bh * T + offs_m, mask=row_ok, other=float("inf"))
    scale = sm_scale
    if EXP2:
        scale = sm_scale * LOG2E
        slope = slope * LOG2E
        tau = tau * LOG2E
        lse = lse * LOG2E
    psum = tl.zeros([BM], dtype=tl.float32)  # P: the softplus sum of the keys walked
    csum = tl.zeros([BM], dtype=tl.float32)  # sum_{j < k} c_j (and the remainder's share)
    if FILTER == 2:
        csum = g_r * rem
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    d_rs = tl.zeros([BM], dtype=tl.float32)
    d_sl = tl.zeros([BM], dtype=tl.float32)
    n_tiles = tl.cdiv(tl.minimum((pid_m + 1) * BM, T) - 1, BN)
    ones_sp = _tri_ones(2 if CUMSUM >= 5 else 1, CUMSUM, CW)
    ones_c = _tri_ones(1, CUMSUM, CW)
    for tile in range(tl.min(first, 0) // BN, n_tiles):
        offs_n = tile * BN + tl.arange(0, BN)
        k, z, zb, valid, keep = _key_tile(q, K, base, offs_m, offs_n, offs_d, dmask, T, scale, slope, rs, tau,
                                          offs_m, FILTER, HAS_SLOPES, HAS_RS, DOT_PREC, D)
        walked = offs_n[None, :] >= first[:, None]
        valid = valid & walked
        keep = keep & walked
        kv_mask = (offs_n < T)[:, None] & dmask[None, :]
        if not SKIP:  # loaded beside the keys, where the loop's pipelining can issue it ahead
            v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        if tl.max(valid.to(tl.int32)) > 0:
            sp, e = _softplus_e(z, EXP2, LOG1P)
            sp = tl.where(valid, sp, 0.0)
            s, sn = _sigmoids(z, e, SIG, EXP2)
            kept = 1
            if SKIP:
                kept = tl.max(keep.to(tl.int32))
            if kept > 0:
                if SKIP:
                    v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
                if CUMSUM >= 5:  # ``_stick``'s form: the walked keys after the tile, then those after j in it
                    after = lse - psum - tl.sum(sp, 1)
                    a = _exp((z - sp) - after[:, None] - _cumsum(sp, 2, CUMSUM, BM, BN, CW, ones_sp), EXP2)
                else:
                    a = _exp(z - (lse - psum)[:, None] + _cumsum(sp, 1, CUMSUM, BM, BN, CW, ones_sp), EXP2)
                a = tl.where(valid, a, 0.0)
                g = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
                if FILTER == 2:
                    a = tl.where(keep, a, 0.0)
                    c = g * a
                else:
                    c = tl.where(valid, (g - g_r[:, None]) * a, 0.0)
                before = csum[:, None] + _cumsum(c, 1, CUMSUM, BM, BN, CW, ones_c)
                dz = tl.where(valid, c * sn - s * before, 0.0)
                dv_tile = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=DOT_PREC)
                tl.atomic_add(DV + base + offs_n[:, None] * D + offs_d[None, :], dv_tile, mask=kv_mask,
                              sem="relaxed")
                csum += tl.sum(c, 1)
            else:  # no kept key (sieve-window): c = 0 on the tile
                dz = tl.where(valid, -s * csum[:, None], 0.0)
            dzs = dz * rs[:, None]
            dq += tl.dot(dzs.to(k.dtype), k, input_precision=DOT_PREC)
            if GRAD_RS:
                if EXP2:
                    zb = zb * LN2
                d_rs += tl.sum(dz * zb, 1)
            if GRAD_SL:
                d_sl += tl.sum(dz * (offs_m[:, None] - offs_n[None, :]).to(tl.float32), 1)
            dk_tile = tl.dot(tl.trans(dzs).to(q.dtype), q, input_precision=DOT_PREC) * sm_scale
            tl.atomic_add(DK + base + offs_n[:, None] * D + offs_d[None, :], dk_tile, mask=kv_mask, sem="relaxed")
            psum += tl.sum(sp, 1)
    tl.atomic_add(DV + roff, rem[:, None] * do32, mask=rmask, sem="relaxed")
    _bwd_store(dq, d_rs, d_sl, DQ, DRS, DSL, base, offs_m, offs_d, rmask, row_ok, bh, T, sm_scale, rs,
               GRAD_RS, GRAD_SL, D)


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
    ``weights_only`` the filter on the weights alone (``sieve-window``); ``tuning`` the levers of
    ``launch_config``. ``tau`` a float ``eps``: the threshold is Algorithm 1's, ``(max_{j<r} z_rj - eps) / 2``,
    found by the forward kernel (``rowmax_pass`` ``fused``)."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, row_scale, tau, sm_scale, weights_only=False, tuning=None):
        pb = Problem(q, k, v, slopes, row_scale, sm_scale)
        config = launch_config(pb, tuning)
        save = any(ctx.needs_input_grad[:5])
        prefix = config["backward"] == "prefix"
        out = torch.empty_like(pb.q)
        o32 = torch.empty(pb.q.shape, device=q.device, dtype=torch.float32) if save and not prefix else None
        rem = pb.rows() if save and not prefix else None
        lse = pb.rows() if save and prefix else None
        start = torch.empty(pb.batch, pb.heads, pb.tokens, device=q.device, dtype=torch.int32) if save and prefix \
            else None
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
        bm, bn, warps, stages, regs = config["fwd"]
        _fwd_kernel[(triton.cdiv(pb.tokens, bm), pb.bh)](
            pb.q, pb.k, pb.v, out, pb.opt(o32), pb.opt(rem), pb.opt(lse), pb.opt(start), pb.opt(pb.slopes),
            pb.opt(pb.row_scale), pb.opt(tau), pb.sm_scale, pb.tokens, pb.heads, EXIT_AT, eps,
            SAVE=(3 if prefix else 1) if save else 0, FILTER=mode, ROWMAX=rowmax, HAS_SLOPES=pb.slopes is not None,
            HAS_RS=pb.row_scale is not None, SPLIT=config["split"] and q.dtype != torch.float32,
            DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm, BN=bn, CUMSUM=config["cumsum"],
            CW=min(bn, config["cumsum_width"] or bn),
            EXP2=config["exp2"], LOG1P=config["log1p"], SKIP=config["skip_empty"] and mode == 2, LOOP=config["loop"],
            FULL=config["full_tiles"] and mode != 1, PREFETCH=config["prefetch"],
            EVERY=config["exit_every"] if mode != 1 else 1,  # (Sieve's empty tiles skip the test's place)
            BNR=config["rowmax"][1] if rowmax else bn, num_warps=warps, num_stages=stages, **max_registers(regs))
        if save:
            ctx.save_for_backward(pb.q, pb.k, pb.v, o32, rem, lse, start, pb.slopes, pb.row_scale, tau)
            ctx.sm_scale = pb.sm_scale
            ctx.config = config
            ctx.rs_shape = None if row_scale is None else row_scale.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o32, rem, lse, start, slopes, row_scale, tau = ctx.saved_tensors
        pb = Problem(q, k, v, slopes, row_scale, ctx.sm_scale)
        config = ctx.config
        do = dout.contiguous()
        grad_rs, grad_sl, dq, dk32, dv32, d_rs, d_sl = grad_buffers(ctx, pb)
        bm, bn, warps, stages, regs = config["bwd"]
        common = dict(FILTER=ctx.mode, HAS_SLOPES=slopes is not None, HAS_RS=row_scale is not None,
                      GRAD_RS=grad_rs, GRAD_SL=grad_sl, DOT_PREC=pb.dot_prec, D=pb.head_dim, BD=pb.block_d, BM=bm,
                      BN=bn, CUMSUM=config["cumsum"], CW=min(bn, config["cumsum_width"] or bn), EXP2=config["exp2"],
                      LOG1P=config["log1p"],
                      SIG=config["sigmoid"],
                      SKIP=config["skip_empty"] and ctx.mode == 2, num_warps=warps, num_stages=stages,
                      **max_registers(regs))
        grid = (triton.cdiv(pb.tokens, bm), pb.bh)
        if config["backward"] == "prefix":
            _bwd_prefix_kernel[grid](q, k, v, do, dq, dk32, dv32, lse, start, pb.opt(slopes), pb.opt(row_scale),
                                     pb.opt(tau), pb.opt(d_rs), pb.opt(d_sl), pb.sm_scale, pb.tokens, pb.heads,
                                     **common)
        else:
            # c_j = (g_j - g_r) a_j and C_r = do_r.(o_r - v_r) use that the weights and the remainder sum to
            # one; with weights dropped outside the filter (mode 2) the general form: c_j = g_j a_j, C_r =
            # do_r.o_r. (The row sums in one kernel each, ``row_delta``.)
            if ctx.mode == 2:
                g_r = torch.zeros(do.shape[:-1], device=do.device, dtype=torch.float32)
                c_total = row_delta(do, o32)
            else:
                g_r = row_delta(do, v)
                c_total = row_delta(do, o32) - g_r
            _bwd_kernel[grid](q, k, v, do, dq, dk32, dv32, c_total, g_r, pb.opt(slopes), pb.opt(row_scale),
                              pb.opt(tau), pb.opt(d_rs), pb.opt(d_sl), pb.sm_scale, pb.tokens, pb.heads, EXIT_AT,
                              **common)
            dv32.addcmul_(rem.unsqueeze(-1), do)
        dk = dk32.to(k.dtype)
        del dk32  # the next cast's buffer takes its place
        dv = dv32.to(v.dtype)
        del dv32
        g_sl, g_rs = param_grads(d_sl, d_rs, ctx.rs_shape)
        return dq, dk, dv, g_sl, g_rs, None, None, None, None


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


def stickbreaking_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None, tuning: dict | None = None):
    """Stick-breaking attention, ``[B, H, T, D]`` causal, remainder on the diagonal; ``tuning`` replaces some of
    the launch settings and levers (``launch_config``)."""
    return StickBreakingAttention.apply(q, k, v, slopes, row_scale, None, sm_scale, False, tuning)
