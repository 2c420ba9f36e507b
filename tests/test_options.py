"""The one options schema (bnfold.options): every CLI flag, every pass option and every
FoldOptions field come from it, and an error names the option as the user spelled it.

The three drifts issue 25 found (each failed before the schema):
* `bnfold-expand-batch-norm{skip-func=main}` expanded @main anyway;
* `--disable X --absorb-high-bias` blamed `--disable`;
* `--report-overlay` with `--pass-pipeline` wrote an empty input overlay;
and the overlay drift: two inlined copies of one helper were both labelled with both folds.
"""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

import bnfold
import support
from bnfold import options
from bnfold.cli import build_parser, main
from bnfold.options import FoldOptions, OptionError
from bnfold.patterns import PASSES

BN = (support.TESTDATA / "conv2d_bias_bn.mlir").read_text()


def test_every_option_with_a_flag_is_a_cli_flag_and_every_pass_option_is_accepted():
    parser = build_parser()
    flags = {a for action in parser._actions for a in action.option_strings}
    for f in fields(FoldOptions):
        meta = f.metadata["bnfold"]
        if meta.flag is not None:
            assert meta.flag in flags, meta.flag
    spec = next(s for s in PASSES if s.name == "bnfold-fold")
    accepted = spec.option_names()
    assert {"disable", "skip-func", "expand-batch-norm", "pad-uniform-shift", "equalize",
            "absorb-high-bias"} <= set(accepted)


def test_expand_pass_takes_skip_func():
    """bnfold-expand-batch-norm{skip-func=main} leaves @main's batch norm alone."""
    folded = bnfold.fold_source(BN, pass_pipeline="builtin.module(bnfold-expand-batch-norm{skip-func=main})")
    assert "batch_norm_inference" in folded.serialize().decode()
    assert folded.report.expanded == 0
    expanded = bnfold.fold_source(BN, pass_pipeline="builtin.module(bnfold-expand-batch-norm)")
    assert "batch_norm_inference" not in expanded.serialize().decode()
    assert expanded.report.expanded == 1


