"""Recognise per-channel affine maps `y = x * s + t`, however they are spelled.

Every exporter writes inference batch norm differently (see docs/folding.md): Flax
subtracts the mean then multiplies by `rsqrt(var + eps) * gamma`, Equinox
divides by `sqrt(var + eps)`, Keras builds a scale and shift with `negate`,
torchax multiplies twice, torch_xla emits `batch_norm_inference`. All of them
are a chain of *steps*, each taking the activation and constants:

    add(x, c)  add(c, x)  subtract(x, c)  subtract(c, x)  multiply(x, c)
    multiply(c, x)  divide(x, c)  negate(x)  reshape(x)
    batch_norm_inference(x, gamma, beta, mean, var)

A chain of steps composes into one per-channel `(s, t)` in float64 as long as
every constant is a scalar or varies only along the channel axis (which
reshapes may move). This module is the shared grammar used by the backward
and forward folding patterns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import attributes
from bnfold.constants import (
    Evaluator,
    argument_refusal,
    loop_refusal,
    map_axis_through_reshape,
    parameter_argument,
    per_channel,
)
from bnfold.elements import all_true, is_float, ranked_type
from bnfold.graph import same_block
from bnfold.ir import ir, stablehlo
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:
    from bnfold.analysis import Analysis

STEP_NAMES = (
    "stablehlo.add",
    "stablehlo.subtract",
    "stablehlo.multiply",
    "stablehlo.divide",
    "stablehlo.negate",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.convert",
    "stablehlo.batch_norm_inference",
)
# Steps that only move data or change precision (the channel axis may move; a
# narrowing convert rounds: a backward fold replays it where it was, a forward
# fold never moves anything across it, see `bnfold.laws`).
LAYOUT = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")
_ELEMENTWISE = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                "stablehlo.negate", "stablehlo.convert")
# Steps that carry normalization (as opposed to a bias or a layout change).
SCALING = ("stablehlo.multiply", "stablehlo.divide", "stablehlo.negate",
           "stablehlo.batch_norm_inference")


class Step(NamedTuple):
    """One op of a chain and the index of its activation operand.

    `parameter` is set when the other operand is not a constant but a
    function argument (a parameter passed at run time): the step belongs to
    the chain, so the report can name the argument, but it cannot fold; it
    holds the reason (bind the parameter, or unroll the loop that passes it).
    """

    op: ir.Operation
    x_index: int
    parameter: Refusal | None = None

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def result(self) -> ir.Value:
        return self.op.results[0]

    @property
    def x(self) -> ir.Value:
        return self.op.operands[self.x_index]


def as_step(op: ir.Operation, evaluator: Evaluator) -> Step | None:
    """`op` as a chain step, or None (memoized by `bnfold.analysis.Analysis.step`)."""
    name = op.name
    result_type = ranked_type(op.results[0])
    if result_type is None:
        return None
    # Elementwise steps may have symbolic dimensions (a shape-polymorphic
    # batch); layout changes and batch_norm_inference need static shapes.
    if not result_type.has_static_shape and name not in _ELEMENTWISE:
        return None
    operands = list(op.operands)
    if name == "stablehlo.convert" and not (
            is_float(ir.RankedTensorType(operands[0].type).element_type)
            and is_float(ir.RankedTensorType(op.results[0].type).element_type)):
        return None  # integer conversions are not affine steps
    if name in ("stablehlo.negate", "stablehlo.batch_norm_inference") + LAYOUT:
        return None if evaluator.constant(operands[0]) is not None else Step(op, 0)
    a_const = evaluator.constant(operands[0]) is not None
    b_const = evaluator.constant(operands[1]) is not None
    if a_const and b_const:
        return None
    if a_const or b_const:
        if name == "stablehlo.divide" and a_const:
            return None  # c / x is not affine in x
        return Step(op, 1 if a_const else 0)
    # Neither operand is constant: a parameter passed as an argument?
    result_size = _size(op.results[0])
    for x_index in (0, 1):
        argument = parameter_argument(operands[1 - x_index], evaluator)
        if argument is not None and _size(argument) < result_size and \
                not (name == "stablehlo.divide" and x_index == 1):
            return Step(op, x_index, argument_refusal(argument, f"operand {1 - x_index} of {name}"))
    for x_index in (0, 1):
        refusal = loop_refusal(operands[1 - x_index], f"operand {1 - x_index} of {name}", evaluator)
        if refusal is not None and not (name == "stablehlo.divide" and x_index == 1):
            return Step(op, x_index, refusal)
    return None


def _size(value: ir.Value) -> float:
    ty = ranked_type(value)
    if ty is None:
        return -1
    return math.inf if not ty.has_static_shape else math.prod(ty.shape)


def extends(value: ir.Value, analysis: Analysis) -> Step | None:
    """The step that continues a chain at `value`: its sole live user, taking it as activation."""
    user = analysis.sole_live_user(value)
    if user is None:
        return None
    step = analysis.step(user)
    if step is None or step.x != value or not same_block(user, value):
        return None
    return step


@dataclass
class Affine:
    """`y = x * scale + shift` per channel, on a value of `shape` with channels on `axis`."""

    scale: np.ndarray
    shift: np.ndarray
    axis: int
    shape: tuple[int, ...]
    origin: int  # the producer-result axis the channels started on
    gamma_beta: list[dict[str, np.ndarray]] = field(default_factory=list)

    @classmethod
    def identity(cls, shape: tuple[int, ...], axis: int) -> Affine:
        n = shape[axis]
        return cls(np.ones(n), np.zeros(n), axis, shape, axis)

    @property
    def channels(self) -> int:
        return self.shape[self.axis]

    def with_scale_shift(self, scale: np.ndarray, shift: np.ndarray) -> Affine:
        """This affine with a new scale and shift (`dataclasses.replace` costs five
        times the constructor, and a chain step asks for one)."""
        return Affine(scale, shift, self.axis, self.shape, self.origin, self.gamma_beta)


def _vector(value: ir.Value, evaluator: Evaluator, axis: int) -> np.ndarray | Refusal:
    const = evaluator.constant(value)
    if const is None:
        return Refusal(Code.NOT_CONSTANT, "operand is not constant")
    return per_channel(const, axis)


def apply(affine: Affine, step: Step, evaluator: Evaluator) -> Affine | Refusal:
    """`affine` followed by `step`, or why the step does not compose per channel."""
    name = step.name
    op = step.op
    if name == "stablehlo.reshape":
        after = tuple(ir.RankedTensorType(op.results[0].type).shape)
        axis = map_axis_through_reshape(affine.shape, after, affine.axis)
        if axis is None:
            return Refusal(Code.AXIS, f"reshape {affine.shape} -> {after} merges or splits the "
                                      f"feature axis")
        return replace(affine, axis=axis, shape=after)
    if name == "stablehlo.transpose":
        after = tuple(ir.RankedTensorType(op.results[0].type).shape)
        return replace(affine, axis=attributes.permutation(op).index(affine.axis), shape=after)
    if name == "stablehlo.convert":
        # Float to float: exact in float64. A narrowing convert rounds, and the
        # folded chain replays it at the same place (see `replay_layout`).
        return affine
    if name == "stablehlo.negate":
        return affine.with_scale_shift(-affine.scale, -affine.shift)
    if name == "stablehlo.batch_norm_inference":
        return _apply_batch_norm(affine, op, evaluator)
    if step.parameter is not None:
        return step.parameter
    c = _vector(op.operands[1 - step.x_index], evaluator, affine.axis)
    if isinstance(c, Refusal):
        return c
    s, t = affine.scale, affine.shift
    if name == "stablehlo.add":
        return affine.with_scale_shift(s, t + c)
    if name == "stablehlo.subtract":
        if step.x_index == 0:
            return affine.with_scale_shift(s, t - c)
        return affine.with_scale_shift(-s, c - t)
    if name == "stablehlo.multiply":
        if not all_true(np.isfinite(c)):  # `0 * inf` is NaN: refused as not finite, not a warning
            with np.errstate(invalid="ignore"):
                return affine.with_scale_shift(s * c, t * c)
        return affine.with_scale_shift(s * c, t * c)
    if name == "stablehlo.divide":
        if np.any(c == 0):
            return Refusal(Code.PRECISION, "division by a per-channel constant that is zero")
        return affine.with_scale_shift(s / c, t / c)
    raise AssertionError(name)


def _apply_batch_norm(affine: Affine, op: ir.Operation, evaluator: Evaluator) -> Affine | Refusal:
    feature = ir.IntegerAttr(op.attributes["feature_index"]).value
    # With one channel every unit axis is "the" channel axis (a reshape that
    # adds unit axes cannot tell them apart), and all statistics are scalars.
    one_channel = affine.channels == 1 and affine.shape[feature] == 1
    if feature != affine.axis and not one_channel:
        return Refusal(Code.AXIS, f"feature_index {feature} is not the producer's output-feature "
                                  f"axis {affine.axis}")
    stats: dict[str, np.ndarray] = {}
    for name, value in zip(("gamma", "beta", "mean", "variance"), list(op.operands)[1:], strict=True):
        const = evaluator.constant(value)
        if const is None:
            argument = parameter_argument(value, evaluator)
            if argument is not None:
                return argument_refusal(argument, f"batch_norm_inference {name}")
            return Refusal(Code.NOT_CONSTANT, f"batch_norm_inference {name} is not constant")
        vector = per_channel(const, 0)
        if isinstance(vector, Refusal):
            return vector.wrap(f"batch_norm_inference {name}")
        stats[name] = vector
    eps = ir.FloatAttr(op.attributes["epsilon"]).value
    stats["epsilon"] = np.asarray(eps, dtype=np.float64)
    denom = stats["variance"] + eps
    if (denom <= 0).any() or not np.isfinite(denom).all():
        return Refusal(Code.PRECISION, "variance + epsilon is not positive and finite")
    a = stats["gamma"] / np.sqrt(denom)
    scale = affine.scale * a
    shift = (affine.shift - stats["mean"]) * a + stats["beta"]
    return replace(affine, scale=scale, shift=shift, gamma_beta=affine.gamma_beta + [stats])


class Composed(NamedTuple):
    """The longest foldable prefix of a chain and the affine it composes to."""

    steps: list[Step]
    affine: Affine
    stop_reason: Refusal | None  # why the next step (if any) could not be added
    # The affine after each of `steps` (the last is `affine`): a prefix's, without
    # composing it again.
    history: list[Affine] = field(default_factory=list)

    @property
    def normalizes(self) -> bool:
        """Worth folding: scales, or more than one additive step."""
        return normalizes(self.steps)


def normalizes(steps: list[Step]) -> bool:
    """Scales, or has more than one additive step."""
    names = [s.name for s in steps if s.name not in LAYOUT]
    return any(n in SCALING for n in names) or len(names) >= 2


def looks_like_normalization(steps: list[Step]) -> bool:
    """Worth a report entry when it does not fold: a batch norm op, a scale
    together with a shift, or a parameter-fed chain (a decomposed batch norm
    whose statistics are arguments)."""
    names = [s.name for s in steps if s.name not in LAYOUT]
    scaling = [n for n in names if n in SCALING]
    if "stablehlo.batch_norm_inference" in names:
        return True
    if any(s.parameter is not None for s in steps):
        return bool(scaling) or len(names) >= 2
    return bool(scaling) and len(names) > len(scaling)


def fold_name_op(steps: list[Step]) -> ir.Operation:
    """The op a fold is reported under: the BN op, else the first step that is
    not a bias add or a layout change."""
    for s in steps:
        if s.name == "stablehlo.batch_norm_inference":
            return s.op
    for s in steps:
        if s.name != "stablehlo.add" and s.name not in LAYOUT:
            return s.op
    return steps[-1].op


def norm_op(steps: list[Step]) -> ir.Operation:
    """The op that names a normalization: the BN op, else the first scaling step,
    else the first non-layout step."""
    for s in steps:
        if s.name == "stablehlo.batch_norm_inference":
            return s.op
    for s in steps:
        if s.name in SCALING:
            return s.op
    for s in steps:
        if s.name not in LAYOUT:
            return s.op
    return steps[-1].op


def compose(steps: list[Step], start: Affine, evaluator: Evaluator) -> Composed:
    """Composes `steps` from `start`; stops at the first step that does not compose."""
    affine = start
    history: list[Affine] = []
    for i, step in enumerate(steps):
        nxt = apply(affine, step, evaluator)
        if isinstance(nxt, Refusal):
            return Composed(steps[:i], affine, nxt, history)
        affine = nxt
        history.append(affine)
    return Composed(list(steps), affine, None, history)


def replay_layout(value: ir.Value, steps: list[Step]) -> ir.Value:
    """Re-applies the layout steps of `steps` to `value`, in order, at the insertion point.

    Layout steps are reshapes, transposes and float converts (mixed precision:
    a bf16 result widened to f32 for the normalization and narrowed after).
    Consecutive reshapes become one reshape to their final shape, none when
    the shape does not change; a convert to the type the value already has
    is dropped.
    """
    pending: list[int] | None = None  # a reshape not emitted yet

    def flush(v: ir.Value) -> ir.Value:
        current = ir.RankedTensorType(v.type)
        if pending is None or list(current.shape) == pending:
            return v
        return stablehlo.ReshapeOp(ir.RankedTensorType.get(pending, current.element_type), v).result

    for s in steps:
        if s.name == "stablehlo.reshape":
            pending = list(ir.RankedTensorType(s.result.type).shape)
            continue
        if s.name == "stablehlo.transpose":
            value, pending = flush(value), None
            value = stablehlo.TransposeOp(value, attributes.permutation(s.op)).result
        elif s.name == "stablehlo.convert":
            target = ir.RankedTensorType(s.result.type).element_type
            current = ir.RankedTensorType(value.type)
            if current.element_type != target:
                value = stablehlo.ConvertOp(
                    ir.RankedTensorType.get(list(current.shape), target), value).result
    return flush(value)


def leading_converts(steps: list[Step]) -> list[Step]:
    """The float converts right after the producer (a widened mixed-precision result)."""
    lead: list[Step] = []
    for s in steps:
        if s.name != "stablehlo.convert":
            break
        lead.append(s)
    return lead
