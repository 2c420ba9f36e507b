"""absorb-high-bias: move the bias a ReLU passes for every likely input into the next layer.

High-bias absorption (Nagel et al., "Data-Free Quantization", ICCV 2019),
run on the equalized sets. Layer 1's pre-activation `y` per channel is, by
its folded batch norm, distributed around `beta` with spread `|gamma|`
(`bnfold.statistics.pre_activation`, divided by the equalization
scale). With `c = max(0, beta - 3|gamma|)` (at most ReLU6's bound),

    act(y) == act(y - c) + c        for every y >= c

holds for an activation that is the identity between its lower bound 0 and
its upper bound (ReLU, ReLU6 as a clamp or max + min, select(y > 0, y, 0)),
and the constant `c` passes through whatever follows (by each op's shift law:
layout, max pooling, a sum pool times its window) and through layer 2 into
its bias. Before (after equalization):

    %a = stablehlo.add %conv1, %b1_b                  // y      (role: bias)
    %r = stablehlo.clamp %zero, %a, %six_b            // ReLU6  (role: activation)
    %z = stablehlo.convolution(%r, %k2) ...           //        (layer 2)
    %o = stablehlo.add %z, %b2_b

After (activation ranges shrink by c; the output is exactly the same for
every input whose pre-activation stays above c -- 3 sigma):

    %a = stablehlo.add %conv1, %b1_minus_c_b
    %r = stablehlo.clamp %zero, %a, %six_minus_c_b
    %z = stablehlo.convolution(%r, %k2) ...
    %o = stablehlo.add %z, %b2_plus_k2c_b             // + sum over k2's window of k2 * c

The region must be exactly these *ordered roles*: layout ops, one bias add of
layer 1 (the one its statistics describe), layout ops, one activation whose
lower bound is 0, then ops that a shift passes (`bnfold.laws`), then layer 2.
Anything else -- a second activation, an add after the activation, a clamp
whose lower bound is not 0, an explicit pad -- is refused with a reason,
because the identity above would not hold. Where layer 2 zero-pads (or is
transposed), its border taps read zeros in both programs that now stand for
different values: the shift reaches its output as `bnfold.border`'s exact
correction instead of a per-channel bias (`bnfold.through.shift_through`).
Layer 2's pre-activation is restored, so the next link's statistics still hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bnfold import attributes, elements, laws, precision, producers
from bnfold.ir import ir, op_id
from bnfold.laws import Edit
from bnfold.patterns.base import Pattern
from bnfold.patterns.rewrite import bias_add, constant_add
from bnfold.quant import region
from bnfold.quant.equalize import EQUALIZED_SETS, replace_constants
from bnfold.refusal import Code, Refusal
from bnfold.rewriter import Rewriter
from bnfold.through import Through, bias_adds, shift_through

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.quant.equalize import Equalized

SIGMAS = 3.0
# E[(c - y)+] / sigma for y ~ N(mu, sigma^2) and c = mu - 3 sigma: the mean
# amount by which relu(y - c) + c misses relu(y), per unit of spread.
_TAIL = math.exp(-SIGMAS ** 2 / 2) / math.sqrt(2 * math.pi) - SIGMAS * 0.5 * math.erfc(
    SIGMAS / math.sqrt(2))
_LAYOUT = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim",
           "stablehlo.convert")


@dataclass(frozen=True)
class Link:
    """One link of an equalized set: layer 1 and layer 2, by their place in the record."""

    record: Equalized
    index: int
    first: ir.Operation
    second: ir.Operation


@dataclass(frozen=True)
class Roles:
    """The region between the layers, read as high-bias absorption's ordered roles."""

    link: Link
    bias: Edit  # layer 1's bias constant
    lower: Edit | None  # the activation's lower bound 0 (None: select(y > 0, y, 0))
    uppers: tuple[Edit, ...]  # its upper bound (ReLU6), if any
    shift_axis: int  # where a shift of the activation's output reaches layer 2
    shift_factor: np.ndarray  # and times what, per channel
    second: ir.Operation
    operand: int  # layer 2's operand that reads the region


