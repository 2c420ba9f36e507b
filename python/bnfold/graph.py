"""Use-def helpers and the module's symbol table, shared by every pass.

Liveness matters for correctness: a fold is only allowed when the producer's
result has no other *live* user. A user that is itself dead (a pure op whose
results nobody reads) is removed by the cleanup after folding, so counting it
would make a second run of bnfold fold more than the first (`fold(fold(m))`
must equal `fold(m)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bnfold.ir import ir

# Ops without side effects that cleanup erases when their results are unused.
_PURE_PREFIXES = ("stablehlo.", "chlo.")
_IMPURE = frozenset({
    "stablehlo.custom_call", "stablehlo.send", "stablehlo.recv", "stablehlo.infeed",
    "stablehlo.outfeed", "stablehlo.after_all", "stablehlo.create_token",
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.all_to_all",
    "stablehlo.collective_permute", "stablehlo.collective_broadcast",
    "stablehlo.reduce_scatter", "stablehlo.rng", "stablehlo.rng_bit_generator",
    "stablehlo.optimization_barrier", "stablehlo.while", "stablehlo.if", "stablehlo.case",
    "stablehlo.return", "stablehlo.composite",
})


def as_operation(owner: object) -> ir.Operation | None:
    if isinstance(owner, ir.OpView):
        return owner.operation
    return owner if isinstance(owner, ir.Operation) else None


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op that defines `value`, or None for a block argument."""
    return as_operation(value.owner)


def users(value: ir.Value) -> list[ir.Operation]:
    """Every op that uses `value` (once per use)."""
    return [u for u in (as_operation(use.owner) for use in value.uses) if u is not None]


def is_pure(op: ir.Operation) -> bool:
    name = op.name
    return name.startswith(_PURE_PREFIXES) and name not in _IMPURE


def is_dead(op: ir.Operation, _depth: int = 0) -> bool:
    """A pure op whose results are only read by dead ops (so cleanup removes it)."""
    if not is_pure(op) or _depth > 64:
        return False
    return all(is_dead(u, _depth + 1) for r in op.results for u in users(r))


def live_users(value: ir.Value) -> list[ir.Operation]:
    """The users of `value` that survive cleanup."""
    uses = iter(value.uses)
    first = next(uses, None)
    if first is None:
        return []
    second = next(uses, None)
    if second is None:  # one user (dead chains are checked by their callers)
        owner = as_operation(first.owner)
        return [] if owner is None else [owner]
    found = users(value)
    return [u for u in found if not is_dead(u)]


def sole_live_user(value: ir.Value) -> ir.Operation | None:
    found = live_users(value)
    return found[0] if len(found) == 1 else None


def same_block(op: ir.Operation, value: ir.Value) -> bool:
    """True when `value` is defined by an op in `op`'s block."""
    owner = defining_op(value)
    return owner is not None and owner.block == op.block


def function_of(op: ir.Operation) -> ir.Operation | None:
    parent = op.parent
    while parent is not None and parent.operation.name != "func.func":
        parent = parent.parent
    return None if parent is None else parent.operation


def symbol_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def function_name(op: ir.Operation) -> str:
    func = function_of(op)
    return "" if func is None else symbol_name(func)


def functions(module: ir.Module) -> Iterator[ir.Operation]:
    """The module's top-level `func.func` ops, in order."""
    return _functions_in(module.body)


def _functions_in(body: ir.Block) -> Iterator[ir.Operation]:
    for op in body.operations:
        if op.operation.name == "func.func":
            yield op.operation


def calls(funcs: Iterable[ir.Operation]) -> list[ir.Operation]:
    """Every `func.call` inside `funcs` (nested regions included), in order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.operation.name == "func.call":
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    for func in funcs:
        func.walk(visit)
    return found


def callee_name(call: ir.Operation) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def symbol_table(module: ir.Module) -> dict[str, ir.Operation]:
    """`{name: func.func}` for every top-level function."""
    return {symbol_name(f): f for f in functions(module)}


def symbol_table_of(module_op: ir.Operation) -> dict[str, ir.Operation]:
    """`symbol_table` for a `builtin.module` operation."""
    return {symbol_name(f): f for f in _functions_in(module_op.regions[0].blocks[0])}


def lookup_function(module: ir.Module, name: str) -> ir.Operation | None:
    return symbol_table(module).get(name)


def is_private(func: ir.Operation) -> bool:
    attrs = func.attributes
    return "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value == "private"


def discardable_attributes(op: ir.Operation) -> dict[str, ir.Attribute]:
    """Dialect-prefixed attributes (`mhlo.sharding`, `mhlo.frontend_attributes`, ...).

    MLIR requires discardable attributes to carry a dialect prefix, and
    inherent attribute names never contain a dot.
    """
    attrs = op.attributes
    return {name: attrs[name] for name in attrs if "." in name}


def carry_attributes(source: ir.Operation, target: ir.Operation) -> None:
    """Copies `source`'s discardable attributes onto `target` (target's own win)."""
    for name, attr in discardable_attributes(source).items():
        if name not in target.attributes:
            target.attributes[name] = attr
