"""Which ops commute with a positive per-channel scale, and the region they span.

Cross-layer equalization divides layer 1's output channels by `s > 0` and
multiplies the matching input channels of layer 2's kernel by `s`. That is
exact when every op between the two satisfies `f(x / s) == f(x) / s` per
channel once its constants are divided by `s` too. Before (ReLU6 as JAX and
torchax spell it):

    %y  = stablehlo.convolution(%x, %k1) ...
    %b  = stablehlo.add %y, %bias_b                   (bias: per channel)
    %r  = stablehlo.clamp %zero, %b, %six             (ReLU6)
    %z  = stablehlo.convolution(%r, %k2) ...

After (`bnfold.patterns.equalize` divides the kernel; this module finds the
region and its constants):

    %y  = stablehlo.convolution(%x, %k1_over_s) ...
    %b  = stablehlo.add %y, %bias_over_s_b
    %r  = stablehlo.clamp %zero_b, %b, %six_over_s_b  (a per-channel clamp to [0, 6/s])
    %z  = stablehlo.convolution(%r, %k2_times_s) ...

The ops that commute (after their constants are scaled):

    add subtract maximum minimum      with a constant, or two scaled values
    multiply divide                   by a constant (left as is)
    negate abs convert(float)         elementwise, no constant
    clamp                             constant bounds (ReLU6)
    compare select                    leaky ReLU / PReLU with a positive slope:
                                      select(x >= 0, x, x * a)
    reshape transpose broadcast_in_dim  keeping the channel axis whole
    pad                               zero padding, none on the channel axis
    reduce_window reduce              sum (init 0) or max/min (init -inf/+inf,
                                      or 0), never over channels (pooling)

Anything else stops the region: sigmoid, tanh, exp, gelu, swish and
hard-swish are not positively homogeneous (`f(x * s) != f(x) * s`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bnfold import producers
from bnfold.constants import Const, Evaluator, map_axis_through_reshape, per_channel
from bnfold.elements import is_float, ranked_type
from bnfold.graph import callee_name, defining_op, is_private, users
from bnfold.ir import format_location, ir, op_id

# Region ops beyond this many mean the walk has wandered into the rest of the
# network (an equalization region is an activation, a few layout ops, pooling).
MAX_REGION_OPS = 64

_BINARY = ("stablehlo.add", "stablehlo.subtract", "stablehlo.maximum", "stablehlo.minimum")
_UNARY = ("stablehlo.negate", "stablehlo.abs", "stablehlo.convert")
_NOT_HOMOGENEOUS = {
    "stablehlo.logistic": "sigmoid", "stablehlo.tanh": "tanh", "stablehlo.exponential": "exp",
    "stablehlo.log": "log", "stablehlo.sqrt": "sqrt", "stablehlo.rsqrt": "rsqrt",
    "stablehlo.power": "power", "stablehlo.erf": "erf (gelu)", "chlo.erf": "erf (gelu)",
    "stablehlo.sine": "sin", "stablehlo.cosine": "cos", "stablehlo.exponential_minus_one": "expm1",
    "stablehlo.log_plus_one": "log1p",
}
PREDICATE = -1  # the tag of a compare's result: not scaled, only selects with it


@dataclass(frozen=True)
class Edit:
    """Operand `operand` of `op` is a constant `vector` per channel along `axis`: divide it by s."""

    op: ir.Operation
    operand: int
    axis: int
    vector: np.ndarray  # float64, one value per channel

    @property
    def like(self) -> ir.Value:
        """A value of the shape the new operand must have (clamp bounds may be rank 0)."""
        return self.op.operands[1] if self.op.name == "stablehlo.clamp" else self.op.results[0]


@dataclass(frozen=True)
class Region:
    """The ops between layer 1's result and the one producer (`consumer`) that reads it."""

    consumer: ir.Operation
    operand: int  # the consumer's operand that carries the scaled channels
    axis: int  # the channel axis of that operand
    ops: tuple[ir.Operation, ...]  # in program order
    edits: tuple[Edit, ...]

    def describe(self) -> str:
        """`add, clamp` (the ops between the layers) or `nothing`."""
        names = [op.name.removeprefix("stablehlo.") for op in self.ops]
        return ", ".join(dict.fromkeys(names)) if names else "nothing"


