"""The precision contract: when rounding a folded kernel is allowed.

A fold computes `K * s` in float64 and rounds it once to the kernel's storage
type. That is equivalent to the original only when

1. the rounded kernel is finite (an f16 kernel times the scale of a dead
   channel, `gamma / sqrt(0 + eps)`, easily overflows),
2. no nonzero weight rounds to zero, and no kernel is pushed wholly below the
   smallest normal number (`_below_normal`: its weights would keep a few bits), and
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

More rules govern what moves across the producer:

4. a forward-folded shift must not cancel (`shift_cancels`): `x @ (K*s) +
   (t @ K)` computes at the magnitude of `x*s` and subtracts a bias of the
   same size, where the original subtracted first. For a normalization `x*s +
   t` whose output has unit spread, that magnitude is about `|t|`, so the
   folded form loses about log2(1 + |t|) bits. Above `SHIFT_LIMIT` the shift
   stays as one add before the producer (the scale still folds) when t / s
   is a constant of the original (the `m` of `(x - m) / d`) or rounds to one
   within SHIFT_LIMIT units of roundoff (`kept_shift_rounds`); otherwise
   nothing folds;
5. a narrowing convert is a rounding that stays where the original has it: no
   scale or shift is moved across it (`bnfold.laws`, Precision.NARROWS);
6. a backward fold must not grow the producer's result past its type
   (`grown_result`): the folded producer computes `y * s` before the shift, where
   the original may have subtracted a mean first (an f16 result of 4e4 times 2).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from bnfold.elements import all_true, any_true
from bnfold.refusal import Code, Refusal

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

# Significand bits (with the implicit bit): how precisely a type stores a value;
# IEEE floats by size (dtype.name is slow: numpy computes it in Python).
_IEEE_SIGNIFICAND_BITS = {2: 11, 4: 24, 8: 53}
_BFLOAT16_SIGNIFICAND_BITS = 8

# A splat (or otherwise compact) kernel is expanded only up to this many
# elements; beyond, a fold must keep it a splat or refuse.
MAX_EXPANDED_ELEMENTS = 1 << 24


def significand_bits(dtype: np.dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return _IEEE_SIGNIFICAND_BITS.get(dtype.itemsize, 0)
    return _BFLOAT16_SIGNIFICAND_BITS if dtype.kind == "V" and dtype.name == "bfloat16" else 0


@functools.cache  # asked per fold (numpy's finfo is Python code)
def _finfo(dtype: np.dtype) -> Any:
    """numpy's finfo of a float dtype; ml_dtypes' for bfloat16 and the other narrow types."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.finfo(dtype)
    import ml_dtypes

    return ml_dtypes.finfo(dtype)


def largest(dtype: np.dtype) -> float:
    """The largest finite value of a float dtype (bfloat16 too)."""
    return float(_finfo(dtype).max)


def smallest_normal(dtype: np.dtype) -> float:
    """The smallest positive normal value of a float dtype (bfloat16 too)."""
    return float(_finfo(dtype).smallest_normal)


def same_exponent_range(wide: np.dtype, narrow: np.dtype) -> bool:
    """Whether `narrow` has the exponent range of `wide` (bf16 of f32): rounding to it then
    never overflows or flushes a value `wide` holds as a normal number."""
    def exponents(dtype: np.dtype) -> tuple[int, int]:
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            info = np.finfo(dtype)
            return int(info.minexp), int(info.maxexp)
        import ml_dtypes

        ml = ml_dtypes.finfo(dtype)
        return int(ml.minexp), int(ml.maxexp)

    return exponents(wide) == exponents(narrow)


