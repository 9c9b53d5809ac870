"""Flip-Flop language modelling: recall the bit of the last write.

Worked example (``n = 8``: 4 instructions, the first ``w``, the last ``r``)::

    input_ids  <bos> w 1 i 0 w 0 r <sep> 0     <eos>
    labels     -     - - - - - - - 0     <eos> -

``n // 2`` instructions; every instruction but the final ``r`` is followed by a random bit; the
middle ones are ``w`` with probability ``p_write``, else ``i``. The answer ``b`` is the bit written by
the last ``w``. Scored: ``b`` and ``<eos>`` (exact match over both). Variants: ``flipflop-sparse``
(``p_write`` 0.1) and ``flipflop-dense`` (0.8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task

_DEFAULTS = ModelDefaults(layers=4, d_model=256, heads=8, ffn=512, train_samples=10_000_000)


class _FlipFlop(Task):
    model_defaults = _DEFAULTS
    default_p_write = 0.1

    def __init__(self, **params):
        params.setdefault("p_write", self.default_p_write)
        super().__init__(**params)
        if not 0.0 <= self.params.p_write <= 1.0:
            raise ValueError(f"p_write must be in [0, 1], got {self.params.p_write}")

    @dataclass(frozen=True)
    class Params:
        p_write: float = 0.1

    def build_vocab(self) -> list[str]:
        return ["<pad>", "<bos>", "<sep>", "<eos>", "0", "1", "w", "i", "r"]

    def min_length(self) -> int:
        return 4

    def max_tokens(self, n: int) -> int:
        return 2 * (n // 2) + 3

    def generate(self, rng, n: int) -> Batch:
        bos, sep, eos, zero, write, ignore, read = self.ids("<bos>", "<sep>", "<eos>", "0", "w", "i", "r")
        batch_size = rng.batch_size
        steps = n // 2  # instructions; the last one is the read
        is_write = rng.uniform(0, steps - 1) < self.params.p_write
        is_write[:, 0] = True
        bits = rng.integers(1, steps - 1, 0, 2)
        last_write = np.where(is_write, np.arange(steps - 1), -1).max(axis=1)
        answer = bits[np.arange(batch_size), last_write] + zero

        body = np.empty((batch_size, 2 * (steps - 1)), dtype=np.int64)
        body[:, 0::2] = np.where(is_write, write, ignore)
        body[:, 1::2] = bits + zero
        column = np.ones((batch_size, 1), dtype=np.int64)
        input_ids = np.concatenate(
            [column * bos, body, column * read, column * sep, answer[:, None], column * eos], axis=1
        )
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, -3] = answer
        labels[:, -2] = eos
        return Batch(input_ids, labels, n, np.full(batch_size, input_ids.shape[1], dtype=np.int64))


@register_task("flipflop-sparse", aliases=("flipflop",))
class FlipFlopSparse(_FlipFlop):
    default_p_write = 0.1


@register_task("flipflop-dense")
class FlipFlopDense(_FlipFlop):
    default_p_write = 0.8
