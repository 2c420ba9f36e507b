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
`n` is rebuilt from the same ops with the constants left out. The norm's input
times a constant scalar that the statistics (and the residual) read too, Gemma's
`embed * sqrt(hidden)`, is not part of the affine: its multiply would run on for
those readers; fold-scale decides it (into the embedding table).

Between the value and each linear layer there may be reshapes, transposes and
float converts (fanning out), and the steps of `bnfold.laws.NORM_PATH_LAWS`
that keep the feature axis whole: ViT's CLS-token slice, Swin's mean pooling
(the sum turns the shift b into m b), a zero-width pad. Before (the head of a
ViT, `%v` the final norm's `n * g + b`):

    %c = stablehlo.slice %v [0:1, 0:1, 0:96]
    %r = stablehlo.reshape %c : (tensor<1x1x96xf32>) -> tensor<1x96xf32>
    %y = stablehlo.dot_general %r, %w ...

After: the same slice and reshape of the bare `%n`, `%w2 = diag(g) w`, and a
bias `b w` added to `%y`. Every use must end at a convolution or dot_general
that reads it as its activation with a constant kernel. Any other use (a
residual add in a post-norm block, a value returned from the function,
attention's `q @ k^T`) refuses the fold (`nonlinear-consumer`), naming the op;
so does a norm no linear layer reads at all (found from its affine chain).
Precision: each kernel is scaled in float64 and rounded once to its type
(docs/precision.md, rule 7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bnfold import attributes, chains, elements, laws, precision, producers
from bnfold.analysis import Analysis
from bnfold.constants import map_axis_through_reshape, per_channel
from bnfold.graph import callee, callee_name, defining_op, function_name, single_block
from bnfold.ir import format_location, ir, stablehlo
from bnfold.patterns.base import Pattern
from bnfold.patterns.forward_affine import FORWARD_FOLDS
from bnfold.patterns.inline_calls import CallSite, behind_calls
from bnfold.patterns.rewrite import (
    BUILDS,
    Copy,
    KernelRewrite,
    bias_add,
    copy_cost,
    plan_kernel,
    record_copy,
)
from bnfold.refusal import Code, Refusal
from bnfold.report import Fold
from bnfold.through import shift_through

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.rewriter import Rewriter


_LAYOUT = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")
_ELEMENTWISE = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                "stablehlo.negate", "stablehlo.convert")
_MAX_PATH = 16  # steps between a norm and a layer, at most
# A helper made of these only moves values (F.pad, torch.roll): inlined for a norm's path.
_MOVES = frozenset({"stablehlo.slice", "stablehlo.concatenate", "stablehlo.pad",
                    "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert",
                    "stablehlo.broadcast_in_dim", "stablehlo.constant", "func.return",
                    "func.func"})
_MAX_DEPTH = 8  # elementwise ops between a norm's statistics and its result, at most
_STATISTICS = ("stablehlo.rsqrt", "stablehlo.sqrt", "stablehlo.reduce")
_STATISTICS_DEPTH = 10  # ops between a norm's statistics and its result, at most
_NORM_DEPTH = 6  # the same for a norm no linear layer reads (its own weight and bias only)


# --- the form of a value: n * g + b ------------------------------------------------------


class Bare(NamedTuple):
    """How to build a value's bare `n`: `value` itself (op None), or `op` cloned with
    its operands' bare values (`parts`), or the negation of `parts[0]`."""

    value: ir.Value
    op: ir.Operation | None = None
    parts: tuple[Bare, ...] = ()
    negate: bool = False


class Form(NamedTuple):
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
                owner.block == block and list(ir.RankedTensorType(v.type).shape) == shape and \
                not (depth and _input_scale(v, owner, analysis)):
            found = _factor_op(owner, v, axis, analysis,
                               lambda u: visit(u, depth + 1)) or found
        memo[v] = found
        return found

    return visit(value, 0)


def _input_scale(v: ir.Value, owner: ir.Operation, analysis: Analysis) -> bool:
    """Whether `v` is a norm's input times a constant scalar that the statistics read too
    (Gemma's `embed * sqrt(d)`, also read by the residual): not part of the affine. Taking
    it would leave its multiply running for the other readers while the report counted it
    folded; it is fold-scale's to decide (into the embedding table)."""
    if owner.name not in ("stablehlo.multiply", "stablehlo.divide") or \
            len(analysis.live_users(v)) < 2:
        return False
    constants = [_scalar(o, analysis) for o in owner.operands]
    if owner.name == "stablehlo.divide":
        constants[0] = None  # c / x is not a scale of x
    if sum(c is not None for c in constants) != 1:
        return False
    frontier, seen = [v], {v}
    for _ in range(_STATISTICS_DEPTH):  # the statistics: a reduce a few steps on
        following: list[ir.Value] = []
        for value in frontier:
            for user in analysis.live_users(value):
                if user.name == "stablehlo.reduce":
                    return True
                if user.name in _ELEMENTWISE or user.name in _LAYOUT or \
                        user.name == "stablehlo.power":
                    following += [r for r in user.results if r not in seen]
                    seen.update(user.results)
        frontier = following
    return False


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
    if not any(isinstance(f, Form) for f in operands):
        return None  # a constant (a norm's step on constants only: its value is not a norm)
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


class Consumer(NamedTuple):
    """A linear layer reading the value through `path` (layout ops, first first)."""

    producer: ir.Operation
    act_index: int
    path: tuple[ir.Operation, ...]
    axis: int  # the feature axis of the value (before the path) that the layer contracts
    shift_factor: float = 1.0  # the path turns a shift b into shift_factor * b (sum: times n)
    padded: ir.Operation | None = None  # a pad on the path that adds positions


def consumers(value: ir.Value, analysis: Analysis) -> tuple[list[Consumer], Refusal | None]:
    """Every linear layer `value` reaches through layout ops, and the first use that is
    not linear (None when there is none). A layer reached along several paths (through
    both halves of torch.roll's concatenate) is one consumer; the paths must agree."""
    found: dict[ir.Value, Consumer] = {}  # a layer's result -> its consumer (first path)
    order: list[Consumer] = []
    problems: list[Refusal] = []
    reached: set[ir.Value] = {value}
    joins: list[ir.Operation] = []

    def walk(v: ir.Value, path: tuple[ir.Operation, ...]) -> None:
        if len(path) > _MAX_PATH:
            problems.append(Refusal(Code.NONLINEAR_CONSUMER, "forward-norm: more than "
                                    f"{_MAX_PATH} steps between the norm and a layer"))
            return
        for user in analysis.live_users(v):
            if _passes(user, v, analysis):
                reached.add(user.results[0])
                if user.name == "stablehlo.concatenate":
                    joins.append(user)
                walk(user.results[0], (*path, user))
                continue
            index = _activation(user, v, analysis) if producers.is_producer(user) else None
            if index is None:
                problems.append(Refusal(Code.NONLINEAR_CONSUMER, _nonlinear(user)))
                continue
            traced = trace(path, _input_axis(user, index), user, analysis)
            if isinstance(traced, Refusal):
                problems.append(traced)
                continue
            consumer = Consumer(user, index, path, *traced)
            first = found.get(user.results[0])
            if first is None:
                found[user.results[0]] = consumer
                order.append(consumer)
            elif (first.axis, first.shift_factor, first.act_index) != \
                    (consumer.axis, consumer.shift_factor, consumer.act_index) or \
                    (first.padded is None) != (consumer.padded is None):
                problems.append(Refusal(Code.AXIS, f"forward-norm: the {_short(user)} at "
                                                   f"{_where(user)} reads the value along two "
                                                   f"paths that treat it differently"))

    walk(value, ())
    for join in joins:
        others = [o for o in join.operands if o not in reached]
        if others:
            problems.append(Refusal(Code.NONLINEAR_CONSUMER, f"forward-norm: the normalized "
                                    f"value is concatenated with another value at "
                                    f"{_where(join)}; its affine would reach that one too"))
    return order, (problems[0] if problems else None)


def _reached(value: ir.Value, analysis: Analysis) -> frozenset[ir.Value]:
    """The values `consumers` walks through from `value` (all paths, both halves of a
    roll's concatenate)."""
    seen = {value}
    frontier = [value]
    while frontier:
        v = frontier.pop()
        for user in analysis.live_users(v):
            if _passes(user, v, analysis) and user.results[0] not in seen:
                seen.add(user.results[0])
                frontier.append(user.results[0])
    return frozenset(seen)


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


def _passes(op: ir.Operation, v: ir.Value, analysis: Analysis) -> bool:
    """Whether the walk from a normalized value goes on through `op` (reading `v`): a layout
    op, or a step with a law in `laws.NORM_PATH_LAWS` (whether it keeps the feature axis
    whole is checked by `trace` once the layer says which axis that is)."""
    if len(op.results) != 1 or not _float(op.results[0]):
        return False
    if op.name in ("stablehlo.multiply", "stablehlo.divide"):
        index = 0 if op.operands[0] == v else 1
        if (op.name == "stablehlo.divide" and index != 0) or op.operands[1 - index] == v:
            return False
        return _scalar(op.operands[1 - index], analysis) is not None
    if op.name not in _LAYOUT and op.name not in laws.NORM_PATH_LAWS:
        return False
    if op.name == "stablehlo.concatenate":  # every operand must be reached (`consumers`)
        return True
    if op.operands[0] != v or any(o == v for o in list(op.operands)[1:]):
        return False
    if op.name == "stablehlo.broadcast_in_dim":  # only one that adds unit axes
        return _size(op.operands[0]) == _size(op.results[0])
    return op.name != "stablehlo.reduce" or len(op.operands) == 2


def _size(v: ir.Value) -> int:
    return int(np.prod(ir.RankedTensorType(v.type).shape))


def _scalar(v: ir.Value, analysis: Analysis) -> float | None:
    """The value of a constant that is one finite non-zero number everywhere, or None."""
    const = analysis.constant(v)
    if const is None:
        return None
    array = np.asarray(const.array, dtype=np.float64)
    if array.size == 0 or not np.all(array == array.flat[0]):
        return None
    c = float(array.flat[0])
    return c if np.isfinite(c) and c != 0 else None


def trace(path: tuple[ir.Operation, ...], axis: int | None, layer: ir.Operation,
          analysis: Analysis) -> tuple[int, float, ir.Operation | None] | Refusal:
    """The producer-input `axis` mapped back through `path` to the value it starts at, the
    factor the path gives a shift, and a pad on it that adds positions; a refusal where a
    step cuts, merges or reduces the feature axis (by `laws.NORM_PATH_LAWS`)."""
    def cut(op: ir.Operation, what: str) -> Refusal:
        return Refusal(Code.AXIS, f"forward-norm: the {_short(op)} at {_where(op)} before the "
                                  f"{_short(layer)} at {_where(layer)} {what}")
    if axis is None:
        return cut(layer, "contracts several axes")
    factor = 1.0
    padded: ir.Operation | None = None
    for op in reversed(path):
        before = list(ir.RankedTensorType(op.operands[0].type).shape)
        if op.name == "stablehlo.transpose":
            from bnfold.attributes import permutation
            axis = permutation(op)[axis]
        elif op.name == "stablehlo.reshape":
            after = tuple(ir.RankedTensorType(op.results[0].type).shape)
            mapped = map_axis_through_reshape(after, tuple(before), axis)
            if mapped is None:
                return cut(op, "merges or splits the feature axis")
            axis = mapped
        elif op.name == "stablehlo.slice":
            rank = len(before)
            starts = attributes.ints(op, "start_indices", default=0, rank=rank)
            limits = attributes.ints(op, "limit_indices", default=0, rank=rank)
            strides = attributes.ints(op, "strides", default=1, rank=rank)
            if (starts[axis], limits[axis], strides[axis]) != (0, before[axis], 1):
                return cut(op, "slices the feature axis")
        elif op.name == "stablehlo.concatenate":
            if attributes.integer(op, "dimension") == axis:
                return cut(op, "concatenates along the feature axis")
        elif op.name == "stablehlo.broadcast_in_dim":
            dims = attributes.broadcast_dimensions(op)
            if axis not in dims:
                return cut(op, "makes the feature axis")
            axis = dims.index(axis)
        elif op.name == "stablehlo.reduce":
            problem = _sum_over_others(op, axis, analysis)
            if isinstance(problem, Refusal):
                return cut(op, problem.message)
            axis, count = problem
            factor *= count
        elif op.name == "stablehlo.pad":
            widths = [attributes.ints(op, name, default=0, rank=len(before))
                      for name in ("edge_padding_low", "edge_padding_high", "interior_padding")]
            if any(w[axis] != 0 for w in widths):
                return cut(op, "pads the feature axis")
            if any(x > 0 for w in widths for x in w):  # (negative widths only crop: a slice)
                const = analysis.constant(op.operands[1])
                if const is None or np.any(np.asarray(const.array, dtype=np.float64) != 0):
                    return cut(op, "pads with a value other than a constant zero")
                padded = op
        elif op.name in ("stablehlo.multiply", "stablehlo.divide"):
            c = _scalar(op.operands[1 - _value_index(op, analysis)], analysis)
            assert c is not None
            factor = factor * c if op.name == "stablehlo.multiply" else factor / c
    return axis, factor, padded


def _value_index(op: ir.Operation, analysis: Analysis) -> int:
    """The operand of a scalar multiply/divide that is the value (not the constant)."""
    return 0 if _scalar(op.operands[1], analysis) is not None else 1


def _sum_over_others(op: ir.Operation, axis: int, analysis: Analysis
                     ) -> tuple[int, int] | Refusal:
    """(the operand axis of result axis `axis`, the count summed) for a sum with zero init
    over axes other than it."""
    body = list(op.regions[0].blocks[0].operations)
    init = analysis.constant(op.operands[1])
    if not body or body[0].name != "stablehlo.add" or init is None or \
            np.any(np.asarray(init.array, dtype=np.float64) != 0):
        return Refusal(Code.AXIS, "is not a sum with a zero init (a max or min does not "
                                  "commute with a shift or a negative scale)")
    shape = list(ir.RankedTensorType(op.operands[0].type).shape)
    dims = attributes.ints(op, "dimensions", default=0, rank=0)
    kept = [d for d in range(len(shape)) if d not in dims]
    return kept[axis], int(np.prod([shape[d] for d in dims]))


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


class Match(NamedTuple):
    """A value read by linear layers, whose form has a constant affine."""

    value: ir.Value
    axis: int
    form: Form
    layers: tuple[Consumer, ...]
    reached: frozenset[ir.Value] = frozenset()  # every value on a path to the layers


class Folded(NamedTuple):
    """One consumer's new kernel and bias."""

    consumer: Consumer
    kernel: KernelRewrite
    bias: np.ndarray | None
    out_axis: int


class Plan(NamedTuple):
    match: Match
    folds: tuple[Folded, ...]
    norm: ir.Operation  # the op the decision is recorded under (`norm_op`)
    copy: Copy | None = None  # kernels another op also reads (a tied LM head): copied


def find(root: ir.Operation, analysis: Analysis) -> Match | Refusal | None:
    """The value `root` computes, if linear layers read it and it has a constant affine
    (a refusal when it is a norm with a use that is not linear)."""
    value = root.results[0]
    if not _float(value):
        return None
    found, problem = consumers(value, analysis)
    if not found:
        # no linear layer reads it: a norm is refused, naming the use that stops it; any
        # other chain's own decision stands
        if problem is None:
            return None
        form = factor(value, ir.RankedTensorType(value.type).rank - 1, analysis)
        if form.factored.is_bare or not form.consumed or not _is_norm(value, analysis):
            return None
        return problem
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
    assert axis is not None
    return Match(value, axis, form, tuple(found), _reached(value, analysis))


def refused_form(root: ir.Operation, analysis: Analysis) -> Form:
    """The form `find` refused (to record the refusal under the norm's op)."""
    value = root.results[0]
    found, _ = consumers(value, analysis)
    axis = feature_axis(value, found)
    return factor(value, axis if axis is not None else ir.RankedTensorType(value.type).rank - 1,
                  analysis)


def _normalizes(value: ir.Value, depth: int = _STATISTICS_DEPTH,
                statistics: tuple[str, ...] = _STATISTICS,
                analysis: Analysis | None = None) -> bool:
    """Whether the statistics of a normalization (rsqrt, sqrt, a reduce) are close behind
    the value, without crossing a linear layer: a norm, not a layer's bias or a plain
    affine (which this pattern leaves alone)."""
    seen: set[ir.Value] = set()
    frontier = [value]
    for _ in range(depth):
        following: list[ir.Value] = []
        for v in frontier:
            owner = defining_op(v)
            if v in seen or owner is None or producers.is_producer(owner) or \
                    owner.name == "stablehlo.constant":
                continue
            seen.add(v)
            if owner.name in statistics:
                if analysis is None or any(analysis.constant(o) is None for o in owner.operands):
                    return True
                continue  # rsqrt(var + eps) of constants: a batch norm's scale, not a norm's
            if owner.name.startswith("stablehlo."):
                following.extend(owner.operands)
        frontier = following
    return False


def _is_norm(value: ir.Value, analysis: Analysis) -> bool:
    """Whether `value` is a norm's result, close behind its rsqrt (or sqrt) of run-time
    statistics: a norm no linear layer reads, which still gets a decision. Not a reduce:
    the variance's own `/ n` and `+ eps` are affine steps right after one. Not an rsqrt
    of constants: an inference batch norm's chain is backward-affine's to decide."""
    return _normalizes(value, _NORM_DEPTH, ("stablehlo.rsqrt", "stablehlo.sqrt"), analysis)


def plan(m: Match, analysis: Analysis) -> Plan | Refusal:
    """Each layer's kernel times g (float64, rounded once) and its bias b @ K."""
    g, b = m.form.factored.g, m.form.factored.b
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(b))):
        return Refusal(Code.PRECISION, "forward-norm: the folded scale or shift is not finite")
    for c in m.layers:
        if c.padded is not None and np.any(b != 0):
            return Refusal(Code.PADDING, f"forward-norm: the pad at {_where(c.padded)} before "
                                         f"the {_short(c.producer)} at {_where(c.producer)} "
                                         f"adds positions that read 0 where the folded value "
                                         f"would read the shift (beta); a non-zero pad does not "
                                         f"commute with it")
    if np.any(b != 0) and (cancels := precision.shift_cancels(b / np.where(g == 0, 1, g))):
        return cancels.wrap("forward-norm")
    folds: list[Folded] = []
    for c in m.layers:
        if (problem := _crosses_narrowing(c, b)) is not None:
            return problem
        shift = b * c.shift_factor
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
        if np.any(shift != 0):
            through = shift_through(op, mapping, kernel, shift)
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
    return Plan(m, tuple(folds), norm_op(m.form, analysis))


