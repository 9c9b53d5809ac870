"""The fused ops as nodes of a compiled graph (``kernels/utils/graph_node.py``), on the CPU under the Triton interpreter:
a compiled function that projects q, k, v and calls an op through the graph node is one graph (no break), and its
loss and every gradient equal those of the op called directly, uncompiled; the backward leaves no forward graph
behind. Its gradients are those of the inputs the forward saw, though their memory was written over after the
call (the backward is handed them again, in the same memory or in other); handed an output that is not the forward's, it runs the op's forward again, with the same gradients. Cases: stick-breaking (with the training step's launch settings), TDA (two views, ``lam`` and ``beta`` tensor arguments with
gradients) and entmax with a row scale (a tensor argument with a gradient). A call without gradients runs the op
itself.

``TRITON_INTERPRET=1`` must be set before Triton is imported: the cases run in worker processes (this file run
as a script).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from interpreter_helpers import interpreter_results, needs_triton

CASES = ["stickbreaking", "tda", "entmax"]
BATCH, TOKENS, HEADS, DIM = 2, 24, 2, 16
# The compiled loss against the eager one, on the op's share: ``sum out^2``, relative. The two sum their squares in
# other orders (eager by ATen's sum, compiled by Inductor's vectorised loop: lanes of 16 floats with AVX-512, 8 with
# AVX2, each lane's terms in sequence), and a float32 sum of n non-negative terms in any order is within gamma_n =
# n u / (1 - n u) of the exact one, relative (u = 2^-24; Higham, "Accuracy and Stability of Numerical Algorithms",
# Section 4.2); each square adds a rounding: so the two sums of n = B H T D squares differ by at most 2 gamma_(n + 1),
# 1.8e-4 here. Their squares differ too, by the op's inputs, which the compiled projection and normalisation round
# otherwise (by an ulp): that moves the share by a few u (measured below), far inside the bound. Measured over seeds
# 0-5, the three cases: at most 2.9e-7 of the share (TDA's; its inputs' rounding alone up to 2.7e-7), under Triton
# 3.6.0 and 3.9.0 alike, bit for bit. The loss itself adds ``x.sum()``, whose rounding in the compiled sum (the order
# of the machine's vector lanes: seed 0's loss 1.13e-6 relative with AVX-512 against 1.9e-7 with AVX2) is no part of
# the op's.
LOSS_BOUND = 2 * (BATCH * HEADS * TOKENS * DIM + 1) * 2.0 ** -24 / (1 - (BATCH * HEADS * TOKENS * DIM + 1) * 2.0 ** -24)


def _case(name: str) -> dict:
    import torch
    import torch._dynamo

    from lengthbench.compile_policy import CAPTURE_TUNING
    from lengthbench.kernels import load_op
    from lengthbench.kernels.utils import graph_node
    from lengthbench.models.attention import KERNELS

    torch.manual_seed(0)
    batch, tokens, heads, dim = BATCH, TOKENS, HEADS, DIM
    views = 5 if name == "tda" else 3
    proj = torch.nn.Linear(heads * dim, views * heads * dim)
    scale_param = torch.nn.Parameter(torch.tensor(0.3))
    beta_param = torch.nn.Parameter(torch.tensor(0.9))  # TDA's beta: a second gradient out of the op
    x = torch.randn(batch, tokens, heads * dim, requires_grad=True)

    def loss_of(x, op):
        parts = proj(x).view(batch, tokens, views, heads, dim).permute(2, 0, 3, 1, 4)
        if name == "tda":
            q1, k1, q2, k2 = (torch.nn.functional.normalize(t, dim=-1).contiguous() for t in parts[:4])
            out = op(q1, k1, q2, k2, parts[4].contiguous(), lam=torch.sigmoid(scale_param), slopes=None,
                     sm_scale=1.0, beta=beta_param, kappa=1.0, power=2.0, tau_index="alg1")
        elif name == "entmax":
            row_scale = (1.0 + scale_param) * torch.ones(batch, heads, tokens)
            out = op(parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous(), slopes=None,
                     row_scale=row_scale)
        else:
            out = op(parts[0].contiguous(), parts[1].contiguous(), parts[2].contiguous(), slopes=None)
        share = (out.float() ** 2).sum()  # the op's share of the loss (LOSS_BOUND)
        return share + x.sum(), share

    params = [x, scale_param, beta_param, *proj.parameters()]

    def run(fn, op):
        for p in params:
            p.grad = None
        loss, share = fn(x, op)
        loss.backward()
        return share.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    plain = load_op(KERNELS.get(name), CAPTURE_TUNING.get(name))
    as_node = graph_node.graph_node_op(KERNELS.get(name), CAPTURE_TUNING.get(name))
    loss0, grads0 = run(loss_of, plain)
    explained = torch._dynamo.explain(loss_of)(x, as_node)
    graph_node._GRAPHS.clear()  # explain's forward had no backward
    torch._dynamo.reset()
    loss1, grads1 = run(torch.compile(loss_of, dynamic=False), as_node)
    with torch.no_grad():
        direct = (loss_of(x, as_node)[1] - loss0).abs().item()
    scale = max(g.abs().max().item() for g in grads0)
    # The compiled forward may write over the op's inputs after the call (Inductor reuses their memory): the
    # backward is handed the inputs again (saved, or computed again into other memory) and its gradients are
    # those of the values the forward saw. Without the forward's graph (an output the forward did not give),
    # the backward runs the op's forward again on the inputs handed to it.
    tensors = [torch.randn(batch, heads, tokens, dim, requires_grad=True) for _ in range(views)]
    spec_args = (*tensors[:-1], tensors[-1])
    kwargs = dict(slopes=None) if name != "tda" else dict(lam=torch.tensor(0.4), slopes=None, sm_scale=1.0)
    reference_out = load_op(KERNELS.get(name), CAPTURE_TUNING.get(name))(*spec_args, **kwargs)
    grad_out = torch.randn_like(reference_out)
    reference = torch.autograd.grad(reference_out, tensors, grad_out)
    listed, spec = graph_node._spec(KERNELS.get(name), CAPTURE_TUNING.get(name), spec_args, kwargs)
    saved, recomputed = graph_node.STATS["saved"], graph_node.STATS["recomputed"]
    # handed the same memory, untouched (Inductor saved the inputs)
    inputs = [t.detach().clone() for t in listed]
    out = torch.ops.lengthbench.fused_forward(inputs, spec)
    kept_same = torch.ops.lengthbench.fused_backward(grad_out, out, inputs, spec)
    same_err = max((a - b).abs().max().item() for a, b in zip(kept_same, reference, strict=True))
    # handed the values again in other memory (laid out otherwise), the forward's memory written over
    inputs = [t.detach().clone() for t in listed]
    out = torch.ops.lengthbench.fused_forward(inputs, spec)
    handed = [t.detach().transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() == 4 else t.detach().clone()
              for t in listed]
    for t in inputs:
        t.normal_()  # the forward's input memory, reused
    kept = torch.ops.lengthbench.fused_backward(grad_out, out, handed, spec)
    overwritten = max((a - b).abs().max().item() for a, b in zip(kept, reference, strict=True))
    took_saved = graph_node.STATS["saved"] - saved
    again = torch.ops.lengthbench.fused_backward(grad_out, out.clone(), [t.detach() for t in listed], spec)
    recompute = max((a - b).abs().max().item() for a, b in zip(again, reference, strict=True))
    return dict(graphs=explained.graph_count, breaks=explained.graph_break_count,
                loss=(loss1 - loss0).abs().item() / loss0.item(),
                grads=max((a - b).abs().max().item() for a, b in zip(grads0, grads1, strict=True)) / scale,
                scale_grad=grads0[1].abs().item(), beta_grad=grads0[2].abs().item(), left=len(graph_node._GRAPHS), no_grad=direct,
                took_saved=took_saved, recomputed=graph_node.STATS["recomputed"] - recomputed,
                overwritten_err=overwritten, same_err=same_err, recompute_err=recompute)


@needs_triton
def test_bridge_is_one_graph_with_the_ops_gradients():
    results = interpreter_results(__file__, len(CASES))
    for index, name in enumerate(CASES):
        r = results[index]
        assert (r["graphs"], r["breaks"]) == (1, 0), (name, r)
        assert r["loss"] <= LOSS_BOUND and r["grads"] < 1e-5, (name, r)
        assert r["left"] == 0 and r["no_grad"] == 0.0, (name, r)  # the same op on the same inputs
        if name != "stickbreaking":  # the tensor argument's gradient came through the bridge
            assert r["scale_grad"] > 0, (name, r)
        if name == "tda":  # and beta's, beside lam's
            assert r["beta_grad"] > 0, (name, r)
        assert r["took_saved"] == 2 and r["overwritten_err"] < 1e-6 and r["same_err"] < 1e-6, (name, r)
        assert r["recomputed"] == 1 and r["recompute_err"] < 1e-6, (name, r)


def test_saved_inputs_are_taken_from_the_tensors_handed_to_the_backward():
    """``_Inputs``: a saved tensor that is a leaf (or a view within a contiguous leaf) is rebuilt from the tensor
    handed in that leaf's place, in other memory and laid out otherwise; two leaves in one buffer (interleaved views)
    each from its own; a saved tensor in a leaf's memory that is neither is kept as a copy; others as they are."""
    import torch

    from lengthbench.kernels.utils.graph_node import _Inputs

    torch.manual_seed(0)
    a = torch.randn(4, 6)
    base = torch.randn(4, 6)
    b, c = base[:, :3], base[:, 3:]  # two leaves in one buffer, neither contiguous
    hooks = _Inputs()
    hooks.watch([a, b, c])
    saved = {"a": a, "a_flat": a.view(24), "a_rows": a[1:3], "b": b, "c": c, "base": base, "other": torch.randn(3)}
    packed = {name: hooks.pack(t) for name, t in saved.items()}
    assert all(isinstance(packed[n], tuple) for n in ("a", "a_flat", "a_rows", "b", "c"))
    assert isinstance(packed["base"], torch.Tensor) and packed["base"].data_ptr() != base.data_ptr()
    assert packed["other"] is saved["other"]
    values = {"a": a.clone(), "b": b.clone(), "c": c.clone()}
    hooks.handed = [values["a"].t().contiguous().t(), values["b"].contiguous(), values["c"].clone()]
    for t in (a, base):
        t.normal_()  # the forward's memory, written over
    assert torch.equal(hooks.unpack(packed["a"]), values["a"])
    assert torch.equal(hooks.unpack(packed["a_flat"]), values["a"].reshape(24))
    assert torch.equal(hooks.unpack(packed["a_rows"]), values["a"][1:3])
    assert torch.equal(hooks.unpack(packed["b"]), values["b"]) and torch.equal(hooks.unpack(packed["c"]), values["c"])
    hooks.handed = None
    try:
        hooks.unpack(packed["a"])
    except RuntimeError as error:
        assert "outside the backward" in str(error)
    else:
        raise AssertionError("a saved input read outside the backward must fail")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for index in map(int, sys.argv[1].split(",")):
        print(json.dumps(dict(case=index, **_case(CASES[index]))), flush=True)