@dataclass(frozen=True)
class Inline:
    """The region goes through `call`, a private helper: inline it and walk again."""

    call: ir.Operation


Walk = Region | Inline | str | None


def walk(start: ir.Value, axis: int, evaluator: Evaluator) -> Walk:
    """The region from `start` (scaled along `axis`) to the next producer.

    Returns None when no producer follows (nothing to pair with and nothing to
    explain), a reason when one follows but the region does not commute with
    the scale, or `Inline` when a private call is in the way.
    """
    closure = _closure(start)
    if isinstance(closure, Inline) or closure is None:
        return closure
    ops, consumers, stop = closure
    tags: dict[ir.Value, int] = {start: axis}
    edits: list[Edit] = []
    for op in ops:
        result = _rule(op, tags, evaluator)
        if isinstance(result, str):
            return f"{result} ({_where(op)})"
        tag, found = result
        tags[op.results[0]] = tag
        edits += found
    return stop or _consumer(consumers, tags, ops, edits)


def _closure(start: ir.Value
             ) -> tuple[list[ir.Operation], list[ir.Operation], str | None] | Inline | None:
    """The region ops in program order, the producers that read them, and where the
    region leaks out (a function result, another block), if it does."""
    block = defining_op(start).block  # type: ignore[union-attr]
    seen: dict[int, ir.Operation] = {}
    consumers: dict[int, ir.Operation] = {}
    stop: str | None = None
    queue = [start]
    while queue:
        for user in users(queue.pop()):
            key = op_id(user)
            if key in seen or key in consumers:
                continue
            if user.block != block:
                stop = stop or f"layer 1's output is read inside a region ({_where(user)})"
            elif producers.is_producer(user):
                consumers[key] = user
            elif user.name == "func.call":
                if _inlinable(user):
                    return Inline(user)
                stop = stop or f"layer 1's output goes to call @{callee_name(user)} ({_where(user)})"
            elif user.name in ("func.return", "stablehlo.return"):
                stop = stop or f"layer 1's output is also a function result ({_where(user)})"
            elif len(user.results) != 1:
                stop = stop or f"{user.name} has {len(user.results)} results ({_where(user)})"
            else:
                seen[key] = user
                if len(seen) > MAX_REGION_OPS:
                    return None  # the rest of the network, not an activation
                queue.append(user.results[0])
    if not consumers:
        return None
    order = {op_id(op): i for i, op in enumerate(block.operations)} if len(seen) > 1 else {}
    ops = sorted(seen.values(), key=lambda op: order.get(op_id(op), 0))
    return ops, list(consumers.values()), stop


def _inlinable(call: ir.Operation) -> bool:
    table = call.parent
    while table is not None and table.operation.name != "builtin.module":
        table = table.parent
    if table is None:
        return False
    callee = ir.SymbolTable(table.operation)[callee_name(call)]
    return is_private(callee.operation) and len(callee.regions[0].blocks) == 1


Rule = tuple[int, list[Edit]] | str


