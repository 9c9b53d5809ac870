import os

import pandas as pd
import pytest

from lengthbench.config import PRESETS, build_config
from lengthbench.store import CONTRACT_COLUMNS, StoreError, load_results, write_run
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
    with pytest.raises(ValueError):
        eval_multipliers(12)


def _row(run_id, multiplier):
    row = {c: 0 for c in CONTRACT_COLUMNS}
    row.update(run_id=run_id, multiplier=multiplier, exact_match=0.5)
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


def test_store_rejects_rows_without_contract_columns(tmp_path):
    with pytest.raises(ValueError, match="contract"):
        write_run(tmp_path, "x", [{"run_id": "x"}])
    with pytest.raises(StoreError):
        load_results(tmp_path / "missing")
    assert isinstance(load_results(tmp_path), pd.DataFrame)
