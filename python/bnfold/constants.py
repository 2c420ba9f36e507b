"""Evaluate constant-only subgraphs with numpy.

Values are held as *compact* arrays: an array of the value's rank whose
dimensions are either the full size or 1, broadcastable to the full shape.
`broadcast_in_dim(constant(dense<[..4 values..]>))` to 1x56x56x4 is held as a
1x1x1x4 array, so per-channel statistics never materialize at activation size.
Floats are computed in float64 (`convert` rounds to its target type, as the
program would); integers and booleans keep their own type and wrap-around.

    %m = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
    %b = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xf32>) -> tensor<1x8x8x2xf32>
    -> Const(array=[[[[1., 2.]]]] (shape 1x1x1x2), shape=(1, 8, 8, 2))

Calls of private functions (`func.call @_flip`, Keras' `@_where`) are evaluated
through the callee's body with its arguments bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from bnfold import attributes, elements
from bnfold.graph import (
    as_operation,
    callee_name,
    calls,
    defining_op,
    functions_in,
    is_private,
    symbol_name,
    symbol_table,
)
from bnfold.ir import ir, location_name
from bnfold.refusal import Code, Refusal

# Guards against materializing something huge while evaluating a reshape or a
# concatenate of a broadcast (elements, not bytes).
MAX_MATERIALIZED_ELEMENTS = 1 << 27
MAX_CALL_DEPTH = 16


class Const(NamedTuple):
    """A constant value: a compact array and the value's full static shape."""

    array: np.ndarray
    shape: tuple[int, ...]
    dtype: np.dtype  # the value's own element dtype (float16, bfloat16, int32, ...)

    def full(self) -> np.ndarray:
        """The value at full shape (a read-only broadcast view, no copy)."""
        return np.broadcast_to(self.array, self.shape)


class NotConst(NamedTuple):
    """Why a value is not a compile-time constant."""

    reason: str


Result = Const | NotConst


