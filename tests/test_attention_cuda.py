"""On CUDA, each module's fast path (fused kernel, SDPA, or the reference where neither exists) against
its reference path: outputs and gradients, every mechanism with every encoding. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from lengthbench.models.attention import ATTENTION
from lengthbench.models.positional import POSITIONAL_ENCODINGS, build_pe

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pe", POSITIONAL_ENCODINGS.names())
@pytest.mark.parametrize("name", ATTENTION.names())
@pytest.mark.parametrize("tokens", [1, 77, 300])
def test_fast_path_matches_reference(name, pe, tokens):
    fast_path_matches_reference(name, pe, tokens)


@pytest.mark.parametrize("name", ["ssmax", "assmax", "sentmax", "asentmax", "scalable-softpick"])
@pytest.mark.parametrize("tokens", [77, 300])
def test_fast_path_scaled_heads_nope(name, tokens):
    """``scaled_heads=nope`` under NAPE: the factor reaches the kernels (or SDPA) only on the NoPE heads."""
    fast_path_matches_reference(name, "nape", tokens, scaled_heads="nope")


@pytest.mark.parametrize("tokens", [77, 300])
def test_stickbreaking_remainder_dropped_runs_its_reference(tokens):
    """Stick-breaking's ``remainder="drop"`` has no fused kernel: on CUDA it runs the dense reference, never the
    diagonal's kernel."""
    layer = ATTENTION.get("stickbreaking")(64, 4, build_pe("none", 4, 16), remainder="drop")
    assert not layer.dispatches_to_kernel()
    fast_path_matches_reference("stickbreaking", "none", tokens, remainder="drop")


@pytest.mark.parametrize("pe", ["none", "alibi"])
@pytest.mark.parametrize("remainder", ["diagonal", "drop"])
@pytest.mark.parametrize("tokens", [1, 77, 300])
def test_sieve_remainders_run_the_fused_op(remainder, pe, tokens):
    """Sieve's fused op computes both remainders: the module dispatches to it and matches its reference."""
    layer = ATTENTION.get("sieve")(64, 4, build_pe(pe, 4, 16), remainder=remainder)
    assert layer.dispatches_to_kernel()
    fast_path_matches_reference("sieve", pe, tokens, remainder=remainder)


