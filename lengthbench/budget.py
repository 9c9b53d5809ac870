"""A sweep's time budget (``lengthbench sweep --budget 25m``): what each cell costs on a GPU, which cells fit,
the plan printed before anything starts, and the guard that never starts a cell that cannot finish in time.

A cell costs its start (process, compilation, graph capture), its training (``train_samples`` over samples per
second), its validations (every ``eval_every`` steps, ``val_samples`` at each selection's length) and its
scoring (``eval_samples`` at every length, once per selection: the run's own and each of ``also_select``). The
rates come, best first, from

1. the store: finished runs with the same task, mechanism, encoding, model and batch on the same GPU model
   (the fastest one's ``train_seconds``, the slowest ``eval_seconds`` per length, where a sample costs a run no
   more than at any longer length, each as if the run had had its GPU alone: divided by the side-by-side
   slowdown of the share of the GPU it recorded, ``train_gpu_share`` and ``gpu_share``, :func:`shared_slowdown`;
   the plan adds its own sharing back), so a campaign's first window
   calibrates the next, and a sweep's finished cells the ones it starts after them (:meth:`CostModel.learn`,
   before each cell starts). A run's training seconds hold its start (compilation, graph capture), so only runs
   that trained :data:`MIN_CALIBRATING_S` or longer set the training rate here; shorter ones (a few thousand
   steps: mostly start) come after the benchmarks;
2. the product benchmarks: ``results/benchmarks/train_throughput.parquet`` (samples/s, warm-up) and
   ``eval_time.parquet`` (seconds per 1,000 samples at a length, scaled to the model's layers x width and
   linearly in length, which over-estimates shorter lengths: attention's share grows with the square);
3. the store's shorter runs of the model, for its training rate;
4. conservative defaults (:data:`DEFAULT_SAMPLES_PER_S`, :data:`DEFAULT_SECONDS_PER_1000_AT_64K`).

The benchmark tables measure each mechanism at its default parameters. Parameters that take a mechanism off its
fused op (1.5-entmax's or Sieve's ``alpha`` other than 1.5, stick-breaking's ``remainder="drop"``) put it on the
dense reference path, much slower and quadratic in length: such a cell is costed from stored runs of the same
mechanism and parameters (any task or model, scaled), else from the reference path's defaults
(:data:`DEFAULT_REFERENCE_SAMPLES_PER_S`, scoring quadratic from :data:`REFERENCE_QUADRATIC_FROM` tokens).

Cells side by side on one GPU each run slower (:func:`side_by_side_factor`, from
``results/benchmarks/side_by_side.parquet`` where measured, else as slow as one after another).

A cell that an earlier window left unfinished costs what it has left (:func:`cell_progress`): the steps after its
training checkpoint, and the lengths and selections not yet scored. A cell longer than the whole budget (no window
of this length holds it; a budget of at least :data:`MIN_PART_S`) runs as a sweep's first cell until the budget
ends, when the sweep stops it at its last checkpoint (training every ``checkpoint_every`` steps, scoring every
30 s); the next window resumes it (:class:`BudgetGuard`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from lengthbench import checkout_path
from lengthbench.config import RunConfig, selection_multiplier
from lengthbench.errors import UsageError
from lengthbench.store import (
    RunFileError,
    read_once,
    read_run_file,
    run_path,
    runs_dir,
    with_schema_version,
)

# The product benchmarks' tables, beside the package in a checkout (an installed package without them plans from
# the store and the defaults).
BENCHMARKS = checkout_path("results", "benchmarks")
# Where nothing measured matches: a slow training step (the paper MQMTAR model with the slowest fused
# mechanisms trains at about 30,000 samples/s on an H200), the slowest scoring measured (Sieve's entmax filter,
# fresh weights, 374 s per 1,000 samples of 65,536 tokens at 4 layers x d 512 on an H100), and a start with
# compilation and graph capture.
DEFAULT_SAMPLES_PER_S = 10_000.0
DEFAULT_SECONDS_PER_1000_AT_64K = 400.0
DEFAULT_START_S = 150.0
REFERENCE_WIDTH = 4 * 512  # layers x d_model of the eval_time benchmark's model (the paper MQMTAR model)
PROCESS_START_S = 20.0  # Python, torch and the data workers, before the first step
LENGTH_OVERHEAD_S = 1.0  # per scored length: batch planning, diagnostics, the row's write
# The dense reference path (parameters no fused op computes): Sieve at alpha 1.1 trained the 2-layer d-256 MQRAR
# model at n 16 at 2,800 samples/s on an H100 (results/runs, 2026-12-06), where alpha 1.5's fused op trains it at
# 11,000; its scoring grows with the square of the length (the scores of every query against every key, chunked by
# queries): the fused default's seconds, times n / REFERENCE_QUADRATIC_FROM above that length.
DEFAULT_REFERENCE_SAMPLES_PER_S = 2_000.0
REFERENCE_QUADRATIC_FROM = 4096
# The shortest budget in which a cell longer than it runs a part: less would go mostly to the start (compilation,
# graph capture) and keep little past the last checkpoint.
MIN_PART_S = 300.0
# The shortest stored training (as if alone on its GPU) whose rate a plan takes before the benchmarks': a run's
# seconds hold its start (compilation, graph capture) and validations, which weigh on a short run (Sieve's paper
# MQRAR model: 5,000 steps in 42 s on an H100, 15,000 samples/s, where the throughput benchmark's steady rate is
# 54,000 on an H200) and little on five minutes of training.
MIN_CALIBRATING_S = 300.0
# A training rate the benchmark measured on another GPU model, for this one: the H100 cells of Sieve Table 1 Copy
# at the paper's protocol (11 trainings, 2026-12-07, sharing divided out) trained at 0.84-1.06x, median 0.95x, the
# H200 rates of results/benchmarks/train_throughput.parquet; a little under, as a plan errs long.
OTHER_GPU_TRAINING = 0.9
# The GPU a plan made on a machine without one is for: the slower of the two lent kinds.
DEFAULT_PLAN_GPU = "NVIDIA H100 80GB HBM3"


def parse_budget(text: str | int | float) -> float:
    """``"25m"``, ``"90s"``, ``"1h30m"``, ``"2h"`` or a number of minutes -> seconds; a one-line
    :class:`UsageError` for anything else."""
    if isinstance(text, bool):
        raise UsageError(f"budget must be a duration like 25m, 90s or 1h30m, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text) * 60
    else:
        match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?:in)?)?\s*(?:(\d+(?:\.\d+)?)s)?\s*",
                             str(text))
        if not match or not any(match.groups()):
            raise UsageError(f"budget must be a duration like 25m, 90s or 1h30m, got {text!r}")
        hours, minutes, secs = (float(part) if part else 0.0 for part in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not math.isfinite(seconds) or seconds <= 0 or seconds > 30 * 24 * 3600:
        raise UsageError(f"budget must be more than 0 and at most 30 days, got {text!r}")
    return seconds


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


@functools.lru_cache(maxsize=256)
def _fused_ops(attn: str, attn_params: str, pe: str, pe_params: str, d_model: int, n_heads: int) -> tuple[str, ...]:
    from lengthbench.models.attention.registry import ATTENTION
    from lengthbench.models.positional import build_pe

    try:
        layer = ATTENTION.get(attn)(d_model, n_heads, build_pe(pe, n_heads, d_model // n_heads, **json.loads(pe_params)),
                                    **json.loads(attn_params))
    except Exception:  # noqa: BLE001 - a mechanism that cannot be built here: costed as measured
        return ("?",)
    return layer.kernel_names() if layer.kernel_supported() else ()


def on_measured_path(config: RunConfig) -> bool:
    """Whether ``config``'s attention, with its parameters, runs on a GPU the way the benchmark tables measured it
    (their rows are of the default parameters): the same fused ops, or none in both."""
    def ops(params: dict) -> tuple[str, ...]:
        return _fused_ops(config.attn, json.dumps(params, sort_keys=True), config.pe,
                          json.dumps(config.pe_params, sort_keys=True), config.d_model, config.n_heads)

    return not config.attn_params or ops(config.attn_params) == ops({})


def _gpu_family(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``: what the tables' device names are matched on."""
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name.upper())
    return match.group(1).lower() if match else name.strip().lower()


