"""Tests of bnfold-opt, the command-line tool (python/bnfold/cli.py).

Most tests call `bnfold.cli.main([...])` in-process (fast); a few run
`python -m bnfold` as a subprocess where the real exit status, stdin, a closed
stdout or the absence of a Python traceback is what is being tested.

Every test gets its own temporary directory for `tempfile` (and `TMPDIR` for
subprocesses), so an internal error's reproducer (`bnfold-repro-*`) never
lands in the real /tmp and tests can assert that none was saved.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import bnfold
from bnfold import elements
from bnfold import ir as bir
from bnfold.cli import main

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"
CONV_BN = TESTDATA / "conv2d_nhwc_bn.mlir"  # folds one batch_norm_inference
DENSE_BN = TESTDATA / "dense_bn.mlir"  # folds one batch_norm_inference
NOFOLD_STATS = TESTDATA / "nofold_stats_args.mlir"  # mean/variance are arguments
PARAMS_ARGS = TESTDATA / "nofold_all_bn_params_args.mlir"  # %arg1..%arg4 are the BN params
BN = "stablehlo.batch_norm_inference"
BYTECODE_MAGIC = b"ML\xefR"

EMPTY_FUNC = "func.func @f() {\n  return\n}\n"
# `stablehlo.add` with mismatched operand shapes; the op is on line 2.
VERIFIER_ERROR = (
    "func.func @f(%a: tensor<2xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {\n"
    "  %0 = stablehlo.add %a, %b : (tensor<2xf32>, tensor<3xf32>) -> tensor<2xf32>\n"
    "  return %0 : tensor<2xf32>\n"
    "}\n"
)
# An op of a dialect nobody registers, on line 2.
UNKNOWN_DIALECT = 'func.func @f() {\n  "nodialect.op"() : () -> ()\n  return\n}\n'


# --- fixtures and helpers (all prefixed cli_ / local to this file) ------------


@pytest.fixture(autouse=True)
def cli_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private `tempfile` directory for this test, also exported as TMPDIR."""
    directory = tmp_path / "systmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    monkeypatch.setenv("TMPDIR", str(directory))
    return directory


@dataclass
class CliResult:
    rc: int
    out: bytes
    err: str


@pytest.fixture
def cli(capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch):
    """Runs `bnfold.cli.main(args)` in-process; returns exit code, stdout bytes, stderr text."""

    def run(*args: object, stdin: bytes | None = None) -> CliResult:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        capsysbinary.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse: --help, usage errors
            rc = 0 if e.code is None else e.code
        out, err = capsysbinary.readouterr()
        return CliResult(rc, out, err.decode("utf-8", errors="replace"))

    return run


def cli_subprocess(*args: object, stdin: bytes | None = None, **kwargs) -> CliResult:
    """Runs `python -m bnfold args` (environment, including TMPDIR, inherited)."""
    proc = subprocess.run([sys.executable, "-m", "bnfold", *map(str, args)], input=stdin,
                          capture_output=True, timeout=120, **kwargs)
    return CliResult(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", errors="replace"))


def parse(data: bytes | str):
    """Parses (and verifies) text, bytecode or a portable artifact with bnfold's own reader."""
    return bir.parse(data, bir.make_context())


def function_ops(module) -> list:
    return [op for op in module.body.operations if op.operation.name == "func.func"]


def find_ops(module, name: str) -> list:
    """Every op called `name`; the caller must keep `module` alive while using them."""
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def reproducers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("bnfold-repro-"))


# --- folding text to stdout ----------------------------------------------------


def test_fold_to_stdout_prints_a_module_without_batch_norm(cli):
    result = cli(CONV_BN)
    assert result.rc == 0
    module = parse(result.out)
    assert find_ops(module, BN) == []
    assert len(find_ops(module, "stablehlo.convolution")) == 1


def test_summary_line_names_file_and_fold_count(cli):
    result = cli(CONV_BN)
    assert result.rc == 0
    lines = result.err.splitlines()
    assert len(lines) == 1
    assert str(CONV_BN) in lines[0]
    assert "folded 1" in lines[0]


def test_quiet_suppresses_the_summary(cli):
    result = cli("-q", CONV_BN)
    assert result.rc == 0
    assert result.err == ""
    assert BN.encode() not in result.out and b"stablehlo.convolution" in result.out


@pytest.mark.parametrize("args", [["-"], []], ids=["dash", "no-argument"])
def test_stdin_is_read_for_dash_and_for_no_argument(args):
    result = cli_subprocess(*args, stdin=CONV_BN.read_bytes())
    assert result.rc == 0, result.err
    assert find_ops(parse(result.out), BN) == []
    assert "<stdin>" in result.err and "folded 1" in result.err


