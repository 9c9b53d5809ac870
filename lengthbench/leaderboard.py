"""The leaderboard: the papers' tables, built from the results store.

Per task (and preset, training protocol and training length, so that runs of different protocols never
share a table; the protocol is the training budget of ``config_json`` (samples, batch size, learning rate),
the task parameters that differ from the defaults, and a checkpoint selection, block layout, initialisation or
curriculum other than the default):
a row per attention x encoding, a column per multiplier, values in % of the task's metric (the
``score`` column: exact match, or token accuracy for the classification tasks). A run given mechanism or
encoding parameters has its own row, named with them: ``entmax (alpha=4)``, ``rope (factor=1)``.

Conventions (also printed under every table):

* **best of seeds** follows the papers ("the single best-performing model selected from experiments
  conducted with multiple random seeds"): one whole run is chosen, the one whose curve has the largest
  area under the curve (AUC, below; ties go to the lower seed). Its full curve is shown, not a per-column
  maximum over seeds, so that every row is a model that exists. Where one seed has several runs (say, a
  learning-rate sweep) its best run by the same rule stands for it.
* **mean +- std** is over seeds (each seed's best run), sample standard deviation (ddof=1).
* **reach** is the largest multiplier whose score is at least 90% (0 where none is; it cannot exceed the
  largest multiplier evaluated).
* **AUC** is the area under the score curve against log2(multiplier), trapezoidal over the multipliers
  the run evaluated, divided by their log2 span, so it lies in [0, 1] (a one-point curve: its score).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from lengthbench.config import build_config, params_suffix, selection_words
from lengthbench.errors import UsageError
from lengthbench.store import (
    SCHEMA_VERSION,
    RunFileError,
    StoreError,
    atomic_write_text,
    load_results,
    runs_dir,
    table_version,
    with_schema_version,
)
from lengthbench.tasks import as_multiplier, multiplier_label

REACH_THRESHOLD = 0.9
# runs in one table share these; ``protocol`` also names the store's schema version of rows written under an
# older one whose tables they do not share, where the store holds rows of both (``schema_label``,
# ``store.table_version``), so those never share a table
TABLE_KEYS = ["task", "preset", "protocol", "train_length"]
ROW_KEYS = ["pe", "attn"]  # the papers' order: encoding, then mechanism
METRIC_NAMES = {"exact_match": "exact match", "token_accuracy": "token accuracy"}


# -- reading the store ----------------------------------------------------------------------------

def load_store(results: str | Path, *, tasks: Iterable[str] | None = None,
               skip_unreadable: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """The rows of a results store with a ``score`` column, and the warnings met on the way.

    Bad input becomes a one-line :class:`UsageError`: a missing folder, a store with no runs, an
    unreadable file (unless ``skip_unreadable``), a task not in the store. Nothing is written.
    """
    if not str(results).strip():
        raise UsageError("--results is empty: give the results folder (e.g. --results runs)")
    path = Path(results)
    if not path.exists():
        raise UsageError(f"results folder {path} does not exist (create it with `lengthbench sweep --results {path} ...`)")
    if not path.is_dir():
        raise UsageError(f"results path {path} is not a folder")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            frame = load_results(path, strict=not skip_unreadable)
        except RunFileError as error:
            first_line = str(error).strip().splitlines()[0]
            raise UsageError(f"{first_line} (the file is left as it is; pass --skip-unreadable to leave "
                             f"{error.part} out)") from error
        except StoreError as error:  # the store itself: its runs/ cannot be listed
            raise UsageError(str(error).strip().splitlines()[0]) from error
    notes = [str(w.message).strip().splitlines()[0] for w in caught]
    if frame.empty:
        raise UsageError(f"no runs in {runs_dir(path)}: the store is empty "
                         f"(fill it with `lengthbench sweep --results {path} ...` or `lengthbench run`)")
    missing = [c for c in ("task", "attn", "pe", "seed", "multiplier") if c not in frame.columns]
    if missing:
        raise UsageError(f"results in {path} lack the columns {', '.join(missing)}; is this a lengthbench store?")
    frame = with_score(frame)
    if tasks:
        wanted = list(dict.fromkeys(_canonical_task(t) for t in tasks))
        present = sorted(frame["task"].unique())
        unknown = [t for t in wanted if t not in present]
        if unknown:
            raise UsageError(f"no runs of task {unknown[0]!r} in {path}; tasks there: {', '.join(present)}")
        frame = frame[frame["task"].isin(wanted)]
    return frame.reset_index(drop=True), notes


def results_list(values: Iterable[str] | str | None, default: str = "runs") -> list[str]:
    """``--results`` given once or repeated, each a folder or a comma-separated list of folders (a name that
    exists as a folder is taken whole, commas and all); the default store where none is given."""
    values = [values] if isinstance(values, str) else list(values or [])
    folders = []
    for value in values:
        value = str(value)
        if not value.strip():
            raise UsageError("--results is empty: give the results folder (e.g. --results runs)")
        parts = [value] if Path(value).is_dir() or "," not in value else [p.strip() for p in value.split(",")]
        if any(not part for part in parts):
            raise UsageError(f"--results {value!r} holds an empty folder name")
        folders += parts
    return list(dict.fromkeys(folders)) or [default]


def load_stores(results: Iterable[str] | str, *, tasks: Iterable[str] | None = None,
                attns: Iterable[str] | None = None, pes: Iterable[str] | None = None,
                skip_unreadable: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """The rows of several stores (:func:`load_store` each), a run stored in more than one counted once, and
    only the mechanisms ``attns`` and encodings ``pes`` where given (by name, ``entmax``, or by the label a row
    with parameters has, ``entmax (alpha=4)``); a filter that matches nothing is a one-line UsageError."""
    frames, notes = [], []
    for folder in results_list(results):
        frame, found = load_store(folder, tasks=tasks, skip_unreadable=skip_unreadable)
        frames.append(frame.assign(store=folder))
        notes += found
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.drop_duplicates(subset=["run_id", "multiplier"], keep="first")
    for column, wanted, flag in (("attn", attns, "--attn"), ("pe", pes, "--pe")):
        wanted = [w for w in (wanted or []) if w]
        if not wanted:
            continue
        keep = frame[column].isin(wanted) | frame[column].str.split(" (", regex=False).str[0].isin(wanted)
        if not keep.any():
            raise UsageError(f"{flag} {', '.join(wanted)}: no runs of it; there: "
                             f"{', '.join(sorted(frame[column].unique()))}")
        frame = frame[keep]
    return frame.reset_index(drop=True), notes


def with_score(frame: pd.DataFrame) -> pd.DataFrame:
    """Fill ``metric``/``score`` where a row lacks them, from the task's registered metric."""
    frame = with_schema_version(frame)
    if "metric" not in frame.columns:
        frame["metric"] = None
    if "score" not in frame.columns:
        frame["score"] = np.nan
    lacking = frame["metric"].isna()
    if lacking.any():
        frame.loc[lacking, "metric"] = frame.loc[lacking, "task"].map(_task_metric)
    lacking = frame["score"].isna()
    if lacking.any():
        for metric in ("exact_match", "token_accuracy"):
            rows = lacking & (frame["metric"] == metric)
            if metric in frame.columns and rows.any():
                frame.loc[rows, "score"] = frame.loc[rows, metric]
    frame["score"] = frame["score"].astype(float)
    for column, default in (("preset", "?"), ("train_length", 64), ("run_id", None)):
        if column not in frame.columns:
            frame[column] = default
    configs = frame["config_json"] if "config_json" in frame.columns else pd.Series("", index=frame.index)
    configs = configs.fillna("")  # (rows written without one)
    parsed = {text: _config(text) for text in configs.unique()}  # (one parse per run, not per row)
    # A curriculum's stages are named by what they trained, from their rows in the same store, so runs of
    # one curriculum share a table whatever their mechanism or seed.
    sources = {run_id: text for run_id, text in zip(frame["run_id"], configs, strict=True) if run_id is not None}
    frame["protocol"] = configs.map({text: protocol_label(text, sources) for text in parsed})
    tables = frame["schema_version"].map(table_version)
    if tables.nunique() > 1:
        frame["protocol"] = [protocol + schema_label(version) for protocol, version
                             in zip(frame["protocol"], tables, strict=True)]
    # Runs of one mechanism (or encoding) with other parameters are other rows: "entmax (alpha=4)".
    for column, key in (("attn", "attn_params"), ("pe", "pe_params")):
        suffixes = configs.map({text: params_suffix(config.get(key)) for text, config in parsed.items()})
        names = frame[column].astype(str)
        frame[column] = [name if name.endswith(suffix) else name + suffix  # (once: this runs on loaded frames too)
                         for name, suffix in zip(names, suffixes, strict=True)]
    if frame["run_id"].isna().any():
        synthetic = frame[["task", "attn", "pe", "preset", "seed"]].astype(str).agg("-".join, axis=1)
        frame["run_id"] = frame["run_id"].fillna(synthetic)
    return frame


