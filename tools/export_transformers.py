#!/usr/bin/env python3
"""Export small transformer models (HF transformers, torchvision) to StableHLO text through torchax.

Real layer stacks from their libraries, with small random configurations, in eval mode,
turned into JAX with ``torchax.extract_jax`` and exported with ``jax.export`` with every
parameter and buffer CLOSED OVER, so they arrive as ``stablehlo.constant`` ops and
``@main`` takes only the model's inputs (token ids, or an image batch). For the tests of
issue 34: norm affines that fold forward into the linear layers after them
(``forward-norm``) and constant scales that fold into a weight (``fold-scale``).

Sizes (the full set): hidden 96, intermediate 192, 2 layers, 4 heads (head_dim 24, so
1/sqrt(head_dim) is not a power of two), 2 KV heads, vocab 256, batch 1, seq 16; images
1x3x32x32 (patch 8; Swin patch 2, window 4, embed 48; ConvNeXt channels 48, 96).

Models (``--only`` takes these names, comma-separated; the file is ``<name>.mlir``):

    hf_llama_tied / hf_llama_untied   LlamaForCausalLM, RMSNorm, RoPE, GQA (4 heads, 2 KV
                                      heads), SwiGLU; LM head tied to the embedding, or not
    hf_llama_sdpa                     hf_llama_untied with attn_implementation="sdpa" (HF's
                                      default; torchax's own lowering of the fused attention)
    hf_mistral                        MistralForCausalLM (Llama's layout, sliding window)
    hf_qwen3                          Qwen3ForCausalLM: QK-norm (an RMSNorm on each head's
                                      q and k before RoPE), tied head
    hf_gemma                          GemmaForCausalLM: RMSNorm with (1 + w), sqrt(hidden)
                                      embedding scale, tied head, GeGLU
    hf_gemma2                         Gemma2ForCausalLM: sandwich norms (pre and post attention
                                      and MLP), attention soft-cap 50, final logit soft-cap 30,
                                      query_pre_attn_scalar
    hf_gemma3                         Gemma3ForCausalLM (text): sandwich norms and QK-norm with
                                      (1 + w), scaled embedding
    hf_gpt2                           GPT2LMHeadModel: pre-norm LayerNorm, Conv1D linears (fused
                                      c_attn), learned positions, tied head
    hf_bert                           BertModel: post-norm LayerNorm (the norm's value is the
                                      residual stream), embedding LayerNorm, pooler
    hf_vit                            ViTForImageClassification, pre-norm, 10 labels
    hf_dinov2                         Dinov2Model: pre-norm with per-channel layer scales
    tv_vit                            torchvision.models.VisionTransformer (nn.MultiheadAttention)
    tv_swin                           torchvision.models.SwinTransformer (shifted windows,
                                      patch merging LayerNorm, q * head_dim^-0.5)
    tv_convnext                       torchvision.models.ConvNeXt (LayerNorm over channels after a
                                      depthwise conv, per-channel layer scale, LayerNorm2d)
    ..._bf16                          hf_llama_untied and hf_gemma2 cast whole to bfloat16 (as
                                      HF's torch_dtype=torch.bfloat16 loads them)
    ..._args                          hf_llama_untied, hf_gpt2, tv_vit with the parameters as
                                      @main arguments (jax.export of the extracted function:
                                      the parameters first, as one flattened pytree, then the input)

HF attention runs with ``attn_implementation="eager"`` (the explicit ``q @ k^T * scaling``
of HF's eager path), except hf_llama_sdpa (HF's default, sdpa: torchax lowers
``scaled_dot_product_attention`` with its own jax code).
Every norm's affine is random, so nothing folds trivially: gamma ~ U(0.5, 1.5) and
beta ~ N(0, 0.3) (Gemma stores w of ``1 + w``: w ~ N(0, 0.3)); DINOv2's and ConvNeXt's layer
scales ~ U(0.5, 1.5); linear biases ~ N(0, 0.1). Weights come from the library's (seeded)
initializer, except that embeddings are N(0, 1) / sqrt(hidden) (GPT-2's and BERT's tiny
default init would make everything look linear). Seeds are fixed.

The ``small`` set (``--small``: hidden 16, 2 heads, vocab 32, seq 8, 16x16 images, so each
file is under 300 KB; 8 of the models) is what testdata/transformers/ holds; ``--out``
defaults to /work/exports/transformers (or testdata/transformers with --small).

Every norm, attention, scaled-embedding and layer-scale module's forward runs under
``jax.named_scope("<norm|attn|emb|ls>:<module path>")``, so each op's location names its
module (``jit(<lambda>)/norm:lm.model.layers.0.input_layernorm/aten::mul.Tensor/mul``) and
so does bnfold's report: that is how ``--measure`` attributes folds and refusals to
modules. Only locations change, not ops.

Output: ``<name>.mlir`` per model and ``manifest.json``, a list of
``{"file", "model", "library", "class", "description", "dtype", "params_as_args",
"inputs": [{"shape", "dtype", "kind", "high"}], "output_shape", "norms", "norm_modules",
"scales", "scopes", "verify": {"reference", "max_rel_err", "rtol"}}`` (and, after
``--measure DIR --record``, "bnfold_min": the norms and scales bnfold folded then).
``scopes`` lists the module paths by scope kind. ``norms`` is the number of
normalization modules with an affine (LayerNorm with elementwise_affine, *RMSNorm with a
weight, torchvision's LayerNorm2d), ``scales`` a dict of constant scales by kind:
``attention`` (one per attention module: its 1/sqrt(d)), ``embedding`` (Gemma's
sqrt(hidden)), ``attention_softcap`` and ``logit_softcap`` (Gemma 2: the ``x / cap`` before
each tanh), ``layer_scale`` (DINOv2, ConvNeXt: per-channel). All are counted from the
model definition (module tree and config), never from the IR. Token inputs are integers in
[0, "high") (the vocabulary), images N(0, 1).

Unless ``--no-verify`` is given, each file is checked: ``@main`` takes exactly the model's
inputs (or the parameters and the inputs for ``_args``), XLA CPU runs the text, and its output
matches torch eager on the same input within "rtol" of max|reference| (f32: 1e-4; bf16 models:
against the bf16 torch eager output, 0.1, and the error against the f32 model is reported).

Environment (its own virtualenv, e.g. /work/venv-torch, Python 3.11), versions run with:
    jax==0.10.2 jaxlib==0.10.2 numpy==2.4.6 torch==2.14.1 torchvision==0.29.1
    torchax==0.0.13 transformers==5.24.0
    pip install jax==0.10.2 jaxlib==0.10.2 torch==2.14.1 torchvision==0.29.1 torchax==0.0.13 transformers
torchax 0.0.13 still fails to import with torch 2.14.1 (``aten::prod.dim_Dimname``): this
script imports it through tools/export_testdata.py's shim.

    python tools/export_transformers.py                  # all, to /work/exports/transformers
    python tools/export_transformers.py --only hf_llama_tied,tv_swin
    python tools/export_transformers.py --small          # testdata/transformers

Measuring bnfold on them (``--measure DIR``: needs bnfold and jax only, no torch): each file
is folded with ``python -m bnfold FILE --report R -o OUT`` (into DIR/folded/), every norm
affine and constant scale of the manifest is found folded or missed (with the refusals
recorded in its module's scope), both modules run on XLA CPU with the same seeded inputs
(token ids in [0, vocab)) and against the original evaluated in float64, and
DIR/coverage.json and DIR/coverage.md (a table per model, every miss with a verdict: a
bnfold gap, or genuinely unfoldable) are written:

    python tools/export_transformers.py --measure /work/exports/transformers
    python tools/export_transformers.py --measure testdata/transformers --record

Run time on 2 loaded CPU cores: the full export about 2 minutes (the first model ~20 s of
imports), --small about 2 minutes, --measure about 1-3 s per model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("/work/exports/transformers")
SMALL_OUT = REPO_ROOT / "testdata" / "transformers"
SMALL_MAX_BYTES = 300 * 1024
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclasses.dataclass
class Sizes:
    """The config sizes: the full set (hidden 96: head_dim 24, so the attention scale
    1/sqrt(24) is not a power of two and rounds into the kernel) or --small (hidden 16,
    head_dim 8)."""

    hidden: int = 96
    intermediate: int = 192
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 256
    seq: int = 16
    image: int = 32
    patch: int = 8


FULL = Sizes()
SMALL = Sizes(hidden=16, intermediate=32, layers=2, heads=2, kv_heads=1, vocab=32, seq=8,
              image=16, patch=8)


@dataclasses.dataclass
class Case:
    """One model to export, with what the manifest and the verifier need."""

    name: str
    library: str  # "transformers" or "torchvision"
    description: str
    model: Any  # the torch module (eval), forward(*inputs) -> one tensor
    inputs: list[np.ndarray]  # what @main takes (int32 token ids or float images)
    input_kinds: list[dict]
    norms: int
    norm_modules: dict[str, int]
    scales: dict[str, int]
    dtype: str = "f32"
    params_as_args: bool = False
    f32_model: Any = None  # for bf16: the f32 model, whose output the error is reported against
    paths: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # scope_modules

    @property
    def file(self) -> str:
        return f"{self.name}.mlir"


# --------------------------------------------------------------------------- counting


def count_norms(model) -> tuple[int, dict[str, int]]:
    """Normalization modules with an affine, by class name (from the module tree)."""
    kinds: dict[str, int] = {}
    for m in model.modules():
        if is_norm(m):
            kinds[type(m).__name__] = kinds.get(type(m).__name__, 0) + 1
    return sum(kinds.values()), kinds


_QUERY_ATTRS = ("q_proj", "query", "c_attn", "in_proj_weight", "qkv")


def count_attention(model) -> int:
    """Attention modules that compute `q k^T` with a constant scale (they own the query
    projection: HF *Attention / *SelfAttention, nn.MultiheadAttention, Swin's
    ShiftedWindowAttention)."""
    return sum(1 for m in model.modules() if is_attention(m))


def count_layer_scales(model) -> int:
    """DINOv2's LayerScale modules and ConvNeXt blocks with a layer_scale."""
    return sum(1 for m in model.modules() if is_layer_scale(m))


