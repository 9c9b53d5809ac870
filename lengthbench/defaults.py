"""What ``lengthbench run`` trains when no ``--preset`` is given, and what a run costs before it starts.

On a CPU the default is the ``smoke`` preset: a tiny model for a minute, which checks the pipeline and learns
little. On a GPU it is the task's **recipe**: a preset, settings and curriculum with which the committed runs
(``results/runs/``, and the studies' ``results/studies/runs/``) learn the task in distribution, in minutes, scored
on 200 samples per length. Where a paper-table config (``configs/``) trains that way the recipe is its training
(the quick preset for most tasks). Copy, Reverse, Sort and MQMTAR have configs that carry out the paper's own
protocol (20M-40M samples, hours a cell) with no run stored yet; their recipes are the shorter settings of the
committed runs that learn them (the quick preset with 3M-4M samples of batch 512; MQMTAR the paper model, 5M
samples at lr 3e-4). MQRAR's is Sieve Attention Table 1's config at a short budget: the task as its authors
generate it (each query answered in place, every recurring key scored), the 4-layer model with PyTorch's
initialisation, 10,000 steps of batch 128, no curriculum: the settings of the study's ``authors-task-init-torch``
runs (``configs/studies/sieve_mqrar_copy_suspects.toml``). A test checks each recipe that names a config against
it, and that most committed runs of every recipe's settings learn. The committed runs of MQMTAR, Local Count and
the Flip-Flops trained those tasks' earlier layouts (the store's schema 1: MQMTAR's random spacing and uniform
values, Local Count's cut runs, Flip-Flop's ``<sep>``); today's layouts have no committed run of these settings
yet.

The cost line gives the runs, steps and samples, and an estimate of the minutes on this device where the
committed runs include runs of the same task, model and batch size on a device of the same name: their median
training samples per second, and their scoring seconds per sample over the same lengths. The line naming the
default says in how many of the committed runs of its settings the task was learned: MQRAR's recipe learns it with
every seed of stick-breaking + NoPE and of softmax + RoPE, not with Sieve as Section 3 of its paper defines it
(alpha 1.5: 71-86 exact match in distribution; docs/reproduction.md, "why MQRAR and Copy do not reproduce").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lengthbench import checkout_path
from lengthbench.config import RunConfig

# The committed stores of the checkout this package runs from, the paper tables' and the studies' (absent in an
# installed wheel: no estimates then)
COMMITTED_RESULTS = (checkout_path("results"), checkout_path("results", "studies"))
DEFAULT_CPU_PRESET = "smoke"
EVAL_SAMPLES = 200  # samples per length of a recipe's scoring (the quick preset's)


@dataclass(frozen=True)
class Recipe:
    """A preset, the RunConfig fields over it, and the curriculum stages (``[[stages]]`` of a sweep file) that
    come before the cell; ``config`` names the paper-table config whose training it is (``""``: none, the
    settings of committed runs)."""

    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    stages: tuple[dict[str, Any], ...] = ()
    config: str = ""

    def describe(self) -> str:
        """``"the paper preset with a 2-stage curriculum"``, and its config where it has one."""
        text = f"the {self.preset} preset"
        if self.stages:
            text += f" with a {len(self.stages)}-stage curriculum"
        elif self.overrides.keys() - {"eval_samples", "max_multiplier"}:
            text += " with " + ", ".join(f"{key.replace('_', ' ')} {_value(value)}"
                                         for key, value in self.overrides.items()
                                         if key not in ("eval_samples", "max_multiplier"))
        return text + (f" (configs/{self.config})" if self.config else "")


def _value(value: Any) -> str:
    """``1,280,000``; ``(layout=inline, score_recurrences=true)`` for a dict of parameters; ``torch``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return "(" + ", ".join(f"{key}={_value(item)}" for key, item in value.items()) + ")"
    return str(value)


def _scored(max_multiplier: int, **training: Any) -> dict[str, Any]:
    return {**training, "eval_samples": EVAL_SAMPLES, "max_multiplier": max_multiplier}


# Sieve Attention, Table 1, MQRAR (configs/sieve_table1_mqrar.toml) at a short budget: its task (Tan et al.'s: each
# query answered in place, every recurring key scored), model and initialisation, 10,000 steps with a 1,000-step
# warm-up, validated every 1,000 steps on 256 samples: the study's authors-task-init-torch runs (results/studies)
_MQRAR = Recipe("paper", _scored(1024, task_params={"layout": "inline", "score_recurrences": True}, init="torch",
                                 train_samples=1_280_000, warmup_steps=1000, val_samples=256, eval_every=1000,
                                 checkpoint_every=1000))

