"""Every law of bnfold.laws, checked on numbers (float64, so a rounding never hides a bug).

Scale laws (cross-layer equalization): layer 1 -> REGION -> layer 2, with layer 1's
output channels deliberately unbalanced so that equalization moves scale through the
region. A region whose ops all commute must be equalized and keep the function (against
the *original* on XLA, to 1e-12); one that does not must be refused with the expected
code and leave the function as it was.

Shift laws (high-bias absorption): layer 1 -> batch norm -> bias -> ReLU -> POST ->
layer 2, on inputs whose pre-activation stays within 3 sigma: absorbed and exact, or
refused with a reason.

The table covers every op kind in `laws.LAWS` (test_every_law_has_cases), and the
fuzzer's grammar generates every one of them (test_every_law_is_in_the_fuzzer_grammar).
"""

from __future__ import annotations

import numpy as np
import pytest

import bnfold
import numerics
from bnfold import laws
from test_properties import run_xla

T = "tensor<2x4x4x3xf64>"
TEMPLATE = """
func.func @main(%x: tensor<2x4x4x3xf64>) -> tensor<2x{out}x2xf64> {{
  %k1 = stablehlo.constant dense<[[[[40.0, 0.5, 0.02], [-60.0, 1.0, 0.03], [20.0, -2.0, 0.01]]]]> : tensor<1x1x3x3xf64>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<2x4x4x3xf64>, tensor<1x1x3x3xf64>) -> {T}
{region}
  %k2 = stablehlo.constant dense<[[[[0.01, -0.02], [1.0, 0.5], [30.0, -50.0]]]]> : tensor<1x1x3x2xf64>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : ({rt}, tensor<1x1x3x2xf64>) -> tensor<2x{out}x2xf64>
  return %z : tensor<2x{out}x2xf64>
}}
"""
VEC = "stablehlo.constant dense<[0.5, -1.0, 2.0]> : tensor<3xf64>"
BCAST = f"stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}"
ZERO = "stablehlo.constant dense<0.0> : tensor<f64>"
SUM_BODY = """({
    ^bb0(%lhs: tensor<f64>, %rhs: tensor<f64>):
      %q = stablehlo.add %lhs, %rhs : tensor<f64>
      stablehlo.return %q : tensor<f64>
  })"""
MAX_BODY = SUM_BODY.replace("stablehlo.add", "stablehlo.maximum")


def region(lines: str, result_type: str = T, spatial: str = "4x4") -> tuple[str, str, str]:
    return lines, result_type, spatial


