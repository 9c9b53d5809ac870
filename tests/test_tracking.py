"""Experiment tracking: TensorBoard event files written by a real tiny run and read back; W&B's calls (through a
stand-in module: no wandb in the tests) and its offline default; the one-line errors."""

from __future__ import annotations

import sys
import types

import pytest
from cli_helpers import cli

from lengthbench.store import load_results

# 60 steps of batch 32: train points at 25, 50 and 60, validations at 20, 40 and 60
RUN = ["run", "--task", "2back", "--attn", "softmax", "--pe", "rope", "--train-samples", "1920", "--batch-size", "32",
       "--eval-samples", "8", "--max-multiplier", "4", "--eval-every", "20", "--d-model", "16", "--heads", "2",
       "--ffn", "32", "--layers", "1", "--no-diagnostics", "--quiet", "--device", "cpu"]


def test_tensorboard_event_files_hold_the_training_and_the_curve(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert cli(monkeypatch, *RUN, "--results", tmp_path, "--track", "tensorboard") == 0
    capsys.readouterr()
    rows = load_results(tmp_path).sort_values("multiplier")
    run_id = rows["run_id"].iloc[0]
    events = EventAccumulator(str(tmp_path / "tracking" / run_id))
    events.Reload()
    scalars = events.Tags()["scalars"]
    for tag in ("train/loss", "train/accuracy", "train/learning_rate", "train/samples_per_second",
                "validation/score", "validation/best_score", "curve/score", "curve/exact_match"):
        assert tag in scalars, (tag, scalars)
    assert [event.step for event in events.Scalars("train/loss")] == [25, 50, 60]
    assert [event.step for event in events.Scalars("validation/score")] == [20, 40, 60]
    assert all(event.value > 0 for event in events.Scalars("train/loss"))
    # the curve: a point per evaluation length, the store's values (float32 in the event file)
    curve = {event.step: event.value for event in events.Scalars("curve/exact_match")}
    assert sorted(curve) == rows["eval_length"].tolist()
    assert [curve[n] for n in rows["eval_length"]] == pytest.approx(rows["exact_match"].tolist(), abs=1e-6)
    # and as a table
    table = events.Tensors("curve/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| multiplier | eval_length | score |" in table and len(rows) + 2 == table.count("\n") + 1


class FakeWandb(types.ModuleType):
    """What lengthbench calls of wandb, recorded."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []
        fake = self

        class Run:
            summary = {}

            def log(self, values, step=None):
                fake.calls.append(("log", values, step))

            def finish(self):
                fake.calls.append(("finish",))

        class Table:
            def __init__(self, columns, data):
                self.columns, self.data = columns, data

        self.Run, self.Table = Run, Table

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self.Run()


@pytest.mark.parametrize("configured", [False, True])
def test_wandb_logs_the_same_metrics_offline_unless_configured(configured, tmp_path, monkeypatch, capsys):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    if configured:
        monkeypatch.setenv("WANDB_MODE", "online")
    else:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    assert cli(monkeypatch, *RUN, "--max-multiplier", "2", "--results", tmp_path, "--track", "wandb") == 0
    capsys.readouterr()
    rows = load_results(tmp_path).sort_values("multiplier")
    init = fake.calls[0][1]
    assert init["id"] == rows["run_id"].iloc[0] and init["mode"] == (None if configured else "offline")
    assert init["dir"] == str(tmp_path / "tracking" / init["id"])
    logged = [call for call in fake.calls if call[0] == "log"]
    assert [step for _, values, step in logged if "train/loss" in values] == [25, 50, 60]
    table = next(values["curve"] for _, values, _ in logged if "curve" in values)
    assert [row[table.columns.index("exact_match")] for row in table.data] == rows["exact_match"].tolist()
    assert fake.calls[-1] == ("finish",)


def test_tracker_errors_are_one_line(tmp_path, monkeypatch, capsys):
    assert cli(monkeypatch, *RUN, "--results", tmp_path, "--track", "mlflow") == 2
    assert "unknown tracker 'mlflow'; choose from: tensorboard, wandb" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert cli(monkeypatch, *RUN, "--results", tmp_path, "--track", "wandb") == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'lengthbench[wandb]'" in err and err.count("\n") == 0
    assert not (tmp_path / "runs").exists()
