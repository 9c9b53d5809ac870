"""``lengthbench sweep | leaderboard | plot | check``: from runs to the tables, figures and CI check."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lengthbench.config import params_suffix
from lengthbench.errors import UsageError

out = Console()
err = Console(stderr=True)

DEFAULT_RESULTS = "runs"  # the default of `lengthbench run --results`
DEFAULT_PLAN_GPU = "NVIDIA H100 80GB HBM3"  # lengthbench.budget.DEFAULT_PLAN_GPU, without importing pandas here
# --help panels beside each command's first, "Options"
OVER_PRESET = "Over the preset (every cell)"
BUDGET = "Budget and GPUs"
SLURM = "--executor slurm"
RAY = "--executor ray"
OUTPUT = "Output"


def _cell_name(config, labels: dict[str, str] | None = None) -> str:
    """The cell as the leaderboard names it, and the sweep file's variant it belongs to in brackets."""
    from rich.markup import escape

    label = (labels or {}).get(config.run_id)
    return config.cell_name() + (escape(f" [{label}]") if label else "")  # printed through rich: not a style tag


def _progress(quiet: bool) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"), console=err, disable=quiet, transient=False)


def _summary_numbers(curve: dict[int, float]) -> tuple[str, str]:
    import pandas as pd

    from lengthbench.leaderboard import auc, reach

    if not curve:
        return "", ""
    series = pd.Series(curve).sort_index()
    value = reach(series)
    return (f"{value}x" if value else "-"), f"{auc(series):.3f}"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        err.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)


def _print_status(configs, results: str, labels: dict[str, str] | None = None) -> None:
    """``sweep --status``: a row per cell, from the store and the records of its jobs."""
    from lengthbench.executors import CELL_STATES, cell_states

    states = cell_states(configs, results)
    colours = {"in store": "green", "running": "cyan", "queued": "blue", "failed": "red", "to run": "dim"}
    table = Table("cell", "run id", "state", "job", "note", title=f"sweep status ({results})", title_justify="left")
    for config in configs:
        state = states[config.run_id]
        table.add_row(_cell_name(config, labels), config.run_id, f"[{colours[state.state]}]{state.state}[/]",
                      f"{state.executor} {state.job_id}".strip(), state.note)
    out.print(table, width=None if out.is_terminal else max(out.width, 160))
    counts = [f"{sum(s.state == name for s in states.values())} {name}" for name in CELL_STATES]
    out.print(f"{len(configs)} cells: " + ", ".join(counts), highlight=False)


def _print_submitted(configs, results: str, submitted, unsubmitted, outcomes) -> None:
    by_id = {c.run_id: c for c in submitted}
    table = Table("cell", "run id", "submitted", title=f"sweep submitted ({results})", title_justify="left")
    from lengthbench.executors import cell_states

    states = cell_states(list(by_id.values()), results)
    for config in submitted:
        table.add_row(_cell_name(config), config.run_id, f"job {states[config.run_id].job_id}")
    out.print(table, width=None if out.is_terminal else max(out.width, 160))
    skipped = sum(o is not None and o.status in ("skipped", "queued") for o in outcomes)
    later = (f"; {len(unsubmitted)} wait for an earlier stage: run the same command again once it is in the "
             "store, or use --wait" if unsubmitted else "")
    out.print(f"{len(configs)} cells: {len(submitted)} submitted, {skipped} in the store or queued already{later}. "
              f"Next: the same command with --status", highlight=False)


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


def _plan_gpu(device: str, given: str | None) -> str:
    """The GPU model a plan is for: this machine's first GPU, else ``--plan-gpu``, else the default."""
    if device != "cpu" and _cuda_available():
        import torch

        return torch.cuda.get_device_name(0)
    if given is not None and not given.strip():
        raise UsageError("--plan-gpu is empty: give a GPU model, e.g. 'NVIDIA H200'")
    return given or DEFAULT_PLAN_GPU


def _plan_gpus(device: str) -> int:
    if device != "cpu" and _cuda_available():
        import torch

        return torch.cuda.device_count()
    return 1


def _cost_model(results: str, plan_gpu: str):
    import warnings

    from lengthbench.budget import CostModel
    from lengthbench.store import StoreError, load_results

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unreadable file only loses its calibration here
            store = load_results(results) if Path(results).is_dir() else None
    except StoreError:
        store = None
    return CostModel(plan_gpu, store)


