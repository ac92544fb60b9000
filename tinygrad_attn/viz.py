"""Draw the backward graph behind a tensor: its nodes, edges and what each node saved.

    g = ta.viz.draw(loss, params=dict(model.named_parameters()))
    g.save("graph.svg")        # self-contained SVG laid out here (or .html: SVG in a page)
    print(g.to_dot())          # the same graph as Graphviz DOT text
    g.render("graph.png")      # runs Graphviz's `dot` when it is installed (the extra)

Each box is a node (`node.name`, its module scope), each arrow an entry of
`node.next_functions` (the direction gradients flow: from the output down to the leaves),
and under a node's name one line per saved tensor: dtype, shape, the bytes of the view,
and whether it is a view of a larger storage (a saved slice pins its whole storage).
Leaves (AccumulateGrad) are named from `params`, as torchviz's make_dot does.

Only the graph's public face is read (`t.grad_fn`, `node.next_functions`,
`node.saved_tensor_list()`, AccumulateGrad's `.variable`, `node.name`), so any engine
whose nodes offer those can be drawn. The layout is ours, with no system dependency:
layers by longest distance from the output, each layer ordered by its parents' places.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

from .memory.counters import fmt_bytes

_CHAR_W, _LINE_H, _PAD = 7.4, 15, 8  # monospace 12px: an estimate good enough for boxes
_GAP_X, _GAP_Y = 24, 56
_FILL = {"op": "#dbe9f6", "leaf": "#d9ead3", "output": "#fff2cc"}


@dataclass
class SavedInfo:
    """One saved tensor of a node, as drawn."""

    dtype: str
    shape: tuple
    nbytes: int  # the view's own bytes (numel * itemsize)
    storage_id: int
    storage_nbytes: int  # what saving it keeps alive
    is_view: bool  # a strided window on a storage larger than, or laid out unlike, itself
    storage_of: str | None  # the named parameter (or output) whose storage it is, if any

    def line(self) -> str:
        text = f"saved {self.dtype}{list(self.shape)} {fmt_bytes(self.nbytes)}"
        if self.is_view:
            text += f", view of #{self.storage_id} ({fmt_bytes(self.storage_nbytes)})"
        if self.storage_of:
            text += f" = {self.storage_of}"
        return text


@dataclass
class NodeInfo:
    key: int
    name: str
    kind: str  # "op", "leaf" or "output"
    scope: str = ""
    label: str = ""  # a leaf's parameter name and shape, the output's shape
    saved: list = field(default_factory=list)
    layer: int = 0

    def lines(self) -> list:
        out = [self.name]
        if self.label:
            out.append(self.label)
        if self.scope:
            out.append(f"in {self.scope}")
        out.extend(s.line() for s in self.saved)
        return out


def _name(node) -> str:
    name = node.name
    return name() if callable(name) else name


def _tensor_label(t, names: dict) -> str:
    label = names.get(id(t), "")
    return f"{label} {t.dtype.name}{list(t.shape)}".strip()


class Graph:
    """The graph behind one tensor, walked once; draw it with svg(), to_dot(), save()."""

    def __init__(self, root, params: dict | None = None, show_output: bool = True):
        if getattr(root, "grad_fn", None) is None:
            raise ValueError("ta.viz: the tensor has no grad_fn (a leaf, or made under "
                             "no_grad); draw the result of an op on tensors requiring grad")
        names = {id(p): n for n, p in (params or {}).items()}
        storages = {p.untyped_storage().id: n for n, p in (params or {}).items()}
        self.nodes: dict = {}  # id(node) -> NodeInfo, in the order they were reached
        self.edges: list = []  # (from key, to key): one per next_functions entry
        order, stack = [], [root.grad_fn]
        while stack:  # iterative: real models are deeper than Python's recursion limit
            node = stack.pop()
            if id(node) in self.nodes:
                continue
            self.nodes[id(node)] = self._info(node, names, storages)
            order.append(node)
            nexts = [edge[0] for edge in node.next_functions
                     if edge is not None and edge[0] is not None]
            self.edges.extend((id(node), id(n)) for n in nexts)
            stack.extend(reversed(nexts))
        if show_output:
            out = NodeInfo(key=id(root), name="output", kind="output",
                           label=_tensor_label(root, names))
            self.nodes = {out.key: out, **self.nodes}
            self.edges.insert(0, (out.key, id(root.grad_fn)))
        self._assign_layers()

    @staticmethod
    def _info(node, names: dict, storages: dict) -> NodeInfo:
        variable = getattr(node, "variable", None)
        if variable is not None:
            return NodeInfo(key=id(node), name=_name(node), kind="leaf",
                            label=_tensor_label(variable, names))
        saved = []
        for t in node.saved_tensor_list():
            st = t.untyped_storage()
            nbytes = t.numel() * t.itemsize
            is_view = (st.nbytes != nbytes or t.storage_offset() != 0
                       or not t.is_contiguous())
            saved.append(SavedInfo(t.dtype.name, tuple(t.shape), nbytes, st.id, st.nbytes,
                                   is_view, storages.get(st.id)))
        return NodeInfo(key=id(node), name=_name(node), kind="op",
                        scope=getattr(node, "scope", "") or "", saved=saved)

    def _assign_layers(self) -> None:
        """Layer = longest path from the output, so every arrow points down."""
        children: dict = {k: [] for k in self.nodes}
        indegree = {k: 0 for k in self.nodes}
        for a, b in self.edges:
            children[a].append(b)
            indegree[b] += 1
        ready = [k for k in self.nodes if indegree[k] == 0]
        while ready:  # Kahn's order: a node is placed after all its parents
            k = ready.pop()
            for c in children[k]:
                self.nodes[c].layer = max(self.nodes[c].layer, self.nodes[k].layer + 1)
                indegree[c] -= 1
                if indegree[c] == 0:
                    ready.append(c)

    # -- numbers a test or a reader may want -----------------------------------------------
    @property
    def saved_bytes(self) -> int:
        """Bytes the graph keeps alive for backward, each storage once."""
        seen = {s.storage_id: s.storage_nbytes for n in self.nodes.values() for s in n.saved}
        return sum(seen.values())

    # -- DOT -----------------------------------------------------------------------------
    def to_dot(self) -> str:
        """Graphviz DOT text: one node per graph node, one edge per next_functions entry."""
        lines = ["digraph backward {", '  node [shape=box, style="rounded,filled", '
                 'fontname="monospace", fontsize=10];']
        for n in self.nodes.values():
            label = "\\l".join(_dot_escape(line) for line in n.lines()) + "\\l"
            lines.append(f'  n{n.key} [label="{label}", fillcolor="{_FILL[n.kind]}"];')
        for a, b in self.edges:
            lines.append(f"  n{a} -> n{b};")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def render(self, path: str) -> str:
        """Write `path` with Graphviz's `dot` (format from its suffix) when `dot` is
        installed; without it, .svg and .html get this module's own layout and other
        formats raise."""
        fmt = path.rsplit(".", 1)[-1].lower()
        dot = shutil.which("dot")
        if dot is None or fmt == "html":
            if fmt in ("svg", "html"):
                return self.save(path)
            raise RuntimeError(f"ta.viz.render({path!r}): Graphviz's `dot` is not installed; "
                               "install graphviz, or save as .svg or .html (no dependency)")
        subprocess.run([dot, f"-T{fmt}", "-o", path], input=self.to_dot(), text=True,
                       check=True)
        return path

    # -- SVG -----------------------------------------------------------------------------
    def _layout(self) -> tuple:
        """Box sizes and places: ({key: (x, y, w, h)}, width, height)."""
        layers: dict = {}
        for n in self.nodes.values():
            layers.setdefault(n.layer, []).append(n)
        parents: dict = {k: [] for k in self.nodes}
        for a, b in self.edges:
            parents[b].append(a)
        def size(n):
            return (max(len(line) for line in n.lines()) * _CHAR_W + 2 * _PAD,
                    len(n.lines()) * _LINE_H + _PAD)

        row_width = {d: sum(size(n)[0] + _GAP_X for n in row) - _GAP_X
                     for d, row in layers.items()}
        width = max(row_width.values()) + 2 * _PAD
        boxes, y = {}, _PAD
        for depth in sorted(layers):
            row = layers[depth]
            if depth > 0:  # under the mean place of its parents: fewer crossings
                row.sort(key=lambda n: sum(boxes[p][0] for p in parents[n.key])
                         / max(len(parents[n.key]), 1))
            x, height = (width - row_width[depth]) / 2, 0  # each row centred
            for n in row:
                w, h = size(n)
                boxes[n.key] = (x, y, w, h)
                x += w + _GAP_X
                height = max(height, h)
            y += height + _GAP_Y
        return boxes, width + 4 * _GAP_X, y - _GAP_Y + _PAD  # room to the right: detours

    def svg(self) -> str:
        """The graph as one self-contained SVG document."""
        boxes, width, height = self._layout()
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
                 f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
                 'font-family="monospace" font-size="12">',
                 '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
                 'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                 '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
                 f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>']
        counts: dict = {}
        for edge in self.edges:  # x * x: two entries to one leaf, drawn once, marked x2
            counts[edge] = counts.get(edge, 0) + 1
        detours = 0
        for (a, b), count in counts.items():
            ax, ay, aw, ah = boxes[a]
            bx, by, bw, bh = boxes[b]
            if self.nodes[b].layer - self.nodes[a].layer > 1:
                # skips a layer: leave by the right side and bend around the boxes between
                detours += 1
                x1, y1, x2, y2 = ax + aw, ay + ah / 2, bx + bw, by + bh / 2
                bend = max(x1, x2) + 40 + 12 * (detours % 4)
                mid = (y1 + y2) / 2
                d = f"M{x1:.1f},{y1:.1f} C{bend:.1f},{y1:.1f} {bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
            else:
                x1, y1, x2, y2 = ax + aw / 2, ay + ah, bx + bw / 2, by
                mid = (y1 + y2) / 2
                d = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
            parts.append(f'<path class="edge" d="{d}" fill="none" stroke="#555" '
                         'marker-end="url(#arrow)"/>')
            if count > 1:
                parts.append(f'<text x="{(x1 + x2) / 2 + 4:.1f}" y="{mid:.1f}" '
                             f'fill="#555">x{count}</text>')
        for n in self.nodes.values():
            x, y, w, h = boxes[n.key]
            parts.append(f'<g class="node {n.kind}"><title>{_xml(chr(10).join(n.lines()))}'
                         f'</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                         f'height="{h:.1f}" rx="5" fill="{_FILL[n.kind]}" stroke="#333"/>')
            for i, line in enumerate(n.lines()):
                weight = ' font-weight="bold"' if i == 0 else ""
                parts.append(f'<text x="{x + _PAD:.1f}" y="{y + _PAD + (i + 0.75) * _LINE_H:.1f}"'
                             f'{weight}>{_xml(line)}</text>')
            parts.append("</g>")
        parts.append("</svg>")
        return "\n".join(parts) + "\n"

    def html(self, title: str = "backward graph") -> str:
        """The SVG in a page of its own, with one line on how to read it."""
        return (f"<!doctype html><meta charset='utf-8'><title>{_xml(title)}</title>"
                f"<h3>{_xml(title)}</h3><p>Arrows go where gradients flow: from the output "
                "down to the leaves. Under each node, the tensors it saved for backward."
                f"</p>\n{self.svg()}")

    def _repr_svg_(self) -> str:  # Jupyter shows the graph inline
        return self.svg()

    def save(self, path: str) -> str:
        """Write .svg (the drawing) or .html (the drawing in a page); returns the path."""
        text = self.html() if path.lower().endswith((".html", ".htm")) else self.svg()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path


def draw(tensor, params: dict | None = None, show_output: bool = True) -> Graph:
    """The graph behind `tensor`; `params` ({name: tensor}, e.g.
    dict(model.named_parameters())) names its leaves."""
    return Graph(tensor, params, show_output)


make_dot = draw  # the name torchviz users know


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
