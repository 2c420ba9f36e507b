"""Structural helpers shared by every pass: use-def, purity, functions and calls.

Nothing here caches: facts that change as the IR changes (liveness) live in
`bnfold.analysis`, which the rewriter keeps up to date.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from bnfold.ir import ir

# Ops without side effects that the cleanup erases when their results are unused.
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
    """The `ir.Operation` of an op (an `OpView` or itself); None for anything else (a
    value's owner is a `Block` for a block argument). One attribute read: use-def walks
    ask this tens of thousands of times a run."""
    return getattr(owner, "operation", None)


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op that defines `value`, or None for a block argument."""
    return getattr(value.owner, "operation", None)


def users(value: ir.Value) -> list[ir.Operation]:
    """Every op that uses `value` (once per use)."""
    return [u for use in value.uses if (u := getattr(use.owner, "operation", None)) is not None]


def is_pure(op: ir.Operation) -> bool:
    """Free of side effects: the cleanup may erase it when nothing reads its results.

    The one notion of purity in bnfold (the cleanup, liveness and the pure
    private functions whose dead calls are erased all use it)."""
    name = op.name
    return name.startswith(_PURE_PREFIXES) and name not in _IMPURE


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
    return functions_in(module.body)


def functions_in(body: ir.Block) -> Iterator[ir.Operation]:
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


def referenced_symbols(module: ir.Module, *, calls: bool = True) -> set[str]:
    """Every symbol an op's attribute names, nested arrays and dictionaries included: a
    call's callee (unless `calls` is False), a composite's decomposition, a custom_call's
    called_computations. A function named here is in use."""
    return set(symbol_uses(module, calls=calls))


def symbol_uses(module: ir.Module, *, calls: bool = True) -> dict[str, list[str]]:
    """`referenced_symbols`, with the names of the ops that name each symbol."""
    found: dict[str, list[str]] = {}

    def add(attr: ir.Attribute, user: str) -> None:
        if isinstance(attr, ir.FlatSymbolRefAttr):
            found.setdefault(attr.value, []).append(user)
        elif isinstance(attr, ir.SymbolRefAttr):  # @outer::@inner: the outer symbol
            outer = str(attr).split("::")[0].removeprefix("@").strip('"')
            found.setdefault(outer, []).append(user)
        elif isinstance(attr, ir.ArrayAttr):
            for element in attr:
                add(element, user)
        elif isinstance(attr, ir.DictAttr):
            for i in range(len(attr)):
                add(attr[i].attr, user)

    def visit(op: ir.Operation) -> ir.WalkResult:
        attributes = op.attributes
        name = op.name
        skip = "callee" if not calls and name == "func.call" else None
        for i in range(len(attributes)):
            named = attributes[i]
            if named.name != skip:
                add(named.attr, name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def callee_name(call: ir.Operation) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def callee(call: ir.Operation) -> ir.Operation | None:
    """The `func.func` a `func.call` calls (looked up in the module that holds the call)."""
    table = call.parent
    while table is not None and table.operation.name != "builtin.module":
        table = table.parent
    if table is None:
        return None
    return symbol_table_of(table.operation).get(callee_name(call))


def symbol_table(module: ir.Module) -> dict[str, ir.Operation]:
    """`{name: func.func}` for every top-level function."""
    return {symbol_name(f): f for f in functions(module)}


def symbol_table_of(module_op: ir.Operation) -> dict[str, ir.Operation]:
    """`symbol_table` for a `builtin.module` operation."""
    return {symbol_name(f): f for f in functions_in(module_op.regions[0].blocks[0])}


def printed_symbol(name: str) -> str:
    """`@name` as MLIR prints it: quoted unless it is an identifier (`@"<lambda>"`)."""
    return f"@{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name) else \
        '@"' + name.replace("\\", "\\5C").replace('"', "\\22") + '"'


def function_list(module: ir.Module) -> str:
    """The module's functions as MLIR prints their names (for error messages)."""
    names = [printed_symbol(symbol_name(f)) for f in functions(module)]
    return ", ".join(names) if names else "none"


def lookup_function(module: ir.Module, name: str) -> ir.Operation | None:
    return symbol_table(module).get(name)


def is_private(func: ir.Operation) -> bool:
    attrs = func.attributes
    return "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value == "private"


def single_block(func: ir.Operation) -> ir.Block | None:
    """The body of a function with exactly one block."""
    blocks = func.regions[0].blocks
    return blocks[0] if len(blocks) == 1 else None


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
