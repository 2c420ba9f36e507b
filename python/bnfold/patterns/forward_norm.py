"""forward-norm: fold a normalization's affine into every linear layer it feeds.

A transformer's LayerNorm / RMSNorm computes its statistics at run time; only
its affine part (gamma, beta; Gemma's `1 + w`) is constant, and pre-norm
blocks feed the normalized value to several linear layers at once (Q, K and V;
gate and up). Before (plain JAX; `%n` is the normalized value):

    %n = stablehlo.multiply %xm, %r : tensor<2x4x8xf32>        // (x - mean) * rsqrt(var + eps)
    %s = stablehlo.multiply %n, %gamma_b : tensor<2x4x8xf32>
    %v = stablehlo.add %s, %beta_b : tensor<2x4x8xf32>
    %q = stablehlo.dot_general %v, %wq, contracting_dims = [2] x [0] ...
    %k = stablehlo.dot_general %v, %wk, contracting_dims = [2] x [0] ...

After:

    %q2 = stablehlo.dot_general %n, %wq2 ...       // wq2 = diag(gamma) wq
    %qb = stablehlo.add %q2, %bq_b                 // bq = beta wq
    %k2 = stablehlo.dot_general %n, %wk2 ...
    %kb = stablehlo.add %k2, %bk_b

The affine is found by its law (`bnfold.laws.factor`), not by names: the
value the linear layers read is written as `n * g + b` per feature, walking
back through elementwise ops, so gamma may sit anywhere a law moves it from:
multiplied into the `rsqrt` factor before that meets `x - mean` (Flax,
Keras), on both terms of Keras' `x * inv + (beta - mean * inv)`, after a
convert to the weight's type (Hugging Face), or as `1 + w` (Gemma). The bare
`n` is rebuilt from the same ops with the constants left out.

Between the value and each linear layer there may be reshapes, transposes and
float converts (fanning out); every use must end at a convolution or
dot_general that reads it as its activation with a constant kernel. Any other
use (a residual add in a post-norm block, a value returned from the function,
attention's `q @ k^T`) refuses the fold (`nonlinear-consumer`), naming the op.
Precision: each kernel is scaled in float64 and rounded once to its type
(docs/precision.md, rule 7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bnfold import chains, elements, laws, precision, producers
from bnfold.analysis import Analysis
from bnfold.constants import map_axis_through_reshape, per_channel
from bnfold.graph import callee_name, defining_op, function_name
from bnfold.ir import format_location, ir, stablehlo
from bnfold.patterns.base import Pattern
from bnfold.patterns.forward_affine import FORWARD_FOLDS
from bnfold.patterns.inline_calls import CallSite, behind_calls
from bnfold.patterns.rewrite import KernelRewrite, bias_add, plan_kernel
from bnfold.refusal import Code, Refusal
from bnfold.report import Fold
from bnfold.through import shift_through

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter


_LAYOUT = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")
_ELEMENTWISE = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                "stablehlo.negate", "stablehlo.convert")
_MAX_DEPTH = 8  # elementwise ops between a norm's statistics and its result, at most
_STATISTICS = ("stablehlo.rsqrt", "stablehlo.sqrt", "stablehlo.reduce")
_STATISTICS_DEPTH = 10  # ops between a norm's statistics and its result, at most


# --- the form of a value: n * g + b ------------------------------------------------------


@dataclass(frozen=True)
class Bare:
    """How to build a value's bare `n`: `value` itself (op None), or `op` cloned with
    its operands' bare values (`parts`), or the negation of `parts[0]`."""

    value: ir.Value
    op: ir.Operation | None = None
    parts: tuple[Bare, ...] = ()
    negate: bool = False


@dataclass(frozen=True)
class Form:
    """A value as `bare * g + b` along `axis`; `consumed`: the ops whose constants went
    into g and b (in program order)."""

    factored: laws.Factored
    bare: Bare
    consumed: tuple[ir.Operation, ...]
    # The values before this one that carry part of the affine (`n * g` before `+ b`):
    # the fold removes them, so nothing else may read them.
    scaled: tuple[ir.Value, ...] = ()


