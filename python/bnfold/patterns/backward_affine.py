"""backward-affine: fold a per-channel affine chain into the producer before it.

A chain of affine steps (see `bnfold.affine`, `bnfold.chains`) whose head
reads a linear producer with a constant kernel. Before (Flax linen):

    %k = stablehlo.constant dense<...> : tensor<3x3x3x4xf32>
    %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], ...
    %c = stablehlo.subtract %y, %mean_b : tensor<1x8x8x4xf32>
    %s = stablehlo.multiply %c, %scale_b : tensor<1x8x8x4xf32>
    %r = stablehlo.add %s, %beta_b : tensor<1x8x8x4xf32>

After:

    %k2 = stablehlo.constant dense<...> : tensor<3x3x3x4xf32>      // K * s along o
    %y2 = stablehlo.convolution(%x, %k2) dim_numbers = ..., ...
    %b = stablehlo.constant dense<[...]> : tensor<4xf32>           // (B - mean) * s + beta
    %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<4xf32>) -> tensor<1x8x8x4xf32>
    %r2 = stablehlo.add %y2, %bb : tensor<1x8x8x4xf32>

The same holds for `batch_norm_inference`, a bias add before the norm, the
Keras scale/shift form, Equinox's divide and torchax's two multiplies.

`match` and `plan` are pure (they return a value or a refusal); `apply`
creates the folded producers and the bias, and replaces the chain's last
folded op (the root): the old producer and chain become dead and the cleanup
removes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import affine, chains, elements, precision, producers, statistics
from bnfold.affine import Affine, Composed, Step
from bnfold.analysis import Analysis
from bnfold.chains import Chain, note
from bnfold.constants import NotConst, argument_refusal, describe_argument, parameter_argument
from bnfold.elements import all_true, any_true
from bnfold.graph import carry_attributes, defining_op, single_block
from bnfold.ir import ir, op_id
from bnfold.ledger import Statistics
from bnfold.patterns.base import Pattern
from bnfold.patterns.inline_calls import CallSite, behind_calls, ops_within
from bnfold.patterns.rewrite import (
    BUILDS,
    Copy,
    KernelRewrite,
    bias_add,
    copy_cost,
    fold_record,
    plan_kernel,
    record_copy,
)
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter



class Source(NamedTuple):
    """What the chain reads: a producer's result, or the result of a region op
    (`stablehlo.case` / `stablehlo.if`, as multi-platform exports emit) whose
    every branch returns a producer's result (the leaves)."""

    value: ir.Value
    leaves: tuple[ir.Operation, ...]

    @property
    def direct(self) -> bool:
        return defining_op(self.value) == self.leaves[0]


class Match(NamedTuple):
    """A chain and the producer(s) its head reads."""

    source: Source
    chain: Chain


class Plan(NamedTuple):
    """A backward fold, computed in float64, ready to apply."""

    source: Source
    steps: tuple[Step, ...]  # the folded prefix of the chain
    affine: Affine
    kernels: tuple[KernelRewrite, ...] | None  # one per leaf; None: kernels kept (scale 1)
    bias: np.ndarray | None  # None when the shift is exactly 0
    rest_reason: Refusal | None  # why the chain's remaining steps did not fold
    chain: Chain | None = None
    copy: Copy | None = None  # the kernels are copies of a weight read elsewhere too

    @property
    def kernel_rounding(self) -> float:
        return max((k.worst_relative_rounding for k in self.kernels or ()), default=0.0)


_REGION_OPS = ("stablehlo.case", "stablehlo.if")


