"""Every fused kernel against its dense reference (``attention_weights``, float64): output and all gradients.

Marked ``gpu``: skipped where CUDA is absent. Errors are ``max |kernel - ref| / max(max |ref|, 0.01)`` per tensor; each
test prints its errors (run with ``-s`` to log them). Rows whose selection is decided by a near-tie
(rectified: a score within ``TIE`` of 0; sieve and sparsemax: a score within ``TIE`` of the entmax threshold;
sieve-window: a score within ``TIE`` of the row's max minus eps) are left out of the comparison (their output gradient
is set to zero), since a rounding-level change of the score legitimately flips them; at most 5% of the rows may be
such (sieve-window's 10%). TDA's op takes two views (``q1, k1, q2, k2,
v``) and has its own tests at the end, against ``attention_weights("tda", ...)`` with gradients to both views,
``lam`` and ``beta``.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from lengthbench.kernels import triton_available
from lengthbench.models.attention import get_kernel, kernel_names

pytestmark = pytest.mark.gpu

MECHANISMS = [name for name in kernel_names() if name != "tda"]  # the single-view ops
# (tokens, head_dim, dtype, batch, heads)
SHAPES = [  # few distinct (dtype, head_dim) pairs: each compiles every kernel once
    (1, 32, torch.float32, 2, 2),
    (17, 32, torch.float32, 2, 2),
    (64, 32, torch.float32, 2, 2),
    (1000, 32, torch.float32, 1, 2),
    (4096, 32, torch.float32, 1, 1),
    (17, 32, torch.bfloat16, 2, 2),
    (64, 64, torch.bfloat16, 2, 2),
    (1000, 16, torch.bfloat16, 1, 2),
    (333, 128, torch.bfloat16, 1, 2),
    (200, 48, torch.bfloat16, 1, 2),
    (4096, 64, torch.bfloat16, 1, 1),
    (77, 32, torch.float16, 2, 2),
    (1000, 64, torch.float16, 1, 2),
]
TOL_OUT = {torch.float32: 2e-3, torch.bfloat16: 2.5e-2, torch.float16: 1e-2}
TOL_GRAD = {torch.float32: 2e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}
TIE = 2e-5


def test_every_registered_op_loads_here():
    """(The registry against the ops that kernels/ defines: test_kernel_dispatch.py, on the CPU.)"""
    assert triton_available()
    for name in kernel_names():
        assert callable(get_kernel(name))


def reference_params(name: str, head_dim: int) -> dict:
    """The reference's parameters without a default (the op's defaults are its mechanism's: kernels/defaults.py)."""
    return {"head_dim": head_dim} if name == "tra" else {}


def dense_scores(q, k, sm_scale, slopes, row_scale):
    z = torch.matmul(q, k.transpose(-1, -2)) * sm_scale
    tokens = q.shape[-2]
    if slopes is not None:
        pos = torch.arange(tokens, device=q.device)
        z = z - slopes[:, None, None] * (pos[:, None] - pos[None, :]).to(z.dtype)
    if row_scale is not None:
        z = z * row_scale[..., None]
    return z


def reference(name, q, k, v, sm_scale, slopes=None, row_scale=None, mechanism=None):
    from lengthbench import attention_weights

    z = dense_scores(q, k, sm_scale, slopes, row_scale)
    w = attention_weights(name, z, **reference_params(name, q.shape[-1]), **(mechanism or {}))
    return torch.matmul(w, v), z.detach()


def tie_rows(name, z, q, k, sm_scale, slopes, row_scale):
    """Rows ``[B, H, T]`` whose selection is a near-tie (see the module docstring)."""
    tokens = z.shape[-1]
    pos = torch.arange(tokens, device=z.device)
    if name == "rectified":
        visible = pos[None, :] <= pos[:, None]
        return ((z.abs() < TIE) & visible).any(-1)
    if name == "sieve":
        from lengthbench.kernels.entmax.threshold import entmax_threshold

        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, strict=True).double()
        earlier = pos[None, :] < pos[:, None]
        near = (z / 2 - tau[..., None]).abs() < TIE * (1 + tau.abs().nan_to_num(0, 0, 0)[..., None])
        return (near & earlier).any(-1)
    if name == "sieve-window":  # a score within TIE of the row's max minus eps (2, the default)
        earlier = pos[None, :] < pos[:, None]
        rowmax = torch.where(earlier, z, torch.full_like(z, float("-inf"))).amax(-1, keepdim=True)
        return (((z - (rowmax - 2.0)).abs() < TIE * (1 + rowmax.abs())) & earlier).any(-1)
    if name == "sparsemax":  # its gradient jumps where a score crosses the threshold
        from lengthbench.kernels.entmax.threshold import entmax_threshold

        tau = entmax_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, alpha=2.0).double()
        visible = pos[None, :] <= pos[:, None]
        near = (z - tau[..., None]).abs() < TIE * (1 + tau.abs()[..., None])
        return (near & visible).any(-1)
    return torch.zeros(z.shape[:-1], dtype=torch.bool, device=z.device)


