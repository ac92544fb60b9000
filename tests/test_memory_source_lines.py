"""profile(source_lines=True) charges an allocation to the user's line: the first frame
outside the engine and the nn package, not nn.Linear's own forward."""

import pathlib

import pytest

import nn
import tinygrad_attn as ta

HERE = pathlib.Path(__file__).name


def _line_of(text: str) -> int:
    src = pathlib.Path(__file__).read_text().splitlines()
    return next(i + 1 for i, s in enumerate(src) if text in s and "_line_of" not in s)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x).relu()  # the line an fc1 output is charged to
        return self.fc2(h)  # and an fc2 output


def _outputs(prof, op: str) -> list:
    """The allocations of `op` in forward, in order."""
    return [a for a in prof.viewer_data()["allocations"]
            if a["op"] == op and a["phase"] == "forward"]


def test_an_nn_linear_in_a_users_module_is_charged_to_the_modules_line():
    ta.manual_seed(0)
    model, x = TwoLayers(), ta.randn(5, 8)
    with ta.memory.profile(source_lines=True) as prof:
        model(x).sum().backward()
    fc1 = [a for a in _outputs(prof, "Linear") if a["shape"] == [5, 16]]
    fc2 = [a for a in _outputs(prof, "Linear") if a["shape"] == [5, 4]]
    assert fc1 and fc2
    assert {a["source"] for a in fc1} == {f"{HERE}:{_line_of('h = self.fc1(x).relu()')}"}
    assert {a["source"] for a in fc2} == {f"{HERE}:{_line_of('return self.fc2(h)')}"}
    # the nn line the call went through is kept beside it: nn.Linear's forward
    assert all(a["via"].startswith("layers.py:") for a in fc1 + fc2)
    # graph nodes' saved tensors are charged the same way
    nodes = prof.summary()["saved_peak"]["nodes"]
    assert nodes and all(n["source"].startswith(f"{HERE}:") for n in nodes)


def test_a_model_wholly_inside_nn_is_charged_to_the_calling_script_line():
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    idx = ta.randint(0, 11, (2, 8))
    with ta.memory.profile(source_lines=True) as prof:
        logits, _ = model(idx)  # every forward byte is asked for from here
    line = _line_of("logits, _ = model(idx)")
    sources = {a["source"] for a in prof.viewer_data()["allocations"] if a["phase"] == "forward"
               and a["t0"] > 0}
    assert sources == {f"{HERE}:{line}"}
    del logits


def test_without_source_lines_nothing_is_walked():
    x = ta.randn(3, 3)
    with ta.memory.profile() as prof:
        y = x * 2
    assert all(a["source"] is None and a["via"] is None
               for a in prof.viewer_data()["allocations"])
    del y


def test_saved_tensors_name_what_forward_left_for_backward_and_at_the_saved_peak():
    ta.manual_seed(0)
    model, x = TwoLayers(), ta.randn(5, 8)
    with ta.memory.profile(source_lines=True) as prof:
        model(x).sum().backward()
    rows = prof.saved_tensors("backward")
    # fc1's input is x (a leaf made before the profile: preexisting, still saved), the relu
    # output h (fc2's input); Relu keeps its output too: one storage each, listed once
    by_op = {(r["op"], tuple(r["shape"])): r for r in rows}
    h = by_op[("Relu", (5, 16))]
    assert h["bytes"] == 5 * 16 * 4 and h["dtype"] == "float32"
    assert h["scope"] == "" and h["source"] == f"{HERE}:{_line_of('self.fc1(x).relu()')}"
    assert {k["forward_op"] for k in h["held_by"]} == {"Linear", "Relu"}
    assert sum(r["bytes"] for r in rows) == (
        prof.summary()["saved_peak"]["unique_bytes_without_parameters"])
    # the saved peak is that moment here (backward only frees), and before anything ran
    # there is nothing
    assert prof.saved_tensors() == rows
    with ta.memory.profile() as empty:
        pass
    assert empty.saved_tensors() == [] and empty.saved_tensors("backward") == []
    with pytest.raises(ValueError, match="saved_tensors: when"):
        prof.saved_tensors("forward")