@dataclass(frozen=True)
class Plan:
    """What absorption writes: new bias and bounds, and layer 2's output shift."""

    roles: Roles
    c: np.ndarray  # per channel of layer 1, what moves
    bias: np.ndarray
    uppers: tuple[np.ndarray, ...]
    through: Through  # c as it reaches layer 2's output (bias or border correction) + merge
    moved: np.ndarray | None  # how layer 2's result moves per channel (None: by position)
    merge: tuple[ir.Operation, ...]  # layer 2's existing bias adds, merged into the new one
    estimate: float
    corrected: bool


def roles(link: Link, ctx: Context) -> Roles | Refusal:
    """The region of `link` as ordered roles, or why it is not layout, bias, layout, one
    activation with lower bound 0, then ops a shift passes."""
    analysis = ctx.analysis
    out = producers.output_axis(link.first, analysis.evaluator)
    if out is None:
        return Refusal(Code.NOT_FLOAT, "layer 1 is not a float producer")
    axis = out[0]
    channels = ir.RankedTensorType(link.first.results[0].type).shape[axis]
    found = region.walk(link.first.results[0], axis, analysis, region.unknown(channels))
    if not isinstance(found, region.Region):
        return found if isinstance(found, Refusal) else \
            Refusal(Code.NO_LAW, "no layer follows any more")
    if found.consumer != link.second:
        return Refusal(Code.NO_LAW, "the layers are no longer adjacent")
    path = _Path(list(found.ops), {(op_id(e.op), e.operand): e for e in found.edits},
                 link.first.results[0])
    path.layout()
    bias = path.bias()
    if isinstance(bias, Refusal):
        return bias
    path.layout()
    act = path.activation()
    if isinstance(act, Refusal):
        return act
    lower, uppers = act
    shifted = path.shifted(axis, analysis)
    if isinstance(shifted, Refusal):
        return shifted
    shift_axis, factor = shifted
    if link.second.operands[found.operand] != path.current:
        return Refusal(Code.ROLE, "layer 2 does not read the activation's path")
    return Roles(link, bias, lower, tuple(uppers), shift_axis,
                 np.broadcast_to(np.asarray(factor, dtype=np.float64), (channels,)).copy(),
                 link.second, found.operand)


def _short(op: ir.Operation) -> str:
    return op.name.removeprefix("stablehlo.")


