"""Random StableHLO modules for bnfold's property tests (see test_properties.py).

A `Case` is a small tree of drawn choices; `render(case, dtype)` prints it as MLIR text
with one `func.func @main` (constants as little-endian hex) and says what bnfold is
expected to do with it (`Expect`). What a case can hold:

* producer: `stablehlo.convolution` of rank 1-3 with independent input/kernel/output
  layouts, feature_group_count or batch_group_count, strides, padding (negative too),
  lhs/rhs dilation and window reversal; or `stablehlo.dot_general` with 0-2 batching
  dims, 1-2 contracting dims and the weight on either side. The kernel is a constant,
  or computed from one (reshape, transpose, reverse, `call @_flip`).
* normalization (`FORMS`): `batch_norm_inference`, the decomposed chains of forms.md
  (Flax linen/nnx, Haiku, Equinox, Keras, torchax), a lone per-channel multiply, or a
  random affine chain (add/subtract either way/multiply/divide/negate/no-op convert
  with per-channel, K-shaped, materialized or scalar constants); optionally wrapped in
  a reshape or a transpose and its inverse; an optional existing bias add.
* direction: "backward" (norm after the producer), "forward" (before it), "both", or
  "between" (conv -> norm -> conv).
* variant (`VARIANTS`): none, or a must-not-fold change: a constant varying along a
  non-feature axis, a second user of the producer or of a chain value, a statistic
  passed as an argument, the norm on a wrong axis of the same size.

The expectation comes from a model of the documented folding rules:

* backward: the chain after the producer folds up to the first obstacle (a
  step whose constant does not vary only along the feature axis, a step whose
  constant is an argument, a value with a second user); the foldable prefix
  must "normalize" (contain a multiply/divide/negate/batch norm, or at least
  two additive steps), otherwise nothing changes. A producer result with a
  second user blocks everything.
* forward: the whole single-use chain of constant steps right before the
  producer must compose; a non-zero shift folds only without positive padding
  and lhs_dilation (convolution) or into a weight with one free dimension and
  no batching dimensions (dot_general).

Values are drawn from a numpy generator seeded by `case.seed` in float64 and
rounded once to `case.dtype`, so rendering the same case with `dtype="f64"`
gives the exact float64 reference of the low-precision module (same constants,
every type f64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

NP_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}
SCALING = ("multiply", "divide", "negate", "bn")
LAYOUT = ("reshape", "transpose", "convert")
FORMS = ("bn", "flax_linen", "flax_nnx", "haiku", "equinox", "keras", "torchax", "random",
         "scale", "none")
VARIANTS = ("none", "nonfeature_const", "producer_multiuse", "intermediate_multiuse",
            "stat_arg", "wrong_axis")
EPSILONS = (1e-5, 1e-3, 1.001e-5, 1e-4, 0.1)
# The numerics compare errors relative to the largest output magnitude; with one or two
# output elements that magnitude can be a near-cancellation of much larger terms (e.g.
# (x - mean) * 100 + beta close to 0), which says nothing about the fold. A few elements
# make such cancellation in *every* element vanishingly unlikely.
MIN_OUTPUT_ELEMENTS = 4


# --- MLIR text helpers -----------------------------------------------------------------


def ttype(shape, dt: str) -> str:
    return "tensor<" + "".join(f"{n}x" for n in shape) + dt + ">"


def dense_hex(values: np.ndarray, dt: str) -> str:
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(NP_DTYPES[dt]))
    return 'dense<"0x' + arr.tobytes().hex().upper() + '">'


def round_to(values: np.ndarray, dt: str) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(NP_DTYPES[dt]).astype(np.float64)


@dataclass(frozen=True)
class V:
    name: str
    shape: tuple[int, ...]
    tainted: bool = False  # derived from a function argument other than %arg0


class Builder:
    def __init__(self, dt: str) -> None:
        self.dt = dt
        self.lines: list[str] = []
        self.args: list[V] = []
        self.n = 0
        self.functions: list[str] = []

    def fresh(self, hint: str) -> str:
        self.n += 1
        return f"%{hint}{self.n}"

    def arg(self, shape) -> V:
        v = V(f"%arg{len(self.args)}", tuple(shape), tainted=len(self.args) > 0)
        self.args.append(v)
        return v

    def emit(self, hint: str, rhs: str, shape, tainted: bool) -> V:
        name = self.fresh(hint)
        self.lines.append(f"    {name} = {rhs}")
        return V(name, tuple(shape), tainted)

    def const(self, values, shape, hint: str = "c") -> V:
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), tuple(shape))
        return self.emit(hint, f"stablehlo.constant {dense_hex(values, self.dt)} : "
                               f"{ttype(shape, self.dt)}", shape, False)

    def bcast(self, v: V, dims, shape) -> V:
        return self.emit("b", f"stablehlo.broadcast_in_dim {v.name}, dims = [{', '.join(map(str, dims))}]"
                              f" : ({ttype(v.shape, self.dt)}) -> {ttype(shape, self.dt)}",
                         shape, v.tainted)

    def reshape(self, v: V, shape) -> V:
        return self.emit("r", f"stablehlo.reshape {v.name} : ({ttype(v.shape, self.dt)}) -> "
                              f"{ttype(shape, self.dt)}", shape, v.tainted)

    def binary(self, op: str, a: V, b: V) -> V:
        assert a.shape == b.shape, (op, a, b)
        return self.emit(op[:3], f"stablehlo.{op} {a.name}, {b.name} : {ttype(a.shape, self.dt)}",
                         a.shape, a.tainted or b.tainted)

    def unary(self, op: str, a: V) -> V:
        return self.emit(op[:3], f"stablehlo.{op} {a.name} : {ttype(a.shape, self.dt)}", a.shape,
                         a.tainted)

    def bn(self, x: V, g: V, b: V, m: V, var: V, eps: float, feature: int) -> V:
        vt = ttype(g.shape, self.dt)
        return self.emit("bn", f'"stablehlo.batch_norm_inference"({x.name}, {g.name}, {b.name}, '
                               f"{m.name}, {var.name}) {{epsilon = {eps:.8e} : f32, feature_index = "
                               f"{feature} : i64}} : ({ttype(x.shape, self.dt)}, {vt}, {vt}, {vt}, "
                               f"{vt}) -> {ttype(x.shape, self.dt)}", x.shape,
                         any(v.tainted for v in (g, b, m, var)))

    def module(self, results: list[V]) -> str:
        args = ", ".join(f"{a.name}: {ttype(a.shape, self.dt)}" for a in self.args)
        rtypes = ", ".join(ttype(r.shape, self.dt) for r in results)
        body = "\n".join(self.lines)
        extra = "".join(self.functions)
        return (f"module @gen {{\n  func.func @main({args}) -> ({rtypes}) {{\n{body}\n"
                f"    return {', '.join(r.name for r in results)} : {rtypes}\n  }}\n{extra}}}\n")

    def kernel(self, values: np.ndarray, style: str, rng: np.random.Generator) -> V:
        """A constant kernel, plain or computed from a constant (as exporters write them)."""
        shape = values.shape
        t = ttype(shape, self.dt)
        if style == "reshape":  # Keras depthwise kernels arrive through a reshape
            flat = self.const(values.reshape(-1), (values.size,), "kflat")
            return self.reshape(flat, shape)
        if style == "transpose":
            perm = [int(d) for d in rng.permutation(len(shape))]
            stored = np.transpose(values, np.argsort(perm))
            c = self.const(stored, stored.shape, "kt")
            return self.emit("k", f"stablehlo.transpose {c.name}, dims = [{', '.join(map(str, perm))}] : "
                                  f"({ttype(stored.shape, self.dt)}) -> {t}", shape, False)
        if style in ("reverse", "call"):  # torchax ConvTranspose: call @_flip(%k)
            dims = [d for d in range(len(shape)) if rng.random() < 0.5] or [0]
            c = self.const(np.flip(values, dims), shape, "kr")
            if style == "reverse":
                return self.emit("k", f"stablehlo.reverse {c.name}, dims = [{', '.join(map(str, dims))}] : {t}",
                                 shape, False)
            self.functions.append(
                f"  func.func private @_flip(%a: {t}) -> {t} {{\n"
                f"    %r = stablehlo.reverse %a, dims = [{', '.join(map(str, dims))}] : {t}\n"
                f"    return %r : {t}\n  }}\n")
            return self.emit("k", f"func.call @_flip({c.name}) : ({t}) -> {t}", shape, False)
        return self.const(values, shape, "k")


# --- producers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Spatial:
    size: int
    window: int
    stride: int
    pad_lo: int
    pad_hi: int
    lhs_dilation: int
    rhs_dilation: int
    reverse: bool

    @property
    def out(self) -> int:
        dilated = (self.size - 1) * self.lhs_dilation + 1
        padded = dilated + self.pad_lo + self.pad_hi
        window = (self.window - 1) * self.rhs_dilation + 1
        return (padded - window) // self.stride + 1 if padded >= window else 0


@dataclass(frozen=True)
class Conv:
    batch: int
    in_features: int
    out_features: int
    feature_groups: int
    batch_groups: int
    spatial: tuple[Spatial, ...]
    in_layout: tuple[str, ...]  # labels b, f, 0, 1, ... by position
    kernel_layout: tuple[str, ...]  # labels i, o, 0, 1, ...
    out_layout: tuple[str, ...]
    # The positive padding as an explicit zero stablehlo.pad before the convolution
    # (Keras ZeroPadding2D then a VALID Conv2D); only without lhs_dilation.
    explicit_pad: bool = False

    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.batch if l == "b" else self.in_features if l == "f" else
                     self.spatial[int(l)].size for l in self.in_layout)

    def kernel_shape(self) -> tuple[int, ...]:
        return tuple(self.in_features // self.feature_groups if l == "i" else self.out_features
                     if l == "o" else self.spatial[int(l)].window for l in self.kernel_layout)

    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.batch // self.batch_groups if l == "b" else self.out_features
                     if l == "f" else self.spatial[int(l)].out for l in self.out_layout)

    @property
    def in_axis(self) -> int:
        return self.in_layout.index("f")

    @property
    def out_axis(self) -> int:
        return self.out_layout.index("f")

    def has_positive_pad(self) -> bool:
        return any(s.pad_lo > 0 or s.pad_hi > 0 for s in self.spatial)

    def has_lhs_dilation(self) -> bool:
        return any(s.lhs_dilation != 1 for s in self.spatial)

    def render(self, b: Builder, x: V, kernel: V) -> V:
        sp = self.spatial
        pads = [(s.pad_lo, s.pad_hi) for s in sp]
        if self.explicit_pad and not self.has_lhs_dilation() and self.has_positive_pad():
            x = self._explicit_pad(b, x)
            pads = [(min(lo, 0), min(hi, 0)) for lo, hi in pads]
        window = (f"stride = [{', '.join(str(s.stride) for s in sp)}], "
                  f"pad = [{', '.join(f'[{lo}, {hi}]' for lo, hi in pads)}], "
                  f"lhs_dilate = [{', '.join(str(s.lhs_dilation) for s in sp)}], "
                  f"rhs_dilate = [{', '.join(str(s.rhs_dilation) for s in sp)}], "
                  f"reverse = [{', '.join('true' if s.reverse else 'false' for s in sp)}]")
        dims = (f"[{', '.join(self.in_layout)}]x[{', '.join(self.kernel_layout)}]->"
                f"[{', '.join(self.out_layout)}]")
        out = self.out_shape()
        return b.emit("conv", f"stablehlo.convolution({x.name}, {kernel.name}) dim_numbers = {dims}, "
                              f"window = {{{window}}} {{batch_group_count = {self.batch_groups} : i64, "
                              f"feature_group_count = {self.feature_groups} : i64}} : "
                              f"({ttype(x.shape, b.dt)}, {ttype(kernel.shape, b.dt)}) -> "
                              f"{ttype(out, b.dt)}", out, False)

    def _explicit_pad(self, b: Builder, x: V) -> V:
        low, high = [0] * len(x.shape), [0] * len(x.shape)
        for d, label in enumerate(self.in_layout):
            if label not in ("b", "f"):
                s = self.spatial[int(label)]
                low[d], high[d] = max(s.pad_lo, 0), max(s.pad_hi, 0)
        shape = tuple(n + lo + hi for n, lo, hi in zip(x.shape, low, high, strict=True))
        zero = b.emit("zero", f"stablehlo.constant dense<0.0> : tensor<{b.dt}>", (), False)
        return b.emit("padded", f"stablehlo.pad {x.name}, {zero.name}, low = {low}, high = {high}, "
                                f"interior = {[0] * len(shape)} : ({ttype(x.shape, b.dt)}, "
                                f"tensor<{b.dt}>) -> {ttype(shape, b.dt)}", shape, x.tainted)

    def fan_in(self) -> int:
        return max(1, (self.in_features // self.feature_groups) *
                   math.prod(s.window for s in self.spatial))


@dataclass(frozen=True)
class Dot:
    """dot_general; dims are ("b"|"c"|"a"|"w", index, size): batching, contracting,
    free dim of the activation, free dim of the weight."""

    weight_rhs: bool
    act_dims: tuple[tuple[str, int, int], ...]  # activation operand, by position
    weight_dims: tuple[tuple[str, int, int], ...]
    feature: int  # index of the weight free dim the norm runs along (backward)

    def _shape(self, dims) -> tuple[int, ...]:
        return tuple(d[2] for d in dims)

    def in_shape(self) -> tuple[int, ...]:
        return self._shape(self.act_dims)

    def kernel_shape(self) -> tuple[int, ...]:
        return self._shape(self.weight_dims)

    def _operands(self):
        return (self.act_dims, self.weight_dims) if self.weight_rhs else (self.weight_dims, self.act_dims)

    def out_dims(self) -> list[tuple[str, int, int]]:
        lhs, rhs = self._operands()
        batch = sorted((d for d in lhs if d[0] == "b"), key=lambda d: d[1])
        return batch + [d for d in lhs if d[0] in "aw"] + [d for d in rhs if d[0] in "aw"]

    def out_shape(self) -> tuple[int, ...]:
        return self._shape(self.out_dims())

    @property
    def out_axis(self) -> int:
        return next(i for i, d in enumerate(self.out_dims()) if d[0] == "w" and d[1] == self.feature)

    @property
    def in_axis(self) -> int:
        """The activation's first contracting dimension (forward folding)."""
        return next(i for i, d in enumerate(self.act_dims) if d[0] == "c" and d[1] == 0)

    def n_contracting(self) -> int:
        return sum(1 for d in self.act_dims if d[0] == "c")

    def weight_has_batch(self) -> bool:
        return any(d[0] == "b" for d in self.weight_dims)

    def weight_free(self) -> int:
        return sum(1 for d in self.weight_dims if d[0] == "w")

    def render(self, b: Builder, x: V, kernel: V) -> V:
        lhs_v, rhs_v = (x, kernel) if self.weight_rhs else (kernel, x)
        lhs, rhs = self._operands()

        def positions(dims, kind):
            found = sorted((d[1], i) for i, d in enumerate(dims) if d[0] == kind)
            return [i for _, i in found]

        text = f"stablehlo.dot_general {lhs_v.name}, {rhs_v.name}, "
        lb, rb = positions(lhs, "b"), positions(rhs, "b")
        if lb:
            text += f"batching_dims = [{', '.join(map(str, lb))}] x [{', '.join(map(str, rb))}], "
        lc, rc = positions(lhs, "c"), positions(rhs, "c")
        text += f"contracting_dims = [{', '.join(map(str, lc))}] x [{', '.join(map(str, rc))}]"
        out = self.out_shape()
        text += f" : ({ttype(lhs_v.shape, b.dt)}, {ttype(rhs_v.shape, b.dt)}) -> {ttype(out, b.dt)}"
        return b.emit("dot", text, out, False)

    def fan_in(self) -> int:
        return max(1, math.prod(d[2] for d in self.weight_dims if d[0] == "c"))


