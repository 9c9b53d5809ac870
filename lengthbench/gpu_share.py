"""How many lengthbench processes share a GPU while a run trains and scores.

A stored run's seconds are what it took on a GPU it may have shared with other cells (a sweep's ``--per-gpu``,
or two sweeps on one machine); a plan that costs the next cell from them must know how many shared it, or it
counts the sharing twice (once in the stored seconds, once in its own side-by-side factor). Each process that
trains or scores on a CUDA GPU registers itself in a folder of that GPU (named by its UUID, under the machine's
temporary folder) and samples, every :data:`SAMPLE_EVERY_S` seconds on a background thread, how many registered
processes are alive: the mean over a stretch of time is the share that a row records (``train_gpu_share`` for
its training, ``gpu_share`` for the scoring of its length). Processes other than lengthbench's are not counted.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import threading
from pathlib import Path

SAMPLE_EVERY_S = 5.0


def registry(key: str) -> Path:
    """The folder where the processes using GPU ``key`` register (one empty file per process id)."""
    return Path(tempfile.gettempdir()) / "lengthbench-gpus" / key


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def count_registered(folder: Path) -> int:
    """The live processes registered in ``folder``; a file left by a process that has died is removed."""
    count = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        if _alive(int(entry.name)):
            count += 1
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    return count


class ShareTracker:
    """Registers this process as a user of GPU ``key`` and keeps the running sum of the sampled counts of users
    (this process included): :meth:`mark` and :meth:`mean_since` give the mean over a stretch."""

    def __init__(self, key: str, every: float = SAMPLE_EVERY_S, start: bool = True):
        self.folder = registry(key)
        self.every = every
        self._lock = threading.Lock()
        self._sum = 0.0
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / str(os.getpid())).touch()
            self.registered = True
        except OSError:
            self.registered = False
        self.sample()
        if start and self.registered:
            self._thread = threading.Thread(target=self._run, name="lengthbench-gpu-share", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def sample(self) -> int:
        """Count the users now and add the count to the running sum."""
        count = max(1, count_registered(self.folder)) if self.registered else 1
        with self._lock:
            self._sum += count
            self._count += 1
        return count

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def mark(self) -> tuple[float, int]:
        """Where a stretch starts (for :meth:`mean_since`)."""
        self.sample()
        with self._lock:
            return self._sum, self._count

    def mean_since(self, mark: tuple[float, int]) -> float:
        """The mean number of users sampled since ``mark`` (a sample is taken now, so it is never empty)."""
        self.sample()
        with self._lock:
            return (self._sum - mark[0]) / max(1, self._count - mark[1])

    def close(self) -> None:
        self._stop.set()
        if self.registered:
            try:
                (self.folder / str(os.getpid())).unlink()
            except OSError:
                pass
            self.registered = False


_TRACKERS: dict[str, ShareTracker] = {}


def tracker(device) -> ShareTracker | None:
    """This process's tracker for ``device`` (a ``torch.device``), started on first use; None off CUDA or where
    the GPU has no UUID to name it by."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
    try:
        key = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    if key not in _TRACKERS:
        _TRACKERS[key] = ShareTracker(key)
    return _TRACKERS[key]


def combined(share: float, seconds: float, earlier_share: float, earlier_seconds: float) -> float:
    """The mean share over two stretches (a resumed training's parts), weighted by their seconds; a stretch
    without a share (NaN, as an older checkpoint has) leaves the other's."""
    if earlier_share != earlier_share or earlier_seconds <= 0:
        return share
    if share != share or seconds <= 0:
        return earlier_share
    return (share * seconds + earlier_share * earlier_seconds) / (seconds + earlier_seconds)
