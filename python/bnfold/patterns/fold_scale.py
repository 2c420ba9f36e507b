"""fold-scale: move a constant scalar scale into a weight.

The attention scale on `q k^T` (or on q, Flax's `query / sqrt(depth)`), Gemma's
`sqrt(hidden)` embedding multiply and Gemma 2's `logits / cap` are a constant scalar c
times a value that linear steps compute from a weight. The scale walks back through
those steps by their scalar laws (`bnfold.laws.SCALAR_LAWS`: layout ops, converts,
RoPE's slices, negate, concatenate and multiplies by cos/sin, adds of two scaled
values, dot_general of two values: the scalar moves to one operand) to the nearest
weight that only this path reads: a linear producer's constant kernel (its bias adds
come along), a gather's table, or, where a normalization stands in the way (QK-norm:
a scale before `x * rsqrt(mean(x^2) + eps)` would be normalized away), the constant
factor after it (the q-norm's weight). Before:

    %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0]     // x Wq
    %qh = stablehlo.reshape %q : (tensor<6x32xf32>) -> tensor<6x4x8xf32>
    %kh = ...
    %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2]
    %c = stablehlo.constant dense<0.353553385> : tensor<4x6x6xf32>
    %r = stablehlo.multiply %s, %c : tensor<4x6x6xf32>

After (`%wq_c` = c Wq, computed in float64 and rounded once):

    %q = stablehlo.dot_general %x, %wq_c, contracting_dims = [1] x [0]
    %qh = stablehlo.reshape %q ...
    %s = stablehlo.dot_general %qh, %kh, ...                            // %r's users read %s

Every value the walk scales must have no live user outside the walk (a value other
ops read unscaled would change), so RoPE's q, read by both halves, may fan out while
a residual stream may not. Where the walk has choices (a bilinear op's operands; a
constant factor or the value beyond it), it tries them in order and takes the first
region that closes. A weight also read elsewhere (or computed by a helper that another
live call also runs) is never copied: the scale is refused with `shared-weight` and the
cost of the copy in bytes, unless another way exists (a
soft-cap's `1 / cap` goes into the final norm's weight through the tied head). An
embedding table tied to the LM head stays one table (docs/precision.md, rule 10): c goes
into the table for every reader, and 1 / c into each head's input by the same walk
(Gemma's final norm weight `(1 + w) / c`). Before:

    %e = "stablehlo.gather"(%table, %ids) ...
    %h = stablehlo.multiply %e, %c                 // sqrt(hidden)
    %n = stablehlo.multiply %r, %fw                // the final norm's 1 + w
    %t = stablehlo.transpose %table, dims = [1, 0]
    %l = stablehlo.dot_general %n, %t ...          // the tied LM head

After (`%table_c` = c T, `%fw_c` = (1 + w) / c): `%h` is `gather(%table_c, %ids)`, `%n`
multiplies by `%fw_c` and the head reads `transpose(%table_c)`. Refused in bf16 for a
scale that is not a power of two (the head's weights would round once more: measured
less accurate).

The precision contract (docs/precision.md, rule 8): the scale never moves into a type narrower
than where the original applied it; a power-of-two scale is exact, another rounds once
into the weight where the original rounded `c x` once: measured, no less accurate.

What counts as a constant scale: a multiply (divide) by a constant scalar whose other
operand has no other live user (`x * 0.5` next to `erf(x * 0.707)` in GELU is a term
of a function of x, not a scale of it) and whose walk reaches a linear producer or a
gather; each gets a decision: a `Fold` of kind "scale", or a refusal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import chains, elements, laws, precision, producers
from bnfold.constants import argument_refusal, is_function_argument
from bnfold.graph import (
    as_operation,
    callee_name,
    defining_op,
    function_name,
    is_private,
    single_block,
    users,
)
from bnfold.ir import ir
from bnfold.patterns import backward_affine
from bnfold.patterns.base import Pattern
from bnfold.patterns.inline_calls import CallSite, ops_within
from bnfold.patterns.rewrite import KernelRewrite, kept_readers, plan_kernel
from bnfold.refusal import Code, Refusal, refused
from bnfold.report import Fold

if TYPE_CHECKING:
    from bnfold.analysis import Analysis
    from bnfold.driver import Context
    from bnfold.rewriter import Handle, Rewriter

ROOT_OPS = ("stablehlo.multiply", "stablehlo.divide")
PRODUCERS = ("stablehlo.dot_general", "stablehlo.convolution", "stablehlo.gather")
# Ops a weight may sit behind (peeled to the constant they read, while only they read it).
PEEL = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose")
MAX_SCALED = 256  # values one walk may scale
MAX_ATTEMPTS = 32  # choice combinations tried per scale
MAX_FORWARD = 64  # ops a fan-out check may visit on its way to the scale
# Which refusal tells the user most, when every way failed (lower first).
_RANK = {Code.SHARED_WEIGHT: 0, Code.PRECISION: 1, Code.RANGE: 1, Code.QUANTIZED: 1,
         Code.PARAMETER: 2, Code.LOOP: 2, Code.KERNEL_ARGUMENT: 2, Code.NORMALIZED: 2,
         Code.USERS: 3}


class Match(NamedTuple):
    """`root` multiplies operand `operand` by the constant scalar `scale` (a divide's
    reciprocal), computed in `compute`."""

    root: ir.Operation
    operand: int
    scale: float
    compute: np.dtype


class Edit(NamedTuple):
    """Operand `operand` of `target` becomes its constant times the scale (`rewrite`);
    `reader` is the op of the walk that reads it (the weight's producer, a bias add)."""

    target: ir.Operation
    operand: int
    rewrite: KernelRewrite
    reader: ir.Operation
    terminal: bool
    channels: tuple[int, int] | None = None  # (scaled, all) where only part of it is scaled
    inverse: bool = False  # takes 1 / scale (the LM head's side of a tied table)
    # operand -1: `target` is the weight's own op, replaced for every reader (a tied table)


class Plan(NamedTuple):
    match: Match
    edits: tuple[Edit, ...]
    crossed: tuple[str, ...]  # the op kinds the scale passed, in walk order


@dataclass
class _Walk:
    """One attempt: the values scaled under one assignment of choices (`policy`)."""

    ctx: Context
    match: Match
    policy: dict[Handle, int]
    reaches: dict[Handle, bool]
    scaled: dict[ir.Value, laws.Mask | None] = field(default_factory=dict)  # None: all of it
    region: set[Handle] = field(default_factory=set)
    through: set[tuple[Handle, int]] = field(default_factory=set)  # (op, operand) scaled
    trail: list[tuple[Handle, int]] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    crossed: list[str] = field(default_factory=list)
    reached: bool = False  # a linear producer or a gather
    # a head's side of a tied table (1 / c) keeps no table of its own: a head reading the
    # scaled embedding itself would otherwise walk back into the same table, endlessly
    keeps_tables: bool = True
    # the scale would grow an f16 value the original never scaled: refused once the walk
    # reaches a weight (a scale with none behind it stays silent, as any other)
    grows: Refusal | None = None

    def handle(self, op: ir.Operation) -> Handle:
        return self.ctx.rewriter.handle(op)

    def run(self) -> Plan | Refusal:
        root = self.match.root
        found = self.visit(root.operands[self.match.operand], root)
        if found is not None:
            return found
        self.through.add((self.handle(root), self.match.operand))
        for value in self.scaled:
            for use in value.uses:
                user = as_operation(use.owner)
                if user is None or self.ctx.analysis.is_dead(user):
                    continue
                if (self.handle(user), use.operand_number) not in self.through and \
                        not _reads_unscaled(user, self.scaled[value]):
                    # another op, or a region op that reads it where the scale does not pass
                    # (x * k with c gone into k: x must not be scaled as well)
                    if self.scaled[value] is not None:
                        return Refusal(Code.USERS, f"only part of {_name(value)} would take the "
                                                   f"scale, but {user.name} also reads some of "
                                                   "that part unscaled; scaling it would change "
                                                   "that op")
                    return Refusal(Code.USERS, f"{_name(value)} is also read by {user.name} "
                                               "unscaled; scaling it would change that op")
        if not any(e.terminal for e in self.edits):
            return Refusal(Code.NO_PRODUCER, "no weight on the way")
        if self.grows is not None:
            return self.grows
        return Plan(self.match, tuple(self.edits), tuple(self.crossed))

    def visit(self, value: ir.Value, user: ir.Operation, mask: laws.Mask | None = None
              ) -> Refusal | None:
        """Scale `value` (where `mask` is True; all of it without one) and walk on."""
        if value in self.scaled:
            if _same_mask(self.scaled[value], mask):
                return None
            return Refusal(Code.USERS, f"{_name(value)} is reached twice, with different parts "
                                       "of it scaled")
        if len(self.scaled) >= MAX_SCALED:
            return Refusal(Code.LIMIT, f"the walk passed {MAX_SCALED} values without closing")
        ty = elements.tensor_type(value)
        dtype = elements.numpy_dtype(ty.element_type) if ty is not None else None
        if dtype is None or not elements.is_float(ty.element_type):  # type: ignore[union-attr]
            return Refusal(Code.NOT_FLOAT, f"{_name(value)} is not a static float tensor")
        if precision.is_narrower(dtype, self.match.compute) and not self.exact_in(dtype):
            if _unowned(defining_op(value), self.ctx.analysis) or not self.decided():
                self.reached = True  # no other pattern decides this scale: it gets ours
            return _narrower(value, dtype, self.match.compute)
        if abs(self.match.scale) > 1 and dtype == np.float16 and \
                value != self.match.root.operands[self.match.operand]:
            self.grows = self.grows or Refusal(
                Code.RANGE, f"the scale {self.match.scale:.6g} would grow {_name(value)}, an "
                            f"f16 value the original never scaled, past what it held (f16 "
                            f"overflows at 65504)")
        analysis = self.ctx.analysis
        for other in analysis.live_users(value):
            if other != user and other != self.match.root and \
                    self.handle(other) not in self.region and not self.forward(other) and \
                    not _reads_unscaled(other, mask):
                if _from_producer(value):
                    self.reached = True  # a weight lies behind the reader: a decision is due
                return Refusal(Code.USERS, f"{_name(value)} is also read by {other.name}, which "
                                           "does not lead to the scale; scaling it would change "
                                           "that op")
        self.scaled[value] = mask
        op = defining_op(value)
        if op is None:
            if is_function_argument(value):
                return argument_refusal(value, "the value the scale would pass")
            return Refusal(Code.NO_PRODUCER, f"{_name(value)} is a block argument")
        law = laws.scalar_law_of(op)
        integer = _integer_producer(op)
        if integer is not None:
            self.reached = True  # a scale of a layer's output: it gets its decision
            return integer
        if isinstance(law, Refusal):
            if op.name in ("stablehlo.rsqrt", "stablehlo.sqrt", "stablehlo.divide"):
                law = Refusal(Code.NORMALIZED, f"{law.message}: a normalization would undo a "
                                               "scale before it, and no constant factor after "
                                               "it (a norm's weight) can take it")
            return law
        ways = law.ways(op, analysis)
        if isinstance(ways, Refusal):
            return ways
        if op.name in PRODUCERS or (mask is not None and _bias_add(op, analysis)):
            # (the bias of a fused projection whose q part takes the scale may refuse before
            # the layer is seen; a scale on all of a layer's output is backward-affine's)
            self.reached = True
        if mask is not None:
            if law.part is None:
                return Refusal(Code.NO_LAW, f"only part of {_name(value)} is scaled (a slice of "
                                            f"it reads the rest unscaled), and no law moves a "
                                            f"scale on part of a value through {op.name}")
            ways = [w for w in ways if w.part] or ways  # a slice: only its part, again
        way = ways[0]
        if len(ways) > 1:
            key = self.handle(op)
            self.trail.append((key, len(ways)))
            way = ways[self.policy.get(key, 0)]
        self.region.add(self.handle(op))
        self.through.update((self.handle(op), i) for i in way.through)
        self.crossed.append(op.name.removeprefix("stablehlo."))
        walked = (*way.into, *way.through)
        for index in walked:
            part = mask
            if mask is not None or way.part:
                assert law.part is not None
                mapped = law.part(op, index, mask if mask is not None else _everything(value))
                if isinstance(mapped, Refusal):
                    return mapped
                if (twice := _read_twice(op, index, walked, mapped, law, mask, value)) is not None:
                    owner = defining_op(op.operands[index])
                    if owner is not None and owner.name in PRODUCERS:
                        self.reached = True  # a layer's output: the scale gets its decision
                    return twice
                if not np.any(mapped):
                    continue  # this operand holds none of the scaled part (a K slice's piece)
                part = None if bool(np.all(mapped)) else mapped
            if index in way.into:
                found = self.edit(op, index, way, part)
            else:
                found = self.visit(op.operands[index], op, part)
            if found is not None:
                return found
        return None

    def exact_in(self, dtype: np.dtype) -> bool:
        """A power-of-two scale moves into a narrower type with the same exponent range
        exactly (bf16 under f32): `2^k round(x) == round(2^k x)`."""
        return math.frexp(abs(self.match.scale))[0] == 0.5 and \
            precision.same_exponent_range(self.match.compute, dtype)

    def keep_one_table(self, gather: ir.Operation, value: ir.Value,
                       others: list[ir.Operation]) -> str | None:
        """A table tied to the LM head (`value`, also read by `others`, each leading
        through layout ops to a dot_general's weight): scale the one table by c for every
        reader and give each head's input 1 / c where a constant factor takes it (the
        final norm's weight: `(1 + w) / c`), so the head computes what it did and the
        table is not copied (docs/precision.md, rule 10). None when done (edits added),
        else why not."""
        ctx, analysis = self.ctx, self.ctx.analysis
        owner = defining_op(value)
        if owner is None or self.handle(owner) in self.region:
            return "the table is not a constant op"
        heads: list[tuple[ir.Operation, int]] = []
        for user in others:
            head, read = _read_as(user, value, analysis)
            if head.name != "stablehlo.dot_general" or self.handle(head) in self.region or \
                    list(head.operands).count(read) != 1:
                return f"{head.name} also reads it, not as a linear layer's weight"
            heads.append((head, 1 - list(head.operands).index(read)))
        dtype = elements.float_dtype(value)
        if dtype is None:
            return "it is not a static float tensor"
        if precision.is_narrower(dtype, np.dtype(np.float32)) and \
                math.frexp(abs(self.match.scale))[0] != 0.5:
            # measured (rule 10): the head reading round(c T) / c instead of T errs a
            # median 1.23x the original in bf16, where f32 stays at 0.98x
            return (f"precision: the LM head would read the {precision.type_name(dtype)} "
                    f"table rounded once more, scaled by {self.match.scale:.6g} (not a power "
                    f"of two), where the original reads it as it is: docs/precision.md, rule "
                    f"10")
        root = self.handle(self.match.root)
        edits: list[Edit] = []
        crossed: list[str] = []
        region, scaled = set(self.region), set(self.scaled)  # taken (by each head in turn)
        closed: list[_Walk] = []

        def apart(walk: _Walk) -> Refusal | None:
            if root in walk.region or walk.region & region or set(walk.scaled) & scaled:
                return Refusal(Code.USERS, "the LM head's input is the scaled value (or "
                                           "another head's) itself")
            closed.append(walk)
            return None

        for head, act in heads:
            compute = elements.float_dtype(head.operands[act])
            if compute is None:
                return "the LM head's input is not a float tensor"
            found = _search(ctx, Match(head, act, 1.0 / self.match.scale, compute), apart,
                            keeps_tables=False)
            if found is None:
                return "no constant factor before the LM head takes 1 / scale"
            if isinstance(found, Refusal):
                return f"1 / scale before the LM head: {found.message}"
            edits += [e._replace(inverse=True) for e in found.edits]
            crossed += found.crossed
            region.update(closed[-1].region)
            scaled.update(closed[-1].scaled)
        kernel = producers.kernel(value, dtype, analysis.evaluator, "gather")
        if isinstance(kernel, Refusal):
            return kernel.message
        rewrite = plan_kernel(kernel, np.asarray(self.match.scale, dtype=np.float64), 0)
        if isinstance(rewrite, Refusal):
            return rewrite.message
        self.edits.append(Edit(owner, -1, rewrite, gather, True))
        self.edits += edits
        self.crossed += crossed
        return None

    def decided(self) -> bool:
        """Whether the scale or an op the walk crossed has a decision, or a backward fold's
        note on its chain (rule 9, given at the end of the stage); none once a fold of an
        earlier scale of that chain took the op it was noted on (`* 0.5 * 3.0` after a
        bf16 layer: the 3.0 is then ours to refuse)."""
        ctx = self.ctx
        keys = [ctx.rewriter.handle(self.match.root), *self.region]
        return any(ctx.ledger.decides(k) or chains.is_noted(ctx, k) for k in keys)

    def forward(self, op: ir.Operation) -> bool:
        """Whether `op`'s result reaches the scale through ops with a scalar law only."""
        start = self.handle(op)
        if start not in self.reaches:
            seen: set[Handle] = set()
            todo = [op]
            found = False
            while todo and not found and len(seen) < MAX_FORWARD:
                current = todo.pop()
                if current == self.match.root:
                    found = True
                    break
                key = self.handle(current)
                if key in seen or current.name not in laws.SCALAR_LAWS:
                    continue
                seen.add(key)
                for result in current.results:
                    todo.extend(self.ctx.analysis.live_users(result))
            self.reaches[start] = found
        return self.reaches[start]

    def edit(self, reader: ir.Operation, index: int, way: laws.ScalarWay,
             mask: laws.Mask | None) -> Refusal | None:
        """Operand `index` of `reader` (a constant) times the scale (where `mask` is True):
        behind the layout ops only this path reads, the constant itself; refused when
        another op reads it too (a copy)."""
        analysis = self.ctx.analysis
        target, operand, value = reader, index, reader.operands[index]
        while True:
            owner = defining_op(value)
            if owner is None or owner.name not in PEEL or len(analysis.live_users(value)) != 1:
                break
            if mask is not None:
                law = laws.SCALAR_LAWS[owner.name]
                assert law.part is not None
                found = law.part(owner, 0, mask)
                if isinstance(found, Refusal):
                    # one value repeated where the part varies: scaling part of it would
                    # write a constant as large as the activation
                    return Refusal(Code.AXIS, f"only part of {_role(reader, way)} of "
                                              f"{reader.name} would take the scale, but it is "
                                              f"one value repeated where the part varies "
                                              f"({found.message}); scaling part of it would "
                                              "write a constant of the activation's size")
                mask = found
            target, operand, value = owner, 0, owner.operands[0]
        others = [u for u in analysis.live_users(value) if u != target]
        role = _role(reader, way)
        owner = defining_op(value)
        if owner is not None and owner.name == "func.call" and way.terminal and \
                (keeping := kept_readers(value, [target], analysis)):
            return Refusal(Code.SHARED_WEIGHT,
                           f"it would go into {role} of {reader.name}, but it is computed by "
                           f"@{callee_name(owner)}, which stays in the module (kept by "
                           f"{', '.join(dict.fromkeys(keeping))}); folding would copy it. Left as "
                           "is: untie the weight to fold it")
        kept = None
        if others and way.terminal and mask is None and reader.name == "stablehlo.gather" \
                and self.keeps_tables:
            kept = self.keep_one_table(reader, value, others)
            if kept is None:
                return None
        if others and way.terminal:
            ty = elements.tensor_type(value)
            size = math.prod(ty.shape) * np.dtype(elements.numpy_dtype(ty.element_type)).itemsize \
                if ty is not None else 0
            readers = [_read_as(u, value, analysis)[0] for u in others]
            tied = reader.name in PRODUCERS and any(r.name in PRODUCERS for r in readers)
            what = "it is tied: also the weight of" if tied else "it is also read by"
            return Refusal(Code.SHARED_WEIGHT,
                           f"it would go into {role} of {reader.name}, but {what} "
                           f"{', '.join(r.name for r in readers)}; folding would copy it "
                           f"({size} bytes)" + (f", and one table cannot take it ({kept})"
                                                if kept else "") +
                           ". Left as is: untie the weight to fold it")
        factor = 1.0 / self.match.scale if way.inverse else self.match.scale
        if not way.terminal and _unchanged(analysis, value, factor):
            return None  # c * NaN = NaN, c * 0 = 0: a take's out-of-range fill stays as it is
        ty = elements.tensor_type(value)
        own = elements.numpy_dtype(ty.element_type) if ty is not None else None
        compute = own if own is not None and self.exact_in(own) else self.match.compute
        kernel = producers.kernel(value, compute, analysis.evaluator,
                                  reader.name.removeprefix("stablehlo."))
        if isinstance(kernel, Refusal):
            return kernel.wrap(f"{role} of {reader.name}")
        scale = np.asarray(factor, dtype=np.float64)
        channels = None
        if mask is not None:
            scale = np.where(mask, scale, 1.0)
            channels = (int(np.count_nonzero(mask)), int(mask.size))
        rewrite = plan_kernel(kernel, scale, operand)
        if isinstance(rewrite, Refusal):
            return rewrite.wrap(f"{role} of {reader.name}")
        self.edits.append(Edit(target, operand, rewrite, reader, way.terminal, channels))
        return None


class FoldScale(Pattern[ir.Operation, Match, Plan]):
    """Moves each constant scalar scale into the weight behind it."""


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        return ctx.ops(ROOT_OPS)

    def match(self, ctx: Context, root: ir.Operation) -> Match | None:
        if ctx.rewriter.is_replaced(root) or ctx.ledger.is_folded(root):
            return None
        found = _scalar(ctx.analysis, root)
        if found is None:
            return None
        operand, scale = found
        ty = elements.tensor_type(root.results[0])
        dtype = elements.numpy_dtype(ty.element_type) if ty is not None else None
        if dtype is None or not elements.is_float(ty.element_type):  # type: ignore[union-attr]
            return None
        value = root.operands[operand]
        if ctx.analysis.live_users(value) != [root]:
            return None  # a term of a function of the value (GELU's x * 0.5), not its scale
        return Match(root, operand, scale, _rounded_in(ctx, root, dtype))

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal | None:
        found = _search(ctx, match)
        if found is None:
            return None  # no weight behind it: not a scale bnfold could fold
        if isinstance(found, Refusal):
            return found.wrap(f"the scale {match.scale:.6g} ({match.root.name})")
        return found

    def apply(self, rewriter: Rewriter, plan: Plan) -> list[ir.Operation]:
        by_target: dict[Handle, list[Edit]] = {}
        for edit in plan.edits:
            by_target.setdefault(rewriter.handle(edit.target), []).append(edit)
        weights: list[ir.Operation] = []
        for edits in by_target.values():
            target = edits[0].target
            if edits[0].operand < 0:  # the weight itself, for every reader (a tied table)
                weights.append(_rebuild_readers(rewriter, edits[0]))
                continue
            with ir.InsertionPoint(target):
                values = {e.operand: e.rewrite.build(target.location) for e in edits}
                new = rewriter.clone(target, values)
            rewriter.replace_op(target, list(new.results), successor=new)
            weights += [new for e in edits if e.terminal]
        root = plan.match.root
        rewriter.replace_op(root, [root.operands[plan.match.operand]])
        return weights

    def record(self, ctx: Context, plan: Plan, applied: list[ir.Operation]) -> None:
        ledger = ctx.ledger
        match = plan.match
        weights = [e for e in plan.edits if e.terminal]
        first = weights[0].reader
        into = ", ".join(f"{_role(e.reader, None)} of {ledger.location(e.reader)}" +
                         (f" (its {e.channels[0]} of {e.channels[1]} output channels that the "
                          "slice reads)" if e.channels else "")
                         for e in weights if not e.inverse)
        tied = [e for e in weights if e.inverse]
        if tied:  # a table tied to the LM head: one table, the head's input takes 1 / scale
            into += " (tied to the LM head: one table, scaled for every reader), and " \
                f"1/{match.scale:.6g} into " + ", ".join(
                    f"{_role(e.reader, None)} of {ledger.location(e.reader)}" for e in tied)
        biases = sum(1 for e in plan.edits if not e.terminal)
        note = f"{match.scale:.6g} into {into}" + (f" (and {biases} bias(es))" if biases else "") + \
            (f", through {', '.join(dict.fromkeys(plan.crossed))}" if plan.crossed else "")
        fold = Fold(id="", producer=ledger.location(first), producer_op=first.name,
                    norm=ledger.location(match.root), norm_op=match.root.name, form="scale",
                    direction="backward", channels=1, ops=[], function=function_name(match.root),
                    params={"scale": np.asarray(match.scale, dtype=np.float64)},
                    kernel_rounding=max(e.rewrite.worst_relative_rounding for e in plan.edits),
                    kind="scale", note=note)
        ledger.fold(fold, [match.root], producer=applied[0] if applied else None)

    def refuse(self, ctx: Context, subject: ir.Operation | Match, refusal: Refusal) -> None:
        if isinstance(subject, Match):
            ctx.ledger.refuse(subject.root, refusal)

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """A helper whose scale's walk crosses this call: a scale inside it (an attention
        helper, a platform branch) on a value its arguments carry in (q from the caller's
        `x Wq`, or a weight passed as an argument), or a result (`@proj(%x)` returning
        `x Wq`, through RoPE) that the caller scales. Each call site gets its own copy
        (inline-calls), so a helper called twice folds twice."""
        analysis = ctx.analysis
        site = CallSite(call, callee)
        if ctx.body_ops(callee) & {*ROOT_OPS, "func.call"}:
            for op, inner in ops_within(site):
                if op.name in ROOT_OPS and (found := _scalar(analysis, op)) is not None and \
                        _back_to_arguments(op.operands[found[0]], inner, ctx):
                    return True
        if not (ctx.body_ops(callee) & {*PRODUCERS, "func.call"}):
            return False  # nothing in it a scale could go into
        return any(_forward_to_scale(result, analysis) for result in call.results)


    def may_inline(self, ctx: Context, callee: ir.Operation) -> bool:
        """A helper with a scale or a weight's layer inside, or a call."""
        return bool(ctx.body_ops(callee) & {*ROOT_OPS, *PRODUCERS, "func.call"})


def _rebuild_readers(rewriter: Rewriter, edit: Edit) -> ir.Operation:
    """The new weight, and each op reading the old one cloned to read it (new ops: nothing
    derived from the old weight's readers stays cached); the clone of `edit.reader`."""
    target, old = edit.target, edit.target.results[0]
    with ir.InsertionPoint(target):
        value = edit.rewrite.build(target.location)
    found = edit.reader
    readers = list(dict.fromkeys(u for u in users(old) if not rewriter.is_replaced(u)))
    for user in readers:
        copy = rewriter.clone(user, {i: value for i, o in enumerate(user.operands) if o == old})
        rewriter.replace_op(user, list(copy.results), successor=copy)
        if user == edit.reader:
            found = copy
    return found


def _search(ctx: Context, match: Match,
            accept: Callable[[_Walk], Refusal | None] | None = None, *,
            keeps_tables: bool = True) -> Plan | Refusal | None:
    """The first region that closes, trying each choice of ways in turn (at most
    MAX_ATTEMPTS); `accept` may refuse a closed one. The refusal that tells most when none
    closes; None when no way reached a weight."""
    policy: dict[Handle, int] = {}
    reaches: dict[Handle, bool] = {}
    refusals: list[tuple[Refusal, int]] = []  # each way's refusal, and how far it got
    reached = False
    for _ in range(MAX_ATTEMPTS):
        walk = _Walk(ctx, match, policy, reaches, keeps_tables=keeps_tables)
        result = walk.run()
        reached = reached or walk.reached
        if not refused(result) and accept is not None:
            result = accept(walk) or result
        if not refused(result):
            return result
        refusals.append((result, len(walk.crossed)))
        while walk.trail:
            key, count = walk.trail.pop()
            following = policy.get(key, 0) + 1
            if following < count:
                policy[key] = following
                break
            policy.pop(key, None)
        else:
            break
    if not reached:
        return None
    return _best(refusals)


def _read_as(user: ir.Operation, value: ir.Value, analysis: Analysis
             ) -> tuple[ir.Operation, ir.Value]:
    """The op that reads `value` through `user` and the layout ops after it (a transposed
    tied table: the LM head's dot_general), and the operand it reads it as."""
    read = value
    for _ in range(8):
        if user.name not in PEEL:
            break
        found = analysis.sole_live_user(user.results[0])
        if found is None:
            break
        read, user = user.results[0], found
    return user, read


def _reaches(start: ir.Value, visit: Callable[[ir.Value], bool | Iterable[ir.Value]]) -> bool:
    """A depth-first search from `start` over at most MAX_FORWARD values: `visit(value)` is
    True where the search succeeds, else the values to look at next."""
    todo: list[ir.Value] = [start]
    seen: set[ir.Value] = set()
    while todo and len(seen) < MAX_FORWARD:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        found = visit(current)
        if found is True:
            return True
        if found is not False:
            todo.extend(found)
    return False


def _back_to_arguments(value: ir.Value, site: CallSite, ctx: Context) -> bool:
    """Whether the walk back from a scaled value inside a helper, through ops with scalar
    laws (and into the helpers they call), reaches a weight behind this call: a producer
    or gather of the caller (through the helper's arguments), or one whose weight the
    call passes in. Only then does inlining gain a fold: a walk that stops inside (at
    hard_sigmoid's relu6 before its `/ 6`) leaves the helper a call."""
    analysis = ctx.analysis
    # where each value lives: the call site that sees it (None: the caller), and whether
    # the walk crossed out of the helper to get there
    where: dict[ir.Value, tuple[CallSite | None, bool]] = {value: (site, False)}

    def visit(current: ir.Value) -> bool | Iterable[ir.Value]:
        here, outside = where[current]
        if here is not None and current in here.arguments:
            passed = here.call.operands[here.arguments.index(current)]
            where.setdefault(passed, (here.outer, outside or here is site))
            return [passed]
        op = defining_op(current)
        if op is None:
            return False
        if op.name == "func.call":  # a nested helper: look inside it
            inner = ctx.callee(op)
            if inner is None or not is_private(inner) or single_block(inner) is None:
                return False
            nested = CallSite(op, inner, here)
            returned = nested.returned(next(i for i, r in enumerate(op.results) if r == current))
            where.setdefault(returned, (nested, outside))
            return [returned]
        if op.name in PRODUCERS and (
                any(_passed_in(o, here, site) for o in op.operands) or
                (outside or here is None) and any(analysis.is_constant(o) for o in op.operands)):
            return True  # a weight the call passes in, or one in the caller
        if op.name in laws.SCALAR_LAWS:
            following = [o for o in op.operands if not analysis.is_constant(o)]
            for o in following:
                where.setdefault(o, (here, outside))
            return following
        if op.name == "stablehlo.batch_norm_inference" and \
                ctx.options.enabled("backward-affine") and \
                backward_affine.would_fold(op, analysis, ctx.options.fold_into_narrow_kernels):
            # No scalar law, but backward-affine (which runs first) will fold it into the
            # producer before it (asked now, by its own plan), and the scale then reaches
            # that producer through its bias: one run inlines what a second run would.
            where.setdefault(op.operands[0], (here, outside))
            return [op.operands[0]]
        return False

    return _reaches(value, visit)


def _passed_in(value: ir.Value, here: CallSite | None, site: CallSite) -> bool:
    """Whether `value`, seen at `here`, is an argument that `site`'s call passes in (through
    the nested calls between them)."""
    while here is not None and value in here.arguments:
        value = here.call.operands[here.arguments.index(value)]
        if here is site:
            return True
        here = here.outer
    return False


def _forward_to_scale(value: ir.Value, analysis: Analysis) -> bool:
    """Whether `value` (a call's result) reaches a constant scalar scale through ops with
    scalar laws."""
    def visit(current: ir.Value) -> bool | Iterable[ir.Value]:
        following: list[ir.Value] = []
        for user in analysis.live_users(current):
            if user.name in ROOT_OPS and (found := _scalar(analysis, user)) is not None and \
                    user.operands[found[0]] == current:
                return True
            if user.name in laws.SCALAR_LAWS:
                following.extend(user.results)
        return following

    return _reaches(value, visit)


def _scalar(analysis: Analysis, root: ir.Operation) -> tuple[int, float] | None:
    """(the scaled operand, the scale) when `root` multiplies a value computed at run time by
    a constant scalar (or divides it by one), else None."""
    indices = (0, 1) if root.name == "stablehlo.multiply" else (1,)
    for index in indices:
        const = analysis.constant(root.operands[index])
        if const is None or analysis.constant(root.operands[1 - index]) is not None:
            continue
        values = np.asarray(const.array, dtype=np.float64).reshape(-1)
        if values.size == 0 or values.size > 4096 or not np.all(values == values[0]):
            return None
        c = float(values[0])
        scale = 1.0 / c if root.name == "stablehlo.divide" and c != 0 else c
        if not math.isfinite(scale) or scale in (0.0, 1.0) or c == 0:
            return None
        return 1 - index, scale
    return None


def _unchanged(analysis: Analysis, value: ir.Value, factor: float) -> bool:
    """Whether a constant is the same times `factor`: all NaN or zero (or infinite, for a
    positive factor), as the NaN fill of a gather's out-of-range rows."""
    ty = elements.tensor_type(value)
    if ty is None or math.prod(ty.shape) > 4096:
        return False
    const = analysis.constant(value)
    if const is None:
        return False
    values = np.asarray(const.array, dtype=np.float64)
    fixed = np.isnan(values) | (values == 0) | (np.isinf(values) & (factor > 0))
    return bool(np.all(fixed))


def _everything(value: ir.Value) -> laws.Mask:
    return np.ones((1,) * len(ir.RankedTensorType(value.type).shape), dtype=bool)


def _same_mask(a: laws.Mask | None, b: laws.Mask | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _reads_unscaled(user: ir.Operation, mask: laws.Mask | None) -> bool:
    """Whether `user` reads only the unscaled part of a value scaled where `mask` is True
    (the K and V slices of a fused projection whose q slice takes the scale)."""
    if mask is None or user.name != "stablehlo.slice":
        return False
    law = laws.SCALAR_LAWS["stablehlo.slice"]
    assert law.part is not None
    read = law.part(user, 0, _everything(user.results[0]))
    return not isinstance(read, Refusal) and not bool(np.any(read & mask))


_ARGUMENT = (Code.PARAMETER, Code.LOOP, Code.KERNEL_ARGUMENT)


def _best(refusals: list[tuple[Refusal, int]]) -> Refusal:
    """The refusal that tells the user most (`_RANK`). A way that ends at a function
    argument says "bind it" only where no other way got further: when the way through the
    weights is stopped by a computed value read twice (q also returned) and the other way
    ends at an argument (k passed in: an input, or an unbound parameter), the fan-out is
    the obstacle, and the argument is mentioned after it."""
    best, depth = min(refusals, key=lambda r: _RANK.get(r[0].code, 9))
    if best.code is Code.USERS:
        # scaling all of a fused projection's output is stopped by its K and V slices; the
        # way that scales only q's part got further, and its obstacle is the one to name
        deeper = [(r, d) for r, d in refusals if d > depth and r.code not in _ARGUMENT]
        if deeper:
            return max(deeper, key=lambda r: r[1])[0]
    if best.code not in _ARGUMENT:
        return best
    further = [(r, d) for r, d in refusals if r.code is Code.USERS and d > depth]
    if not further:
        return best
    users, _ = max(further, key=lambda r: r[1])
    return Refusal(Code.USERS, f"{users.message} (the other way: {best.message})")


def _integer_producer(op: ir.Operation) -> Refusal | None:
    """A refusal when `op` converts an integer layer's output to floats (an int8
    dot_general's i32 result, through layout ops and integer bias adds), else None: the
    scale is that layer's dequantization, and its integer weights cannot take it."""
    if op.name != "stablehlo.convert":
        return None
    ty = elements.tensor_type(op.operands[0])
    if ty is None or elements.is_float(ty.element_type):
        return None
    source = defining_op(op.operands[0])
    for _ in range(8):
        if source is None or source.name in PRODUCERS or \
                source.name not in (*PEEL, "stablehlo.add", "stablehlo.convert"):
            break
        source = defining_op(source.operands[0])
    if source is None or source.name not in PRODUCERS:
        return None
    return Refusal(Code.QUANTIZED, f"it scales the output of {source.name}, which computes in "
                                   f"integers ({ty.element_type}, converted to floats): its "
                                   "integer weights cannot take a scale without becoming floats "
                                   "(an integer layer's dequantization scale stays as it is)")


def _rounded_in(ctx: Context, root: ir.Operation, dtype: np.dtype) -> np.dtype:
    """The type the original rounds `c x` to: the root's, or a narrower one when its only
    reader is a narrowing convert (`convert(convert(q, f32) * c, bf16)`: one bf16 rounding
    of the product, as a bf16 multiply makes)."""
    user = ctx.analysis.sole_live_user(root.results[0])
    if user is None or user.name != "stablehlo.convert":
        return dtype
    narrow = elements.float_dtype(user.results[0])
    return narrow if narrow is not None and precision.is_narrower(narrow, dtype) else dtype


def _role(reader: ir.Operation, way: laws.ScalarWay | None) -> str:
    if reader.name == "stablehlo.gather":
        return "the table"
    if reader.name in PRODUCERS:
        return "the kernel"
    if way is not None and not way.terminal:
        return "the constant"
    return "the constant factor"


def _bias_add(op: ir.Operation, analysis: Analysis) -> bool:
    """Whether `op` adds a constant to a linear layer's result (its bias)."""
    if op.name not in ("stablehlo.add", "stablehlo.subtract"):
        return False
    owners = [defining_op(v) for v in op.operands]
    return any(o is not None and o.name in PRODUCERS for o in owners) and \
        any(analysis.constant(v) is not None for v in op.operands)


def _unowned(op: ir.Operation | None, analysis: Analysis) -> bool:
    """Whether `op` is a gather or a product of two run-time values (`q k^T`): a scale
    of its narrower result (`convert(q k^T) * c`, rule 8) is no backward fold's to refuse."""
    if op is None or op.name not in PRODUCERS:
        return False
    return op.name == "stablehlo.gather" or \
        all(analysis.constant(v) is None for v in op.operands[:2])


def _narrower(value: ir.Value, dtype: np.dtype, compute: np.dtype) -> Refusal:
    v, c = precision.type_name(dtype), precision.type_name(compute)
    return Refusal(Code.PRECISION, f"precision: the scale is applied in {c} but {_name(value)} is "
                                   f"{v}; moving it there would round it in {v} (relative error "
                                   f"up to {precision.unit_roundoff(dtype):.1e} instead of "
                                   f"{precision.unit_roundoff(compute):.1e}). Keep the scale, or "
                                   f"scale in {v}")


def _read_twice(op: ir.Operation, index: int, walked: tuple[int, ...], mapped: laws.Mask,
                law: laws.ScalarLaw, mask: laws.Mask | None, value: ir.Value) -> Refusal | None:
    """Why scaling `mapped` of operand `index` of `op` would reach another operand of `op`
    that is the same value (`concatenate(y, y)`): a part scaled through one copy is scaled
    in the other too, which the walk takes unscaled (or not at all)."""
    operand = op.operands[index]
    for other, read in enumerate(op.operands):
        if other == index or read != operand:
            continue
        if other in walked:
            assert law.part is not None
            again = law.part(op, other, mask if mask is not None else _everything(value))
            if not isinstance(again, Refusal) and _same_mask(_squeeze(again), _squeeze(mapped)):
                continue
        return Refusal(Code.USERS, f"{op.name} reads {_name(operand)} twice (operands {index} "
                                   f"and {other}), and the scale would reach both copies where "
                                   f"only one carries it; scaling it would change that op")
    return None


_VIEWS = frozenset({"stablehlo.slice", "stablehlo.reshape", "stablehlo.transpose",
                    "stablehlo.broadcast_in_dim", "stablehlo.convert"})


def _from_producer(value: ir.Value, steps: int = 16) -> bool:
    """Whether `value` is a linear producer's (or gather's) result, or a view of one (slices,
    reshapes, transposes, broadcasts, converts: a fused projection's q): the walk would have
    reached its weight had the value had no other reader, so that refusal is the scale's
    decision. Not through arithmetic: a norm's own statistics (`sum(x W + b) / n`) read a
    layer's output too, and their divide gets no decision of its own."""
    for _ in range(steps):
        op = defining_op(value)
        if op is None or op.name not in _VIEWS:
            return op is not None and op.name in PRODUCERS
        value = op.operands[0]
    return False


def _squeeze(mask: laws.Mask) -> laws.Mask | None:
    """None for a mask that is True everywhere (the whole value)."""
    return None if bool(np.all(mask)) else mask


def _name(value: ir.Value) -> str:
    owner = defining_op(value)
    return f"the result of {owner.name}" if owner is not None else "a block argument"


PATTERN = FoldScale()