# task -> recipe; "task:pe" where the encoding decides
GPU_RECIPES: dict[str, Recipe] = {
    # Sparse Attention Table 1's tasks: a fraction of the paper's protocol (its configs), which the committed runs of
    # these settings learn in distribution
    "copy": Recipe("quick", _scored(256, train_samples=4_000_000, batch_size=512)),
    "reverse": Recipe("quick", _scored(8, train_samples=3_000_000, batch_size=512)),
    "sort": Recipe("quick", _scored(8, train_samples=3_000_000, batch_size=512)),
    "flipflop-sparse": Recipe("quick", _scored(512), config="sparse_attention_table9_flipflop_sparse.toml"),
    "flipflop-dense": Recipe("quick", _scored(64), config="sparse_attention_table10_flipflop_dense.toml"),
    "localcount": Recipe("quick", _scored(32), config="sparse_attention_table4_localcount.toml"),
    "maxretrieval": Recipe("quick", _scored(256, train_length=16, compile=False),
                           config="sparse_attention_table5_maxretrieval.toml"),
    "mqmtar": Recipe("paper", _scored(1024, train_samples=5_000_000, lr=3e-4)),
    "mqrar": _MQRAR,
    "2back": Recipe("quick", _scored(64), config="sparse_attention_table3_2back.toml"),
    "passkey": Recipe("quick", _scored(64), config="tda_figure3_softpick_table4_passkey.toml"),
}
# tasks without a paper-table config of ours (flipflop-liu, passkey-multi, a plugin's): the quick preset
FALLBACK_RECIPE = Recipe("quick")


def gpu_recipe(task: str, pe: str) -> Recipe:
    """The recipe a GPU run of ``task`` with encoding ``pe`` (canonical names) gets without ``--preset``."""
    return GPU_RECIPES.get(f"{task}:{pe}", GPU_RECIPES.get(task, FALLBACK_RECIPE))


def default_recipe(task: str, pe: str, device_type: str, preset: str | None) -> Recipe:
    """What ``run`` trains: the given ``preset`` as it is; else the task's GPU recipe on CUDA and the smoke preset
    elsewhere."""
    if preset is not None:
        return Recipe(preset)
    if device_type == "cuda":
        return gpu_recipe(task, pe)
    return Recipe(DEFAULT_CPU_PRESET)


# -- cost --------------------------------------------------------------------------------------------------------

_RUN_COLUMNS = ["run_id", "task", "attn", "pe", "device", "train_seconds", "eval_seconds", "multiplier", "n_samples",
                "train_length", "score", "config_json"]
_MODEL_FIELDS = ("n_layers", "d_model", "n_heads", "ffn", "batch_size")
# what else a run's training shares with another of the same protocol, for the count of runs that learned
_TRAINING_FIELDS = ("preset", "train_samples", "lr", "warmup_steps", "selection", "selection_metric", "init",
                    "arch")


def committed_runs(results: Path | tuple[Path, ...] = COMMITTED_RESULTS, task: str | None = None):
    """One row per run of a store or of several (default: the committed ones; with ``task``, the runs whose id
    starts with its name) with what an estimate needs: device, task, training length, task parameters as stored, model and batch,
    training samples per second, and scoring seconds per sample by multiplier (``eval_per_sample``: {multiplier:
    seconds}); and, read in today's terms (schema-1 rows with the defaults they ran), the mechanism, the task
    parameters and the training fields, ``staged`` (trained after a curriculum) and ``learned`` (at least 90% in
    distribution). Empty where the store is absent or unreadable; rescored runs (no training) are left out."""
    import pandas as pd

    from lengthbench.store import with_schema_version

    stores = (results,) if isinstance(results, (str, Path)) else results
    files = [path for store in stores
             for path in sorted((Path(store) / "runs").glob(f"{task}-*.parquet" if task else "*.parquet"))]
    frames = []
    for path in files:
        try:
            frame = pd.read_parquet(path)
            frames.append(frame[_RUN_COLUMNS + (["schema_version"] if "schema_version" in frame else [])])
        except Exception:  # noqa: BLE001 - an unreadable or foreign file gives no estimate, never an error
            continue
    if not frames:
        return pd.DataFrame()
    raw = pd.concat(frames, ignore_index=True)
    today = with_schema_version(raw)
    rows = []
    for (run_id, run), (_, read) in zip(raw.groupby("run_id", sort=False), today.groupby("run_id", sort=False),
                                        strict=True):
        first = run.iloc[0]
        stored, config = json.loads(first["config_json"]), json.loads(read["config_json"].iloc[0])
        seconds = float(first["train_seconds"])
        if config.get("rescored_from") or not seconds > 0:
            continue
        ones = read.loc[read["multiplier"] == 1, "score"]
        try:  # the fields a configuration stored before they existed ran with
            config = dataclasses.asdict(RunConfig.from_dict(config))
        except (TypeError, ValueError):
            continue
        rows.append(dict(
            run_id=run_id, task=first["task"], attn=read["attn"].iloc[0], pe=first["pe"], device=first["device"],
            train_length=int(first["train_length"]),
            task_params=json.dumps(stored.get("task_params", {}), sort_keys=True),
            task_params_today=json.dumps(config.get("task_params", {}), sort_keys=True),
            attn_params=json.dumps(config.get("attn_params", {}), sort_keys=True),
            **{key: config.get(key) for key in _MODEL_FIELDS + _TRAINING_FIELDS},
            staged=bool(config.get("init_from")), learned=bool(len(ones)) and float(ones.iloc[0]) >= 0.9,
            samples_per_s=config.get("train_samples", 0) / seconds,
            eval_per_sample={float(m): float(s) / max(1, int(n)) for m, s, n in
                             zip(run["multiplier"], run["eval_seconds"], run["n_samples"], strict=True)},
        ))
    return pd.DataFrame(rows)


