"""Deployment forms (issue 12): symbolic batch, multi-platform, calls, bound parameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bnfold
import numerics
import support
from bnfold.jax_export import fold_exported

RNG = np.random.default_rng(5)
NORM_OPS = ("stablehlo.rsqrt", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide")


def _layer(cin: int, cout: int = 8) -> dict[str, np.ndarray]:
    return {"k": RNG.normal(size=(3, 3, cin, cout)).astype(np.float32),
            "mean": RNG.normal(size=cout).astype(np.float32),
            "var": RNG.uniform(0.5, 2.0, cout).astype(np.float32),
            "gamma": RNG.uniform(0.5, 1.5, cout).astype(np.float32),
            "beta": RNG.normal(size=cout).astype(np.float32)}


def _conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _bn(y, p):
    return (y - p["mean"]) * jax.lax.rsqrt(p["var"] + 1e-5) * p["gamma"] + p["beta"]


def _apply(params, x):
    y = jax.nn.relu(_bn(_conv(x, params[0]["k"]), params[0]))
    return jax.nn.relu(_bn(_conv(y, params[1]["k"]), params[1]))


PARAMS = [_layer(3), _layer(8)]
SYMBOLIC = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 8, 8, 3"), jnp.float32)


def _no_norm_ops(text: str) -> bool:
    return not any(op in text for op in NORM_OPS)


def _check_batches(folded, reference) -> None:
    for batch in (1, 5):
        x = RNG.normal(size=(batch, 8, 8, 3)).astype(np.float32)
        numerics.check_close([np.asarray(folded.call(x))], [np.asarray(reference(x))])


# --- symbolic batch -----------------------------------------------------------------


def test_symbolic_export_with_closed_over_parameters_folds_and_runs_at_two_batch_sizes():
    exported = jax.export.export(jax.jit(lambda x: _apply(PARAMS, x)))(SYMBOLIC)
    folded, report = fold_exported(exported, argnums=())
    assert len(report.folds) == 2 and not report.skipped, report.dumps()
    assert _no_norm_ops(folded.mlir_module()) and "dynamic_broadcast_in_dim" in folded.mlir_module()
    _check_batches(folded, lambda x: _apply(PARAMS, x))
    blob = folded.serialize()
    _check_batches(jax.export.deserialize(blob), lambda x: _apply(PARAMS, x))


def test_symbolic_export_binds_parameters_while_the_input_stays_symbolic():
    exported = jax.export.export(jax.jit(_apply))(PARAMS, SYMBOLIC)
    folded, report = fold_exported(exported, PARAMS, argnums=0)
    assert len(report.folds) == 2 and not report.skipped, report.dumps()
    assert _no_norm_ops(folded.mlir_module())
    _check_batches(folded, lambda x: _apply(PARAMS, x))
    x = np.ones((3, 8, 8, 3), np.float32)
    assert np.asarray(jax.jit(folded.call)(x)).shape == (3, 8, 8, 8)


def test_symbolic_export_folds_an_input_normalization_into_the_padded_stem():
    """Forward folding with a symbolic batch: the scale into the kernel, the shift
    through the SAME padding as a border correction broadcast to the runtime batch."""
    mean, std = np.float32([0.4, 0.5, 0.6]), np.float32([0.2, 0.25, 0.3])

    def model(x):
        return _apply(PARAMS, (x - mean) / std)

    exported = jax.export.export(jax.jit(model))(SYMBOLIC)
    folded, report = fold_exported(exported, argnums=())
    assert not report.skipped, report.dumps()
    stem = [f for f in report.folds if f.direction == "forward"]
    assert len(stem) == 1 and "border correction" in stem[0].note, report.dumps()
    assert _no_norm_ops(folded.mlir_module())
    _check_batches(folded, model)


def test_symbolic_export_refines_after_folding():
    """The folded module still verifies and refines shapes for a concrete batch."""
    exported = jax.export.export(jax.jit(lambda x: _apply(PARAMS, x)))(SYMBOLIC)
    text, report = bnfold.fold_text(exported.mlir_module_serialized)
    assert len(report.folds) == 2
    from bnfold import ir as bir
    context = bir.make_context()
    module = bir.parse(text, context)
    bir.run_pipeline(module, "builtin.module(stablehlo-refine-arguments"
                             "{types='tensor<4x8x8x3xf32>'},stablehlo-refine-shapes)")
    with context:
        module.operation.verify()
        assert "tensor<?x" not in str(module)


def test_cli_binds_names_recorded_on_the_wrapped_main(tmp_path):
    exported = jax.export.export(jax.jit(_apply))(PARAMS, SYMBOLIC)
    source = tmp_path / "model.mlir"
    source.write_text(exported.mlir_module())
    names = {f"[{i}]['{k}']": v for i, layer in enumerate(PARAMS) for k, v in layer.items()}
    np.savez(tmp_path / "params.npz", **{f"params{n}": v for n, v in names.items()})
    out = tmp_path / "folded.mlir"
    proc = subprocess.run([sys.executable, "-m", "bnfold", source, "--bind-params",
                           tmp_path / "params.npz", "-o", out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "folded 2 normalization(s)" in proc.stderr and "skipped 0" in proc.stderr
    assert _no_norm_ops(out.read_text().split("func.func private @relu")[0])


def test_binding_a_private_function_keeps_the_module_valid(tmp_path):
    exported = jax.export.export(jax.jit(_apply))(PARAMS, SYMBOLIC)
    text = exported.mlir_module()
    values = {f"params[{i}]['{k}']": v for i, layer in enumerate(PARAMS) for k, v in layer.items()}
    folded = bnfold.fold_source(text, bindings=values, bind_function="_wrapped_jax_export_main")
    assert len(folded.report.folds) == 2
    with folded.context:
        folded.module.operation.verify()


# --- multi-platform --------------------------------------------------------------------


def test_multi_platform_export_folds_through_the_platform_case():
    exported = jax.export.export(jax.jit(lambda x: _apply(PARAMS, x)),
                                 platforms=("cpu", "cuda"))(np.ones((2, 8, 8, 3), np.float32))
    folded, report = fold_exported(exported, argnums=())
    assert len(report.folds) == 2 and not report.skipped, report.dumps()
    assert _no_norm_ops(folded.mlir_module())
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    numerics.check_close([np.asarray(folded.call(x))], [np.asarray(_apply(PARAMS, x))])


# --- calls -------------------------------------------------------------------------------


@jax.jit
def _jit_conv(x, k):
    return _conv(x, k)


@jax.jit
def _jit_block(x, p):
    return jax.nn.relu(_bn(_conv(x, p["k"]), p))


@pytest.mark.parametrize("form", ["conv_helper_shared_by_two_layers", "nested_jit_block"])
def test_calls_are_inlined_per_call_site_and_fold(form):
    if form == "conv_helper_shared_by_two_layers":
        def f(x):
            y = jax.nn.relu(_bn(_jit_conv(x, PARAMS[0]["k"]), PARAMS[0]))
            return jax.nn.relu(_bn(_jit_conv(y, PARAMS[1]["k"]), PARAMS[1]))
    else:
        def f(x):
            return _jit_block(_jit_block(x, PARAMS[0]), PARAMS[1])
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    folded, report = support.fold(text)
    assert len(report.folds) == 2 and not report.skipped, report.dumps()
    assert len(report.inlined) == 2 and "inlined 2 call(s)" in report.summary()
    callee = "_jit_conv" if form.startswith("conv") else "_jit_block"
    assert callee not in folded  # no caller left: removed
    numerics.check_close(numerics.run_xla(folded, [x]), numerics.run_xla(text, [x]))
    again, second = support.fold(folded)
    assert again == folded and not second.folds


_jit_bn = jax.jit(_bn)


def test_a_jitted_batch_norm_called_after_each_layer_is_inlined_per_call_site_and_folds():
    """`@_bn(%y, %p...)` holds only the normalization; each call gets the layer's result and
    its own statistics. (Found by the breaker run: neither call folded, and the one report
    entry blamed a block argument inside the helper.)"""
    def f(x):
        y = jax.nn.relu(_jit_bn(_conv(x, PARAMS[0]["k"]), PARAMS[0]))
        return jax.nn.relu(_jit_bn(_conv(y, PARAMS[1]["k"]), PARAMS[1]))
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    assert "func.call" in text or "call @" in text  # the helper really is a function
    folded, report = support.fold(text)
    assert len(report.folds) == 2 and not report.skipped, report.dumps()
    assert len(report.inlined) == 2
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


BN_HELPER_FAN_OUT = """
func.func private @bn(%y: tensor<2x4xf32>, %g: tensor<4xf32>) -> tensor<2x4xf32> {
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
  %m = stablehlo.multiply %y, %gb : tensor<2x4xf32>
  return %m : tensor<2x4xf32>
}
func.func @main(%x: tensor<2x3xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %w = stablehlo.constant dense<[[1.0, 2.0, 0.5, 0.25], [1.5, -1.0, 2.0, 1.0], [0.5, 0.5, -1.0, 2.0]]> : tensor<3x4xf32>
  %g = stablehlo.constant dense<[0.5, 2.0, 3.0, 0.25]> : tensor<4xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %z = func.call @bn(%y, %g) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return %z, %y : tensor<2x4xf32>, tensor<2x4xf32>
}
"""


@pytest.mark.parametrize("options", [{}, {"equalize": True}, {"equalize": True, "absorb_high_bias": True}])
def test_a_helper_given_a_layer_result_that_is_also_returned_is_no_internal_error(options):
    """The fuzzer (seed 402) found the inlining check comparing the call with a missing sole
    user (the layer's result has two): a TypeError. Now the helper stays, with a reason."""
    out = bnfold.fold_source(BN_HELPER_FAN_OUT, options=bnfold.FoldOptions(**options))
    assert not out.report.folds and out.report.skipped, out.report.table()
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    numerics.check_close(numerics.run_xla(out.serialize().decode(), [x]),
                         numerics.run_xla(BN_HELPER_FAN_OUT, [x]))


SCALED_INTO_HELPER = """
func.func private @h(%y: tensor<2x4xf16>) -> tensor<2x4xf16> {
  %n = stablehlo.negate %y : tensor<2x4xf16>
  %c = stablehlo.constant dense<1.868> : tensor<f16>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f16>) -> tensor<2x4xf16>
  %m = stablehlo.multiply %cb, %n : tensor<2x4xf16>
  return %m : tensor<2x4xf16>
}
func.func @main(%x: tensor<2x3xf16>) -> tensor<2x4xf16> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 0.5, 0.25], [1.5, -1.0, 2.0, 1.0], [0.5, 0.5, -1.0, 2.0]]> : tensor<3x4xf16>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf16>, tensor<3x4xf16>) -> tensor<2x4xf16>
  %c = stablehlo.constant dense<1.1875> : tensor<f16>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f16>) -> tensor<2x4xf16>
  %s = stablehlo.multiply %y, %cb : tensor<2x4xf16>
  %z = func.call @h(%s) : (tensor<2x4xf16>) -> tensor<2x4xf16>
  return %z : tensor<2x4xf16>
}
"""


def test_a_helper_after_a_scaled_layer_is_inlined_in_the_first_run():
    """The fuzzer (seed 524): `conv * 1.1875` then a helper that negates and scales. The
    first run folded the multiply only; the second then saw the layer's result at the call,
    inlined and folded again (fold(fold(m)) != fold(m)). Now one run does both."""
    folded, report = support.fold(SCALED_INTO_HELPER)
    assert report.inlined == ["h"] and len(report.folds) == 1, report.dumps()
    again, second = support.fold(folded)
    assert again == folded and not second.folds and not second.inlined
    x = RNG.normal(size=(2, 3)).astype(np.float16)
    w = np.array([[1.0, 2.0, 0.5, 0.25], [1.5, -1.0, 2.0, 1.0], [0.5, 0.5, -1.0, 2.0]])
    reference = -(x.astype(np.float64) @ w) * 1.1875 * float(np.float16(1.868))
    original = numerics.run_xla(SCALED_INTO_HELPER, [x])[0].astype(np.float64)
    actual = numerics.run_xla(folded, [x])[0].astype(np.float64)
    assert numerics.relative_error(actual, reference) <= \
        1.5 * numerics.relative_error(original, reference) + 2.0 ** -10


def test_a_jit_block_of_jitted_layers_is_inlined_through_both_levels_and_folds():
    """@main passes constants to @block, which passes them on to @layer (conv + batch
    norm): the convolution's kernel is constant only at the outer call site. (The second
    breaker run: nothing folded, and the report told the user to bind @layer's arguments
    with --bind-params, which cannot help.)"""
    layer = jax.jit(lambda x, p: jax.nn.relu(_bn(_conv(x, p["k"]), p)))
    block = jax.jit(lambda x, p, q: layer(layer(x, p), q))
    params = [_layer(8) for _ in range(4)]

    def f(x):
        return block(block(x, params[0], params[1]), params[2], params[3])
    x = RNG.normal(size=(2, 6, 6, 8)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    assert text.count("func.func private") >= 2  # the two levels really are functions
    folded, report = support.fold(text)
    assert len(report.folds) == 4 and not report.skipped, report.dumps()
    assert _no_norm_ops(folded)
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


def test_a_helper_that_returns_its_own_layer_is_inlined_for_the_callers_batch_norm():
    """@conv(%x) holds the kernel as its own constant and returns the convolution; the
    caller normalizes the result: inlined (through the returned value) and folded."""
    kernel = PARAMS[0]["k"]
    conv = jax.jit(lambda x: _conv(x, kernel))

    def f(x):
        return _bn(conv(x), PARAMS[0])
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    assert "func.func private" in text
    folded, report = support.fold(text)
    assert len(report.folds) == 1 and len(report.inlined) == 1, report.dumps()
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


MUTUALLY_RECURSIVE = """
func.func private @a(%x: tensor<2x3xf32>, %k: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %y = func.call @b(%x, %k) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
func.func private @b(%x: tensor<2x3xf32>, %k: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %y = func.call @a(%x, %k) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x4xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<3x4xf32>
  %y = func.call @a(%x, %k) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %s = stablehlo.constant dense<2.0> : tensor<2x4xf32>
  %o = stablehlo.multiply %y, %s : tensor<2x4xf32>
  return %o : tensor<2x4xf32>
}
"""


def test_mutually_recursive_helpers_are_no_internal_error():
    """Valid IR, if never run: the look through nested helpers is bounded."""
    out = bnfold.fold_source(MUTUALLY_RECURSIVE)
    text = out.serialize().decode()
    assert "call @a(" in text and "stablehlo.multiply" in text and not out.report.folds


def test_a_helper_with_a_non_constant_kernel_is_not_inlined():
    def f(x, k):
        return _bn(_jit_conv(x, k), PARAMS[0])
    text = jax.jit(f).lower(np.ones((1, 8, 8, 3), np.float32), PARAMS[0]["k"]).as_text()
    folded, report = support.fold(text)
    assert not report.folds and not report.inlined
    assert "func.call" in folded or "call @" in folded
    assert report.skipped  # the normalization is explained


def test_inline_calls_can_be_disabled():
    def f(x):
        return _bn(_jit_conv(x, PARAMS[0]["k"]), PARAMS[0])
    text = jax.jit(f).lower(np.ones((1, 8, 8, 3), np.float32)).as_text()
    _, report = support.fold(text, disable={"inline-calls"})
    assert not report.folds and not report.inlined and report.skipped
    assert "func.call" in report.skipped[0].reason


SHARED_HELPER = """
func.func @main(%x: tensor<1x8x8x2xf32>) -> tensor<1x8x8x2xf32> {
  %ka = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 3.0]]]]> : tensor<1x1x2x2xf32>
  %kb = stablehlo.constant dense<[[[[-4.0, 0.25], [2.0, 1.5]]]]> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x8x8x2xf32>
  %t = stablehlo.constant dense<[1.0, -1.0]> : tensor<2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x8x8x2xf32>
  %y1 = call @conv(%x, %ka) : (tensor<1x8x8x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x8x8x2xf32>
  %n1 = stablehlo.multiply %y1, %sb : tensor<1x8x8x2xf32>
  %b1 = stablehlo.add %n1, %tb : tensor<1x8x8x2xf32>
  %y2 = call @conv(%b1, %kb) : (tensor<1x8x8x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x8x8x2xf32>
  %n2 = stablehlo.multiply %y2, %sb : tensor<1x8x8x2xf32>
  %b2 = stablehlo.add %n2, %tb : tensor<1x8x8x2xf32>
  return %b2 : tensor<1x8x8x2xf32>
}
func.func private @conv(%a: tensor<1x8x8x2xf32>, %w: tensor<1x1x2x2xf32>) -> tensor<1x8x8x2xf32> {
  %0 = stablehlo.convolution(%a, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x8x8x2xf32>
  return %0 : tensor<1x8x8x2xf32>
}
"""


def test_one_helper_called_twice_with_other_kernels_gets_a_copy_per_call_site():
    """The audit's planted bug (one inlined copy reused for the second call site) changed
    the output by 100%: the same private function, two call sites, two kernels."""
    folded, report = support.fold(SHARED_HELPER)
    assert len(report.folds) == 2 and report.inlined == ["conv", "conv"], report.dumps()
    assert "call @conv" not in folded
    x = RNG.normal(size=(1, 8, 8, 2)).astype(np.float32)
    numerics.check_close(numerics.run_xla(folded, [x]), numerics.run_xla(SHARED_HELPER, [x]))


# --- issue 26: a symbolic batch after the fold ------------------------------------------------

def _normalized_stem(x):
    """An input normalization and a batch norm around the same convolution."""
    p = PARAMS[0]
    z = (x - jnp.array([0.4, 0.5, 0.6])) / jnp.array([0.2, 0.25, 0.3])
    return _bn(_conv(z, p["k"]), p)


def test_symbolic_batch_merges_both_folds_into_one_bias():
    """The backward fold's dynamic bias reads the folded producer's runtime shape; that shape
    query must not keep the forward fold from merging its bias into the same add."""
    exported = jax.export.export(jax.jit(_normalized_stem))(SYMBOLIC)
    folded, report = bnfold.fold_text(exported.mlir_module())
    assert sorted(f.direction for f in report.folds) == ["backward", "forward"], report.dumps()
    names = support.op_names(folded)
    assert names.count("stablehlo.convolution") == 1
    assert names.count("stablehlo.add") == 1, names  # one bias: both folds merged
    again, second = bnfold.fold_text(folded)
    assert again == folded and not second.folds
    for batch in (1, 3):
        shape = [batch, 8, 8, 3]
        x = RNG.normal(size=shape).astype(np.float32)
        out = numerics.run_xla(support.refined(folded, shape), [x])
        numerics.check_close(out, [np.asarray(_normalized_stem(x))])


def test_symbolic_batch_equalizes():
    """--equalize on a shape-polymorphic export: the shape queries of the dynamic biases are
    no fan-out (they read no values)."""
    exported = jax.export.export(jax.jit(lambda x: _apply(PARAMS, x)))(SYMBOLIC)
    out = bnfold.fold_source(exported.mlir_module(), options=bnfold.FoldOptions(equalize=True))
    assert out.report.equalized, out.report.table()
    assert not any("get_dimension_size" in s.reason for s in out.report.not_equalized)
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    numerics.check_close(numerics.run_xla(support.refined(out.serialize().decode(), [2, 8, 8, 3]), [x]),
                         [np.asarray(_apply(PARAMS, x))])


# --- issue 26: helpers inside helpers -------------------------------------------------------


def _nest(fn, levels: int):
    """`fn` behind `levels` jax.jit wrappers (each a private function calling the next)."""
    for _ in range(levels):
        fn = jax.jit(lambda *a, inner=fn: inner(*a))
    return fn


@pytest.mark.parametrize("levels", [3, 4])
def test_a_producer_nested_in_helpers_folds(levels):
    conv = _nest(_conv, levels)

    def f(x):
        return jax.nn.relu(_bn(conv(x, PARAMS[0]["k"]), PARAMS[0]))

    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    assert text.count("func.func private") >= levels  # JAX kept every level
    folded, report = support.fold(text)
    assert len(report.folds) == 1 and not report.skipped, report.dumps()
    assert len(report.inlined) == levels, report.inlined  # one per level, then gone
    calls = [line for line in folded.splitlines() if "call @" in line]
    assert all("@relu" in line for line in calls), calls  # only the activation stays a call
    assert _no_norm_ops(folded.split("func.func private")[0])
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


def test_an_explicit_pad_through_nested_helpers_folds_forward():
    """`jnp.pad` in a jitted helper inside another, between an input normalization and a
    VALID convolution: the pad becomes the convolution's padding, the shift a border
    correction."""
    pad = _nest(lambda x: jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))), 2)
    k = PARAMS[0]["k"]

    def f(x):
        z = (x - jnp.array([0.4, 0.5, 0.6])) / jnp.array([0.2, 0.25, 0.3])
        return jax.lax.conv_general_dilated(pad(z), k, (1, 1), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    folded, report = support.fold(text)
    assert [fo.direction for fo in report.folds] == ["forward"], report.dumps()
    assert "call @" not in folded and "stablehlo.pad" not in folded
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


@pytest.mark.parametrize("levels", [1, 2])
def test_a_skipped_helper_is_neither_folded_nor_inlined_nor_removed(levels):
    conv = _nest(_conv, levels)

    def f(x):
        return _bn(conv(x, PARAMS[0]["k"]), PARAMS[0])

    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    text = jax.jit(f).lower(x).as_text()
    helpers = [line.split("@")[1].split("(")[0].strip('"') for line in text.splitlines()
               if "func.func private" in line and "relu" not in line]
    folded, report = support.fold(text, skip_functions=set(helpers))
    assert not report.folds and not report.inlined, report.dumps()
    for name in helpers:
        assert f'func.func private @"{name}"' in folded or f"func.func private @{name}" in folded
    assert report.skipped  # the normalization in @main is explained
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(f(x))])


