"""MQMTAR: multi-query multi-token associative recall (seed 003, Appendix G).

Worked example (sample 0 of the test stream, seed 0, ``n = 14``: one pair and 8 filler spaces; keys and
values of 2 tokens over "0".."255"; ``queries = 2`` to keep it short, the default is 4)::

    input_ids  <bos> <space> <space> <space> 194 148 <kv> 33 171 <space> <space> <space> <space> <space> <space>
               <q> 194 148 <q> 194 148 <sep> <q> 33  171 <q> 33  171   <eos>
    labels     -100 at <bos> and the 14 prefix positions, then
               -   -   -   -   -   -   <q>   33  171 <q> 33  171 <eos> -

The prefix (``n`` tokens) holds ``num_kv = max(1, floor(density * n / 6))`` pairs, each written
``k1 k2 <kv> v1 v2 <space>``; keys are distinct within a sample, values are uniform (repeats allowed).
The remaining ``n - 6 num_kv`` filler ``<space>`` tokens go to the ``num_kv + 1`` gaps (before the
first pair, between pairs, after the last), each one independently to a uniform gap. Then
``queries`` queries ``<q> k1 k2``, keys drawn with replacement from the pairs present; then
``<sep>`` and the answer ``<q> v1 v2`` per query, then ``<eos>``. Scored as next-token targets: the
``3 * queries`` answer tokens (the ``<q>`` separators included, as in the seed's target) and ``<eos>``.
A sample has ``n + 6 * queries + 3`` tokens.

``num_keys = k`` (default 0: distinct keys) draws each pair's key from ``k`` distinct keys of the sample, so
keys are re-assigned and each answer is the value of the asked key's most recent pair; queries pick a pair
uniformly (so a key by how often it is assigned). Not the seed's task: MQRAR's recency in MQMTAR's format and
vocabulary, a stage of the curriculum of REPRODUCTION.md.

Choices the seed leaves open (ours): the gap distribution of the filler (independent uniform gaps);
distinct keys drawn as the first ``num_kv`` outputs of a per-sample pseudo-random permutation of the
``alphabet ** key_tokens`` keys (an 8-round Feistel network with random round tables, cycle-walked;
vectorised and O(num_kv)); ``n`` below one pair (``6``) is rejected; more pairs than distinct keys
(``n`` of 491,528 and more at the defaults) is rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import (
    Batch,
    ModelDefaults,
    Task,
    column,
    distinct_integers,
    full_batch,
    next_token_labels,
    uniform_integers,
)
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>", "<space>", "<kv>", "<q>"]

@register_task("mqmtar")
class MQMTAR(Task):
    """Multi-query multi-token associative recall: 2-token keys, 2-token values, 4 queries."""

    model_defaults = ModelDefaults(layers=4, d_model=512, heads=16, ffn=1024, train_samples=50_000_000)

    @dataclass(frozen=True)
    class Params:
        alphabet: int = 256  # data symbols "0".."alphabet-1"
        key_tokens: int = 2
        value_tokens: int = 2
        queries: int = 4
        density: float = 0.8  # share of the prefix the pairs aim to cover
        # 0: distinct keys (the seed's task). k > 0: each pair's key drawn from k distinct keys of the sample,
        # so keys are re-assigned and a query's answer is the value of its key's most recent pair (MQRAR's
        # recency in MQMTAR's format and vocabulary: a curriculum stage, not the seed's task).
        num_keys: int = 0

    def build_vocab(self) -> list[str]:
        p = self.params
        if p.alphabet < 1 or p.key_tokens < 1 or p.value_tokens < 1 or p.queries < 1:
            raise ValueError("alphabet, key_tokens, value_tokens and queries must be at least 1")
        if not 0.0 < p.density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {p.density}")
        if not 0 <= p.num_keys <= p.alphabet**p.key_tokens:
            raise ValueError(f"num_keys must be in [0, {p.alphabet**p.key_tokens}] (0: distinct keys), got {p.num_keys}")
        return SPECIALS + [str(i) for i in range(p.alphabet)]

    @property
    def pair_tokens(self) -> int:
        return self.params.key_tokens + self.params.value_tokens + 2

    def num_pairs(self, n: int) -> int:
        return max(1, math.floor(self.params.density * n / self.pair_tokens + 1e-9))

    def min_length(self) -> int:
        return self.pair_tokens

    def max_tokens(self, n: int) -> int:
        p = self.params
        return 1 + n + p.queries * (p.key_tokens + 1) + 1 + p.queries * (p.value_tokens + 1) + 1

    def check_length(self, n: int) -> None:
        if n < self.min_length():
            raise ValueError(
                f"task {self.name!r} needs a length of at least {self.min_length()} (one key-value pair), got {n}"
            )
        if not self.params.num_keys and self.num_pairs(n) > self.params.alphabet**self.params.key_tokens:
            raise ValueError(f"task {self.name!r}: length {n} needs more distinct keys than the alphabet has")

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        bos, sep, eos, space, kv, q = self.ids("<bos>", "<sep>", "<eos>", "<space>", "<kv>", "<q>")
        first_symbol = len(SPECIALS)
        batch_size, rows = rng.batch_size, np.arange(rng.batch_size)[:, None]
        pairs, width = self.num_pairs(n), self.pair_tokens

        # Keys: distinct codes, spelled in base `alphabet`, most significant token first (with num_keys, each
        # pair's code drawn from num_keys distinct ones).
        if p.num_keys:
            active = distinct_integers(rng, 0, p.num_keys, p.alphabet**p.key_tokens)
            codes = active[rows, uniform_integers(rng, 4, pairs, 0, p.num_keys)]
        else:
            codes = distinct_integers(rng, 0, pairs, p.alphabet**p.key_tokens)
        pair_codes = codes.copy()
        keys = np.empty((batch_size, pairs, p.key_tokens), dtype=np.int64)
        for t in range(p.key_tokens - 1, -1, -1):
            codes, keys[:, :, t] = np.divmod(codes, p.alphabet)
        keys += first_symbol
        values = uniform_integers(rng, 1, pairs * p.value_tokens, 0, p.alphabet).reshape(batch_size, pairs, -1)
        values += first_symbol

        # Filler: each extra <space> picks one of the pairs + 1 gaps.
        extra = n - pairs * width
        gaps = np.zeros((batch_size, pairs + 1), dtype=np.int64)
        if extra:
            slot = uniform_integers(rng, 2, extra, 0, pairs + 1) + rows * (pairs + 1)
            gaps = np.bincount(slot.ravel(), minlength=batch_size * (pairs + 1)).reshape(batch_size, -1)
        starts = 1 + np.cumsum(gaps[:, :pairs], axis=1) + width * np.arange(pairs)  # in input_ids

        records = np.concatenate(
            [keys, np.full((batch_size, pairs, 1), kv), values, np.full((batch_size, pairs, 1), space)], axis=2
        )
        answer_len = p.queries * (p.value_tokens + 1) + 1
        query_len = p.queries * (p.key_tokens + 1)
        input_ids = np.full((batch_size, n + query_len + 1 + answer_len + 1), space, dtype=np.int64)
        input_ids[:, 0] = bos
        flat = (starts + rows * input_ids.shape[1])[:, :, None] + np.arange(width)
        input_ids.reshape(-1)[flat.reshape(-1)] = records.reshape(-1)

        asked = rng.integers(3, p.queries, 0, pairs)  # pair index of each query
        answered = asked
        if p.num_keys:  # the most recent pair with the asked pair's key
            same = pair_codes[:, :, None] == pair_codes[rows, asked][:, None, :]  # [B, pairs, queries]
            answered = pairs - 1 - same[:, ::-1, :].argmax(axis=1)
        query_block = np.concatenate([np.full((batch_size, p.queries, 1), q), keys[rows, asked]], axis=2)
        answer_block = np.concatenate([np.full((batch_size, p.queries, 1), q), values[rows, answered]], axis=2)
        input_ids[:, n + 1 :] = np.concatenate(
            [query_block.reshape(batch_size, -1), column(batch_size, sep),
             answer_block.reshape(batch_size, -1), column(batch_size, eos)], axis=1,
        )
        sep_at = n + 1 + query_len
        return full_batch(input_ids, next_token_labels(input_ids, sep_at, sep_at + answer_len), n)