def source(chain: Chain, analysis: Analysis) -> Source | None:
    """The producer (or branch producers) whose result is the chain's head operand."""
    value = chain.head.x
    owner = defining_op(value)
    if owner is None or owner.block != chain.head.op.block:
        return None
    if producers.is_producer(owner):
        return Source(value, (owner,))
    if owner.name not in _REGION_OPS:
        return None
    index = next(i for i, r in enumerate(owner.results) if r == value)
    leaves = []
    for region in owner.regions:
        block = region.blocks[0]
        returned = list(block.operations)[-1].operands[index]
        leaf = defining_op(returned)
        if leaf is None or not producers.is_producer(leaf) or leaf.block != block or \
                len(analysis.live_users(returned)) != 1:
            return None
        leaves.append(leaf)
    return Source(value, tuple(leaves))


def _arena(ctx: Context) -> precision.Arena:
    """The buffer backward folds round their kernels into, one per run (precision.Arena)."""
    return precision.Arena()


def plan_fold(source: Source, chain: Chain, analysis: Analysis, *,
              require_normalizing: bool = True, arena: precision.Arena | None = None,
              narrow_kernels: bool = False) -> Plan | Refusal:
    """The longest foldable prefix of `chain` over the producers' candidate axes, or why none.

    `narrow_kernels` (--fold-into-narrow-kernels) folds an affine applied in a wider type
    than the producer's, whose result stays wide, into the narrow kernel anyway
    (`_scaled_in`).

    The new kernels are rounded into `arena` when given: the plan must then be
    applied (or dropped) before the arena is cleared.
    """
    uses = len(analysis.live_users(source.value))
    if uses != 1:
        return Refusal(Code.USERS, f"producer result has {uses} users")
    result_type = elements.ranked_type(source.value)
    if result_type is None:
        return Refusal(Code.SYMBOLIC, "producer result is not a ranked tensor")
    if not elements.is_float(result_type.element_type):
        return Refusal(Code.NOT_FLOAT, f"producer result type {result_type.element_type} is not "
                                       f"float")
    compute = elements.numpy_dtype(result_type.element_type)
    assert compute is not None
    shape = elements.shape_of(result_type)  # -1 for symbolic dimensions
    steps = list(chain.steps)
    reasons: list[tuple[bool, Refusal]] = []  # (the prefix would normalize, why not)
    best: tuple[Composed, list[producers.KernelAxis]] | None = None
    for axis in producers.candidate_output_axes(source.leaves[0]):
        if shape[axis] < 0:
            reasons.append((False, Refusal(Code.SYMBOLIC,
                                           f"the feature axis {axis} has a symbolic size")))
            continue
        composed = affine.compose(steps, Affine.identity(shape, axis), analysis.evaluator)
        if not composed.steps or (require_normalizing and not composed.normalizes):
            reasons.append((composed.normalizes,
                            composed.stop_reason or Refusal(Code.NOTHING, "nothing to fold")))
            continue
        kernel_axes = _kernel_axes(source.leaves, axis, analysis)
        if isinstance(kernel_axes, Refusal):
            reasons.append((composed.normalizes, kernel_axes))
            continue
        if best is None or len(composed.steps) > len(best[0].steps):
            best = (composed, kernel_axes)
    if best is None:
        # Prefer the reason of a prefix that would have normalized.
        reasons.sort(key=lambda r: not r[0])
        return reasons[0][1] if reasons else Refusal(Code.NOTHING, "nothing to fold")
    composed, kernel_axes = best
    fit = composed.affine
    if not (all_true(np.isfinite(fit.scale)) and all_true(np.isfinite(fit.shift))):
        return Refusal(Code.PRECISION, "folded scale or shift is not finite")
    rewrites: list[KernelRewrite] | None = None
    # A normalization always gets new, canonical kernel constants; merging a
    # bias (require_normalizing=False) keeps the kernels when the scale is 1.
    if require_normalizing or any_true(fit.scale != 1):
        rewrites = []
        scaled_in = compute if narrow_kernels else \
            _scaled_in(list(composed.steps), fit, compute, analysis)
        for leaf, kernel_axis in zip(source.leaves, kernel_axes, strict=True):
            kernel = producers.kernel(leaf.operands[kernel_axis.operand], scaled_in,
                                      analysis.evaluator, _producer_word(leaf))
            if isinstance(kernel, Refusal):
                if kernel.code is Code.PRECISION and scaled_in != compute:
                    return _stays_wide(compute, scaled_in, _producer_word(leaf))
                return kernel
            factor = producers.axis_factor(fit.scale, kernel_axis.axis, len(kernel.shape))
            planned = plan_kernel(kernel, factor, kernel_axis.operand, arena=arena)
            if isinstance(planned, Refusal):
                return planned
            rewrites.append(planned)
    lead = affine.leading_converts(list(composed.steps))
    holds = _narrowest(compute, lead)
    if rewrites is not None and any_true(np.abs(fit.scale) > 1) and (
            problem := precision.grown_result(
                fit.scale, _overshoot(composed, Affine.identity(shape, fit.origin), holds),
                lambda: _result_bound(list(composed.steps), fit, analysis), holds,
                _producer_word(source.leaves[0]))):
        return problem
    bias = fit.shift if any_true(fit.shift != 0) else None
    bias_type = elements.ranked_type(lead[-1].result if lead else source.value)
    bias_dtype = elements.numpy_dtype(bias_type.element_type) if bias_type else compute
    if bias is not None and (problem := precision.check_bias(bias, bias_dtype or compute)):
        return problem
    return Plan(source, tuple(composed.steps), fit, None if rewrites is None else tuple(rewrites),
                bias, composed.stop_reason, chain)


