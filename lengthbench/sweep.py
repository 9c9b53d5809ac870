"""Sweeps: every cell of tasks x attns x pes x seeds, resumable, one cell per GPU at a time.

A cell already in the store is skipped (its run id is the hash of its whole configuration, so a changed
setting is a new cell); an interrupted cell continues from its checkpoint. On a machine with several
GPUs each cell runs in a worker process that sees one GPU (``CUDA_VISIBLE_DEVICES``), and its output
goes to ``<results>/logs/<run_id>.log``; on one GPU or CPU the cells run one after another in this
process, each writing the same plain lines (validation points, evaluation lengths) to that log.

Several sweeps over one grid and one store (or cluster workers) share the work: each cell is claimed
before it runs (``<results>/claims/<run_id>.json``, :mod:`lengthbench.claims`), a cell claimed by a live
sweep elsewhere is passed over, and at the end a sweep waits for those ("running elsewhere").

A sweep file (TOML; JSON also works) holds the same settings as the flags, which override it::

    tasks = ["copy", "2back"]
    attns = ["softmax"]
    pes = ["rope", "nape"]
    seeds = [0, 1, 2]
    preset = "smoke"
    results = "runs"

    [overrides]          # RunConfig fields, applied to every cell
    train_samples = 4000

A curriculum: ``[[stages]]`` tables, each the RunConfig fields of one earlier stage over ``[overrides]``
(``task`` too, with its own ``task_params``). Every cell then trains the stages in order, each from the
weights of the one before (``init_from``), and last the cell itself from the last stage::

    [[stages]]           # stage 1 of every cell
    train_length = 16
    task_params = {layout = "inline"}
    [[stages]]           # stage 2, from stage 1; the cell (stage 3) starts from stage 2
    train_length = 16
    attn_params = {alpha = 1.25}   # over the cell's own parameters, for this stage only

A stage starts only when the stage before it is in the store; a failed stage fails the stages after it.

A study of one change at a time: ``[variants.NAME]`` tables, each the RunConfig fields one variant changes over
the cell's own (``task_params``, ``attn_params`` and ``pe_params`` merged key by key), and optionally the
``cells`` it applies to (default: every cell of the file). Every cell runs as given and once more per variant
that applies to it; ``[by_task.NAME]`` tables give one task's cells their fields over ``[overrides]`` (a budget
per task, say), as ``[by_pe.NAME]`` does for an encoding. Both need a ``cells`` list::

    cells = ["mqrar:stickbreaking:none", "copy:stickbreaking:none"]
    [by_task.copy]
    train_samples = 2000000
    [variants.inline]    # mqrar:stickbreaking:none once more, each query answered in place
    cells = ["mqrar:stickbreaking:none"]
    task_params = {layout = "inline"}
    [variants.init-torch]    # both cells once more, with PyTorch's initialisation
    init = "torch"
"""

from __future__ import annotations

import _thread
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lengthbench.config import RunConfig, build_config
from lengthbench.errors import UsageError, interrupted
from lengthbench.validation import MAX_CELLS, check_config, check_task_params

SWEEP_KEYS = ("tasks", "attns", "pes", "cells", "seeds", "preset", "results", "device", "per_gpu", "mps", "budget",
              "fill", "budget_fraction", "paper", "table", "explained", "overrides", "by_pe", "by_task", "variants", "stages")
PARAM_FIELDS = ("task_params", "attn_params", "pe_params")  # merged key by key where a variant or task table sets them
# What a stage may not set: the cell's identity, and the chain itself.
STAGE_FIXED = ("attn", "pe", "seed", "preset", "init_from")


def split_list(text: str | Iterable | None, name: str = "the list") -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]``; a list passes through (as strings); None and "" are no items. An empty
    item (``"copy,,2back"``, a comma at an end) is a :class:`UsageError` naming ``name`` (the option)."""
    if text is None or text == "":
        return []
    # commas inside brackets belong to a cell's parameters: "mqrar:entmax(alpha=4, k=2):none,copy:softmax:rope"
    items = re.split(r",(?![^()]*\))", text) if isinstance(text, str) else [str(x) for x in text]
    items = [item.strip() for item in items]
    if not all(items):
        raise UsageError(f"{name} {text!r} has an empty item (two commas in a row, or one at an end)")
    return items


def parse_seeds(text: str | int | Iterable | None) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (inclusive) or a list of ints; at most :data:`~lengthbench.validation.MAX_SEEDS`
    seeds, each in 0 .. 2**63 - 1 (a huge range is refused before it is expanded)."""
    from lengthbench.validation import MAX_SEED, MAX_SEEDS

    if isinstance(text, int) and not isinstance(text, bool):
        text = [text]
    if isinstance(text, Iterable) and not isinstance(text, str):
        for item in text:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise UsageError(f"seeds must be integers, got {item!r}")
    seeds: list[int] = []
    for item in split_list(text, "--seeds"):
        span = re.fullmatch(r"(\d+)-(\d+)", item)
        if span:
            first, last = int(span[1]), int(span[2])
            if last < first:
                raise UsageError(f"--seeds range {item!r} is empty: write it low-high")
            if last - first + 1 + len(seeds) > MAX_SEEDS:
                raise UsageError(f"--seeds {item!r} is {last - first + 1:,} seeds; a sweep takes at most "
                                 f"{MAX_SEEDS:,}")
            seeds += list(range(first, last + 1))
        elif re.fullmatch(r"\d+", item):
            seeds.append(int(item))
        else:
            raise UsageError(f"--seeds takes non-negative integers like 0,1,2 or 0-4, got {item!r}")
        if seeds and seeds[-1] > MAX_SEED:
            raise UsageError(f"--seeds: a seed must be at most 2**63 - 1, got {seeds[-1]}")
    if len(seeds) > MAX_SEEDS:
        raise UsageError(f"--seeds lists {len(seeds):,} seeds; a sweep takes at most {MAX_SEEDS:,}")
    return list(dict.fromkeys(seeds))


