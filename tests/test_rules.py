"""The core's rules, enforced on real modules with every registered pattern running, by the
driver's own checking mode (`bnfold.driver.CHECKING`, on in the whole suite: tests/conftest.py):

* `roots` (every step of its iteration), `match`, `plan` and `record` leave the IR exactly
  as they found it;
* `apply` only creates ops and goes through the rewriter: every op that existed before
  keeps its attributes and the *identity* of its operands, except operands that a
  `Rewriter.replace_op` redirected; nothing is erased while patterns run (erasure waits
  for `Rewriter.finish`); the rewriter's handles all name ops still in the module;
* every registered pattern is exercised here (its roots reach `match`, and `apply`);
* a change planted in any pattern's phase makes the checking mode fail, naming both;
* `finish` changes the IR only through the rewriter, and `apply` builds only the op names
  its pattern's `builds` declares (`Context.ops` keeps one walk of the module while no op
  of a name asked for was created, and the checking mode compares it with a fresh one);
* a pattern's `may_inline` (inline-calls' filter on a helper) holds wherever its
  `wants_inline` does;
* no state keyed by an op's address survives an erase: MLIR hands a freed address to
  the next op it creates, and that newcomer must not inherit a report entry, an overlay
  node or a statistic.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

import bnfold
import support
from bnfold import driver, patterns, schema
from bnfold import ir as bir
from bnfold.ir import ir, op_id
from bnfold.rewriter import Rewriter

ROOT = Path(__file__).resolve().parent.parent
LIT = ROOT / "lit_tests"

PHASES = ("roots", "match", "plan", "apply")


@pytest.fixture(autouse=True)
def every_phase(monkeypatch):
    """The rule tests check every phase of every root, on large modules too."""
    monkeypatch.setattr(driver, "CHECK_UP_TO", None)

# A forward fold's new bias, a reshape, then an existing bias: merge-bias merges the two.
MERGE_BIAS = """
func.func @main(%x: tensor<2x4xf32>) -> tensor<2x1x2xf32> {
  %s = stablehlo.constant dense<[2.0, 0.5, 1.5, 3.0]> : tensor<4xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
  %t = stablehlo.constant dense<[1.0, -1.0, 0.5, 0.25]> : tensor<4xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
  %m = stablehlo.multiply %x, %sb : tensor<2x4xf32>
  %a = stablehlo.add %m, %tb : tensor<2x4xf32>
  %w = stablehlo.constant dense<[[0.5, -0.25], [1.0, 0.75], [0.5, -1.0], [0.25, 2.0]]> : tensor<4x2xf32>
  %y = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
  %r = stablehlo.reshape %y : (tensor<2x2xf32>) -> tensor<2x1x2xf32>
  %c = stablehlo.constant dense<[0.1, 0.2]> : tensor<2xf32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [2] : (tensor<2xf32>) -> tensor<2x1x2xf32>
  %o = stablehlo.add %r, %cb : tensor<2x1x2xf32>
  return %o : tensor<2x1x2xf32>
}
"""
TEXTS = {"merge-bias": MERGE_BIAS}

# Modules that exercise every registered pattern (test_every_registered_pattern_is_exercised):
# add one that reaches yours.
MODULES = [
    ("text:merge-bias", {}),
    ("lit:backward-affine.mlir", {}),
    ("lit:forward-affine.mlir", {}),
    ("lit:deployment-forms.mlir", {}),
    ("lit:controls.mlir", {"expand_batch_norm": True}),
    ("lit:equalize.mlir", {"equalize": True}),
    ("lit:absorb-high-bias.mlir", {"equalize": True, "absorb_high_bias": True}),
    ("lit:quantize-weights.mlir", {"quantize_weights": "int4", "bias_correction": True,
                                   "quantize_granularity": "per-channel"}),
    ("models/keras_mobilenetv2_nhwc.mlir", {"equalize": True, "absorb_high_bias": True}),
    ("models/deployment_flax_resnet18_multiplatform_nhwc.mlir", {}),
    ("models/deployment_jax_jit_conv_helper_nhwc.mlir", {"equalize": True}),
    ("models/torchax_normalized_stem_nchw.mlir", {}),
    ("models/keras_efficientnet_stem_nhwc.mlir", {"expand_batch_norm": True}),
    ("lit:fold-scale.mlir", {}),
    ("lit:forward-norm.mlir", {}),
    ("models/haiku_resnet_nhwc.mlir", {"equalize": True, "quantize_weights": "int8",
                                       "bias_correction": True}),
]


def texts(name: str) -> list[str]:
    if name.startswith("text:"):
        return [TEXTS[name[5:]]]
    if name.startswith("lit:"):
        return [t for t in (LIT / name[4:]).read_text().split("// -----") if "func.func" in t]
    return [(support.TESTDATA / name).read_text()]


def options_of(options: dict, registry: tuple[patterns.Entry, ...] | None = None):
    """`options` as the options class of `registry` (its patterns' options included)."""
    return (bnfold.FoldOptions if registry is None else schema.build(registry))(**options)


def fold(text: str, options: dict, registry: tuple[patterns.Entry, ...] | None = None
         ) -> bnfold.Report:
    context, module = support.parse(text)
    with context:
        return bnfold.fold_module(module, options_of(options, registry), registry=registry)


Counts = dict[str, dict[str, int]]  # pattern -> phase -> calls


def exercise(text: str, options: dict, registry: tuple[patterns.Entry, ...] | None = None
             ) -> Counts:
    """Folds `text` in checking mode; what each pattern went through."""
    assert driver.CHECKING, "tests/conftest.py turns the driver's checking mode on"
    before = {name: dict(c) for name, c in driver.EXERCISED.items()}
    fold(text, options, registry)
    return {name: {phase: n - before.get(name, {}).get(phase, 0) for phase, n in c.items()}
            for name, c in driver.EXERCISED.items()}


@cache
def survey() -> dict[tuple[str, int], Counts]:
    """Every text of MODULES folded once in checking mode: (module, case) -> counts."""
    return {(name, i): exercise(text, options)
            for name, options in MODULES for i, text in enumerate(texts(name))}


@pytest.mark.parametrize("name, options", MODULES, ids=[m[0].split("/")[-1] for m in MODULES])
def test_patterns_keep_the_rules(name, options):
    """The driver raises RuleViolation when a pattern breaks a rule; here every module
    folds without one, and something was applied (the checks saw real rewrites)."""
    applied = sum(counts.get("apply", 0) for (module, _), found in survey().items()
                  if module == name for counts in found.values())
    assert applied, "nothing was applied: the checking mode checked no rewrite"


@pytest.mark.parametrize("entry", patterns.REGISTRY, ids=lambda e: e.name)
def test_every_registered_pattern_is_exercised(entry):
    """Each registered pattern has roots that reach match, and applies somewhere in MODULES:
    a new pattern needs a module here that exercises it."""
    found = [c.get(entry.name, {}) for c in survey().values()]
    assert any(c.get("match", 0) for c in found), f"{entry.name}: no root reached match"
    assert any(c.get("apply", 0) for c in found), f"{entry.name}: nothing applied"


def _smallest(pattern: str, phase: str) -> tuple[str, dict]:
    """The smallest text of MODULES in which `pattern` reaches `phase`."""
    options = dict(MODULES)
    found = [(len(texts(name)[i]), name, i) for (name, i), c in survey().items()
             if c.get(pattern, {}).get(phase, 0)]
    assert found, f"{pattern} never reaches {phase} in MODULES"
    _, name, i = min(found)
    return texts(name)[i], options[name]


def _plant(module: ir.Module) -> None:
    """A change anywhere in the module (a discardable attribute on its first function)."""
    func = module.body.operations[0].operation
    count = len(func.attributes)
    func.attributes[f"bnfold.planted{count}"] = ir.UnitAttr.get()


def _planted(pattern, phase: str, module: ir.Module):
    """`pattern`'s method of `phase`, changing `module` first (roots: at its first step;
    apply: after it, the attributes of an op that existed before)."""
    original = getattr(type(pattern), phase)

    if phase == "roots":
        def roots(self, ctx):
            found = iter(original(self, ctx))
            _plant(ctx.module)
            yield from found
        return roots
    if phase == "apply":
        def apply(self, rewriter, plan):
            applied = original(self, rewriter, plan)
            _plant(module)
            return applied
        return apply

    def method(self, ctx, subject):
        _plant(ctx.module)
        return original(self, ctx, subject)
    return method


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("entry", patterns.REGISTRY, ids=lambda e: e.name)
def test_a_change_planted_in_any_phase_fails_the_checks(entry, phase, monkeypatch):
    """An IR change inside roots (at a step of its iteration), match, plan or apply (an
    existing op's attributes) fails the checking mode, which names the pattern and phase."""
    text, options = _smallest(entry.name, phase)
    planted_change_fails(entry, phase, text, options, monkeypatch)


def planted_change_fails(entry: patterns.Entry, phase: str, text: str, options: dict,
                         monkeypatch: pytest.MonkeyPatch,
                         registry: tuple[patterns.Entry, ...] | None = None) -> None:
    """Folding `text` with a change planted in `entry`'s `phase` raises RuleViolation."""
    pattern = entry.load()
    context, module = support.parse(text)
    monkeypatch.setattr(type(pattern), phase, _planted(pattern, phase, module))
    with context, pytest.raises(driver.RuleViolation) as raised:
        bnfold.fold_module(module, options_of(options, registry), registry=registry)
    monkeypatch.undo()
    assert f"pattern {entry.name} broke the rules in {phase}" in str(raised.value)


HELPER_CONV = """
func.func @main(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %y = call @conv(%x) : (tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32>
  %s = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %m = stablehlo.multiply %y, %sb : tensor<1x4x4x2xf32>
  return %m : tensor<1x4x4x2xf32>
}
func.func private @conv(%a: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %0 = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  return %0 : tensor<1x4x4x2xf32>
}
"""


def _entry(name: str) -> patterns.Entry:
    return next(e for e in patterns.REGISTRY if e.name == name)


def test_a_helper_inlined_for_a_fold_folds():
    """The control for the two tests below: the jitted conv helper is inlined and folded."""
    report = fold(HELPER_CONV, {})
    assert len(report.folds) == 1 and report.to_json()["inlined"] == ["conv"]


def test_a_filter_that_hides_a_wanted_call_fails_the_checks(monkeypatch):
    """backward-affine wants `@conv` inlined; a `may_inline` saying no call of it could be
    wanted (which would lose the fold silently) fails the checking mode."""
    pattern = _entry("backward-affine").load()
    monkeypatch.setattr(type(pattern), "may_inline", lambda self, ctx, callee: False)
    with pytest.raises(AssertionError, match="may_inline.*@conv.*is False"):
        fold(HELPER_CONV, {})


def test_a_change_in_finish_outside_the_rewriter_fails_the_checks(monkeypatch):
    """An op created in `finish` without the rewriter would be missing from the walk
    `Context.ops` keeps for the next pattern: the checking mode finds the stale walk."""
    pattern = _entry("drop-identity").load()

    def finish(self, ctx):
        main = ctx.module.body.operations[0]
        with ir.InsertionPoint.at_block_begin(main.regions[0].blocks[0]), ir.Location.unknown():
            bir.stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.zeros(2, np.float32)))
    monkeypatch.setattr(type(pattern), "finish", finish)
    with pytest.raises(driver.RuleViolation, match="stale walk"):
        fold(HELPER_CONV, {})


