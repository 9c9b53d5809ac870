"""benchmarks/kernels.py without a GPU: the table it keeps, ``--merge``, its Markdown, its inputs (CPU, fast)."""

import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernels as bench  # noqa: E402


def run_script(monkeypatch, *argv: str) -> None:
    """``benchmarks/kernels.py ARGV`` in this process (its ``main``)."""
    monkeypatch.setattr(sys, "argv", ["benchmarks/kernels.py", *argv])
    bench.main()


def frame(mechanisms, fwd, created, scale=None):
    rows = [dict(mechanism=name, seq_len=65536, head_dim=32, heads=16, dtype="bfloat16", fwd_ms=fwd,
                 fwdbwd_ms=2 * fwd, sdpa_fwd_ms=20.0, sdpa_fwdbwd_ms=70.0, peak_mem_bytes=100, sdpa_peak_mem_bytes=100,
                 device="GPU", created_at=created, inputs="random", git_sha="abc1234",
                 command="python benchmarks/kernels.py") for name in mechanisms]
    out = pd.DataFrame(rows)
    if scale is not None:
        out["input_scale"] = scale
    return out


def test_merge_replaces_the_measured_rows_only(tmp_path, monkeypatch):
    short = frame(["entmax", "sieve-entmax"], 1.0, "2026-11-22").assign(seq_len=1024)  # not measured again: kept
    bench.write(pd.concat([frame(["entmax", "sieve-entmax", "tra"], 100.0, "2026-11-22"), short]), tmp_path / "all")
    bench.write(frame(["entmax", "sparsemax"], 29.0, "2026-11-24", scale=1.0), tmp_path / "new")
    run_script(monkeypatch, "--merge", str(tmp_path / "new"), "--out", str(tmp_path / "all"))
    merged = pd.read_parquet(tmp_path / "all" / "kernels.parquet")
    assert sorted(merged.mechanism) == ["entmax", "entmax", "sieve-entmax", "sieve-entmax", "sparsemax", "tra"]
    longest = merged[merged.seq_len == 65536]
    assert longest.set_index("mechanism").fwd_ms.to_dict() == {"entmax": 29.0, "sieve-entmax": 100.0, "sparsemax": 29.0,
                                                               "tra": 100.0}
    assert merged[merged.seq_len == 1024].fwd_ms.tolist() == [1.0, 1.0]
    text = (tmp_path / "all" / "kernels.md").read_text()
    assert "| entmax | random | 65536 | 32 | 29.000 | 1.45 (1.5) | 58.000 | 0.83 (3) | 1.00 | all | GPU | 2026-11-24 |" \
        in text
    assert "| sieve-entmax | random | 65536 | 32 | 100.000 | 5.00 (1.5) | 200.000 | 2.86 (3) | 1.00 | missed: fwd |" in text


def test_writing_keeps_the_rows_not_measured_again(tmp_path):
    """A measurement written into a folder with a table joins it: the rows it measured again are replaced, the
    others stay (the same mechanism on other inputs too)."""
    bench.write(frame(["stickbreaking"], 10.0, "2026-11-22").assign(inputs="random"), tmp_path)
    walk = frame(["stickbreaking"], 50.0, "2026-11-27").assign(inputs="walk8")
    bench.write(walk, tmp_path)
    bench.write(walk.assign(fwd_ms=30.0), tmp_path)
    table = pd.read_parquet(tmp_path / "kernels.parquet")
    assert sorted(zip(table.inputs, table.fwd_ms, strict=True)) == [("random", 10.0), ("walk8", 30.0)]


