"""Model Explorer node data (`bnfold-opt --report-overlay`, bnfold.overlay)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bnfold
import support
from bnfold import overlay
from bnfold.cli import main, overlay_output_path

# One batch norm folds (after the convolution); the other normalizes a function
# argument, so nothing can absorb it.
MODULE = """
func.func @main(%x: tensor<1x4x4x2xf32>, %y: tensor<1x4x4x2xf32>) -> (tensor<1x4x4x2xf32>, tensor<1x4x4x2xf32>) {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %c = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %m = stablehlo.multiply %c, %sb : tensor<1x4x4x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x4x4x2xf32>
  %m2 = stablehlo.multiply %y, %sb : tensor<1x4x4x2xf32>
  %a2 = stablehlo.add %m2, %tb : tensor<1x4x4x2xf32>
  return %a, %a2 : tensor<1x4x4x2xf32>, tensor<1x4x4x2xf32>
}
"""


def _ops(text: str) -> dict[tuple[str, str], str]:
    """(graph, node id) -> op name, by bnfold.overlay.nodes."""
    context, module = support.parse(text)
    with context:
        return {ref: op.name for op, ref in overlay.nodes(module)}


def test_input_overlay_marks_folded_and_skipped_ops_with_reasons(tmp_path: Path):
    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    out, data = tmp_path / "folded.mlir", tmp_path / "folds.json"
    assert main([str(src), "-o", str(out), "--report-overlay", str(data)]) == 0
    before = json.loads(data.read_text())["main"]
    assert before["name"] == "bnfold"
    ops = _ops(MODULE)
    marked = {node: entry for node, entry in before["results"].items()}
    folded = {n: e for n, e in marked.items() if e["bgColor"] == overlay.FOLDED}
    skipped = {n: e for n, e in marked.items() if e["bgColor"] == overlay.SKIPPED}
    # The first multiply and add folded into the convolution (fold0) ...
    assert sorted(ops[("main", n)] for n in folded) == ["stablehlo.add", "stablehlo.multiply"]
    assert all("fold0" in e["value"] and "stablehlo.convolution" in e["value"]
               for e in folded.values())
    # ... the second normalization is red on every op (issue 32 item 7: it was one op, where
    # a folded one is all of its ops), each with the code first and then the reason.
    assert sorted(ops[("main", n)] for n in skipped) == ["stablehlo.add", "stablehlo.multiply"]
    (reason,) = {e["value"] for e in skipped.values()}
    assert reason.startswith("NOT FOLDED (no-producer): ") and "argument" in reason
    after = json.loads((tmp_path / "folds.output.json").read_text())["main"]["results"]
    folded_ops = _ops(out.read_text())
    assert [(folded_ops[("main", n)], e["value"]) for n, e in after.items()] == \
        [("stablehlo.convolution", "ABSORBED fold0")]


def test_report_overlay_needs_a_file(tmp_path: Path):
    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    assert main([str(src), "-o", str(tmp_path / "o.mlir"), "--report-overlay", "-"]) == 1
    assert main([str(src), "--split-input-file", "-o", str(tmp_path / "o.mlir"),
                 "--report-overlay", str(tmp_path / "x.json")]) == 1


def test_overlay_output_path():
    assert overlay_output_path("a/folds.json") == "a/folds.output.json"
    assert overlay_output_path("folds") == "folds.output.json"
    assert overlay_output_path("dir.d/folds") == "dir.d/folds.output.json"


def test_graph_nodes_are_recorded_only_on_request():
    folded = bnfold.fold_source(MODULE)
    assert all(not f.nodes for f in folded.report.folds)
    folded = bnfold.fold_source(MODULE, graph_nodes=True)
    assert folded.report.folds[0].nodes and folded.report.skipped[0].nodes


@pytest.mark.parametrize("pipeline", [None, "builtin.module(bnfold-fold,cse)"])
def test_graph_nodes_leave_no_marks_in_the_output(pipeline):
    """Issue 31 item 10: from the Python API, `bnfold.absorbed` stayed in the output IR (only
    the CLI removed it); the marks come back as the output graph's node data instead."""
    folded = bnfold.fold_source(MODULE, graph_nodes=True, pass_pipeline=pipeline)
    assert "bnfold." not in folded.serialize().decode()
    (entry,) = folded.output_nodes["main"]["results"].values()
    assert entry["value"] == f"ABSORBED {folded.report.folds[0].id}"
    assert bnfold.fold_source(MODULE).output_nodes is None