def read_sweep_file(path: str | Path) -> dict[str, Any]:
    """The settings of a sweep file (TOML, or JSON by its extension); unknown keys are an error."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"sweep file {path} does not exist")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            import tomllib

            data = tomllib.loads(path.read_text(encoding="utf-8"))
    except ImportError as error:
        raise UsageError("TOML sweep files need Python 3.11 or newer; write the file as JSON instead") from error
    except (ValueError, OSError, UnicodeDecodeError) as error:  # tomllib and json errors are ValueErrors
        raise UsageError(f"cannot read sweep file {path}: {str(error).splitlines()[0]}") from error
    if not isinstance(data, dict):
        raise UsageError(f"sweep file {path} must hold a table of settings")
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise UsageError(f"sweep file {path}: unknown key {unknown[0]!r}; keys: {', '.join(SWEEP_KEYS)}")
    if not isinstance(data.get("overrides", {}), dict):
        raise UsageError(f"sweep file {path}: [overrides] must be a table of RunConfig fields")
    for key in ("by_pe", "by_task", "variants"):
        tables = data.get(key, {})
        if not isinstance(tables, dict) or not all(isinstance(table, dict) for table in tables.values()):
            raise UsageError(f"sweep file {path}: [{key}.NAME] must be tables of RunConfig fields")
    stages = data.get("stages", [])
    if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
        raise UsageError(f"sweep file {path}: stages must be [[stages]] tables of RunConfig fields")
    check_sweep_settings(data, f"sweep file {path}")
    return data


def check_sweep_settings(data: dict[str, Any], where: str) -> None:
    """The types of a sweep file's settings and the ranges of its numbers, each problem one line naming the
    key: ``eval_samples must be an integer, got 'many'``."""
    from lengthbench import validation

    def fail(message: str) -> None:
        raise UsageError(f"{where}: {message}")

    for key in ("tasks", "attns", "pes", "cells"):
        value = data.get(key)
        if value is not None and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(item, str) for item in value))):
            fail(f"{key} must be a list of names (or one comma-separated string), got {value!r}")
    if "explained" in data and not (isinstance(data["explained"], dict) and all(
            isinstance(v, str) for v in data["explained"].values())):
        fail("[explained] must be a table of \"attn:pe\" = \"the reason\"")
    for key in ("preset", "results", "device", "paper", "table"):
        if key in data and not isinstance(data[key], str):
            fail(f"{key} must be a string, got {data[key]!r}")
    if "results" in data and not data["results"].strip():
        fail("results is empty: give a folder name")
    seeds = data.get("seeds")
    if seeds is not None and not isinstance(seeds, str | int | list) or isinstance(seeds, bool):
        fail(f"seeds must be a list of integers or a string like \"0-4\", got {seeds!r}")
    if "per_gpu" in data and data["per_gpu"] != "auto":
        if isinstance(data["per_gpu"], bool) or not isinstance(data["per_gpu"], int):
            fail(f"per_gpu must be a whole number or \"auto\", got {data['per_gpu']!r}")
        try:
            validation.check_int("per_gpu", data["per_gpu"], 1, 64)
        except UsageError as error:
            fail(str(error))
    if "mps" in data and data["mps"] not in ("auto", "on", "off"):
        fail(f"mps must be \"auto\", \"on\" or \"off\", got {data['mps']!r}")
    if "budget" in data:
        from lengthbench.budget import parse_budget

        try:
            parse_budget(data["budget"])
        except UsageError as error:
            fail(str(error))
    if "fill" in data and not isinstance(data["fill"], bool):
        fail(f"fill must be true or false, got {data['fill']!r}")
    if "budget_fraction" in data:
        try:
            validation.check_float("budget_fraction", data["budget_fraction"], 0.0, 1.0, low_open=True)
        except UsageError as error:
            fail(str(error))
    variants = data.get("variants", {})
    for name, variant in variants.items():
        own = variant.get("cells")
        if own is not None and not (isinstance(own, str) or (
                isinstance(own, list) and all(isinstance(item, str) for item in own))):
            fail(f"variants.{name}: cells must be a list of cells, got {own!r}")
        if own is not None and not split_list(own):
            fail(f"variants.{name}: cells is empty: leave it out to apply the variant to every cell")
    if (variants or data.get("by_task")) and not data.get("cells"):
        fail("[variants.NAME] and [by_task.NAME] need a cell list (cells = [...])")
    if variants and data.get("stages"):
        fail("[variants.NAME] and [[stages]] do not combine: give each curriculum its own sweep file")
    for label, table in [("", data.get("overrides", {}))] + [
            (f"by_pe.{name}: ", table) for name, table in data.get("by_pe", {}).items()] + [
            (f"by_task.{name}: ", table) for name, table in data.get("by_task", {}).items()] + [
            (f"variants.{name}: ", {k: v for k, v in table.items() if k != "cells"})
            for name, table in variants.items()] + [
            (f"stage {number}: ", stage) for number, stage in enumerate(data.get("stages", []), 1)]:
        try:
            validation.check_overrides(table, validation.field)
        except UsageError as error:
            fail(f"{label}{error}")




def add_stages(configs: list[RunConfig], stages: list[dict[str, Any]], preset: str = "smoke",
               overrides: dict[str, Any] | None = None) -> list[RunConfig]:
    """Every cell preceded by its curriculum: per cell, one configuration per stage (``overrides``, then the
    stage's fields; the cell's mechanism, encoding, their parameters (a stage's ``attn_params`` over the cell's)
    and seed), each starting from the one
    before, then the cell itself starting from the last stage. Stages come before their cell, so a sweep run in
    order meets every stage's weights before it needs them. Problems are one-line UsageErrors."""
    if not stages:
        return configs
    overrides = dict(overrides or {})
    for number, stage in enumerate(stages, 1):
        unknown = sorted(set(stage) - set(RunConfig.__dataclass_fields__))
        fixed = sorted(set(stage) & set(STAGE_FIXED))
        if unknown or fixed:
            what = "unknown configuration field" if unknown else "a stage cannot set"
            raise UsageError(f"stage {number}: {what} {(unknown or fixed)[0]!r}")
    chained: dict[str, RunConfig] = {}
    for cell in configs:
        previous = ""
        for number, stage in enumerate(stages, 1):
            stage = dict(stage)
            task = stage.pop("task", cell.task)
            task_params = dict(stage.pop("task_params", None) or {})
            attn_params = {**cell.attn_params, **dict(stage.pop("attn_params", None) or {})}
            if task == cell.task:  # the cell's task: the stage's parameters over the sweep's
                task_params = {**(overrides.get("task_params") or {}), **task_params}
            merged = {**overrides, **stage, "task_params": task_params}
            try:
                check_task_params(task, task_params)
            except UsageError as error:
                raise UsageError(f"stage {number} of {cell.task}:{cell.attn}:{cell.pe}: {error}") from error
            try:
                fields = {**default_train_length(task, merged), **merged, "seed": cell.seed,
                          "attn_params": attn_params, "pe_params": cell.pe_params, "init_from": previous}
                config = build_config(task, cell.attn, cell.pe, preset, **fields)
            except (LookupError, ValueError, TypeError) as error:
                message = str(error).splitlines()[0].strip("'\"")
                raise UsageError(f"stage {number} of {cell.task}:{cell.attn}:{cell.pe}: {message}") from error
            check_config(config, f"stage {number} of {cell.task}:{cell.attn}:{cell.pe}")
            if config.attn_params or config.pe_params or config.task_params:
                _check_parameters(config, f"stage {number} of {cell.task}:{cell.attn}:{cell.pe}")
            chained.setdefault(config.run_id, config)
            previous = config.run_id
        final = replace(cell, init_from=previous)
        chained.setdefault(final.run_id, final)
    return list(chained.values())


