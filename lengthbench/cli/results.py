"""``lengthbench leaderboard | compare | plot``: from the results store to the tables, the papers' numbers beside
ours, and the figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import typer

from lengthbench.cli.common import DEFAULT_RESULTS, OUTPUT, err, out, print_warnings
from lengthbench.errors import UsageError


def _config_files(paths: list[str]) -> list[Path]:
    """The sweep files named: a file as it is, a folder's ``*.toml`` and ``*.json`` in name order."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".toml", ".json"))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"--config {name}: no such file or folder")
    return files


def _published_leaderboard(frame, results: str, configs: list[str] | None, fmt: str, out_file, publish,
                           note: str | None) -> None:
    """``lengthbench leaderboard`` without --all: a section per paper-table config."""
    from lengthbench.published import build_sections, load_sections, sections_markdown
    from lengthbench.store import atomic_write_parquet, atomic_write_text

    for path in configs or []:
        if not Path(path).is_file():
            raise UsageError(f"--config {path}: no such file")
    sections = load_sections(configs)
    board = build_sections(frame, sections)
    matched = int(board["seeds"].sum()) if not board.empty else 0
    if not matched:
        err.print(f"no run in {results} matches a paper-table config ({len(sections)} configs); "
                  f"`lengthbench leaderboard --results {results} --all` shows every run by protocol", highlight=False,
                  soft_wrap=True)
    command = "lengthbench leaderboard --results " + results + "".join(f" --config {c}" for c in configs or [])
    source = f"Generated from {matched} runs in `{results}` by `{command}" + (
        f" --publish {publish}`." if publish is not None else "`.")
    source = f"{note}\n\n{source}" if note else source
    if publish is not None:
        atomic_write_text(Path(publish) / "leaderboard.md", sections_markdown(board, sections, source=source))
        atomic_write_parquet(board, Path(publish) / "leaderboard.parquet")
        err.print(f"wrote {Path(publish) / 'leaderboard.md'} and {Path(publish) / 'leaderboard.parquet'} "
                  f"({len(sections)} sections, {matched} runs)", highlight=False)
        return
    if fmt == "parquet":
        if out_file is None:
            raise UsageError("--format parquet needs --out FILE")
        atomic_write_parquet(board, Path(out_file))
        return
    text = sections_markdown(board, sections, source=source) if fmt == "markdown" else board.to_csv(
        index=False, float_format="%.4f")
    if out_file is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(Path(out_file), text)
        err.print(f"wrote {out_file} ({len(sections)} sections, {matched} runs)", highlight=False)


def _compare_configs(configs: list[str], results: str, out_file, skip_unreadable: bool) -> None:
    """``compare --config``: per config, the store's runs at its protocol beside its published rows."""
    from lengthbench.leaderboard import load_stores
    from lengthbench.published import beside_published, load_sections
    from lengthbench.store import atomic_write_text

    for path in configs:
        if not Path(path).is_file():
            raise UsageError(f"--config {path}: no such file")
    sections = load_sections(configs)
    frame, notes = load_stores(results, skip_unreadable=skip_unreadable)
    print_warnings(notes)
    text = "\n".join(beside_published(frame, section) for section in sections)
    text = (f"# Your runs beside the published rows\n\nFrom `{results}` by `lengthbench compare --results {results}"
            + "".join(f" --config {c}" for c in configs) + "`.\n\n" + text)
    if out_file is not None:
        atomic_write_text(Path(out_file), text)
        err.print(f"wrote {out_file}", highlight=False)
    else:
        sys.stdout.write(text)


