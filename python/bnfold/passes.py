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

bnfold's passes are `bnfold-fold` (options `disable=NAME,NAME`,
`skip-func=NAME,NAME`, `expand-batch-norm=true|false`) and
`bnfold-expand-batch-norm`; every other element goes to MLIR as text, so
the upstream and StableHLO passes jaxlib registers work as in mlir-opt
(StableHLO's are registered on first use). Note that jaxlib's `inline` pass
is registered but inlines nothing (no inliner interfaces): bnfold-fold
inlines the calls it needs itself (see the inline-calls pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bnfold.errors import BnfoldError
from bnfold.ir import format_diagnostics, ir, passmanager, register_passes
from bnfold.pipeline import FoldOptions, fold_module
from bnfold.report import Report

PASSES = {
    "bnfold-fold": "fold batch normalization (every spelling) into convolutions and dot_generals",
    "bnfold-expand-batch-norm": "rewrite every batch_norm_inference as multiply + add",
    "bnfold-equalize": "fold, then equalize the weight ranges of consecutive layers "
                       "(cross-layer equalization; option absorb-high-bias=true)",
}
UPSTREAM_EXAMPLES = ("canonicalize", "cse", "symbol-dce", "sccp", "inline",
                     "stablehlo-refine-shapes", "stablehlo-legalize-to-vhlo")


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
    report: Report = field(default_factory=Report)
    error: BnfoldError | None = None

    def __call__(self, op: Any, pass_: Any) -> None:
        try:
            self.report.merge(fold_module(ModuleView(op.operation), self.options,  # type: ignore[arg-type]
                                          source_name=self.source_name))
        except BnfoldError as e:
            self.error = e
            pass_.signal_pass_failure()


def add_fold(pm: passmanager.PassManager, options: FoldOptions | None = None, *,
             argument: str = "bnfold-fold", source_name: str | None = None) -> FoldPass:
    """Adds bnfold's fold to `pm` (at the module level); returns it for its report."""
    fold = FoldPass(options or FoldOptions(), source_name)
    # A generic operation pass, added to a module-anchored pass manager: it
    # runs on the module op itself.
    pm.add(fold, name="BnfoldFold", argument=argument, description=PASSES["bnfold-fold"])
    return fold


def run_pipeline(module: ir.Module, pipeline: str, *, source_name: str | None = None) -> Report:
    """Runs a textual pipeline mixing bnfold's passes with MLIR's; returns bnfold's report."""
    register_passes()
    elements = split_pipeline(pipeline)
    report = Report()
    folds: list[FoldPass] = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        for element in elements:
            name, options = _name_and_options(element)
            if name in PASSES:
                folds.append(add_fold(pm, _fold_options(name, options), argument=name,
                                      source_name=source_name))
                continue
            try:
                pm.add(element)
            except ValueError as e:
                raise BnfoldError(f"{_first_line(e)}; bnfold's passes: {', '.join(PASSES)}; "
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
    if "{" not in element:
        return element, {}
    name, _, rest = element.partition("{")
    body = rest.rstrip("}")
    options: dict[str, str] = {}
    for item in body.split():
        key, _, value = item.partition("=")
        options[key] = value or "true"
    return name.strip(), options


def _fold_options(name: str, options: dict[str, str]) -> FoldOptions:
    known = {"disable", "skip-func", "expand-batch-norm", "pad-uniform-shift"}
    if name == "bnfold-equalize":
        known.add("absorb-high-bias")
    unknown = sorted(set(options) - known)
    if unknown:
        raise BnfoldError(f"{name} has no option {', '.join(unknown)}; its options: "
                          f"{', '.join(sorted(known))}", location="--pass-pipeline")
    if name == "bnfold-expand-batch-norm":
        from bnfold.pipeline import pattern_names

        return FoldOptions(disable=set(pattern_names()) - {"expand-batch-norm"},
                           expand_batch_norm=True)
    flags = {}
    for key in ("expand-batch-norm", "pad-uniform-shift", "absorb-high-bias"):
        flag = options.get(key, "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise BnfoldError(f"{key}={flag} is not true or false", location="--pass-pipeline")
        flags[key] = flag in ("true", "1")
    try:
        return FoldOptions(disable=options.get("disable", ""),
                           skip_functions=options.get("skip-func", ""),
                           expand_batch_norm=flags["expand-batch-norm"],
                           pad_uniform_shift=flags["pad-uniform-shift"],
                           equalize=name == "bnfold-equalize",
                           absorb_high_bias=flags["absorb-high-bias"])
    except BnfoldError as e:
        raise BnfoldError(f"{name}: {e.message}", location="--pass-pipeline") from None


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0]