class Applied(NamedTuple):
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
    on_path = m.reached
    copies: dict[ir.Value, ir.Value] = {m.value: value}

    def copy(v: ir.Value) -> ir.Value:
        """A path value rebuilt on the bare value (every operand on a path replaced)."""
        if v in copies:
            return copies[v]
        op = defining_op(v)
        assert op is not None
        replaced = {i: copy(o) for i, o in enumerate(op.operands)
                    if o in on_path or o == m.value}
        copies[v] = rewriter.clone(op, replaced).results[0]
        return copies[v]

    built: list[ir.Operation] = []
    kernels: list[tuple[KernelRewrite, ir.Value]] = []  # each new kernel, once
    for f in p.folds:
        c = f.consumer
        current = copy(c.path[-1].results[0]) if c.path else value
        op = c.producer
        with ir.InsertionPoint(op):
            # two layers that read one weight (a layer applied twice) share its new kernel
            kernel_value = next((v for k, v in kernels if _same_kernel(k, f.kernel) and
                                 _dominates(v, op)), None) or f.kernel.build(op.location)
            kernels.append((f.kernel, kernel_value))
            folded = rewriter.clone(op, {f.kernel.operand: kernel_value, c.act_index: current})
        if f.bias is None:
            rewriter.replace_op(op, [folded.results[0]], successor=folded)
        else:
            with ir.InsertionPoint.after(op):
                replacement = bias_add(folded.results[0], f.bias, f.out_axis, op.location)
            rewriter.replace_op(op, [replacement], successor=folded)
        built.append(folded)
    return Applied(p.norm, tuple(built))


