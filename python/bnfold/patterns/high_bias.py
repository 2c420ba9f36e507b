"""absorb-high-bias: move the bias a ReLU almost surely passes into the next layer.

High-bias absorption (Nagel et al., "Data-Free Quantization", ICCV 2019),
run on an equalized set. Layer 1's pre-activation `y` per channel is, by its
folded batch norm, distributed around `beta` with spread `|gamma|` (the
chain's output mean and spread, `bnfold.statistics.pre_activation`: other
steps in the chain count too; after equalization: divided by `s`). Where
`c = max(0, beta - 3|gamma|)` is positive, `relu(y) = relu(y - c) + c` for
every `y >= c`, i.e. almost surely, and the constant `c` passes linearly
through layer 2 into its bias.
Before (after equalization):

    %a = stablehlo.add %conv1, %b1_b                  // y
    %r = stablehlo.clamp %zero, %a, %six_b            // ReLU6
    %z = stablehlo.convolution(%r, %k2) ...
    %o = stablehlo.add %z, %b2_b

After (activation ranges shrink by c; the output changes only where y < c,
about 0.13% of inputs):

    %a = stablehlo.add %conv1, %b1_minus_c_b
    %r = stablehlo.clamp %zero, %a, %six_minus_c_b
    %z = stablehlo.convolution(%r, %k2) ...
    %o = stablehlo.add %z, %b2_plus_k2c_b             // + sum over k2's window of k2 * c

Layer 2's pre-activation is restored, so its own statistics still hold for
the next link. Where layer 2 zero-pads (or is transposed: lhs_dilation holes),
those taps see zeros in both programs, which now stand for different values:
the output near the borders then gets `bnfold.border`'s exact correction (a
small table of row classes) instead of a per-channel bias. An explicit
`stablehlo.pad` between the layers, or a correction too large to store, keeps
the per-channel bias and the report says that the borders differ.

The statistics come from the fold report (`batch_norm_inference` operands,
or recovered from a decomposed chain by `bnfold.statistics`). Refused with a
reason: a constant it would change no longer fits its type, no statistics,
no ReLU-like lower bound at 0 between the layers, or an op between them
other than the bias add, the activation and layout ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from bnfold import border, elements, precision, producers
from bnfold.constants import Evaluator, per_channel
from bnfold.graph import users
from bnfold.ir import ir, op_id
from bnfold.patterns.equalize import Layer, Link, SetPlan
from bnfold.scaling import Edit

NAME = "absorb-high-bias"
SIGMAS = 3.0
# E[(c - y)+] / sigma for y ~ N(mu, sigma^2) and c = mu - 3 sigma: the mean
# amount by which relu(y - c) + c misses relu(y), per unit of spread.
_TAIL = math.exp(-SIGMAS ** 2 / 2) / math.sqrt(2 * math.pi) - SIGMAS * 0.5 * math.erfc(SIGMAS / math.sqrt(2))
_ALLOWED = ("stablehlo.add", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp",
            "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert", "stablehlo.pad")

# (mean, spread) per channel of a producer's output, from its folded batch norm
Stats = Callable[[ir.Operation], tuple[np.ndarray, np.ndarray] | None]
# (result axis of output channels, kernel axis of output channels) of a producer
Axes = Callable[[ir.Operation], tuple[int, int]]


def plan(planned: SetPlan, stats: Stats, axes: Axes, evaluator: Evaluator
         ) -> list[dict[str, Any]]:
    """Adjusts `planned` (bias, activation bounds, next bias) link by link; returns what
    each link absorbed, or why not, for the report."""
    records: list[dict[str, Any]] = []
    for index, link in enumerate(planned.links):
        saved = _snapshot(planned)
        result = _absorb(planned, index, link, stats, axes, evaluator)
        if not isinstance(result, str) and (problem := _overflow(planned)) is not None:
            _restore(planned, saved)  # the precision contract: this link absorbs nothing
            result = f"{problem} once the bias is absorbed"
        records.append({"link": index, "absorbed": False, "reason": result}
                       if isinstance(result, str) else result)
    return records


_Snapshot = tuple[list[list[tuple[Edit, np.ndarray]]], list[tuple[Edit, np.ndarray]],
                  list[tuple[ir.Operation, np.ndarray, int]],
                  list[tuple[ir.Operation, border.Correction]]]


def _snapshot(planned: SetPlan) -> _Snapshot:
    """Copies of every constant high-bias absorption may change."""
    return ([[(e, v.copy()) for e, v in link.constants] for link in planned.links],
            [(e, v.copy()) for e, v in planned.extra], list(planned.new_biases),
            list(planned.corrections))


def _restore(planned: SetPlan, saved: _Snapshot) -> None:
    constants, extra, new_biases, corrections = saved
    for link, kept in zip(planned.links, constants, strict=True):
        link.constants[:] = kept
    planned.extra[:] = extra
    planned.new_biases[:] = new_biases
    planned.corrections[:] = corrections


def _overflow(planned: SetPlan) -> str | None:
    """Why a planned constant does not fit its element type, or None."""
    edits = [pair for link in planned.links for pair in link.constants] + planned.extra
    checks = [(vector, edit.like) for edit, vector in edits]
    checks += [(vector, op.results[0]) for op, vector, _ in planned.new_biases]
    checks += [(corr.table, op.results[0]) for op, corr in planned.corrections]
    for values, like in checks:
        dtype = elements.numpy_dtype(ir.RankedTensorType(like.type).element_type)
        if dtype is not None and (problem := precision.check_bias(values, dtype)):
            return problem
    return None


def _absorb(planned: SetPlan, index: int, link: Link, stats: Stats, axes: Axes,
            evaluator: Evaluator) -> dict[str, Any] | str:
    pair = link.pair
    found = stats(pair.first.op)
    if found is None:
        return ("layer 1 has no batch-norm statistics (it did not absorb a recognisable batch "
                "norm, or a scale before the batch norm hides what they describe)")
    ops = pair.region.ops
    odd = [op.name for op in ops if op.name not in _ALLOWED]
    if odd:
        return f"{odd[0]} between the layers (high-bias absorption needs bias -> ReLU/ReLU6)"
    bias = _constant(link, planned, lambda e: e.op.name == "stablehlo.add")
    if bias is None:
        return "layer 1 has no per-channel bias add"
    if not _has_relu(pair.region.edits):
        return "no ReLU-like lower bound at 0 between the layers"
    s = pair.scale
    mean, spread = found[0] / s, found[1] / s
    c = np.maximum(0.0, mean - SIGMAS * spread)
    uppers = _uppers(link, planned)
    for upper in uppers:  # a channel that always saturates passes its bound, no more
        c = np.minimum(c, np.maximum(upper, 0.0))
    if not np.any(c > 0):
        return "nothing to absorb: beta - 3*|gamma| <= 0 in every channel"
    bias[:] -= c
    for upper in uppers:
        upper[:] -= c
    second = pair.second
    exact = "exact except where an input falls below beta - 3*gamma"
    corrected = _border_correction(planned, second, c) if _reads_zeros(second.op) else None
    if isinstance(corrected, border.Correction) and not corrected.is_uniform:
        planned.corrections.append((second.op, corrected))
        exact += " (zero-padded borders and dilation holes corrected exactly)"
    else:
        # Every output position sees the same taps: one value per channel, which is
        # the kernel's sum only when no tap reads an inserted zero.
        delta = (corrected.table.reshape(-1) if isinstance(corrected, border.Correction)
                 else _through_kernel(planned, second, c, axes, signed=True))
        _add_to_output_bias(planned, index, second, delta, axes, evaluator)
        if isinstance(corrected, str):
            exact = ("borders differ: layer 2's zero padding or dilation holes see the shift "
                     f"({corrected})")
        elif any(op.name == "stablehlo.pad" for op in ops):
            exact = "borders differ: an explicit zero pad before layer 2 sees the shift"
    estimate = float(np.max(_through_kernel(planned, second, _TAIL * spread, axes)))
    return {
        "link": index, "absorbed": True, "channels": int(np.count_nonzero(c)),
        "absorbed_max": float(c.max()), "absorbed_mean": float(c.mean()),
        "estimated_output_change": estimate, "exact": exact,
    }


def _constant(link: Link, planned: SetPlan, which: Callable[[Edit], bool]) -> np.ndarray | None:
    """The planned vector of the region constant `which` selects (added to the plan if the
    scaling left it unchanged)."""
    for edit, vector in link.constants:
        if which(edit):
            return vector
    for edit in link.pair.region.edits:
        if which(edit):
            vector = edit.vector / link.pair.scale
            link.constants.append((edit, vector))
            return vector
    return None


def _has_relu(edits: tuple[Edit, ...]) -> bool:
    for edit in edits:
        lower = (edit.op.name == "stablehlo.maximum" or
                 (edit.op.name == "stablehlo.clamp" and edit.operand == 0))
        if lower and np.all(edit.vector == 0):
            return True
    return False


def _uppers(link: Link, planned: SetPlan) -> list[np.ndarray]:
    """Planned vectors of the activation's upper bounds (ReLU6's 6/s)."""
    found = []
    for edit in link.pair.region.edits:
        upper = edit.op.name == "stablehlo.minimum" or \
            (edit.op.name == "stablehlo.clamp" and edit.operand == 2)
        if upper:
            vector = _constant(link, planned, _same(edit))
            assert vector is not None
            found.append(vector)
    return found


def _same(edit: Edit) -> Callable[[Edit], bool]:
    return lambda other: other is edit


def _kernel(planned: SetPlan, layer: Layer) -> np.ndarray:
    rounded = planned.kernels[op_id(layer.op)].rounded.values
    return np.broadcast_to(rounded, layer.kernel.shape).astype(np.float64)


def _weighted(planned: SetPlan, layer: Layer, vector: np.ndarray, signed: bool = True
              ) -> np.ndarray:
    """K * vector (or |K| * vector) along `layer`'s input channels, with the new
    (equalized, rounded) kernel, in float64 and the kernel's shape."""
    kernel = _kernel(planned, layer)
    assert layer.in_axis is not None
    mapping = producers.InputScaleMap(layer.operand, layer.in_axis, layer.out_axis, layer.groups)
    return (kernel if signed else np.abs(kernel)) * mapping.expand(vector, kernel.shape)


