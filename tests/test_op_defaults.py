"""Every fused op at its defaults is its mechanism at the mechanism's defaults: each op of the registry
(``lengthbench.kernels``, every mechanism with a fused kernel), called with its tensors only, against
``attention_weights(name, z) @ v`` with only the parameters that have no default (``head_dim``, TDA's second view),
in float64, on the CPU under the Triton interpreter. The defaults both sides read are ``kernels/defaults.py``'s; this
checks that no op keeps one of its own.

The scores spread over about +-10 (q and k N(0, 2^2), head dim 16), so that a parameter that moves a filter, a
threshold or a denominator moves the output (sieve-window at eps 8 for its 2: 0.8 of the output's scale); the ops whose
``sm_scale`` defaults to 1 take cosine scores (unit q and k), as their modules give them. ``TRITON_INTERPRET=1`` must
be set before Triton is imported: the cases run in worker processes (this file run as a script).
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

from interpreter_helpers import interpreter_results, needs_triton, rel_err

from lengthbench.models.attention import kernel_names

CASES = kernel_names()
BATCH, HEADS, TOKENS, DIM = 1, 2, 24, 16
TOLERANCE = 1e-4  # max |op - reference| / max(max |reference|, 0.01) (fp32 rounding: ~1e-6)


def _case(name: str) -> dict:
    import importlib

    import torch

    from lengthbench import attention_weights
    from lengthbench.models.attention import KERNELS, WEIGHT_FUNCTIONS, load_kernel

    op = load_kernel(name)
    module, function = KERNELS.get(name).split(":")
    signature = inspect.signature(getattr(importlib.import_module(module), function))
    tensors = [p for p in signature.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    sm_scale = signature.parameters["sm_scale"].default
    cosine = sm_scale is not None  # (1: cosine scores of unit q and k)
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    inputs = [torch.randn(BATCH, HEADS, TOKENS, DIM, generator=gen, dtype=torch.float64) * 2.0 for _ in tensors]
    if cosine:
        inputs[:-1] = [torch.nn.functional.normalize(t, dim=-1) for t in inputs[:-1]]
    scale = sm_scale if cosine else 1.0 / math.sqrt(DIM)
    views = [inputs[i] @ inputs[i + 1].transpose(-1, -2) * scale for i in range(0, len(inputs) - 1, 2)]
    required = {}  # the reference's parameters without a default
    wanted = inspect.signature(WEIGHT_FUNCTIONS.get(name)).parameters
    if "head_dim" in wanted:
        required["head_dim"] = DIM
    if "scores2" in wanted:
        required["scores2"] = views[1]
    want = attention_weights(name, views[0], **required) @ inputs[-1]
    with torch.no_grad():
        got = op(*(t.float() for t in inputs))
    return dict(err=rel_err(got, want), finite=bool(torch.isfinite(got).all()))


@needs_triton
def test_every_op_at_its_defaults_is_its_mechanism_at_its_defaults():
    results = interpreter_results(__file__, len(CASES))
    assert sorted(results) == list(range(len(CASES)))
    for index, name in enumerate(CASES):
        print(f"{name}: {results[index]}")
    off = {name: results[index] for index, name in enumerate(CASES)
           if not (results[index]["finite"] and results[index]["err"] <= TOLERANCE)}
    assert not off, f"ops whose defaults are not their mechanism's: {off}"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for index in map(int, sys.argv[1].split(",")):
        print(json.dumps(dict(case=index, **_case(CASES[index]))), flush=True)