# --- chains ----------------------------------------------------------------------------


@dataclass
class Act:
    """One op on the activation path of a chain, as the folding model sees it."""

    name: str  # add subtract multiply divide negate reshape bn
    kind: str  # "step" (composes), "bad" (a step that does not compose), "nonstep"
    result: V
    additive_shift: bool  # adds something to the activation (non-zero shift)


class Chain:
    """Builds a chain on an activation value; constants vary along `axis`."""

    def __init__(self, b: Builder, rng: np.random.Generator, dt: str, x: V, axis: int, *,
                 bad_pos: int | None, other_axis: int | None, stat_arg: str | None,
                 const_style: str, swap: bool, wrong: bool = False) -> None:
        self.b, self.rng, self.dt = b, rng, dt
        self.x, self.axis, self.shape = x, axis, x.shape
        self.acts: list[Act] = []
        self.bad_pos = bad_pos
        self.bad_index: int | None = None  # which vector-constant binary act gets a bad constant
        self.wrong = wrong  # constants vary along a wrong axis: no vector step composes
        self.expected_scale: np.ndarray | None = None
        self.other_axis = other_axis
        self.stat_arg = stat_arg
        self.const_style = const_style
        self.swap = swap
        self._vector_acts = 0

    @property
    def channels(self) -> int:
        return self.shape[self.axis]

    def kshape(self) -> tuple[int, ...]:
        return tuple(n if d == self.axis else 1 for d, n in enumerate(self.shape))

    def values(self, kind: str, n: int | None = None) -> np.ndarray:
        n = self.channels if n is None else n
        r = self.rng
        if kind == "mean":
            v = r.normal(0, 0.5, n)
        elif kind == "var":
            v = np.where(r.random(n) < 0.15, r.uniform(1e-4, 1e-2, n), r.uniform(0.2, 2.0, n))
        elif kind == "gamma":
            v = r.uniform(0.5, 1.5, n) * np.where(r.random(n) < 0.1, -1, 1)
        elif kind == "beta":
            v = r.normal(0, 0.5, n)
        elif kind == "mul":
            v = r.uniform(0.5, 2.0, n) * np.where(r.random(n) < 0.2, -1, 1)
        else:  # add
            v = r.normal(0, 1.0, n)
        return round_to(v, self.dt)

    def stat(self, name: str, values: np.ndarray, shape=None) -> V:
        """A statistic as a constant, or as a function argument (the stat_arg variant)."""
        shape = (self.channels,) if shape is None else shape
        if self.stat_arg == name:
            return self.b.arg(shape)
        return self.b.const(values.reshape(shape), shape, name)

    def scalar(self, value: float) -> V:
        return self.b.const(round_to(np.array(value), self.dt), (), "eps")

    def to_k(self, v: V, via: str = "bcast") -> V:
        if via == "reshape":
            return self.b.reshape(v, self.kshape())
        return self.b.bcast(v, [self.axis], self.kshape())

    def full(self, v: V) -> V:
        if v.shape == self.shape:
            return v
        if v.shape == ():
            return self.b.bcast(v, [], self.shape)
        if v.shape == (self.channels,):
            return self.b.bcast(v, [self.axis], self.shape)
        assert v.shape == self.kshape(), (v.shape, self.kshape())
        return self.b.bcast(v, list(range(len(self.shape))), self.shape)

    def _bad_constant(self) -> V:
        shape = tuple(n if d in (self.axis, self.other_axis) else 1 for d, n in enumerate(self.shape))
        vals = round_to(self.rng.uniform(0.5, 1.5, shape), self.dt)
        c = self.b.const(vals, shape, "bad")
        return self.b.bcast(c, list(range(len(shape))), self.shape)

    def plan(self, vector_acts: int) -> None:
        """Called by each form before its first act: picks the act that gets a bad constant."""
        if self.bad_pos is not None and vector_acts:
            self.bad_index = self.bad_pos % vector_acts

    def act(self, op: str, x: V, c: V, *, x_left: bool = True, vector: bool = True) -> V:
        """A binary op of the activation `x` and the (per-channel or scalar) operand `c`."""
        operand = self.full(c)
        kind = "nonstep" if operand.tainted else "step"
        if vector:
            if self.wrong:
                kind = "bad" if kind == "step" else kind
            if self._vector_acts == self.bad_index:
                operand, kind = self._bad_constant(), "bad"
            self._vector_acts += 1
        if op in ("add", "multiply") and self.swap:
            x_left = not x_left
        out = self.b.binary(op, x, operand) if x_left else self.b.binary(op, operand, x)
        self.acts.append(Act(op, kind, out, op in ("add", "subtract")))
        return out

    def negate(self, x: V) -> V:
        out = self.b.unary("negate", x)
        self.acts.append(Act("negate", "step", out, False))
        return out

    def transpose(self, x: V, perm: list[int]) -> V:
        shape = tuple(x.shape[p] for p in perm)
        out = self.b.emit("t", f"stablehlo.transpose {x.name}, dims = [{', '.join(map(str, perm))}] : "
                               f"({ttype(x.shape, self.b.dt)}) -> {ttype(shape, self.b.dt)}", shape, x.tainted)
        self.acts.append(Act("transpose", "step", out, False))
        self.shape, self.axis = shape, perm.index(self.axis)
        if self.other_axis is not None:
            self.other_axis = perm.index(self.other_axis)
        return out

    def convert(self, x: V) -> V:
        """A no-op convert (same element type), as some exporters leave behind."""
        t = ttype(x.shape, self.b.dt)
        out = self.b.emit("cv", f"stablehlo.convert {x.name} : ({t}) -> {t}", x.shape, x.tainted)
        self.acts.append(Act("convert", "step", out, False))
        return out

    def reshape(self, x: V, shape, axis: int) -> V:
        out = self.b.reshape(x, shape)
        self.acts.append(Act("reshape", "step", out, False))
        self.shape, self.axis = tuple(shape), axis
        return out

    # -- forms (forms.md) ----------------------------------------------------

    def build(self, form: str, eps: float, zero_shift: bool, x: V) -> V:
        n = self.channels
        mean, var = self.values("mean"), self.values("var")
        gamma, beta = self.values("gamma"), self.values("beta")
        if zero_shift:
            mean, beta = np.zeros(n), np.zeros(n)
        first = len(self.acts)
        y = self._form(form, eps, x, mean, var, gamma, beta)
        # The composed per-channel scale, computed in float64 from the rounded constants
        # (the batch norm's epsilon attribute is f32; decomposed chains round it to dtype).
        if form == "bn":
            self.expected_scale = gamma / np.sqrt(var + np.float64(np.float32(eps)))
        elif form in ("flax_linen", "flax_nnx", "haiku", "equinox", "keras", "torchax"):
            self.expected_scale = gamma / np.sqrt(var + round_to(np.array(eps), self.dt))
        elif form == "scale":
            self.expected_scale = self._scale_values
        if zero_shift:  # every additive constant is zero: the composed shift is exactly 0
            for a in self.acts[first:]:
                a.additive_shift = False
        return y

    def _form(self, form: str, eps: float, x: V, mean, var, gamma, beta) -> V:
        n = self.channels
        b = self.b
        if form == "none":
            return x
        if form == "bn":
            g, bb, m, v = (self.stat(k, a) for k, a in
                           (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)))
            out = b.bn(x, g, bb, m, v, eps, self.axis)
            kind = "bad" if (g.tainted or bb.tainted or m.tainted or v.tainted or
                             self.wrong) else "step"
            self.acts.append(Act("bn", kind, out, True))
            return out
        if form in ("flax_linen", "flax_nnx"):
            via = "bcast" if form == "flax_linen" else "reshape"
            self.plan(3)
            mean1 = self.to_k(self.stat("mean", mean), via)
            var1 = self.to_k(self.stat("var", var), via)
            y = self.act("subtract", x, mean1)
            eps_k = b.bcast(self.scalar(eps), [], self.kshape())
            s = b.binary("multiply", b.unary("rsqrt", b.binary("add", var1, eps_k)),
                         b.reshape(self.stat("gamma", gamma), self.kshape()))
            y = self.act("multiply", y, s)
            return self.act("add", y, b.reshape(self.stat("beta", beta), self.kshape()))
        if form == "haiku":
            self.plan(3)
            k = self.kshape()
            gk, vk = self.stat("gamma", gamma, k), self.stat("var", var, k)
            mk, bk = self.stat("mean", mean, k), self.stat("beta", beta, k)
            s = b.binary("multiply", gk, b.unary("rsqrt", b.binary(
                "add", vk, b.bcast(self.scalar(eps), [], k))))
            y = self.act("subtract", x, mk)
            y = self.act("multiply", y, s)
            return self.act("add", y, bk)
        if form == "equinox":
            self.plan(4)
            m = self.to_k(self.stat("mean", mean))
            v = self.stat("var", var)
            sd = b.unary("sqrt", b.binary("add", v, b.bcast(self.scalar(eps), [], (n,))))
            y = self.act("subtract", x, m)
            y = self.act("divide", y, self.to_k(sd))
            y = self.act("multiply", y, self.to_k(self.stat("gamma", gamma)))
            return self.act("add", y, self.to_k(self.stat("beta", beta)))
        if form == "keras":
            self.plan(2)
            v, g = self.stat("var", var), self.stat("gamma", gamma)
            m, bt = self.stat("mean", mean), self.stat("beta", beta)
            eps_v = b.bcast(self.scalar(eps), [], (n,))
            s = b.binary("multiply", b.unary("rsqrt", b.binary("add", v, eps_v)), g)
            t = b.binary("add", b.binary("multiply", b.unary("negate", m), s), bt)
            y = self.act("multiply", x, s)
            return self.act("add", y, t)
        if form == "torchax":
            self.plan(4)
            k = self.kshape()
            r = b.unary("rsqrt", b.binary("add", b.reshape(self.stat("var", var), k),
                                          b.bcast(self.scalar(eps), [], k)))
            y = self.act("subtract", x, b.reshape(self.stat("mean", mean), k))
            y = self.act("multiply", y, r)
            y = self.act("multiply", y, b.reshape(self.stat("gamma", gamma), k))
            return self.act("add", y, b.reshape(self.stat("beta", beta), k))
        if form == "scale":
            self.plan(1)
            self._scale_values = self.values("mul")
            return self.act("multiply", x, self.stat("gamma", self._scale_values))
        if form == "random":
            return self._random(x)
        raise AssertionError(form)

    def _random(self, x: V) -> V:
        r = self.rng
        plan = [(str(r.choice(["add", "subtract", "subtract_r", "multiply", "divide", "negate",
                               "convert"])),
                 bool(r.random() < 0.75)) for _ in range(int(r.integers(1, 5)))]
        self.plan(sum(1 for op, vector in plan if vector and op not in ("negate", "convert")))
        y = x
        for i, (op, vector) in enumerate(plan):
            if op == "negate":
                y = self.negate(y)
                continue
            if op == "convert":
                y = self.convert(y)
                continue
            kind = "mul" if op in ("multiply", "divide") else "add"
            vals = self.values(kind) if vector else self.values(kind, 1)
            style = ("vec" if self.const_style == "scalar" else self.const_style) if vector else "scalar"
            name = f"c{i}"
            if style == "scalar":
                c = self.stat(name, vals, ())
            elif style == "k":
                c = self.stat(name, vals, self.kshape())
            elif style == "full":  # materialized at full size, uniform off the feature axis
                full = np.broadcast_to(vals.reshape(self.kshape()), self.shape)
                c = self.stat(name, full, self.shape)
            else:
                c = self.stat(name, vals)
            if op == "subtract_r":
                y = self.act("subtract", y, c, x_left=False, vector=vector)
            else:
                y = self.act(op, y, c, vector=vector)
        return y


