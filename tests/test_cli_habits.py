"""mlir-opt habits of bnfold-opt (issue 14): print flags, unknown dialects, split files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import support

CONV_BN = support.TESTDATA / "conv2d_nhwc_bn.mlir"
MOBILENET = support.MODELS / "keras_mobilenetv2_nhwc.mlir"


def run(*args: object, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnfold", *map(str, args)], input=stdin,
                          capture_output=True, timeout=120)


def test_print_flags_follow_mlir_opt():
    plain = run("-q", CONV_BN).stdout.decode()
    debug = run("-q", CONV_BN, "--mlir-print-debuginfo").stdout.decode()
    alias = run("-q", CONV_BN, "--print-debuginfo").stdout.decode()
    assert "loc(" not in plain and "loc(" in debug and debug == alias
    generic = run("-q", CONV_BN, "--mlir-print-op-generic").stdout.decode()
    assert '"stablehlo.convolution"(' in generic
    elided = run("-q", CONV_BN, "--mlir-elide-elementsattrs-if-larger", "4").stdout.decode()
    assert "dense_resource<__elided__>" in elided and "__elided__" not in plain


def test_emit_bytecode_alias(tmp_path):
    a, b = tmp_path / "a.mlirbc", tmp_path / "b.mlirbc"
    assert run("-q", CONV_BN, "--emit-bytecode", "-o", a).returncode == 0
    assert run("-q", CONV_BN, "--emit", "bytecode", "-o", b).returncode == 0
    assert a.read_bytes() == b.read_bytes() and a.read_bytes().startswith(b"ML\xefR")


def test_unregistered_dialects_pass_through_with_the_flag():
    text = CONV_BN.read_text().replace(
        "return", '"mydialect.marker"() : () -> ()\n    return', 1)
    refused = run("-q", "-", stdin=text.encode())
    assert refused.returncode == 1 and b"allow-unregistered-dialect" in refused.stderr
    accepted = run("-", "--allow-unregistered-dialect", stdin=text.encode())
    assert accepted.returncode == 0, accepted.stderr
    assert b'"mydialect.marker"()' in accepted.stdout and b"folded 1" in accepted.stderr


def test_split_input_file_processes_the_good_chunks_and_exits_1():
    good = CONV_BN.read_text()
    bad = "func.func @bad(%a: tensor<2xf32>) -> tensor<3xf32> {\n  return %a : tensor<2xf32>\n}\n"
    proc = run("-q", "--split-input-file", "-", stdin=(good + "// -----\n" + bad).encode())
    assert proc.returncode == 1
    assert b"stablehlo.convolution" in proc.stdout and b"batch_norm_inference" not in proc.stdout
    assert b"error" in proc.stderr


def test_split_input_file_with_an_output_file_writes_nothing_on_error(tmp_path):
    out = tmp_path / "out.mlir"
    bad = "func.func @bad(%a: tensor<2xf32>) -> tensor<3xf32> {\n  return %a : tensor<2xf32>\n}\n"
    text = CONV_BN.read_text() + "// -----\n" + bad
    proc = run("-q", "--split-input-file", "-", "-o", out, stdin=text.encode())
    assert proc.returncode == 1 and not out.exists()


def test_empty_input_is_an_empty_module():
    proc = run("-q", "-", stdin=b"")
    assert proc.returncode == 0 and proc.stdout.decode().strip() == "module {\n}"


def test_report_format_text_is_a_table(tmp_path):
    proc = run("-q", CONV_BN, "-o", tmp_path / "out.mlir", "--report", "-",
               "--report-format", "text")
    lines = proc.stdout.decode().splitlines()
    assert lines[0].split() == ["fold", "direction", "producer", "norm", "channels", "rounding",
                                "kind"]
    row = lines[1].split()
    assert row[0] == "fold0" and row[1] == "backward" and row[-1] == "normalization"
    report = json.loads(run("-q", CONV_BN, "-o", tmp_path / "out.mlir", "--report", "-").stdout)
    assert row[-2] == f"{report['folds'][0]['kernel_rounding']:.1e}"
    assert "nothing skipped" in lines and lines[-1].startswith("folded 1 normalization(s)")


def test_report_format_text_shows_each_folds_note(tmp_path):
    """What stayed of a fold (a border correction, a kept shift) is in the text report too
    (issue 26: it was only in the JSON)."""
    stem = support.MODELS / "torchax_normalized_stem_nchw.mlir"
    text = run("-q", stem, "-o", tmp_path / "out.mlir", "--report", "-",
               "--report-format", "text").stdout.decode()
    report = json.loads(run("-q", stem, "-o", tmp_path / "out.mlir", "--report", "-").stdout)
    noted = [f for f in report["folds"] if f.get("note")]
    assert noted, "the normalized stem's input shift folds through the padding with a note"
    for fold in noted:
        assert re.search(rf"^{fold['id']}\s+{re.escape(fold['note'])}$", text, re.MULTILINE), text


def test_only_chains_that_normalize_count_as_normalizations(tmp_path):
    """EfficientNet's stem has 3 batch norms and 1 input normalization; its squeeze-excitation
    conv bias + sigmoid's negate and its mean pool's divide are other affine folds
    (issue 26: the negate was counted as a fifth normalization)."""
    stem = support.MODELS / "keras_efficientnet_stem_nhwc.mlir"
    proc = run(stem, "-o", tmp_path / "out.mlir", "--report", tmp_path / "r.json")
    assert "folded 4 normalization(s)" in proc.stderr.decode()
    assert "(+2 other affine: 1 divide folded forward, 1 negate folded backward)" in \
        proc.stderr.decode()
    kinds = {(f["norm"].rsplit("/", 2)[-2], f["kind"])
             for f in json.loads((tmp_path / "r.json").read_text())["folds"]}
    assert kinds == {("stem_bn", "normalization"), ("block1a_bn", "normalization"),
                     ("block1a_project_bn", "normalization"), ("rescaling", "normalization"),
                     ("block1a_se_expand", "affine"), ("block1a_se_squeeze", "affine")}


def test_summary_separates_batch_norms_from_other_affine_folds(tmp_path):
    proc = run(MOBILENET, "-o", tmp_path / "out.mlir")
    summary = proc.stderr.decode()
    assert "folded 52 normalization(s)" in summary
    # its global average pool is over 1x1: a divide by exactly 1, removed, not a fold
    assert "other affine" not in summary
    assert "removed 1 identity op(s) (1 x / 1; not folds)" in summary
    proc = run(support.MODELS / "deployment_flax_resnet18_symbolic_nhwc.mlir", "-o",
               tmp_path / "resnet.mlir")
    summary = proc.stderr.decode()
    assert "folded 20 normalization(s)" in summary
    assert "(+1 other affine: 1 divide folded forward)" in summary  # its 4x4 average pool


@pytest.mark.parametrize("flags, flag, needs", [
    (["--report-format", "text"], "--report-format", "--report"),
    (["--visualize-port", "9000"], "--visualize-port", "--visualize"),
    (["--bind-func", "main"], "--bind-func", "--bind-params"),
    (["--emit", "bytecode", "--mlir-elide-elementsattrs-if-larger", "4"],
     "--mlir-elide-elementsattrs-if-larger", "--emit mlir"),
    (["--emit", "portable", "--mlir-print-op-generic"], "--mlir-print-op-generic", "--emit mlir"),
    (["--emit-bytecode", "--mlir-print-debuginfo"], "--mlir-print-debuginfo", "--emit mlir"),
])
def test_a_flag_that_cannot_take_effect_names_the_flag_it_needs(flags, flag, needs, tmp_path):
    """Issue 32: these were accepted and did nothing."""
    out = tmp_path / "out"
    proc = run("-q", CONV_BN, "-o", out, *flags)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and not out.exists()
    assert err.count("\n") == 1 and err.startswith(f"bnfold-opt: error: {flag} needs {needs}")
    assert "Traceback" not in err


def test_the_flags_work_with_what_they_need(tmp_path):
    proc = run("-q", CONV_BN, "-o", tmp_path / "o.mlir", "--report", tmp_path / "r.txt",
               "--report-format", "text", "--mlir-print-op-generic")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r.txt").read_text().startswith("fold ")


def test_fail_if_nothing_folded_exits_2_and_still_writes_the_outputs(tmp_path):
    nothing = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  return %a : tensor<2xf32>\n}\n"
    out, report = tmp_path / "o.mlir", tmp_path / "r.json"
    plain = run("-", "-o", out, stdin=nothing.encode())
    assert plain.returncode == 0 and "nothing folded" not in plain.stderr.decode()
    out.unlink()
    proc = run("-", "-o", out, "--report", report, "--fail-if-nothing-folded",
               stdin=nothing.encode())
    assert proc.returncode == 2, proc.stderr
    assert "nothing folded; exit status 2 (--fail-if-nothing-folded)" in proc.stderr.decode()
    assert "func.func @main" in out.read_text() and json.loads(report.read_text())["folds"] == []
    folds = run("-q", CONV_BN, "-o", out, "--fail-if-nothing-folded")
    assert folds.returncode == 0 and folds.stderr == b""


SMALL = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  return %a : tensor<2xf32>\n}\n"


def _on_a_terminal(args: list[object], *, stdin_tty: bool = False, stdout_tty: bool = False,
                   typed: bytes = b"") -> tuple[int, bytes, bytes]:
    """Runs bnfold-opt with stdin and/or stdout on a pseudo-terminal; returns the status,
    what reached the terminal (stdout side) or the stdout pipe, and stderr."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bnfold", *map(str, args)],
                                stdin=slave if stdin_tty else subprocess.DEVNULL,
                                stdout=slave if stdout_tty else subprocess.PIPE,
                                stderr=subprocess.PIPE)
        os.close(slave)
        if stdin_tty:
            os.write(master, typed + b"\x04")  # Ctrl+D at the start of a line: end of input
        out = b""
        if stdout_tty:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
        pipe_out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
    return proc.returncode, out if stdout_tty else pipe_out, err


