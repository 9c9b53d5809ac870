"""Local Count: label every token with its 0-based index within its run (seed 003, Appendix G, H.2).

Worked example (``n = 8``, data symbols "0".."15", count labels "#0".."#47")::

    input_ids  <bos> 3  3  3  3  11 11 11 3  <eos>
    labels     -     #0 #1 #2 #3 #0 #1 #2 #0 -

The source is runs of one symbol; each run's symbol differs from its neighbour's (uniform over the
other ``symbols - 1``; the first uniform over all), so a symbol can come back in a later run; run
lengths are uniform in ``[min_run, max_run]`` = ``[2, 48]``; runs are appended until ``n`` tokens and
the last run is cut at ``n``. Token classification (labels not shifted): the label at each source
position is ``#k``, ``k`` the index of the token within its run. ``n`` counts source tokens; a sample
has ``n + 2`` tokens. Metric: per-token accuracy (as the seed reports).

Training lengths: the seed trains at ``n`` in [64, 128], so ``default_train_length`` is 128 and the
shared rule ``n_train / 2 .. n_train`` gives 64..128; multipliers apply to 128 (1x = 128).
The seed's text says run lengths U(1, 48); TASKS.md says [2, 48] and we follow TASKS.md
(``min_run`` is a parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task, full_batch
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<eos>"]


@register_task("localcount")
class LocalCount(Task):
    """Local Count: label each token with its index within its run of equal symbols."""

    metric = "token_accuracy"
    default_train_length = 128
    model_defaults = ModelDefaults(layers=3, d_model=128, heads=8, ffn=512, train_samples=10_000_000)

    @dataclass(frozen=True)
    class Params:
        symbols: int = 16  # data symbols "0".."symbols-1"
        min_run: int = 2
        max_run: int = 48

    def build_vocab(self) -> list[str]:
        p = self.params
        if p.symbols < 2:
            raise ValueError("symbols must be at least 2 (neighbouring runs differ)")
        if not 1 <= p.min_run <= p.max_run:
            raise ValueError(f"need 1 <= min_run <= max_run, got {p.min_run}, {p.max_run}")
        return SPECIALS + [str(i) for i in range(p.symbols)] + [f"#{k}" for k in range(p.max_run)]

    def max_tokens(self, n: int) -> int:
        return n + 2

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        bos, eos = self.ids("<bos>", "<eos>")
        first_symbol, first_count = len(SPECIALS), len(SPECIALS) + p.symbols
        batch_size = rng.batch_size
        runs = -(-n // p.min_run)  # enough runs to cover n even if every run is as short as possible

        lengths = rng.integers(0, runs, p.min_run, p.max_run + 1)
        starts = np.cumsum(lengths, axis=1) - lengths  # [B, runs]
        steps = rng.integers(1, runs, 1, p.symbols)  # run r's symbol = run r-1's + step (mod symbols)
        steps[:, 0] = rng.integers(2, 1, 0, p.symbols)[:, 0]
        run_symbol = np.cumsum(steps, axis=1) % p.symbols

        # Run id of each position: count the run starts at or before it.
        starts_here = np.zeros((batch_size, n + 1), dtype=np.int64)
        rows = np.broadcast_to(np.arange(batch_size)[:, None], starts.shape)
        inside = starts < n
        starts_here[rows[inside], starts[inside]] = 1  # starts are distinct within a row
        run_id = np.cumsum(starts_here[:, :n], axis=1) - 1
        index_in_run = np.arange(n) - np.take_along_axis(starts, run_id, axis=1)
        source = np.take_along_axis(run_symbol, run_id, axis=1) + first_symbol

        input_ids = np.empty((batch_size, n + 2), dtype=np.int64)
        input_ids[:, 0], input_ids[:, 1:-1], input_ids[:, -1] = bos, source, eos
        labels = np.full_like(input_ids, IGNORE_INDEX)
        labels[:, 1:-1] = index_in_run + first_count
        return full_batch(input_ids, labels, n)