# --- cases -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainSpec:
    form: str
    eps: float
    zero_shift: bool
    wrap: str  # "none"; "reshape": to [1, ...] before the chain and back after (Equinox vmap);
    # "transpose": a random permutation before the chain and its inverse after
    const_style: str  # random form: "vec", "k", "full", "scalar"
    swap: bool  # activation on the right of add/multiply


@dataclass(frozen=True)
class Case:
    dtype: str
    producer: Conv | Dot
    direction: str  # "backward", "forward", "both"
    post: ChainSpec | None
    pre: ChainSpec | None
    bias: bool
    variant: str
    variant_pos: int  # which act / stat / axis the variant picks (modulo the choices)
    wrong_axis: int | None  # the wrong axis for "wrong_axis"/"nonfeature_const"
    seed: int
    kernel_style: str = "const"  # "const", "reshape", "transpose", "reverse", "call"
    first_in_features: int = 1  # "between": input channels of the first convolution


@dataclass
class Expect:
    folds: int | None  # None: the model does not predict this case
    unchanged: bool | None
    reason: bool  # a Skip must explain the missing fold
    full: bool  # every normalization folded: no rsqrt/sqrt/divide/batch norm may remain
    clean_report: bool  # folded everything: report.skipped must be empty


@dataclass
class Rendered:
    text: str
    arg_shapes: list[tuple[int, ...]]
    expect: Expect
    kernel: np.ndarray  # the producer's kernel values (rounded to the case dtype)
    kernel_axis: int  # the kernel axis that carries the output features
    expected_scale: np.ndarray | None  # the norm after the producer, composed in float64
    # The forward chain alone (its output is the producer's input), when one folds forward:
    # evaluated at x = 0 it gives the composed shift t, which the precision contract bounds.
    probe: str | None = None


