"""One decision per operation: folded into a producer, or refused with a reason.

Matchers and planners are pure: they return a match, a plan or a `Refusal`.
Patterns write every decision here, keyed by the operation's `Handle` (never
by its address, which MLIR reuses, nor by its location string: JAX gives
every op of a layer the same name location), and the ledger turns into the
`Report` once, at the end:

    ledger.refuse(bn_op, Refusal(Code.PARAMETER, "the mean is function argument %arg3 ..."))
    ledger.fold(fold_record, consumed_ops, producer=new_producer)
    report = ledger.report()

A fold always wins over a refusal of the same op; a later refusal of an op
that already folded is ignored (it was made with less information).

The ledger listens to the rewriter: when a producer that absorbed folds is
replaced again (equalization copies it with new kernels), its folds and the
statistics of its output move to the successor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from bnfold.graph import function_name
from bnfold.ir import format_location, ir
from bnfold.refusal import Refusal
from bnfold.report import Fold, Part, Report, Skip
from bnfold.rewriter import Handle, Rewriter

if TYPE_CHECKING:
    from bnfold.patterns import Entry

NodeRef = tuple[str, str]  # (Model Explorer graph id, node id), see bnfold.overlay
CARRIED = "bnfold.statistics"  # a producer's statistics, between two bnfold passes


@dataclass(frozen=True)
class Statistics:
    """Mean and spread per channel of a producer's *pre-activation*: its result plus the
    bias its fold added after it (`offset`; None once a position-dependent correction
    made the result's mean vary over positions). The producer's result itself has mean
    `mean - offset` (`at_result`): what a walk that starts there must use.

        %y = stablehlo.convolution(%x, %k)        // mean - offset, spread
        %b = stablehlo.add %y, %offset_b          // mean, spread (the batch norm's beta, |gamma|)

    `spread` is the batch norm's `|gamma|` (a bound: ranges and high-bias absorption
    use it); `deviation` is the standard deviation its statistics imply, `|gamma| *
    sqrt(var / (var + eps))` (never larger; None: the spread), which a mean through an
    activation needs (`deviation_at_result`).
    """

    mean: np.ndarray
    spread: np.ndarray
    offset: np.ndarray | None
    deviation: np.ndarray | None = None

    def scaled(self, factor: np.ndarray) -> Statistics:
        """The statistics once the result and its bias are times a positive per-channel
        `factor` (equalization)."""
        return Statistics(self.mean * factor, self.spread * np.abs(factor),
                          None if self.offset is None else self.offset * factor,
                          None if self.deviation is None else self.deviation * np.abs(factor))

    def shifted(self, pre_activation: np.ndarray, result: np.ndarray | None) -> Statistics:
        """The statistics once the pre-activation moved by `pre_activation` and the result
        by `result` (per channel; None: by an amount that varies over positions)."""
        offset = None if self.offset is None or result is None else \
            self.offset + pre_activation - result
        return Statistics(self.mean + pre_activation, self.spread, offset, self.deviation)

    def at_result(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, spread) of the producer's result, or None when it varies over positions."""
        return None if self.offset is None else (self.mean - self.offset, self.spread)

    def deviation_at_result(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, standard deviation) of the producer's result, or None when its mean
        varies over positions."""
        found = self.at_result()
        return None if found is None else \
            (found[0], self.spread if self.deviation is None else self.deviation)


class Ledger:
    """Decisions of one run over one module."""

    def __init__(self, rewriter: Rewriter, source_name: str | None = None,
                 nodes: dict[Handle, NodeRef] | None = None) -> None:
        self._rewriter = rewriter
        self._source_name = source_name
        self._nodes = nodes or {}  # handle -> Model Explorer node of the input (bnfold.overlay)
        self._folds: list[Fold] = []
        self._folded: set[Handle] = set()
        self._refusals: dict[Handle, Skip] = {}
        self._parts: dict[str, Part] = {}  # each reporting pattern's own records
        self._running = ""  # the pattern the driver runs now
        # producer -> the folds it absorbed, and the statistics of its output
        self._absorbed: dict[Handle, list[Fold]] = {}
        self._statistics: dict[Handle, Statistics] = {}
        self._no_statistics: dict[Handle, str] = {}  # why a folded batch norm gave none
        rewriter.listen(self)

    # -- the patterns' own records ------------------------------------------------

    def expect(self, entries: Iterable[Entry]) -> None:
        """The sections of `entries` that every report has (`Entry.reports == "always"`)."""
        for entry in entries:
            if entry.reports == "always" and entry.name not in self._parts:
                self._parts[entry.name] = Part(entry.name, entry.section())

    def ran(self, entry: Entry) -> None:
        """`entry`'s pattern runs now (until the next one): its section, if it reports, is
        in the report, and `records`, `add` and `add_refusal` are its."""
        self._running = entry.name
        if entry.reports:
            self.expect([entry])
            self._parts.setdefault(entry.name, Part(entry.name, entry.section())).ran = True

    def records(self) -> Part:
        """The running pattern's records and refusals so far (its entry reports)."""
        return self._parts[self._running]

    def add(self, record: Any) -> Any:
        """Records what the running pattern did (a record of the type its section renders)."""
        self.records().records.append(record)
        return record

    def add_refusal(self, op: ir.Operation, refusal: Refusal,
                    layers: Sequence[ir.Operation] = ()) -> None:
        """The running pattern did not rewrite `op` (or the set of `layers` it heads, refused
        as a whole), because `refusal`."""
        skip = self._skip(op, refusal)
        skip.layers = [self.location(layer) for layer in layers]
        self.records().refused.append(skip)

    def location(self, op: ir.Operation) -> str:
        return format_location(op.location, self._source_name)

    # -- folds and refusals -----------------------------------------------------

    def fold(self, fold: Fold, ops: Iterable[ir.Operation], *,
             producer: ir.Operation | None = None) -> Fold:
        """Records `fold`, which consumed `ops`; `producer` now carries it."""
        fold.id = f"fold{len(self._folds)}"
        self._folds.append(fold)
        self.consume(fold, ops)
        if producer is not None:
            self._absorbed.setdefault(self._rewriter.handle(producer), []).append(fold)
        return fold

    def fold_carried_by(self, fold: Fold, producer: ir.Operation) -> None:
        """Another producer carries `fold` too (each branch of a multi-platform case)."""
        self._absorbed.setdefault(self._rewriter.handle(producer), []).append(fold)

    def consume(self, fold: Fold, ops: Iterable[ir.Operation]) -> None:
        """Marks `ops` as folded by `fold` (which lists their names)."""
        for op in ops:
            key = self._rewriter.handle(op)
            if key not in self._folded:
                fold.ops.append(op.name)
                if key in self._nodes:
                    fold.nodes.append(self._nodes[key])
            self._folded.add(key)
            self._refusals.pop(key, None)

    def refuse(self, op: ir.Operation, refusal: Refusal, ops: Iterable[ir.Operation] = ()) -> None:
        """`op` (the op that names a normalization, whose other ops are `ops`) does not
        fold, because `refusal`."""
        key = self._rewriter.handle(op)
        if key in self._folded or key in self._refusals:
            return
        skip = self._skip(op, refusal)
        for other in ops:  # every op of the normalization, for the overlay
            node = self._nodes.get(self._rewriter.handle(other))
            if node is not None and node not in skip.nodes:
                skip.nodes.append(node)
        self._refusals[key] = skip

    def _skip(self, op: ir.Operation, refusal: Refusal) -> Skip:
        key = self._rewriter.handle(op)
        return Skip(self.location(op), op.name, refusal.message, function_name(op),
                    [self._nodes[key]] if key in self._nodes else [], refusal.code.value)

    def is_folded(self, op: ir.Operation) -> bool:
        return self._rewriter.handle(op) in self._folded

    def is_decided(self, op: ir.Operation) -> bool:
        return self.decides(self._rewriter.handle(op))

    def decides(self, key: Handle) -> bool:
        """Whether the op with handle `key` has a decision (folded, or refused)."""
        return key in self._folded or key in self._refusals

    # -- what producers carry -----------------------------------------------------------

    def statistics(self, producer: ir.Operation) -> Statistics | None:
        return self._statistics.get(self._rewriter.handle(producer))

    def set_statistics(self, producer: ir.Operation, statistics: Statistics) -> None:
        self._statistics[self._rewriter.handle(producer)] = statistics

    def no_statistics(self, producer: ir.Operation) -> str | None:
        """Why the batch norm folded into `producer` says nothing of its output, if known."""
        return self._no_statistics.get(self._rewriter.handle(producer))

    def set_no_statistics(self, producer: ir.Operation, reason: str) -> None:
        self._no_statistics[self._rewriter.handle(producer)] = reason

    def folds_of(self, producer: ir.Operation) -> list[Fold]:
        """The folds `producer` (or the op it replaced) absorbed."""
        return self._absorbed.get(self._rewriter.handle(producer), [])

    # -- from one pass of a pipeline to the next -------------------------------------------

    def hand_on(self, module: ir.Module) -> None:
        """Writes each live producer's statistics into a discardable attribute (`CARRIED`),
        for the next bnfold pass of a pipeline (`take`): a separate run, with its own ledger,
        whose bias correction or equalization needs the batch norms this run folded."""
        if not self._statistics:
            return

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            handle = self._rewriter.handles.get(op)
            stats = self._statistics.get(handle) if handle is not None else None
            if stats is not None and not self._rewriter.is_replaced(op):
                arrays = {f.name: getattr(stats, f.name) for f in fields(Statistics)
                          if getattr(stats, f.name) is not None}
                op.attributes[CARRIED] = ir.DictAttr.get(
                    {k: ir.DenseElementsAttr.get(cast(Any, np.ascontiguousarray(v, np.float64)))
                     for k, v in arrays.items()})
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)

    def take(self, module: ir.Module) -> None:
        """Reads (and removes) the statistics an earlier pass handed on (`hand_on`)."""

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if CARRIED in op.attributes:
                attrs = ir.DictAttr(op.attributes[CARRIED])
                arrays = {f.name: np.array(ir.DenseElementsAttr(attrs[f.name]), np.float64)
                          for f in fields(Statistics) if f.name in attrs}
                del op.attributes[CARRIED]
                self.set_statistics(op, Statistics(**arrays))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)

    # -- the rewriter's listener ------------------------------------------------------------

    def on_replace(self, old: Handle, successor: Handle | None) -> None:
        if successor is None:
            return
        if old in self._absorbed:
            self._absorbed.setdefault(successor, []).extend(self._absorbed.pop(old))
        if old in self._statistics and successor not in self._statistics:
            self._statistics[successor] = self._statistics.pop(old)
        if old in self._no_statistics and successor not in self._no_statistics:
            self._no_statistics[successor] = self._no_statistics.pop(old)

    def on_change(self) -> None:
        pass

    def on_finish(self) -> None:
        pass  # keyed by handles, never by ops

    # -- the end ----------------------------------------------------------------------------

    def absorbing_producers(self) -> dict[Handle, list[Fold]]:
        """Every producer (by handle) that carries folds now."""
        return {h: folds for h, folds in self._absorbed.items() if folds}

    def report(self) -> Report:
        return Report(folds=list(self._folds), skipped=list(self._refusals.values()),
                      parts=[Part(p.name, p.section, list(p.records), list(p.refused), p.ran)
                             for p in self._parts.values()])