@pytest.mark.parametrize("flags", [[], ["--split-input-file"]])
def test_no_input_on_a_terminal_says_it_reads_standard_input(flags):
    """Issue 32: `bnfold-opt` with no argument at a terminal seemed to hang."""
    status, out, err = _on_a_terminal(["-q", *flags], stdin_tty=True, typed=SMALL.encode())
    assert status == 0, err
    assert err.decode().startswith("bnfold-opt: reading the module from standard input "
                                   "(end it with Ctrl+D"), err
    assert b"func.func @main" in out
    piped = run("-q", "-", stdin=SMALL.encode())  # not a terminal: nothing to say
    assert piped.returncode == 0 and piped.stderr == b""


@pytest.mark.parametrize("flags, what", [(["--emit", "bytecode"], "--emit bytecode"),
                                         (["--emit", "portable"], "--emit portable"),
                                         (["-o", "/dev/null", "--report-params", "-"], ".npz")])
def test_binary_output_to_a_terminal_is_refused(flags, what):
    status, out, err = _on_a_terminal(["-q", CONV_BN, *flags], stdout_tty=True)
    assert status == 1 and out == b"", out[:200]
    assert err.decode() == (f"bnfold-opt: error: refusing to write binary output ({what}) to a "
                            f"terminal: give {'-o' if what != '.npz' else '--report-params'} a "
                            f"file name, or redirect stdout\n")