def test_stdin_to_output_file(cli, tmp_path):
    out = tmp_path / "folded.mlir"
    result = cli("-", "-o", out, stdin=CONV_BN.read_bytes())
    assert result.rc == 0
    assert result.out == b""
    assert find_ops(parse(out.read_bytes()), BN) == []


def test_output_file_is_written_and_stdout_stays_empty(cli, tmp_path):
    out = tmp_path / "folded.mlir"
    result = cli(CONV_BN, "-o", out)
    assert result.rc == 0
    assert result.out == b""
    module = parse(out.read_bytes())
    assert find_ops(module, BN) == []
    assert len(find_ops(module, "stablehlo.convolution")) == 1


def test_output_file_respects_umask(cli, tmp_path):
    out = tmp_path / "folded.mlir"
    old = os.umask(0o022)
    try:
        assert cli(CONV_BN, "-o", out).rc == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_unwritable_output_is_an_error(cli, tmp_path):
    result = cli(CONV_BN, "-o", tmp_path / "no-such-dir" / "out.mlir")
    assert result.rc == 1
    assert "error: cannot write" in result.err
    assert result.out == b""


# --- output formats --------------------------------------------------------------


def test_emit_bytecode_has_magic_and_parses_back_to_the_text_output(cli, tmp_path):
    out = tmp_path / "folded.mlirbc"
    assert cli(CONV_BN, "--emit", "bytecode", "-o", out).rc == 0
    data = out.read_bytes()
    assert data.startswith(BYTECODE_MAGIC)
    assert bir.detect_format(data) == "bytecode"
    text = cli("-q", CONV_BN).out.decode()
    assert str(parse(data)) == str(parse(text))


def test_emit_portable_round_trips_through_bnfold(cli, tmp_path):
    artifact = tmp_path / "folded.bin"
    assert cli(CONV_BN, "--emit", "portable", "-o", artifact).rc == 0
    assert bir.detect_format(artifact.read_bytes()) == "portable"
    again = cli(artifact)  # format auto-detected
    assert again.rc == 0, again.err
    assert "folded 0" in again.err
    module = parse(again.out)
    assert find_ops(module, BN) == []
    assert len(find_ops(module, "stablehlo.convolution")) == 1


def test_emit_portable_deserializes_with_stablehlo(cli, tmp_path):
    from jaxlib.mlir.dialects import stablehlo

    artifact = tmp_path / "folded.bin"
    assert cli(CONV_BN, "--emit", "portable", "-o", artifact).rc == 0
    module = stablehlo.deserialize_portable_artifact(bir.make_context(), artifact.read_bytes())
    assert module.operation.verify()
    assert find_ops(module, BN) == []
    assert len(find_ops(module, "stablehlo.convolution")) == 1


def test_target_version_selects_the_portable_version(cli, tmp_path):
    artifact = tmp_path / "folded.bin"
    assert cli(CONV_BN, "--emit", "portable", "--target-version", "1.0.0", "-o", artifact).rc == 0
    assert artifact.read_bytes().startswith(BYTECODE_MAGIC + b"\x0dStableHLO_v1.0.0")


def test_target_version_without_emit_portable_is_an_error(cli, tmp_path):
    out = tmp_path / "out.mlir"
    result = cli(CONV_BN, "--target-version", "1.0.0", "-o", out)
    assert result.rc == 1
    assert "error" in result.err and "--target-version" in result.err
    assert not out.exists()


@pytest.mark.parametrize("version", ["99.0.0", "banana"])
def test_invalid_target_version_is_a_clean_error(version, cli_tmpdir, tmp_path):
    out = tmp_path / "out.bin"
    result = cli_subprocess(CONV_BN, "--emit", "portable", "--target-version", version, "-o", out)
    assert result.rc == 1
    assert "error" in result.err and version in result.err
    assert "internal error" not in result.err
    assert reproducers(cli_tmpdir) == []
    assert not out.exists()


# --- reports ---------------------------------------------------------------------