def make_inputs(name, batch, heads, tokens, head_dim, dtype, seed, scale=1.0, shift=0.0):
    """Random q, k, v; ``shift`` moves every score ``q.k / sqrt(D)`` by that much (the long walks of
    ``benchmarks/kernels.py --inputs walk4,walk8``: q's first component 1, k's ``shift sqrt(D)``)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device="cuda", generator=gen) for _ in range(3))
    if name == "tra":
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    else:
        q, k = q * scale, k * scale
    if shift:
        q[..., 0] = 1.0
        k[..., 0] = shift * math.sqrt(head_dim)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def rel_err(a, b):
    """``max |a - b| / max |b|``, the scale floored at 1e-2 (gradients that are exactly zero in the reference,
    as for a single key, leave rounding-level values in the kernel)."""
    if b.numel() == 0:
        return 0.0
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-2)).item()


def check(name, q, k, v, *, slopes=None, row_scale=None, seed=0, label="", tuning=None, allowed=None,
          mechanism=None):
    """The op against the float64 reference (``tuning``: the op's launch settings, else the defaults); its errors.
    ``allowed``: per error, a bound that replaces the dtype's tolerance where it is larger; ``mechanism``: the
    mechanism's parameters, given to the op and the reference alike (else their defaults)."""
    dtype = q.dtype
    op = get_kernel(name) if tuning is None else functools.partial(get_kernel(name), tuning=tuning)
    sm_scale = 1.0 if name == "tra" else 1.0 / math.sqrt(q.shape[-1])
    params = dict(sm_scale=sm_scale)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    extras = {}
    if slopes is not None:
        extras["slopes"] = slopes.detach().clone().requires_grad_()
    if row_scale is not None:
        extras["row_scale"] = row_scale.detach().clone().requires_grad_()
    out = op(*leaves, **params, **extras, **(mechanism or {}))
    assert out.shape == q.shape and out.dtype == dtype

    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_extras = {key: t.detach().double().requires_grad_() for key, t in extras.items()}
    ref_out, z = reference(name, *ref_leaves, sm_scale, ref_extras.get("slopes"), ref_extras.get("row_scale"),
                           mechanism)
    ties = tie_rows(name, z, q, k, sm_scale, extras.get("slopes"), extras.get("row_scale"))
    # sieve-window's filter edge (the row's max minus 2) lies in the bulk of the scores, so long rows have a key
    # near it more often (5.1% of the rows at T = 4,096 on the H100); the rest are still compared
    limit = 0.10 if name == "sieve-window" else 0.05
    assert ties.float().mean().item() <= limit, f"{ties.float().mean().item():.3f} of the rows are near-ties"
    keep = ~ties

    assert torch.isfinite(out).all(), "NaN/inf in the output"
    errors = {"out": rel_err(out[keep], ref_out[keep])}
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(out.shape, device="cuda", generator=gen, dtype=torch.float64) * keep[..., None]
    (out.double() * dout).sum().backward()
    (ref_out * dout).sum().backward()
    names = ["dq", "dk", "dv"] + [f"d{key}" for key in extras]
    mine = leaves + list(extras.values())
    theirs = ref_leaves + list(ref_extras.values())
    for label_, a, b in zip(names, mine, theirs, strict=True):
        assert a.grad is not None and torch.isfinite(a.grad).all(), f"{label_}: missing or non-finite"
        errors[label_] = rel_err(a.grad, b.grad)
    print(f"ERR {name:14s} {label:28s} ties={int(ties.sum())} " + " ".join(f"{key}={val:.2e}" for key, val in errors.items()))
    allowed = allowed or {}
    assert errors["out"] <= max(TOL_OUT[dtype], allowed.get("out", 0.0)), errors
    for key, val in errors.items():
        assert val <= max(TOL_GRAD[dtype], allowed.get(key, 0.0)), (key, errors)
    return errors


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-D{s[1]}-{str(s[2])[6:]}")
@pytest.mark.parametrize("name", MECHANISMS)
def test_kernel_matches_reference(name, shape):
    tokens, head_dim, dtype, batch, heads = shape
    q, k, v = make_inputs(name, batch, heads, tokens, head_dim, dtype, seed=tokens + head_dim)
    check(name, q, k, v, seed=tokens, label=f"T={tokens} D={head_dim} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", MECHANISMS)
def test_slopes_and_row_scale(name, dtype):
    batch, heads, tokens, head_dim = 2, 3, 150, 32
    q, k, v = make_inputs(name, batch, heads, tokens, head_dim, dtype, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(3)
    slopes = torch.tensor([0.5, 0.0625, 0.0], device="cuda")
    row_scale = 0.5 + torch.rand(batch, heads, tokens, device="cuda", generator=gen)
    check(name, q, k, v, slopes=slopes, row_scale=row_scale, label=f"slopes+row_scale {dtype}")


@pytest.mark.parametrize("name", ["rectified", "tra", "rela", "softpick"])
def test_rows_with_nothing_selected(name):
    """All scores negative (below the threshold for tra): zero rows (softpick: zero weights), no NaN."""
    batch, heads, tokens, head_dim = 1, 2, 70, 32
    gen = torch.Generator(device="cuda").manual_seed(11)
    base = torch.randn(head_dim, device="cuda", generator=gen)
    q = base.expand(batch, heads, tokens, head_dim).clone() + 0.01 * torch.randn(
        batch, heads, tokens, head_dim, device="cuda", generator=gen)
    k = -q
    v = torch.randn(batch, heads, tokens, head_dim, device="cuda", generator=gen)
    if name == "tra":
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    op = get_kernel(name)
    out = op(q, k, v, sm_scale=1.0 if name == "tra" else None)
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))
    if name != "softpick":
        assert out.abs().max().item() == 0.0
    else:
        assert out.abs().max().item() < 1e-3