_SCALING = ("stablehlo.multiply", "stablehlo.divide", "stablehlo.batch_norm_inference")


def _scaled_in(steps: list[Step], fit: Affine, compute: np.dtype, analysis: Analysis
               ) -> np.dtype:
    """The type the fold must treat the scale as computed in (docs/precision.md, rule 9):
    the producer's (`compute`), unless the chain converts the producer's narrow result to
    a wider type, scales it there and its result stays wide (`convert(bf16 dot) -> f32 *
    c`, returned in f32). Then the original rounds no weight, and XLA computes the
    converted dot_general's result in f32 too: a scaled kernel rounded to the narrow type
    is a rounding the original does not make (measured: up to 1e4x its error against
    float64), so the wide type is returned (the kernel then needs a wide source behind a
    convert). A chain rounded back to the producer's type at its end (torchvision's bf16
    ResNet: bf16 conv, f32 batch norm, convert to bf16) keeps `compute`: its last
    rounding dominates (measured: within 1.9x, inside the contract's one bf16 ulp), as
    do a chain that computes in the narrow type before its convert (`(y - mean)` in bf16:
    the original rounds there; measured within 2.2x, inside one bf16 ulp) and a
    power-of-two scale with the same exponent range (exact)."""
    def dtype(value: ir.Value) -> np.dtype | None:
        ty = elements.ranked_type(value)
        return elements.numpy_dtype(ty.element_type) if ty is not None else None

    wide = [d for s in steps if s.name in _SCALING and (d := dtype(s.result)) is not None and
            precision.is_narrower(compute, d)]
    if not wide or not steps:
        return compute
    for step in steps:
        if step.name == "stablehlo.convert":
            break
        if step.name not in affine.LAYOUT:
            return compute  # the original rounds in the narrow type after the producer
    end = dtype(steps[-1].result)
    user = analysis.sole_live_user(steps[-1].result)
    if user is not None and user.name == "stablehlo.convert":
        end = dtype(user.results[0])
    if end is None or not precision.is_narrower(compute, end):
        return compute  # rounded back to the producer's type (or narrower) at the end
    widest = max(wide, key=precision.significand_bits)
    mantissas = np.frexp(np.abs(fit.scale[fit.scale != 0]))[0]
    if np.all(mantissas == 0.5) and precision.same_exponent_range(widest, compute):
        return compute  # powers of two: exact in the narrow type
    return widest


