"""Edges that mutation testing found untested (tools/mutation.py survivors), each judged
on numbers against XLA on the original, or on what the report must say.

Forward folding: a narrowing convert as the chain's first step, or after steps that do
not normalize; a crop (negative padding) in an explicit pad; a dot_general with two
contracting dimensions; a folded bias that overflows f16 (also through
--pad-uniform-shift); a subtract right after the producer merged into the new bias; a
multi-result helper. Laws: a shift through `c - x`; `x + x` of shifted values; a max pool
whose windows can be empty; a select-ReLU spelled `>=`; a transpose between the bias and
the activation; the interval of a constant factor (an f16 range check), of a max pool
with init 0, of abs, of an unknown value. Reports: triplets of a plain pair; a
batch_norm_inference after a bias add (its statistics); the kind of a variance-free chain.
"""

from __future__ import annotations

import numpy as np
import pytest

import bnfold
import numerics
from bnfold import elements, laws, precision
from test_laws import HBA, SHIFT_PASSES, VEC, T, hba, hba_module, within_three_sigma
from test_wrong_numbers import CONV, outputs

F32 = "tensor<1x8x8x2xf32>"


def fold(text: str, **kwargs) -> bnfold.Folded:
    return bnfold.fold_source(text, options=bnfold.FoldOptions(**kwargs))


def same_numbers(text: str, out: bnfold.Folded, xs: list[np.ndarray], tolerance: float) -> None:
    expected, actual = outputs(text, xs), outputs(out.serialize().decode(), xs)
    assert np.all(np.isfinite(actual)), out.report.table()
    assert numerics.relative_error(actual, expected) <= tolerance, out.report.table()


# --- forward folding -----------------------------------------------------------------------


def test_a_narrowing_convert_first_then_a_normalization_folds_what_follows():
    """The convert is the chain's first step (nothing before it to keep)."""
    text = f"""
func.func @main(%x: {F32}) -> tensor<1x8x8x3xbf16> {{
  %xb = stablehlo.convert %x : ({F32}) -> tensor<1x8x8x2xbf16>
  %m = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xbf16>
  %d = stablehlo.constant dense<[0.5, 4.0]> : tensor<2xbf16>
  %mb = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xbf16>) -> tensor<1x8x8x2xbf16>
  %db = stablehlo.broadcast_in_dim %d, dims = [3] : (tensor<2xbf16>) -> tensor<1x8x8x2xbf16>
  %c = stablehlo.subtract %xb, %mb : tensor<1x8x8x2xbf16>
  %n = stablehlo.divide %c, %db : tensor<1x8x8x2xbf16>
  %k = stablehlo.constant dense<[[[[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]]]]> : tensor<1x1x2x3xbf16>
  %y = stablehlo.convolution(%n, %k) {CONV} : (tensor<1x8x8x2xbf16>, tensor<1x1x2x3xbf16>) -> tensor<1x8x8x3xbf16>
  return %y : tensor<1x8x8x3xbf16>
}}
"""
    out = fold(text)
    assert [f.direction for f in out.report.folds] == ["forward"], out.report.table()
    assert "stablehlo.convert" in out.serialize().decode()  # the rounding stays where it was
    xs = [np.random.default_rng(0).normal(1, 1, (1, 8, 8, 2)).astype(np.float32)]
    same_numbers(text, out, xs, numerics.tolerance("bf16"))


def test_a_scale_that_cannot_cross_a_narrowing_convert_stays():
    """f32 -> f16 narrows the exponent range: a lone scale before it stays, nothing folds."""
    text = f"""
func.func @main(%x: {F32}) -> tensor<1x8x8x3xf16> {{
  %s = stablehlo.constant dense<[0.5, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> {F32}
  %n = stablehlo.multiply %x, %sb : {F32}
  %nh = stablehlo.convert %n : ({F32}) -> tensor<1x8x8x2xf16>
  %k = stablehlo.constant dense<[[[[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]]]]> : tensor<1x1x2x3xf16>
  %y = stablehlo.convolution(%nh, %k) {CONV} : (tensor<1x8x8x2xf16>, tensor<1x1x2x3xf16>) -> tensor<1x8x8x3xf16>
  return %y : tensor<1x8x8x3xf16>
}}
"""
    out = fold(text)
    assert not out.report.folds
    xs = [np.random.default_rng(0).normal(0, 100, (1, 8, 8, 2)).astype(np.float32)]
    same_numbers(text, out, xs, 0.0)


