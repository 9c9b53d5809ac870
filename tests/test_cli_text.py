"""What a new user reads: help grouped into panels and readable at 80 columns, whole plain-text descriptions in the
listings, samples in the task's symbols, and a progress display that fits 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import typer
from cli_helpers import cli
from rich.console import Console

from lengthbench.cli import app
from lengthbench.cli.registry import plain_summary
from lengthbench.models.attention import ATTENTION
from lengthbench.models.positional import POSITIONAL_ENCODINGS
from lengthbench.tasks import IGNORE_INDEX, get_task


def _commands(command, path: tuple[str, ...] = ()):
    """Every command of the CLI (groups included) with its argument path."""
    yield path, command
    if hasattr(command, "commands"):  # a group (typer's own, not click's class)
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


COMMANDS = [path for path, _ in _commands(typer.main.get_command(app))]


def _help(monkeypatch, capsys, path) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("LINES", raising=False)
    assert cli(monkeypatch, *path, "--help") == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "lengthbench")
def test_every_help_fits_80_columns_in_panels(monkeypatch, capsys, path):
    text = _help(monkeypatch, capsys, path)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "╭─ Options" in text or "╭─ Arguments" in text or "╭─ Commands" in text
    assert "…" not in text, "a help text was cut"
    # a docstring's line breaks are not kept: no help line ends mid-sentence followed by a lower-case word
    prose = [line for line in lines if line.startswith(" ") and not line.startswith(" │")]
    for line, following in zip(prose, prose[1:], strict=False):
        assert not (line.strip() and following.strip() and len(line.rstrip()) < 60
                    and following.strip()[0].islower()), (line, following)


def test_top_level_help_groups_the_commands(monkeypatch, capsys):
    text = _help(monkeypatch, capsys, [])
    panels = [name.strip() for name in re.findall(r"╭─ ([^─]+) ─", text)]
    assert panels == ["Options", "Train and score", "Results", "Look up"]


def test_run_help_is_short_and_grouped(monkeypatch, capsys):
    text = _help(monkeypatch, capsys, ["run"])
    panels = [name.strip() for name in re.findall(r"╭─ ([^─]+) ─", text)]
    assert panels == ["Options", "Training (over the preset)", "Model (over the preset)", "Scoring",
                      "Store, resume, output", "CUDA"]
    assert len(text.splitlines()) <= 100
    options_panel = text.split("╭─ Options")[1].split("╰")[0]
    assert all(flag in options_panel for flag in ("--task", "--attn", "--pe", "--preset", "--seed"))
    assert "--log-samples" in text.split("╭─ Scoring")[1].split("╰")[0]


@pytest.mark.parametrize("registry", [ATTENTION, POSITIONAL_ENCODINGS], ids=["attn", "pe"])
def test_listings_show_whole_plain_descriptions(monkeypatch, capsys, registry):
    monkeypatch.setenv("COLUMNS", "80")
    assert cli(monkeypatch, "attn" if registry is ATTENTION else "pe", "list") == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text
    flat = " ".join(re.sub(r"[│┃]", " ", text).split())
    for name in registry.names():
        summary = plain_summary(registry.get(name).__doc__)
        assert summary, f"{name} has no description"
        assert summary.endswith((".", ")")), f"{name}'s description is not a whole sentence: {summary!r}"
        # the whole summary is printed, wrapped: its words appear in order (columns interleave only across rows)
        assert " ".join(summary.split()[-3:]) in flat or summary.split()[-1] in flat


def test_plain_summary_takes_the_first_paragraph_without_markup():
    doc = """Gated softmax (Qiu et al. 2025): head outputs times ``sigmoid(x W_g)``, see
    :class:`Gate` and `the paper`.

    Details that stay out of the listing."""
    assert plain_summary(doc) == ("Gated softmax (Qiu et al. 2025): head outputs times sigmoid(x W_g), see Gate and "
                                  "the paper.")
    assert plain_summary(None) == ""


def test_tasks_sample_decode_prints_the_tasks_symbols(monkeypatch, capsys):
    assert cli(monkeypatch, "tasks", "sample", "mqrar", "--length", "16", "--count", "2") == 0
    raw = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli(monkeypatch, "tasks", "sample", "mqrar", "--length", "16", "--count", "2", "--decode") == 0
    decoded = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    task = get_task("mqrar")
    assert len(decoded) == 2
    for ids, symbols in zip(raw, decoded, strict=True):
        assert set(symbols) == {"input", "target"}
        assert symbols["input"].split() == [task.vocab[i] for i in ids["input_ids"]]
        assert symbols["target"].split() == [task.vocab[i] for i in ids["labels"] if i != IGNORE_INDEX]
        assert symbols["input"].startswith("<bos> k") and symbols["target"].endswith("<eos>")


def test_tasks_sample_decode_keeps_the_features(monkeypatch, capsys):
    assert cli(monkeypatch, "tasks", "sample", "maxretrieval", "--length", "4", "--decode") == 0
    sample = json.loads(capsys.readouterr().out)
    assert len(sample["features"]) == len(sample["input"].split())
    assert sample["input"].split()[-1] == "<q>"


def test_progress_fits_80_columns_with_step_eta_and_rate():
    from lengthbench.progress import progress_bar

    live = Console(width=80, force_terminal=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
    shown = Console(width=80, color_system=None, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    with progress_bar(True, console=live) as bar:
        task = bar.add_task("train", total=7813, completed=1250, rate="12,345 samples/s",
                            detail="loss 0.1234  accuracy 0.912  first validation at step 1,000")
        bar.update(task, completed=1300)
        shown.print(*bar.get_renderables())
    lines = [line for line in shown.export_text().splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80
    assert any("1,300/7,813 steps" in line and "ETA" in line and "12,345 samples/s" in line for line in lines)
    assert any(line.startswith("  loss 0.1234") for line in lines)


def test_training_progress_shows_no_nan_before_the_first_validation(monkeypatch, tmp_path):
    """The detail line says when the first validation comes instead of a `nan` placeholder."""
    import contextlib
    import dataclasses

    from lengthbench import progress, training
    from lengthbench.config import build_config
    from lengthbench.runner import run_cell

    console = Console(width=80, force_terminal=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
    screen = Console(width=80, color_system=None, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    shown = []

    @contextlib.contextmanager
    def recorded(enabled, **kwargs):
        with progress.progress_bar(enabled, console=console, **kwargs) as bar:
            original = bar.update

            def update(task_id, **fields):
                shown.append(fields.get("detail", ""))
                original(task_id, **fields)
                screen.print(*bar.get_renderables())

            bar.update = update
            yield bar

    monkeypatch.setattr(training, "progress_bar", recorded)
    config = build_config("copy", "softmax", "nape", "smoke", train_samples=1600, batch_size=16, d_model=16,
                          n_heads=2, ffn=32, n_layers=1, max_multiplier=2, eval_samples=4, val_samples=8,
                          eval_every=75, diagnostics=False)
    run_cell(config, tmp_path, device="cpu", progress=True)
    details = [d for d in shown if d]
    assert details and not any("nan" in d for d in details)
    assert details[0].endswith("first validation at step 75")
    assert re.search(r"validation 0\.\d{3} \(best 0\.\d{3} at step (75|100)\)$", details[-1])
    assert max(len(line) for line in screen.export_text().splitlines()) <= 80
    # a run shorter than eval_every validates first (and only) at its last step
    shown.clear()
    run_cell(dataclasses.replace(config, eval_every=1000), tmp_path / "short", device="cpu", progress=True)
    assert [d for d in shown if d][0].endswith("first validation at step 100")


def test_a_run_piped_to_a_file_prints_plain_lines(tmp_path):
    """Not a terminal: a line per validation and per length, not the bar."""
    args = [sys.executable, "-m", "lengthbench.cli", "run", "--task", "copy", "--attn", "softmax", "--pe", "nape",
            "--train-samples", "96", "--batch-size", "16", "--d-model", "16", "--heads", "2", "--ffn", "32",
            "--layers", "1", "--max-multiplier", "2", "--eval-samples", "4", "--no-diagnostics", "--eval-every", "3",
            "--device", "cpu", "--results", str(tmp_path)]
    output = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert output.returncode == 0, output.stderr
    lines = output.stdout.splitlines()
    steps = [line for line in lines if " step " in line and not line.startswith("trained ")]
    assert [line.split(" step ")[1].split(":")[0] for line in steps] == ["3/6", "6/6"]
    assert any("ETA" in line and "samples/s" in line for line in steps)
    assert [line.split(" eval ")[1].split(" ")[0] for line in lines if re.search(r" eval \d+x ", line)] == ["1x", "2x"]
    assert not any(line.startswith(("train ", "score ")) for line in lines)  # no progress bar
    # each printed line whole, not broken at 80 columns
    assert any(line.startswith("copy-softmax-nape-smoke-s0-") and line.endswith(f"results -> {tmp_path}")
               for line in lines)
    assert any(line.startswith("cost: ") and line.endswith("learns little)") for line in lines)
    assert any(line.startswith("trained 6 steps in ") and line.endswith("kept") for line in lines)
