"""The one-CUDA-graph training step (lengthbench/graph_step.py), as far as a CPU can check it.

A CUDA graph records kernels, not Python: a reference that reads a value back to the host (``.item()``, a
Python ``if`` on a tensor) or whose shapes depend on the data (``nonzero``, boolean indexing) cannot be captured.
Fake tensors have no values, so a forward and backward under ``FakeTensorMode`` fails on exactly those
operations: every mechanism's reference runs there as the graph would record it.
"""

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from lengthbench.compile_policy import compiles, trains_dense, trains_in_graph
from lengthbench.config import build_config
from lengthbench.graph_step import GraphStep, graph_optimizer, reference_flags
from lengthbench.models.attention import ATTENTION
from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.models.positional import POSITIONAL_ENCODINGS
from lengthbench.tasks import get_task


def _tiny_model(attn: str, pe: str, has_features: bool = False) -> Decoder:
    return Decoder(ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, ffn=32, attn=attn, pe=pe,
                               has_features=has_features))


def fake_step(model: Decoder) -> torch.Tensor:
    """A forward and backward of ``model`` on its dense references with fake parameters: a data-dependent
    operation raises (DataDependentOutputException, DynamicOutputShapeException) instead of reading a value."""
    for layer in model.attention_layers:
        layer.use_kernels = False
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {name: mode.from_tensor(p) for name, p in model.named_parameters()}
        tokens = torch.zeros(3, 19, dtype=torch.long)
        logits = torch.func.functional_call(model, fake, (tokens,))
        loss = logits.float().logsumexp(-1).mean()
        grads = torch.autograd.grad(loss, list(fake.values()), allow_unused=True)
    assert any(g is not None for g in grads)
    return logits


@pytest.mark.parametrize("pe", ["rope", "nape"])
@pytest.mark.parametrize("attn", ATTENTION.names())
def test_reference_step_reads_nothing_back_and_keeps_static_shapes(attn, pe):
    torch.manual_seed(0)
    assert fake_step(_tiny_model(attn, pe)).shape == (3, 19, 11)


@pytest.mark.parametrize("weights", [
    lambda w: w * w.sum().item(),  # a read-back
    lambda w: w * (2.0 if (w > 0.5).any() else 1.0),  # a Python branch on a value
    lambda w: w.index_put((w.nonzero().unbind(1)), torch.zeros(())),  # a data-dependent shape
])
def test_the_check_fails_a_reference_that_syncs(weights):
    model = _tiny_model("softmax", "rope")
    for layer in model.attention_layers:
        original = layer.weights
        layer.weights = lambda scores, positions, x_rows, original=original: weights(original(scores, positions,
                                                                                               x_rows))
    with pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        fake_step(model)


def test_every_encoding_is_covered_by_the_capture_check():
    assert {"rope", "nape"} <= set(POSITIONAL_ENCODINGS.names())


def test_the_graph_step_is_the_default_on_cuda_only():
    task = get_task("mqrar")
    config = build_config("mqrar", "entmax", "nape", "paper")
    assert config.train_step == "graph-compiled"
    assert config.identity()["train_step"] == "graph-compiled"  # a run id hashes the whole configuration
    model = _tiny_model("entmax", "nape")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert trains_in_graph(config, cuda) and not trains_in_graph(config, cpu)
    compiled = build_config("mqrar", "entmax", "nape", "paper", train_step="compiled")
    assert not trains_in_graph(compiled, cuda) and compiled.identity()["train_step"] == "compiled"
    # what the compiled step would do is unchanged (the Trainer asks only where the graph is off)
    max_tokens = task.max_tokens(config.train_length)
    assert compiles(config, model, cuda, max_tokens) == compiles(compiled, model, cuda, max_tokens)
    assert trains_dense(config, model, cuda, max_tokens) == trains_dense(compiled, model, cuda, max_tokens)


def test_an_unknown_train_step_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown train step 'fast'; choose from: graph-compiled, graph, compiled$"):
        build_config("mqrar", "softmax", "rope", "smoke", train_step="fast")


def test_graph_step_needs_a_capturable_optimizer_and_pads_on_the_right():
    model = _tiny_model("softmax", "rope")
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="fused, capturable AdamW"):
        GraphStep(model, plain, 1.0, width=8)
    step = GraphStep(model, graph_optimizer(model, 1e-3, 0.0), 1.0, width=8)
    ids, labels = torch.ones(2, 5, dtype=torch.long), torch.full((2, 5), 3)
    padded_ids, padded_labels, features = step._pad(ids, labels, None)
    assert padded_ids.shape == (2, 8) and features is None
    assert torch.equal(padded_ids[:, :5], ids) and (padded_ids[:, 5:] == 0).all()
    assert torch.equal(padded_labels[:, :5], labels) and (padded_labels[:, 5:] == -100).all()
    with pytest.raises(ValueError, match="wider than the captured 8"):
        step._pad(torch.ones(2, 9, dtype=torch.long), torch.ones(2, 9, dtype=torch.long), None)


