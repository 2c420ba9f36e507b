"""The region between two layers, walked through the step laws (`bnfold.laws`).

Cross-layer equalization divides layer 1's output channels by `s > 0` and
multiplies the matching input channels of layer 2's kernel by `s`. That is
exact when every op between the two commutes with the scale once its
constants are divided by `s` too -- which is what each op's law says.
Before (ReLU6 as JAX and torchax spell it):

    %y  = stablehlo.convolution(%x, %k1) ...
    %b  = stablehlo.add %y, %bias_b                   (bias: per channel)
    %r  = stablehlo.clamp %zero, %b, %six             (ReLU6)
    %z  = stablehlo.convolution(%r, %k2) ...

What the walk returns: the ops `add, clamp`, the constants that meet a scaled
value (`bias`, `zero`, `six`: each an `Edit` in the type of the value it
meets), and for every value the walk reached its channel axis and the
interval of the original's values (for the range check). Anything without a
law -- sigmoid, a residual add, a runtime gate, a call that was not inlined --
is a refusal naming the op and where it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from bnfold import laws, producers
from bnfold.analysis import Analysis
from bnfold.constants import Const
from bnfold.graph import defining_op, users
from bnfold.ir import format_location, ir, op_id
from bnfold.laws import Edit, Interval
from bnfold.refusal import Code, Refusal

# Region ops beyond this many mean the walk has wandered into the rest of the
# network (an equalization region is an activation, a few layout ops, pooling).
MAX_REGION_OPS = 64


class Reached(NamedTuple):
    """A value inside the region: its channel axis and the original's interval there."""

    value: ir.Value
    axis: int
    interval: Interval


@dataclass(frozen=True)
class Region:
    """The ops between layer 1's result and the one producer (`consumer`) that reads it."""

    consumer: ir.Operation
    operand: int  # the consumer's operand that carries the scaled channels
    axis: int  # the channel axis of that operand
    ops: tuple[ir.Operation, ...]  # in program order
    edits: tuple[Edit, ...]
    reached: tuple[Reached, ...]  # layer 1's result first, then every region result

    def describe(self) -> str:
        """`add, clamp` (the ops between the layers) or `nothing`."""
        names = [op.name.removeprefix("stablehlo.") for op in self.ops]
        return ", ".join(dict.fromkeys(names)) if names else "nothing"


@dataclass
class _Walk:
    """The walk's state, as the laws read it (`bnfold.laws.Env`)."""

    analysis: Analysis
    axes: dict[ir.Value, int] = field(default_factory=dict)
    intervals: dict[ir.Value, Interval] = field(default_factory=dict)

    def axis(self, value: ir.Value) -> int | None:
        return self.axes.get(value)

    def interval(self, value: ir.Value) -> Interval:
        return self.intervals[value]

    def constant(self, value: ir.Value) -> Const | None:
        return self.analysis.constant(value)


def walk(start: ir.Value, axis: int, analysis: Analysis, source: Interval
         ) -> Region | Refusal | None:
    """The region from `start` (scaled along `axis`, its values in `source`) to the next
    producer; None when no producer follows (nothing to pair with, nothing to explain)."""
    closure = _closure(start, analysis)
    if closure is None:
        return None
    ops, consumers, leak = closure
    state = _Walk(analysis, {start: axis}, {start: source})
    edits: list[Edit] = []
    reached = [Reached(start, axis, source)]
    for op in ops:
        law = laws.law_of(op)
        if isinstance(law, Refusal):
            return law.wrap(_where(op))
        scaled = law.scale(op, state)
        if isinstance(scaled, Refusal):
            return Refusal(scaled.code, f"{scaled.message} ({_where(op)})")
        result = op.results[0]
        state.axes[result] = scaled.axis
        if scaled.axis != laws.PREDICATE:  # a predicate has no range (and no interval law)
            assert law.interval is not None, op.name
            state.intervals[result] = law.interval(op, state)
            reached.append(Reached(result, scaled.axis, state.intervals[result]))
        edits += scaled.edits
    return leak or _consumer(consumers, state, ops, edits, reached)


