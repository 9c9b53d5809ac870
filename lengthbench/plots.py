"""Figures from the leaderboard: extrapolation curves per task and a heat map of reach.

``plot_curves`` draws, per task (and preset, training length), the score against length on a log2
axis labelled by multiplier and token count, a line per attention x encoding: the best-of-seeds run
(the leaderboard's row) as the line, the mean +- std over seeds as a faint band where there are
several seeds. Colour encodes the mechanism and marker + line style the encoding, so a line can be
read without the legend's colours alone. ``plot_reach`` draws reach (the largest multiplier scoring at
least 90%) over tasks x (attention, encoding). Both write PNG and SVG; matplotlib runs headless (Agg).

``prune_stale`` keeps the folder in step with the board: it removes the figures an earlier ``plot_all`` wrote
there (listed in ``MANIFEST``) that this one did not, e.g. ``curves_<task>.*`` once the task has several tables
and its figures are named per table. Files it did not write are never touched.
"""

from __future__ import annotations

import hashlib
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

from lengthbench.leaderboard import METRIC_NAMES, REACH_THRESHOLD, ROW_KEYS, TABLE_KEYS, board_multipliers  # noqa: E402
from lengthbench.tasks import multiplier_label  # noqa: E402

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


def _table_label(task: str, preset: str, protocol: str, train_length: int, several: bool) -> str:
    if not several:
        return task
    return f"{task} ({preset}{', ' + protocol if protocol else ''}, n={train_length})"


SLUG_MAX = 120  # file systems allow 255 bytes per name; a long curriculum's protocol exceeds that


def _protocol_slug(protocol: str) -> str:
    """``"8M samples, batch 512, lr 0.001"`` -> ``"8M_b512_lr0.001"``; one longer than ``SLUG_MAX`` is cut and
    ends in a hash of the whole protocol, so distinct protocols keep distinct names."""
    slug = (protocol.replace(" samples, batch ", "_b").replace(", lr ", "_lr").replace(", ", "_")
            .replace("=", "-").replace(",", ""))
    if len(slug) <= SLUG_MAX:
        return slug
    return f"{slug[:SLUG_MAX - 9]}_{hashlib.sha1(protocol.encode()).hexdigest()[:8]}"


def _several(board: pd.DataFrame) -> dict[str, bool]:
    """Per task: whether its runs make more than one table (then labels and file names say which)."""
    return {task: len(table.groupby(TABLE_KEYS[1:])) > 1 for task, table in board.groupby("task")}


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
    """One figure per table of the leaderboard: ``curves_<task>.{png,svg}``, or where a task has several
    tables ``curves_<task>_<preset>[_<protocol>]_n<n>.{png,svg}``."""
    out = Path(out)
    colours, styles = _style_maps(board)
    tables = list(board.groupby(TABLE_KEYS, sort=True))
    several_tables = _several(board)
    paths: list[Path] = []
    for (task, preset, protocol, train_length), table in tables:
        several = bool(several_tables[task])
        multipliers = board_multipliers(table)
        x = np.log2(multipliers)
        fig, ax = plt.subplots(figsize=(8.5, 4.8))
        for _, row in table.sort_values(ROW_KEYS).iterrows():
            marker, linestyle = styles[row["pe"]]
            best = np.array([row[f"{m}x"] for m in multipliers], dtype=float)
            label = f"{row['attn']} + {row['pe']}"
            if row["seeds"] > 1:
                label += f" (best of {row['seeds']})"
                mean = np.array([row[f"{m}x_mean"] for m in multipliers], dtype=float)
                std = np.nan_to_num(np.array([row[f"{m}x_std"] for m in multipliers], dtype=float))
                ax.fill_between(x, np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100),
                                color=colours[row["attn"]], alpha=0.12, linewidth=0)
            ax.plot(x, best, color=colours[row["attn"]], marker=marker, linestyle=linestyle, linewidth=1.8,
                    markersize=6, label=label, clip_on=False, zorder=3)
        ax.axhline(100 * REACH_THRESHOLD, color="0.6", linewidth=0.8, linestyle=(0, (2, 2)), zorder=1)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{m}×\n{round(m * int(train_length))}" for m in multipliers], fontsize=9)
        ax.set_xlim(x[0] - 0.2, x[-1] + 0.2)
        ax.set_ylim(-2, 102)
        ax.set_yticks([0, 20, 40, 60, 80, 100 * REACH_THRESHOLD, 100])
        ax.set_yticklabels(["0", "20", "40", "60", "80", f"{100 * REACH_THRESHOLD:.0f} (reach)", "100"])
        ax.set_xlabel(f"evaluation length: multiplier of n={train_length} (top), nominal length n (bottom), log2 scale")
        metric = METRIC_NAMES.get(table["metric"].iloc[0], str(table["metric"].iloc[0]))
        ax.set_ylabel(f"{metric} (%)")
        legend_note = "lines: best seed, bands: mean ± std" if table["seeds"].max() > 1 else "one seed"
        ax.set_title(wrap_title(f"{_table_label(task, preset, protocol, train_length, several)}: {metric} against "
                                f"length (preset {preset}; {legend_note})"), fontsize=11)
        ax.grid(True, which="major", color="0.9", linewidth=0.8)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9,
                  title="attention + encoding", title_fontsize=9)
        stem = f"curves_{task}" if not several else "_".join(
            part for part in (f"curves_{task}", preset, _protocol_slug(protocol), f"n{train_length}") if part)
        paths += _save(fig, out, _safe(stem))
    return paths


