"""Passkey retrieval (needle in a haystack), word-level (Threshold Differential Attention, Appendix D;
Softpick).

Worked example (sample 0 of the test stream, seed 0, ``passkey``, ``n = 40``: 6 filler tokens, the
filler entered at "sun", the needle at depth 4)::

    input_ids  <bos> sun is yellow . the pass key is 2 4 0 1 8 . remember it . 2 4 0 1 8 is the pass key .
               here we what is the pass key ? the pass key is <sep> 2 4 0 1 8 <eos>
    labels     -100 up to the last "is"; then at <sep> and each digit the next token: 2 4 0 1 8 <eos>

Vocabulary: ``<pad> <bos> <sep> <eos>``, the lower-cased words and the punctuation ``.`` and ``?`` of
the filler, needles and queries below, and the digits "0".."9" (one vocabulary for both tasks).

- Filler: "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
  (24 tokens) repeated, entered at a random offset (uniform over its 24 tokens); the haystack is one
  continuous stretch of it, the needles cut in at token boundaries (mid-sentence allowed, as Threshold
  Differential Attention, Appendix D, cuts its filler by characters).
- Needle: "The pass key is K. Remember it. K is the pass key." with ``K`` uniform in 1..``key_max``
  (50000), written as ``digits`` (5) digit tokens, zero-padded ("00042").
- Query: "What is the pass key? The pass key is", then ``<sep>``, the ``digits`` digits, ``<eos>``.
- ``n`` = tokens from ``<bos>`` to the end of the query; the filler gets what the needles and the
  query leave. The needle's depth is uniform over the ``F + 1`` places in the ``F`` filler tokens.
  Scored, as next-token targets: the digits and ``<eos>``. A sample has ``n + digits + 2`` tokens.

``passkey-multi``: ``needles`` (2; Threshold Differential Attention also uses 4) needles "The pass key number J is K. Remember
it. K is the pass key number J." (``J`` = 1.. ``needles``, a digit token, so at most 9 needles), the
query "What are the pass keys? The pass keys are", and the answer all keys in the order of their
ordinals, which is their order in the text: ``<sep> K1 digits .. Kk digits <eos>``. Widely separated:
the filler is cut into ``needles`` equal strata and needle ``J`` lies in stratum ``J``, its depth
uniform over the middle ``depth_jitter`` (0.5) share of it, so two needles are at least about
``(1 - depth_jitter) F / needles`` filler tokens apart. ``Batch.groups`` holds the needle index
(0 .. k-1) at each scored position and -1 elsewhere; the ``<eos>`` counts with the last needle, so
a sample is an exact match iff every group is. Its ``n`` starts at ``1 + needles * 27 + 10`` (65 for
2 needles), so its ``default_train_length`` is 128 (training ``n`` 65..128).

The papers (Threshold Differential Attention, Appendix D; Softpick, Table 4) evaluate pretrained language
models on this test and give no small-model recipe: the model defaults here are ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import Batch, ModelDefaults, Task, full_batch, next_token_labels
from lengthbench.tasks.rng import SampleRandom

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {K}. Remember it. {K} is the pass key."
QUERY = "What is the pass key? The pass key is"
NEEDLE_MULTI = "The pass key number {J} is {K}. Remember it. {K} is the pass key number {J}."
QUERY_MULTI = "What are the pass keys? The pass keys are"

SPECIALS = ["<pad>", "<bos>", "<sep>", "<eos>"]
DIGITS = [str(d) for d in range(10)]


def words(text: str) -> list[str]:
    """Word-level tokens: lower-cased words, ``.`` and ``?``; ``{K}`` and ``{J}`` kept as placeholders."""
    return [t if t.startswith("{") else t.lower() for t in re.findall(r"\{[KJ]\}|\w+|[^\w\s]", text)]


def _vocabulary() -> list[str]:
    seen = list(SPECIALS)
    for text in (FILLER, NEEDLE, QUERY, NEEDLE_MULTI, QUERY_MULTI):
        for token in words(text):
            if not token.startswith("{") and token not in seen and token not in DIGITS:
                seen.append(token)
    return seen + DIGITS


VOCAB = _vocabulary()


class _Passkey(Task):
    model_defaults = ModelDefaults(layers=2, d_model=256, heads=8, ffn=1024, train_samples=10_000_000)
    needle_text, query_text = NEEDLE, QUERY

    @dataclass(frozen=True)
    class Params:
        key_max: int = 50_000  # keys uniform in 1..key_max
        digits: int = 5  # tokens per key, zero-padded

    # -- the knobs that passkey-multi changes -----------------------------------------------------
    @property
    def needles(self) -> int:
        return 1

    @property
    def depth_jitter(self) -> float:
        return 1.0

    def build_vocab(self) -> list[str]:
        p = self.params
        if p.key_max < 1 or p.digits < 1 or p.key_max >= 10**p.digits:
            raise ValueError(f"need 1 <= key_max < 10**digits, got key_max={p.key_max}, digits={p.digits}")
        return list(VOCAB)

    def _template(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Needle token ids, key-digit index (-1: none) and ordinal mask, one entry per needle token."""
        ids, key_digit, ordinal = [], [], []
        for token in words(self.needle_text):
            if token == "{K}":
                ids += [0] * self.params.digits
                key_digit += list(range(self.params.digits))
                ordinal += [False] * self.params.digits
            else:
                ids.append(0 if token == "{J}" else self.token_id(token))
                key_digit.append(-1)
                ordinal.append(token == "{J}")
        return np.array(ids), np.array(key_digit), np.array(ordinal)

    @property
    def needle_tokens(self) -> int:
        return len(self._template()[0])

    def min_length(self) -> int:
        return 1 + self.needles * self.needle_tokens + len(words(self.query_text))

    def max_tokens(self, n: int) -> int:
        return n + self.needles * self.params.digits + 2

    def train_length_range(self, train_length: int) -> tuple[int, int]:
        low = max(self.min_length(), train_length // 2)
        if low > train_length:
            raise ValueError(
                f"task {self.name!r} needs a train length of at least {self.min_length()}, got {train_length}"
            )
        return low, train_length

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        k, batch_size = self.needles, rng.batch_size
        bos, sep, eos, zero = self.ids("<bos>", "<sep>", "<eos>", "0")
        template, key_digit, is_ordinal = self._template()
        needle_len, query = len(template), self.ids(*words(self.query_text))
        filler = np.array(self.ids(*words(FILLER)))
        filler_len = n - 1 - k * needle_len - len(query)

        keys = rng.integers(0, k, 1, p.key_max + 1)  # [B, k]
        powers = 10 ** np.arange(p.digits - 1, -1, -1)
        key_digits = (keys[:, :, None] // powers) % 10 + zero  # [B, k, digits]
        needles = np.broadcast_to(template, (batch_size, k, needle_len)).copy()
        has_digit = key_digit >= 0
        needles[:, :, has_digit] = key_digits[:, :, key_digit[has_digit]]
        needles[:, :, is_ordinal] = (zero + 1 + np.arange(k))[None, :, None]

        # Depths (filler tokens before each needle): needle j in the middle of stratum j.
        stratum = filler_len / k
        centre = (np.arange(k) + 0.5) * stratum
        low = np.clip(np.floor(centre - self.depth_jitter * stratum / 2 + 0.5), 0, filler_len).astype(np.int64)
        high = np.clip(np.floor(centre + self.depth_jitter * stratum / 2 + 0.5), 0, filler_len).astype(np.int64)
        depth = low + np.floor(rng.uniform(1, k) * (high - low + 1)).astype(np.int64)
        starts = depth + needle_len * np.arange(k)  # [B, k] in haystack coordinates

        # Haystack position p shows filler token (offset + p - needle tokens before p) of the endless
        # filler, read from a tiled buffer; the needles are written over their spans afterwards.
        haystack_len = filler_len + k * needle_len
        position = np.arange(haystack_len)
        margin = len(filler) * -(-(k * needle_len) // len(filler))  # keeps buffer indices >= 0
        offset = rng.integers(2, 1, 0, len(filler)) + margin
        index = offset + position  # [B, haystack_len]
        for j in range(k):
            index -= needle_len * (position >= starts[:, j : j + 1])
        buffer = np.tile(filler, -(-(haystack_len + margin) // len(filler)) + 1)

        answer = key_digits.reshape(batch_size, -1)
        scored = answer.shape[1] + 1
        input_ids = np.empty((batch_size, n + scored + 1), dtype=np.int64)
        input_ids[:, 0] = bos
        input_ids[:, 1 : 1 + haystack_len] = buffer[index]
        spans = 1 + starts[:, :, None] + np.arange(needle_len)  # [B, k, needle_len] in input_ids
        input_ids[np.arange(batch_size)[:, None, None], spans] = needles
        input_ids[:, 1 + haystack_len : n] = query
        input_ids[:, n], input_ids[:, n + 1 : -1], input_ids[:, -1] = sep, answer, eos
        labels = next_token_labels(input_ids, n, n + scored)
        groups = np.full_like(input_ids, -1)
        groups[:, n : n + scored] = np.minimum(np.arange(scored) // p.digits, k - 1)
        return full_batch(input_ids, labels, n, groups=groups)


@register_task("passkey")
class Passkey(_Passkey):
    """Passkey retrieval: a 5-digit key hidden at a random depth in repeated filler text."""


@register_task("passkey-multi")
class PasskeyMulti(_Passkey):
    """Multi-needle passkey: k numbered keys at widely separated depths, all asked for in order."""

    default_train_length = 128
    needle_text, query_text = NEEDLE_MULTI, QUERY_MULTI

    @dataclass(frozen=True)
    class Params:
        needles: int = 2  # k, at most 9 (the ordinal is one digit token)
        key_max: int = 50_000
        digits: int = 5
        depth_jitter: float = 0.5  # share of its stratum over which a needle's depth is uniform

    @property
    def needles(self) -> int:
        return self.params.needles

    @property
    def depth_jitter(self) -> float:
        return self.params.depth_jitter

    def build_vocab(self) -> list[str]:
        if not 1 <= self.params.needles <= 9:
            raise ValueError(f"needles must be in 1..9, got {self.params.needles}")
        if not 0.0 <= self.params.depth_jitter <= 1.0:
            raise ValueError(f"depth_jitter must be in [0, 1], got {self.params.depth_jitter}")
        return super().build_vocab()
