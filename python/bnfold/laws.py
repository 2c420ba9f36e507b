"""One law per step: how each op commutes with a per-channel scale and shift.

Forward folding, cross-layer equalization, high-bias absorption and bias
correction all walk *through* ops between a value and a producer. This table
is the only place that says what such a walk may cross, and how:

    scale      op(x / s) == op(x) / s for a positive per-channel s, once the
               constants that meet x are divided by s too -- in the type of
               the scaled operand they meet (a compare's threshold in x's type,
               never in its i1 result's type); or a Refusal saying why not
    shift      op(x + t) == op(x) + t' for a per-channel t: where t' lies
               (axis) and what it is (t times a per-channel factor); or a Refusal
    precision  EXACT (no rounding of its own), ROUNDS (in its result type),
               NARROWS (a narrowing convert: the rounding must stay where it is;
               nothing may move a shift or scale across it)
    interval   per channel, [lo, hi] of the result from [lo, hi] of the
               operands: an equalization scale 1/s < 1 grows the activations
               and f16 overflows at 65504
    mean       per channel, E[result] from the operands' `Moments` (bias
               correction's E[x]): exact for every linear step (E[f(x)] =
               f(E[x])); through an activation only while the value is still
               Gaussian per channel (a folded batch norm's pre-activation
               through affine steps: the clipped normal's mean); or a Refusal

An op that is not in `LAWS` stops every walk with a Refusal naming it. When a
law is added here, the fuzzer's grammar (tests/regiongen.py) must generate the
op too; tests/test_laws.py checks both, and checks each law numerically.

A walk keeps, per value it has reached, the channel axis (or PREDICATE for a
comparison's result) and the interval; `Env` is how a law reads them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from bnfold import attributes, elements, precision
from bnfold.constants import Const, map_axis_through_reshape, per_channel
from bnfold.graph import defining_op
from bnfold.ir import ir
from bnfold.refusal import Code, Refusal

PREDICATE = -1  # the "axis" of a comparison's i1 result: it only selects


class Precision(enum.Enum):
    EXACT = "exact"
    ROUNDS = "rounds"
    NARROWS = "narrows"


class Interval(NamedTuple):
    """Per channel, every value of the original lies in [lo, hi] (float64, +-inf: unknown)."""

    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def unknown(cls, channels: int) -> Interval:
        return cls(np.full(channels, -np.inf), np.full(channels, np.inf))

    @classmethod
    def point(cls, values: np.ndarray) -> Interval:
        return cls(values.copy(), values.copy())

    def magnitude(self) -> np.ndarray:
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    def __or__(self, other: Interval) -> Interval:
        return Interval(np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi))

    def times(self, lo: np.ndarray, hi: np.ndarray) -> Interval:
        """The product with a factor in [lo, hi] per channel (0 * inf counts as 0)."""
        with np.errstate(invalid="ignore"):
            corners = np.stack([self.lo * lo, self.lo * hi, self.hi * lo, self.hi * hi])
        corners = np.nan_to_num(corners, nan=0.0, posinf=np.inf, neginf=-np.inf)
        return Interval(corners.min(axis=0), corners.max(axis=0))


class Edit(NamedTuple):
    """Operand `operand` of `op` is a constant that meets a scaled value: it becomes
    `vector / s` per channel along `axis`, rounded once to the type of `meets`."""

    op: ir.Operation
    operand: int
    axis: int
    vector: np.ndarray  # float64, one value per channel
    meets: ir.Value  # the scaled value it meets: the new constant takes its type


class Scaled(NamedTuple):
    """The op commutes with the scale: its result's channel axis, and the constants to divide."""

    axis: int
    edits: tuple[Edit, ...] = ()


class Shifted(NamedTuple):
    """A per-channel shift t of the operand reaches the result as `t * factor` on `axis`."""

    axis: int
    factor: np.ndarray | float = 1.0


class Env(Protocol):
    """What a law may ask about the walk that reached `op`."""

    def axis(self, value: ir.Value) -> int | None:
        """The channel axis of a value the walk reached (PREDICATE), or None."""

    def interval(self, value: ir.Value) -> Interval:
        """The interval of a value the walk reached, or of a constant."""

    def constant(self, value: ir.Value) -> Const | None: ...


class Normal(NamedTuple):
    """clip(N(mu, sigma^2), lo, hi) per channel: a folded batch norm's pre-activation
    (N(beta, gamma^2), unbounded) through per-channel affine steps and activations with
    constant bounds (ReLU, ReLU6 as clamp or as max then min). All float64."""

    mu: np.ndarray
    sigma: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, mu: np.ndarray, sigma: np.ndarray) -> Normal:
        mu = np.asarray(mu, dtype=np.float64)
        return cls(mu, np.abs(np.asarray(sigma, dtype=np.float64)), np.full_like(mu, -np.inf),
                   np.full_like(mu, np.inf))

    @property
    def unbounded(self) -> bool:
        return bool(np.all(np.isneginf(self.lo)) and np.all(np.isposinf(self.hi)))

    def mean(self) -> np.ndarray:
        return clipped_mean(self.mu, self.sigma, self.lo, self.hi)

    def affine(self, a: np.ndarray | float, b: np.ndarray | float) -> Normal:
        """a * value + b: a * clip(G, lo, hi) + b = clip(a G + b, ...), bounds swapped by a < 0."""
        a = np.broadcast_to(np.asarray(a, dtype=np.float64), self.mu.shape)
        b = np.broadcast_to(np.asarray(b, dtype=np.float64), self.mu.shape)
        with np.errstate(invalid="ignore"):
            ends = np.stack([a * self.lo + b, a * self.hi + b])
        ends = np.where(a == 0, b, ends)  # 0 * inf: the value is the constant b
        return Normal(a * self.mu + b, np.abs(a) * self.sigma, ends.min(axis=0),
                      ends.max(axis=0))

    def clip(self, lo: np.ndarray, hi: np.ndarray) -> Normal:
        """clip(clip(G, l, h), lo, hi) = clip(G, clip(l, lo, hi), clip(h, lo, hi))."""
        return Normal(self.mu, self.sigma, np.clip(self.lo, lo, hi), np.clip(self.hi, lo, hi))


class Moments(NamedTuple):
    """Per channel along `axis`: the mean of a value (over inputs and positions), and its
    distribution while it is a clipped normal (`normal`); None once a pool or a sum of two
    branches made it something else (its mean is still known).

    `modeled`: what the mean rests on. False: the batch norms' means carried by linear
    steps (sums, scales, layout, sum pools), exact whatever the distributions are, given
    the statistics. True: an activation's mean (ReLU, ReLU6, |x|, a thresholded select),
    which needs the distribution itself: exact for the normal model of a batch norm's
    pre-activation, approximate as far as the data is not normal."""

    axis: int
    mean: np.ndarray
    normal: Normal | None = None
    modeled: bool = False

    @classmethod
    def of(cls, axis: int, normal: Normal) -> Moments:
        return cls(axis, normal.mean(), normal, not normal.unbounded)


class MeanEnv(Protocol):
    """What a mean law may ask: the moments of an operand (computed on demand, walking back
    to the folded batch norms; a Refusal says why they are unknown), and constants."""

    def moments(self, value: ir.Value) -> Moments | Refusal | None:
        """The moments of a value (None for a constant)."""

    def constant(self, value: ir.Value) -> Const | None: ...


class Law(NamedTuple):
    """How one op kind commutes with a per-channel scale and shift (see the module doc)."""

    summary: str
    scale: Callable[[ir.Operation, Env], Scaled | Refusal]
    shift: Callable[[ir.Operation, Env], Shifted | Refusal]
    precision: Callable[[ir.Operation], Precision]
    # None for a comparison: its result is a predicate, not a value with a range
    interval: Callable[[ir.Operation, Env], Interval] | None
    mean: Callable[[ir.Operation, MeanEnv], Moments | Refusal]


def law_of(op: ir.Operation) -> Law | Refusal:
    """The law of `op`'s kind, or a refusal naming the op (not homogeneous, or unknown)."""
    name = op.name
    found = LAWS.get(name)
    if found is not None:
        return found
    if name in NOT_HOMOGENEOUS:
        return Refusal(Code.NOT_HOMOGENEOUS,
                       f"{NOT_HOMOGENEOUS[name]} is not positively homogeneous "
                       f"(f(x*s) != f(x)*s)")
    if name == "func.call":
        return Refusal(Code.NO_LAW, f"{name} @{ir.FlatSymbolRefAttr(op.attributes['callee']).value}"
                                    " (a private helper is inlined first; this one is not)")
    return Refusal(Code.NO_LAW, f"no law for {name} (bnfold does not know how it commutes "
                                f"with a per-channel scale)")


