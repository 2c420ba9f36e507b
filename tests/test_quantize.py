"""--quantize-weights and --bias-correction (bnfold.quant.weights), judged independently:

- the integers and scales against this file's own numpy quantizer of the weights the plain
  fold produces, and the quantized module against that numpy fake-quantization on XLA;
- the bias correction against the expectation computed on XLA (the mean image of the
  layer's input convolved with the error kernel: E[conv(x)] = conv(E[x])), with the mean
  through ReLU from the normal's closed form written here;
- the gain on a MobileNetV2-shaped network with calibrated batch norms, measured.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import bnfold
import numerics
import quantnet
import support
from bnfold import elements
from bnfold import ir as bir
from bnfold.cli import main

LAYERS = ["conv2d_nhwc_bn.mlir", "conv2d_depthwise_bn.mlir", "conv2d_grouped_transposed_bn.mlir",
          "dense_bn.mlir", "conv1d_ncw_stride2_bn.mlir", "models/keras_mobilenetv2_nhwc.mlir",
          "models/torchax_resnet_nchw.mlir", "models/deployment_flax_resnet18_bf16_nhwc.mlir"]


def options(**kwargs) -> bnfold.FoldOptions:
    return bnfold.FoldOptions(**kwargs)


# --- reading weights back (this file's own reader) -------------------------------------------------


def _producers(module) -> list:
    found = []

    def visit(op):
        if op.name in ("stablehlo.convolution", "stablehlo.dot_general"):
            found.append(op)
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _defining(value):
    owner = value.owner
    return owner if isinstance(owner, bir.ir.Operation) else getattr(owner, "operation", None)


def _constant(value) -> np.ndarray | None:
    op = _defining(value)
    if op is None or op.name != "stablehlo.constant":
        return None
    return elements.read(op.attributes["value"])


def _out_axis(op, operand: int) -> int:
    if op.name == "stablehlo.convolution":
        dims = bir.stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        return dims.kernel_output_feature_dimension
    dims = bir.stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    used = set(dims.rhs_contracting_dimensions if operand == 1 else dims.lhs_contracting_dimensions)
    used |= set(dims.rhs_batching_dimensions if operand == 1 else dims.lhs_batching_dimensions)
    rank = bir.ir.RankedTensorType(op.operands[operand].type).rank
    (free,) = [d for d in range(rank) if d not in used]
    return free


def float_kernels(text: str) -> list[tuple[int, int, np.ndarray]]:
    """(operand, output axis, float64 kernel) of every producer with a constant kernel."""
    context, module = support.parse(text)
    found = []
    with context:
        for op in _producers(module):
            for index in (1, 0):
                ty = bir.ir.RankedTensorType(op.operands[index].type)
                kernel = _constant(op.operands[index])
                convert = _defining(op.operands[index])
                if kernel is None and convert is not None and convert.name == "stablehlo.convert":
                    kernel = _constant(convert.operands[0])  # mixed precision: rounded below
                if kernel is not None and kernel.dtype.kind in "fV":
                    dtype = elements.numpy_dtype(ty.element_type)
                    found.append((index, _out_axis(op, index), np.broadcast_to(
                        kernel.astype(dtype).astype(np.float64), ty.shape)))
                    break
    return found


def _dequantize_ops(value):
    """(convert of q, broadcast of the scale, multiply, final convert or None) of a weight
    `convert(convert(q) * s)` or `convert(q) * s`; None otherwise."""
    last = _defining(value)
    mul = last
    if last is not None and last.name == "stablehlo.convert":
        mul = _defining(last.operands[0])
    else:
        last = None
    if mul is None or mul.name != "stablehlo.multiply":
        return None
    convert, broadcast = (_defining(v) for v in mul.operands)
    if convert is None or convert.name != "stablehlo.convert":
        return None
    return convert, broadcast, mul, last


def quantized_kernels(text: str) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """(integers, scale, integer type) of every producer whose kernel is `convert(q) * s`
    (or that product converted to the weight's type)."""
    context, module = support.parse(text)
    found = []
    with context:
        for op in _producers(module):
            for value in op.operands:
                ops = _dequantize_ops(value)
                if ops is None:
                    continue
                convert, broadcast, _, _ = ops
                q_type = bir.ir.RankedTensorType(convert.operands[0].type)
                q = np.broadcast_to(_constant(convert.operands[0]), q_type.shape)
                found.append((q, _constant(broadcast.operands[0]), str(q_type.element_type)))
    return found


def module_weights(text: str) -> list[tuple[np.ndarray, str, str]]:
    """Every quantized producer's weight as the module computes it, from its own constants
    and types: q converted to the multiply's type, times the scale broadcast along the
    broadcast's dims (rounded there once, IEEE), converted to the producer's operand type;
    float64, with (the multiply's type, the weight's type)."""
    context, module = support.parse(text)
    found = []
    with context:
        for op in _producers(module):
            for value in op.operands:
                ops = _dequantize_ops(value)
                if ops is None:
                    continue
                convert, broadcast, mul, _ = ops
                wide = elements.numpy_dtype(bir.ir.RankedTensorType(mul.result.type).element_type)
                weight = elements.numpy_dtype(bir.ir.RankedTensorType(value.type).element_type)
                shape = bir.ir.RankedTensorType(value.type).shape
                q = np.broadcast_to(_constant(convert.operands[0]), shape)
                scale = np.asarray(_constant(broadcast.operands[0])).astype(wide)
                dims = list(bir.ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
                view = [1] * len(shape)
                for d, n in zip(dims, scale.shape, strict=True):
                    view[d] = n
                with np.errstate(over="ignore"):
                    product = q.astype(wide) * scale.reshape(view)
                    w = product.astype(weight)
                found.append((w.astype(np.float64), precision_name(wide), precision_name(weight)))
    return found


def precision_name(dtype: np.dtype) -> str:
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}[
        np.dtype(dtype).name]


def compute_of(dtype: np.dtype) -> np.dtype:
    """Where the README says the module multiplies: f64 for f64 weights, else f32."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def reference(kernel: np.ndarray, bits: int, axis: int | None, dtype: np.dtype
              ) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantization as the README states it: scale = max|W| / (2^(b-1) - 1) rounded
    to f32 (f64 for f64 weights; 1 for an all-zero channel; at least that type's smallest
    normal number; one value down where q * scale would overflow the weight's type), q =
    round half to even, clipped."""
    qmax = 2 ** (bits - 1) - 1
    compute = compute_of(dtype)
    others = tuple(d for d in range(kernel.ndim) if d != axis)
    top = np.max(np.abs(kernel), axis=others) if axis is not None else np.max(np.abs(kernel))
    scale = np.asarray(np.where(top > 0, top / qmax, 1.0)).astype(compute)
    scale = np.maximum(scale, np.finfo(compute).smallest_normal)
    shape = [1] * kernel.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(kernel / scale.reshape(shape).astype(np.float64)), -qmax, qmax)
    with np.errstate(over="ignore"):
        bad = ~np.isfinite((q.astype(compute) * scale.reshape(shape)).astype(dtype))
    if np.any(bad):
        bad = np.any(bad, axis=others) if axis is not None else np.any(bad)
        scale = np.where(bad, np.nextafter(scale, compute.type(0)), scale).astype(compute)
        q = np.clip(np.rint(kernel / scale.reshape(shape).astype(np.float64)), -qmax, qmax)
    return q, scale.astype(np.float64)


