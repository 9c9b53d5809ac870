"""The results store's schema version: written into every row, 1 for rows written without it, rows of earlier
versions read under today's names with the defaults they ran written out (Sieve's remainder on the diagonal up to
version 3), and rows of version 1 never in one leaderboard table with later ones."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from test_leaderboard import synthetic_run

from lengthbench.config import build_config
from lengthbench.leaderboard import build_leaderboard, load_store, to_markdown
from lengthbench.store import SCHEMA_VERSION, load_results, run_path

ROOT = Path(__file__).resolve().parents[1]


def downgrade(results: Path, run_id: str, version: int = 1) -> None:
    """Rewrite a run's file as a store of schema ``version`` wrote it: version 1 without the column."""
    path = run_path(results, run_id)
    frame = pd.read_parquet(path)
    frame = frame.drop(columns="schema_version") if version == 1 else frame.assign(schema_version=version)
    frame.to_parquet(path, index=False)


def test_every_row_written_carries_the_schema_version(tmp_path):
    path = synthetic_run(tmp_path, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5})
    assert SCHEMA_VERSION == 4
    assert list(pd.read_parquet(path)["schema_version"]) == [SCHEMA_VERSION] * 2
    assert list(load_results(tmp_path)["schema_version"]) == [SCHEMA_VERSION] * 2


def test_rows_without_the_column_are_version_1_and_never_share_a_table_with_newer_ones(tmp_path):
    old = synthetic_run(tmp_path, "copy", "softmax", "nape", 0, {1: 1.0, 2: 0.5}, config={"lr": 1})
    synthetic_run(tmp_path, "copy", "softmax", "nape", 1, {1: 1.0, 2: 1.0})
    downgrade(tmp_path, old.stem)
    frame = load_results(tmp_path)
    assert sorted(frame.groupby("run_id")["schema_version"].first()) == [1, SCHEMA_VERSION]
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
    """The committed store: the runs of schema version 1 (most of them), and those of today's campaigns."""
    from lengthbench.store import SCHEMA_VERSION

    store = ROOT / "results" / "runs"
    assert store.is_dir(), "no committed run store"
    frame, _ = load_store(store.parent)
    assert len(frame) > 100 and 1 in set(frame["schema_version"]) and set(frame["schema_version"]) <= {1, 2, 3,
                                                                                                     SCHEMA_VERSION}
    board = build_leaderboard(frame)
    assert len(board) > 10 and set(board["task"]) >= {"mqrar"}


def test_earlier_rows_read_under_todays_names_with_their_defaults_written_out():
    """A row of an earlier version names what it ran, in today's terms: version 1's ``sieve`` was the entmax-support
    form (today's ``sieve``) and its ``sieve-alg1`` the window at eps 2; version 2's ``sieve`` was the window at eps 8,
    its ``sieve-alg1`` the window at eps 2 and its ``sieve-entmax`` today's ``sieve``. The defaults that version 2
    changed (SSMax's, MQMTAR's layout, TRA's row index) are written into a version-1 row's configuration, and those
    that version 4 changed (Sieve's remainder, on the diagonal up to version 3) into every earlier ``sieve`` row's, a
    value set in the row kept. Rows of today's version read as they are, and a frame read twice reads as read
    once."""
    import json

    from lengthbench.store import with_schema_version

    def config(attn, task="mqrar", **attn_params):
        return json.dumps({"task": task, "attn": attn, "attn_params": attn_params, "task_params": {}})

    rows = pd.DataFrame({
        "attn": ["sieve", "ssmax", "sieve-alg1", "sieve", "sieve-alg1", "sieve-alg1", "sieve-entmax", "sieve",
                 "sieve-window", "sieve", "sieve", "sieve"],
        "config_json": [config("sieve"), config("ssmax", "mqmtar", s_init=1.0), config("sieve-alg1"), config("sieve"),
                        config("sieve-alg1"), config("sieve-alg1", eps=8), config("sieve-entmax", alpha=1.5),
                        config("sieve"), config("sieve-window"), config("sieve", remainder="drop"), config("sieve"),
                        config("sieve", remainder="diagonal")],
        "schema_version": [None, None, None, 2, 2, 2, 2, 3, 3, 3, 4, 4],
    })
    read = with_schema_version(rows)
    assert list(read["attn"]) == ["sieve", "ssmax", "sieve-window", "sieve-window", "sieve-window", "sieve-window",
                                  "sieve", "sieve", "sieve-window", "sieve", "sieve", "sieve"]
    configs = [json.loads(c) for c in read["config_json"]]
    assert [c["attn"] for c in configs] == list(read["attn"])
    diagonal = {"remainder": "diagonal"}
    assert [c["attn_params"] for c in configs] == [diagonal, {"s_init": 1.0, "log_offset": 0, "scaled_heads": "all"},
                                                   {"eps": 2.0}, {"eps": 8.0}, {"eps": 2.0}, {"eps": 8},
                                                   {"alpha": 1.5, **diagonal}, diagonal, {}, {"remainder": "drop"},
                                                   {}, diagonal]
    assert configs[1]["task_params"] == {"spacing": "random", "values": "uniform"}  # version 1's MQMTAR
    assert configs[3]["task_params"] == {} and configs[8] == json.loads(rows["config_json"][8])
    assert list(read["config_json"][10:]) == list(rows["config_json"][10:])  # today's, as they are
    assert with_schema_version(read).equals(read)