def count_embedding_scales(model) -> int:
    """Gemma's *ScaledWordEmbedding (sqrt(hidden) times the looked-up rows)."""
    return sum(1 for m in model.modules() if is_embedding_scale(m))


def is_norm(m) -> bool:
    from torch import nn

    cls = type(m).__name__
    if isinstance(m, nn.LayerNorm):
        return m.elementwise_affine
    if isinstance(m, nn.GroupNorm):
        return m.affine
    return cls.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), nn.Parameter)


def is_attention(m) -> bool:
    from torch import nn

    return isinstance(m, nn.MultiheadAttention) or ("Attention" in type(m).__name__ and any(
        isinstance(getattr(m, a, None), nn.Module | nn.Parameter) for a in _QUERY_ATTRS))


def is_embedding_scale(m) -> bool:
    return type(m).__name__.endswith("ScaledWordEmbedding")


def is_layer_scale(m) -> bool:
    from torch import nn

    cls = type(m).__name__
    return cls.endswith("LayerScale") or (
        cls == "CNBlock" and isinstance(getattr(m, "layer_scale", None), nn.Parameter))


SCOPES = (("norm", is_norm), ("attn", is_attention), ("emb", is_embedding_scale),
          ("ls", is_layer_scale))


def scope_modules(model) -> dict[str, list[str]]:
    """Run each norm, attention, scaled-embedding and layer-scale module's forward under
    `jax.named_scope("<kind>:<module path>")`, so every op it emits names its module in
    the IR's locations (and so in bnfold's report). Returns the paths by kind, in
    module-tree order. Only locations change: the ops are the same."""
    import functools

    import jax

    def scoped(forward, label, *args, **kwargs):
        with jax.named_scope(label):
            return forward(*args, **kwargs)

    paths: dict[str, list[str]] = {kind: [] for kind, _ in SCOPES}
    for path, m in model.named_modules():
        for kind, test in SCOPES:
            if test(m):
                paths[kind].append(path)
                m.forward = functools.partial(scoped, m.forward, f"{kind}:{path}")
                break
    return paths


# --------------------------------------------------------------------------- randomizing


class Rand:
    def __init__(self, key: str):
        self.rng = np.random.default_rng(zlib.crc32(key.encode()))

    def uniform(self, shape, lo, hi):
        return self.rng.uniform(lo, hi, shape).astype(np.float32)

    def normal(self, shape, std):
        return self.rng.normal(0.0, std, shape).astype(np.float32)


def randomize(model, key: str, gemma: bool = False) -> None:
    """Random norm affines, layer scales, linear biases and embeddings (see the docstring)."""
    import torch
    from torch import nn

    r = Rand(key)

    def put(p, value):
        p.copy_(torch.from_numpy(value).to(p.dtype))

    with torch.no_grad():
        for m in model.modules():
            cls = type(m).__name__
            w = getattr(m, "weight", None)
            b = getattr(m, "bias", None)
            if isinstance(m, nn.LayerNorm | nn.GroupNorm) or cls.endswith("RMSNorm"):
                if isinstance(w, nn.Parameter):
                    if gemma and cls.endswith("RMSNorm"):
                        put(w, r.normal(w.shape, 0.3))  # (1 + w)
                    else:
                        put(w, r.uniform(w.shape, 0.5, 1.5))
                if isinstance(b, nn.Parameter):
                    put(b, r.normal(b.shape, 0.3))
            elif isinstance(m, nn.Embedding):
                put(m.weight, r.normal(m.weight.shape, 1.0 / math.sqrt(m.weight.shape[1])))
            else:
                if isinstance(w, nn.Parameter) and w.ndim >= 2 and not torch.any(w != 0):
                    # zero-initialised heads (torchvision ViT) would make the output constant
                    fan_in = int(np.prod(w.shape[1:]))
                    put(w, r.normal(w.shape, 1.0 / math.sqrt(fan_in)))
                if isinstance(b, nn.Parameter) and b.ndim == 1:  # linear / conv / Conv1D biases
                    put(b, r.normal(b.shape, 0.1))
            if cls.endswith("LayerScale"):
                for p in m.parameters(recurse=False):
                    put(p, r.uniform(p.shape, 0.5, 1.5))
            elif cls == "CNBlock":
                put(m.layer_scale, r.uniform(m.layer_scale.shape, 0.5, 1.5))
        # learned position embeddings / class tokens that are nn.Parameters
        for name, p in model.named_parameters():
            if any(k in name for k in ("position_embeddings", "cls_token", "pos_embedding",
                                       "class_token", "mask_token", "register_tokens")) \
                    and p.ndim >= 2:
                put(p, r.normal(p.shape, 0.5))


# --------------------------------------------------------------------------- models


