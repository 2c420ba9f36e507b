#!/usr/bin/env python3
"""Screenshot of `bnfold-opt --visualize` (the README's Model Explorer picture).

Runs `python -m bnfold IN -o OUT --visualize` (needs the `bnfold[viz]` extra),
waits for the URL it prints, opens it in headless Chromium through Playwright,
opens the folded module in a split pane next to the input and saves a PNG:
the input graph with bnfold's node data applied (folded normalization ops
green, ops that did not fold red) and the folded graph beside it.

    pip install playwright            # the Python driver only; the browser is Debian's
    apt-get install chromium          # /usr/bin/chromium
    python tools/screenshot_viz.py model.mlir shot.png [--port 8124] [--wait 15]

The README's picture:

    python tools/screenshot_viz.py testdata/models/keras_densenet121_block_nhwc.mlir \
        tools/screenshots/model-explorer-densenet121.png

a Keras DenseNet121 prefix up to conv2_block2_concat, where the pre-activation
batch norms after the pooling and the concatenate cannot fold.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("--wait", type=float, default=15.0,
                        help="seconds for Model Explorer to convert and lay out the graph")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--single", action="store_true",
                        help="only the input graph (default: input and output side by side)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, "-m", "bnfold", str(args.module), "-o", f"{tmp}/folded.mlir",
             "--visualize", "--visualize-port", str(args.port)],
            stderr=subprocess.PIPE, text=True)  # the URL is on stderr (stdout: the module's)
        try:
            url = _url(server)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium,
                                            args=["--no-sandbox", "--enable-unsafe-swiftshader"])
                page = browser.new_page(viewport={"width": 1800, "height": 1000})
                page.goto(url)
                time.sleep(args.wait)
                if not args.single:
                    _open_output_in_split_pane(page, args.wait)
                page.screenshot(path=str(args.png))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {args.png}")
    return 0


def _open_output_in_split_pane(page: Any, wait: float) -> None:
    """Graph selector -> the folded module's `main (2)` row -> its split-pane icon
    (the last thing on the row, at the selector panel's right edge)."""
    page.get_by_text(" nodes").first.click()
    time.sleep(1.5)
    panel = page.get_by_placeholder("Filter graphs").bounding_box()
    row = page.get_by_text("main (2)").first.bounding_box()
    page.mouse.click(panel["x"] + panel["width"] - 10, row["y"] + row["height"] / 2)
    time.sleep(wait)


def _url(server: subprocess.Popen[str]) -> str:
    assert server.stderr is not None
    stderr = server.stderr
    for line in stderr:
        if line.startswith("http://"):
            # Keep draining (the server's request log) so a full pipe never blocks it.
            threading.Thread(target=lambda: [sys.stderr.write(rest) for rest in stderr],
                             daemon=True).start()
            return line.strip()
    raise SystemExit(f"bnfold-opt --visualize exited ({server.wait()}) without a URL")


if __name__ == "__main__":
    sys.exit(main())