@pytest.mark.parametrize("name", MECHANISMS)
def test_large_scores_no_nan(name):
    """Scores of magnitude ~50: no overflow in exp/softplus, output and gradients finite."""
    q, k, v = make_inputs(name, 1, 2, 300, 32, torch.bfloat16, seed=5, scale=2.7)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = get_kernel(name)(*leaves, sm_scale=1.0 if name == "tra" else None)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


# -- the stick-breaking family on long walks, and its levers (kernels/stickbreaking/op.py, ``tuning``) ------------

STICK = ["stickbreaking", "sieve-window"]


@pytest.mark.parametrize("shift", [-4.0, -8.0], ids=["walk4", "walk8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-D{s[1]}-{str(s[2])[6:]}")
@pytest.mark.parametrize("name", STICK)
def test_long_walk_matches_reference(name, shape, shift):
    """Every score moved by -4 or -8: the stick is not spent within a few keys, the walks cross the whole row."""
    tokens, head_dim, dtype, batch, heads = shape
    q, k, v = make_inputs(name, batch, heads, tokens, head_dim, dtype, seed=tokens + head_dim, shift=shift)
    check(name, q, k, v, seed=tokens, label=f"walk{-shift:g} T={tokens} D={head_dim} {dtype}")


SMALL_TILES = dict(fwd=(32, 16, 4, 2), bwd=(16, 32, 4, 2))
STICK_VARIANTS = {
    "scan": dict(cumsum="scan"),  # tl.cumsum's sums (those of Sieve's gathered open rows)
    "exp2-reuse": dict(exp2=True, sigmoid="reuse"),
    "nats": dict(exp2=False, log1p="log"),  # the stick in nats, libdevice's log (Sieve's open rows' arithmetic)
    "poly": dict(log1p="poly"),
    "exit-every-1": dict(exit_every=1),
    "exit-every-2": dict(exit_every=2),
    "regs-128": dict(fwd=(64, 32, 4, 2, 128)),  # the forward's registers capped at 128 (four programs a multiprocessor)
    "poly4": dict(log1p="poly4"),  # the 16-bit inputs' default, here on fp32 inputs too
    "no-prefetch": dict(prefetch=False),  # the forward's walk without the next tile's loads ahead
    "split": dict(split=True),
    "empty-tiles": dict(skip_empty=True),
    "masked": dict(full_tiles=False),
    "tiles-128": dict(fwd=(128, 64, 8, 3), bwd=(128, 64, 8, 2), rowmax=(128, 128, 8, 3)),
    "tiles-16": dict(SMALL_TILES, cumsum="scan"),
    "combined": dict(fwd=(128, 64, 8, 3), bwd=(64, 64, 4, 2), cumsum="scan", exp2=True, sigmoid="reuse",
                     split=False, skip_empty=True, log1p="poly", full_tiles=True),
    "rowmax-fused-64": dict(rowmax=(64, 64, 4, 3)),  # the forward kernel's row-max pass on 64-key tiles
    "rowmax-fused-32": dict(fwd=(32, 32, 4, 2), bwd=(32, 32, 4, 2), rowmax=(32, 32, 4, 2)),  # and the training tiles
    # training-width tiles: 64 query rows, 32 keys, forward and backward (stick-breaking also on its full tiles)
    "train-64x32": dict(fwd=(64, 32, 4, 2), bwd=(64, 32, 4, 2)),
    "train-64x32-full": dict(fwd=(64, 32, 4, 2), bwd=(64, 32, 4, 2), full_tiles=True),
    # one-bf16 sums with the registers uncapped
    "bf16-free-registers": dict(fwd=(64, 32, 4, 2, 0), bwd=(64, 32, 4, 2, 0), cumsum="bf16"),
}
STICK_CASES = {  # (tokens, head_dim, dtype, shift, alibi)
    "T1000-D32-bf16": (1000, 32, torch.bfloat16, 0.0, False),
    "T4096-D32-fp32": (4096, 32, torch.float32, 0.0, False),
    "T300-D64-bf16-alibi": (300, 64, torch.bfloat16, 0.0, True),
    "T4096-D64-bf16-walk8": (4096, 64, torch.bfloat16, -8.0, False),
    "T2000-D32-fp32-walk4": (2000, 32, torch.float32, -4.0, False),
    "T1000-D32-fp16-walk8-alibi": (1000, 32, torch.float16, -8.0, True),
    # every score moved by +8: a key's own softplus is about its score, the stick spent within a few keys
    "T1000-D64-bf16-hot8": (1000, 64, torch.bfloat16, 8.0, False),
}


def stick_variant_cases() -> list:
    """Every (mechanism, case, variant) but the ``rowmax`` variants of stick-breaking (the row-max pass is
    sieve-window's: stick-breaking has no filter)."""
    cases = []
    for name in STICK:
        for case in sorted(STICK_CASES):
            for variant in sorted(STICK_VARIANTS):
                if name == "stickbreaking" and variant.startswith("rowmax"):
                    continue
                cases.append(pytest.param(name, case, variant, id=f"{name}-{case}-{variant}"))
    return cases


@pytest.mark.parametrize("name, case, variant", stick_variant_cases())
def test_stick_variants_match_reference(name, case, variant):
    tokens, head_dim, dtype, shift, alibi = STICK_CASES[case]
    q, k, v = make_inputs(name, 1, 2, tokens, head_dim, dtype, seed=tokens, shift=shift)
    extra = {}
    if alibi:
        gen = torch.Generator(device="cuda").manual_seed(5)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(1, 2, tokens, device="cuda", generator=gen))
    check(name, q, k, v, seed=tokens, label=f"{variant} {case}", tuning=STICK_VARIANTS[variant], **extra)