def fast_path_matches_reference(name, pe, tokens, **params):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    layer = ATTENTION.get(name)(64, 4, build_pe(pe, 4, 16), **params).cuda()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    x = torch.randn(2, tokens, 64, device="cuda")

    def run(use_kernels):
        layer.use_kernels = use_kernels
        layer.zero_grad()
        inputs = x.clone().requires_grad_()
        out = layer(inputs)
        out.backward(torch.cos(torch.arange(out.numel(), device="cuda").view_as(out).float()))
        grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
        return out.detach(), inputs.grad, grads

    fast, fast_dx, fast_grads = run(True)
    ref, ref_dx, ref_grads = run(False)
    torch.testing.assert_close(fast, ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(fast_dx, ref_dx, rtol=5e-3, atol=5e-3)
    assert fast_grads.keys() == ref_grads.keys()
    for key in ref_grads:
        torch.testing.assert_close(fast_grads[key], ref_grads[key], rtol=1e-2, atol=1e-2, msg=f"grad of {key}")


@pytest.mark.parametrize("pe", ["rope", "alibi"])
@pytest.mark.parametrize("name", ATTENTION.names())
def test_fast_path_under_bf16_autocast(name, pe):
    """As the runner trains and evaluates on CUDA (bf16 autocast, where normalised or rotated q and k come out
    in fp32 beside bf16 values): the fast path runs, stays finite and close to the reference path under the
    same autocast. "Close" is 5%, or twice what bf16 itself moves the reference (fp32 vs bf16 reference):
    some maps are ill-conditioned there (ReLA + ALiBi: rows with almost no weight, rescaled by the head
    norm, move the input gradient by ~50% on a CPU as well)."""
    torch.manual_seed(0)
    layer = ATTENTION.get(name)(64, 4, build_pe(pe, 4, 16)).cuda()
    x = torch.randn(2, 300, 64, device="cuda")

    def run(use_kernels, bf16=True):
        layer.use_kernels = use_kernels
        layer.zero_grad()
        inputs = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = layer(inputs)
        out.float().sum().backward()
        return out.float().detach(), inputs.grad

    def rel(a, b):
        return ((a - b).norm() / (b.norm() + 1e-6)).item()

    fast, fast_dx = run(True)
    ref, ref_dx = run(False)
    exact, exact_dx = run(False, bf16=False)
    assert torch.isfinite(fast).all() and torch.isfinite(fast_dx).all()
    assert rel(fast, ref) <= max(0.05, 2 * rel(ref, exact))
    assert rel(fast_dx, ref_dx) <= max(0.05, 2 * rel(ref_dx, exact_dx))


@pytest.mark.parametrize("tokens, grads", [(150, True), (4096, True), (70_000, False)])
def test_sdpa_alibi_channels_in_bfloat16_against_float64(monkeypatch, tokens, grads):
    """softmax/SSMax with an ALiBi bias through SDPA in bfloat16 (``kernels/utils/sdpa.py``), the bias as query/key
    channels against the explicit mask, each measured against float64 scores: at a training width (150) with
    gradients to q, k, v, the slopes and the row factor; at 4,096 with gradients to q, k, v; at 70,000 (three
    position parts) the forward of sampled rows. Slopes from NAPE's 1 to ALiBi's smallest, a growing row factor."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    gen = torch.Generator(device="cuda").manual_seed(3)
    heads, dim = 4, 32
    q, k, v = (torch.randn(1, heads, tokens, dim, device="cuda", generator=gen).bfloat16() for _ in range(3))
    pos = torch.arange(tokens, device="cuda", dtype=torch.float64)
    slopes = torch.tensor([0.0, 1.0, 1 / 64, 2.0 ** -12], device="cuda")
    rs = (0.3 * torch.log(pos + 2))[None, None].expand(1, heads, tokens).float().contiguous()
    factor_grads = tokens <= 256
    rows = torch.arange(tokens, device="cuda") if tokens <= 4096 else torch.tensor(
        [0, 1, 255, 256, 257, 4095, 65535, 65536, 65537, tokens - 1], device="cuda")
    weight = torch.randn(1, heads, len(rows), dim, device="cuda", dtype=torch.float64, generator=gen)

    def run(inputs):
        """float64 inputs: the reference; others: sdpa_attend. Output rows and gradients."""
        q_, k_, v_, sl, r = inputs
        if q_.dtype == torch.float64:
            z = (q_[:, :, rows] @ k_.transpose(-1, -2)) / dim ** 0.5 - sl[:, None, None] * (rows[:, None] - pos)
            z = (z * r[:, :, rows, None]).masked_fill(pos[None, :] > rows[:, None], float("-inf"))
            out = torch.softmax(z, -1) @ v_
        else:
            out = _sdpa.sdpa_attend(q_, k_, v_, sl, row_scale=r)[:, :, rows]
        if not grads:
            return {"out": out.double()}
        leaves = inputs if factor_grads else inputs[:3]
        got = torch.autograd.grad((out.double() * weight).sum(), leaves)
        return {"out": out.double(), **dict(zip(("dq", "dk", "dv", "dslopes", "drs"), got, strict=False))}

    def leaves(dtype, low):
        return [t.to(dtype if i < 3 else low).requires_grad_(grads and (i < 3 or factor_grads))
                for i, t in enumerate((q, k, v, slopes, rs))]

    with torch.set_grad_enabled(grads):
        expected = run(leaves(torch.float64, torch.float64))
        errors = {}
        as_channels = _sdpa.alibi_as_channels
        for mode in ("keys", "mask"):  # the bias as channels where they apply, and as an explicit mask
            monkeypatch.setattr(_sdpa, "alibi_as_channels", as_channels if mode == "keys" else lambda *a: False)
            got = run(leaves(torch.bfloat16, torch.float32))
            errors[mode] = {key: ((got[key].double() - value).abs().max() / value.abs().max().clamp_min(1e-2)).item()
                            for key, value in expected.items()}
    print(f"ERR sdpa-alibi tokens={tokens} keys={errors['keys']} mask={errors['mask']}")
    for key, mask_error in errors["mask"].items():
        assert errors["keys"][key] <= max(1.5 * mask_error, 1e-2), (key, errors)


@pytest.mark.parametrize("dim, tokens, alibi", [(16, 131, False), (32, 91, False), (32, 91, True), (64, 1000, False)])
def test_sdpa_against_float64(dim, tokens, alibi):
    """The softmax family's SDPA calls (``kernels/utils/sdpa.py``) in bfloat16 against float64 scores, output and
    gradients to q, k, v (and the ALiBi slopes through the bias channels), at the paper models' head dims and
    training widths."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    gen = torch.Generator(device="cuda").manual_seed(5)
    heads = 4
    q, k, v = (torch.randn(3, heads, tokens, dim, device="cuda", generator=gen, dtype=torch.float64)
               for _ in range(3))
    slopes = torch.tensor([1.0, 0.5, 1 / 64, 0.0], device="cuda", dtype=torch.float64) if alibi else None
    weight = torch.randn(3, heads, tokens, dim, device="cuda", generator=gen, dtype=torch.float64)
    pos = torch.arange(tokens, device="cuda", dtype=torch.float64)

    def reference(q_, k_, v_, sl):
        z = q_ @ k_.transpose(-1, -2) / dim ** 0.5
        if sl is not None:
            z = z - sl[:, None, None] * (pos[:, None] - pos)
        return torch.softmax(z.masked_fill(pos[None, :] > pos[:, None], float("-inf")), -1) @ v_

    def grads(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        sl = None if slopes is None else slopes.float().requires_grad_()
        out = fn(*leaves, sl)
        got = torch.autograd.grad((out.double() * weight).sum(), leaves + ([sl] if sl is not None else []))
        return [out.double(), *(g.double() for g in got)]

    expected = grads(reference, torch.float64)
    got = grads(lambda a, b, c, sl: _sdpa.sdpa_attend(a, b, c, sl), torch.bfloat16)
    for name, g, e in zip(("out", "dq", "dk", "dv", "dslopes"), got, expected, strict=False):
        error = ((g - e).abs().max() / e.abs().max().clamp_min(1e-2)).item()
        assert error < 2e-2, f"{name}: {error:.3g}"