def _closure(start: ir.Value, analysis: Analysis
             ) -> tuple[list[ir.Operation], list[ir.Operation], Refusal | None] | None:
    """The region ops in program order, the producers that read them, and where the
    region leaks out (a function result, another block, a call); None when no producer
    reads it, not even past a call that leaks it (the last layer: nothing to pair, nothing
    to explain)."""
    owner = defining_op(start)
    assert owner is not None
    block = owner.block
    seen: dict[int, ir.Operation] = {}
    consumers: dict[int, ir.Operation] = {}
    leak: Refusal | None = None
    onward = False  # a producer lies past the leak: the pair exists and needs a reason
    queue = [start]
    while queue:
        for user in analysis.live_users(queue.pop()):
            key = op_id(user)
            if key in seen or key in consumers or user.name == "stablehlo.get_dimension_size":
                continue  # a shape query reads no values: a scale leaves it as it is
            if user.block != block:
                leak = leak or Refusal(Code.NO_LAW, f"layer 1's output is read inside a region "
                                                    f"({_where(user)})")
                onward = onward or producers.is_producer(user) or any(
                    leads_to_producer(r, analysis) for r in user.results)
            elif producers.is_producer(user):
                consumers[key] = user
            elif user.name == "func.return":
                leak = leak or Refusal(Code.FAN_OUT, f"layer 1's output is also a function "
                                                     f"result ({_where(user)})")
            elif user.name == "stablehlo.return":  # the branch of a case/if ends here
                leak = leak or Refusal(Code.NO_LAW, f"layer 1's output leaves the "
                                                    f"{_parent_name(user)} it is computed in "
                                                    f"(equalization does not cross region "
                                                    f"boundaries; {_where(user)})")
                parent = user.parent
                onward = onward or (parent is not None and any(
                    leads_to_producer(r, analysis) for r in parent.results))
            elif len(user.results) != 1 or user.name == "func.call":
                law = laws.law_of(user)
                leak = leak or (law.wrap(_where(user)) if isinstance(law, Refusal) else Refusal(
                    Code.NO_LAW, f"{user.name} has {len(user.results)} results ({_where(user)})"))
                onward = onward or any(leads_to_producer(r, analysis) for r in user.results)
            else:
                seen[key] = user
                if len(seen) > MAX_REGION_OPS:
                    return None  # the rest of the network, not an activation
                queue.append(user.results[0])
    if not consumers and not onward:
        return None
    order = {op_id(op): i for i, op in enumerate(block.operations)} if len(seen) > 1 else {}
    ops = sorted(seen.values(), key=lambda op: order.get(op_id(op), 0))
    return ops, list(consumers.values()), leak


def _consumer(consumers: list[ir.Operation], state: _Walk, ops: list[ir.Operation],
              edits: list[Edit], reached: list[Reached]) -> Region | Refusal:
    if len(consumers) != 1:
        return Refusal(Code.FAN_OUT, f"layer 1's output reaches {len(consumers)} producers "
                                     f"(fan-out: {', '.join(_where(c) for c in consumers)})")
    consumer = consumers[0]
    # `_closure` visited every live user of every region value: each is a region op or
    # this consumer, so nothing else reads a scaled value.
    operands = [i for i, v in enumerate(consumer.operands) if v in state.axes]
    if len(operands) != 1:
        return Refusal(Code.FAN_OUT, f"{consumer.name} reads layer 1's output twice "
                                     f"({_where(consumer)})")
    index = operands[0]
    axis = state.axes[consumer.operands[index]]
    if axis == laws.PREDICATE:
        return Refusal(Code.NOT_HOMOGENEOUS, "the next layer reads a comparison result")
    return Region(consumer, index, axis, tuple(ops), tuple(edits), tuple(reached))


def _passable(op: ir.Operation) -> bool:
    """An op a walk may cross on its way to a producer: it has a law, or it is a call
    (of a private helper, inlined before the walk runs)."""
    return (op.name in laws.LAWS or op.name == "func.call") and len(op.results) == 1


def leads_to_producer(value: ir.Value, analysis: Analysis) -> bool:
    """Whether a producer reads `value` through ops that have laws or calls (a few hops)."""
    queue, seen = [value], 0
    while queue and seen <= MAX_REGION_OPS:
        for user in users(queue.pop()):
            seen += 1
            if producers.is_producer(user):
                return True
            if _passable(user):
                queue.append(user.results[0])
    return False


def fed_by_producer(value: ir.Value, analysis: Analysis) -> bool:
    """Whether `value` is computed from a producer's result through ops that have laws
    or calls."""
    for _ in range(MAX_REGION_OPS):
        owner = defining_op(value)
        if owner is None:
            return False
        if producers.is_producer(owner):
            return True
        # A batch_norm_inference still in place is a per-channel affine like its decomposed
        # chain (inlining runs before the folds that remove it).
        if not (_passable(owner) or owner.name == "stablehlo.batch_norm_inference"):
            return False
        scaled = [v for v in owner.operands if analysis.constant(v) is None]
        if len(scaled) != 1:
            return False
        value = scaled[0]
    return False


def _parent_name(op: ir.Operation) -> str:
    parent = op.parent
    return parent.name if parent is not None else "region"


def _where(op: ir.Operation) -> str:
    where = format_location(op.location, None)
    return f"{op.name} at {'line ' + where[2:] if where.startswith('-:') else where}"


def unknown(channels: int) -> Interval:
    return Interval(np.full(channels, -np.inf), np.full(channels, np.inf))
