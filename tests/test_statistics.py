"""Statistics recovery (bnfold.statistics): the *values* of gamma, beta, mean,
variance and epsilon recovered from each decomposed spelling, with and without a
producer bias before the batch norm, in float64 so the comparison is exact.

High-bias absorption moves `beta - 3|gamma|` (after the bias and the equalization
scale): a recovery that ignores the producer's bias moves the wrong amount, so the
absorbed amount is checked against the statistics the module was built with.
"""

from __future__ import annotations

import numpy as np
import pytest

import bnfold

GAMMA = np.array([1.5, -0.75, 0.5])
BETA = np.array([8.0, 0.25, 6.0])
MEAN = np.array([0.5, -1.0, 2.0])
VAR = np.array([0.25, 2.0, 1.0])
EPS = 1e-3
BIAS = np.array([0.125, -0.5, 1.0])  # the producer's own bias, added before the batch norm
T = "tensor<1x4x4x3xf64>"


def vec(values: np.ndarray) -> str:
    return "dense<[" + ", ".join(repr(float(v)) for v in values) + "]> : tensor<3xf64>"


def bcast(name: str, values: np.ndarray) -> str:
    return (f"  %{name}_v = stablehlo.constant {vec(values)}\n"
            f"  %{name} = stablehlo.broadcast_in_dim %{name}_v, dims = [3] : (tensor<3xf64>) -> {T}\n")


def eps_b(name: str = "eps") -> str:
    return (f"  %{name}_s = stablehlo.constant dense<{EPS}> : tensor<f64>\n"
            f"  %{name} = stablehlo.broadcast_in_dim %{name}_s, dims = [] : (tensor<f64>) -> {T}\n")


# Each form: the chain from %y (the producer's result, after its bias) to %out.
FORMS = {
    "flax": (bcast("m", MEAN) + bcast("v", VAR) + eps_b() + bcast("g", GAMMA) + bcast("b", BETA) +
             f"  %c = stablehlo.subtract %y, %m : {T}\n  %ve = stablehlo.add %v, %eps : {T}\n"
             f"  %r = stablehlo.rsqrt %ve : {T}\n  %s = stablehlo.multiply %r, %g : {T}\n"
             f"  %n = stablehlo.multiply %c, %s : {T}\n  %out = stablehlo.add %n, %b : {T}\n"),
    "equinox": (bcast("m", MEAN) + bcast("v", VAR) + eps_b() + bcast("g", GAMMA) + bcast("b", BETA) +
                f"  %c = stablehlo.subtract %y, %m : {T}\n  %ve = stablehlo.add %v, %eps : {T}\n"
                f"  %sd = stablehlo.sqrt %ve : {T}\n  %d = stablehlo.divide %c, %sd : {T}\n"
                f"  %n = stablehlo.multiply %d, %g : {T}\n  %out = stablehlo.add %n, %b : {T}\n"),
    "keras": (bcast("m", MEAN) + bcast("v", VAR) + eps_b() + bcast("g", GAMMA) + bcast("b", BETA) +
              f"  %ve = stablehlo.add %v, %eps : {T}\n  %r = stablehlo.rsqrt %ve : {T}\n"
              f"  %s = stablehlo.multiply %r, %g : {T}\n  %nm = stablehlo.negate %m : {T}\n"
              f"  %ms = stablehlo.multiply %nm, %s : {T}\n  %t = stablehlo.add %ms, %b : {T}\n"
              f"  %n = stablehlo.multiply %y, %s : {T}\n  %out = stablehlo.add %n, %t : {T}\n"),
}


def module(form: str, bias: bool) -> str:
    lines = bcast("bias", BIAS) + f"  %y = stablehlo.add %conv, %bias : {T}\n" if bias else \
        f"  %y = stablehlo.convert %conv : {T}\n"
    return f"""
func.func @main(%x: tensor<1x4x4x2xf64>) -> {T} {{
  %k = stablehlo.constant dense<[[[[0.5, -1.0, 0.25], [2.0, 0.75, -0.5]]]]> : tensor<1x1x2x3xf64>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<1x4x4x2xf64>, tensor<1x1x2x3xf64>) -> {T}
{lines}{FORMS[form]}  return %out : {T}
}}
"""


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "producer_bias"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_recovered_statistics_are_the_ones_the_model_was_built_with(form, bias):
    _, report = bnfold.fold_text(module(form, bias), bnfold.FoldOptions(statistics=True))
    [fold] = report.folds
    params = fold.params
    np.testing.assert_allclose(params["mean"], MEAN, rtol=1e-12)
    np.testing.assert_allclose(params["variance"], VAR, rtol=1e-12)
    np.testing.assert_allclose(params["epsilon"], np.full(3, EPS), rtol=1e-12)
    np.testing.assert_allclose(params["gamma"], GAMMA, rtol=1e-12)
    np.testing.assert_allclose(params["beta"], BETA, rtol=1e-12)
    # and the composed affine on the producer's output (the bias included)
    scale = GAMMA / np.sqrt(VAR + EPS)
    np.testing.assert_allclose(params["scale"], scale, rtol=1e-12)
    np.testing.assert_allclose(params["shift"], (BIAS * bias - MEAN) * scale + BETA, rtol=1e-12)


RELU_TO_LAYER_2 = f"""
  %zero = stablehlo.constant dense<0.0> : {T}
  %a = stablehlo.maximum %out, %zero : {T}
  %k2 = stablehlo.constant dense<[[[[1.0, -0.5], [0.25, 2.0], [-1.0, 0.5]]]]> : tensor<1x1x3x2xf64>
  %z = stablehlo.convolution(%a, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : ({T}, tensor<1x1x3x2xf64>) -> tensor<1x4x4x2xf64>
  return %z : tensor<1x4x4x2xf64>
"""


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "producer_bias"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_high_bias_absorption_moves_beta_minus_three_gamma(form, bias):
    """The pre-activation is N(beta, gamma^2) whatever the producer's bias (the batch
    norm sees conv + bias); absorption moves max(0, beta - 3|gamma|) / s per channel."""
    text = module(form, bias).replace(f"  return %out : {T}\n", RELU_TO_LAYER_2).replace(
        f"-> {T} {{", "-> tensor<1x4x4x2xf64> {", 1)
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(equalize=True, absorb_high_bias=True))
    [eq] = out.report.equalized
    [record] = eq.high_bias
    expected = np.maximum(0.0, BETA - 3 * np.abs(GAMMA)) / eq.params["scale0"]
    assert record["absorbed"], record
    assert record["channels"] == int(np.count_nonzero(expected))
    assert record["absorbed_max"] == pytest.approx(expected.max(), rel=1e-9)
    assert record["absorbed_mean"] == pytest.approx(expected.mean(), rel=1e-9)
