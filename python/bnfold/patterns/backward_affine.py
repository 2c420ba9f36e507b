"""backward-affine: fold a per-channel affine chain into the producer before it.

Rooted at the last op of a chain of affine steps (see `bnfold.affine`) that
starts at a linear producer with a constant kernel. Before (Flax linen):

    %k = stablehlo.constant dense<...> : tensor<3x3x3x4xf32>
    %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], ...
    %c = stablehlo.subtract %y, %mean_b : tensor<1x8x8x4xf32>
    %s = stablehlo.multiply %c, %scale_b : tensor<1x8x8x4xf32>
    %r = stablehlo.add %s, %beta_b : tensor<1x8x8x4xf32>

After:

    %k2 = stablehlo.constant dense<...> : tensor<3x3x3x4xf32>      // K * s along o
    %y = stablehlo.convolution(%x, %k2) dim_numbers = ..., ...
    %b = stablehlo.constant dense<[...]> : tensor<4xf32>           // (B - mean) * s + beta
    %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<4xf32>) -> tensor<1x8x8x4xf32>
    %r = stablehlo.add %y, %bb : tensor<1x8x8x4xf32>

The same holds for `batch_norm_inference`, a bias add before the norm, the
Keras scale/shift form, Equinox's divide and torchax's two multiplies. Every
intermediate value must have exactly one user; otherwise the IR is left as it
was and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfold import affine, elements, producers
from bnfold.affine import Affine, Composed, Step
from bnfold.ir import ir, stablehlo
from bnfold.patterns.base import MATCHED, NO_MATCH, FoldState, Pattern, defining_op


@dataclass(frozen=True)
class Chain:
    producer: ir.Operation
    steps: list[Step]


class BackwardAffine(Pattern):
    name = "backward-affine"
    roots = affine.STEP_NAMES
    benefit = 2
    description = ("fold a per-channel affine chain (batch_norm_inference or its decomposed "
                   "spellings) into the convolution/dot_general before it")

    def match_and_rewrite(self, op: ir.Operation, rewriter: Any, state: FoldState) -> bool:
        ev = state.evaluator
        step = affine.as_step(op, ev)
        if step is None:
            return NO_MATCH
        if affine.extends(step.result, ev):
            return NO_MATCH  # the chain goes on; fold it at its last op
        chain = _collect(step, state)
        if chain is None and op.name == "stablehlo.batch_norm_inference":
            state.record_skip(op, "no convolution or dot_general produces its operand")
        if not isinstance(chain, Chain):
            return NO_MATCH
        best = _best_composition(chain, state)
        if best is None:
            return NO_MATCH
        composed, kernel_axis, kernel = best
        _rewrite(chain.producer, composed, kernel_axis, kernel, rewriter, state)
        return MATCHED


def _collect(last: Step, state: FoldState) -> Chain | str | None:
    """Walks from `last` back to a producer through single-use steps.

    Returns the chain, None when no producer starts it, or the reason (already
    recorded in the report) why a producer-rooted chain cannot fold.
    """
    ev = state.evaluator
    steps = [last]
    while True:
        current = steps[-1]
        value = current.op.operands[current.x_index]
        owner = defining_op(value)
        if owner is None or not affine.same_block(current.op, value):
            return None
        uses = affine.use_count(value)
        if producers.is_producer(owner):
            if uses != 1:
                return _refuse_if_normalizing(steps, f"producer result has {uses} users", state)
            return Chain(owner, steps[::-1])
        prev = affine.as_step(owner, ev)
        if prev is None:
            return None
        if uses != 1:
            if _reaches_producer(prev, state):
                return _refuse_if_normalizing(steps, f"intermediate value has {uses} users", state)
            return None
        steps.append(prev)


def _reaches_producer(step: Step, state: FoldState) -> bool:
    for _ in range(64):
        owner = defining_op(step.op.operands[step.x_index])
        if owner is None:
            return False
        if producers.is_producer(owner):
            return True
        nxt = affine.as_step(owner, state.evaluator)
        if nxt is None:
            return False
        step = nxt
    return False


def _refuse_if_normalizing(steps: list[Step], reason: str, state: FoldState) -> str:
    for s in steps[::-1]:
        if s.name in affine.SCALING:
            state.record_skip(s.op, reason)
            break
    return reason


def _best_composition(chain: Chain, state: FoldState
                      ) -> tuple[Composed, producers.KernelAxis, np.ndarray] | None:
    """The longest normalizing prefix over the producer's candidate axes."""
    producer = chain.producer
    result_type = elements.tensor_type(producer.results[0])
    if result_type is None:
        return _refuse(chain, "producer result has a dynamic shape", state)
    if not elements.is_float(result_type.element_type):
        return _refuse(chain, f"producer result type {result_type.element_type} is not float", state)
    shape = tuple(result_type.shape)
    best: tuple[Composed, producers.KernelAxis] | None = None
    reasons: list[tuple[Composed, str]] = []
    for axis in producers.candidate_output_axes(producer):
        composed = affine.compose(chain.steps, Affine.identity(shape, axis), state.evaluator)
        if not composed.normalizes:
            reasons.append((composed, composed.stop_reason or "nothing to fold"))
            continue
        kernel_axis = producers.output_kernel_axis(producer, axis)
        if isinstance(kernel_axis, str):
            reasons.append((composed, kernel_axis))
            continue
        if not producers.is_constant(producer.operands[kernel_axis.operand], state.evaluator):
            which = "kernel" if producer.name == "stablehlo.convolution" else \
                f"operand {kernel_axis.operand} of the dot_general"
            reasons.append((composed, f"the {which} (which carries axis {axis}) is not constant"))
            continue
        if best is None or len(composed.steps) > len(best[0].steps):
            best = (composed, kernel_axis)
    if best is None:
        _report_stop(chain, reasons, state)
        return None
    composed, kernel_axis = best
    kernel = producers.kernel_values(producer.operands[kernel_axis.operand], state.evaluator)
    if isinstance(kernel, str):
        return _refuse(chain, kernel, state)
    scale, shift = composed.affine.scale, composed.affine.shift
    if not (np.all(np.isfinite(scale)) and np.all(np.isfinite(shift))):
        return _refuse(chain, "folded scale or shift is not finite", state)
    if composed.stop_reason:
        _report_stop(chain, [(composed, composed.stop_reason)], state, folded=composed)
    return composed, kernel_axis, kernel


