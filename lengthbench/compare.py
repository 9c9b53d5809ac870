"""Our leaderboard beside the papers' published tables (``paper_tables.csv``, transcribed from the papers).

For every cell of a paper's table (task x mechanism x encoding), the comparison lists the leaderboard rows of ours
that stand for the same cell, at the paper's own columns: the paper's value, ours, and the difference in points.
A leaderboard row is the best of seeds of one protocol (``leaderboard.build_leaderboard``); a cell of ours may
have several, one per protocol or variant. They are ordered by how many of the paper's columns they scored, then
by their mean absolute difference from the paper over those columns (closest first).

Which rows stand for a paper's cell:

* the same task with its default task parameters (a named variant such as MQRAR's ``layout=inline`` is another
  task; a curriculum's earlier stages may have had any) at its default training length (64 for most, Local Count
  128, Max Retrieval 16), and an encoding of the same name (its parameters, e.g. RoPE's scaling, may differ: a variant);
* a mechanism of the same name, or one of its :data:`STAND_INS` (``sieve-window``, the window filter of Sieve
  Attention's Algorithm 1, stands in for Sieve), whose :data:`IDENTITY_PARAMS` agree with the paper's (entmax at
  alpha 4 is not entmax at 1.5;
  softmax at a fixed temperature is not softmax; ``scaled_heads=nope`` or ``s_init=1`` are ways to implement the
  same mechanism, and ASEntmax's gamma learned or fixed is its own choice: variants).

Verdicts, over the columns both have (a paper's column we did not score is left out): ``agrees`` where every
difference is within the tolerance (default 5 points: about 1.5 standard errors of a proportion near 50% on the
200 samples per length of our reduced protocols), ``above`` or ``below`` where every difference beyond it has
that sign, ``mixed`` where both signs occur; ``no common length`` where none is shared.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lengthbench.errors import UsageError
from lengthbench.leaderboard import METRIC_NAMES, _md_table, build_leaderboard
from lengthbench.store import SCHEMA_1_TASK_PARAMS
from lengthbench.tasks import as_multiplier, get_task, multiplier_label

PAPER_TABLES = Path(__file__).with_name("paper_tables.csv")
TOLERANCE = 5.0  # points
STAND_INS = {"sieve": ("sieve-window",)}  # Sieve's Algorithm 1 window
# parameters that make another mechanism (with each mechanism's default): entmax at alpha 4 is not entmax at 1.5,
# softmax at a fixed temperature theta (the sparse-attention paper's Max Retrieval, Table 5) is not softmax
IDENTITY_PARAMS = {"alpha": {"entmax": 1.5, "sparsemax": 2.0, "sieve": 1.5, "sentmax": 1.5, "asentmax": 1.5},
                   "theta": {}}
PAPER_COLUMNS = ["paper", "table", "task", "attn", "pe", "multiplier", "value"]
CELL_KEYS = ["paper", "table", "task", "attn", "pe"]  # a cell of a paper's table
# the columns of :func:`compare`'s long form, whether or not any row of ours stands for a paper cell
LONG_COLUMNS = [*CELL_KEYS, "our_attn", "our_pe", "preset", "protocol", "train_length", "metric", "seeds",
                "best_run_id", "verdict", "mean_abs_difference", "rank", "multiplier", "paper_value", "our_value",
                "difference", "our_lo", "our_hi"]
_LABEL = re.compile(r"^(?P<name>[^ (]+)(?: \((?P<params>.*)\))?$")


@dataclass(frozen=True)
class Label:
    """A leaderboard label such as ``entmax (alpha=4)`` split into its name and parameters (as text)."""

    name: str
    params: dict[str, str]

    @classmethod
    def parse(cls, text: str) -> Label:
        match = _LABEL.match(str(text).strip())
        if match is None:
            raise UsageError(f"cannot read the label {text!r} (expected 'name' or 'name (key=value, ...)')")
        params = {}
        for item in filter(None, (part.strip() for part in (match["params"] or "").split(","))):
            key, _, value = item.partition("=")
            params[key.strip()] = value.strip()
        return cls(match["name"], params)


def _same(a: str | float | None, b: str | float | None) -> bool:
    """Two parameter values, numbers compared as numbers ("4" and "4.0"), anything else as text."""
    try:
        return math.isclose(float(a), float(b))
    except (TypeError, ValueError):
        return a == b


def stands_for(ours: str, theirs: str) -> bool:
    """Whether our mechanism label ``ours`` stands for the paper's ``theirs`` (module docstring)."""
    mine, theirs = Label.parse(ours), Label.parse(theirs)
    if mine.name != theirs.name and mine.name not in STAND_INS.get(theirs.name, ()):
        return False
    for key, defaults in IDENTITY_PARAMS.items():
        value = theirs.params.get(key, defaults.get(theirs.name))
        # a stand-in without a default of its own takes the paper mechanism's (sieve-window's filter is Sieve's)
        mine_value = mine.params.get(key, defaults.get(mine.name, defaults.get(theirs.name)))
        if not (value is None and mine_value is None) and not _same(value, mine_value):
            return False
    return True


