"""Typed readers of the op attributes bnfold needs, one per fact.

Every attribute is read through the bindings' typed accessors with
StableHLO's default filled in, never by parsing its printed text:

    >>> padding(conv)                       # [[low, high], ...] per spatial axis
    array([[1, 1], [1, 1]])
    >>> ints(reduce_window, "base_dilations", default=1, rank=4)
    (1, 1, 1, 1)
    >>> comparison_direction(compare)
    'GT'
"""

from __future__ import annotations

import numpy as np

from bnfold.ir import ir, stablehlo


def ints(op: ir.Operation, name: str, *, default: int, rank: int) -> tuple[int, ...]:
    """An i64 array attribute (`window_strides`, `lhs_dilation`, ...), or `default` per axis."""
    attrs = op.attributes
    if name not in attrs:
        return (default,) * rank
    attr = attrs[name]
    try:
        return tuple(_elements(ir.DenseI64ArrayAttr(attr)))
    except ValueError:  # older ops spell some of them as dense integer elements
        return tuple(int(v) for v in np.asarray(ir.DenseIntElementsAttr(attr)).reshape(-1))


def _elements(array: ir.DenseI64ArrayAttr | ir.DenseBoolArrayAttr) -> list:
    """The elements of a dense array attribute, read by index: iterating one ends with the
    bindings raising IndexError, 8 us per attribute where this takes 0.4."""
    return [array[i] for i in range(len(array))]


def bools(op: ir.Operation, name: str, *, rank: int) -> tuple[bool, ...]:
    """A bool array attribute (`window_reversal`), False per axis when absent."""
    attrs = op.attributes
    if name not in attrs:
        return (False,) * rank
    return tuple(bool(v) for v in _elements(ir.DenseBoolArrayAttr(attrs[name])))


def padding(op: ir.Operation, rank: int | None = None) -> np.ndarray:
    """The `padding` attribute of a convolution or reduce_window as int64 [axes, 2]
    (zeros when absent; `rank` axes, by default the op's spatial or operand rank)."""
    attrs = op.attributes
    if "padding" in attrs:
        return np.asarray(ir.DenseIntElementsAttr(attrs["padding"])).astype(np.int64).reshape(-1, 2)
    if rank is None:
        rank = (len(conv_dims(op).input_spatial_dimensions) if op.name == "stablehlo.convolution"
                else ir.RankedTensorType(op.operands[0].type).rank)
    return np.zeros((rank, 2), dtype=np.int64)


def conv_dims(op: ir.Operation) -> stablehlo.ConvDimensionNumbers:
    return stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])


def dot_dims(op: ir.Operation) -> stablehlo.DotDimensionNumbers:
    return stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])


def spatial_rank(conv: ir.Operation) -> int:
    return len(conv_dims(conv).input_spatial_dimensions)


def lhs_dilation(conv: ir.Operation) -> tuple[int, ...]:
    return ints(conv, "lhs_dilation", default=1, rank=spatial_rank(conv))


def is_lhs_dilated(conv: ir.Operation) -> bool:
    """A transposed convolution: holes between the input elements read as zeros."""
    return any(d != 1 for d in lhs_dilation(conv))


def reads_inserted_zeros(conv: ir.Operation, pads: np.ndarray | None = None) -> bool:
    """Some taps of the convolution read zeros it inserts: positive padding (`pads`, when
    given, stands for its own: an explicit pad it absorbs) or lhs_dilation."""
    return bool(np.any((padding(conv) if pads is None else pads) > 0)) or is_lhs_dilated(conv)


def feature_groups(conv: ir.Operation) -> int:
    return ir.IntegerAttr(conv.attributes["feature_group_count"]).value


def batch_groups(conv: ir.Operation) -> int:
    return ir.IntegerAttr(conv.attributes["batch_group_count"]).value


def comparison_direction(compare: ir.Operation) -> str:
    """`EQ`, `NE`, `GE`, `GT`, `LE` or `LT`."""
    return str(stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value)


def integer(op: ir.Operation, name: str) -> int:
    return ir.IntegerAttr(op.attributes[name]).value


def permutation(transpose: ir.Operation) -> list[int]:
    return _elements(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))


def broadcast_dimensions(op: ir.Operation) -> list[int]:
    return list(ints(op, "broadcast_dimensions", default=0, rank=0))