@pytest.mark.parametrize("argv, flag", [
    (["--disable", "forward-affine", "--absorb-high-bias"], "--absorb-high-bias"),
    (["--absorb-high-bias"], "--absorb-high-bias"),
    (["--disable", "nope", "--equalize"], "--disable"),
])
def test_errors_name_the_flag_the_user_gave(tmp_path, capsys, argv, flag):
    src = tmp_path / "m.mlir"
    src.write_text(BN)
    assert main([str(src), *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"bnfold-opt: {flag}: error: "), err
    other = {"--absorb-high-bias": "--disable", "--disable": "--absorb-high-bias"}[flag]
    assert other not in err.split(": error: ")[0]


def test_pass_option_errors_name_the_pass_option():
    with pytest.raises(bnfold.BnfoldError, match=r"bnfold-fold\{absorb-high-bias\}.*bnfold-fold\{equalize\}"):
        bnfold.fold_source(BN, pass_pipeline="builtin.module(bnfold-fold{absorb-high-bias=true})")
    with pytest.raises(bnfold.BnfoldError, match=r"bnfold-expand-batch-norm has no option 'disable'"):
        bnfold.fold_source(BN, pass_pipeline="builtin.module(bnfold-expand-batch-norm{disable=x})")


def test_python_errors_name_the_keyword():
    with pytest.raises(OptionError, match=r"^absorb_high_bias: error: it needs equalize"):
        FoldOptions(absorb_high_bias=True)
    with pytest.raises(ValueError, match="unknown pattern name"):  # a ValueError too
        FoldOptions(disable="nope")


def test_the_same_options_from_every_spelling():
    args = build_parser().parse_args(["x.mlir", "--disable", "forward-affine", "--skip-func", "f",
                                      "--skip-func", "g", "--equalize", "--absorb-high-bias"])
    from_cli = options.from_cli(args, statistics=True)
    spec = next(s for s in PASSES if s.name == "bnfold-fold")
    from_pass = spec.options({"disable": "forward-affine", "skip-func": "f,g", "equalize": "true",
                              "absorb-high-bias": "1"})
    from_python = FoldOptions(disable={"forward-affine"}, skip_functions=["f", "g"], equalize=True,
                              absorb_high_bias=True)
    assert from_cli == from_pass == from_python


def test_report_overlay_with_a_pass_pipeline_describes_the_input(tmp_path):
    src = tmp_path / "m.mlir"
    src.write_text(BN)
    overlay = tmp_path / "nodes.json"
    assert main([str(src), "-o", str(tmp_path / "out.mlir"), "--report-overlay", str(overlay),
                 "--pass-pipeline", "builtin.module(bnfold-fold,cse)", "-q"]) == 0
    data = json.loads(overlay.read_text())
    assert data["main"]["results"], data  # the batch norm, folded (green)
    after = json.loads((tmp_path / "nodes.output.json").read_text())
    assert after["main"]["results"], after  # the producer that absorbed it (blue)
    assert "bnfold.absorbed" not in (tmp_path / "out.mlir").read_text()
    # The overlay describes the input: a pipeline must start with bnfold's pass.
    assert main([str(src), "-o", str(tmp_path / "o2.mlir"), "--report-overlay",
                 str(tmp_path / "n2.json"), "--pass-pipeline", "builtin.module(cse,bnfold-fold)",
                 "-q"]) == 1


SHARED = """
func.func @main(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %ka = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 3.0]]]]> : tensor<1x1x2x2xf32>
  %kb = stablehlo.constant dense<[[[[-4.0, 0.25], [2.0, 1.5]]]]> : tensor<1x1x2x2xf32>
  %sv = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %s = stablehlo.broadcast_in_dim %sv, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %y1 = call @conv(%x, %ka) : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %n1 = stablehlo.multiply %y1, %s : tensor<1x4x4x2xf32>
  %y2 = call @conv(%n1, %kb) : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %s2v = stablehlo.constant dense<[3.0, 0.25]> : tensor<2xf32>
  %s2 = stablehlo.broadcast_in_dim %s2v, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %n2 = stablehlo.multiply %y2, %s2 : tensor<1x4x4x2xf32>
  return %n2 : tensor<1x4x4x2xf32>
}
func.func private @conv(%a: tensor<1x4x4x2xf32>, %w: tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32> {
  %0 = stablehlo.convolution(%a, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  return %0 : tensor<1x4x4x2xf32>
}
"""


def test_two_inlined_copies_of_one_helper_are_labelled_with_their_own_fold(tmp_path):
    """Both copies share the helper's location; matching folds to producers by location
    labelled each with both folds. Each producer must say only the fold it absorbed."""
    src = tmp_path / "m.mlir"
    src.write_text(SHARED)
    out, overlay = tmp_path / "out.mlir", tmp_path / "nodes.json"
    assert main([str(src), "-o", str(out), "--report-overlay", str(overlay), "-q"]) == 0
    after = json.loads((tmp_path / "nodes.output.json").read_text())["main"]["results"]
    values = sorted(entry["value"] for entry in after.values())
    assert values == ["ABSORBED fold0", "ABSORBED fold1"], after


@pytest.mark.parametrize("value", ["a}", "{x}", "{0}", "{equalize}", "{}"])
def test_braces_in_an_option_value_are_quoted_as_typed(tmp_path, capsys, value):
    """Issue 31: the message was `str.format`ted over the user's text (`--disable 'a}'`
    was an internal error; `{equalize}` would have become `--equalize`)."""
    src = tmp_path / "m.mlir"
    src.write_text(BN)
    out = tmp_path / "out.mlir"
    assert main([str(src), "-o", str(out), "--disable", value]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (f"bnfold-opt: --disable: error: unknown pattern name(s) {value}; "
                           f"known: {', '.join(bnfold.pattern_names())}"), err
    assert not out.exists()
    with pytest.raises(OptionError, match=r"^quantize_weights: error: '\{bits\}' is not one of"):
        FoldOptions(quantize_weights="{bits}")


LAMBDA = """
func.func @main(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 3.0]]]]> : tensor<1x1x2x2xf32>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %z = call @"<lambda>"(%y) : (tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32>
  return %z : tensor<1x4x4x2xf32>
}
func.func private @"<lambda>"(%a: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %sv = stablehlo.constant dense<[0.5, 2.0]> : tensor<2xf32>
  %s = stablehlo.broadcast_in_dim %sv, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %n = stablehlo.multiply %a, %s : tensor<1x4x4x2xf32>
  return %n : tensor<1x4x4x2xf32>
}
"""
KEPT = 'func.func private @"<lambda>"'


def _lambda_run(tmp_path, *argv: str) -> tuple[int, str | None]:
    src, out = tmp_path / "m.mlir", tmp_path / "out.mlir"
    src.write_text(LAMBDA)
    out.unlink(missing_ok=True)
    code = main([str(src), "-o", str(out), "-q", *argv])
    return code, out.read_text() if out.exists() else None


@pytest.mark.parametrize("argv", [
    ["--skip-func", '"<lambda>"'], ["--skip-func", '@"<lambda>"'], ["--skip-func", "<lambda>"],
    ["--pass-pipeline", 'builtin.module(bnfold-fold{skip-func="<lambda>"})'],
    ["--pass-pipeline", "builtin.module(bnfold-fold{skip-func='\"<lambda>\"'})"],
    ["--pass-pipeline", 'builtin.module(bnfold-fold{skip-func=@"<lambda>"})'],
])
def test_skip_func_takes_the_name_as_mlir_prints_it(tmp_path, argv):
    """Issue 31 item 8: `--skip-func '"<lambda>"'` matched nothing, and the helper the user
    asked to keep was inlined and deleted."""
    code, text = _lambda_run(tmp_path, *argv)
    assert code == 0 and text is not None and KEPT in text and "stablehlo.multiply" in text
    code, text = _lambda_run(tmp_path)  # the control: without it the helper is folded away
    assert code == 0 and text is not None and KEPT not in text


def test_a_name_with_escapes_as_mlir_prints_it_names_the_function():
    """MLIR prints a backslash in a symbol as `\\` and a quote as `\\22`: the name copied from
    its output (what --skip-func and skip-func= take) is the function's own name."""
    from bnfold.ir import ir
    from bnfold.schema import symbol

    _, module = support.parse('func.func private @"a\\\\b\\22c"() { return }')
    [func] = module.body.operations
    printed = str(func).split("@", 1)[1].split("(", 1)[0]
    assert printed == '"a\\\\b\\22c"'
    assert symbol("@" + printed) == ir.StringAttr(func.attributes["sym_name"]).value == 'a\\b"c'


@pytest.mark.parametrize("argv, where", [
    (["--skip-func", "lambda"], "bnfold-opt: --skip-func: error: "),
    (["--skip-func", "<lambda>", "--skip-func", "@helper"], "bnfold-opt: --skip-func: error: "),
    (["--pass-pipeline", "builtin.module(bnfold-fold{skip-func=lambda})"],
     "bnfold-opt: --pass-pipeline: bnfold-fold{skip-func}: error: "),
])
def test_a_skip_func_that_names_no_function_lists_the_functions(tmp_path, capsys, argv, where):
    code, text = _lambda_run(tmp_path, *argv)
    assert code == 1 and text is None
    err = capsys.readouterr().err.strip()
    missing = "@lambda" if "lambda" in argv[-1] and "<" not in argv[-1] else "@helper"
    first, *caret = err.splitlines()
    assert first.startswith(f"{where}the module has no function {missing}; its functions: "
                            '@main, @"<lambda>"'), err
    if argv[0] == "--pass-pipeline":  # at the option's value, as every pipeline error
        assert first.endswith("(column 38)") and caret[-1].strip() == "^" \
            and caret[-1].index("^") == caret[0].index("skip-func=") + len("skip-func="), err
    else:
        assert not caret, err


def test_skip_func_over_a_split_input_names_a_function_of_some_chunk(tmp_path, capsys):
    src, out = tmp_path / "m.mlir", tmp_path / "out.mlir"
    src.write_text(BN + "\n// -----\n" + LAMBDA)
    assert main([str(src), "-o", str(out), "-q", "--split-input-file",
                 "--skip-func", '@"<lambda>"']) == 0
    assert KEPT in out.read_text() and "batch_norm_inference" not in out.read_text()
    out.unlink()
    assert main([str(src), "-o", str(out), "-q", "--split-input-file",
                 "--skip-func", "lambda"]) == 1
    assert not out.exists()
    assert capsys.readouterr().err.strip() == "bnfold-opt: --skip-func: error: the module has " \
        'no function @lambda; its functions: @main, @"<lambda>"'


def test_options_survive_pickling():
    """FoldOptions is built from the schema at import time: it must still name the module
    that holds it, or pickling (multiprocessing, a cached run) cannot find the class."""
    import pickle

    given = FoldOptions(equalize=True, skip_functions=["f"])
    assert pickle.loads(pickle.dumps(given)) == given
