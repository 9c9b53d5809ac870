"""Training one cell: AdamW with warm-up and cosine decay, bf16 autocast on CUDA, checkpoint selection on a
validation split, checkpoints every ``checkpoint_every`` steps, and a guard that stops a diverged run before it
saves or scores broken weights."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lengthbench import gpu_share
from lengthbench.checkpoints import (
    RESTART,
    atomic_torch_save,
    build_model,
    checkpoint_contents,
    checkpoint_dir,
    load_weights,
    read_checkpoint,
    warm_start,
)
from lengthbench.compile_policy import (
    DENSE_TRAIN_MAX_TOKENS,
    attention_kernels,
    compile_cache_file,
    compiles,
    load_compile_cache,
    save_compile_cache,
    trains_dense,
    trains_in_graph,
)
from lengthbench.config import RunConfig, selection_multiplier, selection_words
from lengthbench.data import BatchProducer, TrainStream, default_workers
from lengthbench.devices import autocast, to_device
from lengthbench.errors import TrainingDiverged
from lengthbench.evaluation import Evaluator
from lengthbench.graph_step import GraphStep, graph_optimizer
from lengthbench.progress import progress_bar, samples_rate
from lengthbench.tasks import IGNORE_INDEX


def learning_rate(config: RunConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    total = config.train_steps
    warmup = min(config.warmup_steps, total)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


@dataclass
class TrainState:
    step: int = 0
    train_seconds: float = 0.0
    best_score: float = -1.0
    best_step: int = -1
    history: list = field(default_factory=list)  # (step, loss, val_score)
    # the best score and step of each selection of ``also_select``: {"id": [score, step]}
    also_best: dict = field(default_factory=dict)
    # the mean number of lengthbench processes on the GPU while it trained, itself included (lengthbench.gpu_share);
    # NaN off CUDA
    gpu_share: float = float("nan")


class Trainer:
    # Training batches on a compiled CUDA model are padded up to multiples of ``pad_multiple`` tokens (a few
    # bucket shapes instead of one worst-case width: MQMTAR's mean padded width falls from 91 to 78; the
    # multiple doubles until there are at most ``max_widths``), one static graph per width. Models with fused
    # ops are not compiled (see ``__init__``) and train on the batches as they come.
    pad_multiple: int = 8
    max_widths: int = 6
    compile_dynamic: bool | None = False

    def __init__(self, config: RunConfig, task, device: torch.device, results: Path, progress: bool = True,
                 log: Callable[[str], None] | None = None,
                 on_metrics: Callable[[str, int, dict[str, float]], None] | None = None):
        self.config = config
        self.task = task
        self.device = device
        self.progress = progress
        self.log = log or (lambda line: None)  # plain lines at each validation (logs of sweep workers)
        # ("train" | "validation", step, values) where the progress bar updates and at each validation: a tracker
        self.on_metrics = on_metrics or (lambda kind, step, values: None)
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
        self.graph = trains_in_graph(config, device)
        self.dense = not self.graph and trains_dense(config, self.model, device, max_tokens)
        self.compiled = not self.graph and compiles(config, self.model, device, max_tokens)
        if self.graph:
            on = ("the fused ops" if config.train_attention == "fused" else
                  "dense reference attention; validation and scoring on the fused ops")
            self.log(f"training step in one CUDA graph at {max_tokens} tokens ({on})")
        elif self.dense:
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
        self.optimizer = (graph_optimizer(self.model, config.lr, config.weight_decay) if self.graph else
                          torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                            fused=fused))
        self.state = TrainState()
        self.best_model_state = None
        self.also_model_states: dict[str, dict] = {}  # the selected weights of each of ``also_select``
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
            "also_models": self.also_model_states,
        }, self.checkpoint_path)

    def load(self) -> bool:
        if not self.checkpoint_path.exists():
            return self.load_trained()
        saved = read_checkpoint(self.checkpoint_path, self.device, RESTART)
        load_weights(self.model, saved["model"], self.checkpoint_path, RESTART)
        with checkpoint_contents(self.checkpoint_path, RESTART):
            self.optimizer.load_state_dict(saved["optimizer"])
            self.state = TrainState(**saved["state"])
            self.best_model_state = saved["best_model"]
            self.also_model_states = saved.get("also_models") or {}
        return True

    def load_trained(self) -> bool:
        """Take the selected weights of a finished training from ``model.pt`` when ``train.pt`` is gone (it holds
        the optimizer's moments too, three times the size: a run scored elsewhere carries only ``model.pt``).
        The scoring then resumes as if from ``train.pt``; an unfinished or other run's ``model.pt`` is ignored."""
        saved = self._finished_model()
        if saved is None:
            return False
        path = self.dir / "model.pt"
        load_weights(self.model, saved["model"], path, RESTART)
        with checkpoint_contents(path, RESTART):
            self.state = TrainState(**saved["state"])
        self.best_model_state = None  # model.pt holds the selected weights already
        return True

    def _finished_model(self) -> dict | None:
        """This run's ``model.pt`` where it holds a finished training of this configuration; else None."""
        path = self.dir / "model.pt"
        if not path.exists():
            return None
        saved = read_checkpoint(path, self.device, RESTART)
        state = saved.get("state")
        if saved.get("config") != self.config.identity() or not state:
            return None
        with checkpoint_contents(path, RESTART):
            if int(state["step"]) < self.config.train_steps:
                return None
        return saved

    # -- the step ----------------------------------------------------------------------------------
    def _make_step_fn(self):
        step = self._make_plain_step_fn()
        if not self.graph:
            return step
        # an eager step on the same fused-op path is the fallback where the capture fails
        return GraphStep(self.model, self.optimizer, self.config.grad_clip,
                         self.task.max_tokens(self.config.train_length), fallback=step, log=self.log,
                         compile_forward=self.config.train_step == "graph-compiled" and self.config.compile,
                         fused=self.config.train_attention == "fused")

    def _make_plain_step_fn(self):
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
        per width), to the widest where it runs in one CUDA graph, else as they come."""
        config = self.config
        padded = self.compiled or self.graph
        pad_to = self.task.max_tokens(config.train_length) if padded else None
        # the dense references compile slowly: Inductor took 75-100 s per width for the paper ASEntmax + NAPE
        # model on the H100 (softmax's graphs take seconds), so those batches all take the widest
        multiple = pad_to if padded and (self.dense or self.graph) else self.pad_multiple
        stream = TrainStream(config.task, tuple(sorted(config.task_params.items())), config.seed,
                             config.batch_size, config.train_length, pad_to, multiple)
        while padded and len(stream.widths()) > self.max_widths:
            stream = dataclasses.replace(stream, pad_multiple=2 * stream.pad_multiple)
        return stream

    def _select(self, evaluator: Evaluator) -> float:
        """Validate at each selection's length; keep the weights where each scores its best (a later step wins
        a tie). Returns the run's own selection's score."""
        config = self.config
        metric = self.task.metric if config.selection_metric == "task" else config.selection_metric
        values = {}
        with attention_kernels(self.model, self.kernel_flags):  # the fused ops, as in scoring
            for selection in (config.selection, *config.also_select):
                n = config.train_length * selection_multiplier(selection)
                if n not in values:
                    scores = evaluator.score(n, config.val_samples, split="val", bleu=metric == "bleu")
                    values[n] = scores.metric(metric)
        value = values[config.train_length * selection_multiplier(config.selection)]
        if value >= self.state.best_score:
            self.state.best_score = value
            self.state.best_step = self.state.step
            self.best_model_state = self._weights()
        for selection in config.also_select:
            other = values[config.train_length * selection_multiplier(selection)]
            if other >= self.state.also_best.get(selection, [-1.0, -1])[0]:
                self.state.also_best[selection] = [other, self.state.step]
                # the same step as the run's own selection: the same weights
                self.also_model_states[selection] = (
                    self.best_model_state if self.state.best_step == self.state.step else self._weights())
        self.model.train()
        return value

    def _weights(self) -> dict:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

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
        report_every = 25
        # each step's loss, gradient norm and token counts since the last report, kept on the device so that a
        # step costs two small launches and no synchronisation; read where the loss is reported and before
        # checkpoints (where a loss or gradient norm that is not finite stops the run)
        window = _StepWindow(report_every, self.state.step + 1, self.device)
        dense = attention_kernels(self.model, False) if self.dense else contextlib.nullcontext()
        with progress_bar(self.progress) as progress, dense:
            # a validation every eval_every steps and at the last one
            first_validation = min(total, (self.state.step // config.eval_every + 1) * config.eval_every)
            task_id = progress.add_task("train", total=total, completed=self.state.step, rate="",
                                        detail=f"first validation at step {first_validation:,}")
            started = time.perf_counter() - self.state.train_seconds
            process_started, steps_here = time.perf_counter(), 0
            share = gpu_share.tracker(self.device)
            share_mark = share.mark() if share is not None else None
            earlier = (self.state.gpu_share, self.state.train_seconds)

            def record_time() -> None:
                self.state.train_seconds = time.perf_counter() - started
                if share is not None:
                    self.state.gpu_share = gpu_share.combined(share.mean_since(share_mark), self.state.train_seconds
                                                              - earlier[1], *earlier)
            try:
                for input_ids, labels, features in producer:
                    lr = learning_rate(config, self.state.step)
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    loss, correct, scored, grad_norm = self.step_fn(
                        to_device(input_ids, self.device), to_device(labels, self.device),
                        to_device(features, self.device, torch.float32),
                    )
                    window.add(loss, correct, scored, grad_norm)
                    steps_here += 1
                    if self.compiled and steps_here in (1, 100):  # compilation and CUDA graph capture take the
                        # first steps' time; say where a compiled run stands before its first validation
                        loss.item()
                        self.log(f"{config.run_id} step {self.state.step + 1}/{total}: {steps_here} step(s) in "
                                 f"{time.perf_counter() - process_started:.1f} s in this process (compilation "
                                 "included)")
                        if steps_here == 100 and (message := save_compile_cache(self.compile_cache)):
                            self.log(message)  # by now every bucket width has come (one for the references)
                    self.state.step += 1
                    window_samples += config.batch_size
                    step = self.state.step
                    if step % config.eval_every == 0 or step == total:
                        val_score = self._select(evaluator)
                        left = (total - step) * (time.perf_counter() - process_started) / steps_here
                        self.log(f"{config.run_id} step {step}/{total}: loss {loss.item():.4f}, {val_label} "
                                 f"{val_score:.3f} (best {self.state.best_score:.3f} at {self.state.best_step}), "
                                 f"{step * config.batch_size / max(time.perf_counter() - started, 1e-9):,.0f} "
                                 f"samples/s since start, ETA {_clock(left)}" + "".join(
                                     f"; selection {other}: best {score:.3f} at {at}"
                                     for other, (score, at) in self.state.also_best.items()))
                        self.on_metrics("validation", step, {"score": val_score, "best_score": self.state.best_score})
                    if step % report_every == 0 or step == total:
                        elapsed = time.perf_counter() - window_start
                        losses, norms, correct_n, scored_n = window.read()
                        window.check(losses, norms, config.run_id, lr)
                        mean_loss = float(losses.mean())
                        _check_finite(mean_loss, f"the mean loss of steps {window.first}-{step}", config.run_id, lr)
                        accuracy = int(correct_n.sum()) / max(1, int(scored_n.sum()))
                        self.state.history.append((step, mean_loss, val_score))
                        samples_per_second = window_samples / max(elapsed, 1e-9)
                        validated = (f"{val_label} {val_score:.3f} (best {self.state.best_score:.3f} at step "
                                     f"{self.state.best_step:,})" if self.state.best_step >= 0 else
                                     f"first validation at step {first_validation:,}")
                        progress.update(task_id, completed=step, rate=samples_rate(samples_per_second),
                                        detail=f"loss {mean_loss:.4f}  accuracy {accuracy:.3f}  {validated}")
                        self.on_metrics("train", step, {"loss": mean_loss, "accuracy": accuracy, "learning_rate": lr,
                                                        "samples_per_second": samples_per_second})
                        window.restart(step + 1)
                        window_start, window_samples = time.perf_counter(), 0
                    if step % config.checkpoint_every == 0 and step < total:
                        losses, norms, _, _ = window.read()
                        bad_loss = window.check(losses, norms, config.run_id, lr)  # never save broken weights
                        if bad_loss >= 0:
                            _check_finite(float("nan"), f"the loss of step {bad_loss}", config.run_id, lr)
                        record_time()
                        self.save()
            finally:
                producer.close()
            record_time()
        self.save()

    def use_best(self) -> None:
        if self.best_model_state is not None:
            self.model.load_state_dict(self.best_model_state)


def _clock(seconds: float) -> str:
    """``"1:02:03"``: a duration as hours, minutes and seconds."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _check_finite(loss: float, what: str, run_id: str, lr: float) -> None:
    """Stop a run whose loss is NaN or infinite, before it checkpoints or scores the broken weights."""
    if not math.isfinite(loss):
        raise TrainingDiverged(f"{run_id}: training diverged: {what} is {loss} (learning rate {lr:g}); no results "
                               "written, the last checkpoint is from before it. Rerun with a lower --lr")


