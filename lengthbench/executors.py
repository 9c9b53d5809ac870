"""Where a sweep's cells run: ``local`` (this machine: :func:`lengthbench.sweep.run_sweep`), ``slurm`` (one
SLURM job per cell through submitit, as a job array where it can) or ``ray`` (one Ray task per cell).

Every executor runs a cell through the same entry, :func:`lengthbench.sweep.run_pending_cell` (``run --resume``
semantics), and writes the store only through its atomic per-run files, so a filesystem that every node mounts
is all they share. A cell in the store is never submitted; a cell whose job was preempted, timed out or was
retried resumes from its last checkpoint. A job takes the cell's claim (:mod:`lengthbench.claims`) as a local sweep
does, so sweeps on a cluster and on a machine, sharing one store, run each cell once.

Besides the store, a sweep on a cluster keeps one small record per cell under ``<results>/jobs/``: what was
submitted (``<run_id>.json``: executor, job id, a token) and what the job reports (``<run_id>.state.json``:
running, done, failed or interrupted, with the same token). ``lengthbench sweep --status`` reads them, with the
store, to say where each cell stands.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lengthbench.config import RunConfig
from lengthbench.errors import UsageError

EXECUTORS = ("local", "slurm", "ray")
# submitit's cluster for ``--executor slurm``: "slurm", or "local" (its LocalExecutor: the same jobs as processes
# of this machine, to try a sweep's commands before queueing it)
SLURM_CLUSTERS = ("slurm", "local")
# SLURM job states after which the job will not run again (squeue/sacct names, as submitit reports them)
SLURM_ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "TIMEOUT")
CELL_STATES = ("in store", "running", "queued", "failed", "to run")


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or a one-line :class:`UsageError` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise UsageError(f"{what} needs {module.split('.')[0]}: pip install 'lengthbench[{extra}]'") from error


def parse_memory_gb(text: str | int | None) -> int | None:
    """``"32G"``, ``"32GB"``, ``"32"`` (GB) or ``"512M"`` -> whole GB (at least 1)."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([gGmMtT]?)[bB]?\s*", str(text))
    if not match:
        raise UsageError(f"--mem takes a size like 32G or 512M, got {text!r}")
    value, unit = int(match[1]), match[2].upper() or "G"
    return max(1, {"M": value // 1024, "G": value, "T": value * 1024}[unit])


def parse_minutes(text: str | int | None) -> int | None:
    """A SLURM time limit in whole minutes (seconds round up): ``"240"`` (minutes), ``"MM:SS"``, ``"HH:MM:SS"``,
    ``"D-HH"``, ``"D-HH:MM"`` or ``"D-HH:MM:SS"``."""
    if text is None:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", str(text).strip())
    if not match:
        raise UsageError(f"--time takes minutes (240) or [D-]HH:MM:SS (4:00:00), got {text!r}")
    parts = [int(part) for part in match[2].split(":")]
    if match[1] is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = parts + [0] * (3 - len(parts))
    else:  # MM, MM:SS or HH:MM:SS
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) == 3 else (0, parts[0], parts[1] if len(parts) > 1 else 0)
    total = int(match[1] or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if total < 1:
        raise UsageError(f"--time must be at least a minute, got {text!r}")
    return total


@dataclass
class SlurmOptions:
    """What each cell's SLURM job asks for (``lengthbench sweep --executor slurm``)."""

    partition: str | None = None
    gpus_per_node: int = 1
    cpus_per_task: int = 8
    mem_gb: int | None = None
    timeout_min: int = 240
    array_parallelism: int = 256
    folder: str | None = None  # submitit's job files and logs (default <results>/slurm)
    cluster: str = "slurm"
    wait: bool = False

    def __post_init__(self):
        if self.cluster not in SLURM_CLUSTERS:
            raise UsageError(f"unknown --slurm-cluster {self.cluster!r}; choose from: {', '.join(SLURM_CLUSTERS)}")
        for name in ("gpus_per_node", "cpus_per_task", "array_parallelism"):
            value = getattr(self, name)
            if value < (0 if name == "gpus_per_node" else 1):
                raise UsageError(f"--{name.replace('_', '-')} must be at least "
                                 f"{0 if name == 'gpus_per_node' else 1}, got {value}")


@dataclass
class RayOptions:
    """How each cell's Ray task is scheduled (``lengthbench sweep --executor ray``)."""

    address: str | None = None  # None: a Ray instance of this machine (or the one this process started)
    gpus_per_cell: float = 1.0
    cpus_per_cell: float = 1.0
    max_retries: int = 3

    def __post_init__(self):
        from lengthbench.validation import check_float, check_int

        # finite: a NaN would pass every comparison and reach Ray
        check_float("--ray-gpus-per-cell", self.gpus_per_cell, 0.0, 1024.0)
        check_float("--ray-cpus-per-cell", self.cpus_per_cell, 0.0, 1e6, low_open=True)
        check_int("--ray-max-retries", self.max_retries, 0, 1000)


# -- records under <results>/jobs/ ---------------------------------------------------------------------------
def jobs_dir(results: str | Path) -> Path:
    return Path(results) / "jobs"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_record(path: Path, record: dict) -> None:
    from lengthbench.store import atomic_write_text

    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True))