def plan_sweep(tasks: list[str], attns: list[str], pes: list[str], seeds: list[int], preset: str = "smoke",
               overrides: dict[str, Any] | None = None) -> list[RunConfig]:
    """The configurations of every cell, in task, attn, pe, seed order. Every name and setting is
    checked before anything runs; the first problem is a one-line :class:`UsageError`."""
    from lengthbench.models.attention import ATTENTION
    from lengthbench.models.positional import POSITIONAL_ENCODINGS
    from lengthbench.models.registry import UnknownNameError
    from lengthbench.tasks import TASKS, eval_multipliers

    for flag, values in (("--tasks", tasks), ("--attns", attns), ("--pes", pes), ("--seeds", seeds)):
        if not values:
            raise UsageError(f"{flag} is empty: give at least one (comma-separated)")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(RunConfig.__dataclass_fields__))
    if unknown:
        raise UsageError(f"unknown configuration field {unknown[0]!r} in overrides")
    if len(tasks) * len(attns) * len(pes) * len(seeds) > MAX_CELLS:
        raise UsageError(f"the sweep has {len(tasks) * len(attns) * len(pes) * len(seeds):,} runs; at most "
                         f"{MAX_CELLS:,}")
    check_task_params_of(tasks, overrides)
    try:
        for registry, names in ((TASKS, tasks), (ATTENTION, attns), (POSITIONAL_ENCODINGS, pes)):
            for name in names:
                registry.canonical(name)
        configs = []
        for task in tasks:
            for attn in attns:
                for pe in pes:
                    for seed in seeds:
                        config = build_config(task, attn, pe, preset,
                                              **{**default_train_length(task, overrides), **overrides, "seed": seed})
                        check_config(config, f"{task}:{attn}:{pe}")
                        eval_multipliers(config.max_multiplier)
                        if config.attn_params or config.pe_params or config.task_params:
                            _check_parameters(config)
                        configs.append(config)
    except UnknownNameError as error:
        raise UsageError(str(error).strip("'\"")) from error
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from error
    unique = {c.run_id: c for c in configs}  # aliases (nope/none) name the same cell
    return list(unique.values())


CELL_PART = re.compile(r"([^()\s]+)\s*(?:\((.*)\))?")


def _cell_part(text: str, cell: str) -> tuple[str, dict[str, Any]]:
    """``"entmax(alpha=4, k=2)"`` -> ``("entmax", {"alpha": 4, "k": 2})``; a bare name has no parameters."""
    from lengthbench.config import parse_params

    match = CELL_PART.fullmatch(text)
    if not match:
        raise UsageError(f"a cell is task:attn:pe, each of attn and pe optionally with parameters, e.g. "
                         f"maxretrieval:entmax(alpha=4):none; got {cell!r}")
    items = [item for item in (match[2] or "").split(",") if item.strip()]
    if match[2] is not None and not items:
        raise UsageError(f"empty parameter list in cell {cell!r}: give key=value or drop the brackets")
    return match[1], parse_params(items, f"cell {cell!r}")


