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
    ("builtin.module(bnfold-fold{colour=blue})", "has no option colour"),
    ("builtin.module(bnfold-fold,(cse)", "unbalanced"),
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