def _stays_wide(compute: np.dtype, wide: np.dtype, producer: str) -> Refusal:
    n, w = precision.type_name(compute), precision.type_name(wide)
    return Refusal(Code.PRECISION,
                   f"precision: the {producer} computes in {n}, but its result is converted to "
                   f"{w}, scaled there, and stays {w}; folding would round the scaled weights "
                   f"to {n} (relative error up to {precision.unit_roundoff(compute):.1e}), a "
                   f"rounding the original does not make (XLA computes a converted {n} "
                   f"{producer}'s result in {w}: measured up to 1e4x the original's error "
                   f"against float64). Keep it, keep the weights in {w} behind a convert, or "
                   f"fold anyway with --fold-into-narrow-kernels")


def _normalizes_an_argument(call: ir.Operation, site: CallSite, analysis: Analysis) -> bool:
    """Whether `call` passes a producer result (with a constant kernel, and no other live
    user) that the helper's first op takes as the activation of an affine step."""
    arguments = site.arguments
    for passed, argument in zip(call.operands, arguments, strict=False):
        # The helper's side first: most helpers (activations) start with no affine step,
        # and walking the caller's chain back to its producer costs more.
        if not _scales_argument(argument, analysis):
            continue
        producer = _chain_source(passed, call, analysis)
        if producer is not None and \
                any(analysis.is_constant(producer.operands[i]) for i in (0, 1)) and \
                not _caller_part_refused(passed, analysis):
            return True
    return False


# Refusals of the caller's part of a chain that steps after it (the helper's) cannot undo:
# a statistic or kernel that is no constant, another user, a wrong axis, no producer.
_FINAL = frozenset({Code.PARAMETER, Code.KERNEL_ARGUMENT, Code.NOT_CONSTANT, Code.LOOP,
                    Code.NO_PRODUCER, Code.USERS, Code.AXIS, Code.SYMBOLIC, Code.NOT_FLOAT,
                    Code.QUANTIZED})


def _caller_part_refused(passed: ir.Value, analysis: Analysis) -> bool:
    """Whether the affine steps the caller applies before the call (`@scaled(bn(x W))`)
    are refused on their own for a reason the helper's steps after them cannot undo (a
    parameter mean, the batch axis): inlining the helper would then gain nothing."""
    owner = defining_op(passed)
    if owner is None or analysis.step(owner) is None:
        return False  # the producer's own result: the caller has no part
    plan = _dry_plan(owner, analysis, require_normalizing=False)
    return plan is None or isinstance(plan, Refusal) and plan.code in _FINAL


def _dry_plan(op: ir.Operation, analysis: Analysis, *, require_normalizing: bool = True,
              narrow_kernels: bool = False) -> Plan | Refusal | None:
    """This pattern's plan, now, for the whole chain the step `op` belongs to (None: no
    step, or no producer before the chain). No arena: the plan is only looked at."""
    step = analysis.step(op)
    if step is None:
        return None
    chain = chains.chain_of(step, analysis)
    found = source(chain, analysis)
    if found is None or analysis.is_dead(chain.tail.op):
        return None
    return plan_fold(found, chain, analysis, require_normalizing=require_normalizing,
                     narrow_kernels=narrow_kernels)


def _scales_argument(argument: ir.Value, analysis: Analysis) -> bool:
    """Whether a helper's argument is the activation of an affine step, its only use."""
    user = analysis.sole_live_user(argument)
    step = analysis.step(user) if user is not None else None
    return step is not None and step.x == argument


MAX_CHAIN_WALK = 64  # affine steps between a producer and the helper call it feeds


