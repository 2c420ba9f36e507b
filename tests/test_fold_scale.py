"""fold-scale on numbers: constant scales moved into weights, judged on XLA CPU against the
original and against the original evaluated in float64 (bnfold.check), and refusals with
their codes. Models: plain-JAX attention blocks (RoPE, QK-norm, GQA, bias, divide), Flax nnx
and Equinox MultiheadAttention, a Gemma-style LM (embedding scale, final norm `1 + w`,
soft-cap; tied and untied head), in f32 and bf16 (tests/transformers_jax.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import bnfold
import support
import transformers_jax as tj
from bnfold import check, laws
from bnfold import ir as bir
from bnfold.refusal import Code
from numerics import check_close, run_xla

pytest.importorskip("flax")
pytest.importorskip("equinox")

EPS = {"f32": float(np.finfo(np.float32).eps), "bf16": 2.0 ** -7, "f16": 2.0 ** -10}
SCALE_CODES = {Code.SHARED_WEIGHT.value, Code.NORMALIZED.value, Code.PRECISION.value,
               Code.USERS.value, Code.RANGE.value}

# id: (builder, keyword arguments, constant scales folded (f32, bf16): by fold-scale, or
# by backward-affine right after a linear layer, which reports them as kind "scale" too).
# Flax nnx scales bf16 x bf16 -> f32 logits in f32 by 1/sqrt(8): a non-power-of-two scale
# into bf16 weights is refused (precision: measured 1.4x the original's error, docs/precision.md rule 8).
MODELS = {
    "attention": (tj.attention, {}, 1),
    "attention_divide_bias": (tj.attention, {"divide": True, "bias": True}, 1),
    "attention_rope": (tj.attention, {"use_rope": True}, 1),
    "attention_rope_gqa": (tj.attention, {"use_rope": True, "kv_heads": 2}, 1),
    "attention_qk_norm_rope_gqa": (tj.attention, {"use_rope": True, "qk_norm": True,
                                                  "kv_heads": 1}, 1),
    "flax_mha": (tj.flax_mha, {}, (1, 0)),
    "flax_mha_normalize_qk": (tj.flax_mha, {"normalize_qk": True}, (1, 0)),
    "equinox_mha": (tj.equinox_mha, {}, 1),
    "gemma_untied": (tj.gemma, {"tied": False}, 2),  # the soft-cap: backward-affine's
    "gemma_tied": (tj.gemma, {"tied": True}, 2),  # jax.export writes the table twice
}
CASES = [(name, dtype) for name in MODELS for dtype in ("f32", "bf16")]


def folded_scales(report: bnfold.Report) -> list:
    return [f for f in report.folds if f.kind == "scale"]


def judged(original: str, output: str, dtype: str, seeds: int = 2) -> None:
    """The output matches the original and is no less accurate against float64 (1.5x plus
    one ulp of the model's type), on `seeds` seeded inputs."""
    for seed in range(seeds):
        outcome = check.check(original, output, seed=seed)
        for o in outcome.outputs:
            assert o.difference <= o.tolerance, o
            assert o.original_error is not None and o.output_error is not None, outcome.float64
            assert o.output_error <= 1.5 * o.original_error + EPS[dtype], o


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_scales_fold_and_keep_the_numerics(name, dtype):
    builder, kwargs, expected = MODELS[name]
    text, constant_scales = builder(dtype=dtype, **kwargs)
    out = bnfold.fold_source(text)
    scales = folded_scales(out.report)
    if isinstance(expected, tuple):
        expected = expected[dtype == "bf16"]
        if not expected:
            refusal, = [s for s in out.report.skipped if s.code in SCALE_CODES]
            assert refusal.code == Code.PRECISION.value, refusal
    assert len(scales) == expected, out.report.table()
    for fold in scales:
        scale = fold.params["scale"].reshape(-1)
        assert fold.form == "scale" and np.all(scale == scale[0]), fold
        assert fold.producer_op in ("stablehlo.dot_general", "stablehlo.gather",
                                    "stablehlo.multiply"), fold
    refused = [s for s in out.report.skipped if s.code in SCALE_CODES]
    assert len(refused) == constant_scales - len(scales), out.report.table()
    judged(text, out.serialize().decode(), dtype)


def test_the_attention_scale_goes_into_wq_and_a_qk_norm_scale_into_the_norm_weight():
    text, _ = tj.attention(use_rope=True, kv_heads=2)
    fold, = folded_scales(bnfold.fold_source(text).report)
    assert fold.producer_op == "stablehlo.dot_general" and "slice" in fold.note, fold.note
    assert fold.params["scale"] == pytest.approx(1 / np.sqrt(12))
    text, _ = tj.attention(use_rope=True, qk_norm=True)
    fold, = folded_scales(bnfold.fold_source(text).report)
    assert fold.producer_op == "stablehlo.multiply", fold.note  # never Wq: normalized away


def _shared(text: str) -> str:
    """The module with common constants merged (one table for the gather and the head)."""
    context = bir.make_context()
    module = bir.parse(text, context)
    bir.run_pipeline(module, "builtin.module(cse)")
    return str(module)


def _tables(text: str, vocab: int, model: int, dtype: str) -> int:
    """How many constants of the table's shape the module holds."""
    return sum(1 for line in text.splitlines()
               if "stablehlo.constant" in line and f": tensor<{vocab}x{model}x{dtype}>" in line)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_tied_table_is_not_copied_and_the_soft_cap_goes_into_the_final_norm(dtype):
    """With the head still tied when fold-scale runs (the final norm's folds off), the
    soft-cap's 1/cap goes into the final norm's weight; the embedding scale c goes into
    the one table, for the gather and the head, and 1/c into the final norm's weight as
    well, in f32 (rule 10); in bf16 that would round the head's weights once more, so it
    stays, refused as `shared-weight` with the copy's bytes and the precision reason."""
    text = _shared(tj.gemma(tied=True, dtype=dtype)[0])
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(
        disable=frozenset({"backward-affine", "forward-affine"})))
    produced = out.serialize().decode()
    folds = folded_scales(out.report)
    cap, = [f for f in folds if "table" not in f.note]
    assert cap.producer_op == "stablehlo.multiply" and "dot_general" in cap.note, cap.note
    assert cap.params["scale"] == pytest.approx(1 / 30, rel=1e-2)
    assert _tables(produced, 40, 32, dtype) == _tables(text, 40, 32, dtype) == 1
    if dtype == "f32":
        embedding, = [f for f in folds if "table" in f.note]
        assert "one table" in embedding.note and "1/5.65685 into the constant factor" in \
            embedding.note, embedding.note
        assert not [s for s in out.report.skipped if s.code == Code.SHARED_WEIGHT.value]
    else:
        shared, = [s for s in out.report.skipped if s.code == Code.SHARED_WEIGHT.value]
        assert "tied" in shared.reason and "2560 bytes" in shared.reason and \
            "rule 10" in shared.reason, shared.reason
        assert shared.op_name == "stablehlo.multiply"
    judged(text, produced, dtype)


