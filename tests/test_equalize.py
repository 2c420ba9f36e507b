"""Cross-layer equalization and high-bias absorption: numerics, reasons, idempotence.

IR shapes are in lit_tests/equalize.mlir; this file runs every equalized
module on XLA CPU against the original, checks what the report says, and
draws random pairs and triplets (layouts, groups, transposed and dilated
convolutions, padding, activations) with hypothesis.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

import bnfold
import modgen
import numerics
import support
from bnfold.pipeline import FoldOptions, fold_source
from test_properties import run_xla

ROOT = Path(__file__).resolve().parent.parent
LIT = (ROOT / "lit_tests" / "equalize.mlir").read_text()
# Each case as a module whose entry is @main (what the XLA runner calls).
CASES = {m.group(1): case.replace(f"func.func @{m.group(1)}(", "func.func @main(")
         for case in LIT.split("// -----")
         if (m := re.search(r"func\.func @(\w+)", case)) is not None}
MODELS = ROOT / "testdata" / "models"


def equalize(text: str | bytes, **options) -> bnfold.pipeline.Folded:
    return fold_source(text, options=FoldOptions(equalize=True, **options))


def relative_error(original: str, changed: str, seed: int = 0, inputs=None) -> float:
    inputs = inputs if inputs is not None else support.inputs_for(original, seed)
    expected = run_xla(original, inputs)
    actual = run_xla(changed, inputs)
    return max(numerics.relative_error(a, e) for a, e in zip(actual, expected, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_lit_cases_keep_the_function(name):
    text = CASES[name]
    folded = equalize(text)
    assert relative_error(text, folded.serialize().decode()) < 1e-5
    equalized = bool(folded.report.equalized)
    assert equalized == (not name.startswith("no_fire")), folded.report.table()


@pytest.mark.parametrize("name, code", [
    ("no_fire_fan_out", "fan-out"),
    ("no_fire_sigmoid", "not-homogeneous"),
    ("no_fire_kernel_argument", "not-constant"),  # folding says kernel-argument here
    ("no_fire_runtime_gate", "not-constant"),
])
def test_every_refusal_has_a_reason(name, code):
    report = equalize(CASES[name]).report
    assert not report.equalized
    assert len(report.not_equalized) == 1
    [refused] = report.not_equalized
    assert refused.code == code and refused.reason, (refused.code, refused.reason)
    assert "1 pair(s) not equalized" in report.summary()


def test_report_json_params_and_summary():
    report = equalize(CASES["pair_through_relu6"]).report
    data = report.to_json()
    [eq] = data["equalized"]
    assert eq["kind"] == "pair" and eq["between"] == ["add, clamp"]
    assert eq["range_ratio_before"][0] == pytest.approx(4.0)
    assert eq["range_ratio_after"][0] == pytest.approx(1.0)  # [2, 2] after
    np.testing.assert_allclose(report.params()["eq0/scale0"], [2.0, 0.5])
    assert "equalized 1 set(s) (1 pair)" in report.summary()
    assert "equalized" not in bnfold.fold_text(CASES["pair_through_relu6"])[1].to_json()


def test_triplet_is_one_set_and_balances_both_links():
    report = equalize(CASES["triplet_conv_depthwise_conv"]).report
    [eq] = report.equalized
    assert eq.kind == "triplet" and len(eq.layers) == 3 and eq.iterations > 1
    assert max(eq.range_ratio_after[:2]) < min(eq.range_ratio_before[:2])


def test_equalizing_twice_changes_nothing():
    """Idempotent: the second run finds every set already balanced and leaves the IR alone."""
    once = equalize(LIT.split("// -----")[1]).serialize().decode()
    twice = equalize(once)
    assert twice.serialize().decode() == once
    assert not twice.report.equalized
    assert all(s.code == "already-balanced" for s in twice.report.not_equalized)


def test_the_pass_and_the_cli_flag(tmp_path):
    from bnfold.cli import main

    source = tmp_path / "in.mlir"
    source.write_text(CASES["pair_through_relu6"])
    out = tmp_path / "out.mlir"
    params = tmp_path / "p.npz"
    assert main([str(source), "--equalize", "-o", str(out), "--report-params", str(params), "-q"]) == 0
    assert "dense<[3.000000e+00, 1.200000e+01]>" in out.read_text()
    np.testing.assert_allclose(np.load(params)["eq0/scale0"], [2.0, 0.5])
    piped = tmp_path / "piped.mlir"
    assert main([str(source), "--pass-pipeline", "builtin.module(bnfold-equalize)", "-o", str(piped),
                 "-q"]) == 0
    assert piped.read_text() == out.read_text()
    assert main([str(source), "--absorb-high-bias", "-q"]) == 1  # needs --equalize


@pytest.mark.parametrize("model", support.manifest(MODELS), ids=lambda m: m["file"])
def test_models_keep_the_function(model):
    """Every real export, equalized or not, computes what the original computes (judged on
    XLA against the unfolded original), and every pair of layers is accounted for."""
    text = (MODELS / model["file"]).read_text()
    equalized = equalize(text)
    report = equalized.report
    out = equalized.serialize().decode()
    if "tensor<?" in text:  # a symbolic batch: refine first
        text, out = support.refined(text, model["input_shape"]), support.refined(out, model["input_shape"])
    error = relative_error(text, out)
    # Equalized kernels are rounded to the model's dtype again: f32 within 1e-4, f16 and
    # bf16 within the model's own tolerance (a few units in the last place; mixed-precision
    # exports take f32 arguments and compute in the narrow type).
    assert error < max(1e-4, model.get("rtol", 1e-4)), report.table()
    if model["producers"] > 1:
        assert report.equalized or report.not_equalized, report.table()
    assert all(s.reason and s.code for s in report.not_equalized)


def test_mobilenetv2_equalizes_every_triplet_through_relu6():
    """Keras MobileNetV2: every expand -> depthwise -> project triplet equalizes through
    ReLU6 (maximum + minimum); the projections into residual adds are refused."""
    report = equalize((MODELS / "keras_mobilenetv2_nhwc.mlir").read_text()).report
    assert len(report.equalized) == 16
    assert all(len(e.layers) >= 3 for e in report.equalized)
    assert all("maximum, minimum" in e.between[0] for e in report.equalized)
    assert all(s.code == "fan-out" for s in report.not_equalized)


def test_statistics_are_recovered_from_decomposed_chains():
    """The export script draws gamma ~ U(0.5, 1.5): recovered gammas must land there."""
    checked = 0
    for path in sorted(MODELS.glob("*.mlir")):
        for fold in bnfold.fold_text(path.read_text())[1].folds:
            scales = {"stablehlo.multiply", "stablehlo.divide"} & set(fold.ops)
            if fold.direction == "backward" and fold.kind == "normalization" and scales:
                assert "gamma" in fold.params, (path.name, fold.norm)
                gamma = np.abs(fold.params["gamma"])
                assert gamma.min() >= 0.5 - 1e-5 and gamma.max() <= 1.5 + 1e-5, path.name
                checked += 1
    assert checked > 100


# --- high-bias absorption ----------------------------------------------------------------

HIGH_BIAS = """
func.func @main(%x: tensor<2x4x4x2xf32>) -> tensor<2x4x4x2xf32> {
  %k1 = stablehlo.constant dense<[[[[0.02, -0.01, 0.03], [0.01, 0.02, -0.02]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x2xf32>, tensor<1x1x2x3xf32>) -> tensor<2x4x4x3xf32>
  %g = stablehlo.constant dense<[0.5, 0.5, 0.25]> : tensor<3xf32>
  %b = stablehlo.constant dense<[4.0, 0.2, 3.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[0.0, 0.1, 0.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[1.0, 1.0, 0.25]> : tensor<3xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 3 : i64} : (tensor<2x4x4x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x4x4x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %six = stablehlo.constant dense<6.0> : tensor<f32>
  %r = stablehlo.clamp %zero, %n, %six : (tensor<f32>, tensor<2x4x4x3xf32>, tensor<f32>) -> tensor<2x4x4x3xf32>
  %k2 = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]]]> : tensor<1x1x3x2xf32>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x3xf32>, tensor<1x1x3x2xf32>) -> tensor<2x4x4x2xf32>
  return %z : tensor<2x4x4x2xf32>
}
"""


def test_high_bias_absorption_moves_the_bias_and_keeps_the_function():
    """beta - 3|gamma| = [2.5, -1.3, 2.25]: channels 0 and 2 move into layer 2's bias.
    Inputs keep every pre-activation within 3 sigma, so the result is exact here."""
    plain = equalize(HIGH_BIAS)
    absorbed = equalize(HIGH_BIAS, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    assert record["absorbed"] and record["channels"] == 2
    assert record["exact"].startswith("exact for every input")
    assert 0 < record["estimated_output_change"] < 1, record  # a number, a small one here
    s = eq.params["scale0"]
    assert record["absorbed_max"] == pytest.approx(max(2.5 / s[0], 2.25 / s[2]), rel=1e-6)
    out = absorbed.serialize().decode()
    assert out.count("stablehlo.add") == 2  # layer 1's bias, and layer 2's new bias
    assert relative_error(HIGH_BIAS, out) < 1e-5
    assert relative_error(HIGH_BIAS, plain.serialize().decode()) < 1e-5


def test_high_bias_of_a_saturated_relu6_channel_is_at_most_its_bound():
    """beta = 1e4 keeps channel 0 at ReLU6's bound 6 for every input: it passes 6, no more,
    so at most 6 / s moves. Moving beta - 3|gamma| (~1e4 / s) leaves the clamp a negative
    upper bound and layer 2 a bias of ~1e5 that its output (~6) cancels: f32 error 5e-4
    against the original on XLA."""
    text = HIGH_BIAS.replace("dense<[4.0, 0.2, 3.0]>", "dense<[10000.0, 0.2, 3.0]>")
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    assert record["absorbed"], record
    s = eq.params["scale0"]
    assert record["absorbed_max"] <= 6 / s[0] * (1 + 1e-6), (record, s)
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


T4 = "tensor<2x4x4x3xf32>"
CLAMP = f"  %r = stablehlo.clamp %zero, %n, %six : (tensor<f32>, {T4}, tensor<f32>) -> {T4}\n"
NCHW_LAYER_2 = ("dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, 0, 1, f], window = {} "
                "{batch_group_count = 1 : i64, feature_group_count = 1 : i64} : "
                "(tensor<2x3x4x4xf32>, tensor<1x1x3x2xf32>)")
# Activations and layouts around them that high-bias absorption must see through: the
# channel axis moves (NHWC -> NCHW) before or after the activation, or ReLU is a select.
HIGH_BIAS_PATHS = {
    "transpose_before_activation": (
        "  %t = stablehlo.transpose %n, dims = [0, 3, 1, 2] : (tensor<2x4x4x3xf32>) -> "
        "tensor<2x3x4x4xf32>\n"
        "  %r = stablehlo.clamp %zero, %t, %six : (tensor<f32>, tensor<2x3x4x4xf32>, tensor<f32>) "
        "-> tensor<2x3x4x4xf32>\n", True),
    "transpose_after_activation": (
        f"  %a = stablehlo.clamp %zero, %n, %six : (tensor<f32>, {T4}, tensor<f32>) -> {T4}\n"
        "  %r = stablehlo.transpose %a, dims = [0, 3, 1, 2] : (tensor<2x4x4x3xf32>) -> "
        "tensor<2x3x4x4xf32>\n", True),
    "relu_as_select": (
        f"  %z4 = stablehlo.constant dense<0.0> : {T4}\n"
        f"  %p = stablehlo.compare GT, %n, %z4 : ({T4}, {T4}) -> tensor<2x4x4x3xi1>\n"
        f"  %r = stablehlo.select %p, %n, %z4 : tensor<2x4x4x3xi1>, {T4}\n", False),
}


@pytest.mark.parametrize("name", sorted(HIGH_BIAS_PATHS))
def test_high_bias_follows_the_channel_axis_and_the_spelling_of_relu(name):
    lines, nchw = HIGH_BIAS_PATHS[name]
    text = HIGH_BIAS.replace(CLAMP, lines)
    if nchw:
        text = text.replace(NCHW_LAYER_2.replace("[b, f, 0, 1]", "[b, 0, 1, f]").replace(
            "tensor<2x3x4x4xf32>", T4), NCHW_LAYER_2)
    assert text.count("stablehlo.convolution") == 2 and ("2x3x4x4" in text) == nchw
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    assert record["absorbed"] and record["channels"] == 2, record
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


@pytest.mark.parametrize("name, activation, code", [
    # max(y, 0.5) passes y - c + c only where y - c >= 0.5 - c: not the identity (not ReLU)
    ("maximum_with_a_nonzero_bound",
     "  %half = stablehlo.constant dense<0.5> : tensor<2x4x4x3xf32>\n"
     "  %r = stablehlo.maximum %n, %half : tensor<2x4x4x3xf32>\n", "role"),
    # |y| commutes with a positive scale (equalized) but is not the identity above 0
    ("abs_is_not_relu", "  %r = stablehlo.abs %n : tensor<2x4x4x3xf32>\n", "role"),
])
def test_high_bias_refuses_what_is_not_bias_then_relu(name, activation, code):
    text = HIGH_BIAS.replace(CLAMP, activation)
    absorbed = equalize(text, absorb_high_bias=True)
    records = [h for eq in absorbed.report.equalized for h in eq.high_bias]
    assert records and not any(r["absorbed"] for r in records), records
    assert all(r["code"] == code and r["reason"] for r in records), records
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


def test_high_bias_without_batch_norm_statistics_says_so():
    """A layer 1 with a plain bias (no batch norm) has no statistics to take c from."""
    text = HIGH_BIAS.replace(
        '  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, '
        'feature_index = 3 : i64} : (tensor<2x4x4x3xf32>, tensor<3xf32>, tensor<3xf32>, '
        'tensor<3xf32>, tensor<3xf32>) -> tensor<2x4x4x3xf32>',
        '  %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<3xf32>) -> tensor<2x4x4x3xf32>\n'
        '  %n = stablehlo.add %y, %bb : tensor<2x4x4x3xf32>')
    assert "batch_norm_inference" not in text
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    assert not record["absorbed"] and record["code"] == "no-statistics" and record["reason"], record
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


def _dense(values: np.ndarray) -> str:
    return "dense<" + np.array2string(values, separator=", ", threshold=10**6,
                                      floatmode="unique").replace("\n", "") + ">"


def _padded_layer_2(window: str) -> str:
    """HIGH_BIAS with a 3x3 layer 2 (`window`) instead of the 1x1 one."""
    k2 = np.random.default_rng(3).normal(0, 1, (3, 3, 3, 2)).astype(np.float32)
    text = HIGH_BIAS.replace(
        '%k2 = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]]]> : '
        'tensor<1x1x3x2xf32>',
        f"%k2 = stablehlo.constant {_dense(k2)} : tensor<3x3x3x2xf32>")
    return text.replace(
        "window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : "
        "(tensor<2x4x4x3xf32>, tensor<1x1x3x2xf32>) -> tensor<2x4x4x2xf32>",
        f"window = {{{window}}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : "
        "(tensor<2x4x4x3xf32>, tensor<3x3x3x2xf32>) -> tensor<2x4x4x2xf32>")


def test_high_bias_into_a_zero_padded_layer_is_exact_at_the_borders():
    """A 3x3 SAME layer 2: the padded taps stood for relu(y) = 0 and would now stand for
    c; an exact border correction (slices, concatenate) replaces the per-channel bias."""
    text = _padded_layer_2("pad = [[1, 1], [1, 1]]")
    absorbed = equalize(text, absorb_high_bias=True)
    [record] = absorbed.report.equalized[0].high_bias
    assert record["absorbed"] and record["channels"] == 2
    assert "corrected exactly" in record["exact"]
    out = absorbed.serialize().decode()
    assert "stablehlo.concatenate" in out
    assert relative_error(text, out) < 1e-5


def test_high_bias_into_a_dilated_asymmetrically_padded_layer_is_exact():
    text = _padded_layer_2("pad = [[1, 3], [0, 2]], rhs_dilate = [2, 1]")
    absorbed = equalize(text, absorb_high_bias=True)
    [record] = absorbed.report.equalized[0].high_bias
    assert "corrected exactly" in record["exact"]
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


THREE_LAYERS = """
func.func @main(%x: tensor<8x2xf32>) -> tensor<8x2xf32> {
  %k1 = stablehlo.constant dense<[[0.02, -0.01, 0.03], [0.01, 0.02, -0.02]]> : tensor<2x3xf32>
  %y1 = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<8x2xf32>, tensor<2x3xf32>) -> tensor<8x3xf32>
  %g1 = stablehlo.constant dense<[0.5, 0.5, 0.25]> : tensor<3xf32>
  %b1 = stablehlo.constant dense<[4.0, 0.2, 3.0]> : tensor<3xf32>
  %m1 = stablehlo.constant dense<[0.0, 0.1, 0.0]> : tensor<3xf32>
  %v1 = stablehlo.constant dense<[1.0, 1.0, 0.25]> : tensor<3xf32>
  %n1 = "stablehlo.batch_norm_inference"(%y1, %g1, %b1, %m1, %v1) {epsilon = 0.0 : f32, feature_index = 1 : i64} : (tensor<8x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<8x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %six = stablehlo.constant dense<6.0> : tensor<f32>
  %r1 = stablehlo.clamp %zero, %n1, %six : (tensor<f32>, tensor<8x3xf32>, tensor<f32>) -> tensor<8x3xf32>
  %k2 = stablehlo.constant dense<[[0.01, 0.02, -0.01], [0.02, -0.01, 0.01], [-0.01, 0.01, 0.02]]> : tensor<3x3xf32>
  %y2 = stablehlo.dot_general %r1, %k2, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3x3xf32>) -> tensor<8x3xf32>
  %g2 = stablehlo.constant dense<[0.5, 0.25, 0.5]> : tensor<3xf32>
  %b2 = stablehlo.constant dense<[3.5, 2.0, 0.5]> : tensor<3xf32>
  %m2 = stablehlo.constant dense<[0.05, 0.0, 0.0]> : tensor<3xf32>
  %v2 = stablehlo.constant dense<[0.01, 0.01, 0.01]> : tensor<3xf32>
  %n2 = "stablehlo.batch_norm_inference"(%y2, %g2, %b2, %m2, %v2) {epsilon = 0.0 : f32, feature_index = 1 : i64} : (tensor<8x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<8x3xf32>
  %r2 = stablehlo.clamp %zero, %n2, %six : (tensor<f32>, tensor<8x3xf32>, tensor<f32>) -> tensor<8x3xf32>
  %k3 = stablehlo.constant dense<[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]> : tensor<3x2xf32>
  %z = stablehlo.dot_general %r2, %k3, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3x2xf32>) -> tensor<8x2xf32>
  return %z : tensor<8x2xf32>
}
"""


def test_high_bias_of_the_next_link_uses_its_own_statistics():
    """Link 1 restores layer 2's pre-activation, so link 2 absorbs exactly
    (beta2 - 3|gamma2|) / s2, not that plus what link 1 moved."""
    absorbed = equalize(THREE_LAYERS, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    first, second = eq.high_bias
    assert first["absorbed"] and second["absorbed"], eq.high_bias
    c2 = np.maximum(0.0, np.array([3.5, 2.0, 0.5]) - 3 * np.array([0.5, 0.25, 0.5]))
    expected = c2 / eq.params["scale1"]
    assert second["absorbed_max"] == pytest.approx(expected.max(), rel=1e-6)
    assert relative_error(THREE_LAYERS, absorbed.serialize().decode()) < 1e-5


def test_high_bias_uses_the_statistics_of_the_whole_chain():
    """A scale after the batch norm (same chain) scales the pre-activation's mean and
    spread too: c = (beta - 3|gamma|) / 4 here, not beta - 3|gamma|, which would
    absorb past what the ReLU passes and change the function."""
    text = HIGH_BIAS.replace(
        "  %zero = stablehlo.constant dense<0.0> : tensor<f32>\n",
        "  %quarter = stablehlo.constant dense<0.25> : tensor<2x4x4x3xf32>\n"
        "  %nq = stablehlo.multiply %n, %quarter : tensor<2x4x4x3xf32>\n"
        "  %zero = stablehlo.constant dense<0.0> : tensor<f32>\n").replace(
        "stablehlo.clamp %zero, %n, %six", "stablehlo.clamp %zero, %nq, %six")
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    s = eq.params["scale0"]
    assert record["absorbed_max"] == pytest.approx(max(2.5 / 4 / s[0], 2.25 / 4 / s[2]), rel=1e-6)
    assert relative_error(text, absorbed.serialize().decode()) < 1e-5


def test_high_bias_that_would_overflow_f16_is_refused_and_undone():
    """The precision contract: K2 * c past f16's range refuses the link, and layer 1's
    bias and ReLU6 bound keep their equalized values (no half-absorbed state)."""
    text = HIGH_BIAS.replace("f32", "f16").replace("epsilon = 0.0 : f16", "epsilon = 0.0 : f32")
    text = text.replace("dense<[[[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]]]>",
                        "dense<[[[[60000.0, -20000.0], [0.5, 0.1], [1.0, 3.0]]]]>")
    plain = equalize(text).serialize().decode()
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    [record] = eq.high_bias
    assert not record["absorbed"]
    assert record["code"] == "precision" and "f16" in record["reason"], record
    assert absorbed.serialize().decode() == plain


def _conv_nhwc(x, k, padding: str):
    import jax
    return jax.lax.conv_general_dilated(x, k, (1, 1), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_high_bias_absorbs_both_links_of_a_triplet_whose_middle_layer_zero_pads():
    """conv 1x1 -> bn -> relu -> conv 3x3 SAME -> bn -> relu -> conv 1x1 (a MobileNet
    block's shape). Link 1's shift reaches the padded layer 2 as a border correction
    that merges with layer 2's bias; taken first, it left link 2 a bias that varies over
    positions, refused as "not per channel" (the breaker run). Both links absorb now, and
    the function is kept on inputs whose pre-activations stay within 3 sigma (the
    statistics are drawn from these inputs' own activations)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, (2, 6, 6, 4)).astype(np.float32)
    kernels = [rng.normal(0, s, shape).astype(np.float32)
               for s, shape in ((0.5, (1, 1, 4, 4)), (0.3, (3, 3, 4, 4)), (0.5, (1, 1, 4, 3)))]
    params = []

    def bn(z, p):
        return (z - p["mean"]) * jax.lax.rsqrt(p["var"]) * p["gamma"] + p["beta"]

    def observed(z) -> dict[str, np.ndarray]:
        """Statistics under which every value of z lies within 2.9 sigma of the mean."""
        z = np.asarray(z, np.float64)
        mean = z.mean(axis=(0, 1, 2))
        sd = np.maximum(z.std(axis=(0, 1, 2)), np.abs(z - mean).max(axis=(0, 1, 2)) / 2.9)
        return {"mean": mean.astype(np.float32), "var": (sd ** 2).astype(np.float32),
                "gamma": rng.uniform(0.4, 0.6, 4).astype(np.float32),
                "beta": rng.uniform(3.0, 4.0, 4).astype(np.float32)}

    z1 = _conv_nhwc(x, kernels[0], "VALID")
    params.append(observed(z1))
    z2 = _conv_nhwc(jax.nn.relu(bn(z1, params[0])), kernels[1], "SAME")
    params.append(observed(z2))

    def f(x):
        a1 = jax.nn.relu(bn(_conv_nhwc(x, kernels[0], "VALID"), params[0]))
        a2 = jax.nn.relu(bn(_conv_nhwc(a1, kernels[1], "SAME"), params[1]))
        return _conv_nhwc(a2, kernels[2], "VALID")

    text = jax.jit(f).lower(jnp.asarray(x)).as_text()
    absorbed = equalize(text, absorb_high_bias=True)
    [eq] = absorbed.report.equalized
    assert [r["link"] for r in eq.high_bias] == [0, 1]
    assert all(r["absorbed"] for r in eq.high_bias), eq.high_bias
    assert "corrected exactly" in eq.high_bias[0]["exact"]
    assert relative_error(text, absorbed.serialize().decode(), inputs=[x]) < 1e-5


def test_high_bias_refusals_are_reported():
    report = equalize((MODELS / "keras_mobilenetv2_nhwc.mlir").read_text(),
                      absorb_high_bias=True).report
    reasons = {r["reason"] for e in report.equalized for r in e.high_bias if not r["absorbed"]}
    assert any("nothing to absorb" in r for r in reasons)
    assert any("no ReLU" in r for r in reasons)  # project -> expand has no activation


# --- property tests ----------------------------------------------------------------------

ACTIVATIONS = ("none", "relu", "relu6_clamp", "relu6_minmax", "leaky")


def _activation(b: modgen.Builder, x: modgen.V, kind: str, axis: int,
                rng: np.random.Generator) -> modgen.V:
    if kind == "none":
        return x
    zero = b.const(0.0, x.shape, "z")
    bias = b.bcast(b.const(rng.normal(0, 0.5, x.shape[axis]), (x.shape[axis],), "bias"), [axis],
                   x.shape)
    x = b.binary("add", x, bias)
    if kind == "relu":
        return b.binary("maximum", x, zero)
    if kind == "relu6_minmax":
        return b.binary("minimum", b.binary("maximum", x, zero), b.const(6.0, x.shape, "six"))
    if kind == "relu6_clamp":
        t = modgen.ttype(x.shape, b.dt)
        lo, hi = b.const(0.0, (), "lo"), b.const(6.0, (), "hi")
        return b.emit("clamp", f"stablehlo.clamp {lo.name}, {x.name}, {hi.name} : "
                               f"({modgen.ttype((), b.dt)}, {t}, {modgen.ttype((), b.dt)}) -> {t}",
                      x.shape, False)
    pred = b.emit("ge", f"stablehlo.compare GE, {x.name}, {zero.name} : "
                        f"({modgen.ttype(x.shape, b.dt)}, {modgen.ttype(x.shape, b.dt)}) -> "
                        f"{modgen.ttype(x.shape, 'i1')}", x.shape, False)
    leak = b.binary("multiply", x, b.const(0.1, x.shape, "slope"))
    return b.emit("sel", f"stablehlo.select {pred.name}, {x.name}, {leak.name} : "
                         f"{modgen.ttype(x.shape, 'i1')}, {modgen.ttype(x.shape, b.dt)}",
                  x.shape, False)


def _last_conv(p: modgen.Conv, out_features: int) -> modgen.Conv:
    """A 1x1 convolution reading `p`'s result in its layout."""
    spatial = tuple(modgen.Spatial(s.out, 1, 1, 0, 0, 1, 1, False) for s in p.spatial)
    return modgen.Conv(p.batch // p.batch_groups, p.out_features, out_features, 1, 1, spatial,
                       p.out_layout, p.kernel_layout, p.out_layout)


def _imbalanced(shape: tuple[int, ...], axis: int, rng: np.random.Generator) -> np.ndarray:
    values = rng.normal(0, 1, shape)
    spread = 10 ** rng.uniform(-3, 0, shape[axis])
    return values * np.reshape(spread, [-1 if d == axis else 1 for d in range(len(shape))])


def _layer_1(p2: modgen.Conv, cin: int, seed: int, weight: float = 1.0
             ) -> tuple[modgen.Conv, modgen.Conv, modgen.Builder, modgen.V, np.random.Generator]:
    """A 1x1 layer 1 with per-channel imbalanced weights (times `weight`) producing the
    input of layer 2 (`p2`, whose positive padding stays an attribute)."""
    if p2.has_positive_pad() and p2.explicit_pad:
        p2 = replace(p2, explicit_pad=False)
    rng = np.random.default_rng(seed)
    p1 = modgen.first_conv(p2, cin)
    b = modgen.Builder("f32")
    x = b.arg(p1.in_shape())
    k1 = b.const(_imbalanced(p1.kernel_shape(), p1.kernel_layout.index("o"), rng) * weight,
                 p1.kernel_shape())
    return p1, p2, b, p1.render(b, x, k1), rng


@given(second=modgen.convs(), acts=st.tuples(st.sampled_from(ACTIVATIONS), st.sampled_from(ACTIVATIONS)),
       triplet=st.booleans(), cin=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_random_pairs_and_triplets_keep_the_function(second, acts, triplet, cin, seed):
    p1, p2, b, y, rng = _layer_1(second[0], cin, seed)
    h = _activation(b, y, acts[0], p1.out_axis, rng)
    k2 = b.const(rng.normal(0, 1, p2.kernel_shape()), p2.kernel_shape())
    out = p2.render(b, h, k2)
    if triplet:
        p3 = _last_conv(p2, 2)
        out = _activation(b, out, acts[1], p2.out_axis, rng)
        k3 = b.const(rng.normal(0, 1, p3.kernel_shape()), p3.kernel_shape())
        out = p3.render(b, out, k3)
    text = b.module([out])
    folded = equalize(text)
    result = folded.serialize().decode()
    report = folded.report
    # Equalized or not, the function is the original's (XLA, against the original).
    assert relative_error(text, result, seed) < 1e-4
    if p2.batch_groups > 1:
        assert [s.code for s in report.not_equalized] == ["axis"], report.table()
        assert "batch_group_count" in report.not_equalized[0].reason
        return
    assert report.equalized, report.table()
    [eq] = report.equalized
    assert len(eq.layers) == (3 if triplet else 2)
    assert relative_error(text, result, seed) < 1e-4
    # Balanced: a second run finds every scale within 0.1% of 1 and changes nothing.
    again = equalize(result)
    assert again.serialize().decode() == result
    assert all(s.code == "already-balanced" for s in again.report.not_equalized)


# Found by 400-example runs: a transposed layer 2 (lhs_dilation 2, no padding) whose
# dilation holes read zeros like padding does.
_HOLES = modgen.Conv(2, 1, 1, 1, 1, (modgen.Spatial(2, 1, 1, 0, 0, 2, 1, False),),
                     ("b", "f", "0"), ("i", "o", "0"), ("b", "f", "0"))


@given(second=modgen.convs(), cin=st.integers(1, 3), seed=st.integers(0, 2**16))
@example(second=(_HOLES, None), cin=1, seed=0)
@example(second=(replace(_HOLES, spatial=(modgen.Spatial(2, 1, 2, 1, 0, 2, 1, False),)), None),
         cin=1, seed=0)  # every output reads only padding or holes: one value, but not sum(K)
def test_random_high_bias_absorption_is_exact_within_three_sigma(second, cin, seed):
    """conv (1x1, tiny weights) -> batch norm -> ReLU6 -> random conv (layouts, groups,
    strides, padding, dilations, transposed, reversed): every pre-activation stays within
    0.05 of beta, above beta - 3|gamma|, so absorption must keep the function exactly,
    zero-padded borders included; channels past 6 are absorbed up to the bound."""
    assume(second[0].batch_groups == 1)
    p1, p2, b, y, rng = _layer_1(second[0], cin, seed, weight=1e-3)
    n = p2.in_features

    def stat(values: np.ndarray, name: str) -> modgen.V:
        return b.const(values, (n,), name)

    gamma = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    norm = b.bn(y, stat(gamma, "g"), stat(rng.uniform(-2.0, 8.0, n), "beta"),
                stat(np.zeros(n), "m"), stat(np.ones(n), "v"), 0.0, p1.out_axis)
    act = _activation(b, norm, "relu6_clamp", p1.out_axis, np.random.default_rng(0))
    out = p2.render(b, act, b.const(rng.normal(0, 1, p2.kernel_shape()), p2.kernel_shape()))
    text = b.module([out])
    report = equalize(text, absorb_high_bias=True)
    records = [r for e in report.report.equalized for r in e.high_bias]
    # Absorbed or refused (a correction too large to store is a refusal), every link says
    # so, and the function is exactly the original's on inputs within 3 sigma.
    assert records and all(r["absorbed"] or (r["reason"] and r["code"]) for r in records)
    inputs = [np.clip(a, -3, 3) for a in support.inputs_for(text, seed)]
    assert relative_error(text, report.serialize().decode(), inputs=inputs) < 1e-4


SHARED_RELU6 = """
func.func @main(%x: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %r = call @relu6_2(%y) : (tensor<4x2xf32>) -> tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0, 0.5], [4.0, 0.1]]> : tensor<2x2xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %q = call @relu6_2(%z) : (tensor<4x2xf32>) -> tensor<4x2xf32>
  %k3 = stablehlo.constant dense<[[3.0], [0.01]]> : tensor<2x1xf32>
  %o = stablehlo.dot_general %q, %k3, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %o : tensor<4x1xf32>
}
func.func private @relu6_2(%a: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %six = stablehlo.constant dense<6.0> : tensor<4x2xf32>
  %c = stablehlo.clamp %zero, %a, %six : tensor<4x2xf32>
  return %c : tensor<4x2xf32>
}
"""


def test_a_shared_private_relu6_gets_its_own_bounds_per_call_site():
    """JAX shares one @relu6_2 between layers of the same shape: each call site is
    inlined with its own per-channel bounds, and the helper goes away."""
    folded = equalize(SHARED_RELU6)
    out = folded.serialize().decode()
    [eq] = folded.report.equalized
    assert len(eq.layers) == 3 and folded.report.inlined == ["relu6_2", "relu6_2"]
    assert "call" not in out and "@relu6_2" not in out
    bounds = re.findall(r"stablehlo.constant dense<(\[[^\]]+\])> : tensor<2xf32>", out)
    assert len(set(bounds)) == len(bounds) >= 2, bounds  # one upper bound per call site
    assert relative_error(SHARED_RELU6, out, inputs=[np.linspace(-9, 9, 8, dtype=np.float32)
                                                     .reshape(4, 2)]) < 1e-5


def test_a_refused_set_names_every_layer_and_counts_every_pair():
    """A chain of three f16 layers whose scales would grow unbounded f16 activations is
    refused as a whole: the report must account for both pairs, not just the first
    (the fuzzer found the second pair missing from the report)."""
    text = """
    func.func @main(%x: tensor<1x1x2xf16>) -> tensor<1x2x1xf16> {
      %k1 = stablehlo.constant dense<6.406250e-01> : tensor<1x1xf16>
      %0 = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<1x1x2xf16>, tensor<1x1xf16>) -> tensor<1x2x1xf16> loc("layer1")
      %k2 = stablehlo.constant dense<3.615720e-01> : tensor<1x1xf16>
      %1 = stablehlo.dot_general %0, %k2, contracting_dims = [2] x [0] : (tensor<1x2x1xf16>, tensor<1x1xf16>) -> tensor<1x2x1xf16> loc("layer2")
      %k3 = stablehlo.constant dense<-7.036130e-01> : tensor<1x1xf16>
      %2 = stablehlo.dot_general %1, %k3, contracting_dims = [2] x [0] : (tensor<1x2x1xf16>, tensor<1x1xf16>) -> tensor<1x2x1xf16> loc("layer3")
      return %2 : tensor<1x2x1xf16>
    }"""
    report = equalize(text).report
    assert not report.equalized, report.table()
    [refused] = report.not_equalized
    assert (refused.code, refused.layers) == ("range", ["layer1", "layer2", "layer3"]), report.table()
    assert "2 pair(s) not equalized" in report.summary()
    assert refused.to_json()["layers"] == ["layer1", "layer2", "layer3"]
    assert "layer1 -> layer2 -> layer3" in report.table()


HELPER_BETWEEN = """
func.func @main(%x: tensor<4x4x1xf32>) -> tensor<1x4x1xf32> {
  %k1 = stablehlo.constant dense<[[[6.9], [-13.6], [-6.8], [-3.3], [5.6], [3.7], [-12.6], [-29.5]]]> : tensor<1x8x1xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [f, b, 0]x[0, o, i]->[f, b, 0], window = {stride = [2], pad = [[0, 0]], lhs_dilate = [1], rhs_dilate = [1]} {batch_group_count = 1 : i64, feature_group_count = 4 : i64} : (tensor<4x4x1xf32>, tensor<1x8x1xf32>) -> tensor<8x4x1xf32> loc("layer1")
  %g = stablehlo.constant dense<[0.19, 1.59, 0.63, 0.44, -6.9, 6.2, 4.97, 0.22]> : tensor<8xf32>
  %b = stablehlo.constant dense<[0.07, -1.19, -0.46, 0.51, -7.49, 2.31, -2.0, -0.01]> : tensor<8xf32>
  %m = stablehlo.constant dense<[-13.7, 4.8, -13.6, -1.7, 0.86, -6.1, 1.6, 8.2]> : tensor<8xf32>
  %v = stablehlo.constant dense<[4.3, 16.5, 4.5, 1.06, 17.0, 7.4, 28.1, 153.5]> : tensor<8xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 1.0e-03 : f32, feature_index = 0 : i64} : (tensor<8x4x1xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<8x4x1xf32>
  %h = call @helper(%n) : (tensor<8x4x1xf32>) -> tensor<8x4x1xf32>
  %k2 = stablehlo.constant dense<[[1.53, 0.0127, 2.17, 1.76, 0.318, 0.887, -0.368, -4.64]]> : tensor<1x8xf32>
  %o = stablehlo.dot_general %k2, %h, contracting_dims = [1] x [0] : (tensor<1x8xf32>, tensor<8x4x1xf32>) -> tensor<1x4x1xf32> loc("layer2")
  return %o : tensor<1x4x1xf32>
}
func.func private @helper(%a: tensor<8x4x1xf32>) -> tensor<8x4x1xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<8x4x1xf32>
  %r = stablehlo.maximum %a, %z : tensor<8x4x1xf32>
  return %r : tensor<8x4x1xf32>
}
"""


def test_a_helper_after_a_batch_norm_op_is_inlined_and_equalized():
    """Found by the fuzzer: a private helper between a batch_norm_inference and the next
    layer was not inlined (the helper's operand was no law yet), and the walk stopped at
    the call without a word: the pair was missing from the report."""
    out = equalize(HELPER_BETWEEN)
    assert [e.layers for e in out.report.equalized] == [["layer1", "layer2"]], out.report.table()
    assert relative_error(HELPER_BETWEEN, out.serialize().decode()) < 1e-5


def test_a_call_the_walk_cannot_enter_is_a_reason():
    """With the helper protected (--skip-func), the pair is refused with a reason."""
    out = equalize(HELPER_BETWEEN, skip_functions=frozenset({"helper"}))
    assert not out.report.equalized
    [refused] = out.report.not_equalized
    assert refused.op == "layer1" and "func.call" in refused.reason, out.report.table()


def test_report_params_number_equalized_sets_across_split_chunks(tmp_path):
    """--split-input-file merges each chunk's report: the second chunk's set is eq1, not a
    second eq0 that would overwrite the first one's scales in the params archive."""
    from bnfold.cli import main

    source = tmp_path / "two.mlir"
    source.write_text(CASES["pair_through_relu6"] + "\n// -----\n" + CASES["pair_through_relu6"])
    params = tmp_path / "p.npz"
    report = tmp_path / "r.json"
    assert main([str(source), "--split-input-file", "--equalize", "--report-params", str(params),
                 "--report", str(report), "-q", "-o", str(tmp_path / "out.mlir")]) == 0
    with np.load(params) as npz:
        assert sorted(k for k in npz.files if k.startswith("eq")) == ["eq0/scale0", "eq1/scale0"]
    import json
    assert [e["id"] for e in json.loads(report.read_text())["equalized"]] == ["eq0", "eq1"]


def test_a_layer_inside_a_case_branch_is_a_reason():
    """Layer 1's output read by a convolution inside a `case` branch (implicit capture): the
    pair exists, equalization does not cross region boundaries, and the report says so
    (the walk used to find no consumer in its block and say nothing)."""
    t = "tensor<1x4x4x2xf32>"
    k = "tensor<1x1x2x2xf32>"
    conv = ("dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} "
            "{batch_group_count = 1 : i64, feature_group_count = 1 : i64}")
    text = f"""
    func.func @main(%x: {t}, %i: tensor<i32>) -> {t} {{
      %k1 = stablehlo.constant dense<[[[[10.0, 0.1], [5.0, -0.2]]]]> : {k}
      %y = stablehlo.convolution(%x, %k1) {conv} : ({t}, {k}) -> {t} loc("layer1")
      %z = stablehlo.constant dense<0.0> : {t}
      %r = stablehlo.maximum %y, %z : {t}
      %o = "stablehlo.case"(%i) ({{
        %k2 = stablehlo.constant dense<[[[[0.1, 0.2], [3.0, -4.0]]]]> : {k}
        %c = stablehlo.convolution(%r, %k2) {conv} : ({t}, {k}) -> {t} loc("layer2")
        stablehlo.return %c : {t}
      }}, {{
        stablehlo.return %r : {t}
      }}) : (tensor<i32>) -> {t}
      return %o : {t}
    }}"""
    out = equalize(text)
    assert not out.report.equalized
    [refused] = out.report.not_equalized
    assert refused.op == "layer1" and "read inside a region" in refused.reason, out.report.table()
    assert out.serialize().decode() == bnfold.fold_source(
        text, options=FoldOptions(disable=bnfold.pattern_names())).serialize().decode()
