"""Copy, Reverse and Sort: reproduce a sequence of ``n`` symbols after a separator.

Worked example (copy, ``n = 3``, symbols "0".."31")::

    input_ids  <bos> 7 7 2 <sep> 7  7  2     <eos>
    labels     -     - - - 7     7  2  <eos> -

Reverse answers ``2 7 7`` and Sort ``2 7 7`` (ascending by numeric value, duplicates kept).
``n`` is the number of source tokens; a sample has ``2 n + 3`` tokens. Scored: the ``n`` answer
tokens and ``<eos>``, as next-token targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task

SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>"]


class _SequenceToSequence(Task):
    @dataclass(frozen=True)
    class Params:
        symbols: int = 32  # size of the data alphabet

    def build_vocab(self) -> list[str]:
        if self.params.symbols < 1:
            raise ValueError("symbols must be at least 1")
        return SPECIALS + [str(i) for i in range(self.params.symbols)]

    def max_tokens(self, n: int) -> int:
        return 2 * n + 3

    def answer(self, source: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def generate(self, rng, n: int) -> Batch:
        bos, sep, eos = self.ids("<bos>", "<sep>", "<eos>")
        source = rng.integers(0, n, 0, self.params.symbols) + len(SPECIALS)
        batch_size = rng.batch_size
        column = np.ones((batch_size, 1), dtype=np.int64)
        input_ids = np.concatenate(
            [column * bos, source, column * sep, self.answer(source), column * eos], axis=1
        )
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, n + 1 : 2 * n + 2] = input_ids[:, n + 2 : 2 * n + 3]
        return Batch(input_ids, labels, n, np.full(batch_size, 2 * n + 3, dtype=np.int64))


@register_task("copy")
class Copy(_SequenceToSequence):
    model_defaults = ModelDefaults(layers=2, d_model=256, heads=16, ffn=1024, train_samples=20_000_000)

    def answer(self, source):
        return source


@register_task("reverse")
class Reverse(_SequenceToSequence):
    model_defaults = ModelDefaults(layers=6, d_model=256, heads=8, ffn=512, train_samples=30_000_000)

    def answer(self, source):
        return source[:, ::-1]


@register_task("sort")
class Sort(_SequenceToSequence):
    model_defaults = ModelDefaults(layers=2, d_model=256, heads=8, ffn=1024, train_samples=40_000_000)

    def answer(self, source):
        return np.sort(source, axis=1)