def test_report_json_describes_the_fold(cli, tmp_path):
    report = tmp_path / "report.json"
    assert cli(CONV_BN, "--report", report).rc == 0
    data = json.loads(report.read_text())
    assert data["skipped"] == []
    assert len(data["folds"]) == 1
    fold = data["folds"][0]
    assert fold["producer"].startswith(f"{CONV_BN}:6:")  # the convolution is on line 6
    assert fold["producer_op"] == "stablehlo.convolution"
    assert fold["norm"].startswith(f"{CONV_BN}:11:")  # the batch_norm_inference on line 11
    assert fold["norm_op"] == BN
    assert fold["form"] == "batch_norm_inference"
    assert fold["direction"] == "backward"
    assert fold["channels"] == 4


def test_report_json_lists_the_skipped_batch_norm_with_a_reason(cli, tmp_path):
    report = tmp_path / "report.json"
    result = cli(NOFOLD_STATS, "--report", report)
    assert result.rc == 0
    assert BN.encode() in result.out
    data = json.loads(report.read_text())
    assert data["folds"] == []
    assert len(data["skipped"]) == 1
    skip = data["skipped"][0]
    assert skip["op_name"] == BN
    assert skip["op"].startswith(f"{NOFOLD_STATS}:9:")  # the batch_norm_inference on line 9
    assert skip["reason"].strip() != ""


def test_report_params_has_one_array_per_statistic(cli, tmp_path):
    params = tmp_path / "params.npz"
    assert cli(CONV_BN, "--report-params", params).rc == 0
    with np.load(params) as npz:
        assert sorted(npz.files) == sorted(
            f"fold0/{k}" for k in ("scale", "shift", "gamma", "beta", "mean", "variance",
                                   "epsilon"))


def test_report_params_match_the_input_constants(cli, tmp_path):
    params = tmp_path / "params.npz"
    assert cli(CONV_BN, "--report-params", params).rc == 0
    module = parse(CONV_BN.read_bytes())  # keep alive: the ops below point into it
    (bn,) = find_ops(module, BN)
    operands = {}
    for name, operand in zip(("gamma", "beta", "mean", "variance"), list(bn.operands)[1:]):
        constant = operand.owner
        assert constant.name == "stablehlo.constant"
        operands[name] = np.array(elements.read_native(constant.attributes["value"]))
    epsilon = bir.ir.FloatAttr(bn.attributes["epsilon"]).value
    with np.load(params) as npz:
        saved = {k.split("/", 1)[1]: npz[k] for k in npz.files}
    for name, expected in operands.items():
        np.testing.assert_array_equal(saved[name], expected.astype(np.float64), err_msg=name)
    assert float(saved["epsilon"]) == epsilon
    expected_scale = saved["gamma"] / np.sqrt(saved["variance"] + saved["epsilon"])
    assert saved["scale"].dtype == np.float64
    np.testing.assert_allclose(saved["scale"], expected_scale, rtol=1e-12, atol=0)


def test_report_params_recover_decomposed_statistics(cli, tmp_path):
    """Recovering gamma..epsilon is skipped unless --report-params asks for them."""
    params = tmp_path / "params.npz"
    model = TESTDATA / "models" / "flax_linen_conv_bn_nhwc.mlir"  # a decomposed chain
    assert cli(model, "--report-params", params).rc == 0
    with np.load(params) as npz:
        keys = {k.split("/", 1)[1] for k in npz.files}
    assert {"scale", "shift", "gamma", "beta", "mean", "variance", "epsilon"} <= keys


def test_statistics_option_controls_recovery():
    text = (TESTDATA / "models" / "flax_linen_conv_bn_nhwc.mlir").read_text()
    with_stats = bnfold.fold_text(text)[1].folds
    without = bnfold.fold_text(text, options=bnfold.FoldOptions(statistics=False))[1].folds
    assert len(with_stats) == len(without) > 0
    for full, bare in zip(with_stats, without, strict=True):
        assert {"gamma", "beta", "mean", "variance", "epsilon"} <= full.params.keys()
        assert set(bare.params) == {"scale", "shift"}
        for key in ("scale", "shift"):
            np.testing.assert_array_equal(full.params[key], bare.params[key])


def test_report_params_number_folds_across_split_chunks(cli, tmp_path):
    source = tmp_path / "two.mlir"
    source.write_text(CONV_BN.read_text() + "// -----\n" + DENSE_BN.read_text())
    params = tmp_path / "params.npz"
    assert cli(source, "--split-input-file", "--report-params", params).rc == 0
    with np.load(params) as npz:
        ids = {k.split("/", 1)[0] for k in npz.files}
        assert ids == {"fold0", "fold1"}
        assert npz["fold0/scale"].shape == (4,)  # the conv's 4 channels come first


# --- --split-input-file ------------------------------------------------------------


