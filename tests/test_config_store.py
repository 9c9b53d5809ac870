import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from lengthbench.config import PRESETS, RunConfig, build_config
from lengthbench.store import (
    CONTRACT_COLUMNS,
    RENAMED,
    RunFileError,
    StoreError,
    load_results,
    with_schema_version,
    write_run,
)
from lengthbench.tasks import eval_lengths, eval_multipliers


def test_presets_build_for_every_preset():
    for preset in PRESETS:
        config = build_config("copy", "softmax", "nape", preset)
        assert config.preset == preset
    paper = build_config("copy", "softmax", "nape", "paper")
    assert (paper.n_layers, paper.d_model, paper.n_heads, paper.ffn) == (2, 256, 16, 1024)
    assert paper.train_samples == 20_000_000 and paper.batch_size == 128 and paper.eval_samples == 1000
    assert paper.compile_mode == "reduce-overhead" and build_config("copy", "softmax", "nape", "quick").compile_mode == "default"


def test_overrides_win_and_run_id_tracks_the_configuration():
    a = build_config("2back", "softmax", "nape", "smoke")
    b = build_config("2back", "softmax", "nape", "smoke", lr=1e-4)
    assert b.lr == 1e-4 and a.run_id != b.run_id
    assert a.run_id == build_config("2back", "softmax", "nape", "smoke").run_id
    # aliases resolve to one canonical name, so they share a run
    assert build_config("2back", "softmax", "nope", "smoke").pe == "none"


def test_bad_configurations_are_value_errors():
    with pytest.raises(ValueError, match="preset"):
        build_config("copy", "softmax", "nape", "huge")
    with pytest.raises(ValueError, match="selection"):
        build_config("copy", "softmax", "nape", "smoke", selection="best")
    with pytest.raises(ValueError, match="divisible"):
        build_config("copy", "softmax", "nape", "smoke", d_model=30, n_heads=4)
    with pytest.raises(LookupError, match="choose from"):
        build_config("copy", "nosuch", "nape", "smoke")


def test_multipliers_are_powers_of_two_up_to_the_maximum():
    assert eval_multipliers(1024) == [2**k for k in range(11)]
    assert eval_lengths(64, 1024)[-1] == (1024, 65_536)
    # a task's extra points (Reverse: 1.5x, the sparse-attention paper's column) within range, in order; ints stay ints
    assert eval_lengths(64, 8, (1.5,)) == [(1, 64), (1.5, 96), (2, 128), (4, 256), (8, 512)]
    assert eval_lengths(64, 1, (1.5,)) == [(1, 64)] and eval_lengths(64, 4, (3.0, 2)) == [
        (1, 64), (2, 128), (3, 192), (4, 256)]
    assert [type(m) for m, _ in eval_lengths(64, 2, (1.5,))] == [int, float, int]
    with pytest.raises(ValueError):
        eval_multipliers(12)


def _row(run_id, multiplier):
    row = {c: 0 for c in CONTRACT_COLUMNS}
    row.update(run_id=run_id, task="copy", attn="softmax", pe="rope", multiplier=multiplier, exact_match=0.5,
               train_length=64, eval_length=64 * multiplier,
               n_samples=4)  # (lengths and a sample count of 0, and a row that names no cell, are outside the store's ranges)
    return row


