"""``lengthbench report --html DIR``: the leaderboard as one self-contained web page."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lengthbench.cli.common import DEFAULT_RESULTS
from lengthbench.errors import UsageError

err = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command("report", rich_help_panel="Results")
    def report(
        html: str = typer.Option(..., "--html", metavar="DIR", help="Write DIR/index.html: a page that opens without a network."),
        results: list[str] = typer.Option(None, "--results", help=f"Results store folder (default {DEFAULT_RESULTS}); "
                                          "repeat it, or give A,B, to read several stores at once."),
        configs: list[str] = typer.Option(None, "--config", help="The paper-table configs whose sections to show "
                                          "(repeat for several; default: every config in configs/)."),
        show_all: bool = typer.Option(False, "--all", help="Every run of the store, a block per task and protocol, "
                                      "instead of the paper-table sections."),
        skip_unreadable: bool = typer.Option(False, "--skip-unreadable",
                                             help="Leave out unreadable result files (with a warning) instead of "
                                             "stopping."),
    ) -> None:
        """The leaderboard as a web page, DIR/index.html, self-contained (inline CSS and script, data as JSON):
        per paper-table section (--all: per task and protocol) its tables and its curves against log2 length,
        a legend entry hides or shows its line, filters by task, encoding and mechanism. The view is kept in the
        address (index.html#task=copy&pe=rope), so a link reopens it."""
        from lengthbench.html_report import protocols_page, sections_page, write_page
        from lengthbench.leaderboard import build_leaderboard, load_stores, results_list
        from lengthbench.validation import check_writable

        folder = check_writable(html, "--html")
        if configs and show_all:
            raise UsageError("give --config or --all, not both")
        for path in configs or []:
            if not Path(path).is_file():
                raise UsageError(f"--config {path}: no such file")
        stores = ",".join(results_list(results, DEFAULT_RESULTS))
        frame, notes = load_stores(stores, skip_unreadable=skip_unreadable)
        for note in notes:
            err.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
        command = (f"lengthbench report --html {html} --results {stores}"
                   + "".join(f" --config {c}" for c in configs or []) + (" --all" if show_all else ""))
        if show_all:
            runs = frame["run_id"].nunique()
            text = protocols_page(build_leaderboard(frame),
                                  source=f"Generated from {runs} runs in `{stores}` by `{command}`.")
            what = f"{runs} runs"
        else:
            from lengthbench.published import build_sections, load_sections

            sections = load_sections(configs)
            board = build_sections(frame, sections)
            runs = int(board["seeds"].sum()) if not board.empty else 0
            if not runs:
                err.print(f"no run in {stores} matches a paper-table config ({len(sections)} configs): the page "
                          f"shows their planned cells, none run; `lengthbench report --html {html} --results "
                          f"{stores} --all` shows every run by protocol", highlight=False, soft_wrap=True)
            text = sections_page(board, sections, source=f"Generated from {runs} runs in `{stores}` by `{command}`.")
            what = f"{len(sections)} sections, {runs} runs"
        path = write_page(folder, text)
        err.print(f"wrote {path} ({what})", highlight=False, soft_wrap=True)
