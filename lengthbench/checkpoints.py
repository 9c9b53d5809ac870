"""A run's checkpoint folder: its training state, its selected model, warm starts from another run, and
where an interrupted run stands."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pandas as pd
import torch
from pyarrow import ArrowException

from lengthbench.config import RunConfig
from lengthbench.errors import UsageError
from lengthbench.models.decoder import Decoder, ModelConfig
from lengthbench.plugins import check_loaded
from lengthbench.store import atomic_write, run_finished, run_path, saved_config
from lengthbench.tasks import eval_lengths, get_task


def checkpoint_dir(results: str | Path, run_id: str) -> Path:
    return Path(results) / "checkpoints" / run_id


def atomic_torch_save(obj, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


# What to do about an unreadable checkpoint, by what the command wanted from it.
RESTART = "delete it, or pass --restart, to train the run from the start"
RETRAIN = "the run's trained model is lost: train the run again (`lengthbench run` with its options and --restart)"


def read_checkpoint(path: Path, device, remedy: str) -> dict:
    """The saved dict of ``train.pt`` or ``model.pt``; a truncated, corrupt or foreign file is a one-line
    :class:`UsageError` naming it, why, and ``remedy`` (what the user can do: :data:`RESTART`, :data:`RETRAIN`)."""
    try:
        saved = torch.load(path, map_location=device, weights_only=False)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as error:  # a truncated zip (RuntimeError), a file of other bytes (UnpicklingError), ...
        text = str(error).strip().splitlines()[0].split(". ")[0] if str(error).strip() else ""
        reason = f"{type(error).__name__}: {text}" if text else type(error).__name__  # (torch's zip errors run on)
        raise UsageError(f"checkpoint {path} is unreadable ({reason}): {remedy}") from error
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) \
            or not isinstance(saved.get("config"), dict):
        raise UsageError(f"checkpoint {path} is not a lengthbench checkpoint (no model and config): {remedy}")
    if not isinstance(saved.get("state", {}), dict):
        raise UsageError(f"checkpoint {path} is not a lengthbench checkpoint (its training state is not a table): "
                         f"{remedy}")
    from lengthbench.validation import check_overrides, field, field_types

    try:  # the configuration that the weights were trained with: every field there of its type and range
        config = saved_config(saved["config"])
        unnamed = [key for key in ("task", "attn", "pe") if not isinstance(config.get(key), str)]
        if unnamed:
            raise UsageError(f"it names no {', '.join(unnamed)}")
        types = field_types()
        check_overrides({key: value for key, value in config.items() if key in types}, field)
        RunConfig.from_dict(config)
    except (UsageError, TypeError, ValueError) as error:
        raise UsageError(f"checkpoint {path} holds no usable run configuration ({str(error).splitlines()[0]}): "
                         f"{remedy}") from error
    return saved


def load_weights(model: torch.nn.Module, weights: dict, path: Path, remedy: str) -> None:
    """``model.load_state_dict(weights)`` for the weights of checkpoint ``path``; weights of another model (tensors
    missing, left over or of other shapes) are a one-line :class:`UsageError` naming the file and ``remedy``."""
    mine = model.state_dict()
    missing = [key for key in mine if key not in weights]
    extra = [key for key in weights if key not in mine]
    shapes = [key for key in mine if key in weights and getattr(weights[key], "shape", None) != mine[key].shape]
    for words, keys in (("lack", missing), ("have other shapes for", shapes), ("have the foreign tensors", extra)):
        if keys:
            more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
            raise UsageError(f"checkpoint {path} does not hold this run's model (its weights {words} {keys[0]}{more}): "
                             f"{remedy}")
    model.load_state_dict(weights)


@contextlib.contextmanager
def checkpoint_contents(path: Path, remedy: str):
    """Around what reads the parts of checkpoint ``path`` (the optimizer's state, the training state): a part
    missing or of another form is a one-line :class:`UsageError` naming the file and ``remedy``."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        reason = f"{type(error).__name__}: {text}" if text else type(error).__name__
        raise UsageError(f"checkpoint {path} does not hold what lengthbench wrote there ({reason}): {remedy}") \
            from error


def build_model(config: RunConfig, task) -> Decoder:
    return Decoder(ModelConfig(
        vocab_size=task.vocab_size, d_model=config.d_model, n_layers=config.n_layers, n_heads=config.n_heads,
        ffn=config.ffn, attn=config.attn, pe=config.pe, attn_params=dict(config.attn_params),
        pe_params=dict(config.pe_params), has_features=task.has_features, init=config.init, arch=config.arch,
    ))


def scored_rows(results: str | Path, run_id: str) -> list[dict]:
    """The rows of the lengths that an unfinished scoring of ``run_id`` wrote so far (``eval_rows.json``; none
    where it has not started); OSError or ValueError where the file is unreadable."""
    path = checkpoint_dir(results, run_id) / "eval_rows.json"
    return json.loads(path.read_text()) if path.exists() else []


def cell_finished(results: str | Path, config: RunConfig) -> bool:
    """Whether run ``config`` and the runs of its other selections (``also_select``) are all in the store."""
    return all(run_finished(results, run.run_id) for run in (config, *config.selected_runs()))


def run_status(results: str | Path, config: RunConfig) -> str:
    """Where run ``config`` stands in ``results``, in words (``lengthbench sweep --dry-run``): "in the store",
    "to run", or what an interrupted run resumes from: its training checkpoint, its trained model, the lengths
    already scored and the samples of the length it was scoring."""
    if run_finished(results, config.run_id):
        left = [other for other in config.selected_runs() if not run_finished(results, other.run_id)]
        if not left:
            return "in the store"
        return "to resume: selection " + ", ".join(
            f"{other.selection} {run_status(results, other).removeprefix('to resume: ')}" for other in left)
    folder = checkpoint_dir(results, config.run_id)
    rows_path, samples_path = folder / "eval_rows.json", folder / "eval_samples_partial.json"
    if rows_path.exists() or samples_path.exists():
        try:
            scored = scored_rows(results, config.run_id)
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
    weights = read_checkpoint(path, device, f"--init-from {run_id} needs that run trained again")["model"]
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


def trained_checkpoint(results: str | Path, run_id: str, device, hint: str = "") -> dict:
    """The saved ``model.pt`` of a trained run (config, selected weights, training state), or a one-line
    :class:`UsageError` naming the runs of ``results`` that have one, or the plugin to load where the run's task,
    mechanism or encoding is not registered."""
    path = checkpoint_dir(results, run_id) / "model.pt"
    if not path.exists():
        known = sorted(p.parent.name for p in (Path(results) / "checkpoints").glob("*/model.pt"))
        raise UsageError(f"no trained model for run {run_id!r} in {results}{hint}"
                         + (f"; runs with a model: {', '.join(known)}" if known else ""))
    saved = read_checkpoint(path, device, RETRAIN)
    check_loaded(RunConfig.from_dict(saved_config(saved["config"])), _plugins(results, run_id, saved), run_id)
    return saved


def _plugins(results: str | Path, run_id: str, saved: dict) -> list[str]:
    """The plugins a run recorded: in its ``model.pt``, else in its rows in the store."""
    if saved.get("plugins") is not None:
        return list(saved["plugins"])
    path = run_path(results, run_id)
    try:
        column = pd.read_parquet(path, columns=["plugins"])["plugins"] if path.exists() else []
    except (OSError, ValueError, KeyError, ArrowException):  # an unreadable file, rows stored without the column
        column = []
    recorded = next((value for value in column if isinstance(value, str)), "")
    return [plugin for plugin in recorded.split(",") if plugin]


def load_model(results: str | Path, run_id: str, device: str = "cpu"):
    """``(model, task, config)`` of a trained run (its selected checkpoint), for inspection."""
    saved = trained_checkpoint(results, run_id, device)
    config = RunConfig.from_dict(saved_config(saved["config"]))
    task = get_task(config.task, **config.task_params)
    model = build_model(config, task)
    load_weights(model, saved["model"], checkpoint_dir(results, run_id) / "model.pt", RETRAIN)
    return model.to(device).eval(), task, config


def newest_trained_run(results: str | Path, task: str, attn: str, pe: str) -> str:
    """The run id of the newest run of ``task:attn:pe`` in ``results`` that kept its model (``model.pt``)."""
    found = []
    for path in (Path(results) / "checkpoints").glob("*/model.pt"):
        try:
            config = saved_config(read_checkpoint(path, "cpu", RETRAIN)["config"])
        except UsageError:  # an unreadable model is not the one asked for
            continue
        if (config.get("task"), config.get("attn"), config.get("pe")) == (task, attn, pe):
            found.append((path.stat().st_mtime, path.parent.name))
    if not found:
        raise UsageError(f"no trained {task}:{attn}:{pe} model in {results}/checkpoints")
    return max(found)[1]
