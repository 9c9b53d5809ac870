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
    assert row["reference"] == "graph-compiled"
    assert row["compiled - reference"] == pytest.approx(0.17)
    assert row["seed spread"] == pytest.approx(0.10)  # the larger of the two steps' spreads
    assert row["seeds"] == 2


def test_a_malformed_cell_is_a_usage_error():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_parity.py"), "--device", "cpu",
                           "--cells", "mqrar:stickbreaking"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "task:attn:pe" in done.stderr


def test_merged_runs_name_each_step_by_its_commit_newest_first(tmp_path):
    def row(seed, step, accuracy, sha, created):
        return dict(cell="mqrar:stickbreaking:none", seed=seed, train_step=step, id_token_accuracy=accuracy,
                    git_sha=sha, created_at=created, command=f"python benchmarks/train_parity.py {sha}",
                    device="GPU", run_id="r", train_samples=10, batch_size=8, id_exact_match=0.0, best_val=0.0,
                    train_seconds=1.0)

    old = pd.DataFrame([row(0, "graph-compiled", 0.5, "aaa", "2026-01-01"), row(0, "compiled", 0.7, "aaa", "2026-01-01")])
    new = pd.DataFrame([row(0, "graph-compiled", 0.6, "bbb", "2026-02-01")])
    for name, frame in (("old", old), ("new", new)):
        frame.to_parquet(tmp_path / f"{name}.parquet", index=False)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_parity.py"), "--merge",
                           f"{tmp_path / 'old.parquet'},{tmp_path / 'new.parquet'}", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    _, steps = parity.labelled(pd.concat([old, new], ignore_index=True))
    assert steps == ["graph-compiled at bbb", "graph-compiled at aaa", "compiled at aaa"]
    text = (tmp_path / "out" / "train_parity.md").read_text()
    assert "graph-compiled at aaa - reference" in text and "commit bbb" in text
    assert len(pd.read_parquet(tmp_path / "out" / "train_parity.parquet")) == 3


def test_a_step_run_under_a_path_variable_is_its_own_step():
    """Rows of one commit and step, one run under ``LENGTHBENCH_VIEWS=compiled``: two steps, not one of 2 x the seeds."""
    def row(seed, accuracy, command, created):
        return dict(cell="mqmtar:asentmax:nape", seed=seed, train_step="graph-compiled", id_token_accuracy=accuracy,
                    git_sha="ccc", created_at=created, command=command)

    frame = pd.DataFrame([row(0, 0.5, "python benchmarks/train_parity.py --seeds 0", "2026-03-01"),
                          row(0, 0.9, "LENGTHBENCH_VIEWS=compiled python benchmarks/train_parity.py --seeds 0",
                              "2026-03-02")])
    shown, steps = parity.labelled(frame)
    assert steps == ["graph-compiled (LENGTHBENCH_VIEWS=compiled) at ccc", "graph-compiled at ccc"]
    assert parity.path_variables("LENGTHBENCH_VIEWS=op OTHER=1 python x.py A=B") == "LENGTHBENCH_VIEWS=op"
    table = parity.summary(shown.assign(train_step=shown["step"]), steps)
    assert table.iloc[0]["reference"] == "graph-compiled (LENGTHBENCH_VIEWS=compiled) at ccc"
    assert table.iloc[0]["graph-compiled at ccc - reference"] == pytest.approx(-0.4)


def test_a_cell_the_newest_run_left_out_keeps_its_own_reference_and_spread():
    """Merged runs where the newest trained one cell only: the other cell compares against its own newest step, and
    its seed spread stays that of the steps that ran it."""
    rows = pd.DataFrame([
        dict(cell="a", seed=0, train_step="new", id_token_accuracy=0.30),
        dict(cell="a", seed=1, train_step="new", id_token_accuracy=0.32),
        dict(cell="a", seed=0, train_step="old", id_token_accuracy=0.35),
        dict(cell="b", seed=0, train_step="old", id_token_accuracy=0.90),
        dict(cell="b", seed=1, train_step="old", id_token_accuracy=0.70),
        dict(cell="b", seed=0, train_step="older", id_token_accuracy=0.50),
    ])
    table = parity.summary(rows, ["new", "old", "older"]).set_index("cell")
    assert table.loc["a", "reference"] == "new" and table.loc["b", "reference"] == "old"
    assert table.loc["a", "old - reference"] == pytest.approx(0.04)
    assert table.loc["b", "older - reference"] == pytest.approx(-0.30)
    assert pd.isna(table.loc["b", "old - reference"])  # the reference against itself: no entry
    assert table.loc["b", "seed spread"] == pytest.approx(0.20)
    assert table.loc["a", "seed spread"] == pytest.approx(0.02)
