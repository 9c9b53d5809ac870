"""Checkpoint selection at N x n_train (``--selection Nx``) and by another metric (``--selection-metric``), with
corpus BLEU-4 (Long-Context Generalization with Sparse Attention selects its RoPE models at 2x or 4x by BLEU)."""

from __future__ import annotations

import math

import pytest
import torch
from cli_helpers import cli
from model_helpers import oracle_model

from lengthbench.config import build_config, selection_multiplier, selection_words
from lengthbench.runner import BleuTally, Evaluator, Trainer
from lengthbench.tasks import get_task

TINY = dict(d_model=32, n_heads=4, ffn=64, n_layers=1, max_multiplier=4, eval_samples=16, val_samples=8,
            eval_every=2, checkpoint_every=50, diagnostics=False)


def bleu(pairs) -> float:
    tally = BleuTally()
    for candidate, reference in pairs:
        tally.add(candidate, reference)
    return tally.score()


def test_bleu_of_hand_worked_corpora():
    assert bleu([([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])]) == pytest.approx(1.0)
    # one wrong last token of six: 1- to 4-gram precisions 5/6, 4/5, 3/4, 2/3, geometric mean (1/3)^(1/4)
    assert bleu([([1, 2, 3, 4, 5, 7], [1, 2, 3, 4, 5, 6])]) == pytest.approx((1 / 3) ** 0.25)
    # clipping: four 1s against one 1 match once; no bigram matches, so no smoothing gives 0
    assert bleu([([1, 1, 1, 1], [1, 2, 3, 4])]) == 0.0
    # brevity: a perfect prefix of 4 of 6 tokens is penalised by exp(1 - 6 / 4)
    assert bleu([([1, 2, 3, 4], [1, 2, 3, 4, 5, 6])]) == pytest.approx(math.exp(-0.5))
    # corpus level: counts are summed over the samples before the mean, not averaged per sample
    pairs = [([1, 2, 3, 4], [1, 2, 3, 4]), ([5, 6, 7, 9], [5, 6, 7, 8])]
    expected = ((7 / 8) * (5 / 6) * (3 / 4) * (1 / 2)) ** 0.25
    assert bleu(pairs) == pytest.approx(expected)
    # too short for a 4-gram anywhere: 0, as the papers' metric
    assert bleu([([1, 2, 3], [1, 2, 3])]) == 0.0


@pytest.mark.parametrize("selection, factor", [("id", 1), ("2x", 2), ("4x", 4), ("8x", 8), ("64x", 64)])
def test_selection_multiplier(selection, factor):
    assert selection_multiplier(selection) == factor


@pytest.mark.parametrize("selection", ["3x", "1x", "0x", "x", "8", "8X", "-2x", "2xx"])
def test_a_bad_selection_is_refused(selection):
    with pytest.raises(ValueError, match="unknown selection"):
        build_config("copy", "softmax", "rope", "smoke", selection=selection)


def test_selection_words():
    assert selection_words("id", "task") == ""
    assert selection_words("2x", "bleu") == "at 2x by bleu"
    assert selection_words("id", "token_accuracy") == "by token accuracy"
    assert selection_words("8x", "task") == "at 8x"


def test_the_default_selection_metric_is_the_default_run_and_another_changes_it():
    base = build_config("copy", "softmax", "rope", "smoke")
    assert base.identity()["selection_metric"] == "task"  # the run id hashes the whole configuration
    assert build_config("copy", "softmax", "rope", "smoke", selection_metric="task").run_id == base.run_id
    assert build_config("copy", "softmax", "rope", "smoke", selection_metric="bleu").run_id != base.run_id
    with pytest.raises(ValueError, match="unknown selection metric"):
        build_config("copy", "softmax", "rope", "smoke", selection_metric="rouge")


