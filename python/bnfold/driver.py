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

In checking mode (`CHECKING`: on when the environment sets `BNFOLD_CHECK_RULES=1`, as
the test suite does; off for users) the driver also enforces the rules it relies on,
and raises `RuleViolation` naming the pattern and the phase that broke one:

* `roots` (each step of its iteration), `match`, `plan` and `record` leave the IR
  exactly as they found it: the same ops, attributes and operands (a structural
  fingerprint; modules of up to `CHECK_UP_TO` ops);
* `apply` only creates ops: every op that existed before is still there with its
  attributes, and its operands are the ones it had unless a `Rewriter.replace_op`
  redirected them; nothing is erased while patterns run; what it created are
  clones (`Rewriter.clone`) or ops of the names its pattern's `builds` declares;
* the walk `Context.ops` keeps lacks only ops of names created since (compared with a
  fresh walk on every call, on modules of any size);
* every op the rewriter has a handle for is still in the module (the handle map
  never points at a freed address).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bnfold import chains, patterns
from bnfold.analysis import Analysis
from bnfold.graph import callee_name, functions, symbol_name, symbol_table
from bnfold.ir import ir, op_id
from bnfold.ledger import Ledger
from bnfold.options import FoldOptions
from bnfold.patterns import Entry
from bnfold.patterns.base import Pattern, Stage
from bnfold.refusal import Refusal
from bnfold.rewriter import Rewriter

CHECKING = os.environ.get("BNFOLD_CHECK_RULES", "") not in ("", "0")
# The largest module (in ops) checked: a fingerprint per phase of every root makes a
# 270-op model fold 10x slower, a 1255-op one 20x (lit cases, generated modules and the
# fuzzer's are far smaller; tests/test_rules.py checks its real models: None, any size).
CHECK_UP_TO: int | None = 150

S = TypeVar("S")


@dataclass
class Context:
    """What a pattern sees during one run: the module, the options, the analysis (read),
    the ledger (write, through `record` and `refuse`) and the rewriter (through `apply`).
    What patterns of one stage share for the run (candidates, notes, buffers) is
    `shared(factory)`: made once per run, by the module that owns it."""

    module: ir.Module
    options: FoldOptions
    rewriter: Rewriter
    analysis: Analysis
    ledger: Ledger
    registry: tuple[Entry, ...] | None = None  # None: bnfold.patterns.REGISTRY
    _shared: dict[Callable[[Any], Any], Any] = field(default_factory=dict)
    _symbols: dict[str, ir.Operation] | None = None
    _bodies: dict[str, frozenset[str]] = field(default_factory=dict)
    _patterns: dict[Stage, tuple[tuple[Entry, ...], list[Pattern]]] = field(default_factory=dict)
    _table: list[tuple[str, ir.Operation]] | None = None  # `ops`' walk, until the IR changes
    _table_version = -1  # the rewriter's version when `_table` was walked
    _created: set[str] = field(default_factory=set)  # op names created since, not in it

    @property
    def checking(self) -> bool:
        """Whether the driver's checking mode is on (patterns may assert their own rules)."""
        return CHECKING

    def functions(self) -> list[ir.Operation]:
        """The functions patterns may change: not skipped, not dropped."""
        return [f for f in functions(self.module)
                if symbol_name(f) not in self.options.skip_functions
                and not self.rewriter.is_replaced(f)]

    def ops(self, names: Container[str]) -> list[ir.Operation]:
        """The ops of `functions()` (nested regions included) named in `names`, in walk
        order (pre-order: a value's definition before its uses). One walk of the module
        serves every call until the IR changes in a way it cannot see: the walk lacks
        only the ops created since, and those have known names (a pattern's declared
        `builds`, the rewriter's `cloned`), so a call naming none of them needs no new
        walk. An apply that declares nothing, or a dropped function, drops the walk.
        Replaced ops stay in the IR until `finish`, in the walk as in the module. Checking
        mode compares the kept walk with a fresh one on every call."""
        return [op for name, op in self._walked(names) if name in names]

    def named_ops(self, names: Container[str]) -> list[tuple[str, ir.Operation]]:
        """`ops(names)` as (name, op) pairs: a pattern that branches on the name need not
        read `op.name` again (a new string each time)."""
        return [entry for entry in self._walked(names) if entry[0] in names]

    def _walked(self, names: Container[str]) -> list[tuple[str, ir.Operation]]:
        """The kept walk, walked again first where it may lack ops named in `names`."""
        table = self._table
        created = self._created
        created |= self.rewriter.cloned
        if table is None or self._table_version != self.rewriter.version or \
                any(name in names for name in created):
            table = self._table = self._walk()
            self._table_version = self.rewriter.version
            created.clear()
            self.rewriter.cloned.clear()
        elif self.checking:
            self._check_kept(table, created)
        return table

    def changed(self, builds: frozenset[str] | None = None) -> None:
        """An `apply` ran: it created ops named in `builds` (besides the rewriter's
        clones); None: it may have created anything, the next `ops` walks again."""
        if builds is None:
            self._table = None
        else:
            self._created |= builds

    def _check_kept(self, table: list[tuple[str, ir.Operation]], created: set[str]) -> None:
        """The kept walk is the fresh one less ops of the names created since (checking)."""
        kept = [op_id(o) for _, o in table]
        fresh = [(n, op_id(o)) for n, o in self._walk()]
        known = set(kept)
        missing = [n for n, o in fresh if o not in known and n not in created]
        if missing or [o for _, o in fresh if o in known] != kept:
            raise RuleViolation("bnfold: the IR changed outside a pattern's apply or finish, "
                                "or an apply built ops its pattern's `builds` does not name "
                                f"({', '.join(sorted(set(missing))) or 'ops moved or erased'}; "
                                "Context.ops kept a stale walk)")

    def _walk(self) -> list[tuple[str, ir.Operation]]:
        found: list[tuple[str, ir.Operation]] = []
        add = found.append
        advance = ir.WalkResult.ADVANCE

        def visit(op: ir.Operation) -> ir.WalkResult:
            add((op.name, op))
            return advance

        for func in self.functions():
            func.walk(visit, ir.WalkOrder.PRE_ORDER)
        return found

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

    def entries(self) -> tuple[Entry, ...]:
        return patterns.REGISTRY if self.registry is None else self.registry

    def patterns(self, after: Stage = Stage.PREPARE) -> list[Pattern]:
        """The enabled patterns of stages after `after`, loaded (in registry order); made
        once per run (inline-calls asks for every call site)."""
        entries = self.entries()
        made = self._patterns.get(after)
        if made is None or made[0] is not entries:
            made = self._patterns[after] = (entries, [
                entry.load() for entry in entries
                if entry.stage > after and self.options.enabled(entry.name, entry.opt_in)])
        return made[1]

    def shared(self, factory: Callable[[Context], S]) -> S:
        """`factory(self)`, made on the first call of this run and kept for the run."""
        if factory not in self._shared:
            self._shared[factory] = factory(self)
        found: S = self._shared[factory]
        return found