# the pointwise ops' launch settings (``utils.rowwise.launch_settings``) at the training widths: the training step's
# (``lengthbench.compile_policy.CAPTURE_TUNING`` for softpick and TRA), and others
ROWWISE_TILES = {"fwd64x32-bwd32x32": dict(fwd=(64, 32, 4), bwd=(32, 32, 4)),
                 "fwd64x64-bwd32x64": dict(fwd=(64, 64, 4), bwd=(32, 64, 2)),
                 # the backward without its dq kernel (dq and the row gradients added atomically by the dk/dv kernel)
                 "fwd64x32-bwd32x32-fused": dict(fwd=(64, 32, 4), bwd=(32, 32, 4), fused_bwd=True)}
# Each is held to the dtype's tolerance, or where the default tiles on the same inputs are near it, to 1.5 times
# theirs: the slopes' gradient at 83 bf16 tokens is a sum that cancels to a small total (errors 4.4e-2 and 5.6e-2
# with forward tiles of 64 and of 32 keys, on an H200: bf16 roundings of the weights taken against running maxima
# that differ with the tiles), where every other error stays below 2e-2.
DEFAULT_TILES_FACTOR = 1.5


@pytest.mark.parametrize("variant", sorted(ROWWISE_TILES))
@pytest.mark.parametrize("tokens, dtype", [(83, torch.bfloat16), (91, torch.bfloat16), (131, torch.float32)])
@pytest.mark.parametrize("name", ["softpick", "rectified", "tra"])
def test_rowwise_tiles_match_reference(name, tokens, dtype, variant):
    q, k, v = make_inputs(name, 2, 2, tokens, 32, dtype, seed=tokens)
    extra = {}
    if name != "tra":  # (the module gives TRA neither)
        gen = torch.Generator(device="cuda").manual_seed(7)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(2, 2, tokens, device="cuda", generator=gen))
    # the op's own defaults (forward 128 x 64, backward 64 x 64), held to the dtype's tolerance
    defaults = check(name, q, k, v, seed=tokens, label="defaults", tuning={}, **extra)
    check(name, q, k, v, seed=tokens, label=variant, tuning=ROWWISE_TILES[variant],
          allowed={key: DEFAULT_TILES_FACTOR * value for key, value in defaults.items()}, **extra)


# Sieve's walk after the threshold on the stick-breaking capture tiles (``walk``), the threshold found by the
# search (one kernel, no lists) or with every row's keys in registers (``threshold`` ``short_rows``: the training step's,
# ``lengthbench.kernels.SIEVE_ENTMAX_CAPTURE``; the search past 256 tokens)
SIEVE_WALK = dict(lists=False, split=False, walk=dict(fwd=(64, 32, 4, 2), bwd=(64, 32, 4, 2)))
SIEVE_WALKS = {"walk-64x32": SIEVE_WALK, "short-rows-walk-64x32": dict(SIEVE_WALK, threshold="short_rows")}


@pytest.mark.parametrize("label", sorted(SIEVE_WALKS))
@pytest.mark.parametrize("tokens, dtype, alibi, shift", [
    (91, torch.bfloat16, False, 0.0), (131, torch.float32, True, 0.0), (300, torch.bfloat16, True, 0.0),
    (256, torch.float16, True, 0.0), (83, torch.bfloat16, True, -8.0), (64, torch.float32, False, -4.0)])
def test_sieve_walk_tiles_match_reference(tokens, dtype, alibi, shift, label):
    q, k, v = make_inputs("sieve", 2, 2, tokens, 32, dtype, seed=tokens, shift=shift)
    extra = {}
    if alibi:
        gen = torch.Generator(device="cuda").manual_seed(7)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(2, 2, tokens, device="cuda", generator=gen))
    check("sieve", q, k, v, seed=tokens, label=label, tuning=SIEVE_WALKS[label], **extra)


# Sieve's two remainders ("diagonal": on the query's own value; "drop": nowhere, Eq. 7) on each launch path: the
# candidate lists (64 slots, and 8, which leave rows open), the threshold search then the walk, and the training
# step's (``lengthbench.compile_policy.CAPTURE_TUNING``); T 1 (row 0 alone: zeros under "drop"), "sharp" scores (q
# scaled by 4: many rows' support one key), ALiBi and a row factor
SIEVE_PATHS = {"lists": None, "lists-8": dict(list_size=8), "no-lists": dict(lists=False), "capture": "capture"}
SIEVE_CASES = {  # (tokens, head_dim, dtype, scale, alibi)
    "T1-D32-fp32": (1, 32, torch.float32, 1.0, False),
    "T300-D32-bf16-alibi": (300, 32, torch.bfloat16, 1.0, True),
    "T1000-D64-fp32": (1000, 64, torch.float32, 1.0, False),
    "T257-D32-fp32-sharp": (257, 32, torch.float32, 4.0, False),
    "T4096-D32-bf16-sharp-alibi": (4096, 32, torch.bfloat16, 4.0, True),
}


