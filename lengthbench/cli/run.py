"""``lengthbench run``: train one cell and print its extrapolation curve."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from lengthbench.config import parse_params, selection_words
from lengthbench.errors import UsageError
from lengthbench.tasks import multiplier_label

out = Console()


def curve_table(frame, title: str) -> Table:
    metric = frame["metric"].iloc[0] if "metric" in frame else "exact_match"
    table = Table(title=title, title_justify="left")
    for column in ("multiplier", "eval_length", "tokens", "exact match %", "token acc %", "samples", "eval s"):
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


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        task: str = typer.Option(..., "--task", help="Task name (lengthbench tasks list)."),
        attn: str = typer.Option(..., "--attn", help="Attention mechanism (lengthbench attn list)."),
        pe: str = typer.Option(..., "--pe", help="Positional encoding: rope, none, alibi, nape (lengthbench pe list)."),
        preset: str = typer.Option("smoke", "--preset", help="smoke (CPU minute), quick (GPU minutes), paper."),
        train_length: int = typer.Option(None, "--train-length", help="n_train (default: the task's, 64 for most)."),
        max_multiplier: int = typer.Option(None, "--max-multiplier",
                                           help="Largest multiplier, a power of 2 (default: the preset's; 1024 for quick/paper, 8 for smoke)."),
        eval_samples: int = typer.Option(None, "--eval-samples", help="Samples per evaluation length."),
        seed: int = typer.Option(0, "--seed"),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
        results: str = typer.Option("runs", "--results", help="Results store folder."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from its checkpoint."),
        restart: bool = typer.Option(False, "--restart", help="Discard an earlier checkpoint or result of this run."),
        train_samples: int = typer.Option(None, "--train-samples", help="Override the preset's training samples."),
        batch_size: int = typer.Option(None, "--batch-size"),
        lr: float = typer.Option(None, "--lr"),
        warmup_steps: int = typer.Option(None, "--warmup-steps"),
        eval_every: int = typer.Option(None, "--eval-every",
                                       help="Steps between validations (logged; the checkpoint selection's points)."),
        d_model: int = typer.Option(None, "--d-model"),
        layers: int = typer.Option(None, "--layers"),
        heads: int = typer.Option(None, "--heads"),
        ffn: int = typer.Option(None, "--ffn"),
        init: str = typer.Option(None, "--init", help="Weight initialisation: normal-0.02 (N(0, 0.02^2), the "
                                 "default) or torch (PyTorch's defaults; faster recall, worse Copy extrapolation)."),
        arch: str = typer.Option(None, "--arch", help="Block layout: prenorm (LayerNorm, GELU MLP; the default) or "
                                 "gemma2 (RMSNorm before and after each sublayer, GeGLU, no biases, scaled "
                                 "embeddings: the Sparse Attention authors' code)."),
        init_from: str = typer.Option(None, "--init-from",
                                      help="Start from the trained weights of this run id (same --results; its "
                                      "model must have this one's shapes): a curriculum."),
        init_part: str = typer.Option(None, "--init-part", help="What --init-from carries over: all (default) or "
                                      "body (all but the token embedding and output layer, which start fresh: "
                                      "the source may have another vocabulary)."),
        selection: str = typer.Option(None, "--selection",
                                      help="Checkpoint selection: id (in-distribution validation, default) or Nx, "
                                      "validation at N times n_train for a power of two N (8x: the papers' "
                                      "protocol; Long-Context Generalization with Sparse Attention selects "
                                      "RoPE models at 2x or 4x)."),
        selection_metric: str = typer.Option(None, "--selection-metric",
                                             help="What the selection compares: task (the task's metric, "
                                             "default), exact_match, token_accuracy or bleu (corpus BLEU-4 of "
                                             "the answers: Long-Context Generalization with Sparse Attention's for "
                                             "models that score 0 at 2x-8x)."),
        compile: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile on CUDA."),
        compile_mode: str = typer.Option(None, "--compile-mode", help="torch.compile mode on CUDA: default, "
                                         "reduce-overhead (CUDA graphs; 1.9x at batch 128 for softmax) or "
                                         "max-autotune."),
        train_attention: str = typer.Option(None, "--train-attention", help="What models with fused ops train "
                                            "on, on CUDA: fused (their Triton ops, recorded in the training "
                                            "step's CUDA graph; the default) or reference (their dense "
                                            "references; two models trained this way under the compiled step did "
                                            "not extrapolate). Scoring is on the fused ops."),
        diagnostics: bool = typer.Option(None, "--diagnostics/--no-diagnostics", help="Measure sparsity, sink rate, entropy."),
        param: list[str] = typer.Option([], "--param", help="Task parameter key=value (repeatable)."),
        attn_param: list[str] = typer.Option([], "--attn-param", help="Mechanism parameter key=value."),
        pe_param: list[str] = typer.Option([], "--pe-param", help="Encoding parameter key=value."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Check the arguments, print the run id and plan "
                                     "and whether the store has the run, then stop (nothing trained or written)."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars: a plain line at each validation and "
                                   "evaluation length instead (for logs)."),
        plugin: list[str] = typer.Option([], "--plugin", help="Module registering your own task/attn/pe."),
        track: str = typer.Option(None, "--track", help="Log training and the curve to tensorboard or wandb "
                                  "(offline unless configured), under RESULTS/tracking/RUN_ID/."),
    ) -> None:
        """Train one model at n_train and evaluate it at every multiplier up to --max-multiplier."""
        from lengthbench.cli import load_plugins

        load_plugins(plugin)
        from lengthbench import validation
        from lengthbench.config import build_config
        from lengthbench.runner import resolve_device, run_cell
        from lengthbench.tasks import get_task

        if resume and restart:
            raise UsageError("give --resume or --restart, not both: --resume continues the checkpoint, "
                             "--restart discards it")
        validation.check_results_writable(results)
        numbers = dict(seed=seed, train_length=train_length, max_multiplier=max_multiplier,
                       eval_samples=eval_samples, train_samples=train_samples, batch_size=batch_size, lr=lr,
                       warmup_steps=warmup_steps, eval_every=eval_every, d_model=d_model, n_layers=layers,
                       n_heads=heads, ffn=ffn)
        validation.check_overrides(numbers)
        task_params = parse_params(param)
        attn_params = parse_params(attn_param, "--attn-param")
        pe_params = parse_params(pe_param, "--pe-param")
        validation.check_task_params(task, task_params)
        if train_length is None:
            train_length = type(get_task(task, **task_params)).default_train_length
        config = build_config(
            task, attn, pe, preset, train_length=train_length, max_multiplier=max_multiplier,
            eval_samples=eval_samples, seed=seed, train_samples=train_samples, batch_size=batch_size, lr=lr,
            warmup_steps=warmup_steps, eval_every=eval_every, d_model=d_model, n_layers=layers, n_heads=heads,
            ffn=ffn, init=init, arch=arch, init_from=init_from, init_part=init_part,
            selection=selection, selection_metric=selection_metric, compile=compile, compile_mode=compile_mode,
            train_attention=train_attention, diagnostics=diagnostics,
            task_params=task_params, attn_params=attn_params, pe_params=pe_params,
        )
        validation.check_config(config)
        get_task(config.task, **config.task_params).check_length(config.train_length)
        from lengthbench.tasks import eval_multipliers

        eval_multipliers(config.max_multiplier)  # validates before any training
        torch_device = resolve_device(device)
        validation.check_run_memory(config, torch_device.type)
        from lengthbench.tracking import check_tracker, tracking

        check_tracker(track)
        # build the model once on the meta device so a bad mechanism/encoding parameter fails now
        if note := scaled_heads_note(config, _check_model(config)):
            out.print(note, highlight=False, soft_wrap=True)
        out.print(f"[bold]{config.run_id}[/]  {config.train_steps:,} steps x batch {config.batch_size}, "
                  f"{config.n_layers} layers x d {config.d_model}, {config.n_heads} heads; results -> {results}")
        if dry_run:
            from lengthbench.runner import cell_finished, checkpoint_dir

            state = ("finished: in the store" if cell_finished(results, config) else
                     "interrupted: a checkpoint to --resume" if checkpoint_dir(results, config.run_id).exists()
                     else "not started")
            out.print(f"dry run: {state}")
            return
        from lengthbench.claims import claim, holder

        with claim(results, config.run_id) as got:  # the claim a sweep takes: one process trains a run at a time
            if not got:
                raise UsageError(f"run {config.run_id} is running elsewhere ({holder(results, config.run_id)}) in "
                                 f"{results}; run this again once it ends")
            with tracking(track, config, results) as tracker:
                frame = run_cell(config, results, device=device, resume=resume, restart=restart, progress=not quiet,
                                 log=(lambda line: print(line, flush=True)) if quiet else None, on_metrics=tracker)
                if tracker is not None:
                    tracker.log_curve(frame)
        cell = config.cell_name().rsplit(" / s", 1)[0]  # "task / attn (params) + pe"
        out.print(curve_table(frame, f"{cell} (seed {config.seed}, {config.preset}; metric: {frame['metric'].iloc[0]})"))
        stored = json.loads(frame["config_json"].iloc[0])
        words = (selection_words(stored.get("selection", "id"), stored.get("selection_metric", "task"))
                 or "in distribution")
        best_step = frame["best_step"].iloc[0] if "best_step" in frame else float("nan")
        kept = f": step {int(best_step):,} kept" if best_step == best_step else ""  # runs stored before the field
        out.print(f"trained {frame['train_steps'].iloc[0]:,} steps in {frame['train_seconds'].iloc[0]:.1f}s "
                  f"on {frame['device'].iloc[0]}; selection {words}{kept}")

    @app.command("rescore")
    def rescore(
        run_id: str = typer.Argument(..., help="Run id of a trained run in --results (its checkpoints/RUN/model.pt)."),
        samples: int = typer.Option(None, "--samples", help="Samples per evaluation length (the seeds': 1000)."),
        max_multiplier: int = typer.Option(None, "--max-multiplier", help="Largest multiplier, a power of 2."),
        device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
        results: str = typer.Option("runs", "--results", help="Results store folder."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar: a plain line per evaluation length."),
        plugin: list[str] = typer.Option([], "--plugin", help="Module registering your own task/attn/pe."),
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

        frame = rescore_run(results, run_id, samples=samples, max_multiplier=max_multiplier, device=device,
                            progress=not quiet, log=(lambda line: print(line, flush=True)) if quiet else None)
        new_id = frame["run_id"].iloc[0]
        config = json.loads(frame["config_json"].iloc[0])
        out.print(curve_table(frame, f"{new_id}: {run_id} rescored ({config['eval_samples']} samples per length; "
                                     f"metric: {frame['metric'].iloc[0]})"))
        out.print(f"on {frame['device'].iloc[0]}; results -> {results}")


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