def _normalizes(acts: list[Act]) -> bool:
    names = [a.name for a in acts if a.name not in LAYOUT]
    return any(n in SCALING for n in names) or len(names) >= 2


def _trim(acts: list[Act]) -> list[Act]:
    while acts and acts[-1].name in LAYOUT:
        acts = acts[:-1]
    return acts


def expect_backward(acts: list[Act], multi: set[int], producer_multiuse: bool) -> tuple[int, bool, bool]:
    """(folds, reason expected if no fold, whole chain folded)."""
    if not acts:
        return 0, False, False
    if producer_multiuse:
        return 0, any(a.name in SCALING for a in acts), False
    end = len(acts)
    for i, a in enumerate(acts):
        if a.kind == "nonstep":
            end = i
            break
        if i in multi:
            end = i + 1
            break
    prefix = acts[:end]
    composed: list[Act] = []
    for a in prefix:
        if a.kind == "bad":
            break
        composed.append(a)
    if _normalizes(composed):
        return 1, False, len(_trim(composed)) == len(_trim(list(acts)))
    # Nothing folds: a reason is due for a scaling op on the part of the chain that reaches
    # the producer through steps (a non-step cuts the rest off), and for any batch norm.
    return 0, any(a.name in SCALING for a in prefix) or any(a.name == "bn" for a in acts), False


