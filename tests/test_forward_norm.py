"""forward-norm on numbers: transformer norm blocks from plain JAX, Flax nnx, Equinox and
Keras, folded, run on XLA CPU against the original and against a float64 numpy
evaluation of the same math (the original's parameters, no roundings).

Each case says how many norms must fold (into how many layers) or which refusal code a
norm must get; the folded module must match the original within the dtype's tolerance
and be no less accurate against float64 than the original (1.5x its error plus one unit
of roundoff of the output type: the precision contract).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import bnfold
from numerics import check_close, relative_error, run_xla

os.environ.setdefault("KERAS_BACKEND", "jax")

jax = pytest.importorskip("jax")
jnp = jax.numpy

D, F, T = 64, 48, 8
B = 8  # input rows: each output's error is the worst over B * T tokens
DTYPES = {"f32": (jnp.float32, np.float32), "bf16": (jnp.bfloat16, ml_dtypes.bfloat16)}


@dataclass
class Case:
    fn: Callable  # the jax function of x
    reference: Callable[[np.ndarray], list[np.ndarray]]  # float64 numpy of the same math
    folds: list[int]  # per folded norm, how many layers it went into
    refused: tuple[str, ...] = ()  # refusal codes some norm must get
    says: str = ""  # what one of those refusals must name (the use that stops the norm)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _param(rng, shape, dtype, mean=0.0, sd=0.3) -> np.ndarray:
    """A parameter rounded to `dtype`, as float64 (exactly the values the module holds)."""
    return rng.normal(mean, sd, shape).astype(np.float32).astype(dtype).astype(np.float64)


def _input(dtype) -> np.ndarray:
    rng = _rng(1)
    x = rng.normal(0, 1, (B, T, D)) * rng.uniform(0.5, 2, (B, T, 1)) + rng.normal(0, 1, (B, T, 1))
    return x.astype(np.float32).astype(dtype)


def _ln64(x, g, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _rms64(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1 + np.exp(-x))


# --- plain JAX blocks (Hugging Face's arithmetic: f32 statistics, the normalized value
# converted back to the model dtype, then multiplied by the weight) ---------------------


def llama_qkv(tag: str) -> Case:
    dt, npdt = DTYPES[tag]
    rng = _rng()
    w = _param(rng, D, npdt, 1.0)
    ws = [_param(rng, (D, F), npdt, 0, D ** -0.5) for _ in range(3)]

    def fn(x):
        x32 = x.astype(jnp.float32)
        n = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
        h = jnp.asarray(w, dt) * n.astype(dt)
        return tuple(h @ jnp.asarray(k, dt) for k in ws)

    return Case(fn, lambda x: [_rms64(x, w, 1e-6) @ k for k in ws], [3])


def llama_gate_up(tag: str) -> Case:
    dt, npdt = DTYPES[tag]
    rng = _rng(2)
    w = _param(rng, D, npdt, 1.0)
    wg, wu = (_param(rng, (D, F), npdt, 0, D ** -0.5) for _ in range(2))
    wd = _param(rng, (F, D), npdt, 0, F ** -0.5)

    def fn(x):
        x32 = x.astype(jnp.float32)
        n = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
        h = n.astype(dt) * jnp.asarray(w, dt)
        return ((jax.nn.silu(h @ jnp.asarray(wg, dt)) * (h @ jnp.asarray(wu, dt)))
                @ jnp.asarray(wd, dt),)

    def reference(x):
        h = _rms64(x, w, 1e-6)
        return [(_silu(h @ wg) * (h @ wu)) @ wd]

    return Case(fn, reference, [2])


def gemma_qkv(tag: str) -> Case:
    """Gemma: `(1 + w)` multiplied in f32, the result converted to the model dtype."""
    dt, npdt = DTYPES[tag]
    rng = _rng(3)
    w = _param(rng, D, np.float32, 0.0)
    ws = [_param(rng, (D, F), npdt, 0, D ** -0.5) for _ in range(3)]

    def fn(x):
        x32 = x.astype(jnp.float32)
        n = x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)
        h = (n * (1.0 + jnp.asarray(w, jnp.float32))).astype(dt)
        return tuple(h @ jnp.asarray(k, dt) for k in ws)

    return Case(fn, lambda x: [_rms64(x, 1 + w, 1e-6) @ k for k in ws], [3])


def gpt2_ln_qkv(tag: str) -> Case:
    """LayerNorm (gamma and beta) read by Q, K, V with biases (GPT-2 / ViT)."""
    dt, npdt = DTYPES[tag]
    rng = _rng(4)
    g, b = _param(rng, D, npdt, 1.0), _param(rng, D, npdt, 0.0)
    ws = [_param(rng, (D, F), npdt, 0, D ** -0.5) for _ in range(3)]
    bs = [_param(rng, F, npdt, 0.0, 0.1) for _ in range(3)]

    def fn(x):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        h = ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(dt) * jnp.asarray(g, dt) + \
            jnp.asarray(b, dt)
        return tuple(h @ jnp.asarray(k, dt) + jnp.asarray(c, dt) for k, c in zip(ws, bs))

    def reference(x):
        h = _ln64(x, g, b, 1e-5)
        return [h @ k + c for k, c in zip(ws, bs)]

    return Case(fn, reference, [3])


def bert_post_norm(tag: str) -> Case:
    """Post-norm: the LayerNorm's output also feeds the residual add."""
    dt, npdt = DTYPES[tag]
    rng = _rng(5)
    g, b = _param(rng, D, npdt, 1.0), _param(rng, D, npdt, 0.0)
    w1 = _param(rng, (D, F), npdt, 0, D ** -0.5)
    w2 = _param(rng, (F, D), npdt, 0, F ** -0.5)

    def fn(x):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        h = ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(dt) * jnp.asarray(g, dt) + \
            jnp.asarray(b, dt)
        return (h + jax.nn.relu(h @ jnp.asarray(w1, dt)) @ jnp.asarray(w2, dt),)

    def reference(x):
        h = _ln64(x, g, b, 1e-5)
        return [h + np.maximum(h @ w1, 0) @ w2]

    return Case(fn, reference, [], ("nonlinear-consumer",))


