"""benchmarks/rescue_model.py: the numpy model behind the entmax kernel's ``rescue`` (CPU, fast)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from rescue_model import entmax15_threshold, model  # noqa: E402


def test_threshold_solves_the_entmax_equation():
    rng = np.random.default_rng(1)
    for scale in (0.05, 1.0, 20.0):
        x = rng.standard_normal(500) * scale
        t = entmax15_threshold(x)
        assert abs(np.sum(np.maximum(x - t, 0.0) ** 2) - 1.0) < 1e-9
    assert abs(entmax15_threshold(np.array([3.0, -5.0])) - 2.0) < 1e-12  # one key: X_max - 1


def test_model_counts_are_consistent():
    """Few keys per column (2 or 4): the top 4 hold them all, so no row is open; many (64): some are, and a
    rescue scans a small share of the keys, more for wider supports."""
    assert model(128, 16, 1.0, rows=20, seed=0)["open"] == 0.0
    assert model(256, 16, 0.3, rows=20, seed=0)["open"] == 0.0
    sharp = model(4096, 32, 1.0, rows=40, seed=0)
    wide = model(4096, 32, 0.5, rows=40, seed=0)
    assert 0.0 < sharp["open"] < wide["open"] <= 1.0
    assert 0.0 < sharp["scanned"] < wide["scanned"] <= 1.0
    assert sharp["fit"] >= wide["fit"]