def _same_kernel(a: KernelRewrite, b: KernelRewrite) -> bool:
    """Whether two new kernels replace one constant with the same rounded values."""
    return a.kernel.value == b.kernel.value and a.kernel.convert == b.kernel.convert and \
        a.rounded.splat == b.rounded.splat and np.array_equal(a.rounded.values, b.rounded.values)


def _dominates(value: ir.Value, op: ir.Operation) -> bool:
    """Whether `value` (a new kernel: a constant, maybe converted) is defined before `op`,
    moving its ops right before `op` when both are in `op`'s block and `op` comes first;
    False (build another) anywhere else."""
    owner = defining_op(value)
    if owner is None or owner.block != op.block:
        return False
    chain = [owner]
    if owner.name == "stablehlo.convert":
        source = defining_op(owner.operands[0])
        if source is None or source.block != op.block:
            return False
        chain.insert(0, source)
    for current in op.block.operations:
        if current == owner:
            return True
        if current == op:
            for built in chain:  # constants only: nothing they read is left behind
                built.move_before(op)
            return True
    return False


def norm_op(form: Form, analysis: Analysis | None = None) -> ir.Operation:
    """The op a norm's decision is recorded under: its scaling op with a constant nearest
    to the normalized value (the weight's multiply; not a scale further up the network
    that the walk also factored). With `analysis`, a scale by one number everywhere after
    the weight (torchax's `alpha` of the residual add, `x * 1.0`) is passed over: it
    belongs to the op after the norm."""
    scales = [op for op in reversed(form.consumed)
              if op.name in ("stablehlo.multiply", "stablehlo.divide", "stablehlo.negate")]
    if analysis is not None:
        for op in scales:
            if any(_varies(operand, analysis) for operand in op.operands):
                return op
    return scales[0] if scales else form.consumed[-1]