def _refuse(chain: Chain, reason: str, state: FoldState) -> None:
    _refuse_if_normalizing(chain.steps, reason, state)
    for s in chain.steps:
        if s.name == "stablehlo.batch_norm_inference":
            state.record_skip(s.op, reason)
    return None


def _report_stop(chain: Chain, reasons: list[tuple[Composed, str]], state: FoldState,
                 folded: Composed | None = None) -> None:
    """Records why a chain (or the rest of a partly folded one) did not fold.

    A normalizing prefix that failed names the producer as the obstacle;
    otherwise the obstacle is the step after the prefix, recorded at the next
    scaling op (a lone bias add that did not fold is not worth a report entry).
    """
    ordered = sorted(reasons, key=lambda r: not r[0].normalizes)
    composed, reason = ordered[0]
    if composed.normalizes and folded is None:
        _refuse(chain, reason, state)
        return
    for s in chain.steps[len(composed.steps):]:
        if s.name in affine.SCALING:
            state.record_skip(s.op, reason)
            return


def _rewrite(producer: ir.Operation, composed: Composed, kernel_axis: producers.KernelAxis,
             kernel: np.ndarray, rewriter: Any, state: FoldState) -> None:
    fit = composed.affine
    steps = composed.steps
    last = steps[-1]
    kernel_value = producer.operands[kernel_axis.operand]
    kernel_type = ir.RankedTensorType(kernel_value.type)
    kernel_owner = defining_op(kernel_value)
    kernel_loc = kernel_owner.location if kernel_owner is not None else producer.location
    norm = _norm_op(steps)
    out_axis = fit.origin

    new_kernel = producers.scale_along(kernel, kernel_axis.axis, fit.scale,
                                       elements.numpy_dtype(kernel_type.element_type))
    with ir.InsertionPoint(producer):
        k = stablehlo.ConstantOp(elements.dense_attr(new_kernel, kernel_type.element_type),
                                 loc=kernel_loc)
    producer.operands[kernel_axis.operand] = k.result

    result = producer.results[0]
    result_type = ir.RankedTensorType(result.type)
    replacement: ir.Value = result
    with ir.InsertionPoint(steps[0].op), norm.location:
        if np.any(fit.shift != 0):
            bias = stablehlo.ConstantOp(elements.dense_attr(fit.shift, result_type.element_type))
            bias_b = stablehlo.BroadcastInDimOp(result_type, bias.result, [out_axis])
            replacement = stablehlo.AddOp(result, bias_b.result).result
        replacement = affine.replay_layout(replacement, steps)
    assert replacement.type == last.result.type, (replacement.type, last.result.type)

    params: dict[str, np.ndarray] = {"scale": fit.scale.copy(), "shift": fit.shift.copy()}
    if len(fit.gamma_beta) == 1:
        params.update(fit.gamma_beta[0])
    state.record_fold(
        producer=producer, norm=norm,
        form="batch_norm_inference" if fit.gamma_beta else "decomposed",
        direction="backward", channels=fit.channels, ops=[s.op for s in steps], params=params,
    )
    for s in steps:
        state.evaluator.forget(s.result)
    rewriter.replace_op(last.op, [replacement])
    for s in steps[-2::-1]:
        rewriter.erase_op(s.op)


def _norm_op(steps: list[Step]) -> ir.Operation:
    """The op that names the normalization: the BN op, else the first non-bias step."""
    for s in steps:
        if s.name == "stablehlo.batch_norm_inference":
            return s.op
    for s in steps:
        if s.name != "stablehlo.add" and s.name not in affine.LAYOUT:
            return s.op
    return steps[-1].op
