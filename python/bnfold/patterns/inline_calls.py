"""inline-calls: inline private helpers where a fold or an equalization must see through them.

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

A call is inlined only where a later enabled pattern says it needs to see
through it (`Pattern.wants_inline`): backward-affine when the helper returns a
producer result (through nested helpers too) that the caller normalizes, a
producer inside (or inside a helper it calls: a jit block of jitted layers)
takes a constant kernel from this call site, or the helper normalizes a
producer result the caller passes it (a jitted batch norm called after each
layer, `@bn(%y, %gamma, %beta)`); forward-affine
when it pads a normalized input for a convolution; equalize when it sits
between two layers (`call @relu6`). Every call site gets its own copy, so a
helper shared by layers with different kernels is never changed under another
caller; a helper left without callers is removed. Helpers inside helpers are
reached in the next round (at most `MAX_ROUNDS`). Public functions, skipped
functions (`--skip-func`) and other calls are untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from bnfold import graph
from bnfold.graph import callee_name, is_private, single_block, symbol_name
from bnfold.ir import ir
from bnfold.patterns.base import Pattern, Stage
from bnfold.report import Part, Section

if TYPE_CHECKING:
    from bnfold.analysis import Analysis
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter

MAX_ROUNDS = 8  # helpers calling helpers calling helpers ...
_CALL = ("func.call",)


class Inline(NamedTuple):
    """A call site and the private single-block function it calls."""

    call: ir.Operation
    callee: ir.Operation


class Inlined(Section):
    """The callees inlined, once per call site: `"inlined": [names]` in every report."""

    order = 20
    always = True

    def attributes(self, part: Part) -> dict[str, Any]:
        return {"inlined": part.records}

    def to_json(self, part: Part) -> dict[str, Any]:
        return {"inlined": list(part.records)}

    def summary(self, part: Part) -> str:
        return f", inlined {len(part.records)} call(s)" if part.records else ""


RECORDS = Inlined()


class InlineCalls(Pattern[ir.Operation, Inline, Inline]):
    """Inlines the private calls later patterns need to see through."""


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        for _ in range(MAX_ROUNDS):  # each round reaches one more level of nesting
            ctx.shared(_Interested).clear()  # an inlined call changed its helper's body
            before = len(ctx.ledger.records().records)
            yield from [c for c in ctx.ops(_CALL) if not ctx.rewriter.is_replaced(c)]
            if len(ctx.ledger.records().records) == before:
                return

    def match(self, ctx: Context, root: ir.Operation) -> Inline | None:
        func = ctx.callee(root)
        if func is None or not is_private(func) or single_block(func) is None or \
                func == graph.function_of(root) or symbol_name(func) in ctx.options.skip_functions:
            return None
        if any(p.wants_inline(ctx, root, func) for p in _interested(ctx, root, func)):
            return Inline(root, func)
        return None

    def plan(self, ctx: Context, match: Inline) -> Inline:
        return match

    def apply(self, rewriter: Rewriter, plan: Inline) -> str:
        inline(rewriter, plan.call, plan.callee)
        return symbol_name(plan.callee)

    def record(self, ctx: Context, plan: Inline, applied: str) -> None:
        ctx.ledger.add(applied)

    def finish(self, ctx: Context) -> None:
        drop_uncalled(ctx, set(ctx.ledger.records().records))


class _Interested(dict[str, list[Pattern]]):
    """Per helper (by name), the later patterns whose `may_inline` holds for it; cleared
    at each round (inlining a nested call changes its helper's body)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()


def _interested(ctx: Context, call: ir.Operation, func: ir.Operation) -> list[Pattern]:
    """The patterns that may want `call` of `func` inlined (`may_inline`, asked once per
    helper and round). In checking mode the others are asked too and must not want it."""
    known = ctx.shared(_Interested)
    name = symbol_name(func)
    found = known.get(name)
    if found is None:
        found = known[name] = [p for p in ctx.patterns(after=Stage.PREPARE)
                               if p.may_inline(ctx, func)]
    if ctx.checking:
        for p in ctx.patterns(after=Stage.PREPARE):
            if p not in found and p.wants_inline(ctx, call, func):
                raise AssertionError(f"{type(p).__name__}.may_inline(@{name}) is False, but "
                                     f"it wants the call at {call.location} inlined")
    return found


class CallSite(NamedTuple):
    """A callee's values as one call site sees them: its arguments are the call's operands
    (which may themselves be arguments of an enclosing call site)."""

    call: ir.Operation
    callee: ir.Operation
    outer: CallSite | None = None

    @property
    def arguments(self) -> list[ir.Value]:
        block = single_block(self.callee)
        return list(block.arguments) if block is not None else []

    def argument_value(self, value: ir.Value) -> ir.Value | None:
        """What the call passes for `value` if it is an argument (seen from the outermost
        caller when the call is itself inside a helper), else None."""
        arguments = self.arguments
        if value not in arguments:
            return None
        passed = self.call.operands[arguments.index(value)]
        if self.outer is not None:
            outer = self.outer.argument_value(passed)
            return passed if outer is None else outer
        return passed

    def is_constant(self, value: ir.Value, analysis: Analysis) -> bool:
        """Whether `value` is a constant at this call site (a constant argument counts)."""
        passed = self.argument_value(value)
        return analysis.is_constant(passed if passed is not None else value)

    def returned(self, index: int) -> ir.Value:
        block = single_block(self.callee)
        assert block is not None
        return list(block.operations)[-1].operands[index]


def behind_calls(value: ir.Value, site: CallSite) -> tuple[ir.Value, CallSite]:
    """The value a helper returns, followed into nested private helpers: where it is
    really computed, and the call site that sees it there."""
    for _ in range(MAX_ROUNDS):
        owner = graph.defining_op(value)
        if owner is None or owner.name != "func.call":
            break
        inner = graph.callee(owner)
        if inner is None or not is_private(inner) or single_block(inner) is None:
            break
        site = CallSite(owner, inner, site)
        value = site.returned(next(i for i, r in enumerate(owner.results) if r == value))
    return value, site


def ops_within(site: CallSite, depth: int = MAX_ROUNDS) -> Iterator[tuple[ir.Operation, CallSite]]:
    """Every op of the helper's body and, through nested private helpers (`depth` levels),
    of theirs, each with the call site that sees it: `@block(%k1, %k2)` calling
    `@layer(%x, %k)`, whose convolution reads a kernel constant at the outer site."""
    block = single_block(site.callee)
    if block is None:
        return
    for view in block.operations:
        op = view.operation
        yield op, site
        if op.name != "func.call" or depth <= 1:
            continue
        inner = graph.callee(op)
        if inner is not None and is_private(inner) and inner != site.callee:
            yield from ops_within(CallSite(op, inner, site), depth - 1)


def inline(rewriter: Rewriter, call: ir.Operation, func: ir.Operation) -> None:
    """Copies the callee's body before `call` and replaces the call with it."""
    block = single_block(func)
    assert block is not None
    mapping: dict[ir.Value, ir.Value] = dict(zip(block.arguments, call.operands, strict=True))
    body = list(block.operations)
    for op in body[:-1]:
        clone = op.operation.clone(ip=ir.InsertionPoint(call)).operation
        _remap(clone, mapping)
        for old, new in zip(op.results, clone.results, strict=True):
            mapping[old] = new
    returned = [mapping.get(value, value) for value in body[-1].operands]
    rewriter.replace_op(call, returned)


def _remap(op: ir.Operation, mapping: dict[ir.Value, ir.Value]) -> None:
    """Points a new copy, and every op nested in it, at the copies of callee values."""
    def visit(inner: ir.Operation) -> ir.WalkResult:
        inner = inner.operation
        for i, operand in enumerate(inner.operands):
            if operand in mapping:
                inner.operands[i] = mapping[operand]
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def drop_uncalled(ctx: Context, names: set[str]) -> None:
    """Drops the private functions in `names` that no live call refers to any more (a
    helper whose only callers were inside a dropped helper goes too)."""
    if not names:  # nothing was inlined: no walk of every call in the module
        return
    rewriter = ctx.rewriter
    dropped: set[str] = set()
    while True:
        live = [f for f in graph.functions(ctx.module)
                if symbol_name(f) not in dropped and not rewriter.is_replaced(f)]
        called = {callee_name(c) for c in graph.calls(live) if not rewriter.is_replaced(c)}
        called |= graph.referenced_symbols(ctx.module, calls=False)  # composites ...
        gone = [f for f in live if symbol_name(f) in names and symbol_name(f) not in called
                and is_private(f) and symbol_name(f) not in ctx.options.skip_functions]
        if not gone:
            return
        for func in gone:
            dropped.add(symbol_name(func))
            rewriter.drop_function(func)


PATTERN = InlineCalls()