NORMALIZED_CONV = """
func.func @main(%x: tensor<1x6x6x2xDT>) -> tensor<1xOUTxDT> {
  %m = stablehlo.constant dense<[MEAN, MEAN]> : tensor<2xDT>
  %d = stablehlo.constant dense<[0.5, 0.25]> : tensor<2xDT>
  %mb = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xDT>) -> tensor<1x6x6x2xDT>
  %db = stablehlo.broadcast_in_dim %d, dims = [3] : (tensor<2xDT>) -> tensor<1x6x6x2xDT>
  %c = stablehlo.subtract %x, %mb : tensor<1x6x6x2xDT>
  %n = stablehlo.divide %c, %db : tensor<1x6x6x2xDT>
  %z = stablehlo.constant dense<0.0> : tensor<DT>
  %p = stablehlo.pad %n, %z, low = [0, LOW, LOW, 0], high = [0, HIGH, HIGH, 0], interior = [0, 0, 0, 0] : (tensor<1x6x6x2xDT>, tensor<DT>) -> tensor<1xPADDEDxDT>
  %k = stablehlo.constant dense<KERNEL> : tensor<3x3x2x3xDT>
  %y = stablehlo.convolution(%p, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1xPADDEDxDT>, tensor<3x3x2x3xDT>) -> tensor<1xOUTxDT>
  return %y : tensor<1xOUTxDT>
}
"""


def normalized_conv(dtype: str, mean: float, low: int, high: int, kernel: float | None = None
                    ) -> str:
    """(x - mean) / [0.5, 0.25], zero pad (low, high), 3x3 convolution; a random kernel, or
    every weight `kernel`."""
    size = 6 + low + high
    k = str(np.random.default_rng(3).normal(0, 1, (3, 3, 2, 3)).round(3).tolist()) \
        if kernel is None else f"{kernel:.6e}"  # MLIR wants the mantissa's point
    return (NORMALIZED_CONV.replace("DT", dtype).replace("MEAN", str(mean))
            .replace("LOW", str(low)).replace("HIGH", str(high))
            .replace("PADDED", f"{size}x{size}x2").replace("OUT", f"{size}x{size}x3")
            .replace("KERNEL", k))


def test_a_pad_that_crops_is_not_taken_into_the_convolution():
    """A negative high edge (a crop) before the convolution's own padding does not add up."""
    text = normalized_conv("f32", 0.5, 1, -1)
    out = fold(text)
    xs = [np.random.default_rng(0).normal(0.5, 1, (1, 6, 6, 2)).astype(np.float32)]
    same_numbers(text, out, xs, numerics.tolerance("f32"))
    assert "stablehlo.pad" in out.serialize().decode()


@pytest.mark.parametrize("dtype, weight, uniform", [
    ("f16", 5000.0, False), ("f32", 2e37, False), ("f32", 2e37, True)],
    ids=["f16", "f32", "f32-pad-uniform-shift"])
def test_a_folded_bias_that_would_overflow_is_refused(dtype, weight, uniform):
    """(x - 0.75) / 0.25 (a shift of 3 units, within the cancellation limit) into 18 equal
    taps: folded, the bias would be -54 * weight, beyond the type (f16: -270000; f32 with
    --pad-uniform-shift too, whose explicit pad moves it into a bias as well); at x = 0.75
    the original is 0 and the folded form inf - inf."""
    text = normalized_conv(dtype, 0.75, 0, 0, kernel=weight).replace("[0.5, 0.25]",
                                                                    "[0.25, 0.25]")
    out = fold(text, pad_uniform_shift=uniform)
    xs = [np.full((1, 6, 6, 2), 0.75, np.float16 if dtype == "f16" else np.float32)]
    expected, actual = outputs(text, xs), outputs(out.serialize().decode(), xs)
    np.testing.assert_array_equal(expected, 0.0)
    np.testing.assert_array_equal(actual, expected)
    assert [s.code for s in out.report.skipped] == ["precision"], out.report.table()