def _read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_submission(results: str | Path, config: RunConfig, executor: str, job_id: str, token: str,
                     **extra: Any) -> None:
    _write_record(jobs_dir(results) / f"{config.run_id}.json",
                  dict(run_id=config.run_id, cell=config.cell_name(), executor=executor, job_id=str(job_id),
                       token=token, submitted_at=_now(), **extra))


def write_job_state(results: str | Path, run_id: str, token: str, state: str, error: str = "") -> None:
    path = jobs_dir(results) / f"{run_id}.state.json"
    record = _read_record(path) if state != "running" else {}
    record.update(run_id=run_id, token=token, state=state, host=socket.gethostname(), updated_at=_now())
    if state == "running":
        record["started_at"] = record["updated_at"]
    if error:
        record["error"] = error
    _write_record(path, record)


# -- the job of one cell, on any executor ------------------------------------------------------------------------
def run_cell_job(config_json: str, results: str, plugins: str = "", track: str | None = None,
                 token: str = "", device: str = "auto") -> str:
    """Run one cell where a cluster put it: import the sweep's plugins, record that the job runs, run the cell
    through :func:`lengthbench.sweep.run_pending_cell` (it resumes from the cell's checkpoint), append its plain
    lines to ``<results>/logs/<run_id>.log``, record how it ended. Returns the run id; raises what the cell
    raised (Ray retries it, submitit reports it)."""
    from lengthbench.plugins import load_plugins
    from lengthbench.sweep import run_pending_cell, split_list

    load_plugins(split_list(plugins))
    config = RunConfig.from_dict(json.loads(config_json))
    write_job_state(results, config.run_id, token, "running")
    log_path = Path(results) / "logs" / f"{config.run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_path, "a", encoding="utf-8") as log_file:
            def log(line: str) -> None:
                log_file.write(line + "\n")
                log_file.flush()

            with _claimed(results, config.run_id, log) as held:
                if held is not None:  # else another worker finished the cell while this job waited for it
                    run_pending_cell(config, results, device=device, log=log, track=track)
    except BaseException as error:
        # SystemExit: submitit's preemption handler, after it requeued the job; the requeued job resumes the cell
        state = "failed" if isinstance(error, Exception) else "interrupted"
        write_job_state(results, config.run_id, token, state, error=_one_line(error))
        raise
    write_job_state(results, config.run_id, token, "done")
    return config.run_id


CLAIM_POLL_SECONDS = 30.0


