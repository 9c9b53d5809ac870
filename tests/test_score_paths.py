"""benchmarks/score_paths.py: a trained model scored through its fused ops and its dense references."""

import json
import subprocess
import sys
from pathlib import Path

from lengthbench.config import build_config
from lengthbench.runner import run_cell

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "score_paths.py"


def test_score_paths_scores_both_paths_and_rejects_an_unknown_run(tmp_path):
    config = build_config("2back", "entmax", "nape", "smoke", train_samples=800, d_model=32, n_heads=4, ffn=64,
                          n_layers=1, max_multiplier=1, eval_samples=8, val_samples=8, eval_every=25,
                          checkpoint_every=25, diagnostics=False)
    run_cell(config, tmp_path, device="cpu", progress=False)
    done = subprocess.run([sys.executable, str(SCRIPT), "--results", str(tmp_path), "--run", config.run_id,
                           "--multipliers", "1,2", "--samples", "8", "--device", "cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / f"score_paths-{config.run_id}.json").read_text())["rows"]
    assert [row["multiplier"] for row in rows] == [1, 2] and [row["n"] for row in rows] == [64, 128]
    for row in rows:  # on a CPU both paths are the references
        assert row["fused_token_accuracy"] == row["reference_token_accuracy"]
        assert 0 < row["fused_token_accuracy"] <= 1
    assert "2x (n = 128): exact match fused" in done.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--results", str(tmp_path), "--run", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no trained model for run 'nope'")
    assert len(bad.stderr.strip().splitlines()) == 1