def test_a_dot_general_contracting_two_dimensions_is_refused_with_its_code():
    text = """
func.func @main(%x: tensor<4x3x2xf32>) -> tensor<4x5xf32> {
  %s = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [2] : (tensor<2xf32>) -> tensor<4x3x2xf32>
  %t = stablehlo.constant dense<[1.0, -1.0]> : tensor<2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [2] : (tensor<2xf32>) -> tensor<4x3x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<4x3x2xf32>
  %a = stablehlo.add %m, %tb : tensor<4x3x2xf32>
  %w = stablehlo.constant dense<0.25> : tensor<3x2x5xf32>
  %y = stablehlo.dot_general %a, %w, contracting_dims = [1, 2] x [0, 1] : (tensor<4x3x2xf32>, tensor<3x2x5xf32>) -> tensor<4x5xf32>
  return %y : tensor<4x5xf32>
}
"""
    out = fold(text)
    (skip,) = out.report.skipped
    assert skip.code == "axis" and "contracts more than one dimension" in skip.reason
    same_numbers(text, out, [np.random.default_rng(0).normal(size=(4, 3, 2)).astype(np.float32)],
                 0.0)


def test_a_subtract_after_the_producer_merges_into_the_forward_bias():
    text = f"""
func.func @main(%x: {F32}) -> tensor<1x8x8x3xf32> {{
  %s = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> {F32}
  %t = stablehlo.constant dense<[1.0, -1.0]> : tensor<2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> {F32}
  %m = stablehlo.multiply %x, %sb : {F32}
  %a = stablehlo.add %m, %tb : {F32}
  %k = stablehlo.constant dense<[[[[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%a, %k) {CONV} : ({F32}, tensor<1x1x2x3xf32>) -> tensor<1x8x8x3xf32>
  %c = stablehlo.constant dense<[0.1, 0.2, 0.3]> : tensor<3xf32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf32>) -> tensor<1x8x8x3xf32>
  %o = stablehlo.subtract %y, %cb : tensor<1x8x8x3xf32>
  return %o : tensor<1x8x8x3xf32>
}}
"""
    # Neither the backward fold nor merge-bias takes the subtract: the forward fold's own merge
    out = fold(text, disable="backward-affine,merge-bias")
    decoded = out.serialize().decode()
    assert "stablehlo.subtract" not in decoded and decoded.count("stablehlo.add") == 1, decoded
    same_numbers(text, out, [np.random.default_rng(0).normal(size=(1, 8, 8, 2)).astype(
        np.float32)], numerics.tolerance("f32"))


def test_a_helper_with_two_results_is_inlined_for_the_pad_it_returns_second():
    text = f"""
func.func private @two(%n: {F32}) -> ({F32}, tensor<1x10x10x2xf32>) {{
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %p = stablehlo.pad %n, %z, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : ({F32}, tensor<f32>) -> tensor<1x10x10x2xf32>
  return %n, %p : {F32}, tensor<1x10x10x2xf32>
}}
func.func @main(%x: {F32}) -> ({F32}, tensor<1x8x8x3xf32>) {{
  %s = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> {F32}
  %n = stablehlo.multiply %x, %sb : {F32}
  %r:2 = call @two(%n) : ({F32}) -> ({F32}, tensor<1x10x10x2xf32>)
  %k = stablehlo.constant dense<0.25> : tensor<3x3x2x3xf32>
  %y = stablehlo.convolution(%r#1, %k) {CONV} : (tensor<1x10x10x2xf32>, tensor<3x3x2x3xf32>) -> tensor<1x8x8x3xf32>
  return %r#0, %y : {F32}, tensor<1x8x8x3xf32>
}}
"""
    out = fold(text)
    assert out.report.inlined == ["two"], out.report.table()
    xs = [np.random.default_rng(0).normal(size=(1, 8, 8, 2)).astype(np.float32)]
    expected, actual = numerics.run_xla(text, xs), numerics.run_xla(out.serialize().decode(), xs)
    for a, e in zip(actual, expected, strict=True):
        assert numerics.relative_error(a, e) <= numerics.tolerance("f32")


