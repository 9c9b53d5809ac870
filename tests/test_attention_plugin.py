"""The example plugin of docs/plugins.md registers a mechanism that the decoder and the reference use."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from lengthbench import attention_weights
from lengthbench.models.attention import ATTENTION
from lengthbench.models.decoder import Decoder, ModelConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example():
    """Import ``examples/my_attention.py`` as a user's ``--plugin my_attention`` would (once per process:
    registering a name twice is an error)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("my_attention")


def test_example_plugin_registers_and_trains():
    load_example()
    assert "sigmoid" in ATTENTION
    scores = torch.randn(5, 5)
    w = attention_weights("sigmoid", scores)
    expected = torch.sigmoid(scores - torch.log(torch.arange(1, 6.0))[:, None]).tril()
    torch.testing.assert_close(w, expected)

    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, ffn=32, attn="sigmoid", pe="nape"))
    ids = torch.randint(0, 8, (4, 9))
    logits = model(ids)
    assert logits.shape == (4, 9, 8)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad and p is not model.embed.weight)
    model.set_query_chunk(4)
    torch.testing.assert_close(model(ids), logits)


def test_lengthbench_run_with_a_plugin_mechanism(tmp_path):
    """The README's route in fresh processes: its ``lengthbench run ... --plugin examples/my_attention.py`` (the
    file, no PYTHONPATH; on a small budget); a later ``inspect`` without the plugin says which one to load; an
    unknown plugin is one line, exit 2."""
    import os
    import shlex
    import subprocess

    import pandas as pd

    readme = (EXAMPLES.parent / "README.md").read_text()
    (line,) = [line for line in readme.splitlines() if line.startswith("lengthbench run ") and "--plugin" in line]
    plugin = str(EXAMPLES / "my_attention.py")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    lengthbench = [sys.executable, "-m", "lengthbench.cli"]
    readme_run = [*lengthbench, *[plugin if arg == "examples/my_attention.py" else arg for arg in shlex.split(line)[1:]]]
    small = ["--train-samples", "320", "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--quiet",
             "--results", str(tmp_path)]
    done = subprocess.run([*readme_run, *small], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pd.concat(pd.read_parquet(p) for p in (tmp_path / "runs").glob("*.parquet"))
    assert set(rows["attn"]) == {"sigmoid"} and list(rows["multiplier"]) == [1, 2]
    assert set(rows["plugins"]) == {f"my_attention@{EXAMPLES}"}

    inspect = [*lengthbench, "inspect", "maps", "--run", rows["run_id"].iloc[0], "--length", "16", "--results",
               str(tmp_path), "--out", str(tmp_path / "maps")]
    hint = subprocess.run(inspect, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert hint.returncode == 2 and hint.stderr.strip().splitlines() == [
        f"error: run {rows['run_id'].iloc[0]} uses the mechanism 'sigmoid', which no loaded module registers; "
        f"load its plugin: --plugin {plugin}"], hint.stderr

    missing = subprocess.run([*lengthbench, "run", "--task", "copy", "--attn", "sigmoid", "--pe", "none", *small,
                              "--plugin", "no_such_module"], env=env, capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert missing.returncode == 2 and "no_such_module" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_one_registration_gives_module_and_weights(monkeypatch):
    """A mechanism is registered once, on its module, with its weight function: both registries read it, and
    the old second registration of the weight function alone says what to do instead."""
    import pytest

    from lengthbench.models.attention import (
        MECHANISMS,
        WEIGHT_FUNCTIONS,
        AttentionLayer,
        causal_mask,
        register_attention,
    )

    builtin = ["softmax", "gated", "ssmax", "assmax", "adatemp", "entmax", "sparsemax", "sentmax", "asentmax",
               "stickbreaking", "sieve", "sieve-window", "softpick", "scalable-softpick", "rectified", "rela", "tra",
               "tda", "diffsoftmax"]
    assert ATTENTION.names() == MECHANISMS.names() and set(builtin) <= set(WEIGHT_FUNCTIONS.names())
    for name in ATTENTION.names():
        entry = MECHANISMS.get(name)
        assert ATTENTION.get(name) is entry.module and entry.module.name == name
        if name in builtin:
            assert WEIGHT_FUNCTIONS.get(name) is entry.weights is not None
    monkeypatch.setattr(MECHANISMS, "_entries", dict(MECHANISMS._entries))  # the registration below is undone

    def doubled(scores, mask, query_positions=None):
        return 2 * attention_weights("softmax", scores)

    @register_attention("test-doubled", weights=doubled)
    class Doubled(AttentionLayer):
        def weights(self, scores, query_positions, x_rows):
            return doubled(scores, causal_mask(query_positions, scores.shape[-1]), query_positions)

    scores = torch.randn(4, 4)
    torch.testing.assert_close(attention_weights("test-doubled", scores), 2 * attention_weights("softmax", scores))
    assert ATTENTION.get("test-doubled") is Doubled and "test-doubled" in WEIGHT_FUNCTIONS
    with pytest.raises(TypeError, match="weights="):
        WEIGHT_FUNCTIONS.register("other")
    with pytest.raises(TypeError, match="not an AttentionLayer"):
        register_attention("not-a-layer", weights=doubled)(doubled)
    with pytest.raises(ValueError, match="already registered"):
        register_attention("test-doubled", weights=doubled)(Doubled)


def test_example_plugin_with_a_kernel(monkeypatch, request):
    """``examples/my_attention_with_kernel.py`` loaded as ``--plugin FILE`` loads it: one registration gives the
    mechanism its module, its weights and its fused op; the op (query blocks smaller than the rows, ALiBi slopes and
    a row scale) computes the weights' output in float64; the module calls it where a kernel runs; and the command
    line lists the mechanism."""
    import subprocess

    from lengthbench import kernels
    from lengthbench.models.attention import KERNELS, get_kernel, registry
    from lengthbench.models.positional import build_pe
    from lengthbench.plugins import load_plugin

    # the registration lasts for this test only: the other tests see the package's mechanisms
    monkeypatch.setattr(registry.MECHANISMS, "_entries", dict(registry.MECHANISMS._entries))
    monkeypatch.setattr(registry, "_KERNEL_OF", dict(registry._KERNEL_OF))
    request.addfinalizer(lambda: sys.modules.pop("my_attention_with_kernel", None))
    module = sys.modules[load_plugin(str(EXAMPLES / "my_attention_with_kernel.py"))]
    assert KERNELS.get("sigmoid-op") is module.sigmoid_attention
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 11, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([0.5, 0.0], dtype=torch.float64)
    row_scale = 0.5 + torch.rand(2, 2, 11, generator=gen, dtype=torch.float64)
    pos = torch.arange(11)
    z = (q @ k.transpose(-1, -2) / 2.0 - slopes[:, None, None] * (pos[:, None] - pos)) * row_scale[..., None]
    want = attention_weights("sigmoid-op", z) @ v
    torch.testing.assert_close(module.sigmoid_attention(q, k, v, slopes=slopes, row_scale=row_scale, block=4), want)

    monkeypatch.setattr(kernels, "triton_available", lambda: True)  # as on a GPU: the registered op is taken
    layer = ATTENTION.get("sigmoid-op")(8, 2, build_pe("none", 2, 8))
    assert layer.dispatches_to_kernel() and get_kernel("sigmoid-op") is not None
    torch.testing.assert_close(layer.kernel()(q, k, v), module.sigmoid_attention(q, k, v))

    listed = subprocess.run([sys.executable, "-m", "lengthbench.cli", "attn", "list", "--plugin",
                             str(EXAMPLES / "my_attention_with_kernel.py")], capture_output=True, text=True,
                            timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert "sigmoid-op" in listed.stdout and "Sigmoid attention with a fused op of its own" in listed.stdout
