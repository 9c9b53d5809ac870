"""The rich progress bars of training and scoring."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool) -> Iterator:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), disable=not enabled, transient=False,
    )
    with progress:
        yield progress
