"""Train one cell (task x attention x encoding x seed) at ``n_train`` and score it at every multiplier.

The run is resumable at any point: training state is checkpointed every ``checkpoint_every`` steps and
the rows of finished evaluation lengths are kept beside it; the store gets the run's rows in one atomic
write at the end. Data are a pure function of ``(config, step)`` (see :mod:`lengthbench.data`), so a
resumed run sees the batches an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from lengthbench import __version__
from lengthbench.config import RunConfig, selection_multiplier, selection_words
from lengthbench.data import BatchProducer, TrainStream, default_workers
from lengthbench.errors import TrainingDiverged, UsageError
from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.store import atomic_write, atomic_write_text, load_results, run_finished, run_path, write_run
from lengthbench.tasks import IGNORE_INDEX, eval_lengths, eval_multipliers, get_task

# --------------------------------------------------------------------------------------------------
# Devices and small helpers


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"unknown device {device!r}; choose from: auto, cpu, cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but no CUDA GPU is available here")
    return torch.device(device)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def git_sha() -> str:
    if os.environ.get("LENGTHBENCH_GIT_SHA"):
        return os.environ["LENGTHBENCH_GIT_SHA"]
    try:
        top = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=top, capture_output=True, text=True,
                              timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def learning_rate(config: RunConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    total = config.train_steps
    warmup = min(config.warmup_steps, total)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def atomic_torch_save(obj, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def build_model(config: RunConfig, task) -> Decoder:
    return Decoder(ModelConfig(
        vocab_size=task.vocab_size, d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
        ffn=config.ffn, attn=config.attn, pe=config.pe, attn_params=dict(config.attn_params),
        pe_params=dict(config.pe_params), has_features=task.has_features, init=config.init, arch=config.arch,
    ))


# A folder of portable compilation caches (torch.compiler.save_cache_artifacts): a compiled run on a fresh machine
# loads its model's file and skips Inductor's code generation and Triton's kernel builds (on the H100 the dense
# references took 148 s to compile, session 17), and writes the file where it was missing.
COMPILE_CACHE_ENV = "LENGTHBENCH_COMPILE_CACHE"
# what the compiled graphs depend on (a seed, learning rate or sample count does not change them)
_GRAPH_FIELDS = ("task", "task_params", "attn", "attn_params", "pe", "pe_params", "train_length", "d_model",
                 "n_layers", "n_heads", "ffn", "batch_size", "compile_mode", "arch")


@functools.lru_cache(maxsize=1)
def model_source_digest() -> str:
    """A digest of the code the compiled step traces (the models' modules and this one): a cache file written by
    other code is another file, not a stale one that shadows the new graphs (session 19 changed the adaptive
    scale's formula under an unchanged configuration)."""
    import lengthbench.models as models

    files = sorted(Path(models.__file__).parent.rglob("*.py")) + [Path(__file__)]
    digest = hashlib.sha1()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def compile_cache_file(config: RunConfig, device: torch.device) -> Path | None:
    """The compilation cache file of ``config``'s training step on ``device`` in the folder that
    ``$LENGTHBENCH_COMPILE_CACHE`` names, or None where it names none."""
    root = os.environ.get(COMPILE_CACHE_ENV, "")
    if not root:
        return None
    key = [torch.__version__, device_description(device), model_source_digest(),
           *(getattr(config, name) for name in _GRAPH_FIELDS)]
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return Path(root) / f"{config.task}-{config.attn}-{config.pe}-b{config.batch_size}-{digest}.bin"


def load_compile_cache(path: Path | None) -> str:
    """Load a file of :func:`compile_cache_file` into this process's compilation caches; what happened, in words.
    A missing, stale or broken file costs only the compilation: it never stops a run."""
    if path is None or not path.exists():
        return ""
    try:  # torch warns and returns None where it cannot read the file (another version's format, corrupted)
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as error:  # noqa: BLE001 - whatever the reason, compile as without it
        info, why = None, f" ({type(error).__name__}: {error})"
    else:
        why = ""
    if info is None:
        return f"compile cache {path} not loaded{why}; compiling without it"
    return f"compile cache loaded from {path}"


def save_compile_cache(path: Path | None) -> str:
    """Write what this process compiled to ``path`` where it is missing; what happened, in words."""
    if path is None or path.exists():
        return ""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(saved[0]))
    return f"compile cache written to {path} ({len(saved[0]) / 2**20:.1f} MiB)"


def checkpoint_dir(results: str | Path, run_id: str) -> Path:
    return Path(results) / "checkpoints" / run_id


def run_status(results: str | Path, config: RunConfig) -> str:
    """Where run ``config`` stands in ``results``, in words (``lengthbench sweep --dry-run``): "in the store",
    "to run", or what an interrupted run resumes from: its training checkpoint, its trained model, the lengths
    already scored and the samples of the length it was scoring."""
    if run_finished(results, config.run_id):
        return "in the store"
    folder = checkpoint_dir(results, config.run_id)
    rows_path, samples_path = folder / "eval_rows.json", folder / "eval_samples_partial.json"
    if rows_path.exists() or samples_path.exists():
        try:
            scored = json.loads(rows_path.read_text()) if rows_path.exists() else []
            task = get_task(config.task, **config.task_params)
            total = len(eval_lengths(config.train_length, config.max_multiplier, task.extra_multipliers))
            words = f"to resume: trained, {len(scored)} of {total} lengths scored"
            if samples_path.exists():
                saved = json.loads(samples_path.read_text())
                multiplier = saved["key"]["n"] / config.train_length  # e.g. Reverse's 1.5x
                words += f", {multiplier:g}x at {saved['state']['start']:,} of {saved['key']['count']:,} samples"
            return words
        except (ValueError, KeyError, OSError):
            return "to resume: trained (its scoring files are unreadable)"
    if (folder / "model.pt").exists():
        return "to resume: trained"
    if (folder / "train.pt").exists():
        return "to resume from its training checkpoint"
    return "to run"


# --------------------------------------------------------------------------------------------------
# Evaluation


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
    corpus without a matching 4-gram scores 0. Seed 003 selects the checkpoints of models that do not reach 8x
    by this metric at 2x or 4x (its appendix)."""

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


def _to_device(array: np.ndarray | None, device: torch.device, dtype=None):
    """Host array -> device tensor. On CUDA through pinned memory, so the copy is asynchronous and the
    host can queue the next step while the GPU works (a pageable copy waits for the GPU to drain)."""
    if array is None:
        return None
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None:
        tensor = tensor.to(dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


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
              save_every: float = 30.0, on_batch: Callable[[int, int], None] | None = None) -> Scores:
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
            saved = json.loads(partial.read_text())
            if saved.get("key") == key:
                state.update(saved["state"])
                state["group_hits"] = {int(g): hits for g, hits in state["group_hits"].items()}
        earlier_seconds = state["seconds"]
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
                state["seconds"] = earlier_seconds + now - started
                atomic_write_text(partial, json.dumps(dict(key=key, state=state)))
                last_save = now
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
        input_ids = _to_device(batch.input_ids, self.device)
        features = _to_device(batch.features, self.device, torch.float32)
        with autocast(self.device):
            logits = self.model(input_ids, features)
        return logits.argmax(-1).cpu().numpy()


# --------------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainState:
    step: int = 0
    train_seconds: float = 0.0
    best_score: float = -1.0
    best_step: int = -1
    history: list = field(default_factory=list)  # (step, loss, val_score)


def model_dispatches_to_kernels(model) -> bool:
    """Whether any attention layer of ``model`` may call a fused (Triton) op on this machine."""
    return any(block.attn.dispatches_to_kernel() for block in model.blocks)


# Training batches at most this many tokens wide run the dense reference attention instead of the fused ops
# (scores ``[batch, heads, T, T]`` in float32: 0.5 GB a layer at batch 128, 16 heads, 256 tokens).
DENSE_TRAIN_MAX_TOKENS = 256


def trains_dense(config: RunConfig, model, device: torch.device, max_tokens: int) -> bool:
    """Whether the training step runs the attention's dense references, compiled, instead of its fused ops: on
    CUDA where the config compiles and asks for it (``train_attention = "reference"``; the default is the fused
    ops), for models with fused ops, when a training batch is at most :data:`DENSE_TRAIN_MAX_TOKENS` tokens wide
    (``max_tokens``). At the seeds' training lengths (64: 66-131 tokens) a fused op gains nothing, and a model
    that calls one cannot be compiled (see ``Trainer.__init__``): it trains eagerly, one launch per operation.
    The references are the same functions, tested against the kernels; validation and scoring still call the
    fused ops."""
    return (device.type == "cuda" and config.compile and config.train_attention == "reference"
            and model_dispatches_to_kernels(model) and max_tokens <= DENSE_TRAIN_MAX_TOKENS)


def compiles(config: RunConfig, model, device: torch.device, max_tokens: int) -> bool:
    """Whether the training step is compiled: on CUDA where the config asks, for models that call no fused op
    in training (none at all, or the dense references instead: :func:`trains_dense`)."""
    return device.type == "cuda" and config.compile and (
        not model_dispatches_to_kernels(model) or trains_dense(config, model, device, max_tokens))


@contextlib.contextmanager
def attention_kernels(model, enabled: bool | list[bool]) -> Iterator[None]:
    """Set each attention layer's ``use_kernels`` (one flag for all, or one per layer) inside the block and
    restore the previous flags after it."""
    layers = [block.attn for block in model.blocks]
    before = [layer.use_kernels for layer in layers]
    flags = enabled if isinstance(enabled, list) else [enabled] * len(layers)
    for layer, flag in zip(layers, flags, strict=True):
        layer.use_kernels = flag
    try:
        yield
    finally:
        for layer, flag in zip(layers, before, strict=True):
            layer.use_kernels = flag


class Trainer:
    # Training batches on a compiled CUDA model are padded up to multiples of ``pad_multiple`` tokens (a few
    # bucket shapes instead of one worst-case width: MQMTAR's mean padded width falls from 91 to 78; the
    # multiple doubles until there are at most ``max_widths``), one static graph per width. Models with fused
    # ops are not compiled (see ``__init__``) and train on the batches as they come.
    pad_multiple: int = 8
    max_widths: int = 6
    compile_dynamic: bool | None = False

    def __init__(self, config: RunConfig, task, device: torch.device, results: Path, progress: bool = True,
                 log: Callable[[str], None] | None = None):
        self.config = config
        self.task = task
        self.device = device
        self.progress = progress
        self.log = log or (lambda line: None)  # plain lines at each validation (logs of sweep workers)
        self.dir = checkpoint_dir(results, config.run_id)
        torch.manual_seed(config.seed)
        self.model = build_model(config, task).to(device)
        # A run whose training finished here or elsewhere (its own model.pt, e.g. carried to another machine to be
        # scored) needs no warm start: ``load`` takes its selected weights. Its source's model may be absent then.
        self.warm_started = False
        if config.init_from and not (self._finished_model() is not None
                                     and not (checkpoint_dir(results, config.init_from) / "model.pt").exists()):
            self.model.load_state_dict(warm_start(results, config.init_from, self.model, device, config.init_part))
            self.warm_started = True
        # torch.compile of a model whose attention calls a fused Triton op (a graph break around an autograd
        # Function) crashed in torch 2.11's AOTAutograd runtime on the H200s, 2026-11-22: a corrupted view
        # shape regenerating an output alias (stick-breaking), a segmentation fault saving the autograd cache
        # (ASEntmax + NAPE), both within the first minute. Those models train eagerly on the Triton ops, or, with
        # ``train_attention = "reference"``, on their dense references, compiled, where the batches are narrow
        # (trains_dense).
        max_tokens = task.max_tokens(config.train_length)
        self.kernel_flags = [block.attn.use_kernels for block in self.model.blocks]
        self.dense = trains_dense(config, self.model, device, max_tokens)
        self.compiled = compiles(config, self.model, device, max_tokens)
        if self.dense:
            self.log(f"training on the dense reference attention, compiled ({max_tokens} tokens at most); "
                     "validation and scoring on the fused ops")
        elif device.type == "cuda" and config.compile and not self.compiled:
            why = (f"its training batches are wider than {DENSE_TRAIN_MAX_TOKENS} tokens"
                   if config.train_attention == "reference" else
                   "training attention is fused (--train-attention reference trains on its compiled references)")
            self.log(f"torch.compile skipped: the model calls fused Triton ops (graph breaks crash torch 2.11) "
                     f"and {why}")
        self.compile_cache = compile_cache_file(config, device) if self.compiled else None
        if message := load_compile_cache(self.compile_cache):
            self.log(message)
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                           fused=fused)
        self.state = TrainState()
        self.best_model_state = None
        self.step_fn = self._make_step_fn()

    # -- checkpoints -------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.dir / "train.pt"

    def save(self) -> None:
        atomic_torch_save({
            "config": self.config.identity(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "state": self.state.__dict__,
            "best_model": self.best_model_state,
        }, self.checkpoint_path)

    def load(self) -> bool:
        if not self.checkpoint_path.exists():
            return self.load_trained()
        saved = torch.load(self.checkpoint_path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state = TrainState(**saved["state"])
        self.best_model_state = saved["best_model"]
        return True

    def load_trained(self) -> bool:
        """Take the selected weights of a finished training from ``model.pt`` when ``train.pt`` is gone (it holds
        the optimizer's moments too, three times the size: a run scored elsewhere carries only ``model.pt``).
        The scoring then resumes as if from ``train.pt``; an unfinished or other run's ``model.pt`` is ignored."""
        saved = self._finished_model()
        if saved is None:
            return False
        self.model.load_state_dict(saved["model"])
        self.state = TrainState(**saved["state"])
        self.best_model_state = None  # model.pt holds the selected weights already
        return True

    def _finished_model(self) -> dict | None:
        """This run's ``model.pt`` where it holds a finished training of this configuration; else None."""
        path = self.dir / "model.pt"
        if not path.exists():
            return None
        saved = torch.load(path, map_location=self.device, weights_only=False)
        state = saved.get("state")
        if saved.get("config") != self.config.identity() or not state or state["step"] < self.config.train_steps:
            return None
        return saved

    # -- the step ----------------------------------------------------------------------------------
    def _make_step_fn(self):
        model = self.model
        device = self.device

        def forward_loss(input_ids, labels, features):
            with autocast(device):
                logits = model(input_ids, features)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
            scored = labels != IGNORE_INDEX
            correct = ((logits.argmax(-1) == labels) & scored).sum()
            return loss, correct, scored.sum()

        if self.compiled:
            # one graph per padded width (and the validation shapes never go through this function)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * self.max_widths)
            # "reduce-overhead" adds CUDA graphs (recorded once per padded width)
            forward_loss = torch.compile(forward_loss, dynamic=self.compile_dynamic, mode=self.compile_mode())

        def step(input_ids, labels, features):
            loss, correct, scored = forward_loss(input_ids, labels, features)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.grad_clip,
                                                  foreach=device.type == "cuda")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            # clone: CUDA-graph outputs are overwritten by the next replay
            return loss.detach().clone(), correct.clone(), scored.clone(), norm.detach()

        return step

    def compile_mode(self) -> str:
        """The configured torch.compile mode (only models without fused ops are compiled)."""
        return self.config.compile_mode

    def train_stream(self) -> TrainStream:
        """The training batches: padded to bucket widths where the step is compiled for CUDA (one static graph
        per width), else as they come."""
        config = self.config
        padded = self.compiled
        pad_to = self.task.max_tokens(config.train_length) if padded else None
        # the dense references compile slowly: Inductor took 75-100 s per width for the paper ASEntmax + NAPE
        # model on the H100 (session 17; softmax's graphs take seconds), so those batches all take the widest
        multiple = pad_to if padded and self.dense else self.pad_multiple
        stream = TrainStream(config.task, tuple(sorted(config.task_params.items())), config.seed,
                             config.batch_size, config.train_length, pad_to, multiple)
        while padded and len(stream.widths()) > self.max_widths:
            stream = dataclasses.replace(stream, pad_multiple=2 * stream.pad_multiple)
        return stream

    def _select(self, evaluator: Evaluator) -> float:
        config = self.config
        n = config.train_length * selection_multiplier(config.selection)
        metric = self.task.metric if config.selection_metric == "task" else config.selection_metric
        with attention_kernels(self.model, self.kernel_flags):  # the fused ops, as in scoring
            scores = evaluator.score(n, config.val_samples, split="val", bleu=metric == "bleu")
        value = scores.metric(metric)
        if value >= self.state.best_score:
            self.state.best_score = value
            self.state.best_step = self.state.step
            self.best_model_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.model.train()
        return value

    def train(self) -> None:
        config = self.config
        total = config.train_steps
        if self.state.step >= total:
            return
        stream = self.train_stream()
        producer = BatchProducer(stream, self.state.step, total, workers=default_workers(self.device.type))
        evaluator = Evaluator(self.model, self.task, self.device, seed=config.seed)
        self.model.train()
        val_score = float("nan")
        # the selection's value, named where it is not the default (in distribution, the task's metric)
        val_label = " ".join(("validation", selection_words(config.selection, config.selection_metric))).strip()
        window_start, window_samples = time.perf_counter(), 0
        loss_sum = torch.zeros((), device=self.device)
        correct_sum = torch.zeros((), device=self.device, dtype=torch.long)
        scored_sum = torch.zeros((), device=self.device, dtype=torch.long)
        report_every = 25
        # the first step whose loss / gradient norm was not finite (-1: none yet), kept on the device so that
        # the check costs no synchronisation per step; read where the loss is reported and before checkpoints
        guard = _FiniteGuard(self.state.step, self.device)
        dense = attention_kernels(self.model, False) if self.dense else contextlib.nullcontext()
        with _progress(self.progress) as progress, dense:
            task_id = progress.add_task(f"train {config.run_id}", total=total, completed=self.state.step,
                                        info="")
            started = time.perf_counter() - self.state.train_seconds
            process_started, steps_here = time.perf_counter(), 0
            try:
                for input_ids, labels, features in producer:
                    lr = learning_rate(config, self.state.step)
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    loss, correct, scored, grad_norm = self.step_fn(
                        _to_device(input_ids, self.device), _to_device(labels, self.device),
                        _to_device(features, self.device, torch.float32),
                    )
                    guard.update(loss, grad_norm)
                    steps_here += 1
                    if self.compiled and steps_here in (1, 100):  # compilation and CUDA graph capture take the
                        # first steps' time; say where a compiled run stands before its first validation
                        loss.item()
                        self.log(f"{config.run_id} step {self.state.step + 1}/{total}: {steps_here} step(s) in "
                                 f"{time.perf_counter() - process_started:.1f} s in this process (compilation "
                                 "included)")
                        if steps_here == 100 and (message := save_compile_cache(self.compile_cache)):
                            self.log(message)  # by now every bucket width has come (one for the references)
                    loss_sum += loss
                    correct_sum += correct
                    scored_sum += scored
                    self.state.step += 1
                    window_samples += config.batch_size
                    step = self.state.step
                    if step % config.eval_every == 0 or step == total:
                        val_score = self._select(evaluator)
                        self.log(f"{config.run_id} step {step}/{total}: loss {loss.item():.4f}, {val_label} "
                                 f"{val_score:.3f} (best {self.state.best_score:.3f} at {self.state.best_step}), "
                                 f"{step * config.batch_size / max(time.perf_counter() - started, 1e-9):,.0f} "
                                 "samples/s since start")
                    if step % report_every == 0 or step == total:
                        elapsed = time.perf_counter() - window_start
                        steps_in_window = (step - 1) % report_every + 1
                        mean_loss = loss_sum.item() / steps_in_window
                        guard.check(config.run_id, lr)
                        _check_finite(mean_loss, f"the mean loss of steps {step - steps_in_window + 1}-{step}",
                                      config.run_id, lr)
                        accuracy = correct_sum.item() / max(1, scored_sum.item())
                        self.state.history.append((step, mean_loss, val_score))
                        progress.update(task_id, completed=step, info=(
                            f"loss {mean_loss:.4f}  acc {accuracy:.3f}  val {val_score:.3f}  "
                            f"{window_samples / max(elapsed, 1e-9):,.0f} samples/s"))
                        loss_sum.zero_()
                        correct_sum.zero_()
                        scored_sum.zero_()
                        window_start, window_samples = time.perf_counter(), 0
                    if step % config.checkpoint_every == 0 and step < total:
                        bad_loss = guard.check(config.run_id, lr)  # never save broken weights
                        if bad_loss >= 0:
                            _check_finite(float("nan"), f"the loss of step {bad_loss}", config.run_id, lr)
                        self.state.train_seconds = time.perf_counter() - started
                        self.save()
            finally:
                producer.close()
            self.state.train_seconds = time.perf_counter() - started
        self.save()

    def use_best(self) -> None:
        if self.best_model_state is not None:
            self.model.load_state_dict(self.best_model_state)


def _check_finite(loss: float, what: str, run_id: str, lr: float) -> None:
    """Stop a run whose loss is NaN or infinite, before it checkpoints or scores the broken weights."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"{run_id}: training diverged: {what} is {loss} (learning rate {lr:g}); no results "
                               "written, the last checkpoint is from before it. Rerun with a lower --lr")


class _FiniteGuard:
    """The first training step whose loss, and the first whose gradient norm, was not finite, tracked on the
    device. A gradient norm that overflows while the loss is still finite breaks the weights (the clipped
    update is NaN) one step before the loss shows it; the two cases call for different cures, so the error
    says which came first."""

    def __init__(self, step: int, device: torch.device):
        self.step = torch.full((), step, dtype=torch.long, device=device)
        self.bad_loss = torch.full((), -1, dtype=torch.long, device=device)
        self.bad_grad = torch.full((), -1, dtype=torch.long, device=device)

    def update(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.step += 1
        for first, value in ((self.bad_loss, loss), (self.bad_grad, grad_norm)):
            first.copy_(torch.where((first < 0) & ~torch.isfinite(value), self.step, first))

    def check(self, run_id: str, lr: float) -> int:
        """Raise if a gradient norm went non-finite before any loss did; else the first step with a
        non-finite loss (-1: none), for the caller's message."""
        bad_loss, bad_grad = int(self.bad_loss), int(self.bad_grad)
        if bad_grad < 0 or (0 <= bad_loss <= bad_grad):
            return bad_loss
        raise TrainingDiverged(
            f"{run_id}: training diverged: the gradient norm of step {bad_grad} is not finite while its loss "
            f"was (learning rate {lr:g}): the backward overflowed, which a lower --lr may not cure; no results "
            "written, the last checkpoint is from before it")


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), disable=not enabled, transient=False,
    )
    with progress:
        yield progress


