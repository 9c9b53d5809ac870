"""The spine end to end on CPU: training, selection, evaluation, the store, resume."""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import oracle_model

from lengthbench.config import build_config
from lengthbench.data import TrainStream, make_train_batch
from lengthbench.runner import Evaluator, build_model, learning_rate, load_model, run_cell
from lengthbench.store import CONTRACT_COLUMNS, load_results
from lengthbench.tasks import get_task

TINY = dict(d_model=32, n_heads=4, ffn=64, n_layers=1, max_multiplier=4, eval_samples=16, val_samples=16,
            eval_every=50, checkpoint_every=50, diagnostics=False)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = build_config("copy", "softmax", "nape", "smoke", train_samples=3200, batch_size=32, warmup_steps=10,
                          lr=1e-3, min_lr_ratio=0.1)
    rates = [learning_rate(config, s) for s in range(config.train_steps)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:], strict=False))
    assert rates[-1] == pytest.approx(1e-4, rel=0.05)


def test_training_batches_are_a_function_of_the_step():
    stream = TrainStream("copy", (), 0, 8, 64, None)
    a, b = make_train_batch(stream, 5), make_train_batch(stream, 5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    lengths = {(make_train_batch(stream, s)[0].shape[1] - 3) // 2 for s in range(40)}
    assert min(lengths) >= 32 and max(lengths) <= 64 and len(lengths) > 5
    padded = make_train_batch(TrainStream("copy", (), 0, 8, 64, 131, pad_multiple=1000), 5)
    assert padded[0].shape[1] == 131 and (padded[1][:, a[0].shape[1]:] == -100).all()


def test_data_worker_processes_leave_ctrl_c_to_the_main_process():
    """A SIGINT that reaches the data workers (Ctrl-C goes to the whole process group) neither kills them nor
    makes them print tracebacks: the main process handles it, and batches keep coming until then."""
    from lengthbench.data import BatchProducer

    stream = TrainStream("copy", (), 0, 4, 16, None, 1)
    producer = BatchProducer(stream, 0, 6, workers=1)
    try:
        first = next(producer)
        workers = list(producer.executor._processes.values())
        assert workers and all(worker.is_alive() for worker in workers)
        for worker in workers:
            os.kill(worker.pid, signal.SIGINT)
        time.sleep(0.5)
        assert all(worker.is_alive() for worker in workers)
        rest = list(producer)
        assert len(rest) == 5
        assert np.array_equal(first[0], make_train_batch(stream, 0)[0])
    finally:
        producer.close()


def test_training_batches_pad_to_bucket_widths():
    stream = TrainStream("copy", (), 0, 8, 64, 131, pad_multiple=8)
    assert stream.widths() == [72, 80, 88, 96, 104, 112, 120, 128, 131]
    for step in range(30):
        raw = make_train_batch(TrainStream("copy", (), 0, 8, 64, None), step)
        ids, labels, _ = make_train_batch(stream, step)
        width = raw[0].shape[1]
        assert ids.shape[1] in stream.widths() and width <= ids.shape[1] < width + 8
        assert np.array_equal(ids[:, :width], raw[0]) and (labels[:, width:] == -100).all()


@pytest.mark.parametrize("pe", ["nape", "rope", "alibi", "none"])
def test_trailing_pads_change_no_output(pe):
    # Bucketed padding relies on it: a causal model's outputs before the pads do not see them.
    task = get_task("copy")
    torch.manual_seed(0)
    model = build_model(build_config("copy", "softmax", pe, "smoke", **TINY), task).eval()
    ids = torch.as_tensor(task.batch(np.arange(3), 40, "train", 0).input_ids)
    padded = torch.nn.functional.pad(ids, (0, 13))
    with torch.no_grad():
        assert torch.allclose(model(ids), model(padded)[:, : ids.shape[1]], atol=1e-5)


def test_evaluator_scores_a_perfect_and_a_wrong_model():
    task = get_task("copy")
    config = build_config("copy", "softmax", "nape", "smoke", **TINY)
    model = build_model(config, task)

    scores = Evaluator(oracle_model(model.config, task.vocab_size), task, torch.device("cpu"), seed=0).score(16, 10)
    assert scores.exact_match == 1.0 and scores.token_accuracy == 1.0 and scores.realised_tokens == 35
    wrong = Evaluator(model, task, torch.device("cpu"), seed=0).score(16, 10)  # untrained
    assert wrong.exact_match == 0.0 and wrong.token_accuracy < 0.5


def test_run_cell_writes_every_contract_column_and_is_deterministic(tmp_path):
    config = build_config("2back", "softmax", "nape", "smoke", train_samples=1600, **TINY)
    lines = []
    first = run_cell(config, tmp_path / "a", device="cpu", progress=False, log=lines.append)
    second = run_cell(config, tmp_path / "b", device="cpu", progress=False)
    # plain log lines (what a sweep worker writes to its log): each validation, then each length
    assert [line.split(": ")[0] for line in lines] == [
        f"{config.run_id} step 50/50", *(f"{config.run_id} eval {m}x (n = {64 * m})" for m in (1, 2, 4))]
    assert all(c in first.columns for c in CONTRACT_COLUMNS)
    assert list(first["multiplier"]) == [1, 2, 4] and list(first["eval_length"]) == [64, 128, 256]
    assert first["token_accuracy"].tolist() == second["token_accuracy"].tolist()
    assert first["token_accuracy"].between(0, 1).all() and (first["n_samples"] == 16).all()
    assert first["score"].tolist() == first["token_accuracy"].tolist()  # 2back reports token accuracy
    # a finished cell is not run again
    again = run_cell(config, tmp_path / "a", device="cpu", progress=False)
    assert again["created_at"].tolist() == first["created_at"].tolist()
    model, task, loaded = load_model(tmp_path / "a", config.run_id)
    assert loaded == config and task.name == "2back"


def test_scoring_resumes_from_model_pt_alone(tmp_path):
    """A run trained on one machine and scored on another carries only model.pt (and the rows scored so far)."""
    import json
    import shutil

    config = build_config("2back", "softmax", "nape", "smoke", train_samples=1600, **TINY)
    first = run_cell(config, tmp_path / "a", device="cpu", progress=False)
    source, target = tmp_path / "a" / "checkpoints" / config.run_id, tmp_path / "b" / "checkpoints" / config.run_id
    target.mkdir(parents=True)
    shutil.copy(source / "model.pt", target / "model.pt")
    assert not (source / "train.pt").exists()  # a finished run keeps model.pt only
    scored = first[first.multiplier == 1].drop(columns="created_at").to_dict("records")
    (target / "eval_rows.json").write_text(json.dumps(scored))  # interrupted after 1x
    lines = []
    second = run_cell(config, tmp_path / "b", device="cpu", progress=False, log=lines.append)
    assert [line.split(": ")[0] for line in lines] == [f"{config.run_id} eval {m}x (n = {64 * m})" for m in (2, 4)]
    for column in ("exact_match", "token_accuracy", "train_steps", "train_seconds", "best_step", "multiplier"):
        assert second[column].tolist() == first[column].tolist(), column
    # a model.pt without the training state (before this change) or of another run is not taken for a trained run
    saved = torch.load(source / "model.pt", weights_only=False)
    for stale in ({k: v for k, v in saved.items() if k != "state"},
                  dict(saved, config=dict(saved["config"], seed=1)),
                  dict(saved, state=dict(saved["state"], step=10))):
        target = tmp_path / "c" / "checkpoints" / config.run_id
        target.mkdir(parents=True, exist_ok=True)
        torch.save(stale, target / "model.pt")
        lines = []
        run_cell(config, tmp_path / "c", device="cpu", progress=False, log=lines.append, restart=False)
        assert lines[0].startswith(f"{config.run_id} step 50/50")  # trained again
        shutil.rmtree(tmp_path / "c")


@pytest.mark.slow
def test_smoke_2back_learns_in_distribution(tmp_path):
    config = build_config("2back", "softmax", "nape", "smoke", max_multiplier=2, eval_samples=64)
    frame = run_cell(config, tmp_path, device="cpu", progress=False)
    assert frame.loc[frame.multiplier == 1, "token_accuracy"].item() >= 0.95


def _run_cli(args, results, **kwargs):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "lengthbench.cli", *args, "--results", str(results), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs)


def test_killed_run_resumes_to_the_same_rows(tmp_path):
    # 350 steps: the smoke preset's checkpoint at step 250, then 100 more for the kill to land in
    args = ["run", "--task", "copy", "--attn", "softmax", "--pe", "nape", "--train-samples", "2800",
            "--batch-size", "8", "--d-model", "16", "--heads", "2", "--ffn", "32", "--layers", "1",
            "--max-multiplier", "2", "--eval-samples", "16", "--no-diagnostics"]
    config = build_config("copy", "softmax", "nape", "smoke", train_samples=2800, batch_size=8, d_model=16,
                          n_heads=2, ffn=32, n_layers=1, max_multiplier=2, eval_samples=16, diagnostics=False)
    checkpoint = tmp_path / "killed" / "checkpoints" / config.run_id / "train.pt"
    fresh = _run_cli(args, tmp_path / "fresh")  # the uninterrupted run, beside the one to be killed
    process = _run_cli(args, tmp_path / "killed")
    deadline = time.time() + 120
    while not checkpoint.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert checkpoint.exists(), "no checkpoint was written"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert load_results(tmp_path / "killed").empty  # nothing half-written in the store

    refused = _run_cli(args, tmp_path / "killed")
    output = refused.communicate()[0]
    assert refused.returncode == 2 and "--resume" in output

    resumed = _run_cli(args + ["--resume"], tmp_path / "killed")
    assert resumed.wait() == 0, resumed.stdout.read()
    assert fresh.wait() == 0, fresh.stdout.read()
    a, b = load_results(tmp_path / "killed"), load_results(tmp_path / "fresh")
    assert a["run_id"].tolist() == b["run_id"].tolist()
    assert a["exact_match"].tolist() == b["exact_match"].tolist()
    assert a["token_accuracy"].tolist() == b["token_accuracy"].tolist()


def test_quiet_run_logs_each_validation(tmp_path):
    args = ["run", "--task", "copy", "--attn", "softmax", "--pe", "nape", "--train-samples", "160",
            "--batch-size", "16", "--d-model", "16", "--heads", "2", "--ffn", "32", "--layers", "1",
            "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--eval-every", "4"]
    process = _run_cli(args, tmp_path)
    output = process.communicate()[0]
    assert process.returncode == 0, output
    steps = [line.split(" step ")[1].split(":")[0] for line in output.splitlines()
             if " step " in line and line.startswith("copy-")]  # (not the closing "trained ...: step 10 kept")
    assert steps == ["4/10", "8/10", "10/10"]
    assert "eval 2x" in output


def test_feature_task_runs_end_to_end_and_the_model_reads_the_features(tmp_path):
    """Max Retrieval's priorities reach the model: logits change with the features alone."""
    config = build_config("maxretrieval", "softmax", "nape", "smoke", train_samples=320, batch_size=32, d_model=32,
                          n_heads=4, ffn=64, n_layers=1, max_multiplier=2, eval_samples=8, val_samples=8,
                          diagnostics=False, train_length=16)
    frame = run_cell(config, tmp_path, device="cpu", progress=False)
    assert list(frame["eval_length"]) == [16, 32]
    model, task, _ = load_model(tmp_path, config.run_id)
    batch = task.batch([0, 1], 16, "test", 0)
    assert batch.features is not None
    ids = torch.from_numpy(batch.input_ids)
    features = torch.from_numpy(batch.features)
    with torch.no_grad():
        a, b = model(ids, features), model(ids, features.flip(-1))
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("attn, pe, kernel, dense", [
    ("softmax", "rope", None, False),          # SDPA: no graph break
    ("ssmax", "nape", None, False),            # row-scaled softmax: SDPA too
    ("sieve", "none", "sieve", True),          # fused op: trains on the dense reference at short lengths
    ("asentmax", "nape", "entmax", True),      # reuses the entmax op
    ("tda", "rope", "tda", True),              # the one-pass op
    ("tda", "rope", "tra", False),             # two tra passes are no longer what the module calls
])
def test_compiled_training_and_dense_references(monkeypatch, attn, pe, kernel, dense):
    from lengthbench.models.attention import registry
    from lengthbench.runner import DENSE_TRAIN_MAX_TOKENS, Trainer, compiles, trains_dense

    monkeypatch.setattr(registry, "get_kernel", lambda name, **kw: (lambda *a, **k: None) if name == kernel else None)
    monkeypatch.setattr(registry, "has_kernel", lambda name: name == kernel)  # the layers ask before loading an op
    config = build_config("copy", attn, pe, "paper", **{**TINY, "compile": True, "train_attention": "reference"})
    task = get_task("copy")
    trainer = Trainer(config, task, torch.device("cpu"), Path("/nonexistent"), progress=False)
    assert not trainer.compiled and not trainer.dense  # never on a CPU
    cuda = torch.device("cuda")
    narrow = task.max_tokens(config.train_length)
    assert narrow <= DENSE_TRAIN_MAX_TOKENS
    # by default a model with fused ops trains on them (eagerly), as every such row in the store did
    fused = build_config("copy", attn, pe, "paper", **{**TINY, "compile": True})
    assert fused.train_attention == "fused" and fused.run_id != config.run_id
    assert not trains_dense(fused, trainer.model, cuda, narrow)
    assert compiles(fused, trainer.model, cuda, narrow) == (not dense)
    with pytest.raises(ValueError, match="train attention"):
        build_config("copy", attn, pe, "paper", train_attention="dense")
    assert compiles(config, trainer.model, cuda, narrow)  # every model, at the papers' length
    assert trains_dense(config, trainer.model, cuda, narrow) == dense
    # wide batches: a model with fused ops trains on them, eagerly
    assert compiles(config, trainer.model, cuda, DENSE_TRAIN_MAX_TOKENS + 1) == (not dense)
    assert not trains_dense(config, trainer.model, cuda, DENSE_TRAIN_MAX_TOKENS + 1)
    no_compile = dataclasses.replace(config, compile=False)
    assert not compiles(no_compile, trainer.model, cuda, narrow)
    assert not trains_dense(no_compile, trainer.model, cuda, narrow)
    trainer.compiled = compiles(config, trainer.model, cuda, narrow)
    trainer.dense = trains_dense(config, trainer.model, cuda, narrow)
    stream = trainer.train_stream()
    assert stream.pad_to is not None
    if dense:  # one width: Inductor compiles a dense reference's graph slowly
        assert stream.widths() == [narrow]
    else:  # bucket widths, one graph each
        assert 1 < len(stream.widths()) <= Trainer.max_widths
    assert trainer.compile_mode() == "reduce-overhead"
    with pytest.raises(ValueError, match="compile mode"):
        build_config("copy", attn, "none", "paper", compile_mode="fast")


def test_attention_kernels_switches_and_restores_the_flags():
    from lengthbench.runner import attention_kernels, build_model

    config = build_config("copy", "entmax", "rope", "smoke", **{**TINY, "n_layers": 3})
    model = build_model(config, get_task("copy"))
    model.blocks[1].attn.use_kernels = False
    flags = [block.attn.use_kernels for block in model.blocks]
    assert flags == [True, False, True]
    with attention_kernels(model, False):
        assert [block.attn.use_kernels for block in model.blocks] == [False] * 3
        with attention_kernels(model, flags):
            assert [block.attn.use_kernels for block in model.blocks] == flags
        assert [block.attn.use_kernels for block in model.blocks] == [False] * 3
    assert [block.attn.use_kernels for block in model.blocks] == flags
    with pytest.raises(RuntimeError), attention_kernels(model, False):
        raise RuntimeError("a failing step")
    assert [block.attn.use_kernels for block in model.blocks] == flags


def _break_step_31(monkeypatch, breaking):
    """Wrap the training step so that ``breaking(trainer)`` runs before the 31st step and the context manager
    it returns (if any) is left after it."""
    from lengthbench import runner

    original = runner.Trainer._make_step_fn

    def step_fn(trainer):
        step = original(trainer)

        def wrapped(*batch):
            if trainer.state.step != 30:
                return step(*batch)
            with breaking(trainer):
                return step(*batch)

        return wrapped

    monkeypatch.setattr(runner.Trainer, "_make_step_fn", step_fn)


def _diverging_run(tmp_path, message: str, checkpoint_every: int = 25, eval_every: int = 25) -> int:
    """Run a tiny cell that must stop with ``message``, write no rows and leave finite weights; the step of
    the checkpoint it left."""
    from lengthbench.errors import TrainingDiverged

    config = build_config("2back", "softmax", "nape", "smoke", train_samples=32 * 100,
                          **dict(TINY, eval_every=eval_every, checkpoint_every=checkpoint_every))
    with pytest.raises(TrainingDiverged, match=message):
        run_cell(config, tmp_path, device="cpu", progress=False)
    assert load_results(tmp_path).empty
    saved = torch.load(tmp_path / "checkpoints" / config.run_id / "train.pt", weights_only=False)
    assert all(torch.isfinite(value).all() for value in saved["model"].values())
    return saved["state"]["step"]


def test_a_diverged_run_stops_with_its_last_good_checkpoint_and_writes_no_rows(tmp_path, monkeypatch, capsys):
    """A loss that turns NaN stops training at the next report: one-line error, exit code 1, nothing in the
    store, and the checkpoint on disk holds the finite weights of before (never the broken ones)."""
    from lengthbench.cli import main

    @contextlib.contextmanager
    def poison(trainer):  # the 31st step: poison the weights, as a blown-up update would
        with torch.no_grad():
            next(trainer.model.parameters()).fill_(float("nan"))
        yield

    _break_step_31(monkeypatch, poison)
    assert _diverging_run(tmp_path, "steps 26-50 is nan") == 25

    monkeypatch.setattr(sys, "argv", ["lengthbench", "run", "--task", "2back", "--attn", "softmax", "--pe", "nape",
                                      "--train-samples", "3200", "--d-model", "32", "--heads", "4", "--ffn", "64",
                                      "--layers", "1", "--eval-every", "25", "--no-diagnostics", "--quiet",
                                      "--results", str(tmp_path / "cli")])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    printed = capsys.readouterr()
    assert "training diverged: the mean loss of steps 26-50 is nan" in " ".join((printed.out + printed.err).split())


def test_a_gradient_that_overflows_before_the_loss_is_named_as_such(tmp_path, monkeypatch):
    """Entmax at alpha 64 overflowed its backward at step 1 with a finite loss (measured): the NaN loss came a
    step later and the error advised a lower learning rate. The error now says the gradient came first."""

    @contextlib.contextmanager
    def overflow(trainer):  # the 31st step: its loss is finite, its backward overflows
        hook = next(trainer.model.parameters()).register_hook(lambda g: torch.full_like(g, float("inf")))
        try:
            yield
        finally:
            hook.remove()

    _break_step_31(monkeypatch, overflow)
    assert _diverging_run(tmp_path, "the gradient norm of step 31 is not finite while its loss was") == 25
    # a checkpoint between reports is guarded too: the weights broken at step 31 are not saved at step 40
    assert _diverging_run(tmp_path / "b", "step 31", checkpoint_every=20, eval_every=100) == 20


def test_reverse_is_scored_at_its_extra_point_and_the_tables_show_it(tmp_path):
    """Long-Context Generalization with Sparse Attention reports Reverse at 1.5x: the run scores n = 96, the store keeps multiplier 1.5, and the
    leaderboard, the check's curve and the run's table label it "1.5x", between 1x and 2x."""
    from lengthbench.check import curve_of
    from lengthbench.cli.run import curve_table
    from lengthbench.leaderboard import board_multipliers, build_leaderboard, to_markdown

    config = build_config("reverse", "softmax", "nape", "smoke", train_samples=320, **dict(TINY, max_multiplier=2))
    frame = run_cell(config, tmp_path, device="cpu", progress=False)
    assert list(frame["multiplier"]) == [1, 1.5, 2] and list(frame["eval_length"]) == [64, 96, 128]
    assert list(curve_of(frame)) == [1, 1.5, 2]
    board = build_leaderboard(load_results(tmp_path))
    assert board_multipliers(board) == [1, 1.5, 2] and "1.5x" in board.columns
    assert "| 1× | 1.5× | 2× |" in to_markdown(board)
    labels = [cell.plain if hasattr(cell, "plain") else str(cell) for cell in curve_table(frame, "t").columns[0]._cells]
    assert labels == ["1x", "1.5x", "2x"]


def test_a_run_can_start_from_another_runs_trained_weights(tmp_path):
    """``init_from`` (``--init-from``): a curriculum, e.g. two-token MQMTAR before single-token (REPRODUCTION.md)."""
    from lengthbench.errors import UsageError
    from lengthbench.leaderboard import protocol_label
    from lengthbench.runner import Trainer, checkpoint_dir
    from lengthbench.tasks import get_task

    first = build_config("2back", "softmax", "nape", "smoke", train_samples=640, **TINY)
    run_cell(first, tmp_path, device="cpu", progress=False)
    trained = torch.load(checkpoint_dir(tmp_path, first.run_id) / "model.pt", weights_only=False)["model"]

    second = build_config("2back", "softmax", "nape", "smoke", train_samples=640, init_from=first.run_id, **TINY)
    assert second.run_id != build_config("2back", "softmax", "nape", "smoke", train_samples=640, **TINY).run_id
    assert first.identity()["init_from"] == ""  # the run id hashes the whole configuration
    trainer = Trainer(second, get_task("2back"), torch.device("cpu"), tmp_path, progress=False)
    for key, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, trained[key]), key
    frame = run_cell(second, tmp_path, device="cpu", progress=False)
    assert protocol_label(frame["config_json"].iloc[0]).endswith(f", from {first.run_id}")

    missing = build_config("2back", "softmax", "nape", "smoke", init_from="no-such-run", **TINY)
    with pytest.raises(UsageError, match="no trained model of that run"):
        run_cell(missing, tmp_path, device="cpu", progress=False)
    wider = build_config("2back", "softmax", "nape", "smoke", init_from=first.run_id,
                         **{**TINY, "d_model": 2 * TINY.get("d_model", 64)})
    with pytest.raises(UsageError, match="does not fit this one"):
        run_cell(wider, tmp_path, device="cpu", progress=False)


