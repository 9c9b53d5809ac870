"""The fused ops as nodes of a compiled graph: no graph break around them in the training step.

A fused op is an autograd function that launches Triton kernels; ``torch.compile`` cannot trace it, so
``load_op`` marks it ``torch.compiler.disable`` and the compiled forward breaks in two at every call. The
pieces between the breaks then exchange their tensors through the autograd engine, eagerly: the casts and
copies at the boundary, the zero fills of gradients that a piece's outputs never receive, the sums of the
gradients of tensors that several pieces read (on the paper MQMTAR model at batch 128, TDA's step spent 1.5 ms
of its 6.9 on such kernels, ASEntmax's with NAPE 1.6 of 5.6, on an H200).

Here an op call is one custom op instead (``lengthbench::fused_forward``), opaque to Inductor but inside its
graph, and its backward another (``lengthbench::fused_backward``), so that one graph holds the whole forward
and one the whole backward. The forward runs the op on its input tensors with autograd on, and keeps the
autograd graph it builds in ``_GRAPHS`` under the address of its output. That graph must not read the inputs'
memory later: Inductor reuses an input's memory in the forward after the call (its buffers are planned for a
graph that holds no references of its own). So while the op runs, a saved-tensor hook (``_Inputs``) keeps, in
place of every tensor the op saves that lies in an input's memory, only where in that input it lies; the
backward is handed the inputs again (Inductor saved them or computed them again) and the hook takes the saved
tensors from those. (Copies of the inputs would cost 12 device copies a step, 90 us of a 3.9 ms 1.5-entmax
step, on the paper MQMTAR model at batch 128 on an H200.) The backward is handed the forward's
output and takes ``torch.autograd.grad`` through the kept graph; handed an output that is not the forward's (or
one whose entry was dropped, ``KEEP``), it runs the op's forward again on the inputs handed to it, then the
gradient (``STATS`` counts both). Inside a CUDA graph (``lengthbench/graph_step.py``) this Python runs once,
during the capture: a replay reruns the kernels that it launched on the same memory.

The training step's attention takes every fused op so (``lengthbench.kernels.get_op(..., in_graph=True)``).

The op's arguments other than tensors (and where its tensors go) travel as a JSON text, a constant of the
compiled graph. Only where autograd records the call (grad mode on, an input that needs a gradient) does the
op go through here; a call without gradients runs the op directly.
"""

from __future__ import annotations

import json
import math

import torch

# op output's address -> (the output with its autograd graph, the leaves whose gradients the backward returns,
# the output handed to the compiled graph, the run's saved-tensor hooks);
# at most KEEP of them (a forward whose backward never runs leaves its entry, dropped once KEEP newer ones came)
_GRAPHS: dict[int, tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, _Inputs]] = {}
KEEP = 256


def _spec(op: str, tuning: dict | None, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], str]:
    """The tensors of a call, in order, and the JSON text of everything else (a tensor appears there as
    ``{"t": i}``), with the grad mask and the shapes and dtypes of the tensors that need gradients."""
    tensors: list[torch.Tensor] = []

    def encode(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return {"t": len(tensors) - 1}
        if isinstance(value, (tuple, list)):
            return [encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): encode(v) for k, v in value.items()}
        return value

    encoded_args = [encode(a) for a in args]
    encoded_kwargs = {k: encode(v) for k, v in kwargs.items()}
    grad = [bool(t.requires_grad) for t in tensors]
    shapes = [[list(t.shape), _DTYPES[t.dtype]] for t in tensors if t.requires_grad]
    return tensors, _dumps(dict(op=op, tuning=encode(tuning), args=encoded_args,
                                kwargs=encoded_kwargs, grad=grad, shapes=shapes))


_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
           torch.float64: "float64"}


@torch._dynamo.assume_constant_result
def _dumps(value) -> str:
    """JSON of constants, run by Dynamo at trace time (it cannot trace ``json.dumps``): a constant text."""
    return json.dumps(value, sort_keys=True)


def _decode(value, tensors):
    if isinstance(value, dict):
        if set(value) == {"t"}:
            return tensors[value["t"]]
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


# The dispatcher's thread-local key sets outside any op: a custom op's body runs below autograd (its keys
# excluded), where the op's own differentiable arithmetic (TDA's ``lam``, a ``beta``) would record no graph.
_OUTSIDE = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


# how many backwards took the forward's graph, and how many ran the op's forward again (test_bridge.py)
STATS = {"saved": 0, "recomputed": 0}


class _Inputs:
    """Saved-tensor hooks for an op's run on ``leaves``: a tensor the op saves that is one leaf's elements (the
    leaf itself, or a view within a contiguous leaf) is packed as (leaf index, size, stride, offset within the
    leaf), and unpacked from :attr:`handed`, the tensors the backward was handed in the leaves' places. A saved
    tensor in a leaf's memory that is not such a view is packed as a copy of its own; others as they are."""

    def __init__(self):
        self.layouts: list[tuple] = []  # a leaf's (storage address, offset, shape, stride, dtype, contiguous)
        self.handed: list[torch.Tensor] | None = None

    def watch(self, leaves: list[torch.Tensor]) -> None:
        self.layouts = [(leaf.untyped_storage().data_ptr() if leaf.numel() else None, leaf.storage_offset(),
                         tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype, leaf.is_contiguous())
                        for leaf in leaves]

    def pack(self, x: torch.Tensor):
        if x.numel() == 0:
            return x
        address, shared = x.untyped_storage().data_ptr(), False
        for i, (storage, offset, shape, stride, dtype, contiguous) in enumerate(self.layouts):
            if storage != address:
                continue
            shared = True
            delta = x.storage_offset() - offset
            same = delta == 0 and tuple(x.shape) == shape and tuple(x.stride()) == stride
            within = contiguous and 0 <= delta and delta + _extent(x) <= math.prod(shape)
            if x.dtype == dtype and (same or within):
                return (i, tuple(x.shape), tuple(x.stride()), delta)
        return x.clone() if shared else x

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        i, shape, stride, delta = packed
        if self.handed is None:
            raise RuntimeError("lengthbench::fused_backward: a saved input was read outside the backward")
        handed = self.handed[i]
        _, _, leaf_shape, leaf_stride, dtype, _ = self.layouts[i]
        if tuple(handed.shape) != leaf_shape or tuple(handed.stride()) != leaf_stride or handed.dtype != dtype:
            handed = torch.empty_strided(leaf_shape, leaf_stride, dtype=dtype, device=handed.device).copy_(handed)
        return handed.as_strided(shape, stride, handed.storage_offset() + delta)