def _varies(value: ir.Value, analysis: Analysis) -> bool:
    const = analysis.constant(value)
    if const is None:
        return False
    array = np.asarray(const.array)
    return array.size > 1 and not np.all(array == array.flat[0])


class ForwardNorm(Pattern[ir.Operation, Match, Plan]):
    """Folds a normalization's affine into every linear layer that reads it."""

    # The new kernels and biases, and the negate of a bare value whose law negates it.
    builds = BUILDS | {"stablehlo.negate"}


    def roots(self, ctx: Context) -> Iterable[ir.Operation]:
        seen: set[int] = set()
        for producer in chains.candidates(ctx).producers:
            producer = ctx.rewriter.current(producer)
            live: bool | None = None  # asked at its first owner: mostly none, and it costs more
            for operand in producer.operands:
                for owner in _behind(operand, producer.block, ctx.analysis):
                    if live is None:
                        live = not ctx.analysis.is_dead(producer)
                    if not live:
                        break
                    key = ctx.rewriter.handle(owner)
                    if key not in seen:
                        seen.add(key)
                        yield owner
        # every norm gets a decision: one whose value reaches no linear layer (a residual
        # add, func.return, RoPE) is refused in `match`, naming that use
        for chain in chains.candidates(ctx).chains:
            tail = _norm_end(chain, ctx)
            if tail is None:
                continue
            key = ctx.rewriter.handle(tail)
            if key not in seen:
                seen.add(key)
                yield tail

    def match(self, ctx: Context, root: ir.Operation) -> Match | Refusal | None:
        if ctx.analysis.is_dead(root) or ctx.rewriter.is_replaced(root) or \
                ctx.ledger.is_folded(root):
            return None  # forward-affine's work (a chain it folded): its decisions stand
        found = find(root, ctx.analysis)
        if isinstance(found, Match) and _forward_affines(found, ctx):
            return None
        return found

    def plan(self, ctx: Context, match: Match) -> Plan | Refusal | None:
        found = plan(match, ctx.analysis)
        if isinstance(found, Refusal):
            return found
        # a layer whose kernel another op also reads (an LM head tied to the embedding
        # table that a gather reads) gets a new constant beside the old: say what it costs
        layers = [c.producer for c in match.layers]
        distinct = [f.kernel for i, f in enumerate(found.folds)  # a shared one is built once
                    if not any(_same_kernel(e.kernel, f.kernel) for e in found.folds[:i])]
        copies = [c for k in distinct if (c := copy_cost(k, layers, ctx.analysis)) is not None]
        if not copies:
            return found
        return found._replace(copy=Copy(sum(c.bytes for c in copies), tuple(dict.fromkeys(
            r for c in copies for r in c.readers))))

    def refuse(self, ctx: Context, subject: ir.Operation | Match, refusal: Refusal) -> None:
        if isinstance(subject, Match):
            form = subject.form
        else:  # refused in match: a use that is not linear
            form = refused_form(subject, ctx.analysis)
        if form.consumed and not any(ctx.ledger.is_folded(op) for op in form.consumed):
            ctx.ledger.refuse(norm_op(form, ctx.analysis), refusal, form.consumed)

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
                if owner is not None and owner.name in _ELEMENTWISE and \
                        _normalizes(value, analysis=analysis) and consumers(result, analysis)[0]:
                    return True
        if ctx.body_ops(callee) <= _MOVES:  # F.pad, torch.roll: steps of a norm's path
            return any(_normalized_behind(operand, ctx) for operand in call.operands)
        if not (ctx.body_ops(callee) & {*producers.NAMES, "func.call"}):
            return False
        for operand in call.operands:
            owner = defining_op(operand)
            if owner is not None and owner.name in _ELEMENTWISE and \
                    _normalizes(operand, analysis=analysis):
                return True
        return False

    def may_inline(self, ctx: Context, callee: ir.Operation) -> bool:
        """A helper that only moves values, has a layer or a call inside, or returns a
        normalized value (`wants_inline`'s three cases, without the call site)."""
        body = ctx.body_ops(callee)
        if body <= _MOVES or body & {*producers.NAMES, "func.call"}:
            return True
        block = single_block(callee)
        if block is None:
            return True  # not a body to judge here: wants_inline decides
        if not body & set(_ELEMENTWISE):
            return False
        for value in list(block.operations)[-1].operands:
            owner = defining_op(value)
            if owner is not None and owner.name in _ELEMENTWISE and \
                    _normalizes(value, analysis=ctx.analysis):
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
        record_copy(fold, plan.copy)
        for other in applied.producers[1:]:
            ledger.fold_carried_by(fold, other)
        for producer in applied.producers:
            ctx.analysis.hand_on(FORWARD_FOLDS, fold, [producer])


