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

Unlike the usual recipe (and AIMET, which stops at ReLU6), a clamp is kept
exact by scaling its bounds per channel; `bnfold.scaling` lists every op that
may sit between the layers. A producer that is layer 2 of one pair and layer 1
of the next (conv -> depthwise -> conv, the DFQ triplet) links the pairs into
one *set*, whose scales are iterated to convergence on max-abs tables; each
kernel is then scaled once in float64 and rounded once (the precision
contract of folding). Refused, with a reason: fan-out (a residual branch also
reads layer 1's output), an op that is not positively homogeneous (sigmoid,
swish, gelu, tanh), a non-constant kernel, a region across blocks. Private
helpers between the layers (`call @relu6`) are inlined per call site.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from bnfold import border, elements, producers, scaling
from bnfold.constants import Evaluator
from bnfold.graph import callee_name, function_name, symbol_name, users
from bnfold.ir import ir, op_id
from bnfold.patterns import rewrite
from bnfold.patterns.inline_calls import drop_uncalled, inline
from bnfold.producers import InputScaleMap, Kernel

NAME = "equalize"
DESCRIPTION = ("cross-layer equalization of convolution/dot_general pairs and triplets "
               "(opt-in: --equalize)")

MAX_ITERATIONS = 200
CONVERGED = 1e-9  # max |log s| of a sweep over a set that counts as converged
ALREADY_EQUAL = 1e-3  # a set whose scales are all within 0.1% of 1 is left alone
_MAX_INLINE_ROUNDS = 8


@dataclass
class Layer:
    """A producer with a constant kernel, as equalization sees it.

    `table` is max |K| over the kernel's other axes, as [input channels of
    the kernel, output channels] (either may be 1 when the producer has only
    one role), updated as scales are chosen; the kernel itself is scaled once.
    """

    op: ir.Operation
    kernel: Kernel
    operand: int
    in_axis: int | None
    out_axis: int | None
    groups: int
    table: np.ndarray
    before: np.ndarray  # per output channel ranges of the original kernel


@dataclass
class Pair:
    """Two layers and the region between them that a positive scale commutes with."""

    first: Layer
    region: scaling.Region
    second: Layer
    scale: np.ndarray  # accumulated: layer 1's output channel c is divided by scale[c]


@dataclass
class Link:
    """A pair as planned: its scales and the new constants of the region between."""

    pair: Pair
    constants: list[tuple[scaling.Edit, np.ndarray]]


@dataclass
class SetPlan:
    """A set of linked pairs as planned: new kernels, region constants, ranges."""

    layers: list[Layer]
    links: list[Link]
    kernels: dict[int, rewrite.KernelRewrite]
    iterations: int
    after: list[np.ndarray] = field(default_factory=list)  # per-layer output ranges
    # set by high-bias absorption: other constants to replace (a last layer's bias add),
    # and new bias adds (producer, per-channel vector, result axis)
    extra: list[tuple[scaling.Edit, np.ndarray]] = field(default_factory=list)
    new_biases: list[tuple[ir.Operation, np.ndarray, int]] = field(default_factory=list)
    # and exact shifts of zero-padded layers (varying near the borders)
    corrections: list[tuple[ir.Operation, border.Correction]] = field(default_factory=list)
    high_bias: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Refused:
    """A layer 1 that cannot be equalized, and why."""

    op: ir.Operation  # layer 1
    reason: str


# --- match -------------------------------------------------------------------


def find(funcs: list[ir.Operation], evaluator: Evaluator,
         on_inline: Callable[[ir.Operation], None]) -> tuple[list[list[Pair]], list[Refused]]:
    """Every equalizable set of pairs in `funcs` (chains of linked pairs), and refusals.

    Private calls between two layers are inlined on the way (`on_inline`
    gets each call before it is inlined).
    """
    layers: dict[int, Layer | str] = {}
    pairs: list[Pair] = []
    refused: list[Refused] = []
    for op in _producers(funcs):
        found = _pair(op, evaluator, layers, on_inline)
        if isinstance(found, Pair):
            pairs.append(found)
        elif isinstance(found, str):
            refused.append(Refused(op, found))
    return _sets(pairs), refused


def _producers(funcs: list[ir.Operation]) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if producers.is_producer(op.operation):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    for func in funcs:
        func.walk(visit)
    return found


