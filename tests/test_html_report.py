"""``lengthbench report --html``: the page rendered by a real headless browser (Chromium's ``--dump-dom``: the DOM
after the page's scripts ran) shows the leaderboard's values, a curve per mechanism x encoding whose points are the
scores, and filters and legend toggles (read from the address's fragment) that hide what they should."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
import urllib.parse
from html.parser import HTMLParser

import pytest
from cli_helpers import cli

from lengthbench.leaderboard import wilson
from lengthbench.published import read_section
from lengthbench.store import CONTRACT_COLUMNS, write_run

COPY = """
# A Paper (Someone, 2025), Table 9, Copy:
paper = "Long-Context Generalization with Sparse Attention"
table = "Table 1"
cells = ["copy:softmax:rope", "copy:entmax:nape", "copy:sparsemax:none"]
seeds = [0]
preset = "smoke"
[overrides]
train_samples = 64
max_multiplier = 4
selection = "2x"
also_select = ["id"]
"""
REVERSE = """
# Another Paper (Someone, 2025), Table 2, Reverse:
cells = ["reverse:softmax:rope"]
seeds = [0]
preset = "smoke"
[overrides]
train_samples = 64
max_multiplier = 4
"""
CURVES = {("copy", "softmax", "rope"): [1.0, 0.5, 0.0], ("copy", "entmax", "nape"): [1.0, 1.0, 0.9],
          ("copy", "sparsemax", "none"): [1.0, 1.0, 0.9], ("reverse", "softmax", "rope"): [0.9, 0.3, 0.1]}
SAMPLES = 10


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


needs_chromium = pytest.mark.skipif(chromium() is None, reason="no chromium binary on the PATH: the page is checked "
                                    "in a real headless browser (apt-get install -y chromium; .ci/run installs it)")


def rows_of(config, scores):
    rows = []
    for multiplier, score in zip((1, 2, 4), scores, strict=True):
        row = dict.fromkeys(CONTRACT_COLUMNS)
        row.update(run_id=config.run_id, task=config.task, attn=config.attn, pe=config.pe, seed=config.seed,
                   preset=config.preset, train_length=64, eval_length=64 * multiplier, multiplier=multiplier,
                   metric="exact_match", score=score, exact_match=score, n_samples=SAMPLES,
                   selection=config.selection, config_json=config.to_json(), created_at="2026-12-06T00:00:00+00:00")
        rows.append(row)
    return rows


@pytest.fixture
def published(tmp_path):
    """Two paper-table configs (Copy with three cells, Reverse with one) and a store of their runs; two Copy
    curves are equal."""
    configs = []
    for name, text in (("a_paper_table9_copy.toml", COPY), ("another_table2_reverse.toml", REVERSE)):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        configs.append(path)
    store = tmp_path / "store"
    for path in configs:
        for config in read_section(path).cells:
            for run in (config, *config.selected_runs()):
                write_run(store, run.run_id, rows_of(run, CURVES[(config.task, config.attn, config.pe)]))
    return store, configs


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], ""

    def all(self, tag=None, **attrs):
        """Descendants with this tag and these attributes (``class_`` matches one class)."""
        found = []
        for child in self.children:
            wanted = {k.rstrip("_"): v for k, v in attrs.items()}
            classes = child.attrs.get("class", "").split()
            if (tag is None or child.tag == tag) and all(
                    (v in classes) if k == "class" else child.attrs.get(k) == v for k, v in wanted.items()):
                found.append(child)
            found += child.all(tag, **attrs)
        return found

    def one(self, tag=None, **attrs):
        (found,) = self.all(tag, **attrs)
        return found

    def content(self) -> str:
        return self.text + "".join(child.content() for child in self.children)

    def hidden(self) -> bool:
        """Hidden by the page's script: itself or an ancestor has ``hidden`` or ``display="none"``."""
        node = self
        while node is not None:
            if "hidden" in node.attrs or node.attrs.get("display") == "none":
                return True
            node = node.parent
        return False


class Tree(HTMLParser):
    VOID = {"meta", "input", "br", "link", "img", "hr", "col", "wbr"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#document", {})
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, [(k, v if v is not None else "") for k, v in attrs], self.node)
        self.node.children.append(node)
        if tag not in self.VOID:
            self.node = node

    def handle_startendtag(self, tag, attrs):
        self.node.children.append(Node(tag, [(k, v if v is not None else "") for k, v in attrs], self.node))

    def handle_endtag(self, tag):
        node = self.node
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.node = node.parent

    def handle_data(self, data):
        self.node.text += data