def test_evaluator_bleu_is_one_for_a_perfect_model_and_below_for_an_untrained_one():
    task = get_task("copy")
    config = build_config("copy", "softmax", "rope", "smoke", **TINY)
    from lengthbench.runner import build_model

    model = build_model(config, task)

    perfect = Evaluator(oracle_model(model.config, task.vocab_size), task, torch.device("cpu"), seed=0).score(
        16, 8, bleu=True)
    assert perfect.bleu == pytest.approx(1.0)
    untrained = Evaluator(model, task, torch.device("cpu"), seed=0).score(16, 8, bleu=True)
    assert 0.0 <= untrained.bleu < 0.5
    assert math.isnan(Evaluator(model, task, torch.device("cpu"), seed=0).score(16, 8).bleu)  # not asked for


@pytest.mark.parametrize("selection, metric, length, bleu, logged", [
    ("id", "task", 16, False, "validation 0.250"), ("2x", "task", 32, False, "validation at 2x 0.250"),
    ("4x", "bleu", 64, True, "validation at 4x by bleu 0.750"),
    ("2x", "token_accuracy", 32, False, "validation at 2x by token accuracy 0.500"),
])
def test_selection_validates_at_its_length_with_its_metric(tmp_path, monkeypatch, selection, metric, length, bleu,
                                                           logged):
    seen = []
    original = Evaluator.score

    def score(self, n, count, split="test", bleu=False, **kwargs):
        result = original(self, n, count, split=split, bleu=bleu, **kwargs)
        seen.append((n, split, bleu))
        # a distinct value per metric, so the test sees which one the selection compared
        result.exact_match, result.token_accuracy, result.bleu = 0.25, 0.5, 0.75
        return result

    monkeypatch.setattr(Evaluator, "score", score)
    config = build_config("copy", "softmax", "rope", "smoke", train_length=16, train_samples=16 * 4,
                          batch_size=16, selection=selection, selection_metric=metric, **TINY)
    lines = []
    trainer = Trainer(config, get_task("copy"), torch.device("cpu"), tmp_path, progress=False, log=lines.append)
    trainer.train()
    assert seen == [(length, "val", bleu)] * 2  # steps 2 and 4
    # the log names the selection's length and metric where they are not the default
    assert [line.split(", ")[1].split(" (best")[0] for line in lines] == [logged] * 2
    expected = {"task": 0.25, "exact_match": 0.25, "token_accuracy": 0.5, "bleu": 0.75}[metric]  # copy: exact match
    assert trainer.state.best_score == expected