def wrap_title(text: str, width: int = TITLE_WIDTH) -> str:
    """A figure title in lines of at most `width` characters (a curriculum's label runs to several hundred, and one
    line that long squeezes the axes to a sliver of the saved figure)."""
    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)) or text


def plot_reach(board: pd.DataFrame, out: str | Path) -> list[Path]:
    """A heat map of reach, tasks x (attention, encoding): ``reach_heatmap.{png,svg}``."""
    out = Path(out)
    several_tables = _several(board)
    row_keys = sorted(board.groupby(TABLE_KEYS).groups)
    row_labels = [_table_label(t, p, r, n, bool(several_tables[t])) for t, p, r, n in row_keys]
    columns = sorted(board.groupby(ROW_KEYS).groups)  # (pe, attn)
    column_labels = [f"{attn}\n{pe}" for pe, attn in columns]
    grid = np.full((len(row_keys), len(columns)), np.nan)
    largest = {key: max(board_multipliers(table)) for key, table in board.groupby(TABLE_KEYS)}
    whole_range = np.zeros_like(grid, dtype=bool)
    for _, row in board.iterrows():
        i = row_keys.index((row["task"], row["preset"], row["protocol"], row["train_length"]))
        j = columns.index((row["pe"], row["attn"]))
        grid[i, j] = row["reach"]
        whole_range[i, j] = row["reach"] >= largest[row_keys[i]]
    top = int(max(1, np.nanmax(grid) if np.isfinite(grid).any() else 1))
    levels = int(math.log2(top)) + 2  # "none" plus 1x .. top
    # Colour index: 0 = no multiplier reaches 90%, k = reach 2^(k-1).
    index = np.where(np.isnan(grid), np.nan, np.where(grid > 0, np.log2(np.maximum(grid, 1)) + 1, 0))
    colours = ["#d9d9d9"] + [plt.get_cmap("viridis")(v) for v in np.linspace(0.15, 0.95, levels - 1)]
    cmap = ListedColormap(colours).with_extremes(bad="white")
    norm = BoundaryNorm(np.arange(-0.5, levels + 0.5), cmap.N)
    width = max(5.0, 1.0 + 0.9 * len(columns))
    height = max(2.5, 1.4 + 0.55 * len(row_keys))
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(np.ma.masked_invalid(index), cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(row_keys)):
        for j in range(len(columns)):
            if np.isnan(grid[i, j]):
                ax.text(j, i, "not run", ha="center", va="center", fontsize=7, color="0.5")
                continue
            value = grid[i, j]
            text = (f"{multiplier_label(value)}×" + ("+" if whole_range[i, j] else "")) if value else "–"
            shade = cmap(norm(index[i, j]))
            luminance = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2]
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color="black" if luminance > 0.5 else "white")
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels(column_labels, fontsize=9)
    ax.set_yticks(range(len(row_keys)))
    ax.set_yticklabels(row_labels, fontsize=9)
    ax.set_xlabel("attention mechanism / positional encoding")
    ax.set_title(f"Reach: largest multiplier with score ≥ {100 * REACH_THRESHOLD:.0f}% (best of seeds)\n"
                 "+: the whole evaluated range; –: not even 1×", fontsize=10)
    ticks = list(range(levels))
    bar = fig.colorbar(image, ax=ax, ticks=ticks, fraction=0.046, pad=0.03)
    bar.ax.set_yticklabels(["none"] + [f"{2 ** (k - 1)}×" for k in ticks[1:]], fontsize=8)
    bar.set_label("reach", fontsize=9)
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
