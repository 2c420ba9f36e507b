"""inline-calls: inline private helpers that compute a producer feeding a normalization.

JAX keeps a `jax.jit`-decorated helper (and Equinox's `filter_jit`) as a
private function; the caller's constants arrive as its arguments and the
normalization stays in the caller, so no chain reaches the producer. Before:

    %y = func.call @conv(%x, %k) : (tensor<1x8x8x3xf32>, tensor<3x3x3x8xf32>) -> tensor<1x8x8x8xf32>
    %c = stablehlo.subtract %y, %mean_b : tensor<1x8x8x8xf32>
    ...
    func.func private @conv(%a: tensor<1x8x8x3xf32>, %w: tensor<3x3x3x8xf32>) -> ... {
      %0 = stablehlo.convolution(%a, %w) ...
      return %0 ...

After (then folded as usual):

    %y = stablehlo.convolution(%x, %k) ...
    %c = stablehlo.subtract %y, %mean_b : tensor<1x8x8x8xf32>

A call is inlined only when that enables a fold: the callee is private and
has one block, and either it returns a convolution/dot_general result that
the caller normalizes (the call result's only user is an affine step) with a
kernel constant at this call site, or a producer inside it takes its kernel
from an argument this call site passes as a constant (a nested jit block with
its parameters as arguments), or it pads (`jnp.pad`) an affine step's result
for a convolution. Each call site gets its own
copy, so a helper shared by layers with different kernels is never changed
under another caller; a callee left without callers is removed. Public
functions and other calls are untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from bnfold import producers
from bnfold.affine import Analysis
from bnfold.graph import (
    callee_name,
    calls,
    defining_op,
    function_name,
    function_of,
    functions,
    is_private,
    live_users,
    symbol_name,
)
from bnfold.ir import ir

NAME = "inline-calls"
DESCRIPTION = ("inline private helpers (jax.jit, filter_jit) whose convolution/dot_general "
               "result the caller normalizes, one copy per call site")

_MAX_ROUNDS = 4  # helpers calling helpers


def run(module: ir.Module, funcs: list[ir.Operation],
        make_analysis: Callable[[], Analysis]) -> tuple[set[str], list[str]]:
    """Inlines every call that enables a fold; returns the changed functions and the
    inlined callee names (once per call site)."""
    changed: set[str] = set()
    inlined: list[str] = []
    names = {symbol_name(f) for f in funcs}
    for _ in range(_MAX_ROUNDS):
        analysis = make_analysis()
        table = {symbol_name(f): f for f in functions(module)}
        worth = [c for c in calls(f for f in functions(module) if symbol_name(f) in names)
                 if _worth_inlining(c, table, analysis)]
        if not worth:
            break
        for call in worth:
            callee = table[callee_name(call)]
            changed.add(function_name(call))
            inlined.append(symbol_name(callee))
            inline(call, callee)
        drop_uncalled(module, {symbol_name(table[n]) for n in inlined if n in table})
    return changed, inlined


def _worth_inlining(call: ir.Operation, table: dict[str, ir.Operation],
                    analysis: Analysis) -> bool:
    callee = table.get(callee_name(call))
    if callee is None or not is_private(callee) or len(callee.regions[0].blocks) != 1 or \
            callee == function_of(call):
        return False
    block = callee.regions[0].blocks[0]
    body = list(block.operations)
    returned = body[-1].operands
    arguments = list(block.arguments)
    # A nested jit block: its producer's kernel is an argument this call site
    # passes as a constant (the normalization may be inside or after it).
    for op in body:
        if producers.is_producer(op.operation) and any(
                operand in arguments and
                analysis.constant(call.operands[arguments.index(operand)]) is not None
                for operand in op.operation.operands):
            return True
    for index, value in enumerate(returned):
        if _pads_a_normalized_input(call, index, value, arguments, analysis):
            return True
        producer = defining_op(value)
        if producer is None or not producers.is_producer(producer):
            continue
        found = live_users(call.results[index])
        if len(found) != 1:
            continue
        step = analysis.step(found[0])
        if step is None or step.x != call.results[index]:
            continue
        if any(_constant_at_call(producer.operands[i], arguments, call, analysis)
               for i in (0, 1)):
            return True
    return False


def _pads_a_normalized_input(call: ir.Operation, index: int, value: ir.Value,
                             arguments: list[ir.Value], analysis: Analysis) -> bool:
    """A padding helper (`jnp.pad`) between an affine step and a convolution's input."""
    pad = defining_op(value)
    found = live_users(call.results[index])
    if pad is None or pad.name != "stablehlo.pad" or pad.operands[0] not in arguments or \
            len(found) != 1 or found[0].name != "stablehlo.convolution" or \
            found[0].operands[0] != call.results[index]:
        return False
    source = defining_op(call.operands[arguments.index(pad.operands[0])])
    return source is not None and analysis.step(source) is not None


def _constant_at_call(value: ir.Value, arguments: list[ir.Value], call: ir.Operation,
                      analysis: Analysis) -> bool:
    if value in arguments:
        return analysis.constant(call.operands[arguments.index(value)]) is not None
    return analysis.constant(value) is not None


def inline(call: ir.Operation, callee: ir.Operation) -> None:
    """Copies the callee's body before `call`, redirects its results, erases the call."""
    block = callee.regions[0].blocks[0]
    mapping: dict[ir.Value, ir.Value] = dict(zip(block.arguments, call.operands, strict=True))
    body = list(block.operations)
    for op in body[:-1]:
        clone = op.operation.clone(ip=ir.InsertionPoint(call)).operation
        _remap(clone, mapping)
        for old, new in zip(op.results, clone.results, strict=True):
            mapping[old] = new
    for result, value in zip(call.results, body[-1].operands, strict=True):
        result.replace_all_uses_with(mapping.get(value, value))
    call.erase()  # the root: replaced by the inlined body


def _remap(op: ir.Operation, mapping: dict[ir.Value, ir.Value]) -> None:
    """Points `op` and every op nested in it at the copies of callee values."""
    def visit(inner: ir.Operation) -> ir.WalkResult:
        inner = inner.operation
        for i, operand in enumerate(inner.operands):
            if operand in mapping:
                inner.operands[i] = mapping[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def drop_uncalled(module: ir.Module, names: set[str]) -> None:
    """Erases private functions in `names` that no call refers to any more."""
    called = {callee_name(c) for c in calls(functions(module))}
    for func in list(functions(module)):
        if symbol_name(func) in names and symbol_name(func) not in called and is_private(func):
            func.erase()
