"""One fold over a parsed module: ledger, driver, cleanup, verify.

    ledger           bnfold.ledger: one decision per op, by handle -> Report
    driver           bnfold.driver: the registered patterns, in order
        match (pure) -> plan (pure, float64) -> apply(rewriter) -> record
    rewriter         bnfold.rewriter: the only mutation path; tells the analysis
                     caches and the ledger of every replacement
    finish           the rewriter erases replaced and dead ops (changed functions only)
    verify

`bnfold.pipeline` (parse, bind, fold) and `bnfold.passes` (bnfold's MLIR passes)
both run it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from bnfold import driver
from bnfold.analysis import Analysis
from bnfold.errors import BnfoldError
from bnfold.graph import functions, printed_symbol, symbol_name
from bnfold.ir import format_diagnostics, ir
from bnfold.ledger import Ledger
from bnfold.options import FoldOptions, OptionError
from bnfold.patterns import Entry
from bnfold.report import Report
from bnfold.rewriter import Rewriter

PASS_NAME = "bnfold"


def fold_module(module: ir.Module, options: FoldOptions | None = None, *,
                source_name: str | None = None, cleanup: bool = True,
                graph_nodes: bool = False, take_statistics: bool = False,
                hand_on_statistics: bool = False, check_skipped: bool = True,
                registry: tuple[Entry, ...] | None = None) -> Report:
    """Folds normalizations in `module` in place and returns the report.

    `cleanup=False` leaves the dead producers and chains in place (for
    debugging and for tests of the rewrite rules). `graph_nodes` records, on
    each fold and skip, the Model Explorer nodes of its ops in the input, and
    marks the producers that absorbed folds in the output (`bnfold.overlay`).
    `take_statistics` and `hand_on_statistics` carry the folded batch norms'
    statistics from one bnfold pass of a pipeline to the next (in a discardable
    attribute on each producer that the next pass reads and removes), so that
    `bnfold-fold,bnfold-quantize-weights{bias-correction=true}` corrects what one
    run corrects. `registry` replaces the package's patterns (bnfold.patterns.REGISTRY; tests
    add their own). Raises `BnfoldError` if the module does not verify afterwards
    (a bnfold bug: please file the reproducer).
    """
    if isinstance(module, str | bytes | bytearray) or not hasattr(module, "operation"):
        hint = (" (MLIR text: use bnfold.fold_text, or parse it first with "
                "bnfold.ir.parse(text, bnfold.ir.make_context()))"
                if isinstance(module, str | bytes | bytearray) else "")
        raise TypeError(f"fold_module expects a parsed jaxlib.mlir.ir.Module, got "
                        f"{_describe(module)}{hint}")
    options = options or FoldOptions()
    rewriter = Rewriter()
    # Floating-point exceptions of the float64 constant math (x / 0, overflow) are
    # results the checks judge (a scale that is not finite is refused), never warnings.
    with module.context, ir.Location.unknown(), np.errstate(all="ignore"):
        nodes = None
        if graph_nodes:
            from bnfold import overlay  # only --report-overlay needs it

            nodes = overlay.input_nodes(module, rewriter)
        if options.skip_functions and check_skipped:
            check_skipped_functions(options.skip_functions, _function_names(module))
        ledger = Ledger(rewriter, source_name, nodes)
        if take_statistics:
            ledger.take(module)
        ctx = driver.Context(module, options, rewriter,
                             Analysis(module, rewriter, errors_ignored=True), ledger)
        driver.run(ctx, registry)
        report = ledger.report()
        if graph_nodes:
            overlay.mark_output(module, rewriter, ledger)
        if hand_on_statistics:
            ledger.hand_on(module)
        rewriter.finish(module, remove_dead=cleanup, keep=options.skip_functions)
        try:
            module.operation.verify()
        except ir.MLIRError as e:
            raise BnfoldError(f"{PASS_NAME}: the folded module does not verify (this is a "
                              f"bnfold bug):\n{format_diagnostics(e, source_name or '-')}",
                              preformatted=True) from None
    return report


def _function_names(module: ir.Module) -> list[str]:
    return [symbol_name(f) for f in functions(module)]


def check_skipped_functions(skipped: Iterable[str], names: Iterable[str]) -> None:
    """A function to skip that is not among `names` is an error (never a silent no-op: the
    helper the user meant would be inlined and removed); it lists the functions there are."""
    present = list(dict.fromkeys(names))
    missing = sorted(set(skipped) - set(present))
    if missing:
        there = ", ".join(map(printed_symbol, present)) or "none"
        raise OptionError(f"the module has no function {', '.join(map(printed_symbol, missing))}"
                          f"; its functions: {there}", field="skip_functions")


def _describe(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else \
        kind.__qualname__