def _chain_source(value: ir.Value, user: ir.Operation, analysis: Analysis
                  ) -> ir.Operation | None:
    """The producer whose result reaches `user` as `value` through affine steps only, each
    value with no other live user (the caller's own part of the chain: `conv * 1.2` before
    the helper folds first, and a second run must not find more), or None."""
    for _ in range(MAX_CHAIN_WALK):
        # The owner first: a constant passed to every call of a helper has hundreds of
        # users, and none of them matters when it is no producer or step.
        owner = defining_op(value)
        if owner is None:
            return None
        producer = producers.is_producer(owner)
        step = None if producer else analysis.step(owner)
        if not producer and step is None:
            return None
        sole = analysis.sole_live_user(value)
        if sole is None or sole != user:
            return None
        if producer:
            return owner
        assert step is not None
        value, user = step.x, owner
    return None


def _narrowest(compute: np.dtype, lead: list[Step]) -> np.dtype:
    """The type with the smallest range that the folded result `y * s` passes through:
    the producer's, or a leading convert's (the bias is added after them: an f32 producer
    narrowed to f16 holds `y * s` in f16)."""
    found = compute
    for step in lead:
        dtype = elements.numpy_dtype(ir.RankedTensorType(step.result.type).element_type)
        if dtype is not None and precision.largest(dtype) < precision.largest(found):
            found = dtype
    return found


def _overshoot(composed: affine.Composed, start: Affine, dtype: np.dtype) -> np.ndarray | None:
    """|t'| per channel: the shift the original has added when its last scaling step has
    run, so it computes `y * s + t'` itself; None when that step computes in another type
    than `dtype` (the one that must hold the folded result). `composed` starts at `start`."""
    steps = composed.steps
    last = max((i for i, step in enumerate(steps) if step.name in affine.SCALING), default=-1)
    if last >= 0 and elements.numpy_dtype(
            ir.RankedTensorType(steps[last].result.type).element_type) != dtype:
        return None
    return np.abs((composed.history[last] if last >= 0 else start).shift)


def _result_bound(steps: list[Step], fit: Affine, analysis: Analysis) -> np.ndarray | None:
    """max |y * s| per channel of the folded producer's result (`y` the original's, before
    the chain's bias adds), from the batch norm's statistics, or None without them."""
    if len(fit.gamma_beta) > 1:
        return None
    params = fit.gamma_beta[0] if fit.gamma_beta else \
        statistics.recover(steps, fit, analysis.evaluator)
    output = statistics.pre_activation(steps, fit, params, analysis.evaluator) \
        if params is not None else None
    if output is None:
        return None
    mean, spread, _ = output  # of the chain's output y * s + t
    return np.abs(mean - fit.shift) + precision.RANGE_SIGMAS * spread


def _kernel_axes(leaves: tuple[ir.Operation, ...], axis: int, analysis: Analysis
                 ) -> list[producers.KernelAxis] | Refusal:
    """The kernel axis carrying result axis `axis` in every leaf, or why not."""
    found = []
    for leaf in leaves:
        kernel_axis = producers.output_kernel_axis(leaf, axis)
        if isinstance(kernel_axis, Refusal):
            return kernel_axis
        if not producers.is_constant(leaf.operands[kernel_axis.operand], analysis.evaluator):
            which = "kernel" if leaf.name == "stablehlo.convolution" else \
                f"operand {kernel_axis.operand} of the dot_general"
            return _not_constant(which, axis, leaf, kernel_axis, analysis)
        found.append(kernel_axis)
    return found


def _producer_word(op: ir.Operation) -> str:
    return op.name.removeprefix("stablehlo.")


