"""bnfold as MLIR passes: textual pipelines and Python `PassManager`s.

    bnfold-opt model.mlir --pass-pipeline='builtin.module(bnfold-fold,cse,symbol-dce)'
    bnfold-opt model.mlir --pass-pipeline='builtin.module(bnfold-fold{disable=forward-affine},canonicalize)'

From Python, with any jaxlib `PassManager` (jaxlib accepts Python-defined passes):

    from jaxlib.mlir import passmanager
    pm = passmanager.PassManager("builtin.module")   # inside `with module.context:`
    fold = bnfold.passes.add_fold(pm, bnfold.FoldOptions(disable={"forward-affine"}))
    pm.add("cse")
    pm.run(module.operation)
    print(fold.report.summary())

bnfold's passes (`bnfold.patterns.PASSES`: `bnfold-fold`,
`bnfold-expand-batch-norm`, `bnfold-equalize`) take every option of the
schema (`bnfold.options`) as a pass option, except those the pass fixes:
`bnfold-fold{disable=forward-affine skip-func=encoder pad-uniform-shift=true}`,
read with MLIR's pass-option grammar (`bnfold.pass_syntax`: quoted values,
braced lists, errors with their column).
Every other element goes to MLIR as text, so the upstream and StableHLO
passes jaxlib registers work as in mlir-opt (StableHLO's are registered on
first use). Note that jaxlib's `inline` pass is registered but inlines
nothing (no inliner interfaces): bnfold-fold inlines the calls it needs
itself (see the inline-calls pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bnfold import pass_syntax
from bnfold.errors import BnfoldError
from bnfold.fold import fold_module
from bnfold.ir import format_diagnostics, ir, passmanager, register_passes
from bnfold.options import FoldOptions, Kind, Meta, OptionError, PassSpec
from bnfold.patterns import PASSES, pattern_names
from bnfold.report import Report
from bnfold.schema import meta, table

UPSTREAM_EXAMPLES = ("canonicalize", "cse", "symbol-dce", "sccp", "inline",
                     "stablehlo-refine-shapes", "stablehlo-legalize-to-vhlo")
_BY_NAME = {spec.name: spec for spec in PASSES}
PASS_SPECS = _BY_NAME  # bnfold's passes by pipeline name


@dataclass
class ModuleView:
    """What `fold_module` needs of an `ir.Module`, for a pass's `builtin.module` op."""

    operation: ir.Operation

    @property
    def body(self) -> ir.Block:
        return self.operation.regions[0].blocks[0]

    @property
    def context(self) -> ir.Context:
        return self.operation.context


@dataclass
class FoldPass:
    """A bnfold pass added to a PassManager; `report` holds what its runs did."""

    options: FoldOptions
    source_name: str | None = None
    graph_nodes: bool = False
    report: Report = field(default_factory=Report)
    error: BnfoldError | None = None
    # An earlier bnfold pass of the pipeline hands its statistics on; a later one takes them.
    take_statistics: bool = False
    hand_on_statistics: bool = False
    argument: str = "bnfold-fold"  # the pass's name in the pipeline
    check_skipped: bool = True  # skip-func must name functions of the module
    # The pipeline's text and this pass's element in it, so that an option error found
    # only when the pass runs (skip-func naming no function) points at its column.
    pipeline: str | None = None
    element: pass_syntax.Element | None = None

    def __call__(self, op: Any, pass_: Any) -> None:
        try:
            self.report.merge(fold_module(ModuleView(op.operation), self.options,  # type: ignore[arg-type]
                                          source_name=self.source_name,
                                          graph_nodes=self.graph_nodes,
                                          take_statistics=self.take_statistics,
                                          hand_on_statistics=self.hand_on_statistics,
                                          check_skipped=self.check_skipped))
        except OptionError as e:  # named as the pipeline spells it
            spelled = e.spelled(_BY_NAME.get(self.argument, _BY_NAME["bnfold-fold"]).spelling)
            self.error = BnfoldError(spelled.message + self._point_at(e.field),
                                     location=f"--pass-pipeline: {spelled.location}")
            pass_.signal_pass_failure()
        except BnfoldError as e:
            self.error = e
            pass_.signal_pass_failure()


    def _point_at(self, name: str | None) -> str:
        """The column of the option `name` (a FoldOptions field) in the pipeline, with a
        caret; the pass's own column when it was not given; nothing outside a pipeline."""
        if self.pipeline is None or self.element is None:
            return ""
        key = _pass_option(name) if name is not None else None
        at = next((o.value_at for o in self.element.options if o.key == key), self.element.at)
        return pass_syntax.point_at(self.pipeline, at)


def add_fold(pm: passmanager.PassManager, options: FoldOptions | None = None, *,
             argument: str = "bnfold-fold", source_name: str | None = None,
             graph_nodes: bool = False) -> FoldPass:
    """Adds bnfold's fold to `pm` (at the module level); returns it for its report."""
    fold = FoldPass(options or FoldOptions(), source_name, graph_nodes, argument=argument)
    spec = _BY_NAME.get(argument, _BY_NAME["bnfold-fold"])
    # A generic operation pass, added to a module-anchored pass manager: it
    # runs on the module op itself.
    pm.add(fold, name="BnfoldFold", argument=argument, description=spec.description)
    return fold


