"""fold-scale on numbers (attention): attention blocks whose `1/sqrt(d)` moves into Wq, run on
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
    scales = [f for f in report.folds if f.kind == "scale"]
    assert len(scales) == 1, [s.to_json() for s in report.skipped]
    assert scales[0].producer_op == "stablehlo.dot_general" and "into the kernel" in scales[0].note

    _judged(text, folded, x, reference, npdt, tag)


def test_flax_multi_head_attention():
    nnx = pytest.importorskip("flax.nnx")
    m = nnx.MultiHeadAttention(num_heads=H, in_features=D, qkv_features=D, decode=False,
                               rngs=nnx.Rngs(0))
    x = np.random.default_rng(2).normal(0, 1, (B, T, D)).astype(np.float32)
    text = jax.jit(lambda x: m(x)).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    assert [f.kind for f in report.folds].count("scale") == 1, \
        [s.to_json() for s in report.skipped]
    check_close(run_xla(folded, [x]), run_xla(text, [x]), "f32")


def _block_of_a_transformer(tag: str):
    """A pre-norm block: LayerNorm -> Q, K, V (biased) -> attention (scaled after the
    product) -> output projection -> residual -> RMSNorm -> gate and up -> down -> residual."""
    dt, npdt = DTYPES[tag]
    rng = np.random.default_rng(3)

    def p(*shape, mean=0.0, sd=None):
        sd = sd if sd is not None else (shape[0] ** -0.5 if len(shape) > 1 else 0.3)
        return rng.normal(mean, sd, shape).astype(np.float32).astype(npdt).astype(np.float64)

    wq, wk, wv, wo = (p(D, D) for _ in range(4))
    bq, bk, bv = (p(D, sd=0.1) for _ in range(3))
    g1, b1, g2 = p(D, mean=1.0), p(D), p(D, mean=1.0)
    w1, w3, w2 = p(D, 2 * D), p(D, 2 * D), p(2 * D, D)
    scale = float(np.asarray(1 / np.sqrt(DH), np.float32).astype(npdt))
    j = {k: jnp.asarray(v, dt) for k, v in dict(wq=wq, wk=wk, wv=wv, wo=wo, bq=bq, bk=bk, bv=bv,
                                                  g1=g1, b1=b1, g2=g2, w1=w1, w3=w3, w2=w2).items()}

    def fn(x):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        h = ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(dt) * j["g1"] + j["b1"]
        q, k, vv = ((h @ j[w] + j[b]).reshape(B, T, H, DH)
                    for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
        logits = jnp.einsum("bthd,bshd->bhts", q, k) * jnp.asarray(scale, dt)
        a = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, -1), vv).reshape(B, T, D)
        x = x + a @ j["wo"]
        x32 = x.astype(jnp.float32)
        h = j["g2"] * (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype(dt)
        return x + (jax.nn.silu(h @ j["w1"]) * (h @ j["w3"])) @ j["w2"]

    def reference(x):
        m = x.mean(-1, keepdims=True)
        h = (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g1 + b1
        q, k, vv = ((h @ w + b).reshape(B, T, H, DH) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
        logits = np.einsum("bthd,bshd->bhts", q, k) * scale
        a = np.einsum("bhts,bshd->bthd", _softmax(logits), vv).reshape(B, T, D)
        x = x + a @ wo
        h = g2 * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        gate = h @ w1
        return x + (gate / (1 + np.exp(-gate)) * (h @ w3)) @ w2

    return fn, reference


@pytest.mark.parametrize("tag", ["f32", "bf16"])
def test_a_transformer_block_folds_both_norms_and_the_scale(tag):
    fn, reference = _block_of_a_transformer(tag)
    _, npdt = DTYPES[tag]
    x = np.random.default_rng(4).normal(0, 1, (B, T, D)).astype(np.float32).astype(npdt)
    text = jax.jit(fn).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    assert sorted(f.note.split()[2] for f in report.folds if f.kind == "normalization") == \
        ["2", "3"], [f.to_json() for f in report.folds]
    assert [f.kind for f in report.folds].count("scale") == 1
    _judged(text, folded, x, reference, npdt, tag)


# --- a fused QKV projection: q is a slice of one linear's output --------------------------

def _fused_block(tag: str, layout: str, where: str):
    """Attention whose q, k, v are slices of ONE biased projection [D, 3D]: "gpt2" slices
    the flat features (c_attn), "mha" reshapes to (T, 3, D) and takes index i of that axis
    (torch's MultiheadAttention in_proj), "swin" reshapes to (T, 3, H, DH) and permutes the
    3 first (torchvision's Swin qkv). The scale on the logits ("post") or on q ("pre"), or
    d^-1/4 on q and on k each ("both", torch's attention math)."""
    dt, npdt = DTYPES[tag]
    rng = np.random.default_rng(5)
    w = rng.normal(0, D ** -0.5, (D, 3 * D)).astype(np.float32).astype(npdt).astype(np.float64)
    bias = rng.normal(0, 0.1, 3 * D).astype(np.float32).astype(npdt).astype(np.float64)
    scale = float(np.asarray(1 / np.sqrt(DH), np.float32).astype(npdt))
    quarter = float(np.asarray(DH ** -0.25, np.float32).astype(npdt))

    def split(y, xp):
        if layout == "gpt2":
            parts = [y[..., i * D:(i + 1) * D] for i in range(3)]
        elif layout == "mha":
            y3 = y.reshape(B, T, 3, D)
            parts = [y3[:, :, i] for i in range(3)]
        else:
            y5 = xp.transpose(y.reshape(B, T, 3, H, DH), (2, 0, 1, 3, 4))
            parts = [y5[i].reshape(B, T, D) for i in range(3)]
        return [p.reshape(B, T, H, DH) for p in parts]

    def attend(q, k, v, xp, softmax, c):
        if where == "pre":
            q = q * c(scale)
        elif where == "both":
            q, k = q * c(quarter), k * c(quarter)
        logits = xp.einsum("bthd,bshd->bhts", q, k)
        if where == "post":
            logits = logits * c(scale)
        return xp.einsum("bhts,bshd->bthd", softmax(logits), v).reshape(B, T, D)

    def fn(x):
        q, k, v = split(x @ jnp.asarray(w, dt) + jnp.asarray(bias, dt), jnp)
        return attend(q, k, v, jnp, lambda z: jax.nn.softmax(z, -1), lambda s: jnp.asarray(s, dt))

    def reference(x):
        q, k, v = split(x @ w + bias, np)
        return attend(q, k, v, np, _softmax, lambda s: s)

    return fn, reference


@pytest.mark.parametrize("where", ["post", "pre", "both"])
@pytest.mark.parametrize("layout", ["gpt2", "mha", "swin"])
@pytest.mark.parametrize("tag", ["f32", "bf16"])
def test_a_fused_projection_takes_the_scale_in_q_columns_only(tag, layout, where):
    fn, reference = _fused_block(tag, layout, where)
    _, npdt = DTYPES[tag]
    x = np.random.default_rng(6).normal(0, 1, (B, T, D)).astype(np.float32).astype(npdt)
    text = jax.jit(fn).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    scales = [f for f in report.folds if f.kind == "scale"]
    assert len(scales) == (2 if where == "both" else 1), [s.to_json() for s in report.skipped]
    for fold in scales:
        assert f"its {D} of {3 * D} output channels" in fold.note, fold.note
    _judged(text, folded, x, reference, npdt, tag)


def _overlapping(read_all: bool):
    """q = y[..., :D] scaled, but k reads y[..., D/2 : 3D/2] (overlapping q's columns), or
    the whole fused output is also returned: q's columns are read unscaled elsewhere."""
    rng = np.random.default_rng(7)
    w = jnp.asarray(rng.normal(0, D ** -0.5, (D, 3 * D)), jnp.float32)

    def fn(x):
        y = jnp.tanh(x) @ w  # (tanh: the walk's other way, through x, stops there)
        q = y[..., :D].reshape(B, T, H, DH)
        start = 2 * D if read_all else D // 2
        k = y[..., start:start + D].reshape(B, T, H, DH)
        logits = jnp.einsum("bthd,bshd->bhts", q, k) * jnp.float32(0.3)
        return (jax.nn.softmax(logits, -1), y) if read_all else jax.nn.softmax(logits, -1)

    return fn


@pytest.mark.parametrize("read_all", [False, True])
def test_a_fused_projection_whose_q_columns_are_read_elsewhere_is_refused(read_all):
    fn = _overlapping(read_all)
    x = np.random.default_rng(8).normal(0, 1, (B, T, D)).astype(np.float32)
    text = jax.jit(fn).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)
    assert not [f for f in report.folds if f.kind == "scale"]
    refusals = [s for s in report.skipped if "the scale 0.3" in s.reason]
    assert refusals and refusals[0].code == "users", [s.to_json() for s in report.skipped]
    assert ("also read by func.return" if read_all else "stablehlo.slice") in refusals[0].reason, \
        refusals[0].reason
    check_close(run_xla(folded, [x]), run_xla(text, [x]), "f32")


def _judged(text: str, folded: str, x: np.ndarray, reference, npdt, tag: str) -> None:
    """Output against the original on XLA, and both against `reference` in float64: the
    original within 50 units of roundoff of it (the reference computes the same thing),
    the output no less accurate than the original (1.5x plus one unit)."""
    original, output = run_xla(text, [x]), run_xla(folded, [x])
    check_close(output, original, tag)
    ref = reference(x.astype(np.float64))
    before, after = relative_error(original[0], ref), relative_error(output[0], ref)
    unit = float(ml_dtypes.finfo(npdt).eps) / 2
    assert before < 50 * unit, before
    assert after <= 1.5 * before + unit, (before, after)
