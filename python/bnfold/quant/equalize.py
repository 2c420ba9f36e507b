"""equalize: cross-layer equalization (CLE) of consecutive producers.

After folding, the per-output-channel weight ranges of a layer can differ by
orders of magnitude (a depthwise convolution's folded batch-norm scales), and
per-tensor int8 weights then wipe out the small channels. Equalization
(Nagel et al., "Data-Free Quantization", ICCV 2019) moves scale from layer 1's
output channels into layer 2's matching input channels without changing the
function. Before:

    %y = stablehlo.convolution(%x, %k1) ...          // ranges r1 per output channel
    %b = stablehlo.add %y, %bias_b
    %r = stablehlo.clamp %zero, %b, %six             // ReLU6
    %z = stablehlo.convolution(%r, %k2) ...          // ranges r2 per input channel

After, with s = sqrt(r1 / r2) per channel (both ranges become sqrt(r1 * r2)):

    %y = stablehlo.convolution(%x, %k1_over_s) ...
    %b = stablehlo.add %y, %bias_over_s_b
    %r = stablehlo.clamp %zero, %b, %six_over_s_b    // per-channel clamp to [0, 6/s]
    %z = stablehlo.convolution(%r, %k2_times_s) ...

Every op between the layers must have a law (`bnfold.laws`) that commutes
with a positive per-channel scale; the constants that meet a scaled value are
divided by s in that value's type. A producer that is layer 2 of one pair and
layer 1 of the next (conv -> depthwise -> conv, the DFQ triplet) links the
pairs into one *set*, whose scales are iterated to convergence on max-abs
tables; each kernel is then scaled once in float64 and rounded once (the
precision contract of folding).

Dividing a channel by s < 1 grows every activation of the region by 1/s:
each value's interval (from layer 1's folded batch-norm statistics, within
`precision.RANGE_SIGMAS`, and from the laws: clamps bound, sum pools multiply) must stay
within its type once divided by s, or the set is refused (`Code.RANGE`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bnfold import elements, precision, producers
from bnfold.analysis import Analysis
from bnfold.attributes import batch_groups
from bnfold.graph import function_name
from bnfold.ir import ir, op_id
from bnfold.laws import Edit, Interval
from bnfold.ledger import Statistics
from bnfold.patterns.base import Pattern
from bnfold.patterns.rewrite import KernelRewrite, broadcast_constant, plan_kernel
from bnfold.producers import InputScaleMap, Kernel
from bnfold.quant import region
from bnfold.quant.region import Region
from bnfold.refusal import Code, Refusal
from bnfold.report import Part, Section, Skip, count
from bnfold.rewriter import Rewriter

if TYPE_CHECKING:
    from bnfold.driver import Context

# Each equalized set and its layers, for high-bias absorption (Analysis.hand_on).
EQUALIZED_SETS = "equalize:sets"
MAX_ITERATIONS = 200
CONVERGED = 1e-9  # max |log s| of a sweep over a set that counts as converged
ALREADY_EQUAL = 1e-3  # a set whose scales are all within 0.1% of 1 is left alone


@dataclass(frozen=True)
class Layer:
    """A producer with a constant kernel."""

    op: ir.Operation
    kernel: Kernel
    operand: int


@dataclass(frozen=True)
class Pair:
    """Two layers and the region between them that a positive scale commutes with."""

    first: Layer
    out_axis: int  # layer 1's kernel axis of output channels
    region: Region
    second: Layer
    mapping: InputScaleMap  # how layer 2's kernel reads its input channels


@dataclass(frozen=True)
class Link:
    """A pair as planned: its scales and the new constants of the region between."""

    pair: Pair
    scale: np.ndarray  # layer 1's output channel c is divided by scale[c]
    constants: tuple[tuple[Edit, np.ndarray], ...]  # each changed constant, divided by s


@dataclass(frozen=True)
class SetPlan:
    """A set of linked pairs as planned: new kernels, region constants, ranges."""

    layers: tuple[Layer, ...]
    links: tuple[Link, ...]
    kernels: tuple[KernelRewrite, ...]  # one per layer
    iterations: int
    before: tuple[np.ndarray, ...]  # per layer, per output channel max |w|, before
    after: tuple[np.ndarray, ...]  # and after


# --- match: pairs and the sets they link into -----------------------------------------------


def find_pairs(ctx: Context, ops: list[ir.Operation]) -> tuple[list[Pair], dict[int, Refusal]]:
    """Every pair of consecutive layers with layer 1 among `ops`, and why each other layer 1
    that has a next producer pairs with none (by `op_id`)."""
    layers: dict[int, Layer | Refusal] = {}  # each kernel read once per run
    pairs: list[Pair] = []
    refused: dict[int, Refusal] = {}
    for op in ops:
        found = pair(op, ctx, layers)
        if isinstance(found, Pair):
            pairs.append(found)
        elif isinstance(found, Refusal):
            refused[op_id(op)] = found
    return pairs, refused


def _producers(ctx: Context) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        op = op.operation
        if producers.is_producer(op) and not ctx.analysis.is_dead(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    for func in ctx.functions():
        func.walk(visit)
    return found


def pair(op: ir.Operation, ctx: Context, layers: dict[int, Layer | Refusal]
         ) -> Pair | Refusal | None:
    """`op` as layer 1 with the next producer, or why not (None: no next producer)."""
    analysis = ctx.analysis
    out = producers.output_axis(op, analysis.evaluator)
    if out is None:
        return None
    result_axis, kernel_axis = out
    channels = ir.RankedTensorType(op.results[0].type).shape[result_axis]
    found = region.walk(op.results[0], result_axis, analysis,
                        source_interval(ctx.ledger.statistics(op), channels))
    if not isinstance(found, Region):
        return found
    if isinstance(kernel_axis, Refusal):
        return kernel_axis.wrap("layer 1's kernel")
    second = found.consumer
    mapping = _input_map(second, found)
    if isinstance(mapping, Refusal):
        return mapping.wrap(f"layer 2 ({second.name})")
    first = _layer(op, kernel_axis.operand, analysis, layers)
    if isinstance(first, Refusal):
        return first.wrap("layer 1")
    last = _layer(second, mapping.operand, analysis, layers)
    if isinstance(last, Refusal):
        return last.wrap(f"layer 2 ({second.name})")
    return Pair(first, kernel_axis.axis, found, last, mapping)


def source_interval(statistics: Statistics | None, channels: int) -> Interval:
    """Layer 1's result values (the walk starts there, before the bias its fold added):
    mean +- precision.RANGE_SIGMAS spread, or unknown."""
    found = statistics.at_result() if statistics is not None else None
    if found is None:
        return region.unknown(channels)
    mean, spread = found
    return Interval(mean - precision.RANGE_SIGMAS * spread, mean + precision.RANGE_SIGMAS * spread)


def _input_map(op: ir.Operation, found: Region) -> InputScaleMap | Refusal:
    if op.name == "stablehlo.convolution" and batch_groups(op) != 1:
        return Refusal(Code.AXIS, "batch_group_count > 1 mixes input channels into the batch")
    return producers.input_scale_map(op, found.operand, found.axis)


def _layer(op: ir.Operation, operand: int, analysis: Analysis,
           layers: dict[int, Layer | Refusal]) -> Layer | Refusal:
    key = op_id(op)
    if key not in layers:
        compute = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
        assert compute is not None
        kernel = producers.kernel(op.operands[operand], compute, analysis.evaluator, op.name)
        layers[key] = kernel if isinstance(kernel, Refusal) else Layer(op, kernel, operand)
    layer = layers[key]
    if isinstance(layer, Layer) and layer.operand != operand:
        return Refusal(Code.AXIS, "the kernel is on a different operand in its two roles")
    return layer


def link_sets(pairs: list[Pair]) -> list[list[Pair]]:
    """Pairs linked through a shared layer, each set in order from its first layer."""
    by_first = {op_id(p.first.op): p for p in pairs}
    seconds = {op_id(p.second.op) for p in pairs}
    sets: list[list[Pair]] = []
    for p in pairs:
        if op_id(p.first.op) in seconds:
            continue  # not the head of its chain
        chain = [p]
        while op_id(chain[-1].second.op) in by_first:
            chain.append(by_first[op_id(chain[-1].second.op)])
        sets.append(chain)
    return sets


# --- plan (pure, float64) ------------------------------------------------------------------


@dataclass(frozen=True)
class _Roles:
    """How a layer's kernel reads input channels (the pair before) and writes output
    channels (the pair after)."""

    in_axis: int | None
    out_axis: int | None
    groups: int


def _roles(chain: list[Pair]) -> list[_Roles]:
    found = []
    for index in range(len(chain) + 1):
        before = chain[index - 1].mapping if index else None
        # A grouped layer 2 needs its output axis too: it says which group reads which channel.
        out_axis = chain[index].out_axis if index < len(chain) else \
            (before.out_axis if before else None)
        found.append(_Roles(before.in_axis if before else None, out_axis,
                            before.groups if before else 1))
    return found


def plan(chain: list[Pair]) -> SetPlan | Refusal:
    """Scales for every pair of `chain` (iterated to convergence), the new kernels and
    region constants, or why the set cannot be equalized."""
    layers = [chain[0].first] + [p.second for p in chain]
    roles = _roles(chain)
    tables = [_table(layer, role) for layer, role in zip(layers, roles, strict=True)]
    before = tuple(t.max(axis=0) for t in tables)
    scales = [np.ones(tables[i].shape[1]) for i in range(len(chain))]
    iterations = 0
    while iterations < MAX_ITERATIONS:
        iterations += 1
        if max(_sweep(i, tables, roles, scales) for i in range(len(chain))) < CONVERGED:
            break
    if all(np.max(np.abs(np.log(s))) < ALREADY_EQUAL for s in scales):
        return Refusal(Code.BALANCED, "already equalized (every scale within 0.1% of 1)")
    for p, s in zip(chain, scales, strict=True):
        problem = range_problem(p.region, s)
        if problem is not None:
            return problem
    kernels: list[KernelRewrite] = []
    for index, (layer, role) in enumerate(zip(layers, roles, strict=True)):
        factor = _factor(layer, role, scales[index - 1] if index else None,
                         scales[index] if index < len(chain) else None)
        planned = plan_kernel(layer.kernel, factor, layer.operand)
        if isinstance(planned, Refusal):
            return planned.wrap(f"{layer.op.name} kernel")
        kernels.append(planned)
    links = []
    for p, s in zip(chain, scales, strict=True):
        constants = _constants(p, s)
        if isinstance(constants, Refusal):
            return constants
        links.append(Link(p, s, constants))
    return SetPlan(tuple(layers), tuple(links), tuple(kernels), iterations, before,
                   tuple(t.max(axis=0) for t in tables))


def _table(layer: Layer, role: _Roles) -> np.ndarray:
    """max |K| over the kernel's other axes, as [input channels, output channels]."""
    values = np.broadcast_to(layer.kernel.values, layer.kernel.shape)
    axes = [a for a in (role.in_axis, role.out_axis) if a is not None]
    others = tuple(d for d in range(values.ndim) if d not in axes)
    table = np.max(np.abs(values), axis=others, keepdims=True).astype(np.float64)
    in_size = values.shape[role.in_axis] if role.in_axis is not None else 1
    out_size = values.shape[role.out_axis] if role.out_axis is not None else 1
    if role.in_axis is not None and role.out_axis is not None and role.in_axis > role.out_axis:
        table = np.swapaxes(table, role.in_axis, role.out_axis)
    return table.reshape(in_size, out_size)