def expect_forward(acts: list[Act], multi: set[int], producer: Conv | Dot, dtype: str = "f32"
                   ) -> tuple[int | None, bool, bool]:
    """(folds or None when the model does not predict, reason expected if no fold,
    whole chain folded)."""
    steps: list[Act] = []
    for i in range(len(acts) - 1, -1, -1):
        if i in multi or acts[i].kind == "nonstep":
            break
        steps.append(acts[i])
    steps.reverse()
    while steps and steps[0].name in LAYOUT:
        steps = steps[1:]
    bn_left = any(a.name == "bn" for a in acts)
    if not steps:
        return 0, bn_left, False
    scaling = any(a.name in SCALING for a in steps)
    if isinstance(producer, Dot) and producer.n_contracting() != 1:
        return None, False, False  # two contracting dims: not handled forward (a missed fold at most)
    if any(a.kind == "bad" for a in steps):
        return 0, scaling or bn_left, False
    if not _normalizes(steps):
        return 0, bn_left, False
    shift = any(a.additive_shift for a in steps)
    if shift and isinstance(producer, Dot) and (producer.weight_has_batch() or producer.weight_free() != 1):
        # The shift cannot fold: in f32/f64 the scale still does, and t / s stays as
        # one add before the producer (the folded chain is not whole); in f16/bf16
        # nothing folds.
        return (1, False, False) if dtype in ("f32", "f64") else (0, scaling or bn_left, False)
    # Through a convolution's zero padding or lhs_dilation the shift folds exactly
    # as a border correction (the generated convolutions are far below its size bound).
    return 1, False, True


