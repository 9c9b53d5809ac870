"""The stick's arithmetic, shared by the forward and backward walks (``forward.py``, ``backward.py``) and Sieve's
kernels: a key tile's scores and filter, softplus in nats or bits with ``log1p`` a polynomial on the FMA units, the
sigmoids from softplus's ``exp(-|z|)``, and the in-tile cumulative sums as products with a triangular ones matrix on
the tensor cores. The constexpr levers are those of ``op.launch_config``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lengthbench.kernels.utils.common import score_tile

EXIT_AT = 60.0
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


def max_registers(regs: int) -> dict:
    """The launch option that caps a kernel's registers a thread at ``regs`` (Triton's ``maxnreg``; 0: none, the
    compiler's choice). Fewer registers let more programs share a multiprocessor, at the price of spills."""
    return {"maxnreg": regs} if regs else {}


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
def _softplus_e(z, EXP2: tl.constexpr, LOG1P: tl.constexpr):
    """``(softplus(z), exp(-|z|))`` (``softplus`` of ``_common``); with ``EXP2`` the scores in bits and both in
    base 2: ``(max(z, 0) + log2(1 + 2^-|z|), 2^-|z|)``."""
    if EXP2:
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
    one more multiply by ``ln 2``); 4: a degree-4 one with its constant term ``1 / ln 2`` itself (below 6.7e-5; near
    ``x = 0``, the scores far below zero of a long walk, below 1e-6)."""
    if LOG1P == 4:
        p = _horner(x, _LOG1P_POLY4, 5)
    else:
        p = _horner(x, _LOG1P_POLY6, 7)
    if not EXP2:
        p = p * LN2
    return p


# ``_log1p_ratio``'s polynomials, highest power first (minimax fits of the relative error in fp32)
_LOG1P_POLY6 = tl.constexpr((0.020413657650351524, -0.0958419069647789, 0.21534417569637299, -0.3391266167163849,
                             0.4776794910430908, -0.7211607694625854, 1.4426932334899902))
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
    if EXP2:
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
def _cumsum(x, PREFIX: tl.constexpr, CUMSUM: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, ones=None):
    """Along the keys of a ``[BM, BN]`` fp32 tile: the suffix sums ``sum_{k >= j} x_k`` (``PREFIX`` 0), the
    prefix sums ``sum_{k < j} x_k`` (1) or the suffix sums without the key's own, ``sum_{k > j} x_k`` (2).
    ``CUMSUM`` 0 a scan; else a product with a triangular ones matrix on the tensor cores (``_tri_dot``; ``ones``
    that matrix, ``_tri_ones(PREFIX, CUMSUM, BN)``, where a walk built it before its loop)."""
    if CUMSUM == 0:
        if PREFIX == 1:
            out = tl.cumsum(x, 1) - x
        elif PREFIX == 2:
            out = tl.cumsum(x, 1, reverse=True) - x
        else:
            out = tl.cumsum(x, 1, reverse=True)
    else:
        out = _tri_dot(x, PREFIX, CUMSUM, BN, ones)
    return out


@triton.jit
def _tri_ones(PREFIX: tl.constexpr, CUMSUM: tl.constexpr, W: tl.constexpr):
    """``_tri_dot``'s ``[W, W]`` triangular ones matrix, in its products' dtype (fp32 for the tf32 ones of fp32
    inputs, bf16 for the others). A walk builds it once before its loop: built inside, the compiler stores it to shared memory
    again for every tile."""
    rows = tl.arange(0, W)[:, None]
    cols = tl.arange(0, W)[None, :]
    if PREFIX == 1:
        tri = rows < cols
    elif PREFIX == 2:
        tri = rows > cols
    else:
        tri = rows >= cols
    if CUMSUM == 6:
        out = tri.to(tl.float32)
    else:
        out = tri.to(tl.bfloat16)
    return out


@triton.jit
def _tri_dot(x, PREFIX: tl.constexpr, CUMSUM: tl.constexpr, W: tl.constexpr, ones=None):
    """``_cumsum`` of a ``[M, W]`` fp32 block as a product with the ``[W, W]`` triangular ones matrix (exact in
    every format; ``ones``, else ``_tri_ones``): ``CUMSUM`` 5 ``x`` in bf16 (8 bits); 6 (fp32 inputs) ``x`` split
    into its tf32 head (the top 10 mantissa bits, cut by a mask) and the rest, two products (about 21 bits).
    ``PREFIX`` as ``_cumsum``'s."""
    if ones is None:
        ones = _tri_ones(PREFIX, CUMSUM, W)
    if CUMSUM == 6:
        hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        out = tl.dot(hi, ones, input_precision="tf32")
        out = tl.dot(x - hi, ones, out, input_precision="tf32")
    else:
        out = tl.dot(x.to(tl.bfloat16), ones)
    return out


@triton.jit
def _stick(z, valid, lsum, CUMSUM: tl.constexpr, EXP2: tl.constexpr, LOG1P: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, MASKED: tl.constexpr, ones=None, thr=None):
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
    if CUMSUM == 5:  # the product adds the sums to its accumulator, log a_j less the sum to the right
        if ones is None:
            ones = _stick_ones(CUMSUM, BN)
        a = _exp(tl.dot(sp.to(tl.bfloat16), ones, zs - lsum[:, None]), EXP2)
    else:
        a = _exp(zs - lsum[:, None] - _cumsum(sp, 2 if CUMSUM >= 5 else 0, CUMSUM, BM, BN, ones), EXP2)
    if MASKED:
        a = tl.where(valid, a, 0.0)
    return sp, a


@triton.jit
def _stick_ones(CUMSUM: tl.constexpr, BN: tl.constexpr):
    """The triangular ones matrix of ``_stick``'s sums (``_tri_ones``), for a walk to build before its loop; with
    one bf16 product over the whole key tile (``CUMSUM`` 5) its negative, so that the product
    subtracts the sums from the log weights in its accumulator (no subtraction after it)."""
    ones = _tri_ones(2 if CUMSUM >= 5 else 0, CUMSUM, BN)
    if CUMSUM == 5:
        ones = -ones
    return ones
