"""The regression check against a real (tiny) run, and its handling of bad baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import cli

from lengthbench.check import compare_curves, load_baseline, run_check
from lengthbench.errors import UsageError

TINY = Path(__file__).resolve().parent.parent / "results" / "baselines" / "tiny.json"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One scratch store for the module: the tiny cell trains once, later checks reuse its run."""
    return tmp_path_factory.mktemp("check-store")


def edited(tmp_path, change) -> Path:
    data = json.loads(TINY.read_text())
    change(data["cells"][0]["curve"])
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(data))
    return path


def test_tiny_baseline_reproduces_on_cpu(scratch, monkeypatch, capsys):
    assert cli(monkeypatch, "check", "--baseline", TINY, "--results", scratch, "--quiet") == 0
    out = capsys.readouterr().out
    assert "OK" in out and "0 regressions" in out


def test_no_progress_bar_where_standard_error_is_not_a_terminal(scratch, monkeypatch, capsys):
    # without --quiet: the output is captured (no terminal), so the bar's last frame is not printed there
    assert cli(monkeypatch, "check", "--baseline", TINY, "--results", scratch) == 0
    captured = capsys.readouterr()
    assert "OK" in captured.out and "━" not in captured.err and "━" not in captured.out


def test_a_worsened_baseline_value_is_an_improvement_and_passes(scratch, tmp_path, monkeypatch, capsys):
    recorded = json.loads(TINY.read_text())["cells"][0]["curve"]["1"]
    assert recorded > 0.06, "the tiny cell must score above the tolerance for this test to mean anything"
    path = edited(tmp_path, lambda curve: curve.update({"1": 0.0}))
    assert cli(monkeypatch, "check", "--baseline", path, "--results", scratch, "--quiet") == 0
    out = capsys.readouterr().out
    assert "improved" in out and "1 improvements" in out


def test_an_inflated_baseline_value_is_a_fall_and_fails(scratch, tmp_path, monkeypatch, capsys):
    path = edited(tmp_path, lambda curve: curve.update({"2": min(1.0, curve["2"] + 0.3)}))
    assert cli(monkeypatch, "check", "--baseline", path, "--results", scratch, "--quiet") == 1
    out = capsys.readouterr().out
    assert "fell" in out and "FAILED" in out
    # A larger tolerance lets the same fall through.
    assert cli(monkeypatch, "check", "--baseline", path, "--results", scratch, "--quiet", "--tolerance", "0.5") == 0


def test_update_rewrites_the_curves(scratch, tmp_path, monkeypatch):
    path = edited(tmp_path, lambda curve: curve.update({"2": 1.0}))
    assert cli(monkeypatch, "check", "--baseline", path, "--results", scratch, "--quiet", "--update") == 0
    assert json.loads(path.read_text())["cells"][0]["curve"] == json.loads(TINY.read_text())["cells"][0]["curve"]
    assert cli(monkeypatch, "check", "--baseline", path, "--results", scratch, "--quiet") == 0


def test_compare_curves_statuses():
    baseline = {1: 1.0, 2: 0.5, 4: 0.5, 8: 0.5, 16: 0.2}
    new = {1: 1.0, 2: 0.3, 4: 0.9, 8: 0.52, 32: 0.1}
    statuses = {c.multiplier: c.status for c in compare_curves("cell", baseline, new, 0.05)}
    assert statuses == {1: "same", 2: "fell", 4: "improved", 8: "within", 16: "missing", 32: "new"}
    assert compare_curves("cell", {1: 0.5}, {1: 0.449}, 0.05)[0].status == "fell"
    assert compare_curves("cell", {1: 0.5}, {1: 0.4501}, 0.05)[0].status == "within"


def test_a_crashing_cell_is_a_failure():
    baseline = load_baseline(TINY)

    def crash(config, results, **kwargs):
        raise RuntimeError("kernel exploded")

    result = run_check(baseline, run=crash)
    assert [c.status for c in result.failed] == ["error"] and "kernel exploded" in result.failed[0].detail


def write_json(tmp_path, data) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def cell(**changes):
    data = json.loads(TINY.read_text())["cells"][0]
    data["config"].update(changes.pop("config", {}))
    data.update(changes)
    return data


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a readable JSON file"),
    ({"cells": []}, "has no cells"),
    ({"format": "other/9", "cells": [cell()]}, "unknown format"),
    ({"cells": [cell(config={"attn": "nosuchattn"})]}, "unknown attention mechanism 'nosuchattn'"),
    ({"cells": [cell(config={"pe": "nosuchpe"})]}, "unknown positional encoding 'nosuchpe'"),
    ({"cells": [cell(config={"max_multiplier": 3})]}, "power of two"),
    ({"cells": [cell(curve={"1": 1.5})]}, "not a fraction"),
    ({"cells": [cell(curve={})]}, "has no curve yet"),
    ({"cells": [cell(), cell()]}, "are the same run"),
    ({"cells": [{"task": "copy", "attn": "softmax", "pe": "nape", "overrides": {"bogus": 1}}]}, "bogus"),
])
def test_bad_baselines_are_one_line_exit_2_and_run_nothing(content, message, tmp_path, monkeypatch, capsys):
    path = write_json(tmp_path, content)
    before = path.read_bytes()
    store = tmp_path / "store"
    assert cli(monkeypatch, "check", "--baseline", path, "--results", store) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not store.exists() and path.read_bytes() == before


def test_missing_baseline_and_bad_tolerance(tmp_path, monkeypatch, capsys):
    assert cli(monkeypatch, "check", "--baseline", tmp_path / "nope.json") == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli(monkeypatch, "check", "--baseline", TINY, "--tolerance", "1.5") == 2
    assert "--tolerance" in capsys.readouterr().err


def test_hand_written_cells_build_their_config(tmp_path):
    config = load_baseline(TINY).cells[0].config
    assert (config.task, config.attn, config.pe, config.train_samples, config.max_multiplier) == (
        "2back", "softmax", "nape", 256, 2)
    path = write_json(tmp_path, {"cells": [{"task": "copy", "attn": "softmax", "pe": "rope", "seed": 1}]})
    spec = load_baseline(path, need_curves=False)
    assert spec.cells[0].config.seed == 1 and spec.cells[0].config.preset == "smoke"
    with pytest.raises(UsageError, match="has no curve yet"):
        load_baseline(path)


def test_scores_are_fractions_in_the_store_rows(scratch):
    # The check compares the store's `score`, which the runner writes as a fraction of the task's metric.
    frames = [pd.read_parquet(p) for p in (scratch / "runs").glob("*.parquet")]
    assert frames and all(f["score"].between(0, 1).all() and (f["metric"] == "token_accuracy").all()
                          for f in frames)
