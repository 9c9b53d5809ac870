"""Sieve's backward by candidate lists (``kernels/sieve/op.py``: ``_lists_bwd_kernel`` on the listed rows,
``_open_bwd_kernel`` on the open ones): dq, dk, dv, d slopes and d row_scale against the float64 dense
reference, against the backward without lists (``tuning={"lists": False}``: the threshold, then the filtered
stick-breaking kernels over all keys), with rows on both paths, and the supports the forward keeps for it.

Runs as ``test_entmax_lists.py`` does: on a CUDA GPU (fp32 and bf16) or on the CPU under the Triton
interpreter (``TRITON_INTERPRET=1``, fp32, the shorter shapes); skipped otherwise.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("triton")  # CPU-only installs (CI) have no Triton: the kernels do not import there

from test_entmax_lists import CUDA, DEVICE, DTYPES, alibi, check, make, path_counts  # noqa: E402
from test_kernels import dense_scores, rel_err, tie_rows  # noqa: E402

from lengthbench import attention_weights  # noqa: E402
from lengthbench.kernels.sieve import op as sieve  # noqa: E402
from lengthbench.kernels.utils.common import Problem  # noqa: E402

pytestmark = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")

# (tokens, head_dim); the interpreter is slow: the longer rows at a few head dims only
SHAPES = [(1, 16), (17, 32), (64, 64), (300, 32), (150, 24), (130, 40)]
if CUDA:
    SHAPES += [(1, 32), (1, 64), (17, 16), (17, 64), (64, 16), (64, 32), (300, 16), (300, 64), (1000, 32),
               (4096, 32), (4096, 64), (333, 128)]


def backward_paths(q, k, v, slopes=None, row_scale=None, tuning=None):
    """``(listed, open)`` rows of the list forward (the backward takes the same split)."""
    listed, total, *_ = path_counts("sieve", q, k, v, slopes, row_scale, tuning=tuning)
    return listed, total - listed


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}-D{s[1]}")
def test_backward_matches_reference(shape, dtype):
    """ALiBi slopes (steep, shallow, none) and a row scale, so every gradient is compared."""
    tokens, head_dim = shape
    batch = 2 if tokens < 100 else 1
    q, k, v = make(batch, 3, tokens, head_dim, dtype, seed=tokens + head_dim)
    slopes, row_scale = alibi(3, batch, tokens, seed=tokens)
    check("sieve", q, k, v, slopes=slopes, row_scale=row_scale, seed=tokens,
          label=f"bwd T={tokens} D={head_dim} {dtype}")


@pytest.mark.parametrize("list_size,head_dim", [(8, 32), (16, 16), (16, 24)])
def test_backward_on_both_paths(list_size, head_dim):
    """Short lists: rows of more candidates are left open, so both backward kernels run, with the open rows'
    fp32 outputs in a buffer of their own (``D > C``) or in their unused list slots (``D <= C``)."""
    tokens = 200
    q, k, v = make(1, 2, tokens, head_dim, torch.float32, seed=21, scale=0.6)
    slopes, row_scale = alibi(2, 1, tokens, seed=5)
    tuning = dict(list_size=list_size)
    listed, open_ = backward_paths(q, k, v, slopes, row_scale, tuning=tuning)
    assert min(listed, open_) >= 0.05 * (listed + open_), (listed, open_)
    check("sieve", q, k, v, slopes=slopes, row_scale=row_scale, seed=21, label=f"lists of {list_size}",
          tuning=tuning)


def test_backward_one_key_supports():
    """Steep slopes (16: ``X_{r-1} - X_{r-2} >= 4 + (s_1 - s_2) / 4`` for N(0, 1) scores ``s``, far above 1):
    every listed row's support is the key just before it, ``dz = sigma (1 - sigma) (g_{r-1} - g_r)``."""
    q, k, v = make(1, 2, 130, 32, torch.float32, seed=9)
    _, row_scale = alibi(2, 1, 130, seed=4)
    slopes = torch.full((2,), 16.0, device=DEVICE)
    pb = Problem(q, k, v, slopes, row_scale, None)
    _, ncand, saved = sieve._lists_forward(pb, True)
    nsup, lists = saved[3], saved[2]
    listed = ncand > 0
    assert listed[:, 1:].all() and (nsup[listed] == 1).all()
    assert (lists[:, 1:, 0] == torch.arange(129, device=DEVICE, dtype=torch.int32)).all()
    check("sieve", q, k, v, slopes=slopes, row_scale=row_scale, label="bwd one-key supports")


