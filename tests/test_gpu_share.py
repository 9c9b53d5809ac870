"""The share of a GPU that a run records: processes registered per GPU, counted alive, averaged over a stretch;
a resumed training's parts weighted by their seconds; rows on a CPU say NaN."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time

import pytest

from lengthbench import gpu_share
from lengthbench.gpu_share import ShareTracker, combined, count_registered, registry


@pytest.fixture
def temp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_second_process_on_the_gpu_is_counted_while_it_lives(temp):
    ours = ShareTracker("GPU-test", start=False)
    assert ours.registered and count_registered(registry("GPU-test")) == 1
    mark = ours.mark()
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from lengthbench.gpu_share import ShareTracker; "
         "ShareTracker('GPU-test', start=False); print('ready', flush=True); time.sleep(60)"],
        env=dict(os.environ, TMPDIR=str(temp)), stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "ready"
        assert ours.sample() == 2
        assert ours.sample() == 2
    finally:
        other.kill()
        other.wait()
    # the dead process's file is removed at the next count
    assert ours.sample() == 1 and sorted(os.listdir(registry("GPU-test"))) == [str(os.getpid())]
    # samples after the mark: 2, 2, 1, and 1 now
    assert ours.mean_since(mark) == pytest.approx(6 / 4)
    ours.close()
    assert os.listdir(registry("GPU-test")) == []
    # another GPU's registry is its own
    assert count_registered(registry("GPU-other")) == 0


def test_the_thread_samples_on_its_own(temp):
    ours = ShareTracker("GPU-thread", every=0.01)
    mark = ours.mark()
    time.sleep(0.2)
    assert ours._count - mark[1] >= 5 and ours.mean_since(mark) == 1.0
    ours.close()


def test_a_resumed_training_weights_its_parts_by_their_seconds():
    assert combined(2.0, 300.0, 1.0, 100.0) == pytest.approx(1.75)
    assert combined(2.0, 300.0, float("nan"), 100.0) == 2.0  # a checkpoint from before the share was kept
    assert combined(float("nan"), 300.0, 1.0, 100.0) == 1.0
    assert combined(1.5, 10.0, 3.0, 0.0) == 1.5


def test_no_tracker_off_cuda():
    import torch

    assert gpu_share.tracker(torch.device("cpu")) is None


def test_a_cpu_run_records_no_share(tmp_path):
    from lengthbench.config import build_config
    from lengthbench.runner import run_cell

    config = build_config("copy", "softmax", "rope", "smoke", train_samples=64, eval_samples=4, max_multiplier=2)
    frame = run_cell(config, tmp_path, device="cpu", progress=False)
    assert {"train_gpu_share", "gpu_share"} <= set(frame.columns)
    assert all(math.isnan(value) for value in frame["train_gpu_share"])
    assert all(math.isnan(value) for value in frame["gpu_share"])


@pytest.mark.gpu
def test_a_gpu_is_named_by_its_uuid_and_a_process_alone_counts_one(temp):
    import torch

    share = gpu_share.tracker(torch.device("cuda"))
    assert share is not None and share.folder.name.startswith("GPU-")
    assert share.sample() == 1 and gpu_share.tracker(torch.device("cuda", 0)) is share
