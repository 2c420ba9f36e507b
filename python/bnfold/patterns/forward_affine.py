"""forward-affine: fold a per-channel affine chain into the producer after it.

Rooted at a convolution / dot_general whose activation operand is the end of
an affine chain (see `bnfold.affine`). Before:

    %n = stablehlo.multiply %x, %scale_b : tensor<1x8x8x4xf32>
    %a = stablehlo.add %n, %shift_b : tensor<1x8x8x4xf32>
    %y = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
           window = {pad = [[0, 0], [0, 0]]} ...

After:

    %k2 = stablehlo.constant dense<...>            // K * s along the kernel's input axis
    %y2 = stablehlo.convolution(%x, %k2) ...
    %b = stablehlo.constant dense<[...]> : tensor<8xf32>   // sum over window and inputs of K * t
    %bb = stablehlo.broadcast_in_dim %b, dims = [3] ...
    %r = stablehlo.add %y2, %bb

The scale always folds (zero padding and lhs dilation insert zeros, and
0 * s = 0). The shift becomes a per-feature bias when every window position
sees real data. Through zero padding or lhs_dilation its contribution varies
near the borders; it folds exactly as a constant correction of the output
(see `bnfold.border`), built from a table no larger than the kernel plus a
margin. An explicit zero `stablehlo.pad` right before the convolution (Keras
`ZeroPadding2D` before a VALID `Conv2D`) becomes the convolution's padding:

    %a = stablehlo.add %n, %shift_b
    %p = stablehlo.pad %a, %zero, low = [0, 0, 1, 1], high = [0, 0, 1, 1], interior = [0, 0, 0, 0]
    %y = stablehlo.convolution(%p, %k) ... window = {pad = [[0, 0], [0, 0]]}
  ->
    %y2 = stablehlo.convolution(%x, %k2) ... window = {pad = [[1, 1], [1, 1]]}
    %r = stablehlo.add %y2, %correction

When the correction is refused (too large, dynamic spatial size), or when
the shift would cancel (`precision.shift_cancels`: `(x - 1e4) / 3` folded
forward computes at the magnitude of x), the scale still folds and `t / s`
stays as one add before the producer, if it is a constant of the original or
rounds like one (`precision.kept_shift_rounds`: `x * 3.66 + 1e5` has no f32
constant `t / s` that keeps the original's precision, and does not fold).
For a dot_general the shift becomes a bias only when the constant operand
has one free dimension and no batching dimensions. A narrowing convert between the chain and the producer is a
rounding that stays where it is (`bnfold.laws`): only what lies after it
folds.

The root is the producer (or the last of the bias adds right after it, which
the new bias merges into): `apply` creates the folded producer, replaces the
root through the rewriter; the old producer and the chain are left to the
cleanup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from bnfold import affine, attributes, chains, elements, precision, producers
from bnfold.affine import Affine, Step
from bnfold.analysis import Analysis
from bnfold.chains import note
from bnfold.constants import map_axis_through_reshape
from bnfold.graph import carry_attributes, defining_op
from bnfold.ir import ir, stablehlo
from bnfold.patterns.base import Pattern
from bnfold.patterns.inline_calls import CallSite, behind_calls
from bnfold.patterns.rewrite import (
    BUILDS,
    Copy,
    KernelRewrite,
    bias_add,
    constant_add,
    copy_cost,
    fold_record,
    plan_kernel,
    record_copy,
)
from bnfold.refusal import Code, Refusal
from bnfold.through import BiasAdds, bias_adds, shift_through

if TYPE_CHECKING:
    from bnfold import border
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter

# Each forward fold and the producer it built, for merge-bias (Analysis.hand_on).
FORWARD_FOLDS = "forward-affine:folds"


class Match(NamedTuple):
    """A chain that ends at a producer's activation operand (at every branch's producer,
    when a multi-platform `case` reads the chain's result once per branch)."""

    producer: ir.Operation
    act_index: int
    steps: tuple[Step, ...]  # first step first; ends at the producer's activation
    pad: ir.Operation | None = None  # an explicit zero pad between the chain and a convolution
    others: tuple[ir.Operation, ...] = ()  # the same producer in the other branches
    # Steps before a narrowing convert: they stay where they are (their rounding too).
    upstream: tuple[Step, ...] = ()
    narrowing: Refusal | None = None