def schema_label(version: int) -> str:
    """What the protocol of a row written under an older schema of the store says: ``", results schema 1"``
    (``""`` for the current one)."""
    return "" if int(version) == SCHEMA_VERSION else f", results schema {int(version)}"


def _config(config_json) -> dict:
    """A run's ``config_json`` as a dict (empty where missing or unreadable)."""
    try:
        config = json.loads(config_json) if isinstance(config_json, str) and config_json else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


MODEL_FIELDS = ("n_layers", "d_model", "n_heads", "ffn")


def _model_label(config: dict) -> str:
    """``", model 4 x d 512, 16 heads, FFN 1024"`` where a run's model is not its preset's for the task (an
    override); ``""`` where it is, or where that cannot be told (an unknown task, mechanism or preset)."""
    if not all(key in config for key in ("task", "attn", "pe", "preset", *MODEL_FIELDS)):
        return ""
    try:
        usual = build_config(config["task"], config["attn"], config["pe"], config["preset"],
                             task_params=config.get("task_params") or None)
    except (LookupError, ValueError, TypeError):  # a plugin's name, a preset of another version
        return ""
    if all(config[key] == getattr(usual, key) for key in MODEL_FIELDS):
        return ""
    return (f", model {config['n_layers']} x d {config['d_model']}, {config['n_heads']} heads, "
            f"FFN {config['ffn']}")


