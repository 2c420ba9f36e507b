"""The bnfold pass: candidates, pure matching and planning, apply, one ledger.

    inline       private helpers whose producer the caller normalizes are
                 inlined, one copy per call site          (patterns.inline_calls)
    candidates   producers and affine chains, found in one walk   (bnfold.chains)
    backward     each chain after a producer (or after a case/if whose
                 branches all return producers): match -> plan -> apply
    forward      each producer after a chain: match -> plan -> apply
                 (backward runs first and wins; a forward fold's new bias is
                 then merged with additive steps after it; a shift through
                 zero padding folds as an exact border correction, or stays
                 as one add before the producer when that is refused)
    expand       opt-in: remaining batch_norm_inference -> multiply + add
    equalize     opt-in: cross-layer equalization of the folded layers
                 (patterns.equalize; after a cleanup, so dead users of the
                 old producers are not mistaken for fan-out)
    explain      every chain that looks like a normalization and did not fold
                 gets one reason, from the attempts above or from its
                 neighbours (what feeds it, what it feeds)
    cleanup      dead ops removed in the functions that changed; verify

Matching and planning never touch the IR or the report; `apply` creates
ops and redirects the uses of one root. Decisions go to a `Ledger`, turned
into the `Report` once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bnfold import affine, chains, elements, precision, statistics
from bnfold.affine import Analysis, Step
from bnfold.binding import bind_arguments
from bnfold.cleanup import remove_dead_ops
from bnfold.constants import Evaluator
from bnfold.errors import BnfoldError
from bnfold.graph import function_name, is_dead, symbol_name
from bnfold.graph import functions as module_functions
from bnfold.ir import Format, format_diagnostics, ir, make_context, parse, parse_path, serialize
from bnfold.ledger import Ledger, Refusal, op_key
from bnfold.patterns import PATTERNS, backward_affine, expand_batch_norm, forward_affine, inline_calls
from bnfold.report import Equalized, Fold, Report

PASS_NAME = "bnfold"
Bindings = Mapping[str | int, Any] | Callable[[ir.Module], Mapping[str | int, Any]]
OPT_IN = {expand_batch_norm.NAME: "expand_batch_norm"}


@dataclass(frozen=True, kw_only=True)
class FoldOptions:
    """Options of the pass.

    disable: pattern names not to run (see `pattern_names()`); a single
        name or a comma-separated string is accepted too.
    skip_functions: function names (without "@") left untouched.
    expand_batch_norm: rewrite every batch_norm_inference that did not fold
        into multiply + add (for back ends and the reference interpreter).
    pad_uniform_shift: fold a uniform shift (Keras Rescaling) through a
        convolution's zero padding by moving the padding into an explicit
        `stablehlo.pad` instead of adding the exact border correction. Off by
        default: XLA CPU runs that form 1.1-1.7x slower than the original stem,
        while the border correction runs as fast as the original.
    equalize: after folding, equalize the per-channel weight ranges of
        consecutive layers (cross-layer equalization, for per-tensor int8
        weights); the function is unchanged within the dtype's rounding.
    absorb_high_bias: with `equalize`, high-bias absorption: the part of a
        layer's bias that its ReLU/clamp almost surely passes (beta - 3*gamma,
        from the folded batch norm's statistics) moves into the next layer's
        bias. Approximate by nature; the report estimates the change.
    statistics: recover each decomposed batch norm's gamma, beta, mean,
        variance and epsilon from its constants into `Fold.params` (the
        report's `.npz`). On by default; `bnfold-opt` turns it off unless
        `--report-params` asks for them (1 in 10 of a small-layer fold's time).
        High-bias absorption recovers them whatever this says.
    """

    # Any collection of names, or one comma-separated string; stored as frozensets.
    disable: Collection[str] = field(default_factory=frozenset)
    skip_functions: Collection[str] = field(default_factory=frozenset)
    expand_batch_norm: bool = False
    pad_uniform_shift: bool = False
    equalize: bool = False
    absorb_high_bias: bool = False
    statistics: bool = True

    def __post_init__(self) -> None:
        if self.absorb_high_bias and not self.equalize:
            raise BnfoldError("absorb_high_bias (--absorb-high-bias) runs after equalization: "
                              "enable equalize (--equalize) too")
        object.__setattr__(self, "disable", _names(self.disable))
        object.__setattr__(self, "skip_functions", _names(self.skip_functions))
        unknown = sorted(set(self.disable) - set(pattern_names()))
        if unknown:
            raise BnfoldError(f"unknown pattern name(s) {', '.join(unknown)}; "
                              f"known: {', '.join(pattern_names())}")

    def enabled(self, name: str) -> bool:
        if name in self.disable:
            return False
        return name not in OPT_IN or bool(getattr(self, OPT_IN[name]))


def _names(value: str | Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(n.strip() for n in value.split(",") if n.strip())
    return frozenset(value)


def pattern_names() -> list[str]:
    return [p.NAME for p in PATTERNS]


@dataclass
class Folded:
    """A parsed, bound and folded module with the context that owns it."""

    module: ir.Module
    context: ir.Context
    report: Report

    def serialize(self, fmt: Format = "mlir", **kwargs: Any) -> bytes:
        with self.context:
            return serialize(self.module, fmt, **kwargs)


def fold_source(data: bytes | str | None = None, *, path: str | None = None,
                name: str = "<input>", options: FoldOptions | None = None,
                bindings: Bindings | None = None,
                bind_function: str = "main", allow_unregistered: bool = False,
                pass_pipeline: str | None = None, graph_nodes: bool = False) -> Folded:
    """The one pipeline: parse -> bind -> fold -> verify (-> report, write by the caller).

    Reads `data` (text, bytecode or a portable artifact) or the file at
    `path`, in a fresh context. `bindings` maps arguments of
    `bind_function` (by `argN`, name or index) to values, or is a function of
    the parsed module returning that mapping. `pass_pipeline` (a textual
    pipeline, see `bnfold.passes`) replaces the default fold. Used by `fold_text`, the CLI,
    the jax.export hook and the numerics harness. Raises `BnfoldError` for
    bad input.
    """
    context = make_context(allow_unregistered=allow_unregistered)
    if path is not None:
        module = parse_path(path, context, name=name)
    elif data is not None:
        module = parse(data, context, name=name)
    else:
        raise BnfoldError("fold_source needs data or a path")
    with context, ir.Location.unknown():
        values = bindings(module) if callable(bindings) else bindings
        if values:
            bind_arguments(module, values, function=bind_function, source_name=name)
        if pass_pipeline is None:
            report = fold_module(module, options, source_name=name, graph_nodes=graph_nodes)
        else:  # bnfold's passes and MLIR's, as the pipeline says
            from bnfold.passes import run_pipeline

            report = run_pipeline(module, pass_pipeline, source_name=name)
    return Folded(module, context, report)


def fold_module(module: ir.Module, options: FoldOptions | None = None, *,
                source_name: str | None = None, cleanup: bool = True,
                graph_nodes: bool = False) -> Report:
    """Folds normalizations in `module` in place and returns the report.

    `cleanup=False` leaves the dead producers and chains in place (for
    debugging and for tests of the rewrite rules). `graph_nodes` records, on
    each fold and skip, the Model Explorer nodes of its ops in the input (for
    `bnfold.overlay`; one more walk of the module). Raises `BnfoldError` if
    the module does not verify afterwards (a bnfold bug: please file the
    reproducer).
    """
    options = options or FoldOptions()

    def selected() -> list[ir.Operation]:
        return [f for f in module_functions(module) if symbol_name(f) not in options.skip_functions]

    funcs = selected()
    ledger = Ledger(source_name, _node_ids(module) if graph_nodes else None)
    with module.context, ir.Location.unknown():
        if options.enabled(inline_calls.NAME):
            changed, ledger.inlined = inline_calls.run(
                module, funcs, lambda: Analysis(Evaluator(module)))
            ledger.changed_functions |= changed
            funcs = selected()
        evaluator = Evaluator(module)
        _Pass(Analysis(evaluator), ledger, options).run(funcs)
        if options.enabled(expand_batch_norm.NAME):
            changed, ledger.expanded = expand_batch_norm.run(funcs, evaluator)
            ledger.changed_functions |= changed
        if options.equalize:
            if ledger.changed_functions:
                remove_dead_ops(module, ledger.changed_functions)
            _equalize(module, selected(), ledger, options.absorb_high_bias)
        if cleanup and ledger.changed_functions:
            remove_dead_ops(module, ledger.changed_functions)
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise BnfoldError(f"{PASS_NAME}: the folded module does not verify (this is a "
                              f"bnfold bug):\n{format_diagnostics(e, source_name or '-')}",
                              preformatted=True) from None
    return ledger.report()


@dataclass
class _Notes:
    """What the attempts on one normalization found, for its reason if it does not fold."""

    op: ir.Operation
    backward: str | None = None
    forward: str | None = None


class _Pass:
    def __init__(self, analysis: Analysis, ledger: Ledger, options: FoldOptions) -> None:
        self.analysis = analysis
        self.ledger = ledger
        self.options = options
        self.notes: dict[int, _Notes] = {}
        # Each backward fold's new kernels are attributes before the next one is
        # planned, so they can all be rounded into the same memory.
        self.arena = precision.Arena()

    def run(self, funcs: list[ir.Operation]) -> None:
        found = chains.find(funcs, self.analysis)
        producers = list(found.producers)
        if self.options.enabled(backward_affine.NAME):
            replaced: dict[int, ir.Operation] = {}
            for chain in found.chains:
                replaced.update(self.backward(chain))
            producers = [replaced.get(op_key(p), p) for p in producers]
        if self.options.enabled(forward_affine.NAME):
            merged = [self.forward(p) for p in producers]
            if self.options.enabled(backward_affine.NAME):
                for result in merged:
                    if result is not None:
                        self.absorb(*result)
        self.explain(found)

    # -- backward -------------------------------------------------------------

    def backward(self, chain: chains.Chain) -> dict[int, ir.Operation]:
        """Folds `chain` into the producer(s) before it; returns the replaced producers."""
        source = backward_affine.match(chain)
        if source is None or is_dead(chain.tail.op):
            return {}
        self.arena.clear()
        plan = backward_affine.plan(source, chain, self.analysis, arena=self.arena)
        if isinstance(plan, str):
            self._note(list(chain.steps), backward=plan)
            return {}
        norm, replaced = backward_affine.apply(plan)
        fold = self.ledger.fold(_fold_record(self.ledger, source.leaves[0], norm, plan.affine,
                                             "backward", plan.kernel_rounding, list(plan.steps)),
                                [s.op for s in plan.steps])
        evaluator = self.analysis.evaluator
        output = None
        if self.options.statistics or self.options.absorb_high_bias:
            if "gamma" not in fold.params and fold.kind == "normalization":
                fold.params.update(statistics.recover(list(plan.steps), plan.affine,
                                                      evaluator) or {})
            output = statistics.pre_activation(list(plan.steps), plan.affine, fold.params,
                                               evaluator)
        for producer in replaced.values():
            self.ledger.producer_folds[op_key(producer)] = fold
            if output is not None:
                self.ledger.output_statistics[op_key(producer)] = output
        rest = list(chain.steps[len(plan.steps):])
        if plan.rest_reason and affine.looks_like_normalization(rest):
            self._note(rest, backward=plan.rest_reason)
        return replaced

    # -- forward --------------------------------------------------------------

    def forward(self, producer: ir.Operation) -> tuple[Fold, ir.Operation] | None:
        match = forward_affine.match(producer, self.analysis)
        if match is None or is_dead(producer):
            return None
        plan = forward_affine.plan(match, self.analysis,
                                   pad_uniform_shift=self.options.pad_uniform_shift)
        if plan is None:
            return None
        if isinstance(plan, str):
            self._note(list(match.steps), forward=plan)
            return None
        norm, folded = forward_affine.apply(plan)
        fold = self.ledger.fold(_fold_record(self.ledger, folded, norm, plan.affine, "forward",
                                             plan.kernel.worst_relative_rounding,
                                             list(match.steps)),
                                [s.op for s in match.steps])
        if plan.merge_into is not None:
            self.ledger.consume(fold, [plan.merge_into])
        if match.pad is not None:
            self.ledger.consume(fold, [match.pad])
        if plan.correction is not None:
            fold.note = (f"shift folded exactly through zero padding: a border correction "
                         f"built from {plan.correction.table.size} constants")
        if plan.kept_reason is not None:
            fold.note = (f"scale folded; the shift stays as one add before the "
                         f"{folded.name.removeprefix('stablehlo.')}: {plan.kept_reason}")
        return fold, folded

    def absorb(self, fold: Fold, producer: ir.Operation) -> None:
        """Merges a forward fold's new bias with the additive steps after it."""
        head = affine.extends(producer.results[0], self.analysis)
        if head is None:
            return
        chain = chains.grow(head, self.analysis)
        if sum(1 for s in chain.steps if s.name not in affine.LAYOUT) < 2:
            return
        source = backward_affine.Source(producer.results[0], (producer,))
        plan = backward_affine.plan(source, chain, self.analysis, require_normalizing=False)
        if isinstance(plan, str):
            return
        backward_affine.apply(plan)
        self.ledger.consume(fold, [s.op for s in plan.steps])

    # -- explain --------------------------------------------------------------

    def _note(self, steps: list[Step], *, backward: str | None = None,
              forward: str | None = None) -> None:
        norm = affine.norm_op(steps)
        notes = self.notes.setdefault(op_key(norm), _Notes(norm))
        notes.backward = notes.backward or backward
        notes.forward = notes.forward or forward

    def explain(self, found: chains.Candidates) -> None:
        """One reason for every normalization-like chain (and batch norm) that did not fold."""
        for chain in found.chains:
            rest = [s for s in chain.steps if not self.ledger.is_folded(s.op)]
            if not rest or is_dead(rest[-1].op):
                continue  # dead code: the cleanup removes it
            norm = affine.norm_op(rest)
            notes = self.notes.get(op_key(norm))
            # A failed attempt on a scaling chain is worth explaining too.
            attempted = notes is not None and affine.normalizes(rest)
            if not (attempted or affine.looks_like_normalization(rest)):
                continue
            notes = notes or _Notes(norm)
            self.ledger.refuse(Refusal(norm, self._reason(chains.Chain(tuple(rest)), notes)))
        for op in found.batch_norms:
            if not self.ledger.is_decided(op):
                self.ledger.refuse(Refusal(op, _batch_norm_reason(op)))

    def _reason(self, chain: chains.Chain, notes: _Notes) -> str:
        if notes.backward:
            return notes.backward if not notes.forward else f"{notes.backward}; {notes.forward}"
        if not self.options.enabled(backward_affine.NAME):
            upstream = "backward-affine is disabled"
        else:
            upstream = chains.upstream_reason(chain, self.analysis)
        if notes.forward:
            return f"{upstream}; {notes.forward}"
        if "users" in upstream or "precision" in upstream:
            return upstream
        if not self.options.enabled(forward_affine.NAME):
            return f"{upstream}; forward-affine is disabled"
        return f"{upstream}; {chains.downstream_reason(chain)}"


def _node_ids(module: ir.Module) -> dict[int, tuple[str, str]]:
    from bnfold import overlay  # imported on demand: only --report-overlay needs it

    return overlay.node_ids(module)


def _equalize(module: ir.Module, funcs: list[ir.Operation], ledger: Ledger,
              absorb_high_bias: bool) -> None:
    # Imported on demand: most runs only fold, and every import is start-up time.
    from bnfold.patterns import equalize, high_bias

    evaluator = Evaluator(module)
    adjust = None
    if absorb_high_bias:
        def stats(op: ir.Operation) -> tuple[np.ndarray, np.ndarray] | None:
            return ledger.output_statistics.get(op_key(op))

        def axes(op: ir.Operation) -> tuple[int, int]:
            found = equalize.output_axis(op, evaluator)
            assert found is not None and not isinstance(found[1], str)
            return found[0], found[1].axis

        def adjust(planned: equalize.SetPlan) -> None:
            planned.high_bias = high_bias.plan(planned, stats, axes, evaluator)

    results, refused, changed, inlined = equalize.run(module, funcs, evaluator, adjust)
    ledger.equalize = True
    ledger.inlined += inlined
    ledger.changed_functions |= changed
    for chain, planned in results:
        if isinstance(planned, str):
            ledger.refuse_equalization(chain[0].first.op, planned)
            continue
        ledger.equalized.append(Equalized(
            id=f"eq{len(ledger.equalized)}",
            layers=[ledger.location(layer.op) for layer in planned.layers],
            layer_ops=[layer.op.name for layer in planned.layers],
            between=[link.pair.region.describe() for link in planned.links],
            function=function_name(chain[0].first.op), kind=equalize.kind(chain),
            iterations=planned.iterations, triplets=equalize.triplets(planned.layers),
            range_ratio_before=[equalize.range_ratio(layer.before) for layer in planned.layers],
            range_ratio_after=[equalize.range_ratio(r) for r in planned.after],
            params={f"scale{i}": pair.scale.copy() for i, pair in enumerate(chain)},
            high_bias=planned.high_bias))
    for refusal in refused:
        ledger.refuse_equalization(refusal.op, refusal.reason)


def _batch_norm_reason(op: ir.Operation) -> str:
    if any(elements.tensor_type(v) is None for v in list(op.operands) + list(op.results)):
        return "dynamic shapes are not supported"
    return "not folded: no foldable producer chain"


def _fold_record(ledger: Ledger, producer: ir.Operation, norm: ir.Operation,
                 fit: affine.Affine, direction: str, kernel_rounding: float,
                 steps: list[Step]) -> Fold:
    params = {"scale": fit.scale.copy(), "shift": fit.shift.copy()}
    if len(fit.gamma_beta) == 1:
        params.update(fit.gamma_beta[0])
    return Fold(
        id="", producer=ledger.location(producer), producer_op=producer.name,
        norm=ledger.location(norm), norm_op=norm.name,
        form="batch_norm_inference" if fit.gamma_beta else "decomposed",
        direction=direction, channels=fit.channels, ops=[], function=function_name(producer),
        params=params,
        kernel_rounding=kernel_rounding,
        kind="normalization" if affine.looks_like_normalization(steps) else "affine",
    )
