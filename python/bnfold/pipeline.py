"""The one pipeline: parse -> bind -> patterns (the driver) -> cleanup -> verify.

    parse, bind      bnfold.ir, bnfold.binding          (API, CLI, hook, passes alike)
    options          bnfold.options.FoldOptions          (one schema)
    driver           bnfold.driver: the registered patterns, in order
        match (pure) -> plan (pure, float64) -> apply(rewriter) -> record
    rewriter         bnfold.rewriter: the only mutation path; tells the analysis
                     caches and the ledger of every replacement and erase
    ledger           bnfold.ledger: one decision per op, by handle -> Report
    finish           the rewriter erases replaced and dead ops (changed functions only)
    verify

`fold_module` works on a parsed module in place; `fold_source` parses,
binds and folds in a fresh context (used by `fold_text`, the CLI, the
jax.export hook and the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bnfold.binding import bind_arguments
from bnfold.errors import BnfoldError
from bnfold.fold import PASS_NAME, _describe, _function_names, check_skipped_functions, fold_module
from bnfold.ir import Format, ir, make_context, parse, parse_path, serialize
from bnfold.options import FoldOptions
from bnfold.patterns import pattern_names
from bnfold.report import Report

Bindings = Mapping[str | int, Any] | Callable[[ir.Module], Mapping[str | int, Any]]

__all__ = ["PASS_NAME", "FoldOptions", "Folded", "check_skipped_functions", "fold_module",
           "fold_source", "pattern_names"]


@dataclass
class Folded:
    """A parsed, bound and folded module with the context that owns it."""

    module: ir.Module
    context: ir.Context
    report: Report
    input_functions: list[str] = field(default_factory=list)  # the input's, before folding
    # With `graph_nodes`: Model Explorer node data of the output graph (each producer that
    # absorbed folds, `bnfold.overlay.output_overlay`); the module itself carries no marks.
    output_nodes: dict[str, Any] | None = None

    def serialize(self, fmt: Format = "mlir", **kwargs: Any) -> bytes:
        with self.context:
            return serialize(self.module, fmt, **kwargs)


def fold_source(data: bytes | str | None = None, *, path: str | None = None,
                name: str = "<input>", options: FoldOptions | None = None,
                bindings: Bindings | None = None,
                bind_function: str = "main", allow_unregistered: bool = False,
                pass_pipeline: str | None = None, graph_nodes: bool = False,
                check_skipped: bool = True) -> Folded:
    """The one pipeline: parse -> bind -> fold -> verify (-> report, write by the caller).

    Reads `data` (text, bytecode or a portable artifact) or the file at
    `path`, in a fresh context. `bindings` maps arguments of
    `bind_function` (by `argN`, name or index) to values, or is a function of
    the parsed module returning that mapping. `pass_pipeline` (a textual
    pipeline, see `bnfold.passes`) replaces the default fold. `graph_nodes`
    records Model Explorer node ids for `bnfold.overlay` (the report's input nodes,
    and `Folded.output_nodes`; the output module carries no marks). `check_skipped=False`
    lets `options.skip_functions` name functions this module lacks (the CLI checks
    them over every chunk of a split input). Raises `BnfoldError` for bad input.
    """
    if data is not None:
        check_source(data, "fold_source")
    context = make_context(allow_unregistered=allow_unregistered)
    if path is not None:
        module = parse_path(path, context, name=name)
    elif data is not None:
        module = parse(data, context, name=name)
    else:
        raise BnfoldError("fold_source needs data or a path")
    with context, ir.Location.unknown():
        input_functions = _function_names(module)
        values = bindings(module) if callable(bindings) else bindings
        parameters: dict[str, str] = {}
        if values:
            bind_arguments(module, values, function=bind_function, source_name=name,
                           names_out=parameters)
        if pass_pipeline is None:
            report = fold_module(module, options, source_name=name, graph_nodes=graph_nodes,
                                 check_skipped=check_skipped)
        else:  # bnfold's passes and MLIR's, as the pipeline says
            from bnfold.passes import run_pipeline  # only pipelines need MLIR's passes

            report = run_pipeline(module, pass_pipeline, source_name=name, graph_nodes=graph_nodes,
                                  check_skipped=check_skipped)
        if parameters:  # quantized weights are named by the parameter they came from
            report.name_parameters(parameters)
        output_nodes = None
        if graph_nodes:  # the marks the fold left on producers go into the node data
            from bnfold import overlay

            output_nodes = overlay.output_overlay(module, report)
    return Folded(module, context, report, input_functions, output_nodes)


_PATH_SUFFIXES = (".mlir", ".mlirbc", ".stablehlo", ".bc", ".bin", ".txt")


def check_source(data: object, caller: str) -> None:
    """`data` is a module's contents (str or bytes), not a file name or another object.

    Raises `TypeError` for other types and `BnfoldError` for a one-line string that
    looks like a path (it would parse as IR and fail with a confusing diagnostic).
    """
    if not isinstance(data, str | bytes | bytearray | memoryview):
        raise TypeError(f"{caller} expects MLIR text or bytes (a module's contents), got "
                        f"{_describe(data)}")
    if isinstance(data, bytes | bytearray | memoryview):
        return
    line = data.strip()
    if not line or "\n" in line or any(c in line for c in "{}()%=<>"):
        return
    import os

    if line.endswith(_PATH_SUFFIXES) or os.path.isfile(line):
        raise BnfoldError(f"{caller} expects MLIR text, got {line!r}, which looks like a path: "
                          f"pass the file's contents (open(path).read()) or use "
                          f"bnfold.fold_source(path={line!r})")
