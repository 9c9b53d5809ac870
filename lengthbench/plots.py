"""Figures from the leaderboard: a figure per paper table, extrapolation curves per task, a heat map of reach.

``plot_configs`` draws, per paper-table config (``configs/*.toml``), the curves of the stored runs that carry out
that config's protocol (:func:`lengthbench.protocols.runs_of_config`) and nothing else: score against length on a
log2 axis labelled by multiplier and token count, a line per cell (mechanism x encoding), the best-of-seeds run as
the line with its 95% Wilson interval at each length (a vertical bar, over the samples scored) and the mean +- std
over seeds as a faint band where there are several seeds. ``plot_curves`` draws the
same per task for a store without configs, a panel per protocol (the leaderboard's tables: protocols never share
a panel). In every figure a mechanism has one colour (the same in every figure where it can), an encoding one line
style, and each line its own hollow marker, set a little apart along the length axis, so that lines with equal
values all stay visible. Legends name mechanism and encoding only; parameters appear only where two lines of a
figure would otherwise share a name, and then only those that differ. ``plot_reach`` draws reach (the largest
multiplier scoring at least 90%) over tasks x (mechanism, encoding). All write PNG and SVG; matplotlib runs
headless (Agg).

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

from lengthbench.leaderboard import (  # noqa: E402
    METRIC_NAMES,
    REACH_THRESHOLD,
    TABLE_KEYS,
    board_multipliers,
    build_leaderboard,
)
from lengthbench.store import atomic_write, atomic_write_text, refuse_special_file  # noqa: E402
from lengthbench.tasks import get_task, multiplier_label  # noqa: E402

TITLE_WIDTH = 100  # characters a line of a curve plot's title

FORMATS = ("png", "svg")
MANIFEST = ".lengthbench-plots.json"  # the figures the last plot_all wrote in a folder
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]
# saturated colours, none pale (tab10's, with black in place of its light olive)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#000000",
           "#7f7f7f"]
ENCODING_LINESTYLES = {"rope": "-", "nape": "--", "none": ":", "alibi": "-."}
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3))]
DODGE = 0.25  # the spread of a panel's lines along the log2 length axis, in octaves, so equal values stay visible


def _registry_order(names, registry_names: list[str]) -> list[str]:
    """``names`` in the order of their registry (a plugin's after them, alphabetically)."""
    rank = {name: i for i, name in enumerate(registry_names)}
    return sorted(set(names), key=lambda name: (rank.get(name, len(rank)), name))


def mechanism_colours(attns) -> dict[str, str]:
    """A colour per mechanism (names without parameters): its place in the registry's list picks it, so a
    mechanism keeps its colour from figure to figure; where two of ``attns`` would share one, the later takes the
    next colour no other of them has."""
    from lengthbench.models.attention import ATTENTION

    registered = ATTENTION.names()
    taken: dict[str, str] = {}
    for name in _registry_order(attns, registered):
        index = registered.index(name) if name in registered else len(registered)
        colour = PALETTE[index % len(PALETTE)]
        free = [c for c in PALETTE if c not in taken.values()]
        taken[name] = colour if colour not in taken.values() or not free else free[0]
    return taken


def encoding_linestyles(pes) -> dict[str, object]:
    """A line style per encoding: the usual four fixed, others from the rest in turn."""
    others = iter([style for style in LINESTYLES if style not in ENCODING_LINESTYLES.values()] + LINESTYLES)
    return {pe: ENCODING_LINESTYLES[pe] if pe in ENCODING_LINESTYLES else next(others) for pe in sorted(set(pes))}


def _style_maps(board: pd.DataFrame) -> tuple[dict[str, object], dict[str, tuple[str, object]]]:
    """A colour per mechanism and a (marker, line style) per encoding of ``board`` (figures that draw a line per
    mechanism x encoding and no more than one per pair, e.g. ``lengthbench inspect diagnostics``)."""
    styles = encoding_linestyles(board["pe"])
    markers = {pe: MARKERS[i % len(MARKERS)] for i, pe in enumerate(sorted(styles))}
    return mechanism_colours(board["attn"]), {pe: (markers[pe], styles[pe]) for pe in styles}


def _base(name: str) -> str:
    """``"ssmax (scaled_heads=nope)"`` -> ``"ssmax"``: a mechanism or encoding without its parameters."""
    return str(name).split(" (")[0]


def _params(name: str) -> dict[str, str]:
    """``"ssmax (s_init=1.0, scaled_heads=nope)"`` -> ``{"s_init": "1.0", "scaled_heads": "nope"}``."""
    text = str(name).partition(" (")[2].rstrip(")")
    return dict(item.split("=", 1) for item in text.split(", ") if "=" in item)


def legend_labels(rows: pd.DataFrame) -> list[str]:
    """``"mechanism + encoding"`` per row, without parameters; where rows would share a label, each names the
    parameters in which they differ (``"ssmax (s_init=1.0, scaled_heads=nope) + nape"`` beside ``"ssmax +
    nape"``)."""
    names = [f"{_base(attn)} + {_base(pe)}" for attn, pe in zip(rows["attn"], rows["pe"], strict=True)]
    labels = []
    for i, (attn, pe) in enumerate(zip(rows["attn"], rows["pe"], strict=True)):
        twins = [j for j, name in enumerate(names) if name == names[i]]
        if len(twins) == 1:
            labels.append(names[i])
            continue
        parts = []
        for own, column in ((attn, "attn"), (pe, "pe")):
            params = _params(own)
            others = [_params(rows[column].iloc[j]) for j in twins if j != i]
            differing = {k: v for k, v in params.items() if any(other.get(k) != v for other in others)}
            parts.append(_base(own) + (" (" + ", ".join(f"{k}={v}" for k, v in differing.items()) + ")"
                                       if differing else ""))
        labels.append(" + ".join(parts))
    return labels


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
    for fmt in FORMATS:  # all refused before one is written: never a PNG beside the SVG of another board
        refuse_special_file(out / f"{stem}.{fmt}")
    paths = []
    for fmt in FORMATS:
        path = out / f"{stem}.{fmt}"
        # A fixed salt for the SVG element ids (random otherwise): the same board gives the same bytes.
        with plt.rc_context({"svg.hashsalt": "lengthbench"}):
            atomic_write(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight",
                                                                metadata={"Date": None} if fmt == "svg" else None))
        paths.append(path)
    plt.close(fig)
    return paths


