"""The bnfold pass: which patterns run, in which order, and the cleanup after.

One walk per function with jaxlib's walk-based rewrite driver (ops in
program order, no fixpoint iteration, no folding of unrelated ops):

1. `backward-affine`  fold an affine chain into the producer before it;
2. `forward-affine`   fold an affine chain into the producer after it
                      (a chain already folded backward is gone by then,
                      so backward folding has priority); if anything folded
                      forward, `backward-affine` runs once more to merge the
                      new bias with an additive step after it;
3. `expand-batch-norm` (opt-in) rewrite each remaining batch_norm_inference
                      as multiply + add.

Then dead constants are removed in the functions that changed, and the module
is verified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bnfold import elements
from bnfold.cleanup import remove_dead_ops
from bnfold.constants import Evaluator
from bnfold.errors import BnfoldError
from bnfold.ir import format_diagnostics, ir, rewrite
from bnfold.patterns import PATTERNS, OPT_IN
from bnfold.patterns.base import FoldState, as_callback
from bnfold.report import Report

PASS_NAME = "bnfold"


@dataclass(frozen=True, kw_only=True)
class FoldOptions:
    """Options of the pass.

    disable: pattern names not to run (see `pattern_names()`).
    skip_functions: function names (without "@") left untouched.
    expand_batch_norm: rewrite every batch_norm_inference that did not fold
        into multiply + add (for back ends and the reference interpreter).
    """

    disable: frozenset[str] = field(default_factory=frozenset)
    skip_functions: frozenset[str] = field(default_factory=frozenset)
    expand_batch_norm: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "disable", frozenset(self.disable))
        object.__setattr__(self, "skip_functions", frozenset(self.skip_functions))
        unknown = sorted(set(self.disable) - set(pattern_names()))
        if unknown:
            raise ValueError(f"unknown pattern name(s) {', '.join(unknown)}; "
                             f"known: {', '.join(pattern_names())}")

    def enabled(self) -> list[str]:
        names = [p.name for p in PATTERNS if p.name not in self.disable]
        return [n for n in names if n not in OPT_IN or
                (n == "expand-batch-norm" and self.expand_batch_norm)]


def pattern_names() -> list[str]:
    return [p.name for p in PATTERNS]


def fold_module(module: ir.Module, options: FoldOptions | None = None, *,
                source_name: str | None = None) -> Report:
    """Folds normalizations in `module` in place and returns the report.

    Raises `BnfoldError` if the module does not verify afterwards (a bnfold
    bug: please file the reproducer).
    """
    options = options or FoldOptions()
    state = FoldState(module=module, evaluator=Evaluator(module), source_name=source_name)
    functions = [f for f in _functions(module)
                 if ir.StringAttr(f.attributes["sym_name"]).value not in options.skip_functions]
    with module.context, ir.Location.unknown():
        for name in _schedule(options):
            _run_pattern(name, functions, state)
            if name == "forward-affine" and _forward_folded(state) and \
                    "backward-affine" in options.enabled():
                # A forward fold adds a bias after its producer; a second
                # backward walk merges it with an additive step that follows.
                state.absorbing = True
                _run_pattern("backward-affine", functions, state)
                state.absorbing = False
        if state.changed_functions:
            remove_dead_ops(module, state.changed_functions)
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise BnfoldError(f"{PASS_NAME}: the folded module does not verify (this is a "
                              f"bnfold bug):\n{format_diagnostics(e, source_name or '-')}") from None
    _record_leftover_batch_norms(functions, state)
    return state.report


def _schedule(options: FoldOptions) -> list[str]:
    return options.enabled()


def _forward_folded(state: FoldState) -> bool:
    return any(f.direction == "forward" for f in state.report.folds)


def _run_pattern(name: str, functions: list[ir.Operation], state: FoldState) -> None:
    pattern = next(p for p in PATTERNS if p.name == name)()
    patterns = rewrite.RewritePatternSet()
    for root in pattern.roots:
        patterns.add(root, as_callback(pattern, state), pattern.benefit)
    frozen = patterns.freeze()
    for func in functions:
        rewrite.walk_and_apply_patterns(func, frozen)
        if state.error is not None:
            error, trace = state.error
            raise RuntimeError(f"{PASS_NAME}: internal error in pattern '{name}':\n"
                               f"{trace}") from error


def _functions(module: ir.Module) -> Iterable[ir.Operation]:
    for op in module.body.operations:
        if op.operation.name == "func.func":
            yield op.operation


def _record_leftover_batch_norms(functions: Iterable[ir.Operation], state: FoldState) -> None:
    """Every batch_norm_inference still present is in the report with a reason."""
    leftovers: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.batch_norm_inference":
            leftovers.append(op)
        return ir.WalkResult.ADVANCE

    for func in functions:
        func.walk(visit)
    for op in leftovers:
        if state.was_skipped(op):
            continue
        if any(elements.tensor_type(v) is None for v in list(op.operands) + list(op.results)):
            state.record_skip(op, "dynamic shapes are not supported")
        else:
            state.record_skip(op, "not folded: no foldable producer chain")
