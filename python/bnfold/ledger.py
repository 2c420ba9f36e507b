"""One decision per operation: folded into a producer, or refused with a reason.

Matchers and planners are pure: they return a chain, a plan or a `Refusal`.
The pipeline writes every decision here, keyed by the operation it is about
(never by its location string: JAX gives every op of a layer the same name
location), and turns the ledger into the `Report` once, at the end:

    ledger.refuse(bn_op, "the mean is function argument %arg3 ...")
    ledger.fold(fold_record, consumed_ops)    # drops earlier refusals of those ops
    report = ledger.report()

A fold always wins over a refusal of the same op; a later refusal of an op
that already folded is ignored (it was made with less information).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from bnfold.graph import function_name
from bnfold.ir import format_location, ir, op_id
from bnfold.report import Equalized, Fold, Report, Skip


@dataclass(frozen=True)
class Refusal:
    """Why `op` (the op that names a normalization) does not fold."""

    op: ir.Operation
    reason: str


def op_key(op: ir.Operation) -> int:
    return op_id(op)


class Ledger:
    """Decisions of one pass over one module."""

    def __init__(self, source_name: str | None = None,
                 nodes: dict[int, tuple[str, str]] | None = None) -> None:
        self._source_name = source_name
        self._nodes = nodes or {}  # op key -> Model Explorer node of the input (bnfold.overlay)
        self._folds: list[Fold] = []
        self._folded: set[int] = set()
        self._refusals: dict[int, Skip] = {}
        self.expanded = 0
        self.inlined: list[str] = []
        self.changed_functions: set[str] = set()
        self.equalize = False
        # new producer (op key) -> the backward fold it absorbed (its statistics)
        self.producer_folds: dict[int, Fold] = {}
        # (mean, spread) per channel of a producer's output after its fold (high-bias absorption)
        self.output_statistics: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.equalized: list[Equalized] = []
        self._not_equalized: list[Skip] = []

    def location(self, op: ir.Operation) -> str:
        return format_location(op.location, self._source_name)

    def fold(self, fold: Fold, ops: Iterable[ir.Operation]) -> Fold:
        fold.id = f"fold{len(self._folds)}"
        self._folds.append(fold)
        self.changed_functions.add(fold.function)
        self.consume(fold, ops)
        return fold

    def consume(self, fold: Fold, ops: Iterable[ir.Operation]) -> None:
        """Marks `ops` as folded by `fold` (which lists their names)."""
        for op in ops:
            key = op_key(op)
            if key not in self._folded:
                fold.ops.append(op.name)
                if key in self._nodes:
                    fold.nodes.append(self._nodes[key])
            self._folded.add(key)
            self._refusals.pop(key, None)

    def refuse(self, refusal: Refusal) -> None:
        key = op_key(refusal.op)
        if key in self._folded or key in self._refusals:
            return
        op = refusal.op
        self._refusals[key] = Skip(self.location(op), op.name, refusal.reason, function_name(op),
                                   [self._nodes[key]] if key in self._nodes else [])

    def refuse_equalization(self, op: ir.Operation, reason: str) -> None:
        """Layer 1 `op` was not equalized with the layer after it, because `reason`."""
        key = op_key(op)
        self._not_equalized.append(Skip(self.location(op), op.name, reason, function_name(op),
                                        [self._nodes[key]] if key in self._nodes else []))

    def is_folded(self, op: ir.Operation) -> bool:
        return op_key(op) in self._folded

    def is_decided(self, op: ir.Operation) -> bool:
        key = op_key(op)
        return key in self._folded or key in self._refusals

    def report(self) -> Report:
        return Report(folds=list(self._folds), skipped=list(self._refusals.values()),
                      expanded=self.expanded, inlined=list(self.inlined),
                      equalized=list(self.equalized), not_equalized=list(self._not_equalized),
                      equalize=self.equalize)
