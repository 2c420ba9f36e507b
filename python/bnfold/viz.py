"""See the folds in Model Explorer (the optional extra: `pip install 'bnfold[viz]'`).

    bnfold-opt model.mlir -o folded.mlir --visualize      # prints the URL, Ctrl+C stops
    >>> bnfold.viz.show("model.mlir")                      # the same from Python / a notebook

Starts Model Explorer's local server on localhost with two models, the input
and the folded output, and `bnfold.overlay`'s node data on each: normalization
ops green (folded: into which producer, fold id, channels) or red (not folded,
with the reason), producers that absorbed folds blue. Pick "bnfold" in the node
data panel of each model; open the second model in a split pane to compare.
"""

from __future__ import annotations

import json
import shutil
import tempfile
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
    """Runs Model Explorer's server for `view` until interrupted (Ctrl+C)."""
    model_explorer = _model_explorer()
    model_explorer.visualize_from_config(config(view), host=host, port=port,
                                         no_open_in_browser=not open_browser)


def show(source: str | Path, *, options: FoldOptions | None = None, host: str = "localhost",
         port: int = DEFAULT_PORT, open_browser: bool = True) -> View:
    """Folds `source` and shows input and output in Model Explorer (blocks until
    interrupted, as Model Explorer's own `visualize` does; in a notebook it embeds)."""
    view = prepare(source, options=options)
    serve(view, host, port, open_browser)
    return view


def check_installed() -> None:
    """Raises `BnfoldError` when the `viz` extra is missing."""
    _model_explorer()


def _model_explorer() -> Any:
    try:
        import model_explorer
    except ImportError:
        raise BnfoldError("Model Explorer is not installed: pip install 'bnfold[viz]' "
                          "(ai-edge-model-explorer)") from None
    return model_explorer
