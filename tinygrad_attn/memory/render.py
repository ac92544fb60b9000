"""What a Profile shows: the text report, the timeline as a PNG (matplotlib) or as HTML.

Each function reads the plain data the ledger computed (`Profile.summary()`'s dict and
`Profile.timeline()`), so the pictures and the report cannot disagree with the numbers.
"""

from __future__ import annotations

from .counters import CATEGORIES, fmt_bytes

_COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optimizer_state": "#8172b3",
           "saved": "#c44e52", "activation": "#55a868", "temporary": "#937860",
           "bucket": "#da8bc3"}


# ----------------------------------------------------------------------------- text report
def report(s: dict, top: int = 10) -> str:
    """The summary `s` as text, section by section."""
    sections = [_headline(s), _by_category(s["peak"]), _saved(s["saved_peak"], top),
                _copies(s["copies"], top), _fanout(s["fanout"], top),
                _holders(s["peak"]["holders"], top), _backward_peak(s["backward_peak"], top)]
    return "\n\n".join(lines for lines in sections if lines)


def _headline(s: dict) -> str:
    pk = s["peak"]
    lines = [f"Memory profile on {s['device']}: {s['n_events']} events"]
    where = f"{pk['op'] or '-'} (phase {pk['phase'] or '-'}"
    where += f", scope {pk['scope']})" if pk["scope"] else ")"
    lines.append(f"  peak live (tensors)   {fmt_bytes(pk['bytes']):>12}  at event "
                 f"{pk['t']}: {where}")
    lines.append(f"  live at start         {fmt_bytes(s['baseline_bytes']):>12}   "
                 f"at end {fmt_bytes(s['end_bytes'])}")
    lines.append(f"  peak above start      {fmt_bytes(s['tensor_peak_above_start']):>12}"
                 " (tensor-level)")
    if s["raw_peak_bytes"] is not None:
        how = "tracemalloc" if s["device"] == "cpu" else "CuPy pool hook"
        lines.append(f"  raw peak above start  {fmt_bytes(s['raw_peak_bytes']):>12}"
                     f" ({how}: includes temporaries inside ops)")
    else:
        lines.append("  raw peak              not measured (profile(raw=True) adds it)")
    if s["reserved_end_bytes"] is not None:
        what = ("process malloc heap" if s["device"] == "cpu" else "CuPy memory pool")
        lines.append(f"  reserved              {fmt_bytes(s['reserved_end_bytes']):>12}"
                     f" at end, {fmt_bytes(s['reserved_start_bytes'])} at start ({what}:"
                     " live + cached)")
    return "\n".join(lines)


def _by_category(pk: dict) -> str:
    lines = ["Bytes at peak by category:"]
    for c, b in sorted(pk["by_category"].items(), key=lambda x: -x[1]):
        if b:
            lines.append(f"  {c:<16}{fmt_bytes(b):>12}  {100 * b / max(pk['bytes'], 1):5.1f}%")
    return "\n".join(lines)


def _saved(sv: dict, top: int) -> str:
    lines = [f"Saved for backward at its peak (event {sv['t']}): "
             f"{fmt_bytes(sv['unique_bytes'])} unique "
             f"({fmt_bytes(sv['unique_bytes_without_parameters'])} without the "
             "parameters nodes keep), "
             f"{fmt_bytes(sv['nominal_bytes'])} nominal (views of one storage count "
             "once in 'unique')"]
    tables = [("by op", sv["by_op"]), ("by module", sv["by_module"])]
    second = sv.get("graph_of_gradient") or {}
    if second.get("nodes"):
        lines.append(f"  of which the gradient's graph (recorded by a create_graph backward): "
                     f"{fmt_bytes(second['unique_bytes'])} unique in {second['nodes']} nodes")
        tables += [("gradient's graph by op", second["by_op"]),
                   ("gradient's graph by module", second["by_module"])]
    for title, table in tables:
        lines.append(f"  {title}:")
        rows = sorted(table.items(), key=lambda kv: -kv[1]["unique_bytes"])[:top]
        for key, row in rows:
            lines.append(f"    {key:<34}{fmt_bytes(row['unique_bytes']):>12} unique "
                         f"{fmt_bytes(row['nominal_bytes']):>12} nominal  "
                         f"({row['nodes']} nodes)")
    return "\n".join(lines)