def _through_kernel(planned: SetPlan, layer: Layer, vector: np.ndarray, axes: Axes,
                    signed: bool = False) -> np.ndarray:
    """Per output channel of `layer`: sum over its window and input channels of
    K * vector (or |K| * vector)."""
    product = _weighted(planned, layer, vector, signed)
    out = axes(layer.op)[1]
    return product.sum(axis=tuple(d for d in range(product.ndim) if d != out))


def _border_correction(planned: SetPlan, layer: Layer, c: np.ndarray) -> border.Correction | str:
    """Layer 2's exact output shift for its input lowered by `c` where some taps read
    inserted zeros: a table that varies near the borders, or why it cannot be built."""
    win = border.window(layer.op)
    if isinstance(win, str):
        return win
    weighted = _weighted(planned, layer, c)
    limit = weighted.size + border.MARGIN_ELEMENTS
    return border.correction(layer.op, win, weighted, limit)


def _add_to_output_bias(planned: SetPlan, index: int, layer: Layer, delta: np.ndarray,
                        axes: Axes, evaluator: Evaluator) -> None:
    """Adds `delta` to the bias right after `layer`: the next link's bias add, an
    existing per-channel add, or a new one."""
    if index + 1 < len(planned.links):
        following = planned.links[index + 1]
        if _first_op_is_bias(following):
            bias = _constant(following, planned, lambda e: e.op.name == "stablehlo.add")
            assert bias is not None
            bias[:] += delta
            return
    result = layer.op.results[0]
    axis = axes(layer.op)[0]
    found = users(result)
    if len(found) == 1 and found[0].name == "stablehlo.add":
        add = found[0]
        index_of_const = 1 if add.operands[0] == result else 0
        const = evaluator.constant(add.operands[index_of_const])
        vector = per_channel(const, axis) if const is not None else "not constant"
        if not isinstance(vector, str):
            planned.extra.append((Edit(add, index_of_const, axis, vector), vector + delta))
            return
    planned.new_biases.append((layer.op, delta, axis))


def _first_op_is_bias(link: Link) -> bool:
    ops = link.pair.region.ops
    return bool(ops) and ops[0].name == "stablehlo.add" and \
        link.pair.first.op.results[0] in list(ops[0].operands)


def _reads_zeros(op: ir.Operation) -> bool:
    """A convolution some of whose taps read inserted zeros: padding, or the holes of
    lhs_dilation (a transposed convolution)."""
    if op.name != "stablehlo.convolution":
        return False
    attrs = op.attributes
    padded = "padding" in attrs and \
        bool(np.any(np.asarray(ir.DenseIntElementsAttr(attrs["padding"])) > 0))
    dilated = "lhs_dilation" in attrs and \
        any(int(v) > 1 for v in ir.DenseI64ArrayAttr(attrs["lhs_dilation"]))
    return padded or dilated