def test_text_output_to_a_terminal_is_written():
    status, out, err = _on_a_terminal(["-q", CONV_BN], stdout_tty=True)
    assert status == 0 and b"stablehlo.convolution" in out, err


def test_a_misspelled_flag_gets_the_nearest_one_in_one_line():
    proc = run(CONV_BN, "--equalise")
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("bnfold-opt: error: unknown option --equalise; did you mean "
                          "--equalize?")
    far = run(CONV_BN, "--xyzzy").stderr.decode()
    assert "unknown option --xyzzy" in far and "did you mean" not in far
    extra = run(CONV_BN, "second.mlir").stderr.decode()
    assert "unexpected argument(s) 'second.mlir' (bnfold-opt takes one INPUT)" in extra


def _two_layers(first_trained: bool) -> str:
    """conv -> batch norm -> relu -> conv -> batch norm (decomposed, as Flax spells it);
    the first batch norm's statistics are their initial values unless `first_trained`."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    k1 = rng.normal(0, .3, (3, 3, 3, 8)).astype(np.float32)
    k2 = rng.normal(0, .3, (1, 1, 8, 4)).astype(np.float32)

    def stats(c, trained):
        if not trained:
            return [np.zeros(c, np.float32), np.ones(c, np.float32), np.ones(c, np.float32),
                    np.zeros(c, np.float32)]
        return [rng.normal(0, .5, c).astype(np.float32), rng.uniform(.5, 2, c).astype(np.float32),
                rng.uniform(.5, 1.5, c).astype(np.float32), rng.normal(0, .3, c).astype(np.float32)]

    s1, s2 = stats(8, first_trained), stats(4, True)

    def bn(y, s):
        mean, var, gamma, beta = s
        return (y - mean) * jax.lax.rsqrt(jax.numpy.asarray(var) + 1e-5) * gamma + beta

    def f(x):
        conv = lambda v, k: jax.lax.conv_general_dilated(  # noqa: E731
            v, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return bn(conv(jax.nn.relu(bn(conv(x, k1), s1)), k2), s2)

    return jax.jit(f).lower(np.ones((1, 8, 8, 3), np.float32)).as_text()


def test_untrained_statistics_are_a_warning_in_the_report(tmp_path):
    """Issue 32 item 9: quantization built on statistics that describe no data made models
    worse, and nothing said so."""
    module = tmp_path / "m.mlir"
    module.write_text(_two_layers(first_trained=False))
    flags = ["-o", tmp_path / "o.mlir", "--equalize", "--quantize-weights", "int8",
             "--bias-correction"]
    proc = run(module, *flags, "--report", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    [warning] = report["warnings"]
    assert warning["code"] == "untrained-statistics" and warning["fold"] == "fold0"
    assert "mean 0, variance 1, gamma 1, beta 0 in every channel" in warning["message"]
    assert "statistics" in report["statistics_note"]
    assert "1 batch norm(s) with untrained statistics" in proc.stderr.decode()
    text = run("-q", module, *flags, "--report", "-", "--report-format", "text",
               "-o", tmp_path / "o2.mlir").stdout.decode()
    assert re.search(r"^fold0\s+untrained-statistics\s+the batch norm's statistics are their "
                     r"initial values", text, re.MULTILINE), text
    assert "note: equalization ranges, high-bias absorption and bias correction take" in text
    # Without quantization the JSON still has the warning (the summary stays as it was).
    plain = run(module, "-o", tmp_path / "o3.mlir", "--report", tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["warnings"] == [warning]
    assert "untrained statistics" not in plain.stderr.decode()


def test_trained_statistics_are_not_a_warning(tmp_path):
    module = tmp_path / "m.mlir"
    module.write_text(_two_layers(first_trained=True))
    proc = run(module, "-o", tmp_path / "o.mlir", "--equalize", "--report", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["folds"]) == 2 and report["warnings"] == []
    assert "untrained statistics" not in proc.stderr.decode()


def test_untrained_running_statistics_with_trained_gamma_are_a_warning_too():
    """Running mean 0 and variance 1 exactly: never updated from data, whatever gamma and
    beta learned; the other statistics, or one channel off, are not a warning."""
    import numpy as np

    from bnfold.report import Fold, untrained

    def fold(**params):
        return Fold("fold0", "p", "stablehlo.convolution", "n", "stablehlo.batch_norm_inference",
                    "batch_norm_inference", "backward", 2, [], "main",
                    params={k: np.asarray(v, np.float64) for k, v in params.items()})

    fresh = dict(mean=[0, 0], variance=[1, 1], gamma=[1, 1], beta=[0, 0], epsilon=1e-5)
    assert "gamma 1, beta 0" in untrained(fold(**fresh))["message"]
    running = untrained(fold(**fresh | {"gamma": [0.5, 2.0]}))
    assert "running mean 0 and variance 1 in every channel" in running["message"]
    assert untrained(fold(**fresh | {"variance": [1, 1.5]})) is None
    assert untrained(fold(**fresh | {"mean": [0, 1e-3]})) is None
    assert untrained(fold(scale=[1, 1], shift=[0, 0])) is None  # no statistics recovered
