#!/usr/bin/env python3
"""Screenshot of `bnfold-opt --visualize` (the Model Explorer picture in docs/report.md).

Runs `python -m bnfold IN -o OUT --visualize` (needs the `bnfold[viz]` extra),
waits for the URL it prints, opens it in headless Chromium through Playwright,
opens the folded module in a split pane next to the input and saves a PNG:
the input graph with bnfold's node data applied (folded normalization ops
green, ops that did not fold red) and the folded graph beside it.

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
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("--wait", type=float, default=15.0,
                        help="seconds for Model Explorer to convert and lay out the graphs")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    panes = capture(args.module, args.png, port=args.port, wait=args.wait, chromium=args.chromium)
    for title, colours in panes:
        print(f"{title}: " + ", ".join(f"{n} {name} pixels" for name, n in colours.items()))
    print(f"wrote {args.png}")
    return 0


COLOURS = {"folded": (0xa5, 0xd6, 0xa7), "not folded": (0xef, 0x9a, 0x9a), "absorbed": (0x90, 0xca, 0xf9)}


def capture(module: Path, png: Path, *, port: int = 8124, wait: float = 15.0,
            chromium: str = "/usr/bin/chromium") -> list[tuple[str, dict[str, int]]]:
    """Serves `module` with `bnfold-opt --visualize`, loads the page in headless Chromium,
    shows the right pane's node data too (Model Explorer selects it in the first pane only),
    saves a screenshot, and returns each pane's title with the count of pixels of each of
    bnfold's colours inside that pane's graph (the drawing, not the side panel's table)."""
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
                time.sleep(wait)
                _colour_right_pane(page, wait)
                page.screenshot(path=str(png))
                panes = _panes(page, Path(tmp))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    return panes


def _colour_right_pane(page: Any, wait: float) -> None:
    """Model Explorer applies node data to the pane open when it loads (the left one); the
    right pane gets it when its graph is picked again: select the pane, pick another graph,
    then the folded one (what the CLI tells a person to do)."""
    page.get_by_text(f"| main{FOLDED}").first.click()
    time.sleep(1.0)
    for name in ("main", f"main{FOLDED}"):
        page.get_by_text(" nodes").first.click()
        time.sleep(1.5)
        page.get_by_text(name, exact=True).last.click()
        time.sleep(wait / 3)


FOLDED = " (folded)"  # bnfold.viz.FOLDED_SUFFIX (this tool runs without importing bnfold)


def _panes(page: Any, tmp: Path) -> list[tuple[str, dict[str, int]]]:
    """Each graph canvas's pane title and colour counts (element screenshots, decoded by
    the browser itself: no image library needed)."""
    import base64

    found = []
    canvases = page.locator("canvas")
    titles = page.get_by_text(" | main", exact=False)
    for i in range(canvases.count()):
        canvas = canvases.nth(i)
        box = canvas.bounding_box()
        if box is None or box["width"] < 200:
            continue  # not a graph (icons, minimaps)
        png = base64.b64encode(canvas.screenshot()).decode()
        counts = page.evaluate(_COUNT_JS, {"png": png, "colours": COLOURS})
        title = titles.nth(len(found)).inner_text() if titles.count() > len(found) else ""
        found.append((title.strip(), {name: int(n) for name, n in counts.items()}))
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
