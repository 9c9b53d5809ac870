"""Which stored runs carry out a paper-table config's protocol (``lengthbench.protocols.runs_of_config``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from lengthbench.config import build_config
from lengthbench.leaderboard import load_store
from lengthbench.protocols import config_cells, runs_of_config
from lengthbench.store import CONTRACT_COLUMNS, write_run

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """# A test table, Table 9: copy and 2back.
cells = ["copy:softmax:rope", "copy:entmax(alpha=2):nape"]
seeds = [0]
preset = "smoke"

[overrides]
train_samples = 640
eval_samples = 8
max_multiplier = 2
"""


def store_run(results, config, *, stored_config=None, schema_version=2, run_id=None):
    """A run's rows as the store keeps them: ``stored_config`` (default: the config's own JSON)."""
    run_id = run_id or config.run_id
    rows = []
    for multiplier in (1, 2):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
                   preset=config.preset, train_length=config.train_length, eval_length=64 * multiplier,
                   multiplier=multiplier, exact_match=0.5, token_accuracy=0.5, n_samples=config.eval_samples,
                   created_at="2026-01-01T00:00:00+00:00", metric="exact_match", score=0.5,
                   config_json=stored_config if stored_config is not None else config.to_json())
        rows.append(row)
    if schema_version == 1:  # written before the store had versions: no such column
        (Path(results) / "runs").mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(Path(results) / "runs" / f"{run_id}.parquet", index=False)
    else:
        write_run(results, run_id, rows)
    return run_id


def _config_file(tmp_path, text=CONFIG) -> Path:
    path = tmp_path / "table.toml"
    path.write_text(text)
    return path


def _cell(seed=0, **changes):
    base = build_config("copy", "softmax", "rope", "smoke", train_samples=640, eval_samples=8, max_multiplier=2,
                        seed=seed)
    return dataclasses.replace(base, **changes)


def test_the_configs_cells_match_whatever_their_seed_and_nothing_else(tmp_path):
    path, store = _config_file(tmp_path), tmp_path / "store"
    cells, _ = config_cells(path, [0])
    assert {c.attn for c in cells} == {"softmax", "entmax"} and len(cells) == 2
    matching = {store_run(store, _cell()), store_run(store, _cell(seed=7)), store_run(store, cells[1])}
    other = {store_run(store, _cell(train_samples=1280)), store_run(store, _cell(eval_samples=16)),
             store_run(store, _cell(selection="8x")), store_run(store, dataclasses.replace(cells[1], attn_params={})),
             store_run(store, build_config("2back", "softmax", "rope", "smoke", train_samples=640,
                                           eval_samples=8, max_multiplier=2))}
    frame = load_store(store)[0]
    found = runs_of_config(frame, path)
    assert set(found["run_id"]) == matching and not matching & other
    assert len(found) == 2 * len(matching)  # every row of those runs


def test_how_a_run_executes_is_not_its_protocol(tmp_path):
    """The training step's implementation, compilation, checkpoints: older runs stored the protocol under others."""
    path, store = _config_file(tmp_path), tmp_path / "store"
    executed = _cell(train_step="compiled", compile=False, compile_mode="reduce-overhead",
                     train_attention="reference", checkpoint_every=7, diagnostics=False, diagnostic_rows=3)
    run_id = store_run(store, executed)
    assert set(runs_of_config(load_store(store)[0], path)["run_id"]) == {run_id}


def test_a_rescored_run_with_the_configs_scoring_matches(tmp_path):
    text = CONFIG.replace("eval_samples = 8", "eval_samples = 32")
    path, store = _config_file(tmp_path, text), tmp_path / "store"
    trained = store_run(store, _cell())  # scored on 8 samples: not this config's scoring
    rescored = store_run(store, _cell(eval_samples=32, rescored_from=trained))
    assert set(runs_of_config(load_store(store)[0], path)["run_id"]) == {rescored}


def test_a_curriculum_matches_its_cells_by_their_stages_configuration(tmp_path):
    """Stages stored under another training step have other run ids; the cell names its stage by that id."""
    text = CONFIG + """
[[stages]]
train_length = 16
max_multiplier = 2
"""
    path, store = _config_file(tmp_path, text), tmp_path / "store"
    cells, planned = config_cells(path, [3])
    stage = next(c for c in planned.values() if c.train_length == 16 and c.attn == "softmax")
    old_stage = dataclasses.replace(stage, train_step="compiled")
    cell = next(c for c in cells if c.attn == "softmax")
    store_run(store, old_stage)
    final = store_run(store, dataclasses.replace(cell, init_from=old_stage.run_id, train_step="compiled"))
    # the same cell after a stage of another length is another protocol
    other_stage = dataclasses.replace(stage, train_length=32)
    store_run(store, other_stage)
    store_run(store, dataclasses.replace(cell, init_from=other_stage.run_id))
    assert set(runs_of_config(load_store(store)[0], path)["run_id"]) == {final}


def test_rows_of_the_first_schema_match_in_todays_terms(tmp_path):
    """A schema-1 SSMax row ran the earlier defaults (s_init 0.43 ...): not the cell a config plans today."""
    text = CONFIG.replace('"copy:entmax(alpha=2):nape"', '"copy:ssmax:nape"')
    path, store = _config_file(tmp_path, text), tmp_path / "store"
    old_json = json.loads(_cell().to_json())
    old_json.pop("train_step")
    softmax = store_run(store, _cell(), stored_config=json.dumps(old_json), schema_version=1)
    ssmax = dict(old_json, attn="ssmax", pe="nape")
    store_run(store, _cell(attn="ssmax", pe="nape"), stored_config=json.dumps(ssmax), schema_version=1)
    frame = load_store(store)[0]
    assert set(runs_of_config(frame, path)["run_id"]) == {softmax}
    # raw rows (not read through the store) are read in today's terms too
    raw = pd.concat([pd.read_parquet(p) for p in (store / "runs").glob("*.parquet")])
    assert set(runs_of_config(raw, path)["run_id"]) == {softmax}


def test_rows_without_a_whole_configuration_match_nothing(tmp_path):
    path, store = _config_file(tmp_path), tmp_path / "store"
    store_run(store, _cell(), stored_config=json.dumps({"task": "copy"}))
    store_run(store, _cell(seed=1), stored_config="")
    assert runs_of_config(load_store(store)[0], path).empty
    assert runs_of_config(load_store(store)[0].iloc[:0], path).empty
