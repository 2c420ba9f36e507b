"""See the folds in Model Explorer (the optional extra: `pip install 'bnfold[viz]'`).

    bnfold-opt model.mlir -o folded.mlir --visualize      # prints the URL, Ctrl+C stops
    >>> bnfold.viz.show("model.mlir")                      # the same from Python / a notebook

Both remove their temporary copies of the two modules when the server stops
(Ctrl+C, SIGTERM, or an error); `prepare` writes them where you say and keeps them.

Starts Model Explorer's local server and opens the input (left) and the folded
output (right) side by side, each with `bnfold.overlay`'s node data applied when
the page opens. They are two models: the input, and the output with its functions
renamed `NAME (folded)` (Model Explorer renames a graph id that two models share,
which would detach the node data). Each model is its own graph collection because
Model Explorer loads remote node data once per collection, for the graph of that
collection processed first, and selects it only in the pane that shows that graph:
two panes of one collection left the right one uncoloured until its graph was
picked again. The legend is in the colours, in the node data's name (the run shown
in each pane's side panel) and in each value's first word: every op of a
normalization green (FOLDED: into which producer, fold id, channels) or red (NOT
FOLDED: the code, then the reason), the producers that absorbed folds blue
(ABSORBED). The layers (jax.export's name scopes) that hold a marked op open
expanded in both panes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bnfold.errors import BnfoldError
from bnfold.graph import callee_name, calls, functions, symbol_name
from bnfold.ir import Format, ir, location_name, parse, serialize
from bnfold.pipeline import Folded, FoldOptions, fold_source

DEFAULT_PORT = 8080


FOLDED_SUFFIX = " (folded)"  # the output's functions in the right pane
LEGEND = ("green FOLDED (every op of a normalization that folded), red NOT FOLDED (every op "
          "of one that did not, with the code and the reason), blue ABSORBED (a producer "
          "that took folds)")
# The name of bnfold's node data: each pane's side panel lists it, the legend on first sight
# (short enough not to be cut off there at half of a 1800-pixel-wide window).
NODE_DATA_NAME = "green FOLDED, red NOT FOLDED, blue ABSORBED"


@dataclass(frozen=True)
class View:
    """The files one Model Explorer view needs, in one directory."""

    input: Path  # a copy of the input module, <stem>.input.<ext>: the left pane
    output: Path  # the folded module, <stem>.folded.<ext>
    input_overlay: Path  # node data for `input`
    output_overlay: Path  # node data for `output`
    # The right pane: the folded module with its functions renamed NAME (folded) and its
    # locations kept (they name the layers), <stem>.shown.<ext>, and its node data.
    shown: Path
    shown_overlay: Path
    ui_state: dict[str, Any]  # the two panes, and the layers to expand in each


def prepare(source: str | Path, directory: str | Path | None = None,
            options: FoldOptions | None = None) -> View:
    """Folds `source` and writes the modules and their node data to `directory` (a new
    temporary directory by default)."""
    from bnfold import overlay

    source = Path(source)
    folded = fold_source(path=str(source), name=str(source), options=options, graph_nodes=True)
    where = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="bnfold-viz-"))
    where.mkdir(parents=True, exist_ok=True)
    ext = "mlirbc" if source.suffix == ".mlirbc" else "mlir"
    fmt: Format = "bytecode" if ext == "mlirbc" else "mlir"
    before = _named(overlay.input_overlay(folded.report))
    after = _named(folded.output_nodes or {})
    stem = where / source.stem
    view = View(Path(f"{stem}.input.{ext}"), Path(f"{stem}.folded.{ext}"),
                Path(f"{stem}.input.nodedata.json"), Path(f"{stem}.folded.nodedata.json"),
                Path(f"{stem}.shown.{ext}"), Path(f"{stem}.shown.nodedata.json"), {})
    shown_overlay = {graph + FOLDED_SUFFIX: data for graph, data in after.items()}
    with folded.context:
        left = parse(source.read_bytes(), folded.context, name=str(source))
        right = _renamed(folded, fmt)
        shown_bytes = serialize(right, fmt, debug_info=True)  # the locations name the layers
        entry = _entry(left)
        right_entry = _entry(right, entry + FOLDED_SUFFIX)
        view.ui_state.update(paneStates=[
            _pane(view.input.name, entry, _layers(left, before), left=True),
            _pane(view.shown.name, right_entry, _layers(right, shown_overlay), left=False)])
    shutil.copyfile(source, view.input)
    view.output.write_bytes(folded.serialize(fmt))
    view.input_overlay.write_text(json.dumps(before, indent=1))
    view.output_overlay.write_text(json.dumps(after, indent=1))
    view.shown.write_bytes(shown_bytes)
    view.shown_overlay.write_text(json.dumps(shown_overlay, indent=1))
    return view


def _named(node_data: dict[str, Any]) -> dict[str, Any]:
    """`node_data` with each graph's entry named by the legend."""
    return {graph: data | {"name": NODE_DATA_NAME} for graph, data in node_data.items()}


def _renamed(folded: Folded, fmt: Format) -> ir.Module:
    """A copy of the folded module (locations kept) with every function renamed
    `NAME (folded)` and the calls retargeted."""
    copy = parse(serialize(folded.module, fmt, debug_info=True), folded.context,
                 name="<folded>")
    renamed = {symbol_name(f): symbol_name(f) + FOLDED_SUFFIX for f in functions(copy)}
    for func in functions(copy):
        func.attributes["sym_name"] = ir.StringAttr.get(renamed[symbol_name(func)])
    for call in calls(list(functions(copy))):
        if callee_name(call) in renamed:
            call.attributes["callee"] = ir.FlatSymbolRefAttr.get(renamed[callee_name(call)])
    return copy


