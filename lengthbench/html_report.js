// lengthbench report --html: draws the curves (inline SVG) and applies the filters and legend toggles.
// The view lives in the address's fragment, #task=a,b&pe=c&attn=d&off=CHART|ATTN|PE, so a link reopens it.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const SVG_NS = "http://www.w3.org/2000/svg"; // the SVG namespace's name; nothing is fetched
  // Saturated, distinguishable colours (no pale ones), one per mechanism across every chart.
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#393b79", "#637939", "#b8860b", "#843c39", "#7b4173", "#000000", "#5f9ea0"];
  // A line style and a marker per encoding, across every chart.
  const DASHES = ["", "8 4", "2 3", "10 3 2 3", "5 2", "1 4"];
  const MARKERS = ["circle", "square", "triangle", "diamond", "down", "cross"];
  const DIMENSIONS = ["task", "pe", "attn"];
  const W = 640, H = 330, LEFT = 56, RIGHT = 14, TOP = 12, BOTTOM = 52;
  const REACH = 90;

  const colourOf = new Map(data.attns.map((a, i) => [a, COLOURS[i % COLOURS.length]]));
  const styleOf = new Map(data.pes.map((p, i) => [p, {dash: DASHES[i % DASHES.length],
    marker: MARKERS[i % MARKERS.length]}]));
  const base = (label) => String(label).split(" (")[0];
  const lineKey = (chart, line) => chart + "|" + line.attn + "|" + line.pe;

  function el(name, attributes, parent) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, String(value));
    if (parent) parent.appendChild(node);
    return node;
  }

  const fmt = (v) => (Math.round(v * 10) / 10).toFixed(1);

  function marker(shape, x, y, r, colour, parent) {
    const common = {class: "marker", fill: colour};
    switch (shape) {
      case "square":
        return el("rect", {...common, x: x - r * 0.85, y: y - r * 0.85, width: 1.7 * r, height: 1.7 * r}, parent);
      case "triangle":
        return el("path", {...common, d: `M${x} ${y - 1.15 * r}L${x + r} ${y + 0.7 * r}L${x - r} ${y + 0.7 * r}Z`},
          parent);
      case "down":
        return el("path", {...common, d: `M${x} ${y + 1.15 * r}L${x + r} ${y - 0.7 * r}L${x - r} ${y - 0.7 * r}Z`},
          parent);
      case "diamond":
        return el("path", {...common, d: `M${x} ${y - 1.2 * r}L${x + r} ${y}L${x} ${y + 1.2 * r}L${x - r} ${y}Z`},
          parent);
      case "cross":
        return el("path", {...common, stroke: colour, "stroke-width": 2.2,
          d: `M${x - r} ${y - r}L${x + r} ${y + r}M${x - r} ${y + r}L${x + r} ${y - r}`}, parent);
      default:
        return el("circle", {...common, cx: x, cy: y, r: r}, parent);
    }
  }

  function swatch(line) {
    const svg = el("svg", {width: 34, height: 14, viewBox: "0 0 34 14", "aria-hidden": "true"});
    const colour = colourOf.get(line.attn), style = styleOf.get(line.pe);
    el("line", {x1: 1, y1: 7, x2: 33, y2: 7, stroke: colour, "stroke-width": 2, "stroke-dasharray": style.dash}, svg);
    marker(style.marker, 17, 7, 4, colour, svg);
    return svg;
  }

  function drawChart(chart, figure) {
    const logs = chart.ticks.map(([m]) => Math.log2(m));
    const lo = Math.min(...logs), hi = Math.max(...logs);
    const width = W - LEFT - RIGHT, height = H - TOP - BOTTOM;
    const x = (m) => (hi > lo ? LEFT + 12 + (Math.log2(m) - lo) / (hi - lo) * (width - 24) : LEFT + width / 2);
    const y = (v) => TOP + (100 - v) / 100 * height;
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, role: "img",
      "aria-label": `${chart.metric} (%) against length, ${chart.lines.length} lines`});
    for (const v of [0, 20, 40, 60, 80, REACH, 100]) {
      el("line", {class: v === REACH ? "grid reach" : "grid", "data-value": v, x1: LEFT, x2: W - RIGHT, y1: y(v),
        y2: y(v)}, svg);
      el("text", {x: LEFT - 6, y: y(v) + 4, "text-anchor": "end", "data-value": v}, svg).textContent =
        v === REACH ? "90 reach" : String(v);
    }
    for (const [m, label] of chart.ticks) {
      el("line", {class: "grid", "data-multiplier": m, x1: x(m), x2: x(m), y1: TOP, y2: TOP + height}, svg);
      el("text", {x: x(m), y: TOP + height + 15, "text-anchor": "middle", "data-multiplier": m}, svg).textContent =
        label + "×";
      el("text", {x: x(m), y: TOP + height + 28, "text-anchor": "middle"}, svg).textContent =
        String(Math.round(m * chart.train_length));
    }
    el("line", {class: "frame", x1: LEFT, x2: W - RIGHT, y1: TOP + height, y2: TOP + height}, svg);
    el("text", {class: "axis-title", x: LEFT + width / 2, y: H - 6, "text-anchor": "middle"}, svg).textContent =
      `length: multiplier of n = ${chart.train_length} (top), tokens (bottom), log2 scale`;
    el("text", {class: "axis-title", x: 14, y: TOP + height / 2, "text-anchor": "middle",
      transform: `rotate(-90 14 ${TOP + height / 2})`}, svg).textContent = `${chart.metric} (%)`;
    // Lines a few pixels apart sideways, so that equal curves (say, several at 100%) all stay in sight.
    const n = chart.lines.length;
    const step = n > 1 ? Math.min(4, 28 / (n - 1)) : 0;
    const radius = n > 8 ? 3.2 : 4;
    const legend = figure.querySelector(".legend");
    chart.lines.forEach((line, i) => {
      const colour = colourOf.get(line.attn), style = styleOf.get(line.pe);
      const dx = (i - (n - 1) / 2) * step;
      const key = lineKey(chart.id, line);
      const group = el("g", {class: "line", "data-key": key, "data-attn": line.attn, "data-pe": line.pe}, svg);
      let d = "", pen = "M", whiskers = "";
      for (const [m, v, low, high] of line.points) {
        if (v === null) { pen = "M"; continue; }
        d += `${pen}${(x(m) + dx).toFixed(2)} ${y(v).toFixed(2)}`;
        pen = "L";
        if (low !== null && high !== null) whiskers += `M${(x(m) + dx).toFixed(2)} ${y(high).toFixed(2)}V${y(low).toFixed(2)}`;
      }
      if (whiskers) el("path", {class: "interval", d: whiskers, stroke: colour}, group);
      el("path", {class: "curve", d: d, stroke: colour, "stroke-dasharray": style.dash, "data-dx": dx.toFixed(2)},
        group);
      for (const [m, v, low, high] of line.points) {
        if (v === null) continue;
        const shape = marker(style.marker, x(m) + dx, y(v), radius, colour, group);
        const interval = low !== null && high !== null ? ` (${fmt(low)}–${fmt(high)})` : "";
        el("title", {}, shape).textContent = `${line.attn} + ${line.pe}, ${chart.ticks.find((t) => t[0] === m)[1]}×: ` +
          `${fmt(v)}${interval}`;
      }
      const item = document.createElement("li");
      item.dataset.attn = line.attn;
      item.dataset.pe = line.pe;
      const button = document.createElement("button");
      button.type = "button";
      button.className = "legend-entry";
      button.dataset.key = key;
      button.setAttribute("aria-pressed", "true");
      button.title = "hide or show this line";
      button.append(swatch(line), document.createTextNode(`${line.attn} + ${line.pe}`));
      button.addEventListener("click", () => {
        if (state.off.has(key)) state.off.delete(key); else state.off.add(key);
        apply(true);
      });
      item.appendChild(button);
      legend.appendChild(item);
    });
    figure.querySelector(".plot").appendChild(svg);
  }

  // -- the view: filters and hidden lines, read from and written to the fragment --------------------------------
  const state = {task: null, pe: null, attn: null, off: new Set()};

  function readFragment() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    for (const dimension of DIMENSIONS) {
      const value = params.get(dimension);
      state[dimension] = value === null ? null : new Set(value.split(",").map((s) => s.trim()).filter(Boolean));
    }
    state.off = new Set(params.getAll("off"));
  }

  function writeFragment() {
    const params = new URLSearchParams();
    for (const dimension of DIMENSIONS) {
      if (state[dimension] !== null) params.set(dimension, [...state[dimension]].join(","));
    }
    for (const key of [...state.off].sort()) params.append("off", key);
    const text = params.toString();
    history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
  }

  const shown = (dimension, name) => state[dimension] === null || state[dimension].has(name);
  const rowShown = (node) => shown("pe", base(node.dataset.pe)) && shown("attn", base(node.dataset.attn));

  function buildFilters() {
    const form = document.getElementById("filters");
    const words = {task: "task", pe: "encoding", attn: "mechanism"};
    for (const dimension of DIMENSIONS) {
      const names = data.filters[dimension];
      if (!names.length) continue;
      const fieldset = document.createElement("fieldset");
      fieldset.dataset.filter = dimension;
      const legend = document.createElement("legend");
      legend.textContent = words[dimension];
      fieldset.appendChild(legend);
      for (const name of names) {
        const label = document.createElement("label");
        const box = document.createElement("input");
        box.type = "checkbox";
        box.name = dimension;
        box.value = name;
        box.addEventListener("change", () => {
          const chosen = new Set([...form.querySelectorAll(`input[name="${dimension}"]:checked`)].map((b) => b.value));
          state[dimension] = chosen.size === names.length ? null : chosen;
          apply(true);
        });
        label.append(box, document.createTextNode(" " + name));
        fieldset.appendChild(label);
      }
      for (const [text, all] of [["all", true], ["none", false]]) {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = text;
        button.addEventListener("click", () => { state[dimension] = all ? null : new Set(); apply(true); });
        fieldset.appendChild(button);
      }
      form.appendChild(fieldset);
    }
  }

  function apply(write) {
    for (const box of document.querySelectorAll("#filters input[type=checkbox]")) {
      box.checked = shown(box.name, box.value);
    }
    let blocks = 0;
    for (const block of document.querySelectorAll("section.block")) {
      block.hidden = !shown("task", block.dataset.task);
      blocks += block.hidden ? 0 : 1;
    }
    for (const item of document.querySelectorAll(".contents li")) item.hidden = !shown("task", item.dataset.task);
    let rows = 0, total = 0;
    for (const row of document.querySelectorAll("tr[data-pe], tr[data-attn]")) {
      row.hidden = !rowShown(row);
      total += 1;
      rows += row.hidden || row.closest("section.block").hidden ? 0 : 1;
    }
    for (const item of document.querySelectorAll(".legend li")) item.hidden = !rowShown(item);
    for (const group of document.querySelectorAll("g.line")) {
      const visible = rowShown(group) && !state.off.has(group.dataset.key);
      if (visible) group.removeAttribute("display"); else group.setAttribute("display", "none");
    }
    for (const button of document.querySelectorAll("button.legend-entry")) {
      const off = state.off.has(button.dataset.key);
      button.classList.toggle("off", off);
      button.setAttribute("aria-pressed", off ? "false" : "true");
    }
    const sections = document.querySelectorAll("section.block").length;
    document.getElementById("shown").textContent =
      `Showing ${blocks} of ${sections} blocks and ${rows} of ${total} table rows.`;
    if (write) writeFragment();
  }

  const figures = new Map([...document.querySelectorAll("figure.curves")].map((f) => [f.dataset.chart, f]));
  for (const chart of data.charts) {
    if (figures.has(chart.id)) drawChart(chart, figures.get(chart.id));
  }
  buildFilters();
  // The contents scroll to a block without replacing the fragment that holds the view.
  for (const link of document.querySelectorAll(".contents a")) {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      document.getElementById("block-" + link.dataset.block).scrollIntoView();
    });
  }
  window.addEventListener("hashchange", () => { readFragment(); apply(false); });
  readFragment();
  apply(false);
  document.body.dataset.rendered = "yes";
})();