# --- steps between a norm and its layers (forward_norm.PATH_LAWS) ----------------------


def _ln_head(tag: str, seed: int, between: Callable, between64: Callable, *,
             shift: bool = True) -> tuple[Callable, Callable]:
    """LayerNorm (RMSNorm where not `shift`), `between`, then a classifier with a bias."""
    dt, npdt = DTYPES[tag]
    rng = _rng(seed)
    g = _param(rng, D, npdt, 1.0)
    b = _param(rng, D, npdt, 0.0, 0.5) if shift else np.zeros(D)
    w = _param(rng, (D, F), npdt, 0, D ** -0.5)
    c = _param(rng, F, npdt, 0.0, 0.1)

    def fn(x):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True) if shift else 0.0
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        h = ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(dt) * jnp.asarray(g, dt)
        if shift:
            h = h + jnp.asarray(b, dt)
        return (between(h) @ jnp.asarray(w, dt) + jnp.asarray(c, dt),)

    def reference(x):
        h = _ln64(x, g, b, 1e-5) if shift else _rms64(x - 0.0, g, 1e-5)
        return [between64(h) @ w + c]

    return fn, reference


def vit_cls_head(tag: str) -> Case:
    """ViT: the final norm's CLS token (a slice on the token axis) into the classifier."""
    return Case(*_ln_head(tag, 9, lambda h: h[:, 0], lambda h: h[:, 0]), [1])


def _pooled(tag: str, *functions) -> Case:
    """In bf16 jnp sums in f32 and rounds the pooled value to bf16: the shift may not cross
    that narrowing convert (precision rule 4); the refusal must say so."""
    if tag == "bf16":
        return Case(*functions, [], ("narrowing-convert",), "cannot move across")
    return Case(*functions, [1])


def mean_pool_head(tag: str) -> Case:
    """Swin / ConvNeXt: the final norm, a mean over the tokens (reduce + divide), the head."""
    return _pooled(tag, *_ln_head(tag, 10, lambda h: h.mean(1), lambda h: h.mean(1)))


def sum_pool_head(tag: str) -> Case:
    """A sum without the divide: the shift reaches the head T times."""
    return _pooled(tag, *_ln_head(tag, 11, lambda h: h.sum(1), lambda h: h.sum(1)))


def rms_mean_pool_head(tag: str) -> Case:
    """An RMSNorm (no shift) before the mean: its scale crosses the bf16 rounding too."""
    return Case(*_ln_head(tag, 18, lambda h: h.mean(1), lambda h: h.mean(1), shift=False), [1])


def _pad(h, low, high):
    return jax.lax.pad(h, jnp.zeros((), h.dtype), [(0, 0, 0), (low, high, 0), (0, 0, 0)])


def _pad64(h, low, high):
    return np.pad(h, [(0, 0), (low, high), (0, 0)])


def zero_pad_head(tag: str) -> Case:
    """Swin's F.pad with zero widths (the window divides the map): the identity."""
    return Case(*_ln_head(tag, 12, lambda h: _pad(h, 0, 0), lambda h: _pad64(h, 0, 0)), [1])


def roll_head(tag: str) -> Case:
    """Swin's torch.roll (slices concatenated back on the token axis) before the layer."""
    return Case(*_ln_head(tag, 19, lambda h: jnp.roll(h, 3, 1), lambda h: np.roll(h, 3, 1)),
                [1])


