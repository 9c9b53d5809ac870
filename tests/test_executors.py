"""Sweeps on clusters: a smoke sweep through submitit's local executor and through a local Ray instance gives the
rows the local executor gives; the jobs' records and `sweep --status`; the options' parsing and the missing
extras' errors."""

from __future__ import annotations

import json
import sys
import time

import pandas as pd
import pytest
from cli_helpers import cli

from lengthbench import executors
from lengthbench.errors import UsageError
from lengthbench.store import load_results, run_finished
from lengthbench.sweep import plan_cells, run_sweep

TINY = {"train_samples": 64, "batch_size": 32, "eval_samples": 8, "val_samples": 8, "max_multiplier": 2,
        "d_model": 16, "n_heads": 2, "ffn": 32, "n_layers": 1, "diagnostics": False}
CELLS = ["2back:softmax:rope", "2back:softmax:nape"]
# what a cell's rows say about the model: equal wherever it ran
SCORES = ["run_id", "multiplier", "eval_length", "exact_match", "token_accuracy", "score", "n_samples",
          "train_steps", "best_step"]


def sweep_file(tmp_path, store, cells=CELLS) -> str:
    path = tmp_path / f"sweep_{store.name}.json"
    path.write_text(json.dumps({"cells": cells, "seeds": [0], "results": str(store), "device": "cpu",
                                "overrides": TINY}))
    return str(path)


