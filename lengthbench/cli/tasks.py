"""``lengthbench tasks list | params | sample | vocab``."""

from __future__ import annotations

import json
import sys

import typer
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
        from lengthbench.tasks import TASKS

        table = Table()
        table.add_column("task", no_wrap=True, style="bold")
        table.add_column("metric", no_wrap=True)
        table.add_column("n_train", justify="right")
        table.add_column("seed model (layers x d, heads)")
        table.add_column("description")
        for name in TASKS.names():
            cls = TASKS.get(name)
            d = cls.model_defaults
            doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
            table.add_row(name, cls.metric, str(cls.default_train_length), f"{d.layers} x {d.d_model}, {d.heads}",
                          doc[0] if doc else "")
        out.print(table)

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
    ) -> None:
        """Print samples as JSON Lines: {"input_ids": [...], "labels": [...]} (+ "features", "groups")."""
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
            lines = [json.dumps(batch.sample(b), separators=(",", ":")) for b in range(len(batch))]
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

    app.add_typer(tasks_app, name="tasks")


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