def run(ctx: Context, registry: tuple[Entry, ...] | None = None) -> None:
    """Runs every enabled pattern of `registry` (default: `ctx`'s, else the package's)
    over `ctx.module`, in order."""
    if registry is not None:
        ctx.registry = registry
    ctx.ledger.expect(ctx.entries())
    explained = False
    for entry in ctx.entries():
        if not explained and entry.stage > Stage.FOLD:
            chains.explain(ctx)
            explained = True
        if ctx.options.enabled(entry.name, entry.opt_in):
            ctx.ledger.ran(entry)
            run_pattern(ctx, entry.load(), entry.name)
    if not explained:
        chains.explain(ctx)


def run_pattern(ctx: Context, pattern: Pattern, name: str = "") -> None:
    """match -> plan -> apply -> record for every root of one pattern, then `finish`."""
    if CHECKING:
        before = fingerprint(ctx.module)
        if CHECK_UP_TO is None or len(before) <= CHECK_UP_TO:
            _Checked(ctx, pattern, name or type(pattern).__name__).run(before)
            return
    for root in pattern.roots(ctx):
        matched = _accepted(ctx, pattern, root, pattern.match(ctx, root))
        if matched is None:
            continue
        planned = _accepted(ctx, pattern, matched, pattern.plan(ctx, matched))
        if planned is not None:
            applied = pattern.apply(ctx.rewriter, planned)
            ctx.changed(pattern.builds)
            pattern.record(ctx, planned, applied)
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


# --- checking mode ----------------------------------------------------------------------


class RuleViolation(AssertionError):
    """A pattern broke one of the driver's rules (a bnfold bug): the message names the
    pattern, the phase and what changed."""


# op address, op name, attributes (uniqued: equal exactly when their contents are), operands
Fingerprint = list[tuple[int, str, tuple[tuple[str, ir.Attribute], ...], tuple[ir.Value, ...]]]

# How many roots, matches, plans and applies each pattern went through while checking
# (tests read it: every registered pattern must be exercised).
EXERCISED: dict[str, dict[str, int]] = {}