@dataclass
class _Path:
    """The region's ops, consumed in order along the one path from layer 1 to layer 2."""

    ops: list[ir.Operation]
    edits: dict[tuple[int, int], Edit]
    current: ir.Value
    position: int = 0

    def peek(self) -> ir.Operation | None:
        return self.ops[self.position] if self.position < len(self.ops) else None

    def edit(self, op: ir.Operation, operand: int) -> Edit | None:
        return self.edits.get((op_id(op), operand))

    def take(self, op: ir.Operation) -> None:
        self.position += 1
        self.current = op.results[0]

    def layout(self) -> None:
        while (op := self.peek()) is not None and op.name in _LAYOUT and \
                op.operands[0] == self.current:
            self.take(op)

    def bias(self) -> Edit | Refusal:
        op = self.peek()
        if op is None or op.name not in ("stablehlo.add", "stablehlo.subtract") or \
                self.current not in list(op.operands):
            what = "nothing" if op is None else _short(op)
            return Refusal(Code.ROLE, f"{what} follows layer 1 where its bias add must be "
                                      "(high-bias absorption needs bias, then the activation)")
        index = 1 - list(op.operands).index(self.current)
        constant = self.edit(op, index)
        if constant is None or (op.name == "stablehlo.subtract" and index != 1):
            return Refusal(Code.ROLE, f"{_short(op)} after layer 1 is not a bias add of a "
                                      "per-channel constant")
        self.take(op)
        return constant

    def activation(self) -> tuple[Edit | None, list[Edit]] | Refusal:
        """One ReLU-like activation: its lower-bound edit (0; None for a select-ReLU) and
        upper-bound edits."""
        op = self.peek()
        if op is None or self.current not in list(op.operands):
            return Refusal(Code.ROLE, "no ReLU-like activation (lower bound 0) between the layers")
        if op.name == "stablehlo.clamp":
            lo, hi = self.edit(op, 0), self.edit(op, 2)
            if lo is None or hi is None or op.operands[1] != self.current or \
                    not np.all(lo.vector == 0):
                return Refusal(Code.ROLE, "a clamp whose lower bound is not 0 (the identity "
                                          "act(y) = act(y - c) + c needs a lower bound at 0)")
            self.take(op)
            return lo, [hi]
        if op.name == "stablehlo.maximum":
            lo = self.edit(op, 1 - list(op.operands).index(self.current))
            if lo is None or not np.all(lo.vector == 0):
                return Refusal(Code.ROLE, "a maximum with a bound other than 0 is not ReLU")
            self.take(op)
            after = self.peek()
            if after is not None and after.name == "stablehlo.minimum" and \
                    self.current in list(after.operands):
                hi = self.edit(after, 1 - list(after.operands).index(self.current))
                if hi is not None and np.all(hi.vector >= 0):
                    self.take(after)
                    return lo, [hi]
            return lo, []
        if op.name == "stablehlo.compare":
            return self._select_relu(op)
        return Refusal(Code.ROLE, f"{_short(op)} after the bias is not a ReLU-like activation "
                                  "(maximum with 0, clamp from 0, select(y > 0, y, 0))")

    def _select_relu(self, compare: ir.Operation) -> tuple[Edit | None, list[Edit]] | Refusal:
        refused = Refusal(Code.ROLE, "a comparison that is not select(y > 0, y, 0): a threshold "
                                     "other than 0 or a leaky slope is not ReLU")
        threshold = self.edit(compare, 1)
        if compare.operands[0] != self.current or threshold is None or \
                not np.all(threshold.vector == 0) or \
                attributes.comparison_direction(compare) not in ("GT", "GE"):
            return refused
        self.position += 1
        select = self.peek()
        if select is None or select.name != "stablehlo.select" or \
                select.operands[0] != compare.results[0] or select.operands[1] != self.current:
            return refused
        zero = self.edit(select, 2)
        if zero is None or not np.all(zero.vector == 0):
            return refused
        self.take(select)
        return None, []

    def shifted(self, axis: int, analysis: Any) -> tuple[int, np.ndarray | float] | Refusal:
        """Where a shift of the activation's output reaches layer 2, and times what: every
        op left on the path must pass a shift by its law."""
        factor: np.ndarray | float = 1.0
        axis = _axis_at(self, axis, analysis)
        while (op := self.peek()) is not None:
            if self.current not in list(op.operands):
                return Refusal(Code.ROLE, f"{_short(op)} between the layers is not on the path "
                                          "from layer 1 (a branch)")
            # Every other operand must be a constant: a second region value (relu(y) + y)
            # carries its own shift, which the law below would not see.
            if any(v != self.current and analysis.constant(v) is None for v in op.operands):
                return Refusal(Code.ROLE, f"{_short(op)} after the activation also reads another "
                                          "value of the region (a branch: its shift differs)")
            law = laws.law_of(op)
            if isinstance(law, Refusal):
                return law
            shifted = law.shift(op, _ShiftEnv(self.current, axis, analysis))
            if isinstance(shifted, Refusal):
                return Refusal(shifted.code, f"after the activation: {shifted.message}")
            factor = factor * shifted.factor
            axis = shifted.axis
            self.take(op)
        return axis, factor