def load_paper_tables(path: str | Path = PAPER_TABLES) -> pd.DataFrame:
    """The papers' cells, one row per number: ``paper, table, task, attn, pe, multiplier, value`` (``paper``: its
    title)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"paper table file {path} does not exist")
    if not path.is_file():
        raise UsageError(f"paper table file {path} is not a file")
    try:
        frame = pd.read_csv(path, dtype={"paper": str, "table": str, "task": str, "attn": str, "pe": str})
    except (ValueError, UnicodeDecodeError) as error:  # pandas' parser errors are ValueErrors
        raise UsageError(f"paper table file {path} is not a readable CSV file: {str(error).splitlines()[0]}") from error
    missing = [column for column in PAPER_COLUMNS if column not in frame.columns]
    if missing:
        raise UsageError(f"{path} lacks the columns {', '.join(missing)}")
    for column in ("multiplier", "value"):
        numbers = pd.to_numeric(frame[column], errors="coerce")
        if numbers.isna().any():
            row = int(numbers.isna().to_numpy().argmax())
            raise UsageError(f"{path}: the {column} of row {row + 2} is not a number, got {frame[column].iloc[row]!r}")
    frame["multiplier"] = frame["multiplier"].map(lambda m: as_multiplier(float(m)))
    frame["value"] = frame["value"].astype(float)
    return frame[PAPER_COLUMNS]


def verdict(differences: list[float], tolerance: float = TOLERANCE, inside: list[bool] | None = None) -> str:
    """``agrees``, ``above``, ``below``, ``mixed`` or ``no common length`` (module docstring). ``inside`` (one a
    difference): whether the paper's value lies inside our 95% Wilson interval there; such a column agrees
    whatever its difference, as one within ``tolerance`` does."""
    if not differences:
        return "no common length"
    inside = inside or [False] * len(differences)
    beyond = [d for d, within in zip(differences, inside, strict=True) if abs(d) > tolerance and not within]
    above, below = any(d > 0 for d in beyond), any(d < 0 for d in beyond)
    return "mixed" if above and below else "above" if above else "below" if below else "agrees"


def inside_interval(row, multiplier, value: float) -> bool:
    """Whether ``value`` (%) lies inside a board row's 95% Wilson interval at ``multiplier``."""
    label = multiplier_label(multiplier)
    low, high = row.get(f"{label}x_lo", math.nan), row.get(f"{label}x_hi", math.nan)
    return not (pd.isna(low) or pd.isna(high)) and low - 1e-9 <= value <= high + 1e-9


def _default_task(config_json) -> bool:
    try:
        config = json.loads(config_json) if isinstance(config_json, str) else dict(config_json or {})
    except (TypeError, ValueError):
        return True
    # the task's earlier layout (schema-1 rows, e.g. MQMTAR's random spacing) stands for it, its parameters named in
    # the protocol column; another named variant (MQRAR's inline layout) does not
    earlier = SCHEMA_1_TASK_PARAMS.get(config.get("task"), {})
    return all(earlier.get(key, object()) == value for key, value in (config.get("task_params") or {}).items())


def _train_length(task: str) -> int:
    return get_task(task).default_train_length


