"""The short-rows kernels (``kernels/entmax/short_rows.py``) against the float64 dense reference, on the CPU under the
Triton interpreter: output and every gradient (q, k, v, ``slopes``, ``row_scale``) of 1.5-entmax, on random scores
and on scores shifted down by 8, one row block and several
(``bm`` 16), with ALiBi slopes and a row scale; and Sieve's threshold alone (``sieve_threshold``) against the
float64 one. On a GPU (``gpu`` mark) the same comparison at the training
widths (17 to 256 tokens), head dims 32 and 64, in fp32 and bf16 (the tolerances of ``test_kernels.py``).

``TRITON_INTERPRET=1`` must be set before Triton is imported: the cases run in a worker process (this file run
as a script). Skipped where Triton is not installed.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from interpreter_helpers import entmax_threshold64, interpreter_results, needs_triton, rel_err

# (op, reference name, reference params, op params)
OPS = {"entmax": ("entmax", {}, {})}
# (tokens, head_dim, extras): "alibi" adds slopes and a row scale; "walk" shifts every score by -8; "bm16" runs
# the rows in blocks of 16; "blocks" takes the backward a row block a program (atomic dk/dv), not a head; "bwd32"
# gives the backward blocks of 32 rows (the forward's stay 16); "whole" takes every row against all keys in one
# launch (by default rows [0, 32), [32, 64), [64, 128) go against the 32, 64, 128 keys they can see); "bd32" pads
# the head dim of the tiles to 32; "own64" gives the launch against 64 keys row blocks of 16 of its own;
# "rowwise" takes the backward of utils/rowwise.py on the forward's row statistics (the others name
# the narrow backward: the default takes rowwise wherever there is a row scale); "notail" takes a range that the
# tokens cut short (rows [32, 40), [64, 70)) against the power of two of keys above its end, not the two tiles of
# short_rows._row_ranges (40 and 70 tokens take the two tiles by default; 131 and 150, rows [128, 131) and [128, 150));
# "rwtiles" gives the rowwise backward tiles of 16 rows and 32 keys, 2 warps (``rowwise_bwd``); "rwtwo" takes that
# backward with its dq kernel (``rowwise_fused`` false; by default the dk/dv kernel adds dq and the row gradients
# atomically); "nt" gives 1.5-entmax's threshold Newton's steps to 3e-2 before the exact root on their support
# (``newton_tol``; by default to ``short_rows.NEWTON_TOL``)
SHAPES = [(1, 16, ""), (17, 16, ""), (17, 32, "alibi"), (40, 16, "walk"), (40, 16, "bm16"), (33, 32, "walk-alibi-bm16"),
          (40, 16, "walk-bm16-blocks"), (33, 32, "alibi-bm16-blocks"), (40, 16, "walk-bm16-bwd32"),
          (70, 16, "walk-alibi"), (40, 16, "walk-whole"), (70, 16, "walk-alibi-bd32-own64"), (17, 16, "bd32"),
          (17, 16, "rowwise"),
          (70, 16, "walk-alibi-rowwise"), (40, 32, "alibi-whole-rowwise"), (70, 16, "walk-alibi-notail"),
          (40, 16, "walk-bm16-blocks-notail"), (150, 16, "walk-alibi"),
          (70, 16, "walk-alibi-rowwise-rwtiles"), (70, 16, "walk-alibi-rowwise-rwtiles-rwtwo"),
          (40, 32, "alibi-rowwise-rwtwo"), (70, 16, "walk-alibi-nt"), (131, 16, "alibi-nt"),
          (40, 16, "bm16-nt"), (70, 16, "walk-alibi-rowwise-nt")]
TOLERANCE = 1e-4
TIE = 2e-5


def for_op(op: str, shapes: list) -> list:
    """``shapes`` that apply to ``op`` (the ``rowwise`` ones to 1.5-entmax only)."""
    return [shape for shape in shapes if op == "entmax" or "rowwise" not in shape[2]]


def cases():
    return [(op, *shape) for op in OPS for shape in for_op(op, SHAPES)]


def case_id(case) -> str:
    op, tokens, head_dim, extras = case
    return f"{op}-T{tokens}-D{head_dim}{'-' + extras if extras else ''}"


def run_case(case, device="cpu", dtype=None) -> dict:
    import torch

    from lengthbench import attention_weights
    from lengthbench.kernels.entmax import short_rows

    op_name, tokens, head_dim, extras = case
    ref_name, ref_params, op_params = OPS[op_name]
    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(100 * tokens + head_dim)
    batch, heads = 2, 2
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, generator=gen) for _ in range(3))
    sm_scale = 1.0 / math.sqrt(head_dim)
    if "walk" in extras:  # one constant component of q and k moves every score by -8
        q[..., 0] = 1.0
        k[..., 0] = -8.0 / sm_scale
    tensors = {"q": q, "k": k, "v": v}
    if "alibi" in extras:
        tensors["slopes"] = torch.tensor([0.5, 0.0625])
        tensors["row_scale"] = 0.5 + torch.rand(batch, heads, tokens, generator=gen)
    low = {key: t.to(dtype) if key in "qkv" else t for key, t in tensors.items()}  # the reference sees the rounded
    mine = {key: t.to(device).clone().requires_grad_() for key, t in low.items()}
    theirs = {key: t.double().clone().requires_grad_() for key, t in low.items()}
    z = torch.matmul(theirs["q"], theirs["k"].transpose(-1, -2)) * sm_scale
    if "slopes" in theirs:
        pos = torch.arange(tokens)
        z = z - theirs["slopes"][:, None, None] * (pos[:, None] - pos[None, :]).double()
        z = z * theirs["row_scale"][..., None]
    ref = torch.matmul(attention_weights(ref_name, z, **ref_params), theirs["v"])
    op = short_rows.entmax_short_rows
    tuning = {**({"bm": 16} if "bm16" in extras else {}), **({"backward": "blocks"} if "blocks" in extras else {}),
              **({"bwd_bm": 32} if "bwd32" in extras else {}), **({"rows": "whole"} if "whole" in extras else {}),
              **({"bd": 32} if "bd32" in extras else {}),
              **({"widths": {"64": {"bm": 16, "bwd_bm": 16}}} if "own64" in extras else {}),
              **({"tail": False} if "notail" in extras else {}),
              **({"rowwise_bwd": [16, 32, 2]} if "rwtiles" in extras else {}),
              **({"rowwise_fused": False} if "rwtwo" in extras else {}),
              **({"newton_tol": 3e-2} if "nt" in extras.split("-") else {}),
              "entmax_backward": "rowwise" if "rowwise" in extras else "narrow"}
    out = op(mine["q"], mine["k"], mine["v"], slopes=mine.get("slopes"), row_scale=mine.get("row_scale"),
             sm_scale=sm_scale, tuning=tuning, **op_params)
    keep = ~near_ties(op_name, z.detach(), tokens, op_params)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64) * keep[..., None]
    (out.double().cpu() * dout).sum().backward()
    (ref * dout).sum().backward()
    errors = {"out": rel_err(out.detach().cpu()[keep], ref.detach()[keep])}
    for key in mine:
        grad = mine[key].grad
        errors[f"d{key}"] = float("nan") if grad is None or not torch.isfinite(grad).all() else rel_err(
            grad.cpu(), theirs[key].grad)
    return dict(errors=errors, ties=int((~keep).sum()), finite=bool(torch.isfinite(out).all()))


def near_ties(name, z, tokens, params):
    """Rows whose selection is a near-tie (a score within TIE of the filter's edge), which rounding may flip."""
    import torch

    pos = torch.arange(tokens)
    earlier = pos[None, :] < pos[:, None]
    if name == "sieve-window":
        rowmax = torch.where(earlier, z, torch.full_like(z, float("-inf"))).amax(-1, keepdim=True)
        return (((z - (rowmax - params["eps"])).abs() < TIE * (1 + rowmax.abs())) & earlier).any(-1)
    if name in ("sieve", "entmax"):
        visible = earlier if name == "sieve" else pos[None, :] <= pos[:, None]
        x = torch.where(visible, z / 2, torch.full_like(z, float("-inf")))
        lo = entmax_threshold64(x, 1.5)
        return (((x - lo[..., None]).abs() < TIE * (1 + lo.abs()[..., None])) & visible).any(-1)
    return torch.zeros(z.shape[:-1], dtype=torch.bool)


# Sieve's threshold alone (``short_rows.sieve_threshold``, the training step's before the long-context walk) against the
# float64 one, (tokens, head_dim, extras) as above: every launch of the row ranges, the two tiles of a range the tokens
# cut short (70, 131), row blocks of 16 ("bm16")
THRESHOLD_SHAPES = [(17, 16, ""), (40, 16, "walk-bm16"), (70, 16, "alibi"), (131, 16, "alibi"), (131, 32, "walk"),
                    (131, 16, "alibi-nt"), (70, 16, "walk-bm16-nt")]


def run_threshold_case(shape) -> dict:
    """``|tau - tau64| / (1 + |tau64|)`` over the rows that see a key, and whether row 0 (none) got ``+inf``."""
    import torch

    from lengthbench.kernels.entmax import short_rows

    tokens, head_dim, extras = shape
    gen = torch.Generator().manual_seed(7 * tokens + head_dim)
    q, k = (torch.randn(2, 2, tokens, head_dim, generator=gen) for _ in range(2))
    sm_scale = 1.0 / math.sqrt(head_dim)
    if "walk" in extras:
        q[..., 0] = 1.0
        k[..., 0] = -8.0 / sm_scale
    slopes = row_scale = None
    z = torch.matmul(q.double(), k.double().transpose(-1, -2)) * sm_scale
    if "alibi" in extras:
        slopes = torch.tensor([0.5, 0.0625])
        row_scale = 0.5 + torch.rand(2, 2, tokens, generator=gen)
        pos = torch.arange(tokens)
        z = (z - slopes.double()[:, None, None] * (pos[:, None] - pos[None, :]).double()) * row_scale.double()[..., None]
    tuning = {**({"bm": 16} if "bm16" in extras else {}), **({"newton_tol": 3e-2} if "nt" in extras.split("-") else {})}
    tau = short_rows.sieve_threshold(q, k, slopes=slopes, row_scale=row_scale, sm_scale=sm_scale, tuning=tuning)
    pos = torch.arange(tokens)
    x = torch.where(pos[None, :] < pos[:, None], z / 2, torch.full_like(z, float("-inf")))
    ref = entmax_threshold64(x, 1.5)
    err = ((tau[..., 1:].double() - ref[..., 1:]).abs() / (1 + ref[..., 1:].abs())).max().item() if tokens > 1 else 0.0
    return dict(errors={"tau": err}, ties=0, finite=bool(torch.isinf(tau[..., 0]).all()))


# Newton's tolerance before the exact root (``newton_tol``): (tokens, head_dim, score scale, extras); "walk" as above
NEWTON_SHAPES = [(131, 16, 1.0, ""), (131, 16, 4.0, ""), (91, 32, 0.5, ""), (131, 16, 1.0, "walk"),
                 (83, 16, 8.0, "alibi")]
NEWTON_TOLS = (3e-2, 0.3)


def run_newton_case(shape) -> dict:
    """Sieve's threshold and 1.5-entmax's output with Newton's steps to each of :data:`NEWTON_TOLS` before the exact
    root, against both with steps to 1e-6: the largest ``|tau - tau_1e-6| / (1 + |tau_1e-6|)`` and ``|out -
    out_1e-6|`` over the tolerances."""
    import torch

    from lengthbench.kernels.entmax import short_rows

    tokens, head_dim, scale, extras = shape
    gen = torch.Generator().manual_seed(11 * tokens + head_dim)
    q, k, v = (torch.randn(2, 2, tokens, head_dim, generator=gen) for _ in range(3))
    q = q * scale
    sm_scale = 1.0 / math.sqrt(head_dim)
    if "walk" in extras:
        q[..., 0] = 1.0
        k[..., 0] = -8.0 / sm_scale
    slopes = row_scale = None
    if "alibi" in extras:
        slopes = torch.tensor([0.5, 0.0625])
        row_scale = 0.5 + torch.rand(2, 2, tokens, generator=gen)
    given = dict(slopes=slopes, row_scale=row_scale, sm_scale=sm_scale)

    def both(tol):
        tuning = {"newton_tol": tol}
        return (short_rows.sieve_threshold(q, k, tuning=tuning, **given),
                short_rows.entmax_short_rows(q, k, v, tuning=tuning, **given))

    tau0, out0 = both(1e-6)
    seen = torch.isfinite(tau0)
    errors = {"tau": 0.0, "out": 0.0}
    for tol in NEWTON_TOLS:
        tau, out = both(tol)
        errors["tau"] = max(errors["tau"], ((tau - tau0)[seen].abs() / (1 + tau0[seen].abs())).max().item())
        errors["out"] = max(errors["out"], (out - out0).abs().max().item())
    return dict(errors=errors, ties=0, finite=bool(torch.equal(seen, torch.isfinite(tau))))


def all_cases() -> list:
    """The op cases, the threshold cases, then the cases of Newton's tolerance (the worker's indices run over all)."""
    return [*cases(), *[("threshold", *shape) for shape in THRESHOLD_SHAPES],
            *[("newton", *shape) for shape in NEWTON_SHAPES]]


@pytest.fixture(scope="module")
def measured() -> dict[int, dict]:
    return interpreter_results(str(Path(__file__).resolve()), len(all_cases()))


@needs_triton
@pytest.mark.parametrize("index", range(len(THRESHOLD_SHAPES)),
                         ids=[f"T{t}-D{d}{'-' + e if e else ''}" for t, d, e in THRESHOLD_SHAPES])
def test_sieve_threshold_matches_float64(index, measured):
    result = measured[len(cases()) + index]
    print(THRESHOLD_SHAPES[index], result["errors"])
    assert result["finite"], "row 0 (no key to see) must get +inf"
    assert result["errors"]["tau"] <= 1e-5, result["errors"]


@needs_triton
@pytest.mark.parametrize("index", range(len(NEWTON_SHAPES)),
                         ids=[f"T{t}-D{d}-x{s:g}{'-' + e if e else ''}" for t, d, s, e in NEWTON_SHAPES])
def test_newton_tolerance_leaves_the_threshold_as_it_was(index, measured):
    """Newton's steps to a coarse tolerance, then the exact root on their support (or more steps where it fails):
    the threshold that steps to 1e-6 give, within float32 rounding."""
    result = measured[len(cases()) + len(THRESHOLD_SHAPES) + index]
    print(NEWTON_SHAPES[index], result["errors"])
    assert result["finite"]
    assert result["errors"]["tau"] <= 1e-6 and result["errors"]["out"] <= 1e-5, result["errors"]


@needs_triton
@pytest.mark.parametrize("index", range(len(cases())), ids=[case_id(c) for c in cases()])
def test_short_rows_kernel_matches_float64_reference(index, measured):
    result = measured[index]
    print(case_id(cases()[index]), " ".join(f"{key}={value:.1e}" for key, value in result["errors"].items()))
    assert result["finite"], "NaN/inf in the output"
    assert result["ties"] <= max(1, cases()[index][1] // 50)  # rows at a filter's edge, left out of the comparison
    for key, value in result["errors"].items():
        assert value <= TOLERANCE, (key, result["errors"])


GPU_SHAPES = [(17, 32, ""), (64, 32, "alibi"), (91, 32, "walk"), (131, 64, "alibi"), (256, 32, "walk-alibi"),
              (200, 64, "bm16"), (91, 32, "alibi-blocks"), (83, 16, "walk"), (131, 16, "alibi"), (83, 16, "walk-bd32"),
              (131, 16, "alibi-bd32-own64"),
              (91, 32, "alibi-rowwise"), (131, 16, "walk-alibi-rowwise"),
              (256, 32, "alibi-rowwise"), (83, 16, "rowwise"), (131, 16, "walk-alibi-rowwise-rwtwo"),
              (131, 32, "alibi-rowwise-rwtiles-rwtwo"), (131, 16, "alibi-nt"), (91, 32, "walk-nt"),
              (131, 16, "walk-alibi-rowwise-nt"), (256, 32, "alibi-nt")]
GPU_TOLERANCE = {"float32": (2e-3, 2e-3), "bfloat16": (2.5e-2, 5e-2)}  # (output, gradients), test_kernels.py's


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op, shape", [(op, shape) for op in OPS for shape in for_op(op, GPU_SHAPES)],
                         ids=lambda p: p if isinstance(p, str) else f"T{p[0]}-D{p[1]}{'-' + p[2] if p[2] else ''}")
def test_short_rows_kernel_on_the_gpu(op, shape, dtype):
    import torch

    result = run_case((op, *shape), device="cuda", dtype=getattr(torch, dtype))
    print(op, shape, dtype, " ".join(f"{key}={value:.1e}" for key, value in result["errors"].items()))
    out_tol, grad_tol = GPU_TOLERANCE[dtype]
    # rows at a filter's edge (within TIE, more of them in bf16 and at 256 tokens) are left out of the comparison
    assert result["finite"] and result["ties"] <= max(2, 2 * 2 * shape[0] // 50)
    for key, value in result["errors"].items():
        assert value <= (out_tol if key == "out" else grad_tol), (key, result["errors"])


@pytest.mark.parametrize("tuning, message", [
    ({"bd": 8}, "bd must be a power of two >= 16"), ({"bd": 48}, "bd must be a power of two"),
    ({"widths": {"64": {"rows": "whole"}}}, "widths[64] takes"), ({"widths": {"32": {"bwd_bm": 24}}}, "bwd_bm"),
    ({"block": 32}, "unknown tuning keys"), ({"entmax_backward": "dense"}, "entmax_backward must be auto, narrow or rowwise"),
    ({"rowwise_bwd": [24, 32, 4]}, "powers of two"), ({"rowwise_fused": 1}, "rowwise_fused must be true or false"),
    ({"newton_tol": 0}, "newton_tol must be a number"), ({"newton_tol": 1}, "newton_tol must be a number"),
    ({"newton_tol": True}, "newton_tol must be a number"), ({"newton_tol": "1e-3"}, "newton_tol must be a number")])
def test_bad_tuning_is_refused(tuning, message):
    import torch

    from lengthbench.kernels.entmax import short_rows
    from lengthbench.kernels.utils.common import Problem

    q = torch.zeros(1, 1, 40, 16)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        short_rows._launch(Problem(q, q, q, None, None, None), tuning)


def test_launch_settings_follow_the_tuning():
    import torch

    from lengthbench.kernels.entmax import short_rows
    from lengthbench.kernels.utils.common import Problem

    q = torch.zeros(1, 1, 100, 16)
    fwd, bwd, layout = short_rows._launch(Problem(q, q, q, None, None, None),
                                      {"bd": 32, "widths": {"128": {"bm": 16, "warps": 8}}, "bwd_warps": 2})
    assert layout == "blocks" and [part["TP"] for part in fwd] == [32, 64, 128]
    assert {part["BD"] for part in fwd + bwd} == {32}
    assert (fwd[-1]["BM"], fwd[-1]["num_warps"], fwd[-1]["M0"]) == (16, 8, 4)
    assert (bwd[-1]["BM"], bwd[-1]["num_warps"]) == (16, 2)
    assert fwd[0]["num_warps"] == 2 and fwd[0]["BM"] == 16  # 1.5-entmax's rows of at most 128 keys


def test_a_range_the_tokens_cut_short_goes_against_two_tiles():
    import torch

    from lengthbench.kernels.entmax import short_rows
    from lengthbench.kernels.utils.common import Problem

    assert short_rows._row_ranges(131, True) == [(0, 32, 32, 0), (32, 64, 64, 0), (64, 128, 128, 0), (128, 131, 128, 16)]
    assert short_rows._row_ranges(131, True, tail=False)[-1] == (128, 131, 256, 0)
    assert short_rows._row_ranges(83, True)[-1] == (64, 83, 64, 32)
    assert short_rows._row_ranges(100, True)[-1] == (64, 100, 128, 0)  # 36 rows: 64 + 64 keys would be no fewer
    assert short_rows._row_ranges(200, True)[-1] == (128, 200, 256, 0)
    assert short_rows._row_ranges(131, False) == [(0, 131, 256, 0)]
    q = torch.zeros(1, 1, 131, 16)
    fwd, bwd, _ = short_rows._launch(Problem(q, q, q, None, None, None), {"widths": {"256": {"bwd_warps": 8}}})
    assert [(part["TP"], part["TW"], part["BM"], part["M0"]) for part in fwd][-1] == (128, 16, 16, 8)
    assert (fwd[-1]["num_warps"], bwd[-1]["num_warps"], bwd[-2]["num_warps"]) == (2, 8, 2)


def test_entmax_backward_is_rowwise_where_there_is_a_row_scale_past_128_keys():
    import torch

    from lengthbench.kernels.entmax import short_rows
    from lengthbench.kernels.utils.common import Problem

    q = torch.zeros(1, 1, 131, 16)
    scale = torch.ones(1, 1, 131)
    assert short_rows._launch(Problem(q, q, q, None, scale, None), None)[2] == "rowwise"
    assert short_rows._launch(Problem(q, q, q, None, None, None), None)[2] == "blocks"
    short = q[:, :, :128]
    assert short_rows._launch(Problem(short, short, short, None, scale[..., :128], None), None)[2] == "blocks"
    assert short_rows._launch(Problem(q, q, q, None, None, None), {"entmax_backward": "rowwise"})[2] == "rowwise"
    assert short_rows._launch(Problem(q, q, q, None, scale, None), {"entmax_backward": "narrow"})[2] == "blocks"
    # the rowwise backward's own tiles: the defaults, or rowwise_bwd's
    assert short_rows._launch(Problem(q, q, q, None, scale, None), None)[1] == (64, 64, 4)
    assert short_rows._launch(Problem(q, q, q, None, scale, None), {"rowwise_bwd": [32, 64, 2]})[1] == (32, 64, 2)


if __name__ == "__main__":
    for index in [int(i) for i in sys.argv[1].split(",") if i]:
        case = all_cases()[index]
        runner = {"threshold": run_threshold_case, "newton": run_newton_case}.get(case[0])
        record = runner(case[1:]) if runner else run_case(case)
        print(json.dumps({"case": index, **record}), flush=True)
