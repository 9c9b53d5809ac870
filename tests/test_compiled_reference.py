"""The dense reference path of every mechanism traces into one torch.compile graph (no graph break), so that
models with fused ops can train on it, compiled with CUDA graphs, at the seeds' short training lengths
(``lengthbench.runner.trains_dense``). A graph break there would cost the CUDA graph of the training step. On
the CPU: Dynamo's tracing is the same for both devices (the modules take their reference path wherever
``use_kernels`` is off), and the ``aot_eager`` backend runs the traced forward and backward without compiling
code."""

from __future__ import annotations

import pytest
import torch

from lengthbench.config import build_config
from lengthbench.models.attention.registry import ATTENTION
from lengthbench.runner import attention_kernels, build_model
from lengthbench.tasks import get_task

TINY = dict(d_model=32, n_heads=4, ffn=64, n_layers=2)
POSITION_FREE = {"stickbreaking", "sieve", "sieve-alg1"}


def _model_and_loss(attn: str, pe: str, **attn_params):
    task = get_task("mqmtar")
    config = build_config("mqmtar", attn, pe, "smoke", attn_params=attn_params, **TINY)
    torch.manual_seed(0)
    model = build_model(config, task)
    batch = task.batch(list(range(3)), 16, "train", 0)
    ids = torch.as_tensor(batch.input_ids)
    weights = torch.randn(*ids.shape, task.vocab_size, generator=torch.Generator().manual_seed(1))

    def loss(ids):
        return (model(ids, None).float() * weights).sum()

    return model, loss, ids


@pytest.mark.parametrize("attn", ATTENTION.names())
def test_reference_path_traces_without_graph_breaks(attn):
    pe = "none" if attn in POSITION_FREE else "rope"
    model, loss, ids = _model_and_loss(attn, pe)
    torch._dynamo.reset()
    with attention_kernels(model, False):
        explained = torch._dynamo.explain(loss)(ids)
    assert explained.graph_break_count == 0, [str(reason) for reason in explained.break_reasons][:1]
    assert explained.graph_count == 1


@pytest.mark.parametrize("attn, pe, params", [
    ("entmax", "rope", {}),                   # the package's sort-based entmax15
    ("sparsemax", "rope", {}),                # its sparsemax
    ("entmax", "nape", {"alpha": 1.3}),       # its bisection
    ("sentmax", "rope", {}),
    ("sieve", "none", {}),
    # not assmax / asentmax: aot_eager's backward of their query projections fails a view on the CPU (torch
    # 2.13), where Inductor, the backend of training, runs them (the forward traces: the test above; Inductor on
    # CUDA: the GPU test below)
])
def test_compiled_reference_matches_eager_forward_and_backward(attn, pe, params):
    model, loss, ids = _model_and_loss(attn, pe, **params)
    with attention_kernels(model, False):
        eager = loss(ids)
        eager.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")(ids)
        compiled.backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert grads and all(grad.abs().sum() > 0 for grad in grads.values() if grad.dim() > 1)
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("attn, pe", [("asentmax", "nape"), ("assmax", "rope"), ("sentmax", "nape")] + [
    (name, "none" if name in POSITION_FREE else "rope") for name in ATTENTION.names()
    if name not in ("asentmax", "assmax", "sentmax")])
def test_inductor_gradients_match_eager_under_cuda_autocast(attn, pe):
    """The runner's compiled step (Inductor, CUDA, bf16 autocast) on the references gives the eager gradients,
    for every mechanism (the scaled ones first). With the adaptive scale written ``log(n + 1) ** gamma``,
    Inductor's gradient for ``w_gamma`` was 15 to 160 times off on the H100/H200 (session 19), and compiled
    ASEntmax models did not learn or extrapolate."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model, _, ids = _model_and_loss(attn, pe)
    model = model.cuda()
    ids = ids.cuda()
    weights = torch.randn(*ids.shape, model.head.out_features, device="cuda",
                          generator=torch.Generator("cuda").manual_seed(1))

    def loss(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids, None)
        return (logits.float() * weights).sum()

    def gradients(fn):
        model.zero_grad(set_to_none=True)
        fn(ids).backward()
        return {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}

    with attention_kernels(model, False):
        eager = gradients(loss)
        torch._dynamo.reset()
        compiled = gradients(torch.compile(loss, dynamic=False))
    assert set(compiled) == set(eager)
    for name, grad in eager.items():
        distance = float((compiled[name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert distance < 0.05, f"{name}: compiled gradient {distance:.3g} (relative) from the eager one"
