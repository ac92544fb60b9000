"""What a Profile shows: the text report, the timeline as a PNG (matplotlib) or as HTML.

Each function reads the plain data the ledger computed (`Profile.summary()`'s dict and
`Profile.timeline()`), so the pictures and the report cannot disagree with the numbers.
"""

from __future__ import annotations

from .counters import CATEGORIES, fmt_bytes

_COLORS = {"parameter": "#4c72b0", "gradient": "#dd8452", "optimizer_state": "#8172b3",
           "saved": "#c44e52", "activation": "#55a868", "temporary": "#937860"}


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
    for title, table in (("by op", sv["by_op"]), ("by module", sv["by_module"])):
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
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ys = [[b / 2**20 for b in tl["series"][c]] for c in CATEGORIES]
    ax.stackplot(xs, ys, labels=CATEGORIES, colors=[_COLORS[c] for c in CATEGORIES])
    for x, label in _phase_changes(tl["phases"]):
        ax.axvline(x, color="k", lw=0.8, ls="--")
        ax.text(x, ax.get_ylim()[1] * 0.97, f" {label}", va="top", fontsize=8)
    if pk["t"] >= 0:
        ax.plot([pk["t"]], [pk["bytes"] / 2**20], "rv")
        ax.annotate(f"peak {fmt_bytes(pk['bytes'])}", (pk["t"], pk["bytes"] / 2**20),
                    textcoords="offset points", xytext=(5, 5), fontsize=8, color="r")
    ax.set_xlabel("event (allocation, free, save, release)")
    ax.set_ylabel("MiB live")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class _Canvas:
    """The HTML timeline's coordinates: event i and bytes v to SVG x, y."""

    W, H, pad = 960, 360, 40

    def __init__(self, n_events: int, top: int) -> None:
        self.n = max(n_events, 1)
        self.top = top

    def xy(self, i, v):
        W, H, pad = self.W, self.H, self.pad  # noqa: N806
        return pad + (W - 2 * pad) * i / max(self.n - 1, 1), H - pad - (H - 2 * pad) * v / self.top


def _svg_areas(tl: dict, canvas: _Canvas) -> list:
    """One polygon per category, stacked in CATEGORIES order."""
    polys = []
    lower = [0] * len(tl["phases"])
    for c in CATEGORIES:
        upper = [lo + v for lo, v in zip(lower, tl["series"][c])]
        if any(tl["series"][c]):
            pts = [canvas.xy(i, v) for i, v in enumerate(upper)]
            pts += [canvas.xy(i, v) for i, v in reversed(list(enumerate(lower)))]
            path_d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            polys.append(f'<polygon points="{path_d}" fill="{_COLORS[c]}">'
                         f"<title>{c}</title></polygon>")
        lower = upper
    return polys


def _svg_marks(tl: dict, pk: dict, canvas: _Canvas) -> list:
    """Dashed lines where the phase changes, and a red dot at the peak."""
    marks = []
    pad, H = canvas.pad, canvas.H  # noqa: N806
    for i, label in _phase_changes(tl["phases"]):
        x, _ = canvas.xy(i, 0)
        marks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad}" y2="{H - pad}" '
                     f'stroke="black" stroke-dasharray="4"/><text x="{x + 3:.1f}" '
                     f'y="{pad + 12}" font-size="11">{label}</text>')
    if pk["t"] >= 0:
        x, y = canvas.xy(pk["t"], pk["bytes"])
        marks.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="red"/><text '
                     f'x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="11" fill="red">peak '
                     f'{fmt_bytes(pk["bytes"])}</text>')
    return marks


def plot_html(tl: dict, pk: dict, report_text: str, path: str, title: str) -> str:
    """The timeline as a self-contained HTML page (inline SVG) above the text report."""
    n_events = len(tl["phases"])
    totals = [sum(tl["series"][c][i] for c in CATEGORIES) for i in range(n_events)]
    canvas = _Canvas(n_events, max(totals + [1]))
    W, H, pad = canvas.W, canvas.H, canvas.pad  # noqa: N806
    legend = " ".join(f'<span style="background:{_COLORS[c]};padding:0 8px"></span> {c}'
                      for c in CATEGORIES)
    escaped = report_text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    page = (f"<!doctype html><meta charset='utf-8'><title>{title}</title>"
            f"<h3>{title}</h3><div>{legend}</div>"
            f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect width="{W}" height="{H}" fill="white"/>{"".join(_svg_areas(tl, canvas))}'
            f'{"".join(_svg_marks(tl, pk, canvas))}<text x="{pad}" y="{H - 10}" '
            f'font-size="11">events (0..{canvas.n - 1}); top = {fmt_bytes(canvas.top)}</text>'
            f"</svg><pre>{escaped}</pre>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