def test_split_input_file_folds_every_module(cli, tmp_path):
    source = tmp_path / "two.mlir"
    source.write_text(CONV_BN.read_text() + "// -----\n" + DENSE_BN.read_text())
    result = cli(source, "--split-input-file")
    assert result.rc == 0
    assert "folded 2" in result.err
    text = result.out.decode()
    assert re.search(r"^// -----$", text, re.MULTILINE)
    chunks = re.split(r"^// -----$", text, flags=re.MULTILINE)
    assert len(chunks) == 2
    names = []
    for chunk in chunks:
        module = parse(chunk)
        assert find_ops(module, BN) == []
        names.append(bir.ir.StringAttr(module.operation.attributes["sym_name"]).value)
    assert names == ["conv2d_nhwc_bn", "dense_bn"]


def test_split_input_file_needs_text_output(cli, tmp_path):
    out = tmp_path / "out.mlirbc"
    result = cli(CONV_BN, "--split-input-file", "--emit", "bytecode", "-o", out)
    assert result.rc == 1
    assert "error" in result.err and "--split-input-file" in result.err
    assert not out.exists()


def test_split_input_file_error_reports_the_original_line(cli, tmp_path):
    source = tmp_path / "split.mlir"
    # Line 7 (in the second chunk) has an op after the terminator with no type.
    source.write_text(EMPTY_FUNC + "// -----\n"
                      "func.func @g() {\n"     # 5
                      "  return\n"             # 6
                      '  %x = "bad.op"()\n'    # 7
                      "}\n")
    out = tmp_path / "out.mlir"
    result = cli(source, "--split-input-file", "-o", out)
    assert result.rc == 1
    assert f"{source}:7:" in result.err
    assert "error" in result.err
    assert result.out == b""
    assert not out.exists()


# --- bad input -------------------------------------------------------------------------


def _bad_missing(tmp_path: Path, cli) -> tuple[Path, str]:
    path = tmp_path / "does-not-exist.mlir"
    return path, re.escape(str(path))


def _bad_garbage(tmp_path: Path, cli) -> tuple[Path, str]:
    path = tmp_path / "garbage.bin"
    path.write_bytes(bytes(range(256)) * 8)
    return path, re.escape(str(path))


def _bad_non_utf8(tmp_path: Path, cli) -> tuple[Path, str]:
    path = tmp_path / "latin.mlir"
    path.write_bytes(b"\xff\xfe\x80" * 100)
    return path, re.escape(str(path))


