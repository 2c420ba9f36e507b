"""The precision contract: when rounding a folded kernel is allowed.

A fold computes `K * s` in float64 and rounds it once to the kernel's storage
type. That is equivalent to the original only when

1. the rounded kernel is finite (an f16 kernel times the scale of a dead
   channel, `gamma / sqrt(0 + eps)`, easily overflows),
2. no nonzero weight rounds to zero, and
3. the kernel is stored at least as precisely as the normalization is
   computed: rounding an f32 scale into bf16 weights (a `bf16 x bf16 -> f32`
   dot_general, JAX's `preferred_element_type`) adds a bf16 rounding the
   original never made. When the kernel is `convert(f32 constant)`, the f32
   source is scaled instead and the convert rounds once, where the original
   rounded; otherwise the fold is refused.

Under these rules the folded module's error against a float64 evaluation of
the original stays within 1.5x the original's own error plus one ulp of the
output type, which the property suite measures. Each fold reports the
kernel's worst relative rounding against float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Significand bits (with the implicit bit): how precisely a type stores a value.
_SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}

# A splat (or otherwise compact) kernel is expanded only up to this many
# elements; beyond, a fold must keep it a splat or refuse.
MAX_EXPANDED_ELEMENTS = 1 << 24
# Elements per block when scaling a kernel (float64 temporaries stay in cache).
_BLOCK = 1 << 16


def significand_bits(dtype: np.dtype) -> int:
    return _SIGNIFICAND_BITS.get(np.dtype(dtype).name, 0)


def type_name(dtype: np.dtype) -> str:
    return {"float16": "f16", "bfloat16": "bf16", "float32": "f32",
            "float64": "f64"}.get(np.dtype(dtype).name, str(dtype))


def unit_roundoff(dtype: np.dtype) -> float:
    return 2.0 ** -significand_bits(dtype)


@dataclass(frozen=True)
class Rounded:
    """A scaled kernel rounded to its storage type.

    `values` is the full array, or a 0-d array when the result is a splat.
    `worst_relative_rounding` is max |effective - exact| / |exact| over the
    nonzero exact products, where `effective` is the kernel the producer
    finally computes with (after a narrowing convert, if any).
    """

    values: np.ndarray
    splat: bool
    worst_relative_rounding: float


def round_scaled(compact: np.ndarray, shape: tuple[int, ...], factor: np.ndarray,
                 storage: np.dtype, effective: np.dtype) -> Rounded | str:
    """`kernel * factor` in float64, rounded once to `storage`, or why not.

    `compact` broadcasts to the kernel's `shape` (a splat is one element);
    `factor` broadcasts to it too. The result must also be exact enough once
    converted to `effective` (the producer's operand type).
    """
    size = math.prod(shape)
    if factor.size > 1 and np.all(factor == factor.flat[0]):
        factor = factor.reshape(-1)[:1].reshape((1,) * factor.ndim)  # a uniform scale
    if compact.shape != tuple(shape):
        product = compact.astype(np.float64) * factor
        if product.size == 1:
            return _finish(product.reshape(()), storage, effective, splat=True)
        if size > MAX_EXPANDED_ELEMENTS:
            return (f"the kernel is a splat or broadcast constant of {size} elements "
                    f"({size * np.dtype(storage).itemsize / 2**30:.1f} GiB expanded) and the "
                    f"per-channel scale would expand it; refused to keep memory proportional "
                    f"to the input")
        compact = np.broadcast_to(compact, shape)
    return _blocks(compact, factor, storage, effective)


def _blocks(kernel: np.ndarray, factor: np.ndarray, storage: np.dtype,
            effective: np.dtype) -> Rounded | str:
    if kernel.ndim == 0:
        return _finish(np.multiply(kernel, factor, dtype=np.float64), storage, effective,
                       splat=False)
    out = np.empty(kernel.shape, dtype=storage)
    factor = np.broadcast_to(factor, (1,) * (kernel.ndim - factor.ndim) + factor.shape)
    rows = kernel.shape[0]
    per_row = max(1, math.prod(kernel.shape[1:]))
    step = max(1, _BLOCK // per_row)
    worst = 0.0
    for start in range(0, rows, step):
        block = slice(start, start + step)
        exact = np.multiply(kernel[block], factor[block] if factor.shape[0] > 1 else factor,
                            dtype=np.float64)
        result = _check(exact, storage, effective)
        if isinstance(result, str):
            return result
        out[block], block_worst = result
        worst = max(worst, block_worst)
    return Rounded(out, False, worst)


def _finish(exact: np.ndarray, storage: np.dtype, effective: np.dtype, *,
             splat: bool) -> Rounded | str:
    result = _check(np.asarray(exact, dtype=np.float64), storage, effective)
    if isinstance(result, str):
        return result
    stored, worst = result
    return Rounded(np.asarray(stored), splat, worst)


def _check(exact: np.ndarray, storage: np.dtype, effective: np.dtype
           ) -> tuple[np.ndarray, float] | str:
    """Rounds one block; returns (stored, worst relative rounding) or the violation."""
    with np.errstate(all="ignore"):
        stored = exact.astype(storage)
        final = stored if np.dtype(effective) == np.dtype(storage) else stored.astype(effective)
        final64 = final.astype(np.float64)
        if not np.all(np.isfinite(final64)):
            bad = int(np.count_nonzero(~np.isfinite(final64)))
            biggest = float(np.max(np.abs(exact[np.isfinite(exact)]), initial=0.0))
            return (f"precision: the folded kernel overflows {type_name(effective)} in {bad} "
                    f"weight(s) (largest |K*s| = {biggest:.3g}); a channel with variance ~0 "
                    f"(a dead channel) has a huge scale. Keep the normalization, or store the "
                    f"kernel in a wider type")
        nonzero = exact != 0
        lost = int(np.count_nonzero(nonzero & (final64 == 0)))
        if lost:
            return (f"precision: {lost} nonzero weight(s) of the folded kernel round to zero in "
                    f"{type_name(effective)} (the scale is tiny); keep the normalization")
        if not np.any(nonzero):
            return stored, 0.0
        rel = np.abs(final64[nonzero] - exact[nonzero]) / np.abs(exact[nonzero])
    return stored, float(np.max(rel))


def narrow_kernel_reason(kernel: np.dtype, compute: np.dtype, producer: str) -> str:
    """Why a kernel narrower than the computation cannot absorb the scale."""
    k, c = type_name(kernel), type_name(compute)
    return (f"precision: the kernel is stored as {k} but the {producer} result and the "
            f"normalization are computed in {c}; folding would round the {c} scale into {k} "
            f"weights (relative error up to {unit_roundoff(kernel):.1e} instead of "
            f"{unit_roundoff(compute):.1e}). Keep the normalization, or keep the weights in "
            f"{c} behind a convert")


def check_bias(shift: np.ndarray, dtype: np.dtype) -> str | None:
    """Why the new bias cannot be stored in the output type, or None."""
    with np.errstate(all="ignore"):
        rounded = shift.astype(dtype).astype(np.float64)
    if not np.all(np.isfinite(rounded)):
        return f"precision: the folded bias overflows {type_name(dtype)}"
    return None


def is_narrower(kernel: np.dtype, compute: np.dtype) -> bool:
    return significand_bits(kernel) < significand_bits(compute)


__all__ = ["MAX_EXPANDED_ELEMENTS", "Rounded", "check_bias", "is_narrower",
           "narrow_kernel_reason", "round_scaled", "significand_bits", "type_name"]