def _sweep(index: int, tables: list[np.ndarray], roles: list[_Roles],
           scales: list[np.ndarray]) -> float:
    """One balancing step of pair `index` on the max-abs tables; returns max |log s|."""
    r1 = tables[index].max(axis=0)
    r2 = _input_ranges(tables[index + 1], roles[index + 1].groups)
    s = np.ones_like(r1)
    ok = (r1 > 0) & (r2 > 0)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    tables[index] /= s[None, :]
    tables[index + 1] *= _in_table_factor(tables[index + 1], roles[index + 1].groups, s)
    scales[index] *= s
    return float(np.max(np.abs(np.log(s)))) if s.size else 0.0


def _input_ranges(table: np.ndarray, groups: int) -> np.ndarray:
    """Per activation channel: max |K| over the kernel entries that read it."""
    if groups == 1:
        return table.max(axis=1)
    in_size, out_size = table.shape
    per_group = table.reshape(in_size, groups, out_size // groups).max(axis=2)
    return per_group.T.reshape(-1)  # channel g * in_size + k


def _in_table_factor(table: np.ndarray, groups: int, s: np.ndarray) -> np.ndarray:
    return InputScaleMap(0, 0, 1, groups).expand(s, table.shape)


def _factor(layer: Layer, role: _Roles, before: np.ndarray | None,
            after: np.ndarray | None) -> np.ndarray:
    """What `layer`'s kernel is multiplied by: s of the pair before along its input
    channels, 1/s of the pair after along its output channels."""
    shape = layer.kernel.shape
    factor = np.ones([1] * len(shape))
    if before is not None:
        assert role.in_axis is not None
        mapping = InputScaleMap(layer.operand, role.in_axis, role.out_axis, role.groups)
        factor = factor * mapping.expand(before, shape)
    if after is not None:
        assert role.out_axis is not None
        factor = factor * producers.axis_factor(1.0 / after, role.out_axis, len(shape))
    return factor


def range_problem(found: Region, scale: np.ndarray) -> Refusal | None:
    """Why dividing the region's values by `scale` could overflow their type: a channel
    that grows (s < 1) must have a known bound (statistics, a clamp) that stays within
    the type, or, in the wide-exponent types, the documented `precision.ASSUMED_BOUND`."""
    grows = scale < 1
    for reached in found.reached:
        dtype = elements.numpy_dtype(ir.RankedTensorType(reached.value.type).element_type)
        if dtype is None or not np.any(grows):
            continue
        name = precision.type_name(dtype)
        magnitude = reached.interval.magnitude()
        unknown = grows & ~np.isfinite(magnitude)
        if np.any(unknown):
            assumed = precision.ASSUMED_BOUND.get(name)
            if assumed is None:
                return Refusal(Code.RANGE, f"range: dividing channels by scales down to "
                                           f"{scale.min():.3g} grows {name} activations that "
                                           f"nothing bounds (no batch-norm statistics, no clamp) "
                                           f"up to {1 / scale.min():.3g}x; {name} overflows at "
                                           f"{precision.largest(dtype):g}")
            magnitude = np.where(unknown, assumed, magnitude)
        grown = np.where(grows, magnitude / scale, 0.0)
        worst = int(np.argmax(grown))
        if grown[worst] > precision.largest(dtype):
            return Refusal(Code.RANGE, f"range: channel {worst} of a {name} value reaches "
                                       f"{magnitude[worst]:.3g}; divided by its scale "
                                       f"{scale[worst]:.3g} it would be {grown[worst]:.3g}, "
                                       f"beyond {name}'s {precision.largest(dtype):g}")
    return None


def _constants(p: Pair, scale: np.ndarray) -> tuple[tuple[Edit, np.ndarray], ...] | Refusal:
    """The region's constants divided by s, in the type of the value each one meets;
    constants that do not change (ReLU's zero) are left out."""
    planned = []
    for edit in p.region.edits:
        dtype = elements.numpy_dtype(ir.RankedTensorType(edit.meets.type).element_type)
        assert dtype is not None
        scaled = edit.vector / scale
        problem = precision.check_bias(scaled[np.isfinite(edit.vector)], dtype,
                                       f"a constant of {edit.op.name} divided by the scales")
        if problem is not None:
            return problem
        if np.array_equal(scaled.astype(dtype), edit.vector.astype(dtype), equal_nan=True):
            continue  # 0 / s == 0: the constant stays as it is
        planned.append((edit, scaled))
    return tuple(planned)


# --- apply -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """The new layers (in the plan's order)."""

    layers: tuple[ir.Operation, ...]


def build(rewriter: Rewriter, p: SetPlan) -> Applied:
    """Replaces the set's layers with copies that have the new kernels, and each region op
    whose constants change with a copy that has the new constants."""
    new_layers = []
    for layer, kernel in zip(p.layers, p.kernels, strict=True):
        with ir.InsertionPoint(layer.op):
            copy = rewriter.clone(layer.op, {layer.operand: kernel.build(layer.op.location)})
        rewriter.replace_op(layer.op, [copy.results[0]], successor=copy)
        new_layers.append(copy)
    by_op: dict[int, tuple[ir.Operation, list[tuple[Edit, np.ndarray]]]] = {}
    for link in p.links:
        for edit, vector in link.constants:
            by_op.setdefault(op_id(edit.op), (edit.op, []))[1].append((edit, vector))
    for op, edits in by_op.values():
        replace_constants(rewriter, op, edits)
    return Applied(tuple(new_layers))


def replace_constants(rewriter: Rewriter, op: ir.Operation,
                      edits: list[tuple[Edit, np.ndarray]]) -> ir.Operation:
    """Replaces `op` with a copy whose edited operands are the new per-channel constants,
    each broadcast to the scaled value it meets and rounded once to its type."""
    with ir.InsertionPoint(op):
        operands = {edit.operand: broadcast_constant(vector, edit.meets, [edit.axis], op.location)
                    for edit, vector in edits}
        copy = rewriter.clone(op, operands)
    rewriter.replace_op(op, list(copy.results), successor=copy)
    return copy


# --- the pattern ---------------------------------------------------------------------------


def range_ratio(ranges: np.ndarray) -> float:
    """max / min of per-channel weight ranges (over the nonzero channels)."""
    nonzero = ranges[ranges > 0]
    return float(nonzero.max() / nonzero.min()) if nonzero.size else 1.0


def triplets(layers: tuple[Layer, ...], chain: list[Pair]) -> int:
    """conv -> depthwise -> conv runs: an inner layer whose groups read one channel each."""
    return sum(1 for i in range(1, len(layers) - 1)
               if chain[i - 1].mapping.groups > 1 and
               layers[i].kernel.shape[chain[i - 1].mapping.in_axis] == 1)


def kind(links: int) -> str:
    """`pair`, `triplet` (DFQ's conv -> depthwise -> conv shape: three layers) or `chain of N`."""
    return {2: "pair", 3: "triplet"}.get(links + 1, f"chain of {links + 1}")


class Survey:
    """Every pair of consecutive layers among `ops` and the sets they link, found once, on
    the first match of a run (from the IR as it was before anything was equalized)."""

    def __init__(self, ctx: Context, ops: list[ir.Operation]) -> None:
        self._ctx, self._ops = ctx, ops
        self._found: tuple[dict[int, list[Pair]], dict[int, Refusal]] | None = None

    def _survey(self) -> tuple[dict[int, list[Pair]], dict[int, Refusal]]:
        if self._found is None:
            pairs, refused = find_pairs(self._ctx, self._ops)
            self._found = ({op_id(s[0].first.op): s for s in link_sets(pairs)}, refused)
        return self._found

    def set_headed_by(self, op: ir.Operation) -> list[Pair] | None:
        return self._survey()[0].get(op_id(op))

    def refusal_of(self, op: ir.Operation) -> Refusal | None:
        return self._survey()[1].get(op_id(op))


@dataclass(frozen=True)
class Root:
    """A producer as layer 1, in one of two passes over the producers: the set it heads
    (`heads`), then why it pairs with no next layer (the sets' records come first)."""

    op: ir.Operation
    heads: bool
    survey: Survey


class Equalize(Pattern[Root, list[Pair], SetPlan]):
    """Equalizes every set of linked layer pairs."""


    def roots(self, ctx: Context) -> Iterable[Root]:
        ops = _producers(ctx)
        survey = Survey(ctx, ops)
        return [Root(op, heads, survey) for heads in (True, False) for op in ops]

    def match(self, ctx: Context, root: Root) -> list[Pair] | Refusal | None:
        if root.heads:
            return root.survey.set_headed_by(root.op)
        return root.survey.refusal_of(root.op)

    def plan(self, ctx: Context, match: list[Pair]) -> SetPlan | Refusal:
        return plan(match)

    def refuse(self, ctx: Context, subject: Root | list[Pair], refusal: Refusal) -> None:
        if isinstance(subject, Root):
            ctx.ledger.add_refusal(subject.op, refusal)
        else:
            layers = [subject[0].first.op, *(p.second.op for p in subject)]
            ctx.ledger.add_refusal(layers[0], refusal, layers)

    def apply(self, rewriter: Rewriter, plan: SetPlan) -> Applied:
        return build(rewriter, plan)

    def record(self, ctx: Context, plan: SetPlan, applied: Applied) -> None:
        ledger = ctx.ledger
        chain = [link.pair for link in plan.links]
        for index, layer in enumerate(applied.layers):
            stats = ledger.statistics(layer)
            if stats is not None and index < len(plan.links):  # its output is divided by s
                ledger.set_statistics(layer, stats.scaled(1.0 / plan.links[index].scale))
        record = Equalized(
            id=f"eq{len(ledger.records().records)}",
            layers=[ledger.location(layer.op) for layer in plan.layers],
            layer_ops=[layer.op.name for layer in plan.layers],
            between=[link.pair.region.describe() for link in plan.links],
            function=function_name(applied.layers[0]), kind=kind(len(plan.links)),
            iterations=plan.iterations, triplets=triplets(plan.layers, chain),
            range_ratio_before=[range_ratio(r) for r in plan.before],
            range_ratio_after=[range_ratio(r) for r in plan.after],
            params={f"scale{i}": link.scale.copy() for i, link in enumerate(plan.links)})
        ledger.add(record)
        ctx.analysis.hand_on(EQUALIZED_SETS, record, applied.layers)

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """A helper between two layers (`call @relu6`): fed by a producer through ops with
        laws, and read by one the same way."""
        analysis = ctx.analysis
        return any(region.fed_by_producer(v, analysis) for v in call.operands) and \
            any(region.leads_to_producer(r, analysis) for r in call.results)


# --- the report --------------------------------------------------------------------------


@dataclass
class Equalized:
    """One set of layers equalized together (a pair, a triplet, a longer chain)."""

    id: str
    layers: list[str]  # producer locations, in data-flow order
    layer_ops: list[str]
    between: list[str]  # per link: the ops between the two layers ("add, clamp")
    function: str
    kind: str  # "pair", "triplet" or "chain of N"
    iterations: int
    triplets: int  # conv -> depthwise conv -> conv runs in the set (DFQ's triplets)
    # per layer: max/min over output channels of the channel's max |weight|
    range_ratio_before: list[float]
    range_ratio_after: list[float]
    # "scale0", "scale1", ...: per link, layer 1's output channel c divided by scale[c]
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    high_bias: list[dict[str, Any]] = field(default_factory=list)  # per link, --absorb-high-bias

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind, "layers": self.layers, "layer_ops": self.layer_ops,
            "between": self.between, "function": self.function, "iterations": self.iterations,
            "triplets": self.triplets,
            "range_ratio_before": self.range_ratio_before,
            "range_ratio_after": self.range_ratio_after,
            "scale_range": [[float(v.min()), float(v.max())] for v in self.params.values()],
        } | ({"high_bias": self.high_bias} if self.high_bias else {})


def _pairs(skip: Skip) -> int:
    """How many layer pairs a refusal leaves unequalized (a refused set: all of its pairs)."""
    return max(1, len(skip.layers) - 1)


class EqualizedSets(Section):
    """`equalized` (each set of layers equalized together) and `not_equalized` (each pair
    or set that was not, with the reason: op = layer 1, layers = the refused set's
    layers), when --equalize ran."""

    order = 30
    statistics = True
    prefix = "eq"
    keys = ("equalized", "not_equalized", "equalize")
    header = ("set", "kind", "layers", "range ratio before -> after")
    refused_column = "layers"

    def row(self, record: Equalized) -> tuple[str, ...]:
        return (record.id, record.kind, " -> ".join(record.layers),
                ", ".join(f"{b:.3g}->{a:.3g}" for b, a in
                          zip(record.range_ratio_before, record.range_ratio_after, strict=True)))

    def summary(self, part: Part) -> str:
        equalized: list[Equalized] = part.records
        text = f", equalized {len(equalized)} set(s)"
        if equalized:
            text += f" ({count(e.kind for e in equalized)})"
        return text + f", {sum(map(_pairs, part.refused))} pair(s) not equalized"


RECORDS = EqualizedSets()
PATTERN = Equalize()
