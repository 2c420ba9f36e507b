"""The report's formats, judged on what a reader gets: the text table (every header, the
numbering, the notes, warnings and each pattern's section), the JSON keys, the one-line
summary and the statistics saved with --report-params. The report is built by hand here,
so every line below is the documented format (docs/report.md), not what a run happened to
print."""

from __future__ import annotations

import numpy as np
import pytest

from bnfold.quant.equalize import Equalized, EqualizedSets
from bnfold.report import Fold, Part, Report, Skip, parameter_path

STATS = dict(mean=[0.0, 0.0], variance=[1.0, 1.0], gamma=[2.0, 2.0], beta=[0.0, 0.0],
             epsilon=1e-5)  # running statistics never updated, gamma trained


def _report() -> Report:
    folds = [
        Fold("fold0", "m.mlir:3:8", "stablehlo.convolution", "m.mlir:5:8",
             "stablehlo.batch_norm_inference", "batch_norm_inference", "backward", 2, [], "main",
             params={k: np.asarray(v, np.float64) for k, v in STATS.items()},
             kernel_rounding=5.9e-8, note="the shift stayed: a border correction"),
        Fold("fold1", "m.mlir:9:8", "stablehlo.dot_general", "m.mlir:7:8", "stablehlo.multiply",
             "decomposed", "forward", 4, ["stablehlo.multiply"], "main", kind="affine"),
    ]
    skipped = [Skip("m.mlir:11:8", "stablehlo.batch_norm_inference", "the mean is %arg1",
                    "main", code="parameter-argument"),
               Skip("m.mlir:12:8", "stablehlo.batch_norm_inference", "the kernel is %arg2",
                    "main", code="kernel-argument")]
    equalized = Equalized("eq0", ["m.mlir:3:8", "m.mlir:9:8"], ["stablehlo.convolution"] * 2,
                          ["add"], "main", "pair", 3, 0, [4.0, 2.0], [1.5, 1.25],
                          params={"scale0": np.asarray([0.5, 2.0])})
    refused = Skip("m.mlir:20:8", "stablehlo.convolution", "an op with no law", "main",
                   code="no-law", layers=["m.mlir:20:8", "m.mlir:22:8", "m.mlir:24:8"])
    part = Part("equalize", EqualizedSets(), [equalized], [refused], ran=True)
    return Report(folds, skipped, [part])


TABLE = """\
fold   direction  producer    norm        channels  rounding  kind
fold0  backward   m.mlir:3:8  m.mlir:5:8  2         5.9e-08   normalization
fold1  forward    m.mlir:9:8  m.mlir:7:8  4         0.0e+00   affine

fold   what stayed of it, and why
fold0  the shift stayed: a border correction

warning  code                  message
fold0    untrained-statistics  the batch norm's statistics are their initial values (running \
mean 0 and variance 1 in every channel: never updated from data); they do not describe the \
activations, so --equalize, --absorb-high-bias and --bias-correction, which rely on them, can \
make a quantized model worse: export after training or calibration

skipped  op           op name                         code                reason
1        m.mlir:11:8  stablehlo.batch_norm_inference  parameter-argument  the mean is %arg1
2        m.mlir:12:8  stablehlo.batch_norm_inference  kernel-argument     the kernel is %arg2

set  kind  layers                    range ratio before -> after
eq0  pair  m.mlir:3:8 -> m.mlir:9:8  4->1.5, 2->1.25

not equalized  layers                                     op name                code    reason
1              m.mlir:20:8 -> m.mlir:22:8 -> m.mlir:24:8  stablehlo.convolution  no-law  an op \
with no law

note: equalization ranges, high-bias absorption and bias correction take the activations' mean \
and spread from the folded batch norms' statistics: statistics that do not describe the data \
(never trained or calibrated) can make the quantized model worse than without them

folded 1 normalization(s) (1 backward batch_norm_inference) (+1 other affine: 1 multiply \
folded forward), skipped 2, equalized 1 set(s) (1 pair), 2 pair(s) not equalized; 1 batch \
norm(s) with untrained statistics, which these results rely on (see the report's warnings)
"""


def test_the_text_table_is_the_documented_one():
    assert _report().table() == TABLE


def test_the_json_report_names_every_part():
    data = _report().to_json()
    assert [f["id"] for f in data["folds"]] == ["fold0", "fold1"]
    assert data["folds"][0]["note"] == "the shift stayed: a border correction"
    assert "note" not in data["folds"][1]
    assert [s["code"] for s in data["skipped"]] == ["parameter-argument", "kernel-argument"]
    [warning] = data["warnings"]
    assert (warning["code"], warning["fold"], warning["norm"]) == \
        ("untrained-statistics", "fold0", "m.mlir:5:8")
    assert data["equalized"][0]["id"] == "eq0"
    assert data["not_equalized"][0]["layers"] == ["m.mlir:20:8", "m.mlir:22:8", "m.mlir:24:8"]
    assert data["statistics_note"].startswith("equalization ranges")


@pytest.mark.parametrize("codes, what", [
    (["parameter-argument"], "every normalization's parameters are function arguments"),
    (["kernel-argument"], "every normalized producer's kernel is a function argument"),
    (["parameter-argument", "kernel-argument"],
     "the normalizations' parameters or their producers' kernels are function arguments"),
    (["parameter-argument", "users"], None),
])
def test_nothing_folded_for_arguments_says_how_to_bind(codes, what):
    report = Report([], [Skip(f"m.mlir:{i}:1", "stablehlo.batch_norm_inference", "r", "main",
                              code=c) for i, c in enumerate(codes)])
    summary = report.summary()
    if what is None:
        assert summary == f"folded 0 normalization(s), skipped {len(codes)}"
    else:
        assert summary == f"folded 0 normalization(s), skipped {len(codes)}; {what}: bind them " \
            "with --bind-params FILE.npz (or bnfold.jax_export.fold_exported)"


def test_an_unknown_attribute_is_named():
    with pytest.raises(AttributeError, match="'Report' object has no attribute 'nope'"):
        _ = _report().nope


def test_report_params_saves_each_fold_and_record_statistics(tmp_path):
    path = tmp_path / "p.npz"
    _report().save_params(str(path))
    with np.load(path) as saved:
        assert sorted(saved.files) == ["eq0/scale0", "fold0/beta", "fold0/epsilon",
                                       "fold0/gamma", "fold0/mean", "fold0/variance"]
        np.testing.assert_array_equal(saved["fold0/gamma"], [2.0, 2.0])
        np.testing.assert_array_equal(saved["eq0/scale0"], [0.5, 2.0])


def test_report_params_names_its_flag_when_it_cannot_write(tmp_path, capsys):
    from bnfold.errors import BnfoldError

    with pytest.raises(BnfoldError, match="--report-params"):
        _report().save_params(str(tmp_path / "no such dir" / "p.npz"))


@pytest.mark.parametrize("name, path", [
    ("params['Conv_0']['kernel']", "params/Conv_0/kernel"),
    ("[0].weight", "0/weight"),
    ("['a'][1]", "a/1"),
    ("not a path!", "not a path!"),
])
def test_parameter_paths_as_aimet_and_flax_write_them(name, path):
    assert parameter_path(name) == path
