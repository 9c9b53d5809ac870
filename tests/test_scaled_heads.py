"""``scaled_heads``: which heads a length-scaled mechanism (SSMax, ASSMax, SEntmax, ASEntmax, scalable-softpick)
scales. ``all`` scales every head's scores, an ALiBi head's bias included; ``nope`` (the default of SSMax, ASSMax and
ASEntmax) scales only the heads without an ALiBi slope under NAPE, as the sparse-attention authors' code does."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import cli

from lengthbench.config import RunConfig
from lengthbench.models.attention import ATTENTION
from lengthbench.models.attention.base import causal_mask
from lengthbench.models.positional import build_pe

SCALED = ["ssmax", "assmax", "sentmax", "asentmax", "scalable-softpick"]
BASE = {"ssmax": "softmax", "assmax": "softmax", "sentmax": "entmax", "asentmax": "entmax",
        "scalable-softpick": "softpick"}


def build(name, pe="nape", scaled_heads="all", n_heads=4, d_model=32, seed=0):
    torch.manual_seed(seed)
    layer = ATTENTION.get(name)(d_model, n_heads, build_pe(pe, n_heads, d_model // n_heads),
                                scaled_heads=scaled_heads)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return layer


def maps(layer, tokens=9):
    x = torch.randn(2, tokens, layer.d_model, generator=torch.Generator().manual_seed(3))
    return layer.attention_map(x), x


@pytest.mark.parametrize("name", SCALED)
def test_nope_leaves_alibi_heads_to_the_base_map(name):
    """Under NAPE the last half of the heads are ALiBi: with ``nope`` they are the base map of the unscaled
    scores (bias included), and the NoPE heads are what ``all`` gives them."""
    every = build(name, scaled_heads="all")
    nope = build(name, scaled_heads="nope")
    nope.load_state_dict(every.state_dict())
    w_all, x = maps(every)
    w_nope, _ = maps(nope)
    alibi = nope.pe.slopes() != 0
    assert alibi.tolist() == [False, False, True, True]
    torch.testing.assert_close(w_nope[:, ~alibi], w_all[:, ~alibi])
    # The base mechanism with the same projections, on the same scores.
    base = ATTENTION.get(BASE[name])(every.d_model, every.n_heads, build_pe("nape", 4, 8))
    base.qkv.load_state_dict(every.qkv.state_dict())
    torch.testing.assert_close(w_nope[:, alibi], base.attention_map(x)[:, alibi])
    # and the scaling did change those heads under ``all``: the test can fail
    assert (w_all[:, alibi] - w_nope[:, alibi]).abs().max() > 1e-3


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("pe", ["none", "rope"])
def test_nope_is_all_without_alibi_heads(name, pe):
    every = build(name, pe=pe, scaled_heads="all")
    nope = build(name, pe=pe, scaled_heads="nope")
    nope.load_state_dict(every.state_dict())
    x = torch.randn(2, 9, every.d_model, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(nope(x), every(x))


@pytest.mark.parametrize("name", ["ssmax", "asentmax"])
def test_nope_gradients_and_rows_sum(name):
    layer = build(name, scaled_heads="nope")
    x = torch.randn(2, 9, layer.d_model, requires_grad=True)
    layer(x).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    weights, _ = maps(layer)
    mask = causal_mask(torch.arange(9), 9)
    assert torch.all(weights[..., ~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


def test_bad_values():
    with pytest.raises(ValueError, match="scaled_heads must be one of"):
        build("ssmax", scaled_heads="alibi")


@pytest.mark.parametrize("name", ["ssmax", "asentmax"])
def test_nope_scales_every_head_where_every_head_has_a_slope(name):
    """Under ALiBi no head is position-free: ``nope`` (the default) scales every head, as ``all``, as the
    sparse-attention authors' code scales every head without NAPE."""
    every = build(name, pe="alibi", scaled_heads="all")
    nope = build(name, pe="alibi", scaled_heads="nope")
    assert nope.scales_every_head and build(name, pe="alibi").scales_every_head
    nope.load_state_dict(every.state_dict())
    x = torch.randn(2, 9, every.d_model, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(nope(x), every(x))


def test_run_id_only_when_given():
    plain = RunConfig(task="copy", attn="ssmax", pe="nape", preset="smoke")
    nope = RunConfig(task="copy", attn="ssmax", pe="nape", preset="smoke", attn_params={"scaled_heads": "nope"})
    assert plain.run_id != nope.run_id


@pytest.mark.parametrize("pe, value, message", [
    ("nape", "both", "scaled_heads must be one of"),
])
def test_cli_bad_value_exits_2_before_training(pe, value, message, tmp_path, monkeypatch, capsys):
    code = cli(monkeypatch, "run", "--task", "copy", "--attn", "ssmax", "--pe", pe, "--preset", "smoke",
               "--attn-param", f"scaled_heads={value}", "--results", tmp_path, "--device", "cpu")
    assert code == 2
    captured = capsys.readouterr()
    assert message in captured.err + captured.out
    assert "steps x batch" not in captured.out
    assert not list(tmp_path.rglob("*.parquet"))
    assert not list(tmp_path.rglob("*"))


@pytest.mark.parametrize("attn, pe, params, noted", [
    ("ssmax", "nape", [], False),  # their default is the authors' nope
    ("asentmax", "nape", [], False),
    ("sentmax", "nape", [], True),  # its default scales every head
    ("ssmax", "nape", ["--attn-param", "scaled_heads=nope"], False),
    ("ssmax", "nape", ["--attn-param", "scaled_heads=all"], False),  # chosen: no note
    ("ssmax", "alibi", [], False),  # every head has a slope: nothing else to choose
    ("ssmax", "rope", [], False),
    ("softmax", "nape", [], False),
])
def test_run_notes_the_default_scaled_heads_under_nape(monkeypatch, capsys, tmp_path, attn, pe, params, noted):
    code = cli(monkeypatch, "run", "--task", "copy", "--attn", attn, "--pe", pe, *params, "--results", tmp_path,
               "--dry-run")
    out = capsys.readouterr().out
    assert code == 0 and "dry run: not started" in out
    assert ("--attn-param scaled_heads=nope" in out) == noted


@pytest.mark.parametrize("name", ["asentmax", "assmax"])
@pytest.mark.parametrize("pe", ["nape", "rope"])
def test_one_product_gives_the_projections_and_the_factor(name, pe):
    """ASEntmax and ASSMax on CUDA take q, k, v and the row factor from one product of x with the qkv weight and
    w_beta, w_gamma side by side (``project_scaled``): the same numbers as the projections apart (float64),
    with trained (nonzero) w_beta and w_gamma, the heads that ``nope`` leaves alone included."""
    layer = build(name, pe=pe, scaled_heads="nope").double()
    x = torch.randn(2, 9, layer.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    q, k, v, factor = layer.project_scaled(x)
    for joint, apart in zip((q, k, v), layer.project(x), strict=True):
        torch.testing.assert_close(joint, apart)
    expected = layer.head_factor(torch.arange(9), x)
    torch.testing.assert_close(factor, expected)
    assert factor.shape == (2, 4, 9, 1)
    # the factor varies by token and head: a product that lost w_beta or w_gamma would fail here
    assert (expected - expected.mean()).abs().max() > 1e-2
    # and the gradients of every weight agree
    grads = torch.autograd.grad((q.sum() + 2 * k.sum() + 3 * v.sum() + (factor * factor).sum()),
                                [layer.qkv.weight, layer.w_beta, layer.w_gamma])
    q2, k2, v2 = layer.project(x)
    apart = torch.autograd.grad((q2.sum() + 2 * k2.sum() + 3 * v2.sum() + (expected * expected).sum()),
                                [layer.qkv.weight, layer.w_beta, layer.w_gamma])
    for joint, sep in zip(grads, apart, strict=True):
        torch.testing.assert_close(joint, sep)