# --- laws ------------------------------------------------------------------------------------


HBA_POSTS = {
    "constant_minus_activation": (  # a shift passes c - x negated
        f"  %c = {VEC}\n  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %r = stablehlo.subtract %cb, %a : {T}", True, None),
    "activation_plus_itself": (f"  %r = stablehlo.add %a, %a : {T}", False, "role"),
    "max_pool_with_empty_windows": (
        "  %ninf = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>\n"
        f'  %r = "stablehlo.reduce_window"(%a, %ninf) ({{\n'
        "    ^bb0(%l: tensor<f64>, %h: tensor<f64>):\n"
        "      %q = stablehlo.maximum %l, %h : tensor<f64>\n"
        "      stablehlo.return %q : tensor<f64>\n"
        "  }) {window_dimensions = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [1, 1], "
        f"[1, 1], [0, 0]]> : tensor<4x2xi64>}} : ({T}, tensor<f64>) -> tensor<2x6x6x3xf64>",
        False, "role"),
}


@pytest.mark.parametrize("name", sorted(HBA_POSTS))
def test_shift_laws_after_the_activation(name):
    lines, absorbs, code = HBA_POSTS[name]
    out_type, spatial = ("tensor<2x6x6x3xf64>", "6x6") if "empty" in name else (T, "4x4")
    text = hba_module((lines, out_type, spatial))
    out, records = hba(text)
    assert [r["absorbed"] for r in records] == [absorbs], records
    if code is not None:
        assert records[0]["code"] == code, records
    xs = within_three_sigma(text)
    expected, actual = outputs(text, xs), outputs(out.serialize().decode(), xs)
    assert numerics.relative_error(actual, expected) < 1e-12


@pytest.mark.parametrize("variant", ["select_ge", "transpose_between"])
def test_high_bias_through_other_relu_spellings(variant):
    text = hba_module(SHIFT_PASSES["nothing"])
    if variant == "select_ge":
        text = text.replace(
            f"  %a = stablehlo.clamp %zero, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}",
            f"  %z0 = stablehlo.constant dense<0.0> : {T}\n"
            f"  %p = stablehlo.compare GE, %n, %z0 : ({T}, {T}) -> tensor<2x4x4x3xi1>\n"
            f"  %a = stablehlo.select %p, %n, %z0 : tensor<2x4x4x3xi1>, {T}")
    else:  # the bias, a transpose to NCHW, ReLU6 there, and back to NHWC
        nchw = "tensor<2x3x4x4xf64>"
        text = text.replace(
            f"  %a = stablehlo.clamp %zero, %n, %six : (tensor<f64>, {T}, tensor<f64>) -> {T}",
            f"  %t1 = stablehlo.transpose %n, dims = [0, 3, 1, 2] : ({T}) -> {nchw}\n"
            f"  %a1 = stablehlo.clamp %zero, %t1, %six : (tensor<f64>, {nchw}, tensor<f64>) -> {nchw}\n"
            f"  %a = stablehlo.transpose %a1, dims = [0, 2, 3, 1] : ({nchw}) -> {T}")
    out, records = hba(text)
    assert [r["absorbed"] for r in records] == [True], records
    xs = within_three_sigma(text)
    assert numerics.relative_error(outputs(out.serialize().decode(), xs),
                                   outputs(text, xs)) < 1e-12


