"""Small transformer pieces in plain JAX, Flax nnx and Equinox, exported to StableHLO text
(random weights; the tests of fold-scale judge them on XLA against the original and
float64). Each builder returns `(mlir text, number of constant scales it has)`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def _export(fn, *specs) -> str:
    return str(export.export(jax.jit(fn))(*specs).mlir_module())


def _weights(seed: int, dtype, *shapes, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=s) * scale, dtype) for s in shapes]


def rms_norm(x, w, eps=1e-6, gemma=False):
    """RMSNorm over the last axis (Gemma: times 1 + w)."""
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1 + w) if gemma else w)


def rope(x, positions):
    """Rotary embedding of the last axis (rotate-half form), positions [S]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / 10000 ** (jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, None].astype(jnp.float32) * freqs[None]
    angles = jnp.concatenate([angles, angles], -1)[:, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + jnp.concatenate([-x2, x1], -1) * sin


def attention(*, dtype: str = "f32", use_rope: bool = False, qk_norm: bool = False,
              kv_heads: int = 4, divide: bool = False, bias: bool = False, seq: int = 6,
              model: int = 32, heads: int = 4, head_dim: int = 12, seed: int = 0) -> tuple[str, int]:
    """One attention block: x Wq (+ bq), heads, optional QK-norm (Qwen3) and RoPE, GQA
    (kv_heads < heads: k and v repeated), scores times 1/sqrt(head_dim) (or divided)."""
    dt = DTYPES[dtype]
    wq, wk, wv, wo, bq, qn, kn = _weights(seed, dt, (model, heads * head_dim),
                                          (model, kv_heads * head_dim),
                                          (model, kv_heads * head_dim), (heads * head_dim, model),
                                          (heads * head_dim,), (head_dim,), (head_dim,))
    qn, kn = qn + 1, kn + 1

    def block(x):
        s = x.shape[0]
        q = x @ wq + (bq if bias else 0)
        q = q.reshape(s, heads, head_dim)
        k = (x @ wk).reshape(s, kv_heads, head_dim)
        v = (x @ wv).reshape(s, kv_heads, head_dim)
        if qk_norm:
            q, k = rms_norm(q, qn), rms_norm(k, kn)
        if use_rope:
            positions = jnp.arange(s)
            q, k = rope(q, positions), rope(k, positions)
        if kv_heads != heads:
            k = jnp.repeat(k, heads // kv_heads, axis=1)
            v = jnp.repeat(v, heads // kv_heads, axis=1)
        scores = jnp.einsum("qhd,khd->hqk", q, k)
        if divide:
            scores = scores / jnp.asarray(math.sqrt(head_dim), dt)
        else:
            scores = scores * jnp.asarray(1 / math.sqrt(head_dim), dt)
        p = jax.nn.softmax(scores, axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v).reshape(s, heads * head_dim) @ wo

    return _export(block, jax.ShapeDtypeStruct((seq, model), dt)), 1


def gemma(*, dtype: str = "f32", tied: bool = True, cap: float = 30.0, vocab: int = 40,
          model: int = 32, seq: int = 5, seed: int = 1) -> tuple[str, int]:
    """Embedding `table[ids] * sqrt(model)`, an MLP, Gemma's final norm `(1 + w)`, the LM
    head (the table itself when `tied`) and Gemma 2's soft-cap `tanh(logits / cap) * cap`."""
    dt = DTYPES[dtype]
    table, head, w1, fw = _weights(seed, dt, (vocab, model), (model, vocab), (model, model),
                                   (model,))

    def lm(ids):
        h = table[ids] * jnp.asarray(math.sqrt(model), dt)
        h = h + jax.nn.relu(h @ w1)
        h = rms_norm(h, fw, gemma=True)
        logits = h @ (table.T if tied else head)
        return jnp.tanh(logits / jnp.asarray(cap, dt)) * jnp.asarray(cap, dt)

    return _export(lm, jax.ShapeDtypeStruct((seq,), jnp.int32)), 2


def flax_mha(*, dtype: str = "f32", normalize_qk: bool = False, seed: int = 2) -> tuple[str, int]:
    """Flax nnx MultiHeadAttention (self-attention; `query / sqrt(depth)` on q)."""
    from flax import nnx

    dt = DTYPES[dtype]
    layer = nnx.MultiHeadAttention(num_heads=4, in_features=32, qkv_features=32, decode=False,
                                   normalize_qk=normalize_qk, dtype=dt, param_dtype=dt,
                                   rngs=nnx.Rngs(seed))
    if normalize_qk:  # random norm weights (all ones would look folded already)
        rng = np.random.default_rng(seed)
        for norm in (layer.query_ln, layer.key_ln):
            norm.scale[...] = jnp.asarray(1 + 0.3 * rng.normal(size=norm.scale[...].shape), dt)
    graph, state = nnx.split(layer)

    def block(x):
        return nnx.merge(graph, state)(x)

    return _export(block, jax.ShapeDtypeStruct((2, 6, 32), dt)), 1


def equinox_mha(*, dtype: str = "f32", seed: int = 3) -> tuple[str, int]:
    """Equinox MultiheadAttention (self-attention, `q / sqrt(qk_size)` before the dot)."""
    import equinox as eqx

    dt = DTYPES[dtype]
    layer = eqx.nn.MultiheadAttention(4, 32, key=jax.random.PRNGKey(seed), dtype=dt)

    def block(x):
        return layer(x, x, x)

    return _export(block, jax.ShapeDtypeStruct((6, 32), dt)), 1


def helpers(*, where: str = "core", layers: int = 2, dtype: str = "f32", model: int = 32,
            heads: int = 4, head_dim: int = 8, seq: int = 6) -> tuple[str, int]:
    """Residual layers whose pieces are `jax.jit` helpers (private functions called from
    main, one call per layer): `where` = "core" (the scaled `softmax(q k^T * c) v`, q from
    the caller's `x Wq`), "proj" (`rope(x Wq)`, scaled by the caller) or "norm" (a
    Gemma-style RMSNorm `(1 + w)` read by the caller's gate and up projections)."""
    dt = DTYPES[dtype]
    scale = jnp.asarray(1 / math.sqrt(head_dim), dt)

    @jax.jit
    def core(q, k, v):
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k) * scale, axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    @jax.jit
    def proj(x, wq):
        return rope((x @ wq).reshape(x.shape[0], heads, head_dim), jnp.arange(x.shape[0]))

    @jax.jit
    def norm(x, w):
        return rms_norm(x, w, gemma=True)

    def layer(x, seed):
        wq, wk, wv, wo, w = _weights(seed, dt, *[(model, heads * head_dim)] * 3,
                                     (heads * head_dim, model), (model,))
        if where == "norm":
            h = norm(x, w)
            return jax.nn.silu(h @ wq) * (h @ wk) @ wo
        s = x.shape[0]
        k = (x @ wk).reshape(s, heads, head_dim)
        v = (x @ wv).reshape(s, heads, head_dim)
        if where == "core":
            o = core((x @ wq).reshape(s, heads, head_dim), k, v)
        else:
            q = proj(x, wq) * scale
            o = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k), -1), v)
        return o.reshape(s, heads * head_dim) @ wo

    def f(x):
        for seed in range(layers):
            x = x + layer(x, seed)
        return x

    return _export(f, jax.ShapeDtypeStruct((seq, model), dt)), layers