def _amount(samples: int) -> str:
    return f"{samples / 1e6:g}M" if samples >= 100_000 else f"{samples:,}"


def _stage_label(config: dict, final: dict) -> str:
    """One earlier stage of a curriculum: ``"mqrar (layout=inline) at n 16, 1.28M samples, init torch"``;
    its batch, learning rate, warm-up and mechanism parameters are named only where they differ from the final
    stage's."""
    params = config.get("task_params") or {}
    label = config.get("task", "?") + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"
                                        if params else "")
    label += f" at n {config.get('train_length', '?')}, {_amount(config.get('train_samples', 0))} samples"
    for key, shown in (("batch_size", "batch {:g}"), ("lr", "lr {:g}"), ("warmup_steps", "warm-up {:,} steps")):
        if key in config and config[key] != final.get(key):
            label += ", " + shown.format(config[key])
    attn_params = config.get("attn_params") or {}
    if attn_params != (final.get("attn_params") or {}):  # e.g. a wider Sieve filter in an early stage
        label += ", " + config.get("attn", "?") + " (" + ", ".join(f"{k}={v}" for k, v in sorted(attn_params.items())) + ")"
    init = config.get("init", "normal-0.02")
    return label if init == "normal-0.02" else f"{label}, init {init}"


def protocol_label(config_json, sources: dict[str, str] | None = None) -> str:
    """The training budget of a run, e.g. ``"8M samples, batch 512, lr 0.001"`` ("" where unknown).

    A run started from another's weights (``init_from``) names the stages before it, ``", after mqrar
    (layout=inline) at n 16, 1.28M samples -> mqrar at n 16, 0.64M samples"``, where ``sources`` (run id ->
    its ``config_json``) has them; else the run id it started from. A run whose trained model was scored again
    (``rescored_from``, ``lengthbench rescore``) says so, with its samples per length; a run scored on another
    count than its preset's says ``", scored on N samples per length"``."""
    config = _config(config_json)
    if not all(key in config for key in ("train_samples", "batch_size", "lr")):
        return ""
    label = f"{_amount(config['train_samples'])} samples, batch {config['batch_size']}, lr {config['lr']:g}"
    params = config.get("task_params") or {}
    label += "".join(f", {key}={value}" for key, value in sorted(params.items()))
    label += _model_label(config)
    label += _warmup_label(config)
    # the papers' checkpoint selection (8x) and another block layout are protocols of their own; the defaults (also
    # of rows stored before the fields) go unnamed
    if words := selection_words(config.get("selection", "id"), config.get("selection_metric", "task")):
        label += f", selection {words}"
    if config.get("arch", "prenorm") != "prenorm":
        label += f", arch {config['arch']}"
    # the default init (also that of rows stored before the field existed) goes unnamed
    init = config.get("init", "normal-0.02")
    label = label if init == "normal-0.02" else f"{label}, init {init}"
    if config.get("rescored_from"):  # its trained model scored again (lengthbench rescore): a table of its own
        samples = config.get("eval_samples")
        label += f", rescored on {samples:,} samples per length" if isinstance(samples, int) else ", rescored"
    else:
        label += _scoring_label(config)
    if not config.get("init_from"):
        return label
    def carried(stage: dict) -> str:  # what a stage took from the one before it
        return " (all but the embedding and output layer)" if stage.get("init_part", "all") == "body" else ""

    stages, current, seen = [], config, set()
    while current.get("init_from") in (sources or {}) and current["init_from"] not in seen:
        seen.add(current["init_from"])
        source = _config(sources[current["init_from"]])
        stages.insert(0, _stage_label(source, config) + carried(current))
        current = source
    if current.get("init_from"):  # a stage whose source is not in this store
        stages.insert(0, current["init_from"] + carried(current))
        return f"{label}, from " + " -> ".join(stages)
    return f"{label}, after " + " -> ".join(stages)