def test_cli_refuses_a_bad_selection_with_exit_2(monkeypatch, capsys, tmp_path):
    code = cli(monkeypatch, "run", "--task", "copy", "--attn", "softmax", "--pe", "rope", "--selection", "3x",
               "--results", tmp_path, "--dry-run")
    err = capsys.readouterr().err
    assert code == 2 and "unknown selection '3x'" in err and len(err.strip().splitlines()) == 1
    code = cli(monkeypatch, "run", "--task", "copy", "--attn", "softmax", "--pe", "rope", "--selection", "2x",
               "--selection-metric", "rouge", "--results", tmp_path, "--dry-run")
    err = capsys.readouterr().err
    assert code == 2 and "unknown selection metric 'rouge'" in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_cli_run_names_the_selection_and_the_step_it_kept(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")  # one line for rich
    common = ["run", "--task", "copy", "--attn", "softmax", "--pe", "rope", "--preset", "smoke", "--train-length", "8",
              "--train-samples", "64", "--batch-size", "16", "--d-model", "16", "--heads", "2", "--ffn", "32",
              "--layers", "1", "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--eval-every", "2",
              "--results", tmp_path]
    assert cli(monkeypatch, *common, "--selection", "2x", "--selection-metric", "bleu") == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "selection at 2x by bleu: step " in last and last.endswith(" kept")
    kept = int(last.split(": step ")[1].split()[0])
    assert kept in (2, 4)  # a validation step of the 4
    assert cli(monkeypatch, *common, "--seed", "1") == 0
    assert "selection in distribution: step " in capsys.readouterr().out


def test_one_training_keeps_two_selections_as_two_runs(tmp_path, monkeypatch):
    """``also_select``: one training, the best checkpoint of each selection scored and stored as a run of its own;
    an interrupted scoring of the second resumes; the same step's checkpoint gives the same rows, copied."""
    import pandas as pd

    from lengthbench.runner import cell_finished, checkpoint_dir, run_cell, run_path

    original = Evaluator.score
    # validation at 16 (id) peaks at step 2, at 32 (2x) at step 4: the two selections keep different weights
    peaks = {16: {2: 0.9, 4: 0.1}, 32: {2: 0.1, 4: 0.8}}
    scored_lengths = []

    def score(self, n, count, split="test", bleu=False, **kwargs):
        result = original(self, n, count, split=split, bleu=bleu, **kwargs)
        if split == "val":
            result.exact_match = peaks[n][trainer_steps[0]]
        else:
            scored_lengths.append(n)
        return result

    trainer_steps = [0]
    original_select = Trainer._select

    def select(self, evaluator):
        trainer_steps[0] = self.state.step
        return original_select(self, evaluator)

    monkeypatch.setattr(Evaluator, "score", score)
    monkeypatch.setattr(Trainer, "_select", select)
    config = build_config("copy", "softmax", "rope", "smoke", train_length=16, train_samples=16 * 4,
                          batch_size=16, selection="2x", also_select=["id"], **TINY)
    (other,) = config.selected_runs()
    assert other.selection == "id" and other.selected_from == config.run_id and other.run_id != config.run_id
    frame = run_cell(config, tmp_path, device="cpu", progress=False)
    assert cell_finished(tmp_path, config)
    own, kept = frame, pd.read_parquet(run_path(tmp_path, other.run_id))
    assert set(own["best_step"]) == {4} and set(kept["best_step"]) == {2}
    assert set(own["selection"]) == {"2x"} and set(kept["selection"]) == {"id"}
    assert set(kept["train_steps"]) == {4}  # the training's fields are the one training's
    assert scored_lengths == [16, 32, 64] * 2  # both checkpoints scored at every length
    # the second selection's scoring interrupted: the run resumes it from its kept checkpoint, training nothing
    run_path(tmp_path, other.run_id).unlink()
    assert not cell_finished(tmp_path, config) and (checkpoint_dir(tmp_path, other.run_id) / "model.pt").exists()
    monkeypatch.setattr(Trainer, "train", lambda self: pytest.fail("trained again"))
    scored_lengths.clear()
    run_cell(config, tmp_path, device="cpu", progress=False)
    assert scored_lengths == [16, 32, 64] and cell_finished(tmp_path, config)
    again = pd.read_parquet(run_path(tmp_path, other.run_id))
    assert list(again["exact_match"]) == list(kept["exact_match"])


def test_two_selections_of_one_step_share_their_rows(tmp_path, monkeypatch):
    import pandas as pd

    from lengthbench.runner import run_cell, run_path

    scored = []
    original = Evaluator.score

    def score(self, n, count, split="test", bleu=False, **kwargs):
        if split != "val":
            scored.append(n)
        return original(self, n, count, split=split, bleu=bleu, **kwargs)

    monkeypatch.setattr(Evaluator, "score", score)
    # one validation (the last step): both selections keep its checkpoint
    config = build_config("copy", "softmax", "rope", "smoke", train_length=16, train_samples=16 * 2,
                          batch_size=16, selection="8x", also_select=["id"], **dict(TINY, eval_every=50))
    own = run_cell(config, tmp_path, device="cpu", progress=False)
    (other,) = config.selected_runs()
    kept = pd.read_parquet(run_path(tmp_path, other.run_id))
    assert scored == [16, 32, 64]  # scored once
    assert list(kept["exact_match"]) == list(own["exact_match"]) and set(kept["selection"]) == {"id"}
    assert set(kept["run_id"]) == {other.run_id} and set(kept["best_step"]) == set(own["best_step"]) == {2}


@pytest.mark.parametrize("value", ["id", ["3x"], ["8x", "8x"], ["8x"]])
def test_a_bad_also_select_is_refused(value):
    with pytest.raises(ValueError):
        build_config("copy", "softmax", "rope", "smoke", selection="8x", also_select=value)