def _classifier(x):
    """A stem, a mean pool and a classifier: the pool's divide folds forward into it."""
    y = jax.nn.relu(_bn(_conv(x, PARAMS[0]["k"]), PARAMS[0]))
    pooled = jnp.mean(y, axis=(1, 2))
    w = np.random.default_rng(9).normal(size=(8, 4)).astype(np.float32)
    return pooled @ w


def test_multi_platform_export_folds_forward_into_every_branch():
    """The same folds with and without the per-platform `case`: the mean pool's divide
    (outside the case) folds into the classifier of each branch."""
    x = RNG.normal(size=(2, 8, 8, 3)).astype(np.float32)
    single = jax.export.export(jax.jit(_classifier))(x)
    multi = jax.export.export(jax.jit(_classifier), platforms=("cpu", "cuda"))(x)
    assert "stablehlo.case" in multi.mlir_module()
    _, one = fold_exported(single, argnums=())
    folded, both = fold_exported(multi, argnums=())
    directions = sorted(f.direction for f in both.folds)
    assert directions == sorted(f.direction for f in one.folds) == ["backward", "forward"], \
        both.dumps()
    assert not both.skipped and "stablehlo.divide" not in folded.mlir_module()
    numerics.check_close([np.asarray(folded.call(x))], [np.asarray(_classifier(x))])