@pytest.mark.parametrize("path", sorted(SIEVE_PATHS))
@pytest.mark.parametrize("case", sorted(SIEVE_CASES))
@pytest.mark.parametrize("remainder", ["diagonal", "drop"])
def test_sieve_remainders_match_reference(remainder, case, path):
    from lengthbench.compile_policy import CAPTURE_TUNING

    tokens, head_dim, dtype, scale, alibi = SIEVE_CASES[case]
    q, k, v = make_inputs("sieve", 2, 2, tokens, head_dim, dtype, seed=tokens + head_dim)
    q = q * scale
    extra = {}
    if alibi:
        gen = torch.Generator(device="cuda").manual_seed(9)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(2, 2, tokens, device="cuda", generator=gen))
    tuning = CAPTURE_TUNING["sieve"] if SIEVE_PATHS[path] == "capture" else SIEVE_PATHS[path]
    check("sieve", q, k, v, seed=tokens, label=f"{remainder} {path} {case}", tuning=tuning,
          mechanism=dict(remainder=remainder), **extra)
    if remainder == "drop":  # row 0 sees no earlier token: its output is exactly zero
        with torch.no_grad():
            out = get_kernel("sieve")(q, k, v, remainder="drop", **extra, **({"tuning": tuning} if tuning else {}))
        assert out[..., 0, :].abs().max().item() == 0.0


def test_no_grad_inference_path():
    q, k, v = make_inputs("stickbreaking", 1, 2, 100, 32, torch.bfloat16, seed=1)
    with torch.no_grad():
        for name in MECHANISMS:
            out = get_kernel(name)(q, k, v, sm_scale=1.0 if name == "tra" else None)
            assert torch.isfinite(out).all()


# -- TDA: two views, shared values ------------------------------------------------------------------------

# SHAPES, plus head dim 16 and 64 in fp32 (each view doubles the registers a tile needs)
TDA_SHAPES = sorted({*SHAPES, (17, 16, torch.float32, 2, 2), (130, 64, torch.float32, 1, 2)},
                    key=lambda shape: (str(shape[2]), shape[0], shape[1]))


def make_tda_inputs(batch, heads, tokens, head_dim, dtype, seed):
    """``q1, k1, q2, k2, v``; the four score operands unit-norm (the module's cosine scores)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tensors = [torch.randn(batch, heads, tokens, head_dim, device="cuda", generator=gen) for _ in range(5)]
    tensors[:4] = [torch.nn.functional.normalize(t, dim=-1) for t in tensors[:4]]
    return [t.to(dtype) for t in tensors]


def tda_reference(q1, k1, q2, k2, v, lam, beta, power, slopes=None, row_scale=None):
    from lengthbench import attention_weights

    z1, z2 = dense_scores(q1, k1, 1.0, slopes, row_scale), dense_scores(q2, k2, 1.0, slopes, row_scale)
    w = attention_weights("tda", z1, scores2=z2, head_dim=q1.shape[-1], lam=lam, beta=beta, power=power)
    return torch.matmul(w, v)


def check_tda(tensors, *, lam, beta, power=2.0, slopes=None, row_scale=None, seed=0, label="", tuning=None,
              allowed=None):
    """The fused op (its launch settings ``tuning``, else the defaults) against the float64 reference: output and
    the gradients of every tensor argument, each within the dtype's tolerance or its bound in ``allowed``, if
    larger. Returns the output and the errors."""
    dtype = tensors[0].dtype
    named = dict(zip(["q1", "k1", "q2", "k2", "v"], tensors, strict=True), lam=lam, beta=beta)
    if slopes is not None:
        named["slopes"] = slopes
    if row_scale is not None:
        named["row_scale"] = row_scale
    mine = {key: t.detach().clone().requires_grad_() for key, t in named.items()}
    theirs = {key: t.detach().double().requires_grad_() for key, t in named.items()}

    def call(fn, a):
        return fn(a["q1"], a["k1"], a["q2"], a["k2"], a["v"], lam=a["lam"], beta=a["beta"], power=power,
                  slopes=a.get("slopes"), row_scale=a.get("row_scale"))

    extra = {} if tuning is None else {"tuning": tuning}
    out = call(functools.partial(get_kernel("tda"), sm_scale=1.0, **extra), mine)
    assert out.shape == tensors[0].shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    ref_out = call(tda_reference, theirs)
    errors = {"out": rel_err(out, ref_out)}
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(out.shape, device="cuda", generator=gen, dtype=torch.float64)
    (out.double() * dout).sum().backward()
    (ref_out * dout).sum().backward()
    for key in named:
        grad = mine[key].grad
        assert grad is not None and torch.isfinite(grad).all(), f"d{key}: missing or non-finite"
        errors[f"d{key}"] = rel_err(grad, theirs[key].grad)
    print(f"ERR {'tda':14s} {label:28s} " + " ".join(f"{key}={val:.2e}" for key, val in errors.items()))
    allowed = allowed or {}
    assert errors["out"] <= max(TOL_OUT[dtype], allowed.get("out", 0.0)), errors
    for key, val in errors.items():
        assert val <= max(TOL_GRAD[dtype], allowed.get(key, 0.0)), (key, errors)
    return out, errors


@pytest.mark.parametrize("shape", TDA_SHAPES, ids=lambda s: f"T{s[0]}-D{s[1]}-{str(s[2])[6:]}")
def test_tda_matches_reference(shape):
    """Scalar ``lam`` and ``beta`` as the module has them (0-d tensors); beta 0.5 keeps more entries on."""
    tokens, head_dim, dtype, batch, heads = shape
    tensors = make_tda_inputs(batch, heads, tokens, head_dim, dtype, seed=tokens + head_dim)
    lam, beta = torch.tensor(0.3, device="cuda"), torch.tensor(0.5, device="cuda")
    check_tda(tensors, lam=lam, beta=beta, seed=tokens, label=f"T={tokens} D={head_dim} {dtype}")


@pytest.mark.parametrize("capture", [False, True], ids=["defaults", "capture"])
@pytest.mark.parametrize("tokens, head_dim, dtype, alibi", [(91, 16, torch.bfloat16, False),
                                                            (131, 32, torch.bfloat16, True),
                                                            (1000, 32, torch.float32, True),
                                                            (4096, 64, torch.bfloat16, False)])
def test_tda_fused_backward_matches_reference(tokens, head_dim, dtype, alibi, capture):
    """``fused_bwd``: dq and the per-row gradients added atomically by the dk/dv kernel, on the activity map's
    lists (the default tiles) and testing every tile (the capture's, which take it), with ALiBi and a row factor."""
    from lengthbench.compile_policy import CAPTURE_TUNING

    tensors = make_tda_inputs(2, 2, tokens, head_dim, dtype, seed=tokens)
    extra = {}
    if alibi:
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(2, 2, tokens, device="cuda", generator=gen))
    tiles = dict(CAPTURE_TUNING["tda"], fused_bwd=False) if capture else {}
    lam, beta = torch.tensor(0.3, device="cuda"), torch.tensor(0.5, device="cuda")
    # the same tiles without it, held to the tolerance; the fused backward to it, or to 1.5x their error
    _, errors = check_tda(tensors, lam=lam, beta=beta, seed=tokens, label=f"T={tokens} D={head_dim} {dtype}",
                          tuning=tiles, **extra)
    check_tda(tensors, lam=lam, beta=beta, seed=tokens, label=f"fused T={tokens} D={head_dim} {dtype}",
              tuning=dict(tiles, fused_bwd=True), allowed={key: 1.5 * value for key, value in errors.items()},
              **extra)