class Evaluator:
    """Memoizing evaluator over the values of one module.

    Create one per pass run: results are cached per `ir.Value`, which hashes
    by address, so it must not outlive an erase (the next op MLIR creates would
    inherit the erased value's entry): `bnfold.analysis.Analysis` drops it when
    the rewriter ends the run.
    """

    def __init__(self, module: ir.Module, *, bindings: dict[ir.Value, Const] | None = None,
                 depth: int = 0, functions: dict[str, ir.Operation] | None = None,
                 errors_ignored: bool = False) -> None:
        self._module = module
        # The caller evaluates under np.errstate(all="ignore") (fold_module does): no need
        # to enter it once per evaluation (1 us each, thousands a run).
        self._errors_ignored = errors_ignored
        self._memo: dict[ir.Value, Result] = dict(bindings or {})
        self._depth = depth
        self._functions = functions
        # (shape, dtype, compute dtype) per static result type: MLIR uniques types, and a
        # module's constants have a handful of them
        self._types: dict[ir.Type, tuple[tuple[int, ...], np.dtype, np.dtype]] = {}

    # -- public ---------------------------------------------------------------

    def evaluate(self, value: ir.Value) -> Result:
        """The constant value of `value`, or why it is not one."""
        cached = self._memo.get(value)
        if cached is not None:
            return cached
        if self._errors_ignored:
            return self._evaluate(value)
        # Floating-point warnings (x / 0, overflow) are results for the callers to
        # judge, not errors.
        with np.errstate(all="ignore"):
            return self._evaluate(value)

    def _evaluate(self, value: ir.Value) -> Result:
        # Iterative post-order so long constant chains cannot hit Python's
        # recursion limit.
        memo = self._memo
        # (value, its op, name and operands once its operands are queued, else None)
        stack: list[tuple[ir.Value, tuple[ir.Operation, str, list[ir.Value]] | None]] = \
            [(value, None)]
        while stack:
            current, expanded = stack.pop()
            if current in memo:
                continue
            if expanded is None:
                op = getattr(current.owner, "operation", None)  # as_operation, inlined
                if op is None:
                    memo[current] = NotConst(f"it is {describe_argument(current)}"
                                             if is_function_argument(current)
                                             else "block argument")
                    continue
                name = op.name
                operands = value_operands(op, name)
                if name in _EVALUATORS and (pending := [v for v in operands if v not in memo]):
                    stack.append((current, (op, name, operands)))
                    stack += [(v, None) for v in pending]
                    continue
            else:
                op, name, operands = expanded
            memo[current] = self._evaluate_op(op, name, current, operands)
        return memo[value]

    def constant(self, value: ir.Value) -> Const | None:
        result = self.evaluate(value)
        return result if isinstance(result, Const) else None

    def is_constant(self, value: ir.Value) -> bool:
        """`constant(value) is not None`, without reading a `stablehlo.constant`'s elements
        into float64 (and keeping them): asking whether a kernel is constant must not
        cost a copy of every weight of the model in memory."""
        cached = self._memo.get(value)
        if cached is not None:
            return isinstance(cached, Const)
        op = as_operation(value.owner)
        if op is None or op.name != "stablehlo.constant":
            return self.constant(value) is not None
        # What _evaluate_op checks for a constant, with a zero-copy read where the
        # elements allow it (`read_native` succeeds exactly where `read` does).
        ty = elements.tensor_type(value)
        if ty is None or elements.numpy_dtype(ty.element_type) is None:
            return False
        try:
            array = elements.read_native(op.attributes["value"], compact=True)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            return False
        return array.ndim == ty.rank

    # -- one op ---------------------------------------------------------------

    def _evaluate_op(self, op: ir.Operation, name: str, value: ir.Value,
                     operands: list[ir.Value]) -> Result:
        handler = _EVALUATORS.get(name)
        if handler is None:
            return _NOT_CONSTANT_OP.get(name) or _NOT_CONSTANT_OP.setdefault(
                name, NotConst(f"{name} is not a constant operation"))
        typed = self._types.get(value_type := value.type)
        if typed is None:
            ty = elements.tensor_type(value_type)
            if ty is None and name == "stablehlo.dynamic_broadcast_in_dim":
                return self._dynamic_broadcast(op, value)
            if ty is None:
                return NotConst(f"{name} result has a dynamic or non-tensor type")
            dtype = elements.numpy_dtype(ty.element_type)
            if dtype is None:
                return NotConst(f"element type {ty.element_type} is not supported")
            typed = self._types[value_type] = (tuple(ty.shape), dtype, elements.compute_dtype(dtype))
        shape, dtype, compute = typed
        if name == "func.call":
            return self._evaluate_call(op, value)
        args: list[Const] = []
        for v in operands:
            r = self._memo[v]
            if isinstance(r, NotConst):
                return r
            args.append(r)
        try:
            array = handler(op, args, shape, dtype)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError) as e:
            return NotConst(f"cannot evaluate {name}: {e}")
        if array is None:
            return NotConst(f"cannot evaluate {name} with these operands")
        array = np.asarray(array)
        if array.ndim != len(shape):
            return NotConst(f"cannot evaluate {name}: rank mismatch")
        if array.dtype != compute:
            try:
                array = _cast(array, dtype)
            except ValueError as e:
                return NotConst(f"cannot evaluate {name}: {e}")
        return Const(array, shape, dtype)

    def _dynamic_broadcast(self, op: ir.Operation, value: ir.Value) -> Result:
        """A constant broadcast to a symbolic shape (jax.export's shape polymorphism).

        The value is known along every dimension the operand broadcasts (size
        1), whatever the runtime size; its `Const.shape` has -1 for dynamic
        dimensions. Only chain steps read such constants (per channel).
        """
        x = self._memo[op.operands[0]]
        if isinstance(x, NotConst):
            return x
        ty = ir.RankedTensorType(value.type)
        dtype = elements.numpy_dtype(ty.element_type)
        if dtype is None:
            return NotConst(f"element type {ty.element_type} is not supported")
        shape = tuple(DYNAMIC if ty.is_dynamic_dim(d) else ty.shape[d] for d in range(ty.rank))
        array = _broadcast_in_dim(op, [x], shape, dtype)
        if any(n == DYNAMIC and array.shape[d] != 1 for d, n in enumerate(shape)):
            return NotConst("a dynamic dimension of the broadcast varies")
        return Const(array, shape, dtype)

    def _evaluate_call(self, op: ir.Operation, value: ir.Value) -> Result:
        if self._depth >= MAX_CALL_DEPTH:
            return NotConst("call nesting too deep to evaluate")
        callee_name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        callee = self._lookup(callee_name)
        if callee is None:
            return NotConst(f"callee @{callee_name} not found")
        args: list[Const] = []
        for v in op.operands:
            r = self.evaluate(v)
            if isinstance(r, NotConst):
                return r
            args.append(r)
        block = callee.regions[0].blocks[0]
        bindings = dict(zip(block.arguments, args, strict=True))
        inner = Evaluator(self._module, bindings=bindings, depth=self._depth + 1,
                          functions=self._functions, errors_ignored=True)  # within ours
        terminator = list(block.operations)[-1]
        index = _result_index(op, value)
        return inner.evaluate(terminator.operands[index])

    def _lookup(self, name: str) -> ir.Operation | None:
        if self._functions is None:
            self._functions = symbol_table(self._module)
        func = self._functions.get(name)
        if func is None or len(func.regions[0].blocks) != 1:
            return None
        return func