def _precision_module() -> str:
    """bf16 weights, f32 products (preferred_element_type), the scale applied in f32."""
    import jax
    import jax.numpy as jnp

    wq, wk = tj._weights(0, jnp.bfloat16, (32, 16), (32, 16))

    def block(x):
        q = jnp.matmul(x, wq, preferred_element_type=jnp.float32)
        k = jnp.matmul(x, wk, preferred_element_type=jnp.float32)
        return (q @ k.T) * jnp.float32(0.3)

    return tj._export(block, jax.ShapeDtypeStruct((6, 32), jnp.bfloat16))


def test_a_scale_never_moves_into_a_narrower_weight():
    out = bnfold.fold_source(_precision_module())
    assert not folded_scales(out.report)
    refusal, = [s for s in out.report.skipped if s.code == Code.PRECISION.value]
    assert "bf16" in refusal.reason and "f32" in refusal.reason, refusal.reason


def test_a_normalization_without_weight_is_explained():
    import jax
    import jax.numpy as jnp

    wq, wk = tj._weights(0, jnp.float32, (32, 16), (32, 16))

    def block(x):
        q = x @ wq
        q = q * jax.lax.rsqrt(jnp.mean(q * q, -1, keepdims=True) + 1e-6)
        return (q @ (x @ wk).T) * jnp.float32(0.25)

    text = tj._export(block, jax.ShapeDtypeStruct((6, 32), jnp.float32))
    out = bnfold.fold_source(text)
    # q is normalized: the scale goes through k instead (into Wk)
    fold, = folded_scales(out.report)
    assert "rsqrt" not in fold.note and fold.producer_op == "stablehlo.dot_general"
    judged(text, out.serialize().decode(), "f32")

    def both(x):
        q, k = x @ wq, x @ wk
        q = q * jax.lax.rsqrt(jnp.mean(q * q, -1, keepdims=True) + 1e-6)
        k = k * jax.lax.rsqrt(jnp.mean(k * k, -1, keepdims=True) + 1e-6)
        return (q @ k.T) * jnp.float32(0.25)

    out = bnfold.fold_source(tj._export(both, jax.ShapeDtypeStruct((6, 32), jnp.float32)))
    assert not folded_scales(out.report)
    refusal, = [s for s in out.report.skipped if s.code == Code.NORMALIZED.value]
    assert "rsqrt" in refusal.reason, refusal.reason