# --- helpers ---------------------------------------------------------------------------


def _channels(value: ir.Value, axis: int) -> int:
    return ir.RankedTensorType(value.type).shape[axis]


def vector(const: Const, axis: int, channels: int) -> np.ndarray | Refusal:
    """A constant as one float64 value per channel (a rank-0 constant repeats)."""
    if len(const.shape) == 0:
        return np.full(channels, float(np.asarray(const.array).reshape(())), dtype=np.float64)
    found = per_channel(const, axis)
    if isinstance(found, Refusal):
        return Refusal(Code.AXIS, f"a constant that is not per channel: {found.message}")
    return found


def _const_interval(const: Const, axis: int, channels: int) -> Interval:
    """Per channel min and max of a constant (any shape that broadcasts)."""
    array = np.broadcast_to(np.asarray(const.array, dtype=np.float64),
                            tuple(1 if n < 0 else n for n in const.array.shape))
    if array.ndim == 0:
        return Interval.point(np.full(channels, float(array)))
    others = tuple(d for d in range(array.ndim) if d != axis)
    lo, hi = array.min(axis=others), array.max(axis=others)
    return Interval(np.broadcast_to(lo, channels).copy(), np.broadcast_to(hi, channels).copy())


def _operand_interval(op: ir.Operation, index: int, axis: int, env: Env) -> Interval:
    value = op.operands[index]
    if env.axis(value) is not None:
        return env.interval(value)
    const = env.constant(value)
    channels = _channels(op.results[0], axis)
    if const is None:
        return Interval.unknown(channels)
    return _const_interval(const, axis, channels)


def _scaled_axis(op: ir.Operation, indices: tuple[int, ...], env: Env) -> int | Refusal:
    """The one channel axis the scaled operands among `indices` share."""
    axes = {env.axis(op.operands[i]) for i in indices} - {None}
    if PREDICATE in axes:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} reads a comparison result as a value")
    if len(axes) != 1:
        return Refusal(Code.AXIS, f"{_short(op)} mixes channels of layer 1's output along "
                                  "different axes")
    axis = axes.pop()
    assert axis is not None
    return axis


def _short(op: ir.Operation) -> str:
    return op.name.removeprefix("stablehlo.")


def _rounds(op: ir.Operation) -> Precision:
    return Precision.ROUNDS


def _exact(op: ir.Operation) -> Precision:
    return Precision.EXACT


def _no_shift(why: str) -> Callable[[ir.Operation, Env], Shifted | Refusal]:
    def law(op: ir.Operation, env: Env) -> Shifted | Refusal:
        return Refusal(Code.ROLE, f"a shift does not pass {_short(op)}: {why}")
    return law


def _first_scaled(op: ir.Operation, env: Env) -> int:
    """The index of the first operand the walk reached."""
    return next(i for i, v in enumerate(op.operands) if env.axis(v) is not None)


# --- elementwise with constants: add subtract maximum minimum clamp compare select ------


def _with_constants(op: ir.Operation, indices: tuple[int, ...], env: Env, *,
                    bounds_only: tuple[int, ...] = ()) -> Scaled | Refusal:
    """Operands in `indices` are scaled (one axis) or constants, which get divided by s.
    An operand in `bounds_only` must be a constant (a clamp's bounds)."""
    axis = _scaled_axis(op, indices, env)
    if isinstance(axis, Refusal):
        return axis
    scaled = next(op.operands[i] for i in indices if env.axis(op.operands[i]) is not None)
    edits: list[Edit] = []
    for i in indices:
        operand = op.operands[i]
        if env.axis(operand) is not None:
            if i in bounds_only:
                return Refusal(Code.NOT_HOMOGENEOUS,
                               f"{_short(op)} uses layer 1's output as a bound")
            continue
        const = env.constant(operand)
        if const is None:
            return Refusal(Code.FAN_OUT, f"{_short(op)} meets another branch that is not scaled "
                                         "with it (a residual add, or a runtime value)")
        found = vector(const, axis, _channels(scaled, axis))
        if isinstance(found, Refusal):
            return found
        edits.append(Edit(op, i, axis, found, scaled))
    return Scaled(axis, tuple(edits))


def _binary_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    return _with_constants(op, (0, 1), env)


def _add_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    index = _first_scaled(op, env)
    if env.axis(op.operands[1 - index]) is not None:
        return Refusal(Code.ROLE, f"{_short(op)} of two shifted values")
    negate = op.name == "stablehlo.subtract" and index == 1
    axis = env.axis(op.operands[index])
    assert axis is not None
    return Shifted(axis, -1.0 if negate else 1.0)


def _add_interval(op: ir.Operation, env: Env) -> Interval:
    axis = _axis_of(op, env)
    a, b = (_operand_interval(op, i, axis, env) for i in (0, 1))
    if op.name == "stablehlo.subtract":
        b = Interval(-b.hi, -b.lo)
    return Interval(a.lo + b.lo, a.hi + b.hi)


def _axis_of(op: ir.Operation, env: Env) -> int:
    axis = env.axis(op.operands[_first_scaled(op, env)])
    return 0 if axis is None or axis == PREDICATE else axis


def _extremum_interval(op: ir.Operation, env: Env) -> Interval:
    axis = _axis_of(op, env)
    a, b = (_operand_interval(op, i, axis, env) for i in (0, 1))
    pick = np.maximum if op.name == "stablehlo.maximum" else np.minimum
    return Interval(pick(a.lo, b.lo), pick(a.hi, b.hi))


def _clamp_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    return _with_constants(op, (0, 1, 2), env, bounds_only=(0, 2))


def _clamp_interval(op: ir.Operation, env: Env) -> Interval:
    axis = env.axis(op.operands[1])
    axis = 0 if axis is None else axis
    lo, x, hi = (_operand_interval(op, i, axis, env) for i in range(3))
    return Interval(np.clip(x.lo, lo.lo, hi.hi), np.clip(x.hi, lo.lo, hi.hi))


def _compare_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    found = _with_constants(op, (0, 1), env)
    if isinstance(found, Refusal):
        return found
    return Scaled(PREDICATE, found.edits)


def _select_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    if env.axis(op.operands[0]) not in (None, PREDICATE):
        return Refusal(Code.NOT_HOMOGENEOUS, "select by a scaled value")
    return _with_constants(op, (1, 2), env)


def _select_interval(op: ir.Operation, env: Env) -> Interval:
    axis = env.axis(op.operands[1])
    axis = env.axis(op.operands[2]) if axis is None else axis
    axis = 0 if axis is None else axis
    return _operand_interval(op, 1, axis, env) | _operand_interval(op, 2, axis, env)


# --- multiply, divide, negate, abs, convert -------------------------------------------


def _by_constant_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    """`x * c`, `c * x`, `x / c` commute with s (c is left as is); `x * x`, `c / x` do not."""
    a, b = (env.axis(v) is not None for v in op.operands)
    name = _short(op)
    if a and b:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{name} of two scaled values is not homogeneous")
    if b and op.name == "stablehlo.divide":
        return Refusal(Code.NOT_HOMOGENEOUS, "c / x is not homogeneous")
    index = 0 if a else 1
    axis = env.axis(op.operands[index])
    if axis == PREDICATE:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{name} reads a comparison result as a value")
    if env.constant(op.operands[1 - index]) is None:
        return Refusal(Code.NOT_CONSTANT, f"{name} by a value that is not constant "
                                          "(a gate computed at run time)")
    assert axis is not None
    return Scaled(axis)


def _factor(op: ir.Operation, env: Env) -> Interval | Refusal:
    """The per-channel interval of the constant factor of a multiply or divide."""
    index = _first_scaled(op, env)
    axis = _axis_of(op, env)
    const = env.constant(op.operands[1 - index])
    if const is None:
        return Refusal(Code.NOT_CONSTANT, "not a constant factor")
    found = _const_interval(const, axis, _channels(op.results[0], axis))
    if op.name == "stablehlo.divide":
        if np.any((found.lo <= 0) & (found.hi >= 0)):
            return Interval.unknown(found.lo.size)
        return Interval(1.0 / found.hi, 1.0 / found.lo)
    return found


def _by_constant_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    index = _first_scaled(op, env)
    axis = env.axis(op.operands[index])
    const = env.constant(op.operands[1 - index])
    if const is None or axis is None:
        return Refusal(Code.NOT_CONSTANT, f"{_short(op)} by a value that is not constant")
    found = vector(const, axis, _channels(op.results[0], axis))
    if isinstance(found, Refusal):
        return Refusal(Code.ROLE, f"a shift does not pass {_short(op)} by a constant that is not "
                                  "per channel")
    if op.name == "stablehlo.divide":
        if np.any(found == 0):
            return Refusal(Code.ROLE, "division by zero")
        return Shifted(axis, 1.0 / found)
    return Shifted(axis, found)


