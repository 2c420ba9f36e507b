"""The core's rules, enforced on real modules with every pattern running.

* `match` and `plan` are pure: the IR is exactly the same after them.
* `apply` only creates ops and goes through the rewriter: every op that existed before
  keeps its attributes and the *identity* of its operands, except operands that a
  recorded `Rewriter.replace_op` / `replace_uses` redirected; nothing is erased while
  patterns run (erasure waits for `Rewriter.finish`).
* No state keyed by an op's address survives an erase: MLIR hands a freed address to
  the next op it creates, and that newcomer must not inherit a report entry, an overlay
  node or a statistic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bnfold
import support
from bnfold import driver
from bnfold import ir as bir
from bnfold.ir import ir, op_id
from bnfold.rewriter import Rewriter

ROOT = Path(__file__).resolve().parent.parent
LIT = ROOT / "lit_tests"


def _snapshot(module: ir.Module) -> list[tuple[object, str, str, tuple]]:
    found: list[tuple[object, str, str, tuple]] = []

    def visit(op):
        op = op.operation
        attrs = ";".join(f"{n}={op.attributes[n]}" for n in op.attributes)
        found.append((op, op.name, attrs, tuple(op.operands)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


class Guard:
    """Checks the rules around every call the driver makes."""

    def __init__(self, module: ir.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.module = module
        self.redirected: dict[object, object] = {}
        self.calls = {"match": 0, "plan": 0, "apply": 0}
        guard = self
        replace_op, replace_uses = Rewriter.replace_op, Rewriter.replace_uses

        def record_replace(rewriter, op, values, **kwargs):
            for result, value in zip(op.results, values, strict=True):
                guard.redirected[result] = value
            return replace_op(rewriter, op, values, **kwargs)

        def record_uses(rewriter, value, new, **kwargs):
            guard.redirected[value] = new
            return replace_uses(rewriter, value, new, **kwargs)

        monkeypatch.setattr(Rewriter, "replace_op", record_replace)
        monkeypatch.setattr(Rewriter, "replace_uses", record_uses)
        monkeypatch.setattr(driver, "run_pattern", self.run_pattern)

    def run_pattern(self, ctx: driver.Context, pattern) -> None:
        for root in pattern.roots(ctx):
            before = _snapshot(self.module)
            matched = pattern.match(ctx, root)
            self.unchanged(before, f"{pattern.NAME}.match")
            self.calls["match"] += 1
            if matched is None or isinstance(matched, bnfold.refusal.Refusal):
                if matched is not None:
                    pattern.refuse(ctx, root, matched)
                continue
            planned = pattern.plan(ctx, matched)
            self.unchanged(before, f"{pattern.NAME}.plan")
            self.calls["plan"] += 1
            if planned is None or isinstance(planned, bnfold.refusal.Refusal):
                if planned is not None:
                    pattern.refuse(ctx, matched, planned)
                continue
            self.redirected.clear()
            applied = pattern.apply(ctx.rewriter, planned)
            self.only_created(before, pattern.NAME)
            self.calls["apply"] += 1
            pattern.record(ctx, planned, applied)
        pattern.finish(ctx)

    def unchanged(self, before, where: str) -> None:
        after = _snapshot(self.module)
        assert len(after) == len(before), f"{where} added or removed ops"
        for (op, name, attrs, operands), (op2, name2, attrs2, operands2) in zip(before, after,
                                                                               strict=True):
            assert op == op2 and name == name2 and attrs == attrs2 and operands == operands2, \
                f"{where} changed {name}"

    def only_created(self, before, where: str) -> None:
        after = {op_id(op): (name, attrs, operands) for op, name, attrs, operands in _snapshot(self.module)}
        for op, name, attrs, operands in before:
            key = op_id(op)
            assert key in after, f"{where}.apply erased {name} (erasure waits for finish)"
            name2, attrs2, operands2 = after[key]
            assert (name2, attrs2) == (name, attrs), f"{where}.apply changed {name}'s attributes"
            expected = tuple(self._follow(v) for v in operands)
            assert operands2 == expected, f"{where}.apply rewired an operand of {name} by hand"

    def _follow(self, value):
        while value in self.redirected:
            value = self.redirected[value]
        return value


MODULES = [
    ("models/keras_mobilenetv2_nhwc.mlir", {"equalize": True, "absorb_high_bias": True}),
    ("models/deployment_flax_resnet18_multiplatform_nhwc.mlir", {}),
    ("models/deployment_jax_jit_conv_helper_nhwc.mlir", {"equalize": True}),
    ("models/torchax_normalized_stem_nchw.mlir", {}),
    ("models/keras_efficientnet_stem_nhwc.mlir", {"expand_batch_norm": True}),
    ("lit:absorb-high-bias.mlir", {"equalize": True, "absorb_high_bias": True}),
    ("lit:equalize.mlir", {"equalize": True}),
    ("lit:forward-affine.mlir", {}),
    ("lit:fold-scale.mlir", {}),
    ("lit:forward-norm.mlir", {}),
    ("models/haiku_resnet_nhwc.mlir", {"equalize": True, "quantize_weights": "int8",
                                       "bias_correction": True}),
    ("lit:quantize-weights.mlir", {"quantize_weights": "int4", "bias_correction": True,
                                   "quantize_granularity": "per-channel"}),
]


def _texts(name: str) -> list[str]:
    if name.startswith("lit:"):
        return [t for t in (LIT / name[4:]).read_text().split("// -----") if "func.func" in t]
    return [(support.TESTDATA / name).read_text()]


@pytest.mark.parametrize("name, options", MODULES, ids=[m[0].split("/")[-1] for m in MODULES])
def test_patterns_are_pure_until_apply_and_apply_only_creates(name, options, monkeypatch):
    applied = 0
    for text in _texts(name):
        context, module = support.parse(text)
        guard = Guard(module, monkeypatch)
        with context:
            bnfold.fold_module(module, bnfold.FoldOptions(**options))
        applied += guard.calls["apply"]
    assert applied, "nothing was applied: the guard checked nothing"


# --- addresses are reused at once: nothing keyed by them survives an erase -------------------

CONV = """
func.func @main(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %s = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %m = stablehlo.multiply %y, %sb : tensor<1x4x4x2xf32>
  %t = stablehlo.constant dense<[1.0, -1.0]> : tensor<2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %n = stablehlo.add %m, %tb : tensor<1x4x4x2xf32>
  return %n : tensor<1x4x4x2xf32>
}
"""


def test_nothing_moves_to_an_op_created_where_an_erased_op_was():
    """Fold (which records a fold, the ops it consumed and its producer's statistics),
    finish (which erases the old chain and producer), then create ops of the same kinds:
    MLIR gives them the freed addresses, and none may inherit what was recorded."""
    from bnfold.analysis import Analysis
    from bnfold.ledger import Ledger, Statistics
    from bnfold.overlay import input_nodes
    from bnfold.patterns.rewrite import bias_add
    from bnfold.quant.equalize import output_axis  # noqa: F401 - quant loads lazily

    context = bir.make_context()
    module = bir.parse(CONV, context)
    with context, ir.Location.unknown():
        rewriter = Rewriter()
        nodes = input_nodes(module, rewriter)
        ledger = Ledger(rewriter, None, nodes)
        ctx = driver.Context(module, bnfold.FoldOptions(), rewriter, Analysis(module, rewriter), ledger)
        body = module.body.operations[0].regions[0].blocks[0]
        old = {op.operation.name: op.operation for op in body.operations}
        old_multiply, old_conv = old["stablehlo.multiply"], old["stablehlo.convolution"]
        addresses = {op_id(old_multiply): "multiply", op_id(old_conv): "convolution"}
        driver.run(ctx)
        [fold] = ledger.report().folds
        new_conv = next(op.operation for op in body.operations
                        if op.operation.name == "stablehlo.convolution" and op.operation != old_conv)
        ledger.set_statistics(old_conv, Statistics(np.ones(2), np.ones(2), np.zeros(2)))
        assert ledger.is_folded(old_multiply) and ledger.folds_of(new_conv) == [fold]
        rewriter.finish(module)
        # The old producer and chain are gone; make newcomers of the same kinds.
        reused = []
        ret = list(body.operations)[-1]
        with ir.InsertionPoint(ret):
            value = new_conv.results[0]
            for _ in range(8):
                mul = bir.stablehlo.MulOp(value, value).operation
                if op_id(mul) in addresses:
                    reused.append(mul)
                copy = new_conv.clone(ip=ir.InsertionPoint(ret)).operation
                if op_id(copy) in addresses:
                    reused.append(copy)
                value = bias_add(value, np.zeros(2), 3, ir.Location.unknown())
        assert reused, "MLIR reused no freed address: the hazard this test guards is gone"
        for op in reused:
            assert not ledger.is_folded(op) and not ledger.is_decided(op), op.name
            assert ledger.statistics(op) is None and ledger.folds_of(op) == [], op.name
            assert rewriter.handle(op) not in nodes, op.name
        assert fold.nodes, "the fold's input nodes were recorded before anything changed"
