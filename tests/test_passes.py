"""bnfold as MLIR passes: --pass-pipeline and Python PassManagers (issue 14)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import bnfold
import numerics
import support
from bnfold import ir as bir
from bnfold import passes

RESNET = support.MODELS / "flax_linen_resnet_nhwc.mlir"


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnfold", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_pipeline_mixes_bnfold_and_mlir_passes(tmp_path):
    out = tmp_path / "out.mlir"
    proc = run(RESNET, "-o", out, "--pass-pipeline",
               "builtin.module(bnfold-fold{disable=forward-affine},cse,symbol-dce,canonicalize)")
    assert proc.returncode == 0, proc.stderr
    assert "folded 8 normalization(s)" in proc.stderr  # forward disabled: the pool divide stays
    text = out.read_text()
    assert "rsqrt" not in text and "stablehlo.divide" in text
    original = RESNET.read_text()
    inputs = support.inputs_for(original)
    numerics.check_close(numerics.run_xla(text, inputs), numerics.run_xla(original, inputs))


def test_stablehlo_passes_are_available(tmp_path):
    out = tmp_path / "out.mlir"
    proc = run(RESNET, "-o", out, "--pass-pipeline",
               "builtin.module(bnfold-fold,stablehlo-legalize-to-vhlo)")
    assert proc.returncode == 0, proc.stderr
    assert "vhlo.convolution" in out.read_text()


@pytest.mark.parametrize("pipeline, message", [
    ("builtin.module(bnfold-fold,no-such-pass)", "bnfold's passes: bnfold-fold"),
    ("builtin.module(bnfold-fold{disable=nope})", "unknown pattern name(s) nope"),
    ("builtin.module(bnfold-fold{colour=blue})", "has no option 'colour'"),
    ("builtin.module(bnfold-fold,(cse)", "expected a pass name, found '('"),
])
def test_bad_pipelines_are_clear_errors(pipeline, message, tmp_path):
    out = tmp_path / "out.mlir"
    proc = run(RESNET, "-o", out, "--pass-pipeline", pipeline)
    assert proc.returncode == 1 and message in proc.stderr and "--pass-pipeline" in proc.stderr
    assert "internal error" not in proc.stderr and not out.exists()


def test_fold_in_a_python_pass_manager():
    context = bir.make_context()
    module = bir.parse(RESNET.read_text(), context)
    with context:
        pm = bir.passmanager.PassManager("builtin.module")
        fold = passes.add_fold(pm, bnfold.FoldOptions(disable={"forward-affine"}))
        pm.add("cse")
        pm.run(module.operation)
        assert len(fold.report.folds) == 8 and "rsqrt" not in str(module)


def test_split_pipeline_respects_nesting():
    assert passes.split_pipeline("builtin.module(a,b{x=1 y=2},func.func(c,d))") == \
        ["a", "b{x=1 y=2}", "func.func(c,d)"]


BN = (support.TESTDATA / "conv2d_bias_bn.mlir").read_text()


def _error(pipeline: str) -> list[str]:
    """The error lines of `pipeline` (it must fail cleanly, before reading the input)."""
    proc = run("/nonexistent.mlir", "--pass-pipeline", pipeline)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "cannot read" not in proc.stderr, proc.stderr
    return proc.stderr.splitlines()


@pytest.mark.parametrize("pipeline, message, column", [
    # Issue 31: these were internal errors, or named something the user never wrote.
    ("builtin.module(bnfold-fold{{}})", "expected an option name, found '{'", 28),
    ("builtin.module(bnfold-fold{quantize-weights=})",
     "expected a value after 'quantize-weights=', found '}'", 45),
    ("builtin.module(bnfold-fold{quantize-weights})",
     "it needs a value: quantize-weights=int8", 28),
    ("builtin.module(bnfold-fold{disable=forward-affine,nope})",
     "unknown pattern name(s) nope", 51),
    ("builtin.module(bnfold-fold{disable={x}})", "unknown pattern name(s) x;", 37),
    ("builtin.module(bnfold-fold{equalize = maybe})", "'maybe' is not true or false", 39),
    ("builtin.module(bnfold-fold{disable=\"forward-affine})", "unterminated '\"'", 36),
    ("builtin.module(bnfold-fold{equalize", "unterminated '{'", 27),
    ("builtin.module(bnfold-fold,cse", "expected ',' or ')' after 'cse'", 31),
    ("builtin.module(bnfold-fold,,cse)", "expected a pass name, found ','", 28),
    ("builtin.module(bnfold-fold{equalize equalize=false})", "'equalize' is given twice", 37),
    ("builtin.module(bnfold-fold{quantize-weights=int8,int4})", "takes one value", 45),
    ("builtin.module(func.func(bnfold-fold))", "bnfold's passes run on modules", 26),
])
def test_pipeline_syntax_errors_point_at_their_column(pipeline, message, column):
    lines = _error(pipeline)
    assert lines[-3].startswith("bnfold-opt: --pass-pipeline") and message in lines[-3], lines
    assert lines[-3].endswith(f"(column {column})"), lines
    assert lines[-2] == f"  {pipeline}" and lines[-1] == "  " + " " * (column - 1) + "^", lines


def _fold(pipeline: str) -> tuple[str, bnfold.Report]:
    folded = bnfold.fold_source(BN, pass_pipeline=pipeline)
    return folded.serialize().decode(), folded.report


@pytest.mark.parametrize("spelling", [
    "bnfold-fold{disable = backward-affine}", "bnfold-fold{disable= backward-affine}",
    "bnfold-fold{ disable =backward-affine }", "bnfold-fold{disable='backward-affine'}",
    'bnfold-fold{disable="backward-affine"}', "bnfold-fold{disable={backward-affine}}",
    'bnfold-fold{disable={"backward-affine",forward-affine}}',
    "bnfold-fold{disable=backward-affine disable=forward-affine}",
])
def test_mlir_option_spellings_mean_what_they_say(spelling):
    """Spaces around '=', quotes and braces (MLIR's pass-option grammar): the batch norm
    stays, as with `disable=backward-affine` (spaces said "has no option , ..."; quotes were
    kept and named no pattern)."""
    text, report = _fold(f"builtin.module({spelling},cse)")
    assert "stablehlo.batch_norm_inference" in text and not report.folds, text
    text, report = _fold("builtin.module(bnfold-fold,cse)")  # the control: it folds
    assert "stablehlo.batch_norm_inference" not in text and len(report.folds) == 1


def test_a_quoted_skip_func_keeps_the_function():
    """`skip-func="main"` kept the quotes, skipped nothing and folded what the user kept."""
    for pipeline in ('bnfold-fold{skip-func="main"}', "bnfold-fold{skip-func='main'}",
                     "bnfold-fold{skip-func = main}"):
        text, report = _fold(f"builtin.module({pipeline})")
        assert "stablehlo.batch_norm_inference" in text and not report.folds, pipeline


def test_a_bare_flag_is_true_and_a_quoted_comma_does_not_split():
    _, report = _fold("builtin.module(bnfold-fold{equalize absorb-high-bias})")
    assert report.equalize
    lines = _error("builtin.module(bnfold-fold{disable='forward-affine,x'})")
    assert "unknown pattern name(s) forward-affine,x" in lines[-3], lines
