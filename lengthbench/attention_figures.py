"""Figures for ``lengthbench inspect``: attention maps of a trained run, and diagnostics against length.

Matplotlib with the Agg backend (no display needed). Each function writes PNG files and returns their
paths.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import Normalize, PowerNorm, TwoSlopeNorm  # noqa: E402

from lengthbench.errors import UsageError  # noqa: E402
from lengthbench.plots import _style_maps  # noqa: E402
from lengthbench.store import atomic_write  # noqa: E402
from lengthbench.tasks import multiplier_label  # noqa: E402

LABELLED_TOKENS = 48  # up to this many tokens, the axes carry the vocabulary symbols
DIAGNOSTIC_COLUMNS = {  # stored column -> panel title
    "sparsity": "sparsity (exact zeros, causal part)",
    "sink_rate": "sink rate (heads with first-token weight > 0.3)",
    "entropy": "entropy / log(visible keys)",
    "support": "support (non-zero weights per row)",
}


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)


# -- attention maps -----------------------------------------------------------------------------------

@torch.no_grad()
def attention_maps(model, input_ids: torch.Tensor, features: torch.Tensor | None = None,
                   max_tokens: int = 512) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Per layer, the weight map ``[H, R, K]`` of one sequence ``input_ids [1, T]``.

    Up to ``max_tokens`` tokens the maps are the full ``T x T`` maps (R = K = T). Longer sequences show
    ``max_tokens`` evenly spaced query rows (the last row included) and keys summed into ``max_tokens``
    equal bins, so no ``T x T`` map is ever built and every bin shows the mass it holds. Entries that
    the row cannot see are NaN. Also returns the query positions ``[R]`` and the key bin edges ``[K+1]``.
    """
    tokens = input_ids.shape[1]
    if tokens <= max_tokens:
        rows = torch.arange(tokens)
        edges = np.arange(tokens + 1)
    else:
        rows = torch.from_numpy(np.linspace(0, tokens - 1, max_tokens).round().astype(np.int64))
        edges = np.linspace(0, tokens, max_tokens + 1).round().astype(np.int64)
    with torch.autocast(device_type=input_ids.device.type, enabled=False):
        states = model.hidden_states(input_ids, features)
        maps = []
        for layer, x in zip(model.attention_layers, states, strict=True):
            chunk = max(1, (1 << 24) // (layer.n_heads * tokens))
            blocks = []
            for start in range(0, len(rows), chunk):
                w = layer.attention_map(x, rows[start : start + chunk].to(x.device))[0].float().cpu()
                if tokens > max_tokens:  # key bins: sums over [edges[i], edges[i+1])
                    cumulative = torch.nn.functional.pad(w.cumsum(-1), (1, 0))
                    w = cumulative[..., edges[1:]] - cumulative[..., edges[:-1]]
                blocks.append(w)
            weights = torch.cat(blocks, dim=1).numpy()
            hidden = edges[:-1][None, :] > rows.numpy()[:, None]  # the bin starts after the query
            maps.append(np.where(hidden[None], np.nan, weights))
    return maps, rows.numpy(), edges


def plot_attention_maps(maps: list[np.ndarray], rows: np.ndarray, edges: np.ndarray, out_dir: Path,
                        stem: str, title: str, symbols: list[str] | None = None, scale: str = "auto") -> list[Path]:
    """One PNG per layer, ``{stem}-layer{l}.png``: a grid of heads, query rows down, keys across.

    ``symbols`` (one per token) label the axes when the map is the full map of at most
    ``LABELLED_TOKENS`` tokens. Each panel has its own colour scale, up to its largest weight outside
    row 0 (which sees one key and would pin every softmax head at 1; the value is in the title), so
    that a diffuse head is as readable as a sharp one. ``scale``: ``linear``, ``sqrt`` (small weights
    brighter), or ``auto`` (linear for full maps, sqrt for binned ones). Maps with negative weights
    use a diverging linear scale centred on 0. Grey: keys the row cannot see.
    """
    if scale not in ("auto", "linear", "sqrt"):
        raise UsageError(f"unknown colour scale {scale!r}; choose from: auto, linear, sqrt")
    out_dir.mkdir(parents=True, exist_ok=True)
    n_tokens = int(edges[-1])
    full = len(rows) == n_tokens
    gamma = 0.5 if scale == "sqrt" or (scale == "auto" and not full) else 1.0
    labelled = symbols is not None and full and n_tokens <= LABELLED_TOKENS
    paths = []
    for layer_index, layer_maps in enumerate(maps):
        n_heads = layer_maps.shape[0]
        n_cols = min(n_heads, 4)
        n_rows = math.ceil(n_heads / n_cols)
        panel = 3.4 if not labelled else max(3.4, 0.13 * n_tokens + 1.2)
        fig, axes = plt.subplots(n_rows, n_cols, figsize=(panel * n_cols, panel * n_rows + 0.6), squeeze=False)
        for head in range(n_rows * n_cols):
            ax = axes[head // n_cols][head % n_cols]
            if head >= n_heads:
                ax.axis("off")
                continue
            w = layer_maps[head]
            finite = w[rows > 0] if len(rows) > 1 else w
            finite = finite[np.isfinite(finite)]
            low = float(finite.min()) if finite.size else 0.0
            high = float(finite.max()) if finite.size else 1.0
            if low < 0:
                bound = max(abs(low), abs(high), 1e-12)
                cmap, norm = "RdBu_r", TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound)
            else:
                vmax = max(high, 1e-12)
                norm = Normalize(0.0, vmax) if gamma == 1.0 else PowerNorm(gamma, vmin=0.0, vmax=vmax)
                cmap = "viridis"
            cmap = plt.get_cmap(cmap).with_extremes(bad="#bdbdbd")
            image = ax.imshow(np.ma.masked_invalid(w), cmap=cmap, norm=norm, aspect="auto",
                              interpolation="nearest",
                              extent=None if full else (0, n_tokens, rows[-1] + 0.5, rows[0] - 0.5))
            ax.set_title(f"head {head}   max {high:.2g}" + (f"   min {low:.2g}" if low < 0 else ""), fontsize=9)
            bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
            bar.ax.tick_params(labelsize=7)
            if gamma != 1.0 and low >= 0:
                bar.set_label("sqrt scale", fontsize=7)
            if labelled:
                ticks = np.arange(n_tokens)
                ax.set_xticks(ticks, symbols, rotation=90, fontsize=6)
                ax.set_yticks(ticks, symbols, fontsize=6)
            else:
                ax.tick_params(labelsize=7)
            if head % n_cols == 0:
                ax.set_ylabel("query position", fontsize=8)
            if head // n_cols == n_rows - 1 or head + n_cols >= n_heads:
                ax.set_xlabel("key position" + ("" if full else " (summed in bins)"), fontsize=8)
        fig.suptitle(f"{title} - layer {layer_index}", fontsize=11)
        fig.tight_layout()
        path = out_dir / f"{stem}-layer{layer_index}.png"
        atomic_write(path, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=110))
        plt.close(fig)
        paths.append(path)
    return paths