def test_the_report_shows_each_mechanisms_longest_length_with_its_provenance(tmp_path):
    rows = pd.concat([frame(["entmax"], 29.0, "2026-11-24T01:02:03+00:00", scale=1.0),
                      frame(["entmax"], 1.0, "2026-11-24T01:02:03+00:00", scale=1.0).assign(seq_len=1024),
                      frame(["tra"], 10.0, "2026-11-22").assign(seq_len=16384)])
    rows = rows.assign(git_sha="abc1234", command="python benchmarks/kernels.py --mechanisms entmax,tra",
                       inputs="random")
    bench.write(rows, tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    assert "| entmax | random | 65536 | 32 | 29.000 |" in text and "| 2026-11-24 | abc1234 |" in text
    assert "| tra | random | 16384 | 32 | 10.000 |" in text  # its longest length measured
    assert "| 1024 |" not in text  # the other lengths are in the Parquet
    assert "- GPU, 2026-11-22, commit abc1234: `python benchmarks/kernels.py --mechanisms entmax,tra`" in text


def test_report_has_ratios_per_input_family_against_their_targets(tmp_path):
    random = frame(["stickbreaking"], 20.0, "2026-11-27").assign(inputs="random")
    walk = frame(["stickbreaking", "sieve-alg1"], 60.0, "2026-11-27").assign(inputs="walk8")
    walk64 = frame(["stickbreaking"], 30.0, "2026-11-27").assign(inputs="walk8", head_dim=64)
    bench.write(pd.concat([random, walk, walk64]), tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    assert "| stickbreaking | random | 65536 | 32 | 20.000 | 1.00 (1.5) | 40.000 | 0.57 (3) | 1.00 | all |" in text
    assert "| stickbreaking | walk8 | 65536 | 32 | 60.000 | 3.00 (2) | 120.000 | 1.71 (3) | 1.00 | missed: fwd |" in text
    assert "| sieve-alg1 | walk8 | 65536 | 32 | 60.000 | 3.00 (2) |" in text
    assert "| stickbreaking | walk8 | 65536 | 64 | 30.000 | 1.50 (2) | 60.000 | 0.86 (3) | 1.00 | all |" in text
    order = [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| stickbreaking")]
    assert order == ["random", "walk8", "walk8"]


def test_walk_inputs_move_every_score_by_the_shift():
    import math

    import torch

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 50, 32, generator=gen), torch.randn(1, 2, 50, 32, generator=gen)
    for shift in (-4.0, -8.0):
        wq, wk = bench.walk_inputs(q, k, shift)
        z = wq @ wk.transpose(-1, -2) / math.sqrt(32)
        rest = q[..., 1:] @ k[..., 1:].transpose(-1, -2) / math.sqrt(32)
        assert torch.allclose(z, rest + shift, atol=1e-5)
        assert wq.shape == q.shape and torch.equal(wq[..., 1:], q[..., 1:])


def test_bad_input_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    for argv, said in ((["--inputs", "walk9"], "error: --inputs: unknown families ['walk9']"),
                       (["--merge", str(tmp_path / "none")], "error: --merge: ")):
        with pytest.raises(SystemExit) as stop:
            run_script(monkeypatch, *argv, "--out", str(tmp_path / "out"))
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(said) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_trained_inputs_are_a_layers_projected_qkv(tmp_path):
    """``--inputs trained``: q, k, v of the chosen layer of a saved model (here an untrained tiny one, on the
    CPU), one sample, at most the asked length; a layer the model lacks is a usage error."""
    import torch

    from lengthbench.config import build_config
    from lengthbench.errors import UsageError
    from lengthbench.runner import atomic_torch_save, build_model, checkpoint_dir
    from lengthbench.tasks import get_task

    config = build_config("mqrar", "stickbreaking", "none", preset="smoke", d_model=16, n_heads=2, ffn=32,
                          n_layers=2)
    torch.manual_seed(0)
    model = build_model(config, get_task("mqrar"))
    folder = checkpoint_dir(tmp_path, config.run_id)
    folder.mkdir(parents=True)
    atomic_torch_save({"config": config.identity(), "model": model.state_dict()}, folder / "model.pt")
    q, k, v = bench.capture_qkv(folder / "model.pt", 1, 40, device="cpu")
    assert q.shape == k.shape == v.shape and q.shape[:2] == (1, 2) and q.shape[-1] == 8 and q.shape[2] <= 40
    again = bench.capture_qkv(folder / "model.pt", 1, 40, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again, strict=True))
    first = bench.capture_qkv(folder / "model.pt", 0, 40, device="cpu")
    assert not torch.equal(first[0], q)  # another layer's projection
    with pytest.raises(UsageError, match="2 attention layers"):
        bench.capture_qkv(folder / "model.pt", 2, 40, device="cpu")