def _by_constant_interval(op: ir.Operation, env: Env) -> Interval:
    x = env.interval(op.operands[_first_scaled(op, env)])
    factor = _factor(op, env)
    if isinstance(factor, Refusal):
        return Interval.unknown(x.lo.size)
    return x.times(factor.lo, factor.hi)


def _unary_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    if axis == PREDICATE:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} of a comparison result")
    if op.name == "stablehlo.convert" and not _float_convert(op):
        return Refusal(Code.NOT_HOMOGENEOUS, "a convert to or from an integer type")
    return Scaled(axis)


def _float_convert(op: ir.Operation) -> bool:
    return all(elements.is_float(ir.RankedTensorType(v.type).element_type)
               for v in (op.operands[0], op.results[0]))


def _negate_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    return Shifted(axis, -1.0)


def _same_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    if op.name == "stablehlo.convert" and not _float_convert(op):
        return Refusal(Code.ROLE, "a shift does not pass a convert to an integer type")
    return Shifted(axis)


def _negate_interval(op: ir.Operation, env: Env) -> Interval:
    x = env.interval(op.operands[0])
    return Interval(-x.hi, -x.lo)


def _abs_interval(op: ir.Operation, env: Env) -> Interval:
    x = env.interval(op.operands[0])
    straddles = (x.lo < 0) & (x.hi > 0)
    lo = np.where(straddles, 0.0, np.minimum(np.abs(x.lo), np.abs(x.hi)))
    return Interval(lo, x.magnitude())


def _same_interval(op: ir.Operation, env: Env) -> Interval:
    return env.interval(op.operands[0])


def _convert_precision(op: ir.Operation) -> Precision:
    if not _float_convert(op):
        return Precision.ROUNDS
    source, target = (elements.numpy_dtype(ir.RankedTensorType(v.type).element_type)
                      for v in (op.operands[0], op.results[0]))
    if source is None or target is None:
        return Precision.ROUNDS
    if precision.significand_bits(target) < precision.significand_bits(source) or \
            precision.largest(target) < precision.largest(source):
        return Precision.NARROWS
    return Precision.EXACT


# --- layout: reshape transpose broadcast_in_dim pad ----------------------------------------


def _layout_axis(op: ir.Operation, axis: int) -> int | Refusal:
    before = elements.ranked_type(op.operands[0])
    after = elements.ranked_type(op.results[0])
    name = _short(op)
    if before is None or after is None or not (before.has_static_shape and after.has_static_shape):
        return Refusal(Code.SYMBOLIC, f"{name} with a dynamic shape")
    if op.name == "stablehlo.reshape":
        moved = map_axis_through_reshape(tuple(before.shape), tuple(after.shape), axis)
        if moved is None:
            return Refusal(Code.AXIS, "a reshape merges or splits the channel axis")
        return moved
    if op.name == "stablehlo.transpose":
        return attributes.permutation(op).index(axis)
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    if after.shape[dims[axis]] != before.shape[axis]:
        return Refusal(Code.AXIS, "a broadcast expands the channel axis")
    return dims[axis]


def _layout_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    if axis == PREDICATE:
        return Scaled(PREDICATE) if op.name != "stablehlo.broadcast_in_dim" else \
            Refusal(Code.NOT_HOMOGENEOUS, "a broadcast of a comparison result")
    moved = _layout_axis(op, axis)
    return moved if isinstance(moved, Refusal) else Scaled(moved)


def _layout_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    moved = _layout_axis(op, axis)
    return moved if isinstance(moved, Refusal) else Shifted(moved)


def _pad_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    if env.axis(op.operands[1]) is not None:
        return Refusal(Code.NOT_HOMOGENEOUS, "pads with a scaled value")
    value = env.constant(op.operands[1])
    if value is None or not _zero_or_infinite(value.array):
        return Refusal(Code.NOT_HOMOGENEOUS, "pads with a value other than zero (or an infinity): "
                                             "v / s != v")
    if _pads_axis(op, axis):
        return Refusal(Code.AXIS, "pads the channel axis")
    return Scaled(axis)


def _pads_axis(op: ir.Operation, axis: int) -> bool:
    rank = ir.RankedTensorType(op.operands[0].type).rank
    return any(attributes.ints(op, name, default=0, rank=rank)[axis] != 0
               for name in ("edge_padding_low", "edge_padding_high", "interior_padding"))


def _pad_interval(op: ir.Operation, env: Env) -> Interval:
    x = env.interval(op.operands[0])
    const = env.constant(op.operands[1])
    if const is None:
        return Interval.unknown(x.lo.size)
    value = float(np.asarray(const.array, dtype=np.float64).reshape(-1)[0])
    return x | Interval.point(np.full(x.lo.size, value))


def _zero_or_infinite(array: np.ndarray) -> bool:
    values = np.asarray(array, dtype=np.float64)
    return bool(np.all((values == 0) | np.isinf(values)))


# --- pooling: reduce_window and reduce -------------------------------------------------


class Pool(NamedTuple):
    """A reduce_window or reduce over non-channel axes, as the laws need it."""

    kind: str  # "add", "maximum" or "minimum"
    init: float
    taps: int  # window (or reduced) elements
    padded: bool  # some windows read padding or base-dilation holes (the init value)
    empty_windows: bool  # some window reads nothing but padding


def pool(op: ir.Operation, axis: int, env: Env) -> Pool | Refusal:
    """The pooling `op` is, along every axis but `axis` (the channels), or why not."""
    name = _short(op)
    if len(op.operands) != 2 or len(op.results) != 1:
        return Refusal(Code.NO_LAW, f"{name} over several values")
    body = list(op.regions[0].blocks[0].operations)
    arguments = list(op.regions[0].blocks[0].arguments)
    if len(body) != 2 or body[0].name not in ("stablehlo.add", "stablehlo.maximum",
                                               "stablehlo.minimum") or \
            set(body[0].operands) != set(arguments) or body[1].operands[0] != body[0].results[0]:
        return Refusal(Code.NO_LAW, f"{name} with a body other than add, maximum or minimum of "
                                    "its arguments")
    kind = body[0].name.removeprefix("stablehlo.")
    init = env.constant(op.operands[1])
    neutral = {"add": (0.0,), "maximum": (-np.inf, 0.0), "minimum": (np.inf, 0.0)}[kind]
    if init is None or np.asarray(init.array).size != 1 or \
            float(np.asarray(init.array, dtype=np.float64).reshape(())) not in neutral:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{name} ({kind}) with an init value that is not "
                                             f"{' or '.join(str(v) for v in neutral)}")
    value = float(np.asarray(init.array, dtype=np.float64).reshape(()))
    shape = ir.RankedTensorType(op.operands[0].type).shape
    rank = len(shape)
    if op.name == "stablehlo.reduce":
        dims = attributes.ints(op, "dimensions", default=0, rank=0)
        if axis in dims:
            return Refusal(Code.AXIS, "reduces over the channel axis")
        return Pool(kind, value, math.prod(shape[d] for d in dims), False, False)
    window = attributes.ints(op, "window_dimensions", default=1, rank=rank)
    per_axis = {name: attributes.ints(op, name, default=1, rank=rank)
                for name in ("window_strides", "base_dilations", "window_dilations")}
    pads = attributes.padding(op, rank)
    if window[axis] != 1 or any(v[axis] != 1 for v in per_axis.values()) or \
            np.any(pads[axis] != 0):
        return Refusal(Code.AXIS, "pools across channels (its window, stride, dilation or "
                                  "padding touches the channel axis)")
    padded = bool(np.any(pads > 0)) or any(d != 1 for d in per_axis["base_dilations"])
    empty = padded and _has_empty_windows(shape, window, per_axis, pads)
    return Pool(kind, value, math.prod(window), padded, empty)


def _has_empty_windows(shape: list[int], window: tuple[int, ...], per_axis: dict[str, tuple[int, ...]],
                       pads: np.ndarray) -> bool:
    """Whether some output window reads only padding or base-dilation holes."""
    for d, size in enumerate(shape):
        base = per_axis["base_dilations"][d]
        dilated = (size - 1) * base + 1
        padded = dilated + int(pads[d][0]) + int(pads[d][1])
        span = (window[d] - 1) * per_axis["window_dilations"][d] + 1
        count = (padded - span) // per_axis["window_strides"][d] + 1 if padded >= span else 0
        for o in range(max(count, 0)):
            taps = [o * per_axis["window_strides"][d] + k * per_axis["window_dilations"][d]
                    - int(pads[d][0]) for k in range(window[d])]
            if not any(0 <= q < dilated and q % base == 0 for q in taps):
                return True
    return False


