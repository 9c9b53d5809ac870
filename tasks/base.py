"""What every task is: a vocabulary, a vectorised batch generator, and the lengths it runs at."""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from lengthbench.tasks.rng import SampleRandom, stream_key

IGNORE_INDEX = -100
SPLITS = ("train", "val", "test")
PAD = "<pad>"


@dataclass
class Batch:
    """A padded batch. ``labels[b, t]`` is the target of the output at position ``t`` (or -100)."""

    input_ids: np.ndarray  # int64 [batch, tokens], padded at the end with the <pad> id 0
    labels: np.ndarray  # int64 [batch, tokens], IGNORE_INDEX where nothing is scored
    nominal_length: int  # the task's size parameter n
    realised_tokens: np.ndarray  # int64 [batch]: tokens of each sample before padding
    features: np.ndarray | None = None  # float32 [batch, tokens] for tasks with per-position features
    groups: np.ndarray | None = None  # int64 [batch, tokens]: scored positions' answer group (per-needle accuracy)

    def __len__(self) -> int:
        return len(self.input_ids)

    def sample(self, b: int) -> dict[str, list]:
        """Sample ``b`` unpadded, in the JSON Lines layout of ``lengthbench tasks sample``."""
        end = int(self.realised_tokens[b])
        out: dict[str, list] = {
            "input_ids": self.input_ids[b, :end].tolist(),
            "labels": self.labels[b, :end].tolist(),
        }
        if self.features is not None:
            out["features"] = [float(x) for x in self.features[b, :end]]
        if self.groups is not None:
            out["groups"] = self.groups[b, :end].tolist()
        return out


@dataclass(frozen=True)
class ModelDefaults:
    """The model and training budget of a task in its paper (``../shared/specs/TASKS.md``)."""

    layers: int
    d_model: int
    heads: int
    ffn: int
    train_samples: int
    batch_size: int = 128