def _norm_end(chain: chains.Chain, ctx: Context) -> ir.Operation | None:
    """The last op of a norm's affine chain whose value still has the affine (not a
    narrowing convert after it: that rounds where it stands), or None (not a norm)."""
    for step in reversed(chain.steps):
        op = step.op
        if ctx.rewriter.is_replaced(op) or ctx.analysis.is_dead(op) or \
                len(op.results) != 1 or not _float(op.results[0]):
            return None
        value = op.results[0]
        if not _is_norm(value, ctx.analysis):
            return None
        if not factor(value, ir.RankedTensorType(value.type).rank - 1,
                      ctx.analysis).factored.is_bare:
            return op
    return None


def _behind(value: ir.Value, block: ir.Block, analysis: Analysis) -> list[ir.Operation]:
    """The elementwise ops a linear layer's operand `value` comes from, walking back
    through the steps `consumers` walks forward through (a scalar divide's own op too)."""
    found: list[ir.Operation] = []
    owner = defining_op(value)
    while owner is not None and owner.block == block and len(owner.results) == 1 and \
            len(owner.operands) > 0:
        if owner.name in _ELEMENTWISE:
            found.append(owner)
        nxt = owner.operands[_value_index(owner, analysis)] \
            if owner.name in ("stablehlo.multiply", "stablehlo.divide") else owner.operands[0]
        if not _passes(owner, nxt, analysis):
            break
        owner = defining_op(nxt)
    return found


