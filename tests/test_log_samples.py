"""``--log-samples``: every scored sample of every length as a JSON line (targets, predictions, symbols), consistent
with the stored scores, also across an interrupted scoring; nothing written without it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import cli

from lengthbench.config import build_config
from lengthbench.evaluation import Evaluator
from lengthbench.runner import build_model, rescore_run, run_cell, sample_log_path
from lengthbench.tasks import get_task

TINY = dict(train_samples=320, batch_size=16, d_model=16, n_heads=2, ffn=32, n_layers=1, max_multiplier=2,
            eval_samples=6, val_samples=8, diagnostics=False)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_logged_samples_match_the_stored_scores(tmp_path):
    config = build_config("copy", "softmax", "nape", "smoke", **TINY)
    frame = run_cell(config, tmp_path, device="cpu", progress=False, log_samples=True)
    task = get_task("copy")
    for row in frame.itertuples():
        lines = _lines(sample_log_path(tmp_path, config.run_id, row.multiplier))
        assert [line["index"] for line in lines] == list(range(config.eval_samples))
        assert {line["n"] for line in lines} == {row.eval_length}
        assert np.mean([line["correct"] for line in lines]) == pytest.approx(row.exact_match)
        hits, scored = sum(line["hits"] for line in lines), sum(line["scored"] for line in lines)
        assert hits / scored == pytest.approx(row.token_accuracy)
        batch = task.batch(np.arange(config.eval_samples), row.eval_length, "test", config.seed)
        for line in lines:
            labels = batch.labels[line["index"]]
            assert line["target_ids"] == labels[labels != -100].tolist()
            assert line["target"].split() == task.symbols(line["target_ids"])
            assert line["prediction"].split() == task.symbols(line["prediction_ids"])
            assert len(line["prediction_ids"]) == line["scored"] == len(line["target_ids"])
            assert line["correct"] == (line["prediction_ids"] == line["target_ids"])


def test_no_log_without_the_option(tmp_path):
    config = build_config("copy", "softmax", "nape", "smoke", **TINY)
    run_cell(config, tmp_path, device="cpu", progress=False)
    assert not list((tmp_path / "checkpoints" / config.run_id).glob("samples_*"))


def test_a_resumed_length_logs_each_sample_once(tmp_path):
    """Interrupted after its tallies were saved at sample 4 (and having logged two samples more), the length
    resumes at 4: the log keeps 0-3 and holds each sample once, as an uninterrupted pass writes it."""
    task = get_task("copy")
    config = build_config("copy", "softmax", "nape", "smoke", **TINY)
    model = build_model(config, task).eval()
    whole, resumed, partial = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", tmp_path / "partial.json"
    evaluator = Evaluator(model, task, __import__("torch").device("cpu"), seed=0, tokens_per_batch=2 * 131)
    expected = evaluator.score(64, 10, sample_log=whole)

    class Interrupt(Exception):
        pass

    def stop(scored, count):
        if scored == 6:
            raise Interrupt

    with pytest.raises(Interrupt):  # saves every batch; batches of 2: saved at 2 and 4, stopped after 6
        evaluator.score(64, 10, partial=partial, save_every=0.0, on_batch=stop, sample_log=resumed)
    assert json.loads(partial.read_text())["state"]["start"] == 4
    assert [line["index"] for line in _lines(resumed)] == list(range(6))
    again = evaluator.score(64, 10, partial=partial, sample_log=resumed)
    assert again.exact_match == expected.exact_match and again.token_accuracy == expected.token_accuracy
    assert _lines(resumed) == _lines(whole)


def test_cli_run_and_rescore_log_samples(monkeypatch, capsys, tmp_path):
    flags = ["--train-samples", "320", "--batch-size", "16", "--d-model", "16", "--heads", "2", "--ffn", "32",
             "--layers", "1", "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--quiet",
             "--device", "cpu", "--results", tmp_path]
    cell = ["run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--preset", "smoke"]
    assert cli(monkeypatch, *cell, *flags, "--log-samples") == 0
    out = capsys.readouterr().out
    run_id = next(line.split()[0] for line in out.splitlines() if line.startswith("2back-softmax-nape-smoke-s0-"))
    assert "scored samples: " in out and "samples_*x.jsonl" in out
    assert len(_lines(sample_log_path(tmp_path, run_id, 2))) == 4
    # the run is in the store: nothing is scored, and the note says how to log its samples
    assert cli(monkeypatch, *cell, *flags[:-4], "--results", tmp_path, "--log-samples", "--quiet") == 0
    assert "rescore" in capsys.readouterr().out
    frame = rescore_run(tmp_path, run_id, samples=3, device="cpu", progress=False, log_samples=True)
    new_id = frame["run_id"].iloc[0]
    assert [len(_lines(sample_log_path(tmp_path, new_id, m))) for m in (1, 2)] == [3, 3]
    assert cli(monkeypatch, "rescore", run_id, "--samples", "5", "--results", tmp_path, "--device", "cpu",
               "--quiet", "--log-samples") == 0
    assert "scored samples: " in capsys.readouterr().out


def test_help_says_where_the_samples_go(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    for command in ("run", "rescore"):
        assert cli(monkeypatch, command, "--help") == 0
        text = " ".join(capsys.readouterr().out.replace("│", " ").split())
        assert "--log-samples" in text and "JSON Lines in RESULTS/checkpoints/" in text
