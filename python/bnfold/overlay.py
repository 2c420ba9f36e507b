"""Model Explorer node data: what folded, into what, and why the rest did not.

Model Explorer (`ai-edge-model-explorer`) draws each function of a StableHLO
module as a graph whose id is the function's name. Its MLIR adapter numbers
the ops of a function in pre-order, nested regions and their terminators
included (a terminator is an "Outputs" node), starting at 0; arguments are
`arg0`, `arg1`, ... `node_ids` reproduces that numbering, and the overlays
below key their entries by it, in Model Explorer's node-data format:

    {"main": {"name": "bnfold", "results": {
        "14": {"value": "folded into stablehlo.convolution at model.mlir:12:10 (fold0)",
               "bgColor": "#a5d6a7"},
        "31": {"value": "not folded: the mean is function argument %arg3 ...",
               "bgColor": "#ef9a9a"}}}}

The input overlay marks every op of every normalization: folded (into which
producer, fold id, channels) or not (with the reason). The output overlay
marks every producer that absorbed a fold.
"""

from __future__ import annotations

from typing import Any

from bnfold import producers
from bnfold.graph import function_name
from bnfold.ir import format_location, ir, op_id
from bnfold.report import Report

FOLDED = "#a5d6a7"  # green
SKIPPED = "#ef9a9a"  # red
ABSORBED = "#90caf9"  # blue
NAME = "bnfold"

NodeRef = tuple[str, str]  # (graph id: the function's name, node id)


def node_ids(module: ir.Module) -> dict[int, NodeRef]:
    """Every op of every function, keyed by `bnfold.ir.op_id`, to its node."""
    found: dict[int, NodeRef] = {}
    for func in module.body.operations:
        if func.operation.name != "func.func":
            continue
        graph = ir.StringAttr(func.operation.attributes["sym_name"]).value
        counter = 0

        def visit(op: ir.Operation, graph: str = graph) -> ir.WalkResult:
            nonlocal counter
            op = op.operation
            if op.name == "func.func":
                return ir.WalkResult.ADVANCE  # the function itself is the graph
            found[op_id(op)] = (graph, str(counter))
            counter += 1
            return ir.WalkResult.ADVANCE

        func.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def input_overlay(report: Report) -> dict[str, Any]:
    """Node data for the input graph: each normalization op, folded or not."""
    graphs: dict[str, dict[str, Any]] = {}
    for fold in report.folds:
        text = (f"folded ({fold.direction}) into {fold.producer_op} at {fold.producer} "
                f"({fold.id}, {fold.channels} channels)")
        if fold.note:
            text += f"; {fold.note}"
        for graph, node in fold.nodes:
            _results(graphs, graph)[node] = {"value": text, "bgColor": FOLDED}
    for skip in report.skipped:
        for graph, node in skip.nodes:
            _results(graphs, graph)[node] = {"value": f"not folded: {skip.reason}",
                                             "bgColor": SKIPPED}
    return graphs


def output_overlay(module: ir.Module, report: Report, source_name: str | None) -> dict[str, Any]:
    """Node data for the output graph: each producer that absorbed folds."""
    by_producer: dict[tuple[str, str], list[str]] = {}
    for fold in report.folds:
        by_producer.setdefault((fold.function, fold.producer), []).append(fold.id)
    graphs: dict[str, dict[str, Any]] = {}
    ids = node_ids(module)

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if producers.is_producer(op):
            folds = by_producer.get((function_name(op), format_location(op.location, source_name)))
            ref = ids.get(op_id(op))
            if folds and ref is not None:
                _results(graphs, ref[0])[ref[1]] = {
                    "value": f"absorbed {', '.join(folds)}", "bgColor": ABSORBED}
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return graphs


def _results(graphs: dict[str, dict[str, Any]], graph: str) -> dict[str, Any]:
    entry = graphs.setdefault(graph, {"name": NAME, "results": {}})
    results: dict[str, Any] = entry["results"]
    return results