def _bad_truncated_bytecode(tmp_path: Path, cli) -> tuple[Path, str]:
    full = tmp_path / "full.mlirbc"
    assert cli(CONV_BN, "-q", "--emit", "bytecode", "-o", full).rc == 0
    data = full.read_bytes()
    path = tmp_path / "truncated.mlirbc"
    path.write_bytes(data[: len(data) // 2])
    return path, re.escape(str(path))


def _bad_unknown_dialect(tmp_path: Path, cli) -> tuple[Path, str]:
    path = tmp_path / "unknown.mlir"
    path.write_text(UNKNOWN_DIALECT)
    return path, re.escape(str(path)) + r":2:\d+: error:"


def _bad_verifier(tmp_path: Path, cli) -> tuple[Path, str]:
    path = tmp_path / "verifier.mlir"
    path.write_text(VERIFIER_ERROR)
    return path, re.escape(str(path)) + r":2:\d+: error:.*stablehlo\.add"


BAD_INPUTS = {
    "missing-file": _bad_missing,
    "binary-garbage": _bad_garbage,
    "non-utf8-text": _bad_non_utf8,
    "truncated-bytecode": _bad_truncated_bytecode,
    "unknown-dialect": _bad_unknown_dialect,
    "verifier-error": _bad_verifier,
}


@pytest.mark.parametrize("preexisting", [False, True], ids=["new-out", "existing-out"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_clean_error_and_writes_nothing(case, preexisting, cli, cli_tmpdir,
                                                       tmp_path):
    source, expected = BAD_INPUTS[case](tmp_path, cli)
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    out = outdir / "out.mlir"
    if preexisting:
        out.write_bytes(b"old content\n")
    result = cli_subprocess(source, "-o", out, "--report", outdir / "report.json")
    assert result.rc == 1
    assert "error" in result.err
    assert "Traceback" not in result.err
    assert "internal error" not in result.err
    assert re.search(expected, result.err), result.err
    assert result.out == b""
    if preexisting:
        assert out.read_bytes() == b"old content\n"
        assert sorted(p.name for p in outdir.iterdir()) == ["out.mlir"]
    else:
        assert list(outdir.iterdir()) == []  # no output, no report, no .bnfold-* temp file
    assert reproducers(cli_tmpdir) == []


def test_failed_fold_leaves_no_temporary_files(cli, tmp_path):
    source = tmp_path / "verifier.mlir"
    source.write_text(VERIFIER_ERROR)
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    assert cli(source, "-o", outdir / "out.mlir", "--emit", "bytecode").rc == 1
    assert [p.name for p in outdir.iterdir() if p.name.startswith(".bnfold-")] == []
    assert list(outdir.iterdir()) == []


def test_successful_write_leaves_only_the_output(cli, tmp_path):
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    assert cli(CONV_BN, "-o", outdir / "out.mlir", "--report", outdir / "r.json",
               "--report-params", outdir / "p.npz").rc == 0
    assert sorted(p.name for p in outdir.iterdir()) == ["out.mlir", "p.npz", "r.json"]


def test_module_without_stablehlo_is_unchanged(cli, tmp_path):
    source = tmp_path / "plain.mlir"
    source.write_text(EMPTY_FUNC)
    result = cli(source)
    assert result.rc == 0
    assert "folded 0" in result.err
    assert str(parse(result.out)) == str(parse(EMPTY_FUNC))


@pytest.mark.parametrize("flag", ["--report", "--report-params"])
def test_unwritable_report_is_a_clean_error(flag, cli, cli_tmpdir, tmp_path):
    result = cli(CONV_BN, flag, tmp_path / "no-such-dir" / "report")
    assert result.rc == 1
    assert "error: cannot write" in result.err
    assert "internal error" not in result.err
    assert reproducers(cli_tmpdir) == []


@pytest.mark.parametrize("flag", ["--report", "--report-params"])
def test_unwritable_report_writes_no_output(flag, cli, tmp_path):
    out = tmp_path / "out.mlir"
    result = cli(CONV_BN, "-o", out, flag, tmp_path / "no-such-dir" / "report")
    assert result.rc == 1
    assert not out.exists()


def test_closed_stdout_is_not_an_internal_error(cli_tmpdir):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "bnfold", str(CONV_BN)], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert "internal error" not in err
    assert reproducers(cli_tmpdir) == []


# --- options ------------------------------------------------------------------------------


def test_disable_backward_affine_keeps_the_batch_norm(cli):
    result = cli(CONV_BN, "--disable", "backward-affine")
    assert result.rc == 0
    assert len(find_ops(parse(result.out), BN)) == 1
    assert "folded 0" in result.err


def test_disable_unknown_name_lists_the_known_names(cli, tmp_path):
    out = tmp_path / "out.mlir"
    result = cli(CONV_BN, "--disable", "nonsense", "-o", out)
    assert result.rc == 1
    assert "error" in result.err and "nonsense" in result.err
    for name in bnfold.pattern_names():
        assert name in result.err
    assert not out.exists()


def test_skip_func_main_keeps_the_batch_norm(cli):
    result = cli(CONV_BN, "--skip-func", "main")
    assert result.rc == 0
    assert len(find_ops(parse(result.out), BN)) == 1


def test_skip_func_of_a_function_the_module_lacks_is_an_error(cli):
    """It folded everything and exited 0 (issue 31: a misspelt name kept nothing)."""
    result = cli(CONV_BN, "--skip-func", "other")
    assert result.rc == 1 and result.out == b""
    assert "--skip-func: error: the module has no function @other; its functions: @main" \
        in result.err


def test_expand_batch_norm_removes_every_batch_norm(cli):
    assert len(find_ops(parse(cli(NOFOLD_STATS).out), BN)) == 1  # does not fold by itself
    result = cli(NOFOLD_STATS, "--expand-batch-norm")
    assert result.rc == 0
    module = parse(result.out)
    assert find_ops(module, BN) == []
    assert find_ops(module, "stablehlo.multiply") != []


def test_equalize_alone_leaves_the_biases_where_they_are(cli, tmp_path):
    """High-bias absorption is its own opt-in: --equalize alone moves no bias into layer 2
    (one add in the output: layer 1's bias), --absorb-high-bias does (a second add)."""
    from test_equalize import HIGH_BIAS  # noqa: PLC0415 - one module of the equalize tests

    source, report = tmp_path / "high_bias.mlir", tmp_path / "report.json"
    source.write_text(HIGH_BIAS)
    for flags, adds in ((["--equalize"], 1), (["--equalize", "--absorb-high-bias"], 2)):
        result = cli(source, "--report", report, *flags)
        assert result.rc == 0, result.err
        module = parse(result.out)
        assert len(find_ops(module, "stablehlo.add")) == adds, (flags, result.out.decode())
        [equalized] = json.loads(report.read_text())["equalized"]
        absorbed = [h["absorbed"] for h in equalized.get("high_bias", [])]
        assert absorbed == ([True] if adds == 2 else []), (flags, equalized)


def test_help_mentions_every_option_and_pattern(cli):
    result = cli("--help")
    assert result.rc == 0
    text = result.out.decode()
    for option in ("--emit", "--target-version", "--report", "--report-params", "--bind-params",
                   "--bind-func", "--disable", "--skip-func", "--expand-batch-norm",
                   "--split-input-file", "-o", "-q"):
        assert re.search(rf"(^|[\s,\[]){re.escape(option)}\b", text), option
    for name in bnfold.pattern_names():
        assert name in text


def test_help_wraps_at_the_terminal_width(cli, monkeypatch):
    for columns in (60, 120):
        monkeypatch.setenv("COLUMNS", str(columns))
        text = cli("--help").out.decode()
        # the options (the description and epilog are preformatted)
        lines = text[text.index("options:"):text.index("patterns (")].splitlines()
        assert max(map(len, lines)) <= columns
        assert max(map(len, lines)) > columns - 25  # filled, not wrapped at a fixed width


def test_help_examples_use_known_pattern_names(cli):
    text = cli("--help").out.decode()
    examples = text[text.index("examples:"):]
    used = re.findall(r"--disable[ =]([\w,-]+)", examples)
    assert used
    for names in used:
        for name in names.split(","):
            assert name in bnfold.pattern_names(), name


# --- internal errors ----------------------------------------------------------------------


def _crash(*args, **kwargs):
    raise RuntimeError("injected failure")


def test_internal_error_saves_a_reproducer_and_writes_nothing(cli, cli_tmpdir, tmp_path,
                                                              monkeypatch):
    monkeypatch.setattr("bnfold.pipeline.fold_module", _crash)
    out = tmp_path / "out.mlir"
    result = cli(CONV_BN, "-o", out)
    assert result.rc == 1
    assert "internal error" in result.err and str(CONV_BN) in result.err
    assert not out.exists()
    (repro,) = reproducers(cli_tmpdir)
    assert (cli_tmpdir / repro / "input").read_bytes() == CONV_BN.read_bytes()
    assert "injected failure" in (cli_tmpdir / repro / "traceback.txt").read_text()


def test_internal_error_reproducer_command_uses_the_given_arguments(cli, cli_tmpdir,
                                                                    monkeypatch):
    monkeypatch.setattr("bnfold.pipeline.fold_module", _crash)
    monkeypatch.setattr(sys, "argv", ["pytest", "--unrelated-flag"])
    result = cli(CONV_BN, "--disable", "backward-affine")
    assert result.rc == 1
    (repro,) = reproducers(cli_tmpdir)
    command = next(line for line in result.err.splitlines() if f"{repro}/input" in line)
    assert "--disable backward-affine" in command
    assert "--unrelated-flag" not in command


# --- --bind-params ------------------------------------------------------------------------


def _bn_params(channels: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "arg1": rng.standard_normal(channels).astype(np.float32),  # scale
        "arg2": rng.standard_normal(channels).astype(np.float32),  # offset
        "arg3": rng.standard_normal(channels).astype(np.float32),  # mean
        "arg4": rng.uniform(0.5, 2.0, channels).astype(np.float32),  # variance
    }


def test_bind_params_folds_the_bound_batch_norm_and_drops_the_arguments(cli, tmp_path):
    before = parse(PARAMS_ARGS.read_bytes())
    assert len(function_ops(before)[0].regions[0].blocks[0].arguments) == 5
    unbound = cli(PARAMS_ARGS)
    assert unbound.rc == 0 and "folded 0" in unbound.err  # nothing is constant without binding
    params = tmp_path / "params.npz"
    np.savez(params, **_bn_params())
    result = cli(PARAMS_ARGS, "--bind-params", params)
    assert result.rc == 0, result.err
    assert "folded 1" in result.err
    module = parse(result.out)
    assert find_ops(module, BN) == []
    (func,) = function_ops(module)
    assert len(func.regions[0].blocks[0].arguments) == 1
    assert len(bir.ir.FunctionType(bir.ir.TypeAttr(func.attributes["function_type"]).value)
               .inputs) == 1


def test_bind_params_unknown_key_is_an_error(cli, tmp_path):
    params = tmp_path / "params.npz"
    np.savez(params, arg9=np.ones(4, np.float32))
    out = tmp_path / "out.mlir"
    result = cli(PARAMS_ARGS, "--bind-params", params, "-o", out)
    assert result.rc == 1
    assert "error" in result.err and "arg9" in result.err
    assert not out.exists()


def test_bind_params_wrong_shape_is_an_error(cli, tmp_path):
    params = tmp_path / "params.npz"
    values = _bn_params()
    values["arg3"] = np.zeros(5, np.float32)
    np.savez(params, **values)
    out = tmp_path / "out.mlir"
    result = cli(PARAMS_ARGS, "--bind-params", params, "-o", out)
    assert result.rc == 1
    assert "error" in result.err and "arg3" in result.err
    assert "arg1" not in result.err  # only the offending key is named
    assert not out.exists()


def test_bind_params_file_location_is_not_an_argument_name(cli, tmp_path):
    params = tmp_path / "params.npz"
    np.savez(params, **{"-": np.zeros((1, 3, 6, 6), np.float32)})  # %arg0's shape
    result = cli(PARAMS_ARGS, "--bind-params", params)
    assert result.rc == 1
    assert "'-'" in result.err


# --- idempotence ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", sorted(TESTDATA.glob("*.mlir")), ids=lambda p: p.stem)
def test_folding_the_folded_output_changes_nothing(source, cli, tmp_path):
    first = tmp_path / "first.mlir"
    assert cli("-q", source, "-o", first).rc == 0
    second = cli("-q", first)
    assert second.rc == 0
    assert second.out == first.read_bytes()


# --- what a new user tripped over (issue 26; each fails on 2e74257) -----------------------


def test_a_directory_as_input_is_one_line_like_split_input_file(cli_tmpdir, tmp_path):
    """No traceback from the crash handler reopening the path, no reproducer directory."""
    folder = tmp_path / "models"
    folder.mkdir()
    plain = cli_subprocess(folder)
    split = cli_subprocess(folder, "--split-input-file")
    for result in (plain, split):
        assert result.rc == 1
        assert result.err.splitlines() == [f"bnfold-opt: error: cannot read '{folder}': "
                                           "Is a directory"], result.err
    assert reproducers(cli_tmpdir) == []


def test_a_crash_on_stdin_saves_the_input_it_read(cli, cli_tmpdir, monkeypatch):
    monkeypatch.setattr("bnfold.pipeline.fold_module", _crash)
    result = cli("-", "--disable", "forward-affine", stdin=CONV_BN.read_bytes())
    assert result.rc == 1
    (repro,) = reproducers(cli_tmpdir)
    saved = cli_tmpdir / repro / "input"
    assert saved.read_bytes() == CONV_BN.read_bytes()
    command = next(line for line in result.err.splitlines() if line.startswith("  bnfold-opt"))
    assert command.split() == ["bnfold-opt", str(saved), "--disable", "forward-affine"]


@pytest.mark.parametrize("pipeline, expected", [
    ("builtin.module(no-such-pass)", r"'no-such-pass' does not refer to a registered pass.*"
                                     r"bnfold-equalize"),
    ("builtin.module(func.func(bnfold-fold))", r"bnfold's passes run on modules"),
    ("builtin.module(bnfold-fold{no-such-option=1})", r"bnfold-fold has no option 'no-such-option'"),
])
def test_pass_pipeline_errors_name_the_program(pipeline, expected, cli):
    result = cli(CONV_BN, "--pass-pipeline", pipeline)
    assert result.rc == 1 and result.out == b""
    assert result.err.startswith("bnfold-opt: --pass-pipeline: error: "), result.err
    assert re.search(expected, result.err), result.err


def test_help_lists_every_pass_with_its_options(cli):
    text = cli("--help").out.decode()
    passes = text[text.index("passes (for --pass-pipeline"):text.index("examples:")]
    for spec in bnfold.patterns.PASSES:
        assert re.search(rf"^  {re.escape(spec.name)} ", passes, re.MULTILINE), spec.name
        for option in spec.option_names():
            assert option in passes, (spec.name, option)
    assert "bnfold-equalize" in passes


def test_bind_params_that_are_not_an_npz_archive(cli, tmp_path):
    pickled = tmp_path / "params.npz"
    pickled.write_bytes(b"\x80\x04\x95not a zip archive")  # what np.load takes for a pickle
    text = tmp_path / "params.txt"
    text.write_text("arg1 = [1, 2, 3]\n")
    for path in (pickled, text):
        result = cli(PARAMS_ARGS, "--bind-params", path)
        assert result.rc == 1
        assert result.err.startswith(f"bnfold-opt: {path}: error: not an .npz archive"), result.err
        assert "pickle" not in result.err


def test_a_truncated_portable_artifact_names_its_file(cli, tmp_path):
    artifact = tmp_path / "model.bin"
    assert cli("-q", CONV_BN, "--emit", "portable", "-o", artifact).rc == 0
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(artifact.read_bytes()[:len(artifact.read_bytes()) // 2])
    result = cli_subprocess(truncated)
    assert result.rc == 1 and result.out == b""
    first = result.err.splitlines()[0]
    assert first.startswith(f"{truncated}: error: "), result.err
    assert 'loc("-"' not in result.err and "Traceback" not in result.err
    from_stdin = cli_subprocess("-", stdin=truncated.read_bytes())
    assert from_stdin.err.splitlines()[0].startswith("<stdin>: error: "), from_stdin.err


def test_the_summary_hint_says_which_argument_blocks_the_fold(cli):
    kernel = cli(TESTDATA / "nofold_kernel_arg.mlir").err
    assert "every normalized producer's kernel is a function argument" in kernel
    assert "parameters" not in kernel
    params = cli(NOFOLD_STATS).err
    assert "every normalization's parameters are function arguments" in params
    for err in (kernel, params):
        assert "--bind-params FILE.npz" in err


@pytest.mark.parametrize("argv, flags", [
    # Issue 31 item 10: every '-' was dropped ('-o - --equalize' printed as '-o --equalize').
    (["-", "-o", "-", "--equalize"], ["-o", "-", "--equalize"]),
    (["-o", "-", "-", "-q"], ["-o", "-", "-q"]),
    (["-o", "-", "--equalize"], ["-o", "-", "--equalize"]),  # stdin by default
    (["--output=-", "-", "--disable", "forward-affine"], ["--output=-", "--disable",
                                                          "forward-affine"]),
    (["--outp", "-", "-", "--skip-func", "my helper"],  # an abbreviation; quoted for a shell
     ["--outp", "-", "--skip-func", "my helper"]),
])
def test_a_crash_reproducer_keeps_every_argument_but_the_input(cli, cli_tmpdir, monkeypatch,
                                                               argv, flags):
    monkeypatch.setattr("bnfold.pipeline.fold_module", _crash)
    result = cli(*argv, stdin=CONV_BN.read_bytes())
    assert result.rc == 1
    (repro,) = reproducers(cli_tmpdir)
    command = next(line for line in result.err.splitlines() if line.startswith("  bnfold-opt"))
    assert shlex.split(command) == ["bnfold-opt", str(cli_tmpdir / repro / "input"), *flags]


def test_jax_dialects_parse_and_their_op_classes_load_only_when_used(tmp_path):
    """chlo, mhlo and sdy ops parse and print through (make_context registers the three
    dialects from their native modules), and a module without them does not import their
    generated op classes: bnfold builds none, and importing them cost ~30 ms of every
    process (issue 35). (MLIR's bindings import a dialect's classes when they first meet
    one of its ops.)"""
    with_ops = tmp_path / "jax_dialects.mlir"
    with_ops.write_text(
        'sdy.mesh @mesh = <["a"=2]>\n'
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %0 = chlo.tan %x : tensor<2xf32> -> tensor<2xf32>\n"
        "  %1 = mhlo.add %0, %0 : tensor<2xf32>\n"
        "  return %1 : tensor<2xf32>\n"
        "}\n")
    without = tmp_path / "plain.mlir"
    without.write_text(TESTDATA.joinpath("conv2d_nhwc_bn.mlir").read_text())

    def imported(src: Path) -> list[str]:
        code = ("import sys\nfrom bnfold.cli import main\n"
                f"status = main(['-q', {str(src)!r}, '-o', {str(src) + '.out'!r}])\n"
                "print(status, *sorted(m.rsplit('.', 1)[-1] for m in sys.modules "
                "if m.endswith(('_chlo_ops_gen', '_mhlo_ops_gen', '_sdy_ops_gen'))))\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        status, *names = done.stdout.split()
        assert status == "0", done.stdout + done.stderr
        return names

    assert imported(without) == []
    assert imported(with_ops)  # the bindings loaded what the module uses
    out = Path(str(with_ops) + ".out").read_text()
    assert "chlo.tan" in out and "mhlo.add" in out and "sdy.mesh @mesh" in out