def compare(frame: pd.DataFrame, papers: pd.DataFrame, *, tolerance: float = TOLERANCE) -> pd.DataFrame:
    """One row per (paper cell, leaderboard row of ours, paper column): the long form of the comparison.

    ``frame`` is a results store as :func:`lengthbench.leaderboard.load_store` returns it; ``papers`` the cells of
    :func:`load_paper_tables`. Columns: the paper cell's ``paper, table, task, attn, pe``; ours ``our_attn, our_pe,
    preset, protocol, train_length, metric, seeds, best_run_id``; ``multiplier, paper_value, our_value,
    difference`` (points; NaN where we did not score that length); per leaderboard row ``verdict``,
    ``mean_abs_difference`` and ``rank`` (0 = closest to the paper). A paper cell with no row of ours has one row
    per column with ``our_attn`` empty and verdict ``no run``.
    """
    board = build_leaderboard(frame)
    configs = frame.drop_duplicates("run_id").set_index("run_id")["config_json"]
    board = board[[_default_task(configs.get(run_id)) for run_id in board["best_run_id"]]]
    # the papers' training length (the task's default: 64, Local Count 128, Max Retrieval 16); a curriculum's stage
    # at another (MQRAR's at n 16) is not the papers' task
    board = board[board["train_length"] == board["task"].map(_train_length)]
    rows = []
    for (paper, table, task, attn, pe), cell in papers.groupby(CELL_KEYS, sort=False):
        cell = cell.sort_values("multiplier")
        base = dict(paper=paper, table=table, task=task, attn=attn, pe=pe)
        candidates = board[(board["task"] == task)
                           & board["pe"].map(lambda label, pe=pe: Label.parse(label).name == pe)
                           & board["attn"].map(lambda label, attn=attn: stands_for(label, attn))]
        if candidates.empty:
            rows += [dict(base, our_attn="", verdict="no run", multiplier=m, paper_value=v, rank=0)
                     for m, v in zip(cell["multiplier"], cell["value"], strict=True)]
            continue
        compared = []
        for _, ours in candidates.iterrows():
            values = [ours.get(f"{multiplier_label(m)}x", math.nan) for m in cell["multiplier"]]
            differences = [v - s for v, s in zip(values, cell["value"], strict=True) if not pd.isna(v)]
            inside = [inside_interval(ours, m, s) for v, m, s in zip(values, cell["multiplier"], cell["value"],
                                                                        strict=True) if not pd.isna(v)]
            closeness = sum(abs(d) for d in differences) / len(differences) if differences else math.inf
            compared.append((len(values) - len(differences), closeness, ours, values, (differences, inside)))
        # rows that scored more of the paper's columns first, then the closest
        compared.sort(key=lambda item: (item[0], item[1], item[2]["protocol"] or "", item[2]["attn"], item[2]["pe"]))
        for rank, (_, closeness, ours, values, (differences, inside)) in enumerate(compared):
            shared = dict(base, our_attn=ours["attn"], our_pe=ours["pe"], preset=ours["preset"],
                          protocol=ours["protocol"], train_length=int(ours["train_length"]),
                          metric=ours["metric"], seeds=int(ours["seeds"]), best_run_id=ours["best_run_id"],
                          verdict=verdict(differences, tolerance, inside), mean_abs_difference=closeness, rank=rank)
            for m, paper_value, our_value in zip(cell["multiplier"], cell["value"], values, strict=True):
                label = multiplier_label(m)
                rows.append(dict(shared, multiplier=m, paper_value=paper_value, our_value=our_value,
                                 difference=our_value - paper_value, our_lo=ours.get(f"{label}x_lo", math.nan),
                                 our_hi=ours.get(f"{label}x_hi", math.nan)))
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def _value(value) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.1f}"


def _signed(value) -> str:
    return "" if value is None or pd.isna(value) else f" ({value:+.1f})"


def _interval(low, high) -> str:
    """Our 95% Wilson interval, in whole points."""
    return "" if low is None or high is None or pd.isna(low) or pd.isna(high) else f" [{low:.0f}–{high:.0f}]"


def summary(long: pd.DataFrame) -> pd.DataFrame:
    """Per paper table and task: its cells, and how many of them the closest row of ours agrees with, is
    above, below or mixed against, or has no run for."""
    closest = long[long["rank"] == 0].drop_duplicates(CELL_KEYS)
    counts = closest.groupby(["paper", "table", "task"], sort=True)["verdict"].value_counts().unstack(fill_value=0)
    columns = ["agrees", "above", "below", "mixed", "no common length", "no run"]
    counts = counts.reindex(columns=columns, fill_value=0)
    counts.insert(0, "cells", counts.sum(axis=1))
    return counts.reset_index()


# where a table cell has no room for the whole title
SHORT_TITLES = {"Long-Context Generalization with Sparse Attention": "Sparse Attention"}


def short_title(paper: str) -> str:
    """A paper's title as a table cell shows it."""
    return SHORT_TITLES.get(paper, paper)