def test_a_value_read_elsewhere_is_not_scaled():
    import jax
    import jax.numpy as jnp

    wq, wk = tj._weights(0, jnp.float32, (32, 16), (32, 16))

    def block(x):  # q is also an output: the scale goes into Wk
        q, k = x @ wq, x @ wk
        return (q @ k.T) * jnp.float32(0.3), q

    text = tj._export(block, jax.ShapeDtypeStruct((6, 32), jnp.float32))
    out = bnfold.fold_source(text)
    fold, = folded_scales(out.report)
    judged(text, out.serialize().decode(), "f32")

    def gelu(x):  # x * 0.5 and x * 0.707 are terms of GELU, not scales of x: no decision
        h = x @ wq
        return h * 0.5 * (1 + jax.lax.erf(h * 0.7071067811865476))

    out = bnfold.fold_source(tj._export(gelu, jax.ShapeDtypeStruct((6, 32), jnp.float32)))
    assert not folded_scales(out.report), out.report.table()
    assert not [s for s in out.report.skipped if s.reason.startswith("the scale")], \
        out.report.table()
    assert fold.producer_op == "stablehlo.dot_general"


def test_folding_twice_folds_nothing_more():
    text, _ = tj.attention(use_rope=True, qk_norm=True, kv_heads=2)
    once = bnfold.fold_source(text).serialize().decode()
    again = bnfold.fold_source(once)
    assert not again.report.folds, again.report.table()


def test_every_scalar_law_is_in_the_fuzzer_grammar():
    import regiongen

    assert set(laws.SCALAR_LAWS) <= set(regiongen.GRAMMAR_OPS), \
        set(laws.SCALAR_LAWS) - set(regiongen.GRAMMAR_OPS)


def test_every_scalar_law_is_crossed_by_a_fold_that_keeps_the_numerics():
    """Attention graphs of the fuzzer's stratum with every feature on (test_fuzz judges
    each against float64 on the original, with every option set): their folds cross every
    op of the scalar law table (the fold's note lists them)."""
    import regiongen as rg
    import test_fuzz

    everything = rg.AttentionGraph(
        dtype="f32", seq=4, heads=2, head_dim=4, model=6, embed=True, conv=True, bias=True,
        pad=True, qk_norm=False, rope=True, convert=True, mask=True, divide=True,
        power_of_two=False, pool=True, temperature=True, gqa=False, swap=False, seed=5)
    graphs = [everything,
              replace(everything, dtype="bf16", conv=False, divide=False, gqa=True, swap=True,
                      power_of_two=True, embed=False),
              replace(everything, qk_norm=True, pool=False, seed=6)]
    crossed: set[str] = set()
    for graph in graphs:
        program = rg.build_attention(graph)
        failures = test_fuzz.check_program(program)
        assert not failures, failures
        folds = folded_scales(bnfold.fold_source(rg.emit(program)).report)
        assert len(folds) == len(program.norms), folds  # the scale, and an embedding's
        for fold in folds:
            crossed.update(f"stablehlo.{op}" for op in fold.note.split("through ")[-1]
                           .split(", "))
    assert set(laws.SCALAR_LAWS) <= crossed, set(laws.SCALAR_LAWS) - crossed


def test_a_scale_in_f32_narrowed_back_to_bf16_rounds_as_a_bf16_scale():
    """`convert(convert(s, f32) * c, bf16)` rounds c s once to bf16, as a bf16 multiply
    does: the scale goes into the bf16 Wq (rule 8 compares with that type)."""
    import jax
    import jax.numpy as jnp

    wq, wk = tj._weights(0, jnp.bfloat16, (32, 16), (32, 16))

    def block(x):
        s = (x @ wq) @ (x @ wk).T
        return (s.astype(jnp.float32) * jnp.float32(0.3)).astype(jnp.bfloat16)

    text = tj._export(block, jax.ShapeDtypeStruct((6, 32), jnp.bfloat16))
    out = bnfold.fold_source(text)
    fold, = folded_scales(out.report)
    assert "convert" in fold.note and fold.producer_op == "stablehlo.dot_general", fold.note
    judged(text, out.serialize().decode(), "bf16", seeds=4)