class Plan(NamedTuple):
    """A forward fold, computed and checked: what `apply` writes."""

    match: Match
    affine: Affine
    kernel: KernelRewrite
    bias: np.ndarray | None
    out_axis: int
    merge: BiasAdds | None  # the producer's existing bias adds, if any
    # When the shift cannot fold (zero padding, lhs_dilation, cancellation): the shift
    # over the scale, t / s, kept as one add before the producer, and why.
    kept_shift: np.ndarray | None = None
    kept_reason: Refusal | None = None
    in_axis: int = 0  # the producer input's feature axis (where kept_shift varies)
    # A uniform shift through zero padding: the padding moves into an explicit
    # stablehlo.pad of the unshifted input with this value (-t/s), low, high.
    pad: tuple[float, list[int], list[int]] | None = None
    # The folded convolution's padding, when it changes (an absorbed or explicit pad).
    padding: np.ndarray | None = None
    # The shift's output through zero padding: varies near the borders.
    correction: border.Correction | None = None
    others: tuple[Plan, ...] = ()  # the folds of the other branches' producers
    copy: Copy | None = None  # the kernel is a copy of a weight read elsewhere too


def find(producer: ir.Operation, analysis: Analysis) -> Match | None:
    """The single-use chain of steps that ends at the producer's activation operand."""
    act_index = _activation_operand(producer, analysis)
    if act_index is None:
        return None
    steps: list[Step] = []
    value = producer.operands[act_index]
    owner = defining_op(value)
    if owner is None or (owner.name != "stablehlo.pad" and analysis.step(owner) is None):
        return None  # no step (or pad) computes the activation: nothing to fold forward
    leaves = _leaves(producer, value, act_index, analysis)
    if leaves is None or leaves[0] != producer:
        return None  # not a chain's only reader, or another branch's producer matches for all
    home = producer.block if len(leaves) == 1 else leaves[0].parent.block  # type: ignore[union-attr]
    pad = _zero_pad(producer, value, analysis) if len(leaves) == 1 else None
    if pad is not None:
        value = pad.operands[0]
    readers = len(leaves) if pad is None else 1
    while len(analysis.live_users(value)) == readers:
        owner = defining_op(value)
        if owner is None or owner.block != home:
            break
        step = analysis.step(owner)
        if step is None:
            break
        steps.append(step)
        value = step.x
        readers = 1
    # What follows a step with a parameter operand can still fold. When nothing
    # does, the whole chain stays, so that the plan tells to bind parameters.
    first_parameter = next((i for i, s in enumerate(steps) if s.parameter is not None), None)
    if first_parameter:
        steps = steps[:first_parameter]
    steps.reverse()
    while steps and steps[0].name in affine.LAYOUT:
        steps.pop(0)
    if not steps:
        return None
    return Match(producer, act_index, tuple(steps), pad, leaves[1:])


_BRANCHING = ("stablehlo.case", "stablehlo.if")


def _leaves(producer: ir.Operation, value: ir.Value, act_index: int, analysis: Analysis
            ) -> tuple[ir.Operation, ...] | None:
    """The producers that read `value` as their activation: this one alone, or one per
    branch of the `case`/`if` whose branches each compute it (a multi-platform export),
    in branch order; None when anything else reads it."""
    readers = analysis.live_users(value)
    if readers == [producer]:
        return (producer,)
    parent = producer.parent  # the op whose region holds the producer
    if parent is None or parent.name not in _BRANCHING or len(readers) != len(parent.regions):
        return None
    found: dict[int, ir.Operation] = {}
    for reader in readers:
        index = next((i for i, r in enumerate(parent.regions) if r.blocks[0] == reader.block),
                     None)
        if index is None or index in found or reader.name != producer.name or \
                reader.operands[act_index] != value:
            return None
        found[index] = reader
    return tuple(found[i] for i in range(len(parent.regions)))