def _fitting_per_gpu(configs, results: str, budget_seconds: float, plan_gpu: str, per_gpu: int, mps: bool) -> int:
    """``--per-gpu auto`` under a budget: the most cells side by side (at most ``per_gpu``) with which the first
    cell not in the store ends inside the budget (each cell side by side runs slower); ``per_gpu`` where none
    does."""
    from lengthbench.budget import side_by_side_factor
    from lengthbench.checkpoints import cell_finished

    first = next((c for c in configs if not cell_finished(results, c)), None)
    if first is None:
        return per_gpu
    cost = _cost_model(results, plan_gpu).cost(first).total
    for count in range(per_gpu, 0, -1):
        if cost * side_by_side_factor(first, count, mps) <= budget_seconds:
            return count
    return per_gpu


def _print_plan(configs, results: str, budget_seconds: float, plan_gpu: str, slots: int, per_gpu: int,
                mps: bool, labels: dict[str, str] | None = None):
    """The budget's plan, before anything starts: each cell's estimated minutes, its start, what fits."""
    from lengthbench.budget import format_minutes, plan
    from lengthbench.checkpoints import cell_finished

    cost = _cost_model(results, plan_gpu)
    planned = plan(configs, budget_seconds, slots, per_gpu, mps, cost,
                   finished=[c.run_id for c in configs if cell_finished(results, c)])
    side = f", {per_gpu} side by side per GPU{' under MPS' if mps else ''}" if per_gpu > 1 else ""
    table = Table("cell", "run id", "minutes", "starts at", "plan", "estimated from",
                  title=f"plan: {format_minutes(budget_seconds)} on {slots // per_gpu} x {plan_gpu}{side}",
                  title_justify="left")
    colours = {"runs": "green", "in the store": "dim", "does not fit": "yellow"}
    for cell in planned:
        table.add_row(_cell_name(cell.config, labels), cell.config.run_id,
                      f"{cell.seconds / 60:.1f}" if cell.state != "in the store" else "",
                      f"{cell.start / 60:.1f}" if cell.state == "runs" else "",
                      f"[{colours[cell.state]}]{cell.state}[/]", "; ".join(cell.sources))
    out.print(table, width=None if out.is_terminal else max(out.width, 200))
    runs = [c for c in planned if c.state == "runs"]
    left = [c for c in planned if c.state == "does not fit"]
    end = max((c.end for c in runs), default=0.0)
    stored = sum(c.state == "in the store" for c in planned)
    out.print(f"{len(runs)} cells fit ({format_minutes(end)} of {format_minutes(budget_seconds)}), "
              f"{len(left)} do not" + (f", {stored} in the store already" if stored else "")
              + (f"; next after this budget: {_cell_name(left[0].config, labels)}" if left else ""), highlight=False)
    return cost


def _print_progress(configs, results: str, plan_gpu: str, per_gpu: int, mps: bool) -> None:
    """``sweep --status``'s last lines: cells done / total, runs stored, GPU-hours spent, the estimate to finish."""
    from lengthbench.budget import side_by_side_factor
    from lengthbench.checkpoints import cell_finished
    from lengthbench.store import run_finished

    cells = [c for c in configs if not c.init_from or c.run_id not in {o.init_from for o in configs}]
    done = [c for c in cells if cell_finished(results, c)]
    runs = [run for c in configs for run in (c, *c.selected_runs())]
    stored = [run for run in runs if run_finished(results, run.run_id)]
    spent = _gpu_seconds(results, stored)
    cost = _cost_model(results, plan_gpu)
    todo = [c for c in configs if not cell_finished(results, c)]
    alone = sum(cost.cost(c).total for c in todo)
    shared = sum(cost.cost(c).total * side_by_side_factor(c, per_gpu, mps, cost.benchmarks) / per_gpu
                 for c in todo)
    out.print(f"{len(done)} of {len(cells)} cells done; {len(stored)} of {len(runs)} runs stored (a run per "
              f"selection); {spent / 3600:.2f} GPU-hours spent; to finish: about {alone / 3600:.1f} GPU-hours on "
              f"{plan_gpu} one at a time" + (f", {shared / 3600:.1f} with {per_gpu} side by side" if per_gpu > 1
                                             else ""), highlight=False)


