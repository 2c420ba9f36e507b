"""quantize-weights: every constant convolution/dot_general weight as signed integers.

Symmetric quantization, one scale per tensor (the default: what equalization
serves) or per output channel: `scale = max|W| / qmax` with `qmax =
2^(bits-1) - 1`, rounded once to f32 (f64 for f64 weights; raised to that
type's smallest normal number, one value down where `q * scale` would
overflow the weight's type), and `q = round_half_even(W / scale)` in [-qmax,
qmax], stored as `i4`, `i8` or `i16` and dequantized in the graph (the product
in f32, converted once to an f16 or bf16 weight's type), so XLA, IREE and
every StableHLO consumer run the module as it is (QDQ). Before:

    %k = stablehlo.constant dense<...> : tensor<3x3x16x32xf32>
    %y = stablehlo.convolution(%x, %k) ...
    %b = stablehlo.add %y, %bias_b

After (int8 per tensor, with --bias-correction):

    %q = stablehlo.constant dense<...> : tensor<3x3x16x32xi8>
    %f = stablehlo.convert %q : (tensor<3x3x16x32xi8>) -> tensor<3x3x16x32xf32>
    %s = stablehlo.constant dense<0.0123> : tensor<f32>
    %sb = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<3x3x16x32xf32>
    %w = stablehlo.multiply %f, %sb : tensor<3x3x16x32xf32>
    %y = stablehlo.convolution(%x, %w) ...
    %b = stablehlo.add %y, %corrected_b            // bias - (W_q - W) E[x]

Analytic bias correction (Nagel et al., "Data-Free Quantization", ICCV 2019,
section 4.2): the quantized layer's output moves, on average, by
`E[(W_q - W) x] = (W_q - W) E[x]` per output channel (linear), averaged over
the output positions with each tap's border share where the layer zero-pads;
E[x] per input channel comes from the folded batch norms before the layer
(`bnfold.quant.moments`). The bias takes the shift back. Where E[x] is
unknown (the model's input, after a max pool or an op without a mean law)
the layer is quantized uncorrected and the report says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bnfold import attributes, elements, precision, producers
from bnfold.graph import carry_attributes, defining_op, function_name
from bnfold.ir import ir, stablehlo
from bnfold.patterns.base import Pattern
from bnfold.patterns.rewrite import bias_add
from bnfold.quant import region
from bnfold.quant.moments import Walk
from bnfold.refusal import Code, Refusal
from bnfold.report import Part, Section, Skip, columns, count, parameter_path
from bnfold.rewriter import Rewriter
from bnfold.through import BiasAdds, bias_adds, mean_through

if TYPE_CHECKING:
    from bnfold.driver import Context
    from bnfold.options import FoldOptions



@dataclass(frozen=True)
class Root:
    """A producer, and the run's walk to the batch norms (shared: each value once)."""

    op: ir.Operation
    walk: Walk


@dataclass(frozen=True)
class Layer:
    """A producer with a constant float kernel on operand `operand`."""

    op: ir.Operation
    operand: int
    out_axis: int  # the kernel axis of output channels
    kernel: producers.Kernel
    walk: Walk


@dataclass(frozen=True)
class Weights:
    """A kernel as integers: `q * scale` (scale broadcast along `axis`, or one value)."""

    q: np.ndarray  # int8 or int16 values in [-qmax, qmax]
    scale: np.ndarray  # float64 values of the scales as stored (rank 0, or one per channel)
    dequantized: np.ndarray  # float64 of the weight the program computes (see `quantize`)
    storage: str  # "i4", "i8" or "i16"
    axis: int | None  # per-channel: the kernel axis of the scales
    compute: np.dtype  # the scale's type, where `convert(q) * scale` is computed
    raised: tuple[int, ...] = ()  # channels (per tensor: 0) whose scale is the smallest normal


@dataclass(frozen=True)
class Correction:
    """The expected output shift the bias takes back, and the bias adds it merges into."""

    shift: np.ndarray  # E[(W_q - W) x] per output channel
    out_axis: int  # the result's axis of output channels
    merge: BiasAdds | None
    bias: np.ndarray  # the new bias: the merged adds' sum minus `shift`
    modeled: bool = False  # E[x] needed the normal model (an activation's mean): `Moments`


