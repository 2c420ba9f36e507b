"""Dead-code removal after folding.

Folding orphans the old kernel constants, the broadcasts of the statistics
and whole constant subgraphs (`call @_flip(%k)`). This removes side-effect
free ops whose results are unused, in the functions that changed only, so
functions without a fold stay byte-for-byte as they were.

Trivially dead ops go through jaxlib's greedy driver with no patterns (its
C++ dead-code elimination; folding, CSE and region simplification off).
Dead calls of private side-effect-free functions, which MLIR cannot prove
dead, are erased here, and the sweep repeats once to collect what they fed.
"""

from __future__ import annotations

from bnfold.constants import EVALUATED_OPS
from bnfold.graph import functions as module_functions
from bnfold.graph import is_private, symbol_name
from bnfold.ir import ir, rewrite

_MAX_DEPTH = 16


def remove_dead_ops(module: ir.Module, functions: set[str]) -> None:
    """Erases unused side-effect-free ops in `functions`."""
    targets = [f for f in module_functions(module) if symbol_name(f) in functions]
    pure_callees = _pure_functions(module)
    for func in targets:
        _erase_trivially_dead(func)
        if pure_callees and _erase_dead_calls(func, pure_callees):
            _erase_trivially_dead(func)


def _erase_trivially_dead(func: ir.Operation) -> None:
    config = rewrite.GreedyRewriteConfig()
    config.enable_folding = False
    config.enable_constant_cse = False
    config.region_simplification_level = rewrite.GreedySimplifyRegionLevel.DISABLED
    config.max_iterations = 2
    rewrite.apply_patterns_and_fold_greedily(func, _EMPTY_PATTERNS(), config)


def _EMPTY_PATTERNS() -> rewrite.FrozenRewritePatternSet:  # noqa: N802 - a factory
    return rewrite.RewritePatternSet().freeze()


def _erase_dead_calls(func: ir.Operation, pure_callees: set[str]) -> int:
    dead: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call" and \
                ir.FlatSymbolRefAttr(op.attributes["callee"]).value in pure_callees and \
                not any(True for r in op.results for _ in r.uses):
            dead.append(op)
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    for op in dead:
        op.erase()
    return len(dead)


def _pure_functions(module: ir.Module) -> set[str]:
    """Private functions whose bodies only compute (no side effects, no custom calls)."""
    bodies: dict[str, list[ir.Operation]] = {}
    for func in module_functions(module):
        if is_private(func) and len(func.regions[0].blocks) == 1:
            bodies[symbol_name(func)] = [o.operation for o in func.regions[0].blocks[0].operations]
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