def test_version_2_rows_share_the_leaderboard_with_todays_under_todays_labels(tmp_path):
    """A version-2 ``sieve`` run (the window at eps 8) and today's ``sieve-window`` at eps 8 are one leaderboard row,
    their seeds pooled; version 2's ``sieve-entmax`` (the remainder on the diagonal) and today's ``sieve`` with
    ``remainder="diagonal"`` another; today's ``sieve`` (the remainder dropped) a third."""
    old = synthetic_run(tmp_path, "mqrar", "sieve", "none", 0, {1: 1.0, 2: 0.5}, config={"attn": "sieve"})
    entmax = synthetic_run(tmp_path, "mqrar", "sieve-entmax", "none", 0, {1: 1.0, 2: 0.0},
                           config={"attn": "sieve-entmax"})
    for run in (old, entmax):
        downgrade(tmp_path, run.stem, version=2)
    synthetic_run(tmp_path, "mqrar", "sieve-window", "none", 1, {1: 1.0, 2: 1.0},
                  config={"attn": "sieve-window", "attn_params": {"eps": 8.0}})
    synthetic_run(tmp_path, "mqrar", "sieve", "none", 1, {1: 1.0, 2: 0.25},
                  config={"attn": "sieve", "attn_params": {"remainder": "diagonal"}})
    synthetic_run(tmp_path, "mqrar", "sieve", "none", 2, {1: 1.0, 2: 0.75}, config={"attn": "sieve"})
    board = build_leaderboard(load_store(tmp_path)[0]).set_index("attn")
    assert sorted(board.index) == ["sieve", "sieve (remainder=diagonal)", "sieve-window (eps=8)"]
    assert list(board.loc[["sieve", "sieve (remainder=diagonal)", "sieve-window (eps=8)"], "seeds"]) == [1, 2, 2]
    assert "results schema" not in to_markdown(board.reset_index())


def test_version_3_sieve_reads_with_its_remainder_on_the_diagonal_never_as_todays_sieve(tmp_path):
    """Up to version 3 ``sieve`` put what is left of the stick on the query's own value: such a row reads as
    ``sieve (remainder=diagonal)``, in the same table as today's rows (the same runs and streams) but never pooled
    with today's ``sieve`` (the remainder dropped), and with a run of today's that sets ``remainder="diagonal"``; a
    version-3 row that set ``remainder="drop"`` reads as it is (a row of its own, as any parameter set)."""
    old = synthetic_run(tmp_path, "copy", "sieve", "none", 0, {1: 1.0, 2: 0.0}, config={"attn": "sieve"})
    dropped = synthetic_run(tmp_path, "copy", "sieve", "none", 3, {1: 1.0, 2: 0.5},
                            config={"attn": "sieve", "attn_params": {"remainder": "drop"}})
    for run in (old, dropped):
        downgrade(tmp_path, run.stem, version=3)
    synthetic_run(tmp_path, "copy", "sieve", "none", 1, {1: 1.0, 2: 1.0}, config={"attn": "sieve"})
    synthetic_run(tmp_path, "copy", "sieve", "none", 2, {1: 1.0, 2: 0.25},
                  config={"attn": "sieve", "attn_params": {"remainder": "diagonal"}})
    frame = load_results(tmp_path)
    assert sorted(frame.groupby("run_id")["schema_version"].first()) == [3, 3, 4, 4]
    board = build_leaderboard(load_store(tmp_path)[0]).set_index("attn")
    assert sorted(board.index) == ["sieve", "sieve (remainder=diagonal)", "sieve (remainder=drop)"]
    assert list(board.loc[["sieve", "sieve (remainder=diagonal)", "sieve (remainder=drop)"], "seeds"]) == [1, 2, 1]
    assert board["protocol"].nunique() == 1 and "results schema" not in to_markdown(board.reset_index())


def test_a_run_under_a_renamed_name_never_takes_the_id_of_the_other_mechanism():
    """Today's ``sieve`` hashes the schema version into its run id, so that it never finds, resumes or counts as done
    a version-2 ``sieve`` run (the window at eps 8) of the same configuration; other names hash their fields only."""
    import dataclasses
    import hashlib
    import json

    from lengthbench.config import OPTIONAL_FIELDS

    def earlier_id(config):  # the run id as version 2 hashed it (its fields had none of the optional ones)
        fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in OPTIONAL_FIELDS}
        digest = hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode())
        return f"{config.task}-{config.attn}-{config.pe}-{config.preset}-s{config.seed}-{digest.hexdigest()[:10]}"

    sieve = build_config("mqrar", "sieve", "none", "smoke")
    assert sieve.run_id.startswith("mqrar-sieve-none-smoke-s0-") and sieve.run_id != earlier_id(sieve)
    for attn in ("sieve-window", "softmax"):
        config = build_config("mqrar", attn, "none", "smoke")
        assert config.run_id == earlier_id(config)


