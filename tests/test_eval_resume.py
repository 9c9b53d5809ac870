"""Scoring one length resumes within it: ``Evaluator.score(partial=...)`` keeps the tallies of the samples scored so
far, and a run interrupted in the middle of a length goes on at its next unscored sample (1,000 samples at 65,536
tokens can take longer than a GPU machine is held). Also the BLEU tally of a task with answer groups (passkey)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import oracle_model

from lengthbench.config import build_config
from lengthbench.runner import Evaluator, build_model, checkpoint_dir, rescore_run, run_cell, run_status
from lengthbench.store import run_finished

TINY = dict(d_model=32, n_heads=4, ffn=64, n_layers=1, max_multiplier=2, eval_samples=8, val_samples=16,
            eval_every=50, checkpoint_every=50, diagnostics=False)
CPU = torch.device("cpu")


class Counting(torch.nn.Module):
    """Wraps a model: counts the samples it is asked to predict, and raises KeyboardInterrupt on call ``stop``."""

    def __init__(self, model, stop: int = 0):
        super().__init__()
        self.inner, self.config, self.stop, self.calls, self.samples = model, model.config, stop, 0, 0

    def forward(self, input_ids, features=None):
        self.calls += 1
        if self.calls == self.stop:
            raise KeyboardInterrupt
        self.samples += input_ids.shape[0]
        return self.inner(input_ids, features)

    def set_query_chunk(self, chunk):
        self.inner.set_query_chunk(chunk)


def interrupt_the_second_length(monkeypatch, stop: int):
    """Patches ``Evaluator.score`` so that the second length a run scores (validation during training aside) is
    scored in batches of 2 samples, its tallies saved after each, and interrupted on batch ``stop``. Returns the
    real method."""
    real = Evaluator.score
    lengths = []

    def score(self, n, count, split="test", bleu=False, partial=None, save_every=30.0, on_batch=None,
              sample_log=None):
        if partial is not None:
            lengths.append(n)
            if len(lengths) == 2:
                self.model = Counting(self.model, stop=stop)
                self.tokens_per_batch = 2 * self.task.max_tokens(n)
                save_every = 0
        return real(self, n, count, split, bleu, partial, save_every, on_batch, sample_log)

    monkeypatch.setattr(Evaluator, "score", score)
    return real


def _untrained(task_name="2back", pe="nape"):
    from lengthbench.tasks import get_task

    task = get_task(task_name)
    torch.manual_seed(0)
    return build_model(build_config(task_name, "softmax", pe, "smoke", **TINY), task).eval(), task


def test_an_interrupted_length_resumes_at_its_next_sample_with_the_same_scores(tmp_path):
    model, task = _untrained()
    n, count = 32, 20
    whole = Evaluator(model, task, CPU, seed=3).score(n, count)
    width = task.max_tokens(n)
    partial = tmp_path / "partial.json"
    # batches of 3 samples; interrupted on the fourth batch, after 9 samples were scored and saved
    first = Counting(model, stop=4)
    with pytest.raises(KeyboardInterrupt):
        Evaluator(first, task, CPU, seed=3, tokens_per_batch=3 * width).score(n, count, partial=partial, save_every=0)
    saved = json.loads(partial.read_text())
    assert saved["key"] == dict(n=n, count=count, split="test", seed=3) and saved["state"]["start"] == 9
    # resumed with another batch size (5): only the 11 samples left are scored, and the tallies equal one pass's
    second = Counting(model)
    seen = []
    resumed = Evaluator(second, task, CPU, seed=3, tokens_per_batch=5 * width).score(
        n, count, partial=partial, save_every=0, on_batch=lambda scored, total: seen.append((scored, total)))
    assert second.samples == count - 9
    assert seen == [(14, 20), (19, 20), (20, 20)]  # the progress a bar shows: from the saved 9, 5 a batch
    for field in ("exact_match", "token_accuracy", "realised_tokens", "n_samples"):
        assert getattr(resumed, field) == getattr(whole, field), field
    assert resumed.earlier_seconds >= 0.0 and whole.earlier_seconds == 0.0


def test_a_partial_file_of_another_length_or_seed_is_ignored(tmp_path):
    model, task = _untrained()
    partial = tmp_path / "partial.json"
    width = task.max_tokens(32)
    with pytest.raises(KeyboardInterrupt):
        Evaluator(Counting(model, stop=2), task, CPU, seed=3, tokens_per_batch=2 * width).score(
            32, 10, partial=partial, save_every=0)
    assert json.loads(partial.read_text())["state"]["start"] == 2
    for n, seed in ((16, 3), (32, 4)):
        fresh = Counting(model)
        Evaluator(fresh, task, CPU, seed=seed).score(n, 10, partial=partial)
        assert fresh.samples == 10, (n, seed)  # every sample scored: nothing taken from the other length's tallies


def test_bleu_cannot_resume():
    model, task = _untrained()
    with pytest.raises(ValueError, match="not resumable"):
        Evaluator(model, task, CPU, seed=0).score(16, 4, bleu=True, partial=Path("unused.json"))


def test_bleu_of_a_task_with_answer_groups():
    # passkey marks its answer's groups; their tally once took the BLEU tally's name and the second batch failed
    model, task = _untrained("passkey", "rope")
    oracle = oracle_model(model.config, task.vocab_size)
    width = task.max_tokens(64)
    scores = Evaluator(oracle, task, CPU, seed=0, tokens_per_batch=2 * width).score(64, 8, bleu=True)
    assert scores.bleu == pytest.approx(1.0)
    assert scores.per_group and all(value == 1.0 for value in scores.per_group.values())


def test_a_run_interrupted_within_a_length_resumes_there(tmp_path, monkeypatch):
    store = tmp_path / "store"
    config = build_config("2back", "softmax", "nape", "smoke", train_samples=640, **TINY)
    run_cell(config, store, device="cpu", progress=False)
    real = interrupt_the_second_length(monkeypatch, stop=4)  # 6 of its samples scored (saved), then stopped
    with pytest.raises(KeyboardInterrupt):
        rescore_run(store, config.run_id, samples=12, device="cpu", progress=False)
    rescored_id = build_config("2back", "softmax", "nape", "smoke", train_samples=640,
                               **dict(TINY, eval_samples=12, rescored_from=config.run_id)).run_id
    folder = checkpoint_dir(store, rescored_id)
    assert not run_finished(store, rescored_id)
    assert json.loads((folder / "eval_samples_partial.json").read_text())["state"]["start"] == 6
    left = []

    def counted(self, n, count, split="test", bleu=False, partial=None, save_every=30.0, on_batch=None,
                sample_log=None):
        self.model = Counting(self.model)
        result = real(self, n, count, split, bleu, partial, save_every, on_batch, sample_log)
        left.append(self.model.samples)
        return result

    monkeypatch.setattr(Evaluator, "score", counted)
    frame = rescore_run(store, config.run_id, samples=12, device="cpu", progress=False)
    assert left == [6]  # the second length's last 6 samples, nothing else
    assert not (folder / "eval_samples_partial.json").exists() and sorted(frame["multiplier"]) == [1, 2]
    monkeypatch.setattr(Evaluator, "score", real)
    model_scores = {row.eval_length: row.exact_match for row in frame.itertuples()}
    from lengthbench.runner import load_model

    model, task, _ = load_model(store, config.run_id)
    for n, value in model_scores.items():
        assert value == Evaluator(model, task, CPU, seed=config.seed).score(n, 12).exact_match


def test_a_staged_cell_carried_to_another_store_is_scored_without_its_stages_model(tmp_path, monkeypatch):
    # a cell trained on one GPU machine, scored to 512x, its checkpoint carried to another to finish;
    # there its earlier stage has a run file but no model, and the cell must not need one
    import shutil

    from lengthbench.errors import UsageError
    from lengthbench.sweep import add_stages, plan_cells

    cells = plan_cells(["2back:softmax:nape"], [0], "smoke", dict(TINY, train_samples=640))
    stage, cell = add_stages(cells, [{"train_length": 16}], "smoke", dict(TINY, train_samples=640))
    first = tmp_path / "first"
    run_cell(stage, first, device="cpu", progress=False)
    real = interrupt_the_second_length(monkeypatch, stop=3)  # 4 of its samples scored (saved), then stopped
    with pytest.raises(KeyboardInterrupt):
        run_cell(cell, first, device="cpu", progress=False)
    monkeypatch.setattr(Evaluator, "score", real)
    for name, resume in (("second", True), ("third", False)):
        store = tmp_path / name
        (store / "runs").mkdir(parents=True)
        shutil.copy(first / "runs" / f"{stage.run_id}.parquet", store / "runs")
        # what the device script sends back of an unfinished cell: not train.pt (the optimizer's moments too)
        checkpoint_dir(store, cell.run_id).mkdir(parents=True)
        for file in ("model.pt", "config.json", "eval_rows.json", "eval_samples_partial.json"):
            shutil.copy(checkpoint_dir(first, cell.run_id) / file, checkpoint_dir(store, cell.run_id))
        # what `lengthbench sweep --dry-run` says of each
        assert run_status(store, stage) == "in the store"
        assert run_status(store, cell) == "to resume: trained, 1 of 2 lengths scored, 2x at 4 of 8 samples"
        if not resume:
            with pytest.raises(UsageError, match="no model of its earlier stage"):
                run_cell(cell, store, device="cpu", progress=False, resume=False)
            continue
        carried = run_cell(cell, store, device="cpu", progress=False)
    assert not checkpoint_dir(tmp_path / "second", stage.run_id).exists()
    assert run_status(tmp_path / "second", cell) == "in the store"
    here = run_cell(cell, first, device="cpu", progress=False)  # finished where it was trained, for comparison
    columns = ["multiplier", "exact_match", "token_accuracy", "train_steps", "best_step"]
    assert carried[columns].equals(here[columns])


def test_run_status_of_a_run_not_yet_scored(tmp_path):
    config = build_config("2back", "softmax", "nape", "smoke", **TINY)
    assert run_status(tmp_path, config) == "to run"
    folder = checkpoint_dir(tmp_path, config.run_id)
    folder.mkdir(parents=True)
    (folder / "train.pt").write_bytes(b"")
    assert run_status(tmp_path, config) == "to resume from its training checkpoint"
    (folder / "model.pt").write_bytes(b"")
    assert run_status(tmp_path, config) == "to resume: trained"
    (folder / "eval_rows.json").write_text("not json")
    assert run_status(tmp_path, config) == "to resume: trained (its scoring files are unreadable)"