def factor(value: ir.Value, axis: int, analysis: Analysis) -> Form:
    """`value` as `n * g + b` per channel along `axis` (bare where no law applies).

    The walk looks `_MAX_DEPTH` elementwise ops back at most: a norm's affine sits right
    before its result, and what lies further up (the rest of the network) stays bare."""
    channels = ir.RankedTensorType(value.type).shape[axis]
    memo: dict[ir.Value, Form] = {}
    shape = list(ir.RankedTensorType(value.type).shape)
    home = defining_op(value)
    block = home.block if home is not None else None

    def visit(v: ir.Value, depth: int) -> Form:
        if v in memo:
            return memo[v]
        owner = defining_op(v)
        found = Form(laws.Factored.bare(channels), Bare(v), ())
        if owner is not None and owner.name in _ELEMENTWISE and depth < _MAX_DEPTH and \
                owner.block == block and list(ir.RankedTensorType(v.type).shape) == shape:
            found = _factor_op(owner, v, axis, analysis,
                               lambda u: visit(u, depth + 1)) or found
        memo[v] = found
        return found

    return visit(value, 0)


def _factor_op(op: ir.Operation, v: ir.Value, axis: int, analysis: Analysis,
               visit: Callable[[ir.Value], Form]) -> Form | None:
    """The form of `op`'s result by its law, or None (bare).

    Where the law does not apply to the operands' forms (a product of a form with a
    shift: `(x + bias - mean) * (r * g)`, the bias of the layer before), it is tried again
    with such operands taken as they are (bare: their own value, g = 1, b = 0)."""
    operands: list[Form | np.ndarray] = []  # a run-time operand's form, a constant's vector
    for operand in op.operands:
        const = analysis.constant(operand)
        if const is None:
            operands.append(visit(operand))
            continue
        vector = per_channel(const, axis)
        if isinstance(vector, Refusal):
            return None  # varies along another axis: not this affine
        operands.append(vector)
    shaped = [i for i, f in enumerate(operands)
              if isinstance(f, Form) and not f.factored.is_bare]
    if len(shaped) == len(operands) == 0 or \
            (not shaped and all(isinstance(f, Form) for f in operands)):
        return None  # nothing constant anywhere behind it: the value is its own bare n
    resets = [frozenset(), *(frozenset({i}) for i in shaped)]
    if len(shaped) > 1:
        resets.append(frozenset(shaped))
    for reset in resets:
        found = _law(op, v, [_bare(op.operands[i], f) if i in reset else f
                             for i, f in enumerate(operands)])
        if found is not None:
            return found
    return None


def _bare(value: ir.Value, form: Form | np.ndarray) -> Form:
    """`value` taken as it is: its own bare value (g = 1, b = 0)."""
    assert isinstance(form, Form)
    return Form(laws.Factored.bare(form.factored.g.shape[0]), Bare(value), ())


def _law(op: ir.Operation, v: ir.Value, operands: list[Form | np.ndarray]) -> Form | None:
    """The law of `op` on its operands' forms and constant vectors, or None."""
    forms = [f if isinstance(f, Form) else None for f in operands]
    if not any(f is not None and not f.factored.is_bare for f in forms) and \
            all(f is not None for f in forms):
        return None
    widening = True
    if op.name == "stablehlo.convert":
        source = elements.numpy_dtype(ir.RankedTensorType(op.operands[0].type).element_type)
        target = elements.numpy_dtype(ir.RankedTensorType(v.type).element_type)
        widening = source is not None and target is not None and \
            not precision.is_narrower(target, source)
    law = laws.factor(op.name, [f.factored if isinstance(f, Form) else f for f in operands],
                      widening=widening)
    if law is None:
        return None
    consumed = tuple(o for f in forms if f is not None for o in f.consumed)
    scaled = tuple(w for f, operand in zip(forms, op.operands, strict=True)
                   if f is not None and not f.factored.is_bare
                   for w in (*f.scaled, operand))
    if any(f is None for f in forms):
        consumed = (*consumed, op)
    if law.build == "op":
        if all(f is None or (f.bare.op is None and f.bare.value == operand and not f.bare.negate)
               for f, operand in zip(forms, op.operands, strict=True)):
            built = Bare(v)  # the operands are their own bare values: so is this
        else:
            built = Bare(v, op, tuple(f.bare if f is not None else Bare(v) for f in forms))
    else:
        kept = forms[law.operand]
        assert kept is not None
        built = kept.bare if law.build == "keep" else Bare(v, None, (kept.bare,), negate=True)
    return Form(law.factored, built, consumed, scaled)


# --- where the value goes ----------------------------------------------------------------


@dataclass(frozen=True)
class Consumer:
    """A linear layer reading the value through `path` (layout ops, first first)."""

    producer: ir.Operation
    act_index: int
    path: tuple[ir.Operation, ...]
    axis: int  # the feature axis of the value (before the path) that the layer contracts


