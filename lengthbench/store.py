"""The results store: one Parquet file per finished run under ``<results>/runs/``.

One file per run makes every write atomic (write a temporary file, then ``os.replace``) and keeps the
store readable while other runs append; a run killed at any moment leaves at most its own rows
unwritten. ``load_results`` concatenates the files and reports (not raises on) unreadable ones and
ones without the contract's columns (:data:`REQUIRED_COLUMNS`), naming each.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from lengthbench.errors import UsageError

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
# 3: Sieve's names: ``sieve`` is Sieve Attention's Section 3 (the entmax filter, ``sieve-entmax`` in version 2)
# and Algorithm 1's window filter is ``sieve-window`` (``sieve`` at eps 8 and ``sieve-alg1`` at eps 2 in version 2).
# Rows of versions 1 and 2 read under today's names (:data:`RENAMED`); version 2's share tables with version 3's
# (the same runs and streams under other names).
# 4: Sieve's remainder: ``sieve`` leaves what is left of the stick nowhere by default (Eq. 7 as printed,
# ``remainder="drop"``), where up to version 3 it put it on the query's own value; rows of versions 1-3 read with
# ``remainder="diagonal"`` written into their ``sieve``'s configuration (:data:`SCHEMA_3_ATTN_PARAMS`), so that their
# leaderboard row is ``sieve (remainder=diagonal)``, never today's ``sieve``. Version 3's rows share tables with
# version 4's (the same runs and streams).
SCHEMA_VERSION = 4
# The versions whose rows share a leaderboard table: from 2 on (see SCHEMA_VERSION).
SHARED_FROM = 2
# The column of a loaded frame that names the version in whose terms its rows read (``with_schema_version``).
READ_AS = "read_as_version"


# What a run file must hold to be read: the contract's columns (the attention diagnostics only where measured),
# and numbers where numbers are expected.
DIAGNOSTIC_COLUMNS = ["sparsity", "sink_rate", "entropy"]
REQUIRED_COLUMNS = [c for c in CONTRACT_COLUMNS if c not in DIAGNOSTIC_COLUMNS]
NUMERIC_COLUMNS = ["seed", "train_length", "eval_length", "multiplier", "exact_match", "token_accuracy",
                   "n_samples", "realised_tokens", "train_steps", "train_seconds", "eval_seconds",
                   *DIAGNOSTIC_COLUMNS, "score"]
NAME_COLUMNS = ["run_id", "task", "attn", "pe"]  # what names a row's run and cell: text in every row


class StoreError(RuntimeError):
    """A results folder that cannot be used; the message says why."""


class RunFileError(StoreError):
    """One run file that cannot be used, or some of its rows (``part``: what leaving it out leaves out)."""

    def __init__(self, message: str, part: str = "it"):
        super().__init__(message)
        self.part = part


# The ranges of a stored row's numbers, per column: (low, high, low_open, nan_allowed, whole). None: unbounded on
# that side, but finite. A row outside them is not read as data (``load_results``).
ROW_RANGES: dict[str, tuple[float | None, float | None, bool, bool, bool]] = {
    "seed": (0, 2**63 - 1, False, False, True),
    "train_length": (1, None, False, False, True),
    "eval_length": (1, None, False, False, True),
    "multiplier": (0, None, True, False, False),
    "exact_match": (0, 1, False, True, False),  # NaN: where it is not the row's metric (see rows_out_of_range)
    "token_accuracy": (0, 1, False, True, False),
    "n_samples": (1, None, False, True, True),  # NaN: not recorded
    "realised_tokens": (0, None, False, True, False),
    "train_steps": (0, None, False, True, True),
    "train_seconds": (0, None, False, True, False),
    "eval_seconds": (0, None, False, True, False),
    "sparsity": (0, 1, False, True, False),  # NaN: not measured
    "sink_rate": (0, 1, False, True, False),
    "entropy": (0, None, False, True, False),
    "score": (0, 1, False, True, False),  # NaN: read from the metric's column
}


def runs_dir(results: str | Path) -> Path:
    return Path(results) / "runs"


def run_path(results: str | Path, run_id: str) -> Path:
    return runs_dir(results) / f"{run_id}.parquet"


def special_file_kind(path: str | Path) -> str | None:
    """What ``path`` is (through its symlinks) where it exists as something other than a regular file or a
    folder: "character device" (``/dev/null``), "block device", "FIFO" or "socket"; None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, a dangling link, a name the file system refuses
        return None
    for test, kind in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return None