@contextlib.contextmanager
def _claimed(results: str, run_id: str, log: Callable[[str], None]) -> Iterator[Any]:
    """The cell's claim (:mod:`lengthbench.claims`), the one a local sweep takes, held while the block runs: a cell
    that another live worker (a sweep elsewhere, an earlier job) is running is waited for, not run twice; yields
    None where that worker put the cell in the store meanwhile. A preempted job's claim goes stale with its
    heartbeat (``claims.TIMEOUT_SECONDS``), so its requeued job takes it over."""
    from lengthbench.claims import holder, take
    from lengthbench.store import run_finished

    held = take(results, run_id)
    if held is None:
        log(f"{run_id} is running elsewhere ({holder(results, run_id)}): waiting for it")
    while held is None and not run_finished(results, run_id):
        time.sleep(CLAIM_POLL_SECONDS)
        held = take(results, run_id)
    try:
        yield held
    finally:
        if held is not None:
            held.release()


def run_cell_task(*args: Any) -> str:
    """A Ray task of one cell: :func:`run_cell_job`, returning "" when the cell is done and, where a retry would
    fail the same way (diverged training, bad input), the error in one line; other errors raise, and Ray runs
    the task again (``max_retries``), the cell resuming from its checkpoint."""
    from lengthbench.errors import TrainingDiverged

    try:
        run_cell_job(*args)
    except (TrainingDiverged, UsageError) as error:
        return _one_line(error)
    return ""


class CellJob:
    """A submitit callable running one cell. Its ``checkpoint`` (called by submitit when SLURM preempts the job
    or its time runs out) resubmits the same call: the requeued job resumes the cell from its last checkpoint
    on disk (every ``checkpoint_every`` steps), so there is no state to carry in the pickle."""

    def __call__(self, config_json: str, results: str, plugins: str = "", track: str | None = None,
                 token: str = "", device: str = "auto") -> str:
        return run_cell_job(config_json, results, plugins, track, token, device)

    def checkpoint(self, *args: Any, **kwargs: Any):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def check_ray_address(address: str | None) -> None:
    """A ``HOST:PORT`` where nothing listens fails here in seconds (Ray itself retries for minutes)."""
    match = re.fullmatch(r"([^:/\s]+):(\d+)", address or "")
    if not match:  # none (a local instance), "auto", ray://...: Ray's own checks
        return
    try:
        socket.create_connection((match[1], int(match[2])), timeout=10).close()
    except OSError as error:
        raise UsageError(f"no Ray cluster answers at {address}: {error}") from error


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


# -- submitting and following ------------------------------------------------------------------------------------
Event = Callable[[str, RunConfig, Any, str], None]


class _Backend:
    """Submits cells and says when each has ended; :func:`_drive` does the rest."""

    name = ""
    chains = False  # whether a job can wait in the queue for another job to succeed (``submit_after``)

    def submit(self, configs: list[RunConfig]) -> list[tuple[Any, str]]:  # (handle, job id) per config
        raise NotImplementedError

    def submit_after(self, config: RunConfig, job_id: str) -> tuple[Any, str]:
        raise NotImplementedError

    def ended(self, handles: list[Any], timeout: float) -> list[Any]:
        raise NotImplementedError

    def error(self, handle: Any) -> str:  # "" where the job ended without an error
        raise NotImplementedError


def _job_args(config: RunConfig, results: Path, track: str | None, token: str, device: str) -> tuple:
    from lengthbench.plugins import loaded_plugins

    return config.to_json(), str(results), ",".join(loaded_plugins()), track, token, device


