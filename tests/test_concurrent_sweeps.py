"""Several sweeps over one grid and one store run each cell once: claims (``lengthbench.claims``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from lengthbench import claims

GRID = ["--tasks", "2back", "--attns", "softmax", "--pes", "nape,none", "--seeds", "0-1", "--train-samples", "64",
        "--eval-samples", "4", "--max-multiplier", "2", "--device", "cpu", "--quiet"]


def test_claim_is_exclusive_and_released(tmp_path):
    first, second = claims.Owner.me(), claims.Owner.me()
    with claims.claim(tmp_path, "cell", owner=first) as got:
        assert got
        record = json.loads(claims.claim_path(tmp_path, "cell").read_text())
        assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
        assert record["started"] <= record["heartbeat"] <= time.time()
        with claims.claim(tmp_path, "cell", owner=second) as other:
            assert not other
        assert claims.holder(tmp_path, "cell") == f"pid {os.getpid()} on {socket.gethostname()}"
    assert not claims.claim_path(tmp_path, "cell").exists()
    assert claims.holder(tmp_path, "cell") is None


def test_claim_is_released_when_the_cell_fails(tmp_path):
    try:
        with claims.claim(tmp_path, "cell") as got:
            assert got
            raise RuntimeError("the cell crashed")
    except RuntimeError:
        pass
    assert not claims.claim_path(tmp_path, "cell").exists()


def test_heartbeat_refreshes_the_claim(tmp_path):
    with claims.claim(tmp_path, "cell", heartbeat=0.05) as got:
        assert got
        first = json.loads(claims.claim_path(tmp_path, "cell").read_text())["heartbeat"]
        time.sleep(0.3)
        later = json.loads(claims.claim_path(tmp_path, "cell").read_text())["heartbeat"]
    assert later > first


def test_a_stale_claim_is_taken_over_once(tmp_path):
    path = claims.claim_path(tmp_path, "cell")
    path.parent.mkdir(parents=True)
    old = time.time() - 3600  # a heartbeat an hour old, from another machine
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "gone", "started": old, "heartbeat": old}))
    owners = [claims.Owner.me() for _ in range(8)]
    got: list[bool] = []
    start = threading.Barrier(len(owners))

    def contend(owner):
        start.wait()
        got.append(claims.acquire(tmp_path, "cell", owner, timeout=60))

    threads = [threading.Thread(target=contend, args=(owner,)) for owner in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(got) == 1  # exactly one taker
    winner = json.loads(path.read_text())["token"]
    assert winner in {owner.token for owner in owners}


def test_a_claim_of_a_dead_process_here_is_stale(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    path = claims.claim_path(tmp_path, "cell")
    path.parent.mkdir(parents=True)
    now = time.time()
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": process.pid, "token": "t", "started": now,
                                "heartbeat": now}))
    assert claims.holder(tmp_path, "cell") is None
    with claims.claim(tmp_path, "cell") as got:
        assert got


def test_a_live_claim_is_reported_running_elsewhere(tmp_path, monkeypatch, capsys):
    from cli_helpers import cli

    from lengthbench.sweep import plan_sweep

    store = tmp_path / "store"
    overrides = dict(train_samples=64, eval_samples=4, max_multiplier=2)
    run_ids = [c.run_id for c in plan_sweep(["2back"], ["softmax"], ["nape", "none"], [0, 1], "smoke", overrides)]
    # another live sweep (this test) holds every cell: a --no-wait sweep runs none and says so
    held = [claims.take(store, run_id) for run_id in run_ids]
    try:
        assert len(run_ids) == 4 and all(held)
        assert cli(monkeypatch, "sweep", *GRID, "--results", store, "--no-wait") == 0
        out = capsys.readouterr().out
        assert "4 running elsewhere" in out and "0 ran" in out
        assert not list((store / "runs").glob("*.parquet"))
    finally:
        for claim in held:
            claim.release()


# a tiny grid of cheap cells: 2 steps, 4 validation and 4 evaluation samples, lengths 1x and 2x
SWEEP_FILE = """tasks = ["2back"]
attns = ["softmax"]
pes = ["nape", "none"]
seeds = "0-1"
device = "cpu"
[overrides]
train_samples = 64
eval_samples = 4
val_samples = 4
max_multiplier = 2
diagnostics = false
"""


def test_a_run_claimed_elsewhere_is_refused(tmp_path, monkeypatch, capsys):
    from cli_helpers import cli

    from lengthbench.config import build_config

    store = tmp_path / "store"
    config = build_config("2back", "softmax", "nape", "smoke", train_length=64, train_samples=64, eval_samples=4,
                          max_multiplier=2)
    held = claims.take(store, config.run_id)
    try:
        assert cli(monkeypatch, "run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--train-samples",
                   "64", "--eval-samples", "4", "--max-multiplier", "2", "--results", store, "--quiet") == 2
        assert "is running elsewhere" in capsys.readouterr().err
    finally:
        held.release()
    assert not (store / "runs").exists()


def _sweep(sweep_file, store, log):
    # one thread each, as this test process runs (conftest): the rows are compared with a sweep run here
    return subprocess.Popen([sys.executable, "-m", "lengthbench.cli", "sweep", "--config", str(sweep_file), "--quiet",
                             "--results", str(store)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"})


def _rows(store):
    frame = pd.concat([pd.read_parquet(path) for path in sorted((store / "runs").glob("*.parquet"))])
    drop = ["train_seconds", "eval_seconds", "created_at"]  # when and how fast, not what
    return frame.drop(columns=drop).sort_values(["run_id", "multiplier"]).reset_index(drop=True)


@pytest.mark.slow  # two sweep processes, each importing torch: a minute on 2 cores
def test_two_concurrent_sweeps_train_each_cell_once(tmp_path, monkeypatch):
    from cli_helpers import cli

    sweep_file = tmp_path / "grid.toml"
    sweep_file.write_text(SWEEP_FILE)
    shared = tmp_path / "shared"
    logs = [open(tmp_path / f"sweep{i}.log", "w") for i in range(2)]  # noqa: SIM115
    try:
        processes = [_sweep(sweep_file, shared, log) for log in logs]
        codes = [process.wait(timeout=300) for process in processes]
    finally:
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"sweep{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], outputs
    # each cell trained (and scored at 1x) once: its log has one "eval 1x" line, whichever sweep ran it
    cell_logs = sorted((shared / "logs").glob("*.log"))
    assert len(cell_logs) == 4
    for log in cell_logs:
        assert log.read_text().count(" eval 1x ") == 1, log.read_text()
    ran = [int(out.split(" cells: ")[1].split(" ran")[0]) for out in outputs]
    assert sum(ran) == 4, outputs
    assert not list((shared / "claims").glob("*.json"))  # every claim released
    # the rows are those of one sweep alone
    alone = tmp_path / "alone"
    assert cli(monkeypatch, "sweep", "--config", sweep_file, "--quiet", "--results", alone) == 0
    pd.testing.assert_frame_equal(_rows(shared), _rows(alone))