@dataclass(frozen=True)
class Plan:
    layer: Layer
    weights: Weights
    sqnr: float
    correction: Correction | Refusal | None  # None: not asked for


# --- quantization (pure, float64) ------------------------------------------------------------


def storage_type(bits: int) -> str:
    return "i4" if bits <= 4 else "i8" if bits <= 8 else "i16"


def compute_type(dtype: np.dtype) -> np.dtype:
    """Where the program dequantizes a weight of type `dtype`: f64 for f64 weights, else
    f32 (every integer up to 16 bits is exact there, and `q * scale` rounds once)."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def quantize(values: np.ndarray, bits: int, dtype: np.dtype, axis: int | None,
             shape: tuple[int, ...]) -> Weights | Refusal:
    """Symmetric quantization of a float64 kernel whose program type is `dtype`.

    `values` may be compact (broadcastable to `shape`, e.g. a splat of one value): the
    integers then are too. The program computes `convert(q) * scale` in `compute_type`
    and converts the product once to `dtype`: `dequantized` is exactly that."""
    qmax = 2 ** (bits - 1) - 1
    compute = compute_type(dtype)
    if not np.all(np.isfinite(values)):
        return Refusal(Code.PRECISION, "precision: the weight is not finite")
    others = tuple(d for d in range(values.ndim) if d != axis)
    if axis is not None:
        top = np.broadcast_to(np.max(np.abs(values), axis=others), (shape[axis],))
    else:
        top = np.asarray(np.max(np.abs(values)))
    with np.errstate(all="ignore"):
        scale = np.asarray(np.where(top > 0, top / qmax, 1.0)).astype(compute)  # zero channel: 1
    # A scale that is subnormal where the program multiplies is flushed to zero by CPUs
    # (XLA CPU: the channel's output would be 0): it is raised to the smallest normal
    # number, a coarser step (fewer levels) for that channel, every weight still within
    # half of it.
    tiny = precision.smallest_normal(compute)
    raised = scale < tiny
    scale = np.where(raised, compute.type(tiny), scale).astype(compute)
    q, dequantized = _quantized(values, scale, qmax, dtype, axis)
    # A scale that rounded up can put qmax * scale past the weight type's largest value
    # (f16 65504: scale 515.78 in f32, 127 * scale rounds to inf in f16): those take the
    # value one below, which puts the largest weight a tiny fraction of a step past qmax.
    overflow = ~np.isfinite(dequantized)
    if np.any(overflow):
        bad = np.any(overflow, axis=others) if axis is not None else np.any(overflow)
        scale = np.where(bad, np.nextafter(scale, compute.type(0)), scale).astype(compute)
        q, dequantized = _quantized(values, scale, qmax, dtype, axis)
    scale64 = scale.astype(np.float64)
    step = scale64.reshape(_scale_shape(values.ndim, axis))
    # The contract, checked on the numbers (a wrong number is worse than a refusal): every
    # weight the program computes is finite and the integers are within half a step.
    if not np.all(np.isfinite(dequantized)):
        return Refusal(Code.PRECISION, "precision: a dequantized weight would overflow "
                                       f"{precision.type_name(dtype)}: keep this layer in float")
    off = np.abs(q * step - values) / step
    if np.any(off > 0.5 + 2.0 ** -30):  # float64 roundoff of off itself (f64 weights)
        return Refusal(Code.PRECISION, f"precision: an integer would be {float(np.max(off)):.3g} "
                                       "steps off its weight (more than half a step): keep this "
                                       "layer in float")
    return Weights(q.astype(np.int8 if bits <= 8 else np.int16), scale64, dequantized,
                   storage_type(bits), axis, compute,
                   tuple(int(c) for c in np.flatnonzero(raised)))


def _scale_shape(ndim: int, axis: int | None) -> list[int]:
    shape = [1] * ndim
    if axis is not None:
        shape[axis] = -1
    return shape


def _quantized(values: np.ndarray, scale: np.ndarray, qmax: int, dtype: np.dtype,
               axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The integers round_half_even(W / scale) in [-qmax, qmax], and the weights the program
    computes from them: `convert(q) * scale` in the scale's type, converted once to `dtype`."""
    step = scale.reshape(_scale_shape(values.ndim, axis))
    q = np.clip(np.rint(values / step.astype(np.float64)), -qmax, qmax)
    with np.errstate(all="ignore"):
        product = q.astype(scale.dtype) * step
        dequantized = product.astype(dtype) if np.dtype(dtype) != scale.dtype else product
    return q, dequantized.astype(np.float64)


