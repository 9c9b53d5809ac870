"""Scoring a model on a task at one nominal length: exact match, token accuracy, per-group scores and corpus
BLEU, resumable within a length."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lengthbench.devices import autocast, to_device
from lengthbench.models.decoder import Decoder
from lengthbench.store import atomic_write_text, read_json_file
from lengthbench.tasks import IGNORE_INDEX


@dataclass
class Scores:
    exact_match: float
    token_accuracy: float
    n_samples: int
    realised_tokens: float
    per_group: dict = field(default_factory=dict)
    bleu: float = float("nan")  # corpus BLEU-4 of the answer tokens, where asked for (``Evaluator.score(bleu=True)``)
    # seconds an earlier, interrupted process spent on these samples (``Evaluator.score(partial=...)``)
    earlier_seconds: float = 0.0

    def metric(self, name: str) -> float:
        return getattr(self, name)


class BleuTally:
    """Corpus BLEU-4 (Papineni et al., 2002) of predicted against reference token sequences: clipped n-gram
    matches and candidate n-gram counts summed over the corpus for n = 1..4, their geometric mean with uniform
    weights, times the brevity penalty exp(1 - r / c) where the candidates are shorter (c < r). No smoothing: a
    corpus without a matching 4-gram scores 0. Long-Context Generalization with Sparse Attention selects the
    checkpoints of models that do not reach 8x by this metric at 2x or 4x (its appendix)."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.matches = [0] * max_n
        self.totals = [0] * max_n
        self.candidate_length = self.reference_length = 0

    def add(self, candidate, reference) -> None:
        candidate, reference = [int(t) for t in candidate], [int(t) for t in reference]
        self.candidate_length += len(candidate)
        self.reference_length += len(reference)
        for n in range(1, self.max_n + 1):
            counts: dict[tuple, int] = {}
            for i in range(len(reference) - n + 1):
                gram = tuple(reference[i:i + n])
                counts[gram] = counts.get(gram, 0) + 1
            total = max(0, len(candidate) - n + 1)
            self.totals[n - 1] += total
            for i in range(total):
                gram = tuple(candidate[i:i + n])
                if counts.get(gram, 0) > 0:
                    counts[gram] -= 1
                    self.matches[n - 1] += 1

    def score(self) -> float:
        if min(self.totals) == 0 or min(self.matches) == 0:
            return 0.0
        log_precision = sum(math.log(m / t) for m, t in zip(self.matches, self.totals, strict=True)) / self.max_n
        c, r = self.candidate_length, self.reference_length
        brevity = 1.0 if c >= r else math.exp(1 - r / c)
        return brevity * math.exp(log_precision)


def sample_record(task, batch, predictions: np.ndarray, row: int, index: int, n: int) -> str:
    """One scored sample as a JSON line: its ``index`` in the split's stream (``lengthbench tasks sample TASK
    --length N --start INDEX --decode`` prints its input), ``n``, whether it is ``correct`` (every scored
    position), and the ``target`` and ``prediction`` at its scored positions as ids and as the task's symbols."""
    scored = batch.labels[row] != IGNORE_INDEX
    target, predicted = batch.labels[row][scored], predictions[row][scored]
    return json.dumps(dict(index=index, n=n, correct=bool((target == predicted).all()),
                           hits=int((target == predicted).sum()), scored=int(scored.sum()),
                           target=" ".join(task.symbols(target)), prediction=" ".join(task.symbols(predicted)),
                           target_ids=target.tolist(), prediction_ids=predicted.tolist()), separators=(",", ":"))


