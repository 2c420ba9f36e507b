"""Numerics on the StableHLO reference interpreter, before and after folding.

The interpreter aborts the process on batch_norm_inference, so
`numerics.interpret` expands it first, as the StableHLO specification defines it
(`numerics.expand_batch_norms`, not bnfold's own pattern), in a child process.
"""

from __future__ import annotations

import numpy as np
import pytest

import numerics
import support
from bnfold import ir as bir

SMALL = [c for c in support.manifest(support.TESTDATA) if c["foldable"]]
# The reference interpreter of jaxlib 0.10.2 aborts on these originals ("Incompatible index
# and shape found while flattening index": a convolution with permuted dimension numbers).
# They are judged on XLA instead; a fixed interpreter makes the test say so.
INTERPRETER_ABORTS = {"conv2d_perm_0b1f_i0o1_f10b_bn.mlir"}


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c["file"])
def test_folded_module_matches_on_reference_interpreter(case):
    text = (support.TESTDATA / case["file"]).read_text()
    folded, _ = support.fold(text)
    inputs = support.inputs_for(text)
    dtype = support.signature(text).element_types[0]
    if case["file"] in INTERPRETER_ABORTS:
        with pytest.raises(numerics.InterpreterCrash, match="flattening index"):
            numerics.interpret(text, inputs)
        numerics.check_close(numerics.run_xla(folded, inputs), numerics.run_xla(text, inputs), dtype)
        return
    expected = numerics.interpret(text, inputs)
    actual = numerics.interpret(folded, inputs)
    numerics.check_close(actual, expected, dtype)


def test_the_harness_expansion_is_the_specification_on_numbers():
    """The oracle's own expansion against float64 numpy of the spec's formula (f32, a
    feature axis in the middle, epsilon that matters)."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 2, (2, 3, 4)).astype(np.float32)
    gamma, beta, mean = (rng.normal(0, 1, 3).astype(np.float32) for _ in range(3))
    var = np.array([1e-3, 0.5, 4.0], np.float32)
    eps = 1e-2
    vec = "tensor<3xf32>"
    text = f"""
    func.func @main(%x: tensor<2x3x4xf32>, %g: {vec}, %b: {vec}, %m: {vec}, %v: {vec}) -> tensor<2x3x4xf32> {{
      %0 = "stablehlo.batch_norm_inference"(%x, %g, %b, %m, %v) {{epsilon = {eps} : f32, feature_index = 1 : i64}} : (tensor<2x3x4xf32>, {vec}, {vec}, {vec}, {vec}) -> tensor<2x3x4xf32>
      return %0 : tensor<2x3x4xf32>
    }}"""
    context, module = support.parse(text)
    with context, bir.ir.Location.unknown():
        assert numerics.expand_batch_norms(module) == 1
        expanded = str(module)
    assert "batch_norm_inference" not in expanded
    c = (slice(None), None)
    f64 = [a.astype(np.float64) for a in (x, gamma, beta, mean, var)]
    expected = (f64[0] - f64[3][c]) / np.sqrt(f64[4][c] + np.float64(np.float32(eps))) * f64[1][c] \
        + f64[2][c]
    inputs = [x, gamma, beta, mean, var]
    for got in (numerics.interpret(text, inputs)[0], numerics.run_xla(expanded, inputs)[0]):
        numerics.check_close([got], [expected], "f32")


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
    from bnfold.errors import BnfoldError
    with pytest.raises(BnfoldError, match="cannot run stablehlo.custom_call"):
        numerics.interpret(text, [np.zeros(2, np.float32)])
