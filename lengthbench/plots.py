"""Figures from the leaderboard: extrapolation curves per task and a heat map of reach.

``plot_curves`` draws, per task, the score against length on a log2 axis labelled by multiplier and token
count, a line per mechanism x encoding: its best row over the task's protocols (``best_rows``: furthest reach,
then largest AUC; the leaderboard keeps each protocol's own table), the best-of-seeds run as the line and the
mean +- std over seeds as a faint band where there are several seeds. Colour encodes the mechanism and marker +
line style the encoding, so a line can be read without the legend's colours alone. ``plot_reach`` draws reach
(the largest multiplier scoring at least 90%) over tasks x (mechanism, encoding) from the same rows. Both write
PNG and SVG; matplotlib runs headless (Agg).

``prune_stale`` keeps the folder in step with the board: it removes the figures an earlier ``plot_all`` wrote
there (listed in ``MANIFEST``) that this one did not, e.g. ``curves_<task>.*`` of a task no longer in the store.
Files it did not write are never touched.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402

from lengthbench.leaderboard import METRIC_NAMES, REACH_THRESHOLD, TABLE_KEYS, board_multipliers  # noqa: E402
from lengthbench.tasks import get_task, multiplier_label  # noqa: E402

TITLE_WIDTH = 100  # characters a line of a curve plot's title

FORMATS = ("png", "svg")
MANIFEST = ".lengthbench-plots.json"  # the figures the last plot_all wrote in a folder
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]
LINESTYLES = ["-", "--", ":", "-."]


def _style_maps(board: pd.DataFrame) -> tuple[dict[str, object], dict[str, tuple[str, str]]]:
    """Stable styles across figures: a colour per mechanism, a (marker, line style) per encoding."""
    attns = sorted(board["attn"].unique())
    pes = sorted(board["pe"].unique())
    palette = plt.get_cmap("tab10" if len(attns) <= 10 else "tab20")
    colours = {a: palette(i % palette.N) for i, a in enumerate(attns)}
    styles = {p: (MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)]) for i, p in enumerate(pes)}
    return colours, styles


def _base(name: str) -> str:
    """``"ssmax (scaled_heads=nope)"`` -> ``"ssmax"``: a mechanism or encoding without its parameters."""
    return str(name).split(" (")[0]


def _task_variant(protocol: str) -> bool:
    """Whether a table's runs set task parameters of their own (a named variant such as MQRAR's ``layout=inline``,
    another task): the leaderboard writes them as ``key=value`` items in the protocol, before any ``", after "``
    that names a curriculum's earlier stages."""
    return any("=" in item for item in str(protocol).split(", after ")[0].split(", "))


def _main_rows(table: pd.DataFrame) -> pd.DataFrame:
    """One task's rows at its default training length (else its longest: a curriculum's stages are shorter) and
    with its default parameters, where it has such rows (a named variant is another task, as for ``compare``)."""
    lengths = set(table["train_length"])
    default = get_task(table["task"].iloc[0]).default_train_length
    table = table[table["train_length"] == (default if default in lengths else max(lengths))]
    own = table[~table["protocol"].map(_task_variant)]
    return own if len(own) else table


def best_rows(board: pd.DataFrame) -> pd.DataFrame:
    """Per task (``_main_rows``), the row of each mechanism x encoding (parameters aside) that reaches furthest,
    then has the largest AUC, over all the task's protocols and variants of the mechanism; ``table_max`` is the
    largest multiplier that row's table evaluated."""
    tables = [_main_rows(table) for _, table in board.groupby("task", sort=True)]
    rows = pd.concat(tables) if tables else board.copy()
    rows["table_max"] = 0.0
    for _, table in rows.groupby(TABLE_KEYS):
        rows.loc[table.index, "table_max"] = float(max(board_multipliers(table)))
    rows["attn_base"], rows["pe_base"] = rows["attn"].map(_base), rows["pe"].map(_base)
    rows = rows.sort_values(["reach", "auc", "attn", "pe", "protocol"], ascending=[False, False, True, True, True])
    return rows.drop_duplicates(["task", "attn_base", "pe_base"]).sort_values(["task", "pe_base", "attn_base"])


