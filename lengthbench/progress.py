"""The progress display of training and scoring, made to be read at 80 columns: a short bar line (what, the bar,
done/total, the percentage, the time left, the rate) and under it the task's ``detail`` field (loss, accuracy,
validation; the length being scored). Where the output is not a terminal the commands print plain lines instead
(``run --quiet``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _DetailProgress(Progress):
    """A rich Progress that prints each unfinished task's ``detail`` field on its own line under the bars."""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            if task.fields.get("detail"):
                yield Text("  " + task.fields["detail"], overflow="ellipsis", no_wrap=True)


@contextlib.contextmanager
def progress_bar(enabled: bool, unit: str = "steps", eta: bool = True, console=None) -> Iterator[Progress]:
    """The display; tasks take ``detail`` (the line under the bars) and ``rate`` (e.g. ``"2,345 samples/s"``)
    fields. ``unit`` names what the bar counts; ``eta``: the time left, else the time spent; ``console``: rich's
    (default: standard output)."""
    progress = _DetailProgress(
        TextColumn("[bold]{task.description}"), BarColumn(bar_width=None),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + unit), TaskProgressColumn(),
        *((TextColumn("ETA"), TimeRemainingColumn()) if eta else (TimeElapsedColumn(),)),
        TextColumn("{task.fields[rate]}"), disable=not enabled, transient=False, expand=True, console=console,
    )
    with progress:
        yield progress


def samples_rate(samples_per_second: float) -> str:
    return f"{samples_per_second:,.0f} samples/s"