def _normalized_behind(value: ir.Value, ctx: Context) -> bool:
    """Whether `value` is a normalized value, possibly through path steps and calls of
    helpers that only move values (Swin's `@_pad` then `@_roll_static`)."""
    for _ in range(_MAX_PATH):
        owner = defining_op(value)
        if owner is None:
            return False
        if owner.name in _ELEMENTWISE:  # a norm's (run-time statistics), not a batch norm's
            return _normalizes(value, analysis=ctx.analysis)
        if owner.name == "func.call":
            called = callee(owner)
            if called is None or not ctx.body_ops(called) <= _MOVES or not owner.operands:
                return False
        elif owner.name not in _LAYOUT and owner.name not in laws.NORM_PATH_LAWS:
            return False
        if not owner.operands:
            return False
        value = owner.operands[0]
    return False


def _forward_affines(m: Match, ctx: Context) -> bool:
    """One layer reading a plain chain through layout ops only: forward-affine's business
    (it ran first; a slice, a sum or a pad on the way is this pattern's)."""
    if len(m.layers) != 1 or any(op.name not in _LAYOUT for op in m.layers[0].path):
        return False
    return all(ctx.analysis.step(op) is not None for op in m.form.consumed) and \
        m.form.bare.op is None and not m.form.bare.negate


PATTERN = ForwardNorm()
