"""``lengthbench tasks list | sample | vocab``."""

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
        from lengthbench.tasks import get_task

        if count < 1:
            raise UsageError(f"--count must be at least 1, got {count}")
        if start < 0:
            raise UsageError(f"--start must be non-negative, got {start}")
        task_obj = get_task(task, **parse_params(param))
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

        task_obj = get_task(task, **parse_params(param))
        sys.stdout.write(json.dumps({str(i): s for i, s in enumerate(task_obj.vocab)}) + "\n")

    app.add_typer(tasks_app, name="tasks")
