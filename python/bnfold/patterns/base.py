"""What every pattern shares: the pass state, the report hooks and the driver glue.

A pattern is a class with a kebab-case `name` (used by `--disable`), the op
names it is rooted at, and `match_and_rewrite(op, rewriter, state) -> bool`.
It returns `NO_MATCH` early for anything it does not handle and `MATCHED`
after rewriting. `as_callback` adapts it to jaxlib's rewrite driver, whose
Python patterns signal "no match" by returning a *truthy* value.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bnfold.constants import Evaluator
from bnfold.ir import format_location, ir
from bnfold.report import Fold, Report, Skip

NO_MATCH = False
MATCHED = True


@dataclass
class FoldState:
    """Shared by all patterns during one pass over one module."""

    module: ir.Module
    evaluator: Evaluator
    report: Report = field(default_factory=Report)
    source_name: str | None = None
    error: tuple[BaseException, str] | None = None
    changed_functions: set[str] = field(default_factory=set)
    absorbing: bool = False  # see pipeline: the backward walk after forward folds
    _skipped_keys: set[tuple[str, str]] = field(default_factory=set)

    def location(self, op: ir.Operation) -> str:
        return format_location(op.location, self.source_name)

    def record_fold(self, *, producer: ir.Operation, norm: ir.Operation, form: str,
                    direction: str, channels: int, ops: list[ir.Operation],
                    params: dict[str, Any]) -> Fold:
        function = function_name(producer)
        if self.absorbing:
            # Merging a forward fold's new bias with the additive step after
            # it is part of that fold, not a normalization of its own.
            where = self.location(producer)
            for fold in reversed(self.report.folds):
                if fold.producer == where and fold.direction == "forward":
                    fold.ops.extend(op.name for op in ops)
                    self._unskip(ops)
                    return fold
        fold = Fold(
            id=f"fold{len(self.report.folds)}",
            producer=self.location(producer), producer_op=producer.name,
            norm=self.location(norm), norm_op=norm.name, form=form, direction=direction,
            channels=channels, ops=[op.name for op in ops], function=function, params=params,
        )
        self.report.folds.append(fold)
        self.changed_functions.add(function)
        self._unskip(ops)
        return fold

    def _unskip(self, ops: list[ir.Operation]) -> None:
        """Drops skip entries of ops that a later pattern did fold after all."""
        folded = {self.location(op) + "|" + op.name for op in ops}
        if not any(k[0] in folded for k in self._skipped_keys):
            return
        self._skipped_keys = {k for k in self._skipped_keys if k[0] not in folded}
        self.report.skipped = [s for s in self.report.skipped
                               if f"{s.op}|{s.op_name}" not in folded]

    def record_skip(self, op: ir.Operation, reason: str) -> None:
        key = (self.location(op) + "|" + op.name, reason)
        if key in self._skipped_keys:
            return
        self._skipped_keys.add(key)
        self.report.skipped.append(Skip(self.location(op), op.name, reason, function_name(op)))

    def was_skipped(self, op: ir.Operation) -> bool:
        prefix = self.location(op) + "|" + op.name
        return any(k[0] == prefix for k in self._skipped_keys)


def function_name(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    if parent is None:
        return ""
    return ir.StringAttr(parent.attributes["sym_name"]).value


class Pattern(abc.ABC):
    name: ClassVar[str]
    roots: ClassVar[tuple[str, ...]]
    benefit: ClassVar[int] = 1
    description: ClassVar[str]

    @abc.abstractmethod
    def match_and_rewrite(self, op: ir.Operation, rewriter: Any, state: FoldState) -> bool:
        """Rewrites `op` and returns MATCHED, or returns NO_MATCH untouched."""


def as_callback(pattern: Pattern, state: FoldState) -> Callable[[Any, Any], bool]:
    """The pattern as a driver callback: falsy means "matched" to the driver.

    Exceptions are captured in `state.error` (the driver cannot carry them) and
    stop further matching; the pipeline re-raises them after the walk.
    """

    def callback(op: Any, rewriter: Any) -> bool:
        if state.error is not None:
            return True
        try:
            matched = pattern.match_and_rewrite(op.operation, rewriter, state)
        except Exception as e:  # noqa: BLE001 - re-raised by the pipeline
            import traceback

            state.error = (e, traceback.format_exc())
            return True
        return not matched

    return callback


def defining_op(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.OpView):
        return owner.operation
    return owner if isinstance(owner, ir.Operation) else None