# op kind -> {case: (region lines defining %r, its type, layer 2's output spatial size)}
COMMUTES: dict[str, dict[str, tuple[str, str, str]]] = {
    "stablehlo.add": {"bias": region(f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.add %y, %cb : {T}"),
                      "twice_itself": region(f"  %r = stablehlo.add %y, %y : {T}")},
    "stablehlo.subtract": {"from_constant": region(
        f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.subtract %cb, %y : {T}")},
    "stablehlo.maximum": {"relu": region(
        f"  %z0 = {ZERO}\n  %zb = stablehlo.broadcast_in_dim %z0, dims = [] : (tensor<f64>) -> {T}\n"
        f"  %r = stablehlo.maximum %y, %zb : {T}")},
    "stablehlo.minimum": {"upper_per_channel": region(
        f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.minimum %cb, %y : {T}")},
    "stablehlo.clamp": {"nonzero_bounds": region(
        "  %lo = stablehlo.constant dense<-1.5> : tensor<f64>\n"
        "  %hi = stablehlo.constant dense<6.0> : tensor<f64>\n"
        f"  %r = stablehlo.clamp %lo, %y, %hi : (tensor<f64>, {T}, tensor<f64>) -> {T}")},
    "stablehlo.compare": {"threshold_relu": region(  # Keras ReLU(threshold=0.7)
        f"  %t = stablehlo.constant dense<0.7> : {T}\n"
        f"  %p = stablehlo.compare GT, %y, %t : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
        f"  %z0 = stablehlo.constant dense<0.0> : {T}\n"
        f"  %r = stablehlo.select %p, %y, %z0 : tensor<2x4x4x3xi1>, {T}")},
    "stablehlo.select": {"leaky": region(
        f"  %z0 = stablehlo.constant dense<0.0> : {T}\n"
        f"  %p = stablehlo.compare GE, %y, %z0 : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
        f"  %a = stablehlo.constant dense<0.1> : {T}\n  %ay = stablehlo.multiply %y, %a : {T}\n"
        f"  %r = stablehlo.select %p, %y, %ay : tensor<2x4x4x3xi1>, {T}")},
    "stablehlo.multiply": {"by_constant": region(
        f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.multiply %y, %cb : {T}")},
    "stablehlo.divide": {"by_constant": region(
        f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.divide %y, %cb : {T}")},
    "stablehlo.negate": {"negate": region(f"  %r = stablehlo.negate %y : {T}")},
    "stablehlo.abs": {"abs": region(f"  %r = stablehlo.abs %y : {T}")},
    "stablehlo.convert": {"f64_to_f64": region(f"  %r = stablehlo.convert %y : {T}")},
    "stablehlo.reshape": {"keeps_channels": region(
        "  %r1 = stablehlo.reshape %y : (tensor<2x4x4x3xf64>) -> tensor<2x16x3xf64>\n"
        f"  %r = stablehlo.reshape %r1 : (tensor<2x16x3xf64>) -> {T}")},
    "stablehlo.transpose": {"there_and_back": region(
        "  %t1 = stablehlo.transpose %y, dims = [0, 3, 1, 2] : (tensor<2x4x4x3xf64>) -> tensor<2x3x4x4xf64>\n"
        f"  %r = stablehlo.transpose %t1, dims = [0, 2, 3, 1] : (tensor<2x3x4x4xf64>) -> {T}")},
    "stablehlo.broadcast_in_dim": {"same_shape": region(
        f"  %r = stablehlo.broadcast_in_dim %y, dims = [0, 1, 2, 3] : ({T}) -> {T}")},
    "stablehlo.reduce_window": {
        "sum_pool_padded": region(
            f"  %z0 = {ZERO}\n"
            f'  %r = "stablehlo.reduce_window"(%y, %z0) {SUM_BODY} {{window_dimensions = array<i64: 1, 3, 3, 1>, '
            'window_strides = array<i64: 1, 2, 2, 1>, padding = dense<[[0, 0], [1, 1], [1, 1], [0, 0]]> : tensor<4x2xi64>} '
            f": ({T}, tensor<f64>) -> tensor<2x2x2x3xf64>", "tensor<2x2x2x3xf64>", "2x2"),
        "max_pool": region(
            "  %ninf = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>\n"
            f'  %r = "stablehlo.reduce_window"(%y, %ninf) {MAX_BODY} {{window_dimensions = array<i64: 1, 2, 2, 1>, '
            'window_strides = array<i64: 1, 2, 2, 1>} '
            f": ({T}, tensor<f64>) -> tensor<2x2x2x3xf64>", "tensor<2x2x2x3xf64>", "2x2")},
    "stablehlo.reduce": {"spatial_sum_kept_dims": region(
        f"  %z0 = {ZERO}\n"
        f"  %s = stablehlo.reduce(%y init: %z0) applies stablehlo.add across dimensions = [2] : ({T}, tensor<f64>) -> tensor<2x4x3xf64>\n"
        "  %r = stablehlo.reshape %s : (tensor<2x4x3xf64>) -> tensor<2x4x1x3xf64>",
        "tensor<2x4x1x3xf64>", "4x1")},
    # A pad then a slice back is a refusal in disguise (slice has no law): the pad law is
    # checked on the numbers with a pad straight into layer 2 (a padded input of layer 2).
    "stablehlo.pad": {"zero_into_layer_2": region(
        f"  %z0 = {ZERO}\n"
        f"  %r = stablehlo.pad %y, %z0, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : ({T}, tensor<f64>) -> tensor<2x6x6x3xf64>",
        "tensor<2x6x6x3xf64>", "6x6")},
}

# case -> (region, expected refusal code)
REFUSED: dict[str, tuple[tuple[str, str, str], str]] = {
    "pad_with_nonzero_value": (region(
        "  %v = stablehlo.constant dense<0.25> : tensor<f64>\n"
        f"  %r = stablehlo.pad %y, %v, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : ({T}, tensor<f64>) -> tensor<2x6x6x3xf64>",
        "tensor<2x6x6x3xf64>", "6x6"), "not-homogeneous"),
    "multiply_by_itself": (region(f"  %r = stablehlo.multiply %y, %y : {T}"), "not-homogeneous"),
    "constant_over_x": (region(f"  %c = {VEC}\n  %cb = {BCAST}\n  %r = stablehlo.divide %cb, %y : {T}"),
                        "not-homogeneous"),
    "sigmoid": (region(f"  %r = stablehlo.logistic %y : {T}"), "not-homogeneous"),
    "cbrt": (region(f"  %r = stablehlo.cbrt %y : {T}"), "not-homogeneous"),
    "slice_has_no_law": (region(
        f"  %c = {VEC}\n  %cb = {BCAST}\n  %a = stablehlo.add %y, %cb : {T}\n"
        f"  %r = stablehlo.slice %a [0:2, 0:4, 0:4, 0:3] : ({T}) -> {T}"), "no-law"),
    "pool_across_channels": (region(
        f"  %z0 = {ZERO}\n"
        f'  %r = "stablehlo.reduce_window"(%y, %z0) {SUM_BODY} {{window_dimensions = array<i64: 1, 1, 1, 1>, '
        'base_dilations = array<i64: 1, 1, 1, 2>} '
        f": ({T}, tensor<f64>) -> tensor<2x4x4x5xf64>", "tensor<2x4x4x5xf64>", "4x4"), "axis"),
    "residual_branch": (region(f"  %r = stablehlo.add %y, %x : {T}"), "fan-out"),
}


def module(case: tuple[str, str, str]) -> str:
    lines, rt, out = case
    text = TEMPLATE.format(region=lines, rt=rt, out=out, T=T)
    if "tensor<2x4x4x5xf64>" in rt:  # a pool that changes the channel count: a wider layer 2
        text = text.replace("tensor<1x1x3x2xf64>", "tensor<1x1x5x2xf64>").replace(
            "[[[[0.01, -0.02], [1.0, 0.5], [30.0, -50.0]]]]",
            "[[[[0.01, -0.02], [1.0, 0.5], [30.0, -50.0], [1.0, 1.0], [2.0, 2.0]]]]")
    return text


def inputs(text: str) -> list[np.ndarray]:
    return [np.random.default_rng(0).normal(size=(2, 4, 4, 3))]


def original_error(text: str, changed: str) -> float:
    xs = inputs(text)
    expected, actual = run_xla(text, xs), run_xla(changed, xs)
    return max(numerics.relative_error(a, e) for a, e in zip(actual, expected, strict=True))


CASES = [(op, name, case) for op, cases in COMMUTES.items() for name, case in cases.items()]


@pytest.mark.parametrize("op, name, case", CASES, ids=[f"{o.split('.')[-1]}-{n}" for o, n, _ in CASES])
def test_scale_law_commutes_on_numbers(op, name, case):
    text = module(case)
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(equalize=True))
    report = out.report
    assert len(report.equalized) == 1, report.table()
    scales = report.equalized[0].params["scale0"]
    assert np.max(np.abs(np.log(scales))) > 1.0, scales  # it did move scale through the op
    assert original_error(text, out.serialize().decode()) < 1e-12


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_scale_law_refuses_with_a_code_and_keeps_the_function(name):
    case, code = REFUSED[name]
    text = module(case)
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(equalize=True))
    report = out.report
    assert not report.equalized, report.table()
    assert [s.code for s in report.not_equalized] == [code], report.table()
    assert original_error(text, out.serialize().decode()) < 1e-12


def test_every_law_has_cases():
    """A law added to bnfold.laws needs a case here (and in the fuzzer's grammar)."""
    assert set(laws.LAWS) == set(COMMUTES), set(laws.LAWS) ^ set(COMMUTES)


def test_every_law_is_in_the_fuzzer_grammar():
    import regiongen

    assert set(laws.LAWS) <= set(regiongen.GRAMMAR_OPS), set(laws.LAWS) - set(regiongen.GRAMMAR_OPS)


def test_constants_are_divided_in_the_type_of_the_value_they_meet():
    """Mechanism 3 of issue 24: a compare's threshold must be divided in the compared
    value's type (f32), never in the compare's i1 result type."""
    text = module(COMMUTES["stablehlo.compare"]["threshold_relu"]).replace("f64", "f32")
    text = text.replace("0xFFF0000000000000", "0xFF800000")
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(equalize=True))
    assert out.report.equalized
    folded = out.serialize().decode()
    assert "xi1> {" not in folded and "tensor<2x4x4x3xi1>" in folded
    xs = [x.astype(np.float32) for x in inputs(text)]
    expected, actual = run_xla(text, xs), run_xla(folded, xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-5


# --- intervals: what equalization's range check reads -----------------------------------


def test_sum_pool_interval_counts_the_window_and_the_padding():
    """A 3x3 sum pool of values in [-1, 2] reads at most 9 of them: [-9, 18]; with padding a
    border window sums fewer (zeros for the rest), which the interval must include."""
    from bnfold import ir as bir
    from bnfold.analysis import Analysis
    from bnfold.laws import Interval
    from bnfold.quant import region as walk

    text = module(COMMUTES["stablehlo.reduce_window"]["sum_pool_padded"])
    context = bir.make_context()
    mod = bir.parse(text, context)
    with context:
        conv = next(op for op in mod.body.operations[0].regions[0].blocks[0].operations
                    if op.operation.name == "stablehlo.convolution").operation
        source = Interval(np.full(3, -1.0), np.full(3, 2.0))
        found = walk.walk(conv.results[0], 3, Analysis(mod), source)
    assert isinstance(found, walk.Region)
    pooled = found.reached[-1].interval
    np.testing.assert_array_equal(pooled.lo, [-9.0] * 3)
    np.testing.assert_array_equal(pooled.hi, [18.0] * 3)


def test_clamp_interval_is_its_bounds():
    from bnfold import ir as bir
    from bnfold.analysis import Analysis
    from bnfold.quant import region as walk

    text = module(COMMUTES["stablehlo.clamp"]["nonzero_bounds"])
    context = bir.make_context()
    mod = bir.parse(text, context)
    with context:
        conv = next(op for op in mod.body.operations[0].regions[0].blocks[0].operations
                    if op.operation.name == "stablehlo.convolution").operation
        found = walk.walk(conv.results[0], 3, Analysis(mod), walk.unknown(3))
    assert isinstance(found, walk.Region)
    np.testing.assert_array_equal(found.reached[-1].interval.lo, [-1.5] * 3)
    np.testing.assert_array_equal(found.reached[-1].interval.hi, [6.0] * 3)


# --- shift laws: high-bias absorption through what follows the activation ----------------

HBA = """
func.func @main(%x: tensor<2x4x4x2xf64>) -> tensor<2x{out}x2xf64> {{
  %k1 = stablehlo.constant dense<[[[[0.02, -0.01, 0.03], [0.01, 0.02, -0.02]]]]> : tensor<1x1x2x3xf64>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<2x4x4x2xf64>, tensor<1x1x2x3xf64>) -> {T}
  %g = stablehlo.constant dense<[0.5, 0.5, 0.25]> : tensor<3xf64>
  %b = stablehlo.constant dense<[4.0, 0.2, 3.0]> : tensor<3xf64>
  %m = stablehlo.constant dense<[0.0, 0.1, 0.0]> : tensor<3xf64>
  %v = stablehlo.constant dense<[1.0, 1.0, 0.25]> : tensor<3xf64>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {{epsilon = 0.0 : f32, feature_index = 3 : i64}} : ({T}, tensor<3xf64>, tensor<3xf64>, tensor<3xf64>, tensor<3xf64>) -> {T}
  %zero = stablehlo.constant dense<0.0> : tensor<f64>
  %six = stablehlo.constant dense<6.0> : tensor<f64>
  %a = stablehlo.clamp %zero, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}
{post}
  %k2 = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]]]> : tensor<1x1x3x2xf64>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : ({rt}, tensor<1x1x3x2xf64>) -> tensor<2x{out}x2xf64>
  return %z : tensor<2x{out}x2xf64>
}}
"""
SHIFT_PASSES = {
    "nothing": (f"  %r = stablehlo.convert %a : {T}", T, "4x4"),
    "transpose_there_and_back": (
        "  %t1 = stablehlo.transpose %a, dims = [0, 3, 1, 2] : (tensor<2x4x4x3xf64>) -> tensor<2x3x4x4xf64>\n"
        f"  %r = stablehlo.transpose %t1, dims = [0, 2, 3, 1] : (tensor<2x3x4x4xf64>) -> {T}", T, "4x4"),
    "max_pool": (
        "  %ninf = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>\n"
        f'  %r = "stablehlo.reduce_window"(%a, %ninf) {MAX_BODY} {{window_dimensions = array<i64: 1, 2, 2, 1>, '
        'window_strides = array<i64: 1, 2, 2, 1>} '
        f": ({T}, tensor<f64>) -> tensor<2x2x2x3xf64>", "tensor<2x2x2x3xf64>", "2x2"),
    "mean_pool_unpadded": (
        f"  %z0 = {ZERO}\n"
        f'  %s = "stablehlo.reduce_window"(%a, %z0) {SUM_BODY} {{window_dimensions = array<i64: 1, 2, 2, 1>, '
        'window_strides = array<i64: 1, 2, 2, 1>} '
        f": ({T}, tensor<f64>) -> tensor<2x2x2x3xf64>\n"
        "  %four = stablehlo.constant dense<4.0> : tensor<2x2x2x3xf64>\n"
        "  %r = stablehlo.divide %s, %four : tensor<2x2x2x3xf64>", "tensor<2x2x2x3xf64>", "2x2"),
    "scale_after": (f"  %c = {VEC}\n  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
                    f"  %r = stablehlo.multiply %a, %cb : {T}", T, "4x4"),
}
SHIFT_REFUSED = {
    "second_relu_after_an_add": (
        f"  %c = {VEC}\n  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %a2 = stablehlo.add %a, %cb : {T}\n"
        f"  %zb = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f64>) -> {T}\n"
        f"  %r = stablehlo.maximum %a2, %zb : {T}", T, "4x4"),
    "explicit_pad": (
        f"  %r = stablehlo.pad %a, %zero, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : ({T}, tensor<f64>) -> tensor<2x6x6x3xf64>",
        "tensor<2x6x6x3xf64>", "6x6"),
    "sum_pool_with_padding": (
        f"  %z0 = {ZERO}\n"
        f'  %r = "stablehlo.reduce_window"(%a, %z0) {SUM_BODY} {{window_dimensions = array<i64: 1, 3, 3, 1>, '
        'padding = dense<[[0, 0], [1, 1], [1, 1], [0, 0]]> : tensor<4x2xi64>} '
        f": ({T}, tensor<f64>) -> {T}", T, "4x4"),
}


def hba_module(post: tuple[str, str, str], activation: str | None = None) -> str:
    lines, rt, out = post
    text = HBA.format(post=lines, rt=rt, out=out, T=T)
    return text if activation is None else text.replace(
        f"  %a = stablehlo.clamp %zero, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}", activation)


def within_three_sigma(text: str) -> list[np.ndarray]:
    """Inputs whose pre-activation stays within 3 sigma of its batch norm (tiny inputs:
    the BN output is beta, give or take 0.1 sigma)."""
    return [np.random.default_rng(1).normal(0, 0.1, (2, 4, 4, 2))]


def hba(text: str) -> tuple[bnfold.Folded, list[dict]]:
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(equalize=True, absorb_high_bias=True))
    return out, [h for e in out.report.equalized for h in e.high_bias]


@pytest.mark.parametrize("name", sorted(SHIFT_PASSES))
def test_shift_law_passes_and_absorption_is_exact_within_three_sigma(name):
    text = hba_module(SHIFT_PASSES[name])
    out, records = hba(text)
    assert [r["absorbed"] for r in records] == [True], records
    xs = within_three_sigma(text)
    expected, actual = run_xla(text, xs), run_xla(out.serialize().decode(), xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


@pytest.mark.parametrize("name", sorted(SHIFT_REFUSED))
def test_shift_law_refused_keeps_the_function(name):
    text = hba_module(SHIFT_REFUSED[name])
    out, records = hba(text)
    assert records and not any(r["absorbed"] for r in records), records
    assert all(r["reason"] and r["code"] for r in records)
    xs = within_three_sigma(text)
    expected, actual = run_xla(text, xs), run_xla(out.serialize().decode(), xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


# Steps that the fold stage would otherwise fold into layer 2 (a per-channel multiply or
# divide before a convolution is a forward fold): with forward folding off they stay
# between the layers, and the shift must cross them by their own law.
SHIFT_PASSES_UNFOLDED = {
    "divide_by_constant": (
        "  %c = stablehlo.constant dense<[4.0, 2.0, 8.0]> : tensor<3xf64>\n"
        f"  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %r = stablehlo.divide %a, %cb : {T}", T, "4x4"),
    "add_constant": (  # relu(y) + k moves by +c
        "  %c = stablehlo.constant dense<[4.0, 2.0, 8.0]> : tensor<3xf64>\n"
        f"  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %r = stablehlo.add %a, %cb : {T}", T, "4x4"),
    "subtract_from_constant": (  # k - relu(y) moves by -c
        "  %c = stablehlo.constant dense<[4.0, 2.0, 8.0]> : tensor<3xf64>\n"
        f"  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %r = stablehlo.subtract %cb, %a : {T}", T, "4x4"),
    "multiply_by_constant": (
        "  %c = stablehlo.constant dense<[4.0, 2.0, 8.0]> : tensor<3xf64>\n"
        f"  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %r = stablehlo.multiply %a, %cb : {T}", T, "4x4"),
}


@pytest.mark.parametrize("name", sorted(SHIFT_PASSES_UNFOLDED))
def test_shift_crosses_a_constant_factor_that_stays_between_the_layers(name):
    """relu(y) / c moves by c_absorbed / c (not c_absorbed * c): layer 2's new bias is
    judged by XLA against the original."""
    text = hba_module(SHIFT_PASSES_UNFOLDED[name])
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(
        equalize=True, absorb_high_bias=True, disable=frozenset({"forward-affine"})))
    records = [h for e in out.report.equalized for h in e.high_bias]
    assert [r["absorbed"] for r in records] == [True], records
    folded = out.serialize().decode()
    op = name.split("_")[0]
    assert f"stablehlo.{op}" in folded  # the step is still there: its law was used
    xs = within_three_sigma(text)
    expected, actual = run_xla(text, xs), run_xla(folded, xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


ACTIVATIONS = {  # mechanism 5 of issue 24: only a lower bound at 0 directly after the bias
    "clamp_with_nonzero_lower_bound": (
        "  %one = stablehlo.constant dense<1.0> : tensor<f64>\n"
        f"  %a = stablehlo.clamp %one, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}", False),
    "relu_as_select": (
        f"  %z0 = stablehlo.constant dense<0.0> : {T}\n"
        f"  %p = stablehlo.compare GT, %n, %z0 : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
        f"  %a = stablehlo.select %p, %n, %z0 : tensor<2x4x4x3xi1>, {T}", True),
    "threshold_relu": (
        f"  %th = stablehlo.constant dense<0.5> : {T}\n  %z0 = stablehlo.constant dense<0.0> : {T}\n"
        f"  %p = stablehlo.compare GT, %n, %th : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
        f"  %a = stablehlo.select %p, %n, %z0 : tensor<2x4x4x3xi1>, {T}", False),
    "relu6_as_max_min": (
        f"  %zb = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f64>) -> {T}\n"
        f"  %sb = stablehlo.broadcast_in_dim %six, dims = [] : (tensor<f64>) -> {T}\n"
        f"  %a0 = stablehlo.maximum %n, %zb : {T}\n  %a = stablehlo.minimum %a0, %sb : {T}", True),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_high_bias_absorption_takes_only_a_lower_bound_at_zero(name):
    activation, absorbs = ACTIVATIONS[name]
    text = hba_module(SHIFT_PASSES["nothing"], activation)
    out, records = hba(text)
    assert [r["absorbed"] for r in records] == [absorbs], records
    xs = within_three_sigma(text)
    expected, actual = run_xla(text, xs), run_xla(out.serialize().decode(), xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


def test_high_bias_needs_its_bias_before_the_activation():
    """An add after the activation is not layer 1's bias: taking c out of it (the old
    behaviour) changed the output by up to 500%."""
    text = HBA.format(post=f"  %r = stablehlo.convert %a : {T}", rt=T, out="4x4", T=T).replace(
        f"  %a = stablehlo.clamp %zero, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}",
        f"  %zb = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f64>) -> {T}\n"
        f"  %a0 = stablehlo.maximum %y, %zb : {T}\n"
        f"  %c = {VEC}\n  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %a = stablehlo.add %a0, %cb : {T}").replace("%n = ", "%unused = ")
    out, records = hba(text)
    assert not any(r.get("absorbed") for r in records), records
    xs = within_three_sigma(text)
    expected, actual = run_xla(text, xs), run_xla(out.serialize().decode(), xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


# --- mean laws: bias correction's E[x] through the region ------------------------------------
#
# Layer 1's batch norm makes its pre-activation N(beta, gamma^2) per channel; the region
# carries it to layer 2; --quantize-weights int4 --bias-correction takes
# E[(W_q - W) x] out of layer 2's bias. The reference is a float64 Monte-Carlo estimate:
# pre-activations drawn from that normal, the *region itself* run on XLA, then the error
# kernel (W_q - W, quantized here by this test's own rule), averaged over samples and
# positions. bnfold's mean laws never compute the reference.

BN_GAMMA, BN_BETA = np.array([1.5, 0.7, 2.0]), np.array([0.8, -0.5, 3.0])
BATCH_NORM = (
    "  %bn_g = stablehlo.constant dense<[1.5, 0.7, 2.0]> : tensor<3xf64>\n"
    "  %bn_b = stablehlo.constant dense<[0.8, -0.5, 3.0]> : tensor<3xf64>\n"
    "  %bn_m = stablehlo.constant dense<[0.1, -0.2, 0.3]> : tensor<3xf64>\n"
    "  %bn_v = stablehlo.constant dense<[1.0, 2.0, 0.5]> : tensor<3xf64>\n"
    f'  %y = "stablehlo.batch_norm_inference"(%y0, %bn_g, %bn_b, %bn_m, %bn_v) {{epsilon = 0.0 : f32, '
    f"feature_index = 3 : i64}} : ({T}, tensor<3xf64>, tensor<3xf64>, tensor<3xf64>, "
    f"tensor<3xf64>) -> {T}\n")
K2 = np.array([[0.01, -0.02], [1.0, 0.5], [30.0, -50.0]])
# Means the walk cannot know, and the code it says so with.
MEAN_REFUSED = {("stablehlo.select", "leaky"): "no-statistics",  # a branch is x * 0.1
                ("stablehlo.reduce_window", "sum_pool_padded"): "padding",
                ("stablehlo.reduce_window", "max_pool"): "no-statistics"}
MEAN_REFUSED_CASES = {"pad_with_nonzero_value": "padding", "multiply_by_itself": "no-statistics",
                      "constant_over_x": "no-statistics", "sigmoid": "no-law",
                      "cbrt": "no-law", "slice_has_no_law": "no-law",
                      "pool_across_channels": "axis", "residual_branch": "no-statistics"}


def with_batch_norm(text: str) -> str:
    conv = text.index("  %y = stablehlo.convolution(")
    end = text.index("\n", conv) + 1
    return text[:conv] + text[conv:end].replace("%y =", "%y0 =", 1) + BATCH_NORM + text[end:]


def int4_error(kernel: np.ndarray) -> np.ndarray:
    """W_q - W for symmetric per-tensor int4 (this test's own rule: max|W| / 7, rint)."""
    scale = np.max(np.abs(kernel)) / 7
    return np.clip(np.rint(kernel / scale), -7, 7) * scale - kernel


def monte_carlo_shift(case: tuple[str, str, str], samples: int = 4096, seed: int = 0,
                      uniform: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """E[(W_q - W) region(y)] per output channel over samples and positions, and its
    standard error; y ~ N(beta, gamma^2) per channel, independent per position (`uniform`:
    uniform with the same mean and spread instead)."""
    lines, rt, out = case
    n = samples
    region_text = lines.replace("tensor<2x", f"tensor<{n}x").replace("[0:2,", f"[0:{n},")
    rt = rt.replace("tensor<2x", f"tensor<{n}x")
    error = int4_error(K2).reshape(1, 1, 3, 2)
    text = (f"func.func @main(%y: tensor<{n}x4x4x3xf64>) -> tensor<{n}x{out}x2xf64> {{\n"
            f"{region_text}\n"
            f"  %k2 = stablehlo.constant dense<{error.tolist()}> : tensor<1x1x3x2xf64>\n"
            "  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->"
            "[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : "
            f"i64}} : ({rt}, tensor<1x1x3x2xf64>) -> tensor<{n}x{out}x2xf64>\n"
            f"  return %z : tensor<{n}x{out}x2xf64>\n}}\n")
    rng = np.random.default_rng(seed)
    y = BN_BETA + BN_GAMMA * np.sqrt(3.0) * rng.uniform(-1.0, 1.0, (n, 4, 4, 3)) if uniform \
        else rng.normal(BN_BETA, BN_GAMMA, size=(n, 4, 4, 3))
    (z,) = run_xla(text, [y])
    per_sample = z.reshape(n, -1, 2).mean(axis=1)
    return per_sample.mean(axis=0), per_sample.std(axis=0) / np.sqrt(n)


def corrected(text: str) -> dict:
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(
        quantize_weights="int4", bias_correction=True))
    layer2 = out.report.quantized[-1]
    assert layer2.bias_correction is not None, out.report.table()
    return layer2.bias_correction | {"shift": layer2.params.get("bias_shift")}


# ReLU, ReLU6, |x| and thresholds (a compare's cases select by it)
MODELED_MEANS = {"stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp", "stablehlo.select",
                 "stablehlo.compare", "stablehlo.abs"}
MEAN_CASES = [(op, name, case) for op, name, case in CASES if (op, name) not in MEAN_REFUSED] + [
    ("stablehlo.select", "threshold_relu", COMMUTES["stablehlo.compare"]["threshold_relu"]),
    ("stablehlo.reduce_window", "sum_pool_unpadded", region(
        f"  %z0 = {ZERO}\n"
        f'  %r = "stablehlo.reduce_window"(%y, %z0) {SUM_BODY} {{window_dimensions = array<i64: 1, 2, 2, 1>, '
        'window_strides = array<i64: 1, 2, 2, 1>} '
        f": ({T}, tensor<f64>) -> tensor<2x2x2x3xf64>", "tensor<2x2x2x3xf64>", "2x2"))]


@pytest.mark.parametrize("op, name, case", MEAN_CASES,
                         ids=[f"{o.split('.')[-1]}-{n}" for o, n, _ in MEAN_CASES])
def test_mean_law_matches_monte_carlo(op, name, case):
    found = corrected(with_batch_norm(module(case)))
    assert found["applied"], found
    expected, error = monte_carlo_shift(case)
    assert np.any(np.abs(expected) > 5 * error), (expected, error)  # the shift is measurable
    np.testing.assert_array_less(np.abs(found["shift"] - expected), 5 * error + 1e-9)
    # What the mean rests on: an activation's needs the distribution (the normal model);
    # every other step's is the batch norm's mean by linearity, so the shift must hold
    # for another distribution with that mean too (uniform here).
    assert found["basis"] == ("normal" if op in MODELED_MEANS else "linear"), (op, found)
    if found["basis"] == "linear":
        expected, error = monte_carlo_shift(case, uniform=True)
        np.testing.assert_array_less(np.abs(found["shift"] - expected), 5 * error + 1e-9)


def test_mean_law_of_a_sum_of_two_modeled_values():
    """max(y, 0) + min(y, 0) is y: the mean of a sum is the sum of the means (each modeled
    from the normal), against the Monte-Carlo estimate."""
    case = region(f"  %z0 = {ZERO}\n  %zb = stablehlo.broadcast_in_dim %z0, dims = [] : "
                  f"(tensor<f64>) -> {T}\n  %p = stablehlo.maximum %y, %zb : {T}\n"
                  f"  %q = stablehlo.minimum %y, %zb : {T}\n  %r = stablehlo.add %p, %q : {T}")
    found = corrected(with_batch_norm(module(case)))
    assert found["applied"], found
    expected, error = monte_carlo_shift(case)
    assert np.any(np.abs(expected) > 5 * error), (expected, error)
    np.testing.assert_array_less(np.abs(found["shift"] - expected), 5 * error + 1e-9)


@pytest.mark.parametrize("name, lines", [
    ("maximum_of_two_values", f"  %n = stablehlo.negate %y : {T}\n  %r = stablehlo.maximum %y, %n : {T}"),
    ("select_by_two_values",
     f"  %n = stablehlo.negate %y : {T}\n"
     f"  %p = stablehlo.compare GT, %y, %n : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
     f"  %z0 = stablehlo.constant dense<0.0> : {T}\n"
     f"  %r = stablehlo.select %p, %y, %z0 : tensor<2x4x4x3xi1>, {T}"),
])
def test_mean_law_refuses_an_extremum_or_a_select_of_two_region_values(name, lines):
    """max(y, -y) or select(y > -y, ...): two values of the region meet, and the mean of
    the larger is not modeled: no correction, with the code that says why."""
    found = corrected(with_batch_norm(module(region(lines))))
    assert not found["applied"] and found["code"] == "no-statistics" and found["reason"], found


SAME_TYPE_CONVERT = """
func.func @main(%x: tensor<1x8x8x2xf32>) -> tensor<1x8x8x3xf32> {
  %s = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[0.25, -1.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x8x8x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x8x8x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x8x8x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x8x8x2xf32>
  %c = stablehlo.convert %a : tensor<1x8x8x2xf32>
  %k = stablehlo.constant dense<[[[[0.3, -0.2, 0.1], [0.25, 0.15, -0.35]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%c, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x2xf32>, tensor<1x1x2x3xf32>) -> tensor<1x8x8x3xf32>
  return %y : tensor<1x8x8x3xf32>
}
"""


def test_a_convert_to_the_same_type_is_exact_and_a_forward_fold_crosses_it():
    """Only a convert that drops significand bits or range is a rounding that must stay
    (Precision.NARROWS); f32 -> f32 is not, and x * s + t before it folds forward."""
    out = bnfold.fold_source(SAME_TYPE_CONVERT)
    assert [f.direction for f in out.report.folds] == ["forward"], out.report.table()
    folded = out.serialize().decode()
    assert "stablehlo.multiply" not in folded
    xs = [np.random.default_rng(0).normal(size=(1, 8, 8, 2)).astype(np.float32)]
    numerics.check_close(numerics.run_xla(folded, xs), numerics.run_xla(SAME_TYPE_CONVERT, xs))


@pytest.mark.parametrize("key", sorted(MEAN_REFUSED), ids=lambda k: f"{k[0].split('.')[-1]}-{k[1]}")
def test_mean_law_refuses_what_it_cannot_know(key):
    found = corrected(with_batch_norm(module(COMMUTES[key[0]][key[1]])))
    assert not found["applied"] and found["code"] == MEAN_REFUSED[key], found


@pytest.mark.parametrize("name", sorted(MEAN_REFUSED_CASES))
def test_mean_law_refuses_where_the_scale_law_does(name):
    case, _ = REFUSED[name]
    found = corrected(with_batch_norm(module(case)))
    assert not found["applied"] and found["code"] == MEAN_REFUSED_CASES[name], found


def test_every_law_has_a_mean_case():
    """Every law's mean is checked on numbers where it is known (a compare only as a select's
    predicate: its own result is no value to average)."""
    assert {op for op, _, _ in MEAN_CASES} == set(laws.LAWS), \
        {op for op, _, _ in MEAN_CASES} ^ set(laws.LAWS)


# --- factor laws (forward-norm): a value as n * g + b per channel --------------------------
#
# Each case gives the operands as ("form", with_shift) for a run-time value n * g + b,
# ("same", with_shift) for one with the previous form's g, or ("const",) for a
# per-channel constant; the law's result must satisfy op(values) == bare * g + b on
# random numbers (float64), with the bare value built as the law says from the operands'
# bare values -- or the law must refuse (None) where no such form exists.
FACTOR_CASES: list[tuple[str, tuple[tuple, ...], bool]] = [
    ("stablehlo.add", (("form", True), ("const",)), True),
    ("stablehlo.add", (("const",), ("form", True)), True),
    ("stablehlo.add", (("form", True), ("same", True)), True),
    ("stablehlo.add", (("form", True), ("form", True)), False),  # different g: no common factor
    ("stablehlo.subtract", (("form", True), ("const",)), True),
    ("stablehlo.subtract", (("const",), ("form", True)), True),
    ("stablehlo.subtract", (("form", True), ("same", False)), True),
    ("stablehlo.multiply", (("form", True), ("const",)), True),
    ("stablehlo.multiply", (("const",), ("form", True)), True),
    ("stablehlo.multiply", (("form", False), ("form", False)), True),
    ("stablehlo.multiply", (("form", True), ("form", False)), False),  # a shift times a run-time value
    ("stablehlo.divide", (("form", True), ("const",)), True),
    ("stablehlo.divide", (("form", False), ("form", False)), True),
    ("stablehlo.divide", (("const",), ("form", False)), False),  # c / x is not affine
    ("stablehlo.divide", (("form", True), ("form", False)), False),
    ("stablehlo.negate", (("form", True),), True),
    ("stablehlo.convert", (("form", True),), True),
]
_NP = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
       "stablehlo.multiply": np.multiply, "stablehlo.divide": np.divide,
       "stablehlo.negate": np.negative, "stablehlo.convert": lambda a: a}


@pytest.mark.parametrize("op,kinds,holds", FACTOR_CASES,
                         ids=[f"{op.removeprefix('stablehlo.')}-{'-'.join(k[0] for k in kinds)}-{i}"
                              for i, (op, kinds, _) in enumerate(FACTOR_CASES)])
def test_factor_law_holds_on_numbers(op, kinds, holds):
    rng = np.random.default_rng(3)
    channels = 5
    values, bares, parts = [], [], []
    g = rng.uniform(0.5, 2.0, channels) * rng.choice([-1.0, 1.0], channels)
    for kind in kinds:
        if kind[0] == "const":
            c = rng.uniform(0.5, 2.0, channels)
            values.append(np.broadcast_to(c, (7, channels)))
            bares.append(None)
            parts.append(c)
            continue
        gk = g if kind[0] == "same" else rng.uniform(0.5, 2.0, channels)
        g = gk
        b = rng.normal(0, 1, channels) if kind[1] else np.zeros(channels)
        n = rng.normal(0, 1, (7, channels)) + 3.0
        values.append(n * gk + b)
        bares.append(n)
        parts.append(laws.Factored(gk, b))
    law = laws.factor(op, parts)
    if not holds:
        assert law is None
        return
    assert law is not None
    if law.build == "op":
        built = _NP[op](*[n if n is not None else 1.0 for n in bares])
    else:
        built = bares[law.operand] * (-1.0 if law.build == "negate" else 1.0)
    expected = _NP[op](*values)
    np.testing.assert_allclose(built * law.factored.g + law.factored.b, expected, rtol=1e-12,
                               atol=1e-12)


def test_a_narrowing_convert_has_no_factor_law():
    form = laws.Factored(np.full(3, 2.0), np.ones(3))
    assert laws.factor("stablehlo.convert", [form], widening=False) is None


def test_every_factor_law_has_cases_and_is_in_the_fuzzer_grammar():
    import regiongen

    assert {op for op, _, _ in FACTOR_CASES} == set(laws.FACTOR_LAWS)
    assert set(laws.FACTOR_LAWS) <= set(regiongen.STEP_OPS["norm"]) | {"stablehlo.convert"}
    assert set(laws.FACTOR_LAWS) <= set(regiongen.GRAMMAR_OPS)


# --- scalar laws (fold-scale): a scalar of q k^T moved back along q ---------------------
#
# x -> dot(x, W) -> REGION (%q to %r) -> dot(%r, k) * 0.125: the scale must move into W or
# the constant that ends the way, keeping the function (f64, against the original on XLA),
# or be refused with the expected code.
SCALAR_TEMPLATE = """
func.func @main(%x: tensor<4x3xf64>, %k: tensor<5x3xf64>) -> tensor<4x5xf64> {{
  %w = stablehlo.constant dense<[[1.0, -2.0, 0.5], [3.0, 4.0, -1.0], [0.25, 2.0, 8.0]]> : tensor<3x3xf64>
  %q = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x3xf64>, tensor<3x3xf64>) -> tensor<4x3xf64>
{region}
  %l = stablehlo.dot_general %r, %k, contracting_dims = [1] x [1] : (tensor<4x3xf64>, tensor<5x3xf64>) -> tensor<4x5xf64>
  %c = stablehlo.constant dense<0.125> : tensor<4x5xf64>
  %s = stablehlo.multiply %l, %c : tensor<4x5xf64>
  return %s : tensor<4x5xf64>
}}
"""
_B = "%b = stablehlo.constant dense<[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]> : tensor<4x3xf64>"
SCALAR_CASES: dict[str, tuple[str, str, str | None]] = {
    # name: (op, region, refusal code or None)
    # q + q: both terms carry the scale (an add of two scaled values)
    "dot_general": ("stablehlo.dot_general", "%r = stablehlo.add %q, %q : tensor<4x3xf64>", None),
    "dot_general_end": ("stablehlo.dot_general", "%r = stablehlo.negate %q : tensor<4x3xf64>", None),
    "reshape": ("stablehlo.reshape", "%a = stablehlo.reshape %q : (tensor<4x3xf64>) -> tensor<2x2x3xf64>\n"
                "%r = stablehlo.reshape %a : (tensor<2x2x3xf64>) -> tensor<4x3xf64>", None),
    "transpose": ("stablehlo.transpose", "%a = stablehlo.transpose %q, dims = [1, 0] : (tensor<4x3xf64>) -> tensor<3x4xf64>\n"
                  "%r = stablehlo.transpose %a, dims = [1, 0] : (tensor<3x4xf64>) -> tensor<4x3xf64>", None),
    "broadcast_in_dim": ("stablehlo.broadcast_in_dim", "%a = stablehlo.broadcast_in_dim %q, dims = [1, 2] : (tensor<4x3xf64>) -> tensor<1x4x3xf64>\n"
                         "%r = stablehlo.reshape %a : (tensor<1x4x3xf64>) -> tensor<4x3xf64>", None),
    "negate": ("stablehlo.negate", "%r = stablehlo.negate %q : tensor<4x3xf64>", None),
    "narrowing_convert": ("stablehlo.convert", "%a = stablehlo.convert %q : (tensor<4x3xf64>) -> tensor<4x3xf32>\n"
                          "%r = stablehlo.convert %a : (tensor<4x3xf32>) -> tensor<4x3xf64>", "precision"),
    "add_bias": ("stablehlo.add", f"{_B}\n%r = stablehlo.add %q, %b : tensor<4x3xf64>", None),
    "subtract_bias": ("stablehlo.subtract", f"{_B}\n%r = stablehlo.subtract %q, %b : tensor<4x3xf64>", None),
    "bias_minus_q": ("stablehlo.subtract", f"{_B}\n%r = stablehlo.subtract %b, %q : tensor<4x3xf64>", None),
    "multiply_end": ("stablehlo.multiply", f"{_B}\n%r = stablehlo.multiply %q, %b : tensor<4x3xf64>", None),
    "divide_end": ("stablehlo.divide", f"{_B}\n%r = stablehlo.divide %q, %b : tensor<4x3xf64>", None),
    "convolution_end": ("stablehlo.convolution",
                        "%kc = stablehlo.constant dense<[[[[1.0, 0.0, 2.0], [0.5, 1.0, 0.0], [0.0, -1.0, 1.0]]]]> : tensor<1x1x3x3xf64>\n"
                        "%q4 = stablehlo.reshape %q : (tensor<4x3xf64>) -> tensor<1x4x1x3xf64>\n"
                        "%cv = stablehlo.convolution(%q4, %kc) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x1x3xf64>, tensor<1x1x3x3xf64>) -> tensor<1x4x1x3xf64>\n"
                        "%r = stablehlo.reshape %cv : (tensor<1x4x1x3xf64>) -> tensor<4x3xf64>", None),
}


@pytest.mark.parametrize("name", sorted(SCALAR_CASES))
def test_scalar_law_moves_the_attention_scale_and_keeps_the_function(name):
    _, region, code = SCALAR_CASES[name]
    text = SCALAR_TEMPLATE.format(region="\n".join("  " + line for line in region.split("\n")))
    out = bnfold.fold_source(text)
    report = out.report
    folded = [f for f in report.folds if f.kind == "scale"]
    if code is None:
        assert folded, [s.to_json() for s in report.skipped]
        assert "stablehlo.multiply %" not in out.serialize().decode().split("dot_general")[-1]
    else:
        assert not folded
        assert code in {s.code for s in report.skipped}, [s.to_json() for s in report.skipped]
    rng = np.random.default_rng(0)
    xs = [rng.normal(0, 1, (4, 3)), rng.normal(0, 1, (5, 3))]
    expected, actual = run_xla(text, xs), run_xla(out.serialize().decode(), xs)
    assert numerics.relative_error(actual[0], expected[0]) < 1e-12


def test_every_scalar_law_has_cases_and_is_in_the_fuzzer_grammar():
    import regiongen

    assert {op for op, _, _ in SCALAR_CASES.values()} <= set(laws.SCALAR_LAWS)
    assert set(laws.SCALAR_LAWS) <= set(regiongen.GRAMMAR_OPS)


# --- norm path laws (forward-norm): steps between a norm and its layers ------------------
#
# path(n g + b) == path(n) g + k b along the feature axis (last), with k the factor the
# step gives a constant; the cases say k, or None where the law refuses (a real pad with
# a shift). Judged in float64 on random values.
_X = np.random.default_rng(3).normal(0, 1, (3, 5, 4))
_G = np.array([0.5, -2.0, 1.5, 3.0])
_B = np.array([1.0, -0.25, 2.0, 0.0])
NORM_PATH_CASES: dict[str, tuple[str, object, float | None]] = {
    "cls token": ("stablehlo.slice", lambda v: v[:, :1], 1.0),
    "keepdims": ("stablehlo.broadcast_in_dim", lambda v: v[:, None], 1.0),
    "sum": ("stablehlo.reduce", lambda v: v.sum(1), 5.0),
    "times 1/n": ("stablehlo.multiply", lambda v: v * 0.2, 0.2),
    "mean": ("stablehlo.divide", lambda v: v.sum(1) / 5.0, 1.0),
    "roll": ("stablehlo.concatenate", lambda v: np.concatenate([v[:, 2:], v[:, :2]], 1), 1.0),
    "zero widths": ("stablehlo.pad", lambda v: np.pad(v, [(0, 0), (0, 0), (0, 0)]), 1.0),
    "real pad": ("stablehlo.pad", lambda v: np.pad(v, [(0, 0), (1, 2), (0, 0)]), None),
}


@pytest.mark.parametrize("name", sorted(NORM_PATH_CASES))
def test_norm_path_laws(name):
    _, path, k = NORM_PATH_CASES[name]
    folded = path(_X) * _G
    original = path(_X * _G + _B)
    if k is None:  # with a shift it does not commute; without one it does
        assert not np.allclose(folded + _B, original)
        np.testing.assert_allclose(path(_X) * _G, path(_X * _G), rtol=1e-12, atol=1e-12)
        return
    np.testing.assert_allclose(folded + k * _B, original, rtol=1e-12, atol=1e-12)


def test_every_norm_path_law_has_cases_and_is_in_the_fuzzer_grammar():
    import regiongen

    assert {op for op, _, _ in NORM_PATH_CASES.values()} == set(laws.NORM_PATH_LAWS)
    assert set(laws.NORM_PATH_LAWS) <= set(regiongen.STEP_OPS["norm"])
