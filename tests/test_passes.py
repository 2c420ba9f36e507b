"""bnfold as MLIR passes: --pass-pipeline and Python PassManagers (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import numpy as np
import pytest

import bnfold
import numerics
import support
from bnfold import ir as bir
from bnfold import options, passes
from test_quantize import stack_module

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
    # MLIR's own message is on its second line (the first is empty): it said only "; ...".
    ("builtin.module(bnfold-fold,canonicalize{max-iterations=x})",
     "error: failed to add `canonicalize` with options `max-iterations=x` (column 28)"),
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
    # An MLIR pass's options are skipped as a group, quotes and all (a mutation survivor).
    ("builtin.module(canonicalize{region-simplify=\"x),bnfold-fold)", "unterminated '\"'", 45),
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


def test_an_empty_quoted_value_is_empty():
    """`disable=""` disables nothing (a mutation survivor: a two-character value was kept
    with its quotes, naming a pattern '""')."""
    for pipeline in ('bnfold-fold{disable=""}', "bnfold-fold{disable=''}"):
        text, report = _fold(f"builtin.module({pipeline})")
        assert "stablehlo.batch_norm_inference" not in text and len(report.folds) == 1, pipeline


def test_a_bare_flag_is_true_and_a_quoted_comma_does_not_split():
    _, report = _fold("builtin.module(bnfold-fold{equalize absorb-high-bias})")
    assert report.equalize
    lines = _error("builtin.module(bnfold-fold{disable='forward-affine,x'})")
    assert "unknown pattern name(s) forward-affine,x" in lines[-3], lines


# --- issue 31 item 7: flags beside --pass-pipeline, what passes hand each other ---------------


def _flag_argv(f) -> list[str]:
    meta = f.metadata["bnfold"]
    if meta.kind is options.Kind.FLAG:
        return [meta.flag]
    if meta.kind is options.Kind.NAMES:
        return [meta.flag, "forward-affine" if f.name == "disable" else "main"]
    return [meta.flag, "int8" if "int8" in meta.choices else meta.choices[-1]]


SCHEMA_FLAGS = [f for f in fields(bnfold.FoldOptions) if f.metadata["bnfold"].flag is not None]


@pytest.mark.parametrize("field", SCHEMA_FLAGS, ids=[f.name for f in SCHEMA_FLAGS])
def test_a_fold_flag_beside_a_pipeline_is_an_error_that_says_how_to_write_it(field, tmp_path):
    """Every schema flag beside --pass-pipeline exited 0 and did nothing (a float model
    shipped as 'int8')."""
    src, out = tmp_path / "m.mlir", tmp_path / "out.mlir"
    src.write_text(BN)
    argv = _flag_argv(field)
    proc = run(src, "-o", out, "--pass-pipeline", "builtin.module(bnfold-fold,cse)", *argv)
    assert proc.returncode == 1 and not out.exists(), proc.stderr
    option = field.metadata["bnfold"].pass_option
    written = "true" if len(argv) == 1 else argv[1]
    assert proc.stderr.startswith(f"bnfold-opt: {argv[0]}: error: "), proc.stderr
    assert f"'bnfold-fold{{{option}={written}}}'" in proc.stderr, proc.stderr


def test_the_spelling_the_error_suggests_quantizes(tmp_path):
    src, out = tmp_path / "m.mlir", tmp_path / "out.mlir"
    src.write_text(BN)
    proc = run(src, "-o", out, "--pass-pipeline", "builtin.module(bnfold-fold)",
               "--quantize-weights", "int4")
    suggested = proc.stderr.split("'")[-2]
    assert suggested == "bnfold-fold{quantize-weights=int4}", proc.stderr
    proc = run(src, "-o", out, "--pass-pipeline", f"builtin.module({suggested})")
    assert proc.returncode == 0 and "tensor<3x3x3x5xi4>" in out.read_text(), proc.stderr


def test_quant_encodings_from_a_pipeline_that_quantizes(tmp_path):
    src, out, enc = tmp_path / "m.mlir", tmp_path / "out.mlir", tmp_path / "enc.json"
    src.write_text(BN)
    proc = run(src, "-o", out, "--quant-encodings", enc, "--pass-pipeline",
               "builtin.module(bnfold-fold,bnfold-quantize-weights{quantize-weights=int4})")
    assert proc.returncode == 0, proc.stderr
    (encodings,) = json.loads(enc.read_text())["param_encodings"].values()
    assert encodings[0]["bitwidth"] == 4
    proc = run(src, "-o", tmp_path / "o2.mlir", "--quant-encodings", tmp_path / "e2.json",
               "--pass-pipeline", "builtin.module(bnfold-fold)")
    assert proc.returncode == 1 and "--quant-encodings needs" in proc.stderr, proc.stderr


@pytest.mark.parametrize("pipeline, bits", [
    ("bnfold-fold,bnfold-quantize-weights{quantize-weights=int4}", 4),
    ("bnfold-quantize-weights{quantize-weights=int4}", 4),
    ("bnfold-fold,bnfold-quantize-weights", 8),
    ("bnfold-fold,bnfold-quantize-weights{quantize-weights=int8}", 8),
])
def test_the_quantize_pass_computes_with_the_levels_its_option_asks_for(pipeline, bits):
    """The weights the output computes with (read back on XLA) lie on 2^(b-1) - 1 levels
    each side of zero: int4 given, int4 levels used (an int8 grid is not 7 levels)."""
    text = stack_module(2)
    folded = bnfold.fold_source(text, pass_pipeline=f"builtin.module({pipeline})")
    found = numerics.kernel_module(folded.serialize().decode())
    assert found is not None
    kernels = numerics.run_xla(found[0], [])
    assert len(kernels) == 2
    levels = 2 ** (bits - 1) - 1
    for kernel in kernels:
        steps = kernel.astype(np.float64) / np.max(np.abs(kernel)) * levels
        np.testing.assert_allclose(steps, np.rint(steps), atol=1e-4, rtol=0)


@pytest.mark.parametrize("two, one", [
    ("bnfold-fold,Q{bias-correction=true}", "Q{bias-correction=true}"),
    ("bnfold-fold,cse,Q{bias-correction=true}", "Q{bias-correction=true},cse"),
    ("bnfold-equalize,Q{bias-correction=true}", "Q{equalize bias-correction=true}"),
])
def test_bias_correction_after_a_separate_fold_pass_corrects_what_one_run_does(two, one):
    """`bnfold-fold,bnfold-quantize-weights{bias-correction=true}` corrected 0 layers where
    one run corrects 2: the folded batch norms' statistics did not reach the second pass."""
    text = stack_module(3)
    results = [bnfold.fold_source(text, pass_pipeline="builtin.module(" + pipeline.replace(
        "Q", "bnfold-quantize-weights") + ")") for pipeline in (one, two)]
    corrected = [[bool(q.bias_correction["applied"]) for q in r.report.quantized]
                 for r in results]
    assert corrected == [[False, True, True]] * 2, results[1].report.table()
    single, split = (r.serialize().decode() for r in results)
    assert split == single
    assert "bnfold." not in split  # nothing bnfold-internal is left
    inputs = support.inputs_for(text)
    numerics.check_close(numerics.run_xla(split, inputs), numerics.run_xla(single, inputs))
