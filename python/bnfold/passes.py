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
`bnfold-fold{disable=forward-affine skip-func=encoder pad-uniform-shift=true}`.
Every other element goes to MLIR as text, so the upstream and StableHLO
passes jaxlib registers work as in mlir-opt (StableHLO's are registered on
first use). Note that jaxlib's `inline` pass is registered but inlines
nothing (no inliner interfaces): bnfold-fold inlines the calls it needs
itself (see the inline-calls pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bnfold.errors import BnfoldError
from bnfold.ir import format_diagnostics, ir, passmanager, register_passes
from bnfold.options import FoldOptions, OptionError, PassSpec
from bnfold.patterns import PASSES
from bnfold.pipeline import fold_module
from bnfold.report import Report

UPSTREAM_EXAMPLES = ("canonicalize", "cse", "symbol-dce", "sccp", "inline",
                     "stablehlo-refine-shapes", "stablehlo-legalize-to-vhlo")
_BY_NAME = {spec.name: spec for spec in PASSES}


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

    def __call__(self, op: Any, pass_: Any) -> None:
        try:
            self.report.merge(fold_module(ModuleView(op.operation), self.options,  # type: ignore[arg-type]
                                          source_name=self.source_name,
                                          graph_nodes=self.graph_nodes))
        except BnfoldError as e:
            self.error = e
            pass_.signal_pass_failure()


def add_fold(pm: passmanager.PassManager, options: FoldOptions | None = None, *,
             argument: str = "bnfold-fold", source_name: str | None = None,
             graph_nodes: bool = False) -> FoldPass:
    """Adds bnfold's fold to `pm` (at the module level); returns it for its report."""
    fold = FoldPass(options or FoldOptions(), source_name, graph_nodes)
    spec = _BY_NAME.get(argument, _BY_NAME["bnfold-fold"])
    # A generic operation pass, added to a module-anchored pass manager: it
    # runs on the module op itself.
    pm.add(fold, name="BnfoldFold", argument=argument, description=spec.description)
    return fold


def run_pipeline(module: ir.Module, pipeline: str, *, source_name: str | None = None,
                 graph_nodes: bool = False) -> Report:
    """Runs a textual pipeline mixing bnfold's passes with MLIR's; returns bnfold's report.

    With `graph_nodes` (Model Explorer node data), the pipeline must start with a bnfold
    pass: node ids describe the input as that pass received it."""
    register_passes()
    elements = split_pipeline(pipeline)
    if graph_nodes and _name_and_options(elements[0])[0] not in _BY_NAME:
        raise BnfoldError("--report-overlay describes the input's nodes: the pipeline must "
                          f"start with one of bnfold's passes ({', '.join(_BY_NAME)})",
                          location="--pass-pipeline")
    report = Report()
    folds: list[FoldPass] = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        for index, element in enumerate(elements):
            name, given = _name_and_options(element)
            if name.startswith("func.func(") and "bnfold-" in name:
                raise BnfoldError(f"'{element}': bnfold's passes run on modules (they inline "
                                  "across functions); write them at the top level, e.g. "
                                  "'builtin.module(bnfold-fold)'", location="--pass-pipeline")
            if name in _BY_NAME:
                folds.append(add_fold(pm, _pass_options(_BY_NAME[name], given), argument=name,
                                      source_name=source_name,
                                      graph_nodes=graph_nodes and index == 0))
                continue
            try:
                pm.add(element)
            except ValueError as e:
                raise BnfoldError(f"{_first_line(e)}; bnfold's passes: {', '.join(_BY_NAME)}; "
                                  f"MLIR's include {', '.join(UPSTREAM_EXAMPLES)} (any pass "
                                  f"jaxlib registers)", location="--pass-pipeline") from None
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


def _pass_options(spec: PassSpec, given: dict[str, str]) -> FoldOptions:
    try:
        return spec.options(given)
    except OptionError as e:
        where = f"--pass-pipeline: {e.location}" if e.location else "--pass-pipeline"
        raise BnfoldError(e.message, location=where) from None


def split_pipeline(pipeline: str) -> list[str]:
    """The top-level elements of `builtin.module(a,b{x=1,y=2},func.func(c))`."""
    text = pipeline.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    elements, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                raise BnfoldError(f"unbalanced '{ch}' in '{pipeline}'", location="--pass-pipeline")
        elif ch == "," and depth == 0:
            elements.append(text[start:i].strip())
            start = i + 1
    if depth != 0:
        raise BnfoldError(f"unbalanced brackets in '{pipeline}'", location="--pass-pipeline")
    elements.append(text[start:].strip())
    if not all(elements):
        raise BnfoldError(f"empty pass in '{pipeline}'", location="--pass-pipeline")
    return elements


def _name_and_options(element: str) -> tuple[str, dict[str, str]]:
    if "{" not in element or element.index("{") > element.find("(") >= 0:
        return element, {}
    name, _, rest = element.partition("{")
    body = rest.rstrip("}")
    given: dict[str, str] = {}
    for item in body.split():
        key, _, value = item.partition("=")
        given[key] = value or "true"
    return name.strip(), given


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0]