def fake_quantized(q: np.ndarray, scale: np.ndarray, axis: int | None, dtype: np.dtype
                   ) -> np.ndarray:
    """q * scale as the README says the module computes it: in f32 (f64 for f64 weights),
    rounded once there, then converted to the weight's type; float64."""
    compute = compute_of(dtype)
    shape = [1] * q.ndim
    if axis is not None:
        shape[axis] = -1
    product = q.astype(compute) * scale.reshape(shape).astype(compute)
    return product.astype(dtype).astype(np.float64)


def with_kernels(text: str, kernels: list[np.ndarray]) -> str:
    """`text` with each producer's constant kernel replaced (same type), in order."""
    context, module = support.parse(text)
    with context, bir.ir.Location.unknown():
        ops = [op for op in _producers(module)]
        it = iter(kernels)
        for op in ops:
            for index in (1, 0):
                const = _defining(op.operands[index])
                if const is not None and const.name == "stablehlo.convert":
                    const = _defining(const.operands[0])
                if const is not None and const.name == "stablehlo.constant" and \
                        elements.is_float(bir.ir.RankedTensorType(op.operands[index].type).element_type):
                    ty = bir.ir.RankedTensorType(op.operands[index].type)
                    with bir.ir.InsertionPoint(op):
                        new = bir.stablehlo.ConstantOp(elements.dense_attr(next(it), ty.element_type))
                    op.operands[index] = new.result
                    break
        return str(module)


# --- the integers, the scales, the numbers -----------------------------------------------------


@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", LAYERS)
def test_quantized_weights_are_the_numpy_fake_quantization(name, bits, granularity):
    text = (support.TESTDATA / name).read_text()
    folded = bnfold.fold_source(text).serialize().decode()
    out = bnfold.fold_source(text, options=options(quantize_weights=f"int{bits}",
                                                   quantize_granularity=granularity))
    quantized = out.serialize().decode()
    floats = float_kernels(folded)
    ints = quantized_kernels(quantized)
    assert len(ints) == len(floats) == len(out.report.quantized) > 0, out.report.table()
    fakes = []
    for (_, axis, kernel), (q, scale, storage), record in zip(floats, ints,
                                                               out.report.quantized):
        dtype = np.dtype(np.float32) if "bf16" not in name else elements.bfloat16()
        expected_q, expected_scale = reference(kernel, bits, axis if granularity == "per-channel"
                                               else None, dtype)
        np.testing.assert_array_equal(q, expected_q)
        np.testing.assert_array_equal(np.asarray(scale, np.float64).reshape(-1),
                                      expected_scale.reshape(-1))
        assert storage == ("i4" if bits == 4 else "i8") == f"i{int(record.storage[1:])}"
        assert record.axis == axis and record.bits == bits
        fake = fake_quantized(expected_q, expected_scale,
                              axis if granularity == "per-channel" else None, dtype)
        fakes.append(fake)
        noise = np.sum((fake - kernel) ** 2)
        expected_sqnr = math.inf if noise == 0 else 10 * np.log10(np.sum(kernel ** 2) / noise)
        assert record.weight_sqnr_db == pytest.approx(expected_sqnr, rel=1e-9)
    inputs = support.inputs_for(text)
    expected = numerics.run_xla(with_kernels(folded, fakes), inputs)
    actual = numerics.run_xla(quantized, inputs)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(a, e)  # the same weights: the same numbers


def test_the_weights_are_stored_as_integers_four_times_smaller(tmp_path):
    source = support.MODELS / "torchax_resnet_nchw.mlir"
    plain, int8 = tmp_path / "plain.mlirbc", tmp_path / "int8.mlirbc"
    assert main(["-q", str(source), "--emit", "bytecode", "-o", str(plain)]) == 0
    assert main(["-q", str(source), "--emit", "bytecode", "--quantize-weights", "int8",
                 "-o", str(int8)]) == 0
    weights = sum(k.size for _, _, k in float_kernels(bnfold.fold_source(
        source.read_text()).serialize().decode()))
    saved = plain.stat().st_size - int8.stat().st_size
    assert saved == pytest.approx(3 * weights, rel=0.02)  # 4 bytes -> 1 byte per weight


def test_quantizing_twice_changes_nothing():
    text = (support.MODELS / "keras_mobilenetv2_nhwc.mlir").read_text()
    once = bnfold.fold_source(text, options=options(quantize_weights="int8")).serialize()
    again = bnfold.fold_source(once, options=options(quantize_weights="int8"))
    assert again.serialize() == once
    assert not again.report.quantized
    assert {s.code for s in again.report.not_quantized} == {"nothing-to-do"}


@pytest.mark.parametrize("element, bits", [("bf16", 9), ("bf16", 10), ("bf16", 16),
                                           ("f16", 12), ("f16", 13), ("f16", 16)])