def _narrowing(steps: list[Step]) -> int | None:
    """The index of the last convert in `steps` that narrows (a rounding that stays)."""
    converts = [i for i, s in enumerate(steps) if s.name == "stablehlo.convert"]
    if not converts:
        return None
    # Imported here: most chains have no convert, and the law table is the largest module
    # a plain fold would import (it costs every bnfold-opt process 5-13 ms).
    from bnfold import laws

    law = laws.LAWS["stablehlo.convert"]
    found = [i for i in converts if law.precision(steps[i].op) is laws.Precision.NARROWS]
    return found[-1] if found else None


def _split_at_narrowing(m: Match, analysis: Analysis) -> Match:
    """`m` itself when no narrowing convert is in the way, or when only a scale crosses it
    and the narrow type keeps the wide type's exponent range (rounding commutes with a scale
    up to the same relative error); otherwise what follows the convert, with the reason the
    rest stays."""
    steps = list(m.steps)
    at = _narrowing(steps)
    if at is None:
        return m
    before, convert, after = steps[:at], steps[at], steps[at + 1:]
    source, target = (elements.numpy_dtype(ir.RankedTensorType(v.type).element_type)
                      for v in (convert.x, convert.result))
    if before and source is not None and target is not None and \
            precision.same_exponent_range(source, target):
        start_shape = tuple(ir.RankedTensorType(before[0].x.type).shape)
        axis = _axis_at_start(steps, _input_axis(m.producer, m.act_index) or 0)
        if axis is not None:
            composed = affine.compose(before, Affine.identity(start_shape, axis),
                                      analysis.evaluator)
            if composed.stop_reason is None and not np.any(composed.affine.shift):
                return m
    if not affine.normalizes(before):
        return m._replace(steps=tuple(after))
    names = [precision.type_name(d) if d is not None else "?" for d in (source, target)]
    reason = Refusal(
        Code.NARROWING,
        f"forward: a convert rounds the normalized value from {names[0]} to {names[1]} before "
        f"the producer; folded forward, the unnormalized input would be rounded to {names[1]} "
        f"instead (before the mean is removed), so it stays: a rounding stays where the "
        f"original has it")
    return m._replace(steps=tuple(after), upstream=tuple(before), narrowing=reason)