_NOT_CONSTANT_OP: dict[str, NotConst] = {}
DYNAMIC = -1  # a symbolic dimension in `Const.shape`


def value_operands(op: ir.Operation, name: str | None = None) -> list[ir.Value]:
    """The operands that carry data (not the shape operand of a dynamic broadcast); `name`
    is `op.name` where the caller has it."""
    operands = list(op.operands)
    if (op.name if name is None else name) == "stablehlo.dynamic_broadcast_in_dim":
        return operands[:1]
    return operands


def _result_index(op: ir.Operation, value: ir.Value) -> int:
    for i, r in enumerate(op.results):
        if r == value:
            return i
    raise ValueError("value is not a result of op")


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rounds to `dtype` (as the program would), then widens floats to float64. Raises
    ValueError for a float that no value of an integer `dtype` holds (NaN, infinite or out
    of range): StableHLO leaves that conversion undefined (XLA saturates where numpy
    wraps), so no fold may rest on a guess of it."""
    target = elements.compute_dtype(dtype)
    if dtype == np.bool_:
        return array != 0
    if target.kind in "iu" and array.dtype.kind == "f":
        array = np.trunc(array)
        info = np.iinfo(dtype)
        if array.size and not (np.all(np.isfinite(array)) and array.min() >= info.min and
                               array.max() <= info.max):
            raise ValueError(f"a float outside {np.dtype(dtype).name}'s range (or NaN) is "
                             "converted to it, which StableHLO leaves undefined")
    return array.astype(dtype).astype(target)


# --- op handlers -------------------------------------------------------------
# Each handler gets the op, its constant operands and the result's full shape
# and dtype, and returns the result's compact array (or None: not foldable).

Handler = Callable[[ir.Operation, list[Const], tuple[int, ...], np.dtype], np.ndarray | None]


def _dense_i64(op: ir.Operation, name: str) -> list[int]:
    return list(attributes.ints(op, name, default=0, rank=0))


def _constant(op, args, shape, dtype):
    return elements.read(op.attributes["value"])


def _broadcast_in_dim(op, args, shape, dtype):
    (x,) = args
    dims = _dense_i64(op, "broadcast_dimensions")
    if dims == list(range(len(shape))):  # same rank, same order: the compact array as it is
        return x.array
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    array = x.array.transpose(order)
    new_shape = [1] * len(shape)
    for i in order:
        new_shape[dims[i]] = x.array.shape[i]
    return array.reshape(new_shape)


def _materialize(x: Const) -> np.ndarray:
    if math.prod(x.shape) > MAX_MATERIALIZED_ELEMENTS:
        raise ValueError("constant too large to materialize")
    return np.array(x.full())


def _reshape(op, args, shape, dtype):
    (x,) = args
    if x.array.size == 1:
        return x.array.reshape((1,) * len(shape))
    if x.array.shape == x.shape:
        return x.array.reshape(shape)
    axis = varying_axis(x.array)
    if axis is not None:
        mapped = map_axis_through_reshape(x.shape, shape, axis)
        if mapped is not None:
            out = [1] * len(shape)
            out[mapped] = shape[mapped]
            return x.array.reshape(out)
    return _materialize(x).reshape(shape)


def _transpose(op, args, shape, dtype):
    return args[0].array.transpose(_dense_i64(op, "permutation"))


def _reverse(op, args, shape, dtype):
    array = args[0].array
    for d in _dense_i64(op, "dimensions"):
        if array.shape[d] > 1:
            array = np.flip(array, d)
    return array


def _slice(op, args, shape, dtype):
    array = args[0].array
    starts = _dense_i64(op, "start_indices")
    limits = _dense_i64(op, "limit_indices")
    strides = _dense_i64(op, "strides")
    index = tuple(slice(s, lim, st) if n > 1 else slice(None)
                  for s, lim, st, n in zip(starts, limits, strides, array.shape, strict=True))
    return array[index]


def _concatenate(op, args, shape, dtype):
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    rank = len(shape)
    common = [1] * rank
    for a in args:
        for d in range(rank):
            if d != dim and a.array.shape[d] > 1:
                common[d] = shape[d]
    parts = []
    for a in args:
        target = list(common)
        target[dim] = a.shape[dim]
        if math.prod(target) > MAX_MATERIALIZED_ELEMENTS:
            raise ValueError("constant too large to materialize")
        parts.append(np.broadcast_to(a.array, target))
    return np.concatenate(parts, axis=dim)


def _convert(op, args, shape, dtype):
    return _cast(args[0].array, dtype)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Handler:
    return lambda op, args, shape, dtype: fn(args[0].array, args[1].array)


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Handler:
    return lambda op, args, shape, dtype: fn(args[0].array)


def _divide(op, args, shape, dtype):
    a, b = args[0].array, args[1].array
    if dtype.kind in "iu":
        if np.any(b == 0):
            raise ZeroDivisionError("integer division by zero")
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (b < 0), -q, q)
    return a / b


def _power(op, args, shape, dtype):
    a, b = args[0].array, args[1].array
    if dtype.kind in "iu" and np.any(b < 0):
        return None
    return np.power(a, b)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


_COMPARISONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "EQ": np.equal, "NE": np.not_equal, "GE": np.greater_equal,
    "GT": np.greater, "LE": np.less_equal, "LT": np.less,
}


def _compare(op, args, shape, dtype):
    return _COMPARISONS[attributes.comparison_direction(op)](args[0].array, args[1].array)


def _select(op, args, shape, dtype):
    return np.where(args[0].array, args[1].array, args[2].array)


_EVALUATORS: dict[str, Handler] = {
    "stablehlo.constant": _constant,
    "stablehlo.broadcast_in_dim": _broadcast_in_dim,
    "stablehlo.reshape": _reshape,
    "stablehlo.transpose": _transpose,
    "stablehlo.reverse": _reverse,
    "stablehlo.slice": _slice,
    "stablehlo.concatenate": _concatenate,
    "stablehlo.convert": _convert,
    "stablehlo.add": _binary(np.add),
    "stablehlo.subtract": _binary(np.subtract),
    "stablehlo.multiply": _binary(np.multiply),
    "stablehlo.divide": _divide,
    "stablehlo.maximum": _binary(np.maximum),
    "stablehlo.minimum": _binary(np.minimum),
    "stablehlo.power": _power,
    "stablehlo.negate": _unary(np.negative),
    "stablehlo.abs": _unary(np.abs),
    "stablehlo.sqrt": _unary(np.sqrt),
    "stablehlo.rsqrt": _unary(_rsqrt),
    "stablehlo.exponential": _unary(np.exp),
    "stablehlo.log": _unary(np.log),
    "stablehlo.compare": _compare,
    "stablehlo.select": _select,
    "func.call": lambda op, args, shape, dtype: None,  # handled by Evaluator
    # The shape operand is not read (see value_operands); dynamic results: see
    # Evaluator._dynamic_broadcast.
    "stablehlo.dynamic_broadcast_in_dim": _broadcast_in_dim,
}



# --- per-channel reduction ---------------------------------------------------


def varying_axis(array: np.ndarray) -> int | None:
    """The single axis along which a compact array has size > 1, if exactly one."""
    axes = [d for d, n in enumerate(array.shape) if n > 1]
    return axes[0] if len(axes) == 1 else None


def per_channel(const: Const, axis: int) -> np.ndarray | Refusal:
    """The constant as a vector along `axis` (length shape[axis]), or why not.

    Succeeds when the constant is a scalar or varies only along `axis`.
    """
    array = const.array
    channels = const.shape[axis]
    others = tuple(d for d in range(array.ndim) if d != axis and array.shape[d] > 1)
    if others:
        # Materialized constants may still be uniform along the other axes.
        first = array[tuple(slice(0, 1) if d in others else slice(None) for d in range(array.ndim))]
        if not np.array_equal(array, np.broadcast_to(first, array.shape), equal_nan=True):
            return Refusal(Code.AXIS, f"constant varies along axis {others[0]}, not only the "
                                      f"feature axis {axis}")
        array = first
    vector = array.reshape(-1) if array.shape[axis] > 1 else np.repeat(array.reshape(-1)[:1], channels)
    return vector.astype(np.float64, copy=False)


def map_axis_through_reshape(before: tuple[int, ...], after: tuple[int, ...], axis: int) -> int | None:
    """Where axis `axis` of `before` lands after a reshape to `after`, if it stays whole.

    The axis is identifiable when some axis of `after` has the same size and
    the same number of elements before it (row-major), e.g. the 4 in
    1x4x8x8 -> 1x1x4x8x8.
    """
    size = before[axis]
    prefix = math.prod(before[:axis])
    running = 1
    for d, n in enumerate(after):
        if running == prefix and n == size:
            return d
        running *= n
    return None


# --- parameters passed as arguments --------------------------------------------


def is_function_argument(value: ir.Value) -> bool:
    """An argument of a function's entry block (not of a loop body or branch)."""
    if not isinstance(value, ir.BlockArgument):
        try:
            value = ir.BlockArgument(value)
        except ValueError:
            return False
    parent = value.owner.owner
    return parent is not None and parent.operation.name == "func.func"