def learned_words(config, runs) -> str:
    """How often the committed runs trained as ``config`` (its task, training length, task parameters, model,
    batch, training fields, curriculum or none) learned the task (at least 90% in distribution), those of its
    mechanism and encoding where there are some: ``"the committed runs of these settings learned it in 4 of 6
    (sieve-alg1 + none)"``; ``""`` where there are none."""
    if runs is None or len(runs) == 0:
        return ""
    same = runs[(runs["task"] == config.task) & (runs["train_length"] == config.train_length)
                & (runs["task_params_today"] == json.dumps(config.task_params, sort_keys=True))
                & (runs["staged"] == bool(config.init_from))]
    for key in _MODEL_FIELDS + _TRAINING_FIELDS:
        same = same[same[key] == getattr(config, key)]
    if same.empty:
        return ""
    params = json.dumps(config.attn_params, sort_keys=True)
    for narrower, which in ((same[(same["attn"] == config.attn) & (same["attn_params"] == params)
                                  & (same["pe"] == config.pe)], f"{config.attn} + {config.pe}"),
                            (same, "any mechanism")):
        if len(narrower):
            return (f"the committed runs of these settings learned it in {int(narrower['learned'].sum())} of "
                    f"{len(narrower)} ({which})")
    return ""


def estimate_seconds(config, device: str, runs) -> float | None:
    """Seconds that ``config`` (a RunConfig) takes on ``device`` (its name, as stored), from ``runs``
    (:func:`committed_runs`) of the same task, training length, model and batch on that device, those of the same
    mechanism and encoding where there are some: the median training rate of the runs with the same task
    parameters for the training; the median scoring seconds per sample of the runs scored over all this run's
    lengths, whatever their task parameters (a layout changes a sample by a few tokens), for the scoring. None
    where either has no such run."""
    import numpy as np

    if runs is None or len(runs) == 0:
        return None
    alike = runs[(runs["device"] == device) & (runs["task"] == config.task)
                 & (runs["train_length"] == config.train_length)]
    for key in _MODEL_FIELDS:
        alike = alike[alike[key] == getattr(config, key)]
    same = alike[alike["task_params"] == json.dumps(config.task_params, sort_keys=True)]
    if same.empty:
        return None
    from lengthbench.tasks import eval_multipliers

    wanted = [float(m) for m in eval_multipliers(config.max_multiplier)]
    alike = alike[[all(m in per_sample for m in wanted) for per_sample in alike["eval_per_sample"]]]
    same, alike = _closest(same, config), _closest(alike, config)
    if alike.empty:
        return None
    scoring = [sum(per_sample[m] for m in wanted) for per_sample in alike["eval_per_sample"]]
    return config.train_samples / float(np.median(same["samples_per_s"])) + config.eval_samples * float(np.median(scoring))


def _closest(runs, config):
    """The runs of ``config``'s mechanism and encoding where there are some, else of its mechanism, else all."""
    for narrower in (runs[(runs["attn"] == config.attn) & (runs["pe"] == config.pe)], runs[runs["attn"] == config.attn]):
        if len(narrower):
            return narrower
    return runs


def usual_device(configs, runs) -> str | None:
    """The device with the most committed runs like the last of ``configs`` (same task, model and batch)."""
    if runs is None or len(runs) == 0:
        return None
    config = configs[-1]
    same = runs[(runs["task"] == config.task) & (runs["train_length"] == config.train_length)]
    for key in _MODEL_FIELDS:
        same = same[same[key] == getattr(config, key)]
    return str(same["device"].value_counts().index[0]) if len(same) else None


def cost_words(configs, device: str | None, runs=None) -> str:
    """``"3 runs (2 curriculum stages, then the cell): 17,500 steps, 2.24M samples; about 11 min on NVIDIA H100
    80GB HBM3 (the committed runs' speed)"``; without the estimate where there is none for ``device``."""
    steps = sum(c.train_steps for c in configs)
    samples = sum(c.train_samples for c in configs)
    what = f"{len(configs)} runs ({len(configs) - 1} curriculum stages, then the cell): " if len(configs) > 1 else ""
    text = f"{what}{steps:,} steps, {_amount(samples)} samples"
    if device is not None and runs is not None:
        estimates = [estimate_seconds(c, device, runs) for c in configs]
        if all(e is not None for e in estimates):
            text += f"; about {_minutes(sum(estimates))} on {device} (the committed runs' speed)"
    return text


def _amount(samples: int) -> str:
    return f"{samples / 1e6:.3g}M" if samples >= 1_000_000 else f"{samples:,}"


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1.5:
        return "1 min"
    if minutes < 90:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h"