def _axis_at(path: _Path, axis: int, analysis: Any) -> int:
    """The channel axis of the path's current value (layout ops before it may move it)."""
    for op in path.ops[:path.position]:
        if op.name in ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim"):
            moved = laws.LAWS[op.name].shift(op, _ShiftEnv(op.operands[0], axis, analysis))
            if not isinstance(moved, Refusal):
                axis = moved.axis
    return axis


@dataclass(frozen=True)
class _ShiftEnv:
    """The one shifted value a shift law sees (the activation's path)."""

    current: ir.Value
    axis_of_current: int
    analysis: Any

    def axis(self, value: ir.Value) -> int | None:
        return self.axis_of_current if value == self.current else None

    def interval(self, value: ir.Value) -> laws.Interval:
        raise NotImplementedError("shift laws read no intervals")

    def constant(self, value: ir.Value) -> Any:
        return self.analysis.constant(value)


def plan(ctx: Context, found: Roles) -> Plan | Refusal:
    """c per channel, the new constants, and c as it reaches layer 2's output."""
    stats = ctx.ledger.statistics(found.link.first)
    if stats is None and (why := ctx.ledger.no_statistics(found.link.first)) is not None:
        return Refusal(Code.NO_STATISTICS, f"layer 1: {why}")
    if stats is None:
        return Refusal(Code.NO_STATISTICS,
                       "layer 1 has no batch-norm statistics (it did not absorb a recognisable "
                       "batch norm, or a scale before the batch norm hides what they describe)")
    c = np.maximum(0.0, stats.mean - SIGMAS * stats.spread)
    for upper in found.uppers:  # a channel that always saturates passes its bound, no more
        c = np.minimum(c, np.maximum(upper.vector, 0.0))
    if not np.any(c > 0):
        return Refusal(Code.NOTHING, "nothing to absorb: beta - 3*|gamma| <= 0 in every channel")
    second = found.second
    analysis = ctx.analysis
    mapping = producers.input_scale_map(second, found.operand, found.shift_axis)
    if isinstance(mapping, Refusal):
        return mapping.wrap("layer 2")
    compute = elements.numpy_dtype(ir.RankedTensorType(second.results[0].type).element_type)
    assert compute is not None
    kernel = producers.kernel(second.operands[mapping.operand], compute, analysis.evaluator,
                              second.name)
    if isinstance(kernel, Refusal):
        return kernel.wrap("layer 2")
    through = shift_through(second, mapping, kernel, c * found.shift_factor)
    if isinstance(through, Refusal):
        return Refusal(Code.PADDING, f"layer 2's output cannot take the shift exactly: {through}")
    moved = None if through.correction is not None else -through.values
    merge = bias_adds(second.results[0], through.out_axis, analysis)
    if merge is not None:
        through = through.plus(merge.bias)
    new_bias = found.bias.vector - c
    uppers = tuple(u.vector - c for u in found.uppers)
    checks = [(new_bias, found.bias.meets), *((u, e.meets) for u, e in zip(uppers, found.uppers,
                                                                           strict=True)),
              (through.values, second.results[0])]
    for values, like in checks:
        dtype = elements.numpy_dtype(ir.RankedTensorType(like.type).element_type)
        if dtype is not None and (problem := precision.check_bias(values, dtype,
                                                                   "a constant absorption changes")):
            return problem
    tail = _TAIL * stats.spread * found.shift_factor
    magnitudes = kernel._replace(values=np.abs(kernel.values))
    spread = shift_through(second, mapping, magnitudes, tail)
    estimate = float(np.max(np.abs(spread.values))) if isinstance(spread, Through) else math.inf
    return Plan(found, c, new_bias, uppers, through, moved, merge.ops if merge else (),
                estimate, through.correction is not None)


