"""``lengthbench check``: re-run a baseline's cells and compare every point (the CI regression check)."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.table import Table

from lengthbench.cli.common import cell_name, err, out, progress_bar
from lengthbench.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("check", rich_help_panel="Train and score")
    def check(
        baseline: str = typer.Option(..., "--baseline", help="Baseline JSON file (see docs/reporting.md)."),
        tolerance: float = typer.Option(0.05, "--tolerance", help="Allowed fall per point, a fraction (0.05 = 5 points)."),
        update: bool = typer.Option(False, "--update", help="Rewrite the baseline from the new runs."),
        results: str = typer.Option(None, "--results", help="Scratch store (default: a temporary folder, removed after)."),
        device: str = typer.Option("cpu", "--device", help="cpu (default, deterministic), auto or cuda."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    ) -> None:
        """Re-run the baseline's cells, compare every point, exit 1 if one fell by more than the tolerance."""
        from lengthbench.check import load_baseline, run_check, write_baseline

        if not 0.0 <= tolerance <= 1.0 or math.isnan(tolerance):
            raise UsageError(f"--tolerance is a fraction in [0, 1], got {tolerance}")
        if device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown device {device!r}; choose from: auto, cpu, cuda")
        from lengthbench.validation import check_results_writable, check_writable

        if not baseline.strip():
            raise UsageError("--baseline is empty: give a baseline JSON file")
        if update and Path(baseline).exists():  # (before reading: a FIFO would wait for a writer)
            check_writable(baseline, "--baseline", folder=False)
        base = load_baseline(baseline, need_curves=not update)
        if results is not None:
            check_results_writable(results)
        err.print(f"[bold]check[/]: {len(base.cells)} cells of {baseline}, tolerance {tolerance:g}, device {device}"
                  + (f", store {results}" if results else ""), highlight=False)
        with progress_bar(quiet) as progress:
            bar = progress.add_task("cells", total=len(base.cells), info=cell_name(base.cells[0].config))

            def on_cell(index, cell, seconds, error) -> None:
                progress.advance(bar)
                following = base.cells[index + 1].config if index + 1 < len(base.cells) else None
                progress.update(bar, info=cell_name(following) if following else "")
                if error:
                    err.print(f"[red]crashed[/] {cell.label}: {error}", highlight=False, soft_wrap=True)

            result = run_check(base, tolerance=tolerance, results=results, device=device, on_cell=on_cell)
        moved = result.moved
        points = sum(c.status != "error" for c in result.changes)
        if moved:
            table = Table("cell", "x", "baseline %", "new %", "change", "status",
                          title=f"what moved (tolerance {100 * tolerance:g} points)", title_justify="left")
            colours = {"fell": "bold red", "missing": "bold red", "error": "bold red", "improved": "green",
                       "within": "yellow", "new": "cyan"}
            for change in moved:
                old = "" if change.baseline is None else f"{100 * change.baseline:.1f}"
                new = "" if change.new is None else f"{100 * change.new:.1f}"
                delta = ("" if change.baseline is None or change.new is None
                         else f"{100 * (change.new - change.baseline):+.1f}")
                status = change.status if change.status != "within" else "within tolerance"
                if change.detail:
                    status += f": {change.detail}"
                table.add_row(change.label, f"{change.multiplier}x" if change.multiplier else "", old, new, delta,
                              f"[{colours.get(change.status, 'white')}]{status}[/]")
            out.print(table)
        failed = result.failed
        improved = sum(c.status == "improved" for c in result.changes)
        out.print(f"{len(base.cells)} cells, {points} points in {result.seconds:.0f}s: {len(failed)} regressions, "
                  f"{improved} improvements, {len(moved) - len(failed) - improved} other changes, "
                  f"{points - len(moved)} unchanged.", highlight=False)
        if update:
            if any(c.status == "error" for c in result.changes):
                out.print(f"[red]baseline {baseline} not updated: a cell crashed[/]", highlight=False)
                raise SystemExit(1)
            write_baseline(base, result.cells)
            out.print(f"updated baseline {baseline} ({len(result.cells)} cells)", highlight=False)
            return
        if failed:
            out.print(f"[bold red]FAILED[/]: {len(failed)} points fell by more than {100 * tolerance:g} points "
                      f"(or are missing); accept with --update if intended", highlight=False)
            raise SystemExit(1)
        out.print("[bold green]OK[/]: no point fell by more than the tolerance", highlight=False)