def _hf_lm(name, cls_name, config_name, sz: Sizes, desc, gemma=False, **config):
    import torch
    import transformers

    torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
    cfg = getattr(transformers, config_name)(
        vocab_size=sz.vocab, hidden_size=sz.hidden, intermediate_size=sz.intermediate,
        num_hidden_layers=sz.layers, num_attention_heads=sz.heads,
        num_key_value_heads=sz.kv_heads, max_position_embeddings=4 * sz.seq,
        **{"attn_implementation": "eager", **config})
    lm = getattr(transformers, cls_name)(cfg).eval()
    randomize(lm, name, gemma=gemma)
    return lm, cfg


class _Logits:
    """forward(ids) -> logits of an HF causal LM (no cache)."""

    @staticmethod
    def wrap(lm):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = lm

            def forward(self, input_ids):
                return self.lm(input_ids=input_ids, use_cache=False).logits

        return Wrapped().eval()


def _wrap(inner, attr: str, index: int | None = None):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            out = self.inner(x)
            out = getattr(out, attr) if attr else out
            return out if index is None else out[index]

    return Wrapped().eval()


def _ids(name: str, sz: Sizes) -> tuple[list[np.ndarray], list[dict]]:
    rng = np.random.default_rng(zlib.crc32(("ids/" + name).encode()))
    ids = rng.integers(0, sz.vocab, size=(1, sz.seq)).astype(np.int32)
    return [ids], [{"kind": "token_ids", "high": sz.vocab}]


def _image(name: str, sz: Sizes) -> tuple[list[np.ndarray], list[dict]]:
    rng = np.random.default_rng(zlib.crc32(("image/" + name).encode()))
    x = rng.standard_normal((1, 3, sz.image, sz.image)).astype(np.float32)
    return [x], [{"kind": "image"}]


def lm_case(name, cls_name, config_name, sz, desc, *, gemma=False,
            attention_softcap=0, logit_softcap=0, **config) -> Case:
    lm, cfg = _hf_lm(name, cls_name, config_name, sz, desc, gemma=gemma, **config)
    norms, kinds = count_norms(lm)
    scales = {"attention": count_attention(lm), "embedding": count_embedding_scales(lm),
              "attention_softcap": attention_softcap, "logit_softcap": logit_softcap}
    inputs, kinds_in = _ids(name, sz)
    return Case(name, "transformers", desc, _Logits.wrap(lm), inputs, kinds_in, norms, kinds,
                {k: v for k, v in scales.items() if v})


def _hf_encoder(name: str, build: Callable[[], Any], desc: str, output: str,
                inputs: Callable[[str], tuple[list[np.ndarray], list[dict]]], *,
                layer_scales: bool = False) -> Case:
    """A transformers encoder (BERT, ViT, DINOv2): built under its name's seed, its weights
    and norms randomized, its norms and scales counted, `output` of its result exported."""
    import torch

    torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
    m = build().eval()
    randomize(m, name)
    norms, kinds = count_norms(m)
    x, kin = inputs(name)
    scales = {"attention": count_attention(m)}
    if layer_scales:
        scales["layer_scale"] = count_layer_scales(m)
    return Case(name, "transformers", desc, _wrap(m, output), x, kin, norms, kinds, scales)


