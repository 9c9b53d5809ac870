"""Flip-Flop language modelling: recall the bit of the last write.

The variants of Long-Context Generalization with Sparse Attention (``flipflop-sparse``, ``flipflop-dense``;
Appendix G), in the layout of its authors' generator (deep-spin/asentmax ``scripts/generate_data.py``, ``FlipFlop``),
worked example (sample 0 of the test stream, seed 0, ``n = 8``: 4 instructions, the first ``w``, the last ``r``)::

    input_ids  <bos> w 0 i 0 i 0 r 0     <eos>
    labels     -     - - - - - - 0 <eos> -

``n // 2`` instructions; every instruction but the final ``r`` is followed by a random bit; the middle ones are
``w`` with probability ``p_write``, else ``i``. The answer ``b`` is the bit written by the last ``w``, predicted at
the final ``r`` (the authors' source is the instructions and bits without the last bit; their target is that
bit). Scored: ``b`` and ``<eos>`` (exact match over both; the authors' metric is exact match of the generated
target); ``2 (n // 2) + 2`` tokens. Variants: ``flipflop-sparse`` (``p_write`` 0.1) and ``flipflop-dense`` (0.8).
``sep=True`` (the earlier default) puts ``<sep>`` between the final ``r`` and the answer
(``... w 0 r <sep> 0 <eos>``, ``2 (n // 2) + 3`` tokens, the answer predicted at ``<sep>``); it changes how a
sample is written, not what is drawn.

Liu et al. (2023) variant, ``flipflop-liu`` (a different parameter, ``p_ignore``, and reads inside
the sequence; its own task name so that its results cannot be mistaken for the paper's), ``n = 8``::

    input_ids  <bos> w 0 i 0 r 0 r 0 <eos>
    labels     -     - - - - 0 - 0 - -

``n // 2`` instructions, each followed by its bit: the first is ``w``, the last ``r``; the others are
``i`` with probability ``p_ignore`` (0.8, Liu et al.'s FFL(0.8)), else ``w`` or ``r`` with equal
probability. The bit after ``w`` and ``i`` is random; the bit after ``r`` is the bit of the most recent
``w``, and it is what is scored (next-token target at each ``r``); exact match needs every read
right. ``2 (n // 2) + 2`` tokens. Model defaults: the sparse-attention paper's Flip-Flop model (Liu et al. train
other sizes; ours).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import (
    IGNORE_INDEX,
    Batch,
    ModelDefaults,
    Task,
    bernoulli,
    full_batch,
    random_lanes,
    uniform_integers,
)
from lengthbench.tasks.rng import SampleRandom

_DEFAULTS = ModelDefaults(layers=4, d_model=256, heads=8, ffn=512, train_samples=10_000_000)
VOCAB = ["<pad>", "<bos>", "<sep>", "<eos>", "0", "1", "w", "i", "r"]


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


class _FlipFlop(Task):
    model_defaults = _DEFAULTS
    presentation_params = ("sep",)

    @dataclass(frozen=True)
    class Params:
        p_write: float = 0.1  # probability that a middle instruction is a write
        sep: bool = False  # False: the answer follows the final r (the authors'); True: r <sep> answer

    def build_vocab(self) -> list[str]:
        _check_probability("p_write", self.params.p_write)
        return list(VOCAB)

    def min_length(self) -> int:
        return 4

    def max_tokens(self, n: int) -> int:
        return 2 * (n // 2) + 2 + int(self.params.sep)

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        bos, sep, eos, zero, write, ignore, read = self.ids("<bos>", "<sep>", "<eos>", "0", "w", "i", "r")
        batch_size = rng.batch_size
        steps = n // 2  # instructions; the last one is the read
        is_write = bernoulli(rng, 0, steps - 1, self.params.p_write)
        is_write[:, 0] = True
        bits = uniform_integers(rng, 1, steps - 1, 0, 2)
        last_write = steps - 2 - np.argmax(is_write[:, ::-1], axis=1)
        answer = bits[np.arange(batch_size), last_write] + zero

        with_sep = int(self.params.sep)
        input_ids = np.empty((batch_size, 2 * steps + 2 + with_sep), dtype=np.int64)
        input_ids[:, 1 : 2 * steps - 1 : 2] = np.array([ignore, write])[is_write.view(np.int8)]
        input_ids[:, 2 : 2 * steps - 1 : 2] = bits + zero
        input_ids[:, 0], input_ids[:, 2 * steps - 1] = bos, read
        if with_sep:
            input_ids[:, 2 * steps] = sep
        input_ids[:, -2], input_ids[:, -1] = answer, eos
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, -3] = answer  # at the final r (or at <sep>)
        labels[:, -2] = eos
        return full_batch(input_ids, labels, n)


@register_task("flipflop-sparse", aliases=("flipflop",))
class FlipFlopSparse(_FlipFlop):
    """Flip-Flop (sparse-attention paper), sparse: writes with probability 0.1; recall the last written bit."""


@register_task("flipflop-dense")
class FlipFlopDense(_FlipFlop):
    """Flip-Flop (sparse-attention paper), dense: writes with probability 0.8; recall the last written bit."""

    @dataclass(frozen=True)
    class Params:
        p_write: float = 0.8  # probability that a middle instruction is a write
        sep: bool = False  # False: the answer follows the final r (the authors'); True: r <sep> answer


@register_task("flipflop-liu")
class FlipFlopLiu(Task):
    """Flip-Flop after Liu et al. 2023: ignores with probability p_ignore, every in-sequence read scored."""

    model_defaults = _DEFAULTS

    @dataclass(frozen=True)
    class Params:
        p_ignore: float = 0.8  # probability that a middle instruction is an ignore (FFL(p_ignore))

    def build_vocab(self) -> list[str]:
        _check_probability("p_ignore", self.params.p_ignore)
        return list(VOCAB)

    def min_length(self) -> int:
        return 4

    def max_tokens(self, n: int) -> int:
        return 2 * (n // 2) + 2

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        bos, eos, zero, write, ignore, read = self.ids("<bos>", "<eos>", "0", "w", "i", "r")
        batch_size, steps = rng.batch_size, n // 2
        lane = random_lanes(rng, 0, steps, 32)
        p_ignore = self.params.p_ignore
        ignore_below = np.uint64(round(p_ignore * 2.0**32))
        write_below = np.uint64(round((p_ignore + (1.0 - p_ignore) / 2) * 2.0**32))
        # 0: ignore, 1: write, 2: read (table lookups: np.where with scalars is slow on long rows)
        kind = (lane >= ignore_below).view(np.int8) + (lane >= write_below).view(np.int8)
        kind[:, 0], kind[:, -1] = 1, 2
        is_write, is_read = kind == 1, kind == 2
        bits = uniform_integers(rng, 1, steps, 0, 2) + zero
        last_write = np.maximum.accumulate(np.arange(steps) * is_write, axis=1)
        np.copyto(bits, np.take_along_axis(bits, last_write, axis=1), where=is_read)

        input_ids = np.empty((batch_size, 2 * steps + 2), dtype=np.int64)
        input_ids[:, 0], input_ids[:, -1] = bos, eos
        input_ids[:, 1:-1:2] = np.array([ignore, write, read])[kind]
        input_ids[:, 2:-1:2] = bits
        labels = np.full_like(input_ids, IGNORE_INDEX)
        np.copyto(labels[:, 1:-1:2], bits, where=is_read)
        return full_batch(input_ids, labels, n)
