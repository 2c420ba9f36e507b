"""Every module in testdata/: folds exactly as the manifest says, and numerics hold on XLA CPU."""

from __future__ import annotations

import pytest

import numerics
import support

CASES = support.manifest(support.TESTDATA)
FOLDABLE = [c for c in CASES if c["foldable"]]
NOT_FOLDABLE = [c for c in CASES if not c["foldable"]]


def test_manifest_lists_every_file():
    listed = {c["file"] for c in CASES}
    on_disk = {p.name for p in support.TESTDATA.glob("*.mlir")}
    assert listed == on_disk
    assert len(FOLDABLE) >= 30 and len(NOT_FOLDABLE) >= 5


@pytest.mark.parametrize("case", FOLDABLE, ids=lambda c: c["file"])
def test_foldable_module_folds_and_matches_on_xla(case):
    text = (support.TESTDATA / case["file"]).read_text()
    folded, report = support.fold(text)
    assert len(report.folds) == case.get("num_folds", 1), report.to_json()
    assert "stablehlo.batch_norm_inference" not in support.op_names(folded)
    assert not report.skipped, report.to_json()
    for fold in report.folds:
        assert fold.producer and fold.norm and fold.direction == "backward"
        assert fold.form == "batch_norm_inference"
    error = support.compare_xla(text, folded, support.inputs_for(text))
    assert error <= numerics.tolerance(support.signature(text).element_types[0])


@pytest.mark.parametrize("case", NOT_FOLDABLE, ids=lambda c: c["file"])
def test_must_not_fold_module_is_unchanged_with_reason(case):
    text = (support.TESTDATA / case["file"]).read_text()
    folded, report = support.fold(text)
    context, original = support.parse(text)
    with context:
        assert folded == str(original)
    assert not report.folds
    reasons = [s for s in report.skipped if s.op_name == "stablehlo.batch_norm_inference"]
    assert reasons and all(s.reason for s in reasons), report.to_json()


def test_folding_twice_changes_nothing():
    for case in FOLDABLE:
        text = (support.TESTDATA / case["file"]).read_text()
        once, _ = support.fold(text)
        twice, report = support.fold(once)
        assert twice == once, case["file"]
        assert not report.folds


def test_canonical_output_form():
    """producer(x, K.new) then add(_, broadcast_in_dim(1-D constant, dims = [feature]))."""
    text = (support.TESTDATA / "conv2d_bias_bn.mlir").read_text()
    folded, _ = support.fold(text)
    names = [n for n in support.op_names(folded) if n.startswith("stablehlo.")]
    assert names == ["stablehlo.constant", "stablehlo.convolution", "stablehlo.constant",
                     "stablehlo.broadcast_in_dim", "stablehlo.add"]
    assert "dims = [3]" in folded and "tensor<5xf32>" in folded


def test_shared_kernel_keeps_original_for_the_other_convolution():
    text = (support.TESTDATA / "conv2d_shared_kernel_bn.mlir").read_text()
    folded, report = support.fold(text)
    assert len(report.folds) == 1
    # Two kernels now: the original (still used by the un-normalized conv) and the folded one.
    assert support.op_names(folded).count("stablehlo.convolution") == 2
    assert folded.count(": tensor<3x3x") >= 2
    support.compare_xla(text, folded, support.inputs_for(text))
