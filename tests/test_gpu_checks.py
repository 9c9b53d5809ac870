"""benchmarks/gpu_checks.sh without a GPU: its usage and its unknown parts are errors (exit 2) that name every
part, and the script parses."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_checks.sh"
PARTS = ["tests", "tests-lists", "tests-modules", "kernels", "long-walks", "eval", "eval-trained", "throughput"]


def test_gpu_checks_names_its_parts(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: gpu_checks.sh ")
    assert usage.stderr.split()[2].split("|") == PARTS
    unknown = subprocess.run(["bash", str(SCRIPT), "nope", str(tmp_path / "out")], capture_output=True, text=True,
                             cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: unknown part 'nope'")
    assert all(part in unknown.stderr for part in PARTS)
    for part in PARTS:  # each part documented in the header
        assert f"gpu_checks.sh {part} OUT" in SCRIPT.read_text()


def test_throughput_attns_measures_those_after_softmax(tmp_path):
    """``throughput`` with ``ATTNS``: those mechanisms only, softmax + RoPE (the baseline) first and not twice;
    without it, every mechanism."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/bash\necho "$@" >> "$ARGS_LOG"\necho measured\n')
    (fake / "python3").chmod(0o755)
    log = tmp_path / "args.txt"
    base = {k: v for k, v in os.environ.items() if k not in ("ATTNS", "TASKS", "PES", "BATCH")}
    for attns in ("sieve,softmax,stickbreaking", None):
        env = {**base, "PATH": f"{fake}:{base['PATH']}", "ARGS_LOG": str(log), **({"ATTNS": attns} if attns else {})}
        done = subprocess.run(["bash", str(SCRIPT), "throughput", str(tmp_path / "out")], capture_output=True,
                              text=True, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
    calls = [line.split() for line in log.read_text().splitlines()]
    chosen = [call[call.index("--attns") + 1] for call in calls]
    assert chosen[0] == "softmax,sieve,stickbreaking"
    assert chosen[1].startswith("softmax,") and len(chosen[1].split(",")) == 10


def test_every_test_file_imports_its_helpers_from_any_folder():
    """gpu_checks.sh runs the test files from /tmp (so that the installed package is tested): a test file imports
    its helpers as ``cli_helpers``/``model_helpers`` (pytest puts tests/ on the path), never as ``tests.<name>``,
    which only the repository root can import."""
    tests = Path(__file__).resolve().parent
    offenders = [path.name for path in sorted(tests.glob("*.py"))
                 if any(line.startswith(("from tests.", "import tests")) for line in path.read_text().splitlines())]
    assert offenders == []