def test_init_part_body_carries_all_but_the_vocabulary_layers_across_tasks(tmp_path):
    """``--init-part body``: single-token MQMTAR's weights start MQRAR (another vocabulary); the embedding and
    output layer are the fresh initialisation, everything else the source's."""
    from lengthbench.errors import UsageError
    from lengthbench.leaderboard import protocol_label
    from lengthbench.runner import VOCAB_PARAMETERS, Trainer, checkpoint_dir
    from lengthbench.tasks import get_task

    params = {"key_tokens": 1, "value_tokens": 1}
    first = build_config("mqmtar", "softmax", "rope", "smoke", train_samples=320, task_params=params, **TINY)
    run_cell(first, tmp_path, device="cpu", progress=False)
    trained = torch.load(checkpoint_dir(tmp_path, first.run_id) / "model.pt", weights_only=False)["model"]

    plain = build_config("mqrar", "softmax", "rope", "smoke", train_samples=320, **TINY)
    whole = build_config("mqrar", "softmax", "rope", "smoke", train_samples=320, init_from=first.run_id, **TINY)
    with pytest.raises(UsageError, match="embed.weight.*--init-part body"):  # the vocabularies differ
        run_cell(whole, tmp_path, device="cpu", progress=False)
    body = build_config("mqrar", "softmax", "rope", "smoke", train_samples=320, init_from=first.run_id,
                        init_part="body", **TINY)
    assert whole.identity()["init_part"] == "all" and body.run_id != whole.run_id
    fresh = Trainer(plain, get_task("mqrar"), torch.device("cpu"), tmp_path, progress=False).model.state_dict()
    started = Trainer(body, get_task("mqrar"), torch.device("cpu"), tmp_path, progress=False).model.state_dict()
    for key, tensor in started.items():
        assert torch.equal(tensor, fresh[key] if key in VOCAB_PARAMETERS else trained[key]), key
    assert trained["embed.weight"].shape != started["embed.weight"].shape
    frame = run_cell(body, tmp_path, device="cpu", progress=False)
    assert protocol_label(frame["config_json"].iloc[0]).endswith(
        f", from {first.run_id} (all but the embedding and output layer)")
    with pytest.raises(ValueError, match="--init-part needs --init-from"):
        build_config("mqrar", "softmax", "rope", "smoke", init_part="body", **TINY)
    with pytest.raises(ValueError, match="unknown init part"):
        build_config("mqrar", "softmax", "rope", "smoke", init_from=first.run_id, init_part="head", **TINY)