def test_integers_wider_than_the_weight_type_are_exact_where_the_module_converts_them(
        element, bits):
    """The module converts the integers to f32 (every integer up to 16 bits is exact there)
    and multiplies there: bf16 int10 and f16 int13 were refused as 'not exact in the weight's
    type'. Read back: each weight the module computes is q * scale rounded to the weight's
    type, within half a step plus that one rounding of the original."""
    text = f"""
func.func @main(%x: tensor<1x4x4x2x{element}>) -> tensor<1x4x4x2x{element}> {{
  %k = stablehlo.constant dense<[[[[1.0, -0.5], [0.25, 0.125]]]]> : tensor<1x1x2x2x{element}>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<1x4x4x2x{element}>, tensor<1x1x2x2x{element}>) -> tensor<1x4x4x2x{element}>
  return %y : tensor<1x4x4x2x{element}>
}}
"""
    out = bnfold.fold_source(text, options=options(quantize_weights=f"int{bits}"))
    assert len(out.report.quantized) == 1 and not out.report.not_quantized
    [(q, scale, _)] = quantized_kernels(out.serialize().decode())
    [(weights, wide, _)] = module_weights(out.serialize().decode())
    kernel = np.array([[[[1.0, -0.5], [0.25, 0.125]]]])
    assert wide == "f32" and float(scale) == np.float32(1.0 / (2 ** (bits - 1) - 1))
    assert np.all(np.abs(q * float(scale) - kernel) <= float(scale) / 2)
    ulp = np.abs(kernel) * 2.0 ** -{"bf16": 8, "f16": 11}[element]
    assert np.all(np.abs(weights - kernel) <= float(scale) / 2 + ulp)  # q * scale, rounded


SMALL_F16 = """
func.func @main(%x: tensor<1x4x4x16x{t}>) -> tensor<1x4x4x4x{t}> {{
  %k = stablehlo.constant {k} : tensor<1x1x16x4x{t}>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<1x4x4x16x{t}>, tensor<1x1x16x4x{t}>) -> tensor<1x4x4x4x{t}>
  return %y : tensor<1x4x4x4x{t}>
}}
"""


@pytest.mark.parametrize("element, bits, tops", [
    ("f16", 10, [5.151e-6 * 511, 0.5, 0.01, 1.0]),  # a scale among f16's subnormals
    ("f16", 8, [2e-4, 0.3, 1.0, 0.004]),
    ("f16", 12, [0.9999, 0.7, 0.123, 1.5]),
    ("bf16", 9, [0.7, 0.33, 1.7, 0.013]),
])
def test_no_integer_is_more_than_half_a_step_off(element, bits, tops):
    """Where the scale rounds down in the weight's type, the largest weight lands more than
    half a step past qmax and was clipped: f16 int10 with a subnormal scale was 2.5 steps
    off (breaker run 2). Judged from the module's own integers and scales against the
    float weights, and on XLA against the numpy fake quantization."""
    dtype = np.dtype(np.float16) if element == "f16" else elements.bfloat16()
    rng = np.random.default_rng(bits)
    kernel = rng.uniform(-1, 1, (1, 1, 16, 4))
    kernel = (kernel / np.abs(kernel).max(axis=(0, 1, 2)) * np.asarray(tops)).astype(dtype)
    kernel = kernel.astype(np.float64)
    text = SMALL_F16.format(t=element, k=_dense(kernel))
    out = bnfold.fold_source(text, options=options(quantize_weights=f"int{bits}",
                                                   quantize_granularity="per-channel"))
    assert len(out.report.quantized) == 1, out.report.table()
    [(q, scale, _)] = quantized_kernels(out.serialize().decode())
    scale = np.asarray(scale, np.float64).reshape(1, 1, 1, -1)
    qmax = 2 ** (bits - 1) - 1
    assert np.abs(q).max() <= qmax
    assert np.all(np.abs(q * scale - kernel) <= scale / 2), np.abs(q * scale - kernel).max()
    expected_q, expected_scale = reference(kernel, bits, 3, dtype)
    np.testing.assert_array_equal(q, expected_q)
    np.testing.assert_array_equal(scale.reshape(-1), expected_scale)
    fake = fake_quantized(expected_q, expected_scale, 3, dtype)
    xs = [rng.normal(0, 1, (1, 4, 4, 16)).astype(dtype)]
    expected = numerics.run_xla(with_kernels(text, [fake]), xs)
    np.testing.assert_array_equal(numerics.run_xla(out.serialize().decode(), xs)[0], expected[0])


# --- bias correction: E[(W_q - W) x] ---------------------------------------------------------------

LAYER2 = """
func.func @main(%x: tensor<1x{h}x{h}x1xf64>) -> tensor<1x{out}xf64> {{
  %k1 = stablehlo.constant dense<{k1}> : tensor<1x1x1x{c}xf64>
  %y0 = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<1x{h}x{h}x1xf64>, tensor<1x1x1x{c}xf64>) -> tensor<1x{h}x{h}x{c}xf64>
  %g = stablehlo.constant dense<{gamma}> : tensor<{c}xf64>
  %b = stablehlo.constant dense<{beta}> : tensor<{c}xf64>
  %m = stablehlo.constant dense<0.0> : tensor<{c}xf64>
  %v = stablehlo.constant dense<1.0> : tensor<{c}xf64>
  %y = "stablehlo.batch_norm_inference"(%y0, %g, %b, %m, %v) {{epsilon = 0.0 : f32, feature_index = 3 : i64}} : (tensor<1x{h}x{h}x{c}xf64>, tensor<{c}xf64>, tensor<{c}xf64>, tensor<{c}xf64>, tensor<{c}xf64>) -> tensor<1x{h}x{h}x{c}xf64>
  %zero = stablehlo.constant dense<0.0> : tensor<1x{h}x{h}x{c}xf64>
  %r = stablehlo.maximum %y, %zero : tensor<1x{h}x{h}x{c}xf64>
{pad}
  %k2 = stablehlo.constant dense<{k2}> : tensor<{k2_type}xf64>
  %z = stablehlo.convolution(%p, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{{window}}} {{batch_group_count = 1 : i64, feature_group_count = {groups} : i64}} : (tensor<1x{hp}x{hp}x{c}xf64>, tensor<{k2_type}xf64>) -> tensor<1x{out}xf64>
  return %z : tensor<1x{out}xf64>
}}
"""