HELPER_CASES = [("core", "f32", ()), ("core", "bf16", ()), ("proj", "f32", ()),
                ("norm", "f32", ()), ("norm", "bf16", ()),
                ("core", "f32", ("backward-affine",)), ("proj", "f32", ("backward-affine",)),
                ("norm", "f32", ("backward-affine",))]


@pytest.mark.parametrize("where, dtype, disabled", HELPER_CASES,
                         ids=[f"{w}-{d}-{'-'.join(x) or 'all'}" for w, d, x in HELPER_CASES])
def test_scales_and_norms_inside_helpers_called_twice_fold_per_call_site(where, dtype, disabled):
    """jax.export keeps `jax.jit` helpers as private functions: an attention core holding
    the scale (q from the caller's `x Wq`), a projection the caller scales, a norm the
    caller's linear layers read. Each of the two call sites is inlined and folds into its
    own layer's weights (a copy per call site: the layers' weights differ), whichever of
    the other patterns is on."""
    text, layers = tj.helpers(where=where, dtype=dtype)
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(disable=frozenset(disabled)))
    report = out.report
    kind = "normalization" if where == "norm" else "scale"
    folded = [f for f in report.folds if f.kind == kind]
    assert len(folded) == layers, report.table()
    assert len(report.inlined) >= layers, report.inlined
    if where == "norm":
        assert all(f.direction == "forward" and "2 linear layers" in f.note for f in folded)
    produced = out.serialize().decode()
    assert "call @norm" not in produced and "call @core" not in produced and \
        "call @proj" not in produced
    judged(text, produced, dtype)