def register(app: typer.Typer) -> None:
    @app.command("leaderboard", rich_help_panel="Results")
    def leaderboard(
        results: list[str] = typer.Option(None, "--results", help="Results store folder (default runs); repeat "
                                          "it, or give A,B, to read several stores at once."),
        fmt: str = typer.Option("markdown", "--format", help="markdown, parquet or csv.", rich_help_panel=OUTPUT),
        out_file: str = typer.Option(None, "--out", help="Write here (default: stdout; parquet needs it).",
                                     rich_help_panel=OUTPUT),
        task: str = typer.Option(None, "--task", help="Only these tasks (comma-separated)."),
        attn: str = typer.Option(None, "--attn", help="Only these mechanisms (comma-separated names or labels)."),
        pe: str = typer.Option(None, "--pe", help="Only these encodings (comma-separated)."),
        publish: str = typer.Option(None, "--publish", rich_help_panel=OUTPUT,
                                     help="Write DIR/leaderboard.md and DIR/leaderboard.parquet (the committed pair)."),
        skip_unreadable: bool = typer.Option(False, "--skip-unreadable",
                                             help="Leave out unreadable result files (with a warning) instead of stopping."),
        note: str = typer.Option(None, "--note", help="A paragraph to print under the title (Markdown).",
                                 rich_help_panel=OUTPUT),
        configs: list[str] = typer.Option(None, "--config", help="The paper-table configs whose sections to show "
                                          "(repeat for several; default: every config in configs/)."),
        show_all: bool = typer.Option(False, "--all", help="Every run of the store, a table per task and protocol, "
                                      "instead of the paper-table sections."),
        metric: str = typer.Option("task", "--metric", help="With --all: the task's metric (task), exact_match or "
                                   "token_accuracy (a study reads both)."),
    ) -> None:
        """The published leaderboard: a section per paper-table config (its runs only), a row per attention x
        encoding, a column per multiplier (%), best of seeds and mean +- std, for the paper's checkpoint selection
        and the in-distribution one. --all: every run, a table per task and protocol."""
        from lengthbench.leaderboard import FORMATS, build_leaderboard, write_leaderboard
        from lengthbench.sweep import split_list
        from lengthbench.validation import check_publish, check_writable

        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
        if publish is not None:
            publish = check_publish(publish, ("leaderboard.md", "leaderboard.parquet"))
        if out_file is not None:
            out_file = check_writable(out_file, "--out", folder=False)
        if configs and show_all:
            raise UsageError("give --config or --all, not both")
        if metric not in ("task", "exact_match", "token_accuracy"):
            raise UsageError(f"unknown --metric {metric!r}; choose from: task, exact_match, token_accuracy")
        if metric != "task" and not show_all:
            raise UsageError("--metric needs --all (the published sections read each paper's metric)")
        if fmt == "parquet" and out_file is None and publish is None:
            raise UsageError("--format parquet needs --out FILE")
        from lengthbench.leaderboard import load_stores, results_list

        results = ",".join(results_list(results, DEFAULT_RESULTS))
        frame, notes = load_stores(results, tasks=split_list(task, "--task"), attns=split_list(attn, "--attn"),
                                   pes=split_list(pe, "--pe"), skip_unreadable=skip_unreadable)
        print_warnings(notes)
        if not show_all:
            _published_leaderboard(frame, results, configs, fmt, out_file, publish, note)
            return
        if metric != "task":
            frame = frame.assign(metric=metric, score=frame[metric].astype(float))
        board = build_leaderboard(frame)
        runs = frame["run_id"].nunique()
        if publish is not None:
            command = f"lengthbench leaderboard --results {results} --all"
            command += f" --metric {metric}" if metric != "task" else ""
            source = f"Generated from {runs} runs in `{results}` by `{command} --publish {publish}`."
            source = f"{note}\n\n{source}" if note else source
            write_leaderboard(board, "markdown", Path(publish) / "leaderboard.md", source=source)
            write_leaderboard(board, "parquet", Path(publish) / "leaderboard.parquet")
            err.print(f"wrote {Path(publish) / 'leaderboard.md'} and {Path(publish) / 'leaderboard.parquet'} "
                      f"({len(board)} rows from {runs} runs)", highlight=False)
            return
        source = f"Generated from {runs} runs in `{results}`."
        if out_file is not None:
            command = f"lengthbench leaderboard --results {results} --all"
            command += f" --metric {metric}" if metric != "task" else ""
            source = f"Generated from {runs} runs in `{results}` by `{command} --out {out_file}`."
        text = write_leaderboard(board, fmt, out_file, source=f"{note}\n\n{source}" if note else source)
        if text is not None:
            sys.stdout.write(text)
        else:
            err.print(f"wrote {out_file} ({len(board)} rows from {runs} runs)", highlight=False)

    @app.command("compare", rich_help_panel="Results")
    def compare(
        results: list[str] = typer.Option(None, "--results", help="Results store folder (default runs); repeat "
                                          "it, or give A,B, to read several stores at once."),
        configs: list[str] = typer.Option(None, "--config", help="A paper-table config: your runs at its protocol "
                                          "beside its published rows and the paper's values (repeat for several)."),
        paper_tables: str = typer.Option(None, "--paper-tables", help="CSV of the papers' cells, one row per "
                                          "number (default: lengthbench/paper_tables.csv)."),
        task: str = typer.Option(None, "--task", help="Only these tasks (comma-separated)."),
        tolerance: float = typer.Option(5.0, "--tolerance", help="Points within which ours agrees with the paper's."),
        rows: int = typer.Option(3, "--rows", help="Rows of ours per paper cell, closest to the paper first (0: all)."),
        out_file: str = typer.Option(None, "--out", help="Write the Markdown here (default: stdout).",
                                     rich_help_panel=OUTPUT),
        publish: str = typer.Option(None, "--publish", rich_help_panel=OUTPUT,
                                     help="Write DIR/paper_comparison.md and DIR/paper_comparison.parquet."),
        skip_unreadable: bool = typer.Option(False, "--skip-unreadable",
                                             help="Leave out unreadable result files (with a warning)."),
    ) -> None:
        """Our leaderboard beside the papers' published tables: per paper cell, ours and the difference in points.
        With --config: the runs of --results trained at that config's protocol (your own mechanism's too) beside
        the published rows of the protocol and the paper's values."""
        from lengthbench.compare import PAPER_TABLES, load_paper_tables, to_markdown, write_comparison
        from lengthbench.compare import compare as compare_store
        from lengthbench.sweep import split_list

        if not (tolerance >= 0 and math.isfinite(tolerance)):
            raise UsageError(f"--tolerance must be a number of points >= 0, got {tolerance}")
        if rows < 0:
            raise UsageError(f"--rows must be 0 (all) or more, got {rows}")
        from lengthbench.validation import check_publish, check_writable

        if publish is not None:
            publish = check_publish(publish, ("paper_comparison.md", "paper_comparison.parquet"))
        if out_file is not None:
            out_file = check_writable(out_file, "--out", folder=False)
        from lengthbench.leaderboard import load_stores, results_list

        results = ",".join(results_list(results, DEFAULT_RESULTS))
        if configs:
            _compare_configs(configs, results, out_file, skip_unreadable)
            return
        if paper_tables is not None and not paper_tables.strip():
            raise UsageError("--paper-tables is empty: give a CSV file")
        papers = load_paper_tables(paper_tables or PAPER_TABLES)
        wanted = split_list(task, "--task")
        unknown = sorted(set(wanted) - set(papers["task"]))
        if unknown:
            raise UsageError(f"no paper table has the task {', '.join(unknown)}; "
                             f"choose from: {', '.join(sorted(papers['task'].unique()))}")
        if wanted:
            papers = papers[papers["task"].isin(wanted)]
        frame, notes = load_stores(results, skip_unreadable=skip_unreadable)
        print_warnings(notes)
        frame = frame[frame["task"].isin(set(papers["task"]))]
        if frame.empty:
            raise UsageError(f"no runs in {results} of the paper tables' tasks "
                             f"({', '.join(sorted(papers['task'].unique()))})")
        long = compare_store(frame, papers, tolerance=tolerance)
        if (long["verdict"] == "no run").all():  # e.g. a store of your own mechanism only
            raise UsageError(f"no run in {results} stands for a cell of the paper tables (there: "
                             f"{', '.join(sorted(map(str, frame['attn'].unique())))}); your runs beside a table's "
                             f"published rows: lengthbench compare --config configs/NAME.toml --results {results}")
        source = f"Generated from {frame['run_id'].nunique()} runs in `{results}` by `lengthbench compare --results {results}`."
        markdown = to_markdown(long, rows_per_cell=rows, tolerance=tolerance, source=source)
        if publish is not None:
            md_path, parquet_path = write_comparison(long, markdown, Path(publish))
            err.print(f"wrote {md_path} and {parquet_path}", highlight=False)
        elif out_file is not None:
            from lengthbench.store import atomic_write_text

            atomic_write_text(out_file, markdown)
            err.print(f"wrote {out_file}", highlight=False)
        else:
            sys.stdout.write(markdown)

    @app.command("plot", rich_help_panel="Results")
    def plot(
        results: list[str] = typer.Option(None, "--results", help="Results store folder (default runs); repeat "
                                          "it, or give A,B, to read several stores at once."),
        out_dir: str = typer.Option("plots", "--out", help="Folder for the figures."),
        task: str = typer.Option(None, "--task", help="Only these tasks (comma-separated)."),
        attn: str = typer.Option(None, "--attn", help="Only these mechanisms (comma-separated names or labels)."),
        pe: str = typer.Option(None, "--pe", help="Only these encodings (comma-separated)."),
        config: list[str] = typer.Option([], "--config", help="A paper-table config (or a folder of them): its "
                                         "figure (repeatable; default: configs/ where it exists)."),
        skip_unreadable: bool = typer.Option(False, "--skip-unreadable",
                                             help="Leave out unreadable result files (with a warning)."),
    ) -> None:
        """A figure per paper table, of the runs of its protocol only, and a heat map of reach (PNG and SVG).

        Each config in configs/ names a paper table; its figure has a line per cell (colour: mechanism; line
        style: encoding), the best seed's curve with the mean +- std over seeds. Without configs: a figure per
        task, a panel per protocol.
        """
        from lengthbench.leaderboard import build_leaderboard, load_stores, results_list
        from lengthbench.plots import plot_all, plot_configs, prune_stale
        from lengthbench.sweep import split_list
        from lengthbench.validation import check_writable

        results = ",".join(results_list(results, DEFAULT_RESULTS))
        out_dir = check_writable(out_dir, "--out")
        config_files = _config_files(config or (["configs"] if Path("configs").is_dir() else []))
        frame, notes = load_stores(results, tasks=split_list(task, "--task"), attns=split_list(attn, "--attn"),
                                   pes=split_list(pe, "--pe"), skip_unreadable=skip_unreadable)
        print_warnings(notes)
        paths = plot_configs(frame, config_files, out_dir) if config_files else []
        if config and not paths:
            raise UsageError(f"no run in {results} carries out the protocol of "
                             f"{', '.join(str(path) for path in config_files)}")
        if not paths:  # no config here, or none with runs in this store
            if config_files:
                err.print("no run here carries out a config of configs/: a figure per task, a panel per protocol",
                          highlight=False)
            paths = plot_all(build_leaderboard(frame), out_dir)
        for path in paths:
            out.print(str(path), highlight=False)
        # figures this command wrote earlier and no longer draws (not with --task: a partial plot)
        for path in prune_stale(out_dir, paths, remove=task is None):
            err.print(f"removed {path} (this plot no longer draws it)", highlight=False)