class Task(abc.ABC):
    """A task family. Subclasses set the class attributes and define the abstract methods ``build_vocab``,
    ``max_tokens`` and ``generate``; ``min_length``, ``max_length`` and ``train_length_range`` have defaults.

    A subclass that leaves an abstract method out is abstract: ``register_task`` refuses it where it is defined
    (the class statement under the decorator raises ``TypeError`` naming the methods), and creating one raises
    ``TypeError`` too.

    ``generate`` receives a :class:`SampleRandom` whose row ``b`` belongs to sample ``indices[b]``; it
    must draw every random number through it, vectorised over the batch, so that a sample does not
    depend on which batch it is in.
    """

    name: ClassVar[str]
    metric: ClassVar[str] = "exact_match"  # the metric the papers report: exact_match or token_accuracy
    has_features: ClassVar[bool] = False
    model_defaults: ClassVar[ModelDefaults]
    default_train_length: ClassVar[int] = 64  # n_train unless --train-length says otherwise
    # Parameters that change how a sample is written, not what is drawn: left out of the stream key, so
    # that every setting of them writes the same samples.
    presentation_params: ClassVar[tuple[str, ...]] = ()
    # evaluation points between the powers of two that a paper reports (multipliers of n_train, e.g. 1.5)
    extra_multipliers: ClassVar[tuple[float, ...]] = ()

    @dataclass(frozen=True)
    class Params:
        """Task parameters (subclasses replace this with their own frozen dataclass)."""

    def __init__(self, **params: Any):
        fields = {f.name for f in dataclasses.fields(self.Params)}
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ValueError(
                f"task {self.name!r} has no parameter {unknown[0]!r}; its parameters: {', '.join(sorted(fields)) or 'none'}"
            )
        defaults = {f.name: f.default for f in dataclasses.fields(self.Params)}
        for key, value in params.items():  # 1 and 1.0 must name the same stream
            if isinstance(defaults[key], float) and isinstance(value, int) and not isinstance(value, bool):
                params[key] = float(value)
        self.params = self.Params(**params)
        _check_param_types(self.name, self.params)
        self._vocab = self.build_vocab()
        self._ids = {symbol: i for i, symbol in enumerate(self._vocab)}
        if self._vocab[0] != PAD:
            raise AssertionError(f"task {self.name}: id 0 must be {PAD}")

    # -- what subclasses provide ------------------------------------------------------------------
    @abc.abstractmethod
    def build_vocab(self) -> list[str]:
        """The symbols, id 0 first (``<pad>``)."""

    def min_length(self) -> int:
        return 1

    def max_length(self) -> int | None:
        """Largest nominal length the task can build (None: unbounded)."""
        return None

    @abc.abstractmethod
    def max_tokens(self, n: int) -> int:
        """Upper bound on the realised token count of a sample of nominal length ``n``."""

    @abc.abstractmethod
    def generate(self, rng: SampleRandom, n: int) -> Batch:
        """The batch of the samples whose random numbers ``rng`` draws (row ``b``: sample ``b``), at length ``n``."""

    def train_length_range(self, train_length: int) -> tuple[int, int]:
        """Inclusive range of nominal lengths seen in training (the papers: n_train/2 .. n_train)."""
        return max(self.min_length(), train_length // 2), train_length

    # -- shared behaviour -------------------------------------------------------------------------
    @property
    def vocab(self) -> list[str]:
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def token_id(self, symbol: str) -> int:
        return self._ids[symbol]

    def ids(self, *symbols: str) -> list[int]:
        return [self._ids[s] for s in symbols]

    def symbols(self, ids) -> list[str]:
        """The inverse of :meth:`ids`: token ids (any integer iterable) -> their symbols."""
        return [self._vocab[int(i)] for i in ids]

    def key(self, split: str, n: int, seed: int) -> int:
        drawn = {k: v for k, v in dataclasses.asdict(self.params).items() if k not in self.presentation_params}
        return stream_key(self.name, drawn, split, int(n), int(seed))

    def check_length(self, n: int) -> None:
        if n < self.min_length():
            raise ValueError(f"task {self.name!r} needs a length of at least {self.min_length()}, got {n}")
        if self.max_length() is not None and n > self.max_length():
            raise ValueError(f"task {self.name!r} supports lengths up to {self.max_length()}, got {n}")

    def batch(self, indices, n: int, split: str = "train", seed: int = 0) -> Batch:
        """Samples ``indices`` of the stream ``(task, params, split, n, seed)``."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from: {', '.join(SPLITS)}")
        self.check_length(n)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) == 0:
            raise ValueError("a batch needs at least one sample")
        if (indices < 0).any():
            raise ValueError("sample indices must be non-negative")
        batch = self.generate(SampleRandom(self.key(split, n, seed), indices), n)
        batch.nominal_length = n
        return batch


@dataclass
class TaskInfo:
    """What ``lengthbench tasks list`` shows."""

    name: str
    metric: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)


def _check_param_types(task: str, params) -> None:
    """A parameter takes the type of its default (an int is accepted for a float): bad CLI input fails early."""
    for f in dataclasses.fields(params):
        value, default = getattr(params, f.name), f.default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = True
        if not ok:
            raise ValueError(
                f"task {task!r}: parameter {f.name!r} takes a {type(default).__name__}, got {value!r}"
            )


def random_lanes(rng: SampleRandom, draw: int, size: int, bits: int) -> np.ndarray:
    """``size`` uniform ``bits``-bit integers (16 or 32) per sample, ``[batch, size]``, unsigned.

    Each 64-bit draw of ``rng`` is cut into ``64 // bits`` lanes (little-endian order on every
    machine), so long sequences hash 2-4x fewer numbers than with one draw per token.
    """
    per_word = 64 // bits
    words = rng.bits(draw, -(-size // per_word))
    return words.astype("<u8", copy=False).view(f"<u{bits // 8}")[:, :size]


def uniform_integers(rng: SampleRandom, draw: int, size: int, low: int, high: int) -> np.ndarray:
    """int64 ``[batch, size]`` uniform in ``[low, high)``, the fast path for long sequences.

    ``(lane * span) >> bits`` over 16-bit lanes where the span is a power of two (exact) or at most 64
    (relative bias below 0.1%), over 32-bit lanes up to a span of 2^22 (the same bound); wider spans
    use :meth:`SampleRandom.integers`.
    """
    span = int(high) - int(low)
    if span < 1:
        raise ValueError(f"empty range [{low}, {high})")
    if span <= 64 or (span <= 1 << 16 and span & (span - 1) == 0):
        bits = 16
    elif span <= 1 << 22:
        bits = 32
    else:
        return rng.integers(draw, size, low, high)
    lanes = random_lanes(rng, draw, size, bits).astype(np.int64)
    if span & (span - 1) == 0:  # the same numbers, without the multiply
        return (lanes >> (bits - span.bit_length() + 1)) + low
    return low + ((lanes * span) >> bits)


def bernoulli(rng: SampleRandom, draw: int, size: int, p: float) -> np.ndarray:
    """bool ``[batch, size]``, True with probability ``p`` (to 2^-32)."""
    return random_lanes(rng, draw, size, 32) < np.uint64(min(round(p * 2.0**32), 2**32))


_FEISTEL_ROUNDS = 8


def distinct_integers(rng: SampleRandom, draw: int, count: int, domain: int) -> np.ndarray:
    """``count`` distinct integers in ``[0, domain)`` per sample, in random order, ``[batch, count]``.

    They are ``P(0), .., P(count - 1)`` for a per-sample pseudo-random permutation ``P`` of
    ``[0, domain)``: a balanced Feistel network on ``2 * half_bits`` bits whose round functions are
    random tables drawn from ``rng``, restricted to ``[0, domain)`` by cycle walking.
    """
    if count > domain:
        raise ValueError(f"cannot draw {count} distinct values from {domain}")
    half_bits = max(1, math.ceil(math.ceil(math.log2(max(domain, 2))) / 2))
    half = 1 << half_bits
    if half_bits <= 16:  # four table entries per 64-bit draw
        tables = random_lanes(rng, draw, _FEISTEL_ROUNDS * half, 16).astype(np.int64) & (half - 1)
    else:
        tables = (rng.bits(draw, _FEISTEL_ROUNDS * half) & np.uint64(half - 1)).astype(np.int64)
    tables = tables.ravel()

    def permute(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        left, right = x >> half_bits, x & (half - 1)
        table_at = rows * (_FEISTEL_ROUNDS * half)  # row r's round tables start here in `tables`
        for r in range(_FEISTEL_ROUNDS):
            left, right = right, left ^ tables[table_at + (r * half) + right]
        return (left << half_bits) | right

    rows = np.broadcast_to(np.arange(rng.batch_size)[:, None], (rng.batch_size, count))
    codes = permute(np.broadcast_to(np.arange(count, dtype=np.int64), rows.shape), rows)
    outside = codes >= domain
    while outside.any():  # cycle walking: a bijection of [0, 4^h) restricted to [0, domain)
        codes[outside] = permute(codes[outside], rows[outside])
        outside = codes >= domain
    return codes


def column(batch_size: int, token: int) -> np.ndarray:
    """A ``[batch_size, 1]`` column of one token id, for ``np.concatenate`` layouts."""
    return np.full((batch_size, 1), token, dtype=np.int64)


def next_token_labels(input_ids: np.ndarray, first: int, last: int) -> np.ndarray:
    """Labels scoring positions ``first .. last - 1`` with the next token (teacher forcing)."""
    labels = np.full_like(input_ids, IGNORE_INDEX)
    labels[:, first:last] = input_ids[:, first + 1 : last + 1]
    return labels


def full_batch(input_ids: np.ndarray, labels: np.ndarray, n: int, **extra) -> Batch:
    """A batch whose samples all have the same length (no padding)."""
    batch_size, width = input_ids.shape
    return Batch(input_ids, labels, n, np.full(batch_size, width, dtype=np.int64), **extra)


def pad_rows(rows: list[np.ndarray], fill: int) -> np.ndarray:
    """Right-pad 1-D int arrays into one ``[len(rows), max_len]`` array."""
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out
