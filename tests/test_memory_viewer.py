"""The ledger's HTML viewer: its data, one file with nothing fetched, and (where Chromium,
chromedriver and selenium are installed) what a real browser does with it."""

import importlib.util
import json
import pathlib
import re
import shutil

import pytest

import tinygrad_attn as ta

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("memory_viewer",
                                                  ROOT / "examples" / "memory_viewer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def step():
    """A tiny GPT step's profile and its viewer data, read while the model lives."""
    prof, model = _example().tiny_step()
    return prof, prof.viewer_data("tiny step"), model


def _payload(html: str) -> dict:
    return json.loads(re.search(r"const DATA = (\{.*?\});\n", html, re.S).group(1))


def test_viewer_data_describes_every_allocation(step):
    prof, data, _ = step
    s = prof.summary()
    assert data["n"] == s["n_events"]
    assert data["peak"]["bytes"] == s["peak"]["bytes"]
    allocs = data["allocations"]
    for a in allocs:
        assert set(a) >= {"t0", "t1", "bytes", "dtype", "shape", "op", "scope", "phase",
                          "source", "copy_reason", "category", "offset"}
    # the live bytes at the peak equal the allocations alive across it
    t = s["peak"]["t"]
    alive = sum(a["bytes"] for a in allocs
                if a["t0"] <= t and (a["t1"] is None or a["t1"] > t))
    assert alive == s["peak"]["bytes"]
    # the copy the merge of heads makes carries its reason and a source line
    copies = [a for a in allocs if a["copy_reason"] == "contiguous"]
    assert copies and all(a["source"] for a in copies)
    assert {"saved", "parameter", "gradient", "optimizer_state"} <= {a["category"] for a in allocs}
    assert "Backward peak" in data["explainer"]


def test_first_fit_never_overlaps_two_live_allocations(step):
    _, data, _ = step
    allocs = data["allocations"]
    for i, a in enumerate(allocs):
        for b in allocs[i + 1:]:
            end_a = a["t1"] if a["t1"] is not None else data["n"]
            end_b = b["t1"] if b["t1"] is not None else data["n"]
            if a["t0"] < end_b and b["t0"] < end_a:  # alive together
                assert (a["offset"] + a["bytes"] <= b["offset"]
                        or b["offset"] + b["bytes"] <= a["offset"])
    assert data["alloc_top"] >= data["live_top"] == data["peak"]["bytes"]


def test_one_self_contained_file_and_a_shared_scale(step, tmp_path):
    prof, data, _ = step
    small = ta.randn(8, 8, requires_grad=True)
    with ta.memory.profile() as p2:
        (small * 2).sum().backward()
    both = ta.memory.plot_html({"gpt": data, "small": p2}, str(tmp_path / "both.html"))
    html = pathlib.Path(both).read_text()
    payload = _payload(html)
    assert [r["title"] for r in payload["runs"]] == ["gpt", "small"]
    assert payload["y_max"] == max(data["alloc_top"], data["live_top"])
    # nothing fetched: the only URL is the SVG namespace
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}
    assert "<script src" not in html and "<link" not in html
    one = pathlib.Path(prof.plot_html(str(tmp_path / "one.html"))).read_text()
    assert len(_payload(one)["runs"]) == 1


def _visible(html: str) -> str:
    """The page without its <title> and its script (the data the script draws from)."""
    html = re.sub(r"<title>.*?</title>", "", html, flags=re.S)
    return re.sub(r"<script>.*?</script>", "", html, flags=re.S)


def test_one_run_shows_its_title_once_several_runs_each_theirs(step, tmp_path):
    _, data, _ = step
    one = pathlib.Path(ta.memory.plot_html({"tiny step": data}, str(tmp_path / "one.html")))
    assert _visible(one.read_text()).count("tiny step") == 1
    two = pathlib.Path(ta.memory.plot_html({"a run": data, "b run": data},
                                           str(tmp_path / "two.html"))).read_text()
    body = _visible(two)
    assert body.count("a run vs b run") == 1  # the page's heading
    assert body.count("<h4>a run</h4>") == 1 and body.count("<h4>b run</h4>") == 1


def test_every_panel_has_an_x_axis_title(step, tmp_path):
    _, data, _ = step
    html = pathlib.Path(ta.memory.plot_html({"t": data}, str(tmp_path / "v.html"))).read_text()
    assert _payload(html)["x_title"].startswith("event")
    # drawn inside the loop over both panels' tops, so under the top chart too
    axes = html[html.index("[TA, TB].forEach"):html.index("function zoomTo")]
    assert 'class: "axis-title"' in axes and "DATA.x_title" in axes


def test_the_peak_marker_says_on_hover_that_a_click_explains_it(step, tmp_path):
    _, data, _ = step
    html = pathlib.Path(ta.memory.plot_html({"t": data}, str(tmp_path / "v.html"))).read_text()
    peak = _payload(html)["runs"][0]["peak"]
    assert peak["hover"].startswith(f"peak: {ta.memory.fmt_bytes(peak['bytes'])} at event "
                                    f"{peak['t']}")
    assert "click for what holds it" in peak["hover"]
    assert 'el("title", {}, g, p.hover)' in html  # the browser's own tooltip on the marker


def test_the_phases_include_short_other_runs_the_labels_must_skip(step):
    _, data, _ = step
    # the case the label rule is for: "other" for a few events between the named phases
    phases, n = data["phases"], data["n"]
    spans = [(p, (phases[j + 1][0] if j + 1 < len(phases) else n - 1) - t)
             for j, (t, p) in enumerate(phases)]
    assert any(p == "other" and width < 5 for p, width in spans)