def _zero_pad(producer: ir.Operation, value: ir.Value, analysis: Analysis) -> ir.Operation | None:
    """An explicit zero pad feeding only this convolution, that its padding can take over.

    Edge padding of spatial axes only, no interior padding, none negative (a
    crop before the convolution's own padding does not add up), and a
    convolution without lhs_dilation (which would dilate the pad's zeros too)."""
    owner = defining_op(value)
    if producer.name != "stablehlo.convolution" or owner is None or \
            owner.name != "stablehlo.pad" or owner.block != producer.block or \
            len(analysis.live_users(value)) != 1 or attributes.is_lhs_dilated(producer):
        return None
    zero = analysis.constant(owner.operands[1])
    if zero is None or np.any(zero.array != 0):
        return None
    rank = ir.RankedTensorType(owner.operands[0].type).rank
    low, high, interior = (attributes.ints(owner, name, default=0, rank=rank)
                           for name in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    spatial = set(producers.conv_dims(producer).input_spatial_dimensions)
    if any(interior) or min(low + high) < 0 or \
            any(low[d] or high[d] for d in range(len(low)) if d not in spatial):
        return None
    return owner


def _padding(m: Match) -> np.ndarray | None:
    """The convolution's padding [spatial, 2], including an absorbed explicit pad."""
    op = m.producer
    if op.name != "stablehlo.convolution":
        return None
    padding = attributes.padding(op)
    if m.pad is not None:
        rank = ir.RankedTensorType(m.pad.operands[0].type).rank
        low = attributes.ints(m.pad, "edge_padding_low", default=0, rank=rank)
        high = attributes.ints(m.pad, "edge_padding_high", default=0, rank=rank)
        for k, d in enumerate(producers.conv_dims(op).input_spatial_dimensions):
            padding[k] += (low[d], high[d])
    return padding


def plan(m: Match, analysis: Analysis, *, pad_uniform_shift: bool = False
         ) -> Plan | Refusal | None:
    """The fold of `m` (into each branch's producer too), or why it cannot fold
    (None: nothing worth folding)."""
    first = _plan_one(m, analysis, pad_uniform_shift=pad_uniform_shift)
    if not isinstance(first, Plan) or not m.others:
        return first
    others: list[Plan] = []
    for leaf in m.others:
        other = _plan_one(m._replace(producer=leaf, others=()), analysis,
                          pad_uniform_shift=pad_uniform_shift)
        if not isinstance(other, Plan):
            return other
        others.append(other)
    return first._replace(others=tuple(others))


def _plan_one(m: Match, analysis: Analysis, *, pad_uniform_shift: bool = False
              ) -> Plan | Refusal | None:
    """The fold of `m` into `m.producer`."""
    m = _split_at_narrowing(m, analysis)
    while m.steps and m.steps[0].name in affine.LAYOUT:
        m = m._replace(steps=m.steps[1:])
    op, steps = m.producer, list(m.steps)
    if not steps:
        return m.narrowing
    end_type = elements.ranked_type(steps[-1].result)
    if end_type is None or not elements.is_float(end_type.element_type):
        return None
    axis_at_end = _input_axis(op, m.act_index)
    if axis_at_end is None:
        return Refusal(Code.AXIS, "forward: the dot_general contracts more than one dimension")
    start_axis = _axis_at_start(steps, axis_at_end)
    if start_axis is None:
        return Refusal(Code.AXIS, "forward: a reshape merges or splits the feature axis")
    first = steps[0]
    start_shape = tuple(ir.RankedTensorType(first.x.type).shape)
    composed = affine.compose(steps, Affine.identity(start_shape, start_axis), analysis.evaluator)
    if composed.stop_reason is not None:
        # Forward folding needs the whole chain up to the producer.
        return composed.stop_reason.wrap("forward")
    if not composed.normalizes:
        return m.narrowing
    mapping = producers.input_scale_map(op, m.act_index, axis_at_end)
    if isinstance(mapping, Refusal):
        return mapping.wrap("forward")
    fit = composed.affine
    if not (np.all(np.isfinite(fit.scale)) and np.all(np.isfinite(fit.shift))):
        return Refusal(Code.PRECISION, "forward: folded scale or shift is not finite")
    compute = elements.numpy_dtype(end_type.element_type)
    assert compute is not None
    kernel = producers.kernel(op.operands[mapping.operand], compute, analysis.evaluator,
                              op.name.removeprefix("stablehlo."))
    if isinstance(kernel, Refusal):
        return kernel.wrap("forward")
    rewrite = plan_kernel(kernel, mapping.expand(fit.scale, kernel.shape), mapping.operand)
    if isinstance(rewrite, Refusal):
        return rewrite.wrap("forward")
    absorbed = _padding(m) if m.pad is not None else None
    if not np.any(fit.shift != 0):
        return Plan(m, fit, rewrite, None, 0, None, padding=absorbed)
    cancels = precision.shift_cancels(fit.shift)
    if cancels is not None:
        return _scale_only(m, fit, rewrite, cancels, axis_at_end, end_type, absorbed)
    padding = _padding(m)
    if pad_uniform_shift and padding is not None and \
            attributes.reads_inserted_zeros(op, padding):
        padded = _uniform_shift_through_padding(m, fit, rewrite, end_type, analysis, padding)
        if padded is not None:
            return padded
    unpadded = ir.RankedTensorType(m.pad.operands[0].type) if m.pad is not None else None
    through = shift_through(op, mapping, kernel, fit.shift, padding, unpadded)
    if isinstance(through, Refusal):
        return _scale_only(m, fit, rewrite, through, axis_at_end, end_type, absorbed)
    merge = bias_adds(op.results[0], through.out_axis, analysis)
    if merge is None and not np.any(through.values):
        # the shift reaches no output (a window that reads only padding): nothing to add,
        # and an add of zeros would be an identity the next run removes (not idempotent)
        return Plan(m, fit, rewrite, None, 0, None, padding=absorbed)
    if merge is not None:
        through = through.plus(merge.bias)
    out_dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
    if out_dtype is not None and (problem := precision.check_bias(through.values, out_dtype)):
        return problem.wrap("forward")
    return Plan(m, fit, rewrite, through.bias, through.out_axis, merge, padding=absorbed,
                correction=through.correction)


def _uniform_shift_through_padding(m: Match, fit: Affine, rewrite: KernelRewrite,
                                   end_type: ir.RankedTensorType, analysis: Analysis,
                                   padding: np.ndarray) -> Plan | None:
    """The exact fold of a uniform shift (the same t/s on every channel, e.g. Keras
    `Rescaling(1/127.5, offset=-1)`) through a convolution's zero padding.

        conv(pad0(x * s + t), K) == conv(pad(x, value=-u), K * s) + u * sum(K * s),   u = t / s

    since pad0(x + u) == pad(x, -u) + u everywhere. The padding moves into an
    explicit `stablehlo.pad`; the convolution becomes VALID. None when it does
    not apply (not a convolution, lhs_dilation, negative padding, a zero or a
    per-channel scale-to-shift ratio)."""
    op = m.producer
    if op.name != "stablehlo.convolution" or np.any(fit.scale == 0):
        return None
    if attributes.is_lhs_dilated(op) or np.any(padding < 0):
        return None
    ratio = fit.shift / fit.scale
    if not np.all(ratio == ratio[0]):
        return None
    dtype = elements.numpy_dtype(end_type.element_type)
    if dtype is None or precision.significand_bits(dtype) < precision.significand_bits(
            np.dtype(np.float32)):
        return None  # as for the kept shift: extra narrow roundings (see _scale_only)
    value = float(np.asarray(-ratio[0]).astype(dtype))  # the pad value, as the program holds it
    if not np.isfinite(value):
        return None
    dims = producers.conv_dims(op)
    low, high = [0] * end_type.rank, [0] * end_type.rank
    for k, d in enumerate(dims.input_spatial_dimensions):
        low[d], high[d] = int(padding[k][0]), int(padding[k][1])
    kernel = rewrite.rounded.values.astype(rewrite.kernel.effective).astype(np.float64)
    kernel = np.broadcast_to(kernel, rewrite.kernel.shape)
    out_kernel = dims.kernel_output_feature_dimension
    axes = tuple(d for d in range(kernel.ndim) if d != out_kernel)
    bias = -value * np.sum(kernel, axis=axes)
    out_axis = dims.output_feature_dimension
    merge = bias_adds(op.results[0], out_axis, analysis)
    if merge is not None:
        bias = bias + merge.bias
    out_dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
    if out_dtype is not None and precision.check_bias(bias, out_dtype):
        return None
    return Plan(m, fit, rewrite, bias, out_axis, merge, pad=(value, low, high),
                padding=np.zeros_like(padding))


def _scale_only(m: Match, fit: Affine, rewrite: KernelRewrite, reason: Refusal, axis: int,
                end_type: ir.RankedTensorType, padding: np.ndarray | None) -> Plan | Refusal:
    """Folds the scale only: x * s + t == (x + t / s) * s, and the zero padding
    the producer adds sees zeros either way; t / s stays as one add before it."""
    if np.any(fit.scale == 0):
        return Refusal(reason.code, f"forward: {reason} (and a zero scale keeps the shift from "
                                    f"staying alone)")
    dtype = elements.numpy_dtype(end_type.element_type)
    if dtype is None or precision.significand_bits(dtype) < precision.significand_bits(
            np.dtype(np.float32)):
        # In f16/bf16 the kept form rounds t/s and x + t/s in the narrow type on top
        # of the scaled kernel; the thorough property suite found ill-conditioned
        # cases where that is measurably worse than the original.
        name = precision.type_name(dtype) if dtype else "this type"
        return Refusal(reason.code, f"forward: {reason} (in {name} the shift is not kept apart: "
                                    f"it would add roundings the original never made)")
    kept = fit.shift / fit.scale
    if problem := (precision.check_bias(kept, dtype) or
                   precision.kept_shift_rounds(kept, fit.scale, dtype)):
        return Refusal(problem.code, f"forward: {reason}; {problem}")
    return Plan(m, fit, rewrite, None, 0, None, kept, reason, axis, padding=padding)


def _activation_operand(op: ir.Operation, analysis: Analysis) -> int | None:
    """The non-constant operand: lhs for convolution, either side for dot_general."""
    if op.name == "stablehlo.convolution":
        return 0
    lhs_const = producers.is_constant(op.operands[0], analysis.evaluator)
    rhs_const = producers.is_constant(op.operands[1], analysis.evaluator)
    if lhs_const == rhs_const:
        return None
    return 1 if lhs_const else 0


def _input_axis(op: ir.Operation, act_index: int) -> int | None:
    if op.name == "stablehlo.convolution":
        return producers.conv_dims(op).input_feature_dimension
    dims = producers.dot_dims(op)
    contracting = dims.lhs_contracting_dimensions if act_index == 0 else dims.rhs_contracting_dimensions
    return contracting[0] if len(contracting) == 1 else None


def _axis_at_start(steps: list[Step], axis: int) -> int | None:
    """Maps the producer-input axis back through the chain's layout steps."""
    for step in reversed(steps):
        if step.name == "stablehlo.transpose":
            axis = attributes.permutation(step.op)[axis]
            continue
        if step.name != "stablehlo.reshape":
            continue
        after = tuple(ir.RankedTensorType(step.result.type).shape)
        before = tuple(ir.RankedTensorType(step.op.operands[0].type).shape)
        mapped = map_axis_through_reshape(after, before, axis)
        if mapped is None:
            return None
        axis = mapped
    return axis


def _explicit_pad(value: ir.Value, pad_value: float, low: list[int], high: list[int],
                  loc: ir.Location) -> ir.Value:
    ty = ir.RankedTensorType(value.type)
    with loc:
        scalar = ir.RankedTensorType.get([], ty.element_type)
        const = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
            scalar, ir.FloatAttr.get(ty.element_type, pad_value)))
        return stablehlo.PadOp(value, const.result, low, high, [0] * ty.rank).result