def sqnr_db(values: np.ndarray, dequantized: np.ndarray) -> float:
    """10 log10(sum W^2 / sum (W_q - W)^2); inf when quantization is exact. Both sums are
    taken relative to max |W| (f64 weights near 1e-300 or 1e308 would underflow or overflow
    when squared)."""
    top = float(np.max(np.abs(values), initial=0.0))
    if top == 0 or not np.isfinite(top):
        return float("inf") if np.array_equal(values, dequantized) else 0.0
    noise = float(np.sum(((dequantized - values) / top) ** 2))
    signal = float(np.sum((values / top) ** 2))
    return float("inf") if noise == 0 else 10.0 * np.log10(signal / noise)


# --- match and plan ------------------------------------------------------------------------------


def layer(root: Root, ctx: Context) -> Layer | Refusal | None:
    """The root's constant float kernel, or why it has none to quantize (None: not float)."""
    op = root.op
    analysis = ctx.analysis
    found = producers.output_axis(op, analysis.evaluator)
    if found is None:
        return None
    _, kernel_axis = found
    if isinstance(kernel_axis, Refusal):
        return kernel_axis
    value = op.operands[kernel_axis.operand]
    if producers.is_dequantized(value):
        return Refusal(Code.NOTHING, "already quantized (an integer constant times a scale)")
    compute = elements.numpy_dtype(ir.RankedTensorType(value.type).element_type)
    assert compute is not None
    kernel = producers.kernel(value, compute, analysis.evaluator, op.name)
    if isinstance(kernel, Refusal):
        return kernel
    return Layer(op, kernel_axis.operand, kernel_axis.axis, kernel, root.walk)


def plan(ctx: Context, found: Layer) -> Plan | Refusal:
    options = ctx.options
    bits = bits_of(options)
    assert bits is not None
    kernel = found.kernel
    values = np.asarray(kernel.values, dtype=np.float64)  # compact: a splat stays one value
    if kernel.convert is not None:
        values = values.astype(kernel.effective).astype(np.float64)
    per_channel = options.quantize_granularity == "per-channel"
    weights = quantize(values, bits, kernel.effective, found.out_axis if per_channel else None,
                       kernel.shape)
    if isinstance(weights, Refusal):
        return weights
    correction = correct_bias(ctx, found, values, weights) if options.bias_correction else None
    return Plan(found, weights, sqnr_db(*np.broadcast_arrays(values, weights.dequantized)),
                correction)


