"""What the tests of the fused ops under the Triton interpreter share: the worker processes that run their cases
(``TRITON_INTERPRET=1`` must be set before Triton is imported), the error measure, the float64 entmax threshold."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed (scripts/setup.sh installs it)")


def interpreter_results(script: str, count: int) -> dict[int, dict]:
    """Every case's record from ``script`` (a test file run as a worker: ``script INDEX,INDEX,...`` prints one
    JSON line a case with its ``case`` index) under the interpreter: two workers (the CPU's two cores), half of
    the cases each."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    halves = [list(range(0, count, 2)), list(range(1, count, 2))]
    workers = [subprocess.Popen([sys.executable, script, ",".join(map(str, half))], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for half in halves]
    results = {}
    for process in workers:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
        for line in stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record.pop("case")] = record
    return results


def rel_err(a, b) -> float:
    """``max |a - b| / max(max |b|, 0.01)``, in float64 (0 for empty tensors)."""
    if b.numel() == 0:
        return 0.0
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-2)).item()


def entmax_threshold64(x, alpha):
    """The alpha-entmax threshold of each row of ``x`` (float64, bisection; ``-inf`` entries left out)."""
    import torch

    power = 1.0 / (alpha - 1.0)
    finite = torch.isfinite(x)
    top = torch.where(finite, x, torch.full_like(x, -1e300)).amax(-1)
    lo, hi = top - 1.0, top
    for _ in range(100):
        mid = (lo + hi) / 2
        mass = torch.where(finite, torch.clamp(x - mid[..., None], min=0) ** power, torch.zeros_like(x)).sum(-1)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    return torch.where(finite.any(-1), lo, torch.zeros_like(lo))