def consumers(value: ir.Value, analysis: Analysis) -> tuple[list[Consumer], Refusal | None]:
    """Every linear layer `value` reaches through layout ops, and the first use that is
    not linear (None when there is none)."""
    found: list[Consumer] = []
    problems: list[Refusal] = []

    def walk(v: ir.Value, path: tuple[ir.Operation, ...]) -> None:
        for user in analysis.live_users(v):
            if user.name in _LAYOUT and user.operands[0] == v and len(user.results) == 1 and \
                    _float(user.results[0]):
                walk(user.results[0], (*path, user))
                continue
            index = _activation(user, v, analysis) if producers.is_producer(user) else None
            if index is None:
                problems.append(Refusal(Code.NONLINEAR_CONSUMER, _nonlinear(user)))
                continue
            axis = _axis_back(path, _input_axis(user, index))
            if axis is None:
                problems.append(Refusal(Code.AXIS, f"forward-norm: a reshape before the "
                                                   f"{_short(user)} at {_where(user)} merges "
                                                   f"or splits the feature axis"))
                continue
            found.append(Consumer(user, index, path, axis))

    walk(value, ())
    return found, (problems[0] if problems else None)


def feature_axis(value: ir.Value, found: list[Consumer]) -> int | None:
    """The axis of `value` every layer contracts (the last one when no layer reads it),
    or None when they disagree."""
    axes = {c.axis for c in found}
    if not axes:
        return ir.RankedTensorType(value.type).rank - 1
    return axes.pop() if len(axes) == 1 else None


def _float(v: ir.Value) -> bool:
    ty = elements.ranked_type(v)
    return ty is not None and ty.has_static_shape and elements.is_float(ty.element_type)


def _short(op: ir.Operation) -> str:
    return op.name.removeprefix("stablehlo.")


def _where(op: ir.Operation) -> str:
    return format_location(op.location)


def _nonlinear(user: ir.Operation, partway: str = "") -> str:
    at = _where(user)
    if user.name == "func.return":
        what = "leaves the function (func.return)"
    elif user.name == "func.call":
        what = f"is passed to func.call @{callee_name(user)}"
    elif producers.is_producer(user):
        what = (f"is an operand of {_short(user)} at {at} whose other operand is computed at "
                f"run time (or is the kernel)")
    elif user.name in ("stablehlo.add", "stablehlo.subtract"):
        what = f"feeds {user.name} at {at} (a residual or other non-linear use)"
    else:
        what = f"feeds {user.name} at {at}, which is not a linear layer"
    return (f"forward-norm: the normalized value {partway}{what}; its affine can fold only "
            f"where every use is a convolution or dot_general with a constant kernel")


def _activation(op: ir.Operation, v: ir.Value, analysis: Analysis) -> int | None:
    """The operand index at which `op` reads `v` as its activation (constant kernel)."""
    if op.name == "stablehlo.convolution":
        return 0 if op.operands[0] == v and op.operands[1] != v and \
            producers.is_constant(op.operands[1], analysis.evaluator) else None
    for index in (0, 1):
        if op.operands[index] == v and op.operands[1 - index] != v and \
                producers.is_constant(op.operands[1 - index], analysis.evaluator):
            return index
    return None


def _input_axis(op: ir.Operation, index: int) -> int | None:
    if op.name == "stablehlo.convolution":
        return producers.conv_dims(op).input_feature_dimension
    dims = producers.dot_dims(op)
    contracting = dims.lhs_contracting_dimensions if index == 0 else \
        dims.rhs_contracting_dimensions
    return contracting[0] if len(contracting) == 1 else None


def _axis_back(path: tuple[ir.Operation, ...], axis: int | None) -> int | None:
    """The producer-input axis mapped back through `path` to the value it starts at."""
    if axis is None:
        return None
    for op in reversed(path):
        if op.name == "stablehlo.transpose":
            from bnfold.attributes import permutation
            axis = permutation(op)[axis]
        elif op.name == "stablehlo.reshape":
            after = tuple(ir.RankedTensorType(op.results[0].type).shape)
            before = tuple(ir.RankedTensorType(op.operands[0].type).shape)
            mapped = map_axis_through_reshape(after, before, axis)
            if mapped is None:
                return None
            axis = mapped
    return axis