def _check_parameters(config: RunConfig, where: str = "") -> None:
    """Build the cell's model on the meta device (no memory, no time): a parameter its mechanism, encoding or
    task does not take fails here, before any cell runs, not in a worker an hour later."""
    import torch

    from lengthbench.runner import build_model
    from lengthbench.tasks import get_task

    try:
        with torch.device("meta"):
            build_model(config, get_task(config.task, **config.task_params))
    except (TypeError, ValueError) as error:
        where = where or f"{config.task}:{config.attn}:{config.pe}"
        raise UsageError(f"{where}: {str(error).splitlines()[0]}") from error


def _pe_overrides(pe: str, overrides: dict[str, Any], by_pe: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """``overrides`` with the fields of the encoding's ``[by_pe.NAME]`` table over them (its canonical name or an
    alias)."""
    if not by_pe:
        return overrides
    from lengthbench.models.positional import POSITIONAL_ENCODINGS

    def canonical(name: str) -> str:
        try:
            return POSITIONAL_ENCODINGS.canonical(name)
        except LookupError:
            return name

    extra = {}
    for name, table in by_pe.items():
        if canonical(name) == canonical(pe):
            extra.update(table)
    return {**overrides, **extra}


def merged_fields(fields: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over``'s fields over ``fields``, the parameter tables (:data:`PARAM_FIELDS`) merged key by key."""
    merged = {**fields, **over}
    for key in PARAM_FIELDS:
        if key in over and isinstance(over[key], dict):
            merged[key] = {**(fields.get(key) or {}), **over[key]}
    return merged


def _task_overrides(task: str, overrides: dict[str, Any], by_task: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """``overrides`` with the fields of the task's ``[by_task.NAME]`` table over them (its canonical name or an
    alias)."""
    if not by_task:
        return overrides
    from lengthbench.tasks import TASKS

    def canonical(name: str) -> str:
        try:
            return TASKS.canonical(name)
        except LookupError:
            return name

    for name, table in by_task.items():
        if canonical(name) == canonical(task):
            overrides = merged_fields(overrides, table)
    return overrides


def plan_cells(cells: list[str], seeds: list[int], preset: str = "smoke",
               overrides: dict[str, Any] | None = None,
               by_pe: dict[str, dict[str, Any]] | None = None,
               by_task: dict[str, dict[str, Any]] | None = None,
               variant: dict[str, Any] | None = None) -> list[RunConfig]:
    """The configurations of an explicit cell list (``task:attn:pe`` each, as tables mix mechanisms and
    encodings), in the order given, each with every seed. The mechanism and the encoding may carry their own
    parameters, ``maxretrieval:entmax(alpha=4):none`` or ``passkey:softmax:rope(factor=1)``, over those of the
    overrides (``attn_params``, ``pe_params``). ``by_pe`` holds fields for the cells of one encoding over the
    overrides (a sweep file's ``[by_pe.rope]``: e.g. the checkpoint selection a paper used for its RoPE models),
    ``by_task`` those of one task over both; ``variant`` (a sweep file's ``[variants.NAME]``, less its cells)
    holds the fields one variant changes, over all of these but the cell's own parameters."""
    if not cells:
        raise UsageError("--cells is empty: give at least one task:attn:pe")
    overrides = dict(overrides or {})
    configs: dict[str, RunConfig] = {}
    for cell in cells:
        parts = [part.strip() for part in cell.split(":")]
        if len(parts) != 3 or not all(parts):
            raise UsageError(f"a cell is task:attn:pe, e.g. copy:sieve:none; got {cell!r}")
        attn, attn_params = _cell_part(parts[1], cell)
        pe, pe_params = _cell_part(parts[2], cell)
        cell_overrides = merged_fields(_task_overrides(parts[0], _pe_overrides(pe, dict(overrides), by_pe), by_task),
                                 variant or {})
        for key, params in (("attn_params", attn_params), ("pe_params", pe_params)):
            if params:
                cell_overrides[key] = {**(cell_overrides.get(key) or {}), **params}
        for config in plan_sweep([parts[0]], [attn], [pe], seeds, preset, cell_overrides):
            configs.setdefault(config.run_id, config)
    return list(configs.values())


def sweep_variants(settings: dict[str, Any], cell_list: list[str], narrowed: bool = False):
    """``(name, cells, fields)`` of each ``[variants.NAME]``: the cells it applies to (its own list, else every
    cell) and the fields it changes. ``narrowed``: the cells were given on the command line, and a variant's own
    list keeps only those among them."""
    for name, table in (settings.get("variants") or {}).items():
        own = split_list(table.get("cells")) or list(cell_list)
        if narrowed and table.get("cells"):
            own = [cell for cell in own if cell in cell_list]
        if own:
            yield name, own, {key: value for key, value in table.items() if key != "cells"}


def configs_of_sweep(settings: dict[str, Any], *, tasks=None, attns=None, pes=None, cells=None, seeds=None,
                     preset: str | None = None, flags: dict[str, Any] | None = None,
                     labels: dict[str, str] | None = None) -> list[RunConfig]:
    """Every configuration a sweep file's ``settings`` (:func:`read_sweep_file`) runs, stages included, with
    command-line values (``None``: the file's) over the file's: the one way the sweep, its status, the
    leaderboard's sections and ``compare --config`` know a protocol's runs. ``labels``, where given, receives the
    name of the variant each variant's run belongs to (by run id)."""
    overrides = dict(settings.get("overrides", {}))
    overrides.update({key: value for key, value in (flags or {}).items() if value is not None})
    by_pe = settings.get("by_pe") or {}
    seed_list = parse_seeds(seeds if seeds is not None else settings.get("seeds", "0"))
    preset = preset or settings.get("preset", "smoke")
    task_list = split_list(*((tasks, "--tasks") if tasks is not None else (settings.get("tasks"), "tasks")))
    attn_list = split_list(*((attns, "--attns") if attns is not None else (settings.get("attns"), "attns")))
    pe_list = split_list(*((pes, "--pes") if pes is not None else (settings.get("pes"), "pes")))
    cell_list = split_list(*((cells, "--cells") if cells is not None else (settings.get("cells"), "cells")))
    if cell_list and (tasks or attns or pes):
        raise UsageError("give either --cells or --tasks/--attns/--pes, not both")
    if cell_list:
        by_task = settings.get("by_task")
        configs = plan_cells(cell_list, seed_list, preset, overrides, by_pe, by_task)
        for name, own, variant in sweep_variants(settings, cell_list, narrowed=cells is not None):
            try:
                planned = plan_cells(own, seed_list, preset, overrides, by_pe, by_task, variant)
            except UsageError as error:
                raise UsageError(f"variants.{name}: {error}") from error
            if labels is not None:
                labels.update({c.run_id: name for c in planned if c.run_id not in labels})
            configs += planned
        configs = list({c.run_id: c for c in configs}.values())  # a variant that changes nothing is its cell
    elif by_pe and pe_list:
        configs = []
        for pe in pe_list:
            configs += plan_sweep(task_list, attn_list, [pe], seed_list, preset, _pe_overrides(pe, overrides, by_pe))
        order = {pe: number for number, pe in enumerate(pe_list)}
        configs.sort(key=lambda c: (task_list.index(c.task) if c.task in task_list else 0,
                                    attn_list.index(c.attn) if c.attn in attn_list else 0,
                                    order.get(c.pe, 0), seed_list.index(c.seed)))
    else:
        configs = plan_sweep(task_list, attn_list, pe_list, seed_list, preset, overrides)
    return add_stages(configs, settings.get("stages", []), preset, overrides)


def check_task_params_of(tasks: list[str], overrides: dict[str, Any]) -> None:
    """The overrides' task parameters, before a task is built with them (a huge alphabet would hang there)."""
    params = overrides.get("task_params") or {}
    if not isinstance(params, dict):
        raise UsageError(f"task_params must be a table of key = value, got {params!r}")
    for task in tasks:
        check_task_params(task, params)


def default_train_length(task: str, overrides: dict[str, Any]) -> dict[str, int]:
    """The task's own n_train where the settings give none (as ``lengthbench run`` does)."""
    if overrides.get("train_length") is not None:
        return {}
    from lengthbench.tasks import get_task

    return {"train_length": type(get_task(task, **(overrides.get("task_params") or {}))).default_train_length}


def gpu_slots(device: str, per_gpu: int = 1) -> list[str]:
    """The worker slots to spread cells over: ``"GPU"`` or ``"GPU.i"`` for the i-th extra cell sharing that GPU
    (its ``CUDA_VISIBLE_DEVICES`` is the part before the dot); empty: run in this process."""
    from lengthbench.validation import check_int

    check_int("--per-gpu", per_gpu, 1, 64)
    if device == "cpu":
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [
        str(i) for i in range(torch.cuda.device_count())]
    slots = [gpu if i == 0 else f"{gpu}.{i}" for i in range(per_gpu) for gpu in ids]
    return slots if len(slots) > 1 else []


# Cells side by side on one GPU by model width, where no measurement says better: three small paper models (d 256),
# two of d 512 and wider (whose kernels fill more of the GPU); at most one cell per CELL_MEMORY_GIB of its memory.
AUTO_PER_GPU = ((256, 3), (10**9, 2))
CELL_MEMORY_GIB = 20


def auto_per_gpu(configs: list[RunConfig], gpu: str, memory_gib: float | None = None) -> int:
    """``--per-gpu auto``: how many cells share a GPU, from the widest model of ``configs``, the GPU's memory and
    the side-by-side measurement (``results/benchmarks/side_by_side.parquet``: the count with the most samples/s
    where one more cell gains at least 5%)."""
    if not configs:
        return 1
    widest = max(configs, key=lambda c: c.d_model * c.n_layers)
    count = next(cells for width, cells in AUTO_PER_GPU if widest.d_model <= width)
    from lengthbench.budget import BENCHMARKS, _read_table

    measured = _read_table(BENCHMARKS / "side_by_side.parquet")
    if not measured.empty:
        rows = measured[measured["mps"]]
        if not rows.empty:
            nearest = (rows["d_model"].astype(float) - widest.d_model).abs()
            rows = rows[nearest == nearest.min()].sort_values("cells")
            count, best = 1, 1.0
            for cells, slowdown in zip(rows["cells"], rows["slowdown"], strict=True):
                if int(cells) / float(slowdown) >= 1.05 * best:
                    count, best = int(cells), int(cells) / float(slowdown)
    if memory_gib is None:
        memory_gib = 80.0 if "h100" in gpu.lower() else 140.0 if "h200" in gpu.lower() else 40.0
        try:
            import torch

            if torch.cuda.is_available():
                memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        except (ImportError, RuntimeError):
            pass
    return max(1, min(count, int(memory_gib // CELL_MEMORY_GIB)))


def slot_gpu(slot: str) -> str:
    return slot.split(".")[0]


@dataclass
class CellOutcome:
    config: RunConfig
    status: str  # done, skipped (in the store), failed, elsewhere (claimed by a live sweep elsewhere), left (not
    # started: the time budget ran out); on a cluster also queued (its job is queued or running)
    seconds: float = 0.0
    curve: dict[int, float] = field(default_factory=dict)
    error: str = ""
    slot: str = ""


# (kind, config, outcome, slot); kind: start, done, skipped, failed, elsewhere, left, or waiting (for a sweep
# elsewhere)
Event = Callable[[str, RunConfig, "CellOutcome | None", str], None]


def _outcome_curve(frame) -> dict[int, float]:
    return {int(m): float(s) for m, s in zip(frame["multiplier"], frame["score"], strict=True)}


def run_sweep(configs: list[RunConfig], results: str | Path, *, device: str = "auto",
              on_event: Event | None = None, slots: list[str] | None = None,
              worker_command: Callable[[RunConfig, Path], list[str]] | None = None, wait: bool = True,
              poll: float = 2.0, track: str | None = None,
              admit: Callable[[RunConfig], bool] | None = None,
              stop_at: Callable[[RunConfig], float | None] | None = None) -> list[CellOutcome]:
    """Run every unfinished cell; return one outcome per cell in ``configs`` order.

    Each cell is claimed before it runs (:mod:`lengthbench.claims`), so several sweeps over one store share
    the grid: a cell claimed by a live sweep elsewhere is passed over, and at the end, with ``wait``, this
    sweep waits (looking every ``poll`` seconds) until those are in the store, running any whose claim is
    given up unfinished; without ``wait`` they end as ``elsewhere`` ("running elsewhere").

    ``slots`` (default: :func:`gpu_slots`) with more than one entry runs a worker process per slot;
    ``worker_command`` replaces the worker's command line (tests). ``track`` (``tensorboard`` or ``wandb``)
    logs each cell's training to that tracker (:mod:`lengthbench.tracking`).

    ``admit`` (a time budget's :meth:`lengthbench.budget.BudgetGuard.admits`) is asked before each cell starts;
    the first cell it refuses and every cell after it end as ``left`` (not started), and the running ones
    finish: a clean stop. ``stop_at`` (the guard's :meth:`~lengthbench.budget.BudgetGuard.stop_at`) gives a cell
    longer than the budget its deadline (a ``time.monotonic()`` time): the sweep interrupts it then, it keeps its
    last checkpoint and ends as ``left``, and every cell after it too.
    """
    from lengthbench.claims import holder

    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda *args: None)
    outcomes: dict[str, CellOutcome] = {}
    pending = [config for config in configs if not _skip_finished(config, results, outcomes, emit)]
    slots = gpu_slots(device) if slots is None else slots
    while pending:
        if len(slots) > 1:
            command = worker_command or (lambda config, results: _worker_command(config, results, track))
            elsewhere = _run_parallel(pending, results, slots, outcomes, emit, command, admit, stop_at)
        else:
            elsewhere = _run_sequential(pending, results, device, outcomes, emit, track, admit, stop_at)
        pending = [config for config in elsewhere if not _skip_finished(config, results, outcomes, emit)]
        if pending and not wait:
            for config in pending:
                held_by = holder(results, config.run_id)
                outcomes[config.run_id] = CellOutcome(
                    config, "elsewhere", error=f"running elsewhere ({held_by})" if held_by else "running elsewhere")
                emit("elsewhere", config, outcomes[config.run_id], "")
            break
        if pending:
            for config in pending:
                emit("waiting", config, None, "")
            time.sleep(poll)
    return [outcomes[c.run_id] for c in configs]


def _skip_finished(config: RunConfig, results: Path, outcomes: dict[str, CellOutcome], emit) -> bool:
    """Whether ``config`` is in the store already (its outcome ``skipped``, its curve read back)."""
    import pandas as pd

    from lengthbench.checkpoints import cell_finished
    from lengthbench.store import run_path

    if not cell_finished(results, config):
        return False
    curve, note = {}, ""
    try:
        curve = _outcome_curve(pd.read_parquet(run_path(results, config.run_id)))
    except Exception:  # an unreadable file is left as it is (never rewritten); say so
        note = f"unreadable run file {config.run_id}.parquet, left as it is"
    outcomes[config.run_id] = CellOutcome(config, "skipped", curve=curve, error=note)
    emit("skipped", config, outcomes[config.run_id], "")
    return True


def _waits_on_elsewhere(config: RunConfig, elsewhere: list[RunConfig]) -> bool:
    """Whether ``config``'s earlier stage is running in another sweep (then it waits for it too)."""
    return bool(config.init_from) and any(c.run_id == config.init_from for c in elsewhere)


def _leave(configs: list[RunConfig], outcomes: dict[str, CellOutcome], emit) -> None:
    """End ``configs`` as ``left``: not started, the budget refused the first of them."""
    for config in configs:
        if config.run_id not in outcomes:
            outcomes[config.run_id] = CellOutcome(config, "left", error="not started: the budget ran out")
            emit("left", config, outcomes[config.run_id], "")


STOP_GRACE_S = 120.0  # a stopped worker's time to leave cleanly (its scoring files are written every 30 s)
STOPPED = "stopped at the budget's end at its last checkpoint: the same sweep in the next window resumes it"


def _run_sequential(pending, results: Path, device: str, outcomes, emit, track: str | None = None,
                    admit: Callable[[RunConfig], bool] | None = None,
                    stop_at: Callable[[RunConfig], float | None] | None = None) -> list[RunConfig]:
    """Run ``pending`` in this process, one after another; return those claimed by a live sweep elsewhere. A cell
    with a deadline (``stop_at``) is interrupted then (a timer raises KeyboardInterrupt in this thread)."""
    from lengthbench.checkpoints import cell_finished
    from lengthbench.claims import claim
    from lengthbench.runner import resolve_device

    if pending:
        resolve_device(device)
        (results / "logs").mkdir(parents=True, exist_ok=True)
    elsewhere: list[RunConfig] = []
    for number, config in enumerate(pending):
        if _stage_failed(config, outcomes, emit):
            continue
        if _waits_on_elsewhere(config, elsewhere):
            elsewhere.append(config)
            continue
        if admit is not None and not cell_finished(results, config) and not admit(config):
            _leave(pending[number:], outcomes, emit)
            break
        with claim(results, config.run_id) as got:
            if not got:
                elsewhere.append(config)
                continue
            if cell_finished(results, config):  # finished elsewhere since we looked
                _skip_finished(config, results, outcomes, emit)
                continue
            emit("start", config, None, "")
            started = time.perf_counter()
            deadline = stop_at(config) if stop_at is not None else None
            timer = _Deadline(deadline)
            try:
                # the worker pool's log of the cell, here too: a quiet sweep otherwise says nothing until it ends
                with timer, open(results / "logs" / f"{config.run_id}.log", "a", encoding="utf-8") as log_file:
                    def log(line: str, log_file=log_file) -> None:
                        log_file.write(line + "\n")
                        log_file.flush()

                    frame = run_pending_cell(config, results, device=device, log=log, track=track)
                outcome = CellOutcome(config, "done", time.perf_counter() - started, curve=_outcome_curve(frame))
            except (KeyboardInterrupt, UsageError, Exception) as error:
                if timer.fired and interrupted(error):
                    outcome = CellOutcome(config, "left", time.perf_counter() - started, error=STOPPED)
                    outcomes[config.run_id] = outcome
                    emit("left", config, outcome, "")
                    _leave(pending[number + 1:], outcomes, emit)
                    break
                if isinstance(error, KeyboardInterrupt | UsageError):
                    raise
                if interrupted(error):  # an interrupt inside a compiled step surfaces as another error
                    raise KeyboardInterrupt from error
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                # one broken cell must not stop the others
                outcome = CellOutcome(config, "failed", time.perf_counter() - started,
                                      error=f"{type(error).__name__}: {message}")
        outcomes[config.run_id] = outcome
        emit(outcome.status, config, outcome, "")
    return elsewhere


class _Deadline:
    """Within ``with``: at ``deadline`` (a ``time.monotonic()`` time; None: never) raise KeyboardInterrupt in this
    (the main) thread, as Ctrl-C would; ``fired`` says whether it did. A process started in the background by a
    shell ignores SIGINT, and Python then raises nothing on it: the handler is Python's own meanwhile."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.fired = False
        self.timer: threading.Timer | None = None
        self.handler = None

    def _fire(self) -> None:
        self.fired = True
        _thread.interrupt_main()

    def __enter__(self):
        if self.deadline is not None:
            self.handler = signal.signal(signal.SIGINT, signal.default_int_handler)
            self.timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
            signal.signal(signal.SIGINT, self.handler)


def run_pending_cell(config: RunConfig, results: str | Path, *, device: str = "auto",
                     log: Callable[[str], None] | None = None, track: str | None = None):
    """Run one cell of a sweep and return its rows: the one way every executor runs a cell (this process, the
    GPU worker pool, a SLURM job, a Ray task). A cell in the store comes back as stored; an interrupted one
    resumes from its checkpoint (``run --resume``). ``track`` logs its training (:mod:`lengthbench.tracking`)."""
    from lengthbench import runner
    from lengthbench.tracking import tracking

    with tracking(track, config, results) as tracker:
        extra = {"on_metrics": tracker} if tracker is not None else {}
        frame = runner.run_cell(config, results, device=device, resume=True, progress=False, log=log, **extra)
        if tracker is not None:
            tracker.log_curve(frame)
    return frame


def _stage_failed(config: RunConfig, outcomes: dict[str, CellOutcome], emit) -> bool:
    """Whether ``config``'s earlier stage (its ``init_from``) failed in this sweep; then it fails too, unrun."""
    before = outcomes.get(config.init_from) if config.init_from else None
    if before is None or before.status != "failed":
        return False
    outcomes[config.run_id] = CellOutcome(config, "failed", error=f"not run: its earlier stage {config.init_from} "
                                                                  f"failed")
    emit("failed", config, outcomes[config.run_id], "")
    return True


def _worker_command(config: RunConfig, results: Path, track: str | None = None) -> list[str]:
    # -P: no current directory on sys.path, where a checkout's lengthbench/ folder would shadow the
    # installed (namespaced) package
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    from lengthbench.plugins import loaded_plugins

    return [sys.executable, *safe, "-m", "lengthbench.sweep", "--worker", str(results), config.to_json(),
            ",".join(loaded_plugins()), track or ""]


def _run_parallel(pending, results: Path, slots: list[str], outcomes, emit, command,
                  admit: Callable[[RunConfig], bool] | None = None,
                  stop_at: Callable[[RunConfig], float | None] | None = None) -> list[RunConfig]:
    """Run ``pending`` in worker processes, one per slot, each cell claimed (by this process) while its worker
    runs; return those claimed by a live sweep elsewhere. A cell with a deadline (``stop_at``) gets SIGINT then
    (the worker keeps its last checkpoint), and SIGKILL :data:`STOP_GRACE_S` later if it is still running."""
    from lengthbench.checkpoints import cell_finished
    from lengthbench.claims import take

    log_dir = results / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    queue = list(pending)
    elsewhere: list[RunConfig] = []
    running: dict[str, tuple[subprocess.Popen, RunConfig, float, Any, Any]] = {}
    deadlines: dict[str, float] = {}  # slot -> when its cell is stopped
    stopped: dict[str, float] = {}  # slot -> when its cell got SIGINT
    try:
        while queue or running:
            for slot in slots:
                config, held = None, None
                while slot not in running and config is None:
                    busy = {entry[1].run_id for entry in running.values()}
                    config = _next_runnable(queue, outcomes, busy, emit)
                    if config is None:
                        break
                    if _waits_on_elsewhere(config, elsewhere):
                        elsewhere.append(config)
                        config = None
                        continue
                    if admit is not None and not cell_finished(results, config) and not admit(config):
                        _leave([config, *queue], outcomes, emit)
                        queue.clear()
                        config = None
                        break
                    held = take(results, config.run_id)
                    if held is None or cell_finished(results, config):
                        if held is None:
                            elsewhere.append(config)
                        else:
                            held.release()
                            _skip_finished(config, results, outcomes, emit)
                        config = None
                if config is not None:
                    log = open(log_dir / f"{config.run_id}.log", "ab")  # noqa: SIM115 (closed when it ends)
                    # Cells sharing the machine share its cores for their data workers too.
                    workers = max(1, (os.cpu_count() or 2) // len(slots) - 1)
                    env = dict(os.environ, CUDA_VISIBLE_DEVICES=slot_gpu(slot),
                               LENGTHBENCH_DATA_WORKERS=os.environ.get("LENGTHBENCH_DATA_WORKERS", str(workers)))
                    process = subprocess.Popen(command(config, results), stdout=log, stderr=subprocess.STDOUT,
                                               env=env)
                    running[slot] = (process, config, time.perf_counter(), log, held)
                    deadline = stop_at(config) if stop_at is not None else None
                    if deadline is not None:
                        deadlines[slot] = deadline
                    emit("start", config, None, slot)
            for slot, (process, config, started, log, held) in list(running.items()):
                if process.poll() is None:
                    now = time.monotonic()
                    if slot in deadlines and slot not in stopped and now >= deadlines[slot]:
                        process.send_signal(signal.SIGINT)
                        stopped[slot] = now
                    elif slot in stopped and now >= stopped[slot] + STOP_GRACE_S:
                        process.kill()
                    continue
                log.close()
                held.release()
                del running[slot]
                deadlines.pop(slot, None)
                seconds = time.perf_counter() - started
                outcome = _finished_outcome(config, results, process.returncode, seconds, log_dir)
                if stopped.pop(slot, None) is not None and outcome.status == "failed":
                    outcome = CellOutcome(config, "left", seconds, error=STOPPED)
                    _leave(queue, outcomes, emit)
                    queue.clear()
                outcome.slot = slot
                outcomes[config.run_id] = outcome
                emit(outcome.status, config, outcome, slot)
            time.sleep(0.2)
    except BaseException:
        for process, _config, _started, _log, _held in running.values():
            process.terminate()
        for process, _config, _started, log, held in running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
            held.release()
        raise
    return elsewhere


def _next_runnable(queue: list[RunConfig], outcomes: dict[str, CellOutcome], busy: set[str],
                   emit) -> RunConfig | None:
    """Take the first queued configuration whose earlier stage is neither queued nor running (``busy``);
    those whose earlier stage failed fail on the way. None when every queued one still waits."""
    queued = {c.run_id for c in queue}
    for config in list(queue):
        if _stage_failed(config, outcomes, emit):
            queue.remove(config)
            queued.discard(config.run_id)
            continue
        if config.init_from and (config.init_from in queued or config.init_from in busy):
            continue
        queue.remove(config)
        return config
    return None


def _finished_outcome(config: RunConfig, results: Path, returncode: int, seconds: float, log_dir: Path) -> CellOutcome:
    import pandas as pd

    from lengthbench.checkpoints import cell_finished
    from lengthbench.store import run_path

    if returncode == 0 and cell_finished(results, config):
        return CellOutcome(config, "done", seconds, curve=_outcome_curve(pd.read_parquet(run_path(results, config.run_id))))
    log_path = log_dir / f"{config.run_id}.log"
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()] if log_path.exists() else []
    last = lines[-1].strip() if lines else ""
    return CellOutcome(config, "failed", seconds, error=f"exit {returncode}: {last} (log: {log_path})")


def _worker_main(argv: list[str]) -> int:
    """``python -m lengthbench.sweep --worker RESULTS CONFIG_JSON [PLUGINS] [TRACK]``: run one cell."""
    results, config_json = argv[0], argv[1]
    # SIGINT stops the cell at its last checkpoint (the sweep's budget sends it), also where a shell started the
    # sweep in the background, which leaves SIGINT ignored in its children
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from lengthbench.plugins import load_plugins

    load_plugins(split_list(argv[2] if len(argv) > 2 else ""))
    track = argv[3] if len(argv) > 3 and argv[3] else None
    config = RunConfig.from_dict(json.loads(config_json))
    try:
        run_pending_cell(config, results, log=lambda line: print(line, flush=True), track=track)
    except BaseException as error:  # the sweep (or a timeout) stopped it: one line in the cell's log, no traceback
        if not interrupted(error):  # (inside a compiled step the interrupt can surface as another error)
            raise
        print(f"{config.run_id} interrupted: the sweep run again resumes it from its last checkpoint (every "
              f"{config.checkpoint_every} steps)", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit("usage: python -m lengthbench.sweep --worker RESULTS CONFIG_JSON [PLUGINS] (use `lengthbench sweep`)")
