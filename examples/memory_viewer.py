"""The memory ledger's pictures of one small GPT training step.

    python examples/memory_viewer.py [--out DIR] [--screenshot docs/memory-viewer.png]

Writes DIR/memory.html, the interactive viewer (one file, nothing fetched: hover a band or
an allocation, drag or wheel to zoom, click the red peak marker) and, with matplotlib,
DIR/memory.png. `--screenshot PATH` also opens the viewer in headless Chromium (Debian's
chromium and chromium-driver, driven by selenium), hovers the largest allocation, clicks
the peak and saves what the browser shows: the README's picture is made this way.
"""

import argparse
import os
import sys
import tempfile

import nn
import tinygrad_attn as ta

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# without the networking switches Chromium keeps calling home, which a closed network floods
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")


def tiny_step(source_lines: bool = True):
    """One forward, backward and AdamW step of a 2-layer GPT under the ledger: (profile,
    model). Keep the model while drawing: a tag set after the profile is read live."""
    ta.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32))
    opt = nn.optim.AdamW(model.parameters(), lr=1e-3)
    idx, targets = ta.randint(0, 65, (4, 32)), ta.randint(0, 65, (4, 32))
    with ta.memory.profile(source_lines=source_lines) as prof:
        logits, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return prof, model


def chromium_driver(user_data_dir: str, width: int = 1040, height: int = 1100):
    """A headless Chromium under selenium, with its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}",
                 f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def screenshot(html_path: str, png_path: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory() as profile_dir:
        driver = chromium_driver(profile_dir)
        try:
            driver.get("file://" + os.path.abspath(html_path))
            driver.find_element(By.CSS_SELECTOR, ".peak circle").click()
            allocs = driver.find_elements(By.CSS_SELECTOR, "rect.alloc")
            biggest = max(allocs, key=lambda e: e.size["width"] * e.size["height"])
            ActionChains(driver).move_to_element(biggest).perform()
            driver.save_screenshot(png_path)
        finally:
            driver.quit()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".", help="folder for memory.html and memory.png")
    p.add_argument("--screenshot", help="also save the viewer, as a browser shows it, here")
    args = p.parse_args(argv)
    try:
        os.makedirs(args.out, exist_ok=True)
        if args.screenshot and os.path.dirname(args.screenshot):
            os.makedirs(os.path.dirname(args.screenshot), exist_ok=True)
    except OSError as e:
        p.error(f"cannot create the output folder: {e.strerror or e}: {e.filename}")
    prof, _model = tiny_step()  # alive while drawing
    title = "one training step of a 2-layer GPT"
    print(prof.report().split("\n\n")[0])
    html = prof.plot_html(os.path.join(args.out, "memory.html"), title=title)
    print(f"wrote {os.path.abspath(html)} (open it in a browser)")
    try:
        png = prof.plot(os.path.join(args.out, "memory.png"), title=title)
        print(f"wrote {os.path.abspath(png)}")
    except ImportError:
        print("no matplotlib: memory.png not written (pip install matplotlib)")
    if args.screenshot:
        screenshot(html, args.screenshot)
        print(f"wrote {os.path.abspath(args.screenshot)}")


if __name__ == "__main__":
    try:
        main()
    except MemoryError as e:  # one line, not NumPy's traceback
        print(f"memory_viewer.py: error: out of memory: {e}", file=sys.stderr)
        raise SystemExit(2) from None