def pad_layer_norm(tag: str) -> Case:
    """A real pad after a LayerNorm: the padded tokens read 0, not beta: refused."""
    return Case(*_ln_head(tag, 13, lambda h: _pad(h, 1, 2), lambda h: _pad64(h, 1, 2)), [],
                ("padding",), "adds positions")


def pad_rms_norm(tag: str) -> Case:
    """A real pad after an RMSNorm (no shift): pad(n g, 0) = pad(n, 0) g folds."""
    return Case(*_ln_head(tag, 14, lambda h: _pad(h, 1, 2), lambda h: _pad64(h, 1, 2),
                          shift=False), [1])


def feature_slice(tag: str) -> Case:
    """A slice of the features: gamma's other half would be lost: refused."""
    return Case(*_ln_head(tag, 15, lambda h: h[..., : D // 2] @ jnp.ones((D // 2, D), h.dtype),
                          lambda h: h[..., : D // 2] @ np.ones((D // 2, D))), [],
                ("axis",), "slices the feature axis")


def returned_norm(tag: str) -> Case:
    """DINOv2: the final norm's CLS token is the model's output."""
    dt, npdt = DTYPES[tag]
    rng = _rng(16)
    g, b = _param(rng, D, npdt, 1.0), _param(rng, D, npdt, 0.0)

    def fn(x):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        h = ((x32 - m) * jax.lax.rsqrt(v + 1e-5)).astype(dt) * jnp.asarray(g, dt) + \
            jnp.asarray(b, dt)
        return (h[:, 0],)

    return Case(fn, lambda x: [_ln64(x, g, b, 1e-5)[:, 0]], [], ("nonlinear-consumer",),
                "func.return")


def sandwich_norm(tag: str) -> Case:
    """Gemma 2/3: a norm after the attention output, read only by the residual add."""
    dt, npdt = DTYPES[tag]
    rng = _rng(17)
    w = _param(rng, D, np.float32, 0.0)
    wo = _param(rng, (D, D), npdt, 0, D ** -0.5)

    def fn(x):
        a = (x @ jnp.asarray(wo, dt)).astype(jnp.float32)
        n = a * jax.lax.rsqrt((a * a).mean(-1, keepdims=True) + 1e-6)
        return (x + (n * (1.0 + jnp.asarray(w, jnp.float32))).astype(dt),)

    return Case(fn, lambda x: [x + _rms64(x @ wo, 1 + w, 1e-6)], [], ("nonlinear-consumer",),
                "stablehlo.add")


# --- frameworks -----------------------------------------------------------------------


def nnx_block(kind: str, tag: str) -> Case:
    nnx = pytest.importorskip("flax.nnx")
    dt, _ = DTYPES[tag]
    rng = _rng(6)
    r = nnx.Rngs(0)
    norm = (nnx.LayerNorm(D, dtype=dt, param_dtype=jnp.float32, rngs=r) if kind == "ln"
            else nnx.RMSNorm(D, dtype=dt, param_dtype=jnp.float32, rngs=r))
    g = _param(rng, D, np.float32, 1.0)
    norm.scale[...] = jnp.asarray(g, jnp.float32)
    b = _param(rng, D, np.float32, 0.0) if kind == "ln" else np.zeros(D)
    if kind == "ln":
        norm.bias[...] = jnp.asarray(b, jnp.float32)
    q = nnx.Linear(D, F, dtype=dt, param_dtype=jnp.float32, rngs=r)
    k = nnx.Linear(D, F, use_bias=False, dtype=dt, param_dtype=jnp.float32, rngs=r)
    wq, bq, wk = (np.asarray(a, np.float64) for a in (q.kernel[...], q.bias[...], k.kernel[...]))

    def fn(x):
        h = norm(x)
        return q(h), k(h)

    def reference(x):
        h = _ln64(x, g, b, 1e-6) if kind == "ln" else _rms64(x, g, 1e-6)
        return [h @ wq + bq, h @ wk]

    # bf16 LayerNorm: the f32 affine's shift is rounded to bf16 before the layers
    # (a narrowing convert a shift may not cross: README rule 4).
    if kind == "ln" and tag == "bf16":
        return Case(fn, reference, [], ("narrowing-convert",))
    return Case(fn, reference, [2])


def equinox_block(tag: str) -> Case:
    eqx = pytest.importorskip("equinox")
    dt, npdt = DTYPES[tag]
    rng = _rng(7)
    g, b = _param(rng, D, npdt, 1.0), _param(rng, D, npdt, 0.0)
    ln = eqx.nn.LayerNorm(D, dtype=dt)
    ln = eqx.tree_at(lambda m: (m.weight, m.bias), ln, (jnp.asarray(g, dt), jnp.asarray(b, dt)))
    q = eqx.nn.Linear(D, F, key=jax.random.PRNGKey(0), dtype=dt)
    k = eqx.nn.Linear(D, F, key=jax.random.PRNGKey(1), dtype=dt)
    wq, bq, wk, bk = (np.asarray(a, np.float64) for a in (q.weight, q.bias, k.weight, k.bias))

    def fn(x):
        h = jax.vmap(jax.vmap(ln))(x)
        return jax.vmap(jax.vmap(q))(h), jax.vmap(jax.vmap(k))(h)

    def reference(x):
        h = _ln64(x, g, b, 1e-5)
        return [h @ wq.T + bq, h @ wk.T + bk]

    if tag == "bf16":
        return Case(fn, reference, [], ("narrowing-convert",))
    return Case(fn, reference, [2])


def keras_block(tag: str) -> Case:
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("keras is not on the jax backend")
    rng = _rng(8)
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32" if tag == "f32" else "bfloat16")
    try:
        inp = keras.Input((T, D))
        norm = keras.layers.LayerNormalization()
        h = norm(inp)
        q, k = keras.layers.Dense(F), keras.layers.Dense(F, use_bias=False)
        model = keras.Model(inp, [q(h), k(h)])
    finally:
        keras.config.set_dtype_policy(policy)
    _, npdt = DTYPES[tag]
    g, b = _param(rng, D, npdt, 1.0), _param(rng, D, npdt, 0.0)
    # Every parameter from this case's rng: Keras' own initializers draw from an unseeded
    # global generator, which made the numbers (and the test's outcome) change per run.
    wq, bq, wk = _param(rng, (D, F), npdt, 0.0, D ** -0.5), _param(rng, F, npdt), \
        _param(rng, (D, F), npdt, 0.0, D ** -0.5)
    for variable, value in ((norm.gamma, g), (norm.beta, b), (q.kernel, wq), (q.bias, bq),
                            (k.kernel, wk)):
        variable.assign(value)
    eps = float(norm.epsilon)

    def reference(x):
        h = _ln64(x, g, b, eps)
        return [h @ wq + bq, h @ wk]

    if tag == "bf16":
        return Case(lambda x: tuple(model(x)), reference, [], ("narrowing-convert",))
    return Case(lambda x: tuple(model(x)), reference, [2])


CASES: dict[str, Callable[[str], Case]] = {
    "llama_qkv": llama_qkv,
    "llama_gate_up": llama_gate_up,
    "gemma_qkv": gemma_qkv,
    "gpt2_ln_qkv": gpt2_ln_qkv,
    "bert_post_norm": bert_post_norm,
    "vit_cls_head": vit_cls_head,
    "mean_pool_head": mean_pool_head,
    "sum_pool_head": sum_pool_head,
    "rms_mean_pool_head": rms_mean_pool_head,
    "zero_pad_head": zero_pad_head,
    "pad_layer_norm": pad_layer_norm,
    "roll_head": roll_head,
    "pad_rms_norm": pad_rms_norm,
    "feature_slice": feature_slice,
    "returned_norm": returned_norm,
    "sandwich_norm": sandwich_norm,
    "nnx_layer_norm": lambda tag: nnx_block("ln", tag),
    "nnx_rms_norm": lambda tag: nnx_block("rms", tag),
    "equinox_layer_norm": equinox_block,
    "keras_layer_normalization": keras_block,
}


def _layers(fold) -> int:
    note = fold.note
    return int(note.split()[2]) if note.startswith("folded into") else 1


@pytest.mark.parametrize("tag", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_norm_blocks_fold_and_keep_their_numerics(name, tag):
    case = CASES[name](tag)
    _, npdt = DTYPES[tag]
    x = _input(npdt)
    text = jax.jit(case.fn).lower(jnp.asarray(x)).as_text()
    folded, report = bnfold.fold_text(text)

    norms = [f for f in report.folds if f.kind == "normalization"]
    assert sorted(_layers(f) for f in norms) == sorted(case.folds), report.to_text() \
        if hasattr(report, "to_text") else [f.to_json() for f in report.folds]
    codes = {s.code for s in report.skipped}
    for code in case.refused:
        assert code in codes, [s.to_json() for s in report.skipped]
    if case.says:
        assert any(s.code in case.refused and case.says in s.reason for s in report.skipped), \
            [s.to_json() for s in report.skipped]

    original = run_xla(text, [x])
    output = run_xla(folded, [x])
    check_close(output, original, tag)
    reference = case.reference(x.astype(np.float64))
    unit = float(ml_dtypes.finfo(npdt).eps) / 2
    for i, (o, f, r) in enumerate(zip(original, output, reference, strict=True)):
        before, after = relative_error(o, r), relative_error(f, r)
        assert before < 50 * unit, (i, before)  # the reference computes the same thing
        assert after <= 1.5 * before + unit, (i, before, after)
