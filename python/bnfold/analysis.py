"""Memoized facts about one module during one run, kept valid by the rewriter.

    constants   `Evaluator`: float64 values of constant subgraphs (by value)
    steps       each op as an affine chain step (`bnfold.affine.as_step`)
    handed on   what one pattern leaves for a later one (`hand_on`, `handed`): each
                forward fold's producer (merge-bias), each equalized set's layers
                (high-bias absorption), read as the rewriter has replaced them since
    liveness    which ops survive the cleanup: replaced ops (tombstones) and
                side-effect-free ops whose every user is dead do not count; nor
                does a shape query (`get_dimension_size`: it reads no values, only
                a shape no fold changes -- a symbolic batch's dynamic bias adds one)

Liveness matters for correctness: a fold is only allowed when the producer's
result has no other *live* user. A user that is dead code is removed by the
cleanup, so counting it would make a second run fold more than the first
(`fold(fold(m))` must equal `fold(m)`).

`Analysis` listens to the `Rewriter`: any change of uses drops the liveness
cache, and the end of the run (before anything is erased: MLIR reuses an
erased op's address at once) drops everything. This is the only place these
facts live.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from bnfold.affine import STEP_NAMES, Step, as_step
from bnfold.constants import Const, Evaluator
from bnfold.graph import (
    as_operation,
    callee_name,
    calls,
    function_of,
    is_private,
    is_pure,
    symbol_name,
    symbol_table,
    symbol_uses,
    users,
)
from bnfold.ir import ir, op_id
from bnfold.rewriter import Handle, Rewriter

_MAX_DEAD_DEPTH = 64
SHAPE_QUERIES = frozenset({"stablehlo.get_dimension_size"})


class Analysis:
    """Constants, chain steps and liveness of one module during one run."""

    def __init__(self, module: ir.Module, rewriter: Rewriter | None = None, *,
                 errors_ignored: bool = False) -> None:
        self.module = module
        self.rewriter = rewriter if rewriter is not None else Rewriter()
        self._errors_ignored = errors_ignored  # see `Evaluator`
        self.evaluator = Evaluator(module, errors_ignored=errors_ignored)
        self._steps: dict[ir.Value, Step | None] = {}
        self._dead: dict[int, bool] = {}
        self._handed: dict[str, list[tuple[Any, tuple[ir.Operation, ...]]]] = {}
        self.rewriter.listen(self)

    # -- constants and steps ------------------------------------------------------

    def constant(self, value: ir.Value) -> Const | None:
        return self.evaluator.constant(value)

    def is_constant(self, value: ir.Value) -> bool:
        """`constant(value) is not None`; a plain constant's elements are not read."""
        return self.evaluator.is_constant(value)

    def step(self, op: ir.Operation, name: str | None = None) -> Step | None:
        """`op` (named `name`, when the caller knows) as a chain step (activation operand
        + constants), or None."""
        if (op.name if name is None else name) not in STEP_NAMES or len(op.results) != 1:
            return None
        key = op.results[0]
        if key not in self._steps:
            self._steps[key] = as_step(op, self.evaluator)
        return self._steps[key]

    # -- what patterns hand on -------------------------------------------------------

    def hand_on(self, topic: str, record: Any, ops: Sequence[ir.Operation]) -> None:
        """Leaves `record` and its `ops` under `topic` for a later pattern of this run."""
        self._handed.setdefault(topic, []).append((record, tuple(ops)))

    def handed(self, topic: str) -> Iterator[tuple[Any, list[ir.Operation]]]:
        """What earlier patterns left under `topic`, in order, each op as it is when its
        record is reached (its successor where the rewriter replaced it)."""
        current = self.rewriter.current
        for record, ops in list(self._handed.get(topic, [])):
            yield record, [current(op) for op in ops]

    # -- liveness -------------------------------------------------------------------

    def is_dead(self, op: ir.Operation) -> bool:
        """Replaced, or side-effect free with every user dead (the cleanup removes it)."""
        key = op_id(op)
        cached = self._dead.get(key)
        if cached is None:
            cached = self._dead[key] = self._is_dead(op, 0)
        return cached

    def _is_dead(self, op: ir.Operation, depth: int) -> bool:
        if self.rewriter.is_replaced(op):
            return True
        if not is_pure(op) or depth > _MAX_DEAD_DEPTH:
            return False
        return all(self._is_dead(u, depth + 1) for r in op.results for u in users(r))

    def live_users(self, value: ir.Value) -> list[ir.Operation]:
        """The users of `value` that survive the cleanup and read its values."""
        uses = iter(value.uses)
        first = next(uses, None)
        if first is None:
            return []
        if next(uses, None) is None:  # the common case: one user
            owner = as_operation(first.owner)
            if owner is None or self.rewriter.is_replaced(owner) or owner.name in SHAPE_QUERIES:
                return []
            return [owner]
        return [u for u in users(value) if u.name not in SHAPE_QUERIES and not self.is_dead(u)]

    def keepers(self, call: ir.Operation, exclude: Sequence[ir.Operation] = ()) -> list[str]:
        """What keeps `call`'s callee, and the constants in it and in the helpers it calls,
        in the module once `call` is gone (a weight a fold read through `call` is then a
        copy), as op names: another call of one of those helpers (`func.call`), an op
        naming one (a composite's decomposition), and a helper that is public or has side
        effects (`func.func`: nothing removes it). A dead call counts where the cleanup
        will not run (a function nothing changed in). Calls in `exclude` (the fold's own)
        do not count."""
        table = symbol_table(self.module)
        helpers = _called_within(callee_name(call), table)
        uses = symbol_uses(self.module, calls=False)
        found = [name for helper in helpers for name in uses.get(helper, [])]
        found += ["func.func" for helper in helpers if helper in table and
                  not (is_private(table[helper]) and _computes_only(table[helper]))]
        home = function_of(call)
        for other in calls([f for f in table.values() if not self.rewriter.is_replaced(f)]):
            if callee_name(other) not in helpers or other == call or other in exclude or \
                    self.rewriter.is_replaced(other):
                continue
            where = function_of(other)
            if where is not None and symbol_name(where) in helpers:
                continue  # inside the helpers themselves: goes with them
            cleaned = where == home or (where is not None and
                                        symbol_name(where) in self.rewriter.changed_functions)
            if not cleaned or any(not self.is_dead(u) for r in other.results
                                  for u in self.live_users(r)):
                found.append("func.call")
        return found

    def sole_live_user(self, value: ir.Value) -> ir.Operation | None:
        found = self.live_users(value)
        return found[0] if len(found) == 1 else None

    # -- the rewriter's listener ------------------------------------------------------

    def on_replace(self, old: Handle, successor: Handle | None) -> None:
        pass

    def on_change(self) -> None:
        self._dead.clear()

    def on_finish(self) -> None:
        self._handed.clear()  # it holds ops: nothing of them may outlive the run
        self._steps.clear()
        self._dead.clear()
        self.evaluator = Evaluator(self.module, errors_ignored=self._errors_ignored)  # empty


def _called_within(name: str, table: dict[str, ir.Operation]) -> set[str]:
    """`name` and every function its body calls, transitively."""
    found, todo = {name}, [name]
    while todo:
        func = table.get(todo.pop())
        if func is None:
            continue
        for call in calls([func]):
            inner = callee_name(call)
            if inner not in found:
                found.add(inner)
                todo.append(inner)
    return found


def _computes_only(func: ir.Operation) -> bool:
    """Whether the body has no side effect of its own (calls are judged by their callees)."""
    pure = True

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal pure
        name = op.name
        if name not in ("func.func", "func.return", "func.call") and not is_pure(op):
            pure = False
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    func.walk(visit)
    return pure
