"""benchmarks/compiled_grads.py: one training step's gradients, eager fused ops against compiled references."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compiled_grads.py"


def test_compiled_grads_compares_every_path_and_rejects_a_bad_variant(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset", "smoke", "--batch", "2", "--calls", "1",
                           "--variants", "default:same_as_forward:fp32:pow-scale", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "compiled_grads.json").read_text())
    assert set(rows) == {"fused", "reference", "compiled[default:same_as_forward:fp32:pow-scale]"}
    compiled = rows["compiled[default:same_as_forward:fp32:pow-scale]"]
    # on a CPU every path is the reference and Inductor's gradients are the eager ones, w_gamma's included
    assert {"qkv", "w_beta", "w_gamma", "head"} <= set(compiled)
    assert all(compiled[group] < 1e-4 for group in ("qkv", "w_beta", "w_gamma", "head"))
    assert abs(compiled["loss"] - rows["fused"]["loss"]) < 1e-4
    assert "the old form ran" in done.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--variants", "default:sometimes:fp32"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: bad variant 'default:sometimes:fp32'")
    assert len(bad.stderr.strip().splitlines()) == 1
