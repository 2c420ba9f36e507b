"""Weights a private helper computes (`@jax.jit def get_kernel(): return w * 2`).

bnfold evaluates constants through calls, so a fold can scale a kernel it reads through
`call @get_kernel()`. The helper, and the weights inside it, must then either go (its last
call gone) or be reported: while another call of it is still read, the fold's new kernel
is a copy (`shared_weight` in its record). Judged on the module text (constant bytes)
and on XLA against the original.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import bnfold
from numerics import check_close, run_xla

K = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 2, 4) / 8  # HWIO, 2 -> 4 channels


def _dense(array: np.ndarray) -> str:
    return "dense<" + np.array2string(array, separator=", ", max_line_width=10**6,
                                      floatmode="unique", threshold=10**6).replace("\n", "") + ">"


def _module(calls: int) -> str:
    """`calls` convolutions, each reading the kernel through its own call of @get_kernel and
    followed by its own per-channel scale and shift (a decomposed batch norm)."""
    body = []
    for i in range(calls):
        s = np.array([0.5, 2.0, 1.5, 0.75], np.float32) * (i + 1)
        body.append(f"""
  %k{i} = call @get_kernel() : () -> tensor<1x1x2x4xf32>
  %y{i} = stablehlo.convolution(%x, %k{i}) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : (tensor<1x3x3x2xf32>, tensor<1x1x2x4xf32>) -> tensor<1x3x3x4xf32>
  %s{i} = stablehlo.constant {_dense(s)} : tensor<4xf32>
  %sb{i} = stablehlo.broadcast_in_dim %s{i}, dims = [3] : (tensor<4xf32>) -> tensor<1x3x3x4xf32>
  %m{i} = stablehlo.multiply %y{i}, %sb{i} : tensor<1x3x3x4xf32>""")
    total = "%m0" if calls == 1 else "%sum"
    if calls == 2:
        body.append("  %sum = stablehlo.add %m0, %m1 : tensor<1x3x3x4xf32>")
    return f"""
func.func @main(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x4xf32> {{{''.join(body)}
  return {total} : tensor<1x3x3x4xf32>
}}
func.func private @get_kernel() -> tensor<1x1x2x4xf32> {{
  %w = stablehlo.constant {_dense(K)} : tensor<1x1x2x4xf32>
  %two = stablehlo.constant dense<2.0> : tensor<f32>
  %b = stablehlo.broadcast_in_dim %two, dims = [] : (tensor<f32>) -> tensor<1x1x2x4xf32>
  %k = stablehlo.multiply %w, %b : tensor<1x1x2x4xf32>
  return %k : tensor<1x1x2x4xf32>
}}
"""


def _kernel_bytes(text: str) -> int:
    return 4 * 8 * len(re.findall(r"stablehlo\.constant dense<[^\n]*> : tensor<1x1x2x4xf32>",
                                  text))


def _same_numbers(original: str, folded: str) -> None:
    x = np.random.default_rng(0).standard_normal((1, 3, 3, 2)).astype(np.float32)
    check_close(run_xla(folded, [x]), run_xla(original, [x]))


def test_a_helper_whose_last_call_a_fold_replaced_goes():
    """One call: the fold's new kernel replaces the helper's weights, so the helper goes
    (it stayed, uncalled, with the old weights: the module grew with nothing said)."""
    text = _module(1)
    folded, report = bnfold.fold_text(text)
    _same_numbers(text, folded)
    assert len(report.folds) == 1 and "@get_kernel" not in folded, folded
    assert _kernel_bytes(folded) == _kernel_bytes(text)
    assert report.to_json()["folds"][0].get("shared_weight") is None


def test_a_skipped_helper_stays():
    """`--skip-func get_kernel`: the helper is left as it is, even without a call."""
    text = _module(1)
    folded, report = bnfold.fold_text(text, bnfold.FoldOptions(skip_functions=["get_kernel"]))
    _same_numbers(text, folded)
    assert len(report.folds) == 1 and "func.func private @get_kernel" in folded


def test_a_helper_called_twice_is_copied_once_and_reported():
    """Two calls, two folds: the first fold's kernel is a copy while the other call keeps
    the helper (its record says so, with the bytes); the second replaces the last reader
    and the helper goes. The module grows by exactly what the report names."""
    text = _module(2)
    folded, report = bnfold.fold_text(text)
    _same_numbers(text, folded)
    folds = report.to_json()["folds"]
    copied = [f["shared_weight"] for f in folds if f.get("shared_weight")]
    assert len(folds) == 2 and len(copied) == 1, folds
    assert copied[0]["also_read_by"] == ["func.call"]
    assert "@get_kernel" not in folded
    assert _kernel_bytes(folded) - _kernel_bytes(text) == copied[0]["copied_bytes"] == 32


@pytest.mark.parametrize("calls", [1, 2])
def test_helper_weights_fold_to_a_fixpoint(calls):
    """Folding the output again changes nothing (no copy is reported twice)."""
    once, _ = bnfold.fold_text(_module(calls))
    twice, report = bnfold.fold_text(once)
    assert twice == once and not report.folds


SCALED_TWICE_CALLED = """
func.func @main(%x: tensor<3x2xf32>) -> (tensor<3x4xf32>, tensor<2x4xf32>) {
  %k = call @get_kernel() : () -> tensor<2x4xf32>
  %y = stablehlo.dot_general %x, %k, contracting_dims = [1] x [0] : (tensor<3x2xf32>, tensor<2x4xf32>) -> tensor<3x4xf32>
  %c = stablehlo.constant dense<0.5> : tensor<3x4xf32>
  %r = stablehlo.multiply %y, %c : tensor<3x4xf32>
  %again = call @get_kernel() : () -> tensor<2x4xf32>
  return %r, %again : tensor<3x4xf32>, tensor<2x4xf32>
}
func.func private @get_kernel() -> tensor<2x4xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]> : tensor<2x4xf32>
  return %w : tensor<2x4xf32>
}
"""


def test_a_scale_into_a_weight_another_call_reads_is_refused():
    """fold-scale never copies a weight: the helper's other call still reads the kernel, so
    the scale stays, with a shared-weight reason naming the helper (it scaled a copy of
    the kernel before, and the helper stayed beside it with nothing said)."""
    options = bnfold.FoldOptions(disable=["backward-affine", "forward-affine"])
    folded, report = bnfold.fold_text(SCALED_TWICE_CALLED, options)
    x = np.random.default_rng(1).standard_normal((3, 2)).astype(np.float32)
    check_close(run_xla(folded, [x]), run_xla(SCALED_TWICE_CALLED, [x]))
    assert not report.folds
    reasons = [(s.code, s.reason) for s in report.skipped]
    assert any(code == "shared-weight" and "@get_kernel, which stays in the module (kept by "
               "func.call)" in reason for code, reason in reasons), reasons
    assert folded.count("stablehlo.constant dense<[[") == 1, folded