def _crosses_narrowing(c: Consumer, shift: np.ndarray) -> Refusal | None:
    """Why the affine may not move across a narrowing convert on the way to `c` (docs/precision.md,
    precision contract rule 4: a shift never does; a scale does when the narrow type
    keeps the wide one's exponent range, as Gemma's f32 `(1 + w)` before a bf16 layer)."""
    for op in c.path:
        if op.name != "stablehlo.convert":
            continue
        source = elements.numpy_dtype(ir.RankedTensorType(op.operands[0].type).element_type)
        target = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
        if source is None or target is None or not precision.is_narrower(target, source):
            continue
        if np.any(shift != 0) or not precision.same_exponent_range(source, target):
            names = [precision.type_name(d) for d in (source, target)]
            what = "its shift" if np.any(shift != 0) else "its scale"
            return Refusal(Code.NARROWING,
                           f"forward-norm: a convert at {_where(op)} rounds the normalized "
                           f"value from {names[0]} to {names[1]} before the "
                           f"{_short(c.producer)}; {what} cannot move across it (a rounding "
                           f"stays where the original has it)")
    return None


# --- match, plan, apply ------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """A value read by linear layers, whose form has a constant affine."""

    value: ir.Value
    axis: int
    form: Form
    layers: tuple[Consumer, ...]


@dataclass(frozen=True)
class Folded:
    """One consumer's new kernel and bias."""

    consumer: Consumer
    kernel: KernelRewrite
    bias: np.ndarray | None
    out_axis: int


@dataclass(frozen=True)
class Plan:
    match: Match
    folds: tuple[Folded, ...]


def find(root: ir.Operation, analysis: Analysis) -> Match | Refusal | None:
    """The value `root` computes, if linear layers read it and it has a constant affine
    (a refusal when it is a norm with a use that is not linear)."""
    value = root.results[0]
    if not _float(value):
        return None
    found, problem = consumers(value, analysis)
    if not found:
        return None  # no linear layer reads it: the chain's own decision stands
    axis = feature_axis(value, found)
    if axis is None:
        form = factor(value, ir.RankedTensorType(value.type).rank - 1, analysis)
        problem = Refusal(Code.AXIS, f"forward-norm: its linear layers contract different "
                                     f"axes {sorted({c.axis for c in found})}")
    else:
        form = factor(value, axis, analysis)
    if form.factored.is_bare or not form.consumed or not _normalizes(value):
        return None
    if problem is not None:
        return problem
    if (problem := _read_midway(value, form, analysis)) is not None:
        return problem
    assert axis is not None
    return Match(value, axis, form, tuple(found))


def _read_midway(value: ir.Value, form: Form, analysis: Analysis) -> Refusal | None:
    """A refusal when an op other than the affine's own next step reads a value partway
    through it (a relu on `n * g` before `+ b`): that op needs the affine computed."""
    inside = {value, *form.scaled}
    for partial in form.scaled:
        for user in analysis.live_users(partial):
            if not any(r in inside for r in user.results):
                owner = defining_op(partial)
                at = f" at {_where(owner)}" if owner is not None else ""
                return Refusal(Code.NONLINEAR_CONSUMER, _nonlinear(
                    user, f"partway through its affine (the result of {_short(owner)}{at}, "
                          f"before the rest of it) " if owner is not None else ""))
    return None


def refused_form(root: ir.Operation, analysis: Analysis) -> Form:
    """The form `find` refused (to record the refusal under the norm's op)."""
    value = root.results[0]
    found, _ = consumers(value, analysis)
    axis = feature_axis(value, found)
    return factor(value, axis if axis is not None else ir.RankedTensorType(value.type).rank - 1,
                  analysis)


def _normalizes(value: ir.Value) -> bool:
    """Whether the statistics of a normalization (rsqrt, sqrt, a reduce) are close behind
    the value, without crossing a linear layer: a norm, not a layer's bias or a plain
    affine (which this pattern leaves alone)."""
    seen: set[ir.Value] = set()
    frontier = [value]
    for _ in range(_STATISTICS_DEPTH):
        following: list[ir.Value] = []
        for v in frontier:
            owner = defining_op(v)
            if v in seen or owner is None or producers.is_producer(owner) or \
                    owner.name == "stablehlo.constant":
                continue
            seen.add(v)
            if owner.name in _STATISTICS:
                return True
            if owner.name.startswith("stablehlo."):
                following.extend(owner.operands)
        frontier = following
    return False


