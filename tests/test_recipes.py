"""The README's framework recipes (run when the frameworks are installed: `.[export]`)."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import numerics
from bnfold.jax_export import fold_exported, fold_function

X_NHWC = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype(np.float32)


def test_flax_linen_variables():
    nn = pytest.importorskip("flax.linen")

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            y = nn.Conv(8, (3, 3), use_bias=False)(x)
            return nn.relu(nn.BatchNorm(use_running_average=True)(y))

    model = Model()
    variables = model.init(jax.random.PRNGKey(0), X_NHWC)
    folded = fold_function(model.apply, variables, X_NHWC)
    assert len(folded.report.folds) == 1
    numerics.check_close([np.asarray(folded(X_NHWC))], [np.asarray(model.apply(variables, X_NHWC))])


def test_equinox_partition_and_state():
    eqx = pytest.importorskip("equinox")

    class Model(eqx.Module):
        conv: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm

        def __init__(self, key):
            self.conv = eqx.nn.Conv2d(3, 8, 3, padding=1, use_bias=False, key=key)
            self.bn = eqx.nn.BatchNorm(8, axis_name="batch", mode="ema")

        def __call__(self, x, state):
            return self.bn(self.conv(x), state)

    model, state = eqx.nn.make_with_state(Model)(jax.random.PRNGKey(0))
    model = eqx.nn.inference_mode(model)
    params, static = eqx.partition(model, eqx.is_array)

    def apply(params, state, x):
        m = eqx.combine(params, static)
        return jax.vmap(lambda xi: m(xi, state)[0], axis_name="batch")(x)

    x = X_NHWC.transpose(0, 3, 1, 2).copy()
    exported = jax.export.export(jax.jit(apply))(params, state, x)
    folded, report = fold_exported(exported, (params, state), argnums=(0, 1))
    assert len(report.folds) == 1
    numerics.check_close([np.asarray(folded.call(x))], [np.asarray(apply(params, state, x))])


def test_keras_stateless_call():
    if os.environ.get("KERAS_BACKEND", "jax") != "jax":
        pytest.skip("needs KERAS_BACKEND=jax")
    os.environ["KERAS_BACKEND"] = "jax"
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("keras was imported with another backend")
    inputs = keras.Input((8, 8, 3))
    outputs = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 3, padding="same")(inputs))
    model = keras.Model(inputs, outputs)
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]

    def apply(tv, ntv, x):
        return model.stateless_call(tv, ntv, x, training=False)[0]

    exported = jax.export.export(jax.jit(apply))(tv, ntv, X_NHWC)
    folded, report = fold_exported(exported, (tv, ntv), argnums=(0, 1))
    assert len(report.folds) == 1
    numerics.check_close([np.asarray(folded.call(X_NHWC))], [np.asarray(apply(tv, ntv, X_NHWC))])
    with pytest.raises(ValueError, match="VJP"):
        folded.vjp()
