"""Element types and dense attributes <-> numpy arrays.

Reading is zero-copy where jaxlib allows it (`np.asarray(attr)` uses the buffer
protocol). jaxlib 0.10.2 cannot expose bf16 (or other non-IEEE) buffers, so
those are read back from the attribute's printed form: raw little-endian hex
for large constants, decimals (or hex bit patterns for NaN/Inf) for small ones.
Splats are returned as a single element of the right rank (a "compact" array,
see `bnfold.constants`) so a huge splat never materializes.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, cast

import numpy as np

from bnfold.ir import ir, resource_blob

_FLOATS: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
_INT_RE = re.compile(r"^(u?)i(\d+)$")


# TypeIDs are process-wide (unlike types, which belong to a context), so they
# are safe dictionary keys; integer widths still need the printed name.
_FLOAT_TYPEIDS: dict[ir.TypeID, np.dtype | None] = {
    ir.F16Type.static_typeid: _FLOATS["f16"],
    ir.BF16Type.static_typeid: None,  # ml_dtypes is imported on first use
    ir.F32Type.static_typeid: _FLOATS["f32"],
    ir.F64Type.static_typeid: _FLOATS["f64"],
}


@functools.cache
def bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bf16(dtype: np.dtype) -> bool:
    # ml_dtypes' types are kind "V"; checking the kind first skips the slow `name`.
    return dtype.kind == "V" and dtype.name == "bfloat16"


# The same by the bindings' type class (`element_type` gives the concrete one): a class
# is a cheaper key than a TypeID, which is made on each read.
_FLOAT_CLASSES: dict[type, np.dtype | None] = {
    ir.F16Type: _FLOATS["f16"], ir.BF16Type: None, ir.F32Type: _FLOATS["f32"],
    ir.F64Type: _FLOATS["f64"],
}


def numpy_dtype(element_type: ir.Type) -> np.dtype | None:
    """The numpy dtype of an MLIR element type, or None if bnfold cannot compute with it."""
    cls = type(element_type)
    if cls in _FLOAT_CLASSES:
        return _FLOAT_CLASSES[cls] or bfloat16()
    typeid = element_type.typeid  # a plain `ir.Type` of a float type
    if typeid in _FLOAT_TYPEIDS:
        return _FLOAT_TYPEIDS[typeid] or bfloat16()
    return _numpy_dtype(element_type)


def _numpy_dtype(element_type: ir.Type) -> np.dtype | None:
    name = str(element_type)
    if name in _FLOATS:
        return _FLOATS[name]
    if name == "bf16":
        return bfloat16()
    if name == "i1":
        return np.dtype(np.bool_)
    match = _INT_RE.match(name)
    if match and match.group(2) in ("4", "8", "16", "32", "64"):
        # i4 (quantized weights) computes as int8: MLIR keeps one element per byte too.
        width = "8" if match.group(2) == "4" else match.group(2)
        return np.dtype(("uint" if match.group(1) else "int") + width)
    return None


def is_float(element_type: ir.Type) -> bool:
    return type(element_type) in _FLOAT_CLASSES or element_type.typeid in _FLOAT_TYPEIDS


def tensor_type(value_or_type: ir.Value | ir.Type) -> ir.RankedTensorType | None:
    """The static ranked tensor type, or None (dynamic or unranked or not a tensor)."""
    ty = value_or_type.type if isinstance(value_or_type, ir.Value) else value_or_type
    if not isinstance(ty, ir.RankedTensorType):
        try:
            ty = ir.RankedTensorType(ty)
        except ValueError:
            return None
    if not ty.has_static_shape:
        return None
    return ty


def float_dtype(value_or_type: ir.Value | ir.Type) -> np.dtype | None:
    """The numpy dtype of a static float tensor, or None (another element type, dynamic)."""
    ty = tensor_type(value_or_type)
    if ty is None or not is_float(ty.element_type):
        return None
    return numpy_dtype(ty.element_type)


def ranked_type(value_or_type: ir.Value | ir.Type) -> ir.RankedTensorType | None:
    """The ranked tensor type (static or with symbolic dimensions), or None."""
    ty = value_or_type.type if isinstance(value_or_type, ir.Value) else value_or_type
    if isinstance(ty, ir.RankedTensorType):
        return ty
    try:
        return ir.RankedTensorType(ty)
    except ValueError:
        return None


def shape_of(ty: ir.RankedTensorType) -> tuple[int, ...]:
    """The shape with -1 for symbolic dimensions."""
    return tuple(-1 if ty.is_dynamic_dim(d) else ty.shape[d] for d in range(ty.rank))


def any_true(mask: np.ndarray) -> bool:
    """`mask.any()` of a boolean array, a fifth of its cost on a small one (no
    Python-level dispatch): the per-fold checks ask a dozen times a fold."""
    return bool(np.count_nonzero(mask))


def all_true(mask: np.ndarray) -> bool:
    """`mask.all()` of a boolean array (see `any_true`)."""
    return int(np.count_nonzero(mask)) == mask.size


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """Floats are evaluated in float64; integers and booleans keep their type."""
    return np.dtype(np.float64) if dtype.kind == "f" or is_bf16(dtype) else dtype


def read(attr: ir.Attribute) -> np.ndarray:
    """The elements of a dense attribute, as a compact array in compute dtype.

    Splats come back with every dimension 1; other attributes with their full
    shape. Raises ValueError for attributes bnfold cannot read.
    """
    dense = _dense(attr)
    if not isinstance(dense, ir.DenseElementsAttr):
        return dense.astype(compute_dtype(dense.dtype), copy=False)
    ty = ir.RankedTensorType(dense.type)
    dtype = numpy_dtype(ty.element_type)
    if dtype is None:
        raise ValueError(f"unsupported element type {ty.element_type}")
    rank = ty.rank
    if dense.is_splat:
        value = _splat_scalar(dense.get_splat_value(), dtype)
        return np.full((1,) * rank, value, dtype=compute_dtype(dtype))
    array = np.asarray(dense) if not is_bf16(dtype) else None
    if array is None or array.dtype == object or array.shape != tuple(ty.shape):
        array = _read_printed(str(dense), dtype, tuple(ty.shape))
    return array.astype(compute_dtype(dtype), copy=False)


def read_native(attr: ir.Attribute, *, compact: bool = False) -> np.ndarray:
    """Full-size elements in the attribute's own dtype (zero-copy when possible).

    With `compact`, a splat comes back as one element of the right rank
    (never expanded; see `bnfold.constants`).
    """
    dense = _dense(attr)
    if not isinstance(dense, ir.DenseElementsAttr):
        return dense
    ty = ir.RankedTensorType(dense.type)
    dtype = numpy_dtype(ty.element_type)
    if dtype is None:
        raise ValueError(f"unsupported element type {ty.element_type}")
    if not dense.is_splat and not is_bf16(dtype):
        array = np.asarray(dense)
        if array.dtype == dtype and array.shape == tuple(ty.shape):
            return array
    values = read(attr).astype(dtype)
    return values if compact else np.broadcast_to(values, tuple(ty.shape)).copy()


def _dense(attr: ir.Attribute) -> ir.DenseElementsAttr | np.ndarray:
    """`attr` as a dense attribute, or a `dense_resource`'s elements read from its blob.

    Raises ValueError for any other kind of attribute.
    """
    try:
        return ir.DenseElementsAttr(attr)
    except ValueError:
        pass
    try:
        resource = ir.DenseResourceElementsAttr(attr)
    except ValueError:
        raise ValueError(f"cannot read a constant of this kind: {str(attr)[:80]}") from None
    ty = ir.RankedTensorType(resource.type)
    dtype = numpy_dtype(ty.element_type)
    if dtype is None or not (dtype.kind in "fiub" or is_bf16(dtype)):
        raise ValueError(f"unsupported element type {ty.element_type}")
    raw = resource_blob(attr)
    count = math.prod(ty.shape)
    if dtype == np.bool_:
        array = np.frombuffer(raw, dtype=np.uint8).astype(np.bool_)
    else:
        array = np.frombuffer(raw, dtype=dtype)
    if array.size != count:
        raise ValueError(f"dense_resource blob holds {array.size} elements, "
                         f"its type {ty} needs {count}")
    return array.reshape(tuple(ty.shape))


def _splat_scalar(attr: ir.Attribute, dtype: np.dtype) -> float | int | bool:
    if dtype.kind == "f" or is_bf16(dtype):
        return ir.FloatAttr(attr).value
    if dtype == np.bool_:
        return bool(ir.IntegerAttr(attr).value)
    return ir.IntegerAttr(attr).value


_DECIMAL_RE = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)|true|false")


def _read_printed(text: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Parses `dense<...> : tensor<...>` as printed by MLIR."""
    body = text[text.index("<") + 1 : text.rindex("> :")]
    if body.startswith('"0x'):
        raw = bytes.fromhex(body[3:-1])
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    tokens = _DECIMAL_RE.findall(body)
    bits_dtype = np.dtype(f"uint{dtype.itemsize * 8}")
    out = np.empty(len(tokens), dtype=dtype)
    for i, token in enumerate(tokens):
        if token.startswith("0x"):
            out[i] = np.array(int(token, 16), dtype=bits_dtype).view(dtype)
        elif token in ("true", "false"):
            out[i] = token == "true"
        else:
            out[i] = float(token) if dtype.kind != "i" and dtype.kind != "u" else int(token)
    if out.size != int(np.prod(shape)):
        raise ValueError(f"cannot read constant of shape {shape}")
    return out.reshape(shape)


