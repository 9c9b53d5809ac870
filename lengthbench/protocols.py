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


def config_cells(config_path: str | Path, seeds: list[int]) -> tuple[list[RunConfig], dict[str, RunConfig]]:
    """The cells a config plans for ``seeds`` (its curriculum's final stage, the cell itself) and every
    configuration it plans by run id (the earlier stages too). Problems are one-line UsageErrors."""
    from lengthbench.sweep import add_stages, plan_cells, plan_sweep, read_sweep_file, split_list

    settings = read_sweep_file(config_path)
    preset = settings.get("preset", "smoke")
    overrides = dict(settings.get("overrides", {}))
    cells = split_list(settings.get("cells"))
    if cells:
        configs = plan_cells(cells, seeds, preset, overrides)
    else:
        configs = plan_sweep(split_list(settings.get("tasks")), split_list(settings.get("attns")),
                             split_list(settings.get("pes")), seeds, preset, overrides)
    planned = add_stages(configs, settings.get("stages", []), preset, overrides)
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


def runs_of_config(frame: pd.DataFrame, config_path: str | Path) -> pd.DataFrame:
    """The rows of ``frame`` (a results store's rows, with ``run_id``, ``seed``, ``config_json`` and
    ``schema_version``) whose run carries out the protocol of the config file at ``config_path`` (the module's
    rule); an empty frame where none does. Rows of the store's schema version 1 are read in today's terms
    (:func:`lengthbench.store.with_schema_version`: the defaults they ran with written out), so a config that
    leaves a since-changed default to today's does not match them."""
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
    seeds = sorted({int(seed) for seed in frame["seed"].dropna().unique()})
    if not seeds:
        return frame.iloc[:0]
    cells, planned = config_cells(config_path, seeds)
    planned_json = {run_id: json.loads(config.to_json()) for run_id, config in planned.items()}
    wanted = {_key(json.loads(cell.to_json()), planned_json) for cell in cells}
    matching = {run_id for run_id, config in stored.items()
                if isinstance(config, dict) and _key(config, stored) in wanted}
    return frame[frame["run_id"].isin(matching)]
