"""Model Explorer node data: what folded, into what, and why the rest did not.

Model Explorer (`ai-edge-model-explorer`) draws each function of a StableHLO
module as a graph whose id is the function's name. Its MLIR adapter numbers
the ops of a function in pre-order, nested regions and their terminators
included (a terminator is an "Outputs" node), starting at 0; arguments are
`arg0`, `arg1`, ... `nodes` reproduces that numbering, and the overlays
below key their entries by it, in Model Explorer's node-data format:

    {"main": {"name": "bnfold", "results": {
        "14": {"value": "FOLDED (backward) into stablehlo.convolution at m.mlir:12:10 (fold0, 16 channels)",
               "bgColor": "#a5d6a7"},
        "31": {"value": "NOT FOLDED (parameter-argument): the mean is function argument %arg3 ...",
               "bgColor": "#ef9a9a"}}}}

The input overlay marks every op of every normalization: folded (into which
producer, fold id, channels) or not (with the reason). The output overlay
marks every producer that absorbed a fold.

Ops are identified by the rewriter's handles while bnfold runs (never by
address or location: two inlined copies of one helper share a location).
At the end of a run, each producer that absorbed folds carries a temporary
discardable attribute `bnfold.absorbed` naming its folds (it survives the
MLIR passes of a pipeline that run after bnfold's); `output_overlay` reads
and removes it.
"""

from __future__ import annotations

from typing import Any

from bnfold import producers
from bnfold.ir import ir
from bnfold.ledger import Ledger
from bnfold.report import Report
from bnfold.rewriter import Handle, Rewriter

FOLDED = "#a5d6a7"  # green
SKIPPED = "#ef9a9a"  # red
ABSORBED = "#90caf9"  # blue
NAME = "bnfold"
MARK = "bnfold.absorbed"  # the temporary attribute on producers that absorbed folds

NodeRef = tuple[str, str]  # (graph id: the function's name, node id)


def nodes(module: ir.Module) -> list[tuple[ir.Operation, NodeRef]]:
    """Every op of every function with its Model Explorer node, numbered as the adapter
    numbers them (pre-order per function, nested regions and terminators included)."""
    found: list[tuple[ir.Operation, NodeRef]] = []
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
            found.append((op, (graph, str(counter))))
            counter += 1
            return ir.WalkResult.ADVANCE

        func.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def input_nodes(module: ir.Module, rewriter: Rewriter) -> dict[Handle, NodeRef]:
    """Every op of the input, by handle, to its node (taken before anything changes)."""
    return {rewriter.handle(op): ref for op, ref in nodes(module)}


def mark_output(module: ir.Module, rewriter: Rewriter, ledger: Ledger) -> None:
    """Marks each producer that now carries folds with their uids (`MARK`)."""
    absorbed = ledger.absorbing_producers()
    if not absorbed:
        return

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if producers.is_producer(op) and not rewriter.is_replaced(op):
            folds = absorbed.get(rewriter.handles.get(op))  # type: ignore[arg-type]
            if folds:
                op.attributes[MARK] = ir.StringAttr.get(",".join(str(f.uid) for f in folds))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def input_overlay(report: Report) -> dict[str, Any]:
    """Node data for the input graph: each normalization op, folded or not."""
    graphs: dict[str, dict[str, Any]] = {}
    for fold in report.folds:
        text = (f"FOLDED ({fold.direction}) into {fold.producer_op} at {fold.producer} "
                f"({fold.id}, {fold.channels} channels)")
        if fold.note:
            text += f"; {fold.note}"
        for graph, node in fold.nodes:
            _results(graphs, graph)[node] = {"value": text, "bgColor": FOLDED}
    for skip in report.skipped:
        for graph, node in skip.nodes:
            _results(graphs, graph)[node] = {"value": f"NOT FOLDED ({skip.code}): {skip.reason}",
                                             "bgColor": SKIPPED}
    return graphs


def output_overlay(module: ir.Module, report: Report) -> dict[str, Any]:
    """Node data for the output graph: each producer that absorbed folds. Removes the
    marks `mark_output` left, so the module can be written as it is."""
    ids = {str(f.uid): f.id for f in report.folds}
    graphs: dict[str, dict[str, Any]] = {}
    for op, (graph, node) in nodes(module):
        if MARK not in op.attributes:
            continue
        uids = ir.StringAttr(op.attributes[MARK]).value.split(",")
        del op.attributes[MARK]
        folds = [ids[u] for u in uids if u in ids]
        if folds:
            _results(graphs, graph)[node] = {"value": f"ABSORBED {', '.join(folds)}",
                                             "bgColor": ABSORBED}
    return graphs


def _results(graphs: dict[str, dict[str, Any]], graph: str) -> dict[str, Any]:
    entry = graphs.setdefault(graph, {"name": NAME, "results": {}})
    results: dict[str, Any] = entry["results"]
    return results
