"""The kernel registry's CPU-side contract (the ops themselves are tested on the GPU in test_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from lengthbench import kernels
from lengthbench.models.attention import KERNELS, get_kernel, kernel_names, load_kernel


def test_ops_get_their_tensors_in_the_dtype_of_the_last():
    """Under bf16 autocast the modules hand fp32 unit q/k beside bf16 v; the op must see one dtype."""
    seen = []

    def op(*tensors, **kwargs):
        seen.append(([t.dtype for t in tensors], kwargs))
        return tensors[0]

    wrapped = kernels._same_dtype(op)
    q = torch.ones(1, dtype=torch.float32)
    v = torch.ones(1, dtype=torch.bfloat16)
    out = wrapped(q, q, v, sm_scale=1.0)
    assert seen[-1] == ([torch.bfloat16] * 3, {"sm_scale": 1.0}) and out.dtype == torch.bfloat16
    wrapped(q, q, q, q, v.float())  # tda's five tensors, already alike: unchanged
    assert seen[-1][0] == [torch.float32] * 5


def test_the_registry_holds_the_ops_that_kernels_defines_and_the_modules_ask_for():
    """The registry against what it is not built from: the public ``*_attention`` functions of the files under
    ``kernels/`` (read from their source) are exactly the registered ops, one per mechanism; and every mechanism
    with an op is one whose module asks for it (``AttentionLayer.kernel_names`` of the registered mechanisms)."""
    pytest.importorskip("triton")
    import ast
    import inspect
    from pathlib import Path

    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.decoder import Decoder, ModelConfig

    root = Path(kernels.__file__).parent
    defined = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(("lengthbench.kernels", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        defined |= {(module, node.name) for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.FunctionDef) and node.name.endswith("_attention")
                    and not node.name.startswith("_")}
    ops = {name: inspect.unwrap(load_kernel(name)) for name in kernel_names()}
    registered = {(op.__module__, op.__name__) for op in ops.values()}
    assert registered == defined and len(registered) == len(ops)
    asked = set()
    for attn in ATTENTION.names():
        model = Decoder(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=4, ffn=16, attn=attn, pe="rope"))
        asked |= set(model.attention_layers[0].kernel_names())
    assert set(ops) <= asked, sorted(set(ops) - asked)


def test_a_kernel_is_registered_with_its_mechanism(monkeypatch):
    """``register_attention(name, weights=fn, kernel=op)``: the op (a function, or its path) is the mechanism's, the
    one its module calls on CUDA and the one a compiled graph's node finds again; a kernel that is neither is
    refused where it is registered."""
    from lengthbench.models.attention import AttentionLayer, register_attention, registry
    from lengthbench.models.attention.softmax import softmax_weights
    from lengthbench.models.positional import build_pe

    calls = []

    def probe_attention(q, k, v, *, slopes=None, row_scale=None, sm_scale=None):
        calls.append(q.shape)
        return v

    monkeypatch.setattr(registry.MECHANISMS, "_entries", dict(registry.MECHANISMS._entries))
    monkeypatch.setattr(registry, "_KERNEL_OF", dict(registry._KERNEL_OF))

    @register_attention("kernel-probe", weights=softmax_weights, kernel=probe_attention)
    class Probe(AttentionLayer):
        """A probe."""

        def weights(self, scores, query_positions, x_rows):
            return softmax_weights(scores, torch.ones(scores.shape[-2:], dtype=torch.bool).tril())

    assert "kernel-probe" in kernel_names() and KERNELS.get("kernel-probe") is probe_attention
    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    layer = Probe(16, 2, build_pe("none", 2, 8))
    q = torch.zeros(1, 2, 5, 8)
    assert layer.dispatches_to_kernel() and get_kernel("kernel-probe") is not None
    assert layer.kernel()(q, q, q) is not None and calls == [q.shape]
    path = kernels.op_path(probe_attention)
    assert path.endswith(":" + probe_attention.__qualname__) and kernels.load_op(path)(q, q, q) is not None
    for bad in ("no-colon", 3):
        with pytest.raises(TypeError, match="kernel must be its fused op or its path"):
            register_attention("kernel-bad", weights=softmax_weights, kernel=bad)(Probe)


def test_unknown_names_get_none():
    assert get_kernel("no-such-mechanism") is None and get_kernel("softmax") is None  # (softmax: no op)
    with pytest.raises(KeyError):
        load_kernel("no-such-mechanism")


@pytest.mark.parametrize("alibi", ["keys", "mask"])
def test_sdpa_attend_row_scale_and_slopes_match_softmax_of_the_scaled_scores(monkeypatch, alibi):
    """The SDPA path of softmax, ssmax/assmax and adatemp: ``softmax(rs_r (q.k s - slope (r - j)))``, the
    bias as key channels and as a mask (also across its query chunks), with gradients to the row factor."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    if alibi == "mask":  # the bias as an explicit mask, where the channels would apply
        monkeypatch.setattr(_sdpa, "alibi_as_channels", lambda *args: False)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([0.5, 0.0625, 0.0], dtype=torch.float64)
    rs = (0.5 + torch.rand(2, 3, 37, generator=gen, dtype=torch.float64)).requires_grad_()
    pos = torch.arange(37)
    z = (q @ k.transpose(-1, -2)) / 8 ** 0.5 - slopes[:, None, None] * (pos[:, None] - pos[None, :])
    z = (z * rs[..., None]).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    expected = torch.softmax(z, -1) @ v
    old = _sdpa.SDPA_BIAS_CHUNK
    try:
        _sdpa.SDPA_BIAS_CHUNK = 16  # three chunks
        got = _sdpa.sdpa_attend(q, k, v, slopes, row_scale=rs)
    finally:
        _sdpa.SDPA_BIAS_CHUNK = old
    torch.testing.assert_close(got, expected)
    (g_got,) = torch.autograd.grad(got.sum(), rs)
    (g_exp,) = torch.autograd.grad(expected.sum(), rs)
    torch.testing.assert_close(g_got, g_exp)
    torch.testing.assert_close(_sdpa.sdpa_attend(q, k, v, None, row_scale=rs.detach()),
                               torch.softmax(((q @ k.transpose(-1, -2)) / 8 ** 0.5 * rs.detach()[..., None])
                                             .masked_fill(pos[None, :] > pos[:, None], float("-inf")), -1) @ v)


