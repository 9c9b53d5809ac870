"""``lengthbench inspect maps | diagnostics``: attention maps of a run, diagnostics against length."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from lengthbench.errors import UsageError

out = Console()


def register(app: typer.Typer) -> None:
    inspect_app = typer.Typer(help="Attention maps of a trained run; attention diagnostics against length.",
                              no_args_is_help=True)

    @inspect_app.command("maps")
    def maps(
        run: str = typer.Option(..., "--run", help="Run id (see the run_id column of the results store)."),
        length: int = typer.Option(..., "--length", "-n", help="Nominal length n of the task sample."),
        out_dir: Path = typer.Option(Path("inspect"), "--out", help="Folder for the PNG files."),
        results: Path = typer.Option(Path("runs"), "--results", help="Results folder of the run."),
        sample: int = typer.Option(0, "--sample", help="Index of the sample in the test stream."),
        seed: int = typer.Option(None, "--seed", help="Test stream seed (default: the run's seed)."),
        max_tokens: int = typer.Option(512, "--max-tokens",
                                       help="Longer sequences: this many query rows, keys summed in bins."),
        scale: str = typer.Option("auto", "--scale",
                                  help="Colour scale: linear, sqrt, or auto (sqrt for binned maps)."),
    ) -> None:
        """Attention maps of a trained run at one length: a PNG per layer, a panel per head."""
        from lengthbench.inspect import inspect_maps, load_run

        if length < 1:
            raise UsageError(f"--length must be at least 1, got {length}")
        if sample < 0:
            raise UsageError(f"--sample must be non-negative, got {sample}")
        if max_tokens < 2:
            raise UsageError(f"--max-tokens must be at least 2, got {max_tokens}")
        model, task, config = load_run(results, run)
        for path in inspect_maps(model, task, config, run, length, out_dir, sample=sample, seed=seed,
                                 max_tokens=max_tokens, scale=scale):
            out.print(str(path), highlight=False, soft_wrap=True)

    @inspect_app.command("diagnostics")
    def diagnostics(
        results: Path = typer.Option(Path("runs"), "--results", help="Results folder."),
        task: str = typer.Option(None, "--task", help="Task to plot (default: every stored task)."),
        attn: list[str] = typer.Option([], "--attn", help="Only these mechanisms (repeatable)."),
        pe: list[str] = typer.Option([], "--pe", help="Only these encodings (repeatable)."),
        run: list[str] = typer.Option([], "--run", help="Only these run ids (repeatable)."),
        out_dir: Path = typer.Option(Path("inspect"), "--out", help="Folder for the PNG files."),
    ) -> None:
        """Sparsity, sink rate, entropy and support against length, from the stored rows: a PNG per task."""
        from lengthbench.inspect import plot_diagnostics, select_rows
        from lengthbench.store import StoreError, load_results

        try:
            frame = load_results(results)
        except StoreError as error:
            raise UsageError(str(error)) from error
        if frame.empty:
            raise UsageError(f"the results folder {results} holds no runs")
        frame = select_rows(frame, task, attn, pe, run)
        for name in sorted(frame["task"].unique()):
            path = plot_diagnostics(frame[frame["task"] == name], out_dir, name)
            out.print(str(path), highlight=False, soft_wrap=True)

    app.add_typer(inspect_app, name="inspect")