class Applied(NamedTuple):
    """What `apply` built: the op that names the normalization and the folded producer
    (and, in a multi-platform export, the other branches' producers)."""

    norm: ir.Operation
    producer: ir.Operation
    others: tuple[ir.Operation, ...] = ()


def build(rewriter: Rewriter, p: Plan) -> Applied:
    """Builds the folded producer(s) (and merged bias); replaces the root(s)."""
    applied = _build_one(rewriter, p)
    others = tuple(_build_one(rewriter, other).producer for other in p.others)
    return applied._replace(others=others)


def _build_one(rewriter: Rewriter, p: Plan) -> Applied:
    """Builds one folded producer (and merged bias); replaces its root."""
    op, steps = p.match.producer, list(p.match.steps)
    norm = affine.norm_op(steps)
    with ir.InsertionPoint(op):
        kernel_value = p.kernel.build(op.location)
        with op.location:
            start = affine.replay_layout(steps[0].x, steps)
        if p.kept_shift is not None:
            start = bias_add(start, p.kept_shift, p.in_axis, norm.location)
        if p.pad is not None:
            start = _explicit_pad(start, *p.pad, norm.location)
        folded = rewriter.clone(op, {p.kernel.operand: kernel_value, p.match.act_index: start})
    if p.padding is not None:  # an absorbed pad, or one moved into an explicit pad (a new op)
        folded.attributes["padding"] = ir.DenseIntElementsAttr.get(
            cast(Any, np.ascontiguousarray(p.padding, dtype=np.int64)))
    if p.bias is None and p.correction is None:
        rewriter.replace_op(op, [folded.results[0]], successor=folded)
        return Applied(norm, folded)
    root = p.merge.root if p.merge is not None else op
    loc = root.location if p.merge is not None else norm.location
    with ir.InsertionPoint.after(root):
        if (corr := p.correction) is not None:
            dims = producers.conv_dims(op)
            replacement = constant_add(folded.results[0], corr.table,
                                       [*dims.output_spatial_dimensions, p.out_axis], loc,
                                       corr.expand)
        else:
            assert p.bias is not None
            replacement = bias_add(folded.results[0], p.bias, p.out_axis, loc)
    owner = defining_op(replacement)
    if owner is not None and p.merge is not None:
        carry_attributes(root, owner)
    if p.merge is not None:
        rewriter.supersede(op, folded)
        rewriter.replace_op(root, [replacement], successor=owner)
    else:
        rewriter.replace_op(op, [replacement], successor=folded)
    return Applied(norm, folded)