def _pair(op: ir.Operation, evaluator: Evaluator, layers: dict[int, Layer | str],
          on_inline: Callable[[ir.Operation], None]) -> Pair | str | None:
    out = output_axis(op, evaluator)
    if out is None:
        return None
    result_axis, kernel_axis = out
    region = _walk(op.results[0], result_axis, evaluator, on_inline)
    if isinstance(region, scaling.Inline):
        return "too many nested calls between the layers"
    if not isinstance(region, scaling.Region):
        return region
    if isinstance(kernel_axis, str):
        return f"layer 1's {kernel_axis}"
    second = region.consumer
    mapping = _input_map(second, region)
    if isinstance(mapping, str):
        return f"layer 2 ({second.name}): {mapping}"
    first = _layer(op, kernel_axis.operand, evaluator, layers)
    if isinstance(first, str):
        return f"layer 1: {first}"
    last = _layer(second, mapping.operand, evaluator, layers)
    if isinstance(last, str):
        return f"layer 2 ({second.name}): {last}"
    _set_roles(first, out_axis=kernel_axis.axis)
    _set_roles(last, in_axis=mapping.in_axis, out_axis=mapping.out_axis, groups=mapping.groups)
    return Pair(first, region, last, np.ones(first.kernel.shape[kernel_axis.axis]))


def _walk(start: ir.Value, axis: int, evaluator: Evaluator,
          on_inline: Callable[[ir.Operation], None]) -> scaling.Walk:
    for _ in range(_MAX_INLINE_ROUNDS):
        found = scaling.walk(start, axis, evaluator)
        if not isinstance(found, scaling.Inline):
            return found
        on_inline(found.call)
    return "too many nested calls between the layers"


def output_axis(op: ir.Operation, evaluator: Evaluator
                 ) -> tuple[int, producers.KernelAxis | str] | None:
    """The result axis of output channels and the kernel axis behind it."""
    result = elements.ranked_type(op.results[0])
    if result is None or not elements.is_float(result.element_type):
        return None
    for axis in producers.candidate_output_axes(op):
        kernel_axis = producers.output_kernel_axis(op, axis)
        if isinstance(kernel_axis, str):
            continue
        if producers.is_constant(op.operands[kernel_axis.operand], evaluator):
            return axis, kernel_axis
    axis = producers.candidate_output_axes(op)[0]
    return axis, "kernel is not constant (bind parameters first: --bind-params)"


def _input_map(op: ir.Operation, region: scaling.Region) -> InputScaleMap | str:
    if op.name == "stablehlo.convolution":
        if ir.IntegerAttr(op.attributes["batch_group_count"]).value != 1:
            return "batch_group_count > 1 mixes input channels into the batch"
    return producers.input_scale_map(op, region.operand, region.axis)


def _layer(op: ir.Operation, operand: int, evaluator: Evaluator,
           layers: dict[int, Layer | str]) -> Layer | str:
    key = op_id(op)
    if key not in layers:
        compute = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
        kernel = producers.kernel(op.operands[operand], compute, evaluator, op.name)  # type: ignore[arg-type]
        if isinstance(kernel, str):
            layers[key] = kernel
        else:
            layers[key] = Layer(op, kernel, operand, None, None, 1, np.zeros(0), np.zeros(0))
    layer = layers[key]
    if isinstance(layer, Layer) and layer.operand != operand:
        return "the kernel is on a different operand in its two roles"
    return layer


def _set_roles(layer: Layer, *, in_axis: int | None = None, out_axis: int | None = None,
               groups: int | None = None) -> None:
    layer.in_axis = layer.in_axis if in_axis is None else in_axis
    layer.out_axis = layer.out_axis if out_axis is None else out_axis
    layer.groups = layer.groups if groups is None else groups


def _sets(pairs: list[Pair]) -> list[list[Pair]]:
    """Pairs linked through a shared layer, each set in order from its first layer."""
    by_first = {op_id(p.first.op): p for p in pairs}
    seconds = {op_id(p.second.op) for p in pairs}
    sets: list[list[Pair]] = []
    for pair in pairs:
        if op_id(pair.first.op) in seconds:
            continue  # not the head of its chain
        chain = [pair]
        while op_id(chain[-1].second.op) in by_first:
            chain.append(by_first[op_id(chain[-1].second.op)])
        sets.append(chain)
    return sets


