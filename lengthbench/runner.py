"""Train one cell (task x attention x encoding x seed) at ``n_train`` and score it at every multiplier.

The run is resumable at any point: training state is checkpointed every ``checkpoint_every`` steps and
the rows of finished evaluation lengths are kept beside it; the store gets the run's rows in one atomic
write at the end. Data are a pure function of ``(config, step)`` (see :mod:`lengthbench.data`), so a
resumed run sees the batches an uninterrupted one would.

The parts live in their own modules: :mod:`lengthbench.training` (the training loop),
:mod:`lengthbench.evaluation` (scoring and BLEU), :mod:`lengthbench.checkpoints` (checkpoints, warm starts,
resume state), :mod:`lengthbench.compile_policy` (what is compiled, on which attention path) and
:mod:`lengthbench.devices`. This module orchestrates them: :func:`run_cell` and :func:`rescore_run`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from lengthbench import __version__, gpu_share
from lengthbench.checkpoints import (
    RETRAIN,
    VOCAB_PARAMETERS,
    atomic_torch_save,
    build_model,
    cell_finished,
    checkpoint_contents,
    checkpoint_dir,
    load_model,
    load_weights,
    newest_trained_run,
    read_checkpoint,
    run_status,
    trained_checkpoint,
    warm_start,
)
from lengthbench.compile_policy import (
    COMPILE_CACHE_ENV,
    DENSE_TRAIN_MAX_TOKENS,
    attention_kernels,
    compile_cache_file,
    compiles,
    load_compile_cache,
    model_dispatches_to_kernels,
    save_compile_cache,
    trains_dense,
)
from lengthbench.config import RunConfig
from lengthbench.devices import autocast, device_description, git_sha, resolve_device, to_device
from lengthbench.errors import UsageError
from lengthbench.evaluation import BleuTally, Evaluator, Scores
from lengthbench.plugins import plugins_of
from lengthbench.progress import progress_bar
from lengthbench.store import (
    atomic_write_text,
    load_results,
    read_json_file,
    run_finished,
    run_path,
    saved_config,
    write_run,
)
from lengthbench.tasks import eval_lengths, eval_multipliers, get_task, multiplier_label
from lengthbench.training import Trainer, TrainState, learning_rate


def _diagnostics(model, task, n: int, config: RunConfig, device: torch.device) -> dict:
    if not config.diagnostics:
        return {}
    try:
        from lengthbench.diagnostics import measure_attention
    except ImportError:
        return {}
    batch = task.batch([0], n, "test", config.seed)
    with autocast(device):
        return measure_attention(model, to_device(batch.input_ids, device),
                                 to_device(batch.features, device, torch.float32),
                                 rows=config.diagnostic_rows, seed=config.seed)


def run_cell(config: RunConfig, results: str | Path, *, device: str = "auto", resume: bool = True,
             progress: bool = True, restart: bool = False,
             log: Callable[[str], None] | None = None,
             on_metrics: Callable[[str, int, dict[str, float]], None] | None = None,
             log_samples: bool = False) -> pd.DataFrame:
    """Train and evaluate one cell; write its rows to the store and return them.

    A cell already in the store is returned as stored. With ``resume`` a cell interrupted earlier
    continues from its checkpoint; without it (and without ``restart``) an existing checkpoint is an
    error, so that no training is thrown away by accident. ``on_metrics`` gets the training's metrics
    (:class:`lengthbench.training.Trainer`), e.g. a :mod:`lengthbench.tracking` tracker. ``log_samples``: each
    length's scored samples to :func:`sample_log_path` (not for a cell returned as stored).
    """
    results = Path(results)
    run_id = config.run_id
    if run_finished(results, run_id) and not restart:
        if not cell_finished(results, config):  # its other selections' scoring was interrupted
            _score_selected(config, results, resolve_device(device), progress, log, log_samples=log_samples)
        return pd.read_parquet(run_path(results, run_id))
    torch_device = resolve_device(device)
    task = get_task(config.task, **config.task_params)
    task.check_length(config.train_length)
    lengths = eval_lengths(config.train_length, config.max_multiplier, task.extra_multipliers)
    ckpt_dir = checkpoint_dir(results, run_id)
    if restart:
        for folder in (ckpt_dir, *(checkpoint_dir(results, other.run_id) for other in config.selected_runs())):
            for path in folder.glob("*"):
                path.unlink()
    trainer = Trainer(config, task, torch_device, results, progress=progress, log=log, on_metrics=on_metrics)
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
    # the other selections' weights, each in its run's folder, before the training checkpoint that holds them goes
    state = {k: v for k, v in trainer.state.__dict__.items() if k not in ("history", "also_best")}
    for other in config.selected_runs():
        if other.selection in trainer.also_model_states:
            score, step = trainer.state.also_best[other.selection]
            atomic_torch_save({"config": other.identity(), "model": trainer.also_model_states[other.selection],
                               "state": dict(state, best_score=score, best_step=step), "plugins": plugins_of(other)},
                              checkpoint_dir(results, other.run_id) / "model.pt")
    trainer.use_best()
    model = trainer.model
    model.eval()
    # the selected weights, with the state the rows record: scoring can resume from this file alone (load_trained)
    atomic_torch_save({"config": config.identity(), "model": model.state_dict(), "state": state,
                       "plugins": plugins_of(config)}, ckpt_dir / "model.pt")

    common = dict(train_steps=trainer.state.step, train_seconds=round(trainer.state.train_seconds, 3),
                  best_step=trainer.state.best_step, train_gpu_share=_share(trainer.state.gpu_share))
    _score_and_store(config, task, model, torch_device, results, lengths, common, progress, log, log_samples)
    trainer.checkpoint_path.unlink(missing_ok=True)  # the run is in the store; model.pt stays for inspect
    _score_selected(config, results, torch_device, progress, log, rescore=restart, log_samples=log_samples)
    return pd.read_parquet(run_path(results, run_id))


def _score_selected(config: RunConfig, results: Path, torch_device: torch.device, progress: bool,
                    log: Callable[[str], None] | None, rescore: bool = False, log_samples: bool = False) -> None:
    """Score and store the runs of ``config.also_select`` (its training's checkpoint of each other selection)
    that are not in the store yet (all of them with ``rescore``). A selection that chose the step the run's own
    selection chose has the same weights, hence the same rows: those are copied, not scored again."""
    own = pd.read_parquet(run_path(results, config.run_id))
    for other in config.selected_runs():
        if run_finished(results, other.run_id) and not rescore:
            continue
        path = checkpoint_dir(results, other.run_id) / "model.pt"
        if not path.exists():
            raise UsageError(f"run {other.run_id} (selection {other.selection} of run {config.run_id}) has no "
                             f"kept checkpoint in {path.parent}: rerun {config.run_id} with --restart")
        remedy = f"rerun {config.run_id} with --restart"
        saved = read_checkpoint(path, "cpu", remedy)
        state = saved.get("state") or {}
        with checkpoint_contents(path, remedy):
            same = int(state["best_step"]) == int(own["best_step"].iloc[0])
            common = dict(train_steps=int(state["step"]), train_seconds=round(float(state["train_seconds"]), 3),
                          best_step=int(state["best_step"]), train_gpu_share=_share(state.get("gpu_share")))
        if same:
            created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            rows = own.drop(columns=["schema_version"]).assign(
                run_id=other.run_id, selection=other.selection, config_json=other.to_json(), created_at=created_at)
            write_run(results, other.run_id, rows.to_dict("records"))
            if log:
                log(f"{other.run_id}: selection {other.selection} chose step {state['best_step']}, as "
                    f"{config.run_id} did: the same rows")
            continue
        task = get_task(other.task, **other.task_params)
        lengths = eval_lengths(other.train_length, other.max_multiplier, task.extra_multipliers)
        model = build_model(other, task)
        load_weights(model, saved["model"], path, remedy)
        model = model.to(torch_device).eval()
        _score_and_store(other, task, model, torch_device, results, lengths, common, progress, log, log_samples)


def _share(value) -> float:
    """A row's GPU share (lengthbench.gpu_share), to two decimals; NaN where it was not measured."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return round(value, 2) if math.isfinite(value) else float("nan")


def sample_log_path(results: str | Path, run_id: str, multiplier: float) -> Path:
    """Where ``--log-samples`` writes the scored samples of one length: ``checkpoints/RUN_ID/samples_Nx.jsonl``."""
    return checkpoint_dir(results, run_id) / f"samples_{multiplier_label(multiplier)}x.jsonl"


def _score_and_store(config: RunConfig, task, model, torch_device: torch.device, results: Path,
                     lengths: list[tuple[int, int]], common: dict, progress: bool,
                     log: Callable[[str], None] | None, log_samples: bool = False) -> None:
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
        rows = read_json_file(partial_path, "delete it to score the run's lengths again",
                              lambda data: isinstance(data, list) and all(isinstance(row, dict) and "multiplier"
                                                                          in row for row in data))
        done = {row["multiplier"]: row for row in rows}
    evaluator = Evaluator(model, task, torch_device, seed=config.seed, tokens_per_batch=config.eval_tokens_per_batch)
    last = ""  # the last length scored, as the progress display shows it
    common = dict(
        run_id=run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed, preset=config.preset,
        train_length=config.train_length, selection=config.selection, train_steps=common["train_steps"],
        train_seconds=common["train_seconds"], device=device_description(torch_device),
        lengthbench_version=__version__, git_sha=git_sha(), metric=task.metric, config_json=config.to_json(),
        best_step=common["best_step"], plugins=",".join(plugins_of(config)),
        train_gpu_share=common.get("train_gpu_share", float("nan")),
    )
    share = gpu_share.tracker(torch_device)
    with progress_bar(progress, unit="lengths", eta=False) as bar:
        task_id = bar.add_task("score", total=len(lengths), completed=len(done), rate="", detail="")
        for multiplier, n in lengths:
            if multiplier in done:
                continue
            started = time.perf_counter()
            share_mark = share.mark() if share is not None else None
            def show(scored: int, count: int, multiplier=multiplier, n=n, last=last) -> None:  # samples scored so far
                bar.update(task_id, detail=f"{last}{multiplier_label(multiplier)}x (n = {n:,}): {scored:,}/{count:,} "
                           "samples")

            scores = evaluator.score(n, config.eval_samples, partial=samples_path, on_batch=show,
                                     sample_log=sample_log_path(results, run_id, multiplier) if log_samples else None)
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
                gpu_share=_share(share.mean_since(share_mark)) if share is not None else float("nan"),
            )
            atomic_write_text(partial_path, json.dumps(list(done.values())))
            samples_path.unlink(missing_ok=True)
            last = f"{multiplier_label(multiplier)}x: {task.metric.replace('_', ' ')} {scores.metric(task.metric):.3f}; "
            bar.update(task_id, advance=1, detail=last.rstrip("; "))
            if log:
                log(f"{run_id} eval {multiplier}x (n = {n}): {task.metric} {scores.metric(task.metric):.3f} in "
                    f"{seconds:.1f} s")
    created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = [dict(common, **done[m], created_at=created_at) for m, _ in lengths]
    write_run(results, run_id, rows)
    partial_path.unlink(missing_ok=True)


