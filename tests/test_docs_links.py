"""README.md and docs/*.md stay true to the repository: every relative link (and #anchor)
points at a file (and heading) that exists, no link leaves the repository, and every
`python examples/X.py ...` or `python benchmarks/X.py ...` command they show names a script
whose argparse parser accepts the flags shown (parsed in this process, nothing run)."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import shlex
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"python3? ((?:examples|benchmarks)/[\w-]+\.py)\b([^\n]*)")


def _rel(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _slug(heading: str) -> str:
    """The anchor a heading gets (GitHub's rule): lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links():
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in LINK.findall(text):
            yield page, target


def test_the_pages_are_found_and_have_links():
    assert len(PAGES) >= 8 and sum(1 for _ in _links()) > 20


def test_no_link_leaves_the_repository():
    outside = [f"{_rel(p)}: {t}" for p, t in _links() if re.match(r"^[a-z][\w+.-]*:", t)]
    assert not outside, outside


def test_every_relative_link_and_anchor_exists():
    broken = []
    for page, target in _links():
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{_rel(page)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{_rel(page)}: {target} (no heading with that anchor)")
    assert not broken, broken


def test_the_slugs_are_githubs():
    assert _slug("The memory ledger (`ta.memory`)") == "the-memory-ledger-tamemory"
    assert _slug("Side by side with PyTorch (benchmarks/vs_torch.py)") == (
        "side-by-side-with-pytorch-benchmarksvs_torchpy")
    assert _slug("Where attention's memory goes") == "where-attentions-memory-goes"


def _code_texts(page: pathlib.Path):
    """The page's code: each fenced block's lines, and each inline span (which may run
    over a line break in the Markdown source)."""
    text = page.read_text()
    for block in FENCE.findall(text):
        yield from block.splitlines()
    for span in SPAN.findall(FENCE.sub("", text)):
        yield span.replace("\n", " ")


def _commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        for code in _code_texts(page):
            for script, rest in COMMAND.findall(code):
                rest = rest.split(" #")[0].replace("[", " ").replace("]", " ")
                rest = re.split(r"&&|\||;|\)", rest)[0]
                args = [a for a in shlex.split(rest) if a != "..."]
                found.append((_rel(page), script, args))
    return found


class _Parsed(Exception):
    pass


def _check_args(script: str, args: list[str], monkeypatch) -> None:
    """Run the script's own parser on args: its build_parser() where it has one, else its
    main(args) with parse_args stopped right after parsing."""
    name = "_doc_cmd_" + re.sub(r"\W", "_", script)
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look it up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    if hasattr(module, "build_parser"):
        module.build_parser().parse_args(args)
        return
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        real(self, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed):
        module.main(args)


def test_every_command_shown_names_a_script_that_takes_its_flags(monkeypatch, capsys):
    commands = _commands()
    scripts = {s for _, s, _ in commands}
    assert {"examples/train_gpt.py", "examples/autodiff_tour.py",
            "benchmarks/vs_torch.py"} <= scripts and len(commands) > 15
    wrong = []
    for page, script, args in commands:
        if not (ROOT / script).exists():
            wrong.append(f"{page}: {script} does not exist")
            continue
        try:
            with monkeypatch.context() as m:
                _check_args(script, args, m)
        except SystemExit as e:  # argparse refused a flag or a value
            err = capsys.readouterr().err.strip().splitlines()
            wrong.append(f"{page}: python {script} {shlex.join(args)}: exit {e.code}: "
                         f"{err[-1] if err else ''}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("script", ["examples/train_gpt.py", "benchmarks/seq_sweep.py",
                                    "examples/autodiff_tour.py"])
def test_the_check_refuses_a_flag_the_script_lacks(script, monkeypatch, capsys):
    with monkeypatch.context() as m, pytest.raises(SystemExit):
        _check_args(script, ["--no-such-flag"], m)
    assert "--no-such-flag" in capsys.readouterr().err