def _copies(copies: list, top: int) -> str:
    lines = [f"Copies (pure data movement): {len(copies)}, "
             f"{fmt_bytes(sum(c['bytes'] for c in copies))}"]
    for c in sorted(copies, key=lambda c: -c["bytes"])[:top]:
        src = f" at {c['source']}" if c["source"] else ""
        src += f" via {c['via']}" if c.get("via") else ""
        scope_ = f" in {c['scope']}" if c["scope"] else ""
        lines.append(f"  {c['reason']:<15}{fmt_bytes(c['bytes']):>12}  {c['op']} "
                     f"{c['dtype']}{c['shape']} ({c['phase']}){scope_}{src}")
    return "\n".join(lines)


def _fanout(fanout: list, top: int) -> str:
    if not fanout:
        return ""
    lines = ["Gradient fan-in (tensors with several consumers):"]
    for f in fanout[:top]:
        lines.append(f"  {f['node']:<24} {f['scope'] or '(top level)':<28} "
                     f"{f['partials']} partial grads, {f['in_place']} summed in place, "
                     f"{f['new_buffer']} new buffer(s), {fmt_bytes(f['bytes'])} each")
    return "\n".join(lines)


def _holders(holders: list, top: int) -> str:
    lines = ["Top holders at peak:"]
    for h in holders[:top]:
        lines.append(f"  {fmt_bytes(h['bytes']):>12}  {h['category']:<16} {h['what']}")
    return "\n".join(lines)


def _backward_peak(bp: dict | None, top: int) -> str:
    if bp is None:
        return ""
    lines = [f"Backward peak: {fmt_bytes(bp['bytes'])} at event {bp['t']} "
             f"({bp['op']}); what was live, by the forward op it belongs to:"]
    for h in bp["holders"][:top]:
        lines.append(f"  {fmt_bytes(h['bytes']):>12}  {h['category']:<16} {_why(h)}")
    return "\n".join(lines)


def _why(h: dict) -> str:
    """Why a holder at the backward peak is live: who saved it, or whose backward made it."""
    if h["category"] == "saved" and h.get("held_by"):
        n = h["held_by"][0]
        why = f"saved by {n['forward_op']}" + (f" in {n['scope']}" if n["scope"] else "")
        return why + (f" ({n['source']})" if n.get("source") else "")
    if h.get("for_forward_op"):
        why = f"made by the backward of {h['for_forward_op']}"
    else:
        why = f"{h['category']} from {h['op'] or 'a factory'}"
    return why + (f" in {h['scope']}" if h["scope"] else "")


# ----------------------------------------------------------------------------- pictures
def _phase_changes(phases):
    out, prev = [], None
    for i, p in enumerate(phases):
        if p != prev:
            out.append((i, p))
            prev = p
    return out