def hf_cases(sz: Sizes) -> dict[str, Callable[[], Case]]:
    def llama(tied):
        return lambda: lm_case(
            f"hf_llama_{'tied' if tied else 'untied'}", "LlamaForCausalLM", "LlamaConfig", sz,
            f"LlamaForCausalLM, hidden {sz.hidden}, {sz.layers} layers, {sz.heads} heads / "
            f"{sz.kv_heads} KV heads, vocab {sz.vocab}, LM head {'tied' if tied else 'untied'}",
            tie_word_embeddings=tied)

    def gemma2():
        n = sz.layers
        return lm_case(
            "hf_gemma2", "Gemma2ForCausalLM", "Gemma2Config", sz,
            f"Gemma2ForCausalLM, hidden {sz.hidden}, {n} layers (sliding and global), sandwich "
            "norms, attn_logit_softcapping 50, final_logit_softcapping 30, "
            f"query_pre_attn_scalar {sz.hidden // sz.heads}",
            gemma=True, attention_softcap=n, logit_softcap=1,
            head_dim=sz.hidden // sz.heads, query_pre_attn_scalar=sz.hidden // sz.heads,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=sz.seq // 2)

    def gemma3():
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        name = "hf_gemma3"
        import torch

        torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
        cfg = Gemma3TextConfig(
            vocab_size=sz.vocab, hidden_size=sz.hidden, intermediate_size=sz.intermediate,
            num_hidden_layers=sz.layers, num_attention_heads=sz.heads,
            num_key_value_heads=sz.kv_heads, head_dim=sz.hidden // sz.heads,
            query_pre_attn_scalar=sz.hidden // sz.heads, max_position_embeddings=4 * sz.seq,
            sliding_window=sz.seq // 2, attn_implementation="eager")
        lm = Gemma3ForCausalLM(cfg).eval()
        randomize(lm, name, gemma=True)
        norms, kinds = count_norms(lm)
        inputs, kin = _ids(name, sz)
        return Case(name, "transformers",
                    f"Gemma3ForCausalLM (text), hidden {sz.hidden}, {sz.layers} layers, sandwich "
                    "norms, QK-norm (1 + w), scaled embedding, tied head",
                    _Logits.wrap(lm), inputs, kin, norms, kinds,
                    {"attention": count_attention(lm), "embedding": count_embedding_scales(lm)})

    def gpt2():
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        name = "hf_gpt2"
        torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
        cfg = GPT2Config(vocab_size=sz.vocab, n_positions=4 * sz.seq, n_embd=sz.hidden,
                         n_layer=sz.layers, n_head=sz.heads, attn_implementation="eager")
        lm = GPT2LMHeadModel(cfg).eval()
        randomize(lm, name)
        norms, kinds = count_norms(lm)
        inputs, kin = _ids(name, sz)
        return Case(name, "transformers",
                    f"GPT2LMHeadModel, n_embd {sz.hidden}, {sz.layers} layers, tied head",
                    _Logits.wrap(lm), inputs, kin, norms, kinds,
                    {"attention": count_attention(lm)})

    def bert():
        from transformers import BertConfig, BertModel

        return _hf_encoder("hf_bert", lambda: BertModel(BertConfig(
            vocab_size=sz.vocab, hidden_size=sz.hidden, num_hidden_layers=sz.layers,
            num_attention_heads=sz.heads, intermediate_size=sz.intermediate,
            max_position_embeddings=4 * sz.seq, attn_implementation="eager")),
            f"BertModel, hidden {sz.hidden}, {sz.layers} layers, post-norm; output: "
            "last_hidden_state", "last_hidden_state", lambda name: _ids(name, sz))

    def vit():
        from transformers import ViTConfig, ViTForImageClassification

        return _hf_encoder("hf_vit", lambda: ViTForImageClassification(ViTConfig(
            hidden_size=sz.hidden, num_hidden_layers=sz.layers, num_attention_heads=sz.heads,
            intermediate_size=sz.intermediate, image_size=sz.image, patch_size=sz.patch,
            num_labels=10, attn_implementation="eager")),
            f"ViTForImageClassification, hidden {sz.hidden}, {sz.layers} layers, "
            f"{sz.image}x{sz.image} image, patch {sz.patch}, 10 labels", "logits",
            lambda name: _image(name, sz))

    def dinov2():
        from transformers import Dinov2Config, Dinov2Model

        return _hf_encoder("hf_dinov2", lambda: Dinov2Model(Dinov2Config(
            hidden_size=sz.hidden, num_hidden_layers=sz.layers, num_attention_heads=sz.heads,
            mlp_ratio=2, image_size=sz.image, patch_size=sz.patch,
            attn_implementation="eager")),
            f"Dinov2Model, hidden {sz.hidden}, {sz.layers} layers, layer scales, "
            f"{sz.image}x{sz.image} image, patch {sz.patch}; output: pooler_output",
            "pooler_output", lambda name: _image(name, sz), layer_scales=True)

    return {
        "hf_llama_tied": llama(True),
        "hf_llama_untied": llama(False),
        "hf_llama_sdpa": lambda: lm_case(
            "hf_llama_sdpa", "LlamaForCausalLM", "LlamaConfig", sz,
            "LlamaForCausalLM as hf_llama_untied but attn_implementation='sdpa' (HF's default: "
            "torch's scaled_dot_product_attention, which torchax lowers itself)",
            tie_word_embeddings=False, attn_implementation="sdpa"),
        "hf_mistral": lambda: lm_case(
            "hf_mistral", "MistralForCausalLM", "MistralConfig", sz,
            f"MistralForCausalLM, hidden {sz.hidden}, {sz.layers} layers, sliding window "
            f"{sz.seq // 2}, untied head", sliding_window=sz.seq // 2),
        "hf_qwen3": lambda: lm_case(
            "hf_qwen3", "Qwen3ForCausalLM", "Qwen3Config", sz,
            f"Qwen3ForCausalLM, hidden {sz.hidden}, {sz.layers} layers, QK-norm, tied head",
            head_dim=sz.hidden // sz.heads, tie_word_embeddings=True),
        "hf_gemma": lambda: lm_case(
            "hf_gemma", "GemmaForCausalLM", "GemmaConfig", sz,
            f"GemmaForCausalLM, hidden {sz.hidden}, {sz.layers} layers, (1 + w) RMSNorm, "
            "sqrt(hidden) embedding scale, tied head", gemma=True,
            head_dim=sz.hidden // sz.heads),
        "hf_gemma2": gemma2,
        "hf_gemma3": gemma3,
        "hf_gpt2": gpt2,
        "hf_bert": bert,
        "hf_vit": vit,
        "hf_dinov2": dinov2,
    }


def tv_cases(sz: Sizes) -> dict[str, Callable[[], Case]]:
    def make(name, build, desc, attention=True):
        import torch

        torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
        m = build().eval()
        randomize(m, name)
        norms, kinds = count_norms(m)
        inputs, kin = _image(name, sz)
        scales = {"attention": count_attention(m), "layer_scale": count_layer_scales(m)}
        return Case(name, "torchvision", desc, m, inputs, kin, norms, kinds,
                    {k: v for k, v in scales.items() if v})

    def vit():
        from torchvision.models import VisionTransformer

        return VisionTransformer(image_size=sz.image, patch_size=sz.patch, num_layers=sz.layers,
                                 num_heads=sz.heads, hidden_dim=sz.hidden, mlp_dim=sz.intermediate,
                                 num_classes=10)

    def swin():
        from torchvision.models import SwinTransformer

        c = sz.hidden // 2
        return SwinTransformer(patch_size=[2, 2], embed_dim=c, depths=[2, 2],
                               num_heads=[2, 4], window_size=[4, 4], num_classes=10)

    def convnext():
        from torchvision.models import ConvNeXt
        from torchvision.models.convnext import CNBlockConfig

        c = sz.hidden // 2
        return ConvNeXt([CNBlockConfig(c, 2 * c, 2), CNBlockConfig(2 * c, None, 1)],
                        num_classes=10)

    return {
        "tv_vit": lambda: make(
            "tv_vit", vit, f"torchvision VisionTransformer(image_size={sz.image}, patch_size="
            f"{sz.patch}, num_layers={sz.layers}, num_heads={sz.heads}, hidden_dim={sz.hidden}, "
            f"mlp_dim={sz.intermediate}, num_classes=10)"),
        "tv_swin": lambda: make(
            "tv_swin", swin, f"torchvision SwinTransformer(patch_size=[2, 2], embed_dim="
            f"{sz.hidden // 2}, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], "
            f"num_classes=10), {sz.image}x{sz.image} image"),
        "tv_convnext": lambda: make(
            "tv_convnext", convnext, f"torchvision ConvNeXt([CNBlockConfig({sz.hidden // 2}, "
            f"{sz.hidden}, 2), CNBlockConfig({sz.hidden}, None, 1)], num_classes=10), "
            f"{sz.image}x{sz.image} image"),
    }


def variant(base: Callable[[], Case], *, bf16=False, args=False) -> Callable[[], Case]:
    def build() -> Case:
        import torch

        case = base()
        if bf16:
            f32_model = case.model
            import copy

            case.model = copy.deepcopy(f32_model).to(torch.bfloat16).eval()
            case.f32_model = f32_model
            case.dtype = "bf16"
            case.name += "_bf16"
            case.description += "; whole model in bfloat16 (.to(torch.bfloat16))"
            case.inputs = [x.astype(jnp_bf16()) if x.dtype.kind == "f" else x
                           for x in case.inputs]
        if args:
            case.params_as_args = True
            case.name += "_args"
            case.description += "; parameters as @main arguments (flattened, before the input)"
        return case

    return build


def jnp_bf16():
    import jax.numpy as jnp

    return jnp.bfloat16


def all_cases(sz: Sizes, small: bool) -> dict[str, Callable[[], Case]]:
    cases = {**hf_cases(sz), **tv_cases(sz)}
    if small:
        keep = ("hf_llama_untied", "hf_qwen3", "hf_gemma2", "hf_gpt2", "hf_bert", "tv_swin",
                "tv_convnext", "hf_dinov2")
        return {k: cases[k] for k in keep}
    cases["hf_llama_untied_bf16"] = variant(cases["hf_llama_untied"], bf16=True)
    cases["hf_gemma2_bf16"] = variant(cases["hf_gemma2"], bf16=True)
    for k in ("hf_llama_untied", "hf_gpt2", "tv_vit"):
        cases[f"{k}_args"] = variant(cases[k], args=True)
    return cases


# --------------------------------------------------------------------------- export, verify


def torch_eager(model, inputs: list[np.ndarray], dtype: str) -> np.ndarray:
    import torch

    targs = []
    for x in inputs:
        if x.dtype.kind in "iu":
            targs.append(torch.from_numpy(x.astype(np.int64)))
        else:
            t = torch.from_numpy(np.asarray(x, np.float32))
            targs.append(t.to(torch.bfloat16) if dtype == "bf16" else t)
    with torch.no_grad():
        return model(*targs).float().numpy()


def export_text(case: Case) -> tuple[str, list[np.ndarray]]:
    """The StableHLO text and the arguments @main takes (parameters first for _args)."""
    import jax

    from export_testdata import _import_torchax

    _, torchax = _import_torchax()
    case.paths = scope_modules(case.model)
    states, jax_fn = torchax.extract_jax(case.model)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case.inputs]
    if case.params_as_args:
        leaves, treedef = jax.tree_util.tree_flatten(states)

        def fn(*flat):
            params = jax.tree_util.tree_unflatten(treedef, flat[:len(leaves)])
            return jax_fn(params, tuple(flat[len(leaves):]))

        specs = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in leaves] + specs
        arguments = [np.asarray(p) for p in leaves] + list(case.inputs)
    else:
        fn = lambda *xs: jax_fn(states, xs)  # noqa: E731
        arguments = list(case.inputs)
    text = jax.export.export(jax.jit(fn, keep_unused=True))(*specs).mlir_module()
    return (text if text.endswith("\n") else text + "\n"), arguments


def run_on_xla(text: str, arguments: list[np.ndarray]) -> np.ndarray:
    import jax
    import jax.extend
    from jax._src.lib import xla_client as xc

    be = jax.extend.backend.get_backend("cpu")
    dev = be.devices()[0]
    exe = be.compile_and_load(text, xc.DeviceList((dev,)), xc.CompileOptions())
    out = exe.execute_sharded([jax.device_put(x, dev) for x in arguments])
    return np.asarray(out.disassemble_into_single_device_arrays()[0][0]).astype(np.float32)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def verify(case: Case, text: str, arguments: list[np.ndarray]) -> dict:
    out = run_on_xla(text, arguments)
    ref = torch_eager(case.model, case.inputs, case.dtype)
    if out.shape != ref.shape:
        raise AssertionError(f"{case.file}: output shape {out.shape} != torch's {ref.shape}")
    if not np.all(np.isfinite(out)):
        raise AssertionError(f"{case.file}: output not finite")
    rtol = 1e-4 if case.dtype == "f32" else 1e-1
    result = {"reference": f"torch {case.dtype} eager", "max_rel_err": rel(out, ref), "rtol": rtol}
    if case.f32_model is not None:
        result["max_rel_err_vs_f32"] = rel(out, torch_eager(case.f32_model, case.inputs, "f32"))
    if result["max_rel_err"] > rtol:
        raise AssertionError(f"{case.file}: max rel err {result['max_rel_err']:.3g} vs torch > {rtol}")
    other = [np.roll(a, 1, axis=-1) if i >= len(arguments) - len(case.inputs) else a
             for i, a in enumerate(arguments)]
    if np.allclose(run_on_xla(text, other), out, rtol=1e-3, atol=1e-3 * np.max(np.abs(ref))):
        raise AssertionError(f"{case.file}: the output does not depend on the input")
    return result


def manifest_entry(case: Case, text: str, output_shape, check: dict | None) -> dict:
    import jax.numpy as jnp

    return {
        "file": case.file,
        "model": case.name,
        "library": case.library,
        "class": type(getattr(case.model, "lm", getattr(case.model, "inner", case.model))).__name__,
        "description": case.description,
        "dtype": case.dtype,
        "params_as_args": case.params_as_args,
        "inputs": [{"shape": list(x.shape),
                    "dtype": "bf16" if x.dtype == jnp.bfloat16 else str(x.dtype), **k}
                   for x, k in zip(case.inputs, case.input_kinds, strict=True)],
        "output_shape": list(output_shape),
        "bytes": len(text.encode()),
        "norms": case.norms,
        "norm_modules": case.norm_modules,
        "scales": case.scales,
        "scopes": case.paths,
        "verify": check,
    }


# --------------------------------------------------------------------------- measure

# The scope a model's op ran under (scope_modules), innermost last.
_SCOPE = r"(norm|attn|emb|ls):([A-Za-z0-9_.]+)"
_TOLERANCE = {"f32": 1e-5, "bf16": 6e-2}


def scopes_of(location: str) -> list[tuple[str, str]]:
    import re

    return re.findall(_SCOPE, location)


def measure_inputs(entry: dict, arg_types: list) -> list[np.ndarray]:
    """Seeded inputs for @main: the manifest's token ids in [0, high) or N(0, 1) images,
    and N(0, 0.1) for parameters (the _args variants)."""
    from bnfold import elements

    rng = np.random.default_rng(zlib.crc32(entry["model"].encode()))
    n_params = len(arg_types) - len(entry["inputs"])
    xs = []
    for i, ty in enumerate(arg_types):
        shape = tuple(ty.shape)
        dtype = elements.numpy_dtype(ty.element_type)
        spec = entry["inputs"][i - n_params] if i >= n_params else {"kind": "param"}
        if spec["kind"] == "token_ids":
            xs.append(rng.integers(0, spec["high"], size=shape).astype(dtype))
        elif dtype.kind in "iu":
            xs.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            scale = 0.1 if spec["kind"] == "param" else 1.0
            xs.append((rng.standard_normal(shape) * scale).astype(dtype))
    return xs


def numerics(original: str, folded: str, entry: dict) -> dict:
    """Both modules on XLA CPU with the same seeded inputs, and against the original
    evaluated in float64 (bnfold.check's evaluator)."""
    from bnfold.check import _Module, relative_difference

    src = _Module(original, "the original", entry["file"])
    out = _Module(folded, "the output", entry["file"])
    xs = measure_inputs(entry, src.arg_types)
    shapes = [tuple(x.shape) for x in xs]
    a = np.asarray(src.run(xs, shapes)[0], np.float64)
    b = np.asarray(out.run(xs, shapes)[0], np.float64)
    result: dict[str, Any] = {"difference": relative_difference(b, a),
                              "tolerance": _TOLERANCE[entry["dtype"]]}
    reference, why = src.float64(xs, shapes)
    if reference is None:
        result["float64"] = why
    else:
        r = np.asarray(reference[0], np.float64)
        result["original_error"] = relative_difference(a, r)
        result["output_error"] = relative_difference(b, r)
    return result


def constant_bytes(text: str) -> int:
    """Bytes of the hex-printed (non-splat) constants: grows when a fold copies a weight
    that another op also reads (a tied embedding table)."""
    import re

    return sum(len(m) // 2 for m in re.findall(r'dense<"0x([0-9A-Fa-f]+)">', text))


def _scale_value(note: str) -> float:
    """The constant of a `scale` fold's note ("0.25 into the kernel of ...", or backward-
    affine's "a constant scale 0.0333333 (divide by a constant scalar), into ...")."""
    found = re.search(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", note)
    return float(found.group()) if found else float("nan")


def classify(entry: dict, report: dict) -> dict:
    """Per model: which norm affines and constant scales folded, and every miss with the
    report's refusals in its module's scope."""
    scopes = entry["scopes"]
    trivial = 0
    norm_folded: dict[str, list[str]] = {}
    scale_folds: dict[str, list[float]] = {}
    unscoped_scales: list[float] = []
    layer_scale_folded: set[str] = set()
    other_folds: list[str] = []
    for f in report["folds"]:
        loc = f["norm"]
        found = scopes_of(loc)
        if f.get("kind") == "affine" and loc.endswith(("aten::add.Tensor/mul", "aten::addmm/mul")):
            trivial += 1  # torchax's `x + y * alpha` (alpha = 1), addmm's beta/alpha
            continue
        if f.get("kind") == "scale":
            value = _scale_value(f.get("note", ""))
            if found and found[-1][0] in ("attn", "emb"):
                scale_folds.setdefault(found[-1][1], []).append(value)
            else:
                unscoped_scales.append(value)
            continue
        if not found and loc.endswith("aten::div.Tensor/div") and entry["scales"].get("logit_softcap"):
            # Gemma 2's logits / cap, folded per vocabulary entry by backward-affine
            unscoped_scales.append(1 / 30 if f.get("kind") == "affine" else float("nan"))
            other_folds.append(f"logit soft-cap: {f.get('kind')} {f['direction']} into the LM head "
                               f"({f['channels']} channels)")
            continue
        if found and found[-1][0] == "norm":
            norm_folded.setdefault(found[-1][1], []).append(
                f"{f.get('kind')} {f['direction']}" + (f" ({f['note']})" if f.get("note") else ""))
        elif found and found[-1][0] == "ls":
            layer_scale_folded.add(found[-1][1])
        else:
            other_folds.append(f"{f.get('kind')} {f['direction']} {loc}")
    skipped_by_scope: dict[str, list[tuple[str, str, str]]] = {}
    unscoped_skips = []
    for sk in report["skipped"]:
        found = scopes_of(sk["op"])
        item = (sk.get("code", "?"), sk["reason"], sk["op"].rsplit("/", 2)[-2] + "/" +
                sk["op"].rsplit("/", 1)[-1] if "/" in sk["op"] else sk["op"])
        if found:
            skipped_by_scope.setdefault(found[-1][1], []).append(item)
        else:
            unscoped_skips.append(item)
    norms = scopes["norm"]
    misses = []
    for path in norms:
        if path not in norm_folded:
            misses.append({"what": "norm", "module": path, "refusals": skipped_by_scope.get(path, [])})
    n_attn_scales = len(scopes["attn"])
    softcap_attn = entry["scales"].get("attention_softcap", 0)
    attn_folded = softcap_folded = 0
    for path in scopes["attn"]:
        values = scale_folds.get(path, [])
        caps = [v for v in values if abs(v - 0.02) < 1e-6 or abs(v - 50) < 1e-4]
        got_attn = len(values) - len(caps) >= 1
        attn_folded += got_attn
        softcap_folded += bool(caps)
        want_cap = softcap_attn > 0
        if not got_attn or (want_cap and not caps):
            what = "attention scale" if not got_attn else "attention soft-cap"
            if not got_attn and want_cap and not caps:
                what = "attention scale and soft-cap"
            misses.append({"what": what, "module": path,
                           "refusals": [r for r in skipped_by_scope.get(path, [])
                                        if r[2].endswith(("/mul", "/div"))]})
    emb_folded = 0
    for path in scopes["emb"]:
        if scale_folds.get(path):
            emb_folded += 1
        else:
            misses.append({"what": "embedding scale", "module": path,
                           "refusals": skipped_by_scope.get(path, [])})
    logit_cap = entry["scales"].get("logit_softcap", 0)
    logit_folded = min(logit_cap, sum(1 for v in unscoped_scales
                                      if abs(v - 1 / 30) < 1e-6 or abs(v - 30) < 1e-4))
    if logit_cap and not logit_folded:
        misses.append({"what": "logit soft-cap", "module": "(LM head)",
                       "refusals": [r for r in unscoped_skips if "div" in r[2]]})
    ls_total = len(scopes["ls"])
    for path in scopes["ls"]:
        if path not in layer_scale_folded:
            misses.append({"what": "layer scale", "module": path,
                           "refusals": [r for r in skipped_by_scope.get(path, [])
                                        if r[2].endswith("mul")]})
    scale_total = n_attn_scales + softcap_attn + len(scopes["emb"]) + logit_cap + ls_total
    scale_done = attn_folded + softcap_folded + emb_folded + logit_folded + len(layer_scale_folded)
    return {
        "norms_folded": len([p for p in norms if p in norm_folded]), "norms_total": len(norms),
        "scales_folded": scale_done, "scales_total": scale_total,
        "scales_detail": {"attention": [attn_folded, n_attn_scales],
                          "attention_softcap": [softcap_folded, softcap_attn],
                          "embedding": [emb_folded, len(scopes["emb"])],
                          "logit_softcap": [logit_folded, logit_cap],
                          "layer_scale": [len(layer_scale_folded), ls_total]},
        "norm_folds": norm_folded, "trivial_folds": trivial, "other_folds": other_folds,
        "identities": len(report.get("identities", [])),
        "copied_bytes": sum(f.get("shared_weight", {}).get("copied_bytes", 0)
                            for f in report["folds"]),
        "unscoped_scale_folds": unscoped_scales, "misses": misses,
    }


# Verdicts on misses: (model regex, what regex, module regex, verdict, why). First match wins.
# "gap": bnfold could fold it (or must explain it better); "genuine": not foldable.
VERDICTS: list[tuple[str, str, str, str, str]] = [
    (r"_args$", ".", ".", "expected",
     "the parameters are @main arguments: bind them first (--bind-params)"),
    (r"hf_bert", "norm", r"encoder\.layer\.\d+\.(attention\.)?output\.LayerNorm$", "genuine",
     "post-norm: the normalized value is the residual stream (read by the next block's "
     "residual add) or the model's output"),
    (r"hf_bert", "norm", r"embeddings\.LayerNorm$", "genuine",
     "feeds Q, K, V and the first residual add"),
    (".", "norm", r"post_(attention|feedforward)_layernorm$", "genuine",
     "sandwich norm: its value goes into the residual add, not a linear layer"),
    (".", "norm", r"\.[qk]_norm$", "genuine",
     "QK-norm: the value meets RoPE and q k^T, no weight (gamma does not commute with "
     "RoPE's pair rotation unless g_i = g_{i+d/2}); the attention scale folds into it instead"),
    (r"hf_dinov2", "norm", r"\.layernorm$", "genuine",
     "the final norm's CLS token is the model's output (pooler_output)"),
    (r"hf_vit|tv_vit", "norm", r"(vit\.layernorm|encoder\.ln)$", "gap",
     "final norm -> slice of the CLS token (token axis, not features) -> classifier Linear: "
     "a slice on another axis commutes with a per-feature affine"),
    (r"tv_swin", "norm", r"^norm$", "gap",
     "final norm -> mean over the spatial axes (reduce + divide) -> flatten -> head Linear: "
     "a mean over other axes commutes with a per-channel affine"),
    (r"tv_swin", "norm", r"norm1$", "gap",
     "norm1 -> F.pad with zero widths here (call @_pad), torch.roll (slice + concatenate on "
     "spatial axes), window partition (reshape/transpose) -> fused qkv Linear: all "
     "per-channel-affine-preserving (a non-zero pad would not be: padded tokens are keys)"),
    (r"tv_swin", "norm", r"features\.0\.2$", "genuine",
     "patch-embedding norm: its value is the first block's residual stream"),
    (r"tv_convnext", "norm", r"features\.0\.1$", "genuine",
     "stem LayerNorm2d: its value is the first block's residual stream"),
    (".", "embedding scale", ".", "gap",
     "no decision at all: torchax's embedding is `call @_take` (gather + select with a NaN "
     "fill for out-of-range ids; still a call after folding), which fold-scale apparently "
     "does not walk through; the table is tied "
     "to the LM head, so it needs the issue's rearrangement (scale the table, 1/scale into "
     "the final norm's weight) or a shared-weight refusal with its cost"),
    (r"tv_vit", "attention scale", ".", "gap",
     "nn.MultiheadAttention -> torch's sdpa math: q * d^-1/4 and k^T * d^-1/4 (two scalar "
     "multiplies, product 1/sqrt(d)), q and k slices of the fused in_proj output; the scale "
     "belongs in the q (and k) columns of the fused kernel and bias; no decision recorded "
     "for either multiply (GPT-2's same shape gets `users`)"),
    (r"tv_swin", "attention scale", ".", "gap",
     "q * head_dim^-0.5 on the q slice of the fused qkv Linear (through reshape/permute); the "
     "scale belongs in the q columns of the fused kernel and bias; no decision recorded"),
    (".", "attention scale", ".", "gap",
     "fused QKV projection (GPT-2 c_attn): q is a slice of one linear's output, so the scale "
     "belongs in the q columns of the fused kernel (and bias) only; refused as `users`"),
]


def verdict(model: str, miss: dict) -> tuple[str, str]:
    import re

    for m_re, w_re, p_re, v, why in VERDICTS:
        if re.search(m_re, model) and re.search(w_re, miss["what"]) and \
                re.search(p_re, miss["module"]):
            return v, why
    return "?", "not classified"


def summary(coverage: dict) -> list[str]:
    """The gaps grouped by cause (for whoever fixes them), then what else the numbers show."""
    groups: dict[str, list[str]] = {}
    report_gaps: list[str] = []
    for model in sorted(coverage):
        r = coverage[model]
        for miss in r.get("misses", []):
            v, why = verdict(model, miss)
            codes = {c for c, _, _ in miss["refusals"]}
            if v == "gap":
                groups.setdefault(f"{miss['what']}: {why}", []).append(f"{model} `{miss['module']}`")
            if miss["what"] == "norm" and v == "genuine" and "nonlinear-consumer" not in codes:
                report_gaps.append(f"{model} `{miss['module']}`")
    lines = ["## Gaps, by cause", ""]
    for i, (why, where) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1])), 1):
        lines.append(f"{i}. **{why}** ({len(where)}): {', '.join(where)}")
    if report_gaps:
        lines.append(f"{len(groups) + 1}. **report: a norm that genuinely cannot fold gets no "
                     "`nonlinear-consumer` refusal naming its residual add / return / RoPE "
                     "use; the only record in its scope is backward-affine's `no-producer` "
                     f"on an op of the statistics** ({len(report_gaps)}): {', '.join(report_gaps)}")
    copies = [f"{m} (+{(r['constant_bytes'][1] - r['constant_bytes'][0]) / 1024:.0f} KiB, "
              f"reported {r.get('copied_bytes', 0) / 1024:.0f} KiB)"
              for m, r in sorted(coverage.items())
              if r.get("constant_bytes") and r["constant_bytes"][1] > 1.05 * r["constant_bytes"][0]]
    if copies:
        silent = [m for m, r in coverage.items() if r.get("constant_bytes") and
                  r["constant_bytes"][1] > 1.05 * r["constant_bytes"][0] and
                  not r.get("copied_bytes")]
        title = "silently" if silent else "reported (`shared_weight`, its bytes) but not avoided"
        lines.append(f"{len(groups) + 2}. **a tied embedding table is copied, {title}**: the "
                     "final norm's gamma (forward-affine, kind `affine`) or Gemma 2's logit "
                     "1/cap (backward-affine) folds into the LM head, whose kernel is the same "
                     "constant the embedding gather reads, so the folded module holds the table "
                     "twice (vocab x hidden more bytes: ~525 MB for a bf16 Llama 3.2 1B); "
                     "fold-scale refuses the same thing as `shared-weight` with its cost: "
                     f"{', '.join(copies)}")
    trivial = {m: r["trivial_folds"] for m, r in coverage.items() if r.get("trivial_folds")}
    removed = {m: r["identities"] for m, r in coverage.items() if r.get("identities")}
    worse = [f"{m} ({r['numerics']['original_error']:.2g} -> {r['numerics']['output_error']:.2g})"
             for m, r in sorted(coverage.items())
             if "original_error" in r.get("numerics", {})
             and r["numerics"]["output_error"] > 1.2 * r["numerics"]["original_error"]]
    lines += ["", "Also:", "",
              f"- Identities: torchax writes every `a + b` as `a + b * alpha` (alpha = 1) and "
              f"addmm as `beta * c + alpha * (a @ b)`; drop-identity removes every multiply by "
              f"exactly 1 and add of exactly 0 before the folds ({sum(removed.values())} over "
              f"{len(removed)} models, the report's `identities`, not folds); multiplies by 1 "
              f"still folded as `affine`: {sum(trivial.values())} over {len(trivial)} models.",
              "- Numerics: every folded module matches its original within the type's tolerance. "
              "Against float64, the folded error is at most 1.5x the original's plus one ulp "
              "everywhere; above 1.2x: " + (", ".join(worse) if worse else "none") +
              " (f32 ones at the 1e-7 level, about one f32 ulp; bf16 ones within one bf16 "
              "ulp, 2^-7; one seed each, so partly noise).", ""]
    return lines


def write_markdown(directory: Path, coverage: dict, entries: list[dict]) -> None:
    """coverage.md: a table per model, then every miss with its refusals and verdict."""
    by_model = {e["model"]: e for e in entries}
    lines = ["# bnfold on transformer exports (issue 34)", "",
             f"Generated by `python tools/export_transformers.py --measure {directory}` from "
             "the exports of tools/export_transformers.py (HF transformers "
             "and torchvision through torchax; random norm affines). Counts of norm affines "
             "and scales come from the model definition (manifest.json); a norm counts as "
             "folded when a fold's op lies in that module's `jax.named_scope` (the "
             "export wraps each module's forward in one), a scale when a `scale` fold (or, "
             "for the logit soft-cap, an `affine` fold of the divide) does. Numerics: folded "
             "vs original on XLA CPU with the same seeded inputs (token ids in [0, vocab)), "
             "max |diff| / max |original|; f64: each module's error against the original "
             "evaluated in float64 (bnfold.check's evaluator).", "",
             "| model | dtype | norms folded | scales folded (attn, cap, emb, logit cap, "
             "layer) | diff | f64 err orig -> folded | constants KiB | fold s | x1 folds / "
             "identities removed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    tot = [0, 0, 0, 0]
    for model in sorted(coverage):
        r = coverage[model]
        e = by_model.get(model, {})
        if "error" in r:
            lines.append(f"| {model} | {e.get('dtype', '?')} | bnfold failed: "
                         f"{r['error'].splitlines()[-1][:120]} | | | | | | |")
            continue
        d = r["scales_detail"]
        parts = ", ".join(f"{d[k][0]}/{d[k][1]}" if d[k][1] else "-" for k in
                          ("attention", "attention_softcap", "embedding", "logit_softcap",
                           "layer_scale"))
        n = r["numerics"]
        cb = r.get("constant_bytes", [0, 0])
        kib = f"{cb[0] / 1024:.0f} -> {cb[1] / 1024:.0f}" + (
            f" **copy** (reported: {r.get('copied_bytes', 0) / 1024:.0f})"
            if cb[1] > 1.05 * cb[0] else "")

        def g(x):
            return "n/a" if x is None else f"{x:.2g}"

        f64 = f"{g(n.get('original_error'))} -> {g(n.get('output_error'))}" \
            if "original_error" in n else n.get("float64", n.get("error", "?"))[:60]
        lines.append(f"| {model} | {e.get('dtype', '?')} | {r['norms_folded']}/{r['norms_total']} |"
                     f" {r['scales_folded']}/{r['scales_total']} ({parts}) |"
                     f" {g(n.get('difference'))} | {f64} | {kib} | {r['fold_seconds']} |"
                     f" {r['trivial_folds']} / {r.get('identities', 0)} |")
        if not model.endswith("_args"):
            tot[0] += r["norms_folded"]
            tot[1] += r["norms_total"]
            tot[2] += r["scales_folded"]
            tot[3] += r["scales_total"]
    genuine = [0, 0]
    for model, r in coverage.items():
        for miss in r.get("misses", []):
            if not model.endswith("_args") and verdict(model, miss)[0] == "genuine":
                genuine[miss["what"] != "norm"] += 1
    lines += ["", f"Totals without the `_args` variants: norms {tot[0]}/{tot[1]}, scales "
              f"{tot[2]}/{tot[3]}; of the foldable ones (less the misses judged genuine below: "
              f"{genuine[0]} norms, {genuine[1]} scales): norms {tot[0]}/{tot[1] - genuine[0]}, "
              f"scales {tot[2]}/{tot[3] - genuine[1]}.", ""]
    lines += ["## Misses", "",
              "Verdict `gap`: bnfold could fold it exactly (or must say more); `genuine`: not "
              "foldable, the refusal is right (a `report gap` note says where its reason "
              "misnames the cause, counted among the gaps); `expected`: parameters as arguments.", ""]
    gaps = 0
    for model in sorted(coverage):
        r = coverage[model]
        if "error" in r or not r["misses"]:
            continue
        lines.append(f"### {model}")
        lines.append("")
        for miss in r["misses"]:
            v, why = verdict(model, miss)
            gaps += v == "gap"
            lines.append(f"- **{miss['what']}** `{miss['module']}`: **{v}**: {why}")
            codes = sorted({(c, reason) for c, reason, _ in miss["refusals"]})
            if miss["what"] == "norm" and v == "genuine" and not any(
                    c == "nonlinear-consumer" for c, _ in codes):
                gaps += 1
                lines.append("  - **report gap**: no `nonlinear-consumer` refusal names the "
                             "use that stops it; what the report says in this module's scope:")
            if not codes:
                lines.append("  - report: no refusal in this module's scope (no decision recorded)")
            for c, reason in codes[:4]:
                lines.append(f"  - `{c}`: {reason[:400]}")
            if len(codes) > 4:
                lines.append(f"  - ... {len(codes) - 4} more")
        lines.append("")
    lines.insert(lines.index("## Misses") + 2, f"{gaps} misses look like bnfold gaps.")
    lines.insert(lines.index("## Misses") + 3, "")
    lines[lines.index("## Misses"):lines.index("## Misses")] = summary(coverage)
    (directory / "coverage.md").write_text("\n".join(lines) + "\n")


def measure(directory: Path, only: list[str] | None, record: bool = False) -> int:
    """Fold every export with `python -m bnfold FILE --report R -o OUT` and write
    coverage.json (per model: counts, misses with refusals, numerics) and coverage.md.
    With `record`, also write each model's folded counts into the manifest as
    "bnfold_min" (the regression floor tests/test_transformer_exports.py holds bnfold to)."""
    import subprocess

    entries = json.loads((directory / "manifest.json").read_text())
    work = directory / "folded"
    work.mkdir(exist_ok=True)
    cov_path = directory / "coverage.json"
    coverage = json.loads(cov_path.read_text()) if cov_path.exists() else {}
    for entry in entries:
        if only and entry["model"] not in only:
            continue
        src = directory / entry["file"]
        report_path = work / f"{entry['model']}.report.json"
        out_path = work / entry["file"]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "bnfold", str(src), "--report",
                               str(report_path), "-o", str(out_path)],
                              capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            coverage[entry["model"]] = {"error": proc.stderr.strip()[-2000:]}
            print(f"  {entry['model']:28s} bnfold FAILED: {proc.stderr.strip()[-300:]}")
            continue
        report = json.loads(report_path.read_text())
        result = classify(entry, report)
        result["fold_seconds"] = round(elapsed, 1)
        result["constant_bytes"] = [constant_bytes(src.read_text()), constant_bytes(out_path.read_text())]
        result["summary"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        try:
            result["numerics"] = numerics(src.read_text(), out_path.read_text(), entry)
        except Exception as e:  # noqa: BLE001 - recorded, reported
            result["numerics"] = {"error": f"{type(e).__name__}: {e}"}
        coverage[entry["model"]] = result
        n = result["numerics"]
        print(f"  {entry['model']:28s} norms {result['norms_folded']}/{result['norms_total']}"
              f"  scales {result['scales_folded']}/{result['scales_total']}"
              f"  diff {n.get('difference', float('nan')):.2g}"
              f"  f64 {n.get('original_error', float('nan')):.2g} -> "
              f"{n.get('output_error', float('nan')):.2g}  ({elapsed:.1f} s)", flush=True)
        cov_path.write_text(json.dumps(coverage, indent=1) + "\n")
    write_markdown(directory, coverage, entries)
    if record:
        for entry in entries:
            r = coverage.get(entry["model"], {})
            if "norms_folded" in r:
                entry["bnfold_min"] = {"norms": r["norms_folded"], "scales": r["scales_folded"]}
        (directory / "manifest.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"wrote {cov_path} and {directory / 'coverage.md'}")
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help=f"output directory (default {DEFAULT_OUT}; --small: testdata/transformers)")
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument("--small", action="store_true",
                   help="the shrunk configs for testdata/transformers (each file < 300 KB)")
    p.add_argument("--no-verify", action="store_true", help="skip the XLA-vs-torch check")
    p.add_argument("--measure", type=Path, metavar="DIR",
                   help="instead of exporting: fold every export in DIR with bnfold and write "
                   "DIR/coverage.json and coverage.md (needs only bnfold and jax, not torch)")
    p.add_argument("--record", action="store_true",
                   help="with --measure: write the folded counts into the manifest as "
                   "\"bnfold_min\" (the floor the tests hold bnfold to)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.measure is not None:
        return measure(args.measure, [n.strip() for n in args.only.split(",")] if args.only else None,
                       record=args.record)
    sz = SMALL if args.small else FULL
    out: Path = args.out or (SMALL_OUT if args.small else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    cases = all_cases(sz, args.small)
    names = list(cases)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in cases]
        if unknown:
            print(f"unknown model(s) {unknown}; known: {', '.join(cases)}", file=sys.stderr)
            return 2
    manifest_path = out / "manifest.json"
    entries = {e["model"]: e for e in json.loads(manifest_path.read_text())} \
        if manifest_path.exists() else {}
    failures = []
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        try:
            case = cases[name]()
            text, arguments = export_text(case)
            (out / case.file).write_text(text)
            check = None
            status = "not verified"
            if not args.no_verify:
                check = verify(case, text, arguments)
                status = f"ok, max rel err {check['max_rel_err']:.1e}"
            out_shape = run_on_xla(text, arguments).shape if check is None else \
                torch_eager(case.model, case.inputs, case.dtype).shape
            if args.small and len(text.encode()) > SMALL_MAX_BYTES:
                raise AssertionError(f"{case.file}: {len(text.encode())} bytes > {SMALL_MAX_BYTES}")
            floor = entries.get(case.name, {}).get("bnfold_min")
            entries[case.name] = manifest_entry(case, text, out_shape, check)
            if floor is not None:  # measured by --measure --record: kept across re-exports
                entries[case.name]["bnfold_min"] = floor
            print(f"  {case.file:32s} {len(text.encode()) / 1024:8.1f} KiB  norms={case.norms:<3d}"
                  f" scales={case.scales}  {status}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception as e:  # report every model, then fail
            import traceback

            traceback.print_exc()
            failures.append(f"{name}: {type(e).__name__}: {e}")
    ordered = [entries[k] for k in sorted(entries)]
    manifest_path.write_text(json.dumps(ordered, indent=2) + "\n")
    print(f"wrote {manifest_path} ({len(ordered)} entries) in {time.perf_counter() - t_all:.1f} s")
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
