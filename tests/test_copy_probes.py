"""The Copy probe plugins (``benchmarks/copy_probes/``): the stick conventions of ``sb_variants`` against the
per-key formulas their docstrings state, and ``copy_variants``' training range. The probes' results are in
``results/copy_probes/README.md``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lengthbench.models.attention import MECHANISMS
from lengthbench.tasks import TASKS

PROBES = str(Path(__file__).resolve().parent.parent / "benchmarks" / "copy_probes")


@pytest.fixture(scope="module")
def plugins():
    """Both plugin modules, registered for this module's tests only."""
    attention, tasks = dict(MECHANISMS._entries), dict(TASKS._entries)
    sys.path.insert(0, PROBES)
    try:
        import copy_variants
        import sb_variants

        yield sb_variants, copy_variants
    finally:
        sys.path.remove(PROBES)
        for registry, before in ((MECHANISMS, attention), (TASKS, tasks)):
            registry._entries.clear()
            registry._entries.update(before)


def stick(z: torch.Tensor, keys: list[int]) -> dict[int, float]:
    """a_j = sigmoid(z_j) * prod over the later keys k in ``keys`` of (1 - sigmoid(z_k)), one row."""
    beta = torch.sigmoid(z)
    return {j: float(beta[j] * torch.prod(torch.stack([1 - beta[k] for k in keys if k > j] or [torch.ones(())])))
            for j in keys}


@pytest.mark.parametrize("tokens", [1, 2, 7])
def test_stick_conventions_follow_their_formulas(plugins, tokens):
    sb_variants, _ = plugins
    z = torch.randn(1, 1, tokens, tokens, dtype=torch.float64, generator=torch.Generator().manual_seed(tokens))
    positions = torch.arange(tokens)
    drop = sb_variants.StickBreakingDropped.weights(None, z, positions, None)[0, 0]
    self_ = sb_variants.StickBreakingSelf.weights(None, z, positions, None)[0, 0]
    norm = sb_variants.StickBreakingNormalised.weights(None, z, positions, None)[0, 0]
    for r in range(tokens):
        earlier, with_self = stick(z[0, 0, r], list(range(r))), stick(z[0, 0, r], list(range(r + 1)))
        expected_drop = torch.tensor([earlier.get(j, 0.0) for j in range(tokens)], dtype=torch.float64)
        expected_self = torch.tensor([with_self.get(j, 0.0) for j in range(tokens)], dtype=torch.float64)
        torch.testing.assert_close(drop[r], expected_drop)
        torch.testing.assert_close(self_[r], expected_self)
        if r == 0:  # no earlier key: the first row attends to itself
            torch.testing.assert_close(norm[r], torch.eye(tokens, dtype=torch.float64)[0])
        else:
            torch.testing.assert_close(norm[r], expected_drop / expected_drop.sum())
    # the query's own key breaks the stick first: its weight is sigmoid(z_rr)
    torch.testing.assert_close(torch.diagonal(self_), torch.sigmoid(torch.diagonal(z[0, 0])))
    assert torch.all(torch.triu(torch.cat([drop, self_, norm]).reshape(3, tokens, tokens), diagonal=1) == 0)


def test_copy_from1_trains_on_every_length_to_n_train(plugins):
    _, copy_variants = plugins
    task, spec = copy_variants.CopyFromOne(), TASKS.get("copy")()
    assert task.train_length_range(64) == (1, 64)
    assert spec.train_length_range(64) == (32, 64)
