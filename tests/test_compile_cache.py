"""The portable compilation cache ($LENGTHBENCH_COMPILE_CACHE): keyed on what the graphs depend on, written by one
process and taken by another on a machine with empty caches (Inductor on the CPU here, as on a GPU)."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import torch

from lengthbench import compile_policy
from lengthbench.compile_policy import (
    COMPILE_CACHE_ENV,
    compile_cache_file,
    load_compile_cache,
    save_compile_cache,
)
from lengthbench.config import build_config

CPU = torch.device("cpu")


def test_the_file_follows_the_graphs_not_the_seed(monkeypatch, tmp_path):
    config = build_config("mqmtar", "asentmax", "nape", "paper")
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    assert compile_cache_file(config, CPU) is None
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path))
    path = compile_cache_file(config, CPU)
    assert path.parent == tmp_path and path.name.startswith("mqmtar-asentmax-nape-b128-")
    for same in (dict(seed=3), dict(lr=1e-4), dict(train_samples=10), dict(max_multiplier=2)):
        assert compile_cache_file(dataclasses.replace(config, **same), CPU) == path
    for other in (dict(attn="entmax"), dict(batch_size=64), dict(d_model=256), dict(compile_mode="default"),
                  dict(attn_params={"alpha": 1.3})):
        assert compile_cache_file(dataclasses.replace(config, **other), CPU) != path
    # other model code, other file (a cache of the old graphs would never be replaced)
    monkeypatch.setattr(compile_policy, "model_source_digest", lambda: "edited")
    assert compile_cache_file(config, CPU) != path


def test_a_broken_or_missing_file_never_stops_a_run(tmp_path):
    assert load_compile_cache(None) == "" and load_compile_cache(tmp_path / "missing.bin") == ""
    (tmp_path / "broken.bin").write_bytes(b"not a cache")
    assert "not loaded" in load_compile_cache(tmp_path / "broken.bin")
    (tmp_path / "kept.bin").write_bytes(b"x")
    assert save_compile_cache(tmp_path / "kept.bin") == ""  # an existing file is not replaced
    assert (tmp_path / "kept.bin").read_bytes() == b"x"


PROCESS = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from torch._dynamo.utils import counters
    from lengthbench.runner import load_compile_cache, save_compile_cache

    path = Path(sys.argv[1])
    print(load_compile_cache(path))
    layer = torch.nn.Linear(16, 16)
    step = torch.compile(lambda x: torch.nn.functional.gelu(layer(x)).square().sum(), dynamic=False)
    step(torch.randn(4, 16)).backward()
    print(save_compile_cache(path))
    print("hits", counters["inductor"]["fxgraph_cache_hit"])
""")


def test_a_fresh_process_with_empty_caches_takes_the_compiled_graphs_from_the_file(tmp_path):
    path = tmp_path / "cache" / "step.bin"

    def run(inductor_dir: str) -> str:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / inductor_dir), OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-c", PROCESS, str(path)], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    first = run("machine-a")
    assert "compile cache written" in first and first.strip().endswith("hits 0")
    second = run("machine-b")  # another machine: its own caches are empty
    assert "compile cache loaded" in second and "written" not in second
    assert int(second.strip().rsplit(" ", 1)[1]) >= 2  # forward and backward graphs