# --------------------------------------------------------------------------------------------------
# A whole cell


def _diagnostics(model, task, n: int, config: RunConfig, device: torch.device) -> dict:
    if not config.diagnostics:
        return {}
    try:
        from lengthbench.diagnostics import measure_attention
    except ImportError:
        return {}
    batch = task.batch([0], n, "test", config.seed)
    with autocast(device):
        return measure_attention(model, _to_device(batch.input_ids, device),
                                 _to_device(batch.features, device, torch.float32),
                                 rows=config.diagnostic_rows, seed=config.seed)


def run_cell(config: RunConfig, results: str | Path, *, device: str = "auto", resume: bool = True,
             progress: bool = True, restart: bool = False,
             log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Train and evaluate one cell; write its rows to the store and return them.

    A cell already in the store is returned as stored. With ``resume`` a cell interrupted earlier
    continues from its checkpoint; without it (and without ``restart``) an existing checkpoint is an
    error, so that no training is thrown away by accident.
    """
    results = Path(results)
    run_id = config.run_id
    if run_finished(results, run_id) and not restart:
        return pd.read_parquet(run_path(results, run_id))
    torch_device = resolve_device(device)
    task = get_task(config.task, **config.task_params)
    task.check_length(config.train_length)
    lengths = eval_lengths(config.train_length, config.max_multiplier, task.extra_multipliers)
    ckpt_dir = checkpoint_dir(results, run_id)
    if restart and ckpt_dir.exists():
        for path in ckpt_dir.glob("*"):
            path.unlink()
    trainer = Trainer(config, task, torch_device, results, progress=progress, log=log)
    if trainer.checkpoint_path.exists() and not resume and not restart:
        raise UsageError(f"run {run_id} has a checkpoint in {ckpt_dir}; pass --resume to continue it "
                         "or --restart to start over")
    loaded = trainer.load() if resume else False
    if config.init_from and not trainer.warm_started and not loaded:
        raise UsageError(f"run {run_id} has a finished model but no model of its earlier stage {config.init_from}: "
                         "pass --resume to score it, or --restart to train it again from that stage")
    (ckpt_dir).mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "config.json").write_text(json.dumps(config.identity(), indent=2, sort_keys=True))

    trainer.train()
    trainer.use_best()
    model = trainer.model
    model.eval()
    # the selected weights, with the state the rows record: scoring can resume from this file alone (load_trained)
    state = {k: v for k, v in trainer.state.__dict__.items() if k != "history"}
    atomic_torch_save({"config": config.identity(), "model": model.state_dict(), "state": state},
                      ckpt_dir / "model.pt")

    common = dict(train_steps=trainer.state.step, train_seconds=round(trainer.state.train_seconds, 3),
                  best_step=trainer.state.best_step)
    _score_and_store(config, task, model, torch_device, results, lengths, common, progress, log)
    trainer.checkpoint_path.unlink(missing_ok=True)  # the run is in the store; model.pt stays for inspect
    return pd.read_parquet(run_path(results, run_id))


def _score_and_store(config: RunConfig, task, model, torch_device: torch.device, results: Path,
                     lengths: list[tuple[int, int]], common: dict, progress: bool,
                     log: Callable[[str], None] | None) -> None:
    """Score ``model`` at every ``(multiplier, n)`` of ``lengths`` and write run ``config.run_id``'s rows.

    Each length's row goes to ``eval_rows.json`` in the run's checkpoint folder as it is scored, and the tallies
    of the length being scored to ``eval_samples_partial.json`` every 30 s, so an interrupted scoring resumes at
    the next unscored sample; the store gets the run only once every length is scored."""
    run_id = config.run_id
    partial_path = checkpoint_dir(results, run_id) / "eval_rows.json"
    # the samples of the length being scored, so far: an interruption within a length resumes there
    samples_path = checkpoint_dir(results, run_id) / "eval_samples_partial.json"
    done: dict[int, dict] = {}
    if partial_path.exists():
        done = {row["multiplier"]: row for row in json.loads(partial_path.read_text())}
    evaluator = Evaluator(model, task, torch_device, seed=config.seed, tokens_per_batch=config.eval_tokens_per_batch)
    common = dict(
        run_id=run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed, preset=config.preset,
        train_length=config.train_length, selection=config.selection, train_steps=common["train_steps"],
        train_seconds=common["train_seconds"], device=device_description(torch_device),
        lengthbench_version=__version__, git_sha=git_sha(), metric=task.metric, config_json=config.to_json(),
        best_step=common["best_step"],
    )
    with _progress(progress) as bar:
        task_id = bar.add_task(f"eval {run_id}", total=len(lengths), completed=len(done), info="")
        for multiplier, n in lengths:
            if multiplier in done:
                continue
            started = time.perf_counter()
            def show(scored: int, count: int, multiplier=multiplier) -> None:  # within a length: samples scored
                bar.update(task_id, info=f"{multiplier}x: {scored:,}/{count:,} samples")

            scores = evaluator.score(n, config.eval_samples, partial=samples_path, on_batch=show)
            diagnostics = _diagnostics(model, task, n, config, torch_device)
            seconds = time.perf_counter() - started + scores.earlier_seconds
            done[multiplier] = dict(
                eval_length=n, multiplier=multiplier, exact_match=scores.exact_match,
                token_accuracy=scores.token_accuracy, score=scores.metric(task.metric), n_samples=scores.n_samples,
                realised_tokens=scores.realised_tokens, eval_seconds=round(seconds, 3),
                per_group_json=json.dumps(scores.per_group) if scores.per_group else "",
                sparsity=diagnostics.get("sparsity", float("nan")),
                sink_rate=diagnostics.get("sink_rate", float("nan")),
                entropy=diagnostics.get("entropy", float("nan")),
                support=diagnostics.get("support", float("nan")),
                diagnostic_rows=diagnostics.get("diagnostic_rows", 0),
                diagnostics_json=json.dumps(diagnostics.get("per_head", {})) if diagnostics else "",
            )
            atomic_write_text(partial_path, json.dumps(list(done.values())))
            samples_path.unlink(missing_ok=True)
            bar.update(task_id, advance=1, info=f"{multiplier}x: {scores.metric(task.metric):.3f} in {seconds:.1f}s")
            if log:
                log(f"{run_id} eval {multiplier}x (n = {n}): {task.metric} {scores.metric(task.metric):.3f} in "
                    f"{seconds:.1f} s")
    created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = [dict(common, **done[m], created_at=created_at) for m, _ in lengths]
    write_run(results, run_id, rows)
    partial_path.unlink(missing_ok=True)


def rescore_run(results: str | Path, run_id: str, *, samples: int | None = None, max_multiplier: int | None = None,
                device: str = "auto", progress: bool = True,
                log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Score the trained model of run ``run_id`` again, with ``samples`` per length and/or up to
    ``max_multiplier``, as a run of its own in the same store.

    Its configuration is the source's with those fields changed and ``rescored_from = run_id`` (so its run id
    differs from that of a run trained with the same fields); its training fields in the rows (steps, seconds,
    best step) are the source's. Nothing is trained. An interrupted rescoring resumes at the next length; a
    finished one is returned as stored. E.g. the seeds' 1,000 samples per length for a run scored on 200."""
    results = Path(results)
    if samples is None and max_multiplier is None:
        raise UsageError("nothing to rescore: give --samples, --max-multiplier or both")
    saved = _trained_checkpoint(results, run_id, "cpu",
                                hint=" (a rescored run keeps none: rescore the run it was rescored from)")
    source = RunConfig.from_dict(saved["config"])
    state = saved.get("state") or {}
    if not state or state.get("step", 0) < source.train_steps:
        raise UsageError(f"run {run_id}'s model.pt is not a finished training (step {state.get('step', 0)} of "
                         f"{source.train_steps})")
    changes = {key: value for key, value in (("eval_samples", samples), ("max_multiplier", max_multiplier))
               if value is not None}
    if all(getattr(source, key) == value for key, value in changes.items()):
        raise UsageError(f"nothing to rescore: run {run_id} was scored with {source.eval_samples} samples per "
                         f"length up to {source.max_multiplier}x already")
    try:
        config = dataclasses.replace(source, rescored_from=run_id, **changes)
    except ValueError as error:
        raise UsageError(str(error)) from error
    eval_multipliers(config.max_multiplier)
    if run_finished(results, config.run_id):
        return pd.read_parquet(run_path(results, config.run_id))
    torch_device = resolve_device(device)
    task = get_task(config.task, **config.task_params)
    task.check_length(config.train_length)
    lengths = eval_lengths(config.train_length, config.max_multiplier, task.extra_multipliers)
    model = build_model(config, task)
    model.load_state_dict(saved["model"])
    model = model.to(torch_device).eval()
    ckpt_dir = checkpoint_dir(results, config.run_id)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "config.json").write_text(json.dumps(config.identity(), indent=2, sort_keys=True))
    common = dict(train_steps=int(state["step"]), train_seconds=round(float(state.get("train_seconds", 0.0)), 3),
                  best_step=int(state.get("best_step", state["step"])))
    _score_and_store(config, task, model, torch_device, results, lengths, common, progress, log)
    return pd.read_parquet(run_path(results, config.run_id))


