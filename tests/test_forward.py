"""Forward folding (normalization before the producer), controls, and the quantization report."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bnfold
import bnfold.ir
import numerics
import support

RNG = np.random.default_rng(7)
S4 = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
T4 = RNG.normal(size=4).astype(np.float32)
K = RNG.normal(size=(3, 3, 4, 6)).astype(np.float32)
KG = RNG.normal(size=(3, 3, 2, 6)).astype(np.float32)
KD = RNG.normal(size=(3, 3, 1, 8)).astype(np.float32)  # depthwise, multiplier 2
W = RNG.normal(size=(4, 5)).astype(np.float32)
X = RNG.normal(size=(2, 8, 8, 4)).astype(np.float32)


def _conv(v, k, pad, groups=1):
    return jax.lax.conv_general_dilated(v, k, (1, 1), pad, feature_group_count=groups,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _bn_before(v):
    return (v - T4) * jax.lax.rsqrt(S4 + 1e-3) * 1.5 + 0.25


CASES = {
    # name: (function, input, expected folds, expected direction or None)
    "valid_padding_scale_and_shift": (lambda v: _conv(v * S4 + T4, K, "VALID"), X, 1),
    "same_padding_scale_only": (lambda v: _conv(v * S4, K, "SAME"), X, 1),
    # A per-channel shift through zero padding: an exact border correction.
    "same_padding_shift_corrected": (lambda v: _conv(v * S4 + T4, K, "SAME"), X, 1),
    "strided_dilated_asymmetric_shift_corrected": (lambda v: jax.lax.conv_general_dilated(
        v * S4 + T4, K, (2, 3), ((0, 2), (3, 1)), rhs_dilation=(2, 1),
        dimension_numbers=("NHWC", "HWIO", "NHWC")), X, 1),
    "negative_and_positive_padding_shift_corrected": (lambda v: jax.lax.conv_general_dilated(
        v * S4 + T4, K, (1, 1), ((-1, 2), (1, -2)), dimension_numbers=("NHWC", "HWIO", "NHWC")),
        X, 1),
    "depthwise_shift_corrected": (lambda v: _conv(v * S4 + T4, KD, "SAME", 4), X, 1),
    "nchw_shift_corrected": (lambda v: jax.lax.conv_general_dilated(
        (v * S4 + T4).transpose(0, 3, 1, 2), K, (2, 2), "SAME",
        dimension_numbers=("NCHW", "HWIO", "NCHW")), X, 1),
    # Keras ZeroPadding2D then Conv2D(padding="valid"): the pad becomes the conv's padding.
    "explicit_pad_valid_shift_corrected": (lambda v: _conv(jnp.pad(
        v * S4 + T4, ((0, 0), (0, 1), (0, 1), (0, 0))), K, "VALID"), X, 1),
    "explicit_pad_valid_scale_only": (lambda v: _conv(jnp.pad(
        v * S4, ((0, 0), (1, 1), (1, 1), (0, 0))), K, "VALID"), X, 1),
    # Too large a correction (a transposed convolution's is periodic over the whole
    # output): the scale folds and t / s stays as one add before the convolution.
    "transposed_large_shift_kept": (lambda v: jax.lax.conv_transpose(
        v * S4 + T4, K, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        RNG.normal(size=(1, 40, 40, 4)).astype(np.float32), 1),
    # Keras Rescaling(1/127.5, offset=-1): a uniform t / s folds exactly via an explicit pad.
    "same_padding_uniform_shift_padded": (lambda v: _conv(v * (1 / 127.5) - 1.0, K, "SAME"),
                                          X * 100, 1),
    "strided_asymmetric_uniform_shift_padded": (lambda v: jax.lax.conv_general_dilated(
        v * S4 + 2.0 * S4, K, (2, 2), ((0, 1), (2, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")),
        X, 1),
    "grouped_uniform_shift_padded": (lambda v: _conv(v * 0.5 + 0.25, KG, "SAME", 2), X, 1),
    "grouped_valid": (lambda v: _conv(v * S4 + T4, KG, "VALID", 2), X, 1),
    "grouped_same_scale_only": (lambda v: _conv(v * S4, KG, "SAME", 2), X, 1),
    "bn_chain_valid": (lambda v: _conv(_bn_before(v), K, "VALID"), X, 1),
    "dense": (lambda v: (v * S4 + T4) @ W, RNG.normal(size=(3, 4)).astype(np.float32), 1),
    "dense_rank3": (lambda v: jnp.einsum("bti,io->bto", v * S4 - T4, W),
                    RNG.normal(size=(2, 3, 4)).astype(np.float32), 1),
    "transposed_scale_only": (lambda v: jax.lax.conv_transpose(
        v * S4, K, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), X, 1),
    "transposed_shift_corrected": (lambda v: jax.lax.conv_transpose(
        v * S4 + T4, K, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")), X, 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_fold_numerics(name):
    fn, x, n_folds = CASES[name]
    text = jax.jit(fn).lower(x).as_text()
    folded, report = support.fold(text, pad_uniform_shift=name.endswith("_padded"))
    assert len(report.folds) == n_folds, report.to_json()
    assert all(f.direction == "forward" for f in report.folds)
    if n_folds:
        assert "stablehlo.multiply" not in folded
        if name.endswith("_padded"):  # exact: an explicit pad, a VALID conv, one bias
            assert "stablehlo.pad" in folded and not report.folds[0].note
            body = folded[folded.index("@main"):]
            assert body.count("stablehlo.add") == 1
        if name.endswith("_shift_kept"):  # the correction would be too large: the shift stays
            note = report.folds[0].note
            assert "the shift stays as one add before the convolution" in note, note
            assert "border correction" in note and "constants" in note, note
        if name.endswith("_corrected"):  # exact: the whole chain folded, plus a correction
            assert "border correction" in report.folds[0].note, report.folds[0].note
            assert "stablehlo.pad" not in folded
            body = folded[folded.index("@main"):]
            assert body.count("stablehlo.add") == 1
    else:
        assert report.skipped and "forward:" in report.skipped[0].reason
        context, original = support.parse(text)
        with context:
            assert folded == str(original)  # the padded additive case is untouched
    support.compare_xla(text, folded, [x])


def test_backward_has_priority_over_forward():
    k2 = RNG.normal(size=(1, 1, 6, 3)).astype(np.float32)
    s6 = RNG.uniform(0.5, 1.5, 6).astype(np.float32)
    text = jax.jit(lambda v: _conv(_conv(v, K, "SAME") * s6 + 1.0, k2, "VALID")).lower(X).as_text()
    folded, report = support.fold(text)
    assert [f.direction for f in report.folds] == ["backward"]
    support.compare_xla(text, folded, [X])


def test_forward_when_backward_is_impossible():
    # The first conv's result has a second user, so the norm can only go forward.
    k2 = RNG.normal(size=(1, 1, 6, 3)).astype(np.float32)
    s6 = RNG.uniform(0.5, 1.5, 6).astype(np.float32)

    def fn(v):
        y = _conv(v, K, "SAME")
        return _conv(y * s6, k2, "VALID"), y

    text = jax.jit(fn).lower(X).as_text()
    folded, report = support.fold(text)
    assert [f.direction for f in report.folds] == ["forward"]
    support.compare_xla(text, folded, [X])


def test_disable_controls_each_direction():
    fn, x, _ = CASES["valid_padding_scale_and_shift"]
    text = jax.jit(fn).lower(x).as_text()
    _, report = support.fold(text, disable={"forward-affine"})
    assert not report.folds
    _, report = support.fold(text, disable={"backward-affine"})
    assert len(report.folds) == 1


def test_report_statistics_reproduce_the_normalization():
    text = (support.TESTDATA / "conv2d_bias_bn.mlir").read_text()
    _, report = support.fold(text)
    (fold,) = report.folds
    p = fold.params
    assert set(p) >= {"scale", "shift", "gamma", "beta", "mean", "variance", "epsilon"}
    scale = p["gamma"] / np.sqrt(p["variance"] + p["epsilon"])
    np.testing.assert_array_equal(p["scale"], scale)
    # shift = (bias - mean) * scale + beta: recover the merged conv bias and check it is
    # the constant in the file, exactly.
    bias = (p["shift"] - p["beta"]) / scale + p["mean"]
    context, module = support.parse(text)
    from bnfold import elements
    with context:
        func = module.body.operations[0]
        ops = list(func.regions[0].blocks[0].operations)
        consts = [elements.read_native(op.attributes["value"])
                  for op in ops if op.name == "stablehlo.constant"]
        (bn,) = [op for op in ops if op.name == "stablehlo.batch_norm_inference"]
        epsilon = bnfold.ir.ir.FloatAttr(bn.attributes["epsilon"]).value
    stats = [c for c in consts if c.shape == (fold.channels,)]
    assert any(np.allclose(bias, c, rtol=0, atol=1e-6) for c in stats)
    for name in ("gamma", "beta", "mean", "variance"):
        assert any(np.array_equal(p[name], c.astype(np.float64)) for c in stats), name
    assert p["epsilon"] == epsilon


def test_report_params_roundtrip_npz(tmp_path):
    text = (support.TESTDATA / "conv2d_two_bn.mlir").read_text()
    _, report = support.fold(text)
    path = tmp_path / "stats.npz"
    report.save_params(str(path))
    with np.load(path) as npz:
        assert sorted({k.split("/")[0] for k in npz.files}) == ["fold0", "fold1"]
        for fold in report.folds:
            for name, value in fold.params.items():
                np.testing.assert_array_equal(npz[f"{fold.id}/{name}"], value)


def test_expand_batch_norm_option_removes_every_leftover():
    text = (support.TESTDATA / "nofold_stats_args.mlir").read_text()
    folded, report = support.fold(text, expand_batch_norm=True)
    assert report.expanded == 1 and "batch_norm_inference" not in folded
    inputs = support.inputs_for(text, positive_args=True)
    numerics.check_close(numerics.run_xla(folded, inputs), numerics.run_xla(text, inputs))