F16_PAIR = """
func.func @main(%x: tensor<1x4x4x2xf16>) -> tensor<1x4x4x2xf16> {
  %k1 = stablehlo.constant dense<[[[[4.0, 0.01], [2.0, 0.02]]]]> : tensor<1x1x2x2xf16>
  %y = stablehlo.convolution(%x, %k1) CONV : (tensor<1x4x4x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x4x4x2xf16>
  %g = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf16>
  %b = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf16>
  %m = stablehlo.constant dense<[0.0, 0.0]> : tensor<2xf16>
  %v = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf16>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 3 : i64} : (tensor<1x4x4x2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>) -> tensor<1x4x4x2xf16>
REGION
  %k2 = stablehlo.constant dense<[[[[1.0, 2.0], [40.0, 30.0]]]]> : tensor<1x1x2x2xf16>
  %z = stablehlo.convolution(%r, %k2) CONV : (tensor<1x4x4x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x4x4x2xf16>
  return %z : tensor<1x4x4x2xf16>
}
""".replace("CONV", CONV)
F16 = "tensor<1x4x4x2xf16>"
F16_REGIONS = {
    "times_a_constant": (  # after the ReLU: the fold's chain ends at the activation
        f"  %zero = stablehlo.constant dense<0.0> : {F16}\n  %a = stablehlo.maximum %n, %zero : {F16}\n"
        f"  %h = stablehlo.constant dense<0.5> : {F16}\n  %r = stablehlo.multiply %a, %h : {F16}"),
    "max_pool_with_init_zero": (
        "  %z0 = stablehlo.constant dense<0.0> : tensor<f16>\n"
        '  %r = "stablehlo.reduce_window"(%n, %z0) ({\n'
        "    ^bb0(%l: tensor<f16>, %h: tensor<f16>):\n"
        "      %q = stablehlo.maximum %l, %h : tensor<f16>\n"
        "      stablehlo.return %q : tensor<f16>\n"
        "  }) {window_dimensions = array<i64: 1, 3, 3, 1>, padding = dense<[[0, 0], [1, 1], "
        f"[1, 1], [0, 0]]> : tensor<4x2xi64>}} : ({F16}, tensor<f16>) -> {F16}"),
}


@pytest.mark.parametrize("name", sorted(F16_REGIONS))
def test_f16_equalization_bounds_the_region_by_its_laws(name):
    """In f16 a channel may grow only with a known bound: the batch norm's statistics carried
    through a constant factor, or a max pool whose init 0 joins the interval."""
    text = F16_PAIR.replace("REGION", F16_REGIONS[name])
    out = fold(text, equalize=True, disable="forward-affine")  # keep the region's multiply
    assert "stablehlo.multiply" in out.serialize().decode() or "pool" in name
    assert len(out.report.equalized) == 1, out.report.table()
    xs = [np.random.default_rng(0).normal(0, 1, (1, 4, 4, 2)).astype(np.float16)]
    same_numbers(text, out, xs, numerics.tolerance("f16"))


class _Env:
    def __init__(self, interval: laws.Interval):
        self._interval = interval

    def axis(self, value):
        return 0

    def interval(self, value):
        return self._interval

    def constant(self, value):
        return None


def test_interval_of_abs_and_of_nothing_known():
    abs_law = laws.LAWS["stablehlo.abs"].interval
    assert abs_law is not None
    op = type("Op", (), {"operands": [object()]})()
    found = abs_law(op, _Env(laws.Interval(np.array([2.0, -5.0, -1.0]),
                                             np.array([5.0, -2.0, 3.0]))))
    np.testing.assert_array_equal(found.lo, [2.0, 2.0, 0.0])
    np.testing.assert_array_equal(found.hi, [5.0, 5.0, 3.0])
    unknown = laws.Interval.unknown(2)
    assert np.all(unknown.lo == -np.inf) and np.all(unknown.hi == np.inf)
    assert laws.LAWS["stablehlo.compare"].interval is None  # a predicate has no range


# --- what the report says --------------------------------------------------------------------