def render(case: Case, dtype: str | None = None) -> Rendered:
    dt = dtype or case.dtype
    rng = np.random.default_rng(case.seed)
    b = Builder(dt)
    p = case.producer
    first = first_conv(p, case.first_in_features) if case.direction == "between" else None
    x = b.arg(first.in_shape() if first else p.in_shape())
    results: list[V] = []
    multi_pre: set[int] = set()
    multi_post: set[int] = set()
    pre_acts: list[Act] = []
    post_acts: list[Act] = []
    variant = case.variant
    stat_names = {"bn": ["gamma", "beta", "mean", "var"], "scale": ["gamma"],
                  "random": ["c0", "c1", "c2", "c3"]}

    def make_chain(spec: ChainSpec, value: V, axis: int, active: bool) -> Chain:
        names = stat_names.get(spec.form, ["gamma", "beta", "mean", "var"])
        return Chain(
            b, rng, case.dtype, value, case.wrong_axis if active and variant == "wrong_axis" else axis,
            bad_pos=(case.variant_pos if active and variant == "nonfeature_const" else None),
            other_axis=case.wrong_axis,
            stat_arg=(names[case.variant_pos % len(names)] if active and variant == "stat_arg" else None),
            const_style=spec.const_style, swap=spec.swap,
            wrong=active and variant == "wrong_axis")

    def run_chain(ch: Chain, spec: ChainSpec) -> V:
        y = ch.x
        shape, axis = ch.shape, ch.axis
        if spec.wrap == "reshape":
            y = ch.reshape(y, (1,) + shape, axis + 1)
            y = ch.build(spec.form, spec.eps, spec.zero_shift, y)
            return ch.reshape(y, shape, axis)
        if spec.wrap == "transpose":
            perm = [int(d) for d in rng.permutation(len(shape))]
            y = ch.transpose(y, perm)
            y = ch.build(spec.form, spec.eps, spec.zero_shift, y)
            return ch.transpose(y, [int(d) for d in np.argsort(perm)])
        return ch.build(spec.form, spec.eps, spec.zero_shift, y)

    active_pre = case.direction in ("forward", "between")
    # "between": a first convolution produces the value the chain normalizes.
    first_out = None
    if first is not None:
        k1 = round_to(rng.normal(0, 1 / math.sqrt(first.fan_in()), first.kernel_shape()), case.dtype)
        x = first_out = first.render(b, x, b.const(k1, k1.shape, "k"))
    # Forward chain on %arg0 (or on the first convolution's result).
    act_in = x
    probe = None
    if case.pre is not None:
        ch = make_chain(case.pre, x, p.in_axis, active_pre)
        act_in = run_chain(ch, case.pre)
        pre_acts = ch.acts
        # Whole chains only: "producer_multiuse" leaves the forward chain whole too.
        if first is None and variant in ("none", "producer_multiuse"):
            probe = b.module([act_in])
    # Producer.
    kshape = p.kernel_shape()
    kernel_vals = round_to(rng.normal(0, 1 / math.sqrt(p.fan_in()), kshape), case.dtype)
    kernel = b.kernel(kernel_vals, case.kernel_style, rng)
    y = p.render(b, act_in, kernel)
    producer_out = y
    out_axis = p.out_axis
    if case.bias:
        bias = b.const(round_to(rng.normal(0, 0.5, y.shape[out_axis]), case.dtype),
                       (y.shape[out_axis],), "bias")
        bb = b.bcast(bias, [out_axis], y.shape)
        y = b.binary("add", y, bb) if rng.random() < 0.5 else b.binary("add", bb, y)
        post_acts.append(Act("add", "step", y, True))
    post_scale = None
    if case.post is not None:
        ch = make_chain(case.post, y, out_axis, not active_pre)
        y = run_chain(ch, case.post)
        post_acts += ch.acts
        post_scale = ch.expected_scale
    results.append(y)
    main_acts = pre_acts if active_pre else post_acts
    main_multi = multi_pre if active_pre else multi_post
    if variant == "producer_multiuse":
        results.append(first_out if first_out is not None else producer_out)
    elif variant == "intermediate_multiuse" and main_acts:
        limit = len(main_acts) if active_pre else len(main_acts) - 1
        if limit > 0:
            i = case.variant_pos % limit
            main_multi.add(i)
            results.append(main_acts[i].result)
    text = b.module(results)

    # Expectations.
    folds_b, reason_b, whole_b = expect_backward(post_acts, multi_post, variant == "producer_multiuse"
                                                 and not active_pre)
    if case.pre is not None:
        folds_f, reason_f, whole_f = expect_forward(pre_acts, multi_pre, p, case.dtype)
    else:
        folds_f, reason_f, whole_f = 0, False, True
    if first is not None:
        # Backward (into the first convolution) has priority; forward only when that is
        # impossible because the first convolution's result has another user.
        fb, rb, _ = expect_backward(pre_acts, multi_pre, variant == "producer_multiuse")
        if fb or variant != "producer_multiuse":
            folds_f, reason_f, whole_f = fb, rb, True
    if not folds_f:
        # No forward fold predicted: its shift bounds nothing (check_case would otherwise
        # take a forward fold off an expectation that never counted one).
        probe = None
    if folds_f is None:
        folds = None
    else:
        folds = folds_b + folds_f
    has_post_norm = any(a.name not in LAYOUT for a in post_acts[1 if case.bias else 0:])
    has_pre_norm = any(a.name not in LAYOUT for a in pre_acts)
    full = ((not has_post_norm or (folds_b == 1 and whole_b)) and
            (not has_pre_norm or (folds_f == 1 and whole_f)) and folds is not None and folds > 0 and
            (variant == "none" or (first is not None and variant == "producer_multiuse")))
    reason = (folds_b == 0 and reason_b) or (folds_f == 0 and reason_f)
    unchanged = None if folds is None else folds == 0
    expect = Expect(folds=folds, unchanged=unchanged, reason=bool(reason), full=full,
                    clean_report=full)
    if isinstance(p, Conv):
        kernel_axis = p.kernel_layout.index("o")
    else:
        kernel_axis = next(i for i, d in enumerate(p.weight_dims) if d[0] == "w" and d[1] == p.feature)
    return Rendered(text, [a.shape for a in b.args], expect, kernel_vals, kernel_axis, post_scale,
                    probe)