def _pool_axis(op: ir.Operation, axis: int) -> int:
    if op.name == "stablehlo.reduce":
        dims = attributes.ints(op, "dimensions", default=0, rank=0)
        return axis - sum(1 for d in dims if d < axis)
    return axis


def _pool_scale(op: ir.Operation, env: Env) -> Scaled | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    if env.axis(op.operands[1]) is not None:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} with a scaled init value")
    found = pool(op, axis, env)
    if isinstance(found, Refusal):
        return found
    return Scaled(_pool_axis(op, axis))


def _pool_shift(op: ir.Operation, env: Env) -> Shifted | Refusal:
    axis = env.axis(op.operands[0])
    assert axis is not None
    found = pool(op, axis, env)
    if isinstance(found, Refusal):
        return found
    out = _pool_axis(op, axis)
    if found.kind == "add":
        if found.padded:
            return Refusal(Code.PADDING, "a shift does not pass a sum pool that reads padding "
                                         "(border windows count fewer taps)")
        return Shifted(out, float(found.taps))
    if found.init not in (-np.inf, np.inf) or found.empty_windows:
        return Refusal(Code.ROLE, "a shift does not pass a max/min pool whose init value or "
                                  "empty windows are not shifted with it")
    return Shifted(out)


def _pool_interval(op: ir.Operation, env: Env) -> Interval:
    x = env.interval(op.operands[0])
    axis = env.axis(op.operands[0])
    found = pool(op, 0 if axis is None else axis, env)
    if isinstance(found, Refusal):
        return Interval.unknown(x.lo.size)
    if found.kind == "add":
        lo, hi = x.lo * found.taps, x.hi * found.taps
        if found.padded:  # border windows sum fewer values (zeros for the rest)
            lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
        return Interval(lo, hi)
    if found.empty_windows or found.init == 0.0:
        return x | Interval.point(np.full(x.lo.size, found.init))
    return x


def _pool_precision(op: ir.Operation) -> Precision:
    body = list(op.regions[0].blocks[0].operations)
    return Precision.ROUNDS if body and body[0].name == "stablehlo.add" else Precision.EXACT


# --- means (bias correction) ----------------------------------------------------------------
#
# E[f(x)] = f(E[x]) for every linear step, whatever x's distribution; an activation needs
# the distribution itself, which is known only while the value is Gaussian per channel.


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))


def _normal_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def clipped_mean(mean: np.ndarray, spread: np.ndarray, lo: np.ndarray, hi: np.ndarray
                 ) -> np.ndarray:
    """E[clip(X, lo, hi)] for X ~ N(mean, spread^2) per channel, in float64 (lo, hi may be
    infinite; a zero spread clips the mean itself):

        lo Phi(a) + mean (Phi(b) - Phi(a)) + spread (phi(a) - phi(b)) + hi (1 - Phi(b)),
        a = (lo - mean) / spread,  b = (hi - mean) / spread
    """
    mean, spread, lo, hi = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                                 for v in (mean, spread, lo, hi)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.where(spread > 0, (lo - mean) / spread, np.where(lo <= mean, -np.inf, np.inf))
        b = np.where(spread > 0, (hi - mean) / spread, np.where(hi >= mean, np.inf, -np.inf))
        below, above = _normal_cdf(a), 1.0 - _normal_cdf(b)
        value = mean * (1.0 - below - above) + spread * (_normal_pdf(a) - _normal_pdf(b))
        value = value + np.where(below > 0, lo * below, 0.0) + np.where(above > 0, hi * above, 0.0)
    return np.where(spread > 0, value, np.clip(mean, lo, hi))


