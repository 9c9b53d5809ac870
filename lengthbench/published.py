"""The published leaderboard: one section per paper-table config (``configs/*.toml``), in the paper's layout.

A config states a paper's protocol and carries it out (``lengthbench sweep --config``); its section holds exactly
the runs that config plans (matched by run id, the hash of the whole configuration), so runs of another protocol,
an older task layout or another store version never share its tables. Per section: the paper's title, the
protocol in one line, the cells done of the cells planned, and a row per attention + encoding (the config's order)
with a column per multiplier, best of seeds and mean +- std over seeds, once for the paper's checkpoint selection
and once for the in-distribution selection kept from the same trainings (``also_select``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lengthbench import checkout_path
from lengthbench.config import DEFAULT_INIT, RunConfig, selection_words
from lengthbench.leaderboard import (
    METRIC_NAMES,
    TextTable,
    _md_table,
    _pct,
    _reach_text,
    board_multipliers,
    build_leaderboard,
    interval_text,
    with_score,
)
from lengthbench.tasks import multiplier_label

CONFIGS = checkout_path("configs")
SELECTION_KINDS = ("paper", "id")  # the run's own (the paper's) selection; the in-distribution one kept beside it


@dataclass
class Section:
    """One paper-table config and the runs it plans. ``paper`` (the paper's title) and ``table``, the config's keys,
    name the table in the transcribed paper tables (``lengthbench/paper_tables.csv``'s columns of those names);
    ``explained`` (its ``[explained]`` table, ``"attn:pe" = "reason"``) gives the one-line reason, with its
    evidence, of a cell that does not agree."""

    path: Path
    title: str
    cells: list[RunConfig]  # the runs the config trains (cells x seeds), the config's order
    budget_fraction: float | None = None
    settings: dict = field(default_factory=dict)

    @property
    def paper(self) -> str | None:
        return self.settings.get("paper")

    @property
    def table(self) -> str | None:
        return self.settings.get("table")

    @property
    def explained(self) -> dict[str, str]:
        return dict(self.settings.get("explained") or {})

    @property
    def name(self) -> str:
        return self.path.stem

    def expected(self) -> dict[str, tuple[RunConfig, str]]:
        """Run id -> (the cell's run, selection kind) of every run the config stores."""
        runs = {}
        for config in self.cells:
            runs[config.run_id] = (config, "paper")
            for other in config.selected_runs():
                runs[other.run_id] = (config, "id" if other.selection == "id" else other.selection)
        return runs

    def rows(self) -> list[tuple[str, str]]:
        """The table's rows, (attn, pe) as the leaderboard names them, in the config's order."""
        from lengthbench.config import params_suffix

        seen = {}
        for config in self.cells:
            seen.setdefault((config.attn + params_suffix(config.attn_params), config.pe + params_suffix(
                config.pe_params)), None)
        return list(seen)


def table_configs(folder: Path = CONFIGS) -> list[Path]:
    """The paper-table configs: the TOML files directly in ``folder`` (studies in its subfolders are not tables)."""
    return sorted(Path(folder).glob("*.toml"))


def read_section(path: str | Path) -> Section:
    """A config's section: its title (the header's first line), its runs and its budget fraction."""
    from lengthbench.sweep import configs_of_sweep, read_sweep_file

    path = Path(path)
    settings = read_sweep_file(path)
    configs = configs_of_sweep(settings)
    sources = {c.init_from for c in configs}
    cells = [c for c in configs if c.run_id not in sources]  # the cells, not their curriculum's stages
    first = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")), "")
    title = first.lstrip("# ").rstrip(":").strip() or path.stem
    return Section(path, title, cells, settings.get("budget_fraction"), settings)


def protocol_line(section: Section) -> str:
    """The section's protocol in one line, from its runs' configurations."""
    if not section.cells:
        return ""
    config = section.cells[0]
    selections = {}
    for cell in section.cells:
        selections.setdefault(selection_words(cell.selection, cell.selection_metric), []).append(cell.pe)
    if len(selections) == 1:
        chosen = next(iter(selections)) or "in distribution"
    else:
        chosen = "; ".join(f"{', '.join(sorted(set(pes)))}: {words or 'in distribution'}"
                           for words, pes in selections.items())
    also = " and in distribution, both from one training" if "id" in config.also_select else ""
    seeds = sorted({c.seed for c in section.cells})
    init = "" if config.init == DEFAULT_INIT else f", init {config.init}"
    task = "".join(f"; task {key}={value}" if not number else f", {key}={value}"
                   for number, (key, value) in enumerate(config.task_params.items()))
    line = (f"{config.train_samples / 1e6:g}M samples of batch {config.batch_size}, lr {config.lr:g}, "
            f"{config.warmup_steps:,} warm-up steps then cosine to "
            f"{'0' if config.min_lr_ratio == 0 else f'{config.min_lr_ratio:g} x lr'}, model "
            f"{config.n_layers} x d {config.d_model}, {config.n_heads} heads, FFN {config.ffn}{init}{task}; checkpoint "
            f"selection {chosen}{also}; {config.eval_samples:,} samples per length; seeds "
            f"{', '.join(map(str, seeds))}")
    if section.budget_fraction is not None:
        line += (f"; budget fraction {section.budget_fraction:g} (the paper's sample count does not fit one GPU "
                 f"window: every row trained on {section.budget_fraction:.0%} of it)")
    return line


def build_sections(frame: pd.DataFrame, sections: list[Section]) -> pd.DataFrame:
    """The leaderboard of each section: the rows of ``build_leaderboard`` for its runs, per selection kind,
    with ``section``, ``title``, ``selection_kind``, ``cells_done``, ``cells_total`` and the config's row order
    (``row``); a cell with no run yet has a row of its own with no values."""
    from lengthbench.protocols import other_selections, runs_of_config

    boards = []
    for section in sections:
        own = runs_of_config(frame, section.path, cells=section.cells) if not frame.empty else frame
        others = other_selections(frame, set(own["run_id"])) if not own.empty else own
        runs = {"paper": own, "id": others}
        done = _cells_done(section, own, others)
        order = {key: number for number, key in enumerate(section.rows())}
        for kind in SELECTION_KINDS:
            if kind != "paper" and not any(cell.also_select for cell in section.cells):
                continue
            part = runs[kind]
            board = build_leaderboard(part, protocol=section.name) if not part.empty else pd.DataFrame()
            missing = [key for key in order if board.empty or not (
                (board["attn"] == key[0]) & (board["pe"] == key[1])).any()]
            if missing:
                board = pd.concat([board, pd.DataFrame([{"attn": a, "pe": p, "seeds": 0} for a, p in missing])],
                                  ignore_index=True)
            board["task"] = section.cells[0].task
            board["section"], board["title"], board["selection_kind"] = section.name, section.title, kind
            board["cells_done"], board["cells_total"] = done, len(order)
            board["row"] = [order.get((a, p), len(order)) for a, p in zip(board["attn"], board["pe"], strict=True)]
            boards.append(board.sort_values("row"))
    if not boards:
        return pd.DataFrame(columns=["section", "title", "selection_kind", "attn", "pe", "seeds"])
    board = pd.concat(boards, ignore_index=True)
    board["seeds"] = board["seeds"].fillna(0).astype(int)
    return board


def _cells_done(section: Section, own: pd.DataFrame, others: pd.DataFrame) -> int:
    """Cells (attention + encoding) with a run of every seed the config names, and each of those runs' other
    selections stored too."""
    from lengthbench.leaderboard import with_score

    if own.empty:
        return 0
    own = with_score(own).drop_duplicates("run_id")
    kept = others.drop_duplicates("run_id") if not others.empty else others
    sources = (kept["config_json"].map(lambda text: __import__("json").loads(text).get("selected_from"))
               .value_counts().to_dict() if not kept.empty else {})
    done = 0
    for attn, pe in section.rows():
        wanted = [c for c in section.cells if (c.attn + _suffix(c.attn_params), c.pe + _suffix(c.pe_params))
                  == (attn, pe)]
        runs = own[(own["attn"] == attn) & (own["pe"] == pe)]
        seeds_stored = set(runs["seed"].astype(int))
        complete = all(sources.get(run_id, 0) >= len(wanted[0].also_select) for run_id in runs["run_id"])
        done += int({c.seed for c in wanted} <= seeds_stored and complete)
    return done


def _suffix(params) -> str:
    from lengthbench.config import params_suffix

    return params_suffix(params)


KIND_WORDS = {"paper": "the paper's checkpoint selection", "id": "checkpoint selection in distribution"}
TOLERANCE = 5.0  # points


def paper_values(section: Section, tables: pd.DataFrame | None = None) -> dict[tuple[str, str], dict]:
    """The paper's printed values of the section's cells: (attn, pe) as the section's rows name them ->
    {multiplier: value in %}; empty where the config names no paper table."""
    from lengthbench.compare import load_paper_tables, stands_for

    if not section.paper or not section.table or not section.cells:
        return {}
    tables = load_paper_tables() if tables is None else tables
    rows = tables[(tables["paper"] == section.paper) & (tables["table"] == section.table)
                  & (tables["task"] == section.cells[0].task)]
    values = {}
    for attn, pe in section.rows():
        match = rows[(rows["pe"] == pe.split(" (")[0]) & rows["attn"].map(lambda label, a=attn: stands_for(a, label))]
        if not match.empty:
            values[(attn, pe)] = dict(zip(match["multiplier"], match["value"], strict=True))
    return values


def grade(row, paper: dict, tolerance: float = TOLERANCE) -> tuple[str, list[float]]:
    """Ours (a section board row, best of seeds) against the paper's values: ``agrees`` where at every shared
    column the difference is within ``tolerance`` points or the paper's value lies inside our 95% Wilson interval;
    else ``above``, ``below`` or ``mixed`` by the signs of the differences beyond (:func:`lengthbench.compare.verdict`);
    ``not run`` without a run."""
    from lengthbench.compare import inside_interval, verdict

    if not row.get("seeds"):
        return "not run", []
    shared = [(m, value, row.get(f"{multiplier_label(m)}x")) for m, value in sorted(paper.items())]
    shared = [(m, value, ours) for m, value, ours in shared if ours is not None and not math.isnan(ours)]
    differences = [ours - value for _, value, ours in shared]
    return verdict(differences, tolerance, [inside_interval(row, m, value) for m, value, _ in shared]), differences

def comparison_rows(part: pd.DataFrame, section: Section, paper: dict) -> tuple[list[str], list[list[str]]]:
    """The section's table of the paper's values beside ours (best of seeds, the paper's selection)."""
    multipliers = sorted({m for values in paper.values() for m in values})
    header = ["attn", "pe"] + [f"{multiplier_label(m)}×" for m in multipliers] + ["verdict", "reason"]
    rows = []
    table = part[part["selection_kind"] == "paper"].sort_values("row")
    for _, row in table.iterrows():
        key = (str(row["attn"]), str(row["pe"]))
        values = paper.get(key, {})
        verdict, _ = grade(row, values) if values else ("no paper value", [])
        cells = list(key)
        for m in multipliers:
            label = multiplier_label(m)
            ours = row.get(f"{label}x") if row.get("seeds") else None
            theirs = values.get(m)
            mine = "–" if ours is None or math.isnan(ours) else f"{ours:.1f}"
            cells.append(f"{mine} / {'–' if theirs is None else f'{theirs:.1f}'}")
        reason = "" if verdict in ("agrees", "not run", "no paper value") else section.explained.get(
            f"{key[0]}:{key[1]}", "to explain")
        rows.append(cells + [verdict, reason])
    return header, rows


SECTIONS_NOTE = (
    "One section per paper-table config in `configs/`, holding exactly the runs that config plans. Values are "
    "the task's metric in %. **Best of seeds**: the whole curve of the run with the largest AUC (ties: lower "
    "seed), the papers' convention of reporting the single best model. **Mean ± std**: over seeds (sample "
    "std). Each best-of-seeds value carries its 95% Wilson interval over the samples scored, in brackets. "
    "**Reach**: the largest multiplier scoring at least 90%. **AUC**: the area under the curve against "
    "log2(multiplier), normalised to [0, 1]. `lengthbench leaderboard --all` shows every run by protocol.")


def section_metric(part: pd.DataFrame, section: Section) -> str:
    """The metric of a section's values (``exact_match`` or ``token_accuracy``)."""
    from lengthbench.leaderboard import _task_metric

    return next((m for m in part.get("metric", pd.Series(dtype=object)).dropna()),
                _task_metric(section.cells[0].task) if section.cells else "exact_match")


def section_notes(part: pd.DataFrame, section: Section) -> list[str]:
    """The paragraphs under a section's title (Markdown inline text): its config and protocol, then the cells
    done and runs stored of those planned and the metric."""
    done, total = int(part["cells_done"].iloc[0]), int(part["cells_total"].iloc[0])
    runs_stored = int(part.groupby("selection_kind")["seeds"].sum().sum())
    metric = section_metric(part, section)
    return [f"`configs/{section.path.name}`: {protocol_line(section)}.",
            f"Cells done: {done} of {total}; runs stored: {runs_stored} of {len(section.expected())}. "
            f"Values: {METRIC_NAMES.get(metric, metric)} (%)."]


def section_tables(part: pd.DataFrame, section: Section) -> list[TextTable]:
    """A section's tables: the paper's values beside ours (where its config names a paper table), then per
    selection kind the best of seeds and the mean +- std."""
    tables = []
    paper = paper_values(section)
    if paper:
        header, rows = comparison_rows(part, section, paper)
        tables.append(TextTable(
            f"Ours beside the paper ({section.paper}, {section.table}): best of seeds at the paper's checkpoint "
            f"selection / the paper's value, %. **agrees**: within {TOLERANCE:g} points or the paper's value "
            "inside our 95% interval at every column; otherwise the reason, with its evidence.",
            header, rows, ["l", "l"] + ["r"] * (len(header) - 4) + ["l", "l"]))
    for kind in SELECTION_KINDS:
        table = part[part["selection_kind"] == kind].sort_values("row")
        if table.empty:
            continue
        multipliers = board_multipliers(table) if table["seeds"].max() > 0 else []
        header = ["attn", "pe"] + [f"{m}×" for m in multipliers]
        best_rows, mean_rows = [], []
        for _, row in table.iterrows():
            cells = [str(row["attn"]), str(row["pe"])]
            if row["seeds"] == 0:
                best_rows.append(cells + ["–"] * len(multipliers) + ["–", "–", "not run"])
                mean_rows.append(cells + ["–"] * len(multipliers) + ["–"])
                continue
            best_rows.append(cells + [interval_text(row, multiplier_label(m)) for m in multipliers]
                             + [_reach_text(row["reach"]), f"{row['auc']:.3f}",
                                f"{row['seeds']} (best: {int(row['best_seed'])})"])
            means = []
            for m in multipliers:
                mean, std = row[f"{m}x_mean"], row[f"{m}x_std"]
                means.append(_pct(mean) if math.isnan(std) else f"{mean:.1f} ± {std:.1f}")
            auc_text = (f"{row['auc_mean']:.3f}" if math.isnan(row["auc_std"])
                        else f"{row['auc_mean']:.3f} ± {row['auc_std']:.3f}")
            mean_rows.append(cells + means + [auc_text])
        align = ["l", "l"] + ["r"] * len(multipliers)
        tables += [TextTable(f"Best of seeds, {KIND_WORDS[kind]}:", header + ["reach", "AUC", "seeds"], best_rows,
                             align + ["r", "r", "r"]),
                   TextTable(f"Mean ± std over seeds, {KIND_WORDS[kind]}:", header + ["AUC"], mean_rows,
                             align + ["r"])]
    return tables


def sections_markdown(board: pd.DataFrame, sections: list[Section], *, source: str | None = None) -> str:
    """The published leaderboard as Markdown: per section its title, protocol, cells done and four tables."""
    parts = ["# lengthbench leaderboard", ""]
    if source:
        parts += [source, ""]
    parts += [SECTIONS_NOTE, ""]
    for section in sections:
        part = board[board["section"] == section.name] if not board.empty else board
        if part.empty:
            continue
        parts += [f"## {section.title}", ""]
        for note in section_notes(part, section):
            parts += [note, ""]
        for table in section_tables(part, section):
            parts += [table.caption, "", table.markdown(), ""]
    return "\n".join(parts).rstrip() + "\n"


def load_sections(paths: list[str | Path] | None = None) -> list[Section]:
    """The sections of ``paths`` (default: every paper-table config); a bad config is a one-line UsageError."""
    return [read_section(path) for path in (paths or table_configs())]


def section_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The store's rows with their scores (``with_score``), for :func:`build_sections`."""
    return with_score(frame)


PUBLISHED = CONFIGS.parent / "results" / "leaderboard.parquet"


def _cell_text(config: RunConfig) -> str:
    """``"mqrar:entmax(alpha=4):none"``: a run's cell as a sweep names it (parameters as JSON values)."""
    import json

    def part(name: str, params: dict) -> str:
        if not params:
            return name
        return name + "(" + ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(params.items())) + ")"

    return f"{config.task}:{part(config.attn, config.attn_params)}:{part(config.pe, config.pe_params)}"


def protocol_section(frame: pd.DataFrame, section: Section) -> Section:
    """The runs of ``frame`` (any store: a user's own mechanism too) trained at ``section``'s protocol: those whose
    run id is the one the section's config plans for their cell and seed (or the id of its other selection), as a
    section of their own (same title and settings, their cells)."""
    import json

    from lengthbench.errors import UsageError
    from lengthbench.plugins import check_loaded
    from lengthbench.sweep import configs_of_sweep

    cells, seen = [], set()
    runs = frame.drop_duplicates("run_id") if "config_json" in frame.columns else frame.iloc[:0]
    task = section.cells[0].task if section.cells else None
    for run_id, text, plugins in zip(runs["run_id"], runs.get("config_json", []),
                                     runs.get("plugins", pd.Series("", index=runs.index)).fillna(""), strict=True):
        try:
            config = RunConfig.from_dict(json.loads(text))
        except (TypeError, ValueError):
            continue
        if config.selected_from or config.init_from or config.rescored_from:
            continue
        if config.task == task:  # a run of this table's task whose mechanism is not loaded: say which plugin
            check_loaded(config, str(plugins).split(","), run_id)
        key = (_cell_text(config), config.seed)
        if key in seen:
            continue
        seen.add(key)
        try:
            planned = configs_of_sweep(section.settings, cells=key[0], seeds=str(config.seed))
        except UsageError:
            continue  # a cell this protocol cannot train (another task, a mechanism not loaded here)
        cells += [candidate for candidate in planned if not candidate.init_from]
    if cells:  # those with a run at the protocol (the rule of lengthbench.protocols)
        from lengthbench.protocols import runs_of_config

        matched = runs_of_config(frame, section.path, cells=cells).drop_duplicates("run_id")
        found = {(_cell_text(RunConfig.from_dict(json.loads(text))), int(seed))
                 for text, seed in zip(matched["config_json"], matched["seed"], strict=True)}
        cells = [cell for cell in cells if (_cell_text(cell), cell.seed) in found]
    return Section(section.path, section.title, cells, section.budget_fraction, section.settings)


def published_board(section: Section, path: Path = PUBLISHED) -> pd.DataFrame:
    """The committed leaderboard's rows of ``section`` (empty where there are none)."""
    try:
        board = pd.read_parquet(path)
    except (OSError, ValueError):
        return pd.DataFrame()
    return board[board["section"] == section.name] if "section" in board.columns else pd.DataFrame()


def beside_published(frame: pd.DataFrame, section: Section, published: pd.DataFrame | None = None) -> str:
    """Markdown: the runs of ``frame`` at ``section``'s protocol beside the published rows of that protocol and
    the paper's values, best of seeds at the paper's checkpoint selection, each value with its 95% interval."""
    mine = protocol_section(frame, section)
    published = published_board(section) if published is None else published
    parts = [f"## {section.title}", "", f"`configs/{section.path.name}`: {protocol_line(section)}.", ""]
    if not mine.cells:
        return "\n".join(parts + ["None of these runs was trained at this protocol: train a cell with "
                                   f"`lengthbench sweep --config configs/{section.path.name} --cells "
                                   "TASK:ATTN:PE --results DIR` (its run id is then the protocol's).", ""])
    board = build_sections(frame, [mine])
    ours = board[(board["selection_kind"] == "paper") & (board["seeds"] > 0)]
    if {"selection_kind", "seeds", "attn", "pe"} <= set(published.columns):
        theirs = published[(published["selection_kind"] == "paper") & (published["seeds"] > 0)]
    else:
        theirs = pd.DataFrame(columns=["attn", "pe", "seeds"])
    multipliers = board_multipliers(pd.concat([ours, theirs], ignore_index=True) if len(theirs) else ours)
    header = ["attn", "pe", "rows"] + [f"{multiplier_label(m)}×" for m in multipliers] + ["seeds"]
    rows = []
    paper = paper_values(section)
    for key in section.rows():
        values = paper.get(key)
        if values:
            rows.append([*key, "the paper"] + [_pct(values.get(m)) if m in values else "" for m in multipliers]
                        + [""])
        for _, row in theirs[(theirs["attn"] == key[0]) & (theirs["pe"] == key[1])].iterrows():
            rows.append([*key, "published"] + [interval_text(row, multiplier_label(m)) for m in multipliers]
                        + [str(row["seeds"])])
    for _, row in ours.sort_values("row").iterrows():
        rows.append([str(row["attn"]), str(row["pe"]), "yours"]
                    + [interval_text(row, multiplier_label(m)) for m in multipliers] + [str(row["seeds"])])
    parts += ["Best of seeds at the paper's checkpoint selection, % (95% interval):", "",
              _md_table(header, rows, ["l", "l", "l"] + ["r"] * (len(multipliers) + 1)), ""]
    return "\n".join(parts)