def describe_argument(value: ir.Value) -> str:
    """`function argument %arg3 ('params['mean']')` for the report."""
    arg: ir.BlockArgument = ir.BlockArgument(value)
    name = location_name(arg.location)
    return f"function argument %arg{arg.arg_number}" + (f" ({name})" if name else "")


BIND_HINT = "bind parameters first (--bind-params FILE.npz, or bnfold.jax_export.fold_exported)"
UNROLL_HINT = ("bnfold rewrites no value that changes per iteration; unroll the loop "
               "(jax.lax.scan(..., unroll=True), or a Python loop) to fold or quantize it")


def argument_refusal(argument: ir.Value, subject: str, code: Code = Code.PARAMETER) -> Refusal:
    """Why `subject` does not fold: it is the function argument `argument`.

    An argument of the entry function is a parameter the user can bind (`code`).
    An argument of a private function that a `stablehlo.while` body calls is a
    per-iteration value (`lax.scan` over stacked weights slices them in the loop):
    binding cannot help there, unrolling the loop does (`Code.LOOP`).
    """
    loop = _loop_caller(argument, depth=0)
    if loop is not None:
        return Refusal(Code.LOOP, f"{subject} is not constant: it is "
                                  f"{describe_argument(argument)} of private function @{loop}, "
                                  "which a stablehlo.while loop calls: "
                                  f"{UNROLL_HINT}")
    return Refusal(code, f"{subject} is not constant: it is {describe_argument(argument)}; {BIND_HINT}")


