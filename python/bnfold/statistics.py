"""Recover a decomposed batch norm's statistics from the constants of its chain.

Folding composes a chain into one per-channel `y = x * s + t`; quantization
steps after it (high-bias absorption) need the batch norm's own `gamma` and
`beta`, i.e. the mean and spread of `y`. Exporters keep them recognisable in
the constant subgraphs of the chain:

    Flax / Haiku / Equinox / torchax      (x - mean) * (gamma * rsqrt(var + eps)) + beta
    Keras 3                               x * inv + (-mean * inv + beta),  inv = rsqrt(var + eps) * gamma

The variance and epsilon are the operands of the `add` under `rsqrt` (or
`sqrt`); the mean is the constant a leading `subtract` removes, or the one a
`negate` flips. Then, exactly in float64:

    gamma = s * sqrt(var + eps)          beta = t + s * mean

`batch_norm_inference` carries them as operands and needs none of this.

`pre_activation` gives what high-bias absorption needs from either form: the
mean and spread of the folded chain's *output*, which differ from the batch
norm's own `beta` and `|gamma|` when other steps (a bias add, a scale) follow
it in the chain.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bnfold import elements
from bnfold.affine import LAYOUT, Affine, Step
from bnfold.constants import Evaluator
from bnfold.elements import all_true
from bnfold.graph import defining_op
from bnfold.ir import ir

_MAX_DEPTH = 12

# A variance under `rsqrt` and no mean: `y * rsqrt(var + eps) * gamma + c`. That is a batch
# norm of mean 0 when c is its beta, and of any mean m when c is beta - m * gamma *
# rsqrt(var + eps) (an exporter that merged the two constants): the same constants either
# way, so the mean of the chain's output is not stated, and nothing assumes one.
NO_MEAN = ("the batch norm folded into it ({}) states no mean (y * rsqrt(var + eps) * gamma "
           "+ c: c is beta for a zero mean, or beta - mean * gamma * rsqrt(var + eps) where an "
           "exporter merged them), so the mean of its output is unknown")
# The ops `_constant_graph` walks through (elementwise and layout ops, and the rsqrt/sqrt
# over a variance).
_WALKED = frozenset({"stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.convert",
                     "stablehlo.transpose", "stablehlo.multiply", "stablehlo.divide",
                     "stablehlo.dynamic_broadcast_in_dim", "stablehlo.add",
                     "stablehlo.subtract", "stablehlo.negate", "chlo.broadcast_add",
                     "stablehlo.rsqrt", "stablehlo.sqrt"})


class Reading(NamedTuple):
    """What a chain's constants say about the batch norm that made it."""

    params: dict[str, np.ndarray] | None  # gamma, beta, mean, variance, epsilon, or None
    no_mean: bool  # the variance is there and the mean is not (`NO_MEAN`)


def read(steps: list[Step], fit: Affine, evaluator: Evaluator) -> Reading:
    """The chain's `gamma`, `beta`, `mean`, `variance`, `epsilon` (None if not
    recognisable), and whether it states a variance but no mean.

    Additive steps before the mean subtraction (a convolution's own bias) are
    part of the batch norm's input: `beta = t + s * (mean - bias)`. One walk of
    the constants answers both (a fold's record asks both of the same chain).
    """
    parts = _parts(steps, evaluator, fit.channels)
    if parts is None:
        return Reading(None, False)
    bias, mean, variance = parts
    if variance is None or mean is None:
        return Reading(None, mean is None and variance is not None)
    var, eps = variance
    return Reading({"gamma": fit.scale * np.sqrt(var + eps),
                    "beta": fit.shift + fit.scale * (mean - bias),
                    "mean": mean, "variance": var, "epsilon": eps}, False)


def recover(steps: list[Step], fit: Affine, evaluator: Evaluator) -> dict[str, np.ndarray] | None:
    """`read(...).params`: the batch norm's parameters, or None if not recognisable."""
    return read(steps, fit, evaluator).params


def _parts(steps: list[Step], evaluator: Evaluator, channels: int
           ) -> tuple[np.ndarray, np.ndarray | None, tuple[np.ndarray, np.ndarray] | None] | None:
    """The bias before the normalization, its mean and its (variance, epsilon), each None
    where the chain does not show it; None when the leading steps are not recognisable."""
    variance: tuple[np.ndarray, np.ndarray] | None = None
    leading = _leading(steps, evaluator, channels)
    if leading is None:
        return None
    bias, mean = leading
    seen: dict[ir.Value, int] = {}  # the steps' constants share subgraphs (Keras: inv twice)
    for step in steps:
        for index, operand in enumerate(step.op.operands):
            if index == step.x_index:
                continue
            for op in _constant_graph(operand, seen):
                if variance is None and op.name in ("stablehlo.rsqrt", "stablehlo.sqrt"):
                    variance = _variance(op, evaluator, channels)
                if mean is None and op.name == "stablehlo.negate":
                    mean = _vector(op.operands[0], evaluator, channels)
    return bias, mean, variance


