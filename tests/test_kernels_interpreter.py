"""Every fused op in ``kernels/`` against its float64 dense reference, on the CPU under the Triton interpreter.

Small shapes (T = 1, 17, 33; head dims 16 and 32; fp32; ALiBi slopes and a row scale at T = 17), output and
every gradient (q, k, v, ``slopes``, ``row_scale``; TDA's two views, ``lam`` and ``beta``), so a change that
breaks a kernel's numerics fails here, without a GPU. Sieve and entmax also run their other launch paths
(``tuning``: without the candidate lists; lists of 8 slots, which fill up and leave rows open), and Sieve both
its remainders (``MECHANISM_PARAMS``: the default drops it, row 0's output all zeros), with rows whose support is
one key (``sharp``). The GPU tests
(``test_kernels.py``) cover the longer shapes, bf16 and fp16.

``TRITON_INTERPRET=1`` must be set before Triton is imported, so the ops run in worker processes (this file
run as a script); the tests read their errors. Skipped where Triton is not installed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
from interpreter_helpers import entmax_threshold64, interpreter_results, needs_triton, rel_err

from lengthbench.compile_policy import CAPTURE_TUNING
from lengthbench.kernels.defaults import SIEVE_WINDOW_EPS
from lengthbench.models.attention import kernel_names

# (tokens, head_dim, extras): extras "alibi" adds slopes and a row scale (both get gradients); "walk4" and
# "walk8" shift every score by -4 and -8 (the long walks of ``benchmarks/kernels.py --inputs``: ``walk_inputs``);
# "hot" by +8, so the stick is spent within a few keys and the stick-breaking walks stop early
SHAPES = [(1, 16, ""), (17, 16, ""), (17, 32, ""), (33, 16, ""), (17, 16, "alibi")]
# the stick-breaking family's extra shapes (``STICK_OPS``)
STICK_SHAPES = [(33, 16, "walk4"), (17, 32, "walk8"), (70, 16, "hot"), (40, 16, "walk8-alibi")]
STICK_OPS = ("stickbreaking", "sieve-window")
# Sieve's extra shape: "sharp" scales q by 12 (scores of about +-12), so most rows' support is one key
SIEVE_SHAPES = [(40, 16, "sharp")]
# the stick-breaking kernels' levers (``stickbreaking.op.launch_config``), each run on every shape of STICK_OPS;
# small tiles so the walks cross several key tiles (and the forward's and backward's tiles differ)
SMALL = dict(fwd=(16, 16, 4, 1), bwd=(32, 16, 4, 1))
STICK_VARIANTS = [
    ("small", SMALL),
    ("scan", dict(SMALL, cumsum="scan")),  # tl.cumsum's sums (those of Sieve's gathered open rows)
    ("scan-reuse", dict(SMALL, exp2=True, sigmoid="reuse", cumsum="scan", full_tiles=True)),
    ("split-exp", dict(SMALL, split=True, sigmoid="exp", cumsum="scan")),
    ("full", dict(SMALL, full_tiles=True)),
    # the weights with each key's own softplus outside the sums (``cumsum`` bf16; fp32 inputs take two tf32
    # products), and the launch option that caps the registers
    ("own", dict(fwd=(16, 16, 4, 1, 96), bwd=(32, 16, 4, 1, 128), cumsum="bf16", full_tiles=True)),
    ("own-masked", dict(SMALL, cumsum="bf16", full_tiles=False, skip_empty=False)),
    ("poly", dict(SMALL, log1p="poly")),
    ("poly4", dict(SMALL, log1p="poly4")),  # the 16-bit inputs' default (fp32 ones take ``poly``)
    ("log", dict(SMALL, log1p="log")),
    # the exit test after every key tile, and after every fourth (the default: every eighth)
    ("exit-every-1", dict(SMALL, exit_every=1)),
    ("exit-every-4", dict(SMALL, exit_every=4, full_tiles=False)),
    # the stick in nats (``exp``/``log``), softplus's log1p by the degree-6 polynomial
    ("nats", dict(SMALL, exp2=False)),
    ("nats-poly", dict(SMALL, exp2=False, log1p="poly")),
    # the forward's next key tile loaded before the work on its own, with and without masked tiles
    ("no-prefetch", dict(SMALL, prefetch=False, full_tiles=True)),
    ("prefetch-masked", dict(SMALL, prefetch=True, full_tiles=False, skip_empty=True)),
    ("prefix-all", dict(fwd=(32, 16, 4, 1), bwd=(16, 32, 4, 1), cumsum="scan", exp2=True, sigmoid="reuse",
                        split=False, skip_empty=True, log1p="poly")),
    ("skip", dict(SMALL, skip_empty=True)),
    ("rowmax-16", dict(SMALL, rowmax=(16, 16, 4, 1))),  # sieve-window's row-max pass on tiles with keys before every row
]
# per op: (label, tuning) of the launch paths to run besides the defaults, and on which shapes
VARIANTS = {
    # Sieve's list path sorts its candidates (``tl.sort``), which the interpreter runs slowly: the defaults
    # (64 slots) at T = 1 only, 8 slots at T = 33 and with ALiBi; and the path without lists everywhere
    "sieve": [("lists-8", dict(list_size=8)), ("no-lists", dict(lists=False)),
                     ("capture-sub2-32x16", dict(lists=False, split=False, subset=2, bm=32, bn=16, bn_subset=16)),
                     # the walk after the threshold on tiles of its own (``walk``), smaller than the tokens
                     ("capture-walk", dict(lists=False, split=False, walk=dict(fwd=(16, 16, 4, 1), bwd=(32, 16, 4, 1)))),
                     # the threshold found with every row's keys in registers (``short_rows.sieve_threshold``), then
                     # that walk; and the threshold search before the capture's walk
                     ("short-rows-walk", dict(lists=False, split=False, threshold="short_rows",
                                          walk=dict(fwd=(16, 16, 4, 1), bwd=(32, 16, 4, 1)))),
                     ("capture-search", dict(lists=False, split=False))],
    "entmax": [("no-lists", dict(lists=False)), ("lists-8", dict(list_size=8)),
               ("capture-sub2-32x16", dict(lists=False, split=False, subset=2, bm=32, bn=16, bn_subset=16))],
    "sparsemax": [("no-lists", dict(lists=False))],
    # (skip and the rowmax one: sieve-window's levers)
    "stickbreaking": [(label, tuning) for label, tuning in STICK_VARIANTS
                      if label != "skip" and not label.startswith("rowmax")],
    "sieve-window": STICK_VARIANTS,
}
# the pointwise ops' launch settings (``utils.rowwise.launch_settings``): tiles smaller than the tokens, the forward's
# rows twice its keys and the backward's keys twice its rows, so several tiles cross the diagonal in each kernel
ROWWISE_TILES = ("tiles-32x16", dict(fwd=(32, 16, 4), bwd=(16, 32, 2)))
# and the same tiles with the backward's dq and row gradients added atomically by the dk/dv kernel (``fused_bwd``)
ROWWISE_FUSED = ("tiles-32x16-fused", dict(ROWWISE_TILES[1], fused_bwd=True))
for _name in ("rectified", "rela", "softpick", "tra"):
    VARIANTS[_name] = [*VARIANTS.get(_name, []), ROWWISE_TILES, ROWWISE_FUSED]
# and the settings a CUDA graph records (the training step's: lengthbench.compile_policy.CAPTURE_TUNING)
CAPTURE = CAPTURE_TUNING
for _name, _tuning in CAPTURE.items():
    VARIANTS[_name] = [*VARIANTS.get(_name, []), ("capture", _tuning)]
# TDA's fused backward (dq and the per-row gradients added atomically by the dk/dv kernel) on the activity map's
# lists (the default tiles) and on the capture's tiles, which test every tile (the capture's rows past 128 take it),
# the capture's tiles with the dq kernel, and the whole-row backward on key tiles smaller than the tokens
VARIANTS["tda"] += [("fused", dict(fused_bwd=True)), ("capture-fused", dict(CAPTURE["tda"], rows=None)),
                    ("capture-two", dict(CAPTURE["tda"], fused_bwd=False, rows=None)),
                    ("rows-32x16", dict(CAPTURE["tda"], rows=(32, 16, 4)))]
# per op: (label, mechanism parameters) run besides its defaults, on the launch paths of MECHANISM_PATHS (each case
# "<path>+<label>"; the reference takes the same parameters): Sieve's remainder on the query's own value (its default
# drops it: Eq. 7, the weights over the earlier tokens only, row 0 all zeros)
MECHANISM_PARAMS = {"sieve": [("diagonal", dict(remainder="diagonal"))]}
MECHANISM_PATHS = {"sieve": ("default", "lists-8", "no-lists", "short-rows-walk", "capture")}
OPS = kernel_names()  # every op of the registry
TOLERANCE = 1e-4  # max |kernel - reference| / max(max |reference|, 0.01), per tensor (fp32 rounding: ~1e-6)
TIE = 2e-5


def cases() -> list[tuple[str, int, int, str, str]]:
    """``(op, tokens, head_dim, extras, variant)`` of every run."""
    out = []
    for op in OPS:
        shapes = SHAPES + (STICK_SHAPES if op in STICK_OPS else []) + (SIEVE_SHAPES if op == "sieve" else [])
        for tokens, head_dim, extras in shapes:
            if op == "tra" and extras:
                continue  # cosine scores with sm_scale 1: the module gives tra no ALiBi or row scale
            if not (op == "sieve" and tokens > 1):  # (see VARIANTS)
                out.append((op, tokens, head_dim, extras, "default"))
            for label, _ in VARIANTS.get(op, []):
                if label == "lists-8" and (tokens, extras) not in ((33, ""), (17, "alibi"), (40, "sharp")):
                    continue  # (the slowest path)
                if op in STICK_OPS and (tokens, head_dim, extras) in ((17, 32, ""), (33, 16, "")):
                    continue  # the levers: T = 1, 17 (and ALiBi), and the long walks and early exits
                out.append((op, tokens, head_dim, extras, label))
    return out + [(op, tokens, head_dim, extras, f"{variant}+{label}")
                  for op, tokens, head_dim, extras, variant in out if variant in MECHANISM_PATHS.get(op, ())
                  for label, _ in MECHANISM_PARAMS[op]]


def case_id(case) -> str:
    op, tokens, head_dim, extras, variant = case
    return f"{op}-T{tokens}-D{head_dim}{'-' + extras if extras else ''}-{variant}"


# -- the worker (this file run as a script, TRITON_INTERPRET=1) ----------------------------------------------

def run_case(case) -> dict:
    import torch

    from lengthbench import attention_weights
    from lengthbench.models.attention import load_kernel as load_op

    op_name, tokens, head_dim, extras, variant = case
    variant, _, param_label = variant.partition("+")
    tuning = dict(VARIANTS.get(op_name, [])).get(variant)
    mechanism = dict(MECHANISM_PARAMS.get(op_name, [])).get(param_label, {})
    gen = torch.Generator().manual_seed(1000 * tokens + head_dim)
    batch, heads = 1, 2
    two_views = op_name == "tda"
    tensors = [torch.randn(batch, heads, tokens, head_dim, generator=gen) for _ in range(5 if two_views else 3)]
    cosine = op_name in ("tra", "tda")
    if cosine:
        tensors[:-1] = [torch.nn.functional.normalize(t, dim=-1) for t in tensors[:-1]]
    sm_scale = 1.0 if cosine else 1.0 / math.sqrt(head_dim)
    params = {}
    if two_views:
        params = dict(lam=torch.tensor(0.3), beta=torch.tensor(0.5))
    shift = {"walk4": -4.0, "walk8": -8.0, "hot": 8.0}.get(extras.removesuffix("-alibi"))
    if shift is not None:
        tensors[:2] = walk_inputs(tensors[0], tensors[1], shift, sm_scale)
    if extras == "sharp":
        tensors[0] = tensors[0] * 12.0
    named = dict(zip(["q1", "k1", "q2", "k2", "v"] if two_views else ["q", "k", "v"], tensors, strict=True))
    if extras.endswith("alibi"):
        params.update(slopes=torch.tensor([0.5, 0.0625]), row_scale=0.5 + torch.rand(batch, heads, tokens, generator=gen))
    mine = {key: t.clone().requires_grad_() for key, t in {**named, **params}.items()}
    theirs = {key: t.double().requires_grad_() for key, t in {**named, **params}.items()}

    def scores(q, k, a):
        z = torch.matmul(q, k.transpose(-1, -2)) * sm_scale
        if "slopes" in a:
            pos = torch.arange(tokens)
            z = z - a["slopes"][:, None, None] * (pos[:, None] - pos[None, :]).to(z.dtype)
        if "row_scale" in a:
            z = z * a["row_scale"][..., None]
        return z

    if two_views:
        z1, z2 = scores(theirs["q1"], theirs["k1"], theirs), scores(theirs["q2"], theirs["k2"], theirs)
        w = attention_weights("tda", z1, scores2=z2, head_dim=head_dim, lam=theirs["lam"], beta=theirs["beta"])
        z = z1
    else:
        z = scores(theirs["q"], theirs["k"], theirs)
        w = attention_weights(op_name, z, **({"head_dim": head_dim} if op_name == "tra" else {}), **mechanism)
    ref = torch.matmul(w, theirs["v"])
    earlier = torch.ones(tokens, tokens, dtype=torch.bool).tril(-1)
    one_key = int((((w.detach() > 0) & earlier).sum(-1) == 1).sum())  # rows whose weights sit on one earlier key

    op = load_op(op_name)
    kwargs = {key: mine[key] for key in params} | mechanism
    if tuning is not None:
        kwargs["tuning"] = tuning
    started = time.perf_counter()
    out = op(*(mine[key] for key in named), sm_scale=sm_scale, **kwargs)
    # rows whose selection is a near-tie (a score within TIE of 0 or of the threshold) may flip on rounding
    keep = ~near_ties(op_name, z.detach(), tokens)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64) * keep[..., None]
    (out.double() * dout).sum().backward()
    seconds = time.perf_counter() - started
    (ref * dout).sum().backward()
    errors = {"out": rel_err(out.detach()[keep], ref.detach()[keep])}
    for key in mine:
        grad = mine[key].grad
        errors[f"d{key}"] = float("nan") if grad is None or not torch.isfinite(grad).all() else rel_err(
            grad, theirs[key].grad)
    return dict(errors=errors, ties=int((~keep).sum()), seconds=seconds, finite=bool(torch.isfinite(out).all()),
                one_key=one_key, row0=float(out.detach()[..., 0, :].abs().max()))


def walk_inputs(q, k, shift, sm_scale):
    """``q, k`` with every score ``sm_scale q.k`` moved by ``shift``: the first component of q set to 1, of k to
    ``shift / sm_scale`` (as ``benchmarks/kernels.py``'s ``walk_inputs``)."""
    q, k = q.clone(), k.clone()
    q[..., 0] = 1.0
    k[..., 0] = shift / sm_scale
    return q, k


def near_ties(name, z, tokens):
    import torch

    pos = torch.arange(tokens)
    none = torch.zeros(z.shape[:-1], dtype=torch.bool)
    if name == "rectified":
        return ((z.abs() < TIE) & (pos[None, :] <= pos[:, None])).any(-1)
    if name == "sieve-window":  # Algorithm 1's filter at its default eps
        eps = SIEVE_WINDOW_EPS
        earlier = pos[None, :] < pos[:, None]
        rowmax = torch.where(earlier, z, torch.full_like(z, float("-inf"))).amax(-1, keepdim=True)
        return (((z - (rowmax - eps)).abs() < TIE * (1 + rowmax.abs())) & earlier).any(-1)
    if name in ("sieve", "sparsemax"):
        alpha = 2.0 if name == "sparsemax" else 1.5
        visible = pos[None, :] < pos[:, None] if name == "sieve" else pos[None, :] <= pos[:, None]
        x = z * (alpha - 1)
        tau = entmax_threshold64(torch.where(visible, x, torch.full_like(x, float("-inf"))), alpha)
        return (((x - tau[..., None]).abs() < TIE * (1 + tau.abs()[..., None])) & visible).any(-1)
    return none


def worker(indices: list[int]) -> None:
    all_cases = cases()
    for index in indices:
        result = run_case(all_cases[index])
        print(json.dumps({"case": index, **result}), flush=True)


# -- the tests ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def measured() -> dict[int, dict]:
    """Every case's errors, from two worker processes."""
    return interpreter_results(str(Path(__file__).resolve()), len(cases()))


@needs_triton
@pytest.mark.parametrize("index", range(len(cases())), ids=[case_id(c) for c in cases()])
def test_kernel_matches_float64_reference(index, measured):
    result = measured[index]
    print(f"{case_id(cases()[index])}: {result['seconds']:.1f}s ties={result['ties']} "
          + " ".join(f"{key}={value:.1e}" for key, value in result["errors"].items()))
    assert result["finite"], "NaN/inf in the output"
    assert result["ties"] <= 1
    for key, value in result["errors"].items():
        assert value <= TOLERANCE, (key, result["errors"])
    op, tokens, _, extras, variant = cases()[index]
    if extras == "sharp":  # the rows whose support is one key are many (row 1's is, in every case)
        assert result["one_key"] >= 10, result["one_key"]
    if op == "sieve" and not variant.endswith("+diagonal"):  # (Eq. 7) row 0 sees no earlier token: zeros, exactly
        assert result["row0"] == 0.0, result["row0"]


def test_every_op_is_covered():
    from lengthbench.models.attention import kernel_names

    assert sorted(OPS) == kernel_names()
    assert {c[0] for c in cases()} == set(OPS)


@needs_triton
def test_rowwise_launch_settings_default_and_refuse_bad_tiles():
    """The pointwise ops' ``tuning``: the defaults without it, the given tiles with it, a clear error for tiles
    that are not powers of two of at least 16, a forward whose rows are not a multiple of its keys (its tiles
    before the diagonal go unmasked) or an unknown key."""
    import torch

    from lengthbench.kernels.utils.common import Problem
    from lengthbench.kernels.utils.rowwise import launch_settings

    q = torch.zeros(1, 2, 40, 32)
    pb = Problem(q, q, q, None, None, None)
    assert launch_settings(pb, None) == ((128, 64, 8), (64, 64, 4))
    assert launch_settings(pb, {"fwd": [64, 32, 4]}) == ((64, 32, 4), (64, 64, 4))
    assert launch_settings(pb, {"bwd": (16, 32, 2)})[1] == (16, 32, 2)
    assert launch_settings(pb, {"fused_bwd": True}) == ((128, 64, 8), (64, 64, 4))
    for bad, message in (({"fwd": [32, 64, 4]}, "multiple of its keys"), ({"bwd": [24, 32, 4]}, "powers of two"),
                         ({"bwd": [16, 16]}, r"\[BM, BN, warps\]"), ({"fwd": [64, 64, 3]}, "warps"),
                         ({"tiles": [64, 64, 4]}, "unknown tuning keys"),
                         ({"fused_bwd": "yes"}, "fused_bwd must be true or false")):
        with pytest.raises(ValueError, match=message):
            launch_settings(pb, bad)


@needs_triton
def test_the_stick_in_bits_or_nats():
    """``exp2``: the kernels' ``EXP2`` is 1 (the stick in bits, the hardware's powers of two) by default, 0 in nats;
    ``cumsum`` and ``log1p`` take their kernels' codes."""
    import torch

    from lengthbench.kernels.stickbreaking.op import launch_config
    from lengthbench.kernels.utils.common import Problem

    q = torch.zeros(1, 2, 40, 32)
    pb = Problem(q, q, q, None, None, None)
    assert [launch_config(pb, tuning)["exp2"] for tuning in (None, {"exp2": False})] == [1, 0]
    assert [launch_config(pb, {"cumsum": c})["cumsum"] for c in ("scan", "bf16")] == [0, 6]  # (fp32 inputs)
    assert [launch_config(pb, {"log1p": p})["log1p"] for p in ("log", "poly", "poly4")] == [0, 1, 4]


@needs_triton
def test_stick_tiles_take_a_register_cap_and_fp32_inputs_their_own_arithmetic():
    """The tiles' fifth entry caps the registers (0: none; the defaults cap the forward's at 96 up to head dim 32,
    with 3 stages, and at 128 up to 64, the backward's at 168 up to 32); 16-bit inputs take the degree-4 ``log1p``
    (4), fp32 ones the degree-6 one (1); one-bf16 sums with fp32 inputs take bf16's form on two tf32 products (6); a
    cap outside 24..255 is refused."""
    import torch

    from lengthbench.kernels.stickbreaking.op import launch_config
    from lengthbench.kernels.stickbreaking.stick import max_registers
    from lengthbench.kernels.utils.common import Problem

    def problem(dim, dtype=torch.bfloat16):
        q = torch.zeros(1, 2, 40, dim, dtype=dtype)
        return Problem(q, q, q, None, None, None)

    assert launch_config(problem(32))["fwd"] == (64, 32, 4, 3, 96)
    assert launch_config(problem(64))["fwd"] == (64, 32, 4, 2, 128)
    assert launch_config(problem(32))["bwd"] == (64, 32, 4, 2, 168)
    assert launch_config(problem(32))["log1p"] == 4 and launch_config(problem(32, torch.float32))["log1p"] == 1
    assert launch_config(problem(32))["exit_every"] == 8 and launch_config(problem(32))["rowmax"] == (64, 128, 4, 3, 0)
    assert launch_config(problem(64))["bwd"] == (64, 32, 4, 2, 0)
    assert launch_config(problem(128))["fwd"] == (32, 32, 4, 2, 0)
    assert launch_config(problem(32), {"fwd": (32, 16, 4, 1)})["fwd"] == (32, 16, 4, 1, 0)
    assert launch_config(problem(32))["cumsum"] == 5 and launch_config(problem(32, torch.float32))["cumsum"] == 6
    assert max_registers(0) == {} and max_registers(96) == {"maxnreg": 96}
    for bad, message in (({"fwd": (64, 32, 4, 2, 300)}, "maxnreg 24 to 255"),
                         ({"bwd": (64, 32, 4, 2, 8)}, "maxnreg 24 to 255")):
        with pytest.raises(ValueError, match=message):
            launch_config(problem(32), bad)


# Each setting that ``stickbreaking.op.launch_config`` refuses, with the words of its error. The check runs on the host
# before any launch, so it is tested here, on the CPU.
BAD_STICK_TUNING = [
    (dict(cumsum="fft"), "cumsum must be one of"),
    (dict(fwd=(48, 64, 4, 2)), "fwd must be"),
    (dict(bwd=(64, 32, 4, 2, 300)), "bwd must be"),  # maxnreg past 255
    (dict(typo=1), "unknown keys"),
    (dict(loop="for"), "unknown keys"),
    (dict(sigmoid="tanh"), "sigmoid must be one of"),
    (dict(cumsum="dot2"), "cumsum must be one of"),
    (dict(log1p="poly5"), "log1p must be one of"),
]


@needs_triton
@pytest.mark.parametrize("bad, words", BAD_STICK_TUNING, ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_stick_tuning_rejects_unknown_keys_and_values(bad, words):
    import torch

    from lengthbench.kernels.stickbreaking.op import launch_config
    from lengthbench.kernels.utils.common import Problem

    q = torch.zeros(1, 1, 10, 32)
    pb = Problem(q, q, q, None, None, None)
    with pytest.raises(ValueError, match=f"stick-breaking tuning: {words}"):
        launch_config(pb, bad)
    # the same keys at settings that go together are taken (``split`` False is the default)
    assert launch_config(pb, dict(split=False))["split"] is False
    assert launch_config(pb, dict(cumsum="scan", split=True))["split"] is True


if __name__ == "__main__":
    worker([int(i) for i in sys.argv[1].split(",") if i])
