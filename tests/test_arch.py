"""The decoder's block layouts: ``prenorm`` (the default) and ``gemma2`` (the papers' authors' code)."""

import json

import pytest
import torch
from cli_helpers import cli

from lengthbench.config import RunConfig, build_config
from lengthbench.models.decoder import Decoder, GemmaRMSNorm, ModelConfig
from lengthbench.runner import load_model, run_cell
from lengthbench.store import load_results

SMALL = dict(vocab_size=12, d_model=16, n_layers=2, n_heads=4, ffn=24)


def test_arch_default_reads_back_and_gemma2_is_a_new_run():
    default = build_config("copy", "stickbreaking", "none", "smoke")
    assert default.arch == "prenorm" and default.identity()["arch"] == "prenorm"
    legacy = dict(json.loads(default.to_json()))
    del legacy["arch"]  # a configuration stored before the field existed reads back with the default
    assert RunConfig.from_dict(legacy) == default and RunConfig.from_dict(legacy).run_id == default.run_id
    gemma = build_config("copy", "stickbreaking", "none", "smoke", arch="gemma2")
    assert gemma.identity()["arch"] == "gemma2" and gemma.run_id != default.run_id
    assert RunConfig.from_dict(json.loads(gemma.to_json())) == gemma
    with pytest.raises(ValueError, match="unknown arch 'llama'"):
        build_config("copy", "softmax", "nape", "smoke", arch="llama")
    with pytest.raises(ValueError, match="unknown arch"):
        Decoder(ModelConfig(**SMALL, arch="llama"))


def test_gemma2_layout():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(**SMALL, attn="stickbreaking", pe="none", arch="gemma2"))
    names = [name for name, _ in model.named_parameters()]
    assert not [name for name in names if name.endswith("bias")]  # no biases anywhere
    block = model.blocks[0]
    norms = [m for m in model.modules() if isinstance(m, GemmaRMSNorm)]
    assert len(norms) == 4 * SMALL["n_layers"] + 1  # before and after attention and MLP, and the final norm
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert {"gate", "up", "down"} <= {name for name, _ in block.mlp.named_children()}
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    # the embeddings enter scaled by sqrt(d_model): the first attention layer reads RMSNorm of them, unchanged,
    # and the residual stream starts at sqrt(16) = 4 times the table
    assert torch.allclose(model.embed_inputs(ids), model.embed.weight[ids] * 4.0)
    # Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w)
    norm = block.attn_norm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 0.5, 16))
    x = torch.randn(3, 16)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    logits = model(ids)
    assert logits.shape == (1, 5, SMALL["vocab_size"])
    logits.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    prenorm = Decoder(ModelConfig(**SMALL, attn="stickbreaking", pe="none"))
    assert any(name.endswith("bias") for name, _ in prenorm.named_parameters())  # LayerNorm's and the MLP's
    assert prenorm.embed_scale is None


def test_gemma2_run_trains_stores_and_reloads(tmp_path, monkeypatch):
    config = build_config("2back", "stickbreaking", "none", "smoke", arch="gemma2", train_samples=1600, d_model=32,
                          n_heads=4, ffn=64, n_layers=1, max_multiplier=2, eval_samples=16, val_samples=16,
                          eval_every=25, checkpoint_every=25, diagnostics=False)
    rows = run_cell(config, tmp_path, device="cpu", progress=False)
    assert len(rows) == 2 and json.loads(rows["config_json"].iloc[0])["arch"] == "gemma2"
    stored = load_results(tmp_path)
    assert set(stored["run_id"]) == {config.run_id}
    model, _, reloaded = load_model(tmp_path, config.run_id)
    assert reloaded.arch == "gemma2" and isinstance(model.norm, GemmaRMSNorm)
    assert cli(monkeypatch, "run", "--task", "copy", "--attn", "softmax", "--pe", "nape", "--arch", "llama",
               "--results", str(tmp_path), "--dry-run") == 2


@pytest.mark.parametrize("vocab", [263, 262, 36, 8])
def test_padded_head_gives_the_same_logits_and_gradients(vocab):
    """The head's product through a weight padded to HEAD_ALIGN rows (as on a GPU) equals the plain one, and so
    do the gradients of its input and weight; the logits keep the vocabulary's width."""
    from lengthbench.models.decoder import HEAD_ALIGN, head_logits

    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 16, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 5, vocab, dtype=torch.float64)
    results = []
    for padded in (False, True):
        logits = head_logits(x, weight, padded=padded)
        assert logits.shape == (3, 5, vocab)
        results.append((logits.detach(), *torch.autograd.grad((logits * upstream).sum(), (x, weight))))
    for plain, padded in zip(*results, strict=True):
        torch.testing.assert_close(padded, plain, rtol=1e-12, atol=1e-12)
    if vocab % HEAD_ALIGN:  # the padded product ran on an aligned weight: its logits are a view of wider rows
        assert head_logits(x, weight, padded=True).stride(-2) == vocab + (-vocab % HEAD_ALIGN)
