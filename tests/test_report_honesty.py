"""What the report says against what the output module is (issue 34's report gaps).

- A fold into a weight also read elsewhere (an embedding table tied to the LM head) copies
  it: the record's `copied_bytes` must equal the growth of the output module's constants,
  measured from the module (every `stablehlo.constant`'s data), and be absent without one.
- `x * 1` and `x + 0` (torchax's `a + b * 1`) are removed, not folded: no fold, no rewrite
  of the linear layer before them, and the outputs are bit for bit the original's.
- A refusal names the real consumer of a norm (the residual add), and a norm's own
  statistics divide gets no skip of its own.
- A private helper is inlined only where a fold is gained.
- A "kernel" that is the input itself (`x @ x^T`) is not called a parameter to bind.

Every judgement is on the output module or on XLA CPU's numbers, never on bnfold's own rules.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import bnfold
from bnfold import check
from bnfold import ir as bir
from numerics import run_xla

RNG = np.random.default_rng(34)


def _dense(array: np.ndarray) -> str:
    return "dense<" + np.array2string(array, separator=", ", threshold=1 << 20,
                                      floatmode="unique").replace("\n", "") + ">"


def constant_bytes(text: str, shapes: set[tuple[int, ...]] | None = None) -> int:
    """The bytes of every constant's data in the module (a splat counts one element); only
    of constants of these `shapes`, when given."""
    module = bir.parse(text, bir.make_context())
    total = 0

    def visit(op: bir.ir.Operation) -> bir.ir.WalkResult:
        op = op.operation
        if op.name == "stablehlo.constant":
            attr = bir.ir.DenseElementsAttr(op.attributes["value"])
            ty = bir.ir.RankedTensorType(attr.type)
            if shapes is not None and tuple(ty.shape) not in shapes:
                return bir.ir.WalkResult.ADVANCE
            width = ty.element_type.width // 8  # type: ignore[attr-defined]
            total_elements = 1 if attr.is_splat else int(np.prod(ty.shape))
            nonlocal total
            total += total_elements * width
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return total


def _head(tied: bool, backward: bool) -> str:
    """An LM head `(x * g) @ W^T` (forward: the per-feature g folds into W) or
    `(x @ W^T) / 30` (backward: the soft-cap's 1/30 folds into W), and an embedding
    lookup `W[ids]` of the same table (tied) or of another one with the same values."""
    w = RNG.normal(size=(32, 16)).astype(np.float32)
    g = RNG.uniform(0.5, 1.5, size=(16,)).astype(np.float32)
    table = "%w" if tied else "%w2"
    second = "" if tied else f"  %w2 = stablehlo.constant {_dense(w)} : tensor<32x16xf32>\n"
    if backward:
        body = (
            "  %l = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : "
            "(tensor<2x16xf32>, tensor<32x16xf32>) -> tensor<2x32xf32>\n"
            "  %cap = stablehlo.constant dense<3.000000e+01> : tensor<2x32xf32>\n"
            "  %logits = stablehlo.divide %l, %cap : tensor<2x32xf32>\n")
    else:
        body = (
            f"  %g = stablehlo.constant {_dense(g)} : tensor<16xf32>\n"
            "  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<16xf32>) -> tensor<2x16xf32>\n"
            "  %n = stablehlo.multiply %x, %gb : tensor<2x16xf32>\n"
            "  %logits = stablehlo.dot_general %n, %w, contracting_dims = [1] x [1] : "
            "(tensor<2x16xf32>, tensor<32x16xf32>) -> tensor<2x32xf32>\n")
    return (
        "func.func @main(%x: tensor<2x16xf32>, %ids: tensor<2x1xi32>) -> "
        "(tensor<2x32xf32>, tensor<2x16xf32>) {\n"
        f"  %w = stablehlo.constant {_dense(w)} : tensor<32x16xf32>\n{second}{body}"
        f'  %e = "stablehlo.gather"({table}, %ids) <{{dimension_numbers = #stablehlo.gather<'
        "offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], "
        "index_vector_dim = 1>, slice_sizes = array<i64: 1, 16>}> : "
        "(tensor<32x16xf32>, tensor<2x1xi32>) -> tensor<2x16xf32>\n"
        "  return %logits, %e : tensor<2x32xf32>, tensor<2x16xf32>\n}\n")


def _same_numbers(original: str, output: str) -> None:
    outcome = check.check(original, output, seed=0)
    for o in outcome.outputs:
        assert o.difference <= o.tolerance, o


@pytest.mark.parametrize("backward", [False, True], ids=["forward-affine", "backward-affine"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_copied_weight_is_reported_with_the_bytes_the_module_grew_by(tied, backward):
    text = _head(tied, backward)
    out = bnfold.fold_source(text)
    folded = out.serialize("mlir").decode()
    fold, = out.report.folds
    assert fold.direction == ("backward" if backward else "forward")
    # what the fold consumed: g (16 floats), or the splat 30
    consumed = 4 if backward else 16 * 4
    grown = constant_bytes(folded) - constant_bytes(text) + consumed
    assert fold.copied_bytes == grown
    if tied:
        assert grown == 32 * 16 * 4  # the table, twice
        data = fold.to_json()
        assert data["shared_weight"] == {"copied_bytes": grown,
                                         "also_read_by": ["stablehlo.gather"]}
        assert f"+{grown} bytes" in fold.note
        assert "copied 1 shared weight(s) (+2 KiB" in out.report.summary()
        assert "shared" in out.report.table()
    else:
        assert grown == 0 and "shared_weight" not in fold.to_json()
        assert "shared weight" not in out.report.summary()
    _same_numbers(text, folded)


def test_a_tied_gemma_head_reports_every_copy_it_makes():
    """A Gemma-style LM (jax, tied head, CSE'd so the gather and the head read one table):
    the final norm's `1 + w` and the soft-cap's `1 / cap` both fold; whatever they copy, the
    report's bytes add up to the module's growth."""
    pytest.importorskip("flax")
    import transformers_jax as tj

    text, _ = tj.gemma(tied=True)
    module = bir.parse(text, bir.make_context())
    bir.run_pipeline(module, "builtin.module(cse)")
    text = str(module)
    out = bnfold.fold_source(text)
    folded = out.serialize("mlir").decode()
    copied = sum(f.copied_bytes for f in out.report.folds)
    assert copied > 0
    found = re.search(r'"stablehlo.gather"\(%\S+, %\S+\).*: \(tensor<(\d+)x(\d+)x', text)
    assert found is not None
    rows, cols = int(found.group(1)), int(found.group(2))
    table = {(rows, cols), (cols, rows)}  # the head may read it transposed
    # the other folds rewrite kernels at their size and drop norm weights: the tables'
    # bytes are where a copy shows
    assert copied == constant_bytes(folded, table) - constant_bytes(text, table)
    _same_numbers(text, folded)


# --- identities ----------------------------------------------------------------------------

_RESIDUAL = """
func.func @main(%x: tensor<2x8xf32>, %a: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %w = stablehlo.constant WEIGHT : tensor<8x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %ob = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %m = stablehlo.multiply %y, %ob : tensor<2x8xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
  %z = stablehlo.add %a, %zero : tensor<2x8xf32>
  %r = stablehlo.add %z, %m : tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}
"""


def _residual() -> tuple[str, np.ndarray]:
    w = RNG.normal(size=(8, 8)).astype(np.float32)
    return _RESIDUAL.replace("WEIGHT", _dense(w)), w


def test_a_multiply_by_one_is_removed_not_folded():
    text, w = _residual()
    out = bnfold.fold_source(text)
    folded = out.serialize("mlir").decode()
    report = out.report
    assert report.folds == []  # no affine fold counted for `y * 1`
    assert [r.op_name for r in report.identities] == ["stablehlo.multiply", "stablehlo.add"]
    assert [r.to_json()["kind"] for r in report.identities] == ["identity", "identity"]
    assert "removed 2 identity op(s)" in report.summary()
    assert "folded 0 normalization(s), skipped 0" in report.summary()
    # the output: one dot_general with the original weight, one add, nothing else
    assert "stablehlo.multiply" not in folded and folded.count("stablehlo.add") == 1
    module = bir.parse(folded, bir.make_context())
    kernels = []

    def visit(op: bir.ir.Operation) -> bir.ir.WalkResult:
        if op.operation.name == "stablehlo.constant":
            kernels.append(np.asarray(bir.ir.DenseElementsAttr(op.operation.attributes["value"])))
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    assert len(kernels) == 1 and np.array_equal(kernels[0], w)  # the weight is not rewritten
    x = RNG.normal(size=(2, 8)).astype(np.float32)
    a = np.array([[-0.0, 1e-30, np.inf, np.nan, 3.0, -2.0, 0.5, 7.0]] * 2, np.float32)
    before, = run_xla(text, [x, a])
    after, = run_xla(folded, [x, a])
    np.testing.assert_array_equal(after, before)  # exact, NaN and inf included


def test_an_identity_with_another_constant_stays():
    text, _ = _residual()
    text = text.replace("dense<1.000000e+00> : tensor<f32>", "dense<1.000001e+00> : tensor<f32>")
    text = text.replace("dense<0.000000e+00> : tensor<2x8xf32>", "dense<1.0e-30> : tensor<2x8xf32>")
    out = bnfold.fold_source(text)
    assert out.report.identities == []
    folded = out.serialize("mlir").decode()
    assert folded.count("stablehlo.add") == 2  # the add of 1e-30 stays


_POST_NORM = """
func.func @main(%x: tensor<2x4x8xf32>, %res: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  %sq = stablehlo.multiply %x, %x : tensor<2x4x8xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [2] : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4xf32>
  %sb = stablehlo.broadcast_in_dim %sum, dims = [0, 1] : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %n = stablehlo.constant dense<8.000000e+00> : tensor<2x4x1xf32>
  %ms = stablehlo.divide %sb, %n : tensor<2x4x1xf32>
  %eps = stablehlo.constant dense<9.99999997E-7> : tensor<2x4x1xf32>
  %v = stablehlo.add %ms, %eps : tensor<2x4x1xf32>
  %r = stablehlo.rsqrt %v : tensor<2x4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2] : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
  %xn = stablehlo.multiply %x, %rb : tensor<2x4x8xf32>
  %g = stablehlo.constant dense<[0.5, 0.75, 1.0, 1.25, 1.5, 0.6, 0.7, 0.8]> : tensor<8xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [2] : (tensor<8xf32>) -> tensor<2x4x8xf32>
  %y = stablehlo.multiply %xn, %gb : tensor<2x4x8xf32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<2x4x8xf32>
  %y1 = stablehlo.multiply %y, %one : tensor<2x4x8xf32>
  %out = stablehlo.add %res, %y1 : tensor<2x4x8xf32>
  return %out : tensor<2x4x8xf32>
}
"""


def test_a_post_norm_refusal_names_the_residual_add_and_its_divide_gets_no_skip():
    """A post-norm RMSNorm (`res + norm(x) * 1`): the norm cannot fold (its value is the
    residual stream), and the refusal names the add, not the `* 1` torchax put before it;
    the mean square's `/ 8` is the norm's own statistics, not a skip of its own."""
    out = bnfold.fold_source(_POST_NORM)
    skipped = out.report.skipped
    assert [s.op_name for s in skipped] == ["stablehlo.multiply"]  # the norm (its g)
    skip, = skipped
    assert skip.code == "nonlinear-consumer"
    assert "stablehlo.add" in skip.reason and "stablehlo.multiply at" not in skip.reason, \
        skip.reason
    assert not any(s.op_name == "stablehlo.divide" for s in skipped)
    folded = out.serialize("mlir").decode()
    _same_numbers(_POST_NORM, folded)


# --- helpers inlined only where a fold is gained ------------------------------------------

_HELPERS = """
func.func @main(%x: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %w = stablehlo.constant WEIGHT : tensor<8x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %t = stablehlo.tanh %y : tensor<2x8xf32>
  %h = call @hard_sigmoid(%t) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %v = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %s = call @scaled(%v) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %h, %s : tensor<2x8xf32>, tensor<2x8xf32>
}
func.func private @hard_sigmoid(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %three = stablehlo.constant dense<3.000000e+00> : tensor<2x8xf32>
  %a = stablehlo.add %arg0, %three : tensor<2x8xf32>
  %r = call @relu6(%a) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %six = stablehlo.constant dense<6.000000e+00> : tensor<2x8xf32>
  %d = stablehlo.divide %r, %six : tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}
func.func private @relu6(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
  %six = stablehlo.constant dense<6.000000e+00> : tensor<2x8xf32>
  %m = stablehlo.maximum %arg0, %zero : tensor<2x8xf32>
  %c = stablehlo.minimum %m, %six : tensor<2x8xf32>
  return %c : tensor<2x8xf32>
}
func.func private @scaled(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %c = stablehlo.constant dense<1.250000e-01> : tensor<2x8xf32>
  %m = stablehlo.multiply %arg0, %c : tensor<2x8xf32>
  return %m : tensor<2x8xf32>
}
"""


def test_a_helper_is_inlined_only_where_its_scale_reaches_a_weight():
    """hard_sigmoid's `/ 6` stops at relu6 (no law carries a scale through a clamp): the
    helpers stay calls and nothing changes there. `@scaled`'s `* 0.125` reaches the
    caller's dot_general: inlined, and the scale goes into its weight."""
    w = RNG.normal(size=(8, 8)).astype(np.float32)
    text = _HELPERS.replace("WEIGHT", _dense(w))
    out = bnfold.fold_source(text)
    folded = out.serialize("mlir").decode()
    assert out.report.inlined == ["scaled"]
    assert "call @hard_sigmoid" in folded and "func.func private @relu6" in folded
    assert "call @scaled" not in folded and "func.func private @scaled" not in folded
    assert "dense<1.250000e-01>" not in folded  # the scale went into a weight
    x = RNG.normal(size=(2, 8)).astype(np.float32)
    before = run_xla(text, [x])
    after = run_xla(folded, [x])
    np.testing.assert_array_equal(after[0], before[0])  # the untouched path: bit for bit
    np.testing.assert_allclose(after[1], before[1], rtol=1e-6, atol=1e-6)
    _same_numbers(text, folded)


_PAD_HELPER = """
func.func @main(%x: tensor<1x6x6x4xf32>) -> tensor<1x6x6x4xf32> {
  %w = stablehlo.constant WEIGHT : tensor<3x3x4x4xf32>
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x6x6x4xf32>, tensor<3x3x4x4xf32>) -> tensor<1x6x6x4xf32>
  %var = stablehlo.constant dense<[0.5, 2.0, 1.5, 0.25]> : tensor<4xf32>
  %r = stablehlo.rsqrt %var : tensor<4xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [3] : (tensor<4xf32>) -> tensor<1x6x6x4xf32>
  %n = stablehlo.multiply %y, %rb : tensor<1x6x6x4xf32>
  %t = stablehlo.tanh %n : tensor<1x6x6x4xf32>
  %a = stablehlo.multiply %n, %t : tensor<1x6x6x4xf32>
  %p = call @_pad(%a) : (tensor<1x6x6x4xf32>) -> tensor<1x7x7x4xf32>
  %z = stablehlo.convolution(%p, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[0, 0], [0, 0]], stride = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x7x7x4xf32>, tensor<3x3x4x4xf32>) -> tensor<1x5x5x4xf32>
  %zp = stablehlo.slice %z [0:1, 0:5, 0:5, 0:4] : (tensor<1x5x5x4xf32>) -> tensor<1x5x5x4xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %o = stablehlo.pad %zp, %zero, low = [0, 0, 0, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<1x5x5x4xf32>, tensor<f32>) -> tensor<1x6x6x4xf32>
  return %o : tensor<1x6x6x4xf32>
}
func.func private @_pad(%arg0: tensor<1x6x6x4xf32>) -> tensor<1x7x7x4xf32> {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %p = stablehlo.pad %arg0, %zero, low = [0, 0, 0, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<1x6x6x4xf32>, tensor<f32>) -> tensor<1x7x7x4xf32>
  return %p : tensor<1x7x7x4xf32>
}
"""


def test_a_pad_helper_after_an_inference_batch_norm_stays_a_call():
    """Keras' `_pad` after a hard-swish of a batch norm (statistics constant: backward-
    affine's, no run-time norm for forward-norm to fold through the pad): nothing folds
    through the helper, so it stays a call, as it was before forward-norm."""
    w = RNG.normal(size=(3, 3, 4, 4)).astype(np.float32)
    text = _PAD_HELPER.replace("WEIGHT", _dense(w))
    out = bnfold.fold_source(text)
    folded = out.serialize("mlir").decode()
    assert out.report.inlined == []
    assert "call @_pad" in folded
    assert len(out.report.folds) == 1  # the batch norm's 1/sqrt(var), backward
    _same_numbers(text, folded)


def test_a_per_channel_parameter_of_ones_is_not_an_identity():
    """An untrained batch norm's gamma (ones per channel, broadcast along the features) is
    that layer's parameter, not torchax's scalar `* 1`: it stays for the folds, which
    recover the batch norm's statistics from it (and warn that they are untrained)."""
    text, _ = _residual()
    text = text.replace(
        "%one = stablehlo.constant dense<1.000000e+00> : tensor<f32>\n"
        "  %ob = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<2x8xf32>",
        "%one = stablehlo.constant dense<1.000000e+00> : tensor<8xf32>\n"
        "  %ob = stablehlo.broadcast_in_dim %one, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>")
    assert "tensor<8xf32>) -> tensor<2x8xf32>" in text
    out = bnfold.fold_source(text)
    assert [r.op_name for r in out.report.identities] == ["stablehlo.add"]  # the scalar + 0
    _same_numbers(text, out.serialize("mlir").decode())


def _product_then_scale(kernel: str, activation: str) -> str:
    computed = activation == "tanh"
    lhs = "%a" if computed else "%x"
    return f"""
func.func @main(%x: tensor<3x3xf32>, %w: tensor<3x3xf32>) -> tensor<3x3xf32> {{
  %a = stablehlo.tanh %x : tensor<3x3xf32>
  %t = stablehlo.transpose {kernel}, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %y = stablehlo.dot_general {lhs}, %t, contracting_dims = [1] x [0] : (tensor<3x3xf32>, tensor<3x3xf32>) -> tensor<3x3xf32>
  %c = stablehlo.constant dense<[1.5, 2.0, 3.0]> : tensor<3xf32>
  %b = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<3xf32>) -> tensor<3x3xf32>
  %z = stablehlo.multiply %y, %b : tensor<3x3xf32>
  return %z : tensor<3x3xf32>
}}"""


@pytest.mark.parametrize("kernel, activation, code", [
    ("%x", "%x", "not-constant"), ("%w", "%x", "kernel-argument"),
    ("%w", "tanh", "kernel-argument")])  # the usual export: weights as arguments
def test_a_product_of_the_input_with_itself_is_not_told_to_bind_it(kernel, activation, code):
    """`x @ x^T * c`: the "kernel" is the input itself; the refusal once told the user to
    bind it as a parameter (--bind-params) like a real weight argument (`x @ w^T * c`,
    `tanh(x) @ w^T * c`)."""
    text = _product_then_scale(kernel, activation)
    folded, report = bnfold.fold_text(text)
    x, w = RNG.standard_normal((3, 3)).astype(np.float32), RNG.standard_normal((3, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_xla(folded, [x, w])[0], run_xla(text, [x, w])[0])
    refusal, = report.skipped
    assert refusal.code == code, refusal.reason
    bind = "--bind-params" in refusal.reason or "bind" in report.summary()
    assert bind == (kernel == "%w"), (refusal.reason, report.summary())
    if kernel == "%x":
        assert "product of two activations" in refusal.reason, refusal.reason
