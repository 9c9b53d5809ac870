"""The training step's gradients against a float64 reference, per parameter, for every mechanism x encoding.

The step under test is the Trainer's own (on CUDA: the whole step in one CUDA graph, bf16 autocast). With the
learning rate at 0 the replays leave the weights as they are and each parameter's ``.grad`` holds the step's
gradient; the reference is a float64 copy of the model on its dense references, without autocast. Each
parameter is compared on its own (``relative_errors``): a compiled path once got ASEntmax's ``w_gamma``
gradient 15-160 times too large while every other gradient was right, which an error over all parameters at
once would not show. Each bound is the larger of a fixed one and a multiple of the float64 model's own change
under bf16 weights (``bf16_sensitivity``): the kinks of softpick and the thresholds of TDA make some gradients
that sensitive whatever computes them.
"""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lengthbench.compile_policy import attention_kernels
from lengthbench.config import build_config
from lengthbench.data import make_train_batch
from lengthbench.models.attention import kernel_names
from lengthbench.tasks import IGNORE_INDEX, get_task
from lengthbench.training import Trainer

# every mechanism registered with a fused op (the registry's), and the paths beside them: softmax and SSMax (torch
# SDPA, with its row factor), ASEntmax (entmax's op with a learned row scale)
MECHANISMS = (*kernel_names(), "softmax", "ssmax", "asentmax")
ENCODINGS = ("rope", "nape")
# bf16 autocast against float64, per parameter (the weights perturbed so that no gradient is zero by symmetry):
# measured up to 4.5e-2 on an H200 (softpick's attn_norm), 1e-2 to 3e-2 for most. TRA and TDA are the exception,
# outside the graph as inside it: their cosine scores come from bf16 queries and keys (2^-9 relative), and
# ``(s - tau)_+^2`` near the threshold multiplies that error: up to 0.58 measured on weight matrices and norms,
# and up to 7.95 on the scalars ``beta`` and ``lambda_logit``, whose gradients are sums over every score that
# nearly cancel. A gradient 15 times too large has a relative error of 14, above every bound; the captured step
# is also compared with the same step outside the graph (``CAPTURE_TOLERANCE``), which measured 0 to 2e-7.
GRAD_TOLERANCE = 0.05
THRESHOLD_TOLERANCE = {"matrix": 1.0, "scalar": 12.0}
# Some gradients move that much in the float64 model itself when only its weights are rounded to bf16 (no kernel
# involved, ``bf16_sensitivity``): on the CPU with this test's seeds and batches, softpick's qkv 0.146 at step 1
# (the GPU step: 0.144), TDA's lambda_logit 61 (the step: 247; autocast rounds the activations too) and qk2 up to
# 0.77 (1.05), ASEntmax's w_gamma 0.025-0.051 (0.057), softmax's and stick-breaking's at most 0.008. A step's
# error is accepted up to SENSITIVITY_FACTOR times that sensitivity where it exceeds the fixed bounds.
SENSITIVITY_FACTOR = 5.0


def tolerance(attn: str, parameter: str) -> float:
    if attn not in ("tra", "tda"):
        return GRAD_TOLERANCE
    scalar = parameter.endswith((".beta", ".lambda_logit"))
    return THRESHOLD_TOLERANCE["scalar" if scalar else "matrix"]


# the captured step against the same step outside the graph, on the same batch: the same kernels
CAPTURE_TOLERANCE = 1e-3


def relative_errors(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """``|g - g_ref| / |g_ref|`` per parameter (Frobenius norms, in float64); a missing gradient is an error of
    infinity, and a zero reference gradient compares the absolute error."""
    errors = {}
    for name, ref in reference.items():
        grad = grads.get(name)
        if grad is None:
            errors[name] = float("inf")
            continue
        ref = ref.double()
        difference = (grad.double().to(ref.device) - ref).norm().item()
        scale = ref.norm().item()
        errors[name] = difference / scale if scale > 0 else difference
    return errors


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.02) -> None:
    """Move every weight off its initial value, so that zero-initialised projections (ASEntmax's ``w_beta``,
    ``w_gamma``) get gradients of their own."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))


def reference_gradients(model, input_ids, labels, features) -> dict[str, torch.Tensor]:
    """The float64 gradients of the mean cross-entropy on the dense references, no autocast."""
    reference = copy.deepcopy(model).double()
    with attention_kernels(reference, False):
        logits = reference(input_ids, None if features is None else features.double())
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
    return {name: p.grad for name, p in reference.named_parameters()}


def bf16_sensitivity(model, input_ids, labels, features) -> dict[str, float]:
    """Per parameter, the relative change of the float64 gradients when the weights are rounded to bf16 first."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return relative_errors(reference_gradients(rounded, input_ids, labels, features),
                           reference_gradients(model, input_ids, labels, features))