def _gpu_seconds(results: str, runs) -> float:
    """The GPU seconds of stored runs: each training once (a run of another selection shares its training) and
    each scoring (a selection that copied its rows scored nothing)."""
    import pandas as pd

    from lengthbench.store import run_path

    total = 0.0
    frames = {run.run_id: pd.read_parquet(run_path(results, run.run_id)) for run in runs}
    for run in runs:
        frame = frames[run.run_id]
        if run.selected_from:
            source = frames.get(run.selected_from)
            if source is not None and int(source["best_step"].iloc[0]) == int(frame["best_step"].iloc[0]):
                continue
        else:
            total += float(frame["train_seconds"].iloc[0])
        total += float(frame["eval_seconds"].sum())
    return total


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
    _print_notes(notes)
    text = "\n".join(beside_published(frame, section) for section in sections)
    text = (f"# Your runs beside the published rows\n\nFrom `{results}` by `lengthbench compare --results {results}"
            + "".join(f" --config {c}" for c in configs) + "`.\n\n" + text)
    if out_file is not None:
        atomic_write_text(Path(out_file), text)
        err.print(f"wrote {out_file}", highlight=False)
    else:
        sys.stdout.write(text)


def register(app: typer.Typer) -> None:
    @app.command("sweep", rich_help_panel="Train and score")
    def sweep(
        tasks: str = typer.Option(None, "--tasks", help="Comma-separated tasks, e.g. copy,2back."),
        attns: str = typer.Option(None, "--attns", help="Comma-separated attention mechanisms."),
        pes: str = typer.Option(None, "--pes", help="Comma-separated positional encodings."),
        cells: str = typer.Option(None, "--cells", help="Explicit cells instead of the product, comma-separated "
                                  "task:attn:pe, e.g. copy:softmax:rope,copy:sieve:none."),
        seeds: str = typer.Option(None, "--seeds", help="Seeds: 0,1,2 or 0-2 (default 0)."),
        preset: str = typer.Option(None, "--preset", help="smoke, quick or paper (default smoke)."),
        config_file: str = typer.Option(None, "--config", help="Sweep file (TOML or JSON); flags override it."),
        results: str = typer.Option(None, "--results", help=f"Results store folder (default {DEFAULT_RESULTS})."),
        device: str = typer.Option(None, "--device", help="auto (default), cpu or cuda."),
        train_samples: int = typer.Option(None, "--train-samples", help="Training samples.",
                                          rich_help_panel=OVER_PRESET),
        max_multiplier: int = typer.Option(None, "--max-multiplier", help="Largest multiplier (a power of 2).",
                                           rich_help_panel=OVER_PRESET),
        eval_samples: int = typer.Option(None, "--eval-samples", help="Samples per evaluation length.",
                                         rich_help_panel=OVER_PRESET),
        train_length: int = typer.Option(None, "--train-length", help="n_train (default: the task's).",
                                         rich_help_panel=OVER_PRESET),
        per_gpu: str = typer.Option(None, "--per-gpu", help="Cells run side by side on each GPU: a number "
                                    "(default 1) or auto (by the model's size and the GPU's memory: three small "
                                    "paper models, two of d 512), for models that leave a GPU idle between kernel "
                                    "launches.", rich_help_panel=BUDGET),
        mps: str = typer.Option(None, "--mps", help="auto (default): with cells side by side, start NVIDIA MPS "
                                "(nvidia-cuda-mps-control -d) for the sweep where the binary is on the PATH and no "
                                "daemon runs, and stop it at the end; on: insist; off: never. A daemon the sweep "
                                "did not start is used and left running.", rich_help_panel=BUDGET),
        budget: str = typer.Option(None, "--budget", help="Time budget, e.g. 25m, 90s or 1h30m: plan each cell's "
                                   "minutes first (print the plan), never start a cell that cannot end inside it, "
                                   "and stop cleanly (exit 0) when the next does not fit.", rich_help_panel=BUDGET),
        plan_gpu: str = typer.Option(None, "--plan-gpu", help="The GPU a plan is for where this machine has none "
                                     f"(default {DEFAULT_PLAN_GPU}; e.g. 'NVIDIA H200').", rich_help_panel=BUDGET),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the cells and what is done; run nothing."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
        executor: str = typer.Option("local", "--executor", help="local (this machine), slurm (a job per cell "
                                     "through submitit) or ray (a task per cell); see docs/clusters.md."),
        status: bool = typer.Option(False, "--status", help="Where each cell stands (in store, running, queued, "
                                    "failed, to run), from the store and the jobs' records; run nothing."),
        wait: bool | None = typer.Option(None, "--wait/--no-wait", help="local: at the end, wait for the cells another "
                                  "sweep on the same store is running (the default), or report them as running "
                                  "elsewhere; slurm: follow the jobs to their end (else return once they are "
                                  "submitted, the default; `--status` reports)."),
        slurm_partition: str = typer.Option(None, "--slurm-partition", help="The partition.",
                                            rich_help_panel=SLURM),
        gpus_per_node: int = typer.Option(1, "--gpus-per-node", help="GPUs per cell's job.", rich_help_panel=SLURM),
        cpus_per_task: int = typer.Option(8, "--cpus-per-task", help="CPU cores per cell's job.",
                                          rich_help_panel=SLURM),
        mem: str = typer.Option(None, "--mem", help="Memory per job, e.g. 32G (default: the partition's).",
                                rich_help_panel=SLURM),
        time_limit: str = typer.Option("240", "--time", help="Time limit per job, minutes or [D-]HH:MM:SS; a "
                                       "job that reaches it is requeued and resumes from its checkpoint.",
                                       rich_help_panel=SLURM),
        slurm_array_parallelism: int = typer.Option(256, "--slurm-array-parallelism",
                                                    help="Cells of the job array running at once.",
                                                    rich_help_panel=SLURM),
        slurm_folder: str = typer.Option(None, "--slurm-folder", help="submitit's job files and logs (default "
                                         "RESULTS/slurm).", rich_help_panel=SLURM),
        slurm_cluster: str = typer.Option("slurm", "--slurm-cluster", help="slurm, or local (submitit's local "
                                          "executor: the same jobs as processes here, to try a sweep out).",
                                          rich_help_panel=SLURM),
        ray_address: str = typer.Option(None, "--ray-address", help="The cluster (default: a Ray instance on this "
                                        "machine).", rich_help_panel=RAY),
        ray_gpus_per_cell: float = typer.Option(1.0, "--ray-gpus-per-cell", help="GPUs per cell (0 on CPUs; 0.25 "
                                                "puts four cells on a GPU).", rich_help_panel=RAY),
        ray_cpus_per_cell: float = typer.Option(1.0, "--ray-cpus-per-cell", help="CPU cores per cell.",
                                                rich_help_panel=RAY),
        ray_max_retries: int = typer.Option(3, "--ray-max-retries", help="Reruns of a failed cell's task (each "
                                            "resumes from the cell's checkpoint).", rich_help_panel=RAY),
        track: str = typer.Option(None, "--track", help="Log each cell's training and curve to tensorboard or "
                                  "wandb, under RESULTS/tracking/RUN_ID/."),
    ) -> None:
        """Run every cell of tasks x attns x pes x seeds that is not in the store yet.

        Several sweeps on one store share the cells: each is claimed before it runs. A paper table's config:
        --config configs/NAME.toml (with its time budget: --budget 25m).
        """
        from lengthbench import validation
        from lengthbench.sweep import (
            configs_of_sweep,
            gpu_slots,
            parse_seeds,
            read_sweep_file,
            run_sweep,
            slot_gpu,
            split_list,
        )

        if config_file is not None and not config_file.strip():
            raise UsageError("--config is empty: give a sweep file")
        settings = read_sweep_file(config_file) if config_file else {}
        flags = dict(train_samples=train_samples, max_multiplier=max_multiplier, eval_samples=eval_samples,
                     train_length=train_length)
        validation.check_overrides(flags)
        seed_list = parse_seeds(seeds if seeds is not None else settings.get("seeds", "0"))
        preset = preset or settings.get("preset", "smoke")
        results = results if results is not None else settings.get("results", DEFAULT_RESULTS)
        if dry_run or status:  # they only read the store
            validation.check_results_readable(results)
        else:
            validation.check_results_writable(results)
        device = device or settings.get("device", "auto")
        if device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"unknown device {device!r}; choose from: auto, cpu, cuda")
        from lengthbench import executors

        if executor not in executors.EXECUTORS:
            raise UsageError(f"unknown executor {executor!r}; choose from: {', '.join(executors.EXECUTORS)}")
        if executor == "local" and device == "cuda" and not (dry_run or status):
            from lengthbench.runner import resolve_device

            resolve_device(device)  # no GPU here: one line now, not after the plan
        if wait is None:  # local waits for cells running elsewhere; slurm returns once its jobs are submitted
            wait = executor != "slurm"
        # the executors' options, for a dry run and --status too (their packages and clusters only for a real run)
        slurm_options = executors.SlurmOptions(
            partition=slurm_partition, gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task,
            mem_gb=executors.parse_memory_gb(mem), timeout_min=executors.parse_minutes(time_limit),
            array_parallelism=slurm_array_parallelism, folder=slurm_folder, cluster=slurm_cluster, wait=wait)
        ray_options = executors.RayOptions(address=ray_address, gpus_per_cell=ray_gpus_per_cell,
                                           cpus_per_cell=ray_cpus_per_cell, max_retries=ray_max_retries)
        labels: dict[str, str] = {}  # run id -> the variant it belongs to ([variants.NAME])
        configs = configs_of_sweep(settings, tasks=tasks, attns=attns, pes=pes, cells=cells, seeds=seeds,
                                   preset=preset, flags=flags, labels=labels)
        cell_list = split_list(cells if cells is not None else settings.get("cells"), "--cells")
        cells_only = [c for c in configs if not any(c.run_id == o.init_from for o in configs)]
        task_list = sorted({c.task for c in cells_only})
        attn_list = sorted({c.attn for c in cells_only})
        pe_list = sorted({c.pe for c in cells_only})
        stages = settings.get("stages", [])
        from lengthbench.runner import run_status
        from lengthbench.store import run_finished

        done_before = sum(run_finished(results, c.run_id) for c in configs)
        per_gpu = per_gpu if per_gpu is not None else settings.get("per_gpu", 1)
        mps = mps if mps is not None else settings.get("mps", "auto")
        from lengthbench.mps import MODES

        if mps not in MODES:
            raise UsageError(f"unknown --mps {mps!r}; choose from: {', '.join(MODES)}")
        budget = budget if budget is not None else settings.get("budget")
        from lengthbench.budget import parse_budget

        budget_seconds = parse_budget(budget) if budget is not None else None
        plan_gpu = _plan_gpu(device, plan_gpu)
        if str(per_gpu).strip() == "auto":
            from lengthbench.sweep import auto_per_gpu

            per_gpu = auto_per_gpu(configs, plan_gpu)
            if budget_seconds is not None:  # fewer side by side where the first cell to run fits no other way
                per_gpu = _fitting_per_gpu(configs, results, budget_seconds, plan_gpu, per_gpu, mps != "off")
        else:
            if isinstance(per_gpu, str):
                if not per_gpu.strip().isdigit():
                    raise UsageError(f"--per-gpu must be a whole number or auto, got {per_gpu!r}")
                per_gpu = int(per_gpu)
            validation.check_int("--per-gpu", per_gpu, 1, 64)
        memory_device = "cuda" if device != "cpu" and _cuda_available() else "cpu"
        for config in configs:
            try:
                validation.check_run_memory(config, memory_device)
            except UsageError as error:
                raise UsageError(f"{config.task}:{config.attn}:{config.pe}: {error}") from error
        from lengthbench.tracking import check_tracker

        check_tracker(track)
        if executor == "slurm" and not (dry_run or status):
            executors.require("submitit", "slurm", "--executor slurm")
        elif executor == "ray" and not (dry_run or status):
            executors.require("ray", "ray", "--executor ray")
            executors.check_ray_address(ray_address)
        if status:
            _print_status(configs, results, labels)
            _print_progress(configs, results, plan_gpu, per_gpu, mps != "off")
            return
        slots = [] if dry_run or executor != "local" else gpu_slots(device, per_gpu)
        gpus = len({slot_gpu(s) for s in slots})
        where = (f"{gpus} GPUs x {len(slots) // gpus} cells" if len(slots) > 1 else
                 ("this process" if not dry_run else ""))
        if executor != "local" and not dry_run:
            where = {"slurm": f"SLURM jobs (submitit, cluster {slurm_cluster})", "ray": "Ray tasks"}[executor]
        shape = (f"{len(cell_list)} listed x {len(seed_list)} seeds" if cell_list else
                 f"{len(task_list)} tasks x {len(attn_list)} attns x {len(pe_list)} pes x {len(seed_list)} seeds")
        if stages:
            shape += f", each after {len(stages)} earlier stage{'s' if len(stages) > 1 else ''}"
        if labels:
            variants = len(set(labels.values()))
            shape += f", and {len(labels)} of {variants} variant{'s' if variants > 1 else ''}"
        err.print(f"[bold]sweep[/]: {len(configs)} runs ({shape}), preset {preset}; {done_before} already in "
                  f"{results}" + (f"; running in {where}" if where else ""), highlight=False)
        if budget_seconds is not None:
            cost = _print_plan(configs, results, budget_seconds, plan_gpu, max(1, len(slots)) if not dry_run else
                               _plan_gpus(device) * per_gpu, per_gpu, mps != "off", labels)
        if dry_run and budget_seconds is not None:
            return
        if dry_run:
            columns = ("cell", "stage", "run id", "status") if stages else ("cell", "run id", "status")
            table = Table(*columns, title="sweep plan", title_justify="left")
            by_id = {c.run_id: c for c in configs}
            sources = {c.init_from for c in configs}
            for config in configs:
                depth, source = 1, config.init_from
                while source in by_id:
                    depth, source = depth + 1, by_id[source].init_from
                stage = [f"{depth}" if config.run_id in sources else f"{depth} (the cell)"] if stages else []
                table.add_row(_cell_name(config, labels), *stage, config.run_id, run_status(results, config))
            out.print(table)
            return
        with _progress(quiet) as progress:
            bar = progress.add_task("cells", total=len(configs), info="")
            running: dict[str, str] = {}

            def on_event(kind, config, outcome, slot) -> None:
                if kind == "start":
                    where = "gpu" if executor == "local" else "job"
                    running[config.run_id] = _cell_name(config, labels) + (f" ({where} {slot})" if slot else "")
                elif kind == "waiting":
                    running[config.run_id] = _cell_name(config, labels) + " (running elsewhere)"
                else:
                    running.pop(config.run_id, None)
                    progress.advance(bar)
                    if kind == "failed":
                        err.print(f"[red]failed[/] {_cell_name(config, labels)}: {outcome.error}", highlight=False,
                                  soft_wrap=True)
                progress.update(bar, info=("running: " + "; ".join(running.values())) if running else "")

            try:
                if executor == "local":
                    from lengthbench.mps import mps_for_sweep

                    with mps_for_sweep(mps, len(slots) > 1 and per_gpu > 1,
                                       say=lambda line: err.print(line, highlight=False)) as mps_on:
                        admit = None
                        if budget_seconds is not None:
                            from lengthbench.budget import BudgetGuard

                            admit = BudgetGuard(budget_seconds, cost, per_gpu, mps_on).admits
                        outcomes = run_sweep(configs, results, device=device, on_event=on_event, slots=slots,
                                             wait=wait, track=track, admit=admit)
                else:
                    outcomes, submitted, unsubmitted = executors.run_on_cluster(
                        configs, results, executor, slurm=slurm_options, ray=ray_options, track=track,
                        device=device, on_event=on_event)
            except KeyboardInterrupt:
                progress.stop()
                err.print("interrupted: run the same command again to finish the sweep (finished cells are kept, "
                          "the interrupted one resumes from its checkpoint)")
                raise SystemExit(130) from None
        if executor == "slurm" and not wait:
            _print_submitted(configs, results, submitted, unsubmitted, outcomes)
            return
        table = Table(title=f"sweep summary ({results})", title_justify="left")
        for column in ("task", "attn", "pe", "seed", "status", "seconds", "reach", "AUC"):
            table.add_column(column, no_wrap=True, justify="right" if column in ("seconds", "AUC") else "left")
        show_note = any(o.error for o in outcomes)
        if show_note:
            table.add_column("note", overflow="fold")
        colours = {"done": "green", "skipped": "dim", "failed": "red", "elsewhere": "yellow", "queued": "blue",
                   "left": "yellow"}
        words = {"done": "ran", "skipped": "in store", "elsewhere": "running elsewhere", "left": "left (budget)"}
        for outcome in outcomes:
            c = outcome.config
            reach_text, auc_text = _summary_numbers(outcome.curve)
            status = words.get(outcome.status, outcome.status)
            table.add_row(c.task, c.attn + params_suffix(c.attn_params), c.pe + params_suffix(c.pe_params), str(c.seed),
                          f"[{colours[outcome.status]}]{status}[/]",
                          f"{outcome.seconds:.1f}" if outcome.status in ("done", "failed") else "", reach_text, auc_text,
                          *([outcome.error] if show_note else []))
        # a log file (no terminal) gets the whole row rather than rich's 80 columns, which cut the last ones
        out.print(table, width=None if out.is_terminal else max(out.width, 160))
        counts = {k: sum(o.status == k for o in outcomes)
                  for k in ("done", "skipped", "failed", "elsewhere", "queued", "left")}
        if counts["left"]:
            left = [o.config for o in outcomes if o.status == "left"]
            finished = counts["done"] + counts["skipped"]
            out.print(f"{finished} cells done, {len(left)} left, next: {_cell_name(left[0], labels)} ({left[0].run_id}). "
                      "The budget stopped the sweep cleanly: run the same command again to go on.", highlight=False)
            if counts["failed"]:
                raise SystemExit(1)
            return
        elsewhere = f", {counts['elsewhere']} running elsewhere" if counts["elsewhere"] else ""
        queued = f", {counts['queued']} queued or running in earlier jobs" if counts["queued"] else ""
        out.print(f"{len(outcomes)} cells: {counts['done']} ran, {counts['skipped']} already in the store, "
                  f"{counts['failed']} failed{elsewhere}{queued}. Next: lengthbench leaderboard --results {results}",
                  highlight=False)
        if counts["failed"]:
            raise SystemExit(1)  # typer.Exit(1) would be lost: main() runs click in non-standalone mode

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
    ) -> None:
        """The published leaderboard: a section per paper-table config (its runs only), a row per attention x
        encoding, a column per multiplier (%), best of seeds and mean +- std, for the paper's checkpoint selection
        and the in-distribution one. --all: every run, a table per task and protocol."""
        from lengthbench.leaderboard import FORMATS, build_leaderboard, write_leaderboard
        from lengthbench.sweep import split_list
        from lengthbench.validation import check_writable

        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
        if publish is not None:
            publish = check_writable(publish, "--publish")
        if out_file is not None:
            out_file = check_writable(out_file, "--out", folder=False)
        if configs and show_all:
            raise UsageError("give --config or --all, not both")
        if fmt == "parquet" and out_file is None and publish is None:
            raise UsageError("--format parquet needs --out FILE")
        from lengthbench.leaderboard import load_stores, results_list

        results = ",".join(results_list(results, DEFAULT_RESULTS))
        frame, notes = load_stores(results, tasks=split_list(task, "--task"), attns=split_list(attn, "--attn"),
                                   pes=split_list(pe, "--pe"), skip_unreadable=skip_unreadable)
        _print_notes(notes)
        if not show_all:
            _published_leaderboard(frame, results, configs, fmt, out_file, publish, note)
            return
        board = build_leaderboard(frame)
        runs = frame["run_id"].nunique()
        if publish is not None:
            source = (f"Generated from {runs} runs in `{results}` by "
                      f"`lengthbench leaderboard --results {results} --publish {publish}`.")
            source = f"{note}\n\n{source}" if note else source
            write_leaderboard(board, "markdown", Path(publish) / "leaderboard.md", source=source)
            write_leaderboard(board, "parquet", Path(publish) / "leaderboard.parquet")
            err.print(f"wrote {Path(publish) / 'leaderboard.md'} and {Path(publish) / 'leaderboard.parquet'} "
                      f"({len(board)} rows from {runs} runs)", highlight=False)
            return
        source = f"Generated from {runs} runs in `{results}`."
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
        from lengthbench.validation import check_writable

        if publish is not None:
            publish = check_writable(publish, "--publish")
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
        _print_notes(notes)
        frame = frame[frame["task"].isin(set(papers["task"]))]
        if frame.empty:
            raise UsageError(f"no runs in {results} of the paper tables' tasks "
                             f"({', '.join(sorted(papers['task'].unique()))})")
        long = compare_store(frame, papers, tolerance=tolerance)
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
        _print_notes(notes)
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
        with _progress(quiet) as progress:
            bar = progress.add_task("cells", total=len(base.cells), info=_cell_name(base.cells[0].config))

            def on_cell(index, cell, seconds, error) -> None:
                progress.advance(bar)
                following = base.cells[index + 1].config if index + 1 < len(base.cells) else None
                progress.update(bar, info=_cell_name(following) if following else "")
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
