"""MQMTAR: multi-query multi-token associative recall (Long-Context Generalization with Sparse Attention,
Appendix G; its authors' generator, deep-spin/asentmax ``scripts/generate_data.py``, decides what the text leaves
open).

Worked example (sample 3 of the test stream, seed 0, ``n = 20``: two pairs in two blocks of 10 tokens; keys and
values of 2 tokens over "0".."255"; ``queries = 2`` to keep it short, the default is 4)::

    input_ids  <bos> <space> <space> <space> 5 211 <kv> 243 16 <space> <space> <space> <space>
                     <space> 53 30 <kv> 77 15 <space> <space>
               <q> 53 30 <q> 5 211 <sep> <q> 77 15 <q> 243 16 <eos>
    labels     -100 at <bos>, the 20 prefix positions and the queries, then
               <q> 77 15 <q> 243 16 <eos> -   (the targets of the positions from <sep> on)

As the authors' generator: ``num_kv = int(n * density // 6)`` pairs (``density`` 0.8; a pair is ``k1 k2 <kv> v1
v2 <space>``, the "+2 for sep and bound" of their code), keys distinct and values distinct within a sample (drawn
without replacement), each pair inside its own block of ``n // num_kv`` tokens, the block's other
``n // num_kv - 6`` tokens ``<space>``: the pair sits centred in a row of ``2 (n // num_kv + 1)`` slots and that
many of the other slots, chosen uniformly, are kept, so a pair has a random number of spaces before it. The
prefix is ``num_kv * (n // num_kv)`` tokens: 64 at ``n = 64`` (8 blocks of 8: 2 extra spaces a pair), 952 at
1,024 and 61,166 at 65,536 (blocks of 7: 1 extra space a pair). Then ``queries`` queries ``<q> k1 k2``, keys
drawn with replacement from the pairs present; then ``<sep>`` and the answer ``<q> v1 v2`` per query, then
``<eos>`` (their ``{bos} src {sep}`` / ``trg {eos}`` patterns). Scored as next-token targets: the
``3 * queries`` answer tokens (the ``<q>`` separators included, as in their target) and ``<eos>``. A sample has
``num_kv * (n // num_kv) + 6 * queries + 3`` tokens (``max_tokens``), the same for every sample of a length.

``spacing="random"`` (the earlier default) makes the prefix exactly ``n`` tokens: ``num_kv = max(1,
floor(density * n / 6))``, and the ``n - 6 num_kv`` filler ``<space>`` tokens go to the ``num_kv + 1`` gaps
(before the first pair, between pairs, after the last), each one independently to a uniform gap.
``values="uniform"`` (the earlier default) draws values independently (repeats allowed). Together they give the
earlier layout (rows of the store's schema version 1 were drawn with it).

``num_keys = k`` (default 0: distinct keys) draws each pair's key from ``k`` distinct keys of the sample, so
keys are re-assigned and each answer is the value of the asked key's most recent pair; queries pick a pair
uniformly (so a key by how often it is assigned). Not the paper's task: MQRAR's recency in MQMTAR's format and
vocabulary, a curriculum stage before MQRAR (docs/reproduction.md).

Choices neither the paper nor its code makes (ours): the authors draw each sample's keys and values from a
fixed pool of 10,000 of the ``256 ** 2`` key and value combinations (``vocab_size``, drawn once per data set);
here the pool is every combination; distinct codes are the first ``num_kv`` outputs of a per-sample
pseudo-random permutation (an 8-round Feistel network with random round tables, cycle-walked; vectorised and
O(num_kv)); ``n`` below one pair (``6``) is rejected, and below ``8`` (where the authors' ``num_kv`` is 0) one
pair is placed; more pairs than distinct keys or values (``n`` of 491,528 and more at the defaults) is rejected.
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
    random_lanes,
    uniform_integers,
)
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>", "<space>", "<kv>", "<q>"]

SPACINGS = ("blocks", "random")
VALUE_DRAWS = ("distinct", "uniform")


def spell(codes: np.ndarray, alphabet: int, tokens: int) -> np.ndarray:
    """Codes ``[batch, count]`` written in base ``alphabet``, most significant token first: ``[batch, count, tokens]``."""
    out = np.empty(codes.shape + (tokens,), dtype=np.int64)
    for t in range(tokens - 1, -1, -1):
        codes, out[..., t] = np.divmod(codes, alphabet)
    return out


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
        # 0: distinct keys (the paper's task). k > 0: each pair's key drawn from k distinct keys of the sample,
        # so keys are re-assigned and a query's answer is the value of its key's most recent pair (MQRAR's
        # recency in MQMTAR's format and vocabulary: a curriculum stage, not the paper's task).
        num_keys: int = 0
        spacing: str = "blocks"  # "blocks": one pair per block of n // num_kv tokens (the authors'); "random": n exactly
        values: str = "distinct"  # "distinct" within a sample (the authors'); "uniform": repeats allowed

    def build_vocab(self) -> list[str]:
        p = self.params
        if p.alphabet < 1 or p.key_tokens < 1 or p.value_tokens < 1 or p.queries < 1:
            raise ValueError("alphabet, key_tokens, value_tokens and queries must be at least 1")
        if not 0.0 < p.density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {p.density}")
        if not 0 <= p.num_keys <= p.alphabet**p.key_tokens:
            raise ValueError(f"num_keys must be in [0, {p.alphabet**p.key_tokens}] (0: distinct keys), got {p.num_keys}")
        if p.spacing not in SPACINGS:
            raise ValueError(f"spacing must be one of {', '.join(SPACINGS)}, got {p.spacing!r}")
        if p.values not in VALUE_DRAWS:
            raise ValueError(f"values must be one of {', '.join(VALUE_DRAWS)}, got {p.values!r}")
        return SPECIALS + [str(i) for i in range(p.alphabet)]

    @property
    def pair_tokens(self) -> int:
        return self.params.key_tokens + self.params.value_tokens + 2

    def num_pairs(self, n: int) -> int:
        if self.params.spacing == "blocks":  # the authors' int(seq_len * num_kv // (k_len + v_len + 2))
            return max(1, int(n * self.params.density // self.pair_tokens))
        return max(1, math.floor(self.params.density * n / self.pair_tokens + 1e-9))

    def prefix_tokens(self, n: int) -> int:
        """Tokens between ``<bos>`` and the queries: ``num_kv * (n // num_kv)`` in blocks, else ``n``."""
        if self.params.spacing == "blocks":
            pairs = self.num_pairs(n)
            return pairs * (n // pairs)
        return n

    def min_length(self) -> int:
        return self.pair_tokens

    def max_tokens(self, n: int) -> int:
        p = self.params
        return 1 + self.prefix_tokens(n) + p.queries * (p.key_tokens + 1) + 1 + p.queries * (p.value_tokens + 1) + 1

    def check_length(self, n: int) -> None:
        if n < self.min_length():
            raise ValueError(
                f"task {self.name!r} needs a length of at least {self.min_length()} (one key-value pair), got {n}"
            )
        if not self.params.num_keys and self.num_pairs(n) > self.params.alphabet**self.params.key_tokens:
            raise ValueError(f"task {self.name!r}: length {n} needs more distinct keys than the alphabet has")
        if self.params.values == "distinct" and self.num_pairs(n) > self.params.alphabet**self.params.value_tokens:
            raise ValueError(f"task {self.name!r}: length {n} needs more distinct values than the alphabet has")

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
        pair_codes = codes
        keys = spell(codes, p.alphabet, p.key_tokens) + first_symbol
        if p.values == "distinct":
            values = spell(distinct_integers(rng, 5, pairs, p.alphabet**p.value_tokens), p.alphabet, p.value_tokens)
        else:
            values = uniform_integers(rng, 1, pairs * p.value_tokens, 0, p.alphabet).reshape(batch_size, pairs, -1)
        values += first_symbol

        prefix = self.prefix_tokens(n)
        if p.spacing == "blocks":
            starts = 1 + (n // pairs) * np.arange(pairs) + self.spaces_before(rng, n)
        else:  # each extra <space> picks one of the pairs + 1 gaps
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
        input_ids = np.full((batch_size, prefix + query_len + 1 + answer_len + 1), space, dtype=np.int64)
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
        input_ids[:, prefix + 1 :] = np.concatenate(
            [query_block.reshape(batch_size, -1), column(batch_size, sep),
             answer_block.reshape(batch_size, -1), column(batch_size, eos)], axis=1,
        )
        sep_at = prefix + 1 + query_len
        return full_batch(input_ids, next_token_labels(input_ids, sep_at, sep_at + answer_len), n)

    def spaces_before(self, rng: SampleRandom, n: int) -> np.ndarray:
        """``[batch, pairs]``: the ``<space>`` tokens before each pair inside its block.

        As the authors' generator: a block of ``n // num_kv`` tokens holds the pair's ``width`` tokens (its
        trailing ``<space>`` included) centred in a row of ``2 (n // num_kv + 1)`` slots; ``n // num_kv - width``
        of the other slots, chosen uniformly, stay as extra ``<space>`` tokens; those before the pair are counted.
        """
        pairs, width = self.num_pairs(n), self.pair_tokens
        block = n // pairs
        extra = block - width
        if extra == 0:
            return np.zeros((rng.batch_size, pairs), dtype=np.int64)
        slots_before = block + 1 - (width - 1) // 2
        free = 2 * (block + 1) - width
        rank_keys = random_lanes(rng, 6, pairs * free, 32).reshape(rng.batch_size, pairs, free)
        kept = np.argsort(rank_keys, axis=-1, kind="stable")[..., :extra]
        return (kept < slots_before).sum(axis=-1).astype(np.int64)