def _alibi_reference(q, k, v, slopes, rs):
    """float64 ``softmax(rs_r (q.k / sqrt(D) - slope (r - j))) v``, causal."""
    pos = torch.arange(q.shape[-2])
    z = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5 - slopes[:, None, None] * (pos[:, None] - pos[None, :])
    z = (z * rs[..., None]).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    return torch.softmax(z, -1) @ v


def _alibi_case(tokens, seed=2):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 4, tokens, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 4, tokens, 16, generator=gen, dtype=torch.float64)  # wider than q, as diffsoftmax's
    slopes = torch.tensor([0.0, 0.0, 1.0, 1 / 3], dtype=torch.float64)
    rs = 0.5 + torch.rand(1, 4, tokens, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, 4, tokens, 16, generator=gen, dtype=torch.float64)
    return (q, k, v, slopes, rs), weight


@pytest.mark.parametrize("tokens", [37, 300])
def test_sdpa_alibi_channels_are_exact_in_float64(tokens):
    """The bias as query/key channels (``_channels``, taken by 16-bit inputs) computed in float64: output and
    gradients to q, k, v, the row factor and the slopes equal the float64 scores' (the zero channel's
    correction included)."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    inputs, weight = _alibi_case(tokens)
    leaves = [t.clone().requires_grad_() for t in inputs]
    expected = _alibi_reference(*leaves)
    grads_expected = torch.autograd.grad((expected * weight).sum(), leaves)
    leaves = [t.clone().requires_grad_() for t in inputs]
    q, k, v, slopes, rs = leaves
    got = _sdpa._channels(q * rs[..., None], k, v, slopes, None, rs)
    torch.testing.assert_close(got, expected.detach())
    for g, e in zip(torch.autograd.grad((got * weight).sum(), leaves), grads_expected, strict=True):
        torch.testing.assert_close(g, e)


def _rel(a, b):
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-2)).item()


@pytest.mark.parametrize("tokens, grads", [(150, True), (300, False)])
def test_sdpa_alibi_channels_in_bfloat16_match_the_mask(monkeypatch, tokens, grads):
    """bfloat16 inputs take the channels (150 tokens with gradients to the row factor and slopes; 300 tokens,
    two position parts, without): their errors against float64 are no larger than the explicit mask's."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    inputs, weight = _alibi_case(tokens, seed=4)
    q64, k64, v64, slopes64, rs64 = inputs
    q64, k64, v64 = (t.bfloat16().double() for t in (q64, k64, v64))
    leaves = [t.clone().requires_grad_(grads) for t in (q64, k64, v64, slopes64, rs64)]
    expected = _alibi_reference(*leaves)
    grads_expected = torch.autograd.grad((expected * weight).sum(), leaves) if grads else ()
    errors = {}
    as_channels = _sdpa.alibi_as_channels
    for mode in ("keys", "mask"):  # the bias as channels, and as an explicit mask where the channels would apply
        monkeypatch.setattr(_sdpa, "alibi_as_channels", as_channels if mode == "keys" else lambda *args: False)
        bf = [t.bfloat16().requires_grad_(grads) for t in (q64, k64, v64)]
        fl = [t.float().requires_grad_(grads) for t in (slopes64, rs64)]
        assert _sdpa.alibi_as_channels(bf[0], fl[0], fl[1]) == (mode == "keys")
        with torch.set_grad_enabled(grads):
            got = _sdpa.sdpa_attend(*bf, fl[0], row_scale=fl[1])
        errors[mode] = {"out": _rel(got, expected.detach())}
        if grads:
            got_grads = torch.autograd.grad((got.double() * weight).sum(), bf + fl)
            errors[mode].update({name: _rel(g, e) for name, g, e in zip(("dq", "dk", "dv", "dslopes", "drs"),
                                                                         got_grads, grads_expected, strict=True)})
    for key, mask_error in errors["mask"].items():
        assert errors["keys"][key] <= max(1.5 * mask_error, 1e-2), errors


