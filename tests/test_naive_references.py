"""Every fused op's short reference (``kernels/<op>/naive.py``, q, k, v to o in plain PyTorch) against its
mechanism's dense weight map (``attention_weights``), in float64 on the CPU: the two references agree, so the one
beside a kernel says what the kernel computes."""

from __future__ import annotations

import importlib

import pytest
import torch

from lengthbench import attention_weights
from lengthbench.models.attention import KERNELS, kernel_names


def naive_of(mechanism: str):
    """The naive reference of ``mechanism``'s registered op: ``NAIVE[mechanism]`` of the ``naive.py`` beside it."""
    package = KERNELS.get(mechanism).split(":")[0]
    return importlib.import_module(f"{package}.naive").NAIVE[mechanism]


@pytest.mark.parametrize("mechanism", kernel_names())
@pytest.mark.parametrize("tokens", [1, 13])
def test_naive_reference_is_the_mechanisms_weight_map(mechanism, tokens):
    gen = torch.Generator().manual_seed(tokens)
    dim = 8
    q, k, v, q2, k2 = (torch.randn(2, 3, tokens, dim, generator=gen, dtype=torch.float64) for _ in range(5))
    if mechanism in ("tra", "tda"):  # cosine scores: the module hands the op unit queries and keys
        q, k, q2, k2 = (torch.nn.functional.normalize(t, dim=-1) for t in (q, k, q2, k2))
        scores = q @ k.transpose(-1, -2)
        params = {"head_dim": dim}
        if mechanism == "tda":
            params["scores2"] = q2 @ k2.transpose(-1, -2)
        got = naive_of(mechanism)(q, k, q2, k2, v) if mechanism == "tda" else naive_of(mechanism)(q, k, v)
    else:
        scores = q @ k.transpose(-1, -2) * dim ** -0.5
        params = {}
        got = naive_of(mechanism)(q, k, v)
    want = attention_weights(mechanism, scores, **params).double() @ v
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-7 if mechanism != "adatemp" else 1e-6)


def test_every_op_has_a_naive_reference():
    for mechanism in kernel_names():
        assert callable(naive_of(mechanism)), mechanism