ADAPTER_CASES = ["models/deployment_flax_resnet18_multiplatform_nhwc.mlir",  # case regions
                 "models/deployment_jax_jit_conv_helper_nhwc.mlir",  # private functions
                 "models/keras_efficientnet_stem_nhwc.mlir",  # name locations
                 "models/torchax_resnet_nchw.mlir", "conv2d_nhwc_bn.mlir"]


@pytest.mark.parametrize("name", ADAPTER_CASES)
def test_node_ids_match_the_model_explorer_adapter(name):
    """Every op's node id is the one Model Explorer's MLIR adapter gives it
    (skipped without the `viz` extra)."""
    adapter = pytest.importorskip("model_explorer.builtin_mlir_adapter")
    path = support.TESTDATA / name
    graphs = adapter.BuiltinMlirAdapter().convert(str(path), {})["graphCollections"]
    labels: dict[tuple[str, str], str] = {}
    for collection in graphs:
        for graph in _get(collection, "graphs"):
            for node in _get(graph, "nodes"):
                labels[(_get(graph, "id"), _get(node, "id"))] = _get(node, "label")
    ours = _ops(path.read_text())
    assert ours, name
    for ref, op_name in ours.items():
        expected = "Outputs" if op_name in ("func.return", "stablehlo.return") else op_name
        assert labels.get(ref) == expected, (ref, op_name, labels.get(ref))


def _get(obj, key):
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


def test_viz_prepare_writes_both_models_and_their_node_data(tmp_path: Path):
    from bnfold import viz

    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    view = viz.prepare(src, tmp_path / "view")
    assert view.input.read_text() == MODULE
    assert "stablehlo.convolution" in view.output.read_text()
    before = json.loads(view.input_overlay.read_text())["main"]["results"]
    after = json.loads(view.output_overlay.read_text())["main"]["results"]
    assert len(before) == 4 and list(after.values())[0]["value"] == "ABSORBED fold0"
    # What Model Explorer opens (issue 32 item 7): the input on the left and the folded
    # module on the right, its functions renamed (Model Explorer would rename a graph id two
    # models share, detaching its node data), each model with its own node data.
    shown = view.shown.read_text()
    assert '@"main (folded)"(' in shown and "@main(" not in shown
    assert "stablehlo.convolution" in shown and "loc(" in shown  # the locations name layers
    context, module = support.parse(shown)
    with context:
        graphs = {graph for _, (graph, _) in overlay.nodes(module)}
    data = json.loads(view.shown_overlay.read_text())
    assert set(data) == {"main (folded)"} <= graphs
    assert data["main (folded)"]["results"] == after
    assert {d["name"] for d in data.values()} == {viz.NODE_DATA_NAME}
    panes = view.ui_state["paneStates"]
    assert [(p["selectedCollectionLabel"], p["selectedGraphId"], p["widthFraction"])
            for p in panes] == [(view.input.name, "main", 0.5),
                                (view.shown.name, "main (folded)", 0.5)]


