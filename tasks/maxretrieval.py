"""Max Retrieval: the class of the item with the highest priority (Long-Context Generalization with Sparse Attention, Appendix H.3; Velickovic et al. 2024).

Worked example (``n = 4`` items; classes "c0".."c9"; priorities in ``Batch.features``)::

    input_ids  <bos> c7    c6    c1    c7    <q>
    features   0.0   0.547 0.510 0.794 0.577 0.0
    labels     -     -     -     -     -     c1

Each of the ``n`` items is a class token, uniform over ``classes``, with a priority uniform in (0, 1)
carried as one float feature at its position (0.0 at ``<bos>`` and ``<q>``). The single scored
position is ``<q>``, whose label is the class of the item of highest priority (classification, not
shifted). A sample has ``n + 2`` tokens.

Priorities are float32 values ``(2k + 1) / 2^24``, ``k`` uniform over ``[0, 2^23)``: exactly what the
model reads, strictly inside (0, 1). Where the top priority is tied (float32 has finitely many values,
so ties happen at long lengths), every tied item but the first is moved down by one float32 step, so the
answer is always unique. Training lengths: ``n`` in ``min_train_items .. n_train`` = 5..16
(``default_train_length`` 16, the in-distribution length of Long-Context Generalization with Sparse
Attention); the paper evaluates up to 4096 (256x), our multipliers go further. Model: the paper (after
Velickovic et al.) uses one attention layer with one head, d 128, MLP encoders and a classification head;
the FFN width (128) and the training budget (10M samples) are ours.
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
    full_batch,
    random_lanes,
    uniform_integers,
)
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<q>"]


@register_task("maxretrieval")
class MaxRetrieval(Task):
    """Max Retrieval: output the class of the item with the highest priority feature."""

    has_features = True
    default_train_length = 16
    model_defaults = ModelDefaults(layers=1, d_model=128, heads=1, ffn=128, train_samples=10_000_000)

    @dataclass(frozen=True)
    class Params:
        classes: int = 10  # class symbols "c0".."c{classes-1}"
        min_train_items: int = 5  # smallest n seen in training

    def build_vocab(self) -> list[str]:
        if self.params.classes < 1 or self.params.min_train_items < 1:
            raise ValueError("classes and min_train_items must be at least 1")
        return SPECIALS + [f"c{i}" for i in range(self.params.classes)]

    def train_length_range(self, train_length: int) -> tuple[int, int]:
        return min(self.params.min_train_items, train_length), train_length

    def max_tokens(self, n: int) -> int:
        return n + 2

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        bos, query = self.ids("<bos>", "<q>")
        batch_size, rows = rng.batch_size, np.arange(rng.batch_size)
        classes = uniform_integers(rng, 0, n, 0, self.params.classes) + len(SPECIALS)
        odd = ((random_lanes(rng, 1, n, 32) >> np.uint32(9)).astype(np.int32) << 1) | 1  # 2k + 1 < 2^24
        priority = (odd.astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)

        top = priority.max(axis=1, keepdims=True)
        at_top = priority == top
        first = at_top.argmax(axis=1)
        tied = at_top.sum(axis=1) > 1
        if tied.any():
            demote = at_top & tied[:, None]
            demote[rows, first] = False
            priority[demote] = np.broadcast_to(np.nextafter(top, np.float32(0.0)), priority.shape)[demote]

        input_ids = np.empty((batch_size, n + 2), dtype=np.int64)
        input_ids[:, 0], input_ids[:, 1:-1], input_ids[:, -1] = bos, classes, query
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, -1] = classes[rows, first]
        features = np.zeros(input_ids.shape, dtype=np.float32)
        features[:, 1:-1] = priority
        return full_batch(input_ids, labels, n, features=features)