def relu_mean(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """E[max(X, 0)], X ~ N(mu, sigma^2): mu Phi(mu / sigma) + sigma phi(mu / sigma)."""
    z = mu / sigma
    cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in z])
    return mu * cdf + sigma * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)


@st.composite
def layer2_cases(draw):
    c = draw(st.sampled_from([2, 3, 4]))
    h = draw(st.integers(3, 7))
    k = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 2))
    rhs_dilation = draw(st.integers(1, 2))
    lhs_dilation = draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    explicit = [draw(st.integers(0, 1)) for _ in range(2)]  # an explicit zero pad first
    depthwise = draw(st.booleans())
    cout = c if depthwise else draw(st.sampled_from([1, 3]))
    return c, h, k, stride, rhs_dilation, lhs_dilation, pads, explicit, depthwise, cout


def layer2_module(rng, case) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, str]:
    c, h, k, stride, rhs_dilation, lhs_dilation, pads, explicit, depthwise, cout = case
    gamma, beta = rng.uniform(0.3, 2.0, c), rng.normal(0, 1.5, c)
    k2 = rng.normal(0, 1, (k, k, 1 if depthwise else c, cout))
    hp = h + explicit[0] + explicit[1]
    pad = (f"  %p = stablehlo.pad %r, %pz, low = [0, {explicit[0]}, {explicit[0]}, 0], high = "
           f"[0, {explicit[1]}, {explicit[1]}, 0], interior = [0, 0, 0, 0] : "
           f"(tensor<1x{h}x{h}x{c}xf64>, tensor<f64>) -> tensor<1x{hp}x{hp}x{c}xf64>")
    pad = "  %pz = stablehlo.constant dense<0.0> : tensor<f64>\n" + pad
    window = (f"stride = [{stride}, {stride}], pad = [[{pads[0]}, {pads[1]}], [{pads[2]}, "
              f"{pads[3]}]], lhs_dilate = [{lhs_dilation}, {lhs_dilation}], rhs_dilate = "
              f"[{rhs_dilation}, {rhs_dilation}]")
    dilated = (hp - 1) * lhs_dilation + 1
    span = (k - 1) * rhs_dilation + 1

    def size(lo: int, hi: int) -> int:
        return (dilated + lo + hi - span) // stride + 1

    oh, ow = size(pads[0], pads[1]), size(pads[2], pads[3])
    if oh < 1 or ow < 1:
        return "", gamma, beta, k2, ""
    text = LAYER2.format(h=h, c=c, hp=hp, k1=np.ones((1, 1, 1, c)).tolist(), gamma=gamma.tolist(),
                         beta=beta.tolist(), k2=k2.tolist(), k2_type="x".join(map(str, k2.shape)),
                         window=window, groups=c if depthwise else 1, pad=pad,
                         out=f"{oh}x{ow}x{cout}")
    return text, gamma, beta, k2, window


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=layer2_cases(), seed=st.integers(0, 2 ** 16))
def test_bias_correction_is_the_expected_shift_with_the_border_share(case, seed):
    """E[conv(x)] over the output positions for E[x] = E[relu(N(beta, gamma^2))] per channel,
    zero padding (the layer's own, an explicit pad, lhs_dilation holes) read as zeros."""
    rng = np.random.default_rng(seed)
    text, gamma, beta, k2, _ = layer2_module(rng, case)
    assume(bool(text))  # an empty output: nothing to correct
    out = bnfold.fold_source(text, options=options(quantize_weights="int4", bias_correction=True))
    layer2 = out.report.quantized[-1]
    assert layer2.bias_correction["applied"], out.report.table()
    q, scale, _ = quantized_kernels(out.serialize().decode())[-1]
    error = q * scale - k2  # the error kernel, as the quantized module computes with it
    mean_image = np.broadcast_to(relu_mean(beta, gamma), (1, *text_shape(text), gamma.size))
    shift_text = text[text.index("func.func"):].replace(
        "tensor<1x{0}x{0}x1xf64>".format(mean_image.shape[1]), "tensor<1x1x1x1xf64>", 1)
    expected = conv_mean(text, mean_image, error)
    np.testing.assert_allclose(layer2.params["bias_shift"], expected, rtol=1e-9, atol=1e-12)
    del shift_text


def text_shape(text: str) -> tuple[int, int]:
    line = next(l for l in text.splitlines() if "%r = stablehlo.maximum" in l)
    dims = line.rsplit("tensor<", 1)[1].split("x")
    return int(dims[1]), int(dims[2])


def conv_mean(text: str, mean_image: np.ndarray, error: np.ndarray) -> np.ndarray:
    """Layer 2's pad and convolution, with the error kernel, on the mean image (XLA), averaged
    over the output positions: E[conv(x)] = conv(E[x]) exactly."""
    start = text.index("  %pz =")
    body = text[start:text.index("  return")]
    body = body.replace(body[body.index("  %k2 ="):body.index("\n", body.index("  %k2 =")) + 1],
                        "")
    h, w = mean_image.shape[1:3]
    c = mean_image.shape[3]
    head = (f"func.func @main(%r: tensor<1x{h}x{w}x{c}xf64>, %k2: "
            f"tensor<{'x'.join(map(str, error.shape))}xf64>) -> ")
    result = body.rsplit("-> ", 1)[1].strip()
    module = head + result + " {\n" + body + f"  return %z : {result}\n}}\n"
    (z,) = numerics.run_xla(module, [np.ascontiguousarray(mean_image), error])
    return z.reshape(-1, z.shape[-1]).mean(axis=0)


SPREAD = """
func.func @main(%x: tensor<{n}x1x1x{c}xf64>) -> tensor<{n}x1x1x{out}xf64> {{
  %k1 = stablehlo.constant dense<1.0> : tensor<1x1x1x{c}xf64>
  %y0 = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = {c} : i64}} : (tensor<{n}x1x1x{c}xf64>, tensor<1x1x1x{c}xf64>) -> tensor<{n}x1x1x{c}xf64>
  %g = stablehlo.constant dense<{gamma}> : tensor<{c}xf64>
  %b = stablehlo.constant dense<{beta}> : tensor<{c}xf64>
  %m = stablehlo.constant dense<{mean}> : tensor<{c}xf64>
  %v = stablehlo.constant dense<{var}> : tensor<{c}xf64>
{norm}
  %zero = stablehlo.constant dense<0.0> : tensor<{n}x1x1x{c}xf64>
  %r = stablehlo.maximum %y, %zero : tensor<{n}x1x1x{c}xf64>
  %k2 = stablehlo.constant dense<{k2}> : tensor<1x1x{c}x{out}xf64>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<{n}x1x1x{c}xf64>, tensor<1x1x{c}x{out}xf64>) -> tensor<{n}x1x1x{out}xf64>
  return %z : tensor<{n}x1x1x{out}xf64>
}}
"""