def test_three_layers_without_a_depthwise_middle_are_no_triplet():
    """conv (2 -> 1) -> ReLU -> conv (1 -> 2, not grouped) -> ReLU -> conv: a set of three
    layers, but DFQ's triplet is conv -> depthwise -> conv."""
    relu = "  %{o} = stablehlo.maximum %{i}, %zero : tensor<1x4x4x{c}xf32>\n"
    text = f"""
func.func @main(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {{
  %zero = stablehlo.constant dense<0.0> : tensor<1x4x4x1xf32>
  %zero2 = stablehlo.constant dense<0.0> : tensor<1x4x4x2xf32>
  %k1 = stablehlo.constant dense<[[[[4.0], [2.0]]]]> : tensor<1x1x2x1xf32>
  %y1 = stablehlo.convolution(%x, %k1) {CONV} : (tensor<1x4x4x2xf32>, tensor<1x1x2x1xf32>) -> tensor<1x4x4x1xf32>
{relu.format(o="r1", i="y1", c=1)}  %k2 = stablehlo.constant dense<[[[[0.01, 0.5]]]]> : tensor<1x1x1x2xf32>
  %y2 = stablehlo.convolution(%r1, %k2) {CONV} : (tensor<1x4x4x1xf32>, tensor<1x1x1x2xf32>) -> tensor<1x4x4x2xf32>
  %r2 = stablehlo.maximum %y2, %zero2 : tensor<1x4x4x2xf32>
  %k3 = stablehlo.constant dense<[[[[30.0, 1.0], [0.1, 0.2]]]]> : tensor<1x1x2x2xf32>
  %y3 = stablehlo.convolution(%r2, %k3) {CONV} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  return %y3 : tensor<1x4x4x2xf32>
}}
"""
    out = fold(text, equalize=True)
    (record,) = out.report.equalized
    assert record.kind == "triplet" and record.triplets == 0, out.report.table()
    xs = [np.random.default_rng(0).normal(size=(1, 4, 4, 2)).astype(np.float32)]
    same_numbers(text, out, xs, numerics.tolerance("f32"))


def test_a_bias_before_a_narrowing_convert_stays_and_what_follows_folds():
    """x + c (f32), convert to f16, then (x - m) / d in f16: only the f16 normalization folds
    (one add before the convert does not normalize; it stays with its rounding)."""
    text = f"""
func.func @main(%x: {F32}) -> tensor<1x8x8x3xf16> {{
  %c = stablehlo.constant dense<[0.25, -0.5]> : tensor<2xf32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<2xf32>) -> {F32}
  %a = stablehlo.add %x, %cb : {F32}
  %h = stablehlo.convert %a : ({F32}) -> tensor<1x8x8x2xf16>
  %m = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf16>
  %d = stablehlo.constant dense<[0.5, 4.0]> : tensor<2xf16>
  %mb = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xf16>) -> tensor<1x8x8x2xf16>
  %db = stablehlo.broadcast_in_dim %d, dims = [3] : (tensor<2xf16>) -> tensor<1x8x8x2xf16>
  %s = stablehlo.subtract %h, %mb : tensor<1x8x8x2xf16>
  %n = stablehlo.divide %s, %db : tensor<1x8x8x2xf16>
  %k = stablehlo.constant dense<[[[[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]]]]> : tensor<1x1x2x3xf16>
  %y = stablehlo.convolution(%n, %k) {CONV} : (tensor<1x8x8x2xf16>, tensor<1x1x2x3xf16>) -> tensor<1x8x8x3xf16>
  return %y : tensor<1x8x8x3xf16>
}}
"""
    out = fold(text)
    assert [f.direction for f in out.report.folds] == ["forward"], out.report.table()
    decoded = out.serialize().decode()
    assert "stablehlo.convert" in decoded and "stablehlo.divide" not in decoded
    xs = [np.random.default_rng(0).normal(1, 1, (1, 8, 8, 2)).astype(np.float32)]
    same_numbers(text, out, xs, numerics.tolerance("f16"))