def llama(*, layers: int = 2, dtype: str = "f32", model: int = 32, heads: int = 4,
          head_dim: int = 8, hidden: int = 48, seq: int = 6, post_norm_in: int | None = None,
          seed: int = 4) -> tuple[str, int]:
    """Pre-norm Llama blocks, each under `jax.named_scope("layers.<i>")` (its ops are named
    `jit(f)/layers.<i>/...`): RMSNorm into q, k, v; the attention scale; RMSNorm into gate
    and up; a final RMSNorm into the head (outside every block). In block `post_norm_in`
    the MLP's normalized value is also added to the residual (a use that is not linear).
    Returns (text, number of norms + constant scales)."""
    dt = DTYPES[dtype]

    def f(x):
        for i in range(layers):
            wq, wk, wv, wo, wg, wu, wd, n1, n2 = _weights(
                seed + i, dt, *[(model, heads * head_dim)] * 3, (heads * head_dim, model),
                (model, hidden), (model, hidden), (hidden, model), (model,), (model,))
            with jax.named_scope(f"layers.{i}"):
                s = x.shape[0]
                h = rms_norm(x, n1 + 1)
                q, k, v = ((h @ w).reshape(s, heads, head_dim) for w in (wq, wk, wv))
                scores = jnp.einsum("qhd,khd->hqk", q, k) * jnp.asarray(1 / math.sqrt(head_dim), dt)
                o = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, -1), v)
                x = x + o.reshape(s, heads * head_dim) @ wo
                h = rms_norm(x, n2 + 1)
                x = x + (jax.nn.silu(h @ wg) * (h @ wu)) @ wd + (h if i == post_norm_in else 0)
        fn, head = _weights(seed + layers, dt, (model,), (model, 40))
        return rms_norm(x, fn + 1) @ head

    return _export(f, jax.ShapeDtypeStruct((seq, model), dt)), 3 * layers + 1


def gemma_block(*, dtype: str = "f32", tied: bool = True, model: int = 32, vocab: int = 48,
                seq: int = 8, seed: int = 1) -> str:
    """Gemma's scaled embedding with a tied head, as HF computes it: `table[ids] *
    sqrt(model)` in the model's type, an RMSNorm `(1 + w)` (statistics and weight in f32,
    the result back in the model's type) read by a linear layer, a residual MLP, the final
    norm, and the LM head (the table itself when `tied`)."""
    dt = DTYPES[dtype]
    table, head, w1, w2, nw, fw = _weights(seed, dt, (vocab, model), (model, vocab),
                                           (model, 2 * model), (2 * model, model), (model,),
                                           (model,))

    def norm(x, w):
        return rms_norm(x.astype(jnp.float32), w.astype(jnp.float32), gemma=True).astype(dt)

    def lm(ids):
        h = table[ids] * jnp.asarray(math.sqrt(model), dt)
        h = h + jax.nn.relu(norm(h, nw) @ w1) @ w2
        return norm(h, fw) @ (table.T if tied else head)

    return _export(lm, jax.ShapeDtypeStruct((seq,), jnp.int32))