class _SubmititBackend(_Backend):
    name = "slurm"

    def __init__(self, results: Path, options: SlurmOptions, track: str | None, device: str):
        submitit = require("submitit", "slurm", "--executor slurm")
        self.results, self.options, self.track, self.device = results, options, track, device
        self.submitit = submitit
        folder = Path(options.folder) if options.folder else results / "slurm"
        self.folder = folder.expanduser().absolute()
        # a later stage waits in SLURM's queue for its earlier stage's job (afterok); submitit's local cluster
        # has no queue, so there a sweep with stages follows its jobs (--wait) or runs again
        self.chains = options.cluster == "slurm"
        self.parameters = dict(name="lengthbench", timeout_min=options.timeout_min,
                               gpus_per_node=options.gpus_per_node, cpus_per_task=options.cpus_per_task,
                               slurm_array_parallelism=options.array_parallelism)
        if options.mem_gb is not None:
            self.parameters["mem_gb"] = options.mem_gb
        if options.partition:
            self.parameters["slurm_partition"] = options.partition
        self.executor = self._executor()

    def _executor(self, **extra: Any):
        executor = self.submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=self.options.cluster)
        executor.update_parameters(**self.parameters, **extra)
        return executor

    def _record(self, config: RunConfig, job, token: str) -> tuple[Any, str]:
        write_submission(self.results, config, "slurm", job.job_id, token, cluster=self.options.cluster,
                         folder=str(self.folder))
        return job, str(job.job_id)

    def submit(self, configs):
        tokens = [uuid.uuid4().hex for _ in configs]
        with self.executor.batch():  # one job array (on SLURM; the local cluster starts one process per job)
            jobs = [self.executor.submit(CellJob(), *_job_args(config, self.results, self.track, token, self.device))
                    for config, token in zip(configs, tokens, strict=True)]
        return [self._record(config, job, token) for config, job, token in zip(configs, jobs, tokens, strict=True)]

    def submit_after(self, config, job_id):
        token = uuid.uuid4().hex
        # kill_on_invalid_dep: a failed earlier stage cancels this job rather than leaving it queued forever
        executor = self._executor(slurm_additional_parameters={"dependency": f"afterok:{job_id}",
                                                               "kill_on_invalid_dep": "yes"})
        job = executor.submit(CellJob(), *_job_args(config, self.results, self.track, token, self.device))
        return self._record(config, job, token)

    def ended(self, handles, timeout):
        deadline = time.monotonic() + timeout
        while True:  # (on SLURM, submitit's watcher spaces its sacct calls out itself)
            done = [job for job in handles if job.done()]
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(0.5)

    def error(self, job):
        failure = job.exception()
        return "" if failure is None else str(failure).strip().splitlines()[-1][:300]


class _RayBackend(_Backend):
    name = "ray"

    def __init__(self, results: Path, options: RayOptions, track: str | None, device: str):
        self.ray = require("ray", "ray", "--executor ray")
        self.results, self.options, self.track, self.device = results, options, track, device
        if not self.ray.is_initialized():
            check_ray_address(options.address)
            try:
                self.ray.init(address=options.address, include_dashboard=False, log_to_driver=False)
            except Exception as error:  # ConnectionError, Ray's AuthenticationError, ...: the address or its token
                where = f"the Ray cluster at {options.address}" if options.address else "a local Ray instance"
                raise UsageError(f"cannot start or reach {where}: {_one_line(error)}") from error
        gpus = self.ray.cluster_resources().get("GPU", 0)
        if options.gpus_per_cell > gpus:
            raise UsageError(f"each cell asks for {options.gpus_per_cell:g} GPU(s) but this Ray cluster has "
                             f"{gpus:g}: pass --ray-gpus-per-cell 0 to run on CPUs")
        self.task = self.ray.remote(num_gpus=options.gpus_per_cell, num_cpus=options.cpus_per_cell,
                                    max_retries=options.max_retries, retry_exceptions=True)(run_cell_task)

    def submit(self, configs):
        handles = []
        for config in configs:
            token = uuid.uuid4().hex
            ref = self.task.remote(*_job_args(config, self.results, self.track, token, self.device))
            write_submission(self.results, config, "ray", ref.hex(), token)
            handles.append((ref, ref.hex()))
        return handles

    def ended(self, handles, timeout):
        done, _ = self.ray.wait(list(handles), num_returns=len(handles), timeout=timeout)
        return done

    def error(self, ref):
        try:
            return self.ray.get(ref)
        except Exception as error:  # the task's error after its retries, or its worker's death
            return _one_line(getattr(error, "cause", None) or error)


