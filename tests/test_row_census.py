"""benchmarks/row_census.py: the census of why list-forward rows stay open (CPU, fast)."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from rescue_model import entmax15_threshold  # noqa: E402
from row_census import census, newton_passes, summary, threshold  # noqa: E402


def test_threshold_matches_the_numpy_model_and_sparsemax():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 300, generator=gen, dtype=torch.float64) * 2
    x[1, 100:] = float("-inf")  # absent keys
    t = threshold(x, 0.5)
    for i in range(5):
        row = x[i][torch.isfinite(x[i])].numpy()
        assert abs(float(t[i]) - entmax15_threshold(row)) < 1e-9
    s = threshold(x, 1.0)
    assert torch.allclose((x - s[:, None]).clamp_min(0).sum(1), torch.ones(5, dtype=torch.float64))


def test_newton_passes_reach_the_root_from_below():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 500, generator=gen, dtype=torch.float64)
    exact = threshold(x, 0.5)
    assert (newton_passes(x, exact, 0.5) == 1).all()  # at the root: one pass moves by < tol
    far = newton_passes(x, exact - 3.0, 0.5)
    assert (far > 2).all() and (far < 40).all()


def test_census_sees_ties_and_open_rows():
    """Repeated keys (a NoPE first layer: a key's score depends on its token only) give supports of tied
    values, more keys a column than the first stage keeps (open), which the census records; distinct keys at
    a sharp scale are certified."""
    gen = torch.Generator().manual_seed(2)
    tokens, dim = 2048, 16
    q = torch.randn(1, 2, tokens, dim, generator=gen)
    k = torch.randn(1, 2, tokens, dim, generator=gen) * 3
    k[0, 1] = k[0, 1, torch.arange(tokens) % 8]  # head 1: 8 distinct keys, repeated
    ncand = torch.ones(2, tokens, dtype=torch.int32)
    ncand[1] = 0
    records = census(q, k, ncand, xs=0.5, strict=True, sm_scale=dim ** -0.5, bns=64, rows=24, seed=0)
    frame = pd.DataFrame(records)
    assert len(frame) == 48 and (frame["keys"] == frame["row"]).all()  # strict: j < r
    sharp, tied = frame[frame["bh"] == 0], frame[frame["bh"] == 1]
    late = tied[tied["row"] > 1024]
    assert (late["distinct"] < late["support"]).all() and (late["support"] > 64).all()
    assert (~late["certified"]).all() and (~late["fits"]).all()
    assert sharp["listed"].all() and (~tied["listed"]).all()
    assert sharp["certified"].mean() > 0.5 and (sharp["support"] < 64).mean() > 0.9
    assert (frame["span"] <= frame["row"]).all()
    text = summary(frame)
    assert "open: 24 rows" in text and "listed: 24 rows" in text
    assert np.isfinite(frame[["support", "newton", "candidates"]].to_numpy()).all()


def test_walk_stops_where_the_stick_is_spent():
    """One key far above the rest (z 100: softplus 100 > 60 nats): the walk of the rows after it ends there;
    before it every score is low (-20), the stick is never spent and the walk reaches key 0."""
    tokens, dim = 256, 4
    q = torch.zeros(1, 1, tokens, dim)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, tokens, dim)
    k[..., 0] = -40.0  # z = -20: softplus 2e-9, the stick never spent
    k[0, 0, 100, 0] = 200.0  # z = 200 * sm_scale (0.5) = 100
    ncand = torch.zeros(1, tokens, dtype=torch.int32)
    frame = pd.DataFrame(census(q, k, ncand, xs=0.5, strict=True, sm_scale=0.5, bns=16, rows=64, seed=0))
    after = frame[frame["row"] > 100]
    assert len(after) > 5 and (after["support"] == 1).all() and (after["walk"] == after["row"] - 100).all()
    before = frame[frame["row"] <= 100]
    assert len(before) > 5 and (before["walk"] == before["row"]).all()
