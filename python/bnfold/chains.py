"""Candidates: the producers and the maximal affine chains of a module, found once.

A *chain* is a maximal run of affine steps (see `bnfold.affine`) linked by
values with exactly one live user in the same block:

    %y = stablehlo.convolution(...)            producer (not part of the chain)
    %c = stablehlo.subtract %y, %mean_b        chain[0]   (head)
    %s = stablehlo.multiply %c, %scale_b       chain[1]
    %r = stablehlo.add %s, %beta_b             chain[2]   (tail)
    %a = stablehlo.maximum %r, %zero           ends the chain (not affine)

Every normalization, however it is spelled, is (part of) one chain, so each
chain gets exactly one decision: folded backward into the producer before its
head, forward into the producer after its tail, or refused with a reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bnfold import affine, producers
from bnfold.affine import Analysis, Step
from bnfold.graph import defining_op, live_users
from bnfold.ir import ir


@dataclass(frozen=True)
class Chain:
    """A maximal run of linked affine steps, head first."""

    steps: tuple[Step, ...]

    @property
    def head(self) -> Step:
        return self.steps[0]

    @property
    def tail(self) -> Step:
        return self.steps[-1]


@dataclass
class Candidates:
    """What one walk of the module found."""

    producers: list[ir.Operation]
    chains: list[Chain]
    batch_norms: list[ir.Operation]  # every batch_norm_inference, in a chain or not


def find(functions: Iterable[ir.Operation], analysis: Analysis) -> Candidates:
    """Producers and chains of `functions`, in program order (one walk)."""
    found_producers: list[ir.Operation] = []
    batch_norms: list[ir.Operation] = []
    steps: list[Step] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if producers.is_producer(op):
            found_producers.append(op)
        else:
            if op.name == "stablehlo.batch_norm_inference":
                batch_norms.append(op)
            step = analysis.step(op)
            if step is not None:
                steps.append(step)
        return ir.WalkResult.ADVANCE

    for func in functions:
        func.walk(visit, ir.WalkOrder.PRE_ORDER)
    found = [grow(s, analysis) for s in steps if _previous(s, analysis) is None]
    return Candidates(found_producers, found, batch_norms)


def _previous(step: Step, analysis: Analysis) -> Step | None:
    """The step this one continues, if it is linked to one."""
    owner = defining_op(step.x)
    if owner is None:
        return None
    prev = analysis.step(owner)
    if prev is None or affine.extends(prev.result, analysis) != step:
        return None
    return prev


def grow(head: Step, analysis: Analysis) -> Chain:
    """The chain that starts at `head`."""
    steps = [head]
    while (nxt := affine.extends(steps[-1].result, analysis)) is not None:
        steps.append(nxt)
    return Chain(tuple(steps))


def upstream_reason(chain: Chain, analysis: Analysis) -> str:
    """Why nothing before `chain` can absorb it (when no backward fold applies)."""
    x = chain.head.x
    owner = defining_op(x)
    if owner is None:
        return "no convolution or dot_general produces its operand (it is a block argument)"
    uses = len(live_users(x))
    if producers.is_producer(owner):
        return f"producer result has {uses} users"
    if analysis.step(owner) is not None:
        if _reaches_producer(owner, analysis):
            return f"intermediate value has {uses} users"
        return f"no convolution or dot_general produces its operand (it comes from {owner.name})"
    if owner.name == "stablehlo.convert" and _reaches_producer(owner, analysis):
        return ("the normalization is computed in another precision than the producer "
                "(a convert sits between them: mixed precision); folding through converts "
                "is not supported")
    if owner.block != chain.head.op.block:
        return "no convolution or dot_general produces its operand in the same block"
    return f"no convolution or dot_general produces its operand (it comes from {owner.name})"


def _reaches_producer(op: ir.Operation, analysis: Analysis) -> bool:
    for _ in range(64):
        if producers.is_producer(op):
            return True
        step = analysis.step(op)
        operand = step.x if step is not None else (
            op.operands[0] if op.name == "stablehlo.convert" else None)
        owner = defining_op(operand) if operand is not None else None
        if owner is None:
            return False
        op = owner
    return False


def downstream_reason(chain: Chain) -> str:
    """Why nothing after `chain` can absorb it forward."""
    found = live_users(chain.tail.result)
    if len(found) != 1:
        return f"forward: its result has {len(found)} users"
    user = found[0]
    if user.name == "stablehlo.convolution" and user.operands[1] == chain.tail.result:
        return "forward: it feeds the kernel operand, not the activation"
    if producers.is_producer(user):
        return f"forward: the chain before the {user.name.removeprefix('stablehlo.')} cannot fold into it"
    if user.name == "func.call":
        callee = ir.FlatSymbolRefAttr(user.attributes["callee"]).value
        return f"forward: it feeds func.call @{callee}, which is not linear"
    return f"forward: it feeds {user.name}, which is not linear"
