"""Shared helpers of the pytest suite (imported as `support`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import bnfold
import numerics
from bnfold import ir as bir

ROOT = Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "testdata"
MODELS = TESTDATA / "models"


def manifest(directory: Path) -> list[dict]:
    path = directory / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else []


def parse(text: str | bytes):
    context = bir.make_context()
    return context, bir.parse(text, context)


def op_names(text: str) -> list[str]:
    """Names of every op in a module, in order."""
    context, module = parse(text)
    names: list[str] = []

    def visit(op):
        names.append(op.name)
        return bir.ir.WalkResult.ADVANCE

    with context:
        module.operation.walk(visit)
    return names


def signature(text: str) -> numerics.Signature:
    context, module = parse(text)
    with context:
        return numerics.main_signature(module)


def fold(text: str, **options) -> tuple[str, bnfold.Report]:
    return bnfold.fold_text(text, bnfold.FoldOptions(**options) if options else None)


def inputs_for(text: str, seed: int = 0, positive_args: bool = False) -> list[np.ndarray]:
    xs = numerics.random_inputs(signature(text), seed)
    return [np.abs(x) + 0.5 if positive_args and x.dtype.kind == "f" else x for x in xs]


def compare_xla(original: str, folded: str, inputs: list[np.ndarray]) -> float:
    """Worst relative error of the folded module against the original on XLA CPU."""
    element_type = signature(original).element_types[0]
    expected = numerics.run_xla(original, inputs)
    actual = numerics.run_xla(folded, inputs)
    return numerics.check_close(actual, expected, element_type)


def refined(text: str, shape: list[int]) -> str:
    """A symbolic-batch export refined to a concrete input shape (as XLA needs)."""
    context, module = parse(text)
    bir.run_pipeline(module, "builtin.module(stablehlo-refine-arguments{types='tensor<"
                             + "x".join(map(str, shape)) + "xf32>'},stablehlo-refine-shapes)")
    assertions = []

    def visit(op):
        if op.name == "stablehlo.custom_call" and \
                "shape_assertion" in str(op.attributes["call_target_name"]):
            assertions.append(op)
        return bir.ir.WalkResult.ADVANCE

    with context:
        module.operation.walk(visit)
        for op in assertions:  # jax checks these itself; bare XLA has no handler
            op.operation.erase()
        return str(module)