def bounds(attn: str, sensitivity: dict[str, float]) -> dict[str, float]:
    return {name: max(tolerance(attn, name), SENSITIVITY_FACTOR * value) for name, value in sensitivity.items()}


def step_gradients(task_name: str, attn: str, pe: str, device: torch.device, tmp_path: Path, batch_size: int = 16,
                   train_step: str = "graph", train_attention: str = "fused"):
    """``(trainer, [(batch, grads), ...], eager_grads)``: the Trainer's step run with learning rate 0 over six
    batches (the graph's eager warm-up, its capture and replays), each batch's gradients as the step left them,
    and the last batch's gradients from the same step outside the graph."""
    task = get_task(task_name)
    config = build_config(task_name, attn, pe, "paper", batch_size=batch_size, grad_clip=1e9, train_samples=10**6,
                          train_step=train_step, train_attention=train_attention)
    trainer = Trainer(config, task, device, tmp_path, progress=False)
    perturb(trainer.model, seed=1)
    stream = trainer.train_stream()
    results = []
    for step in range(6):
        input_ids, labels, features = (None if a is None else torch.as_tensor(a).to(device)
                                       for a in make_train_batch(stream, step))
        features = None if features is None else features.float()
        for group in trainer.optimizer.param_groups:
            group["lr"] = 0.0
        trainer.step_fn(input_ids, labels, features)
        torch.cuda.synchronize()
        grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
        results.append(((input_ids, labels, features), grads))
    trainer.step_fn._eager(*results[-1][0])  # last: the graph's gradient buffers are no longer the .grad after it
    torch.cuda.synchronize()
    eager = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return trainer, results, eager


def test_relative_errors_catch_one_gradient_fifteen_times_too_large():
    torch.manual_seed(0)
    reference = {"qkv": torch.randn(8, 8), "w_gamma": 1e-4 * torch.randn(8, 2)}
    close = {name: g * (1 + 1e-3 * torch.randn_like(g)) for name, g in reference.items()}
    assert max(relative_errors(close, reference).values()) < GRAD_TOLERANCE
    wrong = dict(close, w_gamma=15 * reference["w_gamma"])
    errors = relative_errors(wrong, reference)
    assert errors["qkv"] < GRAD_TOLERANCE and errors["w_gamma"] > 10
    assert relative_errors({"qkv": reference["qkv"]}, reference)["w_gamma"] == float("inf")


def test_bf16_sensitivity_is_per_parameter_and_keeps_a_fifteen_fold_error_out():
    """On a smoke model (CPU): every parameter gets a finite sensitivity, softmax's stay small, and the bounds
    they give would still reject a gradient 15 times too large."""
    task = get_task("2back")
    config = build_config("2back", "softmax", "rope", "smoke", batch_size=4)
    model = Trainer(config, task, torch.device("cpu"), Path("/tmp/lengthbench-sensitivity"), progress=False).model
    perturb(model, seed=1)
    stream_batch = make_train_batch(Trainer(config, task, torch.device("cpu"), Path("/tmp/lengthbench-sensitivity"),
                                            progress=False).train_stream(), 0)
    input_ids, labels, features = (None if a is None else torch.as_tensor(a) for a in stream_batch)
    sensitivity = bf16_sensitivity(model, input_ids, labels, features)
    assert set(sensitivity) == {name for name, _ in model.named_parameters()}
    assert all(0 <= value < 0.05 for value in sensitivity.values()), sensitivity
    assert max(bounds("softmax", sensitivity).values()) < 14


