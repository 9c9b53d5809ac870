"""benchmarks/kernels.py without a GPU: ``--merge`` and the Markdown report (CPU, fast)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernels as bench  # noqa: E402


def frame(mechanisms, fwd, created, scale=None):
    rows = [dict(mechanism=name, seq_len=65536, head_dim=32, heads=16, dtype="bfloat16", fwd_ms=fwd,
                 fwdbwd_ms=2 * fwd, sdpa_fwd_ms=20.0, sdpa_fwdbwd_ms=70.0, peak_mem_bytes=100, sdpa_peak_mem_bytes=100,
                 device="GPU", created_at=created) for name in mechanisms]
    out = pd.DataFrame(rows)
    if scale is not None:
        out["input_scale"] = scale
    return out


def test_merge_replaces_the_measured_rows_only(tmp_path):
    short = frame(["entmax", "sieve-entmax"], 1.0, "2026-11-22").assign(seq_len=1024)  # not measured again: kept
    bench.write(pd.concat([frame(["entmax", "sieve-entmax", "tra"], 100.0, "2026-11-22"), short]), tmp_path / "all")
    bench.write(frame(["entmax", "sparsemax"], 29.0, "2026-11-24", scale=1.0), tmp_path / "new")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels.py"), "--merge", str(tmp_path / "new"),
                           "--out", str(tmp_path / "all")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    merged = pd.read_parquet(tmp_path / "all" / "kernels.parquet")
    assert sorted(merged.mechanism) == ["entmax", "entmax", "sieve-entmax", "sieve-entmax", "sparsemax", "tra"]
    longest = merged[merged.seq_len == 65536]
    assert longest.set_index("mechanism").fwd_ms.to_dict() == {"entmax": 29.0, "sieve-entmax": 100.0, "sparsemax": 29.0,
                                                               "tra": 100.0}
    assert merged[merged.seq_len == 1024].fwd_ms.tolist() == [1.0, 1.0]
    text = (tmp_path / "all" / "kernels.md").read_text()
    assert "between 2026-11-22 and 2026-11-24" in text and "times 1 (SDPA" in text
    assert "| entmax | 1.45 (1.5) | 0.83 (3) | 1.00 | all |" in text
    assert "| sieve-entmax | 5.00 (1.5) | 2.86 (3) | 1.00 | missed: fwd |" in text


def test_each_row_of_the_report_names_its_date_and_commit(tmp_path):
    rows = frame(["entmax"], 29.0, "2026-11-24T01:02:03+00:00", scale=1.0).assign(git_sha="abc1234")
    bench.write(pd.concat([rows, frame(["tra"], 10.0, "2026-11-22")]), tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    assert "| date | commit |" in text
    assert "| entmax | 65536 | 32 | 29.000 |" in text and "| 2026-11-24 | abc1234 |" in text
    assert "| tra | 65536 | 32 | 10.000 |" in text and "| 2026-11-22 |  |" in text  # a row without a commit says so
    assert "Again: `python benchmarks/kernels.py --out results/benchmarks`" in text
