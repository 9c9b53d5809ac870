"""``lengthbench inspect maps | diagnostics``: attention maps of a run, diagnostics against length."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from lengthbench.errors import UsageError

out = Console()


def _results_folder(results: str) -> Path:
    if not results.strip():
        raise UsageError("--results is empty: give the results folder (e.g. --results runs)")
    return Path(results)


def register(app: typer.Typer) -> None:
    inspect_app = typer.Typer(help="Attention maps of a trained run; attention diagnostics against length.",
                              no_args_is_help=True)

    @inspect_app.command("maps")
    def maps(
        run: str = typer.Option(..., "--run", help="Run id (see the run_id column of the results store)."),
        length: int = typer.Option(..., "--length", "-n", help="Nominal length n of the task sample."),
        out_dir: str = typer.Option("inspect", "--out", help="Folder for the PNG files."),
        results: str = typer.Option("runs", "--results", help="Results folder of the run."),
        sample: int = typer.Option(0, "--sample", help="Index of the sample in the test stream."),
        seed: int = typer.Option(None, "--seed", help="Test stream seed (default: the run's seed)."),
        max_tokens: int = typer.Option(512, "--max-tokens",
                                       help="Longer sequences: this many query rows, keys summed in bins."),
        scale: str = typer.Option("auto", "--scale",
                                  help="Colour scale: linear, sqrt, or auto (sqrt for binned maps)."),
    ) -> None:
        """Attention maps of a trained run at one length: a PNG per layer, a panel per head."""
        from lengthbench import validation
        from lengthbench.attention_figures import inspect_maps, load_run

        validation.check_length(length)
        validation.check_int("--sample", sample, 0, validation.MAX_SEED)
        if seed is not None:
            validation.check_seed(seed)
        validation.check_int("--max-tokens", max_tokens, 2, 4096)
        out_dir = validation.check_writable(out_dir, "--out")
        results = _results_folder(results)
        model, task, config = load_run(results, run)
        validation.check_length(length, task=task)
        tokens = task.max_tokens(length)
        # the forward pass, plus a [query rows x keys] map per head and layer
        maps = 4 * config.n_layers * config.n_heads * min(tokens, max_tokens) * tokens
        validation.check_memory(f"--length {length:,} ({tokens:,} tokens)", maps + validation.forward_bytes(
            tokens, config.d_model, config.n_layers, len(task.vocab), config.ffn))
        for path in inspect_maps(model, task, config, run, length, out_dir, sample=sample, seed=seed,
                                 max_tokens=max_tokens, scale=scale):
            out.print(str(path), highlight=False, soft_wrap=True)

    @inspect_app.command("diagnostics")
    def diagnostics(
        results: str = typer.Option("runs", "--results", help="Results folder."),
        task: str = typer.Option(None, "--task", help="Task to plot (default: every stored task)."),
        attn: list[str] = typer.Option([], "--attn", help="Only these mechanisms (repeatable)."),
        pe: list[str] = typer.Option([], "--pe", help="Only these encodings (repeatable)."),
        run: list[str] = typer.Option([], "--run", help="Only these run ids (repeatable)."),
        out_dir: str = typer.Option("inspect", "--out", help="Folder for the PNG files."),
    ) -> None:
        """Sparsity, sink rate, entropy and support against length, from the stored rows: a PNG per task."""
        import warnings

        from lengthbench.attention_figures import plot_diagnostics, select_rows
        from lengthbench.store import StoreError, load_results
        from lengthbench.validation import check_writable

        out_dir = check_writable(out_dir, "--out")
        results = _results_folder(results)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                frame = load_results(results)
            except StoreError as error:
                raise UsageError(str(error)) from error
        skipped = [str(warning.message).splitlines()[0] for warning in caught]
        if frame.empty:
            raise UsageError(f"the results folder {results} holds no runs"
                             + (f" ({skipped[0]}{f', and {len(skipped) - 1} more' if len(skipped) > 1 else ''})"
                                if skipped else ""))
        for note in skipped:  # a file left out: one line naming it
            Console(stderr=True).print(f"[yellow]warning:[/] {escape(note)}", highlight=False, soft_wrap=True)
        frame = select_rows(frame, task, attn, pe, run)
        for name in sorted(frame["task"].unique()):
            path = plot_diagnostics(frame[frame["task"] == name], out_dir, name)
            out.print(str(path), highlight=False, soft_wrap=True)

    app.add_typer(inspect_app, name="inspect", rich_help_panel="Look up")
