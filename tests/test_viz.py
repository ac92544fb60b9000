"""ta.viz: the graph behind a tensor as SVG, HTML and DOT."""

import re
import shutil
import xml.etree.ElementTree as ET

import pytest

import nn
import tinygrad_attn as ta

SVG = "{http://www.w3.org/2000/svg}"


def _small_graph():
    """loss = ((x @ w).softmax(-1) * t).sum(): 5 graph nodes, 5 next_functions edges."""
    ta.manual_seed(0)
    x = ta.randn(2, 3, requires_grad=True)
    w = ta.randn(3, 4, requires_grad=True)
    t = ta.randn(2, 4)
    loss = ((x @ w).softmax(-1) * t).sum()
    return loss, {"x": x, "w": w}


def _texts(svg: str) -> str:
    root = ET.fromstring(svg)  # parses as XML, or the test fails here
    return "\n".join(el.text or "" for el in root.iter(f"{SVG}text"))


def test_svg_names_every_op_saved_tensor_and_parameter():
    loss, params = _small_graph()
    g = ta.viz.draw(loss, params=params)
    text = _texts(g.svg())
    for op in ("SumBackward", "MulBackward", "SoftmaxBackward", "MatmulBackward",
               "AccumulateGrad"):
        assert op in text
    # matmul saves both inputs (as themselves: the parameters' own storages), softmax its
    # (2, 4) output, mul only t
    assert "saved float32[2, 3] 24 B = x" in text
    assert "saved float32[3, 4] 48 B = w" in text
    assert text.count("saved float32[2, 4] 32 B") == 2
    assert "x float32[2, 3]" in text and "w float32[3, 4]" in text
    assert g.saved_bytes == 24 + 48 + 32 + 32


def test_a_saved_slice_is_marked_as_a_view_of_its_whole_storage():
    ta.manual_seed(0)
    x = ta.randn(4, 12, requires_grad=True)
    q, k, v = (x * 2).split(4, dim=-1)
    loss = (q * k).sum()
    text = _texts(ta.viz.draw(loss).svg())
    # each (4, 4) slice is 64 bytes of a 192-byte storage that saving it keeps alive
    assert re.search(r"saved float32\[4, 4\] 64 B, view of #\d+ \(192 B\)", text)
    lines = [ln for ln in text.splitlines() if ln.startswith("saved float32[4, 4]")]
    assert len(lines) == 2 and all("view of" in ln for ln in lines)


def test_dot_has_one_edge_per_next_function_and_the_output_edge():
    loss, params = _small_graph()
    g = ta.viz.draw(loss, params=params)
    dot = g.to_dot()
    assert dot.startswith("digraph backward {") and dot.rstrip().endswith("}")
    # output->Sum, Sum->Mul, Mul->Softmax (t needs no grad: its edge is None),
    # Softmax->Matmul, Matmul->x, Matmul->w
    assert dot.count("->") == 6
    assert len(re.findall(r"^  n\d+ \[label=", dot, re.M)) == 7
    without_output = ta.viz.draw(loss, params=params, show_output=False).to_dot()
    assert without_output.count("->") == 5


def test_repeated_input_gives_two_edges_and_one_drawn_arrow_marked_x2():
    x = ta.randn(3, requires_grad=True)
    g = ta.viz.draw((x * x).sum(), params={"x": x})
    # output->Sum, Sum->Mul, and Mul->x twice: both of Mul's inputs are x
    assert g.to_dot().count("->") == 4
    svg = g.svg()
    ET.fromstring(svg)
    assert svg.count('class="edge"') == 3 and ">x2</text>" in svg


def test_model_parameters_are_named_and_html_and_save_work(tmp_path):
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2))
    loss = model(ta.randn(4, 3)).sum()
    g = ta.viz.draw(loss, params=dict(model.named_parameters()))
    text = _texts(g.svg())
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"{name} float32" in text
    svg_path, html_path = tmp_path / "g.svg", tmp_path / "g.html"
    g.save(str(svg_path))
    g.save(str(html_path))
    ET.parse(svg_path)
    assert html_path.read_text().startswith("<!doctype html>")
    assert "<svg" in html_path.read_text()


def test_every_box_lies_inside_the_canvas_and_arrows_point_down():
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2))
    g = ta.viz.draw(model(ta.randn(4, 3)).sum(), params=dict(model.named_parameters()))
    boxes, width, height = g._layout()
    for x, y, w, h in boxes.values():
        assert 0 <= x and x + w <= width and 0 <= y and y + h <= height
    for a, b in g.edges:
        assert g.nodes[b].layer > g.nodes[a].layer
        assert boxes[b][1] > boxes[a][1]


def test_render_without_dot_writes_svg_and_refuses_png(tmp_path, monkeypatch):
    loss, params = _small_graph()
    g = ta.viz.draw(loss, params=params)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = g.render(str(tmp_path / "g.svg"))
    ET.parse(out)
    with pytest.raises(RuntimeError, match="dot"):
        g.render(str(tmp_path / "g.png"))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_with_dot(tmp_path):
    loss, params = _small_graph()
    out = ta.viz.draw(loss, params=params).render(str(tmp_path / "g.svg"))
    ET.parse(out)


def test_a_tensor_without_a_graph_is_refused():
    with pytest.raises(ValueError, match="grad_fn"):
        ta.viz.draw(ta.randn(2))
