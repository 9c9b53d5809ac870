"""2Back: label every source token with the token two positions earlier.

Worked example (``n = 4``, data symbols "1".."15", "0" the start filler)::

    input_ids  <bos> 0  5  9  3  12 <eos>
    labels     -     0  0  0  5  9  -

Token classification (labels are not shifted). The source is ``0 x1 .. xn`` with ``x`` uniform over
"1".."15"; the label at each source position is the token two positions earlier, "0" for the first
two. ``n`` counts the ``x`` tokens. Scored: every source position (the filler included); the
papers report per-token accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task, full_batch, uniform_integers


@register_task("2back", aliases=("nback",))
class TwoBack(Task):
    """2Back: label every source token with the token two positions earlier (per-token accuracy)."""

    metric = "token_accuracy"
    model_defaults = ModelDefaults(layers=2, d_model=256, heads=8, ffn=512, train_samples=10_000_000)

    @dataclass(frozen=True)
    class Params:
        symbols: int = 15  # data symbols "1".."symbols"
        back: int = 2  # how far back the label looks

    def build_vocab(self) -> list[str]:
        if self.params.symbols < 1 or self.params.back < 1:
            raise ValueError("symbols and back must be at least 1")
        return ["<pad>", "<bos>", "<eos>"] + [str(i) for i in range(self.params.symbols + 1)]

    def max_tokens(self, n: int) -> int:
        return n + 3

    def generate(self, rng, n: int) -> Batch:
        bos, eos, zero = self.ids("<bos>", "<eos>", "0")
        back = self.params.back
        input_ids = np.empty((rng.batch_size, n + 3), dtype=np.int64)
        input_ids[:, 0], input_ids[:, 1], input_ids[:, -1] = bos, zero, eos
        input_ids[:, 2:-1] = zero + uniform_integers(rng, 0, n, 1, self.params.symbols + 1)
        source = input_ids[:, 1:-1]  # the filler "0" and x1 .. xn
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, 1 : 1 + min(back, n + 1)] = zero
        labels[:, 1 + back : n + 2] = source[:, : max(0, n + 1 - back)]  # nothing to recall where back > n + 1
        return full_batch(input_ids, labels, n)
