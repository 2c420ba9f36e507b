"""Real-framework exports (testdata/models/, made by tools/export_testdata.py).

For every model: every BatchNorm layer folds, nothing of the normalization is
left, XLA CPU numerics hold, and the report names both ends of every fold.
"""

from __future__ import annotations

import pytest

import numerics
import support

MODELS = support.manifest(support.MODELS)
PRODUCERS = ("stablehlo.convolution", "stablehlo.dot_general")
SCALING = ("stablehlo.multiply", "stablehlo.subtract", "stablehlo.divide")


def _leftovers(text: str) -> list[str]:
    """Normalization work still present after folding, described."""
    context, module = support.parse(text)
    from bnfold.constants import Evaluator
    problems: list[str] = []
    with context:
        evaluator = Evaluator(module)
        producers = []

        def visit(op):
            if op.name in ("stablehlo.batch_norm_inference", "stablehlo.rsqrt", "stablehlo.sqrt"):
                problems.append(f"{op.name} remains")
            if op.name in PRODUCERS:
                producers.append(op)
            return support.bir.ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for producer in producers:
            value, adds = producer.results[0], 0
            while True:
                uses = list(value.uses)
                if len(uses) != 1:
                    break
                user = uses[0].owner
                if user.name == "stablehlo.reshape":
                    value = user.results[0]
                    continue
                others = [v for v in user.operands if v != value]
                if user.name not in SCALING + ("stablehlo.add",) or len(others) != 1 or \
                        evaluator.constant(others[0]) is None:
                    break
                if user.name in SCALING:
                    problems.append(f"{user.name} by a constant after {producer.name}")
                adds += user.name == "stablehlo.add"
                value = user.results[0]
            if adds > 1:
                problems.append(f"{adds} constant adds after one {producer.name}")
    return problems


def test_models_are_present():
    frameworks = {m["framework"] for m in MODELS}
    assert {"flax_linen", "flax_nnx", "haiku", "equinox", "keras"} <= frameworks, frameworks


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m["file"])
def test_every_batchnorm_folds(model):
    text = (support.MODELS / model["file"]).read_text()
    folded, report = support.fold(text)
    unfoldable = model.get("unfoldable", 0)
    # Pre-activation batch norms (DenseNet) cannot fold: each has a reason.
    assert len(report.skipped) == unfoldable, report.to_json()["skipped"]
    assert all(s.reason for s in report.skipped)
    # Every other BN folds; other per-channel scales may fold too (a mean-pool's divide
    # folds forward into the classifier), so count BN folds by their absence below.
    assert len(report.folds) >= model["batchnorm_layers"] - unfoldable, report.to_json()["skipped"]
    if unfoldable:
        assert report.folds, report.to_json()
    else:
        assert _leftovers(folded) == []
    for fold in report.folds:
        assert fold.producer and fold.norm and fold.producer_op in PRODUCERS
    if model["form"] == "export-symbolic":
        for batch in (1, 3):  # any batch size, after refinement
            shape = [batch] + model["input_shape"][1:]
            original, refined = support.refined(text, shape), support.refined(folded, shape)
            inputs = support.inputs_for(original)
            numerics.check_close(numerics.run_xla(refined, inputs),
                                 numerics.run_xla(original, inputs), "f32")
        return
    inputs = support.inputs_for(text)
    expected = numerics.run_xla(text, inputs)
    # Deep models amplify float32 rounding; the manifest records each model's measured
    # sensitivity (rtol) next to each dtype's default.
    dtype = model.get("dtype", "f32")
    numerics.check_close(numerics.run_xla(folded, inputs), expected, dtype,
                         rtol=max(model.get("rtol", 1e-5), numerics.tolerance(dtype)))


NORMALIZED_INPUTS = [m for m in MODELS if m.get("input_normalization")]


def test_models_with_input_normalization_are_present():
    frameworks = {m["framework"] for m in NORMALIZED_INPUTS}
    assert {"keras", "torchax"} <= frameworks, frameworks


@pytest.mark.parametrize("model", NORMALIZED_INPUTS, ids=lambda m: m["file"])
def test_input_normalization_folds_exactly_into_the_stem(model):
    """torchvision's (x - mean) / std and Keras Rescaling / Normalization before a
    zero-padded stem convolution: the whole normalization folds forward (the shift
    through the padding as an exact border correction), and the output matches."""
    text = (support.MODELS / model["file"]).read_text()
    folded, report = support.fold(text)
    assert not report.skipped, report.to_json()["skipped"]
    stem = [f for f in report.folds if f.direction == "forward" and f.note and "border" in f.note]
    assert len(stem) == 1, report.to_json()
    assert stem[0].producer_op == "stablehlo.convolution"
    assert not any("stays" in (f.note or "") for f in report.folds), report.to_json()
    body = folded[folded.index("func.func public @main"):]
    prologue = body[:body.index("stablehlo.convolution(")]
    # Only constants and layout ops are left between the image and the stem convolution.
    for name in ("multiply", "subtract", "divide", "add", "pad"):
        assert f"stablehlo.{name} " not in prologue, prologue
    inputs = support.inputs_for(text)
    expected = numerics.run_xla(text, inputs)
    # The fold is exact up to float32 rounding: only the default f32 tolerance.
    numerics.check_close(numerics.run_xla(folded, inputs), expected, "f32",
                         rtol=max(model.get("rtol", 1e-5), numerics.tolerance("f32")))