def test_dry_run_prints_the_run_id_and_state_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """``--dry-run``: the run id a script can pass to ``--init-from``, whether the store has the run; no training."""
    from cli_helpers import cli

    args = ["run", "--task", "2back", "--attn", "softmax", "--pe", "nape", "--results", tmp_path,
            "--train-samples", "320", "--batch-size", "16", "--d-model", "16", "--heads", "2", "--ffn", "32",
            "--layers", "1", "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--quiet"]
    config = build_config("2back", "softmax", "nape", "smoke", train_samples=320, batch_size=16, d_model=16,
                          n_heads=2, ffn=32, n_layers=1, max_multiplier=2, eval_samples=4, diagnostics=False)
    assert cli(monkeypatch, *args, "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == config.run_id
    assert lines[-1] == "dry run: not started"
    assert not any(tmp_path.iterdir())  # nothing written
    assert cli(monkeypatch, *args) == 0
    capsys.readouterr()
    assert cli(monkeypatch, *args, "--dry-run") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "dry run: finished: in the store"
    assert cli(monkeypatch, *args, "--dry-run", "--param", "nope=1") == 2  # still checks the arguments


def test_dense_training_steps_on_references_and_validates_on_fused_ops(tmp_path, monkeypatch):
    """With ``dense`` (on CUDA: narrow batches of a model with fused ops) every training step runs with the
    kernels off and every validation with the layers' own flags; the flags are back after training."""
    from lengthbench.models.attention.entmax import EntmaxAttention
    from lengthbench.runner import Trainer

    seen = []
    original = EntmaxAttention.attend

    def attend(self, q, k, v, x):
        seen.append((self.training, self.use_kernels))
        return original(self, q, k, v, x)

    monkeypatch.setattr(EntmaxAttention, "attend", attend)
    config = build_config("2back", "entmax", "rope", "smoke", train_samples=16 * 6, batch_size=16,
                          **dict(TINY, eval_every=3, checkpoint_every=3))
    trainer = Trainer(config, get_task("2back"), torch.device("cpu"), tmp_path, progress=False)
    trainer.dense = True  # as trains_dense decides on CUDA
    trainer.train()
    assert trainer.state.step == 6
    training = [flag for is_training, flag in seen if is_training]
    validation = [flag for is_training, flag in seen if not is_training]
    assert len(training) == 6 and not any(training)
    assert validation and all(validation)
    assert all(block.attn.use_kernels for block in trainer.model.blocks)


def test_the_step_window_keeps_each_step_and_names_the_first_that_broke():
    """The training loop's per-step record (two launches a step, read at reports and checkpoints): the window's
    losses, norms and counts come back as written; a non-finite gradient norm before any non-finite loss is an
    error naming its step, a non-finite loss first (or in the same step) is returned for the caller's message;
    a full window refuses another step."""
    import numpy as np

    from lengthbench.errors import TrainingDiverged
    from lengthbench.training import _StepWindow

    window = _StepWindow(4, 26, torch.device("cpu"))
    for loss, correct, scored, norm in ((2.5, 3, 8, 0.5), (2.0, 5, 8, 0.25), (1.5, 7, 9, 0.125)):
        window.add(torch.tensor(loss), torch.tensor(correct), torch.tensor(scored), torch.tensor(norm))
    losses, norms, correct, scored = window.read()
    assert list(losses) == [2.5, 2.0, 1.5] and list(norms) == [0.5, 0.25, 0.125]
    assert list(correct) == [3, 5, 7] and list(scored) == [8, 8, 9]
    assert window.check(losses, norms, "r", 1e-3) == -1
    nan, inf = float("nan"), float("inf")
    assert window.check(np.array([1.0, nan, nan]), np.array([1.0, 1.0, nan]), "r", 1e-3) == 27
    assert window.check(np.array([1.0, nan]), np.array([1.0, inf]), "r", 1e-3) == 27  # the same step: the loss's
    with pytest.raises(TrainingDiverged, match=r"the gradient norm of step 27 is not finite while its loss was "
                                               r"\(learning rate 0.001\)"):
        window.check(np.array([1.0, 1.0, nan]), np.array([1.0, inf, nan]), "r", 1e-3)
    window.add(torch.tensor(1.0), torch.tensor(1), torch.tensor(1), torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="window of 4 training steps is full"):
        window.add(torch.tensor(1.0), torch.tensor(1), torch.tensor(1), torch.tensor(1.0))
    window.restart(51)
    assert window.first == 51 and [len(x) for x in window.read()] == [0, 0, 0, 0]