def _not_constant(which: str, axis: int, producer: ir.Operation,
                  kernel_axis: producers.KernelAxis, analysis: Analysis) -> Refusal:
    value = producer.operands[kernel_axis.operand]
    argument = parameter_argument(value, analysis.evaluator)
    others = [parameter_argument(o, analysis.evaluator)
              for i, o in enumerate(producer.operands[:2]) if i != kernel_axis.operand]
    if argument is not None and any(o is not None and o == argument for o in others):
        # x @ x^T: the other operand reads the same argument, an input, not a parameter
        # (binding it would bind the input)
        return Refusal(Code.NOT_CONSTANT, f"the {which} (which carries axis {axis}) is not "
                                          f"constant: it is computed from "
                                          f"{describe_argument(argument)}, which the other "
                                          f"operand reads too (a product of two activations "
                                          f"has no weight to fold into)")
    if argument is not None:
        return argument_refusal(argument, f"the {which} (which carries axis {axis})",
                                Code.KERNEL_ARGUMENT)
    result = analysis.evaluator.evaluate(value)
    why = f" ({result.reason})" if isinstance(result, NotConst) else ""
    return Refusal(Code.NOT_CONSTANT,
                   f"the {which} (which carries axis {axis}) is not constant{why}")


class Applied(NamedTuple):
    """What `apply` built: the op that names the normalization and the folded producers."""

    norm: ir.Operation
    producers: tuple[ir.Operation, ...]


def build(rewriter: Rewriter, p: Plan) -> Applied:
    """Builds the folded producers and the bias; replaces the chain's last folded op."""
    steps = list(p.steps)
    last = steps[-1]
    norm = affine.fold_name_op(steps)
    folded_producers: list[ir.Operation] = []
    base = p.source.value
    for index, leaf in enumerate(p.source.leaves):
        folded = leaf
        if p.kernels is not None:
            kernel = p.kernels[index]
            with ir.InsertionPoint(leaf):
                folded = rewriter.clone(leaf, {kernel.operand: kernel.build(leaf.location)})
            if p.source.direct:
                base = folded.results[0]
                rewriter.supersede(leaf, folded)
            else:  # the leaf is this branch's root: its region result now carries the fold
                rewriter.replace_op(leaf, [folded.results[0]], successor=folded)
        folded_producers.append(folded)
    # Mixed precision: the bias goes after the converts that widen the result.
    lead = affine.leading_converts(steps)
    replacement: ir.Value = base
    with ir.InsertionPoint(steps[0].op):
        with last.op.location:
            replacement = affine.replay_layout(replacement, lead)
        if p.bias is not None:
            replacement = bias_add(replacement, p.bias, p.affine.origin, last.op.location)
        with last.op.location:
            replacement = affine.replay_layout(replacement, steps[len(lead):])
    root_replacement = defining_op(replacement)
    if root_replacement is not None and root_replacement != defining_op(p.source.value):
        carry_attributes(last.op, root_replacement)
    rewriter.replace_op(last.op, [replacement], successor=root_replacement)
    return Applied(norm, tuple(folded_producers))


def would_fold(norm: ir.Operation, analysis: Analysis, narrow_kernels: bool = False) -> bool:
    """Whether this pattern folds `norm` (a chain step) into the producer before it, judged
    now by its own match and plan, as it will be in the FOLD stage (fold-scale's inlining
    walk asks during PREPARE; no arena: the plan is dropped)."""
    plan = _dry_plan(norm, analysis, narrow_kernels=narrow_kernels)
    return isinstance(plan, Plan) and any(op_id(s.op) == op_id(norm) for s in plan.steps)


