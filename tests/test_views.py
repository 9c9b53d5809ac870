"""``kernels/qkv_heads/op.py`` (the query, key and value views of the fused projections, one op each way) against the
model's float64 reference prologue (``RoPE.rotate``, ``F.normalize`` for TDA's unit views, the copies to ``[B, H, T,
D]``): outputs and the gradients of both projections. On the CPU under the Triton interpreter (this file run as a
worker, as ``test_kernels_interpreter.py``), fp32; on the GPU, fp32, bf16 and fp16 at training and long lengths. The
whole layers and training steps on the op: ``test_attention_cuda.py``, ``test_train_step_gpu.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from interpreter_helpers import interpreter_results, needs_triton, rel_err

# (batch, tokens, heads, head_dim, two views, rope, tiny, norm, extra, tuning): ``tiny`` sets one query row to norm
# 1e-8, below the norm's eps (F.normalize's clamp); ``norm``, unit views (TDA's, ``unit_views``) or the rows as they
# are (``head_views``); ``extra``, columns after ``qkv``'s in a wider projection it is a slice of (ASEntmax's
# ``w_beta`` and ``w_gamma``); ``tuning``, launch tiles other than the defaults (``views.TILES``)
CASES = [(2, 37, 3, 8, True, True, True, True, 0, None), (2, 37, 3, 8, True, False, False, True, 0, None),
         (1, 1, 2, 16, True, True, False, True, 0, None), (2, 33, 2, 32, False, True, True, True, 0, None),
         (1, 70, 1, 6, False, False, False, True, 0, None),
         (2, 37, 3, 8, True, True, True, True, 0, {"fwd": (16, 2), "bwd": (64, 1)}),
         (2, 37, 3, 8, False, True, False, False, 0, None), (2, 33, 2, 32, False, False, False, False, 0, None),
         (3, 29, 4, 8, False, True, False, False, 8, None), (1, 1, 2, 16, False, True, False, False, 4, None),
         (2, 37, 3, 8, False, True, False, False, 6, {"fwd": (8, 1), "bwd": (128, 2)})]


def reference(qkv, qk2, heads, inv_freq, table_dtype, norm=True):
    """The model's prologue (``AttentionLayer.split_qkv``; ``TwoViewAttention.views_of`` with TDA's ``unit`` where
    ``norm``), in the inputs' dtype, RoPE's tables rounded to ``table_dtype`` (as the model rounds them to its
    activations')."""
    import torch
    import torch.nn.functional as F

    from lengthbench.models.positional import _rotate

    batch, tokens, width = qkv.shape
    head_dim = width // (3 * heads)
    q1, k1, v = qkv.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    pairs = [(q1, k1)]
    if qk2 is not None:
        q2, k2 = qk2.view(batch, tokens, 2, heads, head_dim).permute(2, 0, 3, 1, 4)
        pairs.append((q2, k2))
    out = []
    for q, k in pairs:
        if inv_freq is not None:
            angles = torch.arange(tokens, device=qkv.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
            cos = torch.cat([angles.cos(), angles.cos()], -1).to(table_dtype).to(qkv.dtype)
            sin = torch.cat([angles.sin(), angles.sin()], -1).to(table_dtype).to(qkv.dtype)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out += [F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)] if norm else [q, k]
    return [*out, v]


def errors(case, device="cpu", dtype_name="float32", seed=0) -> dict:
    """Relative errors of the op's outputs and of the gradients of ``qkv`` and ``qk2`` against float64."""
    import torch

    from lengthbench.kernels.qkv_heads import head_views, unit_views
    from lengthbench.models.positional import RoPE

    batch, tokens, heads, head_dim, two, rope, tiny, norm, extra, tuning = case
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim + extra, generator=generator, dtype=torch.float64)
    qk2 = torch.randn(batch, tokens, 2 * heads * head_dim, generator=generator, dtype=torch.float64) if two else None
    if tiny:
        qkv[0, tokens // 2, :head_dim] = 1e-8
    qkv, qk2 = (None if t is None else t.to(dtype).to(device) for t in (qkv, qk2))  # the op's inputs, rounded
    inv_freq = RoPE(heads, head_dim).inv_freq.to(device) if rope else None
    leaves = [t.clone().requires_grad_() for t in (qkv, qk2) if t is not None]
    exact = [t.double().requires_grad_() for t in (qkv, qk2) if t is not None]
    width = 3 * heads * head_dim
    if norm:
        got = unit_views(leaves[0], leaves[1] if two else None, heads, inv_freq, tuning)
    else:  # the rows of a slice where ``extra``: the op reads them in place
        got = head_views(leaves[0][..., :width], heads, inv_freq, tuning)
    want = reference(exact[0][..., :width], exact[1] if two else None, heads, inv_freq, dtype, norm)
    weights = [torch.randn(w.shape, generator=generator, dtype=torch.float64).to(device) for w in want]
    sum((w.to(dtype) * g).float().sum() for w, g in zip(weights, got, strict=True)).backward()
    sum((w.to(dtype).double() * g).sum() for w, g in zip(weights, want, strict=True)).backward()  # the same upstream
    # a clamped row's gradient is 1/eps times its upstream one: relative to each row's own largest entry
    grads = [rel_err(a.grad / a.grad.double().abs().amax(-1, keepdim=True).clamp_min(1e-2).to(a.grad.dtype),
                     b.grad / b.grad.abs().amax(-1, keepdim=True).clamp_min(1e-2))
             for a, b in zip(leaves, exact, strict=True)]
    return dict(out=max(rel_err(g, w) for g, w in zip(got, want, strict=True)), grads=grads,
                contiguous=all(g.is_contiguous() for g in got), shapes=[list(g.shape) for g in got],
                dtypes=sorted({str(g.dtype) for g in got}),
                extra_grad=0.0 if not extra else leaves[0].grad[..., width:].abs().max().item())


@pytest.fixture(scope="module")
def measured():
    return interpreter_results(str(Path(__file__).resolve()), len(CASES))


@needs_triton
@pytest.mark.parametrize("index", range(len(CASES)))
def test_views_match_float64_reference(index, measured):
    batch, tokens, heads, head_dim, two, *_ = CASES[index]
    record = measured[index]
    assert record["out"] < 1e-6 and max(record["grads"]) < 1e-6, record
    assert record["extra_grad"] == 0.0, record  # the columns after a slice's get none
    assert record["contiguous"] and record["dtypes"] == ["torch.float32"]
    assert record["shapes"] == [[batch, heads, tokens, head_dim]] * (5 if two else 3)


@needs_triton
def test_unit_views_refuse_bad_shapes():
    import torch

    from lengthbench.kernels.qkv_heads import unit_views

    with pytest.raises(ValueError, match=r"qkv must be \[B, T, 3 H D\]"):
        unit_views(torch.zeros(1, 4, 10), None, 2)
    with pytest.raises(ValueError, match="head dimension must be even"):
        unit_views(torch.zeros(1, 4, 18), None, 2)
    with pytest.raises(ValueError, match=r"qk2 must be \[B, T, 2 H D\]"):
        unit_views(torch.zeros(1, 4, 24), torch.zeros(1, 4, 12), 2)
    with pytest.raises(ValueError, match=r"cos and sin must be \[T, D / 2\]"):
        unit_views(torch.zeros(1, 4, 24), None, 2, torch.ones(3))
    for tuning, said in (({"fwd": (24, 4)}, "rows a power of 2"), ({"bwd": (32, 3)}, "warps one of"),
                         ({"rows": 32}, "unknown keys")):
        with pytest.raises(ValueError, match=said):
            unit_views(torch.zeros(1, 4, 24), None, 2, tuning=tuning)


def test_tda_hands_the_op_only_rotations_it_computes():
    """TDA's layer gives ``unit_views`` RoPE's frequencies, None for encodings without a rotation, and False (the
    model's own prologue) for an encoding that rotates otherwise, a subclass of RoPE's included."""
    import torch

    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import RoPE, build_pe

    def rotation(pe):
        return ATTENTION.get("tda")(64, 4, pe).views_rotation()

    assert torch.equal(rotation(build_pe("rope", 4, 16)), build_pe("rope", 4, 16).inv_freq)
    for name in ("none", "alibi", "nape"):
        assert rotation(build_pe(name, 4, 16)) is None

    class Shifted(RoPE):
        def rotate(self, q, k, positions):
            return super().rotate(q, k, positions + 1)

    assert rotation(Shifted(4, 16)) is False


@pytest.mark.parametrize("attn", ["entmax", "asentmax", "sieve", "stickbreaking", "tra", "tda", "softmax"])
def test_the_views_choice_traces_without_a_graph_break(attn, monkeypatch):
    """Whether a layer takes the views op is decided inside the forward that torch.compile traces: without loading
    an op (``importlib`` there broke ASEntmax's compiled training step), as a graph of its own (``fullgraph``)."""
    import torch

    from lengthbench import kernels
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import build_pe

    monkeypatch.setattr(kernels, "triton_available", lambda: True)  # as on a GPU
    layer = ATTENTION.get(attn)(64, 4, build_pe("rope", 4, 16))
    torch._dynamo.reset()
    decided = torch.compile(lambda x: x + 1 if layer.dispatches_to_kernel() else x - 1, backend="eager",
                            fullgraph=True)(torch.zeros(2))
    assert torch.equal(decided, torch.full((2,), 1.0 if attn != "softmax" else -1.0))  # softmax's is SDPA


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, bound", [("float32", 1e-5), ("bfloat16", 1e-2), ("float16", 2e-3)])
@pytest.mark.parametrize("case", [(4, 91, 8, 32, True, True, True, True, 0, None),
                                  (2, 131, 8, 32, True, False, False, True, 0, None),
                                  (1, 4096, 4, 64, True, True, False, True, 0, None),
                                  (2, 300, 4, 16, False, True, True, True, 0, None),
                                  (4, 91, 16, 32, False, True, False, False, 32, None),
                                  (4, 131, 16, 16, False, False, False, False, 0, None),
                                  (1, 4096, 4, 64, False, True, False, False, 8, None)])
def test_views_on_the_gpu(case, dtype, bound):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if dtype == "float16" and case[6]:  # a clamped row's gradient, 1e6 times its upstream one, overflows fp16
        case = (*case[:6], False, *case[7:])
    record = errors(case, "cuda", dtype, seed=1)
    assert record["out"] < bound and max(record["grads"]) < bound, record
    assert record["extra_grad"] == 0.0, record
    assert record["contiguous"] and record["dtypes"] == [f"torch.{dtype}"]


if __name__ == "__main__":  # a worker of ``interpreter_results``: one JSON line a case
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for index in map(int, sys.argv[1].split(",")):
        print(json.dumps(dict(case=index, **errors(CASES[index]))), flush=True)