def fingerprint(module: ir.Module) -> Fingerprint:
    """Every op of `module` in walk order, with its attributes and operands."""
    found: Fingerprint = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        attributes = op.attributes
        try:
            named = tuple((n, attributes[n]) for n in attributes)
        except TypeError:  # an attribute the bindings cannot cast (complex elements)
            named = (("<asm>", ir.StringAttr.get(str(op.get_asm(enable_debug_info=False)))),)
        found.append((op_id(op), op.name, named, tuple(op.operands)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


class _Checked:
    """One pattern's loop, with the IR fingerprinted around every call."""

    def __init__(self, ctx: Context, pattern: Pattern, name: str) -> None:
        self.ctx, self.pattern, self.name = ctx, pattern, name
        self.counts = EXERCISED.setdefault(name, {"roots": 0, "match": 0, "plan": 0, "apply": 0})

    def run(self, before: Fingerprint) -> None:
        ctx, pattern = self.ctx, self.pattern
        roots: Iterator[Any] = iter(pattern.roots(ctx))
        while True:
            try:
                root = next(roots)
            except StopIteration:
                self.unchanged(before, "roots")
                break
            self.passed(before, "roots")
            matched = _accepted(ctx, pattern, root,
                                self.passed(before, "match", pattern.match(ctx, root)))
            if matched is None:
                continue
            planned = _accepted(ctx, pattern, matched,
                                self.passed(before, "plan", pattern.plan(ctx, matched)))
            if planned is None:
                continue
            redirected = ctx.rewriter.redirects = {}
            cloned = set(ctx.rewriter.cloned)
            ctx.rewriter.cloned.clear()
            try:
                applied = pattern.apply(ctx.rewriter, planned)
            finally:
                ctx.rewriter.redirects = None
                ctx.changed(pattern.builds)
            after = fingerprint(ctx.module)
            self.only_created(before, after, redirected)
            self.declared(before, after, ctx.rewriter.cloned)
            ctx.rewriter.cloned |= cloned
            self.handles(after)
            self.counts["apply"] += 1
            pattern.record(ctx, planned, applied)
            self.unchanged(after, "record")  # it writes the ledger, never the IR
            before = after
        pattern.finish(ctx)

    def passed(self, before: Fingerprint, phase: str, result: T | None = None) -> T | None:
        """`result` of `phase`, once the IR is checked unchanged and the phase counted."""
        self.unchanged(before, phase)
        self.counts[phase] += 1
        return result

    def fail(self, phase: str, what: str) -> None:
        raise RuleViolation(f"bnfold: pattern {self.name} broke the rules in {phase}: {what}")

    def unchanged(self, before: Fingerprint, phase: str) -> None:
        after = fingerprint(self.ctx.module)
        if after == before:
            return
        if len(after) != len(before):
            self.fail(phase, f"it added or removed ops ({len(before)} -> {len(after)})")
        for old, new in zip(before, after, strict=True):
            if old != new:
                self.fail(phase, f"it changed {old[1]} (" + _difference(old, new) + ")")

    def only_created(self, before: Fingerprint, after: Fingerprint,
                     redirected: dict[ir.Value, ir.Value]) -> None:
        now = {entry[0]: entry for entry in after}
        for address, name, attributes, operands in before:
            found = now.get(address)
            if found is None or found[1] != name:
                self.fail("apply", f"it erased {name} (erasure waits for Rewriter.finish)")
                return
            if found[2] != attributes:
                self.fail("apply", f"it changed {name}'s attributes")
            expected = tuple(_follow(v, redirected) for v in operands)
            if found[3] != expected:
                self.fail("apply", f"it set an operand of {name} by hand (only "
                                   f"Rewriter.replace_op redirects uses)")

    def declared(self, before: Fingerprint, after: Fingerprint, cloned: set[str]) -> None:
        """Every op `apply` created is a clone or of a name its pattern's `builds` declares."""
        builds = self.pattern.builds
        if builds is None:
            return
        old = {entry[0] for entry in before}
        stray = sorted({name for address, name, _, _ in after
                        if address not in old and name not in builds and name not in cloned})
        if stray:
            self.fail("apply", f"it built {', '.join(stray)}, which its `builds` does not name "
                               "(the walk Context.ops keeps would miss them)")

    def handles(self, after: Fingerprint) -> None:
        present = {entry[0] for entry in after}
        stale = self.ctx.rewriter.handles.addresses() - present
        if stale:
            self.fail("apply", f"the rewriter holds handles of {len(stale)} op(s) no longer "
                               f"in the module")


def _follow(value: ir.Value, redirected: dict[ir.Value, ir.Value]) -> ir.Value:
    seen = 0
    while value in redirected and seen < 1000:
        value, seen = redirected[value], seen + 1
    return value


def _difference(old: tuple, new: tuple) -> str:
    if old[1] != new[1]:
        return f"became {new[1]}"
    if old[2] != new[2]:
        return "attributes"
    return "operands"