def correct_bias(ctx: Context, found: Layer, values: np.ndarray, weights: Weights
                 ) -> Correction | Refusal:
    """The expected output shift of the quantized layer, and the bias that takes it back."""
    op = found.op
    operand = 1 - found.operand
    source = op.operands[operand]
    padding, unpadded = None, None
    pad = defining_op(source)
    if op.name == "stablehlo.convolution" and pad is not None and pad.name == "stablehlo.pad":
        absorbed = _absorbed_padding(op, pad, ctx)  # an explicit zero pad: its border share
        if absorbed is not None:
            padding, unpadded = absorbed
            source = pad.operands[0]
    moments = found.walk.moments(source)
    if moments is None:
        return Refusal(Code.NOTHING, "the layer's input is a constant")
    if isinstance(moments, Refusal):
        return moments.wrap("E[x] unknown")
    mapping = producers.input_scale_map(op, operand, moments.axis)
    if isinstance(mapping, Refusal):
        return mapping.wrap("E[x] is per channel along another axis than the layer reads")
    shape = found.kernel.shape
    if values.shape != shape and int(np.prod(shape)) > precision.MAX_EXPANDED_ELEMENTS:
        return Refusal(Code.LIMIT, f"the kernel is a splat of {int(np.prod(shape))} elements "
                                   "(more than 2^24); its correction would expand it, so the "
                                   "layer is quantized uncorrected")
    error = np.broadcast_to(weights.dequantized, shape) - np.broadcast_to(values, shape)
    found_shift = mean_through(op, mapping, error, moments.mean, padding, unpadded)
    if isinstance(found_shift, Refusal):
        return found_shift
    shift, out_axis = found_shift
    merge = bias_adds(op.results[0], out_axis, ctx.analysis)
    bias = (merge.bias if merge is not None else 0.0) - shift
    dtype = elements.numpy_dtype(ir.RankedTensorType(op.results[0].type).element_type)
    if dtype is not None and (problem := precision.check_bias(bias, dtype, "the corrected bias")):
        return problem
    return Correction(shift, out_axis, merge, np.asarray(bias, dtype=np.float64),
                      moments.modeled)


