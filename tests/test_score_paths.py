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


def test_score_paths_loads_a_plugins_run_through_lengthbench_plugins(tmp_path):
    """A run of a plugin's mechanism (the Sieve probe ``sieve-temp``) scores with ``LENGTHBENCH_PLUGINS`` set, as
    the CLI loads it; without it, one line and exit code 2 instead of a traceback."""
    import os

    probes = str(SCRIPT.parent / "sieve_probes")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sieve_variants\n"
        "from pathlib import Path\n"
        "from lengthbench.config import build_config\n"
        "from lengthbench.runner import run_cell\n"
        "c = build_config('mqrar', 'sieve-temp', 'none', 'smoke', train_samples=400, d_model=32, n_heads=4, ffn=64,"
        " n_layers=1, max_multiplier=1, eval_samples=4, val_samples=4, eval_every=25, checkpoint_every=25,"
        " diagnostics=False, attn_params={'T': 4.0}, task_params={'layout': 'inline'})\n"
        "run_cell(c, Path(sys.argv[2]), device='cpu', progress=False)\n"
        "print(c.run_id)\n"
    )
    made = subprocess.run([sys.executable, "-c", code, probes, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr
    run_id = made.stdout.strip().splitlines()[-1]
    command = [sys.executable, str(SCRIPT), "--results", str(tmp_path), "--run", run_id, "--multipliers", "1",
               "--samples", "4", "--device", "cpu"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [probes, os.environ.get("PYTHONPATH")])),
               LENGTHBENCH_PLUGINS="sieve_variants")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "1x (n = 64): exact match fused" in done.stdout
    env.pop("LENGTHBENCH_PLUGINS")
    bad = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "unknown attention mechanism 'sieve-temp'" in bad.stderr
    assert "LENGTHBENCH_PLUGINS" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
