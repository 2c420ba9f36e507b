"""The shortcuts the fold takes for speed answer exactly what the slow paths answer.

    op_id                 the capsule's pointer read directly == PyCapsule_GetPointer
    Evaluator.is_constant a constant's elements not read == `constant(v) is not None`
    attributes.ints       a dense array read by index == iterated
    Rewriter.is_replaced  the replaced ops' addresses == their handles among the tombstones
    --check's help        bnfold.check imported when the help is shown, not by every run
    format_location       a file location's fields == its printed form, reformatted
    numpy_dtype, is_float the bindings' type class == the TypeID (and the name)
    any_true, all_true    np.count_nonzero == ndarray.any / ndarray.all
    defining_op           one attribute read == the isinstance checks
    the CLI process       folds without the cyclic collector (quantizing with it)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bnfold import attributes, elements, graph
from bnfold import ir as bir
from bnfold.constants import Evaluator
from bnfold.rewriter import Rewriter

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted((ROOT / "testdata").rglob("*.mlir"))

# Constants bnfold can and cannot evaluate: a splat, an element type it does not compute
# with (complex, f8), a dense_resource blob, one whose blob is missing.
CONSTANTS = """
module {
  func.func @main(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<2xcomplex<f32>>,
                                         tensor<2xf8E4M3FN>, tensor<2xf32>, tensor<2xf32>) {
    %splat = stablehlo.constant dense<1.5> : tensor<2xf32>
    %dense = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
    %complex = stablehlo.constant dense<[(1.0, 2.0), (3.0, 4.0)]> : tensor<2xcomplex<f32>>
    %f8 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf8E4M3FN>
    %blob = stablehlo.constant dense_resource<blob> : tensor<2xf32>
    %sum = stablehlo.add %x, %dense : tensor<2xf32>
    return %splat, %sum, %complex, %f8, %blob, %dense : tensor<2xf32>, tensor<2xf32>, tensor<2xcomplex<f32>>, tensor<2xf8E4M3FN>, tensor<2xf32>, tensor<2xf32>
  }
}
{-#
  dialect_resources: {
    builtin: {
      blob: "0x040000000000C03F00002040"
    }
  }
#-}
"""


def _ops(module: bir.ir.Module) -> list[bir.ir.Operation]:
    found: list[bir.ir.Operation] = []

    def visit(op: bir.ir.Operation) -> bir.ir.WalkResult:
        found.append(op.operation)
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


@pytest.mark.parametrize("path", MODELS[:12], ids=lambda p: p.name)
def test_op_id_reads_the_pointer_the_checked_call_returns(path: Path) -> None:
    context = bir.make_context()
    module = bir.parse_path(str(path), context)
    with context:
        ops = _ops(module)
        ids = [bir.op_id(op) for op in ops]
        assert ids == [bir._checked_op_id(op) for op in ops]
        assert len(set(ids)) == len(ops)  # one identity per operation
        # Another walk's wrappers, and the OpViews a value's owner gives, have the same ids.
        assert [bir.op_id(op) for op in _ops(module)] == ids
        owners = [(op, r.owner) for op in ops for r in list(op.results)[:1]]
        assert all(bir.op_id(owner) == bir.op_id(op) for op, owner in owners)


def test_is_constant_answers_what_evaluating_answers() -> None:
    context = bir.make_context()
    module = bir.parse(CONSTANTS, context)
    with context:
        values = [v for op in _ops(module) for v in list(op.results) + list(op.operands)]
        answers = [Evaluator(module).is_constant(v) for v in values]
        assert answers == [Evaluator(module).constant(v) is not None for v in values]
        assert True in answers and False in answers
        # Once evaluated (memoized), the answer is the memo's.
        evaluator = Evaluator(module)
        for value in values:
            evaluator.evaluate(value)
        assert [evaluator.is_constant(v) for v in values] == answers


@pytest.mark.parametrize("path", MODELS[:12], ids=lambda p: p.name)
def test_dense_arrays_read_by_index_as_iterated(path: Path) -> None:
    context = bir.make_context()
    module = bir.parse_path(str(path), context)
    with context:
        checked = 0
        for op in _ops(module):
            for name in list(op.attributes):
                try:
                    array = bir.ir.DenseI64ArrayAttr(op.attributes[name])
                except ValueError:
                    continue
                assert attributes.ints(op, name, default=0, rank=0) == tuple(array)
                checked += 1
        assert checked > 0


@pytest.mark.parametrize("path", MODELS[:12], ids=lambda p: p.name)
def test_is_replaced_answers_what_the_handles_answer(path: Path) -> None:
    """After replacing every other op that has results (the way a pattern's apply does),
    `is_replaced` by address agrees with the handle map for every op, replaced or not."""
    context = bir.make_context()
    module = bir.parse_path(str(path), context)
    with context, bir.ir.Location.unknown():
        rewriter = Rewriter()
        ops = _ops(module)
        assert not any(rewriter.is_replaced(op) for op in ops)
        replaced = [op for op in ops if len(op.results) == 1][::2]
        for op in replaced:
            rewriter.replace_op(op, [op.results[0]])  # its own value: no use moves
        slow = [rewriter.handles.get(op) in rewriter._tombstones for op in ops]
        assert [rewriter.is_replaced(op) for op in ops] == slow
        assert sum(slow) == len(replaced) > 0


def test_check_help_quotes_the_tolerances_without_importing_check() -> None:
    """`--check`'s help quotes bnfold.check's tolerance table and default size, read when
    the help is expanded; building the parser (every run) does not import bnfold.check."""
    code = """
import sys
import bnfold.cli
parser = bnfold.cli.build_parser()
assert "bnfold.check" not in sys.modules, "building the parser imported bnfold.check"
text = parser.format_help()
from bnfold.check import DEFAULT_DIM, TOLERANCE
for name, value in TOLERANCE.items():
    assert f"{name} {value:g}" in text, (name, value)
assert f"default {DEFAULT_DIM};" in text
"""
    env = dict(os.environ, COLUMNS="1000")  # one line per argument: nothing wraps
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr


# File names MLIR prints as they are, and ones it escapes (a quote, a backslash, a tab,
# non-ASCII); names a caller substitutes for "-" (text parsed from memory), odd ones too.
_FILES = ["-", "x.py", "a b.py", 'q"uote.py', "back\\slash.py", "caf\u00e9.py", "tab\t.py", "",
          "/abs/path/model.mlir", "~`{}|[]^_@?>=<;:/.,+*()'&%$#!"]
_NAMES = [None, "given.mlir", 'we"ird', "na\u00efve", "-", "a\\b"]


def _printed_form(loc: bir.ir.Location, name: str | None) -> str:
    """format_location by the printed form alone (the fast path switched off)."""
    saved = bir._FILE_LINE_COL
    bir._FILE_LINE_COL = None
    try:
        return bir.format_location(loc, name)
    finally:
        bir._FILE_LINE_COL = saved


def test_file_locations_read_from_their_fields_as_printed() -> None:
    assert bir._FILE_LINE_COL is not None, "jaxlib lost FileLineColLoc: the fast path is off"
    with bir.make_context():
        checked = 0
        for file in _FILES:
            for start, end in [((1, 2), (1, 2)), ((3, 4), (5, 6)), ((0, 0), (0, 0)),
                               ((7, 1), (7, 9))]:
                loc = bir.ir.Location.file(file, *start, *end) if start != end else \
                    bir.ir.Location.file(file, *start)
                for name in _NAMES:
                    assert bir.format_location(loc, name) == _printed_form(loc, name), \
                        (file, start, end, name, str(loc))
                    checked += 1
        # The other kinds have no fields to read: the printed form, as before.
        others = [bir.ir.Location.name("n", bir.ir.Location.file("f.py", 1, 2)),
                  bir.ir.Location.unknown(),
                  bir.ir.Location.fused([bir.ir.Location.file("a.py", 1, 2),
                                         bir.ir.Location.file("b.py", 3, 4)])]
        assert [bir.format_location(loc, "g") for loc in others] == \
            ["n", "unknown", 'fused["a.py":1:2, "b.py":3:4]']
    assert checked == len(_FILES) * 4 * len(_NAMES)


def test_numpy_dtype_by_type_class_is_the_typeid_answer() -> None:
    names = ["f16", "bf16", "f32", "f64", "i1", "i4", "i8", "ui8", "i16", "i32", "i64",
             "f8E4M3FN", "complex<f32>", "index"]
    with bir.make_context():
        for name in names:
            typed = bir.ir.Type.parse(name)  # the bindings give the concrete class
            plain = bir.ir.Type(typed)  # a plain ir.Type: the TypeID path
            assert type(plain) is bir.ir.Type
            assert elements.numpy_dtype(typed) == elements.numpy_dtype(plain), name
            assert elements.is_float(typed) == elements.is_float(plain) == \
                (name in ("f16", "bf16", "f32", "f64")), name
        assert elements.numpy_dtype(bir.ir.Type.parse("f32")) == np.float32
        assert elements.numpy_dtype(bir.ir.Type.parse("complex<f32>")) is None


@pytest.mark.parametrize("mask", [np.zeros(0, bool), np.zeros(3, bool), np.ones(3, bool),
                                  np.array([True, False]), np.array([[False], [True]]),
                                  np.array([1.0, np.nan]) != 1.0, np.bool_(True)])
def test_mask_predicates_answer_any_and_all(mask: np.ndarray) -> None:
    assert elements.any_true(mask) is bool(mask.any())
    assert elements.all_true(mask) is bool(mask.all())


def test_defining_op_is_the_owner_op_or_none() -> None:
    context = bir.make_context()
    module = bir.parse(CONSTANTS, context)
    with context:
        ops = _ops(module)
        for op in ops:
            for value in op.operands:
                owner = value.owner
                expected = owner.operation if isinstance(owner, bir.ir.OpView) else \
                    owner if isinstance(owner, bir.ir.Operation) else None
                assert graph.defining_op(value) == expected
                assert graph.as_operation(owner) == expected
        assert any(graph.defining_op(v) is None for op in ops for v in op.operands)


def _collector_during_fold(extra: list[str], out: Path) -> str:
    """Whether the collector is on while `bnfold-opt ... extra` folds (in a new process)."""
    module = ROOT / "testdata" / "conv2d_nhwc_bn.mlir"
    code = ("import gc, sys, bnfold.cli as cli\n"
            "real = cli.fold_source\n"
            "def spy(*args, **kwargs):\n"
            "    print('collector', gc.isenabled(), flush=True)\n"
            "    return real(*args, **kwargs)\n"
            "cli.fold_source = spy\n"
            f"sys.argv = ['bnfold-opt', '-q', {str(module)!r}, '-o', {str(out)!r}, *{extra!r}]\n"
            "cli.run()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert "stablehlo.batch_norm_inference" not in out.read_text()
    return run.stdout.strip()


def test_a_plain_fold_runs_without_the_cyclic_collector(tmp_path: Path) -> None:
    """`bnfold-opt` (bnfold.cli.run) folds with the collector off; the quantization
    stages and pass pipelines run with it on; a library caller's process keeps it."""
    out = tmp_path / "folded.mlir"
    assert _collector_during_fold([], out) == "collector False"
    assert _collector_during_fold(["--equalize"], out) == "collector True"
    assert _collector_during_fold(["--quantize-weights", "int8"], out) == "collector True"
    assert _collector_during_fold(["--pass-pipeline", "builtin.module(bnfold-fold)"], out) == \
        "collector True"
    module = ROOT / "testdata" / "conv2d_nhwc_bn.mlir"
    code = ("import gc, bnfold\n"
            f"bnfold.fold_source(path={str(module)!r})\n"
            "print('collector', gc.isenabled())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert (run.returncode, run.stdout.strip()) == (0, "collector True"), run.stderr
    run = subprocess.run([sys.executable, "-m", "bnfold", "-q", str(module), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