def _scoring_label(config: dict) -> str:
    """", scored on N samples per length" where a run was scored on another count than its preset's (``paper``
    1,000, ``quick`` 200): runs scored on other counts stand in tables of their own, since the best of seeds
    would otherwise pick between two scorings of one model; "" for the preset's count and rows without it."""
    from lengthbench.config import PRESETS

    samples = config.get("eval_samples")
    default = PRESETS.get(config.get("preset"), {}).get("eval_samples")
    if not isinstance(samples, int) or default is None or samples == default:
        return ""
    return f", scored on {samples:,} samples per length"


def _warmup_label(config: dict) -> str:
    """", warm-up N steps" where a run's warm-up is not its preset's; "" otherwise, and for rows without the
    fields."""
    from lengthbench.config import preset_warmup

    steps = config.get("warmup_steps")
    if steps is None or "train_samples" not in config or "batch_size" not in config:
        return ""
    default = preset_warmup(config.get("preset"), config["train_samples"], config["batch_size"])
    return "" if default is None or steps == default else f", warm-up {steps:,} steps"


def _canonical_task(task: str) -> str:
    from lengthbench.tasks import TASKS

    return TASKS.canonical(task) if task in TASKS else task


def _task_metric(task: str) -> str:
    try:
        from lengthbench.tasks import TASKS

        return TASKS.get(task).metric
    except Exception:  # a task of a plugin not loaded now: the common metric
        return "exact_match"


# -- curves and their summaries -------------------------------------------------------------------

def reach(curve: pd.Series, threshold: float = REACH_THRESHOLD) -> int | float:
    """The largest multiplier (the index) with a score of at least ``threshold``; 0 if none."""
    good = curve.dropna()
    good = good[good >= threshold - 1e-12]
    return as_multiplier(max(good.index)) if len(good) else 0