def test_batch_norm_inference_after_a_bias_add_describes_the_pre_activation():
    """conv + bias, then batch_norm_inference: high-bias absorption moves beta - 3 gamma
    (the batch norm saw x + bias)."""
    text = HBA.format(post=f"  %r = stablehlo.convert %a : {T}", rt=T, out="4x4", T=T).replace(
        '  %n = "stablehlo.batch_norm_inference"(%y,',
        "  %c = stablehlo.constant dense<[0.5, -0.25, 1.0]> : tensor<3xf64>\n"
        f"  %cb = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<3xf64>) -> {T}\n"
        f"  %yb = stablehlo.add %y, %cb : {T}\n"
        '  %n = "stablehlo.batch_norm_inference"(%yb,')
    out, records = hba(text)
    # beta = [4, 0.2, 3], gamma = [0.5, 0.5, 0.25]: c = beta - 3 gamma where positive, in the
    # units equalization left (divided by its scale); the bias before the batch norm does not
    # move the pre-activation's mean (the batch norm removes it with its mean).
    scale = out.report.equalized[0].params["scale0"]
    expected = np.maximum(0.0, np.array([4.0, 0.2, 3.0]) - 3 * np.array([0.5, 0.5, 0.25])) / scale
    assert records[0]["absorbed"], records
    assert records[0]["absorbed_max"] == pytest.approx(expected.max(), rel=1e-9)
    assert records[0]["absorbed_mean"] == pytest.approx(expected.mean(), rel=1e-9)
    xs = within_three_sigma(text)
    assert numerics.relative_error(outputs(out.serialize().decode(), xs),
                                   outputs(text, xs)) < 1e-12


def test_the_kind_of_a_chain_follows_its_statistics():
    """A decomposed batch norm (a variance under rsqrt) is a normalization even when its
    shift is zero; a plain per-channel scale is other affine."""
    bn = f"""
func.func @main(%x: {F32}) -> tensor<1x8x8x3xf32> {{
  %k = stablehlo.constant dense<[[[[0.5, -0.25, 1.0], [0.75, 0.5, -1.0]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%x, %k) {CONV} : ({F32}, tensor<1x1x2x3xf32>) -> tensor<1x8x8x3xf32>
  %v = stablehlo.constant dense<[1.0, 4.0, 0.25]> : tensor<3xf32>
  %e = stablehlo.constant dense<0.0> : tensor<3xf32>
  %ve = stablehlo.add %v, %e : tensor<3xf32>
  %r = stablehlo.rsqrt %ve : tensor<3xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [3] : (tensor<3xf32>) -> tensor<1x8x8x3xf32>
  %n = stablehlo.multiply %y, %rb : tensor<1x8x8x3xf32>
  return %n : tensor<1x8x8x3xf32>
}}
"""
    scale = bn.replace("%r = stablehlo.rsqrt %ve : tensor<3xf32>", "%r = stablehlo.negate %ve : tensor<3xf32>")
    assert [f.kind for f in fold(bn).report.folds] == ["normalization"]
    assert [f.kind for f in fold(scale).report.folds] == ["affine"]


def test_kernel_scaling_threads_follow_the_environment(monkeypatch):
    monkeypatch.setenv("BNFOLD_NUM_THREADS", "3")
    assert precision._workers() == 3
    monkeypatch.setenv("BNFOLD_NUM_THREADS", "not a number")
    assert 1 <= precision._workers() <= 4


def test_a_kernel_behind_a_convert_is_read_as_the_program_rounds_it():
    """A bf16 producer whose kernel is convert(f32 constant): the shift's bias is computed
    from the bf16 kernel the program multiplies with, not from the f32 source."""
    from bnfold.producers import Kernel
    from bnfold.through import kernel_f64

    source = np.array([[1.001, -0.3337]], np.float32)
    kernel = Kernel(value=None, values=source, shape=(1, 2), storage=np.dtype(np.float32),
                    effective=elements.bfloat16(), convert=object(), anchor=None)
    np.testing.assert_array_equal(kernel_f64(kernel), source.astype(elements.bfloat16()))
    assert not np.array_equal(kernel_f64(kernel), source.astype(np.float64))