# The parameters that depend on the vocabulary: what ``init_part = "body"`` leaves at their initialisation.
VOCAB_PARAMETERS = ("embed.weight", "head.weight")


def warm_start(results: str | Path, run_id: str, model: torch.nn.Module, device, part: str = "all") -> dict:
    """The selected weights of the finished run ``run_id`` in ``results``, checked against ``model``'s shapes
    (``RunConfig.init_from``); with ``part="body"`` all but :data:`VOCAB_PARAMETERS`, which keep ``model``'s
    fresh values (``RunConfig.init_part``)."""
    path = checkpoint_dir(results, run_id) / "model.pt"
    if not path.exists():
        raise UsageError(f"--init-from {run_id}: no trained model of that run in {results} (run it to the end "
                         "there first)")
    weights = torch.load(path, map_location=device, weights_only=False)["model"]
    mine = model.state_dict()
    keep = set(VOCAB_PARAMETERS) if part == "body" else set()
    for key in sorted((set(mine) | set(weights)) - keep):
        theirs, ours = weights.get(key), mine.get(key)
        if theirs is None or ours is None or theirs.shape != ours.shape:
            shapes = " against ".join("missing" if t is None else "x".join(map(str, t.shape)) for t in (theirs, ours))
            what = ("the model size, mechanism and encoding must match" if keep else
                    "the vocabulary, model size, mechanism and encoding must match (--init-part body carries "
                    "all but the embedding and output layer, for another vocabulary)")
            raise UsageError(f"--init-from {run_id}: its model does not fit this one ({key}: {shapes}); {what}")
    return {key: (mine[key] if key in keep else weights[key]) for key in mine}