SPREAD_NORMS = {
    "batch_norm_inference": '  %y = "stablehlo.batch_norm_inference"(%y0, %g, %b, %m, %v) {{epsilon = '
    '1.0e-03 : f32, feature_index = 3 : i64}} : ({t}, tensor<{c}xf64>, tensor<{c}xf64>, '
    'tensor<{c}xf64>, tensor<{c}xf64>) -> {t}',
    # Flax's spelling: (y - mean) * (gamma * rsqrt(var + eps)) + beta
    "decomposed": """  %mb = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<{c}xf64>) -> {t}
  %centered = stablehlo.subtract %y0, %mb : {t}
  %eps = stablehlo.constant dense<1.0e-03> : tensor<{c}xf64>
  %ve = stablehlo.add %v, %eps : tensor<{c}xf64>
  %inv = stablehlo.rsqrt %ve : tensor<{c}xf64>
  %s = stablehlo.multiply %g, %inv : tensor<{c}xf64>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<{c}xf64>) -> {t}
  %scaled = stablehlo.multiply %centered, %sb : {t}
  %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<{c}xf64>) -> {t}
  %y = stablehlo.add %scaled, %bb : {t}""",
}


@pytest.mark.parametrize("form", sorted(SPREAD_NORMS))
def test_bias_correction_uses_the_spread_the_statistics_imply(form):
    """A batch norm whose statistics are (mean, var) sees inputs N(mean, var): its output
    spreads gamma * sqrt(var / (var + eps)), 0.03 gamma for var 1e-6 and eps 1e-3 (issue
    31). Judged by Monte-Carlo on XLA: inputs drawn from N(mean, var) per channel, the
    quantized layer 2's mean output shift against the original's, with and without the
    correction; the correction must take it back up to the samples' own noise."""
    rng = np.random.default_rng(31)
    c, out, n = 3, 4, 200_000
    gamma, beta = np.array([1.0, 0.8, 1.2]), np.array([0.0, 0.1, -0.2])
    mean, var = np.array([0.5, -1.0, 2.0]), np.array([1e-6, 1e-4, 1e-2])
    k2 = rng.normal(0, 1, (1, 1, c, out))
    norm = SPREAD_NORMS[form].format(t=f"tensor<{n}x1x1x{c}xf64>", c=c)
    text = SPREAD.format(n=n, c=c, out=out, gamma=_dense(gamma)[6:-1], beta=_dense(beta)[6:-1],
                         mean=_dense(mean)[6:-1], var=_dense(var)[6:-1], k2=_dense(k2)[6:-1],
                         norm=norm)
    x = (mean + np.sqrt(var) * rng.normal(0, 1, (n, 1, 1, c)))
    (expected,) = numerics.run_xla(text, [x])

    def shift(**kwargs) -> np.ndarray:
        # per channel: layer 1's one weight per channel is exact (q = 7), layer 2 moves
        module = bnfold.fold_source(text, options=options(
            quantize_weights="int4", quantize_granularity="per-channel", **kwargs))
        (actual,) = numerics.run_xla(module.serialize().decode(), [x])
        return (actual - expected).reshape(n, out).mean(axis=0)

    plain, corrected = shift(), shift(bias_correction=True)
    assert np.all(np.abs(plain) > 1e-3), plain  # int4: a shift worth taking back
    # the samples' noise: |W_q - W| times the spread of relu(y), over sqrt(n), is < 1e-4
    np.testing.assert_allclose(corrected, 0.0, atol=0.02 * float(np.max(np.abs(plain))))


def test_bias_correction_refuses_without_statistics_and_says_why():
    """The stem reads the model's input; a layer after a max pool, or after a ReLU of a
    residual sum, has no known mean: they are quantized uncorrected, with the reason
    (report, JSON, text)."""
    text = (support.MODELS / "haiku_resnet_nhwc.mlir").read_text()
    report = bnfold.fold_source(text, options=options(quantize_weights="int8",
                                                      bias_correction=True)).report
    corrections = [q.bias_correction for q in report.quantized]
    reasons = [c["reason"] for c in corrections if not c["applied"]]
    assert any(c["applied"] for c in corrections), report.table()
    assert "function argument" in corrections[0]["reason"]  # the stem
    assert any("maximum pool" in r and "stablehlo.reduce_window at" in r for r in reasons), reasons
    assert any("a pool or a sum came first" in r for r in reasons), reasons
    assert {c["code"] for c in corrections if not c["applied"]} == {"no-statistics"}
    assert "not applied (no-statistics)" in report.table()
    data = json.loads(report.dumps())
    assert data["quantized"][0]["bias_correction"]["applied"] is False