def run_pipeline(module: ir.Module, pipeline: str, *, source_name: str | None = None,
                 graph_nodes: bool = False, check_skipped: bool = True) -> Report:
    """Runs a textual pipeline mixing bnfold's passes with MLIR's; returns bnfold's report.

    With `graph_nodes` (Model Explorer node data), the pipeline must start with a bnfold
    pass: node ids describe the input as that pass received it."""
    register_passes()
    elements = pass_syntax.parse(pipeline)
    bnfold_options = pipeline_options(pipeline, elements)
    if graph_nodes and (not elements or elements[0].name not in _BY_NAME):
        raise BnfoldError("--report-overlay describes the input's nodes: the pipeline must "
                          f"start with one of bnfold's passes ({', '.join(_BY_NAME)})",
                          location="--pass-pipeline")
    report = Report()
    folds: list[FoldPass] = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        for index, element in enumerate(elements):
            if element.name in _BY_NAME:
                fold = add_fold(pm, bnfold_options[index], argument=element.name,
                                source_name=source_name, graph_nodes=graph_nodes and index == 0)
                # What one pass hands the next (the folded batch norms' statistics, for
                # bias correction, equalization and high-bias absorption) survives.
                fold.take_statistics = bool(folds)
                fold.check_skipped = check_skipped
                fold.pipeline, fold.element = pipeline, element
                fold.hand_on_statistics = index < max(bnfold_options)
                folds.append(fold)
                continue
            try:
                pm.add(element.text)
            except ValueError as e:
                message = _first_line(e)
                if "does not refer to a registered pass" in message:
                    message += (f"; bnfold's passes: {', '.join(_BY_NAME)}; MLIR's include "
                                f"{', '.join(UPSTREAM_EXAMPLES)} (any pass jaxlib registers)")
                raise BnfoldError(message + pass_syntax.point_at(pipeline, element.at),
                                  location="--pass-pipeline") from None
        try:
            pm.run(module.operation)
        except ir.MLIRError as e:
            failed = next((f.error for f in folds if f.error is not None), None)
            if failed is not None:
                raise failed from None
            raise BnfoldError(format_diagnostics(e, source_name or "-"),
                              preformatted=True) from None
    for fold in folds:
        report.merge(fold.report)
    return report


def pipeline_options(pipeline: str, elements: list[pass_syntax.Element] | None = None
                     ) -> dict[int, FoldOptions]:
    """The options of each bnfold pass of `pipeline`, by its index among the top-level
    elements; raises BnfoldError (with the column) for a syntax error, a bnfold pass nested
    in an op anchor, or a bad option."""
    if elements is None:
        elements = pass_syntax.parse(pipeline)
    found: dict[int, FoldOptions] = {}
    for index, element in enumerate(elements):
        for inner in element.walk()[1:]:
            if inner.name in _BY_NAME:
                raise BnfoldError(f"'{inner.name}' inside '{element.name}(...)': bnfold's passes "
                                  "run on modules (they inline across functions); write them "
                                  "at the top level, e.g. 'builtin.module(bnfold-fold)'"
                                  + pass_syntax.point_at(pipeline, inner.at),
                                  location="--pass-pipeline")
        if element.name in _BY_NAME:
            found[index] = _pass_options(_BY_NAME[element.name], element, pipeline)
    return found


def _pass_options(spec: PassSpec, element: pass_syntax.Element, pipeline: str) -> FoldOptions:
    """The options of one bnfold pass; an error points at the option it is about."""
    taken = spec.option_names()
    lists = {m.pass_option for m in _metas() if m.kind is Kind.NAMES}
    given: dict[str, str | tuple[str, ...] | None] = {}
    by_key: dict[str, pass_syntax.Option] = {}
    for option in element.options:
        if option.key not in taken:
            raise BnfoldError(f"{spec.name} has no option '{option.key}'; its options: "
                              f"{', '.join(sorted(taken))}"
                              + pass_syntax.point_at(pipeline, option.at),
                              location="--pass-pipeline")
        items = tuple(item.text for item in option.items)
        if option.key in given and not (option.key in lists and option.value is not None):
            raise BnfoldError(f"{spec.name}: option '{option.key}' is given twice"
                              + pass_syntax.point_at(pipeline, option.at),
                              location="--pass-pipeline")
        # A list option given twice is one list (as `--skip-func a --skip-func b`).
        given[option.key] = None if option.value is None else \
            (*(given.get(option.key) or ()), *items)
        by_key.setdefault(option.key, option)
    try:
        return spec.options(given)
    except OptionError as e:
        where = f"--pass-pipeline: {e.location}" if e.location else "--pass-pipeline"
        at = element.at
        key = _pass_option(e.field) if e.field is not None else None
        if key in by_key:
            at = by_key[key].value_at
        if e.field == "disable":  # at the first unknown name
            at = next((item.at for o in element.options if o.key == key for item in o.items
                       if item.text not in pattern_names()), at)
        raise BnfoldError(e.message + pass_syntax.point_at(pipeline, at), location=where
                          ) from None


def _metas() -> list[Meta]:
    return [meta(f) for f in table(FoldOptions).values()]


def _pass_option(name: str) -> str | None:
    return meta(table(FoldOptions)[name]).pass_option


def split_pipeline(pipeline: str) -> list[str]:
    """The top-level elements of `builtin.module(a,b{x=1 y=2},func.func(c))`, as written."""
    return [element.text for element in pass_syntax.parse(pipeline)]


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), "invalid pass")