@dataclass
class CellCost:
    """One cell's estimated seconds, in parts, and where each rate came from."""

    start: float
    train: float
    validation: float
    scoring: float
    sources: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.start + self.train + self.validation + self.scoring


@dataclass
class Progress:
    """What an unfinished cell has done in a store: the share of its training steps behind its checkpoint (1.0
    once trained) and, per run of the cell (its own selection and each of ``also_select``), the multipliers
    scored, or None for a run in the store."""

    trained: float = 0.0
    scored: dict[str, set[float] | None] = field(default_factory=dict)


def cell_progress(results: str | Path | None, config: RunConfig) -> Progress:
    """Where ``config``'s cell stands in ``results`` (None: nothing done): its checkpoint folders' ``train.pt``
    (the step reached), ``model.pt`` (trained) and ``eval_rows.json`` (the lengths scored); an unreadable file
    counts as nothing done."""
    progress = Progress()
    if results is None:
        return progress
    from lengthbench.checkpoints import checkpoint_dir, scored_rows
    from lengthbench.store import run_finished

    runs = [config, *config.selected_runs()]
    for run in runs:
        if run_finished(results, run.run_id):
            progress.scored[run.run_id] = None
            continue
        try:
            progress.scored[run.run_id] = {float(row["multiplier"]) for row in scored_rows(results, run.run_id)}
        except (OSError, ValueError, TypeError, KeyError):
            progress.scored[run.run_id] = set()
    if any(run_finished(results, run.run_id) for run in runs) or any(
            (checkpoint_dir(results, run.run_id) / "model.pt").exists() for run in runs):
        progress.trained = 1.0
    elif (checkpoint_dir(results, config.run_id) / "train.pt").exists():
        try:
            import torch

            saved = torch.load(checkpoint_dir(results, config.run_id) / "train.pt", map_location="cpu",
                               weights_only=False)
            progress.trained = min(1.0, int(saved["state"]["step"]) / max(1, config.train_steps))
        except Exception:  # noqa: BLE001 - an unreadable checkpoint: the run trains again, costed so
            progress.trained = 0.0
    return progress