def draw_table(ax, table: pd.DataFrame, title: str, colours: dict[str, str]) -> None:
    """One panel: the rows of one leaderboard table (one task and protocol), a line per row."""
    table = table.assign(_pe=table["pe"].map(_base), _attn=table["attn"].map(_base)).sort_values(
        ["_pe", "_attn", "pe", "attn"])
    train_length = int(table["train_length"].iloc[0])
    multipliers = board_multipliers(table)
    linestyles = encoding_linestyles(table["_pe"])
    labels = legend_labels(table)
    count = len(table)
    for i, ((_, row), label) in enumerate(zip(table.iterrows(), labels, strict=True)):
        own = board_multipliers(row.to_frame().T)
        x = np.log2(own) + (DODGE * (i / (count - 1) - 0.5) if count > 1 else 0.0)
        best = np.array([row[f"{multiplier_label(m)}x"] for m in own], dtype=float)
        colour = colours[row["_attn"]]
        if row["seeds"] > 1:
            label += f" (best of {row['seeds']})"
            mean = np.array([row[f"{multiplier_label(m)}x_mean"] for m in own], dtype=float)
            std = np.nan_to_num(np.array([row[f"{multiplier_label(m)}x_std"] for m in own], dtype=float))
            ax.fill_between(x, np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100), color=colour, alpha=0.1,
                            linewidth=0)
        ax.plot(x, best, color=colour, linestyle=linestyles[row["_pe"]], linewidth=1.6, marker=MARKERS[i % len(MARKERS)],
                markersize=6.5, markerfacecolor="white", markeredgewidth=1.4, label=label, clip_on=False,
                zorder=3 + i / max(1, count))
        # the best run's 95% Wilson interval over the samples scored at each length (where the rows give them)
        low = np.array([row.get(f"{multiplier_label(m)}x_lo", np.nan) for m in own], dtype=float)
        high = np.array([row.get(f"{multiplier_label(m)}x_hi", np.nan) for m in own], dtype=float)
        shown = ~(np.isnan(low) | np.isnan(high))
        if shown.any():
            ax.vlines(x[shown], low[shown], high[shown], color=colour, linewidth=1.0, alpha=0.7,
                      zorder=2.5 + i / max(1, count))
    x = np.log2(multipliers)
    ax.axhline(100 * REACH_THRESHOLD, color="0.6", linewidth=0.8, linestyle=(0, (2, 2)), zorder=1)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{multiplier_label(m)}×\n{round(m * train_length)}" for m in multipliers], fontsize=8)
    ax.set_xlim(x[0] - 0.3, x[-1] + 0.3)
    ax.set_ylim(-3, 103)
    ax.set_yticks([0, 20, 40, 60, 80, 100 * REACH_THRESHOLD, 100])
    ax.set_yticklabels(["0", "20", "40", "60", "80", f"{100 * REACH_THRESHOLD:.0f} (reach)", "100"])
    ax.set_xlabel(f"evaluation length: multiplier of n={train_length} (top), tokens n (bottom), log2 scale")
    metric = METRIC_NAMES.get(table["metric"].iloc[0], str(table["metric"].iloc[0]))
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(wrap_title(title), fontsize=9, loc="left")
    ax.grid(True, which="major", color="0.9", linewidth=0.8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8,
              title="mechanism + encoding", title_fontsize=8)