def scores(store) -> pd.DataFrame:
    return load_results(store)[SCORES].sort_values(["run_id", "multiplier"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    """The two cells through the local executor (this process, one thread, as the jobs below)."""
    store = tmp_path_factory.mktemp("local") / "store"
    outcomes = run_sweep(plan_cells(CELLS, [0], "smoke", TINY), store, device="cpu", slots=[])
    assert [o.status for o in outcomes] == ["done", "done"]
    return scores(store)


@pytest.fixture
def one_thread(monkeypatch):
    # the jobs' processes then compute as this one does (conftest: one thread), bit for bit
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_slurm_through_submitits_local_executor_gives_the_local_rows(tmp_path, monkeypatch, capsys, local_rows,
                                                                    one_thread):
    """One cell submitted without --wait (the command returns; --status follows it), then the sweep again with
    --wait: the first cell is skipped, the second runs; the rows are the local executor's."""
    store = tmp_path / "store"
    first, second = plan_cells(CELLS, [0], "smoke", TINY)
    slurm = ["--quiet", "--executor", "slurm", "--slurm-cluster", "local", "--gpus-per-node", "0",
             "--cpus-per-task", "1"]
    assert cli(monkeypatch, "sweep", "--config", sweep_file(tmp_path, store), "--status") == 0
    assert "2 cells: 0 in store, 0 running, 0 queued, 0 failed, 2 to run" in capsys.readouterr().out
    assert cli(monkeypatch, "sweep", "--config", sweep_file(tmp_path, store, CELLS[:1]), *slurm) == 0
    out = capsys.readouterr().out
    assert "1 cells: 1 submitted" in out and "--status" in out
    deadline = time.monotonic() + 600  # (seconds on an idle machine; minutes where other work shares its cores)
    while not run_finished(store, first.run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cli(monkeypatch, "sweep", "--config", sweep_file(tmp_path, store), "--status") == 0
    assert "2 cells: 1 in store, 0 running, 0 queued, 0 failed, 1 to run" in capsys.readouterr().out
    code = cli(monkeypatch, "sweep", "--config", sweep_file(tmp_path, store), *slurm, "--wait")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 ran, 1 already in the store, 0 failed" in out
    pd.testing.assert_frame_equal(scores(store), local_rows)
    for config in (first, second):  # each job's records, and its lines in the cell's log as the local scheduler's
        submission = json.loads((store / "jobs" / f"{config.run_id}.json").read_text())
        state = json.loads((store / "jobs" / f"{config.run_id}.state.json").read_text())
        assert submission["executor"] == "slurm" and state["token"] == submission["token"]
        assert state["state"] == "done"
        assert f"{config.run_id} eval 2x" in (store / "logs" / f"{config.run_id}.log").read_text()


def test_cell_states_come_from_the_store_and_the_jobs_records(tmp_path):
    configs = plan_cells(CELLS + ["2back:softmax:alibi", "2back:softmax:none"], [0], "smoke", TINY)
    store = tmp_path / "store"
    queued, running, failed, fresh = configs
    for config in (queued, running, failed):
        executors.write_submission(store, config, "slurm", f"job-{config.run_id}", token=config.run_id,
                                   cluster="local")
    executors.write_job_state(store, running.run_id, running.run_id, "running")
    executors.write_job_state(store, failed.run_id, failed.run_id, "failed", error="RuntimeError: boom")
    executors.write_job_state(store, queued.run_id, "an earlier submission", "failed", error="old")
    states = executors.cell_states(configs, store)
    assert [states[c.run_id].state for c in configs] == ["queued", "running", "failed", "to run"]
    assert states[failed.run_id].note == "RuntimeError: boom" and states[running.run_id].job_id == f"job-{running.run_id}"
    # off SLURM (here: submitit's local cluster) no job counts as live: a later sweep submits the cell again
    assert not any(state.live for state in states.values())


def test_a_preempted_job_is_requeued_with_the_same_call_and_says_so(tmp_path, monkeypatch):
    """submitit calls the job's ``checkpoint`` when SLURM preempts it or its time runs out, then exits: the job
    must hand back the same call (the requeued job resumes the cell from its checkpoint on disk), and the cell's
    record must not call it failed."""
    from lengthbench import sweep

    config = plan_cells(CELLS[:1], [0], "smoke", TINY)[0]
    args = (config.to_json(), str(tmp_path), "", None, "token-1", "cpu")
    requeued = executors.CellJob().checkpoint(*args)
    assert isinstance(requeued.function, executors.CellJob) and requeued.args == args

    def preempted(*args, **kwargs):
        raise SystemExit(-1)  # what submitit's signal handler raises after requeueing

    monkeypatch.setattr(sweep, "run_pending_cell", preempted)
    executors.write_submission(tmp_path, config, "slurm", "7_0", "token-1", cluster="local")
    with pytest.raises(SystemExit):
        executors.CellJob()(*args)
    state = executors.cell_states([config], tmp_path)[config.run_id]
    assert (state.state, state.note) == ("queued", "requeued after an interruption")


@pytest.mark.parametrize("text, minutes", [("240", 240), ("4:00:00", 240), ("1-00:00:00", 1440), ("1-2", 1560),
                                           ("90:30", 91), ("0:00:30", 1)])
def test_slurm_time_limits(text, minutes):
    assert executors.parse_minutes(text) == minutes


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_bad_options_are_one_line_errors(tmp_path, monkeypatch, capsys):
    assert executors.parse_memory_gb("32G") == 32 and executors.parse_memory_gb("2048M") == 2
    for bad in (lambda: executors.parse_memory_gb("lots"), lambda: executors.parse_minutes("4h"),
                lambda: executors.parse_minutes("0"), lambda: executors.SlurmOptions(cluster="pbs"),
                lambda: executors.RayOptions(gpus_per_cell=-1)):
        with pytest.raises(UsageError):
            bad()
    base = ["sweep", "--cells", CELLS[0], "--results", tmp_path / "store"]
    for extra, message in ((["--executor", "kubernetes"], "unknown executor 'kubernetes'"),
                           (["--executor", "slurm", "--time", "soon"], "--time takes minutes"),
                           (["--track", "mlflow"], "unknown tracker 'mlflow'"),
                           (["--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}"], "no Ray cluster answers")):
        assert cli(monkeypatch, *base, *extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.count("\n") == 0


@pytest.mark.parametrize("executor, module", [("slurm", "submitit"), ("ray", "ray")])
def test_a_missing_extra_says_what_to_install(executor, module, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if the package were not installed
    assert cli(monkeypatch, "sweep", "--cells", CELLS[0], "--results", tmp_path, "--executor", executor) == 2
    err = capsys.readouterr().err.strip()
    assert f"pip install 'lengthbench[{executor}]'" in err and err.count("\n") == 0


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    import os

    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the workers inherit it: they compute as this process does
    # address "local": a new instance even where `ray start` left one on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    if threads is None:
        os.environ.pop("OMP_NUM_THREADS")
    else:
        os.environ["OMP_NUM_THREADS"] = threads


def test_ray_gives_the_local_rows_and_tracks_each_cell(tmp_path, monkeypatch, capsys, local_rows, ray_instance):
    store = tmp_path / "store"
    code = cli(monkeypatch, "sweep", "--config", sweep_file(tmp_path, store), "--quiet", "--executor", "ray",
               "--ray-gpus-per-cell", "0", "--track", "tensorboard")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 ran, 0 already in the store, 0 failed" in out
    pd.testing.assert_frame_equal(scores(store), local_rows)
    for config in plan_cells(CELLS, [0], "smoke", TINY):
        assert list((store / "tracking" / config.run_id).glob("events.out.tfevents.*"))
    # a cell asking for GPUs this Ray cluster lacks would wait forever: one line instead
    assert cli(monkeypatch, "sweep", "--cells", "2back:softmax:alibi", "--results", store, "--executor", "ray") == 2
    assert "--ray-gpus-per-cell 0" in capsys.readouterr().err


def test_slurm_submits_an_array_and_later_stages_wait_in_the_queue(tmp_path, monkeypatch, capsys):
    """Against submitit's own stand-in for sbatch and sacct: the ready cells go in one job array with the
    requested resources; each later stage waits in the queue for its earlier stage's job (afterok); a second
    sweep submits nothing while those jobs live; --status reads SLURM's states."""
    mocked = pytest.importorskip("submitit.slurm.test_slurm")
    import submitit

    store = tmp_path / "store"
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"cells": CELLS, "seeds": [0], "results": str(store), "overrides": TINY,
                                "stages": [{"train_length": 16}]}))
    args = ["sweep", "--config", path, "--quiet", "--executor", "slurm", "--slurm-partition", "gpu",
            "--gpus-per-node", "1", "--cpus-per-task", "4", "--mem", "16G", "--time", "2:00:00"]
    with mocked.mocked_slurm() as mock:
        assert cli(monkeypatch, *args) == 0
        assert "4 cells: 4 submitted" in capsys.readouterr().out
        # (submitit keeps a copy of the array's script in each of its tasks' folders)
        scripts = sorted({script.read_text() for script in (store / "slurm").rglob("*.sh")})
        array = [script for script in scripts if "--array" in script]
        assert len(scripts) == 3 and len(array) == 1
        for flag in ("--array=0-1%2", "--partition=gpu", "--gpus-per-node=1", "--cpus-per-task=4", "--mem=16GB",
                     "--time=120"):
            assert flag in array[0], flag
        chained = sorted(line for script in scripts for line in script.splitlines() if "--dependency" in line)
        assert chained == ["#SBATCH --dependency=afterok:12_0", "#SBATCH --dependency=afterok:12_1"]
        assert all("--kill-on-invalid-dep=yes" in script for script in scripts if "--dependency" in script)
        sbatch_calls = mock.job_count
        assert cli(monkeypatch, *args) == 0  # every job is live: nothing is submitted twice
        assert "4 cells: 0 submitted, 4 in the store or queued already" in capsys.readouterr().out
        assert mock.job_count == sbatch_calls
        mock.set_job_state("12", "FAILED", array=2)
        submitit.SlurmJob.watcher.clear()
        assert cli(monkeypatch, "sweep", "--config", path, "--status") == 0
        out = capsys.readouterr().out
        assert "4 cells: 0 in store, 2 running, 0 queued, 2 failed, 0 to run" in out and "SLURM: FAILED" in out
