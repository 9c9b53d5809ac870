"""The kernel registry's CPU-side contract (the ops themselves are tested on the GPU in test_kernels.py)."""

from __future__ import annotations

import torch

from lengthbench import kernels


def test_ops_get_their_tensors_in_the_dtype_of_the_last():
    """Under bf16 autocast the modules hand fp32 unit q/k beside bf16 v; the op must see one dtype."""
    seen = []

    def op(*tensors, **kwargs):
        seen.append(([t.dtype for t in tensors], kwargs))
        return tensors[0]

    wrapped = kernels._same_dtype(op)
    q = torch.ones(1, dtype=torch.float32)
    v = torch.ones(1, dtype=torch.bfloat16)
    out = wrapped(q, q, v, sm_scale=1.0)
    assert seen[-1] == ([torch.bfloat16] * 3, {"sm_scale": 1.0}) and out.dtype == torch.bfloat16
    wrapped(q, q, q, q, v.float())  # tda's five tensors, already alike: unchanged
    assert seen[-1][0] == [torch.float32] * 5


def test_no_op_is_left_unverified_and_unknown_names_get_none():
    assert kernels.UNVERIFIED == frozenset()
    assert kernels.get_kernel("no-such-mechanism") is None
