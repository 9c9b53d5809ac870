"""The results store's schema version: written into every row, 1 for rows written without it, and rows of
different versions never in one leaderboard table."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from test_leaderboard import synthetic_run

from lengthbench.config import build_config
from lengthbench.leaderboard import build_leaderboard, load_store, to_markdown
from lengthbench.store import SCHEMA_VERSION, load_results, run_path

ROOT = Path(__file__).resolve().parents[1]


def downgrade(results: Path, run_id: str) -> None:
    """Rewrite a run's file as a store of schema version 1 wrote it: without the column."""
    path = run_path(results, run_id)
    pd.read_parquet(path).drop(columns="schema_version").to_parquet(path, index=False)


def test_every_row_written_carries_the_schema_version(tmp_path):
    path = synthetic_run(tmp_path, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5})
    assert SCHEMA_VERSION == 2
    assert list(pd.read_parquet(path)["schema_version"]) == [SCHEMA_VERSION] * 2
    assert list(load_results(tmp_path)["schema_version"]) == [SCHEMA_VERSION] * 2


def test_rows_without_the_column_are_version_1_and_never_share_a_table_with_newer_ones(tmp_path):
    old = synthetic_run(tmp_path, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5}, config={"lr": 1})
    synthetic_run(tmp_path, "copy", "softmax", "nape", 1, {1: 1.0, 2: 1.0})
    downgrade(tmp_path, old.stem)
    frame = load_results(tmp_path)
    assert sorted(frame.groupby("run_id")["schema_version"].first()) == [1, 2]
    board = build_leaderboard(load_store(tmp_path)[0])
    assert len(board) == 2  # one row each: the seeds of two schema versions are not pooled
    assert sorted(board["seeds"]) == [1, 1]
    assert list(board["protocol"].str.endswith(", results schema 1")) == [True, False] or \
        list(board["protocol"].str.endswith(", results schema 1")) == [False, True]
    text = to_markdown(board)
    assert text.count("## copy") == 2 and "results schema 1" in text
    # a store of one version names none
    synthetic_run(tmp_path / "one", "copy", "softmax", "nape", 0, {1: 1.0})
    assert "results schema" not in to_markdown(build_leaderboard(load_store(tmp_path / "one")[0]))


def test_the_run_id_hashes_every_field():
    from lengthbench.config import OPTIONAL_FIELDS

    base = build_config("copy", "softmax", "nape", "smoke")
    # every field, the optional ones where they differ from their default (a field added that way leaves the ids
    # of the runs that do not use it unchanged)
    assert set(base.identity()) == set(base.__dataclass_fields__) - set(OPTIONAL_FIELDS)
    for change in (dict(arch="gemma2"), dict(init="torch"), dict(train_attention="reference"),
                   dict(selection_metric="bleu"), dict(init_from="x"), dict(rescored_from="y"),
                   dict(also_select=["id"], selection="8x"), dict(selected_from="z")):
        changed = build_config("copy", "softmax", "nape", "smoke", **change)
        assert changed.run_id != base.run_id and set(change) <= set(changed.identity()), change


def test_the_committed_store_loads_as_version_1_and_shows_in_the_leaderboard():
    store = ROOT / "results" / "runs"
    assert store.is_dir(), "no committed run store"
    frame, _ = load_store(store.parent)
    assert len(frame) > 100 and set(frame["schema_version"]) == {1}
    board = build_leaderboard(frame)
    assert len(board) > 10 and set(board["task"]) >= {"mqrar"}


def test_schema_1_rows_read_with_the_earlier_defaults_written_out():
    """A version-1 row names what it ran: ``sieve`` was the entmax-support form, and the defaults that version 2
    changed (SSMax's, MQMTAR's layout, TRA's row index) are written into its configuration; version 2 rows are
    read as they are."""
    import json

    import pandas as pd

    from lengthbench.store import with_schema_version

    rows = pd.DataFrame({
        "attn": ["sieve", "ssmax", "sieve"],
        "config_json": [json.dumps({"task": "mqrar", "attn": "sieve", "attn_params": {}, "task_params": {}}),
                        json.dumps({"task": "mqmtar", "attn": "ssmax", "attn_params": {"s_init": 1.0},
                                    "task_params": {}}),
                        json.dumps({"task": "mqrar", "attn": "sieve", "attn_params": {}, "task_params": {}})],
        "schema_version": [None, None, 2],
    })
    read = with_schema_version(rows)
    assert list(read["attn"]) == ["sieve-entmax", "ssmax", "sieve"]
    first, second, third = (json.loads(c) for c in read["config_json"])
    assert first["attn"] == "sieve-entmax"
    assert second["attn_params"] == {"s_init": 1.0, "log_offset": 0, "scaled_heads": "all"}  # set values kept
    assert second["task_params"] == {"spacing": "random", "values": "uniform"}
    assert third == {"task": "mqrar", "attn": "sieve", "attn_params": {}, "task_params": {}}
