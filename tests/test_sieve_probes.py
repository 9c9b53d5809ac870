"""The Sieve probe plugin ``sieve-temp`` (``benchmarks/sieve_probes/sieve_variants.py``): Sieve with its filter
on ``z / T``. Its reference against the built-in Sieve and the width bound the docstring states; its fused path
(entmax's threshold of ``z / T`` and the stick-breaking kernels) against that reference on a CUDA GPU or under
the Triton interpreter (``TRITON_INTERPRET=1``, fp32)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from lengthbench import attention_weights
from lengthbench.models.attention import MECHANISMS, causal_mask
from lengthbench.models.attention.base import diagonal_and_earlier

CUDA = torch.cuda.is_available()
PROBES = str(Path(__file__).resolve().parent.parent / "benchmarks" / "sieve_probes")


@pytest.fixture(scope="module", autouse=True)
def sieve_variants():
    """The plugin module, its mechanisms registered for this module's tests only: the other tests (and the
    sweep workers they start) see the registry as it was."""
    before = dict(MECHANISMS._entries)
    sys.path.insert(0, PROBES)
    try:
        import sieve_variants as module

        yield module
    finally:
        sys.path.remove(PROBES)
        MECHANISMS._entries.clear()
        MECHANISMS._entries.update(before)


def scores(tokens=40, seed=0, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    return spread * torch.randn(2, 3, tokens, tokens, generator=gen, dtype=torch.float64)


def temp_weights(z, T):
    layer = sys.modules["sieve_variants"].SieveTemp(d_model=32, n_heads=2, pe=None, T=T)
    mask = causal_mask(torch.arange(z.shape[-1]), z.shape[-1])
    return layer.weights(z, torch.arange(z.shape[-1]), None), mask


def test_the_runner_sees_the_fused_ops_it_calls():
    """``runner.compiles`` must not compile a model whose layers call fused ops (graph breaks crash torch 2.11):
    the probe names Sieve's ops, which its fused path calls, and with ``use_kernels`` off it takes none."""
    layer = sys.modules["sieve_variants"].SieveTemp(d_model=32, n_heads=2, pe=None, T=4.0)
    assert layer.kernel_names() == ("sieve",)
    layer.use_kernels = False
    assert layer.kernel("sieve") is None and not layer.dispatches_to_kernel()


def test_temperature_one_is_sieve():
    z = scores()
    w, mask = temp_weights(z, 1.0)
    torch.testing.assert_close(w, attention_weights("sieve", z), rtol=0, atol=0)


@pytest.mark.parametrize("T", [2.0, 4.0])
def test_the_filter_lies_within_2T_of_the_row_max_and_widens_with_T(T):
    z = scores(spread=6.0)
    w, mask = temp_weights(z, T)
    diagonal, earlier = diagonal_and_earlier(mask, torch.arange(z.shape[-1]))
    rowmax = torch.where(earlier, z, torch.tensor(float("-inf"), dtype=z.dtype)).amax(-1, keepdim=True)
    kept = (w > 0) & earlier
    assert kept.any()
    assert (z[kept] > (rowmax - 2 * T).expand_as(z)[kept]).all()
    narrower, _ = temp_weights(z, 1.0)
    assert ((narrower > 0) & earlier & ~kept).sum() == 0  # T's support holds T = 1's
    assert kept.sum() > ((narrower > 0) & earlier).sum()  # and more
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


FUSED = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                           reason="needs a CUDA GPU or TRITON_INTERPRET=1")


def check_fused_against_reference(op, weights, slopes, seed):
    """``op(q, k, v, slopes=...)`` against ``weights(z)`` of the float64 scores (ALiBi bias included), output and
    gradients, at 70 tokens over two heads (the second's slope 0)."""
    device = "cuda" if CUDA else "cpu"
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 70, 32, generator=gen) for _ in range(3))
    q = 2.0 * q
    sl = torch.tensor([0.25, 0.0]) if slopes else None
    leaves = [t.clone().to(device).requires_grad_() for t in (q, k, v)]
    out = op(*leaves, slopes=None if sl is None else sl.to(device))
    grad = torch.randn(out.shape, generator=gen).to(device)
    (out * grad).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    z = torch.matmul(ref_leaves[0], ref_leaves[1].transpose(-1, -2)) * 32 ** -0.5
    if sl is not None:
        pos = torch.arange(70)
        z = z - sl.double()[:, None, None] * (pos[:, None] - pos[None, :])
    ref = torch.matmul(weights(z), ref_leaves[2])
    (ref * grad.double().cpu()).sum().backward()
    assert (out.detach().cpu().double() - ref.detach()).abs().max() < 1e-4
    for mine, theirs in zip(leaves, ref_leaves, strict=True):
        assert (mine.grad.cpu().double() - theirs.grad).abs().max() < 1e-3