class CostModel:
    """Estimated seconds of a cell on ``gpu`` (a device name such as ``torch.cuda.get_device_name()`` gives),
    from ``store`` (a loaded results frame, may be empty) and the benchmark tables in ``benchmarks``; with
    ``results`` (the sweep's store folder), the part an unfinished cell has left (:func:`cell_progress`)."""

    def __init__(self, gpu: str, store: pd.DataFrame | None = None, benchmarks: Path = BENCHMARKS,
                 results: str | Path | None = None):
        self.gpu = gpu
        self.family = _gpu_family(gpu)
        self.store = store if store is not None else pd.DataFrame()
        self.benchmarks = Path(benchmarks)
        self.results = results
        self._read: set[str] | None = None  # the run ids in ``store`` or looked at by :meth:`learn`

    def learn(self) -> list[str]:
        """Add the runs stored in ``results`` since the store was read, and return their run ids: the cells a
        sweep has just run calibrate those after them (a model's first cell, costed from a benchmark or a
        default, measures the model for the seeds after it). A file that cannot be read is passed over."""
        if self.results is None or not runs_dir(self.results).is_dir():
            return []
        if self._read is None:
            self._read = set(self.store["run_id"].astype(str)) if "run_id" in self.store.columns else set()
        try:
            new = sorted(entry.name[:-len(".parquet")] for entry in os.scandir(runs_dir(self.results))
                         if entry.name.endswith(".parquet") and entry.name[:-len(".parquet")] not in self._read)
        except OSError:
            return []
        self._read.update(new)
        frames = []
        for run_id in new:
            try:
                frames.append(with_schema_version(read_run_file(run_path(self.results, run_id))))
            except RunFileError:
                continue
        if frames:
            self.store = pd.concat([frame for frame in (self.store, *frames) if not frame.empty], ignore_index=True)
            self.__dict__.pop("_stored_runs", None)  # cached_property: costed again from the grown store
        return [str(frame["run_id"].iloc[0]) for frame in frames if not frame.empty]

    @cached_property
    def _throughput(self) -> pd.DataFrame:
        return _read_table(self.benchmarks / "train_throughput.parquet")

    @cached_property
    def _eval_time(self) -> pd.DataFrame:
        return _read_table(self.benchmarks / "eval_time.parquet")

    @cached_property
    def _stored_runs(self) -> pd.DataFrame:
        """The store's finished training runs on this GPU model, one row per length, with their configuration."""
        frame = self.store
        needed = {"config_json", "device", "train_seconds", "eval_seconds", "n_samples", "eval_length"}
        if frame.empty or not needed <= set(frame.columns):
            return pd.DataFrame()
        frame = frame[frame["device"].astype(str).map(_gpu_family) == self.family]
        return frame[frame["train_seconds"].astype(float) > 0]

    @staticmethod
    def _matching(frame: pd.DataFrame, config: RunConfig, keys: list[str]) -> pd.DataFrame:
        """The rows of ``frame`` whose run configuration equals ``config``'s at ``keys`` (rescored runs left out)."""
        def matches(text: str) -> bool:
            try:
                other = json.loads(text)
            except (TypeError, ValueError):
                return False
            return all(other.get(key) == getattr(config, key) for key in keys) and not other.get("rescored_from")

        if frame.empty:
            return frame
        texts = frame["config_json"]
        matched = {text: matches(text) for text in texts.unique()}  # (a run's rows share one configuration)
        return frame[[matched.get(text, False) for text in texts]]  # (NaN, a text never equal to itself: no match)

    def _same_model(self, frame: pd.DataFrame, config: RunConfig, batch: bool = True) -> pd.DataFrame:
        keys = ["task", "attn", "pe", "attn_params", "pe_params", "d_model", "n_layers", "n_heads", "ffn",
                "train_length", "train_step"] + (["batch_size"] if batch else [])
        return self._matching(frame, config, keys)

    def samples_per_second(self, config: RunConfig) -> tuple[float, float, str]:
        """``(samples/s, start seconds, source)`` of ``config``'s training on this GPU."""
        measured = on_measured_path(config)
        found = self._stored_rate(config, long=True)
        if found is None and measured:
            found = self._benchmark_rate(config)
        if found is None:
            found = self._stored_rate(config, long=False)
        if found is not None:
            return found
        return self._reference_rate(config) if not measured else (DEFAULT_SAMPLES_PER_S, DEFAULT_START_S, "default")

    def _stored_rate(self, config: RunConfig, long: bool) -> tuple[float, float, str] | None:
        """``(samples/s, start seconds, source)`` from the fastest stored run of ``config``'s model on this GPU, as
        if alone on it, among those that trained :data:`MIN_CALIBRATING_S` or longer (``long``) or among all."""
        runs = self._same_model(self._stored_runs, config)
        if runs.empty:
            return None
        per_run = runs.groupby("run_id").first()
        steps = per_run["train_steps"].astype(float) * config.batch_size
        # a run's seconds include its start and validations (its rate is the whole training's) and the cells
        # that shared its GPU, taken out here by the share it recorded (the plan adds its own back:
        # side_by_side_factor)
        seconds = per_run["train_seconds"].astype(float) / self._alone(config, _column(per_run, "train_gpu_share"))
        if long:
            steps, seconds = steps[seconds >= MIN_CALIBRATING_S], seconds[seconds >= MIN_CALIBRATING_S]
            if steps.empty:
                return None
        runs = f"{len(steps)} run{'s' * (len(steps) > 1)}"
        short = "" if long else f" shorter than {MIN_CALIBRATING_S / 60:.0f} min"
        return float((steps / seconds).max()), PROCESS_START_S, f"the store ({runs}{short})"

    def _benchmark_rate(self, config: RunConfig) -> tuple[float, float, str] | None:
        """``(samples/s, start seconds, source)`` of ``config``'s training from the throughput benchmark."""
        table = self._throughput
        if not table.empty and {"tokens_per_sample", "d_model", "layers"} <= set(table.columns):
            rows = table[(table["attn"] == config.attn) & (table["pe"] == config.pe) &
                         (table["batch_size"] == config.batch_size)]
            if "train_step" in rows.columns:
                rows = rows[rows["train_step"] == config.train_step]
            same_model = rows[(rows["task"] == config.task) & (rows["d_model"].astype(float) == config.d_model) &
                              (rows["layers"].astype(float) == config.n_layers)]
            # another encoding of the mechanism (the encoding's share of a step is small: NoPE's rows are rarely
            # measured), another task's model (its rate scaled by layers x width x tokens a sample, which the
            # step's time follows at these sizes), or another GPU model's rate times OTHER_GPU_TRAINING
            any_pe = table[(table["attn"] == config.attn) & (table["batch_size"] == config.batch_size)]
            if "train_step" in any_pe.columns:
                any_pe = any_pe[any_pe["train_step"] == config.train_step]
            any_pe_model = any_pe[(any_pe["task"] == config.task) & (any_pe["d_model"].astype(float) ==
                                                                     config.d_model) &
                                  (any_pe["layers"].astype(float) == config.n_layers)]
            for candidates, scaled in ((same_model, False), (any_pe_model, False), (rows, True), (any_pe, True)):
                same_gpu = candidates[candidates["device"].astype(str).map(_gpu_family) == self.family]
                chosen, scale, where = ((same_gpu, 1.0, "") if not same_gpu.empty else
                                        (candidates, OTHER_GPU_TRAINING, f", another GPU x {OTHER_GPU_TRAINING:g}"))
                if chosen.empty:
                    continue
                newest = chosen[chosen["commit"] == chosen.sort_values("created_at")["commit"].iloc[-1]]
                if scaled:
                    from lengthbench.tasks import get_task

                    tokens = get_task(config.task, **config.task_params).max_tokens(config.train_length)
                    work = newest["layers"].astype(float) * newest["d_model"].astype(float) * newest[
                        "tokens_per_sample"].astype(float)
                    rate = float((newest["samples_per_s"] * work).min()) / (config.n_layers * config.d_model * tokens)
                    where = f", scaled from {', '.join(sorted(set(newest['task'])))}{where}"
                else:
                    rate = float(newest["samples_per_s"].median())
                start = float(newest["warmup_s"].median()) if "warmup_s" in newest else DEFAULT_START_S
                return rate * scale, PROCESS_START_S + start, f"train_throughput{where}"
        return None

    def _alone(self, config: RunConfig, shares: pd.Series) -> pd.Series:
        """Per stored row, how much slower it ran than alone on its GPU, by the share it recorded."""
        return shares.map(lambda share: shared_slowdown(config.d_model, share, self.benchmarks))

    def _same_mechanism(self, config: RunConfig) -> pd.DataFrame:
        """Stored runs on this GPU model of ``config``'s mechanism with the same parameters, any task or model."""
        return self._matching(self._stored_runs, config, ["attn", "attn_params"])

    def _reference_rate(self, config: RunConfig) -> tuple[float, float, str]:
        """Samples/s of a cell on the dense reference path: the slowest stored run of the same mechanism and
        parameters, scaled by layers x width x tokens a sample, else :data:`DEFAULT_REFERENCE_SAMPLES_PER_S`."""
        from lengthbench.tasks import get_task

        def work(run: dict) -> float:
            tokens = get_task(run["task"], **(run.get("task_params") or {})).max_tokens(run["train_length"])
            return run["n_layers"] * run["d_model"] * tokens

        runs = self._same_mechanism(config)
        rates = []
        for _, row in (runs.groupby("run_id").first() if not runs.empty else runs).iterrows():
            run = json.loads(row["config_json"])
            rate = float(row["train_steps"]) * run["batch_size"] / float(row["train_seconds"])
            rate *= shared_slowdown(run["d_model"], _value(row, "train_gpu_share"), self.benchmarks)
            rates.append((rate * work(run) / work(json.loads(config.to_json())), run["task"]))
        if rates:
            rate, task = min(rates)
            return rate, DEFAULT_START_S, f"the store, scaled from {task} (no fused op for these parameters)"
        return DEFAULT_REFERENCE_SAMPLES_PER_S, DEFAULT_START_S, "default (no fused op for these parameters)"

    def _reference_seconds_per_sample(self, config: RunConfig, n: int) -> tuple[float, str]:
        """Seconds to score one sample of ``n`` tokens on the dense reference path: from the longest stored length
        of the same mechanism and parameters (scaled by layers x width, linearly to shorter lengths and with the
        square to longer ones), else the fused default times ``n / REFERENCE_QUADRATIC_FROM`` above that length."""
        width = config.n_layers * config.d_model
        runs = self._same_mechanism(config)
        if not runs.empty:
            row = runs.loc[runs["eval_length"].astype(int).idxmax()]
            run = json.loads(row["config_json"])
            m = int(row["eval_length"])
            per_sample = float(row["eval_seconds"]) / max(1.0, float(row["n_samples"]))
            per_sample /= shared_slowdown(run["d_model"], _value(row, "gpu_share"), self.benchmarks)
            per_sample *= width / (run["n_layers"] * run["d_model"])
            return per_sample * max(n / m, (n / m) ** 2), "the store, scaled (no fused op)"
        fused = DEFAULT_SECONDS_PER_1000_AT_64K / 1000 * width / REFERENCE_WIDTH * n / 65536
        return fused * max(1.0, n / REFERENCE_QUADRATIC_FROM), "default (no fused op)"

    def seconds_per_sample(self, config: RunConfig, n: int) -> tuple[float, str]:
        """Seconds to score one sample of ``n`` tokens with ``config``'s model on this GPU."""
        runs = self._same_model(self._stored_runs, config, batch=False)
        if not runs.empty:
            rows = runs[runs["eval_length"].astype(int) >= n]
            scored = set(rows.loc[rows["eval_length"].astype(int) == n, "run_id"])
            if scored:
                rows = rows[rows["run_id"].isin(scored)]
                per_sample = rows["eval_seconds"].astype(float) / rows["n_samples"].astype(float).clip(lower=1)
                per_sample /= self._alone(config, _column(rows, "gpu_share"))
                # a sample of n tokens scores no slower than a longer one of the same run: a length's seconds can
                # hold a one-time start (the first length's compilation and graph capture: 6 s for 200 samples
                # of 64 tokens, where 128 tokens took 0.3 s), which the run's longer lengths do not
                return float(per_sample.groupby(rows["run_id"]).min().max()), "the store"
        if not on_measured_path(config):
            return self._reference_seconds_per_sample(config, n)
        width = config.n_layers * config.d_model
        table = self._eval_time
        if not table.empty:
            rows = table[(table["attn"] == config.attn) & (table["pe"] == config.pe)]
            if rows.empty:  # the mechanism under another encoding
                rows = table[table["attn"] == config.attn]
            same_task = rows[rows["task"] == config.task]
            rows = same_task if not same_task.empty else rows
            same_gpu = rows[rows["device"].astype(str).map(_gpu_family) == self.family]
            rows, scale = (same_gpu, 1.0) if not same_gpu.empty else (rows, 1.33)
            if not rows.empty:
                row = rows.sort_values("created_at").iloc[-1]
                reference_width = float(row["layers"]) * float(row["d_model"])
                per_sample = float(row["s_per_1000"]) / 1000 * scale * width / reference_width
                return per_sample * n / float(row["n"]), "eval_time"
        return DEFAULT_SECONDS_PER_1000_AT_64K / 1000 * width / REFERENCE_WIDTH * n / 65536, "default"

    def cost(self, config: RunConfig) -> CellCost:
        from lengthbench.tasks import eval_lengths, get_task

        rate, start, train_source = self.samples_per_second(config)
        train = config.train_steps * config.batch_size / rate
        task = get_task(config.task, **config.task_params)
        selections = [config.selection, *config.also_select]
        validation_lengths = sorted({config.train_length * selection_multiplier(s) for s in selections})
        validations = -(-config.train_steps // config.eval_every)
        # a stored run's training seconds hold its validations already
        validation = 0.0 if train_source.startswith("the store (") else validations * sum(config.val_samples * self.seconds_per_sample(config, n)[0]
                                       for n in validation_lengths)
        lengths = eval_lengths(config.train_length, config.max_multiplier, task.extra_multipliers)
        scoring_sources = set()
        each = {}
        for multiplier, n in lengths:
            per_sample, source = self.seconds_per_sample(config, n)
            scoring_sources.add(source)
            each[float(multiplier)] = config.eval_samples * per_sample + LENGTH_OVERHEAD_S
        progress = cell_progress(self.results, config)
        scoring = 0.0
        for run in (config, *config.selected_runs()):
            scored = progress.scored.get(run.run_id, set())
            if scored is not None:
                scoring += sum(seconds for multiplier, seconds in each.items() if multiplier not in scored)
        sources = [f"training: {train_source}", f"scoring: {', '.join(sorted(scoring_sources))}"]
        if progress.trained or any(progress.scored.values()):
            sources.append("resumed: " + ("trained" if progress.trained >= 1 else
                                          f"{progress.trained:.1%} of the steps done"))
        left = 1.0 - progress.trained
        return CellCost(start, train * left, validation * left, scoring, sources)


def _read_table(path: Path) -> pd.DataFrame:
    """A benchmark table (read once per version of its file: every stored row of a shared GPU looks up
    ``side_by_side.parquet``); empty where it is absent or unreadable. Callers filter it, never change it."""
    try:
        return read_once(path)
    except (OSError, ValueError, ImportError):
        return pd.DataFrame()


def side_by_side_factor(config: RunConfig, cells: int, mps: bool, benchmarks: Path = BENCHMARKS) -> float:
    """How much longer each of ``cells`` cells sharing one GPU takes than one alone: the measured factor for the
    nearest model size (``results/benchmarks/side_by_side.parquet``: ``d_model``, ``cells``, ``mps``,
    ``slowdown``), else ``cells`` (no gain: as slow as one after another)."""
    return _slowdown(config.d_model, cells, mps, benchmarks)


def _slowdown(d_model: int, cells: int, mps: bool, benchmarks: Path) -> float:
    if cells <= 1:
        return 1.0
    table = _read_table(Path(benchmarks) / "side_by_side.parquet")
    if not table.empty:
        rows = table[(table["cells"] == cells) & (table["mps"] == mps)]
        if not rows.empty:
            nearest = (rows["d_model"].astype(float) - d_model).abs()
            rows = rows[nearest == nearest.min()]
            return float(max(1.0, rows["slowdown"].max()))
    return float(cells)


def shared_slowdown(d_model: int, share: float, benchmarks: Path = BENCHMARKS) -> float:
    """How much slower a run was than alone on its GPU, where ``share`` lengthbench processes (itself included, a
    mean: ``train_gpu_share`` or ``gpu_share`` of a stored row, lengthbench.gpu_share) used the GPU: the measured
    side-by-side slowdown under MPS (as sweeps run cells side by side) of the nearest model size, interpolated
    between whole numbers of cells; 1 where the share is not recorded (NaN) or is 1."""
    if not share == share or share <= 1.0:
        return 1.0
    low, high = math.floor(share), math.ceil(share)
    below, above = _slowdown(d_model, low, True, benchmarks), _slowdown(d_model, high, True, benchmarks)
    return below + (above - below) * (share - low)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """``frame[name]`` as floats; NaN where the store predates the column."""
    if name in frame.columns:
        return pd.to_numeric(frame[name], errors="coerce")
    return pd.Series(float("nan"), index=frame.index)


def _value(row: pd.Series, name: str) -> float:
    try:
        return float(row[name]) if name in row.index else float("nan")
    except (TypeError, ValueError):
        return float("nan")


@dataclass
class PlannedCell:
    config: RunConfig
    seconds: float  # estimated, side by side included; 0 for a cell in the store
    start: float = 0.0  # seconds after the sweep starts
    slot: int = 0
    state: str = "runs"  # runs, runs part (longer than the budget: stopped at its end), in the store, does not fit
    sources: list[str] = field(default_factory=list)
    until: float = math.inf  # where a part runs: the budget's end

    @property
    def end(self) -> float:
        return self.start + min(self.seconds, self.until)


def plan(configs: Iterable[RunConfig], budget: float, slots: int, per_gpu: int, mps: bool, cost: CostModel,
         finished: Iterable[str] = (), fill: bool = False) -> list[PlannedCell]:
    """Each cell in order on the first free slot of ``slots`` (``per_gpu`` of them share a GPU, each slower by
    :func:`side_by_side_factor`), until the first that cannot end inside ``budget`` seconds: it and every cell
    after it do not fit (the sweep stops there). A cell's earlier stage (``init_from``) ends before it starts.
    The first cell to run, where it is longer than the whole budget, runs the budget through (state ``"runs
    part"``: stopped at the budget's end, resumed by the next window), as :class:`BudgetGuard` admits it. With
    ``fill``, a cell that cannot end inside the budget runs a part too wherever its slot has at least
    :data:`MIN_PART_S` of the budget left (the budget's tail is not left idle)."""
    finished = set(finished)
    free = [0.0] * max(1, slots)
    ends: dict[str, float] = {}
    planned, stopped = [], False
    for config in configs:
        if config.run_id in finished:
            planned.append(PlannedCell(config, 0.0, state="in the store"))
            continue
        estimate = cost.cost(config)
        seconds = estimate.total * side_by_side_factor(config, per_gpu, mps, cost.benchmarks)
        slot = min(range(len(free)), key=free.__getitem__)
        start = max(free[slot], ends.get(config.init_from, 0.0))
        cell = PlannedCell(config, seconds, start, slot, sources=estimate.sources)
        first = not any(c.state != "in the store" for c in planned)
        if first and seconds > budget >= MIN_PART_S or (
                fill and not stopped and start + seconds > budget and budget - start >= MIN_PART_S):
            # seconds: the whole estimate; the slot: to the budget's end
            cell.state, cell.until = "runs part", budget - start
            free[slot] = ends[config.run_id] = budget
        elif stopped or start + seconds > budget:
            stopped = True
            cell.state, cell.start = "does not fit", 0.0
        else:
            free[slot] = ends[config.run_id] = start + seconds
        planned.append(cell)
    return planned


class BudgetGuard:
    """At run time: whether a cell, started now beside ``running`` others on its GPU, ends before the deadline
    (by the cost model, side by side included). Once one does not, no other starts (the sweep stops cleanly).

    A cell longer than the whole budget, which no window of this length holds, is admitted as the sweep's first
    cell only, with a deadline (:meth:`stop_at`): the sweep stops it when the budget ends, at its last checkpoint,
    and the next window resumes it (costed by what it has left). With ``fill``, so is any cell that cannot end
    inside the budget while at least :data:`MIN_PART_S` of it is left."""

    def __init__(self, seconds: float, cost: CostModel, per_gpu: int, mps: bool, clock=time.monotonic,
                 fill: bool = False):
        self.clock = clock
        self.budget = seconds
        self.deadline = clock() + seconds
        self.cost = cost
        self.per_gpu = per_gpu
        self.mps = mps
        self.stopped_at: RunConfig | None = None
        self.asked = False
        self.long: set[str] = set()  # the run ids admitted to be stopped at the deadline
        self.fill = fill

    def admits(self, config: RunConfig) -> bool:
        if self.stopped_at is not None:
            return False
        self.cost.learn()  # the cells finished since the last one started calibrate this one
        first, self.asked = not self.asked, True
        seconds = self.cost.cost(config).total * side_by_side_factor(config, self.per_gpu, self.mps,
                                                                     self.cost.benchmarks)
        if self.clock() + seconds > self.deadline:
            if first and seconds > self.budget >= MIN_PART_S or (
                    self.fill and self.deadline - self.clock() >= MIN_PART_S):
                self.long.add(config.run_id)
                return True
            self.stopped_at = config
            return False
        return True

    def stop_at(self, config: RunConfig) -> float | None:
        """The clock time (``clock``'s) at which the sweep stops ``config``, a cell admitted as a part (longer
        than the budget, or than what is left of it with ``fill``); None for a cell that ends inside it."""
        return self.deadline if config.run_id in self.long else None

    def left_seconds(self) -> float:
        return self.deadline - self.clock()