def first_conv(p: Conv, in_features: int) -> Conv:
    """A 1x1 convolution whose result has the layout and shape of `p`'s input."""
    spatial = tuple(Spatial(s.size, 1, 1, 0, 0, 1, 1, False) for s in p.spatial)
    return Conv(p.batch, in_features, p.in_features, 1, 1, spatial, p.in_layout, p.kernel_layout,
                p.in_layout)


# --- strategies ------------------------------------------------------------------------


def _perm(draw, labels: list[str]) -> tuple[str, ...]:
    return tuple(draw(st.permutations(labels)))


@st.composite
def spatial_dims(draw, lhs_dilation_ok: bool = True) -> Spatial:
    size = draw(st.integers(1, 5))
    window = draw(st.integers(1, 3))
    stride = draw(st.integers(1, 3))
    lhs = draw(st.integers(1, 2)) if lhs_dilation_ok else 1
    rhs = draw(st.integers(1, 2))
    lo = draw(st.integers(-1, 2))
    hi = draw(st.integers(-1, 2))
    rev = draw(st.booleans())
    s = Spatial(size, window, stride, lo, hi, lhs, rhs, rev)
    # Negative padding crops the dilated input; keep at least one real element.
    while size - (-(lo // lhs) if lo < 0 else 0) - (-(hi // lhs) if hi < 0 else 0) < 1:
        lo, hi = min(lo + 1, 0) if lo < 0 else lo, min(hi + 1, 0) if hi < 0 else hi
        s = Spatial(size, window, stride, lo, hi, lhs, rhs, rev)
    # Keep the output non-empty: widen the high padding until a window fits.
    while s.out < 1:
        s = replace(s, pad_hi=s.pad_hi + 1) if s.pad_lo >= 0 or s.pad_hi < 0 else replace(s, pad_lo=s.pad_lo + 1)
    return s


CONV_MODES = ("plain", "plain", "plain", "groups", "batch_groups")


@st.composite
def convs(draw, need_other_axis: str | None = None, equal_to_channels: bool = False,
          forward: bool = False, modes: tuple[str, ...] = CONV_MODES,
          large: bool = False) -> tuple[Conv, int | None]:
    """A convolution; with need_other_axis ("in"/"out"), also a non-feature axis of size >= 2
    (of the input / output), and with equal_to_channels, the channel count set to its size.
    `modes` picks plain, grouped or batch-grouped; `large` draws kernels of more than 4096
    weights (the precision contract's blocked, threaded rounding path)."""
    rank = draw(st.integers(2, 2)) if large else draw(st.integers(1, 3))
    spatial = tuple(draw(spatial_dims()) for _ in range(rank))
    if large:
        spatial = tuple(replace(s, window=3, size=max(s.size, 3), stride=1, lhs_dilation=1, rhs_dilation=1,
                                pad_lo=max(s.pad_lo, 0), pad_hi=max(s.pad_hi, 0)) for s in spatial)
    if equal_to_channels:
        mode = "plain"
    else:
        mode = draw(st.sampled_from(modes))
    g = draw(st.integers(2, 3)) if mode == "groups" else 1
    bg = draw(st.integers(2, 3)) if mode == "batch_groups" else 1
    batch = bg * draw(st.integers(1, 2))
    ci = draw(st.integers(22, 28)) if large else draw(st.integers(1, 3))
    ok = draw(st.integers(22, 28)) if large else draw(st.integers(1, 3))
    labels = [str(i) for i in range(rank)]
    conv = Conv(batch, g * ci, max(g, bg) * ok, g, bg, spatial,
                _perm(draw, ["b", "f"] + labels), _perm(draw, ["i", "o"] + labels),
                _perm(draw, ["b", "f"] + labels), explicit_pad=forward and draw(st.booleans()))
    size = math.prod(conv.out_shape())
    if size < MIN_OUTPUT_ELEMENTS:
        conv = replace(conv, batch=batch * -(-MIN_OUTPUT_ELEMENTS // size))
    other = None
    if need_other_axis:
        shape = conv.in_shape() if need_other_axis == "in" else conv.out_shape()
        feature = conv.in_axis if need_other_axis == "in" else conv.out_axis
        candidates = [d for d, n in enumerate(shape) if d != feature and n >= 2]
        if not candidates:
            conv = replace(conv, batch=2 * bg)
            shape = conv.in_shape() if need_other_axis == "in" else conv.out_shape()
            candidates = [d for d, n in enumerate(shape) if d != feature and n >= 2]
        other = draw(st.sampled_from(candidates))
        if equal_to_channels:
            if need_other_axis == "in":
                conv = replace(conv, in_features=shape[other])
            else:
                conv = replace(conv, out_features=shape[other])
    return conv, other


@st.composite
def dots(draw, need_other_axis: str | None = None, equal_to_channels: bool = False
         ) -> tuple[Dot, int | None]:
    """A dot_general with a constant weight; with need_other_axis ("in"/"out"), also an axis
    of the activation / result of size >= 2 that no fold may use (batching or activation free)."""
    nb = draw(st.integers(0, 2))
    nc = draw(st.integers(1, 2))
    na = draw(st.integers(1 if need_other_axis else 0, 2))
    nw = draw(st.integers(1, 2))
    size = st.integers(1, 4)
    batch = [("b", i, draw(size)) for i in range(nb)]
    contract = [("c", i, draw(size)) for i in range(nc)]
    act_free = [("a", i, draw(size)) for i in range(na)]
    w_free = [("w", i, draw(size)) for i in range(nw)]
    feature = draw(st.integers(0, nw - 1))
    out_size = math.prod(d[2] for d in batch + act_free + w_free)
    if out_size < MIN_OUTPUT_ELEMENTS:
        grow = -(-MIN_OUTPUT_ELEMENTS // out_size)
        if act_free:
            act_free[0] = ("a", 0, act_free[0][2] * grow)
        elif batch:
            batch[0] = ("b", 0, batch[0][2] * grow)
        else:
            w_free[feature] = ("w", feature, w_free[feature][2] * grow)
    other = None
    if need_other_axis:
        # The axis must not be a weight free dim (a fold along it would be legitimate).
        pool = batch + act_free if need_other_axis == "out" else batch + act_free
        pick = draw(st.sampled_from(pool))
        bumped = (pick[0], pick[1], max(2, pick[2]))
        batch = [bumped if d == pick else d for d in batch]
        act_free = [bumped if d == pick else d for d in act_free]
        if equal_to_channels:
            if need_other_axis == "out":
                w_free = [(d[0], d[1], bumped[2]) if d[1] == feature else d for d in w_free]
            else:
                contract = [(d[0], d[1], bumped[2]) if d[1] == 0 else d for d in contract]
        pick = bumped
    act = tuple(draw(st.permutations(batch + contract + act_free)))
    weight = tuple(draw(st.permutations(batch + contract + w_free)))
    dot = Dot(draw(st.booleans()), act, weight, feature)
    if need_other_axis == "out":
        other = next(i for i, d in enumerate(dot.out_dims()) if d[:2] == pick[:2])
    elif need_other_axis == "in":
        other = next(i for i, d in enumerate(dot.act_dims) if d[:2] == pick[:2])
    return dot, other


@st.composite
def chain_specs(draw, forms=FORMS, zero_shift_ok: bool = True) -> ChainSpec:
    """zero_shift_ok=False for variants: a zero constant varies along no axis at all."""
    form = draw(st.sampled_from(forms))
    return ChainSpec(form=form, eps=draw(st.sampled_from(EPSILONS)),
                     zero_shift=(draw(st.booleans()) if zero_shift_ok and
                                 form not in ("random", "scale", "none") else False),
                     wrap=draw(st.sampled_from(["none", "none", "none", "none", "reshape", "transpose"])),
                     const_style=draw(st.sampled_from(["vec", "k", "full", "scalar"])),
                     swap=draw(st.booleans()))


KERNEL_STYLES = st.sampled_from(["const", "const", "const", "reshape", "transpose", "reverse", "call"])
DTYPE_STRATEGY = st.sampled_from(["f32", "f32", "f32", "f32", "f16", "bf16"])
NORM_FORMS = tuple(f for f in FORMS if f != "none")


@st.composite
def cases(draw, direction: str = "backward", producer: str | None = None,
          variants=("none",), dtypes=DTYPE_STRATEGY, forms=FORMS,
          conv_modes: tuple[str, ...] = CONV_MODES, large: bool = False) -> Case:
    variant = draw(st.sampled_from(variants))
    kind = producer or draw(st.sampled_from(["conv", "conv", "dot"]))
    if direction == "between":
        kind = "conv"
    side = "in" if direction in ("forward", "between") else "out"
    need = side if variant in ("wrong_axis", "nonfeature_const") else None
    equal = variant == "wrong_axis"
    if kind == "conv":
        prod, other = draw(convs(need_other_axis=need, equal_to_channels=equal,
                                 forward=direction == "forward", modes=conv_modes, large=large))
    else:
        prod, other = draw(dots(need_other_axis=need, equal_to_channels=equal))
    if variant == "none":
        forms_here = forms
    elif variant == "nonfeature_const":
        forms_here = tuple(f for f in forms if f not in ("bn", "none"))
    else:
        forms_here = tuple(f for f in forms if f != "none")
    post = pre = None
    if direction in ("backward", "both"):
        post = draw(chain_specs(forms_here if direction == "backward" else NORM_FORMS,
                                zero_shift_ok=variant == "none"))
    if direction in ("forward", "both", "between"):
        pre = draw(chain_specs(forms_here if direction != "both" else NORM_FORMS,
                               zero_shift_ok=variant == "none"))
        if variant in ("wrong_axis", "nonfeature_const") or direction == "both":
            pre = replace(pre, wrap="none")
    if post is not None and variant in ("wrong_axis", "nonfeature_const"):
        post = replace(post, wrap="none")
    bias = draw(st.booleans())
    return Case(dtype=draw(dtypes), producer=prod, direction=direction, post=post, pre=pre,
                bias=bias, variant=variant, variant_pos=draw(st.integers(0, 5)), wrong_axis=other,
                seed=draw(st.integers(0, 2**32 - 1)), kernel_style=draw(KERNEL_STYLES),
                first_in_features=draw(st.integers(1, 3)))