def _save(fig, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = out / f"{stem}.{fmt}"
        # A fixed salt for the SVG element ids (random otherwise): the same board gives the same bytes.
        with plt.rc_context({"svg.hashsalt": "lengthbench"}):
            fig.savefig(path, dpi=150, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def plot_curves(board: pd.DataFrame, out: str | Path) -> list[Path]:
    """One figure per task, ``curves_<task>.{png,svg}``: a line per mechanism x encoding, its best row over the
    task's protocols (``best_rows``; the leaderboard has every protocol's own table)."""
    out = Path(out)
    colours, styles = _style_maps(board.assign(attn=board["attn"].map(_base), pe=board["pe"].map(_base)))
    paths: list[Path] = []
    for task, rows in best_rows(board).groupby("task", sort=True):
        train_length = int(rows["train_length"].iloc[0])
        multipliers = sorted({m for _, row in rows.iterrows() for m in board_multipliers(row.to_frame().T)})
        fig, ax = plt.subplots(figsize=(8.5, 4.8))
        for _, row in rows.iterrows():
            marker, linestyle = styles[row["pe_base"]]
            own = board_multipliers(row.to_frame().T)
            x = np.log2(own)
            best = np.array([row[f"{m}x"] for m in own], dtype=float)
            label = f"{row['attn']} + {row['pe']}"
            if row["seeds"] > 1:
                label += f" (best of {row['seeds']})"
                mean = np.array([row[f"{m}x_mean"] for m in own], dtype=float)
                std = np.nan_to_num(np.array([row[f"{m}x_std"] for m in own], dtype=float))
                ax.fill_between(x, np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100),
                                color=colours[row["attn_base"]], alpha=0.12, linewidth=0)
            ax.plot(x, best, color=colours[row["attn_base"]], marker=marker, linestyle=linestyle, linewidth=1.8,
                    markersize=6, label=label, clip_on=False, zorder=3)
        x = np.log2(multipliers)
        ax.axhline(100 * REACH_THRESHOLD, color="0.6", linewidth=0.8, linestyle=(0, (2, 2)), zorder=1)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{multiplier_label(m)}×\n{round(m * train_length)}" for m in multipliers], fontsize=8)
        ax.set_xlim(x[0] - 0.2, x[-1] + 0.2)
        ax.set_ylim(-2, 102)
        ax.set_yticks([0, 20, 40, 60, 80, 100 * REACH_THRESHOLD, 100])
        ax.set_yticklabels(["0", "20", "40", "60", "80", f"{100 * REACH_THRESHOLD:.0f} (reach)", "100"])
        ax.set_xlabel(f"evaluation length: multiplier of n={train_length} (top), nominal length n (bottom), log2 scale")
        metric = METRIC_NAMES.get(rows["metric"].iloc[0], str(rows["metric"].iloc[0]))
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(wrap_title(f"{task}: {metric} against length, the best row of each mechanism + encoding over "
                                "the leaderboard's protocols (lines: best seed; bands: mean ± std)"), fontsize=10)
        ax.grid(True, which="major", color="0.9", linewidth=0.8)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8,
                  title="attention + encoding", title_fontsize=8)
        paths += _save(fig, out, _safe(f"curves_{task}"))
    return paths


def wrap_title(text: str, width: int = TITLE_WIDTH) -> str:
    """A figure title in lines of at most `width` characters (a curriculum's label runs to several hundred, and one
    line that long squeezes the axes to a sliver of the saved figure)."""
    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)) or text