MEANLESS = """
func.func @main(%x: tensor<1x4x4x3xf32>) -> tensor<1x4x4x2xf32> {{
  %k1 = stablehlo.constant dense<[[[[0.5, -1.0, 0.25], [1.5, 0.75, -0.5], [-0.25, 1.0, 2.0]]]]> : tensor<1x1x3x3xf32>
  %y = stablehlo.convolution(%x, %k1) {conv} : (tensor<1x4x4x3xf32>, tensor<1x1x3x3xf32>) -> tensor<1x4x4x3xf32>
  %m = stablehlo.constant dense<[0.3, -0.2, 0.1]> : tensor<3xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<3xf32>) -> tensor<1x4x4x3xf32>
  %c = {centered}
  %v = stablehlo.constant dense<[1.5, 0.5, 2.0]> : tensor<3xf32>
  %eps = stablehlo.constant dense<1.0e-03> : tensor<3xf32>
  %ve = stablehlo.add %v, %eps : tensor<3xf32>
  %inv = stablehlo.rsqrt %ve : tensor<3xf32>
  %g = stablehlo.constant dense<[1.0, 0.8, 1.2]> : tensor<3xf32>
  %s = stablehlo.multiply %inv, %g : tensor<3xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<3xf32>) -> tensor<1x4x4x3xf32>
  %n = stablehlo.multiply %c, %sb : tensor<1x4x4x3xf32>
  %b = stablehlo.constant dense<[0.5, -0.1, 0.2]> : tensor<3xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<3xf32>) -> tensor<1x4x4x3xf32>
  %o = stablehlo.add %n, %bb : tensor<1x4x4x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x4x4x3xf32>
  %r = stablehlo.maximum %o, %zero : tensor<1x4x4x3xf32>
  %k2 = stablehlo.constant dense<[[[[0.3, -0.7], [1.1, 0.2], [-0.4, 0.9]]]]> : tensor<1x1x3x2xf32>
  %z = stablehlo.convolution(%r, %k2) {conv} : (tensor<1x4x4x3xf32>, tensor<1x1x3x2xf32>) -> tensor<1x4x4x2xf32>
  return %z : tensor<1x4x4x2xf32>
}}
"""


@pytest.mark.parametrize("centered", [True, False], ids=["with-mean", "without-mean"])
def test_a_batch_norm_without_a_mean_states_no_mean_and_says_so(centered):
    """`y * rsqrt(var + eps) * gamma + c` folds, but says nothing of its output's mean: c is
    beta for a zero mean, or beta - mean * gamma * rsqrt(var + eps) where an exporter merged
    them -- the same constants. The layer after it is quantized uncorrected, and the report
    names the batch norm without a mean (not 'no folded batch norm'); with `y - mean` first,
    the same module is corrected."""
    text = MEANLESS.format(conv=STACK_CONV, centered="stablehlo.subtract %y, %mb : "
                           "tensor<1x4x4x3xf32>" if centered else
                           "stablehlo.convert %y : tensor<1x4x4x3xf32>")
    out = bnfold.fold_source(text, options=options(quantize_weights="int4", bias_correction=True))
    assert len(out.report.folds) == 1, out.report.table()
    layer2 = out.report.quantized[1].bias_correction
    if centered:
        assert layer2["applied"], layer2
        return
    assert not layer2["applied"] and layer2["code"] == "no-statistics", layer2
    assert "states no mean" in layer2["reason"] and "fold0" in layer2["reason"], layer2["reason"]
    assert "stablehlo.convolution at" in layer2["reason"], layer2["reason"]


def test_high_bias_absorption_names_the_batch_norm_without_a_mean():
    """Absorption needs layer 1's pre-activation mean (beta - 3 gamma): after a batch norm
    without a mean it is refused, and the reason says why rather than 'no batch norm'."""
    text = MEANLESS.format(conv=STACK_CONV, centered="stablehlo.convert %y : tensor<1x4x4x3xf32>")
    report = bnfold.fold_source(text, options=options(equalize=True, absorb_high_bias=True)).report
    (link,) = report.equalized[0].high_bias
    assert not link["absorbed"] and link["code"] == "no-statistics", link
    assert "layer 1: the batch norm folded into it (fold0) states no mean" in link["reason"], link


# --- the measured gain ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobilenet():
    import jax

    net = quantnet.mobilenet(seed=0)
    xs = quantnet.inputs(7, 64)
    return net.stablehlo(batch=len(xs)), xs, np.asarray(jax.jit(net.forward)(xs))


def _sqnr(text: str, xs: np.ndarray, expected: np.ndarray, **kwargs) -> float:
    module = bnfold.fold_source(text, options=options(**kwargs)).serialize().decode()
    return quantnet.sqnr_db(numerics.run_xla(module, [xs])[0], expected)


def test_bias_correction_raises_the_output_sqnr_of_a_calibrated_mobilenet(mobilenet):
    """Measured (not a bnfold rule): per-tensor int8 after equalization, with and without
    the analytic correction, against the float network's outputs (XLA)."""
    text, xs, expected = mobilenet
    plain = _sqnr(text, xs, expected, equalize=True, quantize_weights="int8")
    corrected_ = _sqnr(text, xs, expected, equalize=True, quantize_weights="int8",
                       bias_correction=True)
    assert plain > 15.0  # equalization did its part
    assert corrected_ > plain + 0.5, (plain, corrected_)  # measured: 21.5 -> 22.6 dB


def _biases(text: str) -> list[np.ndarray]:
    """The constant each producer's bias add puts after it (float64), in program order."""
    context, module = support.parse(text)
    found = []
    with context:
        for op in _producers(module):
            (use,) = list(op.results[0].uses)
            add = use.owner if isinstance(use.owner, bir.ir.Operation) else use.owner.operation
            assert add.name == "stablehlo.add", add
            (value,) = [v for v in add.operands if v != op.results[0]]
            while _constant(value) is None:
                value = _defining(value).operands[0]  # broadcast_in_dim, reshape
            found.append(np.asarray(_constant(value), np.float64).reshape(-1))
    return found


def _assumed_input_means(net: quantnet.Net, n: int, rng) -> list[np.ndarray | None]:
    """Per producer in program order, the mean of its input per channel over `n` samples
    drawn from what the correction assumes: each batch norm's pre-activation N(beta,
    gamma^2 var / (var + eps)) per channel, through the network's own ops (ReLU6,
    residual sums, the mean pool's sum) in numpy. None for the stem (the model's input)."""
    def out(conv: quantnet.Conv) -> np.ndarray:
        spread = np.abs(conv.gamma) * np.sqrt(conv.var / (conv.var + quantnet.EPS))
        z = conv.beta + spread * rng.standard_normal((n, conv.beta.size))
        return np.clip(z, 0.0, 6.0) if conv.relu6 else z

    means: list[np.ndarray | None] = [None]
    y = out(net.stem)
    for expand, depthwise, project, residual in net.blocks:
        z = y
        if expand is not None:
            means.append(z.mean(axis=0))
            z = out(expand)
        means.append(z.mean(axis=0))
        z = out(depthwise)
        means.append(z.mean(axis=0))
        z = out(project)
        y = y + z if residual else z
    means.append(y.mean(axis=0))
    means.append(out(net.head).mean(axis=0))  # the mean pool: times its taps below
    return means