def partial_mean(mean: np.ndarray, spread: np.ndarray, threshold: np.ndarray, above: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(E[X; X > t], P(X > t)) for X ~ N(mean, spread^2) (or X < t when not `above`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread > 0, (threshold - mean) / np.where(spread > 0, spread, 1.0),
                     np.where(threshold < mean, -np.inf, np.inf))
    cdf, pdf = _normal_cdf(z), _normal_pdf(z)
    if above:
        return mean * (1.0 - cdf) + spread * pdf, 1.0 - cdf
    return mean * cdf - spread * pdf, cdf


def _operand_moments(op: ir.Operation, env: MeanEnv
                     ) -> list[Moments | np.ndarray] | Refusal:
    """Each operand's moments, or a constant operand as a vector along the walked axis."""
    found: list[Moments | Refusal | None] = [env.moments(v) for v in op.operands]
    for item in found:
        if isinstance(item, Refusal):
            return item
    reached = [m for m in found if isinstance(m, Moments)]
    if not reached:
        return Refusal(Code.NO_STATISTICS, f"{_short(op)} of constants only")
    axis = reached[0].axis
    if any(m.axis != axis for m in reached):
        return Refusal(Code.AXIS, f"{_short(op)} meets channels along different axes")
    channels = _channels(op.results[0], axis) if ir.RankedTensorType(op.results[0].type).rank \
        else reached[0].mean.size
    operands: list[Moments | np.ndarray] = []
    for value, item in zip(op.operands, found, strict=True):
        if isinstance(item, Moments):
            operands.append(item)
            continue
        const = env.constant(value)
        if const is None:
            return Refusal(Code.NO_STATISTICS, f"{_short(op)} reads a value whose mean is unknown")
        vec = vector(const, axis, channels)
        if isinstance(vec, Refusal):
            return vec
        operands.append(vec)
    return operands


def _normal(op: ir.Operation, x: Moments) -> Normal | Refusal:
    if x.normal is None:
        return Refusal(Code.NO_STATISTICS, f"the mean after {_short(op)} needs its input's "
                                           "distribution, which is no longer the batch norm's "
                                           "(clipped) normal (a pool or a sum came first)")
    return x.normal


def _add_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """E[x + y] = E[x] + E[y]; a clipped normal stays one when the rest is constant."""
    found = _operand_moments(op, env)
    if isinstance(found, Refusal):
        return found
    a, b = found
    sign = -1.0 if op.name == "stablehlo.subtract" else 1.0
    if op.operands[0] == op.operands[1]:  # x + x, x - x: one value, twice
        assert isinstance(a, Moments)
        if a.normal is not None:
            return Moments.of(a.axis, a.normal.affine(1.0 + sign, 0.0))
        return Moments(a.axis, a.mean * (1.0 + sign), modeled=a.modeled)
    if isinstance(a, Moments) and isinstance(b, Moments):
        return Moments(a.axis, a.mean + sign * b.mean, modeled=a.modeled or b.modeled)
    if isinstance(a, Moments):
        assert isinstance(b, np.ndarray)
        return _affine(a, 1.0, sign * b)
    assert isinstance(b, Moments) and isinstance(a, np.ndarray)
    return _affine(b, sign, a)


def _affine(x: Moments, a: np.ndarray | float, b: np.ndarray | float) -> Moments:
    if x.normal is not None:
        return Moments.of(x.axis, x.normal.affine(a, b))
    return Moments(x.axis, np.asarray(a) * x.mean + b, modeled=x.modeled)


def _extremum_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """max(x, c) / min(x, c) of a clipped normal x: clips it further."""
    found = _operand_moments(op, env)
    if isinstance(found, Refusal):
        return found
    reached = [v for v in found if isinstance(v, Moments)]
    if len(reached) != 1:
        return Refusal(Code.NO_STATISTICS, f"{_short(op)} of two values: the mean of the "
                                           "larger one is not modeled")
    x = reached[0]
    bound = next(v for v in found if not isinstance(v, Moments))
    normal = _normal(op, x)
    if isinstance(normal, Refusal):
        return normal
    inf = np.full_like(bound, np.inf)
    lo, hi = (bound, inf) if op.name == "stablehlo.maximum" else (-inf, bound)
    return Moments.of(x.axis, normal.clip(lo, hi))


def _clamp_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """clamp(lo, x, hi) of a clipped normal x (ReLU6): clips it further."""
    found = _operand_moments(op, env)
    if isinstance(found, Refusal):
        return found
    lo, x, hi = found
    if not isinstance(x, Moments) or isinstance(lo, Moments) or isinstance(hi, Moments):
        return Refusal(Code.NO_STATISTICS, "clamp with bounds that are not constant")
    normal = _normal(op, x)
    if isinstance(normal, Refusal):
        return normal
    return Moments.of(x.axis, normal.clip(lo, hi))


def _compare_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    return Refusal(Code.NOT_HOMOGENEOUS, "a comparison result read as a value")


_ABOVE = {"GT": True, "GE": True, "LT": False, "LE": False}


def _select_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """select(x > t, a, b) of a normal x (a thresholded ReLU), where each of a and b is x
    or a constant: E[a; x > t] + E[b; x <= t]."""
    compare = defining_op(op.operands[0])
    if compare is None or compare.name != "stablehlo.compare" or \
            attributes.comparison_direction(compare) not in _ABOVE:
        return Refusal(Code.NO_STATISTICS, "select by a predicate other than x > t or x < t")
    above = _ABOVE[attributes.comparison_direction(compare)]
    reached = [i for i, v in enumerate(compare.operands) if env.constant(v) is None]
    if len(reached) != 1:
        return Refusal(Code.NO_STATISTICS, "select by a comparison of two values")
    x_value = compare.operands[reached[0]]
    if reached[0] == 1:  # t > x is x < t
        above = not above
    x = env.moments(x_value)
    if not isinstance(x, Moments):
        return x if isinstance(x, Refusal) else Refusal(Code.NO_STATISTICS, "select of constants")
    normal = _normal(op, x)
    if isinstance(normal, Refusal):
        return normal
    if not normal.unbounded:
        return Refusal(Code.NO_STATISTICS, "select of a value an activation already bounded")
    channels = x.mean.size
    const = env.constant(compare.operands[1 - reached[0]])
    assert const is not None
    threshold = vector(const, x.axis, channels)
    if isinstance(threshold, Refusal):
        return threshold
    mean = np.zeros(channels)
    for value, taken in ((op.operands[1], above), (op.operands[2], not above)):
        if value == x_value:
            part, _ = partial_mean(normal.mu, normal.sigma, threshold, taken)
        else:
            branch = env.constant(value)
            if branch is None:
                return Refusal(Code.NO_STATISTICS, "select of a value other than the compared "
                                                   "one and constants (its mean is not modeled)")
            c = vector(branch, x.axis, channels)
            if isinstance(c, Refusal):
                return c
            _, chance = partial_mean(normal.mu, normal.sigma, threshold, taken)
            part = c * chance
        mean = mean + part
    return Moments(x.axis, mean, modeled=True)


def _by_constant_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """E[x * c] = E[x] c and E[x / c] = E[x] / c for a per-channel constant c."""
    found = _operand_moments(op, env)
    if isinstance(found, Refusal):
        return found
    a, b = found
    if isinstance(a, Moments) == isinstance(b, Moments):
        return Refusal(Code.NO_STATISTICS, f"{_short(op)} of two values: E[xy] needs their "
                                           "correlation")
    if op.name == "stablehlo.divide" and isinstance(b, Moments):
        return Refusal(Code.NO_STATISTICS, "c / x: its mean is not E[c] / E[x]")
    x, c = (a, b) if isinstance(a, Moments) else (b, a)
    assert isinstance(x, Moments) and isinstance(c, np.ndarray)
    return _affine(x, 1.0 / c if op.name == "stablehlo.divide" else c, 0.0)


def _negate_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    x = env.moments(op.operands[0])
    if not isinstance(x, Moments):
        return x or Refusal(Code.NO_STATISTICS, "negate of a constant")
    return _affine(x, -1.0, 0.0)


def _abs_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """|x| of a clipped normal: E[max(x, 0)] + E[max(-x, 0)]."""
    x = env.moments(op.operands[0])
    if not isinstance(x, Moments):
        return x or Refusal(Code.NO_STATISTICS, "abs of a constant")
    normal = _normal(op, x)
    if isinstance(normal, Refusal):
        return normal
    zero, inf = np.zeros_like(x.mean), np.full_like(x.mean, np.inf)
    positive = normal.clip(zero, inf).mean()
    negative = normal.affine(-1.0, 0.0).clip(zero, inf).mean()
    return Moments(x.axis, positive + negative, modeled=True)


def _convert_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """A float convert keeps the mean (it rounds each value by at most half an ulp)."""
    if not _float_convert(op):
        return Refusal(Code.NO_STATISTICS, "a convert to or from an integer type")
    x = env.moments(op.operands[0])
    return x if x is not None else Refusal(Code.NO_STATISTICS, "convert of a constant")


def _layout_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    x = env.moments(op.operands[0])
    if not isinstance(x, Moments):
        return x or Refusal(Code.NO_STATISTICS, f"{_short(op)} of a constant")
    moved = _layout_axis(op, x.axis)
    if isinstance(moved, Refusal):
        return moved
    return Moments(moved, x.mean, x.normal, x.modeled)


def _pad_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    return Refusal(Code.PADDING, "a pad makes the mean vary near the borders; its share is "
                                 "modeled only when the layer reads the pad directly")


def _pool_mean(op: ir.Operation, env: MeanEnv) -> Moments | Refusal:
    """A sum over a window (or reduced axes) without padding: E[x] times the taps."""
    x = env.moments(op.operands[0])
    if not isinstance(x, Moments):
        return x or Refusal(Code.NO_STATISTICS, f"{_short(op)} of a constant")

    channel_axis = x.axis

    class _Axes:  # `pool` reads the init value and the channel axis through an Env
        def axis(self, value: ir.Value) -> int | None:
            return channel_axis if value == op.operands[0] else None

        def interval(self, value: ir.Value) -> Interval:
            raise NotImplementedError

        def constant(self, value: ir.Value) -> Const | None:
            return env.constant(value)

    found = pool(op, x.axis, _Axes())
    if isinstance(found, Refusal):
        return found
    if found.kind != "add":
        return Refusal(Code.NO_STATISTICS, f"the mean of a {found.kind} pool is not modeled "
                                           "(it depends on the whole distribution)")
    if found.padded:
        return Refusal(Code.PADDING, "a sum pool that reads padding: border windows sum fewer "
                                     "values")
    return Moments(_pool_axis(op, x.axis), x.mean * found.taps, modeled=x.modeled)


# --- the table ------------------------------------------------------------------------------


def _law(summary: str, scale: Callable[[ir.Operation, Env], Scaled | Refusal],
         shift: Callable[[ir.Operation, Env], Shifted | Refusal],
         precision: Callable[[ir.Operation], Precision],
         interval: Callable[[ir.Operation, Env], Interval] | None,
         mean: Callable[[ir.Operation, MeanEnv], Moments | Refusal]) -> Law:
    return Law(summary, scale, shift, precision, interval, mean)


_ACTIVATION_SHIFT = _no_shift("it is the activation (high-bias absorption's own role)")

LAWS: dict[str, Law] = {
    "stablehlo.add": _law("x/s + c/s = (x + c)/s; a shift passes", _binary_scale, _add_shift,
                          _rounds, _add_interval, _add_mean),
    "stablehlo.subtract": _law("x/s - c/s = (x - c)/s; a shift passes (negated in c - x)",
                               _binary_scale, _add_shift, _rounds, _add_interval, _add_mean),
    "stablehlo.maximum": _law("max(x/s, c/s) = max(x, c)/s (ReLU); no shift", _binary_scale,
                              _ACTIVATION_SHIFT, _exact, _extremum_interval, _extremum_mean),
    "stablehlo.minimum": _law("min(x/s, c/s) = min(x, c)/s; no shift", _binary_scale,
                              _ACTIVATION_SHIFT, _exact, _extremum_interval, _extremum_mean),
    "stablehlo.clamp": _law("clamp(lo/s, x/s, hi/s) = clamp(lo, x, hi)/s (ReLU6 becomes a "
                            "per-channel clamp); no shift", _clamp_scale, _ACTIVATION_SHIFT,
                            _exact, _clamp_interval, _clamp_mean),
    "stablehlo.compare": _law("compare(x/s, c/s) = compare(x, c), c divided in x's type "
                              "(never the i1 result's); no shift", _compare_scale,
                              _no_shift("a comparison is not shift-invariant"), _exact,
                              None, _compare_mean),
    "stablehlo.select": _law("select(p, x/s, c/s) = select(p, x, c)/s (leaky ReLU, thresholds); "
                             "no shift", _select_scale, _no_shift("a select is an activation"),
                             _exact, _select_interval, _select_mean),
    "stablehlo.multiply": _law("(x/s) * c = (x * c)/s; a shift t becomes t * c (c per channel)",
                               _by_constant_scale, _by_constant_shift, _rounds,
                               _by_constant_interval, _by_constant_mean),
    "stablehlo.divide": _law("(x/s) / c = (x / c)/s (not c / x); a shift t becomes t / c",
                             _by_constant_scale, _by_constant_shift, _rounds,
                             _by_constant_interval, _by_constant_mean),
    "stablehlo.negate": _law("-(x/s) = (-x)/s; a shift is negated", _unary_scale, _negate_shift,
                             _exact, _negate_interval, _negate_mean),
    "stablehlo.abs": _law("|x/s| = |x|/s for s > 0; no shift", _unary_scale,
                          _no_shift("|x + t| != |x| + t"), _exact, _abs_interval, _abs_mean),
    "stablehlo.convert": _law("convert(x/s) = convert(x)/s (float to float); a narrowing "
                              "convert rounds where it stands", _unary_scale, _same_shift,
                              _convert_precision, _same_interval, _convert_mean),
    "stablehlo.reshape": _law("moves the channel axis if it stays whole", _layout_scale,
                              _layout_shift, _exact, _same_interval, _layout_mean),
    "stablehlo.transpose": _law("moves the channel axis", _layout_scale, _layout_shift, _exact,
                                _same_interval, _layout_mean),
    "stablehlo.broadcast_in_dim": _law("moves the channel axis unless it expands it",
                                       _layout_scale, _layout_shift, _exact, _same_interval, _layout_mean),
    "stablehlo.pad": _law("pad(x/s, v) = pad(x, v)/s for v in {0, +-inf}, not on channels; "
                          "no shift (padding stays 0)", _pad_scale,
                          _no_shift("the padding would not be shifted"), _exact, _pad_interval, _pad_mean),
    "stablehlo.reduce_window": _law("sum/max/min pooling not across channels, neutral init; a "
                                    "shift passes a max pool, and a sum pool without padding "
                                    "times its window", _pool_scale, _pool_shift,
                                    _pool_precision, _pool_interval, _pool_mean),
    "stablehlo.reduce": _law("sum/max/min over non-channel axes, neutral init; a shift passes "
                             "(times the reduced size for a sum)", _pool_scale, _pool_shift,
                             _pool_precision, _pool_interval, _pool_mean),
}

# Ops that are not positively homogeneous: a walk stops at them with this name.
NOT_HOMOGENEOUS = {
    "stablehlo.logistic": "sigmoid", "stablehlo.tanh": "tanh", "stablehlo.exponential": "exp",
    "stablehlo.log": "log", "stablehlo.sqrt": "sqrt", "stablehlo.rsqrt": "rsqrt",
    "stablehlo.power": "power", "stablehlo.erf": "erf (gelu)", "chlo.erf": "erf (gelu)",
    "stablehlo.sine": "sin", "stablehlo.cosine": "cos", "stablehlo.exponential_minus_one": "expm1",
    "stablehlo.log_plus_one": "log1p", "stablehlo.cbrt": "cbrt", "stablehlo.floor": "floor",
    "stablehlo.ceil": "ceil", "stablehlo.round_nearest_even": "round",
    "stablehlo.round_nearest_afz": "round", "stablehlo.sign": "sign",
}


# --- a scalar constant scale (fold-scale) ---------------------------------------------------
#
# A constant scalar c on an op's result moves to its operands: `c * op(x, ...)` equals op
# with some operands times c (`through`: their values are scaled, the walk goes on there),
# or with a constant operand replaced by `c * constant` (`into`; `/ c` for a divisor). A
# bilinear op (dot_general, convolution, multiply of two values) has several ways: the
# scalar moves to either operand. A kernel or a constant factor is where a walk can stop
# (`terminal`); a bias or a concatenated constant comes along with the value it meets.
# Precision: EXACT ops only move values, so `c * op(x) == op(c * x)` bit for bit; ROUNDS
# ops round the same sum or product at c times the magnitude: the one rounding of `c * x`
# the original made moves into the weight (docs/precision.md, rule 8).


class ScalarWay(NamedTuple):
    """One way a scalar c on the result moves to the operands."""

    through: tuple[int, ...] = ()  # operands whose values become c * value
    into: tuple[int, ...] = ()  # constant operands that become c * constant
    inverse: bool = False  # `into` operands are divisors: they become constant / c
    terminal: bool = False  # `into` is the weight the walk stops at (a kernel, a factor)
    part: bool = False  # only the part of the operand the op reads takes c (a slice)


class ScalarEnv(Protocol):
    def constant(self, value: ir.Value) -> Const | None: ...


# A mask (bool, the value's rank, each axis of size 1 or the value's size): True where
# the value is scaled by c, False where it is read unscaled. A slice of one producer's
# output (q of a fused QKV projection) scales only the part it reads; the mask says
# which part on the way back, and becomes a per-channel factor (c on the masked output
# channels, 1 on the rest) where it meets a weight.
Mask = np.ndarray
PartLaw = Callable[[ir.Operation, int, Mask], "Mask | Refusal"]
MAX_MASK = 1 << 22  # elements a mask may expand to (through a reshape or a slice)


class ScalarLaw(NamedTuple):
    summary: str
    ways: Callable[[ir.Operation, ScalarEnv], list[ScalarWay] | Refusal]
    precision: Callable[[ir.Operation], Precision]
    part: PartLaw | None = None  # a mask on the result -> the mask of operand `index`


def _split(op: ir.Operation, env: ScalarEnv, indices: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                              tuple[int, ...]]:
    """(operands among `indices` computed at run time, constant ones)."""
    constant = tuple(i for i in indices if env.constant(op.operands[i]) is not None)
    return tuple(i for i in indices if i not in constant), constant


def _linear_in(*indices: int) -> Callable[[ir.Operation, ScalarEnv], list[ScalarWay] | Refusal]:
    """c * op(x) == op(c * x) in operands `indices` together (constants among them scaled)."""
    def ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
        chosen = indices or tuple(range(len(op.operands)))
        through, into = _split(op, env, chosen)
        return [ScalarWay(through, into)]
    return ways


def _bilinear(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    """c (a b) == (c a) b == a (c b): a constant operand takes it (the weight) or the walk
    goes on through the other; two values computed at run time: either one, not both."""
    (a, b) = op.operands[0], op.operands[1]
    through, into = _split(op, env, (0, 1))
    if len(into) == 2:
        return Refusal(Code.NOT_CONSTANT, f"{_short(op)} of two constants")
    if len(into) == 1:
        return [ScalarWay(into=into, terminal=True), ScalarWay(through=through)]
    if a == b:
        return Refusal(Code.NOT_LINEAR, f"{_short(op)} of a value with itself: c x * x = c^2 "
                                        "x * x, so the scalar cannot move to one operand")
    return [ScalarWay(through=(0,)), ScalarWay(through=(1,))]


def _divide_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    """c (x / y) == (c x) / y; with y constant also x / (y / c)."""
    through, into = _split(op, env, (0, 1))
    if 0 in into:
        return Refusal(Code.NOT_LINEAR, "divide of a constant by a value: c / x is not linear "
                                        "in x")
    if into:
        return [ScalarWay(through=(0,)), ScalarWay(into=(1,), inverse=True, terminal=True)]
    return [ScalarWay(through=(0,))]


def _multiply_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    """x * k: through x first (towards the weight of a producer), else into k (a norm's
    weight); x * y: either operand."""
    found = _bilinear(op, env)
    if isinstance(found, Refusal) or len(found) != 2 or not found[0].terminal:
        return found
    return [found[1], found[0]]


def _pad_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    value = env.constant(op.operands[1])
    if value is None or np.any(np.asarray(value.array, dtype=np.float64) != 0):
        return Refusal(Code.NOT_HOMOGENEOUS, "pad with a value other than a constant zero: "
                                             "c * pad(x, v) != pad(c * x, v)")
    return [ScalarWay(through=(0,))]


def _sum_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    body = list(op.regions[0].blocks[0].operations)
    if len(op.operands) != 2 or not body or body[0].name != "stablehlo.add":
        return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} other than a sum of one value")
    return _pad_ways(op, env)  # a zero init value, as a pad's


def _convert_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    if not _float_convert(op):
        return Refusal(Code.NOT_HOMOGENEOUS, "a convert to or from an integer type")
    return [ScalarWay(through=(0,))]


def _gather_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    """gather(c T, i) == c gather(T, i): a constant table is the weight."""
    if env.constant(op.operands[0]) is not None:
        return [ScalarWay(into=(0,), terminal=True)]
    return [ScalarWay(through=(0,))]


def _select_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    through, into = _split(op, env, (1, 2))
    return [ScalarWay(through, into)]


def _slice_ways(op: ir.Operation, env: ScalarEnv) -> list[ScalarWay] | Refusal:
    """c slice(x) == slice(c x); or only the part of x the slice reads takes c (q of a
    fused QKV projection, whose K and V slices read the rest unscaled)."""
    return [ScalarWay(through=(0,)), ScalarWay(through=(0,), part=True)]


# --- masks through ops (a scale on part of a value) -------------------------------------------


def compress(mask: Mask) -> Mask:
    """`mask` with each axis along which it is constant reduced to size 1."""
    for axis in range(mask.ndim):
        if mask.shape[axis] > 1:
            first = np.take(mask, [0], axis=axis)
            if np.array_equal(np.broadcast_to(first, mask.shape), mask):
                mask = first
    return mask


def _shape(value: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _too_large(op: ir.Operation, size: int) -> Refusal | None:
    if size > MAX_MASK:
        return Refusal(Code.LIMIT, f"the scaled part of the value at {_short(op)} spans {size} "
                                   f"elements (more than {MAX_MASK})")
    return None


def _same_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """Elementwise ops: each operand has the result's shape, and the same part is scaled."""
    return mask


def _transpose_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    return np.transpose(mask, np.argsort(attributes.permutation(op)))


def _broadcast_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """The operand's axis k is the result's axis dims[k]; along a new or expanded axis the
    operand's one element is read at every position, so the part must not vary there."""
    dims = attributes.broadcast_dimensions(op)
    shape = _shape(op.operands[0])
    kept = {d for k, d in enumerate(dims) if shape[k] == mask.shape[d] or mask.shape[d] == 1}
    for axis in range(mask.ndim):
        if axis not in kept and mask.shape[axis] > 1:
            return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} repeats its operand along axis "
                                                 f"{axis}, where only part of the result is "
                                                 "scaled")
    picked = np.transpose(mask, [*dims, *(a for a in range(mask.ndim) if a not in dims)])
    return picked.reshape(picked.shape[:len(dims)])  # the other axes are size 1


