"""attention-scale on numbers: attention blocks whose `1/sqrt(d)` moves into Wq, run on
XLA CPU against the original and (plain JAX) a float64 numpy evaluation of the same math.

The folded module has no scale op left on the logits, matches the original within the
dtype's tolerance, and is no less accurate against float64 than the original (1.5x its
error plus one unit of roundoff of the output type).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import bnfold
from numerics import check_close, relative_error, run_xla

jax = pytest.importorskip("jax")
jnp = jax.numpy

B, T, D, H = 2, 6, 32, 4
DH = D // H
DTYPES = {"f32": (jnp.float32, np.float32), "bf16": (jnp.bfloat16, ml_dtypes.bfloat16)}


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _block(tag: str, where: str):
    """Multi-head attention with a biased Q; the scale after the product ("post", a
    multiply) or on q before it ("pre", a divide)."""
    dt, npdt = DTYPES[tag]
    rng = np.random.default_rng(0)
    wq, wk, wv = (rng.normal(0, D ** -0.5, (D, D)).astype(np.float32).astype(npdt)
                  .astype(np.float64) for _ in range(3))
    bq = rng.normal(0, 0.1, D).astype(np.float32).astype(npdt).astype(np.float64)
    scale = float(np.asarray(1 / np.sqrt(DH), np.float32).astype(npdt))
    root = float(np.asarray(np.sqrt(DH), np.float32).astype(npdt))

    def fn(x):
        q = (x @ jnp.asarray(wq, dt) + jnp.asarray(bq, dt)).reshape(B, T, H, DH)
        k = (x @ jnp.asarray(wk, dt)).reshape(B, T, H, DH)
        v = (x @ jnp.asarray(wv, dt)).reshape(B, T, H, DH)
        if where == "pre":
            q = q / jnp.asarray(root, dt)
        logits = jnp.einsum("bthd,bshd->bhts", q, k)
        if where == "post":
            logits = logits * jnp.asarray(scale, dt)
        p = jax.nn.softmax(logits, -1)
        return jnp.einsum("bhts,bshd->bthd", p, v).reshape(B, T, D)

    def reference(x):
        q = (x @ wq + bq).reshape(B, T, H, DH)
        k = (x @ wk).reshape(B, T, H, DH)
        v = (x @ wv).reshape(B, T, H, DH)
        factor = scale if where == "post" else 1 / root
        logits = np.einsum("bthd,bshd->bhts", q, k) * factor
        return np.einsum("bhts,bshd->bthd", _softmax(logits), v).reshape(B, T, D)

    return fn, reference


@pytest.mark.parametrize("where", ["post", "pre"])
@pytest.mark.parametrize("tag", ["f32", "bf16"])
def test_attention_scale_moves_into_wq(tag, where):
    fn, reference = _block(tag, where)
    _, npdt = DTYPES[tag]
    x = np.random.default_rng(1).normal(0, 1, (B, T, D)).astype(np.float32).astype(npdt)
    text = jax.jit(fn).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    scales = [f for f in report.folds if f.form == "scale"]
    assert len(scales) == 1, [s.to_json() for s in report.skipped]
    assert "kernel of the dot_general" in scales[0].note

    original, output = run_xla(text, [x]), run_xla(folded, [x])
    check_close(output, original, tag)
    ref = reference(x.astype(np.float64))
    before, after = relative_error(original[0], ref), relative_error(output[0], ref)
    unit = float(ml_dtypes.finfo(npdt).eps) / 2
    assert before < 50 * unit, before  # the reference computes the same thing
    assert after <= 1.5 * before + unit, (before, after)


def test_flax_multi_head_attention():
    nnx = pytest.importorskip("flax.nnx")
    m = nnx.MultiHeadAttention(num_heads=H, in_features=D, qkv_features=D, decode=False,
                               rngs=nnx.Rngs(0))
    x = np.random.default_rng(2).normal(0, 1, (B, T, D)).astype(np.float32)
    text = jax.jit(lambda x: m(x)).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    assert [f.form for f in report.folds].count("scale") == 1, \
        [s.to_json() for s in report.skipped]
    check_close(run_xla(folded, [x]), run_xla(text, [x]), "f32")