def test_backward_near_uniform_scores():
    """Tiny scores (wide supports): most rows take the open backward."""
    q, k, v = make(1, 2, 200, 32, torch.float32, seed=12, scale=0.05)
    _, row_scale = alibi(2, 1, 200, seed=6)
    listed, open_ = backward_paths(q, k, v, None, row_scale)
    assert open_ > listed > 0, (listed, open_)
    check("sieve", q, k, v, row_scale=row_scale, seed=2, label="bwd near-uniform")


@pytest.mark.parametrize("tokens,head_dim,list_size", [(257, 32, 64), (200, 16, 8)])
def test_backward_agrees_with_old(tokens, head_dim, list_size):
    """The list backward's gradients equal the old backward's to rounding (near-tie rows aside). The slopes'
    gradient within 1e-3: the old backward's ``C_r - sum_{j >= k} c_j`` cancels for the keys far from the
    diagonal, which the slope weighs by ``r - j`` (3e-4 from the float64 reference at T 300 under the
    interpreter, against 5e-5 for the list backward's direct sums)."""
    q, k, v = make(1, 3, tokens, head_dim, torch.float32, seed=41, scale=0.9)
    slopes, row_scale = alibi(3, 1, tokens, seed=8)
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(head_dim), slopes.double(), row_scale.double())
    keep = ~tie_rows("sieve", z, q, k, None, slopes, row_scale)[..., None]
    results = []
    for tuning in (dict(list_size=list_size), dict(lists=False)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, slopes, row_scale)]
        out = sieve.sieve_attention(*leaves[:3], slopes=leaves[3], row_scale=leaves[4], tuning=tuning)
        gen = torch.Generator(device=DEVICE).manual_seed(1)
        (out * torch.randn(out.shape, device=DEVICE, generator=gen) * keep).sum().backward()
        results.append([out.detach() * keep] + [t.grad for t in leaves])
    for label, a, b in zip(["out", "dq", "dk", "dv", "dslopes", "drow_scale"], *results, strict=True):
        err = rel_err(a, b)
        print(f"ERR sieve lists bwd vs old T={tokens} D={head_dim} C={list_size} {label} {err:.2e}")
        assert err <= (1e-3 if label == "dslopes" else 1e-4), (label, err)


def test_forward_keeps_the_supports():
    """With gradients, the listed rows' lists hold their supports (from the dense float64 threshold, near-tie
    rows aside) and ``nsup`` their sizes (-1 on the open rows)."""
    tokens, head_dim = 300, 32
    q, k, v = make(1, 2, tokens, head_dim, torch.float32, seed=31)
    pb = Problem(q, k, v, None, None, None)
    _, ncand, saved = sieve._lists_forward(pb, True)
    lists, nsup = saved[2], saved[3]
    assert ((ncand > 0) == (nsup >= 0)).all()
    z = dense_scores(q.double(), k.double(), 1.0 / math.sqrt(head_dim), None, None)
    earlier = torch.ones(tokens, tokens, dtype=torch.bool, device=z.device).tril(-1)
    support = ((attention_weights("sieve", z) > 0) & earlier).reshape(-1, tokens, tokens).cpu()
    ties = tie_rows("sieve", z, q, k, None, None, None).reshape(-1, tokens).cpu()
    lists, nsup = lists.cpu(), nsup.cpu()
    checked = 0
    for bh in range(support.shape[0]):
        for row in range(1, tokens):
            n = int(nsup[bh, row])
            if n < 0 or ties[bh, row]:
                continue
            keys = sorted(lists[bh, row, :n].tolist())
            assert keys == support[bh, row].nonzero().flatten().tolist(), (bh, row, keys)
            checked += 1
    assert checked >= 0.8 * support.shape[0] * tokens, checked
