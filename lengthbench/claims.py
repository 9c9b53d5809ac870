"""Claims: several sweeps (or cluster workers) sharing one grid and one store run each cell once.

Before it runs a cell, a worker claims it: it creates ``<results>/claims/<run_id>.json`` with
``O_CREAT | O_EXCL`` (so of two workers exactly one succeeds), holding its owner (host, pid and a random
token) and its ``started`` and ``heartbeat`` times (UTC, seconds since the epoch). A thread refreshes the
heartbeat every ``heartbeat`` seconds while the cell runs; the claim is removed when the cell finishes or
fails. A claim whose heartbeat is older than ``timeout`` seconds, or whose owner is a process of this host
that no longer exists, is stale: another worker takes it over atomically (under a short-lived
``<run_id>.json.takeover`` lock made the same way, it checks the claim is still the stale one and replaces
it with its own in one ``os.replace``). Use::

    from lengthbench.claims import claim

    with claim(results, run_id) as got:
        if got:
            ...  # run the cell: no other live worker runs it now
        else:
            ...  # a live worker elsewhere holds it: skip it, look again later

:func:`take` returns a :class:`Held` to ``release()`` later, for a pool that starts and reaps workers in a loop.
:func:`holder` says who holds a claim (``None``: nobody live). A cell already in the store needs no claim:
check the store first, and again once the claim is held (another worker may have finished it meanwhile).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_SECONDS = 30.0
TIMEOUT_SECONDS = 300.0  # ten missed heartbeats: the owner is gone (or its machine is)


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    token: str

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex)

    def words(self) -> str:
        return f"pid {self.pid} on {self.host}"


def claims_dir(results: str | Path) -> Path:
    return Path(results) / "claims"


def claim_path(results: str | Path, run_id: str) -> Path:
    return claims_dir(results) / f"{run_id}.json"


def _record(owner: Owner, started: float) -> dict:
    return {"host": owner.host, "pid": owner.pid, "token": owner.token, "started": started,
            "heartbeat": time.time()}


def read_claim(path: Path) -> dict | None:
    """The claim's record; None where there is none. A claim being written (empty or half a file) reads as a
    record with no heartbeat yet: fresh, held by an unknown owner, until it grows old."""
    try:
        text = path.read_text(encoding="utf-8")
        stat_time = path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if isinstance(record, dict):
            return record
    except ValueError:
        pass
    return {"host": "", "pid": 0, "token": "", "started": stat_time, "heartbeat": stat_time}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_stale(record: dict, timeout: float = TIMEOUT_SECONDS) -> bool:
    """Whether a claim's owner is gone: no heartbeat for ``timeout`` seconds, or a dead process of this host."""
    heartbeat = record.get("heartbeat")
    if not isinstance(heartbeat, int | float) or time.time() - heartbeat > timeout:
        return True
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        return not _process_alive(pid)
    return False


def holder(results: str | Path, run_id: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """Who holds the claim of ``run_id`` ("pid 123 on host"), or None where nobody live does."""
    record = read_claim(claim_path(results, run_id))
    if record is None or is_stale(record, timeout):
        return None
    return f"pid {record.get('pid')} on {record.get('host') or '?'}"


def _write_new(path: Path, record: dict) -> bool:
    """Create ``path`` holding ``record`` only if it does not exist (``O_CREAT | O_EXCL``)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    return True


def _replace(path: Path, record: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _take_over(path: Path, seen: dict, owner: Owner, started: float, timeout: float) -> bool:
    """Replace the stale claim ``seen`` at ``path`` with ours, unless someone else got there first."""
    lock = path.with_name(path.name + ".takeover")
    lock_record = read_claim(lock)
    if lock_record is not None and time.time() - lock_record.get("heartbeat", 0) > timeout:
        lock.unlink(missing_ok=True)  # a taker that died within its takeover
    if not _write_new(lock, _record(owner, started)):
        return False
    try:
        current = read_claim(path)
        if current is not None and (current.get("token") != seen.get("token") or not is_stale(current, timeout)):
            return False  # renewed, or already taken over by another worker
        _replace(path, _record(owner, started))
        return True
    finally:
        lock.unlink(missing_ok=True)


def acquire(results: str | Path, run_id: str, owner: Owner, timeout: float = TIMEOUT_SECONDS) -> bool:
    """Claim ``run_id`` for ``owner``: True if it is ours now (new, or taken over from a stale owner)."""
    path = claim_path(results, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if _write_new(path, _record(owner, started)):
        return True
    record = read_claim(path)
    if record is None:  # released between our two looks: try once more
        return _write_new(path, _record(owner, started))
    if record.get("token") == owner.token:
        return True
    if is_stale(record, timeout):
        return _take_over(path, record, owner, started, timeout)
    return False


def release(results: str | Path, run_id: str, owner: Owner) -> None:
    """Remove ``owner``'s claim of ``run_id`` (a claim taken over by another worker is left alone)."""
    path = claim_path(results, run_id)
    record = read_claim(path)
    if record is not None and record.get("token") == owner.token:
        path.unlink(missing_ok=True)


class Heartbeat(threading.Thread):
    """Refreshes a held claim's heartbeat every ``interval`` seconds until stopped."""

    def __init__(self, path: Path, owner: Owner, interval: float):
        super().__init__(daemon=True, name=f"claim heartbeat {path.stem}")
        self.path, self.owner, self.interval = path, owner, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            record = read_claim(self.path)
            if record is None or record.get("token") != self.owner.token:
                return  # released, or taken over after we stalled: not ours to refresh
            with contextlib.suppress(OSError):
                _replace(self.path, {**record, "heartbeat": time.time()})

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)


class Held:
    """A claim this process holds, its heartbeat running; :meth:`release` ends both."""

    def __init__(self, results: str | Path, run_id: str, owner: Owner, heartbeat: float):
        self.results, self.run_id, self.owner = results, run_id, owner
        self.beat = Heartbeat(claim_path(results, run_id), owner, heartbeat)
        self.beat.start()

    def release(self) -> None:
        self.beat.stop()
        release(self.results, self.run_id, self.owner)


def take(results: str | Path, run_id: str, *, owner: Owner | None = None, heartbeat: float = HEARTBEAT_SECONDS,
         timeout: float = TIMEOUT_SECONDS) -> Held | None:
    """Claim ``run_id`` and start its heartbeat: a :class:`Held` to release later, or None where a live
    worker elsewhere holds it (for callers that cannot keep a ``with`` block open, e.g. a pool of workers)."""
    owner = owner or Owner.me()
    if not acquire(results, run_id, owner, timeout):
        return None
    return Held(results, run_id, owner, heartbeat)


@contextlib.contextmanager
def claim(results: str | Path, run_id: str, *, owner: Owner | None = None, heartbeat: float = HEARTBEAT_SECONDS,
          timeout: float = TIMEOUT_SECONDS) -> Iterator[bool]:
    """Hold the claim of ``run_id`` in ``results`` for the block; yields whether it was got. While held, a
    thread refreshes its heartbeat; on leaving the block (normally or by an exception) it is released."""
    held = take(results, run_id, owner=owner, heartbeat=heartbeat, timeout=timeout)
    try:
        yield held is not None
    finally:
        if held is not None:
            held.release()