def rescore_run(results: str | Path, run_id: str, *, samples: int | None = None, max_multiplier: int | None = None,
                device: str = "auto", progress: bool = True,
                log: Callable[[str], None] | None = None, log_samples: bool = False) -> pd.DataFrame:
    """Score the trained model of run ``run_id`` again, with ``samples`` per length and/or up to
    ``max_multiplier``, as a run of its own in the same store.

    Its configuration is the source's with those fields changed and ``rescored_from = run_id`` (so its run id
    differs from that of a run trained with the same fields); its training fields in the rows (steps, seconds,
    best step) are the source's. Nothing is trained. An interrupted rescoring resumes at the next length; a
    finished one is returned as stored. E.g. the papers' 1,000 samples per length for a run scored on 200."""
    results = Path(results)
    if samples is None and max_multiplier is None:
        raise UsageError("nothing to rescore: give --samples, --max-multiplier or both")
    saved = trained_checkpoint(results, run_id, "cpu",
                                hint=" (a rescored run keeps none: rescore the run it was rescored from)")
    source = RunConfig.from_dict(saved_config(saved["config"]))
    state = saved.get("state") or {}
    source_path = checkpoint_dir(results, run_id) / "model.pt"
    with checkpoint_contents(source_path, RETRAIN):
        finished = bool(state) and int(state.get("step", 0)) >= source.train_steps
    if not finished:
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
    load_weights(model, saved["model"], source_path, RETRAIN)
    model = model.to(torch_device).eval()
    ckpt_dir = checkpoint_dir(results, config.run_id)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "config.json").write_text(json.dumps(config.identity(), indent=2, sort_keys=True))
    with checkpoint_contents(source_path, RETRAIN):
        common = dict(train_steps=int(state["step"]), train_seconds=round(float(state.get("train_seconds", 0.0)), 3),
                      best_step=int(state.get("best_step", state["step"])), train_gpu_share=_share(state.get("gpu_share")))
    _score_and_store(config, task, model, torch_device, results, lengths, common, progress, log, log_samples)
    return pd.read_parquet(run_path(results, config.run_id))


__all__ = [
    "BleuTally",
    "COMPILE_CACHE_ENV",
    "DENSE_TRAIN_MAX_TOKENS",
    "Evaluator",
    "Scores",
    "TrainState",
    "Trainer",
    "VOCAB_PARAMETERS",
    "atomic_torch_save",
    "attention_kernels",
    "autocast",
    "build_model",
    "cell_finished",
    "checkpoint_dir",
    "compile_cache_file",
    "compiles",
    "device_description",
    "git_sha",
    "learning_rate",
    "load_compile_cache",
    "load_model",
    "load_results",
    "model_dispatches_to_kernels",
    "newest_trained_run",
    "rescore_run",
    "resolve_device",
    "run_cell",
    "run_finished",
    "run_status",
    "save_compile_cache",
    "to_device",
    "trains_dense",
    "warm_start",
]