@pytest.mark.gpu
@pytest.mark.parametrize("train_attention", ["fused", pytest.param("reference", marks=pytest.mark.slow)])
@pytest.mark.parametrize("train_step", ["graph", pytest.param("graph-compiled", marks=pytest.mark.slow)])
@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("attn", MECHANISMS)
def test_training_step_gradients_match_float64_per_parameter(attn, pe, train_step, train_attention, tmp_path):
    device = torch.device("cuda")
    trainer, results, eager = step_gradients("mqrar", attn, pe, device, tmp_path, train_step=train_step,
                                             train_attention=train_attention)
    assert trainer.graph and trainer.step_fn.graph is not None, trainer.step_fn.failed
    if train_step == "graph-compiled":  # Inductor compiled the forward: the step did not fall back to the plain one
        assert trainer.step_fn.forward_loss != trainer.step_fn._forward_loss
    for index, (batch, grads) in enumerate(results):
        errors = relative_errors(grads, reference_gradients(trainer.model, *batch))
        bound = bounds(attn, bf16_sensitivity(trainer.model, *batch))
        worst = max(errors, key=lambda name: errors[name] / bound[name])
        print(f"{train_step}/{train_attention} {attn} + {pe} step {index}: worst {worst} {errors[worst]:.2e} "
              f"(bound {bound[worst]:.2e})")
        assert errors[worst] < bound[worst], (index, worst, errors[worst], bound[worst])
    captured = relative_errors(results[-1][1], eager)
    worst = max(captured, key=captured.get)
    print(f"{train_step}/{train_attention} {attn} + {pe} captured vs eager: worst {worst} {captured[worst]:.2e}")
    assert captured[worst] < CAPTURE_TOLERANCE, (worst, captured[worst])


@pytest.mark.gpu
@pytest.mark.parametrize("train_step", ["graph", pytest.param("graph-compiled", marks=pytest.mark.slow)])
def test_asentmax_w_gamma_gradient_of_the_graph_step(train_step, tmp_path):
    """The gradient that a compiled path once got wrong, on the MQMTAR paper model (4 layers)."""
    trainer, results, _ = step_gradients("mqmtar", "asentmax", "nape", torch.device("cuda"), tmp_path, batch_size=8,
                                         train_step=train_step)
    batch, grads = results[-1]
    errors = relative_errors(grads, reference_gradients(trainer.model, *batch))
    bound = bounds("asentmax", bf16_sensitivity(trainer.model, *batch))
    gammas = {name: (error, bound[name]) for name, error in errors.items() if name.endswith("w_gamma")}
    assert len(gammas) == 4 and all(error < limit for error, limit in gammas.values()), gammas


@pytest.mark.gpu
def test_the_captured_step_clips_as_clip_grad_norm_then_adamw():
    """The graph's clipping inside the fused AdamW (``graph_step.clipped_step``) against ``clip_grad_norm_`` then
    the optimizer's step, eagerly on a copy of the model, over the eager steps, the capture and replays, with the
    clip active (norms above 0.2, the clip 0.01): the returned norms, the clipped gradients, AdamW's moments and
    the weights. The moments hold the clipped gradients: a step that skipped the clipping moves them 20 and more
    times too far. The graph's step reads the linear maps through bf16 shadows, the reference through autocast."""
    from lengthbench.graph_step import GraphStep, graph_optimizer
    from lengthbench.models.decoder import Decoder, ModelConfig

    device = torch.device("cuda")
    torch.manual_seed(0)
    graph_model = Decoder(ModelConfig(vocab_size=11, d_model=64, n_layers=2, n_heads=4, ffn=128, attn="softmax",
                                      pe="rope")).to(device)
    eager_model = copy.deepcopy(graph_model)
    clip = 0.01
    step = GraphStep(graph_model, graph_optimizer(graph_model, 1e-3, 0.1), clip, width=24)
    reference = torch.optim.AdamW(eager_model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    for index in range(6):
        ids = torch.randint(0, 11, (8, 24), device=device)
        labels = torch.randint(0, 11, (8, 24), device=device)
        _, _, _, norm = step(ids, labels, None)
        reference.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = eager_model(ids)
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
        expected = torch.nn.utils.clip_grad_norm_(eager_model.parameters(), clip, foreach=True)
        reference.step()
        torch.cuda.synchronize()
        assert float(expected) > 20 * clip, float(expected)
        torch.testing.assert_close(norm, expected, rtol=1e-3, atol=0)
        pairs = list(zip(graph_model.named_parameters(), eager_model.parameters(), strict=True))
        for what, mine, theirs in (
                ("grad", {n: p.grad for (n, p), _ in pairs}, {n: q.grad for (n, _), q in pairs}),
                ("exp_avg", {n: step.optimizer.state[p]["exp_avg"] for (n, p), _ in pairs},
                 {n: reference.state[q]["exp_avg"] for (n, _), q in pairs}),
                ("weight", {n: p for (n, p), _ in pairs}, {n: q for (n, _), q in pairs})):
            errors = relative_errors(mine, theirs)  # bf16 rounding as the two steps' weights drift apart
            worst = max(errors, key=errors.get)
            print(f"step {index} {what}: worst {worst} {errors[worst]:.2e}")
            assert errors[worst] < 2e-2, (index, what, worst, errors[worst])
    assert step.graph is not None, step.failed
