"""See the folds in Model Explorer (the optional extra: `pip install 'bnfold[viz]'`).

    bnfold-opt model.mlir -o folded.mlir --visualize      # prints the URL, Ctrl+C stops
    >>> bnfold.viz.show("model.mlir")                      # the same from Python / a notebook

Both remove their temporary copies of the two modules when the server stops
(Ctrl+C, SIGTERM, or an error); `prepare` writes them where you say and keeps them.

Starts Model Explorer's local server on localhost with two models, the input
and the folded output, and `bnfold.overlay`'s node data on each: normalization
ops green (folded: into which producer, fold id, channels) or red (not folded,
with the reason), producers that absorbed folds blue. Pick "bnfold" in the node
data panel of each model; open the second model in a split pane to compare.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bnfold.errors import BnfoldError
from bnfold.pipeline import FoldOptions, fold_source

DEFAULT_PORT = 8080


@dataclass(frozen=True)
class View:
    """The files one Model Explorer view needs, in one directory."""

    input: Path  # a copy of the input module, named <stem>.input.<ext>
    output: Path  # the folded module, <stem>.folded.<ext>
    input_overlay: Path
    output_overlay: Path


def prepare(source: str | Path, directory: str | Path | None = None,
            options: FoldOptions | None = None) -> View:
    """Folds `source` and writes the two modules and their node data to
    `directory` (a new temporary directory by default)."""
    from bnfold import overlay

    source = Path(source)
    folded = fold_source(path=str(source), name=str(source), options=options, graph_nodes=True)
    where = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="bnfold-viz-"))
    where.mkdir(parents=True, exist_ok=True)
    ext = "mlirbc" if source.suffix == ".mlirbc" else "mlir"
    view = View(where / f"{source.stem}.input.{ext}", where / f"{source.stem}.folded.{ext}",
                where / f"{source.stem}.input.nodedata.json",
                where / f"{source.stem}.folded.nodedata.json")
    shutil.copyfile(source, view.input)
    with folded.context:  # first: it removes the marks the fold left on producers
        after = overlay.output_overlay(folded.module, folded.report)
    view.output.write_bytes(folded.serialize("bytecode" if ext == "mlirbc" else "mlir"))
    view.input_overlay.write_text(json.dumps(overlay.input_overlay(folded.report), indent=1))
    view.output_overlay.write_text(json.dumps(after, indent=1))
    return view


def config(view: View) -> Any:
    """A Model Explorer config with both models and each one's node data."""
    model_explorer = _model_explorer()
    cfg = model_explorer.config()
    cfg.add_model_from_path(str(view.input)).add_model_from_path(str(view.output))
    cfg.add_node_data_from_path(str(view.input_overlay), model_name=view.input.name)
    cfg.add_node_data_from_path(str(view.output_overlay), model_name=view.output.name)
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
