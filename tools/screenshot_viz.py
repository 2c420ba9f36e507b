#!/usr/bin/env python3
"""Screenshot of `bnfold-opt --visualize` (the Model Explorer picture in docs/report.md).

Runs `python -m bnfold IN -o OUT --visualize` (needs the `bnfold[viz]` extra),
waits for the URL it prints, opens it in headless Chromium through Playwright,
waits for Model Explorer to lay out both panes and saves a PNG of the page as it
opens, with no clicks: the input graph (left) with bnfold's node data applied
(folded normalization ops green, ops that did not fold red) and the folded graph
(right) with the producers that absorbed folds blue.

    pip install playwright            # the Python driver only; the browser is Debian's
    apt-get install chromium          # /usr/bin/chromium
    python tools/screenshot_viz.py model.mlir shot.png [--port 8124] [--wait 15]

The picture in docs/report.md:

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
from typing import Any, NamedTuple


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("--wait", type=float, default=30.0,
                        help="at most this many seconds after the graphs appear for both "
                             "panes to show bnfold's colours")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    panes = capture(args.module, args.png, port=args.port, wait=args.wait, chromium=args.chromium)
    for pane in panes:
        print(f"{pane.title}: " + ", ".join(f"{n} {name} pixels"
                                           for name, n in pane.colours.items())
              + f"; node data {pane.node_data}")
    print(f"wrote {args.png}")
    return 0


class Pane(NamedTuple):
    """One pane as the page drew it."""

    title: str  # "MODEL FILE | GRAPH"
    colours: dict[str, int]  # pixels of each of bnfold's colours in the pane's graph
    node_data: list[str]  # the node data runs its side panel lists (their names)


COLOURS = {"folded": (0xa5, 0xd6, 0xa7), "not folded": (0xef, 0x9a, 0x9a), "absorbed": (0x90, 0xca, 0xf9)}


def capture(module: Path, png: Path, *, port: int = 8124, wait: float = 30.0,
            chromium: str = "/usr/bin/chromium") -> list[Pane]:
    """Serves `module` with `bnfold-opt --visualize`, loads the page in headless Chromium
    and, clicking nothing, waits (at most `wait` seconds after the graphs appear) until
    every pane shows one of bnfold's colours; saves a screenshot and returns the panes."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, "-m", "bnfold", str(module), "-o", f"{tmp}/folded.mlir",
             "--visualize", "--visualize-port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # the URL is on stderr
        try:
            url = _url(server)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium,
                                            args=["--no-sandbox", "--enable-unsafe-swiftshader"])
                page = browser.new_page(viewport={"width": 1800, "height": 1000})
                page.goto(url)
                page.wait_for_selector("canvas", timeout=120_000)
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    panes = _panes(page)
                    if len(panes) == 2 and all(any(p.colours.values()) for p in panes):
                        break
                    time.sleep(1.0)
                time.sleep(2.0)  # the layout's animation
                page.screenshot(path=str(png))
                panes = _panes(page)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    return panes


def _panes(page: Any) -> list[Pane]:
    """Each graph canvas's pane: its title, its colour counts (element screenshots,
    decoded by the browser itself: no image library needed), and the node data runs
    listed between it and the next pane (its side panel)."""
    import base64

    graphs = []
    canvases = page.locator("canvas")
    for i in range(canvases.count()):
        canvas = canvases.nth(i)
        box = canvas.bounding_box()
        if box is None or box["width"] < 200:
            continue  # not a graph (icons, minimaps)
        png = base64.b64encode(canvas.screenshot()).decode()
        counts = page.evaluate(_COUNT_JS, {"png": png, "colours": COLOURS})
        graphs.append((box["x"], {name: int(n) for name, n in counts.items()}))
    titles = page.locator(".pane-title")
    runs = page.locator(".run-name")
    found = []
    for k, (x, counts) in enumerate(graphs):
        end = graphs[k + 1][0] if k + 1 < len(graphs) else float("inf")
        title = titles.nth(k).inner_text().strip() if titles.count() > k else ""
        names = [runs.nth(j).inner_text().strip() for j in range(runs.count())
                 if x <= (runs.nth(j).bounding_box() or {"x": -1.0})["x"] < end]
        found.append(Pane(title, counts, names))
    return found


_COUNT_JS = """async ({png, colours}) => {
  const image = new Image();
  image.src = "data:image/png;base64," + png;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width; canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  const counts = {};
  for (const [name, rgb] of Object.entries(colours)) {
    let n = 0;
    for (let k = 0; k < data.length; k += 4) {
      if (Math.abs(data[k] - rgb[0]) <= 6 && Math.abs(data[k + 1] - rgb[1]) <= 6 &&
          Math.abs(data[k + 2] - rgb[2]) <= 6) n++;
    }
    counts[name] = n;
  }
  return counts;
}"""


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
