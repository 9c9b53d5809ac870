"""The whole training step in one CUDA graph: forward, backward, gradient clipping and AdamW.

At the papers' training lengths a step's attention is tiny (at most a few hundred tokens), and a step of the
paper models is hundreds of small kernels. :class:`GraphStep` records the step once, at one padded width per
model (every training batch is padded on the right to the task's widest sample; under causal attention the
padding changes nothing for the real tokens, and its labels are ignored), and replays it for every later batch:
one launch a step, the clipping and the optimizer included.

Inside the graph the attention runs the mechanisms' fused ops (``fused``, the default: ``train_attention =
"fused"``) with the launch settings a graph can record (``lengthbench.compile_policy.CAPTURE_TUNING``: no host sync, no
launch sized on the device), the same ops that validation and scoring call; or, with ``fused`` False
(``train_attention = "reference"``), their dense references, except where a module calls torch SDPA (softmax,
SSMax). The references are host-sync free too (no ``.item()``, no data-dependent shapes;
``tests/test_graph_step.py`` checks each one under fake tensors). With ``compile_forward`` (``train_step =
"graph-compiled"``, the default) the rest of the forward and its backward are Inductor's fused kernels, compiled
once at the one width in the first eager step (each fused op a node of that graph, ``kernels/utils/graph_node.py``);
without it they run eagerly, one kernel per operation (a capture takes under a second, but
the unfused kernels cost time of their own). Every number: results/benchmarks/train_throughput.md.

The matrices are cast to bf16 once a step, all in one launch: each ``nn.Linear``'s weight and bias has a bf16
shadow (:func:`linear_parameters`) that the step's forward reads instead of the float32 parameter (autocast would
cast each one on its own, forward and backward: two launches per weight), and the shadows' bf16 gradients are
copied into the parameters' float32 ``.grad`` in one launch. The values are autocast's: a linear under bf16
autocast reads its weight rounded to bf16, and its weight gradient comes out of a bf16 matmul.

The optimizer is AdamW with ``capturable=True`` and ``fused=True``; it clips the gradients as it reads them
(:func:`clipped_step`); its learning rate is a device tensor that the replay reads, filled from the parameter
group's float before each replay (the schedule stays :func:`lengthbench.training.learning_rate`).

The first ``eager_steps`` batches train eagerly, on a side stream, with the same code (cuBLAS handles and the
optimizer's state are created there, as a capture needs); the next one is captured and replayed. A capture that
fails falls back, for the rest of the run, to the step the caller gave (``fallback``), and says why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from lengthbench.compile_policy import attention_kernels, inductor_options
from lengthbench.tasks import IGNORE_INDEX

StepOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def graph_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """The AdamW that a captured step can replay: fused, capturable (its step count on the device)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True, capturable=True)


