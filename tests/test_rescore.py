"""``lengthbench rescore``: a trained run's model scored again with other samples or lengths, as a run of its own."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import cli

from lengthbench.config import build_config
from lengthbench.errors import UsageError
from lengthbench.leaderboard import build_leaderboard, load_store, protocol_label
from lengthbench.runner import Evaluator, checkpoint_dir, load_model, rescore_run, run_cell
from lengthbench.store import load_results, run_finished

TINY = dict(d_model=32, n_heads=4, ffn=64, n_layers=1, max_multiplier=2, eval_samples=8, val_samples=16,
            eval_every=50, checkpoint_every=50, diagnostics=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    config = build_config("2back", "softmax", "nape", "smoke", train_samples=640, **TINY)
    frame = run_cell(config, store, device="cpu", progress=False)
    return store, config, frame


def test_rescore_scores_the_same_model_with_more_samples_and_lengths(trained):
    store, config, source = trained
    frame = rescore_run(store, config.run_id, samples=24, max_multiplier=4, device="cpu", progress=False)
    new = json.loads(frame["config_json"].iloc[0])
    assert new["rescored_from"] == config.run_id and new["eval_samples"] == 24 and new["max_multiplier"] == 4
    assert frame["run_id"].iloc[0] not in (config.run_id, build_config(
        "2back", "softmax", "nape", "smoke", train_samples=640, **dict(TINY, eval_samples=24, max_multiplier=4)).run_id)
    assert sorted(frame["multiplier"]) == [1, 2, 4] and set(frame["n_samples"]) == {24}
    # the training fields are the source's, and the scores are those of the source's model on those samples
    for column in ("train_steps", "train_seconds", "best_step"):
        assert frame[column].iloc[0] == source[column].iloc[0], column
    model, task, _ = load_model(store, config.run_id)
    evaluator = Evaluator(model, task, torch.device("cpu"), seed=config.seed)
    for row in frame.itertuples():
        assert row.exact_match == evaluator.score(row.eval_length, 24).exact_match
    # the source's rows are untouched; both runs are in the store, and the leaderboard tells them apart
    assert load_results(store)["run_id"].nunique() == 2
    assert "rescored" not in protocol_label(source["config_json"].iloc[0])
    assert protocol_label(frame["config_json"].iloc[0]).endswith(", rescored on 24 samples per length")
    stored, _ = load_store(store)
    assert stored["protocol"].nunique() == 2 and len(build_leaderboard(stored)) == 2
    # a second call returns the stored run; nothing is scored again
    again = rescore_run(store, config.run_id, samples=24, max_multiplier=4, device="cpu", progress=False)
    assert again["created_at"].iloc[0] == frame["created_at"].iloc[0]


def test_an_interrupted_rescore_resumes_at_the_next_length(trained, monkeypatch):
    store, config, _ = trained
    calls = []
    real = Evaluator.score

    def failing(self, n, count, split="test", **kwargs):
        calls.append(n)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, n, count, split, **kwargs)

    monkeypatch.setattr(Evaluator, "score", failing)
    with pytest.raises(KeyboardInterrupt):
        rescore_run(store, config.run_id, samples=12, device="cpu", progress=False)
    rescored = build_config("2back", "softmax", "nape", "smoke", train_samples=640,
                            **dict(TINY, eval_samples=12, rescored_from=config.run_id))
    assert not run_finished(store, rescored.run_id)
    partial = json.loads((checkpoint_dir(store, rescored.run_id) / "eval_rows.json").read_text())
    assert [row["multiplier"] for row in partial] == [1]
    scored = []
    monkeypatch.setattr(Evaluator, "score",
                        lambda self, n, count, split="test", **kwargs: scored.append(n) or real(self, n, count, split,
                                                                                 **kwargs))
    frame = rescore_run(store, config.run_id, samples=12, device="cpu", progress=False)
    assert len(scored) == 1  # only the length left
    assert sorted(frame["multiplier"]) == [1, 2] and frame["run_id"].iloc[0] == rescored.run_id


def test_rescore_refuses_what_it_cannot_do(trained, tmp_path):
    store, config, _ = trained
    with pytest.raises(UsageError, match="no trained model for run 'no-such-run'"):
        rescore_run(store, "no-such-run", samples=10, device="cpu", progress=False)
    with pytest.raises(UsageError, match="give --samples, --max-multiplier or both"):
        rescore_run(store, config.run_id, device="cpu", progress=False)
    with pytest.raises(UsageError, match="scored with 8 samples per length up to 2x already"):
        rescore_run(store, config.run_id, samples=8, max_multiplier=2, device="cpu", progress=False)
    with pytest.raises(UsageError, match="eval-samples must be at least 1"):
        rescore_run(store, config.run_id, samples=0, device="cpu", progress=False)
    with pytest.raises((UsageError, ValueError), match="must be a power of two"):
        rescore_run(store, config.run_id, max_multiplier=3, device="cpu", progress=False)


def test_rescore_cli_prints_the_curve_and_exits_2_on_bad_input(trained, monkeypatch, capsys):
    store, config, _ = trained
    assert cli(monkeypatch, "rescore", config.run_id, "--results", store, "--samples", 16, "--device", "cpu",
               "--quiet") == 0
    assert "rescored (16 samples per length" in capsys.readouterr().out
    assert cli(monkeypatch, "rescore", "no-such-run", "--results", store, "--samples", 16) == 2
    assert "no trained model" in capsys.readouterr().err