def _loop_caller(argument: ir.Value, depth: int) -> str | None:
    """The private function owning `argument` when a loop body calls it (directly, or
    through private functions that pass the argument on); None otherwise."""
    func = as_operation(ir.BlockArgument(argument).owner.owner)
    if func is None or not is_private(func) or depth > 8:
        return None
    name = symbol_name(func)
    module = func.parent
    if module is None:
        return None
    number = ir.BlockArgument(argument).arg_number
    for call in calls(functions_in(module.regions[0].blocks[0])):
        if callee_name(call) != name:
            continue
        if _inside_loop(call):
            return name
        passed = call.operands[number]
        if is_function_argument(passed) and _loop_caller(passed, depth + 1) is not None:
            return name
    return None


def _inside_loop(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.operation.name != "func.func":
        if parent.operation.name == "stablehlo.while":
            return True
        parent = parent.parent
    return False


def loop_refusal(value: ir.Value, subject: str, evaluator: Evaluator) -> Refusal | None:
    """Why `subject` does not fold when `value` is a slice of a loop's carried values.

    jax 0.11 lowers `lax.scan` over stacked weights with the body inline in the
    `stablehlo.while` body: each layer's kernel and statistics are
    `func.call @dynamic_index_in_dim(%iterArg, %i)` there, not arguments of a private
    function (`argument_refusal` finds those). Follows evaluable ops back from `value`;
    each source must be a block argument of a `stablehlo.while` region, or a call or
    `dynamic_slice` reading only those and constants. None when `value` depends on
    anything else (an activation computed in the body, a function argument).
    """
    owner = defining_op(value)
    if owner is None:
        if not _carried_by_loop(value):
            return None
    elif not _inside_loop(owner):  # only a loop body reads what a loop carries
        return None
    sources = _sources(value, evaluator, opaque=("func.call", "stablehlo.dynamic_slice"))
    if not sources or not all(_carried_by_loop(v) or _reads_only_carried(v, evaluator)
                               for v in sources):
        return None
    return Refusal(Code.LOOP, f"{subject} is not constant: it is sliced, per iteration, from "
                              f"the values a stablehlo.while loop carries; {UNROLL_HINT}")


def _reads_only_carried(value: ir.Value, evaluator: Evaluator) -> bool:
    """`value` is the result of an op (a call, a dynamic_slice) whose operands are all
    constants or what a loop carries."""
    owner = defining_op(value)
    return owner is not None and all(
        evaluator.constant(v) is not None or _carried_by_loop(v) for v in owner.operands)


def _carried_by_loop(value: ir.Value) -> bool:
    """A block argument of a `stablehlo.while` region (what the loop carries)."""
    if defining_op(value) is not None:
        return False
    parent = as_operation(ir.BlockArgument(value).owner.owner)
    return parent is not None and parent.name == "stablehlo.while"


def parameter_argument(value: ir.Value, evaluator: Evaluator) -> ir.Value | None:
    """The function argument a non-constant, parameter-like value is computed from.

    Follows evaluable ops (broadcasts, reshapes, rsqrt, arithmetic with
    constants): `bcast(reshape(%arg3))` is the parameter %arg3. Returns None
    when the value depends on anything else (an activation, a loop variable).
    """
    sources = _sources(value, evaluator)
    if sources is None or not all(is_function_argument(v) for v in sources):
        return None
    return sources[0] if sources else None


def _sources(value: ir.Value, evaluator: Evaluator, opaque: tuple[str, ...] = ()
             ) -> list[ir.Value] | None:
    """The non-constant values `value` is computed from through evaluable ops (broadcasts,
    reshapes, rsqrt, arithmetic with constants): block arguments, and results of the ops
    named in `opaque`, which the walk does not enter. None when it meets any other op
    (an activation's producer, a call) or takes more than 256 steps."""
    sources: list[ir.Value] = []
    stack = [value]
    for _ in range(256):
        if not stack:
            return sources
        current = stack.pop()
        if evaluator.constant(current) is not None:
            continue
        owner = defining_op(current)
        if owner is None or owner.name in opaque:
            sources.append(current)
        elif owner.name not in _EVALUATORS or owner.name == "func.call":
            return None
        else:
            stack.extend(value_operands(owner))
    return None