def plot_png(tl: dict, pk: dict, path: str, title: str) -> str:
    """The timeline `tl` as a stacked PNG, phases marked and the peak `pk` annotated."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plot() needs matplotlib: pip install 'tinygrad_attn[plot]' (or use "
            "plot_html(), which needs nothing)"
        ) from e
    xs = list(range(len(tl["phases"])))
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ys = [[b / 2**20 for b in tl["series"][c]] for c in CATEGORIES]
    ax.stackplot(xs, ys, labels=CATEGORIES, colors=[_COLORS[c] for c in CATEGORIES])
    ax.set_xlim(0, max(len(xs) - 1, 1))
    for x, _ in _phase_changes(tl["phases"]):
        ax.axvline(x, color="k", lw=0.8, ls="--")
    if pk["t"] >= 0:
        ax.plot([pk["t"]], [pk["bytes"] / 2**20], "rv")
        ax.annotate(f"peak {fmt_bytes(pk['bytes'])}", (pk["t"], pk["bytes"] / 2**20),
                    textcoords="offset points", xytext=(5, 5), fontsize=8, color="r")
    ax.set_xlabel("event (allocation, free, save, release)")
    ax.set_ylabel("MiB live")
    ax.set_title(title, pad=44)
    # outside the axes, so it hides no band and no phase name
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    _phase_labels(fig, ax, _phase_changes(tl["phases"]))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _phase_labels(fig, ax, changes, rows: int = 3) -> None:
    """Each phase's name above the axes where it starts, in the first of `rows` rows where
    it overlaps no name already placed (phases a few events apart would print over each
    other); a name that fits in no row is left out (its dashed line stays)."""
    renderer = fig.canvas.get_renderer()
    placed = [[] for _ in range(rows)]  # per row: (x0, x1) extents in pixels
    for x, label in changes:
        for r in range(rows):
            text = ax.text(x, 1.01 + 0.06 * r, f" {label}", fontsize=8, va="bottom",
                           transform=ax.get_xaxis_transform(), clip_on=False)
            box = text.get_window_extent(renderer)
            if all(box.x1 <= a or box.x0 >= b for a, b in placed[r]):
                placed[r].append((box.x0, box.x1))
                break
            text.remove()


# ----------------------------------------------------------------------------- the viewer
def _first_fit(allocations: list) -> int:
    """Give each allocation an `offset`: the lowest gap among the live ones that fits it, in
    event order, as a simple allocator would. Returns the highest end (the drawing's top)."""
    actions = []
    for i, a in enumerate(allocations):
        actions.append((a["t0"], 1, i))
        if a["t1"] is not None:
            actions.append((a["t1"], 0, i))
    live, top = [], 0  # live: [offset, end, i] sorted by offset
    for _, is_alloc, i in sorted(actions):
        a = allocations[i]
        if not is_alloc:
            live = [blk for blk in live if blk[2] != i]
            continue
        offset = 0
        for lo, hi, _ in live:
            if lo - offset >= a["bytes"]:
                break
            offset = max(offset, hi)
        a["offset"] = offset
        live.append([offset, offset + a["bytes"], i])
        live.sort()
        top = max(top, offset + a["bytes"])
    return top


def viewer_data(tl: dict, s: dict, events: list, allocations: list, report_text: str,
                title: str) -> dict:
    """What one run's viewer draws, as plain data (JSON): the timeline by category, the
    phases, each event's op and module, each allocation's lifetime and description, the
    peaks and the backward-peak explainer's text."""
    n = len(tl["phases"])
    top = _first_fit(allocations)
    strings: dict = {}

    def code(text):
        return strings.setdefault(text or "", len(strings))

    ev_op = [code(e["op"]) for e in events]
    ev_scope = [code(e["scope"]) for e in events]
    pk, bp = s["peak"], s["backward_peak"]
    same = bp is not None and bp["t"] == pk["t"]
    explainer = "\n\n".join(part for part in (
        _headline(s), _holders(pk["holders"], 10), _backward_peak(bp, 15)) if part)
    return {
        "title": title, "n": n, "series": {c: tl["series"][c] for c in CATEGORIES},
        "phases": [[i, p] for i, p in _phase_changes(tl["phases"])],
        "strings": list(strings), "ev_op": ev_op, "ev_scope": ev_scope,
        "allocations": allocations, "alloc_top": top,
        "live_top": max([sum(tl["series"][c][i] for c in CATEGORIES) for i in range(n)] + [1]),
        "peak": {"t": pk["t"], "bytes": pk["bytes"], "op": pk["op"], "phase": pk["phase"],
                 "label": "peak (in backward)" if same else "peak",
                 "hover": _peak_hover("peak", pk)},
        "backward_peak": None if bp is None else {
            "t": bp["t"], "bytes": bp["bytes"], "op": bp["op"], "label": "backward peak",
            "hover": _peak_hover("backward peak", bp)},
        "explainer": explainer, "report": report_text,
    }


def _peak_hover(name: str, p: dict) -> str:
    """What hovering a peak marker says: the marker does nothing on hover but a click opens
    the explainer, which a user would not guess from a red dot."""
    where = f" in {p['phase']}" if p.get("phase") else ""
    return (f"{name}: {fmt_bytes(p['bytes'])} at event {p['t']}{where}"
            " \u2014 click for what holds it")


X_TITLE = "event (allocation, free, save, release)"


def plot_html(runs: list, path: str, title: str | None = None) -> str:
    """One self-contained HTML page (inline script, nothing fetched) drawing each run's
    viewer_data: live bytes by category above each allocation's lifetime, all runs on one
    byte scale. Hover a band or an allocation for its details, drag or wheel to zoom the
    event axis, click a peak marker for what was live there."""
    import json

    title = title or " vs ".join(r["title"] for r in runs)
    y_max = max([max(r["alloc_top"], r["live_top"]) for r in runs] + [1])
    payload = json.dumps({"runs": runs, "y_max": y_max, "colors": _COLORS, "x_title": X_TITLE,
                          "categories": list(CATEGORIES)}).replace("</", "<\\/")
    legend = " ".join(f'<span class="sw" style="background:{_COLORS[c]}"></span>{c}'
                      for c in CATEGORIES)
    # one run under the page's own title needs no second heading saying the same
    heads = [r["title"] != title for r in runs]
    blocks = "".join(
        f'<section class="run" id="run{k}">'
        + (f'<h4>{_esc(r["title"])}</h4>' if head else "") +
        '<div class="controls"><button class="reset">reset zoom</button> '
        "<span>wheel or drag: zoom the event axis; click a red peak marker: what was live"
        '</span></div><svg class="chart"></svg><pre class="explainer" hidden></pre>'
        f"<details><summary>the ledger's report</summary><pre>{_esc(r['report'])}</pre>"
        "</details></section>" for k, (r, head) in enumerate(zip(runs, heads)))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<style>{_CSS}</style></head><body><h3>{_esc(title)}</h3>"
            f'<div class="legend">{legend}</div>{blocks}<div id="tip"></div>'
            f"<script>const DATA = {payload};\n{_SCRIPT}</script></body></html>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_CSS = """
body { font: 13px sans-serif; margin: 12px; }
.legend { margin: 4px 0 8px; } .sw { display: inline-block; width: 14px; height: 10px;
  margin: 0 4px 0 12px; }
.run { margin-bottom: 18px; } .run h4 { margin: 8px 0 2px; }
svg.chart { display: block; user-select: none; }
.xtick, .ytick, .phase, .peak-label, .axis-title { font-size: 11px; }
.panel-title { font-size: 12px; font-weight: bold; }
.peak { cursor: pointer; }
pre.explainer { background: #fff8e6; border: 1px solid #e0c070; padding: 6px; }
#tip { position: fixed; display: none; pointer-events: none; background: #222; color: #fff;
  font: 12px monospace; padding: 6px 8px; border-radius: 4px; white-space: pre;
  z-index: 10; }
"""

_SCRIPT = r"""
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 980, L = 74, R = 16, PH = 190, TA = 44, TB = TA + PH + 66, H = TB + PH + 40;
  const PW = W - L - R, CATS = DATA.categories, YMAX = DATA.y_max;
  const tip = document.getElementById("tip");

  function el(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < 3) { n /= 1024; i++; }
    return i === 0 ? n.toFixed(0) + " B" : n.toFixed(2) + " " + units[i];
  }
  function nice(x) {  // 1, 2 or 5 times a power of ten, at least x
    const p = Math.pow(10, Math.floor(Math.log10(x))), m = x / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function byteTicks(max) {  // ticks in the largest binary unit below max: 0, 64 MiB, ...
    const units = ["B", "KiB", "MiB", "GiB"];
    let k = 0;
    while (k < 3 && max >= 1024 ** (k + 1)) k++;
    const unit = 1024 ** k, step = nice(max / unit / 5), out = [];
    for (let v = 0; v <= max / unit + 1e-9; v += step)
      out.push([v * unit, (+v.toPrecision(6)) + " " + units[k]]);
    return out;
  }
  function showTip(ev, lines) {
    tip.textContent = lines.join("\n");
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  DATA.runs.forEach(function (run, k) {
    const section = document.getElementById("run" + k);
    const svg = section.querySelector("svg.chart");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    svg.setAttribute("xmlns", NS);
    const explainer = section.querySelector(".explainer");
    const S = run.strings, n = run.n;
    const view = {t0: 0, t1: Math.max(n - 1, 1)};
    const defs = el("defs", {}, svg);
    [["A", TA], ["B", TB]].forEach(function (p) {
      const clip = el("clipPath", {id: "clip" + p[0] + k}, defs);
      el("rect", {x: L, y: p[1], width: PW, height: PH}, clip);
    });
    const layer = el("g", {}, svg);

    const sx = t => L + (t - view.t0) / (view.t1 - view.t0) * PW;
    const tx = x => view.t0 + (x - L) / PW * (view.t1 - view.t0);
    const sy = (top, v) => top + PH - v / YMAX * PH;

    function stackAt(i) {
      let lo = 0; const out = [];
      CATS.forEach(function (c) {
        const v = run.series[c][i] || 0;
        out.push([c, lo, lo + v]);
        lo += v;
      });
      return out;
    }
    function eventText(i) {
      let phase = "";
      run.phases.forEach(function (p) { if (p[0] <= i) phase = p[1]; });
      return ["event " + i + " (" + phase + ")", "op      " + (S[run.ev_op[i]] || "-"),
              "module  " + (S[run.ev_scope[i]] || "(top level)")];
    }

    function draw() {
      while (layer.firstChild) layer.removeChild(layer.firstChild);
      const i0 = Math.max(0, Math.floor(view.t0)), i1 = Math.min(n - 1, Math.ceil(view.t1));
      // panel A: live bytes by category, stacked
      el("text", {x: L, y: TA - 24, class: "panel-title"}, layer, "live bytes by category");
      const gA = el("g", {"clip-path": "url(#clipA" + k + ")"}, layer);
      let lower = new Array(i1 - i0 + 1).fill(0);
      CATS.forEach(function (c) {
        const s = run.series[c];
        const upper = lower.map((lo, j) => lo + s[i0 + j]);
        if (upper.some((u, j) => u !== lower[j])) {
          const pts = [];
          const pt = (j, v) => sx(i0 + j).toFixed(1) + "," + sy(TA, v).toFixed(1);
          for (let j = 0; j < upper.length; j++) pts.push(pt(j, upper[j]));
          for (let j = lower.length - 1; j >= 0; j--) pts.push(pt(j, lower[j]));
          el("polygon", {points: pts.join(" "), fill: DATA.colors[c], class: "band",
                         "data-category": c}, gA);
        }
        lower = upper;
      });
      // phases: a dashed line where each starts, and its name above the chart only where
      // the phase, as drawn now, is wide enough to hold it: the few events of "other"
      // between backward and the optimizer would otherwise print over their names
      run.phases.forEach(function (p, j) {
        const end = j + 1 < run.phases.length ? run.phases[j + 1][0] : n - 1;
        if (end < view.t0 || p[0] > view.t1) return;
        if (p[0] >= view.t0)
          el("line", {x1: sx(p[0]), x2: sx(p[0]), y1: TA, y2: TA + PH, stroke: "#000",
                      "stroke-dasharray": "4"}, gA);
        const x0 = sx(Math.max(p[0], view.t0)), x1 = sx(Math.min(end, view.t1));
        const label = el("text", {x: x0 + 3, y: TA - 4, class: "phase"}, layer, p[1]);
        const width = label.getComputedTextLength ? label.getComputedTextLength()
                                                  : p[1].length * 6.5;
        if (width + 6 > x1 - x0) layer.removeChild(label);
        else label.setAttribute("data-span", (x1 - x0).toFixed(1));
      });
      const hitA = el("rect", {x: L, y: TA, width: PW, height: PH, fill: "transparent",
                               class: "hit"}, layer);
      hitA.addEventListener("mousemove", function (ev) {
        const box = svg.getBoundingClientRect();
        const i = Math.max(0, Math.min(n - 1, Math.round(tx(ev.clientX - box.left))));
        const v = (TA + PH - (ev.clientY - box.top)) / PH * YMAX;
        const stack = stackAt(i), lines = eventText(i);
        let total = 0;
        stack.forEach(function (b) {
          const here = v >= b[1] && v < b[2] ? "> " : "  ";
          total += b[2] - b[1];
          if (b[2] > b[1]) lines.push(here + b[0].padEnd(16) + fmtBytes(b[2] - b[1]));
        });
        lines.push("  total           " + fmtBytes(total));
        showTip(ev, lines);
      });
      hitA.addEventListener("mouseleave", hideTip);
      const bp = run.backward_peak, same = bp && bp.t === run.peak.t;
      [[run.peak, "peak"], [same ? null : bp, "backward-peak"]].forEach(function (m) {
        const p = m[0];
        if (!p || p.t < view.t0 || p.t > view.t1) return;
        const g = el("g", {class: "peak " + m[1]}, layer);
        // a click opens the explainer; the hover says so (the browser's own tooltip, and
        // ours at once, since the browser's waits a second)
        el("title", {}, g, p.hover);
        el("circle", {cx: sx(p.t), cy: sy(TA, p.bytes), r: 6, fill: "red", stroke: "white"}, g);
        el("text", {x: sx(p.t) + 8, y: sy(TA, p.bytes) - 6, fill: "red", class: "peak-label"},
           g, p.label + " " + fmtBytes(p.bytes));
        g.addEventListener("mousemove", function (ev) { showTip(ev, [p.hover]); });
        g.addEventListener("mouseleave", hideTip);
        g.addEventListener("click", function () {
          explainer.hidden = false;
          explainer.textContent = run.explainer;
        });
      });
      // panel B: each allocation from its allocation to its free, at a first-fit offset
      el("text", {x: L, y: TB - 8, class: "panel-title"}, layer,
         "allocations (each storage from allocation to free; first-fit offsets)");
      const gB = el("g", {"clip-path": "url(#clipB" + k + ")"}, layer);
      el("rect", {x: L, y: TB, width: PW, height: PH, fill: "#f7f7f7", class: "hit"}, gB);
      run.allocations.forEach(function (a, j) {
        const t1 = a.t1 === null ? n - 1 : a.t1;
        if (t1 < view.t0 || a.t0 > view.t1) return;
        const x0 = sx(Math.max(a.t0, view.t0)), x1 = sx(Math.min(t1, view.t1));
        const y1 = sy(TB, a.offset + a.bytes), y0 = sy(TB, a.offset);
        const r = el("rect", {x: x0, y: y1, width: Math.max(x1 - x0, 1),
                              height: Math.max(y0 - y1, 0.5),
                              fill: DATA.colors[a.category], stroke: "#fff", "stroke-width": 0.3,
                              class: "alloc", "data-index": j}, gB);
        r.addEventListener("mousemove", function (ev) {
          const shape = a.shape ? "[" + a.shape.join(", ") + "]" : "";
          showTip(ev, [fmtBytes(a.bytes) + "  " + a.dtype + shape,
                       "category  " + a.category, "op        " + (a.op || "a factory"),
                       "module    " + (a.scope || "(top level)"), "phase     " + a.phase,
                       "source    " + (a.source || "-") + (a.via ? " via " + a.via : ""),
                       "copy      " + (a.copy_reason || "no"),
                       "lifetime  events " + a.t0 + "-" + (a.t1 === null ? "end" : a.t1)]);
        });
        r.addEventListener("mouseleave", hideTip);
      });
      // axes: bytes up the side of each panel, events along the bottom of each
      [TA, TB].forEach(function (top) {
        byteTicks(YMAX).forEach(function (tk) {
          const y = sy(top, tk[0]);
          el("line", {x1: L - 4, x2: L + PW, y1: y, y2: y, stroke: "#ddd"}, layer);
          el("text", {x: L - 6, y: y + 4, "text-anchor": "end", class: "ytick"}, layer, tk[1]);
        });
        el("line", {x1: L, x2: L, y1: top, y2: top + PH, stroke: "#000"}, layer);
        el("line", {x1: L, x2: L + PW, y1: top + PH, y2: top + PH, stroke: "#000"}, layer);
        const step = Math.max(1, nice((view.t1 - view.t0) / 8));
        for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
          el("line", {x1: sx(t), x2: sx(t), y1: top + PH, y2: top + PH + 4, stroke: "#000"}, layer);
          el("text", {x: sx(t), y: top + PH + 15, "text-anchor": "middle", class: "xtick"},
             layer, String(t));
        }
        el("text", {x: L + PW / 2, y: top + PH + 30, "text-anchor": "middle",
                    class: "axis-title"}, layer,
           DATA.x_title + ": " + Math.round(view.t0) + " to " + Math.round(view.t1) +
           " of " + n);
      });
      svg.appendChild(sel);
    }

    function zoomTo(a, b) {
      const lo = Math.max(0, Math.min(a, b)), hi = Math.min(n - 1, Math.max(a, b));
      if (hi - lo < 2) return;
      view.t0 = lo; view.t1 = hi; draw();
    }
    const sel = el("rect", {y: TA, height: TB + PH - TA, fill: "rgba(60,120,220,0.2)",
                            width: 0, x: 0,
                            visibility: "hidden", "pointer-events": "none", class: "selection"});
    let dragFrom = null;
    svg.addEventListener("mousedown", function (ev) {
      const x = ev.clientX - svg.getBoundingClientRect().left;
      if (x < L || x > L + PW || ev.target.closest(".peak")) return;
      dragFrom = x; ev.preventDefault();
    });
    window.addEventListener("mousemove", function (ev) {
      if (dragFrom === null) return;
      const x = Math.max(L, Math.min(L + PW, ev.clientX - svg.getBoundingClientRect().left));
      sel.setAttribute("x", Math.min(x, dragFrom));
      sel.setAttribute("width", Math.abs(x - dragFrom));
      sel.setAttribute("visibility", "visible");
    });
    window.addEventListener("mouseup", function (ev) {
      if (dragFrom === null) return;
      const x = Math.max(L, Math.min(L + PW, ev.clientX - svg.getBoundingClientRect().left));
      sel.setAttribute("visibility", "hidden");
      if (Math.abs(x - dragFrom) > 4) zoomTo(tx(dragFrom), tx(x));
      dragFrom = null;
    });
    svg.addEventListener("wheel", function (ev) {
      const x = ev.clientX - svg.getBoundingClientRect().left;
      if (x < L || x > L + PW) return;
      ev.preventDefault();
      const t = tx(x), f = ev.deltaY > 0 ? 1.25 : 0.8;
      zoomTo(t - (t - view.t0) * f, t + (view.t1 - t) * f);
    }, {passive: false});
    section.querySelector(".reset").addEventListener("click", function () {
      view.t0 = 0; view.t1 = Math.max(n - 1, 1); draw();
    });
    draw();
  });
})();
"""