# --- plan (pure, float64) ------------------------------------------------------


def plan(chain: list[Pair]) -> SetPlan | str:
    """Scales for every pair of `chain` (iterated to convergence), the new kernels
    and region constants, or why the set cannot be equalized."""
    layers = [chain[0].first] + [p.second for p in chain]
    for layer in layers:
        _init_table(layer)
    iterations = 0
    while iterations < MAX_ITERATIONS:
        iterations += 1
        if max(_sweep(pair) for pair in chain) < CONVERGED:
            break
    if all(np.max(np.abs(np.log(p.scale))) < ALREADY_EQUAL for p in chain):
        return "already equalized (every scale within 0.1% of 1)"
    kernels: dict[int, rewrite.KernelRewrite] = {}
    for index, layer in enumerate(layers):
        factor = _factor(layer, chain[index - 1] if index else None,
                         chain[index] if index < len(chain) else None)
        planned = rewrite.plan_kernel(layer.kernel, factor, layer.operand)
        if isinstance(planned, str):
            return f"{layer.op.name} kernel: {planned}"
        kernels[op_id(layer.op)] = planned
    links = []
    for pair in chain:
        constants = _constants(pair)
        if isinstance(constants, str):
            return constants
        links.append(Link(pair, constants))
    after = [layer.table.max(axis=0) for layer in layers]
    return SetPlan(layers, links, kernels, iterations, after)


def _init_table(layer: Layer) -> None:
    values = np.broadcast_to(layer.kernel.values, layer.kernel.shape)
    axes = [a for a in (layer.in_axis, layer.out_axis) if a is not None]
    others = tuple(d for d in range(values.ndim) if d not in axes)
    table = np.max(np.abs(values), axis=others, keepdims=True).astype(np.float64)
    in_size = values.shape[layer.in_axis] if layer.in_axis is not None else 1
    out_size = values.shape[layer.out_axis] if layer.out_axis is not None else 1
    if layer.in_axis is not None and layer.out_axis is not None and layer.in_axis > layer.out_axis:
        table = np.swapaxes(table, layer.in_axis, layer.out_axis)
    layer.table = table.reshape(in_size, out_size)
    layer.before = layer.table.max(axis=0)


def _sweep(pair: Pair) -> float:
    """One balancing step of `pair` on the max-abs tables; returns max |log s|."""
    r1 = pair.first.table.max(axis=0)
    r2 = _input_ranges(pair.second)
    s = np.ones_like(r1)
    ok = (r1 > 0) & (r2 > 0)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    pair.first.table /= s[None, :]
    pair.second.table *= _in_table_factor(pair.second, s)
    pair.scale *= s
    return float(np.max(np.abs(np.log(s)))) if s.size else 0.0


