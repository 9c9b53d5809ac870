"""benchmarks/mqrar_slot_attention.py: the positions it reads attention at, and a run end to end on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from lengthbench.config import build_config
from lengthbench.runner import load_model, run_cell
from lengthbench.tasks import get_task

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "mqrar_slot_attention.py"
spec = importlib.util.spec_from_file_location("mqrar_slot_attention", SCRIPT)
slot_attention = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slot_attention)


@pytest.mark.parametrize("n", [16, 64])
def test_slot_positions_point_at_the_query_key_and_its_most_recent_value(n):
    task = get_task("mqrar")
    batch = task.batch(list(range(32)), n, "test", 3)
    for b in range(32):
        ids = batch.input_ids[b, : int(batch.realised_tokens[b])]
        slots = slot_attention.slot_positions(ids, n, task.params.queries)
        assert len(slots) == task.params.queries
        for slot in slots:
            (own,), (value,), (assigned,) = slot["own key"], slot["value"], slot["assigned key"]
            assert task.vocab[ids[slot["slot"]]] == "<q>" and task.vocab[ids[own - 1]] == "<q>"
            assert batch.labels[b, slot["slot"]] == ids[value]  # the slot's target is that value
            assert ids[assigned] == ids[own] and value == assigned + 1
            later = [p for p in range(assigned + 2, n + 1, 2) if ids[p] == ids[own]]
            assert not later  # no later assignment of the key
            assert own not in slot["other keys"] and len(slot["other keys"]) == task.params.queries - 1


def test_the_script_measures_a_trained_run(tmp_path):
    config = build_config(task="mqrar", attn="stickbreaking", pe="none", preset="smoke", train_length=16,
                          train_samples=640, max_multiplier=1, eval_samples=4)
    run_cell(config, tmp_path, device="cpu", progress=False)
    run_id = config.run_id
    model, task, config = load_model(tmp_path, run_id)
    with torch.no_grad():
        report = slot_attention.measure(model, task, config, 16, 3)
    assert report["slots"] == 3 * task.params.queries and len(report["layers"]) == config.n_layers
    for entry in report["layers"]:
        for name in (*slot_attention.TARGETS, *(f"key: {k}" for k in slot_attention.KEY_TARGETS)):
            assert 0.0 <= entry[name]["mean_weight"] <= (task.params.queries - 1) + 1e-6
            assert 0.0 <= entry[name]["top1"] <= 1.0
    assert slot_attention.main(["--results", str(tmp_path), "--run", run_id, "--samples", "2",
                                "--out", str(tmp_path / "out")]) == 0
    assert np.isfinite(list(report["layers"][0]["own key"].values())).all()
    assert (tmp_path / "out" / f"slot_attention-{run_id}-n16.md").exists()
