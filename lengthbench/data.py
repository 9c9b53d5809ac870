"""Training batches: a deterministic function of ``(config, step)``, produced ahead in background workers.

Batch ``step`` draws its nominal length from the papers' training range with a counter-based hash of
``(seed, step)`` and takes samples ``step * batch_size ...`` of the train stream at that length. Resuming
at step ``s`` therefore sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import get_task
from lengthbench.tasks.rng import SampleRandom, stream_key


@dataclass(frozen=True)
class TrainStream:
    task: str
    task_params: tuple  # sorted (key, value) pairs, hashable for the worker cache
    seed: int
    batch_size: int
    train_length: int
    pad_to: int | None  # the widest batch: pad up to a bucket of at most this width (compiled models)
    pad_multiple: int = 16  # bucket widths: multiples of this, capped at ``pad_to``

    def padded_width(self, width: int) -> int:
        """The width a batch of ``width`` tokens is padded to: the next multiple of ``pad_multiple``, at
        most ``pad_to``. A few bucket widths keep the compiled shapes few (one graph each) while a short
        batch no longer pays for the longest (causal attention: trailing pads change no scored output)."""
        if self.pad_to is None:
            return width
        bucket = -(-width // self.pad_multiple) * self.pad_multiple
        return max(width, min(bucket, self.pad_to))

    def widths(self) -> list[int]:
        """The padded widths this stream's batches can have (at most: every training length's widest)."""
        task = _task(self)
        low, high = task.train_length_range(self.train_length)
        return sorted({self.padded_width(task.max_tokens(n)) for n in range(low, high + 1)})

    def length_of_step(self, step: int, low: int, high: int) -> int:
        rng = SampleRandom(stream_key("train-length", self.task, self.seed), np.array([step]))
        return int(rng.integers(0, 1, low, high + 1)[0, 0])


_TASK_CACHE: dict = {}


def _task(stream: TrainStream):
    key = (stream.task, stream.task_params)
    if key not in _TASK_CACHE:
        _TASK_CACHE[key] = get_task(stream.task, **dict(stream.task_params))
    return _TASK_CACHE[key]


def make_train_batch(stream: TrainStream, step: int):
    """``(input_ids, labels, features or None)`` of training step ``step``, as numpy arrays."""
    task = _task(stream)
    low, high = task.train_length_range(stream.train_length)
    n = stream.length_of_step(step, low, high)
    first = step * stream.batch_size
    batch = task.batch(np.arange(first, first + stream.batch_size), n, "train", stream.seed)
    input_ids, labels, features = batch.input_ids, batch.labels, batch.features
    extra = stream.padded_width(input_ids.shape[1]) - input_ids.shape[1]
    if extra > 0:
        input_ids = np.pad(input_ids, ((0, 0), (0, extra)))
        labels = np.pad(labels, ((0, 0), (0, extra)), constant_values=-100)
        if features is not None:
            features = np.pad(features, ((0, 0), (0, extra)))
    return input_ids, labels, features


class BatchProducer:
    """Iterates training batches from ``start_step`` on, ``prefetch`` batches ahead.

    ``workers = 0`` produces in one background thread (enough on a CPU, where the model is the
    bottleneck); ``workers > 0`` uses that many processes, for GPUs that consume batches faster than
    one core makes them.
    """

    def __init__(self, stream: TrainStream, start_step: int, stop_step: int, workers: int = 0,
                 prefetch: int | None = None):
        self.stream = stream
        self.next_step = start_step
        self.stop_step = stop_step
        self.executor: Executor = (
            ProcessPoolExecutor(max_workers=workers, initializer=_ignore_interrupts) if workers > 0
            else ThreadPoolExecutor(max_workers=1)
        )
        self.prefetch = prefetch or max(2, 2 * max(1, workers))
        self.pending: deque = deque()
        self._fill()

    def _fill(self) -> None:
        while len(self.pending) < self.prefetch and self.next_step < self.stop_step:
            self.pending.append(self.executor.submit(make_train_batch, self.stream, self.next_step))
            self.next_step += 1

    def __iter__(self):
        return self

    def __next__(self):
        if not self.pending:
            raise StopIteration
        result = self.pending.popleft().result()
        self._fill()
        return result

    def close(self) -> None:
        for future in self.pending:
            future.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _ignore_interrupts() -> None:
    """Data worker processes leave Ctrl-C (SIGINT) to the main process, which checkpoints and says how to
    resume; without this each worker printed its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_workers(device_type: str) -> int:
    """Data worker processes: none on a CPU, else ``LENGTHBENCH_DATA_WORKERS`` or up to 8 of the cores."""
    if device_type != "cuda":
        return 0
    if os.environ.get("LENGTHBENCH_DATA_WORKERS"):
        return max(1, int(os.environ["LENGTHBENCH_DATA_WORKERS"]))
    return max(1, min(8, (os.cpu_count() or 2) - 2))