def _data_input_means(net: quantnet.Net, xs: np.ndarray) -> list[np.ndarray | None]:
    """Per producer in program order, its float input averaged over the inputs `xs` (the
    network's own forward pass in float64 on XLA): an image per convolution, a vector for
    the dense layer (the mean pool's sum). None for the stem."""
    import jax
    import jax.numpy as jnp

    found: list[np.ndarray | None] = [None]

    def layer(conv: quantnet.Conv, x: jax.Array) -> jax.Array:
        found.append(np.asarray(jnp.mean(x, axis=0, keepdims=True)))
        return quantnet._layer(conv, x)

    with jax.enable_x64():
        y = quantnet._layer(net.stem, jnp.asarray(xs, jnp.float64))
        for expand, depthwise, project, residual in net.blocks:
            z = layer(expand, y) if expand is not None else y
            z = layer(project, layer(depthwise, z))
            y = y + z if residual else z
        head = layer(net.head, y)
        found.append(np.asarray(jnp.mean(jnp.sum(head, axis=(1, 2)), axis=0)))
    return found


@pytest.mark.parametrize("source", ["assumed", "data"])
def test_each_corrected_layer_takes_back_its_own_shift(source):
    """Issue 31: for every corrected layer of the calibrated MobileNet, its own mean
    output shift, (W_q - W) x averaged over inputs x and over the output positions (XLA:
    the convolution of the mean input image with the error kernel, zero padding
    included), must go down once the corrected bias is in (the bias the corrected module
    adds minus the plain one's). `assumed`: x drawn from the statistics the correction
    assumed (numpy through the network's ops), which it must take back up to the
    samples' noise; `data`: x the layer's float input on 64 inputs from the distribution
    the batch norms were calibrated on, where the normal model is an approximation.
    Per-tensor int8 without equalization: the kernels and statistics are the network's."""
    import jax
    import jax.numpy as jnp

    net = quantnet.mobilenet(seed=0)
    text = net.stablehlo(batch=1)
    plain = bnfold.fold_source(text, options=options(quantize_weights="int8"))
    corrected = bnfold.fold_source(text, options=options(quantize_weights="int8",
                                                         bias_correction=True))
    plain_text, corrected_text = plain.serialize().decode(), corrected.serialize().decode()
    floats = float_kernels(bnfold.fold_source(text).serialize().decode())
    quantized = quantized_kernels(plain_text)
    taken = [p - c for p, c in zip(_biases(plain_text), _biases(corrected_text), strict=True)]
    means = _assumed_input_means(net, 50_000, np.random.default_rng(31)) \
        if source == "assumed" else _data_input_means(net, quantnet.inputs(7, 64))
    convs = [net.stem] + [c for e, d, p, _ in net.blocks for c in (e, d, p) if c is not None] \
        + [net.head]
    context, module = support.parse(plain_text)
    with context:
        shapes = [tuple(bir.ir.RankedTensorType(op.operands[0].type).shape)
                  for op in _producers(module)]
        (reduce_,) = [_defining(op.operands[0]) for op in _producers(module)][-1:]
        assert reduce_.name == "stablehlo.reduce"  # the dense reads the sum of the pool
        taps = int(np.prod(bir.ir.RankedTensorType(reduce_.operands[0].type).shape[1:3]))
    assert len(floats) == len(quantized) == len(means) == len(convs) + 1
    rows = []
    for k, ((_, _, kernel), (q, scale, _)) in enumerate(zip(floats, quantized, strict=True)):
        if means[k] is None:
            assert not np.any(taken[k]), "the stem reads the model's input"
            continue
        error = (q.astype(np.float32) * np.float32(scale)).astype(np.float64) - kernel
        if k < len(convs):
            conv = convs[k]
            image = np.broadcast_to(means[k], (1, *shapes[k][1:]))  # per position: data
            with jax.enable_x64():
                y = jax.lax.conv_general_dilated(
                    jnp.asarray(image), jnp.asarray(error), (conv.stride, conv.stride), "SAME",
                    dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=conv.groups)
            shift = np.asarray(y).reshape(-1, error.shape[-1]).mean(axis=0)
        else:
            shift = (means[k] * (taps if source == "assumed" else 1)) @ error
        before = float(np.sqrt(np.mean(shift ** 2)))
        after = float(np.sqrt(np.mean((shift - taken[k]) ** 2)))
        rows.append((k, before, after))
    assert len(rows) == len(floats) - 1  # every layer but the stem is corrected
    # What each E[x] rests on: an expand or head convolution reads a projection (or a
    # residual sum of them) -- the batch norms' means, by linearity; the others read a
    # ReLU6 (the depthwise after block 0's stem too), whose mean is the normal model's.
    expands = {id(e) for e, _, _, _ in net.blocks if e is not None}
    linear = [id(conv) in expands or conv is net.head for conv in convs]
    bases = [q.bias_correction.get("basis") for q in corrected.report.quantized]
    assert bases == [None] + ["linear" if x else "normal" for x in linear[1:]] + ["normal"], bases
    if source == "assumed":  # the samples' own noise is a few 1e-3 of the shift
        assert all(after < 0.05 * before for _, before, after in rows), rows
    else:  # measured: 2-31% of the uncorrected shift is left
        assert all(after < before for _, before, after in rows), rows


def test_the_corrections_lower_the_mean_output_shift_of_the_calibrated_mobilenet(mobilenet):
    """End to end on XLA, per-tensor int8 after equalization: the mean over the inputs of
    the output error (quantized minus float, per class) goes down with the correction."""
    text, xs, expected = mobilenet
    shifts = []
    for correct in (False, True):
        module = bnfold.fold_source(text, options=options(
            equalize=True, quantize_weights="int8", bias_correction=correct))
        actual = numerics.run_xla(module.serialize().decode(), [xs])[0]
        shift = np.mean(np.asarray(actual, np.float64) - expected, axis=0)
        shifts.append(float(np.sqrt(np.mean(shift ** 2))))
    assert shifts[1] < 0.9 * shifts[0], shifts  # measured: 1.56e-2 -> 1.27e-2


# --- the walk back to the batch norms: its limits and what it names --------------------------

