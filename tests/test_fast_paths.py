"""The shortcuts the fold takes for speed answer exactly what the slow paths answer.

    op_id                 the capsule's pointer read directly == PyCapsule_GetPointer
    Evaluator.is_constant a constant's elements not read == `constant(v) is not None`
    attributes.ints       a dense array read by index == iterated
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bnfold import attributes
from bnfold import ir as bir
from bnfold.constants import Evaluator

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