def _extent(t: torch.Tensor) -> int:
    """The elements from a tensor's first to its last, plus one."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _run(tensors: list[torch.Tensor], meta: dict, hooks: _Inputs | None = None
         ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The op on detached ``tensors`` (the same memory) with autograd on: its output and the leaves that need
    gradients. With ``hooks``, the tensors it saves from the inputs' memory are taken from ``hooks.handed``."""
    from lengthbench.kernels import load_op

    leaves = [t.detach().requires_grad_(g) for t, g in zip(tensors, meta["grad"], strict=True)]
    op = load_op(meta["op"], meta["tuning"])
    with torch.enable_grad():
        if hooks is None:
            out = op(*_decode(meta["args"], leaves), **_decode(meta["kwargs"], leaves))
        else:
            hooks.watch(leaves)
            with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
                out = op(*_decode(meta["args"], leaves), **_decode(meta["kwargs"], leaves))
    return out, [leaf for leaf, g in zip(leaves, meta["grad"], strict=True) if g]


@torch.library.custom_op("lengthbench::fused_forward", mutates_args=())
def fused_forward(tensors: list[torch.Tensor], spec: str) -> torch.Tensor:
    meta = json.loads(spec)
    hooks = _Inputs()
    with torch._C._ForceDispatchKeyGuard(*_OUTSIDE):
        out, leaves = _run(tensors, meta, hooks)
    result = out.detach().contiguous()  # the strides of the fake output below (Inductor indexes by them)
    _GRAPHS.pop(result.data_ptr(), None)
    # the entry holds ``result``: no other tensor takes its address while the entry lives
    _GRAPHS[result.data_ptr()] = (out, leaves, result, hooks)
    while len(_GRAPHS) > KEEP:
        _GRAPHS.pop(next(iter(_GRAPHS)))
    return result


@fused_forward.register_fake
def _(tensors, spec):
    return torch.empty_like(tensors[0])


@torch.library.custom_op("lengthbench::fused_backward", mutates_args=())
def fused_backward(grad: torch.Tensor, out: torch.Tensor, tensors: list[torch.Tensor], spec: str) -> list[torch.Tensor]:
    entry = _GRAPHS.pop(out.data_ptr(), None)
    meta = json.loads(spec)
    # The forward's graph keeps no tensor in its inputs' memory (``_Inputs``): it takes them from the inputs
    # handed here. Without it (handed an output that is not the forward's, or the entry dropped after KEEP newer
    # ones), the op's forward runs again on the inputs handed here.
    with torch._C._ForceDispatchKeyGuard(*_OUTSIDE):
        if entry is not None and entry[2].shape == out.shape:
            STATS["saved"] += 1
            recorded, leaves, hooks = entry[0], entry[1], entry[3]
            hooks.handed = list(tensors)
            try:
                grads = torch.autograd.grad(recorded, leaves, grad, allow_unused=True)
            finally:
                hooks.handed = None
        else:
            STATS["recomputed"] += 1
            recorded, leaves = _run(tensors, meta)
            grads = torch.autograd.grad(recorded, leaves, grad, allow_unused=True)
    return [torch.zeros_like(leaf, memory_format=torch.contiguous_format) if g is None else g.contiguous()
            for g, leaf in zip(grads, leaves, strict=True)]


@fused_backward.register_fake
def _(grad, out, tensors, spec):
    return [grad.new_empty(shape, dtype=getattr(torch, dtype)) for shape, dtype in json.loads(spec)["shapes"]]


def _setup_context(ctx, inputs, output):
    ctx.spec = inputs[1]
    ctx.save_for_backward(output, *inputs[0])


def _backward(ctx, grad):
    out, *tensors = ctx.saved_tensors
    grads = iter(torch.ops.lengthbench.fused_backward(grad.contiguous(), out, tensors, ctx.spec))
    return [next(grads) if g else None for g in json.loads(ctx.spec)["grad"]], None


fused_forward.register_autograd(_backward, setup_context=_setup_context)


def graph_node_op(op: str, tuning: dict | None = None):
    """The op at the path ``op`` (``load_op``, launch settings ``tuning``) as a call of
    ``lengthbench::fused_forward`` where autograd records it, the op itself elsewhere."""
    from lengthbench.kernels import load_op

    def call(*args, **kwargs):
        tensors, spec = _spec(op, tuning, args, kwargs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return torch.ops.lengthbench.fused_forward(tensors, spec)
        return load_op(op, tuning)(*args, **kwargs)

    return call
