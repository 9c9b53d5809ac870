"""Which stored runs carry out a paper-table config's protocol.

A config in ``configs/`` (a sweep file) plans its cells (:func:`lengthbench.sweep.plan_cells`, or
:func:`~lengthbench.sweep.plan_sweep` for a grid, then :func:`~lengthbench.sweep.add_stages` for a curriculum). A
stored run belongs to the config where its stored configuration equals one of those cells' for the run's seed
(any seed: a config names the seeds it was run with, and reruns add others), field by field, except:

* the fields that say how a run executes, not what it trains and scores (:data:`EXECUTION_FIELDS`: the training
  step's implementation, compilation, the attention path of training, checkpoint and diagnostics settings);
  older runs stored the same protocol under other values of these;
* ``rescored_from``: a run scored again (``lengthbench rescore``) with the config's samples and lengths carries
  out the config's scoring of a model trained as the config says;
* ``init_from``, a run id (a hash of everything), is compared as the configuration of the run it names (its own
  earlier stage, found in the same frame), by the same rule.

Only the config's cells match, not their curriculum's earlier stages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lengthbench.config import RunConfig

# RunConfig fields that say how a run executes, not what it trains and scores
EXECUTION_FIELDS = frozenset({"train_step", "compile", "compile_mode", "train_attention", "eval_tokens_per_batch",
                              "checkpoint_every", "diagnostics", "diagnostic_rows"})


def config_cells(config_path: str | Path, seeds: list[int] | None = None
                 ) -> tuple[list[RunConfig], dict[str, RunConfig]]:
    """The cells a config plans for ``seeds`` (default: the config's own; its curriculum's final stage, the cell
    itself) and every configuration it plans by run id (the earlier stages too). Problems are one-line
    UsageErrors."""
    from lengthbench.sweep import configs_of_sweep, read_sweep_file

    settings = read_sweep_file(config_path)
    planned = configs_of_sweep(settings, seeds=None if seeds is None else ",".join(map(str, seeds)))
    sources = {config.init_from for config in planned}
    return [config for config in planned if config.run_id not in sources], {c.run_id: c for c in planned}


def _key(config: dict[str, Any], configs: dict[str, dict], seen: frozenset = frozenset()) -> str | None:
    """What two runs of one protocol share: the stored configuration without :data:`EXECUTION_FIELDS` and
    ``rescored_from``, ``init_from`` replaced by the key of the run it names (where ``configs`` has it); None for
    a configuration that is not a whole RunConfig."""
    try:
        identity = RunConfig.from_dict(config).identity()
    except (TypeError, ValueError):
        return None
    for name in EXECUTION_FIELDS | {"rescored_from"}:
        identity.pop(name, None)
    source = identity.get("init_from")
    if source and source in configs and source not in seen:
        earlier = _key(configs[source], configs, seen | {source})
        identity["init_from"] = json.loads(earlier) if earlier else source
    return json.dumps(identity, sort_keys=True, default=str)


def runs_of_config(frame: pd.DataFrame, config_path: str | Path, *, config_seeds: bool = False,
                   cells: list[RunConfig] | None = None) -> pd.DataFrame:
    """The rows of ``frame`` (a results store's rows, with ``run_id``, ``seed``, ``config_json`` and
    ``schema_version``) whose run carries out the protocol of the config file at ``config_path`` (the module's
    rule), of any seed or, with ``config_seeds``, of the config's seeds only (the published leaderboard: a seed
    added after the fact is not the protocol's); an empty frame where none does. Rows of the store's schema
    version 1 are read in today's terms (:func:`lengthbench.store.with_schema_version`: the defaults they ran
    with written out), so a config that leaves a since-changed default to today's does not match them. ``cells``
    (e.g. a user's own mechanism planned at the config's protocol) replaces the config's cells."""
    from lengthbench.store import with_schema_version

    if frame.empty:
        return frame
    configs = with_schema_version(frame[[c for c in ("run_id", "config_json", "schema_version") if c in frame]])
    stored: dict[str, dict] = {}
    for run_id, text in zip(configs["run_id"], configs["config_json"], strict=True):
        if run_id not in stored and isinstance(text, str) and text:
            try:
                stored[run_id] = json.loads(text)
            except ValueError:
                continue
    seeds = None if config_seeds or cells is not None else sorted(
        {int(seed) for seed in frame["seed"].dropna().unique()})
    if seeds == []:
        return frame.iloc[:0]
    planned_cells, planned = config_cells(config_path, seeds)
    if cells is not None:
        planned = {**planned, **{cell.run_id: cell for cell in cells}}
    cells = planned_cells if cells is None else cells
    planned_json = {run_id: json.loads(config.to_json()) for run_id, config in planned.items()}
    wanted = {_key(json.loads(cell.to_json()), planned_json) for cell in cells}
    matching = {run_id for run_id, config in stored.items()
                if isinstance(config, dict) and _key(config, stored) in wanted}
    return frame[frame["run_id"].isin(matching)]


def other_selections(frame: pd.DataFrame, run_ids: set[str]) -> pd.DataFrame:
    """The rows of ``frame`` whose run scores another checkpoint selection of one of ``run_ids``' trainings
    (``RunConfig.also_select``: its stored ``selected_from`` is one of them)."""
    if frame.empty or "config_json" not in frame.columns:
        return frame.iloc[:0]
    sources = {}
    for run_id, text in zip(frame["run_id"], frame["config_json"], strict=True):
        if run_id in sources:
            continue
        try:
            sources[run_id] = (json.loads(text) or {}).get("selected_from", "") if isinstance(text, str) else ""
        except (ValueError, AttributeError):
            sources[run_id] = ""
    return frame[frame["run_id"].map(lambda run_id: sources.get(run_id, "") in run_ids)]
