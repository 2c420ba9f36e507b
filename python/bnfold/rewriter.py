"""The one mutation path: every change to the IR goes through a `Rewriter`.

MLIR reuses a freed operation's address for the next operation it creates
(nearly always, for an op of the same kind), and Python's wrappers of an
operation and of a value hash by that address. A map keyed by an op, a value
or an address that outlives an erase can therefore hand a stale answer to
the newcomer. bnfold avoids that with three rules, all enforced here:

* Ops are identified by a `Handle` (`Rewriter.handle`): a number that is
  never reused. Reports, overlays and statistics are keyed by handles.
* Replacing an op (`replace_op`) redirects its uses and *defers* its erase
  until `finish`, when no pattern runs any more: while patterns run nothing
  is freed, so no address is reused and no wrapper dangles. The replaced op
  is a tombstone: dead for liveness, gone for the walks.
* Listeners (the analysis caches, the ledger) are told of every replacement
  and, before anything is erased, that the run is over (`on_finish`), as
  MLIR's `RewriterBase::Listener` is told of replacements and erasures.

A pattern's `apply` creates ops at an insertion point (building is not a
change: nothing existing sees it), then replaces its root:

    with ir.InsertionPoint(op):
        new = rewriter.clone(op, {1: kernel})        # a copy with a new kernel operand
    rewriter.replace_op(op, [new.results[0]], successor=new)

`finish` ends the run: it tells every listener to drop everything it keyed
by ops, values or addresses (`on_finish`), forgets every handle, then erases
the replaced ops and the ops left dead in the functions that changed (jaxlib's
greedy driver erases the trivially dead ones in C++: thousands of ops in a
few milliseconds, where one Python call per op costs tens).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import NewType, Protocol

from bnfold.graph import (
    callee_name,
    calls,
    function_name,
    functions,
    is_private,
    is_pure,
    referenced_symbols,
    symbol_name,
    users,
)
from bnfold.ir import ir, op_id, rewrite

Handle = NewType("Handle", int)


class Listener(Protocol):
    """Told of every change a `Rewriter` makes (MLIR's rewriter listener model)."""

    def on_replace(self, old: Handle, successor: Handle | None) -> None:
        """`old`'s results now read from elsewhere; `successor` computes the same thing."""

    def on_change(self) -> None:
        """Uses changed somewhere: drop anything derived from them."""

    def on_finish(self) -> None:
        """The run is over and ops are about to be erased: drop everything keyed by an
        op, a value or an address (nothing may be used after this)."""


class Handles:
    """Stable identities for operations; an erased op's handle is never given out again."""

    def __init__(self) -> None:
        self._by_address: dict[int, Handle] = {}
        self._count = 0

    def of(self, op: ir.Operation | ir.OpView) -> Handle:
        """The op's handle (a new one the first time the op is seen)."""
        address = op_id(op)
        handle = self._by_address.get(address)
        if handle is None:
            handle = self._by_address[address] = Handle(self._count)
            self._count += 1
        return handle

    def get(self, op: ir.Operation | ir.OpView) -> Handle | None:
        """The op's handle if it has one."""
        return self._by_address.get(op_id(op))

    def addresses(self) -> set[int]:
        """The addresses of the ops that have handles (the driver's checking mode)."""
        return set(self._by_address)

    def clear(self) -> None:
        """Forgets every address (handles given out stay unique: the count goes on)."""
        self._by_address.clear()


class Rewriter:
    """Replaces, erases and clones operations, and tells the listeners."""

    def __init__(self) -> None:
        self.handles = Handles()
        self._listeners: list[Listener] = []
        self._tombstones: dict[Handle, ir.Operation] = {}
        self._tombstone_ids: set[int] = set()  # their addresses: `is_replaced` in one lookup
        self._successors: dict[Handle, ir.Operation] = {}
        self.changed_functions: set[str] = set()
        # Counts the changes to which ops the module's functions hold (a dropped function);
        # replacing keeps the old op until `finish`, so it is not one.
        self.version = 0
        self.cloned: set[str] = set()  # names of the ops `clone` created (nested ones too)
        # While the driver checks a pattern's apply: each result replace_op redirected.
        self.redirects: dict[ir.Value, ir.Value] | None = None

    # -- identity -------------------------------------------------------------

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def handle(self, op: ir.Operation | ir.OpView) -> Handle:
        return self.handles.of(op)

    def is_replaced(self, op: ir.Operation) -> bool:
        if not self._tombstone_ids:  # nothing replaced yet: no address to look up
            return False
        return op_id(op) in self._tombstone_ids

    def current(self, op: ir.Operation) -> ir.Operation:
        """The op that now computes what `op` computed (itself unless replaced)."""
        handle = self.handles.get(op)
        while handle is not None and handle in self._successors:
            op = self._successors[handle]
            handle = self.handles.get(op)
        return op

    # -- building -------------------------------------------------------------

    def clone(self, op: ir.Operation, operands: dict[int, ir.Value] | None = None) -> ir.Operation:
        """A copy of `op` right before it (regions included), with some operands replaced.

        The copy is new, so setting its operands changes nothing that exists. Its name (and
        those of the ops in its regions) go into `cloned`: the walk `Context.ops` keeps lacks
        the copy."""
        copy = op.clone(ip=ir.InsertionPoint(op)).operation
        for index, value in (operands or {}).items():
            copy.operands[index] = value
        if len(copy.regions):
            copy.walk(self._note_clone)
        else:
            self.cloned.add(copy.name)
        return copy

    def _note_clone(self, op: ir.Operation) -> ir.WalkResult:
        self.cloned.add(op.name)
        return ir.WalkResult.ADVANCE

    # -- changing -------------------------------------------------------------

    def replace_op(self, op: ir.Operation, values: Sequence[ir.Value], *,
                   successor: ir.Operation | None = None) -> None:
        """Every use of `op`'s results reads `values` instead; `op` is erased at `finish`.

        `successor` is the op that now computes what `op` computed (a folded
        producer, an equalized copy): records about `op` move to it."""
        if len(values) != len(op.results):
            raise ValueError(f"{op.name} has {len(op.results)} results, got {len(values)} values")
        for result, value in zip(op.results, values, strict=True):
            if result != value:
                result.replace_all_uses_with(value)
                if self.redirects is not None:
                    self.redirects[result] = value
        handle = self.handle(op)
        self._tombstones[handle] = op
        self._tombstone_ids.add(op_id(op))
        if successor is not None:
            self._successors[handle] = successor
        name = function_name(op)
        if name:
            self.changed_functions.add(name)
        after = self.handle(successor) if successor is not None else None
        for listener in self._listeners:
            listener.on_replace(handle, after)
            listener.on_change()

    def supersede(self, old: ir.Operation, new: ir.Operation) -> None:
        """`new` takes over `old`'s role (a folded producer: its records move to `new`);
        `old` keeps its uses, all dead, and goes with the cleanup. Shape queries of
        `old`'s results move to `new`'s (the same shapes), so nothing keeps `old` alive."""
        handle, after = self.handle(old), self.handle(new)
        self._successors[handle] = new
        for result, successor in zip(old.results, new.results, strict=True):
            for query in [u for u in users(result) if u.name == "stablehlo.get_dimension_size"]:
                with ir.InsertionPoint(query):
                    moved = self.clone(query, {0: successor})
                self.replace_op(query, list(moved.results), successor=moved)
        for listener in self._listeners:
            listener.on_replace(handle, after)

    def drop_function(self, func: ir.Operation) -> None:
        """Marks a private function that nothing calls any more for erasure at `finish`."""
        self._tombstones[self.handle(func)] = func
        self._tombstone_ids.add(op_id(func))
        self.version += 1
        for listener in self._listeners:
            listener.on_change()

    # -- the end of a run -------------------------------------------------------

    def finish(self, module: ir.Module, *, remove_dead: bool = True,
               keep: Container[str] = ()) -> None:
        """Ends the run: listeners drop what they keyed by ops (`on_finish`), then, with
        `remove_dead`, the replaced ops and every op left dead in the functions that
        changed are erased (side-effect free with unused results, and calls of
        side-effect free private functions), and the private functions dropped because
        nothing calls them any more, or whose last call the cleanup erased (a helper that
        computed a weight a fold replaced: its constants would stay in the module), except
        those in `keep` (skipped functions). Functions without a change stay as they were.
        Without `remove_dead` (debugging) nothing is erased: replaced ops stay, unused."""
        tombstones = list(self._tombstones.values())
        self._tombstones.clear()
        self._tombstone_ids.clear()
        self._successors.clear()
        for listener in self._listeners:
            listener.on_finish()
        self._listeners.clear()
        if remove_dead:
            dropped = [op for op in tombstones if op.name == "func.func"]
            # Replaced ops that MLIR does not consider trivially dead (calls): erased here,
            # users first; the rest are side-effect free and go with the cleanup below.
            for op in reversed([op for op in tombstones if op.name == "func.call"]):
                if _unused(op):
                    op.erase()
            pure_callees = _pure_functions(module)
            uncalled: set[str] = set()
            for func in functions(module):
                if symbol_name(func) in self.changed_functions and func not in dropped:
                    uncalled |= _remove_dead(func, pure_callees)
            for func in dropped:
                func.erase()
            _erase_uncalled(module, uncalled, pure_callees, keep)
        self.handles.clear()


def _erase_uncalled(module: ir.Module, names: set[str], pure_callees: set[str],
                   keep: Container[str]) -> None:
    """Erases the pure private functions in `names` that nothing refers to any more (no
    call, no composite's decomposition, no custom_call's called_computations), and then
    those that only they called."""
    while names:
        functions_now = list(functions(module))
        called = referenced_symbols(module)  # calls, and a composite's decomposition ...
        gone = [f for f in functions_now if symbol_name(f) in names and is_private(f) and
                symbol_name(f) in pure_callees and symbol_name(f) not in called and
                symbol_name(f) not in keep]
        names = {callee_name(c) for c in calls(gone)}
        for func in gone:
            func.erase()


def _remove_dead(func: ir.Operation, pure_callees: set[str]) -> set[str]:
    """Erases unused side-effect-free ops in `func` (jaxlib's greedy driver, no patterns:
    folding, CSE and region simplification off), and dead calls of pure private
    functions, which MLIR cannot prove dead; once more for what those calls fed. Returns
    the callees of the calls it erased."""
    _erase_trivially_dead(func)
    dead: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if op.name == "func.call" and callee_name(op) in pure_callees and _unused(op):
            dead.append(op)
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    erased = {callee_name(op) for op in dead}
    for op in dead:
        op.erase()
    if dead:
        _erase_trivially_dead(func)
    return erased


def _erase_trivially_dead(func: ir.Operation) -> None:
    config = rewrite.GreedyRewriteConfig()
    config.enable_folding = False
    config.enable_constant_cse = False
    config.region_simplification_level = rewrite.GreedySimplifyRegionLevel.DISABLED
    config.max_iterations = 2
    rewrite.apply_patterns_and_fold_greedily(func, rewrite.RewritePatternSet().freeze(), config)


def _unused(op: ir.Operation) -> bool:
    return not any(True for result in op.results for _ in result.uses)


def _pure_functions(module: ir.Module) -> set[str]:
    """Private single-block functions whose bodies only compute (calls of such included)."""
    bodies: dict[str, list[ir.Operation]] = {}
    for func in functions(module):
        if is_private(func) and len(func.regions[0].blocks) == 1:
            bodies[symbol_name(func)] = [o.operation for o in func.regions[0].blocks[0].operations]
    pure: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, ops in bodies.items():
            if name not in pure and all(_computes(o, pure) for o in ops):
                pure.add(name)
                grew = True
    return pure


def _computes(op: ir.Operation, pure: Iterable[str]) -> bool:
    if op.name == "func.return":
        return True
    if op.name == "func.call":
        return callee_name(op) in pure
    return is_pure(op) and not op.regions