def _rule(op: ir.Operation, tags: dict[ir.Value, int], evaluator: Evaluator) -> Rule:
    """The channel axis of `op`'s result (or PREDICATE) and the constants to scale."""
    name = op.name
    if name in _NOT_HOMOGENEOUS:
        return (f"{_NOT_HOMOGENEOUS[name]} is not positively homogeneous "
                f"(f(x*s) != f(x)*s), so the layers cannot be equalized across it")
    if name in _BINARY or name == "stablehlo.compare":
        return _elementwise(op, range(2), tags, evaluator,
                            PREDICATE if name == "stablehlo.compare" else None)
    if name in ("stablehlo.multiply", "stablehlo.divide"):
        return _by_constant(op, tags, evaluator)
    if name == "stablehlo.clamp":
        return _elementwise(op, range(3), tags, evaluator, None, scaled_only=(1,))
    if name == "stablehlo.select":
        return _elementwise(op, (1, 2), tags, evaluator, None)
    if name in _UNARY:
        if name == "stablehlo.convert" and not all(
                is_float(ir.RankedTensorType(v.type).element_type)
                for v in (op.operands[0], op.results[0])):
            return "a convert to or from an integer type"
        return _scaled(op, 0, tags), []
    if name in ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim"):
        return _layout(op, tags)
    if name == "stablehlo.pad":
        return _pad(op, tags, evaluator)
    if name in ("stablehlo.reduce_window", "stablehlo.reduce"):
        return _reduction(op, tags, evaluator)
    return f"{name} does not commute with a per-channel scale"


def _scaled(op: ir.Operation, index: int, tags: dict[ir.Value, int]) -> int:
    return tags.get(op.operands[index], PREDICATE - 1)


def _elementwise(op: ir.Operation, indices: range | tuple[int, ...], tags: dict[ir.Value, int],
                 evaluator: Evaluator, result_tag: int | None,
                 scaled_only: tuple[int, ...] | None = None) -> Rule:
    """Each operand in `indices` is scaled (same axis) or a constant divided by s."""
    axes = {tags[op.operands[i]] for i in indices if op.operands[i] in tags}
    axes.discard(PREDICATE)
    if len(axes) != 1:
        return "mixes channels of layer 1's output along different axes" if axes else \
            "reads a predicate as a value"
    axis = axes.pop()
    edits: list[Edit] = []
    for i in indices:
        operand = op.operands[i]
        if operand in tags:
            if tags[operand] == PREDICATE or (scaled_only is not None and i not in scaled_only):
                return "uses layer 1's output in an unsupported position"
            continue
        const = evaluator.constant(operand)
        if const is None:
            return ("meets another branch that is not scaled with it (a residual add, or a "
                    "runtime value)")
        vector = _vector(const, axis, _channels(op, axis))
        if isinstance(vector, str):
            return vector
        edits.append(Edit(op, i, axis, vector))
    return (axis if result_tag is None else result_tag), edits


def _by_constant(op: ir.Operation, tags: dict[ir.Value, int], evaluator: Evaluator) -> Rule:
    """`x * c`, `c * x` and `x / c` commute with s; `x * x` and `c / x` do not."""
    a, b = op.operands[0] in tags, op.operands[1] in tags
    if a and b:
        return f"{op.name.removeprefix('stablehlo.')} of two scaled values is not homogeneous"
    if b and op.name == "stablehlo.divide":
        return "c / x is not homogeneous"
    index = 0 if a else 1
    if tags[op.operands[index]] == PREDICATE:
        return "reads a predicate as a value"
    if evaluator.constant(op.operands[1 - index]) is None:
        return "multiplies layer 1's output by a value that is not constant"
    return tags[op.operands[index]], []


def _layout(op: ir.Operation, tags: dict[ir.Value, int]) -> Rule:
    axis = _scaled(op, 0, tags)
    before = ranked_type(op.operands[0])
    after = ranked_type(op.results[0])
    if before is None or after is None or not (before.has_static_shape and after.has_static_shape):
        return f"{op.name} with a dynamic shape"
    name = op.name
    if name == "stablehlo.reshape":
        moved = map_axis_through_reshape(tuple(before.shape), tuple(after.shape), axis)
        if moved is None:
            return "a reshape merges or splits the channel axis"
        return moved, []
    if name == "stablehlo.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        return perm.index(axis), []
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    if after.shape[dims[axis]] != before.shape[axis]:
        return "a broadcast expands the channel axis"
    return dims[axis], []


