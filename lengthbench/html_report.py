"""The leaderboard as one self-contained web page: ``lengthbench report --html DIR`` writes ``DIR/index.html``.

The page needs no network: its CSS and JavaScript are inline (``html_report.css`` and ``html_report.js`` beside
this module), its data is embedded as JSON, and it uses the system's fonts. It holds

* the leaderboard's tables, the same cells as the Markdown (:class:`lengthbench.leaderboard.TextTable`): by
  default a block per paper-table section (the paper's values beside ours, then per checkpoint selection the best
  of seeds with 95% Wilson intervals and the mean +- std), with ``--all`` a block per task and protocol;
* per block, the extrapolation curves of its best-of-seeds rows (at the paper's checkpoint selection for a
  section): score against log2(multiplier), drawn as inline SVG by the page's own script, a colour per
  mechanism, a line style and marker per encoding, whiskers for the 95% interval, lines set a few pixels apart
  sideways so that equal curves stay visible; a legend entry hides or shows its line;
* filters by task, encoding and mechanism that hide blocks, table rows, curves and legend entries.

The view is kept in the address's fragment (``index.html#task=copy&pe=rope&off=CHART|ATTN|PE``), so a link
opens the page as it was left: ``task``, ``pe`` and ``attn`` list what is shown (comma-separated names; absent:
all), each ``off`` a line hidden from its chart.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd

from lengthbench.leaderboard import (
    ALL_NOTE,
    METRIC_NAMES,
    TABLE_KEYS,
    TextTable,
    board_multipliers,
    protocol_note,
    protocol_tables,
)
from lengthbench.store import atomic_write_text
from lengthbench.tasks import multiplier_label

PAGE = "index.html"


@dataclass
class Block:
    """One block of the page: a paper-table section, or (``--all``) one task's table of one protocol."""

    id: str  # unique in the page, the chart's name in the fragment's ``off``
    task: str
    title: str
    notes: list[str]  # paragraphs, Markdown inline text
    tables: list[TextTable]
    chart: dict | None  # the curves (``chart_data``), None where no row has a run
    chart_caption: str = ""


def base_name(label: str) -> str:
    """``"entmax (alpha=4)"`` -> ``"entmax"``: a mechanism or encoding without its parameters, as filters name it."""
    return str(label).split(" (")[0]


