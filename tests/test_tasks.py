"""The contract every registered task keeps, determinism of the streams, golden samples, and the CLI.

One parametrised test runs over every registered task, so adding a task adds its tests; what the
samples mean is checked in ``test_task_meaning.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from lengthbench.tasks import IGNORE_INDEX, SPLITS, get_task, task_names

ALL_TASKS = task_names()


def lengths_for(task) -> list[int]:
    return sorted({task.min_length(), max(task.min_length(), 64), max(task.min_length() + 1, 65), 4096})


@pytest.mark.parametrize("name", ALL_TASKS)
def test_contract(name):
    task = get_task(name)
    vocab = task.vocab
    assert vocab[0] == "<pad>"
    assert len(set(vocab)) == len(vocab), "symbols must be unique"
    for symbol in vocab:  # role tokens in angle brackets, data tokens without any
        assert re.fullmatch(r"<[a-z]+>", symbol) or ("<" not in symbol and ">" not in symbol), symbol
    assert {"<pad>", "<bos>"} <= set(vocab)
    doc = (type(task).__doc__ or "").strip()
    assert doc and not doc.startswith("A task family"), "the class docstring's first line is shown by tasks list"
    assert sys.modules[type(task).__module__].__doc__.count("input_ids") >= 1, "module docstring: worked example"
    assert task.metric in ("exact_match", "token_accuracy")
    d = task.model_defaults
    assert d.layers >= 1 and d.d_model % d.heads == 0 and d.train_samples > 0

    for n in lengths_for(task):
        batch = task.batch(range(3), n, "test", 0)
        width = batch.input_ids.shape[1]
        assert batch.input_ids.dtype == np.int64 and batch.labels.dtype == np.int64
        assert batch.labels.shape == batch.input_ids.shape and batch.nominal_length == n
        assert ((batch.input_ids >= 0) & (batch.input_ids < task.vocab_size)).all()
        scored = batch.labels != IGNORE_INDEX
        assert ((batch.labels[scored] >= 0) & (batch.labels[scored] < task.vocab_size)).all()
        assert (batch.realised_tokens <= task.max_tokens(n)).all() and batch.realised_tokens.max() == width
        for b in range(len(batch)):
            end = batch.realised_tokens[b]
            assert (batch.input_ids[b, :end] != 0).all(), "no <pad> inside a sample"
            assert (batch.input_ids[b, end:] == 0).all() and (batch.labels[b, end:] == IGNORE_INDEX).all()
            assert scored[b].any(), "every sample scores something"
        assert (batch.features is not None) == task.has_features
        if batch.features is not None:
            assert batch.features.dtype == np.float32 and batch.features.shape == batch.input_ids.shape
        if batch.groups is not None:
            assert ((batch.groups >= 0) == scored).all(), "a group at each scored position, -1 elsewhere"

    if task.min_length() > 1:
        with pytest.raises(ValueError, match="at least"):
            task.batch([0], task.min_length() - 1)
    low, high = task.train_length_range(task.default_train_length)
    assert task.min_length() <= low <= high


@pytest.mark.parametrize("name", ALL_TASKS)
def test_determinism(name):
    task = get_task(name)
    n = max(task.min_length(), 70)
    whole = task.batch(range(12), n, "test", 3)
    assert len({json.dumps(whole.sample(b)) for b in range(12)}) == 12, "samples differ from each other"
    for indices in ([7], [11, 7, 2], list(range(5, 9))):
        part = task.batch(indices, n, "test", 3)
        for b, i in enumerate(indices):
            assert part.sample(b) == whole.sample(i), f"sample {i} changed with its batch"
    again = get_task(name).batch(range(12), n, "test", 3)
    np.testing.assert_array_equal(again.input_ids, whole.input_ids)
    # Independent streams: splits, seeds and lengths do not share samples.
    streams = {(split, seed): task.batch(range(4), n, split, seed) for split in SPLITS for seed in (3, 4)}
    keys = {json.dumps([streams[s].sample(b) for b in range(4)]) for s in streams}
    assert len(keys) == len(streams)


def test_parameters_change_the_stream():
    a = get_task("flipflop-sparse").batch(range(4), 64).input_ids
    b = get_task("flipflop-sparse", p_write=0.2).batch(range(4), 64).input_ids
    assert not np.array_equal(a, b)
    # An int for a float parameter names the same stream as the float.
    one = get_task("flipflop-sparse", p_write=1).batch(range(4), 64).input_ids
    np.testing.assert_array_equal(one, get_task("flipflop-sparse", p_write=1.0).batch(range(4), 64).input_ids)
    assert get_task("flipflop-dense").params.p_write == 0.8


def golden(name: str, n: int) -> list[str]:
    task = get_task(name)
    batch = task.batch([0, 1, 1000], n, "test", 0)
    out = []
    for b in range(len(batch)):
        sample = batch.sample(b)
        blob = json.dumps({"input_ids": sample["input_ids"], "labels": sample["labels"]}, separators=(",", ":"))
        out.append(hashlib.sha256(blob.encode()).hexdigest()[:16])
    return out


# sha256 (first 16 hex digits) of {"input_ids", "labels"} of samples 0, 1 and 1000 of (test, seed 0).
# A change here changes the samples every stored number was measured on: it comes with a new schema version of
# the results store (``SCHEMA_VERSION``, lengthbench/store.py), so that rows of the old streams are told apart.
GOLDEN = {
    "copy": ["733e5c70e3cb918f", "74a357bee0f1544e", "e2f1c775f921fbd1"],
    "reverse": ["f2d22aac536abc97", "9d3a911066df6cec", "e32183bafeacd699"],
    "sort": ["de6802325e3d4fa8", "428779ba9a5fb44c", "d13ceed4dbc5cc04"],
    "flipflop-sparse": ["5ba570a51b554d18", "04cebec1000fe19d", "c74f5d5488fb5f70"],
    "flipflop-dense": ["3366a15ce4018e17", "7c390e15147cd6e6", "a34d46c855503899"],
    "flipflop-liu": ["b750a64e87d4726a", "54b75e46ecce0d89", "14b47aa33977f792"],
    "localcount": ["7c9099e5f6930949", "d850e6d2402e9779", "cc89110612d5a685"],
    "maxretrieval": ["e27977e979932e68", "3e21675039f9688e", "a0e830daff9114ea"],
    "mqmtar": ["51466516081e3e0d", "72f6242dcd47b327", "8467506a63ee881f"],  # schema 2: the authors' layout, keyed on every parameter
    "mqrar": ["1f43169c19fc321e", "eb89b57f43e01c6f", "5867d27ce52c5cb1"],  # schema 2: keyed on value_tokens too
    "2back": ["a55174bf15a650d9", "8fccd0339f81bc53", "7e45dbe8c2a7e2a1"],
    "passkey": ["22287aa78b3f4bf3", "b6febe903d735666", "05415ea0eb514f74"],
    "passkey-multi": ["e65ad67274241724", "af4d8424fb488467", "4fe8491762cc4194"],
}


@pytest.mark.parametrize("name", ALL_TASKS)
def test_golden(name):
    n = max(64, get_task(name).min_length())
    assert name in GOLDEN, f"add GOLDEN[{name!r}] = {golden(name, n)!r}"
    assert golden(name, n) == GOLDEN[name]


def test_vocabularies_are_stable():
    assert get_task("mqmtar").vocab[:7] == ["<pad>", "<bos>", "<sep>", "<eos>", "<space>", "<kv>", "<q>"]
    assert get_task("copy").vocab_size == 36 and get_task("mqmtar").vocab_size == 263
    assert get_task("mqrar").vocab_size == 6 + 256 and get_task("localcount").vocab_size == 3 + 16 + 48


# -- command line ---------------------------------------------------------------------------------

def run_cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    from lengthbench.cli import main

    monkeypatch.setattr(sys, "argv", ["lengthbench", *args])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["tasks", "sample", "mqmtar", "--length", "3"], "at least 6"),
        (["tasks", "sample", "copy", "--count", "0"], "--count"),
        (["tasks", "sample", "copy", "--split", "foo"], "train, val, test"),
        (["tasks", "sample", "nosuchtask"], "choose from"),
        (["tasks", "vocab", "nosuchtask"], "choose from"),
        (["tasks", "sample", "copy", "--param", "symbols=abc"], "symbols"),
        (["tasks", "sample", "copy", "--param", "colour=3"], "no parameter"),
        (["tasks", "sample", "flipflop-liu", "--param", "p_ignore=2"], "p_ignore"),
        (["tasks", "sample", "passkey-multi", "--param", "needles=12", "--length", "999"], "needles"),
        (["tasks", "sample", "copy", "--length", "x"], "length"),
    ],
)
def test_cli_bad_input(monkeypatch, capsys, args, message):
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ALL_TASKS)
def test_cli_sample_json_lines(monkeypatch, capsys, name):
    task = get_task(name)
    n = max(task.min_length(), 20)
    code, out, err = run_cli(monkeypatch, capsys, "tasks", "sample", name, "--length", str(n), "--count", "3",
                             "--start", "5", "--seed", "2")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 3
    batch = task.batch([5, 6, 7], n, "test", 2)
    for b, line in enumerate(lines):
        sample = json.loads(line)
        assert sample == batch.sample(b)
        assert len(sample["input_ids"]) == len(sample["labels"])
        assert ("features" in sample) == task.has_features


def test_cli_vocab_and_list(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "vocab", "passkey")
    assert code == 0 and json.loads(out)["0"] == "<pad>"
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "list")
    assert code == 0
    for name in ALL_TASKS:
        assert name in out


def test_cli_end_to_end():
    """The installed command, in a fresh process: one-line error, exit code 2."""
    command = "from lengthbench.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", command, "tasks", "sample", "mqmtar", "--length", "3"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "at least" in done.stderr


def test_tasks_params_lists_every_parameter(monkeypatch, capsys):
    """``lengthbench tasks params TASK``: what ``--param`` accepts, with defaults and the source's comments."""
    import dataclasses

    from cli_helpers import cli

    from lengthbench.tasks import TASKS

    monkeypatch.setenv("COLUMNS", "200")
    for name in TASKS.names():
        assert cli(monkeypatch, "tasks", "params", name) == 0
        text = capsys.readouterr().out
        for field in dataclasses.fields(TASKS.get(name).Params):
            assert field.name in text, (name, field.name)
    assert cli(monkeypatch, "tasks", "params", "mqrar") == 0
    text = capsys.readouterr().out
    assert "distinct active keys per sample" in text
    assert cli(monkeypatch, "tasks", "params", "no-such-task") == 2
