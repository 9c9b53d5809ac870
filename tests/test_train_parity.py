"""benchmarks/train_parity.py without a GPU: its summary and its argument errors (CPU, fast)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import train_parity as parity  # noqa: E402


def test_summary_compares_the_steps_seed_means_with_the_seed_spread():
    rows = pd.DataFrame([
        dict(cell="mqrar:stickbreaking:none", seed=0, train_step="graph-compiled", id_token_accuracy=0.50),
        dict(cell="mqrar:stickbreaking:none", seed=1, train_step="graph-compiled", id_token_accuracy=0.60),
        dict(cell="mqrar:stickbreaking:none", seed=0, train_step="compiled", id_token_accuracy=0.70),
        dict(cell="mqrar:stickbreaking:none", seed=1, train_step="compiled", id_token_accuracy=0.74),
    ])
    table = parity.summary(rows, ["graph-compiled", "compiled"])
    row = table.iloc[0]
    assert row["graph-compiled 1x token acc"] == pytest.approx(0.55)
    assert row["compiled 1x token acc"] == pytest.approx(0.72)
    assert row["compiled - graph-compiled"] == pytest.approx(0.17)
    assert row["seed spread"] == pytest.approx(0.10)  # the larger of the two steps' spreads
    assert row["seeds"] == 2


def test_a_malformed_cell_is_a_usage_error():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_parity.py"), "--device", "cpu",
                           "--cells", "mqrar:stickbreaking"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "task:attn:pe" in done.stderr
