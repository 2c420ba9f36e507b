"""The driver: runs the registered patterns, in their declared order, over one module.

    for each registry entry that is enabled (bnfold.patterns.REGISTRY):
        for each root the pattern names (re-read as the IR changes):
            match (pure)  -> Match | Refusal | None
            plan  (pure)  -> Plan  | Refusal | None
            apply(rewriter, plan); record(ctx, plan, applied)
        finish
    at the end of the FOLD stage: every normalization gets its decision (chains.explain)

A refusal goes back to the pattern that made it (`Pattern.refuse`), which
notes it for the report. Nothing here knows what a pattern does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from bnfold import chains, precision
from bnfold.analysis import Analysis
from bnfold.chains import Candidates, Notes
from bnfold.graph import callee_name, functions, symbol_name, symbol_table
from bnfold.ir import ir
from bnfold.ledger import Ledger
from bnfold.options import FoldOptions
from bnfold.patterns import REGISTRY, Entry
from bnfold.patterns.base import Pattern, Stage
from bnfold.refusal import Refusal
from bnfold.rewriter import Handle, Rewriter


@dataclass
class Context:
    """What a pattern sees during one run: the module, the options, the analysis (read),
    the ledger (write, through `record` and `refuse`) and the rewriter (through `apply`)."""

    module: ir.Module
    options: FoldOptions
    rewriter: Rewriter
    analysis: Analysis
    ledger: Ledger
    notes: dict[Handle, Notes] = field(default_factory=dict)
    # Backward folds round their kernels into one reused buffer (see precision.Arena).
    arena: precision.Arena = field(default_factory=precision.Arena)
    _candidates: Candidates | None = None
    _symbols: dict[str, ir.Operation] | None = None
    _bodies: dict[str, frozenset[str]] = field(default_factory=dict)

    def functions(self) -> list[ir.Operation]:
        """The functions patterns may change: not skipped, not dropped."""
        return [f for f in functions(self.module)
                if symbol_name(f) not in self.options.skip_functions
                and not self.rewriter.is_replaced(f)]

    def callee(self, call: ir.Operation) -> ir.Operation | None:
        """The function a `func.call` calls (functions are only ever dropped, never added)."""
        if self._symbols is None:
            self._symbols = symbol_table(self.module)
        return self._symbols.get(callee_name(call))

    def body_ops(self, func: ir.Operation) -> frozenset[str]:
        """The op names in a function's body (nested regions included), once per function."""
        name = symbol_name(func)
        if name not in self._bodies:
            found: set[str] = set()

            def visit(op: ir.Operation) -> ir.WalkResult:
                found.add(op.operation.name)
                return ir.WalkResult.ADVANCE

            func.walk(visit)
            self._bodies[name] = frozenset(found)
        return self._bodies[name]

    def patterns(self, after: Stage = Stage.PREPARE) -> list[Pattern]:
        """The enabled patterns of stages after `after`, loaded (in registry order)."""
        return [entry.load() for entry in REGISTRY
                if entry.stage > after and self.options.enabled(entry.name, entry.opt_in)]

    def candidates(self) -> Candidates:
        """The producers and affine chains, found in one walk when the FOLD stage starts."""
        if self._candidates is None:
            self._candidates = chains.find(self.functions(), self.analysis)
        return self._candidates


def run(ctx: Context, registry: tuple[Entry, ...] = REGISTRY) -> None:
    """Runs every enabled pattern of `registry` over `ctx.module`, in order."""
    explained = False
    for entry in registry:
        if not explained and entry.stage > Stage.FOLD:
            chains.explain(ctx, ctx.candidates())
            explained = True
        if ctx.options.enabled(entry.name, entry.opt_in):
            run_pattern(ctx, entry.load())
    if not explained:
        chains.explain(ctx, ctx.candidates())


def run_pattern(ctx: Context, pattern: Pattern) -> None:
    """match -> plan -> apply -> record for every root of one pattern, then `finish`."""
    for root in pattern.roots(ctx):
        matched = _accepted(ctx, pattern, root, pattern.match(ctx, root))
        if matched is None:
            continue
        planned = _accepted(ctx, pattern, matched, pattern.plan(ctx, matched))
        if planned is not None:
            pattern.record(ctx, planned, pattern.apply(ctx.rewriter, planned))
    pattern.finish(ctx)


T = TypeVar("T")


def _accepted(ctx: Context, pattern: Pattern, subject: object, result: T | Refusal | None
              ) -> T | None:
    """`result`, unless it is None (not the pattern's business) or a refusal, which goes
    back to the pattern to be noted against `subject`."""
    if isinstance(result, Refusal):
        pattern.refuse(ctx, subject, result)
        return None
    return result
