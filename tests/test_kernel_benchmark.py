"""benchmarks/kernels.py without a GPU: ``--merge`` and the Markdown report (CPU, fast)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

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
    short = frame(["entmax", "sieve"], 1.0, "2026-11-22").assign(seq_len=1024)  # not measured again: kept
    bench.write(pd.concat([frame(["entmax", "sieve", "tra"], 100.0, "2026-11-22"), short]), tmp_path / "all")
    bench.write(frame(["entmax", "sparsemax"], 29.0, "2026-11-24", scale=1.0), tmp_path / "new")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels.py"), "--merge", str(tmp_path / "new"),
                           "--out", str(tmp_path / "all")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    merged = pd.read_parquet(tmp_path / "all" / "kernels.parquet")
    assert sorted(merged.mechanism) == ["entmax", "entmax", "sieve", "sieve", "sparsemax", "tra"]
    longest = merged[merged.seq_len == 65536]
    assert longest.set_index("mechanism").fwd_ms.to_dict() == {"entmax": 29.0, "sieve": 100.0, "sparsemax": 29.0,
                                                               "tra": 100.0}
    assert merged[merged.seq_len == 1024].fwd_ms.tolist() == [1.0, 1.0]
    text = (tmp_path / "all" / "kernels.md").read_text()
    assert "between 2026-11-22 and 2026-11-24" in text and "times 1 (SDPA" in text
    assert "| entmax | 1.45 (1.5) | 0.83 (3) | 1.00 | all |" in text
    assert "| sieve | 5.00 (1.5) | 2.86 (3) | 1.00 | missed: fwd |" in text


def test_each_row_of_the_report_names_its_date_and_commit(tmp_path):
    rows = frame(["entmax"], 29.0, "2026-11-24T01:02:03+00:00", scale=1.0).assign(git_sha="abc1234")
    bench.write(pd.concat([rows, frame(["tra"], 10.0, "2026-11-22")]), tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    assert "| date | commit |" in text
    assert "| entmax | 65536 | 32 | 29.000 |" in text and "| 2026-11-24 | abc1234 |" in text
    assert "| tra | 65536 | 32 | 10.000 |" in text and "| 2026-11-22 |  |" in text  # a row without a commit says so
    assert "Again: `python benchmarks/kernels.py --out results/benchmarks`" in text


def test_rows_without_inputs_or_variant_read_as_random_default(tmp_path):
    """An old file (no ``inputs``/``variant`` columns) merged with walk rows: its rows stay, labelled random and
    default; a walk row replaces only the walk row of the same mechanism, shape and variant."""
    bench.write(frame(["stickbreaking"], 10.0, "2026-11-22"), tmp_path / "all")
    walk = frame(["stickbreaking", "stickbreaking"], 50.0, "2026-11-27").assign(inputs="walk8",
                                                                              variant=["default", "prefix"])
    merged = bench.merge(pd.read_parquet(tmp_path / "all" / "kernels.parquet"), walk)
    assert sorted(zip(merged.inputs, merged.variant, merged.fwd_ms, strict=True)) == [
        ("random", "default", 10.0), ("walk8", "default", 50.0), ("walk8", "prefix", 50.0)]
    again = bench.merge(merged, walk.iloc[1:].assign(fwd_ms=30.0))
    assert sorted(zip(again.inputs, again.variant, again.fwd_ms, strict=True)) == [
        ("random", "default", 10.0), ("walk8", "default", 50.0), ("walk8", "prefix", 30.0)]


def test_report_has_ratios_per_input_family_against_their_targets(tmp_path):
    random = frame(["stickbreaking"], 20.0, "2026-11-27").assign(inputs="random", variant="default")
    walk = frame(["stickbreaking", "sieve-window"], 60.0, "2026-11-27").assign(inputs="walk8", variant="default")
    walk64 = frame(["stickbreaking"], 30.0, "2026-11-27").assign(inputs="walk8", variant="prefix", head_dim=64)
    bench.write(pd.concat([random, walk, walk64]), tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    random_part = text.split("## Ratios to SDPA at L=65536, D=32, random inputs")[1].split("##")[0]
    assert "| stickbreaking | 1.00 (1.5) | 0.57 (3) | 1.00 | all |" in random_part
    walk_part = text.split("## Ratios to SDPA at L=65536, D=32, walk8 inputs")[1].split("##")[0]
    assert "| stickbreaking | 3.00 (2) | 1.71 (3) | 1.00 | missed: fwd |" in walk_part
    assert "| sieve-window | 3.00 (2) | 1.71 (3) | 1.00 | missed: fwd |" in walk_part
    assert "| stickbreaking [prefix] | 1.50 (2) | 0.86 (3) | 1.00 | all |" in text.split("D=64, walk8 inputs")[1]
    assert "| walk8 | prefix | GPU | 2026-11-27 |" in text


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


def test_variants_parse_and_bad_ones_exit_2(capsys):
    assert bench.parse_variants(['prefix={"backward": "prefix", "fwd": [64, 32, 4, 2]}']) == [
        ("default", None), ("prefix", {"backward": "prefix", "fwd": (64, 32, 4, 2)})]
    for bad in ("x={not json", "default={}", "y=[1]"):
        try:
            bench.parse_variants([bad])
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(bad)
    assert capsys.readouterr().err.count("error: --variant") == 3


def test_bad_input_family_exits_2():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels.py"), "--inputs", "walk9"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "unknown families ['walk9']" in done.stderr


def test_trained_inputs_are_a_layers_projected_qkv(tmp_path):
    """``--inputs trained``: q, k, v of the chosen layer of a saved model (here an untrained tiny one, on the
    CPU), one sample, at most the asked length; a layer the model lacks is a usage error."""
    import pytest
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


def test_narrow_kernel_rows_say_which_op_ran():
    """benchmarks/narrow_kernels.py's ``narrow`` column: the capturable op follows the library's choice (the
    stick-breaking family on the long-context ops), a variant runs the training-width op at any width it takes."""
    import pytest

    pytest.importorskip("triton")
    import narrow_kernels

    from lengthbench import kernels

    assert kernels.CAPTURE_STICK == "wide"
    assert not narrow_kernels.takes_narrow("sieve-window", "capturable", 83)
    assert narrow_kernels.takes_narrow("entmax", "capturable", 131)
    assert not narrow_kernels.takes_narrow("sieve", "capturable", 131)  # past its 128 keys
    assert narrow_kernels.takes_narrow("sieve-window", "bd32", 131)
    assert not narrow_kernels.takes_narrow("sieve-window", "wide32", 83)
    assert not narrow_kernels.takes_narrow("softpick", "capturable", 83)


def test_entmax_search_bad_input_exits_2_with_one_line():
    """``benchmarks/entmax_search.py``: a variant that is not JSON, a scale that is not a number, an unknown task
    or mechanism for the fresh model, and a machine without a GPU each end it with one line and exit 2 before
    anything is measured."""
    script = str(ROOT / "benchmarks" / "entmax_search.py")
    for argv, words in ((["--variant", "x=notjson"], "not JSON"), (["--scales", "a"], "--scales"),
                        (["--fresh", "nope:entmax"], "unknown task"), (["--fresh", "mqmtar:nope"], "unknown attention"),
                        ([], "CUDA GPU")):
        if not argv and torch.cuda.is_available():
            continue
        done = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, check=False)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_profile_forward_refuses_bad_input_with_exit_2():
    """benchmarks/profile_forward.py: a one-line error and exit code 2 for a bad ``--inputs`` (argparse), and
    without a GPU (here) or for a mechanism without a fused op."""
    script = str(ROOT / "benchmarks" / "profile_forward.py")
    bad = subprocess.run([sys.executable, script, "--inputs", "walk9"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    done = subprocess.run([sys.executable, script, "--mechanism", "no-such-op"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and len(done.stderr.strip().splitlines()) == 1


SASS_LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FFMA R2, R3, R4, -R5 ;
        /*0020*/                   FMNMX R2, RZ, R2, !PT ;
        /*0030*/                   FADD R6, R6, R2 ;
        /*0040*/              @!P0 BRA `(.L_x_0) ;
        /*0050*/                   FMUL R7, R6, R6 ;
        /*0060*/                   BRA `(.L_x_1) ;
.L_x_1:
        /*0070*/                   EXIT ;
"""


def test_sass_loops_finds_the_loops_and_counts_their_instructions():
    """``benchmarks/sass_loops.py``'s reading of a SASS listing: a loop is a branch back to a label (a forward
    branch is none), its instructions counted by opcode, predicates aside."""
    import sass_loops

    assert sass_loops.loops(SASS_LISTING, least=1) == [(4, {"FFMA": 1, "FMNMX": 1, "FADD": 1, "BRA": 1})]
    assert sass_loops.loops(SASS_LISTING, least=5) == []


def test_sass_loops_bad_kernels_exit_2_with_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_loops.py"), "--kernels", "newton,nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: --kernels: unknown ['nope']")
    assert len(done.stderr.strip().splitlines()) == 1