def _trained_checkpoint(results: str | Path, run_id: str, device, hint: str = "") -> dict:
    """The saved ``model.pt`` of a trained run (config, selected weights, training state), or a one-line
    :class:`UsageError` naming the runs of ``results`` that have one."""
    path = checkpoint_dir(results, run_id) / "model.pt"
    if not path.exists():
        known = sorted(p.parent.name for p in (Path(results) / "checkpoints").glob("*/model.pt"))
        raise UsageError(f"no trained model for run {run_id!r} in {results}{hint}"
                         + (f"; runs with a model: {', '.join(known)}" if known else ""))
    return torch.load(path, map_location=device, weights_only=False)


def load_model(results: str | Path, run_id: str, device: str = "cpu"):
    """``(model, task, config)`` of a trained run (its selected checkpoint), for inspection."""
    saved = _trained_checkpoint(results, run_id, device)
    config = RunConfig.from_dict(saved["config"])
    task = get_task(config.task, **config.task_params)
    model = build_model(config, task)
    model.load_state_dict(saved["model"])
    return model.to(device).eval(), task, config


def newest_trained_run(results: str | Path, task: str, attn: str, pe: str) -> str:
    """The run id of the newest run of ``task:attn:pe`` in ``results`` that kept its model (``model.pt``)."""
    found = []
    for path in (Path(results) / "checkpoints").glob("*/model.pt"):
        config = torch.load(path, map_location="cpu", weights_only=False)["config"]
        if (config.get("task"), config.get("attn"), config.get("pe")) == (task, attn, pe):
            found.append((path.stat().st_mtime, path.parent.name))
    if not found:
        raise UsageError(f"no trained {task}:{attn}:{pe} model in {results}/checkpoints")
    return max(found)[1]


__all__ = ["Evaluator", "Trainer", "load_model", "load_results", "newest_trained_run", "rescore_run", "run_cell",
           "warm_start"]