def type_name(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    name = _TYPE_NAMES.get(dtype)
    if name is None:  # once per dtype: numpy computes dtype.name in Python (20 us a call)
        name = _TYPE_NAMES[dtype] = {"float16": "f16", "bfloat16": "bf16", "float32": "f32",
                                     "float64": "f64"}.get(dtype.name, str(dtype))
    return name


_TYPE_NAMES: dict[np.dtype, str] = {}


def unit_roundoff(dtype: np.dtype) -> float:
    return 2.0 ** -significand_bits(dtype)


class Rounded(NamedTuple):
    """A scaled kernel rounded to its storage type.

    `values` is the full array, or a 0-d array when the result is a splat.
    `worst_relative_rounding` is max |effective - exact| / |exact| over the
    nonzero exact products, where `effective` is the kernel the producer
    finally computes with (after a narrowing convert, if any).
    """

    values: np.ndarray
    splat: bool
    worst_relative_rounding: float


class Arena:
    """Memory for rounded kernels that only live until they become attributes.

    A backward fold copies its new kernels into attributes before the next fold
    is planned, so one pass can round every kernel into the same memory: its
    pages are touched once instead of once per kernel (fresh pages cost more
    than the arithmetic on a large model). `clear()` hands the memory out
    again: arrays taken before it must not be used after it.
    """

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint8)
        self._used = 0

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        start = -(-self._used // 64) * 64  # aligned for vector loads
        if start + size > self._buffer.size:
            # A new buffer; arrays already taken keep the old one alive.
            self._buffer = np.empty(max(size, 2 * self._buffer.size), dtype=np.uint8)
            start = 0
        self._used = start + size
        return self._buffer[start:start + size].view(dtype).reshape(shape)

    def clear(self) -> None:
        self._used = 0


def round_scaled(compact: np.ndarray, shape: tuple[int, ...], factor: np.ndarray,
                 storage: np.dtype, effective: np.dtype, *,
                 arena: Arena | None = None) -> Rounded | Refusal:
    """`kernel * factor` in float64, rounded once to `storage`, or why not.

    `compact` broadcasts to the kernel's `shape` (a splat is one element);
    `factor` broadcasts to it too. The result must also be exact enough once
    converted to `effective` (the producer's operand type). A large result is
    written into `arena` when one is given (see `Arena`).
    """
    size = math.prod(shape)
    if factor.size > 1 and all_true(factor == factor.flat[0]):
        factor = factor.reshape(-1)[:1].reshape((1,) * factor.ndim)  # a uniform scale
    if compact.shape != tuple(shape):
        product = compact.astype(np.float64) * factor
        if product.size == 1:
            return _finish(product.reshape(()), storage, effective, splat=True,
                           shrinks=_shrinks(factor))
        if size > MAX_EXPANDED_ELEMENTS:
            return Refusal(Code.LIMIT, f"the kernel is a splat or broadcast constant of {size} "
                           f"elements ({size * np.dtype(storage).itemsize / 2**30:.1f} GiB "
                           f"expanded) and the per-channel scale would expand it; refused to "
                           f"keep memory proportional to the input")
        compact = np.broadcast_to(compact, shape)
    if size <= ROUNDING_SAMPLE:  # small: one float64 product, every weight checked
        with np.errstate(all="ignore"):
            return _finish(np.multiply(compact, factor, dtype=np.float64), storage, effective,
                           splat=False, shrinks=_shrinks(factor))
    out = arena.take(tuple(shape), storage) if arena is not None else np.empty(shape, storage)
    return _blocks(compact, factor, out, effective)


# Elements per block: a block's output (1 MiB of f32) stays in cache while
# it is checked.
BLOCK_ELEMENTS = 1 << 18


def _blocks(kernel: np.ndarray, factor: np.ndarray, out: np.ndarray,
            effective: np.dtype) -> Rounded | Refusal:
    """Scales in float64 and rounds once into `out` (the storage type), block
    by block (in parallel when the kernel is large), checking each block while
    it is in cache."""
    storage = out.dtype
    factor = factor.reshape((1,) * (kernel.ndim - factor.ndim) + factor.shape)
    narrow = np.dtype(effective) != np.dtype(storage)
    # Where subnormals are kept, |K * s| > (smallest subnormal) / 2 whenever |s| > 1/2, so
    # only a smaller scale can round a weight the original kept to zero. Where XLA flushes
    # them (rule 2), any |s| < 1 can push a normal weight below the smallest normal number.
    flushed = flushed_below(effective)
    small = (_shrinks(factor) if flushed == smallest_normal(effective)
             else bool((np.abs(factor) <= 0.5).any()))

    def block(index: tuple[slice, ...]) -> tuple[float, bool]:
        """(largest |weight|, NaN or inf when one is not finite; some weight became
        zero) for one block."""
        part = out[index]
        # Overflow is a result the caller judges, not a warning; numpy's error
        # state is per thread, so the pool's threads set their own.
        with np.errstate(all="ignore"):
            # One ufunc: numpy widens both operands to float64 in its own small
            # buffers and rounds each product once into `part`.
            np.multiply(kernel[index], factor[_factor_index(factor, index)], out=part,
                        dtype=np.float64, casting="unsafe")
            final = part.astype(effective) if narrow else part
            if not small or final.size == 0:
                return _peak(final), False
            peak, smallest = _magnitudes(final)
            return peak, smallest < flushed

    with np.errstate(all="ignore"):
        results = _map(block, list(_block_indices(kernel.shape)))
        final = out if not narrow else out.astype(effective)
        peaks = [p for p, _ in results]
        peak = math.nan if any(math.isnan(p) for p in peaks) else max(peaks, default=0.0)
        if not math.isfinite(peak):
            bad = int(np.count_nonzero(~np.isfinite(final)))
            biggest = float(np.nanmax(np.abs(np.multiply(kernel, factor, dtype=np.float64))))
            return _overflow(effective, bad, biggest)
        if _shrinks(factor) and 0 < peak < smallest_normal(effective):  # rare: checked in full
            problem = _below_normal(np.multiply(kernel, factor, dtype=np.float64),
                                    final.astype(np.float64), effective)
            if problem is not None:
                return problem
        if any(zero for _, zero in results):
            original = kernel if not narrow else kernel.astype(effective)
            if not np.all(factor != 0):
                original = np.multiply(original, factor != 0)
            lost = int(np.count_nonzero((np.abs(original) >= flushed) & (original != 0)
                                        & (np.abs(final) < flushed)))
            if lost:
                return _underflow(effective, lost)
    return Rounded(out, False, _sampled_rounding(kernel, factor, final))


# Elements per piece of `_magnitudes`: its |x| temporary (256 KiB of f32) comes from
# malloc's free lists; a block-sized one (1 MiB per thread) stays in the process's peak.
PIECE_ELEMENTS = 1 << 16


def _magnitudes(values: np.ndarray) -> tuple[float, float]:
    """(max |values|, min |values|) of a C-contiguous block, piece by piece; (NaN, inf)
    when a value is NaN (a non-finite peak, as `_peak` says)."""
    flat = values.reshape(-1)
    peak, smallest = 0.0, math.inf
    for start in range(0, flat.size, PIECE_ELEMENTS):
        magnitude = np.abs(flat[start:start + PIECE_ELEMENTS])
        high = float(magnitude.max())
        if math.isnan(high):
            return math.nan, math.inf
        peak, smallest = max(peak, high), min(smallest, float(magnitude.min()))
    return peak, smallest


def _peak(values: np.ndarray) -> float:
    """max |values|: NaN or inf when one is not finite. max and min propagate inf
    and NaN, are vectorized (twice as fast as a sum) and work for bfloat16."""
    if values.size == 0:
        return 0.0
    high, low = float(values.max()), float(values.min())
    return math.nan if math.isnan(high) or math.isnan(low) else max(high, -low)


def _shrinks(factor: np.ndarray) -> bool:
    """Whether some scale is below 1 in magnitude: only then can a weight the original
    stored as a normal number become subnormal."""
    return any_true(np.abs(factor) < 1)


def _below_normal(exact: np.ndarray, final: np.ndarray, effective: np.dtype,
                  peak: float | None = None) -> Refusal | None:
    """Rule 2: a kernel the scale pushes wholly below the smallest normal number.

    Among the subnormals a weight errs by up to half their spacing, `u * tiny`
    (u the unit roundoff, tiny the smallest normal), however small it is. While
    the kernel has a normal weight that is at most `u * max|K*s|`, one unit of
    roundoff of the kernel's scale, as rounding any normal weight costs; a kernel
    whose every weight is below `tiny` (an f16 layer times scales of 2^-17) errs
    by up to `tiny / max|K*s|` times more, which the original, computing
    `K x` and then scaling the result, never did."""
    if peak is None:  # max |exact|
        peak = float(np.max(np.abs(exact), initial=0.0))
    tiny = smallest_normal(effective)
    if not 0 < peak < tiny:
        return None
    err = float(np.max(np.abs(final.reshape(-1) - exact.reshape(-1)), initial=0.0))
    if err <= unit_roundoff(effective) * peak:
        return None
    return Refusal(Code.PRECISION,
                   f"precision: the scale pushes the whole folded kernel below "
                   f"{type_name(effective)}'s smallest normal number {tiny:.3g} (largest "
                   f"|K*s| = {peak:.3g}), where weights keep fewer bits: they round by up to "
                   f"{err / peak:.1%} of the largest one (a normal kernel: "
                   f"{unit_roundoff(effective):.1e}). Keep the normalization, or store the "
                   f"kernel in a wider type")


def _block_indices(shape: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    """Index tuples of C-order blocks of about BLOCK_ELEMENTS elements covering `shape`."""
    if not shape or math.prod(shape) <= BLOCK_ELEMENTS:
        yield tuple(slice(None) for _ in shape)
        return
    inner = math.prod(shape[1:])
    if inner <= BLOCK_ELEMENTS:
        step = max(1, BLOCK_ELEMENTS // max(inner, 1))
        for i in range(0, shape[0], step):
            yield (slice(i, i + step),) + tuple(slice(None) for _ in shape[1:])
        return
    for i in range(shape[0]):
        for rest in _block_indices(shape[1:]):
            yield (slice(i, i + 1),) + rest


def _factor_index(factor: np.ndarray, index: tuple[slice, ...]) -> tuple[slice, ...]:
    return tuple(s if factor.shape[d] > 1 else slice(None) for d, s in enumerate(index))


def _workers() -> int:
    """Threads for kernel scaling: BNFOLD_NUM_THREADS, else the usable cores (at most 4)."""
    configured = os.environ.get("BNFOLD_NUM_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(4, cores or 1)


_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None


def _map(fn: Callable[[tuple[slice, ...]], _T], items: list[tuple[slice, ...]]) -> list[_T]:
    """`fn` over `items`, on a few threads when there are enough (numpy releases
    the GIL in its loops; the result does not depend on the order)."""
    global _pool
    workers = _workers()
    if workers < 2 or len(items) < 4:
        return [fn(item) for item in items]
    if _pool is None:
        # Imported here: a small model never needs it (start-up time).
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bnfold-kernel")
    return list(_pool.map(fn, items))


# Weights examined for the reported rounding (evenly strided beyond this).
ROUNDING_SAMPLE = 1 << 12


def _sampled_rounding(kernel: np.ndarray, factor: np.ndarray, final: np.ndarray) -> float:
    """max |final - K*s| / |K*s| over all weights, or an evenly strided sample of
    `ROUNDING_SAMPLE` of them for larger kernels (the finiteness and
    lost-weight checks always cover every weight)."""
    size = final.size
    if size == 0:
        return 0.0
    if size <= ROUNDING_SAMPLE:
        exact = np.multiply(kernel, factor, dtype=np.float64).reshape(-1)
        got = final.astype(np.float64).reshape(-1)
    else:
        step = -(-size // ROUNDING_SAMPLE)
        position = np.arange(0, size, step)
        # The factor at each sampled position, from its (few) varying axes.
        factor = factor.reshape((1,) * (final.ndim - factor.ndim) + factor.shape)
        inner = np.cumprod((final.shape[1:] + (1,))[::-1])[::-1]
        where = tuple((position // inner[d]) % final.shape[d] if factor.shape[d] > 1 else 0
                      for d in range(final.ndim))
        flat_kernel = kernel.reshape(-1) if kernel.flags.c_contiguous else None
        sampled = flat_kernel[::step] if flat_kernel is not None else \
            kernel[np.unravel_index(position, final.shape)]
        exact = np.multiply(sampled, factor[where], dtype=np.float64)
        got = final.reshape(-1)[::step].astype(np.float64)
    with np.errstate(all="ignore"):
        rel = np.abs(got - exact) / np.abs(exact)  # 0/0 is NaN, ignored by fmax
    worst = float(np.fmax.reduce(rel))
    return 0.0 if math.isnan(worst) else worst


def _overflow(effective: np.dtype, bad: int, biggest: float) -> Refusal:
    return Refusal(Code.PRECISION,
                   f"precision: the folded kernel overflows {type_name(effective)} in {bad} "
                   f"weight(s) (largest |K*s| = {biggest:.3g}); a channel with variance ~0 "
                   f"(a dead channel) has a huge scale. Keep the normalization, or store the "
                   f"kernel in a wider type")


def _underflow(effective: np.dtype, lost: int) -> Refusal:
    what = "round to zero or to a subnormal number, which XLA flushes to zero," \
        if type_name(effective) in _FLUSHED else "round to zero"
    return Refusal(Code.PRECISION,
                   f"precision: {lost} nonzero weight(s) of the folded kernel {what} in "
                   f"{type_name(effective)} (the scale is tiny); keep the normalization")


# Types whose subnormal numbers XLA flushes to zero (CPU sets FTZ/DAZ; GPUs flush f32):
# a weight that lands there is a weight rounded to zero (rule 2). f16 is computed
# through f32 on CPU, where its subnormals are normal numbers: kept.
_FLUSHED = frozenset({"f32", "f64", "bf16"})


@functools.cache  # asked per fold (numpy's finfo is Python code)
def flushed_below(dtype: np.dtype) -> float:
    """The magnitude below which a weight of `dtype` is zero where the model runs: the
    smallest normal number for types whose subnormals XLA flushes, else the smallest
    subnormal (only an exact zero is zero)."""
    if type_name(dtype) in _FLUSHED:
        return smallest_normal(dtype)
    return float(_finfo(dtype).smallest_subnormal)


def _finish(exact: np.ndarray, storage: np.dtype, effective: np.dtype, *,
             splat: bool, shrinks: bool) -> Rounded | Refusal:
    with np.errstate(all="ignore"):
        result = _check(np.asarray(exact, dtype=np.float64).reshape(-1), storage, effective,
                        shrinks)
    if isinstance(result, Refusal):
        return result
    stored, worst = result
    return Rounded(stored.reshape(np.shape(exact)), splat, worst)


def _check(exact: np.ndarray, storage: np.dtype, effective: np.dtype, shrinks: bool
           ) -> tuple[np.ndarray, float] | Refusal:
    """Rounds a small 1-D array of exact products; (stored, worst rounding) or the violation."""
    stored = exact.astype(storage)
    final = stored if np.dtype(effective) == np.dtype(storage) else stored.astype(effective)
    final64 = final.astype(np.float64)
    if not all_true(np.isfinite(final64)):
        return _overflow(effective, int(np.count_nonzero(~np.isfinite(final64))),
                         float(np.nanmax(np.abs(exact))))
    flushed = flushed_below(effective)
    final_magnitude = np.abs(final64)
    if final_magnitude.size and float(final_magnitude.min()) < flushed:  # else none is lost
        lost = int(np.count_nonzero((exact != 0) & (final_magnitude < flushed)))
        if lost:
            return _underflow(effective, lost)
    magnitude = np.abs(exact)
    if shrinks and (problem := _below_normal(exact, final64, effective,
                                             float(magnitude.max(initial=0.0)))):
        return problem
    rel = np.abs(final64 - exact) / magnitude
    worst = float(np.fmax.reduce(rel)) if rel.size else 0.0
    return stored, 0.0 if math.isnan(worst) else worst


def narrow_kernel_reason(kernel: np.dtype, compute: np.dtype, producer: str) -> Refusal:
    """Why a kernel narrower than the computation cannot absorb the scale."""
    k, c = type_name(kernel), type_name(compute)
    return Refusal(Code.PRECISION,
                   f"precision: the kernel is stored as {k} but the {producer} result and the "
                   f"normalization are computed in {c}; folding would round the {c} scale into "
                   f"{k} weights (relative error up to {unit_roundoff(kernel):.1e} instead of "
                   f"{unit_roundoff(compute):.1e}). Keep the normalization, or keep the weights "
                   f"in {c} behind a convert")


def check_bias(shift: np.ndarray, dtype: np.dtype, what: str = "the folded bias") -> Refusal | None:
    """Why the new bias (or another new constant) cannot be stored in `dtype`, or None."""
    with np.errstate(all="ignore"):
        rounded = shift.astype(dtype).astype(np.float64)
    if not all_true(np.isfinite(rounded)):
        return Refusal(Code.PRECISION, f"precision: {what} overflows {type_name(dtype)}")
    return None


# A forward-folded shift costs about log2(1 + |t|) bits against the original: measured
# on random f32 convolutions, err(folded) <= 1.5 err(original) + (1 + |t|) ulps, and the
# plain "+ 1 ulp" already fails at |t| = 2 (docs/precision.md). Standard
# image normalizations have |t| <= 2.2 and fold; raw-data ones (|t| of 10^2 and more)
# keep the shift before the producer. At most 2 bits:
SHIFT_LIMIT = 3.0


def shift_cancels(shift: np.ndarray) -> Refusal | None:
    """Why folding `shift` (in units of the normalized spread) past a producer would cancel."""
    worst = float(np.max(np.abs(shift))) if shift.size else 0.0
    if worst <= SHIFT_LIMIT:
        return None
    return Refusal(Code.CANCELS,
                   f"precision: the shift is up to {worst:.3g} normalized units; folded past the "
                   f"producer it would be computed at that magnitude and cancel about "
                   f"{math.log2(1 + worst):.1f} bits that the original keeps (its limit is "
                   f"|t| <= {SHIFT_LIMIT:g}, {math.log2(1 + SHIFT_LIMIT):.1f} bits)")


def kept_shift_rounds(kept: np.ndarray, scale: np.ndarray, dtype: np.dtype) -> Refusal | None:
    """Why the shift t / s cannot stay as one add before the producer in `dtype`.

    The original computes x * s + t (or (x - m) / d) at the normalized spread; the kept
    form adds round(t / s) to x. Rounding t / s errs by up to |t| u in normalized units:
    nothing when t / s is the original's own constant (-m of (x - m) / d), |t| ulps when
    it is new (x * s + t with a large t). Allowed as much as a folded shift
    (`SHIFT_LIMIT` units of roundoff)."""
    stored = kept.astype(dtype).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        err = float(np.max(np.abs(stored - kept) * np.abs(scale), initial=0.0))
    if err <= SHIFT_LIMIT * unit_roundoff(dtype):
        return None
    return Refusal(Code.CANCELS,
                   f"precision: t / s is not a constant of the original, and rounded to "
                   f"{type_name(dtype)} it would move the normalized values by up to {err:.2g} "
                   f"(the limit is {SHIFT_LIMIT:g} units of roundoff)")


# Where a range must be known: a value lies within mean +- RANGE_SIGMAS spread of the
# batch norm that describes it.
RANGE_SIGMAS = 8.0
# A value nothing bounds (no statistics, no clamp) is assumed below this in the
# wide-exponent types; f16 has no such assumption (growth there needs a known bound).
ASSUMED_BOUND = {"f32": 2.0 ** 64, "bf16": 2.0 ** 64, "f64": 2.0 ** 512}


# A folded result may exceed what the original computes by this fraction of its type's
# range: it then overflows only where the original's own value is within that of
# overflowing too (a conv bias times a BN scale is far below it; a mean of 4e4 in f16 is not).
RESULT_MARGIN = 1 / 16


def grown_result(scale: np.ndarray, overshoot: np.ndarray | None, bound: Callable[[], np.ndarray | None],
                 dtype: np.dtype, producer: str) -> Refusal | None:
    """Rule 6: why the folded producer's result `y * s` could overflow `dtype` where the
    original's values do not, or None.

    The original computes `y * s + t'` itself once its last scaling step has run (`t'`
    the shift added by then: the bias times the scale of `(y + b) * s`, or `-m * s` of
    `(y - m) * s`), so `|y * s|` exceeds a value the original computes by at most
    `overshoot = |t'|`; None when that value is not in `dtype` (a convert came first).
    Within `RESULT_MARGIN` of the type's range it may grow; beyond, `bound()` (max
    |y * s| from the batch norm's statistics, mean +- `RANGE_SIGMAS` spread) must stay
    within the type, or, without statistics, `ASSUMED_BOUND` times the scale (f16 has
    none)."""
    grows = np.abs(scale) > 1
    if not any_true(grows):
        return None
    name, top = type_name(dtype), largest(dtype)
    if overshoot is not None and all_true(overshoot[grows] <= RESULT_MARGIN * top):
        return None
    known = bound()
    if known is not None:
        grown = np.where(grows, known, 0.0)
        worst = int(np.argmax(grown))
        if grown[worst] <= top:
            return None
        return Refusal(Code.RANGE,
                       f"range: the folded {producer} computes its result times the scale "
                       f"before the shift is added: channel {worst} (scale "
                       f"{scale[worst]:.3g}) reaches {grown[worst]:.3g} (its batch norm's mean "
                       f"+- {RANGE_SIGMAS:g} sigma), beyond {name}'s {top:g}, where the "
                       f"original's values stay within it. Keep the normalization")
    assumed = ASSUMED_BOUND.get(name)
    if assumed is not None and assumed * float(np.max(np.abs(scale))) <= top:
        return None  # the wide types' documented assumption about unbounded values
    why = (f"the original has added up to {float(np.max(overshoot[grows])):.3g} by the time it "
           f"has scaled, so the folded result can exceed the original's values by that much"
           if overshoot is not None else
           "the original scales in another type (after a convert)")
    return Refusal(Code.RANGE,
                   f"range: the folded {producer} computes its result times the scale (up to "
                   f"{float(np.max(np.abs(scale))):.3g}x) before the shift is added; {why}, and "
                   f"nothing bounds its {name} result (the chain has no batch-norm statistics: no "
                   f"variance under an rsqrt, no batch_norm_inference); {name} overflows at "
                   f"{top:g}. Keep the normalization, or compute the layer in f32")


def is_narrower(kernel: np.dtype, compute: np.dtype) -> bool:
    return significand_bits(kernel) < significand_bits(compute)


__all__ = ["ASSUMED_BOUND", "MAX_EXPANDED_ELEMENTS", "RANGE_SIGMAS", "SHIFT_LIMIT", "Rounded",
           "RESULT_MARGIN", "check_bias", "grown_result", "is_narrower", "kept_shift_rounds",
           "largest", "narrow_kernel_reason", "round_scaled", "shift_cancels", "significand_bits",
           "smallest_normal", "type_name"]