# --- lax.scan over stacked constant layers ----------------------------------------------


def _scanned(unroll: bool) -> str:
    """Three dense + batch-norm + ReLU layers as one lax.scan over stacked constants."""
    rng = np.random.default_rng(11)
    k = rng.normal(size=(3, 8, 8)).astype(np.float32)
    mean, beta = rng.normal(size=(2, 3, 8)).astype(np.float32)
    var, gamma = rng.uniform(0.5, 2.0, size=(2, 3, 8)).astype(np.float32)

    def f(x):
        def body(h, p):
            y = (h @ p[0] - p[1]) * jax.lax.rsqrt(p[2] + 1e-5) * p[3] + p[4]
            return jax.nn.relu(y), None
        return jax.lax.scan(body, x, (k, mean, var, gamma, beta), unroll=unroll)[0]

    spec = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    return jax.export.export(jax.jit(f))(spec).mlir_module()


# jax 0.11 puts the scan body inline in the while body, where each layer's weights are
# `func.call @dynamic_index_in_dim(%iterArg, %i)` (jax <= 0.10: arguments of a private
# function the body calls). This is _scanned(unroll=False) as jax 0.11.2 exported it.
SCAN_JAX_0112 = Path(__file__).parent / "inputs" / "scan_stacked_jax0112.mlir"


@pytest.mark.parametrize("exporter", ["this jax", "jax 0.11.2"])
def test_a_scan_over_stacked_constants_says_unroll_not_bind(exporter):
    """The stacked weights are constants sliced per iteration in a while loop: binding
    parameters cannot help (the module has none), unrolling does."""
    text = _scanned(unroll=False) if exporter == "this jax" else SCAN_JAX_0112.read_text()
    assert "stablehlo.while" in text
    out, report = support.fold(text, equalize=True, quantize_weights="int8")
    assert not report.folds and not report.quantized
    refusals = list(report.skipped) + list(report.not_quantized)
    assert [r.code for r in refusals] == ["loop-carried", "loop-carried"], refusals
    for r in refusals:
        assert "unroll=True" in r.reason and "bind" not in r.reason, r.reason
    inputs = support.inputs_for(text)
    assert support.compare_xla(text, out, inputs) == 0.0  # nothing rewritten

    unrolled = _scanned(unroll=True)
    folded, report = support.fold(unrolled)
    assert len(report.folds) == 3 and not report.skipped
    assert "rsqrt" not in folded and "stablehlo.while" not in folded
    numerics.check_close(numerics.run_xla(folded, inputs), numerics.run_xla(text, inputs))