def _groups(source: Sequence[int], target: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The reshape's axis groups: the shortest runs of `source` axes and `target` axes with
    equal products (no size is 0)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(source) or j < len(target):
        a: list[int] = []
        b: list[int] = []
        pa = pb = 1
        if i < len(source):
            a.append(i)
            pa *= source[i]
            i += 1
        if j < len(target):
            b.append(j)
            pb *= target[j]
            j += 1
        while pa != pb:
            if pa < pb:
                a.append(i)
                pa *= source[i]
                i += 1
            else:
                b.append(j)
                pb *= target[j]
                j += 1
        groups.append((a, b))
    return groups


def _reshape_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """Each group of result axes that the part varies along is spelled out and reshaped to
    the operand's axes of the same group (row-major: the elements keep their order)."""
    result, operand = _shape(op.results[0]), _shape(op.operands[0])
    if 0 in result:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{_short(op)} of an empty tensor")
    full = list(mask.shape)
    new: list[int] = []
    for r_axes, o_axes in _groups(result, operand):
        if any(mask.shape[a] > 1 for a in r_axes):
            for a in r_axes:
                full[a] = result[a]
            new += [operand[a] for a in o_axes]
        else:
            new += [1] * len(o_axes)
    found = _too_large(op, math.prod(full))
    if found is not None:
        return found
    return compress(np.broadcast_to(mask, full).reshape(new))


def _slice_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """The operand is scaled where the slice reads it with the result's part, and read
    unscaled everywhere else."""
    operand = _shape(op.operands[0])
    rank = len(operand)
    starts = attributes.ints(op, "start_indices", default=0, rank=rank)
    limits = attributes.ints(op, "limit_indices", default=0, rank=rank)
    strides = attributes.ints(op, "strides", default=1, rank=rank)
    whole = [starts[a] == 0 and limits[a] == operand[a] and strides[a] == 1 and
             mask.shape[a] == 1 for a in range(rank)]
    shape = [1 if whole[a] else operand[a] for a in range(rank)]
    found = _too_large(op, math.prod(shape))
    if found is not None:
        return found
    out = np.zeros(shape, dtype=bool)
    window = tuple(slice(None) if whole[a] else slice(starts[a], limits[a], strides[a])
                   for a in range(rank))
    part = np.broadcast_to(mask, [1 if whole[a] else len(range(starts[a], limits[a], strides[a]))
                                  for a in range(rank)])
    out[window] = part
    return compress(out)


def _concatenate_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    axis = attributes.integer(op, "dimension")
    if mask.shape[axis] == 1:
        return mask
    start = sum(_shape(op.operands[i])[axis] for i in range(index))
    size = _shape(op.operands[index])[axis]
    return compress(np.take(mask, range(start, start + size), axis=axis))


def _dot_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """The result's axes are (batch, lhs free, rhs free): operand `index` takes the part on
    its batch and free axes (size 1 on the contracted ones), which must not vary along the
    other operand's free axes (those positions share this operand's elements)."""
    dims = attributes.dot_dims(op)
    ranks = [len(_shape(o)) for o in op.operands[:2]]
    batch = [list(dims.lhs_batching_dimensions), list(dims.rhs_batching_dimensions)]
    contracting = [list(dims.lhs_contracting_dimensions), list(dims.rhs_contracting_dimensions)]
    free = [[a for a in range(ranks[k]) if a not in batch[k] and a not in contracting[k]]
            for k in (0, 1)]
    n_batch = len(batch[0])
    result_of = [list(range(n_batch, n_batch + len(free[0]))),
                 list(range(n_batch + len(free[0]), n_batch + len(free[0]) + len(free[1])))]
    if any(mask.shape[a] > 1 for a in result_of[1 - index]):
        return Refusal(Code.NOT_HOMOGENEOUS, f"only part of {_short(op)}'s result is scaled, "
                                             "and the part varies along the other operand's "
                                             "axes: no one factor of this operand gives it")
    shape = [1] * ranks[index]
    axes: dict[int, int] = {}
    for k, a in enumerate(batch[index]):
        axes[a] = k
    for k, a in enumerate(free[index]):
        axes[a] = result_of[index][k]
    for a, r in axes.items():
        shape[a] = mask.shape[r]
    order = [axes[a] for a in sorted(axes)]
    picked = np.transpose(mask, [*order, *(r for r in range(mask.ndim) if r not in order)])
    picked = picked.reshape([mask.shape[r] for r in order])
    return picked.reshape(shape)


def _conv_part(op: ir.Operation, index: int, mask: Mask) -> Mask | Refusal:
    """Part of a convolution's output features (q's of a fused QKV 1x1 convolution): the
    kernel's same output features; the part must not vary along the batch or spatial axes,
    and no one factor of the input gives it."""
    dims = attributes.conv_dims(op)
    out = dims.output_feature_dimension
    if index != 1 or any(mask.shape[a] > 1 for a in range(mask.ndim) if a != out):
        return Refusal(Code.NOT_HOMOGENEOUS, f"only part of {_short(op)}'s result is scaled, "
                                             "and the part is not a set of its output features "
                                             "that its kernel could take")
    shape = [1] * len(_shape(op.operands[1]))
    shape[dims.kernel_output_feature_dimension] = mask.shape[out]
    return mask.reshape(shape)


_MOVES = "moves values only: exact"

SCALAR_LAWS: dict[str, ScalarLaw] = {
    "stablehlo.reshape": ScalarLaw(_MOVES, _linear_in(0), _exact, part=_reshape_part),
    "stablehlo.transpose": ScalarLaw(_MOVES, _linear_in(0), _exact, part=_transpose_part),
    "stablehlo.broadcast_in_dim": ScalarLaw(_MOVES, _linear_in(0), _exact, part=_broadcast_part),
    "stablehlo.slice": ScalarLaw(_MOVES + " (RoPE's halves); or only the part it reads takes c "
                                 "(q of a fused QKV projection)", _slice_ways, _exact, part=_slice_part),
    "stablehlo.concatenate": ScalarLaw(_MOVES + "; a constant piece is scaled with it",
                                       _linear_in(), _exact, part=_concatenate_part),
    "stablehlo.negate": ScalarLaw("-(c x) = c (-x): exact", _linear_in(0), _exact, part=_same_part),
    "stablehlo.select": ScalarLaw("select(p, c a, c b): exact (a constant branch is scaled; a NaN or zero "
                                  "fill, which c leaves as it is, is not rewritten)",
                                  _select_ways, _exact, part=_same_part),
    "stablehlo.pad": ScalarLaw("pad(c x, 0) = c pad(x, 0): exact; no other pad value",
                               _pad_ways, _exact),
    "stablehlo.gather": ScalarLaw("gather(c T, i) = c gather(T, i): exact; a constant table "
                                  "takes c (Gemma's sqrt(hidden) embedding scale)",
                                  _gather_ways, _exact),
    "stablehlo.convert": ScalarLaw("convert(c x) = c convert(x) up to rounding: before a "
                                   "narrowing convert c x rounds once in the wide type (the "
                                   "original rounded twice); never moved into a narrower type "
                                   "than where the original scaled", _convert_ways,
                                   _convert_precision, part=_same_part),
    "stablehlo.add": ScalarLaw("c (a + b) = c a + c b: both values scaled, a constant (a bias) "
                               "scaled with them; rounds the same sum", _linear_in(0, 1), _rounds,
                               part=_same_part),
    "stablehlo.subtract": ScalarLaw("c (a - b) = c a - c b", _linear_in(0, 1), _rounds, part=_same_part),
    "stablehlo.multiply": ScalarLaw("c (x k) = (c x) k = x (c k): through x, or into the constant "
                                    "factor k (a norm's weight); c (x y) = (c x) y", _multiply_ways,
                                    _rounds, part=_same_part),
    "stablehlo.divide": ScalarLaw("c (x / y) = (c x) / y = x / (y / c); not c / x",
                                  _divide_ways, _rounds, part=_same_part),
    "stablehlo.dot_general": ScalarLaw("c (x W) = x (c W): into a constant operand (the weight) "
                                       "or through the other; of two values, through either "
                                       "(q k^T: into q)", _bilinear, _rounds, part=_dot_part),
    "stablehlo.convolution": ScalarLaw("c conv(x, K) = conv(x, c K) = conv(c x, K)", _bilinear,
                                       _rounds, part=_conv_part),
    "stablehlo.reduce": ScalarLaw("c sum(x) = sum(c x) with init 0; rounds the same sum",
                                  _sum_ways, _rounds),
}


def scalar_law_of(op: ir.Operation) -> ScalarLaw | Refusal:
    """The scalar law of `op`'s kind, or a refusal naming the op."""
    found = SCALAR_LAWS.get(op.name)
    if found is not None:
        return found
    if op.name in NOT_HOMOGENEOUS:
        return Refusal(Code.NOT_HOMOGENEOUS, f"{NOT_HOMOGENEOUS[op.name]} is not linear "
                                             f"(f(c x) != c f(x))")
    return Refusal(Code.NO_LAW, f"no scalar law for {op.name} (bnfold does not know how it "
                                "commutes with a constant scale)")


# --- factoring a per-channel affine out of a value (forward-norm) ---------------------------
#
# A normalization's affine is recognised by its law, not by names: a value v is written
# as `n * g + b` per channel (n computed at run time; g, b float64 vectors), and each op
# says what it does to that form and how the bare n is built from its operands' bare
# values. A constant operand is absorbed into g and b; two run-time operands combine
# only where the identity is exact (a product of two forms without shifts, a sum of two
# forms with the same g). An op without a law here makes its result bare (n = v, g = 1,
# b = 0): always true, it only folds less.


class Factored(NamedTuple):
    """`n * g + b` per channel (float64 vectors)."""

    g: np.ndarray
    b: np.ndarray

    @classmethod
    def bare(cls, channels: int) -> Factored:
        return cls(np.ones(channels), np.zeros(channels))

    @property
    def is_bare(self) -> bool:
        return bool(np.all(self.g == 1) and np.all(self.b == 0))


class Factoring(NamedTuple):
    """An op's result as a form, and how its bare value is built: "keep" (operand
    `operand`'s bare value as it is), "negate" (its negation), or "op" (the same op on
    the operands' bare values)."""

    factored: Factored
    build: str
    operand: int = 0


Operand = Factored | np.ndarray  # a run-time value's form, or a constant's per-channel vector


def _keep(g: np.ndarray, b: np.ndarray, operand: int, build: str = "keep") -> Factoring:
    return Factoring(Factored(g, b), build, operand)


def _factor_add(a: Operand, c: Operand, sign: float) -> Factoring | None:
    if isinstance(a, Factored) and not isinstance(c, Factored):
        return _keep(a.g, a.b + sign * c, 0)  # (n g + b) + c
    if isinstance(c, Factored) and not isinstance(a, Factored):
        if sign > 0:
            return _keep(c.g, c.b + a, 1)  # c + (n g + b)
        return _keep(c.g, a - c.b, 1, "negate")  # c - (n g + b) = (-n) g + (c - b)
    assert isinstance(a, Factored) and isinstance(c, Factored)
    if not np.array_equal(a.g, c.g):
        return None  # n1 g1 + n2 g2 has no common per-channel factor
    return Factoring(Factored(a.g, a.b + sign * c.b), "op")  # (n1 +- n2) g + (b1 +- b2)


def _factor_multiply(a: Operand, c: Operand) -> Factoring | None:
    if isinstance(a, Factored) and not isinstance(c, Factored):
        return _keep(a.g * c, a.b * c, 0)
    if isinstance(c, Factored) and not isinstance(a, Factored):
        return _keep(c.g * a, c.b * a, 1)
    assert isinstance(a, Factored) and isinstance(c, Factored)
    if np.any(a.b != 0) or np.any(c.b != 0):
        return None  # (n1 g1 + b1) * (n2 g2) is not n g + b
    return Factoring(Factored(a.g * c.g, np.zeros_like(a.b)), "op")  # (n1 n2) (g1 g2)


def _factor_divide(a: Operand, c: Operand) -> Factoring | None:
    if not isinstance(a, Factored):
        return None  # c / x is not affine in x
    if not isinstance(c, Factored):
        if np.any(c == 0):
            return None
        return _keep(a.g / c, a.b / c, 0)
    if np.any(a.b != 0) or np.any(c.b != 0) or np.any(c.g == 0):
        return None
    return Factoring(Factored(a.g / c.g, np.zeros_like(a.b)), "op")  # (n1 / n2) (g1 / g2)


def factor(name: str, operands: Sequence[Operand], *, widening: bool = True
           ) -> Factoring | None:
    """The law of op `name` on factored operands (at least one run-time), or None: the
    result is bare. `widening`: a float convert that does not round."""
    if name in ("stablehlo.add", "stablehlo.subtract"):
        return _factor_add(operands[0], operands[1], 1.0 if name == "stablehlo.add" else -1.0)
    if name == "stablehlo.multiply":
        return _factor_multiply(operands[0], operands[1])
    if name == "stablehlo.divide":
        return _factor_divide(operands[0], operands[1])
    x = operands[0]
    if not isinstance(x, Factored):
        return None
    if name == "stablehlo.negate":
        return Factoring(Factored(x.g, -x.b), "op")  # -(n g + b) = (-n) g - b
    if name == "stablehlo.convert" and widening:
        return Factoring(x, "op")  # exact: the bare value is converted instead
    return None  # a narrowing convert rounds where it stands


FACTOR_LAWS: dict[str, str] = {
    "stablehlo.add": "(n g + b) + c = n g + (b + c); n1 g + n2 g = (n1 + n2) g",
    "stablehlo.subtract": "(n g + b) - c = n g + (b - c); c - (n g + b) = (-n) g + (c - b); "
                          "n1 g - n2 g = (n1 - n2) g",
    "stablehlo.multiply": "(n g + b) c = n (g c) + b c; (n1 g1) (n2 g2) = (n1 n2) (g1 g2)",
    "stablehlo.divide": "(n g + b) / c = n (g / c) + b / c; (n1 g1) / (n2 g2) = (n1 / n2) "
                        "(g1 / g2)",
    "stablehlo.negate": "-(n g + b) = (-n) g - b",
    "stablehlo.convert": "a widening float convert is exact: convert(n) g + b; a narrowing "
                         "one rounds where it stands (its result is bare)",
}


# How each step between a normalized value and a linear layer commutes with its per-feature
# affine `n * g + b` (along feature axis a). Each keeps axis a whole and acts on every
# feature alike, so path(n * g + b) = path(n) * g + k b, with k the factor the step gives
# a constant (docs/precision.md, rule 7). Layout ops (reshape, transpose, a float convert)
# move the axis; forward-norm's `trace` checks that each step keeps a whole. The fuzzer's
# `norm_path` stratum generates each (tests/regiongen.py, `_norm_path`).
NORM_PATH_LAWS: dict[str, str] = {
    "stablehlo.slice": "slice(n g + b) = slice(n) g + b when a is kept whole (the CLS token "
                       "of ViT): exact, moves values",
    "stablehlo.broadcast_in_dim": "adding unit axes (a mean's keepdims) moves a: exact",
    "stablehlo.reduce": "sum over axes other than a (zero init): sum(n g + b) = sum(n) g + "
                        "m b, m the count summed; rounds a sum of n instead of n g + b",
    "stablehlo.multiply": "(n g + b) c = (n c) g + c b for a scalar constant c (a mean's "
                          "1/m): rounds the same product",
    "stablehlo.divide": "(n g + b) / c = (n / c) g + b / c for a scalar constant c (a mean's "
                        "count): rounds the same quotient",
    "stablehlo.concatenate": "along an axis other than a, of pieces that all carry the one "
                             "affine (torch.roll: slices of the same value): concat(n_i g + "
                             "b) = concat(n_i) g + b, exact; with any other piece refused",
    "stablehlo.pad": "pad with zero widths is the identity; pad(n g, 0) = pad(n, 0) g on axes "
                     "other than a; with a shift it does not commute (the padded positions "
                     "would read b, not 0): refused",
}