def plan(m: Match, analysis: Analysis) -> Plan | Refusal:
    """Each layer's kernel times g (float64, rounded once) and its bias b @ K."""
    g, b = m.form.factored.g, m.form.factored.b
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(b))):
        return Refusal(Code.PRECISION, "forward-norm: the folded scale or shift is not finite")
    if np.any(b != 0) and (cancels := precision.shift_cancels(b / np.where(g == 0, 1, g))):
        return cancels.wrap("forward-norm")
    folds: list[Folded] = []
    for c in m.layers:
        if (problem := _crosses_narrowing(c, b)) is not None:
            return problem
        op = c.producer
        in_axis = _input_axis(op, c.act_index)
        assert in_axis is not None
        mapping = producers.input_scale_map(op, c.act_index, in_axis)
        if isinstance(mapping, Refusal):
            return mapping.wrap("forward-norm")
        act_type = ir.RankedTensorType(op.operands[c.act_index].type)
        compute = elements.numpy_dtype(act_type.element_type)
        if compute is None:
            return Refusal(Code.NOT_FLOAT, f"forward-norm: {act_type} is not a float type")
        kernel = producers.kernel(op.operands[mapping.operand], compute, analysis.evaluator,
                                  _short(op))
        if isinstance(kernel, Refusal):
            return kernel.wrap("forward-norm")
        rewrite = plan_kernel(kernel, mapping.expand(g, kernel.shape), mapping.operand)
        if isinstance(rewrite, Refusal):
            return rewrite.wrap("forward-norm")
        bias: np.ndarray | None = None
        out_axis = 0
        if np.any(b != 0):
            through = shift_through(op, mapping, kernel, b)
            if isinstance(through, Refusal):
                return through.wrap("forward-norm")
            if through.bias is None:
                return Refusal(Code.PADDING, f"forward-norm: the shift reaches the "
                                             f"{_short(op)} at {_where(op)} through zero "
                                             f"padding; its border correction is not built for "
                                             f"a normalization with several consumers")
            out_dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
            if out_dtype is not None and (problem := precision.check_bias(through.bias, out_dtype)):
                return problem.wrap("forward-norm")
            bias, out_axis = through.bias, through.out_axis
        folds.append(Folded(c, rewrite, bias, out_axis))
    return Plan(m, tuple(folds))


@dataclass(frozen=True)
class Applied:
    norm: ir.Operation
    producers: tuple[ir.Operation, ...]


def _build_bare(rewriter: Rewriter, bare: Bare, memo: dict[int, ir.Value]) -> ir.Value:
    """The bare value, built right before the ops it stands in for."""
    key = id(bare)
    if key in memo:
        return memo[key]
    result: ir.Value
    if bare.negate:
        inner = _build_bare(rewriter, bare.parts[0], memo)
        owner = defining_op(bare.value)
        assert owner is not None
        with ir.InsertionPoint(owner), owner.location:
            result = stablehlo.NegOp(inner).result
    elif bare.op is None:
        result = bare.value
    else:
        operands = {i: _build_bare(rewriter, p, memo) for i, p in enumerate(bare.parts)
                    if p.op is not None or p.negate or p.value != bare.op.operands[i]}
        result = rewriter.clone(bare.op, operands).results[0]
    memo[key] = result
    return result


def build(rewriter: Rewriter, p: Plan) -> Applied:
    """The bare value, each layer's path to it, the folded layers and their biases."""
    m = p.match
    value = _build_bare(rewriter, m.form.bare, {})
    paths: dict[int, ir.Value] = {}  # id of a path op -> its copy's result
    built: list[ir.Operation] = []
    for f in p.folds:
        c = f.consumer
        current = value
        for op in c.path:
            key = id(op)  # ops of this walk: alive for the whole apply
            found = paths.get(key)
            if found is None:
                found = rewriter.clone(op, {0: current}).results[0]
                paths[key] = found
            current = found
        op = c.producer
        with ir.InsertionPoint(op):
            kernel_value = f.kernel.build(op.location)
            folded = rewriter.clone(op, {f.kernel.operand: kernel_value, c.act_index: current})
        if f.bias is None:
            rewriter.replace_op(op, [folded.results[0]], successor=folded)
        else:
            with ir.InsertionPoint.after(op):
                replacement = bias_add(folded.results[0], f.bias, f.out_axis, op.location)
            rewriter.replace_op(op, [replacement], successor=folded)
        built.append(folded)
    return Applied(norm_op(m.form), tuple(built))