def inspect_maps(model, task, config, run_id: str, length: int, out_dir: Path, *, sample: int = 0,
                 seed: int | None = None, max_tokens: int = 512, scale: str = "auto") -> list[Path]:
    """Attention maps of sample ``sample`` of the test stream at nominal length ``length``."""
    seed = getattr(config, "seed", 0) if seed is None else seed
    batch = task.batch([sample], length, "test", seed)
    end = int(batch.realised_tokens[0])
    device = next(model.parameters()).device
    input_ids = torch.as_tensor(batch.input_ids[:, :end], device=device)
    features = None if batch.features is None else torch.as_tensor(batch.features[:, :end], device=device)
    maps, rows, edges = attention_maps(model, input_ids, features, max_tokens=max_tokens)
    symbols = [task.vocab[i] for i in batch.input_ids[0, :end]]
    attn, pe = getattr(config, "attn", "?"), getattr(config, "pe", "?")
    title = f"{run_id}\n{task.name} n={length} ({end} tokens), {attn} + {pe}, test sample {sample}"
    return plot_attention_maps(maps, rows, edges, out_dir, safe_name(f"{run_id}-n{length}-s{sample}"),
                               title, symbols, scale)


def load_run(results: str | Path, run_id: str):
    """``(model, task, config)`` of a trained run, through the runner."""
    if not Path(results).is_dir():
        raise UsageError(f"results folder {results} does not exist")
    from lengthbench.runner import load_model

    return load_model(results, run_id, device="cpu")