class ForwardAffine(Pattern[ir.Operation, Match, Plan]):
    """Folds the affine chain before each producer into it."""

    # `build`'s kernel and biases, an explicit pad (`_explicit_pad`), the border correction's
    # table (bnfold.border: slices and concatenates of a broadcast constant).
    builds = BUILDS | {"stablehlo.pad", "stablehlo.slice"}


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        for producer in chains.candidates(ctx).producers:
            yield ctx.rewriter.current(producer)  # a backward fold may have replaced it

    def match(self, ctx: Context, root: ir.Operation) -> Match | None:
        found = find(root, ctx.analysis)  # mostly None at once: liveness costs more
        return None if found is None or ctx.analysis.is_dead(root) else found

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal | None:
        found = plan(match, ctx.analysis, pad_uniform_shift=ctx.options.pad_uniform_shift)
        if not isinstance(found, Plan):
            return found
        return found._replace(copy=copy_cost(found.kernel, [match.producer, *match.others],
                                             ctx.analysis))

    def refuse(self, ctx: Context, subject: ir.Operation | Match, refusal: Refusal) -> None:
        if not isinstance(subject, Match):
            return
        split = _split_at_narrowing(subject, ctx.analysis)
        note(ctx, list(split.upstream if refusal.code is Code.NARROWING and split.upstream
                       else subject.steps), forward=refusal)

    def apply(self, rewriter: Rewriter, plan: Plan) -> Applied:
        return build(rewriter, plan)

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """A padding helper (`jnp.pad`, nested at any depth) between a normalization and a
        convolution's input."""
        if not (ctx.body_ops(callee) & {"stablehlo.pad", "func.call"}):
            return False
        analysis = ctx.analysis
        site = CallSite(call, callee)
        for index, result in enumerate(call.results):
            user = analysis.sole_live_user(result)
            if user is None or user.name != "stablehlo.convolution" or user.operands[0] != result:
                continue
            value, inner = behind_calls(site.returned(index), site)
            pad = defining_op(value)
            if pad is None or pad.name != "stablehlo.pad":
                continue
            source = inner.argument_value(pad.operands[0])
            owner = defining_op(source) if source is not None else None
            if owner is not None and analysis.step(owner) is not None:
                return True
        return False

    def may_inline(self, ctx: Context, callee: ir.Operation) -> bool:
        return bool(ctx.body_ops(callee) & {"stablehlo.pad", "func.call"})

    def record(self, ctx: Context, plan: Plan, applied: Applied) -> None:
        m = plan.match  # the steps that folded (after a narrowing convert, if one stays)
        fold = ctx.ledger.fold(
            fold_record(ctx.ledger, applied.producer, applied.norm, plan.affine, "forward",
                        plan.kernel.worst_relative_rounding, list(m.steps)),
            [s.op for s in m.steps], producer=applied.producer)
        for other in applied.others:  # the other branches of a multi-platform case
            ctx.ledger.fold_carried_by(fold, other)
        ctx.analysis.hand_on(FORWARD_FOLDS, fold, [applied.producer])
        consumed = list(plan.merge.ops) if plan.merge is not None else []
        if m.pad is not None:
            consumed.append(m.pad)
        ctx.ledger.consume(fold, consumed)
        if plan.correction is not None:
            fold.note = (f"shift folded exactly through zero padding: a border correction "
                         f"built from {plan.correction.table.size} constants")
        if plan.kept_reason is not None:
            fold.note = (f"scale folded; the shift stays as one add before the "
                         f"{m.producer.name.removeprefix('stablehlo.')}: {plan.kept_reason}")
        record_copy(fold, plan.copy)
        if m.narrowing is not None:
            note(ctx, list(m.upstream), forward=m.narrowing)


PATTERN = ForwardAffine()
