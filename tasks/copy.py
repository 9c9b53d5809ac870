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
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task, full_batch, uniform_integers

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
        input_ids = np.empty((rng.batch_size, 2 * n + 3), dtype=np.int64)
        source = input_ids[:, 1 : n + 1]
        source[:] = uniform_integers(rng, 0, n, 0, self.params.symbols) + len(SPECIALS)
        input_ids[:, 0], input_ids[:, n + 1], input_ids[:, -1] = bos, sep, eos
        input_ids[:, n + 2 : 2 * n + 2] = self.answer(source)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, n + 1 : 2 * n + 2] = input_ids[:, n + 2 : 2 * n + 3]
        return full_batch(input_ids, labels, n)


@register_task("copy")
class Copy(_SequenceToSequence):
    """Copy: reproduce the n source symbols after <sep>."""

    model_defaults = ModelDefaults(layers=2, d_model=256, heads=16, ffn=1024, train_samples=20_000_000)

    def answer(self, source):
        return source


@register_task("reverse")
class Reverse(_SequenceToSequence):
    """Reverse: write the n source symbols in reverse order after <sep>."""

    model_defaults = ModelDefaults(layers=6, d_model=256, heads=8, ffn=512, train_samples=30_000_000)
    extra_multipliers = (1.5,)  # Long-Context Generalization with Sparse Attention reports Reverse at 64, 96, 128, 256, 512

    def answer(self, source):
        return source[:, ::-1]


@register_task("sort")
class Sort(_SequenceToSequence):
    """Sort: write the n source symbols in ascending numeric order (duplicates kept) after <sep>."""

    model_defaults = ModelDefaults(layers=2, d_model=256, heads=8, ffn=1024, train_samples=40_000_000)

    def answer(self, source):
        # A counting sort: O(n) per sample where np.sort is O(n log n); the alphabet is small.
        batch_size, n = source.shape
        symbols = self.vocab_size
        rows = np.arange(batch_size)[:, None] * symbols
        counts = np.bincount((source + rows).ravel(), minlength=batch_size * symbols)
        return np.repeat(np.tile(np.arange(symbols), batch_size), counts).reshape(batch_size, n)
