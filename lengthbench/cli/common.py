"""What the commands share: the default results store, the consoles, a cell's printed name, the progress bar."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

out = Console()
err = Console(stderr=True)

DEFAULT_RESULTS = "runs"  # the default of `lengthbench run --results`
OUTPUT = "Output"  # a --help panel beside each command's first, "Options"


def cell_name(config, labels: dict[str, str] | None = None) -> str:
    """The cell as the leaderboard names it, and the sweep file's variant it belongs to in brackets."""
    from rich.markup import escape

    label = (labels or {}).get(config.run_id)
    return config.cell_name() + (escape(f" [{label}]") if label else "")  # printed through rich: not a style tag


def progress_bar(quiet: bool) -> Progress:
    """The cells' bar of ``sweep`` and ``check`` on standard error; none with --quiet or where standard error is
    not a terminal (a log file gets the commands' lines, not the bar's last frame)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"), console=err, disable=quiet or not err.is_terminal,
                    transient=False)



def print_wide(console: Console, renderable, width: int) -> None:
    """Print a table whole where the output is not a terminal (a log, a pipe): ``width`` columns there, not rich's
    80 (``Console.print(width=...)`` cannot widen past the console's own width)."""
    if console.is_terminal:
        console.print(renderable)
        return
    Console(file=console.file, width=max(console.width, width), color_system=None, highlight=False).print(renderable)


def print_warnings(notes: list[str]) -> None:
    for note in notes:
        err.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
