"""The results store: one Parquet file per finished run under ``<results>/runs/``.

One file per run makes every write atomic (write a temporary file, then ``os.replace``) and keeps the
store readable while other runs append; a run killed at any moment leaves at most its own rows
unwritten. ``load_results`` concatenates the files and reports (not raises on) unreadable ones.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd

# The contract of ../shared/specs/INTERFACES.md, in order; more columns follow them.
CONTRACT_COLUMNS = [
    "run_id", "task", "attn", "pe", "seed", "preset", "train_length", "eval_length", "multiplier",
    "exact_match", "token_accuracy", "n_samples", "realised_tokens", "selection", "train_steps",
    "train_seconds", "eval_seconds", "device", "lengthbench_version", "git_sha", "created_at",
    "sparsity", "sink_rate", "entropy",
]
# Beyond the contract: the task's reported metric and its value, the run's full configuration, and the
# version of the store's schema the row was written under.
EXTRA_COLUMNS = ["metric", "score", "config_json", "schema_version"]
# The store's schema version, written into every row. 2: a run id hashes the whole configuration and a task's
# sample stream is keyed on all of its drawn parameters. Rows without the column are version 1 (run ids and
# streams that left out fields and task parameters added after the first runs were published, at their
# defaults); they load as they are and the leaderboard never puts them in a table with rows of another version.
SCHEMA_VERSION = 2


class StoreError(RuntimeError):
    """A results folder that cannot be used; the message says why."""


def runs_dir(results: str | Path) -> Path:
    return Path(results) / "runs"


def run_path(results: str | Path, run_id: str) -> Path:
    return runs_dir(results) / f"{run_id}.parquet"


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """The one way this package writes a file: ``write(tmp)`` fills a temporary file beside ``path``,
    which then replaces ``path`` in one step; an interrupted write leaves the old file untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_parquet(frame: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_run(results: str | Path, run_id: str, rows: list[dict]) -> Path:
    """Write the rows of one finished run (replacing an earlier file of the same run)."""
    frame = pd.DataFrame(rows)
    frame["schema_version"] = SCHEMA_VERSION
    missing = [c for c in CONTRACT_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"rows lack contract columns: {', '.join(missing)}")
    ordered = CONTRACT_COLUMNS + [c for c in frame.columns if c not in CONTRACT_COLUMNS]
    path = run_path(results, run_id)
    atomic_write_parquet(frame[ordered], path)
    return path


def run_finished(results: str | Path, run_id: str) -> bool:
    return run_path(results, run_id).exists()


def with_schema_version(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``schema_version`` column an int, 1 where the rows were written without one."""
    versions = frame["schema_version"] if "schema_version" in frame.columns else pd.Series(1, index=frame.index)
    return frame.assign(schema_version=versions.fillna(1).astype("int64"))


def load_results(results: str | Path, *, strict: bool = False) -> pd.DataFrame:
    """All rows of the store. Unreadable files are skipped with a warning (or raise with ``strict``)."""
    folder = runs_dir(results)
    if not Path(results).exists():
        raise StoreError(f"results folder {results} does not exist")
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    frames = []
    for path in files:
        try:
            frames.append(with_schema_version(pd.read_parquet(path)))
        except Exception as error:  # a corrupt or truncated file must not hide the others
            if strict:
                raise StoreError(f"cannot read {path}: {error}") from error
            warnings.warn(f"skipping unreadable results file {path}: {error}", stacklevel=2)
    if not frames:
        return pd.DataFrame(columns=CONTRACT_COLUMNS + EXTRA_COLUMNS)
    return pd.concat(frames, ignore_index=True)
