"""Local Count: label every token with its 0-based index within its run (seed 003, Appendix G, H.2).

Worked example (``n = 10``, data symbols "0".."15", count labels "#0".."#47"; ``max_run = 4`` to
keep it short, the default is 48)::

    input_ids  <bos> 0  0  0  11 11 14 14 14 14 1  <eos>
    labels     -     #0 #1 #2 #0 #1 #0 #1 #2 #3 #0 -

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
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task, full_batch, uniform_integers
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

    def runs_per_block(self, n: int) -> int:
        """Runs drawn per round: about 1.25x the expected need, so one round almost always suffices."""
        return int(1.25 * n / ((self.params.min_run + self.params.max_run) / 2)) + 8

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        bos, eos = self.ids("<bos>", "<eos>")
        first_symbol, first_count = len(SPECIALS), len(SPECIALS) + p.symbols
        batch_size, rows = rng.batch_size, np.arange(rng.batch_size)[:, None]

        # Run lengths in blocks of about 1.25x the expected need, drawn until every sample's runs
        # cover n; block k always uses the same draw ids, so a sample does not depend on its batch.
        block = self.runs_per_block(n)
        lengths, steps = [], []
        while not lengths or (np.sum(lengths, axis=(0, 2)) < n).any():
            k = len(lengths)
            lengths.append(uniform_integers(rng, 10 + 2 * k, block, p.min_run, p.max_run + 1))
            steps.append(uniform_integers(rng, 11 + 2 * k, block, 1, p.symbols))  # symbol change per run
        lengths, steps = np.concatenate(lengths, axis=1), np.concatenate(steps, axis=1)
        steps[:, 0] = rng.integers(2, 1, 0, p.symbols)[:, 0]  # the first run's symbol
        run_symbol = np.cumsum(steps, axis=1) % p.symbols
        change = np.diff(run_symbol, axis=1, prepend=0)  # symbol difference to the previous run
        starts = np.cumsum(lengths, axis=1) - lengths
        inside = starts < n
        run_rows = np.broadcast_to(rows, starts.shape)[inside]

        input_ids = np.empty((batch_size, n + 2), dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        input_ids[:, 0], input_ids[:, -1] = bos, eos
        source, counts = input_ids[:, 1:-1], labels[:, 1:-1]
        # Symbols: a running sum of the per-run differences, placed at the run starts.
        source[:] = 0
        source[run_rows, starts[inside]] = change[inside]
        source[:, 0] += first_symbol
        np.cumsum(source, axis=1, out=source)
        # Index within the run: position minus the start of the current run.
        counts[:] = 0
        counts[run_rows, starts[inside]] = starts[inside]
        np.maximum.accumulate(counts, axis=1, out=counts)
        np.subtract(np.arange(n), counts, out=counts)
        counts += first_count
        return full_batch(input_ids, labels, n)
