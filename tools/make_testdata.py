#!/usr/bin/env python3
"""Generate hand-built StableHLO test modules that contain ``stablehlo.batch_norm_inference``.

Every module is written as MLIR text to ``<out>/<name>.mlir`` and holds one public
``func.func @main`` whose arguments are the activations only; every parameter (kernel, bias,
scale, offset, mean, variance) is a ``stablehlo.constant`` printed as ``dense<"0x...">``, the
little-endian raw bytes of the tensor, so f32, f64, f16 and bf16 are all written exactly.
The deliberate exceptions are the ``nofold_*`` cases, where a parameter is an argument on
purpose. ``<out>/manifest.json`` lists every file with a description, whether the batch norm
in it must fold (``foldable``), its dtype, why it must not fold (``reason``), the producer op
kind and how many batch norms are expected to fold (``num_folds``).

Output is deterministic: each case draws its values from its own generator seeded with the
CRC-32 of its name, so adding or reordering cases does not change the others.

Parameter distributions: kernel and bias ~ N(0, 0.3), scale (gamma) ~ U(0.5, 1.5),
offset (beta) ~ N(0, 0.3), mean ~ N(0, 0.5), variance ~ U(0.5, 2.0). The ``epsilon``
attribute is always ``f32``, whatever the operand dtype.

``--verify`` checks every module after writing it:
  1. it parses (and verifies) with jaxlib's MLIR bindings;
  2. it compiles and runs on XLA CPU with deterministic random inputs;
  3. its outputs match an independent float64 reference: ``jax.lax.conv_general_dilated``
     (window reversal applied by flipping the kernel) for convolutions, ``numpy.einsum`` for
     ``dot_general`` and numpy for batch norm, within a per-dtype tolerance.

Usage::

    python tools/make_testdata.py                # writes testdata/*.mlir and manifest.json
    python tools/make_testdata.py --verify       # ... and checks every module
    python tools/make_testdata.py --out /tmp/td --only conv2d_nhwc_bn --verify
    python tools/make_testdata.py --list
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent

DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}

# Relative tolerance per dtype for --verify, measured against max|reference| of each output:
# |xla - ref| <= rtol * (|ref| + max|ref|).
TOLERANCES: dict[str, float] = {"f64": 1e-10, "f32": 1e-4, "f16": 5e-3, "bf16": 4e-2}


# --------------------------------------------------------------------------------------------
# Values and the text builder
# --------------------------------------------------------------------------------------------


def tensor_type(shape: Sequence[int], dtype: str) -> str:
    dims = "x".join(str(d) for d in shape)
    return f"tensor<{dims}x{dtype}>" if dims else f"tensor<{dtype}>"


def hex_literal(arr: np.ndarray) -> str:
    """``"0x..."`` of the little-endian raw bytes of ``arr`` (all elements, row-major)."""
    arr = np.ascontiguousarray(arr)
    if sys.byteorder != "little" and arr.dtype.itemsize > 1:
        arr = arr.byteswap()
    return '"0x' + arr.tobytes().hex().upper() + '"'


def float_literal(value: float) -> str:
    """A float literal MLIR accepts (it needs a '.' or the exponent form with a mantissa dot)."""
    return f"{value:.6e}"


@dataclasses.dataclass
class Value:
    """An SSA value: its name, type and a lazy float64 reference of its contents."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    ref: Callable[[], np.ndarray]

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)


RESULT_TYPE = "@RESULT_TYPE@"  # placeholder for the result type in _op's text