def plot_reach(board: pd.DataFrame, out: str | Path) -> list[Path]:
    """A heat map of reach, tasks x (mechanism, encoding), each cell the best row over the task's protocols
    (``best_rows``): ``reach_heatmap.{png,svg}``."""
    out = Path(out)
    rows = best_rows(board)
    tasks = sorted(rows["task"].unique())
    columns = sorted(set(zip(rows["pe_base"], rows["attn_base"], strict=True)))  # (pe, attn)
    grid = np.full((len(tasks), len(columns)), np.nan)
    whole_range = np.zeros_like(grid, dtype=bool)
    for _, row in rows.iterrows():
        i, j = tasks.index(row["task"]), columns.index((row["pe_base"], row["attn_base"]))
        grid[i, j] = row["reach"]
        whole_range[i, j] = row["reach"] >= row["table_max"]
    top = int(max(1, np.nanmax(grid) if np.isfinite(grid).any() else 1))
    levels = int(math.log2(top)) + 2  # "none" plus 1x .. top
    # Colour index: 0 = no multiplier reaches 90%, k = reach 2^(k-1).
    index = np.where(np.isnan(grid), np.nan, np.where(grid > 0, np.log2(np.maximum(grid, 1)) + 1, 0))
    colours = ["#d9d9d9"] + [plt.get_cmap("viridis")(v) for v in np.linspace(0.15, 0.95, levels - 1)]
    cmap = ListedColormap(colours).with_extremes(bad="white")
    norm = BoundaryNorm(np.arange(-0.5, levels + 0.5), cmap.N)
    width = min(16.0, max(5.0, 2.0 + 0.5 * len(columns)))
    height = min(9.0, max(2.5, 1.6 + 0.4 * len(tasks)))
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(np.ma.masked_invalid(index), cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(tasks)):
        for j in range(len(columns)):
            if np.isnan(grid[i, j]):
                continue  # not run: the cell stays white
            value = grid[i, j]
            text = (f"{multiplier_label(value)}" + ("+" if whole_range[i, j] else "")) if value else "–"
            shade = cmap(norm(index[i, j]))
            luminance = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2]
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if luminance > 0.5 else "white")
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([f"{attn} + {pe}" for pe, attn in columns], fontsize=7, rotation=60, ha="right",
                       rotation_mode="anchor")
    ax.set_yticks(range(len(tasks)))
    ax.set_yticklabels(tasks, fontsize=8)
    ax.set_title(f"Reach: largest multiplier with score ≥ {100 * REACH_THRESHOLD:.0f}% (best row over protocols)\n"
                 "+: the whole evaluated range; –: not even 1×; white: not run", fontsize=9)
    ticks = list(range(levels))
    bar = fig.colorbar(image, ax=ax, ticks=ticks, fraction=0.03, pad=0.02)
    bar.ax.set_yticklabels(["none"] + [f"{2 ** (k - 1)}×" for k in ticks[1:]], fontsize=7)
    bar.set_label("reach", fontsize=8)
    return _save(fig, out, "reach_heatmap")


def _safe(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)


def plot_all(board: pd.DataFrame, out: str | Path) -> list[Path]:
    return plot_curves(board, out) + plot_reach(board, out)


def prune_stale(out: str | Path, written: list[Path], *, remove: bool = True) -> list[Path]:
    """Record ``written`` in ``out``'s manifest; with ``remove``, first delete the figures the manifest listed
    that are not in ``written`` (the figures of tables the board no longer has). Returns the deleted paths.
    Without ``remove`` (a plot of some tasks only) the manifest keeps the earlier entries too."""
    out = Path(out)
    manifest = out / MANIFEST
    earlier: list[str] = []
    if manifest.exists():
        try:
            earlier = [str(name) for name in json.loads(manifest.read_text()).get("figures", [])]
        except (ValueError, AttributeError):
            earlier = []  # an unreadable manifest forgets, it never deletes
    now = {path.name for path in written}
    removed = []
    if remove:
        for name in sorted(set(earlier) - now):
            path = out / name
            if Path(name).name == name and path.suffix.lstrip(".") in FORMATS and path.is_file():
                path.unlink()
                removed.append(path)
    names = sorted(now if remove else now | set(earlier))
    out.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"figures": names}, indent=1) + "\n")
    tmp.replace(manifest)
    return removed