def element_type(dtype: np.dtype) -> ir.Type:
    """The MLIR float type of a numpy float dtype."""
    if is_bf16(dtype):
        return ir.BF16Type.get()
    if dtype.itemsize == 2:
        return ir.F16Type.get()
    return ir.F32Type.get() if dtype.itemsize == 4 else ir.F64Type.get()


def dense_attr(array: np.ndarray, element: ir.Type) -> ir.DenseElementsAttr:
    """A dense attribute of `element` type holding `array` rounded once to it."""
    dtype = numpy_dtype(element)
    assert dtype is not None and is_float(element)
    # np.ascontiguousarray would turn a 0-d array into shape (1,).
    rounded = np.array(array, dtype=dtype, order="C", copy=None)
    ty = ir.RankedTensorType.get(list(rounded.shape), element)
    if is_bf16(dtype):
        rounded = rounded.view(np.uint16)
    # numpy arrays are buffers; jaxlib's stubs only say `Buffer`.
    return ir.DenseElementsAttr.get(cast(Any, rounded), type=ty)


def array_attr(array: np.ndarray, ty: ir.RankedTensorType | None = None) -> ir.DenseElementsAttr:
    """`array` as a dense attribute: floats rounded once to `ty`'s (or their own)
    element type, integers and booleans as they are."""
    element = ty.element_type if ty is not None else None
    if element is not None and is_float(element):
        return dense_attr(array, element)
    if element is None and (array.dtype.kind == "f" or is_bf16(array.dtype)):
        return dense_attr(array, element_type(array.dtype))
    return ir.DenseElementsAttr.get(cast(Any, np.ascontiguousarray(array)), type=ty)