def test_sieve_run_ids_tell_the_remainders_apart_across_versions():
    """Today's ``sieve`` (the remainder dropped) never takes the id of a version-3 ``sieve`` run (the remainder on the
    diagonal) of the same configuration; today's ``sieve`` with ``remainder="diagonal"`` is that run: its id is the
    one version 3 gave, so a sweep finds it done, resumes it, and the stored row's configuration as read today
    (``remainder="diagonal"`` written out) names its own id."""
    import dataclasses
    import hashlib
    import json

    from lengthbench.config import OPTIONAL_FIELDS, RunConfig
    from lengthbench.store import with_schema_version

    def version_3_id(config):  # the run id as version 3 hashed a ``sieve`` run: its fields and schema_version 3
        fields = {k: v for k, v in dataclasses.asdict(config).items()
                  if not (k in OPTIONAL_FIELDS and v == OPTIONAL_FIELDS[k])}
        digest = hashlib.sha1(json.dumps({**fields, "schema_version": 3}, sort_keys=True, default=str).encode())
        return f"{config.task}-{config.attn}-{config.pe}-{config.preset}-s{config.seed}-{digest.hexdigest()[:10]}"

    today = build_config("copy", "sieve", "none", "smoke")
    diagonal = build_config("copy", "sieve", "none", "smoke", attn_params={"remainder": "diagonal"})
    dropped = build_config("copy", "sieve", "none", "smoke", attn_params={"remainder": "drop"})
    assert today.run_id != version_3_id(today) and today.run_id != diagonal.run_id != dropped.run_id
    assert diagonal.run_id == version_3_id(today)
    row = pd.DataFrame({"attn": ["sieve"], "config_json": [today.to_json()], "schema_version": [3]})
    read = RunConfig.from_dict(json.loads(with_schema_version(row)["config_json"][0]))
    assert read.attn_params == {"remainder": "diagonal"} and read.run_id == version_3_id(today)


def test_a_trained_model_of_an_earlier_version_loads_as_the_mechanism_it_trained(tmp_path):
    """A ``model.pt`` keeps its run's identity as saved: one of version 2 under ``sieve`` (the window at eps 8) loads
    as ``sieve-window`` at eps 8 (``load_model``: inspection; and rescoring), version 1's ``sieve`` (the entmax form,
    its identity without ``rescored_from``) and version 3's as ``sieve`` with the remainder on the diagonal, today's
    ``sieve`` as it is (the remainder dropped)."""
    import dataclasses

    import torch

    from lengthbench.checkpoints import build_model, checkpoint_dir, load_model
    from lengthbench.models.attention.stickbreaking import SieveAttention, SieveWindowAttention
    from lengthbench.store import saved_config
    from lengthbench.tasks import get_task

    today = build_config("copy", "sieve", "none", "smoke", d_model=16, n_heads=2, ffn=32, n_layers=1)
    version_2 = {**dataclasses.asdict(today)}  # every field, no schema_version
    version_1 = {key: value for key, value in version_2.items() if key != "rescored_from"}
    diagonal = {"remainder": "diagonal"}
    version_3 = {**today.identity(), "schema_version": 3}
    assert saved_config(today.identity()) == today.identity()
    assert saved_config(version_1) == {**version_1, "attn_params": diagonal}
    assert saved_config(version_3) == {**version_3, "attn_params": diagonal}
    assert saved_config({**version_3, "attn_params": {"remainder": "drop"}})["attn_params"] == {"remainder": "drop"}
    assert saved_config(version_2) == {**version_2, "attn": "sieve-window", "attn_params": {"eps": 8.0}}
    alg1 = {**version_2, "attn": "sieve-alg1", "attn_params": {"eps": 4.0}}
    assert saved_config(alg1) == {**alg1, "attn": "sieve-window"}  # its own eps kept
    softmax = {**version_2, "attn": "softmax"}
    assert saved_config(softmax) == softmax
    task = get_task("copy")
    for run_id, config, kind in (("old", version_2, SieveWindowAttention), ("older", version_1, SieveAttention),
                                 ("v3", version_3, SieveAttention), ("new", today.identity(), SieveAttention)):
        model = build_model(today, task)
        folder = checkpoint_dir(tmp_path, run_id)
        folder.mkdir(parents=True)
        torch.save({"config": config, "model": model.state_dict(), "state": {}}, folder / "model.pt")
        loaded, _, read = load_model(tmp_path, run_id)
        assert type(loaded.blocks[0].attn) is kind, run_id
        assert read.attn_params == ({"eps": 8.0} if kind is SieveWindowAttention else {} if run_id == "new"
                                    else diagonal)
        if kind is SieveWindowAttention:
            assert loaded.blocks[0].attn.eps == 8.0
        else:
            assert loaded.blocks[0].attn.remainder == ("drop" if run_id == "new" else "diagonal")