@pytest.mark.parametrize("rows", [(128, 32, 4), (128, 32, 8), (128, 64, 8), (256, 32, 8)],
                         ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("tokens, head_dim, dtype, alibi", [(1, 16, torch.bfloat16, False),
                                                            (83, 16, torch.bfloat16, True),
                                                            (91, 16, torch.bfloat16, False),
                                                            (131, 16, torch.bfloat16, True),
                                                            (100, 32, torch.float32, True),
                                                            (128, 64, torch.bfloat16, False)])
def test_tda_whole_row_backward_matches_reference(tokens, head_dim, dtype, alibi, rows):
    """``rows``: one program a head computes the whole backward where every row fits its query tile (else the
    capture's fused backward runs), against float64, held to the tolerance or to 1.5x the capture's error on the
    same inputs, with ALiBi and a row factor."""
    from lengthbench.compile_policy import CAPTURE_TUNING

    tensors = make_tda_inputs(2, 2, tokens, head_dim, dtype, seed=tokens + 1)
    extra = {}
    if alibi:
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(2, 2, tokens, device="cuda", generator=gen))
    tiles = dict(CAPTURE_TUNING["tda"], rows=None)
    lam, beta = torch.tensor(0.3, device="cuda"), torch.tensor(0.5, device="cuda")
    if alibi:  # lam and beta per head, their gradients summed per head by the kernel
        lam, beta = torch.tensor([0.3, 0.6], device="cuda"), torch.tensor([0.5, 0.8], device="cuda")
    _, errors = check_tda(tensors, lam=lam, beta=beta, seed=tokens, label=f"T={tokens} D={head_dim} {dtype}",
                          tuning=tiles, **extra)
    check_tda(tensors, lam=lam, beta=beta, seed=tokens, label=f"rows {rows} T={tokens} D={head_dim} {dtype}",
              tuning=dict(tiles, rows=rows), allowed={key: 1.5 * value for key, value in errors.items()}, **extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_tda_slopes_row_scale_per_head(dtype):
    """ALiBi slopes and a row factor (which also skip the distant tiles), per-head ``lam`` and ``beta``."""
    batch, heads, tokens, head_dim = 2, 3, 150, 32
    tensors = make_tda_inputs(batch, heads, tokens, head_dim, dtype, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(3)
    slopes = torch.tensor([0.5, 0.0625, 0.0], device="cuda")
    row_scale = 0.5 + torch.rand(batch, heads, tokens, device="cuda", generator=gen)
    lam = torch.tensor([0.2, 0.5, 0.8], device="cuda")
    beta = torch.tensor([0.3, 0.6, 1.0], device="cuda")
    check_tda(tensors, lam=lam, beta=beta, slopes=slopes, row_scale=row_scale,
              label=f"slopes+row_scale {dtype}")


def test_tda_power():
    tensors = make_tda_inputs(2, 2, 130, 32, torch.float32, seed=4)
    check_tda(tensors, lam=torch.tensor(0.6, device="cuda"), beta=torch.tensor(0.4, device="cuda"), power=1.5,
              label="power=1.5")


def test_tda_rows_with_nothing_active():
    """Head 1's threshold (beta 50) is above every cosine score: its output and gradients are exact zeros,
    head 0 still matches the reference, nothing is NaN."""
    tensors = make_tda_inputs(1, 2, 300, 32, torch.float32, seed=13)
    beta = torch.tensor([0.4, 50.0], device="cuda")
    lam = torch.tensor([0.5, 0.5], device="cuda")
    out, _ = check_tda(tensors, lam=lam, beta=beta, label="beta=50 on head 1")
    assert out[:, 1].abs().max().item() == 0.0 and out[:, 0].abs().max().item() > 0.0
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    lam = torch.tensor(0.5, device="cuda", requires_grad=True)
    beta = torch.full_like(beta, 50.0).requires_grad_()
    out = get_kernel("tda")(*leaves, lam=lam, beta=beta, sm_scale=1.0)
    out.sum().backward()
    assert out.abs().max().item() == 0.0
    for t in [*leaves, lam, beta]:
        assert torch.isfinite(t.grad).all() and t.grad.abs().max().item() == 0.0


def test_tda_no_grad_inference_path():
    q1, k1, q2, k2, v = make_tda_inputs(1, 2, 100, 32, torch.bfloat16, seed=1)
    with torch.no_grad():
        out = get_kernel("tda")(q1, k1, q2, k2, v, lam=0.5, beta=0.5, sm_scale=1.0)
    assert torch.isfinite(out).all() and out.abs().max().item() > 0.0


# The one-pass TDA op's launch variants (kernels/tda/op.py, ``tuning``): the activity map kept in registers (1)
# or stored per tile (2), with and without the forward's skip branch, and the old branch-only path (map 0).
TDA_VARIANTS = {
    "map1": dict(fwd=(128, 64, 8), dq=(64, 64, 4), dkdv=(64, 64, 4), skip=False, map=1),
    "map2-bm128": dict(fwd=(128, 64, 8), dq=(128, 64, 8), dkdv=(128, 64, 8), skip=False, map=2),
    "map1-skip-bn32": dict(fwd=(128, 32, 8), dq=(64, 32, 8), dkdv=(64, 64, 8), skip=True, map=1),
    "map0-noskip": dict(fwd=(128, 64, 8), dq=(64, 64, 8), dkdv=(64, 64, 8), skip=False, map=0),
}


@pytest.mark.parametrize("variant", sorted(TDA_VARIANTS))
@pytest.mark.parametrize("case", ["T1000-D32-bf16", "T4096-D32-fp32", "T300-D64-bf16-alibi"])
def test_tda_variants_match_reference(variant, case, monkeypatch):
    from lengthbench.kernels.tda import op as tda

    real = tda._config  # the op's launch settings, replaced by the variant's (``tda_attention(tuning=...)``)
    monkeypatch.setattr(tda, "_config", lambda block_d, tuning=None: real(block_d, TDA_VARIANTS[variant]))
    tokens, head_dim, dtype = {"T1000-D32-bf16": (1000, 32, torch.bfloat16), "T4096-D32-fp32": (4096, 32, torch.float32),
                               "T300-D64-bf16-alibi": (300, 64, torch.bfloat16)}[case]
    tensors = make_tda_inputs(1, 2, tokens, head_dim, dtype, seed=tokens)
    extra = {}
    if "alibi" in case:
        gen = torch.Generator(device="cuda").manual_seed(5)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(1, 2, tokens, device="cuda", generator=gen))
    check_tda(tensors, lam=torch.tensor([0.3, 0.6], device="cuda"), beta=torch.tensor([0.5, 0.8], device="cuda"),
              seed=tokens, label=f"{variant} {case}", **extra)


@pytest.mark.parametrize("mode", [1, 2])
def test_tda_activity_map_is_exact(mode, monkeypatch):
    """The map the forward writes: 1 exactly on the (128 rows x 64 keys) tiles where either view has a causal
    entry above its row's threshold (computed densely here)."""
    from lengthbench.kernels.tda import op as tda
    from lengthbench.kernels.tra import tra_threshold

    real = tda._config
    variant = dict(TDA_VARIANTS["map1" if mode == 1 else "map2-bm128"])
    monkeypatch.setattr(tda, "_config", lambda block_d, tuning=None: real(block_d, variant))
    seen = {}
    lists = tda._tile_lists
    monkeypatch.setattr(tda, "_tile_lists", lambda amap: seen.setdefault("map", amap.clone()) is not None
                        and lists(amap))
    tokens, head_dim, heads = 1000, 32, 2
    q1, k1, q2, k2, v = make_tda_inputs(1, heads, tokens, head_dim, torch.float32, seed=21)
    beta = torch.tensor([0.6, 0.9], device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q1, k1, q2, k2, v)]
    tda.tda_attention(*leaves, lam=0.5, beta=beta).sum().backward()
    tau = tra_threshold(tokens, head_dim, beta, 1.0, "cuda")
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device="cuda").tril()
    active = torch.zeros(1, heads, tokens, tokens, dtype=torch.bool, device="cuda")
    for qa, ka in ((q1, k1), (q2, k2)):
        active |= ((qa @ ka.transpose(-1, -2)) - tau[None, :, :, None] > 0) & causal
    nq, nk = -(-tokens // 128), -(-tokens // 64)
    padded = torch.zeros(1, heads, nq * 128, nk * 64, dtype=torch.bool, device="cuda")
    padded[..., :tokens, :tokens] = active
    want = padded.view(heads, nq, 128, nk, 64).any(4).any(2).to(torch.int8)
    got = seen["map"]
    # fp32 products in another order may move a score within rounding of the threshold: allow 1 tile per head
    assert (got != want).sum().item() <= heads, (got != want).nonzero()
    assert 0 < want.sum().item() < want.numel()


# -- the entmax search's variants (kernels/entmax/config.py, ``tuning``) --------------------------------------

# ``top16``: the 16 largest tile maxima start, per-tile reductions, two scale products, one kernel, without the
# candidate lists; the others: the per-column top-d start (``subset``) with its certificate, the Newton passes
# over the open rows only (``split``), elementwise partial sums (``acc``), other tiles (tiny ones leave most
# rows to the Newton passes).
TOP16 = dict(split=False, subset=0, acc=False, fold=False, lists=False, lean=False, pairs=False)
ENTMAX_VARIANTS = {
    "top16": TOP16,
    "top16-split": dict(TOP16, split=True),
    "fused-sub3-acc": dict(split=False, subset=3, acc=True),
    "sub2-bm128-w8": dict(subset=2, bm=128, warps=8, newton=(128, 64, 8, 2)),
    "sub1-acc-nofold": dict(subset=1, acc=True, fold=False, newton=(32, 32, 4, 2)),
    "tiny": dict(subset=2, bm=32, bn=16, bn_subset=16, newton=(16, 16, 4, 2)),
    "norescue": dict(rescue=False),  # without the saturated columns' scan into the lists (_rescue_kernel)
    "pairwise-sieve": dict(sieve_scan=False),  # Sieve's listed rows' [rows, C, C] suffix sums
    "sieve-open-n16": dict(sieve_open=(16, 16, 2, 3)),  # Sieve's open rows on tiles of their own
    # the few-open-rows tiles (the count read and found few at any length)
    "few-open-n16": dict(few_open=(1 << 30, 0), newton_few=(16, 16, 2, 3), sieve_open_few=(16, 16, 2, 3)),
    "rescue-c16-all": dict(rescue=True, list_size=16, max_sat=64, rescue_launch=(4, 32, 4)),
    # the training step's settings (no lists, one kernel) with a 2-deep subset on 32x16 tiles: Copy's Sieve
    # 0.63 -> 0.70x softmax + RoPE (results/benchmarks/gpu_logs/train_tiles_sweep.txt)
    "capture-sub2-32x16": dict(lists=False, split=False, subset=2, bm=32, bn=16, bn_subset=16),
}


@pytest.mark.parametrize("variant", sorted(ENTMAX_VARIANTS))
@pytest.mark.parametrize("case", ["entmax:T1000-D32-bf16", "sparsemax:T4096-D32-fp32",
                                  "sieve:T300-D64-bf16-alibi", "entmax:T333-D128-bf16-alibi"])
def test_entmax_variants_match_reference(variant, case):
    name, shape = case.split(":")
    tokens, head_dim, dtype = {"T1000-D32-bf16": (1000, 32, torch.bfloat16),
                               "T4096-D32-fp32": (4096, 32, torch.float32),
                               "T300-D64-bf16-alibi": (300, 64, torch.bfloat16),
                               "T333-D128-bf16-alibi": (333, 128, torch.bfloat16)}[shape]
    q, k, v = make_inputs(name, 1, 2, tokens, head_dim, dtype, seed=tokens)
    extra = {}
    if "alibi" in case:
        gen = torch.Generator(device="cuda").manual_seed(5)
        extra = dict(slopes=torch.tensor([0.25, 0.0], device="cuda"),
                     row_scale=0.5 + torch.rand(1, 2, tokens, device="cuda", generator=gen))
    check(name, q, k, v, seed=tokens, label=f"{variant} {shape}", tuning=ENTMAX_VARIANTS[variant], **extra)


@pytest.mark.parametrize("variant", sorted([*set(ENTMAX_VARIANTS) - {"top16"}, "default"]))
@pytest.mark.parametrize("case", ["entmax-bf16", "entmax-fp32-small", "sparsemax-bf16", "sieve-fp32-alibi"])
def test_entmax_threshold_variants_agree(variant, case):
    """Every variant's ``tau`` equals the top-16 search's to rounding (the same root, reached from another start
    or summed in another order), with the same rows at ``+inf`` (no visible key)."""
    from lengthbench.kernels.entmax import op as entmax

    name, dtype, *rest = case.split("-")
    tokens, scale = (2048, 0.5) if "small" in rest else (4096, 1.0)  # small scores: wide supports, more passes
    q, k, _ = make_inputs("entmax", 1, 3, tokens, 32, {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype],
                          seed=17, scale=scale)
    kwargs = dict(alpha=2.0 if name == "sparsemax" else 1.5, strict=name == "sieve")  # Sieve's j < r
    if "alibi" in rest:
        gen = torch.Generator(device="cuda").manual_seed(6)
        kwargs.update(slopes=torch.tensor([0.5, 0.0625, 0.0], device="cuda"),
                      row_scale=0.5 + torch.rand(1, 3, tokens, device="cuda", generator=gen))
    want = entmax.entmax_threshold(q, k, **kwargs, tuning=TOP16)
    got = entmax.entmax_threshold(q, k, **kwargs, tuning=ENTMAX_VARIANTS.get(variant))  # default: None
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    err = ((got - want).abs() / (1 + want.abs()))[finite].max().item()
    print(f"ERR tau {variant:12s} {case:18s} {err:.2e}")
    assert err <= 1e-5, err
