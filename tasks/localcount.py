"""Local Count: label every token with its 0-based index within its run (Long-Context Generalization with Sparse
Attention, Appendix G and H.2; its authors' generator, deep-spin/asentmax ``scripts/generate_data.py``, decides
what the text leaves open).

Worked example (sample 2 of the test stream, seed 0, ``n = 10``: ``10 // 3 = 3`` whole runs; data symbols
"0".."15", count labels "#0".."#47"; ``max_run = 4`` to keep it short, the default is 48)::

    input_ids  <bos> 9  9  9  9  15 15 15 4  4  4  4  <eos>
    labels     -     #0 #1 #2 #3 #0 #1 #2 #0 #1 #2 #3 -

As the authors' generator: ``int(n // ((min_run + max_run) / 2))`` whole runs (their ``seq_len // ((max_reps +
2) / 2)``), run lengths uniform in ``[min_run, max_run]`` = ``[2, 48]``, none cut, so the realised length varies
around ``n`` (at ``n = 128``: 5 runs, 10 to 240 source tokens, mean 125; ``max_tokens`` is ``runs * max_run +
2``). Each run's symbol differs from its neighbour's. Token classification (labels not shifted): the label at
each source position is ``#k``, ``k`` the index of the token within its run. A sample has its source tokens plus
``<bos>`` and ``<eos>`` (their ``{bos} text {eos}`` pattern, no loss at either). Metric: per-token accuracy (as
the paper reports).

``runs="cut"`` (the earlier default) appends runs until ``n`` tokens and cuts the last run at ``n`` (so a sample
has exactly ``n + 2`` tokens and may end on a run of one): the earlier layout (rows of the store's schema
version 1 were drawn with it).

Training lengths: the authors train at ``n`` in [64, 128], so ``default_train_length`` is 128 and the shared rule
``n_train / 2 .. n_train`` gives 64..128; multipliers apply to 128 (1x = 128). The paper's text says run lengths
U(1, 48); the authors' code draws from [2, 48] (``randint(2, max_reps + 1)``), as TASKS.md (``min_run`` is a
parameter).

Choices the code leaves open (ours): neighbouring symbols differ by a uniform step over the other ``symbols - 1``
(the first symbol uniform); the authors re-draw equal neighbours until none are left, which gives nearly the
same distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lengthbench.tasks import register_task
from lengthbench.tasks.base import IGNORE_INDEX, Batch, ModelDefaults, Task, full_batch, uniform_integers
from lengthbench.tasks.rng import SampleRandom

SPECIALS = ["<pad>", "<bos>", "<eos>"]
RUNS = ("whole", "cut")


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
        runs: str = "whole"  # "whole": n // mean run whole runs (the authors'); "cut": runs until n, the last cut there

    def build_vocab(self) -> list[str]:
        p = self.params
        if p.symbols < 2:
            raise ValueError("symbols must be at least 2 (neighbouring runs differ)")
        if not 1 <= p.min_run <= p.max_run:
            raise ValueError(f"need 1 <= min_run <= max_run, got {p.min_run}, {p.max_run}")
        if p.runs not in RUNS:
            raise ValueError(f"runs must be one of {', '.join(RUNS)}, got {p.runs!r}")
        return SPECIALS + [str(i) for i in range(p.symbols)] + [f"#{k}" for k in range(p.max_run)]

    def num_runs(self, n: int) -> int:
        """Whole runs of a sample: the authors' ``int(seq_len // ((max_reps + 2) / 2))``, at least one."""
        return max(1, int(n // ((self.params.min_run + self.params.max_run) / 2)))

    def max_tokens(self, n: int) -> int:
        if self.params.runs == "whole":
            return self.num_runs(n) * self.params.max_run + 2
        return n + 2

    def runs_per_block(self, n: int) -> int:
        """Runs drawn per round: about 1.25x the expected need, so one round almost always suffices."""
        return int(1.25 * n / ((self.params.min_run + self.params.max_run) / 2)) + 8

    def generate(self, rng: SampleRandom, n: int) -> Batch:
        if self.params.runs == "whole":
            return self.generate_whole(rng, n)
        return self.generate_cut(rng, n)

    def generate_whole(self, rng: SampleRandom, n: int) -> Batch:
        p = self.params
        bos, eos = self.ids("<bos>", "<eos>")
        first_symbol, first_count = len(SPECIALS), len(SPECIALS) + p.symbols
        batch_size, runs = rng.batch_size, self.num_runs(n)
        lengths = uniform_integers(rng, 20, runs, p.min_run, p.max_run + 1)
        steps = uniform_integers(rng, 21, runs, 1, p.symbols)  # symbol change per run
        steps[:, 0] = rng.integers(22, 1, 0, p.symbols)[:, 0]  # the first run's symbol
        run_symbol = np.cumsum(steps, axis=1) % p.symbols
        ends = np.cumsum(lengths, axis=1)
        starts = ends - lengths
        realised = ends[:, -1]
        width = int(realised.max())

        # Per position: its run (how many run ends lie at or before it), then symbol and index within the run.
        positions = np.arange(width)
        run_of = np.stack([np.searchsorted(ends[b], positions, side="right") for b in range(batch_size)])
        inside = run_of < runs
        run_of = np.minimum(run_of, runs - 1)
        source = np.take_along_axis(run_symbol, run_of, axis=1) + first_symbol
        counts = positions - np.take_along_axis(starts, run_of, axis=1) + first_count

        input_ids = np.zeros((batch_size, width + 2), dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        input_ids[:, 0] = bos
        input_ids[:, 1:-1] = np.where(inside, source, 0)
        labels[:, 1:-1] = np.where(inside, counts, IGNORE_INDEX)
        input_ids[np.arange(batch_size), realised + 1] = eos
        return Batch(input_ids, labels, n, (realised + 2).astype(np.int64))

    def generate_cut(self, rng: SampleRandom, n: int) -> Batch:
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