def build(rewriter: Rewriter, p: Plan) -> ir.Operation:
    """Replaces the bias add, the activation's bounds and layer 2's bias; returns the new
    layer 2 (a copy when a new bias add had to follow it)."""
    found = p.roles
    replace_constants(rewriter, found.bias.op, [(found.bias, p.bias)])
    for edit, vector in zip(found.uppers, p.uppers, strict=True):
        replace_constants(rewriter, edit.op, [(edit, vector)])
    second = found.second
    with ir.InsertionPoint(second):
        copy = rewriter.clone(second)
    root = p.merge[-1] if p.merge else second
    with ir.InsertionPoint.after(root):
        if (corr := p.through.correction) is not None:
            dims = producers.conv_dims(second)
            value = constant_add(copy.results[0], corr.table,
                                 [*dims.output_spatial_dimensions, p.through.out_axis],
                                 second.location, corr.expand)
        else:
            assert p.through.bias is not None
            value = bias_add(copy.results[0], p.through.bias, p.through.out_axis, root.location)
    if p.merge:
        rewriter.supersede(second, copy)
        rewriter.replace_op(root, [value])
    else:
        rewriter.replace_op(second, [value], successor=copy)
    return copy


def _record(p: Plan) -> dict[str, Any]:
    exact = "exact for every input whose pre-activation stays above beta - 3*gamma"
    if p.corrected:
        exact += " (layer 2's zero-padded borders and dilation holes corrected exactly)"
    return {"link": p.roles.link.index, "absorbed": True, "channels": int(np.count_nonzero(p.c)),
            "absorbed_max": float(p.c.max()), "absorbed_mean": float(p.c.mean()),
            "estimated_output_change": p.estimate, "exact": exact}


def _note(record: Equalized, entry: dict[str, Any]) -> None:
    """The set's report entry lists its links in data-flow order (they run last first)."""
    record.high_bias.append(entry)
    record.high_bias.sort(key=lambda e: e["link"])


class AbsorbHighBias(Pattern[Link, Roles, Plan]):
    """High-bias absorption on every link of every equalized set, the last link first.

    The links are independent (each restores layer 2's pre-activation), but not their
    regions: where layer 2 zero-pads, a link's shift reaches layer 2's output as a
    border correction that varies over positions and merges with layer 2's bias, which
    is the next link's bias role. Taken last link first, that bias is still the per-channel
    constant the next link needs (a conv -> depthwise 3x3 -> conv triplet absorbs on
    both links, not only the first)."""


    def roots(self, ctx: Context) -> Iterable[Link]:
        for record, layers in ctx.analysis.handed(EQUALIZED_SETS):
            for index in reversed(range(len(layers) - 1)):
                first, second = (ctx.rewriter.current(op) for op in layers[index:index + 2])
                yield Link(record, index, first, second)

    def match(self, ctx: Context, root: Link) -> Roles | Refusal:
        return roles(root, ctx)

    def plan(self, ctx: Context, match: Roles) -> Plan | Refusal:
        return plan(ctx, match)

    def refuse(self, ctx: Context, subject: Link | Roles, refusal: Refusal) -> None:
        link = subject.link if isinstance(subject, Roles) else subject
        _note(link.record, {"link": link.index, "absorbed": False,
                            "reason": refusal.message, "code": refusal.code.value})

    def apply(self, rewriter: Rewriter, plan: Plan) -> ir.Operation:
        return build(rewriter, plan)

    def record(self, ctx: Context, plan: Plan, applied: ir.Operation) -> None:
        _note(plan.roles.link.record, _record(plan))
        ledger = ctx.ledger
        first, second = plan.roles.link.first, applied
        if (stats := ledger.statistics(first)) is not None:
            # layer 1's pre-activation moved down by c; its result did not move
            ledger.set_statistics(first, stats.shifted(-plan.c, np.zeros_like(plan.c)))
        if (stats := ledger.statistics(second)) is not None:
            # layer 2's pre-activation is restored; its result moved by -K2 c
            ledger.set_statistics(second, stats.shifted(np.zeros_like(stats.mean), plan.moved))



PATTERN = AbsorbHighBias()