def _input_ranges(layer: Layer) -> np.ndarray:
    """Per activation channel: max |K| over the kernel entries that read it."""
    table = layer.table
    if layer.groups == 1:
        return table.max(axis=1)
    in_size, out_size = table.shape
    per_group = table.reshape(in_size, layer.groups, out_size // layer.groups).max(axis=2)
    return per_group.T.reshape(-1)  # channel g * in_size + k


def _in_table_factor(layer: Layer, s: np.ndarray) -> np.ndarray:
    in_size, out_size = layer.table.shape
    return InputScaleMap(layer.operand, 0, 1, layer.groups).expand(s, (in_size, out_size))


def _factor(layer: Layer, before: Pair | None, after: Pair | None) -> np.ndarray:
    """What `layer`'s kernel is multiplied by: s of the pair before along its input
    channels, 1/s of the pair after along its output channels."""
    shape = layer.kernel.shape
    factor = np.ones([1] * len(shape))
    if before is not None:
        assert layer.in_axis is not None
        mapping = InputScaleMap(layer.operand, layer.in_axis, layer.out_axis, layer.groups)
        factor = factor * mapping.expand(before.scale, shape)
    if after is not None:
        assert layer.out_axis is not None
        factor = factor * producers.axis_factor(1.0 / after.scale, layer.out_axis, len(shape))
    return factor


def _constants(pair: Pair) -> list[tuple[scaling.Edit, np.ndarray]] | str:
    """The region's constants divided by s, rounded once; unchanged ones are left out."""
    planned = []
    for edit in pair.region.edits:
        dtype = elements.numpy_dtype(ir.RankedTensorType(edit.like.type).element_type)
        assert dtype is not None
        scaled = edit.vector / pair.scale
        rounded = scaled.astype(dtype)
        if not np.all(np.isfinite(rounded[np.isfinite(scaled)])):
            return (f"a constant of {edit.op.name} divided by the scales overflows "
                    f"{np.dtype(dtype).name}")
        if np.array_equal(rounded.astype(np.float64), edit.vector.astype(dtype).astype(np.float64)):
            continue  # 0 / s == 0: the constant stays as it is (ReLU's zero)
        planned.append((edit, scaled))
    return planned


# --- apply ---------------------------------------------------------------------


def apply(planned: SetPlan) -> None:
    """Replaces the kernels of the set's layers and the changed region constants."""
    for layer in planned.layers:
        new = planned.kernels[op_id(layer.op)]
        with ir.InsertionPoint(layer.op):
            layer.op.operands[layer.operand] = new.build(layer.op.location)
    edits = [e for link in planned.links for e in link.constants] + planned.extra
    for edit, vector in edits:
        with ir.InsertionPoint(edit.op):
            edit.op.operands[edit.operand] = rewrite.broadcast_constant(
                vector, edit.like, [edit.axis], edit.op.location)
    for op, vector, axis in planned.new_biases:
        _add_after(op, partial(rewrite.bias_add, bias=vector, axis=axis, loc=op.location))
    for op, corr in planned.corrections:
        _add_after(op, partial(_border_shift, conv=op, corr=corr))


def _border_shift(result: ir.Value, conv: ir.Operation, corr: border.Correction) -> ir.Value:
    """`result + C`, C the correction table expanded over `conv`'s output."""
    dims = producers.conv_dims(conv)
    return rewrite.constant_add(
        result, corr.table, [*dims.output_spatial_dimensions, dims.output_feature_dimension],
        conv.location, corr.expand)


def _add_after(op: ir.Operation, build: Callable[[ir.Value], ir.Value]) -> None:
    """Inserts `build(result)` right after `op` and reads it wherever `op`'s result was read."""
    result = op.results[0]
    readers = users(result)
    with ir.InsertionPoint.after(op):
        added = build(result)
    for reader in readers:
        for i, operand in enumerate(reader.operands):
            if operand == result:
                reader.operands[i] = added


def range_ratio(ranges: np.ndarray) -> float:
    """max / min of per-channel weight ranges (over the nonzero channels)."""
    nonzero = ranges[ranges > 0]
    return float(nonzero.max() / nonzero.min()) if nonzero.size else 1.0


def triplets(layers: list[Layer]) -> int:
    """conv -> depthwise -> conv runs: an inner layer whose groups read one channel each."""
    return sum(1 for layer in layers[1:-1] if layer.groups > 1 and layer.table.shape[0] == 1)


def kind(chain: list[Pair]) -> str:
    """`pair`, `triplet` (DFQ's conv -> depthwise -> conv shape: three layers) or `chain of N`."""
    n = len(chain) + 1
    return {2: "pair", 3: "triplet"}.get(n, f"chain of {n}")


def run(module: ir.Module, funcs: list[ir.Operation], evaluator: Evaluator,
        adjust: Callable[[SetPlan], None] | None = None
        ) -> tuple[list[tuple[list[Pair], SetPlan | str]], list[Refused], set[str], list[str]]:
    """Finds, plans and applies every set; returns (set, plan or reason) per set, the
    pair refusals, the changed functions and the callees inlined. `adjust` may
    change a plan before it is applied (high-bias absorption)."""
    changed: set[str] = set()
    inlined: list[str] = []

    def on_inline(call: ir.Operation) -> None:
        table = ir.SymbolTable(module.operation)
        callee = table[callee_name(call)].operation
        changed.add(function_name(call))
        inlined.append(symbol_name(callee))
        inline(call, callee)

    sets, refused = find(funcs, evaluator, on_inline)
    if inlined:
        drop_uncalled(module, set(inlined))
    results: list[tuple[list[Pair], SetPlan | str]] = []
    for chain in sets:
        planned = plan(chain)
        if isinstance(planned, SetPlan):
            if adjust is not None:
                adjust(planned)
            apply(planned)
            changed.add(function_name(chain[0].first.op))
        results.append((chain, planned))
    return results, refused, changed, inlined