def auc(curve: pd.Series) -> float:
    """Area under the score curve against log2(multiplier), over its own span, in [0, 1]."""
    points = curve.dropna().sort_index()
    if points.empty:
        return float("nan")
    if len(points) == 1:
        return float(points.iloc[0])
    x = np.log2(points.index.to_numpy(dtype=float))
    y = points.to_numpy(dtype=float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def run_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its keys, its curve (a column per multiplier, fractions), reach and AUC."""
    frame = frame.sort_values("created_at") if "created_at" in frame.columns else frame
    frame = frame.drop_duplicates(subset=["run_id", "multiplier"], keep="last")
    keys = TABLE_KEYS + ["metric"] + ROW_KEYS + ["seed", "run_id"]
    # groupby keeps rows whose keys hold NaN; pivot_table(dropna=False) would instead build the cartesian
    # product of every key's values, which grows with every new protocol (24 GB at 164 runs).
    curves = frame.groupby(keys + ["multiplier"], sort=True, dropna=False)["score"].last().unstack("multiplier")
    curves = curves.dropna(how="all")
    curves.columns = [as_multiplier(m) for m in curves.columns]  # (a float index where any is 1.5)
    curves = curves[sorted(curves.columns)]
    summary = pd.DataFrame(index=curves.index)
    summary["reach"] = [reach(row) for _, row in curves.iterrows()]
    summary["auc"] = [auc(row) for _, row in curves.iterrows()]
    return pd.concat([curves, summary], axis=1).reset_index()


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(score: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a proportion ``score`` measured on ``n`` samples, as
    ``(low, high)`` fractions; NaN where ``n`` is missing or 0. It stays inside [0, 1] and is not empty at 0 or 1
    (0 of 1,000: [0, 0.38%]), where the normal approximation's is."""
    if n is None or not n > 0 or score is None or math.isnan(score):
        return float("nan"), float("nan")
    denominator = 1 + z * z / n
    centre = (score + z * z / (2 * n)) / denominator
    half = z * math.sqrt(score * (1 - score) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _multipliers(frame: pd.DataFrame) -> list[int | float]:
    return sorted(c for c in frame.columns if isinstance(c, (int, float)))


def _pick_best(runs: pd.DataFrame) -> pd.Series:
    """The best run: largest AUC, then the lower seed, then the run id (deterministic)."""
    ranked = runs.assign(_auc=runs["auc"].fillna(-1.0)).sort_values(
        ["_auc", "seed", "run_id"], ascending=[False, True, True])
    return ranked.iloc[0].drop("_auc")


def build_leaderboard(frame: pd.DataFrame, protocol: str | None = None) -> pd.DataFrame:
    """The leaderboard as one wide frame: a row per (task, preset, train_length, pe, attn).

    Columns: the keys, ``metric``, ``seeds`` (how many), ``best_seed``, ``best_run_id``; per multiplier
    ``m``: ``"{m}x"`` (the best run's score, %), ``"{m}x_n"`` (its samples), ``"{m}x_lo"`` and ``"{m}x_hi"`` (its
    95% Wilson interval, %), ``"{m}x_mean"`` and ``"{m}x_std"`` (over seeds, %);
    ``reach`` and ``auc`` of the best run; ``reach_mean``, ``auc_mean``, ``auc_std`` over seeds. ``protocol``
    puts every run in one protocol (a published section's runs: one config's, which the caller matched)."""
    scored = with_score(frame)
    if protocol is not None:
        scored["protocol"] = protocol
    curves = run_curves(scored)
    samples = ({(run_id, as_multiplier(m)): n for run_id, m, n in
                zip(scored["run_id"], scored["multiplier"], scored["n_samples"], strict=True)}
               if "n_samples" in scored.columns else {})
    multipliers = _multipliers(curves)
    rows = []
    for keys, group in curves.groupby(TABLE_KEYS + ["metric"] + ROW_KEYS, sort=True, dropna=False):
        per_seed = pd.DataFrame([_pick_best(runs) for _, runs in group.groupby("seed", sort=True)])
        best = _pick_best(per_seed)
        row = dict(zip(TABLE_KEYS + ["metric"] + ROW_KEYS, keys, strict=True))
        row.update(seeds=len(per_seed), best_seed=int(best["seed"]), best_run_id=str(best["run_id"]))
        for m in multipliers:  # columns may be floats (1.0, 1.5): name them "1x", "1.5x"
            label = multiplier_label(m)
            row[f"{label}x"] = 100 * best[m]
            n = samples.get((best["run_id"], m))
            low, high = wilson(float(best[m]), float(n) if n is not None and pd.notna(n) else float("nan"))
            row[f"{label}x_n"], row[f"{label}x_lo"], row[f"{label}x_hi"] = n, 100 * low, 100 * high
        row.update(reach=as_multiplier(best["reach"]), auc=float(best["auc"]))
        row.update(reach_mean=float(per_seed["reach"].mean()), auc_mean=float(per_seed["auc"].mean()),
                   auc_std=float(per_seed["auc"].std(ddof=1)) if len(per_seed) > 1 else float("nan"))
        for m in multipliers:
            values, label = per_seed[m].astype(float), multiplier_label(m)
            row[f"{label}x_mean"] = 100 * values.mean()
            row[f"{label}x_std"] = 100 * values.std(ddof=1) if values.notna().sum() > 1 else float("nan")
        rows.append(row)
    board = pd.DataFrame(rows)
    board["train_length"] = board["train_length"].astype(int)
    return board


def interval_text(row, label: str) -> str:
    """``"99.1 (98.3-99.5)"``: a best-of-seeds value with its 95% Wilson interval (``"–"`` where none)."""
    value = row.get(f"{label}x")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    low, high = row.get(f"{label}x_lo"), row.get(f"{label}x_hi")
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return _pct(value)
    return f"{value:.1f} ({low:.1f}–{high:.1f})"


def board_multipliers(board: pd.DataFrame) -> list[int | float]:
    """The multipliers that have a value somewhere in ``board`` (a slice of the leaderboard)."""
    found = []
    for column in board.columns:
        if column.endswith("x") and column[:-1].replace(".", "", 1).isdigit() and board[column].notna().any():
            found.append(as_multiplier(column[:-1]))
    return sorted(found)


# -- rendering ------------------------------------------------------------------------------------

def _pct(value: float) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def _reach_text(value: float) -> str:
    return "–" if not value or math.isnan(value) else f"{multiplier_label(value)}×"


def _reach_mean_text(value: float) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:,.0f}×" if value >= 100 else f"{value:.3g}×"  # 1,024×, not 1.02e+03×


def _md_table(header: list[str], rows: list[list[str]], align: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else ":---" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def frame_markdown(frame: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """Any frame as a Markdown table (numbers right-aligned, floats as ``floatfmt``, missing values empty),
    without pandas' optional ``tabulate``: the benchmark scripts write their tables with it."""
    def cell(value) -> str:
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return ""
        if isinstance(value, float | np.floating):
            return format(value, floatfmt)
        return str(value)

    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]
    rows = [[cell(v) for v in row] for row in frame.itertuples(index=False, name=None)]
    return _md_table([str(c) for c in frame.columns], rows, ["r" if n else "l" for n in numeric])


class TextTable(NamedTuple):
    """A table as text, for the Markdown and the HTML report alike: the line above it, the header, the rows
    (Markdown inline text: ``**bold**``) and each column's alignment (``"l"`` or ``"r"``)."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    align: list[str]

    def markdown(self) -> str:
        return _md_table(self.header, self.rows, self.align)


ALL_NOTE = (
    "Values are in % of the metric each section names. **Best of seeds**: the whole curve of the run with the largest AUC "
    "(ties: lower seed), the papers' convention of reporting the single best model, each value with its 95% "
    "Wilson interval over the samples scored; bold marks the best value of a column. **Reach**: the largest "
    "multiplier scoring at least 90% (– if none). **AUC**: area under the score curve against log2(multiplier), "
    "normalised to [0, 1]. **Mean ± std**: over seeds (sample std; one seed: the mean alone).")


def protocol_note(table: pd.DataFrame) -> str:
    """The line under a protocol's heading: its metric, preset, protocol and training length."""
    preset, protocol, train_length = (table[key].iloc[0] for key in TABLE_KEYS[1:])
    metric = METRIC_NAMES.get(table["metric"].iloc[0], str(table["metric"].iloc[0]))
    return (f"{metric} (%), preset `{preset}`" + (f" ({protocol})" if protocol else "")
            + f", trained at n = {train_length}; 1× is in distribution.")


def protocol_tables(table: pd.DataFrame) -> list[TextTable]:
    """The tables of one protocol's rows (one group of ``TABLE_KEYS``): best of seeds, the best value of each
    column in bold, then mean +- std where a row has several seeds."""
    table = table.sort_values(ROW_KEYS)
    multipliers = board_multipliers(table)
    header = ["pe", "attn"] + [f"{m}×" for m in multipliers]
    best_of_column = {m: table[f"{m}x"].max() for m in multipliers}
    best_auc = table["auc"].max()
    rows = []
    for _, row in table.iterrows():
        cells = [str(row["pe"]), str(row["attn"])]
        for m in multipliers:
            text = interval_text(row, multiplier_label(m))
            if (text != "–" and len(table) > 1 and best_of_column[m] > 0
                    and row[f"{m}x"] >= best_of_column[m] - 1e-9):
                text = f"**{text}**"
            cells.append(text)
        auc_text = f"{row['auc']:.3f}"
        if len(table) > 1 and best_auc > 0 and row["auc"] >= best_auc - 1e-12:
            auc_text = f"**{auc_text}**"
        cells += [_reach_text(row["reach"]), auc_text, f"{row['seeds']} (best: {row['best_seed']})"]
        rows.append(cells)
    tables = [TextTable("Best of seeds:", header + ["reach", "AUC", "seeds"], rows,
                        ["l", "l"] + ["r"] * (len(multipliers) + 3))]
    if table["seeds"].max() <= 1:
        return tables
    rows = []
    for _, row in table.iterrows():
        cells = [str(row["pe"]), str(row["attn"])]
        for m in multipliers:
            mean, std = row[f"{m}x_mean"], row[f"{m}x_std"]
            cells.append(_pct(mean) if math.isnan(std) else f"{mean:.1f} ± {std:.1f}")
        auc_text = (f"{row['auc_mean']:.3f}" if math.isnan(row["auc_std"])
                    else f"{row['auc_mean']:.3f} ± {row['auc_std']:.3f}")
        cells += [_reach_mean_text(row["reach_mean"]), auc_text]
        rows.append(cells)
    return tables + [TextTable("Mean ± std over seeds:", header + ["reach (mean)", "AUC"], rows,
                               ["l", "l"] + ["r"] * (len(multipliers) + 2))]


def to_markdown(board: pd.DataFrame, *, source: str | None = None) -> str:
    """The leaderboard as Markdown: per table (task, preset, n) the best-of-seeds table, with the
    best value of each column in bold, then the mean +- std table."""
    parts = ["# lengthbench leaderboard", ""]
    if source:
        parts += [source, ""]
    parts += [ALL_NOTE, ""]
    for (task, *_), table in board.groupby(TABLE_KEYS, sort=True):
        parts += [f"## {task}", "", protocol_note(table), ""]
        tables = protocol_tables(table)
        for text_table in tables:
            parts += [text_table.caption, "", text_table.markdown(), ""]
        if len(tables) == 1:
            parts += ["One seed per row: no mean ± std.", ""]
    return "\n".join(parts).rstrip() + "\n"


def write_leaderboard(board: pd.DataFrame, fmt: str, out: Path | None, *, source: str | None = None) -> str | None:
    """Write ``board`` as ``markdown``, ``csv`` or ``parquet`` to ``out`` (atomically), or return the
    text (markdown, csv) when ``out`` is None."""
    from lengthbench.store import atomic_write_parquet

    if fmt == "parquet":
        if out is None:
            raise UsageError("--format parquet needs --out FILE")
        atomic_write_parquet(board, Path(out))
        return None
    text = to_markdown(board, source=source) if fmt == "markdown" else board.to_csv(index=False, float_format="%.4f")
    if out is None:
        return text
    atomic_write_text(Path(out), text)
    return None


FORMATS = ("markdown", "parquet", "csv")