class BackwardAffine(Pattern[Chain, Match, Plan]):
    """Folds each affine chain into the producer(s) before it."""

    builds = BUILDS  # the new kernel, the bias add, the replayed layout (`build`)


    def roots(self, ctx: Context) -> Iterable[Chain]:
        return chains.candidates(ctx).chains

    def match(self, ctx: Context, root: Chain) -> Match | None:
        found = source(root, ctx.analysis)
        if found is None or ctx.analysis.is_dead(root.tail.op):
            return None
        return Match(found, root)

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal:
        arena = ctx.shared(_arena)
        arena.clear()  # the last plan's kernels are attributes by now
        found = plan_fold(match.source, match.chain, ctx.analysis, arena=arena,
                          narrow_kernels=ctx.options.fold_into_narrow_kernels)
        if isinstance(found, Refusal) or not found.kernels:
            return found
        copies = [c for k in found.kernels
                  if (c := copy_cost(k, found.source.leaves, ctx.analysis)) is not None]
        if not copies:
            return found
        return found._replace(copy=Copy(sum(c.bytes for c in copies), tuple(dict.fromkeys(
            r for c in copies for r in c.readers))))

    def refuse(self, ctx: Context, subject: Chain | Match, refusal: Refusal) -> None:
        chain = subject.chain if isinstance(subject, Match) else subject
        note(ctx, list(chain.steps), backward=refusal)

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """A helper whose producer gets a constant kernel from this call site (a nested jit
        block), that returns a producer result (through nested helpers too) that the
        caller normalizes, with a kernel constant at this call site, or that normalizes
        a producer result the caller passes it (a jitted batch norm, `@bn(%y, %g, %b)`)."""
        analysis = ctx.analysis
        site = CallSite(call, callee)
        if _normalizes_an_argument(call, site, analysis):
            return True
        if not (ctx.body_ops(callee) & {*producers.NAMES, "func.call"}):
            return False  # an activation helper: nothing to fold inside or behind it
        for op, inner in ops_within(site):  # a nested jit block: @block calls @layer
            if producers.is_producer(op) and any(
                    operand in inner.arguments and inner.is_constant(operand, analysis)
                    for operand in op.operands):
                return True
        for index, result in enumerate(call.results):
            step = analysis.step(user) if (user := analysis.sole_live_user(result)) else None
            if step is None or step.x != result:
                continue
            value, inner = behind_calls(site.returned(index), site)
            producer = defining_op(value)
            if producer is not None and producers.is_producer(producer) and \
                    any(inner.is_constant(producer.operands[i], analysis) for i in (0, 1)):
                return True
        return False

    def may_inline(self, ctx: Context, callee: ir.Operation) -> bool:
        """A helper with a producer or a call inside, or one that scales an argument."""
        if ctx.body_ops(callee) & {*producers.NAMES, "func.call"}:
            return True
        block = single_block(callee)
        return block is not None and \
            any(_scales_argument(a, ctx.analysis) for a in block.arguments)

    def apply(self, rewriter: Rewriter, plan: Plan) -> Applied:
        return build(rewriter, plan)

    def record(self, ctx: Context, plan: Plan, applied: Applied) -> None:
        steps = list(plan.steps)
        fold = ctx.ledger.fold(
            fold_record(ctx.ledger, plan.source.leaves[0], applied.norm, plan.affine, "backward",
                        plan.kernel_rounding, steps),
            [s.op for s in steps], producer=applied.producers[0])
        record_copy(fold, plan.copy)
        for extra in applied.producers[1:]:  # the other branches of a multi-platform case
            ctx.ledger.fold_carried_by(fold, extra)
        options = ctx.options
        if options.needs_statistics:
            evaluator = ctx.analysis.evaluator
            reading = None
            if "gamma" not in fold.params and fold.kind == "normalization":
                reading = statistics.read(steps, plan.affine, evaluator)
                fold.params.update(reading.params or {})
            output = statistics.pre_activation(steps, plan.affine, fold.params, evaluator)
            if output is not None:
                mean, spread, deviation = output
                for producer in applied.producers:
                    # The fold's shift is the bias it adds after the producer.
                    ctx.ledger.set_statistics(producer, Statistics(
                        mean, spread, plan.affine.shift, deviation))
            elif fold.kind == "normalization" and "mean" not in fold.params and (
                    reading or statistics.read(steps, plan.affine, evaluator)).no_mean:
                for producer in applied.producers:
                    ctx.ledger.set_no_statistics(producer, statistics.NO_MEAN.format(fold.id))
        rest = list(plan.chain.steps[len(steps):]) if plan.chain is not None else []
        if plan.rest_reason is not None and affine.looks_like_normalization(rest):
            note(ctx, rest, backward=plan.rest_reason)


PATTERN = BackwardAffine()