def clipped_step(optimizer: torch.optim.Optimizer, parameters, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_(parameters, max_norm)`` then ``optimizer.step()``, with the clipping done inside the fused
    AdamW's pass: the gradients' total norm is computed, and the optimizer divides every gradient by
    ``max(1, (norm + 1e-6) / max_norm)`` as it reads it (its ``grad_scale``, the hook ``GradScaler`` uses; the
    divided gradients are written back, as clipping leaves them). One pass over the gradients and its launches
    fewer than clipping them first. Returns the total norm before clipping, as ``clip_grad_norm_`` does."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale  # no later step (an eager fallback) may divide by it again
    return norm


def linear_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters of ``model``'s ``nn.Linear`` modules (weights and biases), by name: the ones that bf16
    autocast casts whole to bf16 before every use (the models use them in nothing but their linear maps)."""
    names = {f"{prefix}.{name}" if prefix else name
             for prefix, module in model.named_modules() if isinstance(module, torch.nn.Linear)
             for name, _ in module.named_parameters(recurse=False)}
    return {name: p for name, p in model.named_parameters() if name in names}


def reference_flags(model) -> list[bool]:
    """Each attention layer's ``use_kernels`` inside a graph on the dense references: off where the layer would
    call a fused Triton op (it runs its dense reference instead), on elsewhere (torch SDPA)."""
    return [block.attn.use_kernels and not block.attn.dispatches_to_kernel() for block in model.blocks]


class GraphStep:
    """``step(input_ids, labels, features) -> (loss, correct, scored, grad_norm)``, each a fresh 0-d tensor,
    for batches of at most ``width`` tokens; the optimizer's parameter groups hold the float learning rate."""

    eager_steps: int = 3

    def __init__(self, model, optimizer: torch.optim.Optimizer, grad_clip: float, width: int,
                 fallback: Callable[..., StepOutputs] | None = None, log: Callable[[str], None] | None = None,
                 compile_forward: bool = False, fused: bool = True):
        for group in optimizer.param_groups:
            if not (group.get("capturable") and group.get("fused")):
                raise ValueError("GraphStep needs a fused, capturable AdamW (graph_optimizer)")
        self.model = model
        self.optimizer = optimizer
        self.grad_clip = float(grad_clip)
        self.width = int(width)
        self.fallback = fallback
        self.log = log or (lambda line: None)
        self.device = next(model.parameters()).device
        self.fused = bool(fused)
        self.flags = [block.attn.use_kernels for block in model.blocks] if self.fused else reference_flags(model)
        self.lr = torch.zeros((), device=self.device, dtype=torch.float32)
        # bf16 shadows of the linear maps' parameters (module docstring); float32 ones (``shadow_dtype``) make
        # the step the plain one, as on a CPU
        self.shadow_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.sources = linear_parameters(model)
        self.shadows = {name: torch.empty_like(p, dtype=self.shadow_dtype).requires_grad_()
                        for name, p in self.sources.items()}
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = ""  # why the capture failed ("" while it has not)
        self.steps = 0
        self.static: dict[str, torch.Tensor | None] = {}
        self.outputs: StepOutputs | None = None
        self.side_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # Inductor's kernels for the forward and its backward (fused elementwise work), compiled at the one width
        # in the first eager step; the graph then records them like any other launch
        # (with ``compile_policy.inductor_options``)
        self.forward_loss = (torch.compile(self._forward_loss, dynamic=False, options=inductor_options())
                             if compile_forward else self._forward_loss)

    # -- the step's body, the same eagerly and in the capture ------------------------------------------------
    def _forward_loss(self, input_ids, labels, features, shadows):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):  # no weight cache in a graph
            logits = torch.func.functional_call(self.model, shadows, (input_ids, features), strict=False)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        scored = labels != IGNORE_INDEX
        correct = ((logits.argmax(-1) == labels) & scored).sum()
        return loss, correct, scored.sum()

    def _body(self, input_ids, labels, features) -> StepOutputs:
        shadows, sources = list(self.shadows.values()), list(self.sources.values())
        for shadow in shadows:
            shadow.grad = None  # the backward writes a shadow's gradient, never adds to an older one
        with torch.no_grad():
            torch._foreach_copy_(shadows, sources)
        loss, correct, scored = self.forward_loss(input_ids, labels, features, self.shadows)
        loss.backward()
        with torch.no_grad():  # a linear map this forward left out keeps no gradient, as without the shadows
            pairs = [(p, shadow.grad) for p, shadow in zip(sources, shadows, strict=True) if shadow.grad is not None]
            for p, _ in pairs:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
            if pairs:
                torch._foreach_copy_([p.grad for p, _ in pairs], [grad for _, grad in pairs])
        norm = clipped_step(self.optimizer, self.model.parameters(), self.grad_clip)
        return loss.detach(), correct, scored, norm.detach()

    def _pad(self, input_ids, labels, features):
        """Right-pad a batch to ``width`` tokens (labels ignored there); a wider batch is a caller's error."""
        extra = self.width - input_ids.shape[1]
        if extra < 0:
            raise ValueError(f"a training batch of {input_ids.shape[1]} tokens is wider than the captured "
                             f"{self.width}")
        if extra == 0:
            return input_ids, labels, features
        input_ids = F.pad(input_ids, (0, extra))
        labels = F.pad(labels, (0, extra), value=IGNORE_INDEX)
        features = None if features is None else F.pad(features, (0, extra))
        return input_ids, labels, features

    def __call__(self, input_ids, labels, features) -> StepOutputs:
        if self.failed and self.fallback is not None:
            return self.fallback(input_ids, labels, features)
        input_ids, labels, features = self._pad(input_ids, labels, features)
        self.steps += 1
        if self.graph is None and self.steps > self.eager_steps and not self.failed:
            self._capture(input_ids, labels, features)
            if self.failed and self.fallback is not None:
                return self.fallback(input_ids, labels, features)
        if self.graph is None:
            return self._eager(input_ids, labels, features)
        self.static["input_ids"].copy_(input_ids, non_blocking=True)
        self.static["labels"].copy_(labels, non_blocking=True)
        if features is not None:
            self.static["features"].copy_(features, non_blocking=True)
        self.lr.fill_(self.optimizer.param_groups[0]["lr"])
        self.graph.replay()
        return tuple(t.clone() for t in self.outputs)

    def _eager(self, input_ids, labels, features) -> StepOutputs:
        """One step outside the graph, on the side stream (as a capture's warm-up must be). Where Inductor fails
        on the forward (it compiles in the first of these), the step goes on with the plain one."""
        stream = self.side_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), attention_kernels(self.model, self.flags, self.fused):
            self.optimizer.zero_grad(set_to_none=True)  # before, not after: the step's gradients stay readable
            try:
                outputs = self._body(input_ids, labels, features)
            except Exception as error:  # noqa: BLE001 - the optimizer has not stepped: redo the batch uncompiled
                if self.forward_loss == self._forward_loss:
                    raise
                self.log(f"torch.compile of the training forward failed ({type(error).__name__}); the CUDA graph "
                         "records the uncompiled step")
                self.forward_loss = self._forward_loss
                self.optimizer.zero_grad(set_to_none=True)
                outputs = self._body(input_ids, labels, features)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return outputs

    def _capture(self, input_ids, labels, features) -> None:
        self.static = {"input_ids": input_ids.clone(), "labels": labels.clone(),
                       "features": None if features is None else features.clone()}
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients in its pool
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        groups = self.optimizer.param_groups
        if any(group["lr"] != groups[0]["lr"] for group in groups):
            raise ValueError("GraphStep replays one learning rate for every parameter group")
        floats = [group["lr"] for group in groups]
        # a checkpoint written by another step's optimizer loads as not capturable, its step counts on the host
        for group in groups:
            group["capturable"] = True
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")) and state["step"].device != self.device:
                state["step"] = state["step"].to(self.device, torch.float32)
        for group in groups:
            group["lr"] = self.lr  # the captured update reads the device learning rate
        try:
            with attention_kernels(self.model, self.flags, self.fused), torch.cuda.graph(graph):
                self.outputs = self._body(self.static["input_ids"], self.static["labels"], self.static["features"])
        except Exception as error:  # noqa: BLE001 - any failure: train on without the graph, and say why
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.optimizer.zero_grad(set_to_none=True)
            self.log(f"CUDA graph capture of the training step failed ({self.failed}); training without it")
            self.outputs = None
            return
        finally:
            for group, lr in zip(groups, floats, strict=True):
                group["lr"] = lr
        self.graph = graph
