"""benchmarks/eval_time.py on the CPU (small n): a trained run's model timed through the runner's Evaluator."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from lengthbench.config import build_config
from lengthbench.leaderboard import frame_markdown
from lengthbench.runner import run_cell

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "eval_time.py"


def test_eval_time_times_a_trained_run_and_names_a_missing_one(tmp_path):
    config = build_config("mqmtar", "entmax", "nape", "smoke", train_samples=64, batch_size=16, d_model=32,
                          n_heads=4, ffn=64, n_layers=1, max_multiplier=1, eval_samples=4, val_samples=4,
                          eval_every=2, checkpoint_every=2, diagnostics=False)
    run_cell(config, tmp_path, device="cpu", progress=False)
    out = tmp_path / "timing"
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(tmp_path), "--attns", "entmax:nape",
                           "--samples", "2", "--n", "128", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = pd.read_parquet(out / "eval_time.parquet").iloc[0]
    assert row["weights"] == f"trained: {config.run_id}" and row["samples"] == 2 and row["seconds"] > 0
    assert row["tokens"] > 128 and row["device"].startswith("cpu")
    assert f"trained: {config.run_id}" in (out / "eval_time.md").read_text()
    assert 0 <= row["accuracy_1x"] <= 1 and row["kind"] == "trained" and row["train_samples"] == 64
    # a second command adds its rows; measuring a row again replaces it
    fresh = [sys.executable, str(SCRIPT), "--attns", "softmax", "--pe", "none", "--samples", "1", "--n", "128",
             "--device", "cpu", "--out", str(out)]
    for _ in range(2):
        assert subprocess.run(fresh, capture_output=True, text=True, timeout=300).returncode == 0
    frame = pd.read_parquet(out / "eval_time.parquet")
    assert sorted(zip(frame["attn"], frame["kind"], strict=True)) == [("entmax", "trained"), ("softmax", "fresh")]
    text = (out / "eval_time.md").read_text()
    assert f"| mqmtar | 128 | trained: {config.run_id} | entmax | nape |" in text
    assert "| mqmtar | 128 | fresh | softmax | none |" in text
    missing = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(tmp_path), "--attns", "sieve:none",
                              "--n", "128", "--device", "cpu", "--out", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: no trained mqmtar:sieve:none model in {tmp_path}/checkpoints"


def test_frame_markdown_needs_no_tabulate():
    frame = pd.DataFrame({"attn": ["softmax", "entmax"], "ms": [1.23456, np.nan], "n": [1, 2]})
    assert frame_markdown(frame).splitlines() == [
        "| attn | ms | n |", "|:---|---:|---:|", "| softmax | 1.235 | 1 |", "| entmax |  | 2 |"]