# ----------------------------------------------------------------------------- browser
@pytest.fixture
def browser(tmp_path):
    pytest.importorskip("selenium")
    mod = _example()
    for exe in (mod.CHROMIUM, mod.CHROMEDRIVER):
        if shutil.which(exe) is None:
            pytest.skip(f"{exe} is not installed (apt-get install chromium chromium-driver)")
    driver = mod.chromium_driver(str(tmp_path / "chromium-profile"))
    yield driver
    driver.quit()


def test_in_a_browser_hover_zoom_and_peak(step, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    prof, data, _ = step
    page = ta.memory.plot_html({"tiny step": data}, str(tmp_path / "viewer.html"))
    browser.get(pathlib.Path(page).as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # hover the largest allocation: the tooltip names its bytes, shape, op, module, source
    allocs = browser.find_elements(By.CSS_SELECTOR, "rect.alloc")
    assert len(allocs) == len(data["allocations"])
    biggest = max(allocs, key=lambda e: e.size["width"] * e.size["height"])
    a = data["allocations"][int(biggest.get_attribute("data-index"))]
    ActionChains(browser).move_to_element(biggest).perform()
    tip = browser.find_element(By.ID, "tip").text
    assert tip.startswith(ta.memory.fmt_bytes(a["bytes"]))
    assert f"{a['dtype']}[{', '.join(map(str, a['shape']))}]" in tip
    assert f"op        {a['op'] or 'a factory'}" in tip and f"module    {a['scope']}" in tip
    assert f"phase     {a['phase']}" in tip and f"source    {a['source'] or '-'}" in tip

    # hover a band: the bytes of each category at that event, and their total
    band = browser.find_element(By.CSS_SELECTOR, "rect.hit")
    ActionChains(browser).move_to_element(band).perform()
    assert "total" in browser.find_element(By.ID, "tip").text

    # the y axis is in binary units
    yticks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".ytick")]
    assert "0 KiB" in yticks and any(t.endswith("KiB") and t != "0 KiB" for t in yticks)

    # drag across a tenth of the chart: the event axis zooms in; reset brings it back
    def xticks():
        return [e.text for e in browser.find_elements(By.CSS_SELECTOR, "text.xtick")
                if e.text.isdigit()]

    before = xticks()
    width = band.size["width"]
    (ActionChains(browser).move_to_element_with_offset(band, -width // 4, 0).click_and_hold()
     .move_by_offset(width // 10, 0).release().perform())
    after = xticks()
    assert after != before and int(after[-1]) - int(after[0]) < int(before[-1]) - int(before[0])
    browser.find_element(By.CSS_SELECTOR, "button.reset").click()
    assert xticks() == before

    # a click on the peak shows what was live there, as the report explains it
    explainer = browser.find_element(By.CSS_SELECTOR, ".explainer")
    assert not explainer.is_displayed()
    browser.find_element(By.CSS_SELECTOR, ".peak circle").click()
    assert explainer.is_displayed() and "Backward peak" in explainer.text
    browser.save_screenshot(str(tmp_path / "viewer.png"))
    assert (tmp_path / "viewer.png").read_bytes()[:4] == b"\x89PNG"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_attention_memory_without_matplotlib_says_it_writes_html(step, tmp_path, monkeypatch,
                                                                  capsys):
    spec = importlib.util.spec_from_file_location("attention_memory",
                                                  ROOT / "examples" / "attention_memory.py")
    am = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(am)
    monkeypatch.setattr(am, "have_matplotlib", lambda: False)
    _, data, _ = step
    written = am.plot_timelines({"a": {"viewer": data}, "b": {"viewer": data}},
                                str(tmp_path / "timelines.png"))
    assert written == [str(tmp_path / "timelines.html")]
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert len(_payload(pathlib.Path(written[0]).read_text())["runs"]) == 2


def test_in_a_browser_titles_phase_labels_and_peak_hover(step, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _, data, _ = step
    page = ta.memory.plot_html({"tiny step": data}, str(tmp_path / "viewer.html"))
    browser.get(pathlib.Path(page).as_uri())
    body = browser.find_element(By.TAG_NAME, "body").text
    assert body.count("tiny step") == 1
    axis_titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "text.axis-title")]
    assert len(axis_titles) == 2 and all(t.startswith("event (") for t in axis_titles)

    # each phase name fits inside its phase as drawn, and no two names overlap
    labels = browser.find_elements(By.CSS_SELECTOR, "text.phase")
    boxes = []
    for e in labels:
        box = browser.execute_script(
            "const b = arguments[0].getBBox(); return [b.x, b.x + b.width];", e)
        assert box[1] - box[0] <= float(e.get_attribute("data-span")), e.text
        boxes.append(box)
    boxes.sort()
    assert all(a[1] <= b[0] for a, b in zip(boxes, boxes[1:]))
    names = [e.text for e in labels]
    assert {"forward", "backward", "optimizer"} <= set(names)
    assert names.count("other") < [p for _, p in data["phases"]].count("other")

    # hovering the peak marker says what a click does, in its title and in the tooltip
    marker = browser.find_element(By.CSS_SELECTOR, ".peak")
    title = marker.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert title == data["peak"]["hover"] and "click" in title
    ActionChains(browser).move_to_element(
        browser.find_element(By.CSS_SELECTOR, ".peak circle")).perform()
    assert browser.find_element(By.ID, "tip").text == data["peak"]["hover"]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
