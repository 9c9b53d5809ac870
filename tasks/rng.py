"""Counter-based random numbers: sample ``i`` of a stream is a pure function of ``(key, i)``.

Every generator draws its randomness through :class:`SampleRandom`, so sample ``i`` is identical
whatever batch it is generated in, in which order, by how many workers, on which machine. The numbers
are a SplitMix64 hash of ``(key, sample index, draw, position)``: fully vectorised over a batch, no
per-sample generator objects, no per-token Python.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_POSITION = np.uint64(0xD1B54A32D192ED03)
_DRAW = np.uint64(0xC2B2AE3D27D4EB4F)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO_TO_MINUS_53 = 1.0 / (1 << 53)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (a bijection on uint64 with good avalanche)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def stream_key(*parts: object) -> int:
    """A 64-bit key from any JSON-serialisable parts (task name, parameters, split, n, seed)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


class SampleRandom:
    """Random numbers for a batch of samples, one row per sample index.

    ``draw`` names the purpose of a call (0, 1, 2, ... within a generator) so that two calls never
    share numbers; a generator must use each draw id once per sample.
    """

    def __init__(self, key: int, indices: np.ndarray):
        indices = np.asarray(indices, dtype=np.uint64).reshape(-1)
        with np.errstate(over="ignore"):
            self._sample_hash = _mix(_mix(indices * _GOLDEN + np.uint64(key)))[:, None]
        self.batch_size = len(indices)

    def bits(self, draw: int, size: int) -> np.ndarray:
        """uint64 array ``[batch, size]``."""
        positions = np.arange(size, dtype=np.uint64)[None, :]
        with np.errstate(over="ignore"):
            seed = _mix(self._sample_hash + np.uint64(draw + 1) * _DRAW)
            return _mix(seed + positions * _POSITION)

    def uniform(self, draw: int, size: int) -> np.ndarray:
        """float64 in [0, 1), shape ``[batch, size]``."""
        return (self.bits(draw, size) >> np.uint64(11)).astype(np.float64) * _TWO_TO_MINUS_53

    def integers(self, draw: int, size: int, low: int, high) -> np.ndarray:
        """int64 uniform in ``[low, high)``; ``high`` may be an array broadcasting against ``[batch, 1]``."""
        span = np.asarray(high, dtype=np.int64) - low
        return low + np.floor(self.uniform(draw, size) * span).astype(np.int64)

    def permutation_order(self, draw: int, size: int) -> np.ndarray:
        """A uniform random permutation of ``range(size)`` per sample, ``[batch, size]``."""
        return np.argsort(self.bits(draw, size), axis=1, kind="stable")