def _pad(op: ir.Operation, tags: dict[ir.Value, int], evaluator: Evaluator) -> Rule:
    axis = _scaled(op, 0, tags)
    if op.operands[1] in tags:
        return "pads with a scaled value"
    value = evaluator.constant(op.operands[1])
    if value is None or not _zero_or_infinite(value.array):
        return "pads with a value other than zero (or an infinity)"
    for attr in ("edge_padding_low", "edge_padding_high", "interior_padding"):
        if list(ir.DenseI64ArrayAttr(op.attributes[attr]))[axis] != 0:
            return "pads the channel axis"
    return axis, []


def _reduction(op: ir.Operation, tags: dict[ir.Value, int], evaluator: Evaluator) -> Rule:
    """Sum or max/min pooling over axes other than the channels, with a neutral init."""
    if len(op.operands) != 2:
        return f"{op.name} over several values"
    axis = _scaled(op, 0, tags)
    body = [o for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[0].name not in ("stablehlo.add", "stablehlo.maximum",
                                               "stablehlo.minimum"):
        return f"{op.name} with a body other than add, maximum or minimum"
    init = evaluator.constant(op.operands[1])
    if init is None or not _zero_or_infinite(init.array):
        return f"{op.name} with an init value other than 0 or an infinity"
    if op.name == "stablehlo.reduce":
        dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        if axis in dims:
            return "reduces over the channel axis"
        return axis - sum(1 for d in dims if d < axis), []
    window = list(ir.DenseI64ArrayAttr(op.attributes["window_dimensions"]))
    strides = op.attributes["window_strides"] if "window_strides" in op.attributes else None
    padding = op.attributes["padding"] if "padding" in op.attributes else None
    if window[axis] != 1 or (strides is not None and list(ir.DenseI64ArrayAttr(strides))[axis] != 1):
        return "pools across channels"
    if padding is not None and np.any(np.asarray(ir.DenseIntElementsAttr(padding))[axis] != 0):
        return "pads the channel axis"
    return axis, []


def _zero_or_infinite(array: np.ndarray) -> bool:
    values = np.asarray(array, dtype=np.float64)
    return bool(np.all((values == 0) | np.isinf(values)))


def _channels(op: ir.Operation, axis: int) -> int:
    ty = ir.RankedTensorType(op.results[0].type) if op.name != "stablehlo.compare" else \
        ir.RankedTensorType(op.operands[0].type)
    return ty.shape[axis]


def _vector(const: Const, axis: int, channels: int) -> np.ndarray | str:
    if len(const.shape) == 0:  # a rank-0 clamp bound
        return np.full(channels, float(np.asarray(const.array).reshape(())), dtype=np.float64)
    vector = per_channel(const, axis)
    if isinstance(vector, str):
        return f"a constant that is not per channel: {vector}"
    return vector


def _consumer(consumers: list[ir.Operation], tags: dict[ir.Value, int],
              ops: list[ir.Operation], edits: list[Edit]) -> Region | str:
    if len(consumers) != 1:
        return (f"layer 1's output reaches {len(consumers)} producers (fan-out: "
                f"{', '.join(_where(c) for c in consumers)})")
    consumer = consumers[0]
    # `_closure` visited every user of every region value: each is a region op
    # or this consumer, so nothing else reads a scaled value.
    operands = [i for i, v in enumerate(consumer.operands) if v in tags]
    if len(operands) != 1:
        return f"{consumer.name} reads layer 1's output twice ({_where(consumer)})"
    index = operands[0]
    axis = tags[consumer.operands[index]]
    if axis == PREDICATE:
        return "the next layer reads a predicate"
    return Region(consumer, index, axis, tuple(ops), tuple(edits))


def _where(op: ir.Operation) -> str:
    where = format_location(op.location, None)
    return f"{op.name} at {'line ' + where[2:] if where.startswith('-:') else where}"