def test_visualize_without_the_extra_is_a_clear_error(tmp_path: Path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_model_explorer(name, *args, **kwargs):
        if name == "model_explorer":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_model_explorer)
    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    assert main([str(src), "-o", str(tmp_path / "o.mlir"), "--visualize"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bnfold-opt: ") and "bnfold[viz]" in err
    assert "pip install -e '.[viz]'" in err  # what works from a checkout
    assert not (tmp_path / "o.mlir").exists()  # checked before any work


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_visualize(tmp_path: Path, port: int, output: str | None = None):
    """`python -m bnfold model.mlir --visualize` with its own TMPDIR (output `-o o.mlir`, or
    `output`); returns the process and the URL it printed (on stderr: stdout is the
    module's stream). Lines before the URL are kept in the process's `banner` attribute."""
    import os
    import queue
    import subprocess
    import sys
    import threading

    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "bnfold", str(src), "-o",
                               output or str(tmp_path / "o.mlir"),
                               "--visualize", "--visualize-port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"TMPDIR": str(temp)})
    assert server.stderr is not None
    stderr = server.stderr
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:  # until the URL (a reader thread: a missing URL must not hang)
        for line in stderr:
            lines.put(line)
            if line.startswith("http://"):
                return
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    server.banner = []  # type: ignore[attr-defined]
    url = None
    while url is None:
        try:
            line = lines.get(timeout=120)
        except queue.Empty:
            line = None
        if line is None:
            server.kill()
            out, _ = server.communicate(timeout=30)
            pytest.fail(f"no URL on stderr; stderr: {''.join(server.banner)!r}; "  # type: ignore[attr-defined]
                        f"stdout: {out[:2000]!r}")
        server.banner.append(line)  # type: ignore[attr-defined]
        if line.startswith("http://"):
            url = line.strip()
    return server, url, temp


def test_visualize_serves_the_input_and_the_folded_module(tmp_path: Path):
    """`bnfold-opt --visualize` starts Model Explorer on localhost with both
    models and their node data (skipped without the `viz` extra)."""
    pytest.importorskip("model_explorer")
    import urllib.parse
    import urllib.request

    server, url, temp = _start_visualize(tmp_path, _free_port())
    try:
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200
        data = json.loads(urllib.parse.unquote(url.split("data=", 1)[1]))
        models = [Path(m["url"]) for m in data["models"]]
        assert [m.name for m in models] == ["model.input.mlir", "model.shown.mlir"]
        assert all(m.parent.parent == temp for m in models)
        # Each model its own collection, with its own node data (issue 32 item 7).
        assert data["nodeDataTargets"] == [m.name for m in models]
        before, after = [json.loads(Path(p).read_text()) for p in data["nodeData"]]
        assert set(before) == {"main"} and set(after) == {"main (folded)"}
        assert before["main"]["results"] and after["main (folded)"]["results"]
        panes = data["uiState"]["paneStates"]
        assert [(p["selectedCollectionLabel"], p["selectedGraphId"]) for p in panes] == \
            [("model.input.mlir", "main"), ("model.shown.mlir", "main (folded)")]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_visualize_leaves_only_the_module_on_stdout(tmp_path: Path):
    """`bnfold-opt model.mlir --visualize > folded.mlir`: Model Explorer's banner and URL go
    to stderr, so the module's stream parses back as the folded module (issue 32: it read
    "custom op 'Loading' is unknown")."""
    pytest.importorskip("model_explorer")
    import signal

    server, url, temp = _start_visualize(tmp_path, _free_port(), output="-")
    try:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    finally:
        server.kill()
    banner = "".join(server.banner) + err  # type: ignore[attr-defined]
    assert "Model Explorer stopped" in banner and "Traceback" not in banner
    assert "Loading" in banner  # the banner went somewhere: to stderr
    expected, _ = bnfold.fold_text(MODULE)
    assert out == expected, out[:500]
    context, module = support.parse(out)  # the stream is one module, nothing else
    with context:
        assert "stablehlo.convolution" in str(module)


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_visualize_removes_its_temporary_files_when_stopped(signal_name, tmp_path: Path):
    """Ctrl+C and SIGTERM stop the server and remove both module copies (issue 26: hundreds
    of MB for a ResNet-50 stayed in /tmp); the outputs written before stay."""
    pytest.importorskip("model_explorer")
    import signal

    server, url, temp = _start_visualize(tmp_path, _free_port())
    try:
        assert [p.name.startswith("bnfold-viz-") for p in temp.iterdir()] == [True]
        server.send_signal(getattr(signal, signal_name))
        _, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert list(temp.iterdir()) == [], err
    assert "Model Explorer stopped" in err and "Traceback" not in err
    assert (tmp_path / "o.mlir").exists()


def test_visualize_on_a_busy_port_names_the_option_and_writes_nothing(tmp_path: Path):
    pytest.importorskip("model_explorer")
    import os
    import socket
    import subprocess
    import sys

    src = tmp_path / "model.mlir"
    src.write_text(MODULE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    with socket.socket() as busy:
        busy.bind(("localhost", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "bnfold", str(src), "-o",
                               str(tmp_path / "o.mlir"), "--visualize", "--visualize-port",
                               str(port)], capture_output=True, text=True, timeout=120,
                              env=os.environ | {"TMPDIR": str(temp)})
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"bnfold-opt: error: port {port} on localhost is in use"), \
        proc.stderr
    assert "--visualize-port" in proc.stderr
    assert not (tmp_path / "o.mlir").exists() and list(temp.iterdir()) == []


def test_visualize_in_a_real_browser_shows_the_folds_expanded_and_side_by_side(tmp_path: Path):
    """Issue 32 item 7, judged on pixels: headless Chromium loads `--visualize`'s page and,
    with nothing clicked, the left pane is the input with the ops of a folded normalization
    green and every op of a refused one red, drawn in the graph itself (a collapsed layer
    would hide them: jax.export's name scopes), and the right pane is the folded graph with
    the producer that absorbed the fold blue (Model Explorer applies node data to one pane
    per model: the right pane stayed grey until its graph was picked again); each pane's
    side panel names the node data by the legend. Needs the viz extra, Playwright and a
    Chromium (CI installs all three)."""
    pytest.importorskip("model_explorer")
    pytest.importorskip("playwright")
    import shutil
    import sys

    from bnfold import viz

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    try:
        import screenshot_viz
    finally:
        sys.path.pop(0)
    src = tmp_path / "scoped.mlir"
    src.write_text(_scoped_module())
    panes = screenshot_viz.capture(src, tmp_path / "shot.png", port=_free_port(), wait=60.0,
                                   chromium=chromium)
    assert [p.title.split(" | ")[-1] for p in panes] == ["main", "main (folded)"], panes
    left, right = (p.colours for p in panes)
    assert left["folded"] > 200 and left["not folded"] > 200, panes
    assert left["absorbed"] == 0, panes
    # Block_0's convolution absorbed fold0; Block_1's did not (its result is also returned).
    assert right["absorbed"] > 200 and right["folded"] == right["not folded"] == 0, panes
    assert [p.node_data for p in panes] == [[viz.NODE_DATA_NAME]] * 2, panes


def _scoped_module() -> str:
    """Two conv + batch-norm blocks under jax.named_scope (Model Explorer draws each scope as
    a layer), the second with a conv result also returned (not folded: 'users')."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(3)
    k = rng.normal(size=(2, 3, 3, 4, 4)).astype(np.float32)
    m, b = rng.normal(size=(2, 2, 4)).astype(np.float32)
    v, g = rng.uniform(0.5, 2.0, size=(2, 2, 4)).astype(np.float32)

    def f(x):
        outs = []
        for i in range(2):
            with jax.named_scope(f"Block_{i}"):
                y = jax.lax.conv_general_dilated(x, k[i], (1, 1), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
                x = jax.nn.relu((y - m[i]) * jax.lax.rsqrt(v[i] + 1e-5) * g[i] + b[i])
                outs.append(y)
        return x, outs[1]

    spec = jax.ShapeDtypeStruct((1, 6, 6, 4), jnp.float32)
    return jax.export.export(jax.jit(f))(spec).mlir_module()
