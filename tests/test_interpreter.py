"""Numerics on the StableHLO reference interpreter, before and after folding.

The interpreter aborts the process on batch_norm_inference, so
`bnfold.numerics.interpret` expands it first and runs in a child process.
"""

from __future__ import annotations

import pytest

import numerics
import support

SMALL = [c for c in support.manifest(support.TESTDATA) if c["foldable"]]


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c["file"])
def test_folded_module_matches_on_reference_interpreter(case):
    text = (support.TESTDATA / case["file"]).read_text()
    folded, _ = support.fold(text)
    inputs = support.inputs_for(text)
    try:
        expected = numerics.interpret(text, inputs)
    except numerics.InterpreterCrash as e:
        pytest.skip(f"the reference interpreter itself aborts on this module: {e}")
    actual = numerics.interpret(folded, inputs)
    numerics.check_close(actual, expected, support.signature(text).element_types[0])


def test_interpreter_agrees_with_xla_on_expanded_batch_norm():
    text = (support.TESTDATA / "nofold_stats_args.mlir").read_text()
    inputs = support.inputs_for(text, positive_args=True)
    numerics.check_close(numerics.interpret(text, inputs), numerics.run_xla(text, inputs), "f32",
                         rtol=1e-5)


def test_interpreter_abort_is_contained():
    # custom_call @check.* aborts the interpreter; bnfold refuses it with an error instead.
    text = """
    func.func @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.custom_call @check.expect_eq(%arg0, %arg0) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    }"""
    import numpy as np

    from bnfold.errors import BnfoldError
    with pytest.raises(BnfoldError, match="cannot run stablehlo.custom_call"):
        numerics.interpret(text, [np.zeros(2, np.float32)])