def test_an_apply_that_builds_an_op_its_builds_does_not_name_fails_the_checks(monkeypatch):
    """backward-affine declares what its apply builds (`Pattern.builds`), so later patterns
    reuse the kept walk; leaving the bias add out of it would hide the add from them."""
    pattern = _entry("backward-affine").load()
    monkeypatch.setattr(type(pattern), "builds", pattern.builds - {"stablehlo.add"})
    with pytest.raises(driver.RuleViolation, match="built stablehlo.add, which its `builds`"):
        fold(CONV, {})


def _context(text: str) -> tuple[ir.Context, driver.Context]:
    from bnfold.analysis import Analysis
    from bnfold.ledger import Ledger

    context, module = support.parse(text)
    rewriter = Rewriter()
    return context, driver.Context(module, bnfold.FoldOptions(), rewriter,
                                   Analysis(module, rewriter), Ledger(rewriter, None, None))


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts `Context.ops`' walks of the module (not the checking mode's own)."""
    counted: list[int] = []
    walk = driver.Context._walk
    monkeypatch.setattr(driver, "CHECKING", False)
    monkeypatch.setattr(driver.Context, "_walk", lambda self: counted.append(1) or walk(self))
    return counted


def test_the_kept_walk_serves_names_no_apply_created(monkeypatch):
    """After an apply that built an add (declared), a request for multiplies is served by
    the kept walk and one for adds walks again and finds the new add."""
    walks = _walks(monkeypatch)
    context, ctx = _context(CONV)
    with context, ir.Location.unknown():
        (multiply,) = ctx.ops({"stablehlo.multiply"})
        (add,) = ctx.ops({"stablehlo.add"})
        with ir.InsertionPoint(add):
            new = bir.stablehlo.AddOp(add.operands[0], add.operands[1]).operation
        ctx.changed(frozenset({"stablehlo.add"}))
        assert ctx.ops({"stablehlo.multiply"}) == [multiply] and len(walks) == 1
        assert ctx.ops({"stablehlo.add"}) == [new, add] and len(walks) == 2
        ctx.changed(None)  # an apply that declares nothing
        ctx.ops({"stablehlo.multiply"})
        assert len(walks) == 3


def test_one_walk_serves_fold_scale_after_the_folds(monkeypatch):
    """fold-scale's multiplies come from the walk inline-calls made before backward-affine
    folded (it built only declared ops); with `builds` unknown it walks again."""
    walks = _walks(monkeypatch)
    report = fold(CONV, {})
    assert len(report.folds) == 1 and len(walks) == 1
    pattern = _entry("backward-affine").load()
    monkeypatch.setattr(type(pattern), "builds", None)
    fold(CONV, {})
    assert len(walks) == 3


def test_an_undeclared_op_in_the_kept_walk_fails_the_checks():
    """An op built without being declared is missing from the kept walk: the checking mode
    names it, whatever the request asks for."""
    context, ctx = _context(CONV)
    with context, ir.Location.unknown():
        (add,) = ctx.ops({"stablehlo.add"})
        with ir.InsertionPoint(add):
            bir.stablehlo.MulOp(add.operands[0], add.operands[1])
        ctx.changed(frozenset({"stablehlo.add"}))
        with pytest.raises(driver.RuleViolation, match=r"stablehlo.multiply; Context.ops kept"):
            ctx.ops({"stablehlo.convolution"})


def test_the_checks_are_off_for_users():
    """Users do not pay for the checks: bnfold turns them on only when asked."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "BNFOLD_CHECK_RULES"}
    out = subprocess.run([sys.executable, "-c", "from bnfold import driver; print(driver.CHECKING)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