def _drive(pending: list[RunConfig], results: Path, backend: _Backend, emit: Event, outcomes: dict,
           poll_seconds: float, follow: bool, live_jobs: dict[str, str] | None = None) -> list[RunConfig]:
    """Submit every cell whose earlier stage is neither pending nor running, then (with ``follow``) wait for
    them, submitting later stages as theirs reach the store. Without ``follow``, a later stage is submitted to
    wait in the queue for its earlier stage's job (``live_jobs``: run id -> job id of jobs still queued or
    running) where the backend can. Returns the cells left unsubmitted."""
    import pandas as pd

    from lengthbench.checkpoints import cell_finished
    from lengthbench.store import run_finished, run_path
    from lengthbench.sweep import CellOutcome, _outcome_curve, _stage_failed

    waiting = list(pending)
    running: dict[Any, tuple[RunConfig, float, str]] = {}
    while waiting or running:
        unfinished = {config.run_id for config in waiting} | {entry[0].run_id for entry in running.values()}
        ready = []
        for config in list(waiting):
            if _stage_failed(config, outcomes, emit):
                waiting.remove(config)
            elif (not config.init_from or run_finished(results, config.init_from)
                  or config.init_from not in unfinished | set(live_jobs or {})):
                ready.append(config)
                waiting.remove(config)
        if ready:
            for config, (handle, job_id) in zip(ready, backend.submit(ready), strict=True):
                running[handle] = (config, time.perf_counter(), job_id)
                emit("start", config, None, job_id)
        if not follow:
            job_ids = dict(live_jobs or {}) | {entry[0].run_id: entry[2] for entry in running.values()}
            chained = backend.chains
            while chained and waiting:
                chained = [config for config in waiting if config.init_from in job_ids]
                for config in chained:  # in stage order: a stage's job id is known before its next stage's turn
                    _handle, job_id = backend.submit_after(config, job_ids[config.init_from])
                    waiting.remove(config)
                    job_ids[config.run_id] = job_id
                    emit("start", config, None, job_id)
            return waiting
        if not running:  # the cells left wait for an earlier stage queued or running in an earlier sweep's job
            break
        for handle in backend.ended(list(running), poll_seconds):
            config, started, job_id = running.pop(handle)
            error = backend.error(handle)
            seconds = time.perf_counter() - started
            if not error and cell_finished(results, config):
                curve = _outcome_curve(pd.read_parquet(run_path(results, config.run_id)))
                outcome = CellOutcome(config, "done", seconds, curve=curve, slot=job_id)
            else:
                log = results / "logs" / f"{config.run_id}.log"
                outcome = CellOutcome(config, "failed", seconds, slot=job_id,
                                      error=f"{error or 'the job ended without its rows in the store'} (log: {log})")
            outcomes[config.run_id] = outcome
            emit(outcome.status, config, outcome, job_id)
    return waiting


def run_on_cluster(configs: list[RunConfig], results: str | Path, executor: str, *,
                   slurm: SlurmOptions | None = None, ray: RayOptions | None = None, track: str | None = None,
                   device: str = "auto", on_event: Event | None = None, poll_seconds: float = 5.0):
    """Run (``ray``; ``slurm`` with ``wait``) or submit (``slurm``) every cell of ``configs`` not in the store.

    Returns ``(outcomes, submitted, unsubmitted)``: per cell in ``configs`` order its
    :class:`~lengthbench.sweep.CellOutcome` (done, failed, skipped: in the store, or queued: its job, or its
    earlier stage's, is queued or running from an earlier sweep), or None for a cell submitted and not
    followed (``slurm`` without ``wait``); the cells submitted; and those left for a later run (an earlier stage
    still to come, where the jobs cannot wait for it in the queue)."""
    from lengthbench.sweep import CellOutcome

    if executor not in ("slurm", "ray"):
        raise UsageError(f"unknown executor {executor!r}; choose from: {', '.join(EXECUTORS)}")
    results = Path(results).expanduser().absolute()  # jobs on other nodes see the same path
    results.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda *args: None)
    states = cell_states(configs, results)
    outcomes: dict[str, Any] = {}
    pending = []
    for config in configs:
        state = states[config.run_id]
        if state.state == "in store":
            outcomes[config.run_id] = CellOutcome(config, "skipped")
            emit("skipped", config, outcomes[config.run_id], "")
        elif state.state in ("queued", "running") and state.live:
            outcomes[config.run_id] = CellOutcome(config, "queued", error=f"{state.state} as job {state.job_id}")
            emit("queued", config, outcomes[config.run_id], state.job_id)
        else:
            pending.append(config)
    if executor == "slurm":
        options = slurm or SlurmOptions()
        backend: _Backend = _SubmititBackend(results, options, track, device)
        follow = options.wait
    else:
        backend = _RayBackend(results, ray or RayOptions(), track, device)
        follow = True  # a Ray task ends with the driver that submitted it
    submitted: list[RunConfig] = []

    def record(kind, config, outcome, slot):
        if kind == "start":
            submitted.append(config)
        emit(kind, config, outcome, slot)

    live_jobs = {run_id: state.job_id for run_id, state in states.items() if state.live}
    left = _drive(pending, results, backend, record, outcomes, poll_seconds, follow, live_jobs) if pending else []
    if follow:
        for config in left:
            outcomes[config.run_id] = CellOutcome(config, "queued", error=f"not submitted: its earlier stage "
                                                  f"{config.init_from} is queued or running; run again once it ends")
            emit("queued", config, outcomes[config.run_id], "")
    return [outcomes.get(c.run_id) for c in configs], submitted, left