@FUSED
@pytest.mark.parametrize("T", [1.0, 4.0])
@pytest.mark.parametrize("slopes", [False, True], ids=["nope", "alibi"])
def test_fused_path_matches_the_reference(T, slopes, sieve_variants):
    check_fused_against_reference(lambda *qkv, slopes: sieve_variants.sieve_temp_op(*qkv, slopes=slopes, T=T),
                                  lambda z: temp_weights(z, T)[0], slopes, seed=3)


def test_support_width_finds_each_answers_assignment_and_measures_a_model(sieve_variants):
    """benchmarks/sieve_probes/support_width.py (session 27): each scored answer's target is the value after
    its key's most recent assignment, the stale ones its earlier assignments; on a small model every record
    keeps within the 2 T bound and the eps window holds the filter (it is the wider of the two)."""
    import numpy as np

    sys.path.insert(0, PROBES)
    try:
        import support_width
    finally:
        sys.path.remove(PROBES)
    from lengthbench.config import build_config
    from lengthbench.runner import build_model
    from lengthbench.tasks import get_task

    task = get_task("mqrar", layout="inline")
    batch = task.batch(np.arange(6), 32, "test", 0)
    sep = task.token_id("<sep>")
    answers = support_width.targets(batch.input_ids, batch.labels, sep)
    assert sum(len(rows) for rows in answers) == 6 * task.params.queries
    for b, rows in enumerate(answers):
        ids, labels = batch.input_ids[b], batch.labels[b]
        for row, (key, value), stale in rows:
            assert ids[key] == ids[row] and value == key + 1 and ids[value] == labels[row]
            assert all(ids[p] == ids[row] and p < key for p in stale[::2])
            boundary = int(np.nonzero(ids == sep)[0][0])
            assert not any(ids[j] == ids[row] for j in range(key + 1, boundary) if (j - 1) % 2 == 0)

    torch.manual_seed(0)
    config = build_config("mqrar", "sieve-temp", "none", "smoke", d_model=32, n_heads=4, ffn=64, n_layers=2,
                          attn_params={"T": 2.0}, task_params={"layout": "inline"})
    model = build_model(config, task).eval()
    records = support_width.measure(model, task, 32, 4, 0)
    assert {r["layer"] for r in records} == {0, 1} and len(records) == 2 * 4 * task.params.queries
    for r in records:
        assert all(w <= 2 * 2.0 + 1e-5 for w, k in zip(r["width"], r["kept"], strict=True) if k > 0)
        assert all(e >= k for e, k in zip(r["eps_kept"], r["kept"], strict=True))
        assert all(eh or not h for eh, h in zip(r["eps_hit"], r["hit"], strict=True))
    assert "| 1 |" in support_width.summarise(records, [32])
    assert not any("weights" in vars(layer) for layer in model.attention_layers)  # the recorder is removed


def eps_weights(z, eps, masked):
    layer = sys.modules["sieve_variants"].SieveEps(d_model=32, n_heads=2, pe=None, eps=eps, masked=masked)
    return layer.weights(z, torch.arange(z.shape[-1]), None)


def test_sieve_eps_names_the_op_it_calls_and_its_masked_form_is_sieve_alg1():
    layer = sys.modules["sieve_variants"].SieveEps(d_model=32, n_heads=2, pe=None, eps=8.0)
    assert layer.kernel_names() == ("sieve-alg1",)
    layer.use_kernels = False
    assert layer.kernel("sieve-alg1") is None and not layer.dispatches_to_kernel()
    z = scores(spread=4.0)
    torch.testing.assert_close(eps_weights(z, 3.0, 1.0), attention_weights("sieve-alg1", z, eps=3.0),
                               rtol=0, atol=0)
    kept = eps_weights(z, 3.0, 0.0)
    torch.testing.assert_close(kept.sum(-1), torch.ones_like(kept.sum(-1)))
    assert ((kept > 0) != (eps_weights(z, 3.0, 1.0) > 0)).sum() == 0  # the same keys keep weight


@FUSED
@pytest.mark.parametrize("masked", [0.0, 1.0], ids=["kept-stick", "alg1"])
@pytest.mark.parametrize("slopes", [False, True], ids=["nope", "alibi"])
def test_sieve_eps_fused_path_matches_the_reference(masked, slopes, sieve_variants):
    """``sieve-eps`` on CUDA: ``sieve_alg1_attention(masked=...)`` against the float64 reference."""
    from lengthbench.kernels.sieve import sieve_alg1_attention

    check_fused_against_reference(
        lambda *qkv, slopes: sieve_alg1_attention(*qkv, slopes=slopes, eps=3.0, masked=bool(masked)),
        lambda z: eps_weights(z, 3.0, masked), slopes, seed=5)
