"""`bnfold-opt --check` and `bnfold.check.check`: the original and the output on XLA CPU.

The verdicts are judged on modules whose equivalence is known independently of the
check: a real fold (equivalent), a hand-altered output or a broken fold (not), and
the numbers the check reports are compared with the test harness's own XLA run
(tests/numerics.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

import bnfold
import numerics
import support
from bnfold.check import check
from bnfold.cli import main

CONV_BN = support.TESTDATA / "conv2d_nhwc_bn.mlir"


@pytest.fixture(autouse=True)
def check_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash's reproducer (bnfold-repro-*) lands in the test's directory, not /tmp."""
    import tempfile

    directory = tmp_path / "systmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))


def _altered(folded: str, delta: float = 0.25) -> str:
    """The folded module with its first float constant vector (the new bias) moved."""
    match = re.search(r"dense<\[(-?[0-9.]+(?:[eE][-+]?\d+)?),", folded)
    assert match, folded
    return folded[:match.start(1)] + repr(float(match.group(1)) + delta) + folded[match.end(1):]


def test_python_check_passes_a_fold_and_fails_an_altered_output():
    source = CONV_BN.read_text()
    folded, report = bnfold.fold_text(source)
    assert len(report.folds) == 1
    good = check(source, folded)
    assert good.passed and "check passed" in good.summary()
    # the check's number is the harness's own measure of the same run
    inputs = numerics.random_inputs(support.signature(source), 0)
    assert inputs[0].shape == (1, 8, 8, 3)
    assert good.outputs[0].element_type == "f32" and good.difference <= 1e-5
    assert good.outputs[0].original_error is not None  # f32 re-typed to f64 and run
    assert good.outputs[0].output_error <= 1.5 * good.outputs[0].original_error + 1.2e-7

    bad = check(source, _altered(folded))
    expected = numerics.run_xla(source, [bad_input := _first_input(source)])
    actual = numerics.run_xla(_altered(folded), [bad_input])
    assert numerics.relative_error(actual[0], expected[0]) > 1e-3  # really not equivalent
    assert not bad.passed and bad.difference > 1e-3
    assert "check failed" in bad.summary() and "output 0 (f32)" in bad.summary()
    assert check(source, _altered(folded), tolerance=1.0).passed  # the tolerance decides


def _first_input(text: str) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(support.signature(text).shapes[0]) \
        .astype(np.float32)


def test_cli_check_passes_a_real_fold(tmp_path: Path, capsys):
    out = tmp_path / "folded.mlir"
    assert main([str(CONV_BN), "-o", str(out), "--check"]) == 0
    err = capsys.readouterr().err
    assert "check passed: max relative difference" in err
    assert "error against float64: original" in err and out.exists()