def test_sdpa_alibi_takes_the_mask_where_channels_would_lose_precision():
    """float32 (SDPA may multiply in TF32), float16 past 65,536 positions, and gradients to the row factor past
    256 keys (several position parts) take the explicit mask."""
    from lengthbench.kernels.utils.sdpa import alibi_as_channels

    slopes = torch.ones(2)
    grad_rs = torch.ones(1, 2, 1, requires_grad=True)
    assert not alibi_as_channels(torch.zeros(1, 2, 8, 4), slopes, None)
    assert alibi_as_channels(torch.zeros(1, 2, 8, 4, dtype=torch.bfloat16), slopes, grad_rs)
    assert alibi_as_channels(torch.zeros(1, 2, 300, 4, dtype=torch.bfloat16), slopes, None)
    assert not alibi_as_channels(torch.zeros(1, 2, 300, 4, dtype=torch.bfloat16), slopes, grad_rs)
    with torch.no_grad():
        assert alibi_as_channels(torch.zeros(1, 2, 300, 4, dtype=torch.bfloat16), slopes, grad_rs)
    assert not alibi_as_channels(torch.empty(1, 1, 70_000, 4, dtype=torch.float16), slopes, None)
    assert alibi_as_channels(torch.empty(1, 1, 70_000, 4, dtype=torch.bfloat16), slopes, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sdpa_position_parts_are_exact_and_sum_to_the_position(dtype):
    from lengthbench.kernels.utils.sdpa import position_parts

    tokens = 70_000 if dtype != torch.float16 else 65_000
    parts = position_parts(tokens, dtype)
    assert parts.dtype == dtype and parts.shape[1] == tokens
    assert parts.shape[0] == (1 if dtype == torch.float32 else 3 if tokens > 65_536 else 2)
    assert torch.equal(parts.double().sum(0), torch.arange(tokens, dtype=torch.float64))
    assert position_parts(200, dtype).shape[0] == 1


def test_sdpa_attend_keeps_a_sample_independent_factor_and_its_bias_at_batch_one(monkeypatch):
    """SSMax's factor depends on the position only: given as ``[1, H, T]`` it gives the same output and
    gradients as the factor expanded to every sample, and the ALiBi mask handed to SDPA stays at batch 1
    (measured: ssmax + NAPE evaluating 3.7x slower than softmax + NAPE with a per-sample bias)."""
    from lengthbench.kernels.utils import sdpa as _sdpa

    gen = torch.Generator().manual_seed(1)  # (float64: the bias as an explicit mask)
    q, k, v = (torch.randn(3, 2, 21, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([0.25, 0.5], dtype=torch.float64)
    shared = (0.5 + torch.rand(1, 2, 21, generator=gen, dtype=torch.float64)).requires_grad_()
    masks = []
    real_sdpa = _sdpa.F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        return real_sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(_sdpa.F, "scaled_dot_product_attention", spy)
    got = _sdpa.sdpa_attend(q, k, v, slopes, row_scale=shared)
    assert masks and all(shape[0] == 1 for shape in masks), masks
    expanded = shared.detach().expand(3, 2, 21).clone().requires_grad_()
    expected = _sdpa.sdpa_attend(q, k, v, slopes, row_scale=expanded)
    assert masks[-1][0] == 3
    torch.testing.assert_close(got, expected)
    (g_got,) = torch.autograd.grad(got.sum(), shared)
    (g_exp,) = torch.autograd.grad(expected.sum(), expanded)
    torch.testing.assert_close(g_got, g_exp.sum(0, keepdim=True))
    # A [H, T] factor broadcasts the same way.
    torch.testing.assert_close(_sdpa.sdpa_attend(q, k, v, slopes, row_scale=shared.detach()[0]), expected.detach())


def test_adatemp_temperature_is_the_reference_polynomial():
    """The fused op's ``theta(H)`` against the reference weight function's, entropy by entropy."""
    from lengthbench.kernels.utils.sdpa import temperature
    from lengthbench.models.attention.scaled import ADATEMP_POLY

    entropy = torch.linspace(0.0, 6.0, 601, dtype=torch.float64)
    poly = torch.zeros_like(entropy)
    for coefficient in ADATEMP_POLY:
        poly = poly * entropy + coefficient
    expected = torch.where(entropy > 0.5, poly.clamp_min(1.0), torch.ones_like(poly))
    torch.testing.assert_close(temperature(entropy), expected)
    assert temperature(torch.tensor([0.4, 3.0], dtype=torch.float64))[0] == 1.0


def test_entmax_short_rows_key_takes_the_short_rows_kernels_up_to_their_width(monkeypatch):
    """``entmax_attention``'s ``short_rows`` (the training step's): the short-rows kernels at 256 tokens or fewer
    and alpha 1.5, the long-context op with the other keys elsewhere; without it the long-context op."""
    pytest.importorskip("triton")
    from lengthbench.kernels.entmax import op as entmax

    calls = []
    monkeypatch.setattr(entmax, "entmax_short_rows", lambda *t, **kw: calls.append(("short", kw)) or t[0])
    monkeypatch.setattr(entmax, "_lists_apply", lambda q, tuning: calls.append(("long", tuning)) or True)
    monkeypatch.setattr(entmax.EntmaxListsAttention, "apply", lambda q, *rest: q)
    tuning = {"lists": False, "split": False, "short_rows": True}
    for tokens, alpha in ((256, 1.5), (257, 1.5), (64, 2.0)):
        q = torch.zeros(1, 1, tokens, 4)
        entmax.entmax_attention(q, q, q, alpha=alpha, tuning=tuning)
    assert [kind for kind, _ in calls] == ["short", "long", "long"]
    assert calls[1][1] == {"lists": False, "split": False}
    assert tuning["short_rows"] is True  # the caller's settings are left as they were
    entmax.entmax_attention(torch.zeros(1, 1, 8, 4), torch.zeros(1, 1, 8, 4), torch.zeros(1, 1, 8, 4))
    assert calls[-1] == ("long", {})


@pytest.mark.parametrize("mechanism", kernel_names())
def test_training_step_tuning_reaches_the_op(monkeypatch, mechanism):
    """``load_op(mechanism, tuning)`` calls the op with the training step's launch settings
    (``compile_policy.CAPTURE_TUNING``; none for an op without an entry), the same through a compiled graph's node
    (its JSON text: lists back to tuples)."""
    pytest.importorskip("triton")
    import importlib

    from lengthbench.compile_policy import CAPTURE_TUNING

    module_name, function = KERNELS.get(mechanism).split(":")
    target = importlib.import_module(module_name)
    calls = []
    monkeypatch.setattr(target, function, lambda *t, **kw: calls.append(kw.get("tuning")) or t[0])
    kernels._load_op.cache_clear()
    try:
        tuning = CAPTURE_TUNING.get(mechanism)
        q = torch.zeros(1, 1, 8, 4)
        kernels.load_op(KERNELS.get(mechanism), tuning)(q, q, q)
        kernels.load_op(KERNELS.get(mechanism), kernels._tuning_of(kernels._tuning_key(tuning)))(q, q, q)
    finally:
        kernels._load_op.cache_clear()
    assert calls == [tuning, tuning]


def test_sieve_walk_setting_is_checked_before_any_launch():
    """Sieve's ``walk`` (the stick-breaking walk's launch settings after the threshold): a dict, and only
    where the list path is off (that path walks its open rows on ``sieve_open``'s tiles)."""
    pytest.importorskip("triton")
    from lengthbench.kernels.sieve import sieve_attention

    q = torch.randn(1, 2, 17, 16)
    with pytest.raises(ValueError, match="walk must be a dict"):
        sieve_attention(q, q, q, tuning={"lists": False, "walk": [64, 32, 4, 2]})
    with pytest.raises(ValueError, match="the list path does not take"):
        sieve_attention(q, q, q, tuning={"walk": {"fwd": [64, 32, 4, 2]}})
    with pytest.raises(ValueError, match="threshold must be one of"):
        sieve_attention(q, q, q, tuning={"lists": False, "threshold": "rows"})
    with pytest.raises(ValueError, match="the list path does not take"):
        sieve_attention(q, q, q, tuning={"threshold": "short_rows"})


def test_sieve_short_rows_threshold_takes_rows_up_to_256_keys(monkeypatch):
    """``threshold`` ``short_rows``: ``entmax.short_rows.sieve_threshold`` up to 256 tokens, the threshold search past them."""
    pytest.importorskip("triton")
    from lengthbench.kernels.sieve import op as sieve

    calls = []
    monkeypatch.setattr(sieve, "sieve_threshold", lambda q, k, **kw: calls.append("short_rows") or q[..., 0].float())
    monkeypatch.setattr(sieve, "entmax_threshold", lambda q, k, **kw: calls.append("search") or q[..., 0].float())
    monkeypatch.setattr(sieve.StickBreakingAttention, "apply", lambda q, *rest: q)
    for tokens in (17, 256, 257):
        q = torch.zeros(1, 1, tokens, 4)
        sieve.sieve_attention(q, q, q, tuning={"lists": False, "threshold": "short_rows"})
    sieve.sieve_attention(q, q, q, tuning={"lists": False})
    assert calls == ["short_rows", "short_rows", "search", "search"]


def test_tda_fused_backward_setting_is_checked():
    """TDA's ``fused_bwd`` (dq added atomically by the dk/dv kernel): off by default, a bool when set."""
    pytest.importorskip("triton")
    from lengthbench.kernels.tda.op import _config

    assert _config(32)["fused_bwd"] is False and _config(128, {"fused_bwd": True})["fused_bwd"] is True
    with pytest.raises(ValueError, match="fused_bwd must be true or false"):
        _config(32, {"fused_bwd": "yes"})
    with pytest.raises(ValueError, match="unknown keys"):
        _config(32, {"fused": True})


def test_tda_whole_row_setting_is_checked():
    """TDA's ``rows`` (the one-kernel backward where a head's rows fit one query tile): off by default, else
    ``[BM, BN, warps]`` in powers of two."""
    pytest.importorskip("triton")
    from lengthbench.kernels.tda.op import _config

    assert _config(32)["rows"] is None and _config(32, {"rows": [128, 32, 4]})["rows"] == [128, 32, 4]
    for bad in ([128, 32], [96, 32, 4], "128", [128, 32, 0]):
        with pytest.raises(ValueError, match="rows must be null or"):
            _config(32, {"rows": bad})

