"""Odd and hostile inputs: always a correct fold, an untouched op with a reason, or a clean error."""

from __future__ import annotations

import numpy as np
import pytest

import bnfold
import numerics
import support

INPUTS = support.ROOT / "tests" / "inputs"


def _fold_file(name: str):
    text = (INPUTS / name).read_text()
    folded, report = support.fold(text)
    return text, folded, report


def test_dynamic_batch_is_skipped_with_reason():
    text, folded, report = _fold_file("dynamic_batch.mlir")
    assert not report.folds
    assert [s.reason for s in report.skipped] == ["dynamic shapes are not supported"]
    assert "stablehlo.batch_norm_inference" in folded


def test_nonfinite_statistics_and_nonpositive_variance_refuse():
    text, folded, report = _fold_file("nonfinite_stats.mlir")
    assert not report.folds
    reasons = sorted(s.reason for s in report.skipped)
    assert reasons == ["folded scale or shift is not finite",
                       "variance + epsilon is not positive and finite"]
    assert folded.count("stablehlo.batch_norm_inference") == 2


def test_integer_convolution_is_left_alone():
    text, folded, report = _fold_file("integer_conv.mlir")
    assert not report.folds and report.skipped[0].code == "not-float"
    context, original = support.parse(text)
    with context:
        assert folded == str(original)


def test_huge_splat_constants_are_never_materialized():
    # 4096x4096x64 f32 would be 4 GiB; it must stay a compact splat everywhere.
    text, folded, report = _fold_file("huge_splat.mlir")
    assert len(report.folds) == 1
    assert "4096x4096x64" not in folded  # dead after folding, removed with the rest
    unfolded = text.replace("  %big = stablehlo.constant dense<2.0> : tensor<4096x4096x64xf32>\n", "")
    support.compare_xla(unfolded, folded, support.inputs_for(text))


def test_evaluator_keeps_huge_splats_compact():
    from bnfold.constants import Evaluator
    text = """
    func.func @main() -> tensor<16777216x64xf32> {
      %big = stablehlo.constant dense<2.0> : tensor<4096x4096x64xf32>
      %r = stablehlo.reshape %big : (tensor<4096x4096x64xf32>) -> tensor<16777216x64xf32>
      %m = stablehlo.multiply %r, %r : tensor<16777216x64xf32>
      return %m : tensor<16777216x64xf32>
    }"""
    context, module = support.parse(text)
    with context:
        func = module.body.operations[0]
        ret = list(func.regions[0].blocks[0].operations)[-1]
        const = Evaluator(module).constant(ret.operands[0])
    assert const is not None and const.array.size == 1 and float(const.array.item()) == 4.0
    assert const.shape == (16777216, 64)


def test_nested_regions_and_private_functions_fold():
    text, folded, report = _fold_file("nested_regions.mlir")
    assert len(report.folds) == 2
    assert {f.function for f in report.folds} == {"main", "other"}
    assert "batch_norm_inference" not in folded
    x = support.inputs_for(text)
    for pred in (True, False):
        inputs = [x[0], np.array(pred)]
        numerics.check_close(numerics.run_xla(folded, inputs), numerics.run_xla(text, inputs))


def test_while_body_folds():
    text, folded, report = _fold_file("while_loop.mlir")
    assert len(report.folds) == 1
    support.compare_xla(text, folded, support.inputs_for(text))


def test_skip_func_leaves_that_function_alone():
    text = (INPUTS / "nested_regions.mlir").read_text()
    _, report = support.fold(text, skip_functions={"other"})
    assert [f.function for f in report.folds] == ["main"]


def test_empty_input_is_an_empty_module():
    """mlir-opt's convention: nothing in, an empty module out."""
    folded, report = bnfold.fold_text("", source_name="empty.mlir")
    assert folded.strip() == "module {\n}" and not report.folds and not report.skipped


@pytest.mark.parametrize("source", [
    "\x00\x01garbage",
    "func.func @f() { %0 = unknown.op : () -> () }",
    "func.func @f(%a: tensor<2xf32>) -> tensor<3xf32> { return %a : tensor<2xf32> }",
])
def test_bad_input_raises_bnfold_error(source):
    with pytest.raises(bnfold.BnfoldError) as info:
        bnfold.fold_text(source, source_name="bad.mlir")
    assert "bad.mlir" in str(info.value) and "error" in str(info.value)


def test_module_without_stablehlo_is_fine():
    folded, report = bnfold.fold_text("func.func @f() { return }")
    assert "func.func @f()" in folded and not report.folds and not report.skipped


def test_bad_options_raise_value_error():
    with pytest.raises(ValueError, match="unknown pattern"):
        bnfold.FoldOptions(disable={"no-such-pattern"})


def test_quantized_types_give_a_clean_error():
    # jaxlib's bindings do not ship the quant dialect: a located parse error, not a crash.
    text = (INPUTS / "quantized_conv.mlir").read_text()
    with pytest.raises(bnfold.BnfoldError, match=r"q\.mlir:1:\d+: error: .*quant"):
        bnfold.fold_text(text, source_name="q.mlir")


@pytest.mark.parametrize("version, supported", [("0.8.3", False), ("0.9.0", True),
                                                ("0.10.2", True), ("0.11.2", True),
                                                ("0.12.0", False)])
def test_unsupported_jaxlib_fails_at_import_with_the_range(version, supported):
    from bnfold import _jaxlib_version

    if supported:
        _jaxlib_version.check(version)
        return
    with pytest.raises(ImportError, match=r"supports jax/jaxlib 0\.9 to 0\.11.*pip install"):
        _jaxlib_version.check(version)
