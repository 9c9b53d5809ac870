"""``lengthbench run``: train one cell and print its extrapolation curve."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from lengthbench.config import parse_params, selection_words
from lengthbench.errors import UsageError
from lengthbench.plugins import HELP as PLUGIN_HELP
from lengthbench.tasks import multiplier_label

out = Console()


def curve_table(frame, title: str) -> Table:
    metric = frame["metric"].iloc[0] if "metric" in frame else "exact_match"
    table = Table(title=title, title_justify="left")
    for column in ("multiplier", "n", "tokens", "exact match %", "token acc %", "samples", "eval s"):
        table.add_column(column, justify="right")
    for row in frame.sort_values("multiplier").itertuples():
        em, ta = f"{100 * row.exact_match:.1f}", f"{100 * row.token_accuracy:.1f}"
        if metric == "exact_match":
            em = f"[bold]{em}[/]"
        else:
            ta = f"[bold]{ta}[/]"
        table.add_row(f"{multiplier_label(row.multiplier)}x", str(row.eval_length), f"{row.realised_tokens:.0f}",
                      em, ta, str(row.n_samples), f"{row.eval_seconds:.1f}")
    return table


# --help panels of `run` and `rescore` (the cell's own options stay in the first, "Options")
TRAINING = "Training (over the preset)"
MODEL = "Model (over the preset)"
SCORING = "Scoring"
STORE = "Store, resume, output"
CUDA = "CUDA"


def register(app: typer.Typer) -> None:
    @app.command("run", rich_help_panel="Train and score")
    def run(
        task: str = typer.Option(..., "--task", help="Task (lengthbench tasks list)."),
        attn: str = typer.Option(..., "--attn", help="Attention mechanism (lengthbench attn list)."),
        pe: str = typer.Option(..., "--pe", help="Positional encoding (lengthbench pe list)."),
        preset: str = typer.Option(None, "--preset", show_default=False,
                                   help="smoke, quick or paper. Default: on a GPU the task's recipe (see above); "
                                   "on a CPU smoke."),
        seed: int = typer.Option(0, "--seed"),
        param: list[str] = typer.Option([], "--param", help="Task parameter key=value (repeatable; lengthbench "
                                        "tasks params TASK)."),
        attn_param: list[str] = typer.Option([], "--attn-param", help="Mechanism parameter key=value (lengthbench "
                                             "attn params NAME)."),
        pe_param: list[str] = typer.Option([], "--pe-param", help="Encoding parameter key=value."),
        train_length: int = typer.Option(None, "--train-length", help="n_train (default: the task's, 64 for most).",
                                         rich_help_panel=TRAINING),
        train_samples: int = typer.Option(None, "--train-samples", rich_help_panel=TRAINING),
        batch_size: int = typer.Option(None, "--batch-size", rich_help_panel=TRAINING),
        lr: float = typer.Option(None, "--lr", rich_help_panel=TRAINING),
        warmup_steps: int = typer.Option(None, "--warmup-steps", rich_help_panel=TRAINING),
        eval_every: int = typer.Option(None, "--eval-every", help="Steps between validations.",
                                       rich_help_panel=TRAINING),
        selection: str = typer.Option(None, "--selection", rich_help_panel=TRAINING,
                                      help="Checkpoint kept: id (best in distribution, default) or Nx (best at N "
                                      "x n_train; 8x: the papers')."),
        selection_metric: str = typer.Option(None, "--selection-metric", rich_help_panel=TRAINING,
                                             help="task (default), exact_match, token_accuracy or bleu."),
        init: str = typer.Option(None, "--init", help="normal-0.02 (default) or torch (PyTorch's).",
                                 rich_help_panel=TRAINING),
        init_from: str = typer.Option(None, "--init-from", help="Start from this run's trained weights (same "
                                      "--results, same shapes).", rich_help_panel=TRAINING),
        init_part: str = typer.Option(None, "--init-part", help="all (default) or body (not the embedding and "
                                      "output layer).", rich_help_panel=TRAINING),
        d_model: int = typer.Option(None, "--d-model", rich_help_panel=MODEL),
        layers: int = typer.Option(None, "--layers", rich_help_panel=MODEL),
        heads: int = typer.Option(None, "--heads", rich_help_panel=MODEL),
        ffn: int = typer.Option(None, "--ffn", rich_help_panel=MODEL),
        arch: str = typer.Option(None, "--arch", help="prenorm (default) or gemma2 (the Sparse Attention "
                                 "authors' block).", rich_help_panel=MODEL),
        max_multiplier: int = typer.Option(None, "--max-multiplier", help="Largest multiplier, a power of 2.",
                                           rich_help_panel=SCORING),
        eval_samples: int = typer.Option(None, "--eval-samples", help="Samples per length.",
                                         rich_help_panel=SCORING),
        diagnostics: bool = typer.Option(None, "--diagnostics/--no-diagnostics", help="Sparsity, sink rate, "
                                         "entropy per length.", rich_help_panel=SCORING),
        log_samples: bool = typer.Option(False, "--log-samples", help="Each length's scored samples (target, "
                                         "prediction, symbols) as JSON Lines in RESULTS/checkpoints/ RUN_ID/.",
                                         rich_help_panel=SCORING),
        results: str = typer.Option("runs", "--results", help="Results store folder.", rich_help_panel=STORE),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda.", rich_help_panel=STORE),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run.", rich_help_panel=STORE),
        restart: bool = typer.Option(False, "--restart", help="Discard this run's checkpoint or result.",
                                     rich_help_panel=STORE),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and cost; train nothing.",
                                     rich_help_panel=STORE),
        quiet: bool = typer.Option(False, "--quiet", help="Plain lines, no progress bar (also when the output is "
                                   "not a terminal).", rich_help_panel=STORE),
        track: str = typer.Option(None, "--track", help="tensorboard or wandb, under RESULTS/tracking/.",
                                  rich_help_panel=STORE),
        plugin: list[str] = typer.Option([], "--plugin", help=PLUGIN_HELP, rich_help_panel=STORE),
        compile: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile.", rich_help_panel=CUDA),
        compile_mode: str = typer.Option(None, "--compile-mode", help="default, reduce-overhead or max-autotune.",
                                         rich_help_panel=CUDA),
        train_attention: str = typer.Option(None, "--train-attention", help="fused (the Triton ops, default) or "
                                            "reference (dense references).", rich_help_panel=CUDA),
    ) -> None:
        """Train one model at n_train and score it at every multiplier up to --max-multiplier.

        Without --preset, a GPU trains the task's recipe: a preset, settings and curriculum with which the committed
        runs learn the task in minutes (for most tasks its paper-table config's training); a CPU trains the smoke
        preset, a tiny model that checks the pipeline and learns little. The cost is printed before training
        starts.
        """
        from lengthbench.cli import load_plugins

        load_plugins(plugin)
        from lengthbench import validation
        from lengthbench.defaults import default_recipe
        from lengthbench.runner import resolve_device, run_cell

        if resume and restart:
            raise UsageError("give --resume or --restart, not both: --resume continues the checkpoint, "
                             "--restart discards it")
        if dry_run:  # it only reads the store
            validation.check_results_readable(results)
        else:
            validation.check_results_writable(results)
        numbers = dict(seed=seed, train_length=train_length, max_multiplier=max_multiplier,
                       eval_samples=eval_samples, train_samples=train_samples, batch_size=batch_size, lr=lr,
                       warmup_steps=warmup_steps, eval_every=eval_every, d_model=d_model, n_layers=layers,
                       n_heads=heads, ffn=ffn)
        validation.check_overrides(numbers)
        explicit = dict(numbers, init=init, arch=arch, init_from=init_from, init_part=init_part,
                        selection=selection, selection_metric=selection_metric, compile=compile,
                        compile_mode=compile_mode, train_attention=train_attention, diagnostics=diagnostics,
                        task_params=parse_params(param), attn_params=parse_params(attn_param, "--attn-param"),
                        pe_params=parse_params(pe_param, "--pe-param"))
        validation.check_task_params(task, explicit["task_params"])
        torch_device = resolve_device(device)
        recipe = default_recipe(_canonical_task(task), _canonical_pe(pe), torch_device.type, preset)
        chain = plan_run(task, attn, pe, recipe, explicit)
        config = chain[-1]
        for each in chain:
            validation.check_run_memory(each, torch_device.type)
        from lengthbench.tracking import check_tracker, tracking

        check_tracker(track)
        # build the model once on the meta device so a bad mechanism/encoding parameter fails now
        if note := scaled_heads_note(config, _check_model(config)):
            out.print(note, highlight=False, soft_wrap=True)
        # whole lines (soft_wrap): a pipe or log file gets each as one line, not broken at 80 columns
        out.print(f"[bold]{config.run_id}[/]  {config.train_steps:,} steps x batch {config.batch_size}, "
                  f"{config.n_layers} layers x d {config.d_model}, {config.n_heads} heads; results -> {results}",
                  soft_wrap=True)
        for line in cost_lines(chain, recipe, preset, torch_device, explicit):
            out.print(line, highlight=False, soft_wrap=True)
        if dry_run:
            from lengthbench.runner import cell_finished, checkpoint_dir

            for each in chain:
                state = ("finished: in the store" if cell_finished(results, each) else
                         "interrupted: a checkpoint to --resume" if checkpoint_dir(results, each.run_id).exists()
                         else "not started")
                stage = f" (stage {chain.index(each) + 1} of {len(chain)}: {each.run_id})" if each is not config else ""
                out.print(f"dry run{stage}: {state}", highlight=False, soft_wrap=True)
            return
        from lengthbench.claims import claim, holder

        progress = not quiet and out.is_terminal  # a pipe or a log file gets plain lines, not a clipped bar
        log = None if progress else (lambda line: print(line, flush=True))
        for number, each in enumerate(chain, 1):
            if each is not config:
                out.print(f"stage {number} of {len(chain)}: {each.run_id} ({each.task} at n {each.train_length}"
                          f"{' ' + _params(each.task_params) if each.task_params else ''})", highlight=False,
                          soft_wrap=True)
            with claim(results, each.run_id) as got:  # a sweep's claim: one process trains a run at a time
                if not got:
                    raise UsageError(f"run {each.run_id} is running elsewhere ({holder(results, each.run_id)}) "
                                     f"in {results}; run this again once it ends")
                with tracking(track if each is config else None, each, results) as tracker:
                    # --restart retrains the cell; its finished stages stay (a stage of --resume continues)
                    frame = run_cell(each, results, device=device, resume=resume, restart=restart and each is config,
                                     progress=progress, log=log, on_metrics=tracker,
                                     log_samples=log_samples and each is config)
                    if tracker is not None:
                        tracker.log_curve(frame)
            if each is not config:
                first = frame.sort_values("multiplier").iloc[0]
                out.print(f"stage {number}: {first['metric'].replace('_', ' ')} {100 * first['score']:.1f}% in "
                          "distribution", highlight=False)
        cell = config.cell_name().rsplit(" / s", 1)[0]  # "task / attn (params) + pe"
        out.print(curve_table(frame, f"{cell} (seed {config.seed}, {config.preset}; metric: {frame['metric'].iloc[0]})"))
        stored = json.loads(frame["config_json"].iloc[0])
        words = (selection_words(stored.get("selection", "id"), stored.get("selection_metric", "task"))
                 or "in distribution")
        best_step = frame["best_step"].iloc[0] if "best_step" in frame else float("nan")
        kept = f": step {int(best_step):,} kept" if best_step == best_step else ""  # runs stored before the field
        out.print(f"trained {frame['train_steps'].iloc[0]:,} steps in {frame['train_seconds'].iloc[0]:.1f}s "
                  f"on {frame['device'].iloc[0]}; selection {words}{kept}", soft_wrap=True)
        if log_samples:
            out.print(log_samples_note(results, config.run_id, frame), highlight=False, soft_wrap=True)

    @app.command("rescore", rich_help_panel="Train and score")
    def rescore(
        run_id: str = typer.Argument(..., help="Run id of a trained run in --results (its checkpoints/RUN/model.pt)."),
        samples: int = typer.Option(None, "--samples", help="Samples per evaluation length (the papers': 1000).",
                                    rich_help_panel=SCORING),
        max_multiplier: int = typer.Option(None, "--max-multiplier", help="Largest multiplier, a power of 2.",
                                           rich_help_panel=SCORING),
        log_samples: bool = typer.Option(False, "--log-samples", help="Each length's scored samples (target, "
                                         "prediction, symbols) as JSON Lines in RESULTS/checkpoints/ NEW_RUN_ID/.",
                                         rich_help_panel=SCORING),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda.", rich_help_panel=STORE),
        results: str = typer.Option("runs", "--results", help="Results store folder.", rich_help_panel=STORE),
        quiet: bool = typer.Option(False, "--quiet", help="Plain lines, no progress bar (also when the output is "
                                   "not a terminal).", rich_help_panel=STORE),
        plugin: list[str] = typer.Option([], "--plugin", help=PLUGIN_HELP, rich_help_panel=STORE),
    ) -> None:
        """Score a trained run again with other samples or lengths, as a run of its own; nothing is trained."""
        # The new run's configuration is the old one's with --samples / --max-multiplier and `rescored_from` set;
        # its training fields are the old run's; the leaderboard says "rescored" in its protocol, so it does not
        # mix with runs scored the first time. Interrupted, the same command resumes it.
        from lengthbench.cli import load_plugins

        load_plugins(plugin)
        from lengthbench import validation
        from lengthbench.runner import rescore_run

        validation.check_results_writable(results)
        if samples is not None:
            validation.check_int("--samples", samples, *validation.RUN_RANGES["eval_samples"])
        if max_multiplier is not None:
            validation.check_max_multiplier(max_multiplier)

        progress = not quiet and out.is_terminal
        frame = rescore_run(results, run_id, samples=samples, max_multiplier=max_multiplier, device=device,
                            progress=progress, log=None if progress else (lambda line: print(line, flush=True)),
                            log_samples=log_samples)
        new_id = frame["run_id"].iloc[0]
        config = json.loads(frame["config_json"].iloc[0])
        out.print(curve_table(frame, f"{new_id}: {run_id} rescored ({config['eval_samples']} samples per length; "
                                     f"metric: {frame['metric'].iloc[0]})"))
        out.print(f"on {frame['device'].iloc[0]}; results -> {results}")
        if log_samples:
            out.print(log_samples_note(results, new_id, frame), highlight=False, soft_wrap=True)


def _canonical_task(name: str) -> str:
    from lengthbench.tasks import TASKS

    return TASKS.canonical(name)


def _canonical_pe(name: str) -> str:
    from lengthbench.models.positional import POSITIONAL_ENCODINGS

    return POSITIONAL_ENCODINGS.canonical(name)


def _params(params: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(params.items()))


def plan_run(task: str, attn: str, pe: str, recipe, explicit: dict) -> list:
    """The configurations ``run`` trains, in order: a recipe's curriculum stages (:func:`lengthbench.sweep.add_stages`,
    unless ``--init-from`` is given), then the cell. The cell's fields: the recipe's over its preset, then what the
    user gave (``explicit``: RunConfig fields, None where not given; a user's task, attention or encoding
    parameters over the recipe's, one by one), then the task's own n_train where neither sets it. Every
    configuration is checked before anything runs."""
    from lengthbench import validation
    from lengthbench.config import build_config
    from lengthbench.sweep import add_stages, default_train_length, merged_fields
    from lengthbench.tasks import eval_multipliers, get_task

    fields = merged_fields(recipe.overrides, {key: value for key, value in explicit.items() if value is not None})
    fields = {**default_train_length(task, fields), **fields}
    config = build_config(task, attn, pe, recipe.preset, **fields)
    validation.check_config(config)
    get_task(config.task, **config.task_params).check_length(config.train_length)
    eval_multipliers(config.max_multiplier)  # validates before any training
    if not recipe.stages or config.init_from:
        return [config]
    return add_stages([config], [dict(stage) for stage in recipe.stages], recipe.preset, fields)


def cost_lines(chain: list, recipe, preset: str | None, device, explicit: dict) -> list[str]:
    """What ``run`` prints before it trains: where no --preset was given on a GPU, which recipe it is; the cost of
    the runs (steps, samples, minutes on this device where the committed runs give an estimate); on a CPU without
    --preset, what a real run of the task needs on a GPU, and how often the committed runs of it learned."""
    from lengthbench import defaults
    from lengthbench.devices import device_description

    config = chain[-1]
    runs = defaults.committed_runs(task=config.task)
    lines = []
    if preset is None and device.type == "cuda":
        learned = defaults.learned_words(config, runs)
        lines.append(f"default on a GPU for {config.task} + {config.pe}: {recipe.describe()}"
                     + (f"; {learned}" if learned else "") + "; --preset chooses another")
    cost = "cost: " + defaults.cost_words(chain, device_description(device), runs)
    if preset is None and device.type != "cuda":
        cost += " (the smoke preset, a CPU's default: a tiny model that checks the pipeline and learns little)"
        lines.append(cost)
        # the recipe as a GPU runs it for this cell: the cell's own parameters and seed, none of the overrides
        cell = {key: explicit.get(key) for key in ("seed", "task_params", "attn_params", "pe_params")}
        gpu = defaults.gpu_recipe(config.task, config.pe)
        gpu_chain = plan_run(config.task, config.attn, config.pe, gpu, cell)
        learned = defaults.learned_words(gpu_chain[-1], runs)
        lines.append(f"a real run of {config.task} needs a GPU, where `run` defaults to {gpu.describe()}: "
                     f"{defaults.cost_words(gpu_chain, defaults.usual_device(gpu_chain, runs), runs)}"
                     + (f"; {learned}" if learned else ""))
    else:
        lines.append(cost)
    return lines


def log_samples_note(results: str, run_id: str, frame) -> str:
    """Where ``--log-samples`` wrote the scored samples, or why it wrote none (the run was in the store)."""
    from lengthbench.runner import sample_log_path

    paths = [sample_log_path(results, run_id, m) for m in sorted(frame["multiplier"])]
    written = [path for path in paths if path.exists()]
    if not written:
        return (f"no samples logged: {run_id} was in the store already (nothing was scored); `lengthbench rescore "
                f"{run_id} --samples N --log-samples` scores it again")
    missing = (f"; {len(paths) - len(written)} lengths scored before --log-samples was given have none"
               if len(written) < len(paths) else "")
    return f"scored samples: {written[0].parent}/samples_*x.jsonl, a JSON Lines file per length{missing}"


def _check_model(config):
    """The model built on the meta device (no memory, no weights): a bad mechanism or encoding parameter fails
    here, before any training."""
    import torch

    from lengthbench.runner import build_model
    from lengthbench.tasks import get_task

    try:
        with torch.device("meta"):
            return build_model(config, get_task(config.task, **config.task_params))
    except (TypeError, ValueError) as error:  # a parameter the mechanism or encoding refuses
        raise UsageError(f"{config.attn} + {config.pe}: {str(error).splitlines()[0]}") from error


def scaled_heads_note(config, model) -> str | None:
    """A one-line note where a length-scaled mechanism scales every head under an encoding that mixes ALiBi and
    NoPE heads (NAPE) by default: the code of Long-Context Generalization with Sparse Attention scales the NoPE
    heads only, and the two differ far apart. None where the user chose, or where there is no such mix."""
    if "scaled_heads" in config.attn_params:
        return None
    attn = model.attention_layers[0] if model.attention_layers else None
    if getattr(attn, "scaled_heads", None) != "all":
        return None
    biased = attn.pe.biased_heads() if hasattr(attn, "pe") else []
    if not any(biased) or all(biased):
        return None
    return (f"note: {config.attn} scales every head here, the ALiBi heads' bias included (scaled_heads=all, the "
            "default); the code of Long-Context Generalization with Sparse Attention scales only the NoPE heads: "
            "--attn-param scaled_heads=nope")