def _absorbed_padding(op: ir.Operation, pad: ir.Operation, ctx: Context
                      ) -> tuple[np.ndarray, ir.RankedTensorType] | None:
    """The convolution's padding with a zero pad before it added, and the pad's input type;
    None when the pad is not zeros on the spatial axes only."""
    value = ctx.analysis.constant(pad.operands[1])
    if value is None or np.any(np.asarray(value.array, dtype=np.float64) != 0):
        return None
    dims = producers.conv_dims(op)
    rank = ir.RankedTensorType(pad.operands[0].type).rank
    low, high, interior = (attributes.ints(pad, name, default=0, rank=rank)
                           for name in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    spatial = list(dims.input_spatial_dimensions)
    if any(interior) or any(low[d] < 0 or high[d] < 0 for d in range(rank)) or \
            any((low[d] or high[d]) for d in range(rank) if d not in spatial):
        return None
    # The pad's zeros come before lhs_dilation spreads the input: each is `dilation` zeros of
    # the convolution's own padding (its holes are zeros too).
    own = attributes.padding(op)
    dilation = attributes.lhs_dilation(op)
    padding = np.array([[own[k][0] + low[d] * dilation[k], own[k][1] + high[d] * dilation[k]]
                        for k, d in enumerate(spatial)])
    return padding, ir.RankedTensorType(pad.operands[0].type)


# --- apply ---------------------------------------------------------------------------------------


def dequantize(weights: Weights, like: ir.Value, loc: ir.Location,
               anchor: ir.Operation | None = None) -> ir.Value:
    """`convert(convert(q) * broadcast(scale))` of `like`'s type, at the insertion point:
    the product in the scale's type (f32, or f64), one convert to the weight's type where
    that differs (the integer constant keeps `anchor`'s discardable attributes)."""
    ty = ir.RankedTensorType(like.type)
    shape = list(ty.shape)
    with loc:
        wide = elements.element_type(weights.compute)
        wide_type = ir.RankedTensorType.get(shape, wide)
        storage = ir.IntegerType.get_signless(int(weights.storage[1:]))
        q_type = ir.RankedTensorType.get(shape, storage)
        if weights.q.size == 1 and weights.q.shape != tuple(shape):  # a splat stays one
            attr = ir.DenseElementsAttr.get_splat(
                q_type, ir.IntegerAttr.get(storage, int(weights.q.reshape(-1)[0])))
        else:
            attr = elements.array_attr(np.broadcast_to(weights.q, shape), q_type)
        q = stablehlo.ConstantOp(attr)
        if anchor is not None:
            carry_attributes(anchor, q.operation)
        floats = stablehlo.ConvertOp(wide_type, q.result).result
        scale = stablehlo.ConstantOp(elements.dense_attr(weights.scale, wide)).result
        dims = [] if weights.axis is None else [weights.axis]
        scales = stablehlo.BroadcastInDimOp(wide_type, scale, dims).result
        product = stablehlo.MulOp(floats, scales).result
        if wide == ty.element_type:
            return product
        return stablehlo.ConvertOp(ty, product).result


def build(rewriter: Rewriter, p: Plan) -> ir.Operation:
    """Replaces the layer with a copy that reads the dequantized weight (and its bias adds
    with one corrected add); returns the copy."""
    op = p.layer.op
    anchor = p.layer.kernel.anchor
    loc = anchor.location if anchor is not None else op.location
    with ir.InsertionPoint(op):
        weight = dequantize(p.weights, op.operands[p.layer.operand], loc, anchor)
        copy = rewriter.clone(op, {p.layer.operand: weight})
    correction = p.correction
    if not isinstance(correction, Correction) or \
            (correction.merge is None and not np.any(correction.shift)):
        rewriter.replace_op(op, [copy.results[0]], successor=copy)  # nothing to add
        return copy
    root = correction.merge.root if correction.merge is not None else op
    with ir.InsertionPoint.after(root):
        value = bias_add(copy.results[0], correction.bias, correction.out_axis, root.location)
    if correction.merge is not None:
        rewriter.supersede(op, copy)
        rewriter.replace_op(root, [value])
    else:
        rewriter.replace_op(op, [value], successor=copy)
    return copy


# --- the pattern --------------------------------------------------------------------------------


def _record(ctx: Context, p: Plan, copy: ir.Operation) -> Quantized:
    ledger = ctx.ledger
    correction: dict[str, object] | None = None
    params = {"scale": p.weights.scale.copy()}
    if isinstance(p.correction, Correction):
        shift = p.correction.shift
        correction = {"applied": True, "channels": int(np.count_nonzero(shift)),
                      "max_shift": float(np.max(np.abs(shift))) if shift.size else 0.0,
                      "mean_shift": float(np.mean(np.abs(shift))) if shift.size else 0.0,
                      "basis": "normal" if p.correction.modeled else "linear"}
        params["bias_shift"] = shift.copy()
        stats = ledger.statistics(copy)
        if stats is not None:  # the result moved by the shift, the bias took it back
            ledger.set_statistics(copy, stats.shifted(np.zeros_like(shift), shift))
    elif isinstance(p.correction, Refusal):
        correction = {"applied": False, "code": p.correction.code.value,
                      "reason": p.correction.message}
    options = ctx.options
    bits = bits_of(options)
    assert bits is not None
    return Quantized(
        id=f"q{len(ledger.records().records)}", producer=ledger.location(p.layer.op),
        producer_op=p.layer.op.name, function=function_name(copy), bits=bits,
        granularity=options.quantize_granularity or "per-tensor", storage=p.weights.storage,
        axis=p.layer.out_axis, weight_sqnr_db=p.sqnr, bias_correction=correction,
        params=params, weight_location=_weight_location(p.layer.kernel),
        scale_type=precision.type_name(p.weights.compute),
        weight_type=precision.type_name(p.layer.kernel.effective),
        raised_scales=list(p.weights.raised))


def _weight_location(kernel: producers.Kernel) -> str:
    """The location of the constant the weight was read from (a bound parameter's constant
    has its argument's location: `report.name_parameters` names the weight by it), through
    the reshapes, transposes and converts a kernel computed from one constant passes."""
    if kernel.anchor is not None:
        return str(kernel.anchor.location)
    owner = defining_op(kernel.value)
    for _ in range(8):
        if owner is None:
            break
        if owner.name == "stablehlo.constant":
            return str(owner.location)
        if len(owner.operands) != 1:
            break
        owner = defining_op(owner.operands[0])
    return ""


def bits_of(options: FoldOptions) -> int | None:
    """The weight bits of `quantize_weights` ("int8" -> 8), or None."""
    return int(options.quantize_weights[3:]) if options.quantize_weights else None


class QuantizeWeights(Pattern[Root, Layer, Plan]):
    """Quantizes every producer's constant weight, in program order. A corrected layer's
    pre-activation keeps its mean (that is the correction), so the moments the walk
    already knows downstream of it still hold."""


    def roots(self, ctx: Context) -> Iterable[Root]:
        walk = Walk(ctx)
        found: list[Root] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if producers.is_producer(op) and not ctx.analysis.is_dead(op):
                found.append(Root(op, walk))
            return ir.WalkResult.ADVANCE

        for func in ctx.functions():
            func.walk(visit)
        return found

    def match(self, ctx: Context, root: Root) -> Layer | Refusal | None:
        return layer(root, ctx)

    def plan(self, ctx: Context, match: Layer) -> Plan | Refusal:
        return plan(ctx, match)

    def refuse(self, ctx: Context, subject: Root | Layer, refusal: Refusal) -> None:
        ctx.ledger.add_refusal(subject.op, refusal)

    def apply(self, rewriter: Rewriter, plan: Plan) -> ir.Operation:
        return build(rewriter, plan)

    def record(self, ctx: Context, plan: Plan, applied: ir.Operation) -> None:
        ctx.ledger.add(_record(ctx, plan, applied))

    def wants_inline(self, ctx: Context, call: ir.Operation, callee: ir.Operation) -> bool:
        """With bias correction: a helper on the way from the batch norms to a layer
        (`call @relu6`, also after a residual add): the walk back needs its ops' mean laws."""
        if not ctx.options.bias_correction:
            return False
        return any(region.leads_to_producer(r, ctx.analysis) for r in call.results)


# --- the report --------------------------------------------------------------------------


@dataclass
class Quantized:
    """One weight stored as integers (--quantize-weights), and its bias correction."""

    id: str
    producer: str
    producer_op: str
    function: str
    bits: int
    granularity: str  # "per-tensor" or "per-channel"
    storage: str  # the integer type of the stored constant: "i4", "i8" or "i16"
    axis: int  # the kernel axis of output channels (the per-channel scales' axis)
    weight_sqnr_db: float  # 10 log10(sum W^2 / sum (W_q - W)^2) against the float weight
    # {"applied": true, "channels": n, "max_shift": x, "mean_shift": y, "basis": "linear"
    # (E[x] is the batch norms' means through linear steps) or "normal" (an activation's
    # mean under the normal model of a batch norm's pre-activation)} or
    # {"applied": false, "code": ..., "reason": ...}; None without --bias-correction
    bias_correction: dict[str, Any] | None = None
    # "scale": one value per tensor or per output channel; "bias_shift": the expected
    # output shift taken out of the bias (per output channel)
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    # the raw location of the constant the weight came from, and the name of the bound
    # parameter it is (`params/Conv_0/kernel`), when it came from one (--bind-params,
    # fold_exported's pytree; set by `Report.name_parameters`)
    weight_location: str = field(default="", repr=False)
    parameter: str | None = None
    # the module's weight is weight_type(scale_type(q) * scale), the product rounded once in
    # scale_type, then converted to weight_type where they differ
    scale_type: str = "f32"
    weight_type: str = "f32"
    # channels (per tensor: [0]) whose scale max|W| / qmax was below scale_type's smallest
    # normal number and is that number instead (fewer levels; no weight more than half off)
    raised_scales: list[int] = field(default_factory=list)

    @property
    def note(self) -> str:
        if not self.raised_scales:
            return ""
        which = "the tensor's scale" if self.granularity == "per-tensor" else \
            f"channel(s) {', '.join(map(str, self.raised_scales))}"
        return (f"{which}: max|W| / {2 ** (self.bits - 1) - 1} is below {self.scale_type}'s "
                "smallest normal number (flushed to zero by CPUs); the scale is that number "
                "instead, a coarser step with every weight within half of it")

    def to_json(self) -> dict[str, Any]:
        scale = self.params["scale"]
        return {
            "id": self.id, "producer": self.producer, "producer_op": self.producer_op,
            "function": self.function, "bits": self.bits, "granularity": self.granularity,
            "storage": self.storage, "axis": self.axis,
            "scale": float(scale) if scale.ndim == 0 else [float(v) for v in scale],
            "scale_type": self.scale_type, "weight_type": self.weight_type,
            "weight_sqnr_db": self.weight_sqnr_db,
        } | ({"parameter": self.parameter} if self.parameter else {}) | (
            {"raised_scales": self.raised_scales, "note": self.note} if self.raised_scales
            else {}) | ({"bias_correction": self.bias_correction}
                        if self.bias_correction is not None else {})

    def encoding(self) -> list[dict[str, Any]]:
        """AIMET's encoding entries, one per tensor or per output channel, in its strict
        symmetric form: offset -qmax, min = -qmax * scale, max = qmax * scale with qmax =
        2^(bits-1) - 1, exactly the range of the module's integers (AIMET's default signed
        grid reaches -2^(bits-1), a value bnfold never stores, and past the type's largest
        value for a weight at its maximum)."""
        qmax = 2 ** (self.bits - 1) - 1
        return [{"bitwidth": self.bits, "dtype": "int", "is_symmetric": "True",
                 "scale": float(v), "offset": -qmax, "min": -qmax * float(v),
                 "max": qmax * float(v)} for v in np.atleast_1d(self.params["scale"])]


def _correction_text(correction: dict[str, Any] | None) -> str:
    if correction is None:
        return "-"
    if correction["applied"]:
        return (f"{correction['channels']} channels, max |shift| {correction['max_shift']:.3g}"
                f" ({correction.get('basis', 'linear')})")
    return f"not applied ({correction['code']}): {correction['reason']}"


class QuantizedWeights(Section):
    """`quantized` (each weight stored as integers: bits, scales, weight SQNR, bias
    correction) and `not_quantized` (each producer whose weight was not, and why), when
    --quantize-weights ran."""

    order = 40
    statistics = True
    prefix = "q"
    keys = ("quantized", "not_quantized", "quantize")
    header = ("weight", "producer", "bits", "granularity", "weight SQNR dB", "bias correction")
    refused_column = "producer"

    def row(self, record: Quantized) -> tuple[str, ...]:
        return (record.id, record.producer, str(record.bits), record.granularity,
                f"{record.weight_sqnr_db:.1f}", _correction_text(record.bias_correction))

    def notes(self, part: Part) -> list[str]:
        """Each weight whose scale was raised to the smallest normal number, and why."""
        notes = [(q.id, q.note) for q in part.records if q.note]
        return [""] + columns([("weight", "note"), *notes]) if notes else []

    def summary(self, part: Part) -> str:
        quantized: list[Quantized] = part.records
        refused: list[Skip] = part.refused
        text = f", quantized {len(quantized)} weight(s)"
        if quantized:
            text += f" ({count(f'int{q.bits} {q.granularity}' for q in quantized)})"
        corrections = [q.bias_correction for q in quantized if q.bias_correction]
        if corrections:
            applied = sum(1 for c in corrections if c["applied"])
            text += f", bias-corrected {applied} ({len(corrections) - applied} not)"
        if refused:
            text += f", {len(refused)} not quantized"
        return text

    def name_parameters(self, part: Part, names: dict[str, str]) -> None:
        for q in part.records:
            name = names.get(q.weight_location) if q.weight_location else None
            if name is not None:
                q.parameter = parameter_path(name)

    def encodings(self, part: Part) -> dict[str, Any]:
        """The quantized weights as an AIMET-style encodings file (`--quant-encodings`):
        `{"version": ..., "param_encodings": {name: [entry, ...]}, "param_locations":
        {name: producer location}}`. A weight that came from a bound parameter
        (--bind-params, fold_exported's pytree) is keyed by the parameter's name
        (`params/Conv_0/kernel`, as tools that read AIMET encodings expect), any other by
        its producer's location; a key used twice (a producer inlined into several call
        sites, a parameter shared by two layers) gets `#1`, `#2`, ..."""
        found: dict[str, Any] = {}
        where: dict[str, str] = {}
        for q in part.records:
            base = q.parameter or q.producer
            key, n = base, 1
            while key in found:
                key, n = f"{base}#{n}", n + 1
            found[key] = q.encoding()
            where[key] = q.producer
        return {"version": "0.6.1", "activation_encodings": {}, "param_encodings": found,
                "param_locations": where}


RECORDS = QuantizedWeights()
PATTERN = QuantizeWeights()
