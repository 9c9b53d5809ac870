"""MQRAR: multi-query repeated associative recall (Sieve Attention, Section 4; after Tan et al. 2025).

Worked example (sample 1 of the test stream, seed 0, ``n = 8``: 4 assignments; ``num_keys = 3`` and
``queries = 2`` to keep it short, the defaults are 16 and 4)::

    input_ids  <bos> k53 v29 k117 v6 k106 v56 k53 v94 <q> k53 <q> k106 <sep> <q> v94 <q> v56 <eos>
    labels     -     -   -   -    -  -    -   -   -   -   -   -   -    -     v94 -   v56 <eos> -

``k53`` is assigned twice; the answer to ``<q> k53`` is its most recent value, ``v94``. The prefix of ``n`` tokens
holds ``n // 2`` assignments ``k v``: keys drawn with replacement from ``num_keys`` distinct active
keys of the sample (out of ``keys``), values uniform over ``values``. Then ``queries`` queries
``<q> k``, keys drawn with replacement, uniform over the keys present in the prefix; then ``<sep>``
and ``<q> a`` per query, then ``<eos>``. Scored as next-token targets: the answers ``a`` and
``<eos>`` (not the ``<q>`` separators, which are given). A sample has ``n + 4 * queries + 3``
tokens (``n`` even) or one more filler token (``n`` odd).

``layout="inline"`` (a parameter; the default is the layout above) asks and answers each query in place,
as in Zoology's MQAR: ``<bos> prefix <sep> <q> k53 v94 <q> k106 v56 <eos>``, scored: each answer (at its
key) and ``<eos>``; ``n + 3 * queries + 3`` tokens. An answer then needs one hop less (no query to locate by
position); Sieve Attention's text ("a series of queries ... output the most recent value assigned to each queried
key") fits both.

``score_recurrences = True`` (default False) also scores every key of the prefix that was assigned before, at
the key, with the value it held until then (the label is that value, not the next input token, which assigns the
new one). In the example above, the second ``k53`` (position 7) is scored with ``v29``. Tan et al.'s MQRAR
generator (shawntan/zoology, ``zoology/data/recent_associative_recall.py``) scores every key that recurs this way,
so its samples carry many more scored positions than the queries alone; exact match then needs the recurrences
too. It needs one-symbol values.

``value_tokens = 2`` (default 1) makes each value two symbols: assignments ``k v v'`` (``n // 3`` of them, the
remainder of ``n`` as leading ``<space>``) and answers ``<q> a a'``, each symbol scored. Not the paper's task:
it is the first stage of a curriculum (the second answer symbol is a plain induction step, copying what
followed the first), whose trained weights then start the paper's MQRAR (``lengthbench run --init-from``);
the vocabulary is the same.

The model: 4 layers (d 256, 16 heads). Sieve Attention's Table 1 heads its MQRAR columns "MQRAR (L = 4)" while
its Table 3 gives 2 layers; here no 2-layer position-free model learns the separate layout (0 of 3 seeds), while
4-layer stick-breaking and ``sieve`` + NoPE models learn it and hold it to 1024x (docs/reproduction.md, Sieve
Attention Table 1). Why depth: the answer slots after ``<sep>`` share one input token (``<q>``), and without
positions a first layer's scores depend on content only, so no slot can pick its own query's key in layer 1; one
layer recalls each query key's value, a later one lets each slot fetch it.

Choices the paper leaves open (ours): for odd ``n`` the prefix starts with one ``<space>`` so that it
is ``n`` tokens; "keys present" is uniform over distinct present keys (not weighted by how often a
key is assigned); the feed-forward width of the model (1024) is not given by Sieve Attention.
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
    column,
    distinct_integers,
    full_batch,
    uniform_integers,
)
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>", "<space>", "<q>"]
LAYOUTS = ("separate", "inline")


@register_task("mqrar")
class MQRAR(Task):
    """Multi-query repeated associative recall: answer the most recent value of each queried key."""

    model_defaults = ModelDefaults(layers=4, d_model=256, heads=16, ffn=1024, train_samples=20_000_000)
    presentation_params = ("layout", "score_recurrences")

    @dataclass(frozen=True)
    class Params:
        keys: int = 128  # key symbols "k0".."k{keys-1}"
        values: int = 128  # value symbols "v0".."v{values-1}"
        num_keys: int = 16  # distinct active keys per sample
        queries: int = 4
        layout: str = "separate"  # "separate": queries, <sep>, then the answers; "inline": <q> k a per query
        value_tokens: int = 1  # symbols per value (a curriculum's first stage uses 2; the paper's task has 1)
        score_recurrences: bool = False  # also score each prefix key assigned before with its value until then

    def build_vocab(self) -> list[str]:
        p = self.params
        if min(p.keys, p.values, p.num_keys, p.queries, p.value_tokens) < 1:
            raise ValueError("keys, values, num_keys, queries and value_tokens must be at least 1")
        if p.num_keys > p.keys:
            raise ValueError(f"num_keys ({p.num_keys}) cannot exceed keys ({p.keys})")
        if p.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {p.layout!r}; choose from: {', '.join(LAYOUTS)}")
        if p.score_recurrences and p.value_tokens != 1:
            raise ValueError("score_recurrences needs value_tokens = 1 (a recurring key is scored with one symbol)")
        return SPECIALS + [f"k{i}" for i in range(p.keys)] + [f"v{i}" for i in range(p.values)]

    tail_window = 64  # assignments per active key searched before the whole prefix (speed only)

    def min_length(self) -> int:
        return 1 + self.params.value_tokens

    def max_tokens(self, n: int) -> int:
        p = self.params
        answered = p.queries * (1 + p.value_tokens)
        if p.layout == "inline":
            return 1 + n + 1 + p.queries + answered + 1
        return 1 + n + 2 * p.queries + 1 + answered + 1

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        bos, sep, eos, space, q = self.ids("<bos>", "<sep>", "<eos>", "<space>", "<q>")
        first_key, first_value = len(SPECIALS), len(SPECIALS) + p.keys
        batch_size, rows = rng.batch_size, np.arange(rng.batch_size)[:, None]
        width = 1 + p.value_tokens  # tokens per assignment
        assignments, filler = divmod(n, width)

        active = distinct_integers(rng, 0, p.num_keys, p.keys)  # [B, num_keys] key numbers
        slot = uniform_integers(rng, 1, assignments, 0, p.num_keys)  # which active key each assignment sets
        values = uniform_integers(rng, 2, assignments * p.value_tokens, 0, p.values)
        values = values.reshape(batch_size, assignments, p.value_tokens)

        # Queries: uniform over the active keys that occur in the prefix.
        present = np.bincount((slot + rows * p.num_keys).ravel(), minlength=batch_size * p.num_keys)
        present = present.reshape(batch_size, p.num_keys) > 0
        scores = rng.uniform(3, p.queries * p.num_keys).reshape(batch_size, p.queries, p.num_keys)
        asked = np.where(present[:, None, :], scores, -1.0).argmax(axis=2)  # [B, queries] slots
        # Most recent assignment of each asked key: search a tail window first (an active key is
        # almost always set again near the end), then the whole prefix for the rows it missed.
        answers = np.empty((batch_size, p.queries, p.value_tokens), dtype=np.int64)
        window = max(1, min(assignments, self.tail_window * p.num_keys))
        for j in range(p.queries):
            hit = slot[:, -window:] == asked[:, j : j + 1]
            last = assignments - 1 - hit[:, ::-1].argmax(axis=1)
            missed = ~hit.any(axis=1)
            if missed.any():
                hit = slot[missed] == asked[missed, j : j + 1]
                last[missed] = assignments - 1 - hit[:, ::-1].argmax(axis=1)
            answers[:, j] = values[np.arange(batch_size), last]

        prefix = np.empty((batch_size, assignments, width), dtype=np.int64)
        prefix[:, :, 0] = active[rows, slot] + first_key
        prefix[:, :, 1:] = values + first_value
        prefix = prefix.reshape(batch_size, -1)
        marks = np.full((batch_size, p.queries, 1), q)
        keys_asked = (active[rows, asked] + first_key)[:, :, None]
        parts = [column(batch_size, bos)] + [column(batch_size, space)] * filler
        # Offsets of the answer symbols within one answered query (after its <q>, or <q> k when inline).
        within = np.arange(p.value_tokens)
        if p.layout == "inline":
            asked_and_answered = np.concatenate([marks, keys_asked, answers + first_value], axis=2)
            parts += [prefix, column(batch_size, sep), asked_and_answered.reshape(batch_size, -1),
                      column(batch_size, eos)]
            starts = 1 + n + 1 + 2 + (2 + p.value_tokens) * np.arange(p.queries)
        else:
            queried = np.concatenate([marks, keys_asked], axis=2)
            answered = np.concatenate([marks, answers + first_value], axis=2)
            parts += [prefix, queried.reshape(batch_size, -1), column(batch_size, sep),
                      answered.reshape(batch_size, -1), column(batch_size, eos)]
            starts = 1 + n + 2 * p.queries + 2 + width * np.arange(p.queries)  # positions of a1 .. a4
        answer_at = (starts[:, None] + within[None, :]).ravel()
        input_ids = np.concatenate(parts, axis=1)

        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, answer_at - 1] = input_ids[:, answer_at]
        labels[:, -2] = eos
        if p.score_recurrences:
            recurs, before = previous_assignment(slot)
            key_at = 1 + filler + width * np.arange(assignments)  # each assignment's key position
            rows_hit, hit = np.nonzero(recurs)
            labels[rows_hit, key_at[hit]] = values[rows_hit, before[rows_hit, hit], 0] + first_value
        return full_batch(input_ids, labels, n)


def previous_assignment(slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each assignment ``[B, A]`` (its key's slot): whether the key was assigned before it, and the index of
    that key's latest earlier assignment (0 where there is none)."""
    order = np.argsort(slot, axis=1, kind="stable")  # by key, then by position
    by_key = np.take_along_axis(slot, order, axis=1)
    same = by_key[:, 1:] == by_key[:, :-1]  # the assignment before in this order sets the same key
    recurs = np.zeros(slot.shape, dtype=bool)
    before = np.zeros(slot.shape, dtype=np.int64)
    np.put_along_axis(recurs, order[:, 1:], same, axis=1)
    np.put_along_axis(before, order[:, 1:], np.where(same, order[:, :-1], 0), axis=1)
    return recurs, before