@pytest.mark.parametrize("tied", [False, True])
def test_an_embedding_scale_walks_through_a_take_with_a_nan_fill(tied):
    """`jnp.take(table, ids, mode="fill")` (torchax's embedding: gather, then a select with
    NaN for out-of-range ids) times sqrt(hidden): c * NaN = NaN, so the fill is left as it
    is and the scale goes into the table; a table the LM head also reads stays one table,
    scaled for both, with 1/c in the kernel of the layer before the head."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(11)
    table = jnp.asarray(rng.normal(0, 0.3, (16, 8)), jnp.float32)
    w = jnp.asarray(rng.normal(0, 0.3, (8, 8)), jnp.float32)

    def fn(ids):
        x = jnp.take(table, ids, axis=0, mode="fill") * jnp.float32(math.sqrt(8.0) * 1.1)
        h = jnp.tanh(x) @ w  # (tanh: the scale cannot fold forward into w instead)
        return h @ (table.T if tied else w)

    ids = rng.integers(0, 16, (2, 5)).astype(np.int32)
    text = jax.jit(fn).lower(jnp.asarray(ids)).as_text()
    assert "0x7FC00000" in text  # the NaN fill is there
    folded, report = bnfold.fold_text(text)
    scales = [f for f in report.folds if f.kind == "scale"]
    if tied:  # one table, scaled for the gather and the head; 1/c into w (rule 10)
        assert len(scales) == 1 and "one table" in scales[0].note and \
            "1/3.11127 into the kernel of" in scales[0].note, scales[0].note
        assert _tables(folded, 16, 8, "f32") == 1
    else:
        assert len(scales) == 1 and "into the table of" in scales[0].note, \
            [s.to_json() for s in report.skipped]
    check_close(run_xla(folded, [ids]), run_xla(text, [ids]), "f32")


def test_every_norm_and_scale_decision_is_grouped_by_its_block():
    """Llama blocks named `layers.<i>` (jax.named_scope): each block's norms and attention
    scale fold, block 1's MLP norm is refused (its value also feeds the residual add),
    the final norm is outside every block; the JSON names each decision's block and the
    text report lists the decisions block by block."""
    text, _ = tj.llama(layers=2, post_norm_in=1)
    out = bnfold.fold_source(text)
    report = out.report
    data = report.to_json()
    by_block: dict[str, list[str]] = {}
    for f in data["folds"]:
        assert f["block"] == (f["norm"].split("/")[1] if "layers." in f["norm"] else "main"), f
        by_block.setdefault(f["block"], []).append(f["kind"])
    for s in data["skipped"]:
        assert s["block"] == (s["op"].split("/")[1] if "layers." in s["op"] else "main"), s
    for i in range(2):
        kinds = by_block[f"layers.{i}"]
        assert kinds.count("scale") == 1 and kinds.count("normalization") == 2 - i, by_block
    refused, = [s for s in report.skipped if s.code == Code.NONLINEAR_CONSUMER.value]
    assert refused.block == "layers.1", refused
    lines = report.table().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("block "))
    group, seen = "", {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        group = line.split()[0] if not line.startswith(" ") else group
        decision = line.split()[1] if not line.startswith(" ") else line.split()[0]
        seen.setdefault(group, []).append(decision)
    expected = {}
    for f in report.folds:
        expected.setdefault(f.block, []).append(f.id)
    for s in report.skipped:
        expected.setdefault(s.block, []).append("skipped")
    assert {b: len(d) for b, d in seen.items()} == {b: len(d) for b, d in expected.items()}, \
        report.table()
    assert seen["layers.1"][0].startswith("fold") and "skipped" in seen["layers.1"]
    judged(text, out.serialize().decode(), "f32", seeds=1)


def test_block_of_a_location():
    from bnfold.report import block_of
    cases = {
        "jit(f)/layers.0/attn/mul": "layers.0",
        "model.layers.3.self_attn.q_proj": "model.layers.3",
        "jit(f)/transformer/h.11/ln_1/mul": "transformer/h.11",
        "jit(<lambda>)/ResNet/BasicBlock_2/BatchNorm_0/sub": "ResNet/BasicBlock_2",
        "jit(f)/res_net/block_group_0/block_1/batchnorm_0/sub": "res_net/block_group_0/block_1",
        "jit(<lambda>)/mobilenetv2_0.35_32/block_1_expand_BN/mul": "mobilenetv2_0.35_32/block_1",
        "jit(f)/layers/2/norm/mul": "layers/2",
        "jit(block)/eqx.nn.MultiheadAttention/vmap()/div": "main",
        "jit(<lambda>)/ResNet/BatchNorm_0/sub": "main",
        "model.mlir:12:10": "main",
        "mul": "main",
    }
    assert {loc: block_of(loc, "main") for loc in cases} == cases


INTEGER_LAYER = """
func.func @main(%x: tensor<4x8xi8>) -> tensor<4x2x4xf32> {
  %w = stablehlo.constant dense<3> : tensor<8x8xi8>
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xi8>, tensor<8x8xi8>) -> tensor<4x8xi32>
  %b = stablehlo.constant dense<7> : tensor<4x8xi32>
  %db = stablehlo.add %d, %b : tensor<4x8xi32>
  %h = stablehlo.reshape %db : (tensor<4x8xi32>) -> tensor<4x2x4xi32>
  %f = stablehlo.convert %h : (tensor<4x2x4xi32>) -> tensor<4x2x4xf32>
  %c = stablehlo.constant dense<0.125> : tensor<4x2x4xf32>
  %r = stablehlo.multiply %f, %c : tensor<4x2x4xf32>
  return %r : tensor<4x2x4xf32>
}
"""


def test_the_scale_of_an_integer_layer_is_refused_with_a_code():
    """An int8 dot_general's i32 output (plus an integer bias, heads reshaped) converted to
    f32 and scaled (breaker 3b): the scale gets a decision, a refusal saying the layer
    computes in integers, and the module keeps its numbers."""
    out = bnfold.fold_source(INTEGER_LAYER)
    assert not out.report.folds, out.report.table()
    refused, = out.report.skipped
    assert refused.code == Code.QUANTIZED.value and "integers" in refused.reason, refused
    assert refused.op_name == "stablehlo.multiply"
    outcome = check.check(INTEGER_LAYER, out.serialize().decode(), seed=0)
    assert all(o.difference == 0 for o in outcome.outputs), outcome


LAYER_SCALE = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = stablehlo.constant dense<[[0.5, -0.25, 1.0, 2.0, 0.75, -1.5, 0.125, 3.0]]> : tensor<1x8xf32>
  %wb = stablehlo.broadcast_in_dim %w, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<8x8xf32>
  %d = stablehlo.dot_general %x, %wb, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %c = stablehlo.constant dense<0.1> : tensor<4x8xf32>
  %r = stablehlo.multiply %d, %c : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""


def test_a_scale_folded_by_backward_affine_is_reported_as_a_constant_scale():
    """A layer scale right after a linear layer folds through backward-affine (breaker 3c:
    it was reported as kind "affine", with nothing saying it was a constant scale)."""
    out = bnfold.fold_source(LAYER_SCALE)
    fold, = out.report.folds
    assert (fold.kind, fold.form, fold.direction) == ("scale", "scale", "backward"), fold
    assert fold.note.startswith("a constant scale 0.1 (multiply"), fold.note
    assert "1 multiply folded backward" in out.report.summary()
    judged(LAYER_SCALE, out.serialize().decode(), "f32")


FAN_OUT_AND_INPUT = """
func.func @main(%x: tensor<4x8xf32>, %kh: tensor<4x2x4xf32>) -> (tensor<2x4x4xf32>, tensor<4x8xf32>) {
  %wq = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %qh = stablehlo.reshape %q : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  %c = stablehlo.constant dense<0.3> : tensor<2x4x4xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x4x4xf32>
  return %r, %q : tensor<2x4x4xf32>, tensor<4x8xf32>
}
"""

UNBOUND = """
func.func @main(%x: tensor<4x8xf32>, %wq: tensor<8x8xf32>, %wk: tensor<8x8xf32>, %wv: tensor<8x8xf32>) -> (tensor<2x4x4xf32>, tensor<4x8xf32>) {
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %k = stablehlo.dot_general %x, %wk, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %v = stablehlo.dot_general %x, %wv, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %qh = stablehlo.reshape %q : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %kh = stablehlo.reshape %k : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  %c = stablehlo.constant dense<0.3> : tensor<2x4x4xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x4x4xf32>
  return %r, %v : tensor<2x4x4xf32>, tensor<4x8xf32>
}
"""


def test_a_value_read_twice_is_the_reason_not_a_function_argument():
    """Breaker 3d: q (x Wq) is also returned and k is an input of the function: the way
    into Wq is stopped by q's second reader, the way into k ends at the argument. The
    refusal names q's fan-out (code users) and mentions the argument after it, instead
    of telling the user to bind parameters; where the weights themselves are arguments
    (unbound), binding is still what it says."""
    out = bnfold.fold_source(FAN_OUT_AND_INPUT)
    refused, = out.report.skipped
    assert refused.code == Code.USERS.value, refused
    assert refused.reason.index("also read by func.return") < refused.reason.index("%arg1"), \
        refused.reason
    assert "bind them" not in out.report.summary()
    unbound, = bnfold.fold_source(UNBOUND).report.skipped
    assert unbound.code == Code.PARAMETER.value, unbound
    for text in (FAN_OUT_AND_INPUT, UNBOUND):
        outcome = check.check(text, bnfold.fold_source(text).serialize().decode(), seed=0)
        assert all(o.difference == 0 for o in outcome.outputs), outcome


def _bf16_layer_then_f32(chain: str, conv: bool = False, seed: int = 0) -> str:
    """A bf16 dot_general (or convolution) converted to f32, then `* 0.102` ("scale") or a
    batch norm ("bn") in f32, returned in f32, or converted back to bf16 ("bn_bf16":
    torchvision's bf16 ResNet)."""
    import jax
    import jax.numpy as jnp
    from jax import export

    rng = np.random.default_rng(seed)
    k, m = 64, 32
    w = jnp.asarray(rng.normal(size=(3, 3, k, m) if conv else (k, m)) / 8, jnp.bfloat16)
    mean, beta = (rng.normal(size=m).astype(np.float32) * 0.3 for _ in range(2))
    var = rng.uniform(0.5, 2, size=m).astype(np.float32)
    gamma = rng.normal(1, 0.3, size=m).astype(np.float32)

    def f(x):
        y = (jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
             if conv else x @ w).astype(jnp.float32)
        if chain == "scale":
            return y * jnp.float32(0.102)
        bn = (y - mean) * (gamma * jax.lax.rsqrt(var + 1e-5)) + beta
        return bn.astype(jnp.bfloat16) if chain == "bn_bf16" else bn

    shape = (2, 8, 8, k) if conv else (16, k)
    return str(export.export(jax.jit(f))(jax.ShapeDtypeStruct(shape, jnp.bfloat16)).mlir_module())


@pytest.mark.parametrize("chain", ["scale", "bn", "bn_bf16"])
@pytest.mark.parametrize("conv", [False, True], ids=["dot", "conv"])
def test_a_bf16_layer_scaled_in_f32_keeps_its_kernel_unless_rounded_back(chain, conv):
    """Breaker 3e, rule 9: `convert(bf16 layer) -> f32 * c` (or a batch norm in f32) with
    an f32 result is refused (folding rounds the scaled weights to bf16; the original,
    on XLA, is f32-accurate); --fold-into-narrow-kernels folds it anyway. Rounded back to
    bf16 at the end (torchvision's bf16 ResNet), it folds within the contract. Judged on
    XLA against float64 of the original."""
    text = _bf16_layer_then_f32(chain, conv)
    out = bnfold.fold_source(text)
    if chain == "bn_bf16":
        assert len(out.report.folds) == 1, out.report.table()
        judged(text, out.serialize().decode(), "bf16", seeds=3)
        return
    assert not out.report.folds, out.report.table()
    refused, = out.report.skipped
    assert refused.code == Code.PRECISION.value and "--fold-into-narrow-kernels" in \
        refused.reason, refused
    forced = bnfold.fold_source(text, options=bnfold.FoldOptions(fold_into_narrow_kernels=True))
    assert len(forced.report.folds) == 1, forced.report.table()
    o = check.check(text, forced.serialize().decode(), seed=0).outputs[0]
    if o.original_error < 1e-5:
        # XLA CPU up to jax 0.10 keeps the converted product in f32: what the rule keeps out.
        assert o.output_error > 100 * o.original_error, o
    else:
        # jax 0.11's XLA CPU rounds the product to bf16, as its type says: then the
        # forced fold is within the contract (docs/precision.md, rule 9).
        assert o.original_error < 1e-2 and o.output_error <= 1.5 * o.original_error + 2.0 ** -24, o


def test_an_f16_weight_scaled_into_the_subnormals_is_kept_not_flushed():
    """Breaker 3f, rule 2 for f16: the soft-cap 1/30 pushes the weight 6e-5 to 2e-6, an f16
    subnormal. XLA CPU computes f16 through f32, where it is a normal number: measured,
    the folded weight is used (not flushed to zero), so rule 2 counts f16 subnormals as
    numbers (`precision.flushed_below`) and judges them norm-wise. Elementwise, an input
    concentrated on that weight's row sees its subnormal rounding (1.3% against float64,
    where the original errs 3e-4), which the contract's norm-wise bound allows; a rule
    refusing every f16 weight that rounds by more than a unit of roundoff would refuse 8
    of the 20 folds of Flax's ResNet-18 in f16 (docs/precision.md, rule 2)."""
    from bnfold.ir import xla_cpu_run

    w = np.array([[6.0e-5, 0.5], [0.3, -0.2], [0.25, 0.7], [-0.4, 0.1]], np.float16)
    text = f"""
func.func @main(%x: tensor<1x4xf16>) -> tensor<1x2xf16> {{
  %w = stablehlo.constant dense<"0x{w.tobytes().hex().upper()}"> : tensor<4x2xf16>
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<1x4xf16>, tensor<4x2xf16>) -> tensor<1x2xf16>
  %c = stablehlo.constant dense<3.333330e-02> : tensor<1x2xf16>
  %r = stablehlo.multiply %d, %c : tensor<1x2xf16>
  return %r : tensor<1x2xf16>
}}
"""
    out = bnfold.fold_source(text)
    fold, = out.report.folds
    assert fold.kind == "scale", out.report.table()
    folded = out.serialize().decode()
    x = np.array([[1000, 1e-3, 1e-3, 1e-3]], np.float16)
    exact = (x.astype(np.float64) @ w.astype(np.float64))[0, 0] * float(np.float16(3.33333e-2))
    got = float(np.asarray(xla_cpu_run(folded, [x])[0], np.float64)[0, 0])
    flushed = (x.astype(np.float64)[0, 1:] @ w.astype(np.float64)[1:, 0]) * 3.33333e-2
    assert abs(got - exact) < 0.02 * abs(exact) < abs(flushed - exact), (got, exact, flushed)
    judged(text, folded, "f16", seeds=3)


def _embedding_decisions(report: bnfold.Report, c: float) -> tuple[list, list]:
    """The folds and refusals of the embedding scale `c`."""
    folds = [f for f in report.folds if f.kind == "scale" and
             float(f.params["scale"].reshape(-1)[0]) == pytest.approx(c, rel=1e-2)]
    refusals = [s for s in report.skipped if s.reason.startswith(f"the scale {str(c)[:4]}")]
    return folds, refusals


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_gemma_embedding_scale_gets_its_own_decision(dtype, tied):
    """Gemma's `table[ids] * sqrt(d)` is read by the first norm's statistics, its `x *
    rsqrt(...)` and the residual: the norm's layers take only its `1 + w` (not c (1 + w):
    the multiply would still run for the others), and the scale gets one decision of its
    own, a fold into the table (the head's copy of a tied table is the final norm's fold,
    made before), so the multiply is gone. Judged on XLA and against float64."""
    model = 32
    c = math.sqrt(model)
    text = _shared(tj.gemma_block(dtype=dtype, tied=tied, model=model, vocab=48))
    out = bnfold.fold_source(text)
    produced = out.serialize().decode()
    folds, refusals = _embedding_decisions(out.report, c)
    assert len(folds) == 1 and not refusals, out.report.table()
    assert "into the table of" in folds[0].note, folds[0].note
    scale = "5.65685415" if dtype == "f32" else "5.656250e+00"
    assert scale in text and scale not in produced  # the multiply is gone
    vocab = 48  # gemma_block's weights, drawn in its order: the first norm's w is the 5th
    nw = np.asarray(tj._weights(1, np.float32, (vocab, model), (model, vocab),
                                (model, 2 * model), (2 * model, model), (model,))[4])
    first, = [f for f in out.report.folds if f.kind != "scale" and
              np.allclose(f.params["scale"], 1 + nw, rtol=1e-2)]  # 1 + w, not c (1 + w)
    assert not [f for f in out.report.folds if f.kind != "scale" and
                np.allclose(f.params["scale"], c * (1 + nw), rtol=1e-2)], first
    judged(text, produced, dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_tied_gemma_table_stays_one_table(dtype):
    """The head still tied when fold-scale runs (forward-affine off, so the final norm
    keeps its `1 + w`): in f32 the scale goes into the one table and 1/c into the final
    norm's weight, and no copy is written (rule 10: measured no less accurate); in bf16
    the head would read the table rounded once more (measured: less accurate), so the
    multiply stays, refused `shared-weight` with the copy's bytes and the reason."""
    model, vocab = 32, 48
    c = math.sqrt(model)
    text = _shared(tj.gemma_block(dtype=dtype, tied=True, model=model, vocab=vocab))
    out = bnfold.fold_source(text, options=bnfold.FoldOptions(
        disable=frozenset({"forward-affine"})))
    produced = out.serialize().decode()
    folds, refusals = _embedding_decisions(out.report, c)
    assert _tables(text, vocab, model, dtype) == _tables(produced, vocab, model, dtype) == 1
    if dtype == "f32":
        assert len(folds) == 1 and not refusals, out.report.table()
        assert "one table" in folds[0].note and \
            f"1/{c:.6g} into the constant factor of" in folds[0].note, folds[0].note
        assert "5.65685415" not in produced
    else:
        assert not folds and len(refusals) == 1, out.report.table()
        assert refusals[0].code == Code.SHARED_WEIGHT.value and \
            f"({vocab * model * 2} bytes)" in refusals[0].reason and \
            "rule 10" in refusals[0].reason, refusals[0].reason
    judged(text, produced, dtype, seeds=3)



def test_a_scaling_helper_after_a_batch_norm_folds_in_one_run():
    """Fuzzer seed 11: a jitted helper's `* c` after a `batch_norm_inference` (a bias and a
    reshape between). The walk that decides whether to inline the helper stopped at the
    batch norm (no scalar law), so the first run left the helper; a second run, with the
    batch norm folded into the convolution, inlined it and folded the scale forward:
    fold(fold(m)) != fold(m). Judged on XLA against float64 of the original."""
    text = (support.ROOT / "tests" / "inputs" / "scale_helper_after_batch_norm.mlir").read_text()
    out = bnfold.fold_source(text)
    assert sorted((f.norm_op, f.direction) for f in out.report.folds) == [
        ("stablehlo.batch_norm_inference", "backward"), ("stablehlo.multiply", "forward")], \
        out.report.table()
    assert out.report.inlined == ["block0"], out.report.inlined
    folded = out.serialize().decode()
    again = bnfold.fold_source(folded)
    assert not again.report.folds and again.serialize().decode() == folded, again.report.table()
    judged(text, folded, "f16")