class _StepWindow:
    """The training steps since the last report, on the device: each step's loss and gradient norm (float32) and
    its correct and scored token counts, two rows written by one launch each a step (the steps ahead of the host
    need no synchronisation), read back at a report or a checkpoint. ``first`` is the number of the window's
    first step; the window holds at most ``size`` steps."""

    def __init__(self, size: int, first: int, device: torch.device):
        self.values = torch.zeros(size, 2, device=device)  # loss, gradient norm
        self.counts = torch.zeros(size, 2, dtype=torch.long, device=device)  # correct, scored
        self.first, self.n = first, 0

    def add(self, loss: torch.Tensor, correct: torch.Tensor, scored: torch.Tensor, grad_norm: torch.Tensor) -> None:
        if self.n == len(self.values):
            raise RuntimeError(f"a window of {self.n} training steps is full: read it and restart it first")
        torch.stack((loss.float(), grad_norm.float()), out=self.values[self.n])
        torch.stack((correct.long(), scored.long()), out=self.counts[self.n])
        self.n += 1

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(losses, gradient norms, correct, scored)`` of the window's steps, on the host."""
        values, counts = self.values[:self.n].cpu().numpy(), self.counts[:self.n].cpu().numpy()
        return values[:, 0], values[:, 1], counts[:, 0], counts[:, 1]

    def restart(self, first: int) -> None:
        self.first, self.n = first, 0

    def check(self, losses: np.ndarray, norms: np.ndarray, run_id: str, lr: float) -> int:
        """Raise if a gradient norm went non-finite before any loss did (a gradient norm that overflows while the
        loss is still finite breaks the weights, the clipped update NaN, one step before the loss shows it; the
        two cases call for different cures, so the error says which came first); else the number of the first
        step with a non-finite loss (-1: none), for the caller's message. Steps before the window were checked
        when it started (a run stops at the first check that finds one)."""
        def first_bad(values: np.ndarray) -> int:
            bad = np.flatnonzero(~np.isfinite(values))
            return self.first + int(bad[0]) if bad.size else -1

        bad_loss, bad_grad = first_bad(losses), first_bad(norms)
        if bad_grad < 0 or (0 <= bad_loss <= bad_grad):
            return bad_loss
        raise TrainingDiverged(
            f"{run_id}: training diverged: the gradient norm of step {bad_grad} is not finite while its loss "
            f"was (learning rate {lr:g}): the backward overflowed, which a lower --lr may not cure; no results "
            "written, the last checkpoint is from before it")