def _open_sample_log(path: Path, start: int):
    """``path`` opened to append the lines of samples ``start`` on: a length resumed at sample ``start`` keeps
    the lines before it (and drops any written after its tallies were last saved); a fresh one starts empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if start and path.exists():
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["index"] < start]
    atomic_write_text(path, "".join(line + "\n" for line in kept))
    return path.open("a")


class Evaluator:
    """Scores a model on ``count`` samples of a split at nominal length ``n``.

    One teacher-forced forward pass per batch. Batch size and the reference path's query chunk adapt
    to the sequence length and to free memory; an out-of-memory batch is retried at half the size.
    """

    def __init__(self, model: Decoder, task, device: torch.device, seed: int, tokens_per_batch: int = 0):
        self.model = model
        self.task = task
        self.device = device
        self.seed = seed
        self.tokens_per_batch = tokens_per_batch or self._default_tokens_per_batch()

    def _default_tokens_per_batch(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            config = self.model.config
            # activations kept per token in a no-grad pass: a few d_model and ffn vectors + the logits
            per_token = 4 * (8 * config.d_model + 2 * config.ffn + 2 * config.vocab_size)
            return int(max(4096, min(4 * 2**20, 0.25 * free / per_token)))
        return 2**15

    def _query_chunk(self, batch_size: int, tokens: int) -> int:
        """Rows per reference-path block so that scores take ~256 MB (CPU) or ~2 GB (GPU)."""
        budget = (2 * 2**30) if self.device.type == "cuda" else 256 * 2**20
        per_row = batch_size * self.model.config.n_heads * tokens * 4 * 3
        return int(max(16, min(tokens, budget // max(1, per_row))))

    @torch.no_grad()
    def score(self, n: int, count: int, split: str = "test", bleu: bool = False, partial: Path | None = None,
              save_every: float = 30.0, on_batch: Callable[[int, int], None] | None = None,
              sample_log: Path | None = None) -> Scores:
        """``bleu``: also the corpus BLEU-4 of each sample's predicted answer tokens (the argmax at its scored
        positions) against its labels, for checkpoint selection by ``selection_metric = "bleu"``.

        ``partial``: a file that keeps the tallies of the samples scored so far (written atomically after a batch,
        at most every ``save_every`` seconds), so that a process interrupted within one length resumes at the next
        unscored sample instead of the length's first: 1,000 samples at 65,536 tokens can take longer than a
        machine is held. A file written for another length, count, split or seed is ignored. Samples are drawn by
        index, so the resumed tallies equal an uninterrupted pass's whatever the batch sizes. The caller removes
        the file once the length's row is stored. Not with ``bleu`` (its tally is validation's, never resumed).

        ``on_batch(scored, count)``: called after each batch with the number of samples scored so far (a progress
        bar's; a resumed length starts at its saved count)."""
        if bleu and partial is not None:
            raise ValueError("a BLEU score is not resumable: score it without `partial`")
        self.model.eval()
        bleu_tally = BleuTally() if bleu else None
        width = self.task.max_tokens(n)
        batch_size = int(max(1, min(count, self.tokens_per_batch // width)))
        key = dict(n=n, count=count, split=split, seed=self.seed)
        state = dict(start=0, correct_samples=0, correct_tokens=0, scored_tokens=0, realised=0, group_hits={},
                     seconds=0.0)
        if partial is not None and partial.exists():
            saved = read_json_file(partial, "delete it to score that length from its first sample",
                                   lambda data: isinstance(data, dict) and isinstance(data.get("state"), dict))
            if saved.get("key") == key:
                state.update(saved["state"])
                state["group_hits"] = {int(g): hits for g, hits in state["group_hits"].items()}
        earlier_seconds = state["seconds"]
        log = _open_sample_log(sample_log, state["start"]) if sample_log is not None else None
        started = last_save = time.perf_counter()
        while state["start"] < count:
            start = state["start"]
            size = min(batch_size, count - start)
            batch = self.task.batch(np.arange(start, start + size), n, split, self.seed)
            try:
                predictions = self._predict(batch)
            except torch.OutOfMemoryError:
                if batch_size == 1:
                    raise
                torch.cuda.empty_cache()
                batch_size = max(1, batch_size // 2)
                continue
            labels = batch.labels
            scored = labels != IGNORE_INDEX
            hits = (predictions == labels) & scored
            state["correct_tokens"] += int(hits.sum())
            state["scored_tokens"] += int(scored.sum())
            state["correct_samples"] += int((hits.sum(1) == scored.sum(1)).sum())
            if bleu_tally is not None:
                for row in range(size):
                    bleu_tally.add(predictions[row][scored[row]], labels[row][scored[row]])
            if log is not None:
                log.writelines(sample_record(self.task, batch, predictions, row, start + row, n) + "\n"
                               for row in range(size))
            state["realised"] += int(batch.realised_tokens.sum())
            if batch.groups is not None:
                for group in np.unique(batch.groups[scored]):
                    in_group = (batch.groups == group) & scored
                    ok = (hits | ~in_group).all(axis=1)
                    group_tally = state["group_hits"].setdefault(int(group), [0, 0])
                    group_tally[0] += int(ok.sum())
                    group_tally[1] += size
            state["start"] = start + size
            if on_batch is not None:
                on_batch(state["start"], count)
            now = time.perf_counter()
            if partial is not None and state["start"] < count and now - last_save >= save_every:
                if log is not None:
                    log.flush()  # the log holds every sample the saved tallies count
                state["seconds"] = earlier_seconds + now - started
                atomic_write_text(partial, json.dumps(dict(key=key, state=state)))
                last_save = now
        if log is not None:
            log.close()
        self.model.set_query_chunk(None)
        return Scores(
            exact_match=state["correct_samples"] / count,
            token_accuracy=state["correct_tokens"] / max(1, state["scored_tokens"]),
            n_samples=count,
            realised_tokens=state["realised"] / count,
            per_group={g: hit / total for g, (hit, total) in sorted(state["group_hits"].items())},
            bleu=bleu_tally.score() if bleu_tally is not None else float("nan"),
            earlier_seconds=earlier_seconds,
        )

    def _predict(self, batch) -> np.ndarray:
        tokens = batch.input_ids.shape[1]
        self.model.set_query_chunk(self._query_chunk(len(batch), tokens))
        input_ids = to_device(batch.input_ids, self.device)
        features = to_device(batch.features, self.device, torch.float32)
        with autocast(self.device):
            logits = self.model(input_ids, features)
        return logits.argmax(-1).cpu().numpy()