def _layers(module: ir.Module, node_data: dict[str, Any]) -> dict[str, set[str]]:
    """Per graph, Model Explorer's ids of the layers (the name scopes of the ops'
    locations) that hold an op with node data."""
    from bnfold import overlay

    marked = {(graph, node) for graph, data in node_data.items() for node in data["results"]}
    layers: dict[str, set[str]] = {}
    for op, ref in overlay.nodes(module):
        name = location_name(op.location) if ref in marked else None
        if name and "/" in name:  # Model Explorer's layer: the name scope around the op
            layers.setdefault(ref[0], set()).add(name.rsplit("/", 1)[0] + "___group___")
    return layers


def _entry(module: ir.Module, preferred: str = "main") -> str:
    """The function a pane opens: `preferred` where the module has it, else the first."""
    names = [symbol_name(f) for f in functions(module)]
    return preferred if preferred in names or not names else names[0]


def _pane(collection: str, graph: str, layers: dict[str, set[str]], left: bool
          ) -> dict[str, Any]:
    return {"deepestExpandedGroupNodeIds": sorted(layers.get(graph, ())), "selectedNodeId": "",
            "selectedGraphId": graph, "selectedCollectionLabel": collection,
            "widthFraction": 0.5, "selected": left, "flattenLayers": False}


def config(view: View) -> Any:
    """A Model Explorer config: the two models, each with its node data (its own graph
    collection: see the module docstring), and the UI state (two panes, layers expanded)
    in the address the server opens."""
    model_explorer = _model_explorer()
    base = type(model_explorer.config())

    class _Config(base):  # type: ignore[misc,valid-type]
        def to_url_param_value(self) -> str:
            data = json.loads(urllib.parse.unquote(super().to_url_param_value()))
            data["uiState"] = view.ui_state
            return urllib.parse.quote(json.dumps(data))

    cfg = _Config()
    cfg.add_model_from_path(str(view.input))
    cfg.add_model_from_path(str(view.shown))
    cfg.add_node_data_from_path(str(view.input_overlay), model_name=view.input.name)
    cfg.add_node_data_from_path(str(view.shown_overlay), model_name=view.shown.name)
    return cfg


def url(view: View, host: str = "localhost", port: int = DEFAULT_PORT) -> str:
    """The address at which `serve` shows `view`."""
    return f"http://{host}:{port}/?data={config(view).to_url_param_value()}"


def serve(view: View, host: str = "localhost", port: int = DEFAULT_PORT,
          open_browser: bool = False) -> None:
    """Runs Model Explorer's server for `view` until interrupted (Ctrl+C, or SIGTERM from
    the main thread). Raises `BnfoldError` when `port` is taken."""
    model_explorer = _model_explorer()
    check_port(host, port)
    with _terminate_as_interrupt():
        try:
            model_explorer.visualize_from_config(config(view), host=host, port=port,
                                                 no_open_in_browser=not open_browser)
        except SystemExit:  # Model Explorer exits when it finds the port taken (a race)
            raise BnfoldError(_busy(host, port)) from None


@contextlib.contextmanager
def session(source: str | Path, *, options: FoldOptions | None = None) -> Iterator[View]:
    """`prepare` into a new temporary directory that is removed when the block exits,
    however it exits (the two modules of a ResNet-50 are hundreds of MB)."""
    directory = tempfile.mkdtemp(prefix="bnfold-viz-")
    try:
        yield prepare(source, directory, options=options)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def show(source: str | Path, *, options: FoldOptions | None = None, host: str = "localhost",
         port: int = DEFAULT_PORT, open_browser: bool = True) -> None:
    """Folds `source` and shows input and output in Model Explorer (blocks until
    interrupted, as Model Explorer's own `visualize` does); the files go when it stops."""
    check_port(host, port)  # before any work
    with session(source, options=options) as view:
        serve(view, host, port, open_browser)


def check_port(host: str, port: int) -> None:
    """Raises `BnfoldError` when something already listens on `host:port`."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        try:
            taken = probe.connect_ex((host, port)) == 0
        except OSError as e:  # an unknown host name
            raise BnfoldError(f"cannot serve on {host}:{port}: {e}") from None
    if taken:
        raise BnfoldError(_busy(host, port))


def _busy(host: str, port: int) -> str:
    return (f"port {port} on {host} is in use (another Model Explorer?); choose a free one "
            f"with --visualize-port PORT (bnfold.viz: port=)")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT stop the server as Ctrl+C does (Model Explorer returns on
    KeyboardInterrupt), so the caller's cleanup runs; the old handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a process started in the background of a script inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler of its own.
    previous = {number: signal.signal(number, interrupt)
                for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Standard output goes to standard error for the block, at the descriptor level:
    Model Explorer prints its banner and URL on stdout (Python prints and anything its
    threads write), and `bnfold-opt model.mlir --visualize > folded.mlir` must leave
    nothing but the module in that stream. What was written before is flushed first."""
    import sys

    for stream in (sys.stdout, sys.__stdout__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    try:
        saved: int | None = os.dup(1)
    except OSError:  # stdout was closed: nothing to restore
        saved = None
    os.dup2(2, 1)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.__stdout__):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()  # what the block printed goes where it was meant to
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
        else:
            os.close(1)


def check_installed() -> None:
    """Raises `BnfoldError` when the `viz` extra is missing."""
    _model_explorer()


def _model_explorer() -> Any:
    try:
        import model_explorer
    except ImportError:
        raise BnfoldError("Model Explorer is not installed: pip install 'bnfold[viz]', or from "
                          "a checkout pip install -e '.[viz]' (ai-edge-model-explorer)") from None
    return model_explorer
