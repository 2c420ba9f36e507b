"""The shortcuts the fold takes for speed answer exactly what the slow paths answer.

    op_id                 the capsule's pointer read directly == PyCapsule_GetPointer
    Evaluator.is_constant a constant's elements not read == `constant(v) is not None`
    attributes.ints       a dense array read by index == iterated
    Rewriter.is_replaced  the replaced ops' addresses == their handles among the tombstones
    --check's help        bnfold.check imported when the help is shown, not by every run
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bnfold import attributes
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
