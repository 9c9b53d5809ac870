"""The regression check: re-run the cells of a baseline and compare their curves point by point.

A baseline is a JSON file (diffable in review, small)::

    {
      "format": "lengthbench-baseline/1",
      "name": "smoke",
      "description": "what it covers",
      "device": "cpu",
      "generated_by": {"lengthbench_version": "0.1.0", "git_sha": "...", "created_at": "..."},
      "cells": [
        {"run_id": "2back-softmax-nape-smoke-s0-...", "task": "2back", "attn": "softmax", "pe": "nape",
         "seed": 0, "metric": "token_accuracy",
         "config": {... the full RunConfig, as RunConfig.to_json() writes it ...},
         "curve": {"1": 0.9538, "2": 0.9481, "4": 0.9443}}
      ]
    }

``curve`` maps each multiplier to the task's metric (the store's ``score``, a fraction). A hand-written
cell may give ``task``, ``attn``, ``pe``, optional ``seed``, ``preset`` and ``overrides`` (RunConfig
fields) instead of ``config``, and no ``curve``; ``lengthbench check --update`` fills in both.

A point *falls* when its new score is below the baseline by more than the tolerance (a fraction: 0.05
is five percentage points); a fall, a point that is gone, or a cell that crashes fails the check
(exit 1). Rises beyond the tolerance are reported as improvements and do not fail it. Runs are
deterministic on CPU for a given configuration, so on CPU every point should come back identical.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lengthbench.config import RunConfig, build_config
from lengthbench.errors import UsageError
from lengthbench.tasks import as_multiplier

BASELINE_FORMAT = "lengthbench-baseline/1"
DEFAULT_TOLERANCE = 0.05
SAME = 5e-6  # baselines store scores to 6 decimals


@dataclass
class Cell:
    """One run of the baseline: its configuration and its recorded curve (empty until ``--update``)."""

    config: RunConfig
    curve: dict[int, float] = field(default_factory=dict)
    metric: str | None = None
    recorded_run_id: str | None = None

    @property
    def label(self) -> str:
        return self.config.cell_name()

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {"run_id": c.run_id, "task": c.task, "attn": c.attn, "pe": c.pe, "seed": c.seed,
                "metric": self.metric, "config": json.loads(c.to_json()),
                "curve": {str(m): round(float(s), 6) for m, s in sorted(self.curve.items())}}


@dataclass
class Baseline:
    path: Path
    cells: list[Cell]
    name: str = ""
    description: str = ""
    device: str = "cpu"


@dataclass
class PointChange:
    label: str
    multiplier: int | float
    baseline: float | None
    new: float | None
    status: str  # same, within, improved, fell, missing, new, error
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("fell", "missing", "error")


@dataclass
class CheckResult:
    changes: list[PointChange]
    cells: list[Cell]  # with the new curves
    seconds: float
    cell_seconds: list[float]

    @property
    def failed(self) -> list[PointChange]:
        return [c for c in self.changes if c.failed]

    @property
    def moved(self) -> list[PointChange]:
        return [c for c in self.changes if c.status != "same"]


# -- reading and writing baselines ----------------------------------------------------------------

def _fail(path: Path, message: str) -> UsageError:
    return UsageError(f"baseline {path}: {message}")


def load_baseline(path: str | Path, *, need_curves: bool = True) -> Baseline:
    """Read and validate a baseline; every problem is a one-line :class:`UsageError` naming the cell."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"baseline {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _fail(path, f"not a readable JSON file ({str(error).splitlines()[0]})") from error
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise _fail(path, 'expected a JSON object with a "cells" list')
    unknown = sorted(set(data) - set(BASELINE_KEYS))
    if unknown:  # (a misspelt key would be ignored, and dropped by --update)
        raise _fail(path, f"unknown key {unknown[0]!r}; a baseline's keys: {', '.join(BASELINE_KEYS)}")
    if data.get("format", BASELINE_FORMAT) != BASELINE_FORMAT:
        raise _fail(path, f"unknown format {data.get('format')!r}; this lengthbench reads {BASELINE_FORMAT!r}")
    if not data["cells"]:
        raise _fail(path, "has no cells")
    cells, seen = [], {}
    for index, raw in enumerate(data["cells"]):
        cell = _parse_cell(path, index, raw, need_curves)
        if cell.config.run_id in seen:
            raise _fail(path, f"cells {seen[cell.config.run_id]} and {index} are the same run ({cell.config.run_id})")
        seen[cell.config.run_id] = index
        cells.append(cell)
    return Baseline(path=path, cells=cells, name=str(data.get("name", path.stem)),
                    description=str(data.get("description", "")), device=str(data.get("device", "cpu")))


CELL_KEYS = ("run_id", "task", "attn", "pe", "seed", "preset", "metric", "config", "overrides", "curve")
BASELINE_KEYS = ("format", "name", "description", "device", "generated_by", "cells")  # as write_baseline writes


def _parse_cell(path: Path, index: int, raw: Any, need_curves: bool) -> Cell:
    """One cell, validated whole: its keys, its configuration (a complete ``config``, or a preset's with
    ``overrides``), and its curve (a score in [0, 1] at each multiplier the cell evaluates)."""
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import POSITIONAL_ENCODINGS
    from lengthbench.models.registry import UnknownNameError
    from lengthbench.sweep import default_train_length
    from lengthbench.tasks import TASKS, eval_lengths, eval_multipliers, get_task
    from lengthbench.validation import (
        check_config,
        check_overrides,
        check_stored_config,
        check_task_params,
        field,
    )

    if not isinstance(raw, dict):
        raise _fail(path, f"cell {index} is not a JSON object")
    unknown = sorted(set(raw) - set(CELL_KEYS))
    if unknown:
        raise _fail(path, f"cell {index}: unknown key {unknown[0]!r}; a cell's keys: {', '.join(CELL_KEYS)}")
    if "config" in raw and not isinstance(raw["config"], dict):
        raise _fail(path, f"cell {index}: \"config\" must be an object of RunConfig fields")
    if "config" in raw and "overrides" in raw:
        raise _fail(path, f"cell {index}: give \"config\" (every field) or \"overrides\" (of a preset), not both")
    source = raw.get("config", raw)
    names = {k: source.get(k) for k in ("task", "attn", "pe")}
    where = f"cell {index} ({names['task']} / {names['attn']} + {names['pe']})"
    for key, value in names.items():
        if value is None:
            raise _fail(path, f"cell {index} has no {key!r}")
        if not isinstance(value, str):
            raise _fail(path, f"cell {index}: {key!r} must be a name, got {value!r}")
    for key in ("run_id", "metric"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise _fail(path, f"{where}: {key!r} must be a string, got {raw[key]!r}")
    try:
        for registry, key in ((TASKS, "task"), (ATTENTION, "attn"), (POSITIONAL_ENCODINGS, "pe")):
            registry.canonical(names[key])
        if "config" in raw:
            check_stored_config(raw["config"], field)
            config = RunConfig.from_dict(raw["config"])
        else:
            overrides = raw.get("overrides") or {}
            if not isinstance(overrides, dict):
                raise ValueError('"overrides" must be an object of RunConfig fields')
            known = set(RunConfig.__dataclass_fields__)
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise ValueError(f"unknown configuration field {unknown[0]!r}")
            check_overrides({**overrides, "seed": raw.get("seed", 0), "preset": raw.get("preset", "smoke")}, field)
            check_task_params(names["task"], overrides.get("task_params") or {})
            config = build_config(names["task"], names["attn"], names["pe"], raw.get("preset", "smoke"),
                                  seed=raw.get("seed", 0), **{**default_train_length(names["task"], overrides),
                                                             **overrides})
        check_config(config, name=field)
        eval_multipliers(config.max_multiplier)
        multipliers = [m for m, _ in eval_lengths(config.train_length, config.max_multiplier,
                                                  get_task(config.task, **config.task_params).extra_multipliers)]
    except (UnknownNameError, ValueError, TypeError) as error:
        message = str(error).strip("'\"") if isinstance(error, UnknownNameError) else str(error)  # (a LookupError)
        raise _fail(path, f"{where}: {message}") from error
    curve_raw = raw.get("curve") or {}
    if not isinstance(curve_raw, dict):
        raise _fail(path, f"{where}: \"curve\" must map multipliers to scores")
    curve = {}
    shown = ", ".join(f'"{m}"' for m in multipliers)
    for key, value in curve_raw.items():
        try:
            multiplier = as_multiplier(float(key))
        except (TypeError, ValueError, OverflowError):  # "x", "inf", "1e400"
            multiplier = None
        if multiplier not in multipliers:
            raise _fail(path, f"{where}: curve key {key!r} is not a multiplier the cell evaluates ({shown})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise _fail(path, f"{where}: the score {value!r} at {key}x is not a fraction in [0, 1]")
        curve[multiplier] = float(value)
    if need_curves and not curve:
        raise _fail(path, f"{where} has no curve yet; record one with `lengthbench check --baseline {path} --update`")
    return Cell(config=config, curve=curve, metric=raw.get("metric"), recorded_run_id=raw.get("run_id"))


def write_baseline(baseline: Baseline, cells: list[Cell]) -> None:
    """Rewrite the baseline file atomically with ``cells`` (their configs and new curves)."""
    from lengthbench import __version__
    from lengthbench.store import atomic_write_text

    try:
        from lengthbench.runner import git_sha

        sha = git_sha()
    except Exception:
        sha = "unknown"
    data = {
        "format": BASELINE_FORMAT,
        "name": baseline.name,
        "description": baseline.description,
        "device": baseline.device,
        "generated_by": {"lengthbench_version": __version__, "git_sha": sha,
                         "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "cells": [cell.to_json() for cell in cells],
    }
    atomic_write_text(baseline.path, json.dumps(data, indent=2) + "\n")


# -- comparing ------------------------------------------------------------------------------------

def compare_curves(label: str, baseline: dict[int, float], new: dict[int, float], tolerance: float) -> list[PointChange]:
    """Every point of both curves with its status (``same``: equal to the 6 decimals a baseline keeps)."""
    changes = []
    for multiplier in sorted(set(baseline) | set(new)):
        old, now = baseline.get(multiplier), new.get(multiplier)
        if old is None:
            status = "new"
        elif now is None or (isinstance(now, float) and math.isnan(now)):
            status = "missing"
        elif now < old - tolerance - SAME:
            status = "fell"
        elif now > old + tolerance + SAME:
            status = "improved"
        elif abs(now - old) > SAME:
            status = "within"
        else:
            status = "same"
        changes.append(PointChange(label, multiplier, old, now, status))
    return changes


def curve_of(frame) -> dict[int | float, float]:
    return {as_multiplier(m): float(s) for m, s in zip(frame["multiplier"], frame["score"], strict=True)}


def run_check(baseline: Baseline, *, tolerance: float = DEFAULT_TOLERANCE, results: str | Path | None = None,
              device: str = "cpu", on_cell: Callable[[int, Cell, float, str | None], None] | None = None,
              run: Callable | None = None) -> CheckResult:
    """Re-run every cell (into ``results``, or a temporary store removed afterwards) and compare."""
    if not 0.0 <= tolerance <= 1.0:
        raise UsageError(f"--tolerance is a fraction in [0, 1], got {tolerance}")
    if run is None:
        from lengthbench.runner import run_cell as run
    scratch = Path(tempfile.mkdtemp(prefix="lengthbench-check-")) if results is None else Path(results)
    started = time.perf_counter()
    changes: list[PointChange] = []
    new_cells: list[Cell] = []
    cell_seconds: list[float] = []
    try:
        for index, cell in enumerate(baseline.cells):
            cell_started = time.perf_counter()
            error = None
            try:
                frame = run(cell.config, scratch, device=device, resume=True, progress=False)
                curve, metric = curve_of(frame), str(frame["metric"].iloc[0])
            except (KeyboardInterrupt, UsageError, OSError):  # (a store that cannot be written is no regression)
                raise
            except Exception as exc:  # a crashing cell is a regression, reported with the others
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                curve, metric = {}, cell.metric
            seconds = time.perf_counter() - cell_started
            cell_seconds.append(seconds)
            if error:
                changes.append(PointChange(cell.label, 0, None, None, "error", detail=error))
            else:
                changes += compare_curves(cell.label, cell.curve, curve, tolerance)
            new_cells.append(Cell(config=cell.config, curve=curve or cell.curve, metric=metric,
                                  recorded_run_id=cell.config.run_id))
            if on_cell:
                on_cell(index, cell, seconds, error)
    finally:
        if results is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return CheckResult(changes=changes, cells=new_cells, seconds=time.perf_counter() - started,
                       cell_seconds=cell_seconds)