def pre_activation(steps: list[Step], fit: Affine, params: dict[str, np.ndarray],
                   evaluator: Evaluator) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mean, spread, deviation) per channel of the chain's output `y = x * s + t`, or None.

    The batch norm saw `x + bias` (the adds before it) with mean `mean` and
    variance `var`, so `E[y] = t + s * (mean - bias)`, and its standard
    deviation is `|s| * sqrt(var)` (`deviation`: `|gamma| * sqrt(var / (var +
    eps))` for a batch norm alone, 0.03 |gamma| for var 1e-6, eps 1e-3). The
    `spread` `|s| * sqrt(var + eps)` (`|gamma|` alone) is never smaller: the
    bound that ranges and high-bias absorption keep (the deviation is what a
    mean through an activation needs).
    None when the statistics are missing or a step other than an add or a
    layout change comes before the batch norm (its statistics would not
    describe `x`)."""
    if not {"mean", "variance", "epsilon"} <= params.keys():
        return None
    if any(step.name == "stablehlo.batch_norm_inference" for step in steps):
        bias = np.zeros(fit.channels)
        for step in steps:
            if step.name == "stablehlo.batch_norm_inference":
                break
            if step.name in LAYOUT:
                continue
            if step.name != "stablehlo.add" or step.parameter:
                return None
            constant = _vector(step.op.operands[1 - step.x_index], evaluator, fit.channels)
            if constant is None:
                return None
            bias = bias + constant
    else:  # decomposed: `recover` found the statistics with the same reading
        leading = _leading(steps, evaluator, fit.channels)
        if leading is None:
            return None
        bias = leading[0]
    spread = np.abs(fit.scale) * np.sqrt(params["variance"] + params["epsilon"])
    deviation = np.abs(fit.scale) * np.sqrt(np.maximum(params["variance"], 0.0))
    return fit.shift + fit.scale * (params["mean"] - bias), spread, deviation


def _leading(steps: list[Step], evaluator: Evaluator, channels: int
             ) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The bias added before the normalization, and the mean if `x - mean` follows it."""
    bias = np.zeros(channels)
    for step in steps:
        if step.name in LAYOUT:
            continue
        if step.name not in ("stablehlo.add", "stablehlo.subtract") or step.parameter:
            return bias, None
        constant = _vector(step.op.operands[1 - step.x_index], evaluator, channels)
        if constant is None:
            return None
        if step.name == "stablehlo.subtract":
            if step.x_index != 0:
                return None
            return bias, constant
        bias = bias + constant
    return bias, None


def has_variance(steps: list[Step]) -> bool:
    """Whether a variance is under an `rsqrt` or `sqrt` among the chain's operands (a
    decomposed batch norm or a Keras `Normalization`: statistics made this chain)."""
    for step in steps:
        for index, operand in enumerate(step.op.operands):
            if index != step.x_index and any(
                    op.name in ("stablehlo.rsqrt", "stablehlo.sqrt") and _per_channel(op)
                    for op in _constant_graph(operand)):
                return True
    return False


def _per_channel(op: ir.Operation) -> bool:
    """Whether an rsqrt or sqrt computes a vector, as a variance is: not attention's
    `rsqrt(64.0)` of a scalar (a constant scale, however it is spelled)."""
    ty = elements.ranked_type(op.results[0])
    return ty is None or ty.rank > 0


def _constant_graph(value: ir.Value, seen: dict[ir.Value, int] | None = None
                    ) -> list[ir.Operation]:
    """The ops computing a constant operand (depth-limited, pure elementwise and layout ops),
    leaving out the subgraphs `seen` has walked from a depth no greater (it gets the values
    walked here, at their depth)."""
    found: list[ir.Operation] = []
    stack = [(value, 0)]
    while stack:
        current, depth = stack.pop()
        if seen is not None:
            if seen.get(current, _MAX_DEPTH + 1) <= depth:
                continue
            seen[current] = depth
        op = defining_op(current)
        if op is None or depth > _MAX_DEPTH:
            continue
        found.append(op)
        if op.name in _WALKED:
            stack += [(v, depth + 1) for v in op.operands]
    return found


def _variance(op: ir.Operation, evaluator: Evaluator, channels: int
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """(variance, epsilon) from `rsqrt(var + eps)`: the per-channel and the scalar operand."""
    add = defining_op(op.operands[0])
    while add is not None and add.name in ("stablehlo.convert", "stablehlo.reshape",
                                           "stablehlo.broadcast_in_dim"):
        add = defining_op(add.operands[0])
    if add is None or add.name != "stablehlo.add":  # no epsilon: sqrt(var)
        var = _vector(op.operands[0], evaluator, channels)
        return None if var is None else (var, np.zeros(channels))
    a = _vector(add.operands[0], evaluator, channels)
    b = _vector(add.operands[1], evaluator, channels)
    if a is None or b is None:
        return None
    if all_true(b == b[0]) and not all_true(a == a[0]):
        return a, b
    if all_true(a == a[0]) and not all_true(b == b[0]):
        return b, a
    return (a, b) if float(np.max(b)) <= float(np.max(a)) else (b, a)


def _vector(value: ir.Value, evaluator: Evaluator, channels: int) -> np.ndarray | None:
    """The constant as a float64 vector of `channels` values (a scalar is repeated)."""
    const = evaluator.constant(value)
    if const is None:
        return None
    array = np.asarray(const.array, dtype=np.float64)
    if array.size == 1:
        return np.full(channels, float(array.reshape(-1)[0]))
    flat = array.reshape(-1)
    return flat if flat.size == channels else None