def test_cli_check_fails_a_broken_fold_and_writes_nothing(tmp_path: Path, capsys, monkeypatch):
    """A fold that breaks numbers (monkeypatched: the pipeline returns a hand-altered
    output): exit 1, a message, no output file."""
    from bnfold import cli

    real = cli.fold_source
    broken = _altered(bnfold.fold_text(CONV_BN.read_text())[0])

    def wrong_fold(*args, **kwargs):
        folded = real(*args, **kwargs)
        return real(broken, name=kwargs.get("name", "<input>")) if folded else folded

    monkeypatch.setattr(cli, "fold_source", wrong_fold)
    out = tmp_path / "folded.mlir"
    assert main([str(CONV_BN), "-o", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert "check failed" in err and "not equivalent on XLA CPU" in err
    assert "no output written" in err and "Traceback" not in err
    assert not out.exists()
    # a looser tolerance passes it
    assert main([str(CONV_BN), "-o", str(out), "-q", "--check", "--check-tolerance", "1"]) == 0


def test_cli_check_with_integer_inputs(tmp_path: Path, capsys):
    """Token ids: an embedding lookup (integer input) then dense + batch norm."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(2, 6)).astype(np.float32)
    w = rng.normal(0, .3, (6, 5)).astype(np.float32)
    mean, var = rng.normal(size=5).astype(np.float32), rng.uniform(.5, 2, 5).astype(np.float32)

    def model(ids):
        h = jax.numpy.asarray(table)[ids] @ w
        return (h - mean) * jax.lax.rsqrt(var + 1e-5)

    text = jax.jit(model).lower(np.zeros((3, 4), np.int32)).as_text()
    source = tmp_path / "tokens.mlir"
    source.write_text(text)
    out = tmp_path / "folded.mlir"
    assert main([str(source), "-o", str(out), "--check"]) == 0
    err = capsys.readouterr().err
    assert "folded 1 normalization" in err and "check passed" in err
    result = check(text, out.read_text())
    assert result.passed and result.outputs[0].original_error is not None
    # the inputs really are token ids of the table (both rows used, not all zeros), and the
    # check's numbers are the harness's for those inputs
    [ids] = result.inputs
    assert ids.dtype == np.int32 and ids.shape == (3, 4) and set(np.unique(ids)) == {0, 1}
    expected = numerics.run_xla(text, [ids])
    numerics.check_close(expected, [np.asarray(model(ids))])
    assert result.difference == pytest.approx(
        numerics.relative_error(numerics.run_xla(out.read_text(), [ids])[0], expected[0]),
        abs=1e-12)


def test_cli_check_with_a_symbolic_batch(tmp_path: Path, capsys):
    rng = np.random.default_rng(4)
    k = rng.normal(0, .3, (3, 3, 3, 4)).astype(np.float32)
    mean, var = rng.normal(size=4).astype(np.float32), rng.uniform(.5, 2, 4).astype(np.float32)

    def model(x):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y - mean) * jax.lax.rsqrt(var + 1e-5)

    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(model))(jax.ShapeDtypeStruct((b, 6, 6, 3), np.float32))
    source = tmp_path / "poly.mlir"
    source.write_text(exported.mlir_module())
    out = tmp_path / "folded.mlir"
    assert main([str(source), "-o", str(out), "--check", "--check-dim", "b=3"]) == 0
    err = capsys.readouterr().err
    assert "check passed" in err and "symbolic dims b=3" in err
    assert main([str(source), "-o", str(out), "-q", "--check"]) == 0  # the default size
    assert "b=2" in capsys.readouterr().err
    broken = _altered(out.read_text())
    assert not check(exported.mlir_module(), broken, dims={"b": 3}).passed
    assert main([str(source), "-o", str(tmp_path / "x.mlir"), "--check", "--check-dim",
                 "batch=3"]) == 1
    err = capsys.readouterr().err
    assert "batch name(s) no symbolic dimension of @main (it has b)" in err
    assert main([str(source), "--check", "--check-dim", "b"]) == 1
    assert "NAME=SIZE" in capsys.readouterr().err
    assert main([str(source), "--check-dim", "b=3"]) == 1  # never a silent no-op
    assert "add --check" in capsys.readouterr().err
    assert main([str(source), "--check", "--check-tolerance", "-1"]) == 1
    assert "expected a positive relative tolerance" in capsys.readouterr().err


def test_check_says_when_there_is_no_float64_comparison():
    text = ("func.func @main(%a: tensor<4xf32>) -> tensor<4xi32> {\n"
            "  %0 = stablehlo.bitcast_convert %a : (tensor<4xf32>) -> tensor<4xi32>\n"
            "  return %0 : tensor<4xi32>\n}\n")
    result = check(text, text)
    assert result.passed and "bitcast_convert" in (result.float64 or "")
    assert "no float64 comparison" in result.summary()


def test_check_with_bound_parameters_feeds_them_to_the_original(tmp_path: Path, capsys):
    out = tmp_path / "folded.mlir"
    params = support.TESTDATA / "nofold_all_bn_params_args.mlir"
    sig = support.signature(params.read_text())
    rng = np.random.default_rng(0)
    values = {f"arg{i}": (np.abs(rng.normal(size=s)) + .5).astype(np.float32)
              for i, s in enumerate(sig.shapes) if i >= 1}
    np.savez(tmp_path / "p.npz", **values)
    assert main([str(params), "-o", str(out), "--check", "--bind-params",
                 str(tmp_path / "p.npz")]) == 0
    assert "check passed" in capsys.readouterr().err
    with pytest.raises(bnfold.BnfoldError, match="takes 1 argument"):
        check(params.read_text(), out.read_text())  # the bound values are needed


def test_cli_check_on_a_serialized_exported(tmp_path: Path, capsys):
    """The Exported's module against the rebuilt Exported's, bound parameters fed."""
    from test_jax_export import MODELS

    fn, params, x, _ = MODELS["conv_bn_nchw"]
    exported = jax.export.export(jax.jit(fn))(params, x)
    source = tmp_path / "exported.bin"
    source.write_bytes(exported.serialize())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    np.savez(tmp_path / "p.npz", **{f"params{jax.tree_util.keystr(p)}": np.asarray(v)
                                    for p, v in leaves})
    out = tmp_path / "folded.bin"
    assert main([str(source), "-o", str(out), "--check", "--bind-params",
                 str(tmp_path / "p.npz")]) == 0
    assert "check passed" in capsys.readouterr().err
    assert jax.export.deserialize(bytearray(out.read_bytes())).in_avals[0].shape == x.shape


def test_check_tolerance_follows_the_narrowest_type_the_original_computes_in():
    """An f32 output of a bf16 network is judged at bf16's tolerance: the fold rounds its
    kernel to bf16 (a bf16 module's output at f32's 1e-5 would fail every real fold)."""
    rng = np.random.default_rng(0)
    dt = jax.numpy.bfloat16
    k = rng.normal(0, .3, (3, 3, 3, 4)).astype(dt)
    mean, var = rng.normal(size=4).astype(dt), rng.uniform(.5, 2, 4).astype(dt)

    def model(x):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return ((y - mean) * jax.lax.rsqrt(var + 1e-3)).astype(np.float32)

    text = jax.jit(model).lower(jax.ShapeDtypeStruct((2, 6, 6, 3), dt)).as_text()
    folded, report = bnfold.fold_text(text)
    assert len(report.folds) == 1
    result = check(text, folded)
    [output] = result.outputs
    assert output.element_type == "f32" and output.precision == "bf16"
    assert output.tolerance == 6e-2 and result.passed, result.summary()
    assert "the original computes in bf16" in result.summary()
    assert output.difference > 1e-5  # f32's tolerance would have failed it
    assert not check(text, _altered(folded, 2.0)).passed