def render(page, tmp_path, fragment: str = "") -> Node:
    """The DOM of ``page`` after its scripts ran, in headless Chromium, opened at ``#fragment``."""
    url = page.as_uri() + (f"#{fragment}" if fragment else "")
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    root = Tree(done.stdout).root
    assert root.one("body").attrs.get("data-rendered") == "yes"  # the script ran to its end, no error on the way
    return root


def points(path: Node) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"[ML]([-\d.]+) ([-\d.]+)", path.attrs["d"])]


def shown(score: float) -> str:
    low, high = wilson(score, SAMPLES)
    return f"{100 * score:.1f} ({100 * low:.1f}–{100 * high:.1f})"


@needs_chromium
def test_the_page_shows_the_tables_and_a_curve_per_row(published, tmp_path, monkeypatch):
    store, configs = published
    out = tmp_path / "report"
    assert cli(monkeypatch, "report", "--html", out, "--results", store, *[a for c in configs for a in ("--config", c)]) == 0
    page = out / "index.html"
    text = page.read_text()
    # self-contained: nothing to fetch (the SVG namespace's name is a name, not a request)
    assert not re.search(r"<(link|img|iframe)\b|\b(src|href)=\"(https?:)?//|@import|url\(", text)
    dom = render(page, tmp_path)
    copy = dom.one("section", id="block-a_paper_table9_copy")
    assert copy.attrs["data-task"] == "copy" and copy.one("h2").content() == "A Paper (Someone, 2025), Table 9, Copy"
    best = copy.all("table")[1]  # after the paper's values beside ours: best of seeds, the paper's selection
    row = [tr for tr in best.all("tr") if tr.attrs.get("data-attn") == "softmax"][0]
    assert [td.content() for td in row.all("td")][:5] == ["softmax", "rope", shown(1.0), shown(0.5), shown(0.0)]
    assert "Ours beside the paper" in copy.all("p", class_="caption")[0].content()
    assert "| " not in copy.content()  # tables, not Markdown
    # the curves: y is the score on the chart's own axis, x the multiplier's tick (less the line's sideways offset)
    svg = copy.one("div", class_="plot").one("svg")
    y0, y100 = (float(svg.one("line", class_="grid", **{"data-value": v}).attrs["y1"]) for v in ("0", "100"))
    ticks = {float(t.attrs["data-multiplier"]): float(t.attrs["x1"]) for t in svg.all("line", class_="grid")
             if "data-multiplier" in t.attrs}
    assert sorted(ticks) == [1.0, 2.0, 4.0] and ticks[2.0] - ticks[1.0] == pytest.approx(ticks[4.0] - ticks[2.0])
    lines = {(g.attrs["data-attn"], g.attrs["data-pe"]): g for g in svg.all("g", class_="line")}
    assert set(lines) == {("softmax", "rope"), ("entmax", "nape"), ("sparsemax", "none")}
    offsets, strokes, dashes = set(), set(), set()
    for (attn, pe), group in lines.items():
        curve = group.one("path", class_="curve")
        dx = float(curve.attrs["data-dx"])
        offsets.add(dx)
        strokes.add(curve.attrs["stroke"])
        dashes.add(curve.attrs.get("stroke-dasharray"))
        xy = points(curve)
        assert [x - dx for x, _ in xy] == pytest.approx([ticks[1.0], ticks[2.0], ticks[4.0]], abs=0.02)
        assert [100 * (y0 - y) / (y0 - y100) for _, y in xy] == pytest.approx(
            [100 * s for s in CURVES[("copy", attn, pe)]], abs=0.05)
        assert len(group.all(class_="marker")) == 3  # a marker per point, its value in a tooltip
    assert len(offsets) == 3 and len(strokes) == 3 and len(dashes) == 3  # the two equal curves stay apart
    tips = [m.one("title").content() for m in lines[("softmax", "rope")].all(class_="marker")]
    assert tips[1] == f"softmax + rope, 2×: {shown(0.5)}"
    legend = copy.one("ul", class_="legend")
    assert [b.content() for b in legend.all("button")] == ["softmax + rope", "entmax + nape", "sparsemax + none"]
    assert not any(node.hidden() for node in (copy, row, *lines.values()))
    reverse = dom.one("section", id="block-another_table2_reverse")
    assert not reverse.hidden() and len(reverse.one("div", class_="plot").one("svg").all("g", class_="line")) == 1
    assert dom.one("p", id="shown").content().startswith("Showing 2 of 2 blocks")