# -- diagnostics against length ----------------------------------------------------------------------

def select_rows(frame: pd.DataFrame, task: str | None = None, attns: list[str] | None = None,
                pes: list[str] | None = None, runs: list[str] | None = None) -> pd.DataFrame:
    """The stored rows of the chosen runs, with a one-line error naming the choices when none match."""
    for column, wanted in (("task", [task] if task else None), ("attn", attns), ("pe", pes), ("run_id", runs)):
        if not wanted:
            continue
        present = sorted(frame[column].dropna().astype(str).unique())
        unknown = [w for w in wanted if w not in present]
        if unknown:
            raise UsageError(f"no stored rows with {column} {unknown[0]!r}; stored: {', '.join(present) or 'none'}")
        frame = frame[frame[column].isin(wanted)]
    return frame


def plot_diagnostics(frame: pd.DataFrame, out_dir: Path, task: str) -> Path:
    """``diagnostics-{task}.png``: a panel per diagnostic against length (log2 axis), and the task's
    score for reference; a line per attention + encoding (mean over its runs; the band spans their
    min and max)."""
    columns = [c for c in DIAGNOSTIC_COLUMNS if c in frame.columns and frame[c].notna().any()]
    if not columns:
        raise UsageError(f"the stored rows of task {task!r} have no attention diagnostics "
                         "(runs made with diagnostics off?)")
    titles = dict(DIAGNOSTIC_COLUMNS)
    score = "score" if "score" in frame.columns and frame["score"].notna().any() else "exact_match"
    if score in frame.columns and frame[score].notna().any():
        metric = frame["metric"].dropna().iloc[0] if score == "score" and "metric" in frame.columns \
            and frame["metric"].notna().any() else "exact_match"
        titles[score] = f"{str(metric).replace('_', ' ')} (the task's score)"
        columns = [score, *columns]
    x_column = "multiplier" if "multiplier" in frame.columns and frame["multiplier"].notna().all() else "eval_length"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_cols = 3 if len(columns) > 3 else len(columns) + 1
    n_rows = math.ceil((len(columns) + 1) / n_cols)  # one more cell for the legend
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.6 * n_cols, 3.7 * n_rows), squeeze=False)
    cells = [ax for row in axes for ax in row]
    groups = list(frame.groupby(["attn", "pe"], sort=True))
    colours, styles = _style_maps(frame)  # the leaderboard figures' styles: colour = attn, marker = pe
    ticks = sorted(frame[x_column].dropna().unique())
    for ax, column in zip(cells, columns, strict=False):
        for (attn, pe), rows in groups:
            stats = rows.groupby(x_column)[column].agg(["mean", "min", "max"]).dropna().sort_index()
            if stats.empty:
                continue
            n_runs = rows["run_id"].nunique() if "run_id" in rows else 1
            label = f"{attn} + {pe}" + (f" ({n_runs} runs)" if n_runs > 1 else "")
            colour, (marker, linestyle) = colours[attn], styles[pe]
            ax.plot(stats.index, stats["mean"], marker=marker, linestyle=linestyle, markersize=3.5, color=colour,
                    label=label)
            if n_runs > 1:
                ax.fill_between(stats.index, stats["min"], stats["max"], color=colour, alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [f"{multiplier_label(t)}x" if x_column == "multiplier" else str(int(t)) for t in ticks],
                      fontsize=7, rotation=45 if len(ticks) > 6 else 0)
        ax.minorticks_off()
        ax.set_xlabel("multiplier of the training length" if x_column == "multiplier" else "evaluation length",
                      fontsize=8)
        ax.set_title(titles[column], fontsize=9)
        if column == "support":
            ax.set_yscale("log")
        else:
            ax.set_ylim(-0.03, 1.03)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, alpha=0.3)
    handles, labels = cells[0].get_legend_handles_labels()
    for ax in cells[len(columns):]:
        ax.axis("off")
    cells[len(columns)].legend(handles, labels, loc="center", fontsize=8, frameon=False,
                               title="attention + encoding", title_fontsize=9)
    fig.suptitle(f"attention diagnostics against length - task {task}", fontsize=11)
    fig.tight_layout()
    path = out_dir / f"diagnostics-{safe_name(task)}.png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path