# -- where each cell stands --------------------------------------------------------------------------------------
@dataclass
class CellState:
    config: RunConfig
    state: str  # one of CELL_STATES
    job_id: str = ""
    executor: str = ""
    note: str = ""
    live: bool = False  # a queued or running job that will still end (never resubmitted meanwhile)


def _slurm_state(submission: dict) -> str:
    """The SLURM state of a submitted job ("" where it cannot be asked: no SLURM here, or the local cluster)."""
    if submission.get("executor") != "slurm" or submission.get("cluster", "slurm") != "slurm":
        return ""
    try:
        import submitit

        return str(submitit.SlurmJob(folder=submission["folder"], job_id=submission["job_id"]).state)
    except Exception:  # no sacct here, or it failed: the records alone
        return ""


def cell_states(configs: list[RunConfig], results: str | Path) -> dict[str, CellState]:
    """Per run id, where the cell stands: in the store; running or queued (by its job's records, and on SLURM
    by the job's state); failed (its job said so, or SLURM ended it); or to run."""
    from lengthbench.store import run_finished

    states = {}
    for config in configs:
        run_id = config.run_id
        if run_finished(results, run_id):
            states[run_id] = CellState(config, "in store")
            continue
        submission = _read_record(jobs_dir(results) / f"{run_id}.json")
        if not submission:
            states[run_id] = CellState(config, "to run")
            continue
        job = _read_record(jobs_dir(results) / f"{run_id}.state.json")
        job = job if job.get("token") == submission.get("token") else {}
        common = dict(job_id=submission.get("job_id", ""), executor=submission.get("executor", ""))
        scheduler = _slurm_state(submission)  # "" off SLURM: then no job counts as live
        ended = scheduler.split()[0] in SLURM_ENDED if scheduler else False
        live = bool(scheduler) and not ended
        reported = job.get("state", "")
        if reported == "failed" or (ended and reported in ("", "running")):
            note = job.get("error") or f"SLURM: {scheduler}"
            states[run_id] = CellState(config, "failed", note=note, **common)
        elif reported == "running":
            states[run_id] = CellState(config, "running", note=f"on {job.get('host', '?')} since "
                                       f"{job.get('started_at', '?')}", live=live, **common)
        elif scheduler.startswith("RUNNING"):  # started, its job's record not written yet
            states[run_id] = CellState(config, "running", note="SLURM: RUNNING", live=live, **common)
        elif reported in ("", "interrupted"):  # submitted, not started (or requeued after a preemption)
            note = "requeued after an interruption" if reported else f"submitted {submission.get('submitted_at', '')}"
            states[run_id] = CellState(config, "queued", note=note, live=live, **common)
        else:  # the job says done but the store has no rows: run it again
            states[run_id] = CellState(config, "to run", note="its job ended without rows in the store", **common)
    return states