def refuse_special_file(path: str | Path, option: str = "") -> None:
    """A :class:`UsageError` where ``path`` is a device, FIFO or socket: writing renames a new file over its
    target, which would replace ``/dev/null`` itself with a plain file."""
    kind = special_file_kind(path)
    if kind is not None:
        where = f"{option} {path}" if option else str(path)
        raise UsageError(f"{where} is a {kind}, not a regular file: give the name of a file to write")


def _umask() -> int:
    """The process's file-creation mask (read without changing it where Linux says it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """The one way this package writes a file: ``write(tmp)`` fills a temporary file beside ``path``,
    which then replaces ``path`` in one step; an interrupted write leaves the old file untouched. A symlink is
    written through (its target is replaced, the link stays); a device, FIFO or socket is refused
    (:func:`refuse_special_file`). The file keeps the permissions of the one it replaces, and a new one gets
    those the umask gives (a bare temporary file is readable by its owner only: a shared store, a published
    page would be unreadable to the others)."""
    path = Path(path)
    refuse_special_file(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # a new file
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_json_file(path: Path, remedy: str, check: Callable[[object], bool] = lambda data: True):
    """The JSON a run left in its checkpoint folder (its scored lengths, a length's tallies); a file that is not
    JSON, or whose content ``check`` refuses, is a one-line :class:`UsageError` naming it and ``remedy``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:  # (json's errors are ValueErrors)
        raise UsageError(f"{path} is unreadable ({str(error).splitlines()[0]}): {remedy}") from error
    if not check(data):
        raise UsageError(f"{path} does not hold what lengthbench wrote there: {remedy}")
    return data


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


# The mechanisms that an earlier schema version named otherwise: version -> its name -> (today's name, the parameters
# that name defaulted to, written into the row's configuration where it left them unset). Version 1's ``sieve`` was
# the entmax-support form, today's ``sieve``; its ``sieve-alg1`` the window filter at eps 2.
RENAMED = {
    1: {"sieve-alg1": ("sieve-window", {"eps": 2.0})},
    2: {"sieve": ("sieve-window", {"eps": 8.0}), "sieve-alg1": ("sieve-window", {"eps": 2.0}),
        "sieve-entmax": ("sieve", {})},
}
# What a configuration of schema version 1 left to defaults that version 2 changed (the defaults of the papers'
# public code, docs/conventions.md): read into its rows, so that they say what they ran.
SCHEMA_1_ATTN_PARAMS = {
    "ssmax": {"s_init": 0.43, "log_offset": 0, "scaled_heads": "all"},
    "assmax": {"gamma_scale": 1.0, "scaled_heads": "all"},
    "asentmax": {"gamma_scale": 1.0, "scaled_heads": "all"},
    "tra": {"tau_index": "eq1"},
    "tda": {"tau_index": "eq1"},
}
# What a configuration of schema versions 1 to 3 left to defaults that version 4 changed (Sieve's remainder), by
# today's name of its mechanism: read into its rows and saved models, so that they say and build what they ran.
SCHEMA_3_ATTN_PARAMS = {"sieve": {"remainder": "diagonal"}}
SCHEMA_1_TASK_PARAMS = {
    "mqmtar": {"spacing": "random", "values": "uniform"},
    "localcount": {"runs": "cut"},
    "flipflop-sparse": {"sep": True},
    "flipflop-dense": {"sep": True},
}


def _old_config(config_json: str, version: int) -> str:
    """An earlier version's ``config_json`` under today's names (:data:`RENAMED`), with the defaults of that version
    that a later one changed written out (version 1's: :data:`SCHEMA_1_ATTN_PARAMS`, :data:`SCHEMA_1_TASK_PARAMS`;
    versions 1-3's: :data:`SCHEMA_3_ATTN_PARAMS`)."""
    try:
        config = json.loads(config_json)
    except (TypeError, ValueError):
        return config_json
    if not isinstance(config, dict):
        return config_json
    attn, params = RENAMED.get(version, {}).get(config.get("attn"), (config.get("attn"), {}))
    config["attn"] = attn
    config["attn_params"] = {**params, **(config.get("attn_params") or {})}
    if version == 1:
        config["attn_params"] = {**SCHEMA_1_ATTN_PARAMS.get(attn, {}), **config["attn_params"]}
        config["task_params"] = {**SCHEMA_1_TASK_PARAMS.get(config.get("task"), {}),
                                 **(config.get("task_params") or {})}
    if version <= 3:
        config["attn_params"] = {**SCHEMA_3_ATTN_PARAMS.get(attn, {}), **config["attn_params"]}
    return json.dumps(config, sort_keys=True)


def with_schema_version(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``schema_version`` column an int, 1 where the rows were written without one; rows of an
    earlier version read in today's terms (:func:`_old_config`: today's names, the earlier defaults written out)."""
    versions = frame["schema_version"] if "schema_version" in frame.columns else pd.Series(1, index=frame.index)
    frame = frame.assign(schema_version=versions.fillna(1).astype("int64"))
    # (read once: a frame read so already carries READ_AS at today's version)
    read = frame[READ_AS] == SCHEMA_VERSION if READ_AS in frame.columns else False
    old = (frame["schema_version"] < SCHEMA_VERSION) & ~read
    frame = frame.assign(**{READ_AS: SCHEMA_VERSION})
    if old.any():
        frame = frame.copy()
        for version in sorted(frame.loc[old, "schema_version"].unique()):
            rows = old & (frame["schema_version"] == version)
            renamed = {name: new for name, (new, _) in RENAMED.get(int(version), {}).items()}
            if "attn" in frame.columns and renamed:
                frame.loc[rows, "attn"] = frame.loc[rows, "attn"].replace(renamed)
            if "config_json" in frame.columns:
                frame.loc[rows, "config_json"] = frame.loc[rows, "config_json"].map(
                    lambda text, version=int(version): _old_config(text, version))
    return frame


def saved_config(config: dict) -> dict:
    """A run's configuration as its trained model (``model.pt``) keeps it, the identity its run id hashed, in today's
    names (:data:`RENAMED`), with the defaults its version ran that version 4 changed written out
    (:data:`SCHEMA_3_ATTN_PARAMS`). Since version 3 the identity of a mechanism under a renamed name holds the
    ``schema_version`` (``RunConfig.identity``); one saved before names it without: version 1's identity left
    ``rescored_from`` out at its default, version 2's holds every field."""
    attn = config.get("attn")
    if "schema_version" in config:
        version, name, params = int(config["schema_version"]), attn, {}
    elif any(attn in names for names in RENAMED.values()):
        version = 2 if "rescored_from" in config else 1
        name, params = RENAMED[version].get(attn, (attn, {}))
    else:
        return config
    if version <= 3:
        params = {**SCHEMA_3_ATTN_PARAMS.get(name, {}), **params}
    if name == attn and not params:
        return config
    return {**config, "attn": name, "attn_params": {**params, **(config.get("attn_params") or {})}}


def table_version(version: int) -> int:
    """The schema version whose tables a row of ``version`` shares (:data:`SHARED_FROM`)."""
    return SCHEMA_VERSION if int(version) >= SHARED_FROM else int(version)


def schema_problem(frame: pd.DataFrame) -> str | None:
    """What makes ``frame`` (one run file) unusable as store rows, in a few words; None if nothing does."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        return f"lacks the column{'s' if len(missing) > 1 else ''} {shown}"
    if frame.empty:
        return "holds no rows"
    for column in NUMERIC_COLUMNS:
        if column in frame.columns and not pd.api.types.is_numeric_dtype(frame[column]) \
                and not frame[column].isna().all():
            return f"column {column} holds {frame[column].dtype} values, not numbers"
    for column in NAME_COLUMNS:
        others = [value for value in frame[column].dropna() if not isinstance(value, str)]
        if others:
            return f"column {column} holds {others[0]}, which is not a name"
    return None


def rows_out_of_range(frame: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Which rows of ``frame`` hold a number outside :data:`ROW_RANGES` (NaN, an infinity, a score above 1, a
    multiplier of 0...), and a few words on each column that does: ``"score 1.5 (must be in [0, 1])"``."""
    bad = pd.Series(False, index=frame.index)
    words = []
    for column, (low, high, low_open, nan_allowed, whole) in ROW_RANGES.items():
        if column not in frame.columns:
            continue
        values = pd.to_numeric(frame[column], errors="coerce").astype(float)
        finite = np.isfinite(values)
        wrong = ~finite & ~(values.isna() & nan_allowed)
        inside = finite & (values > low if low_open else values >= low) if low is not None else finite
        if high is not None:
            inside &= values <= high
        if whole:
            inside &= values.where(finite, 0.5) % 1 == 0
        wrong |= finite & ~inside
        if wrong.any():
            bounds = (f"{'(' if low_open else '['}{low:,}, {high:,}]" if high is not None else
                      f"{'>' if low_open else '>='} {low:,}")
            kind = "a whole number " if whole else ""
            words.append(f"{column} {values[wrong].iloc[0]:g} (must be {kind}{'in ' if high is not None else ''}"
                         f"{bounds})")
            bad |= wrong
    # the row's value must be there: its score, else the column of its metric (the other accuracy may be missing)
    value = pd.to_numeric(frame["score"], errors="coerce") if "score" in frame.columns else \
        pd.Series(np.nan, index=frame.index)
    metrics = frame["metric"] if "metric" in frame.columns else pd.Series("exact_match", index=frame.index)
    for metric in ("exact_match", "token_accuracy"):
        if metric in frame.columns:
            value = value.fillna(pd.to_numeric(frame[metric], errors="coerce").where(metrics == metric))
    if value.isna().any():
        words.append(f"score nan and {metrics[value.isna()].iloc[0]} nan (the row has no value)")
        bad |= value.isna()
    for column in NAME_COLUMNS:
        if column in frame.columns:
            unnamed = frame[column].isna() | (frame[column].astype(str).str.strip() == "")
            if unnamed.any():
                words.append(f"{column} missing (the row names no {column.replace('_', ' ')})")
                bad |= unnamed
    return bad, words


def read_once(path: str | Path, read: Callable[[str], pd.DataFrame] = pd.read_parquet) -> pd.DataFrame:
    """``read(path)``, done once per version of the file in this process (its inode, size, modification and change
    times: a file written, replaced or made unreadable since is read again); a command that reads a store twice (a
    sweep's plan and its progress) reads each file once. An error is raised each time, never kept. Callers filter
    the frame, never change it."""
    status = Path(path).stat()
    return _read_version(read, str(path), status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


@functools.lru_cache(maxsize=4096)
def _read_version(read: Callable[[str], pd.DataFrame], path: str, *version: int) -> pd.DataFrame:
    return read(path)


def read_run_file(path: Path) -> pd.DataFrame:
    """The rows of one run file, its schema checked (once per version of the file: :func:`read_once`); a
    :class:`RunFileError` says what is wrong with it."""
    try:
        return read_once(path, _read_checked)
    except RunFileError:
        raise
    except Exception as error:  # a corrupt or truncated file, or no permission to read it
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunFileError(f"cannot read {path}: {reason}") from error


def _read_checked(path: str) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    problem = schema_problem(frame)
    if problem:
        raise RunFileError(f"results file {path} {problem}; it is not a lengthbench run file")
    return frame


def load_results(results: str | Path, *, strict: bool = False) -> pd.DataFrame:
    """All rows of the store. A file that cannot be read or lacks the contract's columns, and a row with a number
    outside :data:`ROW_RANGES`, is skipped with a warning naming the file and why (or raises :class:`RunFileError`
    with ``strict``). A ``runs/`` folder that cannot be listed is a :class:`StoreError`, never an empty store."""
    folder = runs_dir(results)
    if str(results).strip() == "":
        raise StoreError("the results folder name is empty")
    if not Path(results).exists():
        raise StoreError(f"results folder {results} does not exist")
    if not Path(results).is_dir():
        raise StoreError(f"results path {results} is not a folder")
    if folder.exists() and not folder.is_dir():
        raise StoreError(f"{folder} is a file, not the folder of run files")
    if folder.exists() and not os.access(folder, os.R_OK | os.X_OK):  # (a glob would read it as empty)
        raise StoreError(f"no permission to read {folder}: its runs cannot be listed")
    try:
        files = sorted(Path(entry.path) for entry in os.scandir(folder) if entry.name.endswith(".parquet")) \
            if folder.exists() else []
    except OSError as error:
        raise StoreError(f"cannot list {folder}: {error.strerror or error}") from error
    read: list[pd.DataFrame | RunFileError] = []
    for path in files:
        try:
            read.append(read_run_file(path))
        except RunFileError as error:  # said in the order of the files, below
            read.append(error)
    bad_rows = _rows_out_of_range_by_file(read)
    frames = []
    for path, frame, bad in zip(files, read, bad_rows, strict=True):
        try:
            if isinstance(frame, RunFileError):
                raise frame
            if bad.any():
                words = rows_out_of_range(frame)[1]
                rows, ranges = f"{int(bad.sum())} of {len(frame)} rows", "; ".join(words)
                if strict or bad.all():
                    raise RunFileError(f"results file {path}: {rows} outside the store's ranges: {ranges}",
                                       "those rows" if not bad.all() else "it")
                warnings.warn(f"skipping {rows} of {path}, outside the store's ranges: {ranges}", stacklevel=2)
                frame = frame[~bad]
            frames.append(frame)
        except RunFileError as error:  # a corrupt or foreign file must not hide the others
            if strict:
                raise
            warnings.warn(f"skipping {str(error).replace('cannot read ', 'unreadable results file ', 1)}",
                          stacklevel=2)
    if not frames:
        return pd.DataFrame(columns=CONTRACT_COLUMNS + EXTRA_COLUMNS)
    columns = list(dict.fromkeys(c for frame in frames for c in (*frame.columns, "schema_version", READ_AS)))
    return with_schema_version(pd.concat(frames, ignore_index=True))[columns]


def _rows_out_of_range_by_file(read: list) -> list[np.ndarray]:
    """:func:`rows_out_of_range`'s rows for each frame of ``read`` (none for an error in its place), checked once
    per set of columns: a store's files share a few, and the check costs the same for one row as for thousands."""
    bad = [np.zeros(0, dtype=bool)] * len(read)
    groups: dict[tuple, list[int]] = {}
    for index, frame in enumerate(read):
        if isinstance(frame, pd.DataFrame):
            groups.setdefault(tuple(frame.columns), []).append(index)
    for members in groups.values():
        together = pd.concat([read[index] for index in members], ignore_index=True)
        rows = rows_out_of_range(together)[0].to_numpy()
        for index, part in zip(members, np.split(rows, np.cumsum([len(read[i]) for i in members])[:-1]), strict=True):
            bad[index] = part
    return bad
