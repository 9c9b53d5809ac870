"""``lengthbench tasks list | params | sample | vocab``."""

from __future__ import annotations

import json
import sys

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from lengthbench.config import parse_params
from lengthbench.errors import UsageError

out = Console()


def register(app: typer.Typer) -> None:
    tasks_app = typer.Typer(help="Task generators: list them, print samples and vocabularies.",
                            no_args_is_help=True)

    @tasks_app.command("list")
    def list_tasks() -> None:
        """List the registered tasks with their metric and default sizes."""
        from lengthbench.cli.registry import plain_summary
        from lengthbench.tasks import TASKS

        # a task per row: what it is, then its metric, training length and the papers' model for it
        table = Table("task", "description", box=box.SIMPLE_HEAD, expand=True)
        for name in TASKS.names():
            cls = TASKS.get(name)
            d = cls.model_defaults
            table.add_row(f"[bold]{name}[/]", plain_summary(cls.__doc__ or sys.modules[cls.__module__].__doc__)
                          + f"\n[dim]{cls.metric.replace('_', ' ')}, n_train {cls.default_train_length}, model "
                          f"{d.layers} x {d.d_model}, {d.heads} heads[/]")
        out.print(table, highlight=False)

    @tasks_app.command("params")
    def params(task: str = typer.Argument(..., help="Task name (see `lengthbench tasks list`).")) -> None:
        """List a task's parameters (for --param key=value): default, type and what each does."""
        import dataclasses

        from lengthbench.tasks import TASKS

        if task not in TASKS:
            raise UsageError(f"unknown task {task!r}; choose from: {', '.join(TASKS.names())}")
        cls = TASKS.get(TASKS.canonical(task))
        notes = _field_comments(cls.Params)
        table = Table(title=f"{TASKS.canonical(task)}: --param key=value", title_justify="left")
        for column in ("parameter", "default", "type", "what it does"):
            table.add_column(column, no_wrap=column != "what it does")
        for field in dataclasses.fields(cls.Params):
            note = notes.get(field.name, "")
            if field.name in cls.presentation_params:
                note += " (changes how samples are written, not what is drawn)"
            kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
            table.add_row(field.name, repr(field.default), kind, note.strip())
        out.print(table)

    @tasks_app.command("sample")
    def sample(
        task: str = typer.Argument(..., help="Task name (see `lengthbench tasks list`)."),
        length: int = typer.Option(64, "--length", "-n", help="Nominal length n."),
        count: int = typer.Option(1, "--count", "-k", help="Number of samples."),
        seed: int = typer.Option(0, "--seed", help="Stream seed."),
        split: str = typer.Option("test", "--split", help="train, val or test."),
        start: int = typer.Option(0, "--start", help="Index of the first sample in the stream."),
        param: list[str] = typer.Option([], "--param", help="Task parameter key=value (repeatable)."),
        decode: bool = typer.Option(False, "--decode", help="Symbols instead of ids: {\"input\": \"<bos> ...\", "
                                    "\"target\": \"...\"}, the target being the scored positions' labels."),
    ) -> None:
        """Print samples as JSON Lines: {"input_ids": [...], "labels": [...]} (+ "features", "groups"; labels are
        -100 where nothing is scored)."""
        from lengthbench import validation
        from lengthbench.tasks import get_task

        validation.check_int("--count", count, 1, validation.MAX_COUNT)
        validation.check_int("--start", start, 0, validation.MAX_SEED - count)
        validation.check_seed(seed)
        params = parse_params(param)
        validation.check_task_params(task, params)
        task_obj = get_task(task, **params)
        validation.check_length(length, task=task_obj)
        # one sample's arrays (ids, labels, features: int64) and its JSON line
        validation.check_memory(f"--length {length:,} ({task_obj.max_tokens(length):,} tokens a sample)",
                                64 * task_obj.max_tokens(length))
        chunk = max(1, min(count, 1_000_000 // max(1, task_obj.max_tokens(length))))
        for first in range(start, start + count, chunk):
            indices = range(first, min(start + count, first + chunk))
            batch = task_obj.batch(indices, length, split, seed)
            samples = [batch.sample(b) for b in range(len(batch))]
            if decode:
                samples = [decoded(task_obj, sample) for sample in samples]
            lines = [json.dumps(sample, separators=(",", ":")) for sample in samples]
            sys.stdout.write("\n".join(lines) + "\n")

    @tasks_app.command("vocab")
    def vocab(
        task: str = typer.Argument(..., help="Task name."),
        param: list[str] = typer.Option([], "--param", help="Task parameter key=value (repeatable)."),
    ) -> None:
        """Print the id -> symbol map as JSON."""
        from lengthbench.tasks import get_task
        from lengthbench.validation import check_task_params

        params = parse_params(param)
        check_task_params(task, params)
        task_obj = get_task(task, **params)
        sys.stdout.write(json.dumps({str(i): s for i, s in enumerate(task_obj.vocab)}) + "\n")

    app.add_typer(tasks_app, name="tasks", rich_help_panel="Look up")


def decoded(task, sample: dict) -> dict:
    """A sample of :meth:`Batch.sample` in symbols: ``input`` (every token) and ``target`` (the labels at the
    scored positions, in order), each space-separated; ``features`` and ``groups`` as they are."""
    from lengthbench.tasks import IGNORE_INDEX

    target = [label for label in sample["labels"] if label != IGNORE_INDEX]
    out = {"input": " ".join(task.symbols(sample["input_ids"])), "target": " ".join(task.symbols(target))}
    out.update({key: value for key, value in sample.items() if key in ("features", "groups")})
    return out


def _field_comments(params_cls) -> dict[str, str]:
    """``{field: comment}`` from the source of a task's ``Params``: a field's trailing ``# ...``, else the
    comment lines just above it."""
    import inspect
    import re

    try:
        lines = inspect.getsource(params_cls).splitlines()
    except (OSError, TypeError):  # no source (e.g. a frozen build)
        return {}
    notes, above = {}, []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"(\w+)\s*:[^=]*=[^#]*(?:#\s*(.*))?$", stripped)
        if match:
            notes[match.group(1)] = match.group(2) or " ".join(above)
        above = []
    return notes