def test_store_writes_atomically_and_skips_corrupt_files(tmp_path):
    write_run(tmp_path, "a", [_row("a", 1), _row("a", 2)])
    write_run(tmp_path, "b", [_row("b", 1)])
    corrupt = tmp_path / "runs" / "c.parquet"
    corrupt.write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="unreadable"):
        frame = load_results(tmp_path)
    assert sorted(frame["run_id"].unique()) == ["a", "b"] and len(frame) == 3
    assert corrupt.read_bytes() == b"not parquet"
    assert not [p for p in os.listdir(tmp_path / "runs") if p.endswith(".tmp")]
    assert list(frame.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS


def test_a_store_read_twice_reads_its_files_once_and_again_when_one_changes(tmp_path, monkeypatch):
    """A command that reads a store twice reads each file once; a file written since reads again, alone; each
    read says the same warnings and hands out its own frame. Rows are checked per set of
    columns, with the same rows skipped and the same words as a file alone would get."""
    write_run(tmp_path, "a", [_row("a", 1), _row("a", 2)])
    write_run(tmp_path, "b", [_row("b", 1), {**_row("b", 2), "exact_match": 1.5}])  # a row outside the ranges
    write_run(tmp_path, "c", [{**_row("c", 1), "extra": 1.0}, {**_row("c", 2), "extra": 2.0}])  # other columns
    reads = []
    real = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, **kw: reads.append(Path(path).name) or real(path, **kw))
    for _ in range(2):
        with pytest.warns(UserWarning, match=r"skipping 1 of 2 rows of .*b\.parquet.*exact_match 1\.5"):
            frame = load_results(tmp_path)
        assert sorted(frame["run_id"]) == ["a", "a", "b", "c", "c"]
    assert sorted(reads) == ["a.parquet", "b.parquet", "c.parquet"]
    frame.loc[:, "exact_match"] = -1.0  # the caller's frame is its own
    with pytest.warns(UserWarning):
        assert (load_results(tmp_path)["exact_match"] >= 0).all()
    write_run(tmp_path, "a", [_row("a", 1), _row("a", 2), _row("a", 4)])
    with pytest.warns(UserWarning):
        assert len(load_results(tmp_path)) == 6
    assert sorted(reads) == ["a.parquet", "a.parquet", "b.parquet", "c.parquet"]  # only the file written since
    with pytest.raises(RunFileError, match="b.parquet: 1 of 2 rows outside"):
        load_results(tmp_path, strict=True)


def test_store_rejects_rows_without_contract_columns(tmp_path):
    with pytest.raises(ValueError, match="contract"):
        write_run(tmp_path, "x", [{"run_id": "x"}])
    with pytest.raises(StoreError):
        load_results(tmp_path / "missing")
    assert isinstance(load_results(tmp_path), pd.DataFrame)


def test_init_default_and_legacy_rows_read_back():
    """Rows stored before the ``init`` field existed were trained with N(0, 0.02^2) weights, still the default:
    reading their configuration gives that init back. They are rows of the store's schema version 1 (run ids
    that hashed fewer fields), and load as such under the run ids they were stored with."""
    import glob

    import pandas as pd

    assert build_config("copy", "softmax", "nape", "smoke").init == "normal-0.02"
    stored = sorted(glob.glob(str(Path(__file__).resolve().parents[1] / "results" / "runs" / "*.parquet")))
    assert stored, "no stored rows to check against"
    rows = [with_schema_version(pd.read_parquet(path, columns=["run_id", "config_json"])).iloc[0] for path in stored]
    legacy = [row for row in rows if "init" not in json.loads(row["config_json"])]
    assert len(legacy) >= 5, "the store should still hold rows from before the init field"
    for row in legacy[:5]:
        config = RunConfig.from_dict(json.loads(row["config_json"]))
        assert config.init == "normal-0.02" and row["schema_version"] == 1
        # (a mechanism version 1 named otherwise keeps that name in its run id)
        names = [config.attn, *(old for old, (new, _) in RENAMED[1].items() if new == config.attn)]
        assert any(row["run_id"].startswith(f"{config.task}-{name}-{config.pe}-{config.preset}-s{config.seed}-")
                   for name in names)
    new = build_config("copy", "softmax", "nape", "smoke", init="torch")
    legacy = build_config("copy", "softmax", "nape", "smoke")
    assert new.run_id != legacy.run_id and legacy.identity()["init"] == "normal-0.02"
    assert RunConfig.from_dict(json.loads(new.to_json())) == new
    with pytest.raises(ValueError, match="unknown init"):
        build_config("copy", "softmax", "nape", "smoke", init="xavier")


def test_decoder_init_scales():
    from lengthbench.models.decoder import Decoder, ModelConfig

    torch.manual_seed(0)
    default = Decoder(ModelConfig(vocab_size=300, d_model=64, n_heads=4, ffn=128, init="torch"))
    legacy = Decoder(ModelConfig(vocab_size=300, d_model=64, n_heads=4, ffn=128))
    assert 0.9 < default.embed.weight.std().item() < 1.1  # PyTorch's N(0, 1)
    assert 0.018 < legacy.embed.weight.std().item() < 0.022
    assert 0.018 < legacy.blocks[0].mlp[0].weight.std().item() < 0.022
    assert default.blocks[0].mlp[0].weight.std().item() > 0.05  # Kaiming-uniform, 1/sqrt(3 * 64) = 0.072
