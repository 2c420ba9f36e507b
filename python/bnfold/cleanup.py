"""Dead-code removal after folding.

Folding orphans the old kernel constants, the broadcasts of the statistics
and whole constant subgraphs (`call @_flip(%k)`). This removes side-effect
free ops whose results are unused, in the functions that changed only, so
functions without a fold stay byte-for-byte as they were.
"""

from __future__ import annotations

from bnfold.constants import EVALUATED_OPS
from bnfold.ir import ir

_MAX_DEPTH = 16


def remove_dead_ops(module: ir.Module, functions: set[str]) -> int:
    """Erases unused pure ops in `functions`; returns how many."""
    pure_callees = _pure_functions(module)
    erased = 0
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        if ir.StringAttr(op.attributes["sym_name"]).value not in functions:
            continue
        for region in op.regions:
            for block in region.blocks:
                erased += _sweep_block(block, pure_callees)
    return erased


def _sweep_block(block: ir.Block, pure_callees: set[str]) -> int:
    erased = 0
    # Users come after their operands in a block, so one backward sweep
    # removes whole dead chains.
    for op in reversed(list(block.operations)):
        operation = op.operation
        for region in operation.regions:
            for inner in region.blocks:
                erased += _sweep_block(inner, pure_callees)
        if not _removable(operation, pure_callees):
            continue
        if any(True for r in operation.results for _ in r.uses):
            continue
        operation.erase()
        erased += 1
    return erased


def _removable(op: ir.Operation, pure_callees: set[str]) -> bool:
    if op.name == "func.call":
        return ir.FlatSymbolRefAttr(op.attributes["callee"]).value in pure_callees
    return op.name in EVALUATED_OPS and len(op.regions) == 0


def _pure_functions(module: ir.Module) -> set[str]:
    """Private functions whose bodies only compute (no side effects, no custom calls)."""
    bodies: dict[str, list[ir.Operation]] = {}
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        attrs = op.attributes
        if "sym_visibility" not in attrs or ir.StringAttr(attrs["sym_visibility"]).value != "private":
            continue
        name = ir.StringAttr(attrs["sym_name"]).value
        if len(op.regions[0].blocks) != 1:
            continue
        bodies[name] = [o.operation for o in op.regions[0].blocks[0].operations]
    pure: set[str] = set()
    for _ in range(_MAX_DEPTH):
        grew = False
        for name, ops in bodies.items():
            if name in pure:
                continue
            if all(o.name in EVALUATED_OPS or o.name == "func.return" or
                   (o.name == "func.call" and
                    ir.FlatSymbolRefAttr(o.attributes["callee"]).value in pure)
                   for o in ops):
                pure.add(name)
                grew = True
        if not grew:
            break
    return pure