def to_markdown(long: pd.DataFrame, *, rows_per_cell: int = 3, tolerance: float = TOLERANCE,
                source: str | None = None) -> str:
    """The comparison as Markdown: a summary, then per paper table and task the paper's row and ours under it."""
    parts = ["# Our leaderboard beside the papers' tables", ""]
    if source:
        parts += [source, ""]
    parts += [
        "The papers' numbers: `lengthbench/paper_tables.csv`, transcribed from the tables each section names. "
        "Ours: the leaderboard's best of seeds, one row per protocol or variant of the cell, closest to the "
        f"paper first (mean absolute difference over the paper's columns we scored); at most {rows_per_cell} a "
        "cell (`--rows 0` lists all). In round brackets: ours minus the paper's, in points; in square brackets: our "
        "95% Wilson interval over the samples scored. Verdict over the columns both have: **agrees** where at "
        f"every one the difference is within {tolerance:g} points or the paper's value lies inside our interval, "
        "**above** / **below** where every other difference has that sign, **mixed** where both do. – : a length "
        "we did not score.",
        "",
        "## Summary: the closest row of ours per paper cell", "",
    ]
    table = summary(long)
    rows = [[short_title(row[c]) if c == "paper" else str(row[c]) for c in table.columns]
            for _, row in table.iterrows()]
    parts += [_md_table(list(table.columns), rows, ["l"] * 3 + ["r"] * (len(table.columns) - 3)), ""]
    for (paper, table_name, task), group in long.groupby(["paper", "table", "task"], sort=True):
        multipliers = sorted(group["multiplier"].unique())
        metric = group["metric"].dropna()
        metric_text = METRIC_NAMES.get(metric.iloc[0], metric.iloc[0]) if len(metric) else "the task's metric"
        parts += [f"## {paper}, {table_name}: {task}", "",
                  f"Ours in {metric_text} (%); the paper's as printed.", ""]
        header = ["cell", "row"] + [f"{multiplier_label(m)}×" for m in multipliers] + ["verdict", "ours: protocol"]
        rows = []
        for (attn, pe), cell in group.groupby(["attn", "pe"], sort=False):
            paper_values = cell.drop_duplicates("multiplier").set_index("multiplier")["paper_value"]
            rows.append([f"{attn} + {pe}", short_title(paper)] + [_value(paper_values.get(m)) for m in multipliers]
                        + ["", ""])
            ranks = sorted(cell["rank"].unique())
            shown = ranks if rows_per_cell <= 0 else ranks[:rows_per_cell]
            for rank in shown:
                ours = cell[cell["rank"] == rank].set_index("multiplier")
                first = ours.iloc[0]
                if first["verdict"] == "no run":
                    rows.append(["", "ours"] + ["–"] * len(multipliers) + ["no run", ""])
                    continue
                values = [_value(ours["our_value"].get(m)) + _signed(ours["difference"].get(m))
                          + _interval(ours["our_lo"].get(m), ours["our_hi"].get(m))
                          if m in ours.index else "" for m in multipliers]
                protocol = f"`{first['preset']}`" + (f", {first['protocol']}" if first["protocol"] else "")
                seeds = int(first["seeds"])
                protocol += f"; {seeds} seed{'s' if seeds != 1 else ''}"
                rows.append(["", f"ours: {first['our_attn']} + {first['our_pe']}"] + values
                            + [first["verdict"], protocol])
            if len(shown) < len(ranks):
                rows.append(["", f"({len(ranks) - len(shown)} more rows of ours)"] + [""] * (len(multipliers) + 2))
        parts += [_md_table(header, rows, ["l", "l"] + ["r"] * len(multipliers) + ["l", "l"]), ""]
    return "\n".join(parts).rstrip() + "\n"


def paper_table_problems(papers: pd.DataFrame, *, tasks, attns, pes) -> list[str]:
    """What in the paper tables names no task, mechanism or encoding of ours, or repeats a cell."""
    problems = []
    for column, known in (("task", set(tasks)), ("pe", set(pes))):
        problems += [f"unknown {column} {value!r}" for value in sorted(set(papers[column]) - known)]
    names = {Label.parse(label).name for label in papers["attn"]}
    problems += [f"unknown attn {name!r}" for name in sorted(names - set(attns))]
    repeated = papers.duplicated([*CELL_KEYS, "multiplier"], keep=False)
    problems += [f"repeated cell {tuple(row)}" for row in
                 papers.loc[repeated, [*CELL_KEYS, "multiplier"]].itertuples(index=False)]
    return problems


def write_comparison(long: pd.DataFrame, markdown: str, out_dir: Path) -> tuple[Path, Path]:
    """``out_dir/paper_comparison.md`` and ``.parquet``, each written atomically."""
    from lengthbench.store import atomic_write_parquet, atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, parquet_path = out_dir / "paper_comparison.md", out_dir / "paper_comparison.parquet"
    atomic_write_text(md_path, markdown)
    frame = long.copy()
    frame["multiplier"] = frame["multiplier"].astype(float)
    atomic_write_parquet(frame, parquet_path)
    return md_path, parquet_path
