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
`explain` gives that reason at the end of the FOLD stage, from what the
folding patterns noted (`Notes`) or from the chain's neighbours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from bnfold import affine, elements, producers
from bnfold.affine import STEP_NAMES, Step
from bnfold.graph import callee_name, defining_op
from bnfold.ir import ir
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:
    from bnfold.analysis import Analysis
    from bnfold.driver import Context
    from bnfold.rewriter import Handle


class Chain(NamedTuple):
    """A maximal run of linked affine steps, head first."""

    steps: tuple[Step, ...]

    @property
    def head(self) -> Step:
        return self.steps[0]

    @property
    def tail(self) -> Step:
        return self.steps[-1]


class Candidates(NamedTuple):
    """What one walk of the module found."""

    producers: list[ir.Operation]
    chains: list[Chain]
    batch_norms: list[ir.Operation]  # every batch_norm_inference, in a chain or not


# The ops `find` looks at: producers, chain steps and batch norms.
FOUND = frozenset({*producers.NAMES, *STEP_NAMES, "stablehlo.batch_norm_inference"})


def find(ops: Iterable[tuple[str, ir.Operation]], analysis: Analysis) -> Candidates:
    """Producers and chains among `ops` ((name, op) pairs of those named in `FOUND`, in
    program order)."""
    found_producers: list[ir.Operation] = []
    batch_norms: list[ir.Operation] = []
    steps: list[Step] = []
    for name, op in ops:
        if name in producers.NAMES:
            found_producers.append(op)
            continue
        if name == "stablehlo.batch_norm_inference":
            batch_norms.append(op)
        step = analysis.step(op, name)
        if step is not None:
            steps.append(step)
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


def chain_of(step: Step, analysis: Analysis) -> Chain:
    """The whole chain `step` is a step of (from its head)."""
    head = step
    for _ in range(1024):  # a chain never loops; the bound only guards the walk
        prev = _previous(head, analysis)
        if prev is None:
            break
        head = prev
    return grow(head, analysis)


def grow(head: Step, analysis: Analysis) -> Chain:
    """The chain that starts at `head`."""
    steps = [head]
    while (nxt := affine.extends(steps[-1].result, analysis)) is not None:
        steps.append(nxt)
    return Chain(tuple(steps))


# --- reasons ----------------------------------------------------------------------------


def upstream_reason(chain: Chain, analysis: Analysis) -> Refusal:
    """Why nothing before `chain` can absorb it (when no backward fold applies)."""
    x = chain.head.x
    owner = defining_op(x)
    if owner is None:
        return Refusal(Code.NO_PRODUCER, "no convolution or dot_general produces its operand "
                                         "(it is a block argument)")
    uses = len(analysis.live_users(x))
    if producers.is_producer(owner):
        return Refusal(Code.USERS, f"producer result has {uses} users")
    if analysis.step(owner) is not None:
        if _reaches_producer(owner, analysis):
            return Refusal(Code.USERS, f"intermediate value has {uses} users")
        return Refusal(Code.NO_PRODUCER, f"no convolution or dot_general produces its operand "
                                         f"(it comes from {owner.name})")
    if owner.block != chain.head.op.block:
        return Refusal(Code.NO_PRODUCER, "no convolution or dot_general produces its operand in "
                                         "the same block")
    return Refusal(Code.NO_PRODUCER, f"no convolution or dot_general produces its operand (it "
                                     f"comes from {owner.name})")


def _reaches_producer(op: ir.Operation, analysis: Analysis) -> bool:
    for _ in range(64):
        if producers.is_producer(op):
            return True
        step = analysis.step(op)
        owner = defining_op(step.x) if step is not None else None
        if owner is None:
            return False
        op = owner
    return False


def downstream_reason(chain: Chain, analysis: Analysis) -> Refusal:
    """Why nothing after `chain` can absorb it forward."""
    found = analysis.live_users(chain.tail.result)
    if len(found) != 1:
        return Refusal(Code.USERS, f"forward: its result has {len(found)} users")
    user = found[0]
    if user.name == "stablehlo.convolution" and user.operands[1] == chain.tail.result:
        return Refusal(Code.NOT_LINEAR, "forward: it feeds the kernel operand, not the activation")
    if producers.is_producer(user):
        return Refusal(Code.NOT_LINEAR, f"forward: the chain before the "
                                        f"{user.name.removeprefix('stablehlo.')} cannot fold into it")
    if user.name == "func.call":
        return Refusal(Code.NOT_LINEAR, f"forward: it feeds func.call @{callee_name(user)}, "
                                        f"which is not linear")
    return Refusal(Code.NOT_LINEAR, f"forward: it feeds {user.name}, which is not linear")


# --- the decision for every normalization ------------------------------------------------