def _number(value) -> float | None:
    """A JSON number, or None for a missing value (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else round(value, 4)


def chart_data(rows: pd.DataFrame, chart_id: str, train_length: int, metric: str) -> dict | None:
    """A chart's curves: per row with a run (``attn``, ``pe``, in ``rows``' order) its best-of-seeds points
    ``[multiplier, value %, low %, high %]``; None where no row has one."""
    rows = rows[rows["seeds"] > 0] if "seeds" in rows.columns else rows
    if rows.empty:
        return None
    multipliers = board_multipliers(rows)
    lines = []
    for _, row in rows.iterrows():
        points = []
        for m in board_multipliers(row.to_frame().T):
            label = multiplier_label(m)
            points.append([float(m), _number(row[f"{label}x"]), _number(row.get(f"{label}x_lo")),
                           _number(row.get(f"{label}x_hi"))])
        lines.append({"attn": str(row["attn"]), "pe": str(row["pe"]), "seeds": int(row["seeds"]), "points": points})
    return {"id": chart_id, "train_length": int(train_length), "metric": METRIC_NAMES.get(metric, metric),
            "ticks": [[float(m), multiplier_label(m)] for m in multipliers], "lines": lines}


def section_blocks(board: pd.DataFrame, sections) -> list[Block]:
    """A block per paper-table section that has rows in ``board`` (``lengthbench.published.build_sections``)."""
    from lengthbench.published import KIND_WORDS, section_metric, section_notes, section_tables

    blocks = []
    for section in sections:
        part = board[board["section"] == section.name] if not board.empty else board
        if part.empty:
            continue
        ours = part[part["selection_kind"] == "paper"].sort_values("row")
        train_length = section.cells[0].train_length if section.cells else 64
        blocks.append(Block(section.name, str(part["task"].iloc[0]), section.title, section_notes(part, section),
                            section_tables(part, section),
                            chart_data(ours, section.name, train_length, section_metric(part, section)),
                            f"Best of seeds, {KIND_WORDS['paper']}"))
    return blocks


def protocol_blocks(board: pd.DataFrame) -> list[Block]:
    """A block per table of ``lengthbench.leaderboard.build_leaderboard`` (task, preset, protocol, n)."""
    blocks, counts = [], {}
    for (task, *_), table in board.groupby(TABLE_KEYS, sort=True):
        counts[task] = counts.get(task, 0) + 1
        chart_id = f"{task}-{counts[task]}"
        table = table.sort_values(["pe", "attn"])
        preset, protocol, train_length = (table[key].iloc[0] for key in TABLE_KEYS[1:])
        title = f"{task}: preset {preset}" + (f", {protocol}" if protocol else "") + f", n = {train_length}"
        blocks.append(Block(chart_id, str(task), title, [protocol_note(table)], protocol_tables(table),
                            chart_data(table, chart_id, int(train_length), str(table["metric"].iloc[0])),
                            "Best of seeds"))
    return blocks


def inline(text: str) -> str:
    """Markdown inline text (``**bold**``, `` `code` ``) as HTML, everything else escaped."""
    text = html.escape(str(text), quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _attribute(value: str) -> str:
    return html.escape(str(value), quote=True)


def table_html(table: TextTable) -> str:
    """A table with its caption; a row names its mechanism and encoding (``data-attn``, ``data-pe``) where the
    table has those columns, for the filters."""
    columns = {name: number for number, name in enumerate(table.header)}
    classes = ["num" if a == "r" else "" for a in table.align]
    head = "".join(f'<th scope="col" class="{c}">{inline(h)}</th>' if c else f'<th scope="col">{inline(h)}</th>'
                   for h, c in zip(table.header, classes, strict=True))
    body = []
    for row in table.rows:
        names = "".join(f' data-{key}="{_attribute(row[columns[key]])}"' for key in ("attn", "pe") if key in columns)
        cells = "".join(f'<td class="{c}">{inline(v)}</td>' if c else f"<td>{inline(v)}</td>"
                        for v, c in zip(row, classes, strict=True))
        body.append(f"<tr{names}>{cells}</tr>")
    caption = "caption" if len(table.caption) <= 80 else "caption long"  # a paragraph, not a heading
    return (f'<div class="table"><p class="{caption}">{inline(table.caption)}</p><div class="scroll"><table>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div></div>")


def block_html(block: Block) -> str:
    parts = [f'<section class="block" id="block-{_attribute(block.id)}" data-task="{_attribute(block.task)}">',
             f"<h2>{inline(block.title)}</h2>"]
    parts += [f"<p>{inline(note)}</p>" for note in block.notes]
    if block.chart is None:
        parts.append('<p class="empty">No run of this block has a curve yet.</p>')
    else:
        parts.append(f'<figure class="curves" data-chart="{_attribute(block.id)}"><figcaption>'
                     f"{inline(block.chart_caption)}: {inline(block.chart['metric'])} (%) against length, log2 "
                     "axis; whiskers: 95% interval. Click a legend entry to hide or show its line."
                     '</figcaption><div class="plot"></div><ul class="legend"></ul></figure>')
    parts += [table_html(table) for table in block.tables]
    parts.append("</section>")
    return "\n".join(parts)


def _asset(name: str) -> str:
    return resources.files("lengthbench").joinpath(name).read_text(encoding="utf-8")


def page_data(blocks: list[Block]) -> dict:
    """What the page's script reads: the charts, every mechanism and encoding (their order fixes colours and
    styles across charts), and the names each filter offers."""
    charts = [block.chart | {"task": block.task} for block in blocks if block.chart is not None]
    attns, pes = set(), set()
    for block in blocks:
        for table in block.tables:
            columns = {name: number for number, name in enumerate(table.header)}
            for row in table.rows:
                attns.update([row[columns["attn"]]] if "attn" in columns else [])
                pes.update([row[columns["pe"]]] if "pe" in columns else [])
    return {"charts": charts, "attns": sorted(attns), "pes": sorted(pes),
            "filters": {"task": sorted({block.task for block in blocks}),
                        "pe": sorted({base_name(p) for p in pes}), "attn": sorted({base_name(a) for a in attns})}}


def _script_json(value) -> str:
    """JSON that can sit inside a ``<script>`` element: no ``<``, ``>`` or ``&`` that HTML would read."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(blocks: list[Block], *, intro: str, source: str, title: str = "lengthbench leaderboard") -> str:
    """The whole page as text (no timestamps: the same board gives the same bytes)."""
    contents = "".join(f'<li data-task="{_attribute(b.task)}"><a href="#block-{_attribute(b.id)}" '
                       f'data-block="{_attribute(b.id)}">{inline(b.title)}</a></li>' for b in blocks)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>\n{_asset('html_report.css')}</style>",
        "</head>",
        "<body>",
        f"<header><h1>{html.escape(title)}</h1><p>{inline(source)}</p><p>{inline(intro)}</p></header>",
        '<form class="filters" id="filters" aria-label="filters"></form>',
        f'<p class="shown" id="shown"></p><nav aria-label="contents"><ol class="contents">{contents}</ol></nav>',
        "<main>",
        *[block_html(block) for block in blocks],
        "</main>",
        f'<script type="application/json" id="report-data">{_script_json(page_data(blocks))}</script>',
        f"<script>\n{_asset('html_report.js')}</script>",
        "</body>",
        "</html>",
        "",
    ])


def sections_page(board: pd.DataFrame, sections, *, source: str) -> str:
    from lengthbench.published import SECTIONS_NOTE

    return render_page(section_blocks(board, sections), intro=SECTIONS_NOTE, source=source)


def protocols_page(board: pd.DataFrame, *, source: str) -> str:
    return render_page(protocol_blocks(board), intro=ALL_NOTE, source=source)


def write_page(folder: str | Path, text: str) -> Path:
    """``folder/index.html``, written atomically (the folder is created where missing), readable as the umask
    allows (a web server serves it)."""
    path = Path(folder) / PAGE
    atomic_write_text(path, text)
    return path

