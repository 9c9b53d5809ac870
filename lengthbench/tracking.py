"""Experiment tracking of one run (``--track tensorboard|wandb`` on ``lengthbench run`` and ``sweep``).

A tracker receives what the training loop reports (:class:`lengthbench.training.Trainer`'s ``on_metrics``):
every 25 steps the mean training loss, the token accuracy, the learning rate and samples/s (``train/...``),
at each validation the selection's score and the best so far (``validation/...``), and at the end the run's
curve: the task's metric, exact match and token accuracy per multiplier, as scalars (``curve/...``, the step
being the evaluation length) and as a table. Its files go to ``<results>/tracking/<run_id>/``.

TensorBoard: ``tensorboard --logdir <results>/tracking``. Weights & Biases: offline (``wandb sync`` uploads
the folder later) unless ``WANDB_MODE`` or ``WANDB_API_KEY`` is set, one W&B run per lengthbench run (id =
run id, so a resumed run continues it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from lengthbench.config import RunConfig
from lengthbench.errors import UsageError

TRACKERS = ("tensorboard", "wandb")
CURVE_COLUMNS = ("multiplier", "eval_length", "score", "exact_match", "token_accuracy", "n_samples")


def check_tracker(kind: str | None) -> None:
    """Fail now, in one line, for an unknown tracker or one whose package is missing."""
    if kind is None:
        return
    if kind not in TRACKERS:
        raise UsageError(f"unknown tracker {kind!r}; choose from: {', '.join(TRACKERS)}")
    module = "torch.utils.tensorboard" if kind == "tensorboard" else "wandb"
    try:
        __import__(module)
    except ImportError as error:
        raise UsageError(f"--track {kind} needs {kind}: pip install 'lengthbench[{kind}]'") from error


def tracking_dir(results: str | Path, run_id: str, directory: str | Path | None = None) -> Path:
    return Path(directory if directory is not None else Path(results) / "tracking") / run_id


def curve_rows(frame) -> list[dict]:
    """The run's rows as the curve table: one row per multiplier, :data:`CURVE_COLUMNS`."""
    rows = frame.sort_values("multiplier")
    return [{column: row[column] for column in CURVE_COLUMNS} for _, row in rows.iterrows()]


def curve_markdown(frame) -> str:
    lines = ["| " + " | ".join(CURVE_COLUMNS) + " |", "|" + "---|" * len(CURVE_COLUMNS)]
    for row in curve_rows(frame):
        cells = [f"{row[c]:g}" if c == "multiplier" else f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c])
                 for c in CURVE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class TensorBoardTracker:
    """Scalars and the curve's table (as text) in TensorBoard event files, through torch's SummaryWriter."""

    def __init__(self, config: RunConfig, folder: Path):
        self.config, self.folder, self.writer = config, folder, None

    def _writer(self, step: int):
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events an interrupted attempt logged after its checkpoint
            self.writer = SummaryWriter(str(self.folder), purge_step=step)
            self.writer.add_text("config", "```\n" + self.config.to_json() + "\n```", 0)
        return self.writer

    def __call__(self, kind: str, step: int, values: dict[str, float]) -> None:
        writer = self._writer(step)
        for name, value in values.items():
            writer.add_scalar(f"{kind}/{name}", value, step)

    def log_curve(self, frame) -> None:
        writer = self._writer(self.config.train_steps + 1)
        for row in curve_rows(frame):  # the step is the evaluation length (an integer; multipliers may be 1.5)
            for name in ("score", "exact_match", "token_accuracy"):
                writer.add_scalar(f"curve/{name}", row[name], int(row["eval_length"]))
        writer.add_text("curve", curve_markdown(frame), self.config.train_steps)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbTracker:
    """A W&B run: the scalars under the same names, and the curve as a ``wandb.Table``."""

    def __init__(self, config: RunConfig, folder: Path):
        import wandb

        self.wandb = wandb
        folder.mkdir(parents=True, exist_ok=True)
        configured = os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lengthbench"), id=config.run_id,
                              name=config.cell_name(), dir=str(folder), config=config.identity(),
                              mode=None if configured else "offline", resume="allow")

    def __call__(self, kind: str, step: int, values: dict[str, float]) -> None:
        self.run.log({f"{kind}/{name}": value for name, value in values.items()}, step=step)

    def log_curve(self, frame) -> None:
        rows = curve_rows(frame)
        table = self.wandb.Table(columns=list(CURVE_COLUMNS), data=[[row[c] for c in CURVE_COLUMNS] for row in rows])
        self.run.log({"curve": table})
        self.run.summary.update({f"curve/{row['multiplier']:g}x": row["score"] for row in rows})

    def close(self) -> None:
        self.run.finish()


@contextlib.contextmanager
def tracking(kind: str | None, config: RunConfig, results: str | Path,
             directory: str | Path | None = None) -> Iterator[TensorBoardTracker | WandbTracker | None]:
    """The tracker of run ``config`` (None without ``kind``), closed on the way out."""
    if kind is None:
        yield None
        return
    check_tracker(kind)
    folder = tracking_dir(results, config.run_id, directory)
    tracker = (TensorBoardTracker if kind == "tensorboard" else WandbTracker)(config, folder)
    try:
        yield tracker
    finally:
        tracker.close()