@dataclass
class Notes:
    """What the folding attempts on one normalization found, for its reason if it stays."""

    op: ir.Operation
    backward: Refusal | None = None
    forward: Refusal | None = None


def candidates(ctx: Context) -> Candidates:
    """The producers and affine chains, found in one walk when the FOLD stage starts
    (once per run)."""
    return ctx.shared(_find_candidates)


def _find_candidates(ctx: Context) -> Candidates:
    return find(ctx.named_ops(FOUND), ctx.analysis)


def _notes(ctx: Context) -> dict[Handle, Notes]:
    """What the folding patterns noted this run, by the normalization's handle."""
    return {}


def note(ctx: Context, steps: list[Step], *, backward: Refusal | None = None,
         forward: Refusal | None = None) -> None:
    """Remembers why a folding pattern did not fold the normalization these steps are."""
    norm = affine.norm_op(steps)
    notes = ctx.shared(_notes).setdefault(ctx.rewriter.handle(norm), Notes(norm))
    notes.backward = notes.backward or backward
    notes.forward = notes.forward or forward


def is_noted(ctx: Context, key: Handle) -> bool:
    """Whether a folding pattern noted why the normalization with handle `key` did not fold
    (`explain` gives it that decision at the end of the fold stage)."""
    return key in ctx.shared(_notes)


def explain(ctx: Context) -> None:
    """One reason for every normalization-like chain (and batch norm) that did not fold."""
    ledger, analysis, found = ctx.ledger, ctx.analysis, candidates(ctx)
    for chain in found.chains:
        rest = [s for s in chain.steps if not ledger.is_folded(s.op)]
        if not rest or analysis.is_dead(rest[-1].op):
            continue  # dead code: the cleanup removes it
        norm = affine.norm_op(rest)
        notes = ctx.shared(_notes).get(ctx.rewriter.handle(norm))
        if notes is None and is_statistics(rest, analysis):
            continue  # a norm's own mean square or variance: the norm gets the decision
        # A failed attempt on a scaling chain is worth explaining too.
        attempted = notes is not None and affine.normalizes(rest)
        if not (attempted or affine.looks_like_normalization(rest)):
            continue
        ledger.refuse(norm, _reason(ctx, Chain(tuple(rest)), notes or Notes(norm)),
                      [s.op for s in rest])
    for op in found.batch_norms:
        if not ledger.is_decided(op):
            ledger.refuse(op, _batch_norm_reason(op))


_STATISTICS_USERS = ("stablehlo.rsqrt", "stablehlo.sqrt")
_PASS_THROUGH = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert")


def is_statistics(steps: list[Step], analysis: Analysis) -> bool:
    """Whether the steps compute a normalization's statistics, not an affine of its data:
    they start at a reduction (through broadcasts, reshapes and converts: a sum over the
    features) and every reader of their result takes its `rsqrt` or `sqrt` (RMSNorm's
    `rsqrt(sum(x * x) / n + eps)`, a variance's `/ n`). Such a divide is not a
    normalization of its own: the norm it belongs to is decided (folded or refused) as one."""
    readers = analysis.live_users(steps[-1].result)
    if not readers or any(r.name not in _STATISTICS_USERS for r in readers):
        return False
    owner = defining_op(steps[0].x)
    while owner is not None and owner.name in _PASS_THROUGH:
        owner = defining_op(owner.operands[0])
    return owner is not None and owner.name == "stablehlo.reduce"


def _reason(ctx: Context, chain: Chain, notes: Notes) -> Refusal:
    options = ctx.options
    if notes.backward is not None:
        if notes.forward is None:
            return notes.backward
        return Refusal(notes.backward.code, f"{notes.backward}; {notes.forward}")
    if not options.enabled("backward-affine"):
        upstream = Refusal(Code.NOTHING, "backward-affine is disabled")
    else:
        upstream = upstream_reason(chain, ctx.analysis)
    if notes.forward is not None:
        return Refusal(notes.forward.code if upstream.code is Code.NO_PRODUCER else upstream.code,
                       f"{upstream}; {notes.forward}")
    if upstream.code in (Code.USERS, Code.PRECISION):
        return upstream
    if not options.enabled("forward-affine"):
        return Refusal(upstream.code, f"{upstream}; forward-affine is disabled")
    return Refusal(upstream.code, f"{upstream}; {downstream_reason(chain, ctx.analysis)}")


def _batch_norm_reason(op: ir.Operation) -> Refusal:
    if any(elements.tensor_type(v) is None for v in list(op.operands) + list(op.results)):
        return Refusal(Code.SYMBOLIC, "dynamic shapes are not supported")
    return Refusal(Code.NO_PRODUCER, "not folded: no foldable producer chain")