def _lazy(fn: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    return functools.lru_cache(maxsize=None)(fn)


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """Convolution attributes. ``lhs``/``rhs``/``out`` are dim-number strings, one character
    per dimension: ``b``/``f`` (lhs, out), ``i``/``o`` (rhs) and the spatial index ``0``..``9``."""

    lhs: str
    rhs: str
    out: str
    stride: tuple[int, ...] | None = None
    pad: tuple[tuple[int, int], ...] | None = None
    lhs_dilate: tuple[int, ...] | None = None
    rhs_dilate: tuple[int, ...] | None = None
    reverse: tuple[bool, ...] | None = None
    feature_group_count: int = 1
    batch_group_count: int = 1

    @property
    def rank(self) -> int:
        return len(self.lhs) - 2

    def filled(self) -> ConvSpec:
        n = self.rank
        return dataclasses.replace(
            self,
            stride=self.stride or (1,) * n,
            pad=self.pad or ((0, 0),) * n,
            lhs_dilate=self.lhs_dilate or (1,) * n,
            rhs_dilate=self.rhs_dilate or (1,) * n,
            reverse=self.reverse or (False,) * n,
        )


def layout_shape(layout: str, sizes: dict[str, int], spatial: Sequence[int]) -> tuple[int, ...]:
    """Physical shape for a dim-number string given the logical sizes."""
    return tuple(spatial[int(c)] if c.isdigit() else sizes[c] for c in layout)


def conv_output_shape(x_shape, k_shape, spec: ConvSpec) -> tuple[int, ...]:
    s = spec.filled()
    n = x_shape[s.lhs.index("b")]
    c = x_shape[s.lhs.index("f")]
    o = k_shape[s.rhs.index("o")]
    fgc, bgc = s.feature_group_count, s.batch_group_count
    assert fgc == 1 or bgc == 1, "feature_group_count and batch_group_count cannot both be > 1"
    assert c % fgc == 0 and k_shape[s.rhs.index("i")] == c // fgc, (x_shape, k_shape, s)
    assert o % fgc == 0 and o % bgc == 0 and n % bgc == 0, (x_shape, k_shape, s)
    spatial = []
    for d in range(s.rank):
        size = x_shape[s.lhs.index(str(d))]
        win = k_shape[s.rhs.index(str(d))]
        lo, hi = s.pad[d]
        dilated_in = (size - 1) * s.lhs_dilate[d] + 1 + lo + hi
        dilated_win = (win - 1) * s.rhs_dilate[d] + 1
        assert dilated_in >= dilated_win, (x_shape, k_shape, s)
        spatial.append((dilated_in - dilated_win) // s.stride[d] + 1)
    return layout_shape(s.out, {"b": n // bgc, "f": o}, spatial)


def conv_reference(x: np.ndarray, k: np.ndarray, spec: ConvSpec) -> np.ndarray:
    """float64 reference via jax.lax.conv_general_dilated (needs jax_enable_x64)."""
    import jax.numpy as jnp
    from jax import lax

    s = spec.filled()
    spatial = [str(d) for d in range(s.rank)]
    for d, rev in enumerate(s.reverse):
        if rev:  # window reversal == correlating with a kernel flipped along that axis
            k = np.flip(k, axis=s.rhs.index(str(d)))
    dn = lax.ConvDimensionNumbers(
        lhs_spec=tuple(s.lhs.index(c) for c in ["b", "f", *spatial]),
        rhs_spec=tuple(s.rhs.index(c) for c in ["o", "i", *spatial]),
        out_spec=tuple(s.out.index(c) for c in ["b", "f", *spatial]),
    )
    xa, ka = jnp.asarray(x, jnp.float64), jnp.asarray(np.ascontiguousarray(k), jnp.float64)
    assert xa.dtype == np.float64, "conv_reference needs jax_enable_x64"
    y = lax.conv_general_dilated(
        xa, ka,
        window_strides=s.stride,
        padding=[tuple(p) for p in s.pad],
        lhs_dilation=s.lhs_dilate,
        rhs_dilation=s.rhs_dilate,
        dimension_numbers=dn,
        feature_group_count=s.feature_group_count,
        batch_group_count=s.batch_group_count,
        precision=lax.Precision.HIGHEST,
    )
    return np.asarray(y, np.float64)


def dot_general_shape_and_einsum(lhs_shape, rhs_shape, lb, rb, lc, rc):
    """Result shape and einsum equation of stablehlo.dot_general:
    result dims = batching dims, then lhs free dims, then rhs free dims (each in order)."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs_l = [""] * len(lhs_shape)
    rhs_l = [""] * len(rhs_shape)
    for a, b in zip(lb, rb):
        assert lhs_shape[a] == rhs_shape[b]
        lhs_l[a] = rhs_l[b] = next(letters)
    for a, b in zip(lc, rc):
        assert lhs_shape[a] == rhs_shape[b]
        lhs_l[a] = rhs_l[b] = next(letters)
    lfree = [i for i in range(len(lhs_shape)) if not lhs_l[i]]
    rfree = [i for i in range(len(rhs_shape)) if not rhs_l[i]]
    for i in lfree:
        lhs_l[i] = next(letters)
    for i in rfree:
        rhs_l[i] = next(letters)
    out_l = [lhs_l[a] for a in lb] + [lhs_l[i] for i in lfree] + [rhs_l[i] for i in rfree]
    shape = tuple([lhs_shape[a] for a in lb] + [lhs_shape[i] for i in lfree]
                  + [rhs_shape[i] for i in rfree])
    return shape, f"{''.join(lhs_l)},{''.join(rhs_l)}->{''.join(out_l)}"


def _ilist(xs) -> str:
    return "[" + ", ".join(str(int(v)) for v in xs) + "]"


class Builder:
    """Builds the text of one module with a single public ``func.func @main``."""

    def __init__(self, name: str, dtype: str = "f32"):
        self.name = name
        self.dtype = dtype
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.args: list[Value] = []
        self.inputs: list[np.ndarray] = []
        self.lines: list[str] = []
        self._count = 0

    # -- values ------------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"%{prefix}{self._count}"

    def _cast(self, data, dtype: str) -> np.ndarray:
        return np.asarray(data, np.float64).astype(DTYPES[dtype])

    def arg(self, shape, data=None, dtype: str | None = None) -> Value:
        """A function argument; ``data`` (default N(0, 1)) is the input used by --verify."""
        dtype = dtype or self.dtype
        shape = tuple(shape)
        if data is None:
            data = self.rng.standard_normal(shape)
        arr = self._cast(data, dtype)
        assert arr.shape == shape
        ref = arr.astype(np.float64)
        v = Value(f"%arg{len(self.args)}", shape, dtype, lambda: ref)
        self.args.append(v)
        self.inputs.append(arr)
        return v

    def const(self, data, prefix: str = "cst", dtype: str | None = None) -> Value:
        dtype = dtype or self.dtype
        arr = self._cast(data, dtype)
        ref = arr.astype(np.float64)
        v = Value(self._fresh(prefix), arr.shape, dtype, lambda: ref)
        assert arr.size >= 2, "use splat() for one-element constants"
        self.lines.append(f"{v.name} = stablehlo.constant dense<{hex_literal(arr)}> : {v.type}")
        return v

    def splat(self, value: float, shape, dtype: str | None = None) -> Value:
        dtype = dtype or self.dtype
        shape = tuple(shape)
        ref = np.full(shape, float(self._cast(value, dtype)))
        v = Value(self._fresh("splat"), shape, dtype, lambda: ref)
        self.lines.append(
            f"{v.name} = stablehlo.constant dense<{float_literal(value)}> : {v.type}")
        return v

    # random parameters -----------------------------------------------------------------------
    def kernel(self, shape) -> Value:
        return self.const(self.rng.normal(0.0, 0.3, shape), "kernel")

    def bias(self, n: int) -> Value:
        return self.const(self.rng.normal(0.0, 0.3, (n,)), "bias")

    def bn_params(self, n: int) -> dict[str, np.ndarray]:
        return {
            "scale": self.rng.uniform(0.5, 1.5, (n,)),
            "offset": self.rng.normal(0.0, 0.3, (n,)),
            "mean": self.rng.normal(0.0, 0.5, (n,)),
            "variance": self.rng.uniform(0.5, 2.0, (n,)),
        }

    # ops -------------------------------------------------------------------------------------
    def _op(self, prefix: str, shape, text: str, ref: Callable[[], np.ndarray],
            dtype: str | None = None) -> Value:
        v = Value(self._fresh(prefix), tuple(shape), dtype or self.dtype, _lazy(ref))
        self.lines.append(f"{v.name} = " + text.replace(RESULT_TYPE, v.type))
        return v

    def conv(self, x: Value, k: Value, spec: ConvSpec) -> Value:
        s = spec.filled()
        out_shape = conv_output_shape(x.shape, k.shape, s)
        window = (
            f"stride = {_ilist(s.stride)}, "
            f"pad = [{', '.join(_ilist(p) for p in s.pad)}], "
            f"lhs_dilate = {_ilist(s.lhs_dilate)}, rhs_dilate = {_ilist(s.rhs_dilate)}, "
            f"reverse = [{', '.join('true' if r else 'false' for r in s.reverse)}]"
        )
        text = (
            f"stablehlo.convolution({x.name}, {k.name}) "
            f"dim_numbers = [{', '.join(s.lhs)}]x[{', '.join(s.rhs)}]->[{', '.join(s.out)}], "
            f"window = {{{window}}} "
            f"{{batch_group_count = {s.batch_group_count} : i64, "
            f"feature_group_count = {s.feature_group_count} : i64}} "
            f": ({x.type}, {k.type}) -> @RESULT_TYPE@"
        )
        return self._op("conv", out_shape, text, lambda: conv_reference(x.ref(), k.ref(), s))

    def dot_general(self, lhs: Value, rhs: Value, *, contracting, batching=((), ())) -> Value:
        (lb, rb), (lc, rc) = batching, contracting
        shape, eq = dot_general_shape_and_einsum(lhs.shape, rhs.shape, lb, rb, lc, rc)
        dims = f"contracting_dims = {_ilist(lc)} x {_ilist(rc)}"
        if lb:
            dims = f"batching_dims = {_ilist(lb)} x {_ilist(rb)}, " + dims
        text = (f"stablehlo.dot_general {lhs.name}, {rhs.name}, {dims} "
                f": ({lhs.type}, {rhs.type}) -> @RESULT_TYPE@")
        return self._op("dot", shape, text, lambda: np.einsum(eq, lhs.ref(), rhs.ref()))

    def broadcast_in_dim(self, v: Value, shape, dims) -> Value:
        shape = tuple(shape)

        def ref():
            expanded = np.ones(len(shape), int)
            expanded[list(dims)] = v.shape
            return np.broadcast_to(v.ref().reshape(expanded), shape)

        text = (f"stablehlo.broadcast_in_dim {v.name}, dims = {_ilist(dims)} "
                f": ({v.type}) -> @RESULT_TYPE@")
        return self._op("bcast", shape, text, ref)

    def add(self, a: Value, b: Value) -> Value:
        assert a.shape == b.shape
        return self._op("add", a.shape, f"stablehlo.add {a.name}, {b.name} : @RESULT_TYPE@",
                        lambda: a.ref() + b.ref())

    def relu(self, a: Value) -> Value:
        zero = self.splat(0.0, a.shape)
        return self._op("relu", a.shape, f"stablehlo.maximum {a.name}, {zero.name} : @RESULT_TYPE@",
                        lambda: np.maximum(a.ref(), 0.0))

    def batch_norm(self, x: Value, scale: Value, offset: Value, mean: Value, variance: Value,
                   *, feature_index: int, epsilon: float = 1e-5) -> Value:
        n = x.shape[feature_index]
        for p in (scale, offset, mean, variance):
            assert p.shape == (n,), (p.shape, n)
        eps32 = float(np.float32(epsilon))

        def ref():
            bshape = [1] * len(x.shape)
            bshape[feature_index] = n
            g, b_, m, v = (p.ref().reshape(bshape) for p in (scale, offset, mean, variance))
            return (x.ref() - m) / np.sqrt(v + eps32) * g + b_

        p = (scale, offset, mean, variance)
        text = (
            f'"stablehlo.batch_norm_inference"({x.name}, {", ".join(q.name for q in p)}) '
            f"{{epsilon = {float_literal(epsilon)} : f32, feature_index = {feature_index} : i64}} "
            f": ({x.type}, {', '.join(q.type for q in p)}) -> @RESULT_TYPE@"
        )
        return self._op("bn", x.shape, text, ref)

    def bn_const(self, x: Value, *, feature_index: int, epsilon: float = 1e-5) -> Value:
        """batch_norm_inference with all four parameters random constants."""
        params = self.bn_params(x.shape[feature_index])
        consts = [self.const(params[k], k) for k in ("scale", "offset", "mean", "variance")]
        return self.batch_norm(x, *consts, feature_index=feature_index, epsilon=epsilon)

    # -- text --------------------------------------------------------------------------------
    def module_text(self, results: Sequence[Value], description: str) -> str:
        args = ", ".join(f"{a.name}: {a.type}" for a in self.args)
        rtypes = ", ".join(r.type for r in results)
        out = [
            "// Generated by tools/make_testdata.py -- do not edit by hand.",
            *(f"// {line}" for line in description.splitlines()),
            f"module @{self.name} {{",
            f"  func.func @main({args}) -> ({rtypes}) {{",
            *(f"    {line}" for line in self.lines),
            f"    return {', '.join(r.name for r in results)} : {rtypes}",
            "  }",
            "}",
            "",
        ]
        return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    name: str
    description: str
    foldable: bool
    build: Callable[[Builder], list[Value]]
    dtype: str = "f32"
    reason: str = ""
    producer: str | None = "convolution"
    num_folds: int = 1


CASES: list[Case] = []


def case(name: str, description: str, *, foldable: bool = True, dtype: str = "f32",
         reason: str = "", producer: str | None = "convolution", num_folds: int | None = None):
    def register(fn: Callable[[Builder], list[Value]]):
        assert not any(c.name == name for c in CASES), name
        assert foldable or reason, f"{name}: a non-foldable case needs a reason"
        CASES.append(Case(name, description, foldable, fn, dtype, reason, producer,
                          num_folds if num_folds is not None else int(foldable)))
        return fn
    return register


def conv_layer(b: Builder, x: Value, spec: ConvSpec, cout: int, ksize: Sequence[int]) -> Value:
    """Convolution of ``x`` with a random constant kernel laid out as ``spec.rhs``."""
    cin = x.shape[spec.lhs.index("f")]
    kshape = layout_shape(spec.rhs, {"i": cin // spec.feature_group_count, "o": cout}, ksize)
    return b.conv(x, b.kernel(kshape), spec)


def conv_bn_case(name: str, description: str, spec: ConvSpec, *, n: int, cin: int,
                 spatial: Sequence[int], cout: int, ksize: Sequence[int], dtype: str = "f32",
                 epsilon: float = 1e-5) -> None:
    """Register the common shape: x (argument) -> convolution -> batch_norm_inference."""

    def build(b: Builder) -> list[Value]:
        x = b.arg(layout_shape(spec.lhs, {"b": n, "f": cin}, spatial))
        c = conv_layer(b, x, spec, cout, ksize)
        return [b.bn_const(c, feature_index=spec.out.index("f"), epsilon=epsilon)]

    case(name, description, dtype=dtype)(build)


NHWC = dict(lhs="b01f", rhs="01io", out="b01f")
NCHW = dict(lhs="bf01", rhs="oi01", out="bf01")
NCHW_IO = dict(lhs="bf01", rhs="io01", out="bf01")  # torch ConvTranspose kernel layout

# ---- 2-D layouts ----------------------------------------------------------------------------
conv_bn_case("conv2d_nhwc_bn", "2-D conv NHWC/HWIO, 3x3 SAME padding, + BN (feature_index 3).",
             ConvSpec(**NHWC, pad=((1, 1), (1, 1))),
             n=1, cin=3, spatial=(8, 8), cout=4, ksize=(3, 3))
conv_bn_case("conv2d_nchw_bn", "2-D conv NCHW/OIHW, VALID padding, batch 2, + BN "
             "(feature_index 1, epsilon 1e-3).",
             ConvSpec(**NCHW), n=2, cin=3, spatial=(7, 7), cout=5, ksize=(3, 3), epsilon=1e-3)
conv_bn_case("conv2d_perm_f0b1_o10i_1bf0_bn",
             "2-D conv with permuted dims [f, 0, b, 1]x[o, 1, 0, i]->[1, b, f, 0], non-square "
             "3x2 kernel, + BN on output axis 2.",
             ConvSpec(lhs="f0b1", rhs="o10i", out="1bf0", pad=((1, 1), (0, 1))),
             n=2, cin=3, spatial=(7, 6), cout=4, ksize=(3, 2))
conv_bn_case("conv2d_perm_0b1f_i0o1_f10b_bn",
             "2-D conv with permuted dims [0, b, 1, f]x[i, 0, o, 1]->[f, 1, 0, b] (feature first "
             "in the output, spatial dims swapped), + BN on output axis 0.",
             ConvSpec(lhs="0b1f", rhs="i0o1", out="f10b", stride=(1, 2)),
             n=1, cin=4, spatial=(6, 8), cout=5, ksize=(2, 3))

# ---- 1-D and 3-D ----------------------------------------------------------------------------
conv_bn_case("conv1d_nwc_bn", "1-D conv [b, 0, f]x[0, i, o]->[b, 0, f], batch 2, + BN.",
             ConvSpec(lhs="b0f", rhs="0io", out="b0f", pad=((1, 1),)),
             n=2, cin=3, spatial=(9,), cout=4, ksize=(3,))
conv_bn_case("conv1d_ncw_stride2_bn", "1-D conv [b, f, 0]x[o, i, 0]->[b, f, 0], stride 2, + BN.",
             ConvSpec(lhs="bf0", rhs="oi0", out="bf0", stride=(2,), pad=((1, 1),)),
             n=1, cin=4, spatial=(9,), cout=6, ksize=(3,))
conv_bn_case("conv3d_ndhwc_bn", "3-D conv NDHWC/DHWIO, 3x3x2 kernel, + BN (feature_index 4).",
             ConvSpec(lhs="b012f", rhs="012io", out="b012f", pad=((1, 1), (1, 1), (0, 1))),
             n=1, cin=2, spatial=(5, 6, 5), cout=3, ksize=(3, 3, 2))

# ---- window attributes ----------------------------------------------------------------------
conv_bn_case("conv2d_stride2_bn", "2-D conv NHWC, stride 2, pad 1, + BN.",
             ConvSpec(**NHWC, stride=(2, 2), pad=((1, 1), (1, 1))),
             n=1, cin=3, spatial=(9, 9), cout=6, ksize=(3, 3))
conv_bn_case("conv2d_asym_pad_stride_bn",
             "2-D conv NHWC, stride [2, 1], asymmetric padding [[0, 1], [2, 0]], + BN.",
             ConvSpec(**NHWC, stride=(2, 1), pad=((0, 1), (2, 0))),
             n=2, cin=3, spatial=(8, 7), cout=4, ksize=(3, 3))
conv_bn_case("conv2d_negative_pad_bn",
             "2-D conv NCHW with negative padding [[-1, 1], [1, -2]] (crops the input), + BN.",
             ConvSpec(**NCHW, pad=((-1, 1), (1, -2))),
             n=1, cin=3, spatial=(8, 8), cout=4, ksize=(3, 3))
conv_bn_case("conv2d_rhs_dilation_bn", "2-D atrous conv NHWC, rhs_dilate [2, 2], pad 2, + BN.",
             ConvSpec(**NHWC, pad=((2, 2), (2, 2)), rhs_dilate=(2, 2)),
             n=1, cin=3, spatial=(9, 9), cout=4, ksize=(3, 3))
conv_bn_case("conv2d_transposed_nhwc_bn",
             "Transposed conv NHWC: lhs_dilate [2, 2], pad [[1, 2], [1, 2]] (5x5 -> 10x10), + BN.",
             ConvSpec(**NHWC, pad=((1, 2), (1, 2)), lhs_dilate=(2, 2)),
             n=1, cin=4, spatial=(5, 5), cout=3, ksize=(3, 3))
conv_bn_case("conv2d_transposed_torch_bn",
             "Transposed conv as torch lowers ConvTranspose2d(k=3, s=2, p=1, output_padding=1): "
             "NCHW, kernel [i, o, 0, 1], lhs_dilate 2, window reversal on both axes, + BN.",
             ConvSpec(**NCHW_IO, pad=((1, 2), (1, 2)), lhs_dilate=(2, 2), reverse=(True, True)),
             n=1, cin=4, spatial=(5, 5), cout=3, ksize=(3, 3))
conv_bn_case("conv2d_window_reversal_bn",
             "2-D conv NHWC with window reversal [true, false] and a 3x2 kernel, + BN.",
             ConvSpec(**NHWC, pad=((1, 1), (0, 1)), reverse=(True, False)),
             n=1, cin=3, spatial=(7, 7), cout=4, ksize=(3, 2))

# ---- groups ---------------------------------------------------------------------------------
conv_bn_case("conv2d_grouped_bn",
             "Grouped conv NHWC, feature_group_count 2 (4 -> 6 channels, kernel 3x3x2x6), + BN.",
             ConvSpec(**NHWC, pad=((1, 1), (1, 1)), feature_group_count=2),
             n=1, cin=4, spatial=(7, 7), cout=6, ksize=(3, 3))
conv_bn_case("conv2d_depthwise_bn",
             "Depthwise conv NHWC, feature_group_count 4 == input channels, channel multiplier 2 "
             "(kernel 3x3x1x8), + BN.",
             ConvSpec(**NHWC, pad=((1, 1), (1, 1)), feature_group_count=4),
             n=1, cin=4, spatial=(8, 8), cout=8, ksize=(3, 3))
conv_bn_case("conv2d_depthwise_nchw_bn",
             "Depthwise conv NCHW/OIHW, feature_group_count 3 == channels (kernel 3x1x3x3), "
             "batch 2, + BN.",
             ConvSpec(**NCHW, pad=((1, 1), (1, 1)), feature_group_count=3),
             n=2, cin=3, spatial=(6, 6), cout=3, ksize=(3, 3))
conv_bn_case("conv2d_batch_group_bn",
             "Conv NHWC with batch_group_count 2 (input batch 2 -> output batch 1; output "
             "features split in 2 groups, each fed by one batch slice), + BN.",
             ConvSpec(**NHWC, batch_group_count=2),
             n=2, cin=3, spatial=(6, 6), cout=4, ksize=(3, 3))
conv_bn_case("conv2d_grouped_transposed_bn",
             "Grouped transposed conv NHWC: lhs_dilate [2, 2] + feature_group_count 2 "
             "(kernel 3x3x2x6), + BN.",
             ConvSpec(**NHWC, pad=((1, 2), (1, 2)), lhs_dilate=(2, 2), feature_group_count=2),
             n=1, cin=4, spatial=(5, 5), cout=6, ksize=(3, 3))
conv_bn_case("conv2d_grouped_transposed_torch_bn",
             "Grouped transposed conv as torch lowers ConvTranspose2d(4, 6, 3, stride=2, "
             "groups=2): NCHW, kernel [i, o, 0, 1] of shape 2x6x3x3 (i = 4/2, o = 6), "
             "lhs_dilate 2, reversed window, feature_group_count 2, + BN. The scale goes along "
             "kernel axis 1 (size 6), not axis 0 and not in groups of 3.",
             ConvSpec(**NCHW_IO, pad=((2, 2), (2, 2)), lhs_dilate=(2, 2), reverse=(True, True),
                      feature_group_count=2),
             n=1, cin=4, spatial=(5, 5), cout=6, ksize=(3, 3))

# ---- dtypes ---------------------------------------------------------------------------------
conv_bn_case("conv2d_nhwc_f64_bn", "2-D conv NHWC + BN, everything f64 (epsilon attribute f32).",
             ConvSpec(**NHWC, pad=((1, 1), (1, 1))),
             n=1, cin=3, spatial=(6, 6), cout=4, ksize=(3, 3), dtype="f64")
conv_bn_case("conv2d_nchw_f16_bn",
             "2-D conv NCHW + BN, everything f16 (epsilon 1e-3, attribute f32).",
             ConvSpec(**NCHW, pad=((1, 1), (1, 1))),
             n=1, cin=3, spatial=(6, 6), cout=4, ksize=(3, 3), dtype="f16", epsilon=1e-3)
conv_bn_case("conv2d_nhwc_bf16_bn", "2-D conv NHWC + BN, everything bf16 (epsilon attribute f32).",
             ConvSpec(**NHWC, pad=((1, 1), (1, 1))),
             n=1, cin=3, spatial=(6, 6), cout=4, ksize=(3, 3), dtype="bf16")


# ---- bias, chains, sharing ------------------------------------------------------------------
@case("conv2d_bias_bn", "2-D conv NHWC + existing bias add(conv, broadcast_in_dim(bias, "
      "dims=[3])) + BN.")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 7, 7, 3))
    c = conv_layer(b, x, spec, 5, (3, 3))
    c = b.add(c, b.broadcast_in_dim(b.bias(5), c.shape, [3]))
    return [b.bn_const(c, feature_index=3)]


@case("conv2d_bias_nchw_bn", "2-D conv NCHW + bias add(broadcast_in_dim(bias, dims=[1]), conv) "
      "(bias on the lhs of the add) + BN with Keras-ResNet epsilon 1.001e-5.")
def _(b: Builder):
    spec = ConvSpec(**NCHW, stride=(2, 2), pad=((1, 1), (1, 1)))
    x = b.arg((2, 3, 8, 8))
    c = conv_layer(b, x, spec, 4, (3, 3))
    c = b.add(b.broadcast_in_dim(b.bias(4), c.shape, [1]), c)
    return [b.bn_const(c, feature_index=1, epsilon=1.001e-5)]


@case("conv2d_two_bn", "conv-BN-relu-conv-BN in one module (NHWC); both BNs fold.", num_folds=2)
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 8, 8, 3))
    y = b.bn_const(conv_layer(b, x, spec, 4, (3, 3)), feature_index=3)
    y = b.relu(y)
    y = b.bn_const(conv_layer(b, y, spec, 6, (3, 3)), feature_index=3, epsilon=1e-3)
    return [y]


@case("conv2d_shared_kernel_bn",
      "One kernel constant used by two convolutions; only the first is followed by BN, both "
      "results are returned. The BN folds, but the second conv must keep the original kernel "
      "(the folder has to give the first conv its own scaled copy).")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 6, 6, 3))
    k = b.kernel((3, 3, 3, 4))
    y = b.bn_const(b.conv(x, k, spec), feature_index=3)
    z = b.conv(x, k, spec)
    return [y, z]


# ---- dot_general ----------------------------------------------------------------------------
@case("dense_bn", "dot_general [batch, in] x [in, out] (contracting [1]x[0]) + BN "
      "(feature_index 1).", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 6))
    y = b.dot_general(x, b.kernel((6, 5)), contracting=((1,), (0,)))
    return [b.bn_const(y, feature_index=1)]


@case("dense_bias_bn", "dot_general [batch, in] x [in, out] + bias add(broadcast_in_dim(bias, "
      "dims=[1])) + BN.", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 8))
    y = b.dot_general(x, b.kernel((8, 4)), contracting=((1,), (0,)))
    y = b.add(y, b.broadcast_in_dim(b.bias(4), y.shape, [1]))
    return [b.bn_const(y, feature_index=1)]


@case("linear_torch_bn", "torch Linear style dot_general: x [batch, in] x W [out, in], "
      "contracting [1]x[1], + BN (feature_index 1).", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 6))
    y = b.dot_general(x, b.kernel((5, 6)), contracting=((1,), (1,)))
    return [b.bn_const(y, feature_index=1)]


@case("dot_batched_bn", "Batched dot_general lhs [3, 4, 6] x const rhs [3, 6, 5], batching "
      "[0]x[0], contracting [2]x[1] -> [3, 4, 5]; BN on axis 2, which is rhs's non-contracting "
      "dim 2.", producer="dot_general")
def _(b: Builder):
    x = b.arg((3, 4, 6))
    y = b.dot_general(x, b.kernel((3, 6, 5)), batching=((0,), (0,)), contracting=((2,), (1,)))
    return [b.bn_const(y, feature_index=2)]


@case("dot_rank3_bn", "dot_general with rank-3 lhs [b, t, in] x [in, out] -> [b, t, out] "
      "(contracting [2]x[0]) + BN on axis 2.", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 4, 6))
    y = b.dot_general(x, b.kernel((6, 5)), contracting=((2,), (0,)))
    return [b.bn_const(y, feature_index=2)]


@case("dot_weight_lhs_bn", "dot_general with the constant weight as lhs: W [out, in] x "
      "x [batch, in] -> [out, batch] (contracting [1]x[1]) + BN on axis 0 (W's non-contracting "
      "dim).", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 6))
    y = b.dot_general(b.kernel((5, 6)), x, contracting=((1,), (1,)))
    return [b.bn_const(y, feature_index=0)]


@case("dense_bf16_bn", "dot_general [batch, in] x [in, out] + BN, everything bf16.",
      dtype="bf16", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 8))
    y = b.dot_general(x, b.kernel((8, 6)), contracting=((1,), (0,)))
    return [b.bn_const(y, feature_index=1)]


@case("linear_torch_f16_bn", "torch Linear style dot_general (contracting [1]x[1]) + BN, "
      "everything f16.", dtype="f16", producer="dot_general")
def _(b: Builder):
    x = b.arg((2, 6))
    y = b.dot_general(x, b.kernel((4, 6)), contracting=((1,), (1,)))
    return [b.bn_const(y, feature_index=1, epsilon=1e-3)]


# ---- must not fold --------------------------------------------------------------------------
@case("nofold_stats_args", "conv NHWC (constant kernel) + BN whose mean and variance are "
      "function arguments; scale and offset are constants.", foldable=False,
      reason="BN mean and variance are function arguments, not constants.")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 6, 6, 3))
    p = b.bn_params(4)
    mean = b.arg((4,), p["mean"])
    var = b.arg((4,), p["variance"])
    c = conv_layer(b, x, spec, 4, (3, 3))
    return [b.batch_norm(c, b.const(p["scale"], "scale"), b.const(p["offset"], "offset"),
                         mean, var, feature_index=3)]


@case("nofold_all_bn_params_args", "conv NCHW (constant kernel) + BN whose scale, offset, mean "
      "and variance are all function arguments (JAX-export style params).", foldable=False,
      reason="All BN parameters are function arguments; nothing to fold without bound values.")
def _(b: Builder):
    spec = ConvSpec(**NCHW, pad=((1, 1), (1, 1)))
    x = b.arg((1, 3, 6, 6))
    p = b.bn_params(4)
    params = [b.arg((4,), p[k]) for k in ("scale", "offset", "mean", "variance")]
    c = conv_layer(b, x, spec, 4, (3, 3))
    return [b.batch_norm(c, *params, feature_index=1)]


@case("nofold_kernel_arg", "conv NHWC whose kernel is a function argument + BN with constant "
      "parameters.", foldable=False,
      reason="The convolution kernel is a function argument, so it cannot be rewritten.")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 6, 6, 3))
    k = b.arg((3, 3, 3, 4), b.rng.normal(0.0, 0.3, (3, 3, 3, 4)))
    return [b.bn_const(b.conv(x, k, spec), feature_index=3)]


@case("nofold_spatial_feature_index", "conv NHWC with output 1x6x6x6 + BN with feature_index 2 "
      "(the W axis, same size as the channel axis).", foldable=False,
      reason="feature_index is a spatial axis of the conv output, not its feature axis.")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 6, 6, 3))
    c = conv_layer(b, x, spec, 6, (3, 3))
    return [b.bn_const(c, feature_index=2)]


@case("nofold_conv_returned", "conv NHWC + BN, and the conv result is also returned.",
      foldable=False,
      reason="The conv result has a second user (it is returned), so it must keep its values.")
def _(b: Builder):
    spec = ConvSpec(**NHWC, pad=((1, 1), (1, 1)))
    x = b.arg((1, 6, 6, 3))
    c = conv_layer(b, x, spec, 4, (3, 3))
    return [b.bn_const(c, feature_index=3), c]


@case("nofold_conv_added_to_bn", "conv NCHW + BN, then add(BN, conv) (residual on the "
      "pre-normalization value).", foldable=False,
      reason="The conv result has a second user (the add), so it must keep its values.")
def _(b: Builder):
    spec = ConvSpec(**NCHW, pad=((1, 1), (1, 1)))
    x = b.arg((1, 3, 6, 6))
    c = conv_layer(b, x, spec, 3, (3, 3))
    y = b.bn_const(c, feature_index=1)
    return [b.add(y, c)]


@case("nofold_block_arg", "BN applied directly to the function argument (no producer).",
      foldable=False, producer=None,
      reason="The BN operand is a block argument; there is no producer to fold into.")
def _(b: Builder):
    x = b.arg((1, 6, 6, 4))
    return [b.bn_const(x, feature_index=3)]


@case("nofold_dot_lhs_axis", "Batched dot_general lhs(arg) [3, 5, 6] x const rhs [3, 6, 5] -> "
      "[3, 5, 5]; BN on axis 1, which comes from the lhs (activation) non-contracting dim.",
      foldable=False, producer="dot_general",
      reason="The normalized axis comes from the non-constant lhs, not from the constant rhs.")
def _(b: Builder):
    x = b.arg((3, 5, 6))
    y = b.dot_general(x, b.kernel((3, 6, 5)), batching=((0,), (0,)), contracting=((2,), (1,)))
    return [b.bn_const(y, feature_index=1)]


@case("nofold_dense_batch_axis", "dot_general [5, in] x [in, 5] -> [5, 5] + BN with "
      "feature_index 0 (the batch axis, same size as the output-feature axis).",
      foldable=False, producer="dot_general",
      reason="feature_index is the batch axis (from the activation), not the weight's output "
             "axis.")
def _(b: Builder):
    x = b.arg((5, 6))
    y = b.dot_general(x, b.kernel((6, 5)), contracting=((1,), (0,)))
    return [b.bn_const(y, feature_index=0)]


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Built:
    case: Case
    text: str
    inputs: list[np.ndarray]
    results: list[Value]


def build_case(c: Case) -> Built:
    b = Builder(c.name, c.dtype)
    results = c.build(b)
    return Built(c, b.module_text(results, c.description), b.inputs, results)


def manifest_entry(c: Case) -> dict:
    return {
        "file": f"{c.name}.mlir",
        "description": c.description,
        "foldable": c.foldable,
        "dtype": c.dtype,
        "reason": c.reason,
        "producer": c.producer,
        "num_folds": c.num_folds,
    }


def verify(built: Built) -> tuple[bool, str]:
    """Parse with jaxlib, run on XLA CPU, compare with the float64 reference."""
    import jax
    import jax.extend
    from jax._src.interpreters import mlir as jm
    from jax._src.lib import xla_client as xc
    from jaxlib.mlir import ir

    with jm.make_ir_context():
        ir.Module.parse(built.text)

    be = jax.extend.backend.get_backend("cpu")
    dev = be.devices()[0]
    exe = be.compile_and_load(built.text, xc.DeviceList((dev,)), xc.CompileOptions())
    outs = exe.execute_sharded([jax.device_put(x, dev) for x in built.inputs])
    outs = [np.asarray(o[0]) for o in outs.disassemble_into_single_device_arrays()]
    if len(outs) != len(built.results):
        return False, f"{len(outs)} outputs, expected {len(built.results)}"
    rtol = TOLERANCES[built.case.dtype]
    worst = 0.0
    for got, want in zip(outs, built.results):
        ref = want.ref()
        if got.shape != want.shape or got.dtype != DTYPES[want.dtype]:
            return False, f"got {got.dtype}{got.shape}, expected {want.type}"
        scale = float(np.max(np.abs(ref))) or 1.0
        err = np.abs(got.astype(np.float64) - ref) / (np.abs(ref) + scale)
        worst = max(worst, float(err.max()))
    return worst <= rtol, f"max err {worst:.2e} (tol {rtol:.0e})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "testdata",
                        help="output directory (default: testdata/ at the repo root)")
    parser.add_argument("--verify", action="store_true",
                        help="parse, compile and run every module on XLA CPU and compare with a "
                             "float64 reference (lax.conv_general_dilated / einsum / numpy)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="generate only this case (repeatable); manifest.json is then not "
                             "written")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    cases = CASES
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in CASES})
        if unknown:
            parser.error(f"unknown case(s): {', '.join(unknown)}")
        cases = [c for c in CASES if c.name in args.only]
    if args.list:
        for c in cases:
            flag = "fold  " if c.foldable else "NOFOLD"
            print(f"{c.name:38s} {c.dtype:4s} {flag} {c.description}")
        return 0

    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    if args.verify:
        import jax

        jax.config.update("jax_enable_x64", True)  # float64 references for lax convolutions

    failures = 0
    for c in cases:
        built = build_case(c)
        (out / f"{c.name}.mlir").write_text(built.text)
        if args.verify:
            try:
                ok, msg = verify(built)
            except Exception as e:  # report every broken module, not just the first
                ok, msg = False, f"{type(e).__name__}: {e}"
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {c.name:38s} {c.dtype:4s} {msg}")
    if not args.only:  # a partial manifest would hide the other cases
        (out / "manifest.json").write_text(
            json.dumps([manifest_entry(c) for c in cases], indent=2) + "\n")
    print(f"wrote {len(cases)} modules{'' if args.only else ' and manifest.json'} to {out}")
    if args.verify:
        print(f"verify: {len(cases) - failures} ok, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