def test_right_padding_leaves_the_real_tokens_and_the_loss_unchanged():
    """What makes one padded width per model exact: causal attention never looks right."""
    torch.manual_seed(1)
    for attn in ("asentmax", "stickbreaking", "tda"):
        model = _tiny_model(attn, "nape", has_features=True).double()
        ids, features = torch.randint(0, 11, (2, 7)), torch.rand(2, 7, dtype=torch.float64)
        padded = model(torch.nn.functional.pad(ids, (0, 5)), torch.nn.functional.pad(features, (0, 5)))
        assert torch.allclose(padded[:, :7], model(ids, features), atol=1e-12, rtol=0)


def test_reference_flags_keep_sdpa_and_drop_triton_ops():
    # on a CPU no layer dispatches to a Triton op: every layer keeps its flag
    model = _tiny_model("entmax", "rope")
    assert reference_flags(model) == [True, True]


def test_inductor_options_default_and_unknown():
    """The training step's Inductor options: mix-order reductions off, PDL and autotuned pointwise kernels (where
    this torch has them); an option this torch lacks dropped."""
    import torch._inductor.config as inductor_config

    from lengthbench.compile_policy import inductor_options

    has = {"triton.mix_order_reduction": hasattr(inductor_config.triton, "mix_order_reduction"),
           "triton.enable_pdl": hasattr(inductor_config.triton, "enable_pdl"),
           "max_autotune_pointwise": hasattr(inductor_config, "max_autotune_pointwise")}
    defaults = {"triton.mix_order_reduction": False, "triton.enable_pdl": True, "max_autotune_pointwise": True}
    assert inductor_options() == {name: value for name, value in defaults.items() if has[name]}
    options = inductor_options({"max_autotune": False, "triton.no_such_option": 1})
    assert options == {"max_autotune": False}


def test_the_clipping_inside_adamw_steps_as_clip_grad_norm_then_step():
    """The captured step clips through the fused AdamW's ``grad_scale``: parameters, gradients and the norm agree
    with ``clip_grad_norm_`` then ``step``, clipped (a large loss) or not, and no scale is left for a later step."""
    from lengthbench.graph_step import clipped_step

    torch.manual_seed(0)
    ids = torch.randint(0, 11, (4, 9))
    models = [_tiny_model("softmax", "rope") for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True) for m in models]
    for weight in (100.0, 1e-3, 100.0):
        norms = []
        for index, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            optimizer.zero_grad()
            (model(ids).float().pow(2).mean() * weight).backward()
            if index == 0:
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True))
                optimizer.step()
            else:
                norms.append(clipped_step(optimizer, model.parameters(), 1.0))
        assert not hasattr(optimizers[1], "grad_scale")
        assert (norms[0] > 1.0) == (weight > 1.0)
        torch.testing.assert_close(norms[1], norms[0], rtol=1e-6, atol=0)
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-8)


def test_the_step_through_the_linear_shadows_gives_the_plain_gradients():
    """The step's forward reads the linear maps' parameters through their shadows (bf16 on CUDA; float32 here, so
    the values must agree) and copies the shadows' gradients into the parameters': each parameter ends with the
    gradient of the plain model, the norms' and embeddings' included, over two steps."""
    from lengthbench.graph_step import linear_parameters

    torch.manual_seed(0)
    model = _tiny_model("asentmax", "nape", has_features=True)
    reference = copy.deepcopy(model)
    names = set(linear_parameters(model))
    assert {"blocks.0.attn.qkv.weight", "head.weight"} <= names
    assert any(name.endswith(".bias") for name in names)  # the feature encoder's linear maps
    assert not any("norm" in name or name.startswith("embed.") for name in names)
    step = GraphStep(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True, capturable=True), 1e9,
                     width=9)
    ids, labels, features = torch.randint(0, 11, (3, 9)), torch.randint(0, 11, (3, 9)), torch.rand(3, 9)
    for _ in range(2):  # the second step: no shadow gradient is added to the first one's
        step.optimizer.zero_grad(set_to_none=True)
        step._body(ids, labels, features)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        reference_optimizer.zero_grad(set_to_none=True)
        logits = reference(ids, features)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
        reference_optimizer.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