def norm_op(form: Form) -> ir.Operation:
    """The op a norm's decision is recorded under: its scaling op with a constant nearest
    to the normalized value (the weight's multiply; not a scale further up the network
    that the walk also factored)."""
    for op in reversed(form.consumed):
        if op.name in ("stablehlo.multiply", "stablehlo.divide", "stablehlo.negate"):
            return op
    return form.consumed[-1]


class ForwardNorm(Pattern[ir.Operation, Match, Plan]):
    """Folds a normalization's affine into every linear layer that reads it."""


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        seen: set[int] = set()
        for producer in chains.candidates(ctx).producers:
            producer = ctx.rewriter.current(producer)
            if ctx.analysis.is_dead(producer) or \
                    any(f.direction == "forward" for f in ctx.ledger.folds_of(producer)):
                continue  # forward-affine's work: its decisions stand
            for operand in producer.operands:
                value = operand
                owner = defining_op(value)
                while owner is not None and owner.name in _LAYOUT and owner.block == producer.block:
                    value = owner.operands[0]
                    owner = defining_op(value)
                if owner is None or owner.name not in _ELEMENTWISE or \
                        owner.block != producer.block:
                    continue
                key = ctx.rewriter.handle(owner)
                if key in seen:
                    continue
                seen.add(key)
                yield owner

    def match(self, ctx: Context, root: ir.Operation) -> Match | Refusal | None:
        if ctx.analysis.is_dead(root) or ctx.rewriter.is_replaced(root):
            return None
        found = find(root, ctx.analysis)
        if isinstance(found, Match) and _forward_affines(found, ctx):
            return None
        return found

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal | None:
        return plan(match, ctx.analysis)

    def refuse(self, ctx: Context, subject: ir.Operation | Match, refusal: Refusal) -> None:
        if isinstance(subject, Match):
            form = subject.form
        else:  # refused in match: a use that is not linear
            form = refused_form(subject, ctx.analysis)
        if form.consumed and not any(ctx.ledger.is_folded(op) for op in form.consumed):
            ctx.ledger.refuse(norm_op(form), refusal, form.consumed)

    def apply(self, rewriter: Rewriter, plan: Plan) -> Applied:
        return build(rewriter, plan)

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """A norm helper (`@rms_norm(%x, %w)`, jitted) whose result the caller's linear
        layers read, or a helper with linear layers that reads a normalized value the
        caller passes it. Each call site gets its own copy (inline-calls)."""
        analysis = ctx.analysis
        if ctx.body_ops(callee) & set(_ELEMENTWISE):
            site = CallSite(call, callee)
            for index, result in enumerate(call.results):
                value, _ = behind_calls(site.returned(index), site)
                owner = defining_op(value)
                if owner is not None and owner.name in _ELEMENTWISE and _normalizes(value) and \
                        consumers(result, analysis)[0]:
                    return True
        if not (ctx.body_ops(callee) & {*producers.NAMES, "func.call"}):
            return False
        for operand in call.operands:
            owner = defining_op(operand)
            if owner is not None and owner.name in _ELEMENTWISE and _normalizes(operand):
                return True
        return False

    def record(self, ctx: Context, plan: Plan, applied: Applied) -> None:
        m = plan.match
        ledger = ctx.ledger
        first = applied.producers[0]
        g, b = m.form.factored.g, m.form.factored.b
        others = [ledger.location(p) for p in applied.producers[1:]]
        fold = Fold(
            id="", producer=ledger.location(first), producer_op=first.name,
            norm=ledger.location(applied.norm), norm_op=applied.norm.name, form="decomposed",
            direction="forward", channels=int(g.shape[0]), ops=[], function=function_name(first),
            params={"scale": g.copy(), "shift": b.copy()},
            kernel_rounding=max(f.kernel.worst_relative_rounding for f in plan.folds),
            kind="normalization",
            note=(f"folded into {len(applied.producers)} linear layers" +
                  (f" (also {', '.join(others)})" if others else "")))
        ledger.fold(fold, m.form.consumed, producer=first)
        for other in applied.producers[1:]:
            ledger.fold_carried_by(fold, other)
        for producer in applied.producers:
            ctx.analysis.hand_on(FORWARD_FOLDS, fold, [producer])


def _forward_affines(m: Match, ctx: Context) -> bool:
    """One layer reading a plain chain: forward-affine's business (it ran first)."""
    if len(m.layers) != 1:
        return False
    return all(ctx.analysis.step(op) is not None for op in m.form.consumed) and \
        m.form.bare.op is None and not m.form.bare.negate


PATTERN = ForwardNorm()
