"""``lengthbench sweep``: every cell of a grid or a paper-table config, with its budget's plan and its status."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from lengthbench.cli.common import DEFAULT_RESULTS, cell_name, err, out, print_wide, progress_bar
from lengthbench.config import params_suffix
from lengthbench.errors import UsageError

DEFAULT_PLAN_GPU = "NVIDIA H100 80GB HBM3"  # lengthbench.budget.DEFAULT_PLAN_GPU, without importing pandas here
# --help panels beside the command's first, "Options"
OVER_PRESET = "Over the preset (every cell)"
BUDGET = "Budget and GPUs"
SLURM = "--executor slurm"
RAY = "--executor ray"


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


def _print_status(configs, results: str, labels: dict[str, str] | None = None) -> None:
    """``sweep --status``: a row per cell, from the store and the records of its jobs."""
    from lengthbench.checkpoints import run_status
    from lengthbench.executors import CELL_STATES, cell_states

    states = cell_states(configs, results)
    colours = {"in store": "green", "running": "cyan", "queued": "blue", "failed": "red", "to run": "dim"}
    table = Table("cell", "run id", "state", "job", "note", title=f"sweep status ({results})", title_justify="left")
    for config in configs:
        state = states[config.run_id]
        # a cell an earlier window stopped: what it resumes from
        where = run_status(results, config) if state.state == "to run" and not state.note else ""
        table.add_row(cell_name(config, labels), config.run_id, f"[{colours[state.state]}]{state.state}[/]",
                      f"{state.executor} {state.job_id}".strip(), state.note or where.removeprefix("to run"))
    print_wide(out, table, 160)
    counts = [f"{sum(s.state == name for s in states.values())} {name}" for name in CELL_STATES]
    out.print(f"{len(configs)} cells: " + ", ".join(counts), highlight=False, soft_wrap=True)


def _print_submitted(configs, results: str, submitted, unsubmitted, outcomes) -> None:
    by_id = {c.run_id: c for c in submitted}
    table = Table("cell", "run id", "submitted", title=f"sweep submitted ({results})", title_justify="left")
    from lengthbench.executors import cell_states

    states = cell_states(list(by_id.values()), results)
    for config in submitted:
        table.add_row(cell_name(config), config.run_id, f"job {states[config.run_id].job_id}")
    print_wide(out, table, 160)
    skipped = sum(o is not None and o.status in ("skipped", "queued") for o in outcomes)
    later = (f"; {len(unsubmitted)} wait for an earlier stage: run the same command again once it is in the "
             "store, or use --wait" if unsubmitted else "")
    out.print(f"{len(configs)} cells: {len(submitted)} submitted, {skipped} in the store or queued already{later}. "
              f"Next: the same command with --status", highlight=False, soft_wrap=True)


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
    return CostModel(plan_gpu, store, results=results)


def _fitting_per_gpu(configs, results: str, budget_seconds: float, plan_gpu: str, per_gpu: int, mps: bool) -> int:
    """``--per-gpu auto`` under a budget: the most cells side by side (at most ``per_gpu``) with which the first
    cell not in the store ends inside the budget (each cell side by side runs slower); one where none does (that
    cell, longer than the budget, runs a part of itself alone: lengthbench.budget.BudgetGuard)."""
    from lengthbench.budget import side_by_side_factor
    from lengthbench.checkpoints import cell_finished

    first = next((c for c in configs if not cell_finished(results, c)), None)
    if first is None:
        return per_gpu
    cost = _cost_model(results, plan_gpu).cost(first).total
    for count in range(per_gpu, 0, -1):
        if cost * side_by_side_factor(first, count, mps) <= budget_seconds:
            return count
    return 1


def _print_plan(configs, results: str, budget_seconds: float, plan_gpu: str, slots: int, per_gpu: int,
                mps: bool, labels: dict[str, str] | None = None, fill: bool = False):
    """The budget's plan, before anything starts: each cell's estimated minutes, its start, what fits."""
    from lengthbench.budget import format_minutes, plan
    from lengthbench.checkpoints import cell_finished

    cost = _cost_model(results, plan_gpu)
    planned = plan(configs, budget_seconds, slots, per_gpu, mps, cost,
                   finished=[c.run_id for c in configs if cell_finished(results, c)], fill=fill)
    side = f", {per_gpu} side by side per GPU{' under MPS' if mps else ''}" if per_gpu > 1 else ""
    table = Table("cell", "run id", "minutes", "starts at", "plan", "estimated from",
                  title=f"plan: {format_minutes(budget_seconds)} on {slots // per_gpu} x {plan_gpu}{side}",
                  title_justify="left")
    colours = {"runs": "green", "runs part": "green", "in the store": "dim", "does not fit": "yellow"}
    for cell in planned:
        table.add_row(cell_name(cell.config, labels), cell.config.run_id,
                      f"{cell.seconds / 60:.1f}" if cell.state != "in the store" else "",
                      f"{cell.start / 60:.1f}" if cell.state.startswith("runs") else "",
                      f"[{colours[cell.state]}]{cell.state}[/]", "; ".join(cell.sources))
    print_wide(out, table, 200)
    runs = [c for c in planned if c.state == "runs"]
    part = [c for c in planned if c.state == "runs part"]
    left = [c for c in planned if c.state == "does not fit"]
    end = max((c.end for c in runs + part), default=0.0)
    stored = sum(c.state == "in the store" for c in planned)
    out.print(f"{len(runs)} {'cell fits' if len(runs) == 1 else 'cells fit'} ({format_minutes(end)} of {format_minutes(budget_seconds)}), "
              f"{len(left)} do not" + (f", {stored} in the store already" if stored else "")
              + (f"; next after this budget: {cell_name(left[0].config, labels)}" if left else ""), highlight=False, soft_wrap=True)
    for cell in part:
        why = ("is longer than the budget" if cell.start == 0 and cell.seconds > budget_seconds else
               f"fills the budget's last {format_minutes(cell.until)} (--fill)")
        out.print(f"{cell_name(cell.config, labels)} ({format_minutes(cell.seconds)} left) {why}: it "
                  "runs to the budget's end and stops at its last checkpoint; the same command in the next window "
                  "resumes it", highlight=False, soft_wrap=True)
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
                                             else ""), highlight=False, soft_wrap=True)


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
                                "daemon runs, and stop it at the end (left running while other processes use it); "
                                "on: insist; off: never. A daemon the sweep did not start is used and left running.",
                                rich_help_panel=BUDGET),
        budget: str = typer.Option(None, "--budget", help="Time budget, e.g. 25m, 90s or 1h30m: plan each cell's "
                                   "minutes first (print the plan), never start a cell that cannot end inside it, "
                                   "and stop cleanly (exit 0) when the next does not fit.", rich_help_panel=BUDGET),
        fill: bool = typer.Option(None, "--fill/--no-fill", help="Fill the budget's tail: where the next cell "
                                  "cannot end inside the budget but 5 minutes or more are left, run it as a part, "
                                  "stopped at the budget's end at its last checkpoint and resumed by the same "
                                  "command (its checkpoints must reach the next window). Default: the config's "
                                  "fill, else off.", rich_help_panel=BUDGET),
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
        if executor == "local" and device in ("cuda", "auto") and not (dry_run or status):
            from lengthbench.runner import resolve_device

            resolve_device(device)  # no GPU here, or one CUDA cannot start: one line now, not after the plan
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
        if fill and budget is None:
            raise UsageError("--fill fills a budget's tail: give --budget too (e.g. --budget 25m)")
        fill = fill if fill is not None else bool(settings.get("fill", False))
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
                               _plan_gpus(device) * per_gpu, per_gpu, mps != "off", labels, fill)
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
                table.add_row(cell_name(config, labels), *stage, config.run_id, run_status(results, config))
            out.print(table)
            return
        with progress_bar(quiet) as progress:
            bar = progress.add_task("cells", total=len(configs), info="")
            running: dict[str, str] = {}

            def on_event(kind, config, outcome, slot) -> None:
                if kind == "start":
                    where = "gpu" if executor == "local" else "job"
                    running[config.run_id] = cell_name(config, labels) + (f" ({where} {slot})" if slot else "")
                elif kind == "waiting":
                    running[config.run_id] = cell_name(config, labels) + " (running elsewhere)"
                else:
                    running.pop(config.run_id, None)
                    progress.advance(bar)
                    if kind == "failed":
                        err.print(f"[red]failed[/] {cell_name(config, labels)}: {outcome.error}", highlight=False,
                                  soft_wrap=True)
                progress.update(bar, info=("running: " + "; ".join(running.values())) if running else "")

            try:
                if executor == "local":
                    from lengthbench.mps import mps_for_sweep

                    with mps_for_sweep(mps, len(slots) > 1 and per_gpu > 1,
                                       say=lambda line: err.print(line, highlight=False)) as mps_on:
                        admit = stop_at = None
                        if budget_seconds is not None:
                            from lengthbench.budget import BudgetGuard

                            guard = BudgetGuard(budget_seconds, cost, per_gpu, mps_on, fill=fill)
                            admit, stop_at = guard.admits, guard.stop_at
                        outcomes = run_sweep(configs, results, device=device, on_event=on_event, slots=slots,
                                             wait=wait, track=track, admit=admit, stop_at=stop_at)
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
        print_wide(out, table, 160)
        counts = {k: sum(o.status == k for o in outcomes)
                  for k in ("done", "skipped", "failed", "elsewhere", "queued", "left")}
        if counts["left"]:
            left = [o.config for o in outcomes if o.status == "left"]
            finished = counts["done"] + counts["skipped"]
            out.print(f"{finished} cell{'' if finished == 1 else 's'} done, {len(left)} left, next: {cell_name(left[0], labels)} ({left[0].run_id}). "
                      "The budget stopped the sweep cleanly: run the same command again to go on.", highlight=False, soft_wrap=True)
            if counts["failed"]:
                raise SystemExit(1)
            return
        elsewhere = f", {counts['elsewhere']} running elsewhere" if counts["elsewhere"] else ""
        queued = f", {counts['queued']} queued or running in earlier jobs" if counts["queued"] else ""
        out.print(f"{len(outcomes)} cells: {counts['done']} ran, {counts['skipped']} already in the store, "
                  f"{counts['failed']} failed{elsewhere}{queued}. Next: lengthbench leaderboard --results {results}",
                  highlight=False, soft_wrap=True)
        if counts["failed"]:
            raise SystemExit(1)  # typer.Exit(1) would be lost: main() runs click in non-standalone mode