@needs_chromium
def test_filters_and_legend_toggles_hide_rows_and_curves(published, tmp_path, monkeypatch):
    store, configs = published
    out = tmp_path / "report"
    assert cli(monkeypatch, "report", "--html", out, "--results", store, "--config", configs[0],
               "--config", configs[1]) == 0
    off = urllib.parse.quote("a_paper_table9_copy|entmax|nape")
    dom = render(out / "index.html", tmp_path, f"task=copy&pe=rope,nape&off={off}")
    assert dom.one("section", id="block-another_table2_reverse").hidden()  # another task
    copy = dom.one("section", id="block-a_paper_table9_copy")
    assert not copy.hidden()
    rows = [tr for tr in copy.all("tr") if "data-pe" in tr.attrs]
    assert rows and {tr.attrs["data-pe"] for tr in rows if not tr.hidden()} == {"rope", "nape"}
    assert all(tr.hidden() for tr in rows if tr.attrs["data-pe"] == "none")
    lines = {g.attrs["data-key"]: g for g in copy.all("g", class_="line")}
    assert not lines["a_paper_table9_copy|softmax|rope"].hidden()
    assert lines["a_paper_table9_copy|entmax|nape"].hidden()  # toggled off in its legend
    assert lines["a_paper_table9_copy|sparsemax|none"].hidden()  # its encoding is filtered out
    toggled = copy.one("button", **{"data-key": "a_paper_table9_copy|entmax|nape"})
    assert "off" in toggled.attrs["class"].split() and toggled.attrs["aria-pressed"] == "false"
    assert dom.one("p", id="shown").content().startswith("Showing 1 of 2 blocks")


@needs_chromium
def test_clicks_on_the_legend_and_the_filters_hide_and_write_the_fragment(published, tmp_path, monkeypatch):
    store, configs = published
    out = tmp_path / "report"
    assert cli(monkeypatch, "report", "--html", out, "--results", store, "--config", configs[0],
               "--config", configs[1]) == 0
    # a variant of the page that clicks as a reader would, once the page's own script has run
    clicks = """<script>
    document.querySelector('button.legend-entry[data-key="a_paper_table9_copy|softmax|rope"]').click();
    document.querySelector('#filters input[name="task"][value="reverse"]').click();
    document.body.dataset.fragment = decodeURIComponent(location.hash);
    </script></body>"""
    variant = out / "clicked.html"
    variant.write_text((out / "index.html").read_text().replace("</body>", clicks))
    dom = render(variant, tmp_path)
    assert dom.one("body").attrs["data-fragment"] == "#task=copy&off=a_paper_table9_copy|softmax|rope"
    assert dom.one("section", id="block-another_table2_reverse").hidden()
    lines = {g.attrs["data-key"]: g for g in dom.all("g", class_="line")}
    assert lines["a_paper_table9_copy|softmax|rope"].hidden() and not lines["a_paper_table9_copy|entmax|nape"].hidden()


def test_every_run_by_protocol_with_all(published, tmp_path, monkeypatch):
    store, _ = published
    out = tmp_path / "all"
    assert cli(monkeypatch, "report", "--html", out, "--results", store, "--all") == 0
    text = (out / "index.html").read_text()
    # a block per task and protocol: Copy's runs at the 2x selection, its runs kept in distribution, Reverse's
    assert re.findall(r'<section class="block" id="block-([^"]+)"', text) == ["copy-1", "copy-2", "reverse-1"]
    assert f"<td class=\"num\">{shown(0.3)}</td>" in text and 'data-task="reverse"' in text


@pytest.mark.parametrize("args, message", [
    (["--html", "{file}"], "is a file, not a folder"),
    (["--html", "{out}", "--results", "{empty}"], "the store is empty"),
    (["--html", "{out}", "--results", "{missing}"], "does not exist"),
    (["--html", "{out}", "--config", "{missing}.toml"], "no such file"),
    (["--html", "{out}", "--all", "--config", "{file}"], "give --config or --all, not both"),
    (["--results", "{empty}"], "--html"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    (tmp_path / "a_file").write_text("kept")
    names = {"file": tmp_path / "a_file", "out": tmp_path / "out", "empty": tmp_path / "empty",
             "missing": tmp_path / "missing"}
    assert cli(monkeypatch, "report", *[a.format(**names) for a in args]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1 and "Traceback" not in error
    assert (tmp_path / "a_file").read_text() == "kept" and not (tmp_path / "out").exists()