def _table_title(keys: dict, note: str = "") -> str:
    protocol = f": {keys['protocol']}" if keys.get("protocol") else ""
    return f"{keys['task']}, preset {keys['preset']}{protocol}{note}"


def _figure(tables: list[tuple[dict, pd.DataFrame]], title: str, colours: dict[str, str]):
    fig, axes = plt.subplots(len(tables), 1, figsize=(9.0, 4.4 * len(tables)), squeeze=False)
    for ax, (keys, table) in zip(axes[:, 0], tables, strict=True):
        draw_table(ax, table, _table_title(keys, " (lines: best seed; bands: mean ± std over seeds)"), colours)
    fig.suptitle(wrap_title(title), fontsize=11, x=0.02, ha="left")
    fig.tight_layout()
    return fig


def _tables(board: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    return [(dict(zip(TABLE_KEYS, keys, strict=True)), table)
            for keys, table in board.groupby(TABLE_KEYS, sort=True, dropna=False)]


def config_title(config_path: str | Path) -> str:
    """The table a config reproduces, from its header's first line up to its colon: ``"Sieve Attention, Table 1,
    MQRAR (L = 4)"``; the file's name where it has no header."""
    for line in Path(config_path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.lstrip("#").strip():
            return line.lstrip("#").strip().split(": ")[0].rstrip(":")
        if line.strip():
            break
    return Path(config_path).stem


def config_board(frame: pd.DataFrame, config_path: str | Path) -> pd.DataFrame:
    """The leaderboard rows of the runs of ``frame`` that carry out the config's protocol
    (:func:`lengthbench.protocols.runs_of_config`); their curricula's earlier stages (from ``frame``) name the
    protocol, as in the leaderboard, and have no rows of their own. Empty where no run does."""
    from lengthbench.protocols import runs_of_config

    rows = runs_of_config(frame, config_path)
    if rows.empty:
        return pd.DataFrame()
    cells = set(rows["run_id"])
    sources = dict(zip(frame["run_id"], frame["config_json"], strict=True))
    kept, queue = set(cells), list(cells)
    while queue:  # the earlier stages, for the protocol's label
        source = json.loads(sources.get(queue.pop(), "{}") or "{}").get("init_from")
        if source and source in sources and source not in kept:
            kept.add(source)
            queue.append(source)
    board = build_leaderboard(frame[frame["run_id"].isin(kept)])
    return board[board["best_run_id"].isin(cells)]


def plot_configs(frame: pd.DataFrame, config_paths: list[str | Path], out: str | Path) -> list[Path]:
    """A figure per paper-table config, ``<config name>.{png,svg}``: the curves of the runs of ``frame`` (a store's
    rows) that carry out its protocol (:func:`config_board`), nothing else; none for a config without such runs.
    Then the heat map of reach over those rows."""
    out = Path(out)
    boards = [(Path(path), config_board(frame, path)) for path in config_paths]
    boards = [(path, board) for path, board in boards if len(board)]
    colours = mechanism_colours({_base(a) for _, board in boards for a in board["attn"]})
    paths: list[Path] = []
    for path, board in boards:
        fig = _figure(_tables(board), f"{config_title(path)} ({path.name})", colours)
        paths += _save(fig, out, _safe(path.stem))
    if boards:
        paths += plot_reach(pd.concat([board for _, board in boards], ignore_index=True), out)
    return paths


def plot_curves(board: pd.DataFrame, out: str | Path) -> list[Path]:
    """One figure per task, ``curves_<task>.{png,svg}``: a panel per protocol of the task itself (``_main_rows``:
    its default training length and parameters), a line per mechanism x encoding of that protocol."""
    out = Path(out)
    colours = mechanism_colours(board["attn"].map(_base))
    paths: list[Path] = []
    for task, rows in board.groupby("task", sort=True):
        fig = _figure(_tables(_main_rows(rows)), f"{task}: score against length, a panel per protocol", colours)
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
    """Per task, ``curves_<task>`` (a panel per protocol), and the heat map of reach: a store without configs."""
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
    atomic_write_text(manifest, json.dumps({"figures": names}, indent=1) + "\n")
    return removed