STACK_CONV = ("dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} "
              "{batch_group_count = 1 : i64, feature_group_count = 1 : i64}")


def _dense(values: np.ndarray) -> str:
    return "dense<" + np.array2string(values, separator=", ", threshold=10 ** 6,
                                      floatmode="unique").replace("\n", "") + ">"


def stack_module(layers: int, between: str = "", seed: int = 0) -> str:
    """`layers` 1x1 conv + batch_norm_inference + ReLU6 layers in a row (4 channels, f32);
    `between` (ops on %in -> %out, `T` for the type) sits after layer 1's ReLU6."""
    rng = np.random.default_rng(seed)
    t = "tensor<1x4x4x4xf32>"
    lines = [f"func.func @main(%x: {t}) -> {t} {{",
             f"  %zero = stablehlo.constant dense<0.0> : {t}",
             f"  %six = stablehlo.constant dense<6.0> : {t}"]
    prev = "%x"
    for i in range(layers):
        k = rng.normal(0, 0.5, (1, 1, 4, 4)).astype(np.float32)
        g, b = rng.uniform(0.5, 1.5, 4).astype(np.float32), rng.normal(0.5, 0.5, 4).astype(np.float32)
        m, v = rng.normal(0, 0.3, 4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
        lines += [f"  %k{i} = stablehlo.constant {_dense(k)} : tensor<1x1x4x4xf32>",
                  f"  %y{i} = stablehlo.convolution({prev}, %k{i}) {STACK_CONV} : "
                  f"({t}, tensor<1x1x4x4xf32>) -> {t}"]
        for name, vec in (("g", g), ("b", b), ("m", m), ("v", v)):
            lines.append(f"  %{name}{i} = stablehlo.constant {_dense(vec)} : tensor<4xf32>")
        lines += [f'  %n{i} = "stablehlo.batch_norm_inference"(%y{i}, %g{i}, %b{i}, %m{i}, %v{i}) '
                  f"{{epsilon = 1.0e-03 : f32, feature_index = 3 : i64}} : ({t}, tensor<4xf32>, "
                  f"tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> {t}",
                  f"  %r{i} = stablehlo.clamp %zero, %n{i}, %six : {t}"]
        prev = f"%r{i}"
        if i == 0 and between:
            lines.append(between.replace("%in", prev).replace("T", t))
            prev = "%out"
    lines += [f"  return {prev} : {t}", "}"]
    return "\n".join(lines) + "\n"


def _corrections(text: str) -> list[dict]:
    report = bnfold.fold_source(text, options=options(quantize_weights="int8",
                                                      bias_correction=True)).report
    return [q.bias_correction for q in report.quantized]


def test_bias_correction_walks_a_deep_stack_layer_by_layer():
    """Each layer's walk is short (ReLU6 -> bias -> the previous conv), however many layers
    came before: all 200 layers but the stem are corrected (the depth limit is per walk,
    not per run)."""
    found = _corrections(stack_module(200))
    assert [c["applied"] for c in found] == [False] + [True] * 199, \
        [c["reason"] for c in found if not c["applied"]][:3]


def test_bias_correction_stops_at_its_depth_limit_and_says_so():
    """170 transposes (each with a mean law, none foldable) between two layers: the walk
    gives up past 160 ops with code `limit`, not a wrong mean and not a crash."""
    swap = "dims = [0, 2, 1, 3] : (T) -> T"
    chain = [f"  %a0 = stablehlo.transpose %in, {swap}"]
    chain += [f"  %a{i} = stablehlo.transpose %a{i - 1}, {swap}" for i in range(1, 169)]
    chain.append(f"  %out = stablehlo.transpose %a168, {swap}")
    found = _corrections(stack_module(2, "\n".join(chain)))
    assert not found[1]["applied"] and found[1]["code"] == "limit", found[1]
    assert "more than 160 ops" in found[1]["reason"]


def _layer2(text: str) -> tuple[dict, np.ndarray]:
    out = bnfold.fold_source(text, options=options(quantize_weights="int8", bias_correction=True))
    layer2 = out.report.quantized[1]
    assert layer2.bias_correction["applied"], layer2.bias_correction
    return layer2.bias_correction, layer2.params["bias_shift"]


def test_what_a_mean_rests_on_survives_layout_scales_and_sums():
    """Between layer 1's ReLU6 and layer 2: two transposes keep the activation's mean (the
    normal model's); ReLU6 plus half its own |.| is a sum of two values (no longer a
    clipped normal) whose mean is still exact by linearity: 1.5 E[relu6]. Layer 2's kernel
    is quantized the same way in each module, so its shift is linear in E[x]
    (E[(W_q - W) x] = (W_q - W) E[x]): the same shift, and 1.5 times it."""
    plain, shift = _layer2(stack_module(2))
    swap = "dims = [0, 2, 1, 3] : (T) -> T"
    moved, moved_shift = _layer2(stack_module(2, f"  %a = stablehlo.transpose %in, {swap}\n"
                                                  f"  %out = stablehlo.transpose %a, {swap}"))
    half = "stablehlo.constant dense<0.5> : T"
    summed, summed_shift = _layer2(stack_module(2, "  %a = stablehlo.abs %in : T\n"
                                                   f"  %h = {half}\n"
                                                   "  %s = stablehlo.multiply %a, %h : T\n"
                                                   "  %out = stablehlo.add %in, %s : T"))
    assert plain["basis"] == moved["basis"] == "normal", (plain, moved)
    assert summed["basis"] == "normal", summed  # the sum of two activations' means
    np.testing.assert_allclose(moved_shift, shift, rtol=1e-12)
    np.testing.assert_allclose(summed_shift, 1.5 * shift, rtol=1e-6)


def test_bias_correction_names_the_op_it_cannot_see_through():
    """An op without a law (a sigmoid) between two layers: the reason names it and where."""
    found = _corrections(stack_module(2, "  %out = stablehlo.logistic %in : T"))
    assert not found[1]["applied"] and found[1]["code"] == "no-law", found[1]
    assert "stablehlo.logistic at" in found[1]["reason"], found[1]["reason"]
    assert "no mean law" in found[1]["reason"] and "homogeneous" not in found[1]["reason"]
