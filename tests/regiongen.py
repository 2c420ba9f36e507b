"""Random region graphs for bnfold's differential fuzzer (see tests/test_fuzz.py).

A `Graph` is a small tree of drawn choices (hypothesis strategies at the end of
this file); `build(graph)` turns it into a `Program`: one `func.func @main` (plus
private helpers) in a tiny SSA IR whose every value also carries its float64
reference value and a magnitude bound, computed here with numpy while the program
is built (`Builder`). `emit` prints a program as MLIR text (generic op syntax,
constants as little-endian hex so every value is exact) in one of three modes:

* "orig"      the module under test, in its own float types (f32 / f16 / bf16,
              mixed through converts);
* "f64"       the same graph with every float type replaced by f64 (converts
              become f64 -> f64 no-ops) and the same rounded constants: the
              float64 reference of the original (numpy's values must match it);
* "magnitude" the f64 graph with every producer's kernel replaced by |K| and a
              `stablehlo.abs` inserted on each producer's activation operand: it
              measures |K| applied to |the value the original feeds the producer|.
              `Program.magnitude` is the stricter bound test_fuzz also uses.

What a graph holds:

* an optional input normalization (loc "bn0") before layer 1, `(x - m) / d` or
  `x * s + t` per channel with |m / d| log-uniform in 1e-1..1e5 (capped where f16
  cannot hold it), optionally followed by a float convert that narrows or widens;
  the input is drawn as `m + d * N(0, 1)` so the normalized values are O(1);
* 1 to 3 layers (loc "layerN"): `stablehlo.convolution` (1-2 spatial dims, random
  input / kernel / output layouts, plain, grouped or depthwise, strides, zero
  padding none / SAME-like / random, rhs_dilation, sometimes lhs_dilation) or
  `stablehlo.dot_general` (weight on either side, either orientation), constant
  kernels; each optionally followed by a bias add (loc "biasN", before or after)
  and a batch norm (loc "bnN"), `batch_norm_inference` or the decomposed
  `(y - mean) * (gamma * rsqrt(var + eps)) + beta`. The batch-norm statistics are
  the actual statistics of the value entering it (its mean, and a variance that
  puts every value within 2.9 sigma, floored at the values' rounding level), and
  some channels get beta > 3 |gamma|: high-bias absorption has something to absorb
  and its 3-sigma assumption holds on the drawn inputs (`Program.hb_ok` says so);
* after each layer a random region of `Step`s (`STEPS`): bias add / subtract,
  converts, thresholded and leaky ReLU (compare + select; a threshold keeps
  `THRESHOLD_MARGIN` away from every value it is compared with, since the jump at
  it would turn any rounding difference into a large error), clamps with nonzero
  bounds, maximum / minimum, ReLU6, activations in a row, multiply / divide by
  signed constants, large positive scales ("amplify"), negate, abs, reduce_window
  pools (sum and max; window and base dilations, sometimes over the channel axis),
  explicit pads (zero and nonzero values, sometimes on the channel axis), reshape /
  transpose / broadcast_in_dim that keep or break the channel axis, `add(z, z)`,
  fan-out (a residual add, a value also returned), and private helpers (`@relu6*`,
  `@act*`, a `@block*` wrapping the next steps; a helper with constant arguments may
  be called twice with different constants). The region after the last layer
  ends the function (it has no next layer).

Every value is kept finite and representable in its type (a step that would
overflow f16 or grow the tensor past `MAX_ELEMENTS` is dropped, kernels are scaled
by a power of two to keep layer outputs in range), so the original module itself
is well defined; what bnfold makes of it is the test's business. `Program.features`
tags what a program contains ("grouped", "f16_sum_pool", "threshold_nonzero",
"layers_3", ...): test_fuzz's strata require them and its CLI can exclude them.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

FLOATS = ("f32", "f16", "bf16")
NP_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}
EPS = {"f32": float(np.finfo(np.float32).eps), "f16": float(np.finfo(np.float16).eps),
       "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps), "f64": float(np.finfo(np.float64).eps)}
# The largest magnitude a value of the original may reach (f16 overflows at 65504;
# the margin leaves room for the original's own rounding).
LIMIT = {"f32": 1e30, "f16": 2e4, "bf16": 1e30}
MAX_ELEMENTS = 4096
MAX_RANK = 5
# Batch-norm variances put every value of the drawn inputs within this many sigmas
# of the mean: high-bias absorption assumes 3.
SIGMA_MARGIN = 2.9
MODES = ("orig", "f64", "magnitude")
# A thresholded ReLU select(x > thr, x, 0) jumps by thr at x = thr: a threshold within
# rounding distance of a value would make any two roundings of the same computation
# differ by O(thr). Thresholds keep this fraction of max |x| away from every value x,
# by the coarsest float type computed so far (a few units of its rounding).
THRESHOLD_MARGIN = {"f32": 1e-4, "f16": 0.01, "bf16": 0.06}


def round_to(values, dtype: str) -> np.ndarray:
    """`values` rounded to `dtype`, back in float64."""
    return np.asarray(values, dtype=np.float64).astype(NP_DTYPES[dtype]).astype(np.float64)


# --- the IR ------------------------------------------------------------------------------


@dataclass(frozen=True)
class T:
    """A ranked tensor type of the original module (element type f32/f16/bf16 or i1)."""

    shape: tuple[int, ...]
    dtype: str

    def text(self, mode: str) -> str:
        dtype = "f64" if mode != "orig" and self.dtype in FLOATS else self.dtype
        return "tensor<" + "".join(f"{n}x" for n in self.shape) + dtype + ">"


@dataclass(frozen=True)
class Dense:
    """A dense constant attribute; `kernel` constants become |K| in magnitude mode."""

    values: np.ndarray
    type: T
    kernel: bool = False

    def text(self, mode: str) -> str:
        dtype = "f64" if mode != "orig" else self.type.dtype
        values = np.abs(self.values) if mode == "magnitude" and self.kernel else self.values
        data = np.ascontiguousarray(np.asarray(values, np.float64).astype(NP_DTYPES[dtype]))
        return f'dense<"0x{data.tobytes().hex().upper()}"> : {self.type.text(mode)}'


Attr = str | Dense


@dataclass
class Node:
    """One op in generic syntax: `%r = "name"(operands) (region) {attrs} : (ins) -> out loc`."""

    result: str | None
    name: str
    operands: list[str]
    in_types: list[T]
    out_type: T | None
    attrs: list[tuple[str, Attr]] = field(default_factory=list)
    reducer: str | None = None  # reduce_window body: stablehlo.add / stablehlo.maximum
    loc: str | None = None
    activation: int | None = None  # producers: the operand abs() wraps in magnitude mode

    def lines(self, mode: str) -> list[str]:
        out: list[str] = []
        operands = list(self.operands)
        if mode == "magnitude" and self.activation is not None:
            i = self.activation
            name = f"{self.result}_abs"
            t = self.in_types[i].text(mode)
            out.append(f'{name} = "stablehlo.abs"({operands[i]}) : ({t}) -> {t}')
            operands[i] = name
        attrs = ", ".join(f"{k} = {v.text(mode) if isinstance(v, Dense) else v}" for k, v in self.attrs)
        region = ""
        if self.reducer is not None:
            s = T((), self.in_types[1].dtype).text(mode)
            region = (f' ({{\n    ^bb0(%lhs: {s}, %rhs: {s}):\n'
                      f'      %red = "{self.reducer}"(%lhs, %rhs) : ({s}, {s}) -> {s}\n'
                      f'      "stablehlo.return"(%red) : ({s}) -> ()\n    }})')
        ins = ", ".join(t.text(mode) for t in self.in_types)
        res = self.out_type.text(mode) if self.out_type is not None else "()"
        head = f"{self.result} = " if self.result else ""
        loc = f' loc("{self.loc}")' if self.loc else ""
        out.append(f'{head}"{self.name}"({", ".join(operands)}){region}'
                   f'{" {" + attrs + "}" if attrs else ""} : ({ins}) -> {res}{loc}')
        return out


@dataclass
class Val:
    """An SSA value of the program being built: its float64 reference value, an elementwise
    bound `mag` on the magnitudes the original computes it from (see `Builder`), and the
    axis that carries layer channels (None once a reshape or broadcast broke it)."""

    name: str
    type: T
    value: np.ndarray
    axis: int | None = None
    mag: np.ndarray = field(default_factory=lambda: np.zeros(()))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def channels(self) -> int:
        return self.shape[self.axis] if self.axis is not None else 1


@dataclass
class Func:
    name: str
    args: list[Val]
    nodes: list[Node]
    results: list[Val]
    private: bool

    def text(self, mode: str) -> str:
        args = ", ".join(f"{a.name}: {a.type.text(mode)}" for a in self.args)
        rtypes = ", ".join(r.type.text(mode) for r in self.results)
        head = f"  func.func {'private ' if self.private else ''}@{self.name}({args}) -> ({rtypes}) {{"
        body = [f"    {line}" for node in self.nodes for line in node.lines(mode)]
        ret = (f'    "func.return"({", ".join(r.name for r in self.results)}) : ({rtypes}) -> ()')
        return "\n".join([head, *body, ret, "  }"])


@dataclass
class Program:
    """A built graph: functions (main first), its input, and what the oracles need."""

    funcs: list[Func]
    inputs: list[np.ndarray]  # in the input's own dtype
    reference: list[np.ndarray]  # float64 outputs computed by numpy while building
    magnitude: list[np.ndarray]  # the outputs' magnitude bounds (`Builder`)
    norms: list[str]  # locations of every normalization chain ("bn0", "bn1", ...)
    layers: list[str]  # locations of the producers, in data-flow order
    hb_ok: bool  # every drawn batch norm input is within 3 sigma (high-bias assumption)
    features: set[str]
    output_dtypes: list[str]
    dtypes: set[str]  # float types the original computes in

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(itertools.pairwise(self.layers))


def emit(program: Program, mode: str = "orig") -> str:
    """The program as MLIR text in `mode` ("orig", "f64" or "magnitude")."""
    assert mode in MODES
    return "module @fuzz {\n" + "\n".join(f.text(mode) for f in program.funcs) + "\n}\n"


# --- numpy semantics (float64) -----------------------------------------------------------


def pad_ref(x: np.ndarray, value: float, low: Sequence[int], high: Sequence[int],
            interior: Sequence[int]) -> np.ndarray:
    """stablehlo.pad with non-negative edge padding."""
    shape = [lo + hi + n + max(n - 1, 0) * it for n, lo, hi, it in zip(x.shape, low, high, interior)]
    out = np.full(shape, value, dtype=np.float64)
    out[tuple(slice(lo, lo + (n - 1) * (it + 1) + 1, it + 1)
              for n, lo, it in zip(x.shape, low, interior))] = x
    return out


def window_out(size: int, window: int, stride: int, dilation: int) -> int:
    """Output length of a strided, dilated window over `size` (padded) elements."""
    extent = (window - 1) * dilation + 1
    return (size - extent) // stride + 1 if size >= extent else 0


def reduce_window_ref(x: np.ndarray, init: float, reducer: str, window: Sequence[int],
                      strides: Sequence[int], base: Sequence[int], dilations: Sequence[int],
                      padding: Sequence[tuple[int, int]]) -> np.ndarray:
    """stablehlo.reduce_window: padding and base-dilation holes hold `init`."""
    padded = pad_ref(x, init, [p[0] for p in padding], [p[1] for p in padding], [b - 1 for b in base])
    out_shape = [window_out(n, w, s, d) for n, w, s, d in zip(padded.shape, window, strides, dilations)]
    combine = np.add if reducer == "stablehlo.add" else np.maximum
    acc = np.full(out_shape, init, dtype=np.float64)
    for tap in itertools.product(*(range(w) for w in window)):
        acc = combine(acc, padded[tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, s, o in
                                        zip(tap, dilations, strides, out_shape))])
    return acc


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's layouts (labels by position) and window, spatial dims 0..n-1."""

    in_labels: tuple[str, ...]
    kernel_labels: tuple[str, ...]
    out_labels: tuple[str, ...]
    windows: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    groups: int

    @property
    def spatial(self) -> int:
        return len(self.windows)

    def out_sizes(self, in_sizes: Sequence[int]) -> list[int]:
        return [window_out((n - 1) * l + 1 + lo + hi, w, s, r) for n, w, s, (lo, hi), l, r in
                zip(in_sizes, self.windows, self.strides, self.padding, self.lhs_dilation,
                    self.rhs_dilation)]

    def dimension_numbers(self) -> str:
        return (f"#stablehlo.conv<[{', '.join(self.in_labels)}]x[{', '.join(self.kernel_labels)}]->"
                f"[{', '.join(self.out_labels)}]>")


def _canonical(labels: Sequence[str], first: str, second: str) -> list[int]:
    """Positions of (first, second, 0, 1, ...) in `labels`: the transpose to canonical order."""
    spatial = sorted((l for l in labels if l.isdigit()), key=int)
    return [labels.index(l) for l in (first, second, *spatial)]


def conv_ref(x: np.ndarray, k: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """stablehlo.convolution (feature groups, dilations, non-negative padding) in float64."""
    xc = np.transpose(x, _canonical(g.in_labels, "b", "f"))
    kc = np.transpose(k, _canonical(g.kernel_labels, "o", "i"))
    xc = pad_ref(xc, 0.0, [0, 0] + [p[0] for p in g.padding], [0, 0] + [p[1] for p in g.padding],
                 [0, 0] + [l - 1 for l in g.lhs_dilation])
    batch, channels = xc.shape[:2]
    out_features, per_group = kc.shape[:2]
    groups = g.groups
    out_sizes = [window_out(n, w, s, r) for n, w, s, r in
                 zip(xc.shape[2:], g.windows, g.strides, g.rhs_dilation)]
    xg = xc.reshape(batch, groups, per_group, *xc.shape[2:])
    kg = kc.reshape(groups, out_features // groups, per_group, *kc.shape[2:])
    out = np.zeros((batch, groups, out_features // groups, *out_sizes))
    for tap in itertools.product(*(range(w) for w in g.windows)):
        index = tuple(slice(t * r, t * r + (o - 1) * s + 1, s) for t, r, s, o in
                      zip(tap, g.rhs_dilation, g.strides, out_sizes))
        out += np.einsum("bgi...,goi->bgo...", xg[(slice(None),) * 3 + index], kg[(Ellipsis, *tap)])
    out = out.reshape(batch, out_features, *out_sizes)
    return np.transpose(out, np.argsort(_canonical(g.out_labels, "b", "f")))


# --- the builder -------------------------------------------------------------------------


@dataclass
class _Scope:
    name: str
    args: list[Val]
    nodes: list[Node] = field(default_factory=list)
    count: int = 0  # SSA names of a helper are local (two calls build the same text)


class Builder:
    """Emits nodes into the current function and computes each value in float64.

    Next to each value it propagates `mag`, an elementwise bound on the magnitudes the
    original rounds on the way to that value, for the conditioning of the outputs:
    constants |c|; add/subtract the sum of the operands' bounds, multiply the product,
    divide by a constant |c|; negate, abs, convert, layout ops and pads carry it along;
    maximum, minimum, clamp and select (1-Lipschitz) the largest operand bound; pools
    sum or take the max of bounds; a producer applies |K| to its input's bound; a batch
    norm is (mag + |mean|) * |gamma| / sqrt(var + eps) + |beta|. The input
    normalization resets it to |its result|: the original computes `(x - m) / d` from
    an exact input, so |x| / d is not a magnitude it rounds.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.count = 0
        self.scopes: list[_Scope] = []
        self.helpers: dict[str, Func] = {}
        self.extra_outputs: list[Val] = []
        self.features: set[str] = set()
        self.dtypes: set[str] = set()
        self.norms: list[str] = []  # locations of the runtime normalizations the regions made

    # -- scopes and bookkeeping --

    @property
    def scope(self) -> _Scope:
        return self.scopes[-1]

    @property
    def in_helper(self) -> bool:
        return len(self.scopes) > 1

    def fresh(self) -> str:
        if self.in_helper:
            self.scope.count += 1
            return f"%h{self.scope.count}"
        self.count += 1
        return f"%v{self.count}"

    def mark(self) -> tuple[int, int, int, frozenset[str], int]:
        return (len(self.scope.nodes), len(self.extra_outputs), len(self.helpers),
                frozenset(self.features), len(self.norms))

    def rollback(self, mark: tuple[int, int, int, frozenset[str], int]) -> None:
        nodes, outputs, helpers, features, norms = mark
        del self.scope.nodes[nodes:]
        del self.extra_outputs[outputs:]
        del self.norms[norms:]
        for name in list(self.helpers)[helpers:]:
            del self.helpers[name]
        self.features = set(features)

    def node(self, name: str, operands: Sequence[Val], out: T, value: np.ndarray,
             axis: int | None = None, attrs: Sequence[tuple[str, Attr]] = (), loc: str | None = None,
             reducer: str | None = None, activation: int | None = None,
             mag: np.ndarray | None = None) -> Val:
        """Appends one op; `mag` is the result's magnitude bound (default |value|)."""
        result = self.fresh()
        self.scope.nodes.append(Node(result, name, [v.name for v in operands],
                                     [v.type for v in operands], out, list(attrs), reducer, loc,
                                     activation))
        if out.dtype in FLOATS:
            self.dtypes.add(out.dtype)
        value = np.asarray(value, dtype=np.float64 if out.dtype != "i1" else bool)
        bound = np.abs(value.astype(np.float64)) if mag is None else np.broadcast_to(mag, value.shape)
        return Val(result, out, value, axis, np.asarray(bound, dtype=np.float64))

    # -- constants and broadcasts --

    def constant(self, values, dtype: str, loc: str | None = None, kernel: bool = False) -> Val:
        values = round_to(values, dtype)
        t = T(values.shape, dtype)
        return self.node("stablehlo.constant", [], t, values,
                         attrs=[("value", Dense(values, t, kernel))], loc=loc)

    def broadcast(self, v: Val, dims: Sequence[int], shape: tuple[int, ...], axis: int | None,
                  loc: str | None = None) -> Val:
        """broadcast_in_dim: operand dim i becomes result dim dims[i] (dims increasing)."""
        assert list(dims) == sorted(dims)
        missing = [d for d in range(len(shape)) if d not in dims]
        value = np.broadcast_to(np.expand_dims(v.value, missing), shape)
        return self.node("stablehlo.broadcast_in_dim", [v], T(tuple(shape), v.dtype), value, axis,
                         [("broadcast_dimensions", _i64(dims))], loc,
                         mag=np.broadcast_to(np.expand_dims(v.mag, missing), shape))

    def like(self, x: Val, values, per_channel: bool, loc: str | None = None) -> Val:
        """A constant broadcast to x's shape: per channel along x.axis, or one scalar."""
        if per_channel and x.axis is not None:
            c = self.constant(np.broadcast_to(values, (x.channels,)), x.dtype, loc)
            return self.broadcast(c, [x.axis], x.shape, x.axis, loc)
        c = self.constant(np.asarray(values).reshape(-1)[0], x.dtype, loc)
        return self.broadcast(c, [], x.shape, x.axis, loc)

    # -- elementwise --

    def binary(self, name: str, a: Val, b: Val, loc: str | None = None) -> Val:
        assert a.type == b.type, (name, a.type, b.type)
        fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
              "maximum": np.maximum, "minimum": np.minimum}[name]
        mag = {"add": a.mag + b.mag, "subtract": a.mag + b.mag, "multiply": a.mag * b.mag,
               "maximum": np.maximum(a.mag, b.mag), "minimum": np.maximum(a.mag, b.mag)}.get(name)
        if name == "divide":  # by a constant (the generator divides by nothing else)
            mag = a.mag / np.abs(b.value)
        axis = a.axis if a.axis is not None else b.axis
        return self.node(f"stablehlo.{name}", [a, b], a.type, fn(a.value, b.value), axis, loc=loc,
                         mag=mag)

    def unary(self, name: str, a: Val, loc: str | None = None) -> Val:
        fn = {"negate": np.negative, "abs": np.abs, "rsqrt": lambda v: 1 / np.sqrt(v)}[name]
        value = fn(a.value)
        return self.node(f"stablehlo.{name}", [a], a.type, value, a.axis, loc=loc,
                         mag=np.abs(value) if name == "rsqrt" else a.mag)

    def convert(self, a: Val, dtype: str, loc: str | None = None) -> Val:
        """A float convert: a no-op in the float64 reference."""
        return self.node("stablehlo.convert", [a], T(a.shape, dtype), a.value, a.axis, loc=loc, mag=a.mag)

    def compare(self, a: Val, b: Val, direction: str) -> Val:
        fn = {"GT": np.greater, "GE": np.greater_equal, "LT": np.less, "LE": np.less_equal}[direction]
        return self.node("stablehlo.compare", [a, b], T(a.shape, "i1"), fn(a.value, b.value), a.axis,
                         [("comparison_direction", f"#stablehlo<comparison_direction {direction}>")])

    def select(self, pred: Val, a: Val, b: Val) -> Val:
        return self.node("stablehlo.select", [pred, a, b], a.type, np.where(pred.value, a.value, b.value),
                         a.axis, mag=np.maximum(a.mag, b.mag))

    def clamp(self, lo: Val, x: Val, hi: Val) -> Val:
        return self.node("stablehlo.clamp", [lo, x, hi], x.type,
                         np.minimum(np.maximum(x.value, lo.value), hi.value), x.axis,
                         mag=np.maximum(x.mag, np.maximum(lo.mag, hi.mag)))

    # -- layout --

    def reshape(self, x: Val, shape: tuple[int, ...], axis: int | None) -> Val:
        return self.node("stablehlo.reshape", [x], T(shape, x.dtype), x.value.reshape(shape), axis,
                         mag=x.mag.reshape(shape))

    def transpose(self, x: Val, perm: Sequence[int]) -> Val:
        axis = list(perm).index(x.axis) if x.axis is not None else None
        return self.node("stablehlo.transpose", [x], T(tuple(x.shape[p] for p in perm), x.dtype),
                         np.transpose(x.value, perm), axis, [("permutation", _i64(perm))],
                         mag=np.transpose(x.mag, perm))

    def pad(self, x: Val, value: Val, low: Sequence[int], high: Sequence[int],
            interior: Sequence[int], axis: int | None) -> Val:
        out = pad_ref(x.value, float(value.value), low, high, interior)
        return self.node("stablehlo.pad", [x, value], T(out.shape, x.dtype), out, axis,
                         [("edge_padding_low", _i64(low)), ("edge_padding_high", _i64(high)),
                          ("interior_padding", _i64(interior))],
                         mag=pad_ref(x.mag, abs(float(value.value)), low, high, interior))

    def reduce_window(self, x: Val, init: Val, reducer: str, window: Sequence[int],
                      strides: Sequence[int], base: Sequence[int], dilations: Sequence[int],
                      padding: Sequence[tuple[int, int]], axis: int | None) -> Val:
        out = reduce_window_ref(x.value, float(init.value), reducer, window, strides, base, dilations,
                                padding)
        mag = reduce_window_ref(x.mag, 0.0, reducer, window, strides, base, dilations, padding)
        return self.node("stablehlo.reduce_window", [x, init], T(out.shape, x.dtype), out, axis,
                         [("window_dimensions", _i64(window)), ("window_strides", _i64(strides)),
                          ("base_dilations", _i64(base)), ("window_dilations", _i64(dilations)),
                          ("padding", _padding(padding))], reducer=reducer, mag=mag)

    def reduce(self, x: Val, init: Val, reducer: str, dims: Sequence[int]) -> Val:
        """stablehlo.reduce over `dims` (a global pool); the channel axis moves down past them."""
        dims = sorted(dims)
        combine = np.sum if reducer == "stablehlo.add" else np.max
        out = combine(x.value, axis=tuple(dims)) if dims else x.value
        axis = None if x.axis is None or x.axis in dims else x.axis - sum(d < x.axis for d in dims)
        return self.node("stablehlo.reduce", [x, init], T(np.shape(out), x.dtype), out, axis,
                         [("dimensions", _i64(dims))], reducer=reducer,
                         mag=combine(x.mag, axis=tuple(dims)))

    # -- producers and normalizations --

    def conv(self, x: Val, kernel: Val, g: ConvGeometry, loc: str) -> Val:
        out = conv_ref(x.value, kernel.value, g)
        return self.node("stablehlo.convolution", [x, kernel], T(out.shape, x.dtype), out,
                         g.out_labels.index("f"),
                         [("batch_group_count", "1 : i64"), ("feature_group_count", f"{g.groups} : i64"),
                          ("dimension_numbers", g.dimension_numbers()),
                          ("window_strides", _i64(g.strides)), ("padding", _padding(g.padding)),
                          ("lhs_dilation", _i64(g.lhs_dilation)), ("rhs_dilation", _i64(g.rhs_dilation))],
                         loc, activation=0, mag=conv_ref(x.mag, np.abs(kernel.value), g))

    def dot(self, x: Val, weight: Val, x_axis: int, w_axis: int, weight_lhs: bool, loc: str) -> Val:
        """dot_general contracting x's `x_axis` with the weight's `w_axis` (no batching)."""
        if weight_lhs:
            out = np.tensordot(weight.value, x.value, axes=([w_axis], [x_axis]))
            mag = np.tensordot(np.abs(weight.value), x.mag, axes=([w_axis], [x_axis]))
            operands, dims, axis = [weight, x], (w_axis, x_axis), 0
        else:
            out = np.tensordot(x.value, weight.value, axes=([x_axis], [w_axis]))
            mag = np.tensordot(x.mag, np.abs(weight.value), axes=([x_axis], [w_axis]))
            operands, dims, axis = [x, weight], (x_axis, w_axis), out.ndim - 1
        numbers = (f"#stablehlo.dot<lhs_contracting_dimensions = [{dims[0]}], "
                   f"rhs_contracting_dimensions = [{dims[1]}]>")
        return self.node("stablehlo.dot_general", operands, T(out.shape, x.dtype), out, axis,
                         [("dot_dimension_numbers", numbers)], loc, activation=1 if weight_lhs else 0,
                         mag=mag)

    def batch_norm(self, x: Val, gamma: Val, beta: Val, mean: Val, var: Val, eps: float,
                   loc: str) -> Val:
        assert x.axis is not None
        eps32 = float(np.float32(eps))
        shape = [1] * len(x.shape)
        shape[x.axis] = x.channels
        scale = (gamma.value / np.sqrt(var.value + eps32)).reshape(shape)
        out = (x.value - mean.value.reshape(shape)) * scale + beta.value.reshape(shape)
        mag = (x.mag + np.abs(mean.value).reshape(shape)) * np.abs(scale) + np.abs(beta.value).reshape(shape)
        return self.node("stablehlo.batch_norm_inference", [x, gamma, beta, mean, var], x.type, out,
                         x.axis, [("epsilon", f"{eps32:.9e} : f32"), ("feature_index", f"{x.axis} : i64")],
                         loc, mag=mag)

    # -- private functions --

    def call(self, name: str, args: Sequence[Val], body: Callable[[Builder, list[Val]], Val]) -> Val:
        """Calls private @name(args), whose body `body` builds; the first call defines it,
        later calls must build the same text (the body may not depend on values)."""
        params = [Val(f"%{name}_a{i}", a.type, a.value, a.axis, a.mag) for i, a in enumerate(args)]
        self.scopes.append(_Scope(name, params))
        try:
            result = body(self, params)
        finally:
            scope = self.scopes.pop()
        func = Func(name, params, scope.nodes, [result], private=True)
        known = self.helpers.get(name)
        if known is None:
            self.helpers[name] = func
        else:
            assert known.text("orig") == func.text("orig"), f"@{name} differs between its calls"
            self.features.add("call_twice")
        self.features.add("call")
        return self.node("func.call", list(args), result.type, result.value, result.axis,
                         [("callee", f"@{name}")], mag=result.mag)


def _i64(values: Sequence[int]) -> str:
    return f"array<i64{': ' if len(values) else ''}{', '.join(str(int(v)) for v in values)}>"


def _padding(pairs: Sequence[tuple[int, int]]) -> str:
    rows = ", ".join(f"[{lo}, {hi}]" for lo, hi in pairs)
    return f"dense<[{rows}]> : tensor<{len(pairs)}x2xi64>"


def _valid(v: Val) -> bool:
    """Finite, representable in its type with margin, and small enough to run fast."""
    if v.dtype not in FLOATS:
        return True
    size = math.prod(v.shape)
    return (0 < size <= MAX_ELEMENTS and len(v.shape) <= MAX_RANK and bool(np.all(np.isfinite(v.value)))
            and float(np.max(np.abs(v.value), initial=0.0)) <= LIMIT[v.dtype])


def _mag(v: Val) -> float:
    """The value's largest magnitude (1 for an all-zero value)."""
    m = float(np.max(np.abs(v.value), initial=0.0))
    return m if m > 0 else 1.0


# --- graph specifications (what hypothesis draws) ----------------------------------------


@dataclass(frozen=True)
class InputNorm:
    """`(x - m) / d` ("sub_div") or `x * s + t` ("mul_add") per channel before layer 1,
    with |m / d| = 10**log_offset (per channel within a factor 2), then an optional convert."""

    form: str
    log_offset: float
    convert: str | None


@dataclass(frozen=True)
class ConvSpec:
    groups: str  # "plain", "grouped", "depthwise"
    windows: tuple[int, int]
    strides: tuple[int, int]
    padding: str  # "valid", "same", "random"
    pads: tuple[int, int, int, int]
    rhs_dilation: tuple[int, int]
    lhs_dilation: int
    kernel_perm: int  # index into the permutations of the kernel's labels
    out_perm: int
    spatial_perm: int
    batch_pick: int


@dataclass(frozen=True)
class DotSpec:
    weight_lhs: bool
    transposed: bool  # weight [out, in] instead of [in, out]


@dataclass(frozen=True)
class LayerSpec:
    producer: ConvSpec | DotSpec
    width: int  # output features (per group for grouped convolutions)
    bn: str  # "none", "op", "chain"
    bias: str  # "none", "before", "after" (the batch norm)
    log_weight: float  # kernel magnitude, log10
    spread: float  # per-channel weight ranges vary by 10**(+-spread)
    high_beta: bool  # some channels get beta > 3 |gamma|
    feature_pick: int  # the input feature axis when the channel axis was broken


@dataclass(frozen=True)
class Step:
    """One region op (or a few); `variant`, `pick` and `flag` choose among its forms
    (interpreted modulo what the current value allows)."""

    kind: str
    variant: int = 0
    pick: int = 0
    flag: bool = False


@dataclass(frozen=True)
class Graph:
    dtype: str  # the input's type (and the module's, unless converts change it)
    batch: int
    channels: int
    spatial: tuple[int, ...]
    in_perm: int  # index into the permutations of the input's labels
    input_norm: InputNorm | None
    layers: tuple[LayerSpec, ...]
    regions: tuple[tuple[Step, ...], ...]  # after each layer (the last one: the tail)
    seed: int


# --- building ----------------------------------------------------------------------------


def _permutation(items: Sequence[str], index: int) -> tuple[str, ...]:
    perms = list(itertools.permutations(items))
    return perms[index % len(perms)]


def build(graph: Graph) -> Program:
    """The program of `graph`, with its input and float64 reference outputs."""
    b = Builder(np.random.default_rng(graph.seed))
    x, stats = _input(b, graph)
    b.scopes.append(_Scope("main", [x]))
    cur = x
    norms: list[str] = []
    if graph.input_norm is not None:
        assert stats is not None
        cur = _input_norm(b, cur, graph.input_norm, *stats)
        norms.append("bn0")
    layers: list[str] = []
    hb_ok = True
    for i, spec in enumerate(graph.layers, 1):
        cur, within = _layer(b, cur, spec, i)
        layers.append(f"layer{i}")
        if spec.bn != "none":
            norms.append(f"bn{i}")
            hb_ok = hb_ok and (within or i == len(graph.layers))
        cur = _region(b, cur, graph.regions[i - 1])
    b.features.add(f"layers_{len(layers)}")
    scope = b.scopes.pop()
    results = [cur, *b.extra_outputs]
    main = Func("main", [x], scope.nodes, results, private=False)
    input_value = x.value.astype(NP_DTYPES[x.dtype])
    return Program([main, *b.helpers.values()], [input_value], [r.value for r in results],
                   [r.mag for r in results], norms + b.norms, layers, hb_ok, b.features | b.dtypes,
                   [r.dtype for r in results], set(b.dtypes))


def _input(b: Builder, graph: Graph) -> tuple[Val, tuple[np.ndarray, np.ndarray] | None]:
    """The argument %arg0 (value drawn around the input normalization's mean, if any) and
    that normalization's per-channel mean m and spread d."""
    labels = _permutation(["b", "f", *(str(i) for i in range(len(graph.spatial)))], graph.in_perm)
    shape = tuple(graph.batch if l == "b" else graph.channels if l == "f" else graph.spatial[int(l)]
                  for l in labels)
    axis = labels.index("f")
    z = b.rng.standard_normal(shape)
    stats = None
    if graph.input_norm is not None:
        m, d = stats = _input_statistics(b.rng, graph.channels, graph.input_norm, graph.dtype)
        bshape = [1] * len(shape)
        bshape[axis] = graph.channels
        z = m.reshape(bshape) + d.reshape(bshape) * z
    b.dtypes.add(graph.dtype)
    x = round_to(z, graph.dtype)
    return Val("%arg0", T(shape, graph.dtype), x, axis, np.abs(x)), stats


def _input_statistics(rng: np.random.Generator, channels: int, spec: InputNorm, dtype: str
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean m and spread d with |m / d| around 10**log_offset."""
    d = 10.0 ** rng.uniform(-1, 2, channels)
    ratio = 10.0 ** (spec.log_offset + rng.uniform(-0.15, 0.15, channels))
    if dtype == "f16":  # t = -m / d must be an f16 too
        ratio = np.minimum(ratio, LIMIT["f16"] / 2)
    m = ratio * d * rng.choice([-1.0, 1.0], channels)
    if dtype == "f16":  # keep m + 5 d inside f16's range
        shrink = np.minimum(1.0, LIMIT["f16"] / (np.abs(m) + 5 * d))
        m, d = m * shrink, d * shrink
    return round_to(m, dtype), round_to(d, dtype)


def _input_norm(b: Builder, x: Val, spec: InputNorm, m: np.ndarray, d: np.ndarray) -> Val:
    b.features.add("input_norm")
    if float(np.max(np.abs(m / d))) > 100:
        b.features.add("large_offset")
    if spec.form == "sub_div":
        y = b.binary("subtract", x, b.like(x, m, True, "bn0"), "bn0")
        y = b.binary("divide", y, b.like(x, d, True, "bn0"), "bn0")
    else:
        y = b.binary("multiply", x, b.like(x, 1.0 / d, True, "bn0"), "bn0")
        y = b.binary("add", y, b.like(x, -m / d, True, "bn0"), "bn0")
    if spec.convert is not None and spec.convert != x.dtype:
        b.features.add(_convert_kind(x.dtype, spec.convert))
        y = b.convert(y, spec.convert, "cvt0")
    y.mag = np.abs(y.value)  # see `Builder`: not |x| / d + |m / d|
    return y


def _convert_kind(src: str, dst: str) -> str:
    if src == "f32":
        return "narrowing_convert"
    return "widening_convert" if dst == "f32" else "cross_convert"


def _layer(b: Builder, x: Val, spec: LayerSpec, index: int) -> tuple[Val, bool]:
    """Layer `index` with its bias and batch norm; also whether its batch-norm input is
    within 3 sigma everywhere (True without a batch norm)."""
    rank = len(x.shape)
    axis = x.axis if x.axis is not None else spec.feature_pick % rank
    x = Val(x.name, x.type, x.value, axis, x.mag)
    loc = f"layer{index}"
    conv = None
    if isinstance(spec.producer, ConvSpec) and rank in (3, 4):
        conv = _conv_geometry(b, x, spec, spec.producer)
    if conv is not None:
        geometry, out_features = conv
        per_group = x.channels // geometry.groups
        w = _weights(b, out_features, per_group, math.prod(geometry.windows), spec)
        canonical = w.reshape(out_features, per_group, *geometry.windows)
        values = np.transpose(canonical, np.argsort(_canonical(geometry.kernel_labels, "o", "i")))
        values = _fit(values, lambda k: conv_ref(x.value, k, geometry), x.dtype)
        y = b.conv(x, b.constant(values, x.dtype, kernel=True), geometry, loc)
        b.features.add("conv")
    else:
        d = spec.producer if isinstance(spec.producer, DotSpec) else DotSpec(False, False)
        width = spec.width if x.value.size // x.channels * spec.width <= MAX_ELEMENTS else 1
        w = _weights(b, width, x.channels, 1, spec)[:, :, 0]  # [out, in]
        values = w if d.transposed else w.T
        w_axis = 1 if d.transposed else 0
        values = _fit(values, lambda k: np.tensordot(x.value, k, axes=([axis], [w_axis])), x.dtype)
        y = b.dot(x, b.constant(values, x.dtype, kernel=True), axis, w_axis, d.weight_lhs, loc)
        b.features.add("dot")
    bias_loc = f"bias{index}"
    if spec.bias == "before":
        y = b.binary("add", y, b.like(y, b.rng.normal(0, 0.5, y.channels) * _rms(y), True, bias_loc),
                     bias_loc)
    within = True
    if spec.bn != "none":
        y, within = _batch_norm(b, y, spec, f"bn{index}")
        b.features.add(f"bn_{spec.bn}")
    if spec.bias == "after":
        y = b.binary("add", y, b.like(y, b.rng.normal(0, 0.5, y.channels) * _rms(y), True, bias_loc),
                     bias_loc)
    return y, within


def _rms(v: Val) -> float:
    return float(np.sqrt(np.mean(v.value ** 2))) or 1.0


def _fit(kernel: np.ndarray, apply: Callable[[np.ndarray], np.ndarray], dtype: str) -> np.ndarray:
    """The kernel rounded to `dtype`, scaled by a power of two so that it and the layer's
    output stay well inside the type's range."""
    limit = LIMIT.get(dtype, 1e30) / 16
    peak = max(float(np.max(np.abs(kernel))), float(np.max(np.abs(apply(kernel)), initial=0.0)))
    if peak > limit:
        kernel = kernel * 2.0 ** -math.ceil(math.log2(peak / limit))
    return round_to(kernel, dtype)


def _weights(b: Builder, out_features: int, in_features: int, taps: int, spec: LayerSpec
             ) -> np.ndarray:
    """[out, in, taps] weights: N(0, 1/fan_in) * 10**log_weight, per-channel ranges spread."""
    rng = b.rng
    w = rng.standard_normal((out_features, in_features, taps)) / math.sqrt(in_features * taps)
    w *= 10.0 ** spec.log_weight
    w *= (10.0 ** rng.uniform(-spec.spread, spec.spread, out_features))[:, None, None]
    w *= (10.0 ** rng.uniform(-spec.spread, spec.spread, in_features))[None, :, None]
    return w


def _conv_geometry(b: Builder, x: Val, spec: LayerSpec, c: ConvSpec) -> tuple[ConvGeometry, int] | None:
    """The convolution `c` describes over x (feature axis x.axis) and its output features;
    None if its output would be too large."""
    assert x.axis is not None
    rank = len(x.shape)
    n = rank - 2
    others = [d for d in range(rank) if d != x.axis]
    batch = others[c.batch_pick % len(others)]
    spatial_axes = [d for d in others if d != batch]
    numbering = _permutation([str(i) for i in range(n)], c.spatial_perm)
    in_labels = ["b" if d == batch else "f" if d == x.axis else "" for d in range(rank)]
    for pos, label in zip(spatial_axes, numbering):
        in_labels[pos] = label
    sizes = [x.shape[in_labels.index(str(i))] for i in range(n)]
    channels = x.channels
    if c.groups == "depthwise" or (c.groups == "grouped" and channels > 1):
        divisors = [g for g in range(2, channels + 1) if channels % g == 0]
        groups = channels if c.groups == "depthwise" else divisors[spec.width % len(divisors)]
        out_features = groups * (1 + spec.width % 2)
    else:
        groups, out_features = 1, spec.width
    windows, strides, pads, lhs, rhs = [], [], [], [], []
    for i, size in enumerate(sizes):
        l = c.lhs_dilation if size > 1 else 1
        dilated = (size - 1) * l + 1
        w, s, r = c.windows[i], c.strides[i], c.rhs_dilation[i]
        if c.padding == "same":
            total = max((-(-dilated // s) - 1) * s + (w - 1) * r + 1 - dilated, 0)
            lo, hi = total // 2, total - total // 2
        elif c.padding == "random":
            lo, hi = c.pads[2 * i], c.pads[2 * i + 1]
        else:
            lo = hi = 0
        while (w - 1) * r + 1 > dilated + lo + hi:
            r, w = (1, w) if r > 1 else (r, w - 1)
        windows.append(w)
        strides.append(s)
        pads.append((lo, hi))
        lhs.append(l)
        rhs.append(r)
    spatial_labels = [str(i) for i in range(n)]
    geometry = ConvGeometry(tuple(in_labels), _permutation(["o", "i", *spatial_labels], c.kernel_perm),
                            _permutation(["b", "f", *spatial_labels], c.out_perm), tuple(windows),
                            tuple(strides), tuple(pads), tuple(lhs), tuple(rhs), groups)
    size = x.shape[batch] * out_features * math.prod(geometry.out_sizes(sizes))
    if size > MAX_ELEMENTS:
        return None
    if groups > 1:
        b.features.add("grouped")
        if groups == channels:
            b.features.add("depthwise")
    if any(l > 1 for l in lhs):
        b.features.add("lhs_dilation")
    if any(p != (0, 0) for p in pads):
        b.features.add("conv_padding")
    return geometry, out_features


def _batch_norm(b: Builder, y: Val, spec: LayerSpec, loc: str) -> tuple[Val, bool]:
    """A batch norm of `y` with statistics from its actual values; whether every value is
    within 3 sigma of the rounded statistics."""
    assert y.axis is not None
    rng, dtype, c = b.rng, y.dtype, y.channels
    moved = np.moveaxis(y.value, y.axis, 0).reshape(c, -1)
    mean = round_to(moved.mean(axis=1), dtype)
    eps = 1e-3 if dtype == "f16" or rng.random() < 0.5 else 1e-5
    deviation = np.max(np.abs(moved - mean[:, None]), axis=1) / SIGMA_MARGIN
    # A (nearly) constant channel: no spread below the rounding of its values, which the
    # normalization would otherwise amplify into the output (1 for an all-zero channel).
    floor = 64 * max(EPS[d] for d in b.dtypes) * np.max(np.abs(moved), axis=1)
    deviation = np.maximum(deviation, floor)
    deviation = np.where(deviation > 0, deviation, 1.0)
    # (an f16 variance stays representable; the 3-sigma check below then sees the cap)
    var = round_to(np.minimum(np.maximum(deviation ** 2 - eps, deviation ** 2 * 0.5), LIMIT[dtype]), dtype)
    gamma = 10.0 ** rng.uniform(-1, 1, c) * np.where(rng.random(c) < 0.15, -1.0, 1.0)
    beta = rng.normal(0, 1, c) * np.abs(gamma)
    if spec.high_beta:
        high = rng.random(c) < 0.6
        high[rng.integers(c)] = True
        beta = np.where(high, np.abs(gamma) * rng.uniform(3.5, 8, c), beta)
    gamma, beta = round_to(gamma, dtype), round_to(beta, dtype)
    eps_used = float(np.float32(eps)) if spec.bn == "op" else float(round_to(eps, dtype))
    z = (moved - mean[:, None]) / np.sqrt(var + eps_used)[:, None]
    within = bool(np.all(np.abs(z) <= 3.0))
    g, be, m, v = (b.constant(value, dtype, loc) for value in (gamma, beta, mean, var))
    if spec.bn == "op":
        return b.batch_norm(y, g, be, m, v, eps, loc), within
    e = b.broadcast(b.constant(eps, dtype, loc), [], (c,), None, loc)
    scale = b.binary("multiply", b.unary("rsqrt", b.binary("add", v, e, loc), loc), g, loc)
    centered = b.binary("subtract", y, b.broadcast(m, [y.axis], y.shape, y.axis, loc), loc)
    scaled = b.binary("multiply", centered, b.broadcast(scale, [y.axis], y.shape, y.axis, loc), loc)
    return b.binary("add", scaled, b.broadcast(be, [y.axis], y.shape, y.axis, loc), loc), within


# --- regions -----------------------------------------------------------------------------

StepFn = Callable[[Builder, Val, Step], Val]
# Kinds that cannot run inside a private helper (they need the caller's function).
_MAIN_ONLY = ("output", "call", "helper", "norm", "attention")


def _region(b: Builder, cur: Val, steps: Sequence[Step]) -> Val:
    """Applies `steps` in order; a step whose value would be invalid is dropped."""
    i = 0
    while i < len(steps):
        step = steps[i]
        if step.kind == "call":  # wraps the next steps in a private function
            inner = [s for s in steps[i + 1:i + 2 + step.variant % 3] if s.kind not in _MAIN_ONLY]
            cur = _block_call(b, cur, inner, step)
            i += 2 + step.variant % 3
            continue
        if b.in_helper and step.kind in _MAIN_ONLY:
            i += 1
            continue
        mark = b.mark()
        nxt = STEPS[step.kind](b, cur, step)
        if _valid(nxt):
            cur = nxt
        else:
            b.rollback(mark)
        i += 1
    return cur


def _block_call(b: Builder, cur: Val, inner: list[Step], step: Step) -> Val:
    mark = b.mark()
    name = f"block{len(b.helpers)}"
    out = b.call(name, [cur], lambda bb, args: _region(bb, args[0], inner))
    if not _valid(out):
        b.rollback(mark)
        return cur
    return out


def _nonzero(rng: np.random.Generator, mag: float, low: float = 0.05, high: float = 0.6,
             size: int | None = None) -> np.ndarray:
    return mag * rng.uniform(low, high, size) * rng.choice([-1.0, 1.0], size)


def _zero(b: Builder, x: Val) -> Val:
    return b.like(x, 0.0, False)


def step_relu(b: Builder, x: Val, s: Step) -> Val:
    z = _zero(b, x)
    return b.binary("maximum", *((x, z) if not s.flag else (z, x)))


def step_bias(b: Builder, x: Val, s: Step) -> Val:
    c = b.like(x, b.rng.normal(0, 0.5, x.channels) * _mag(x), s.flag)
    name = "add" if s.variant % 4 < 2 else "subtract"
    return b.binary(name, *((x, c) if s.variant % 2 == 0 else (c, x)))


def step_scale(b: Builder, x: Val, s: Step) -> Val:
    c = 10.0 ** b.rng.uniform(-1, 1, x.channels) * (-1.0 if s.pick % 3 == 0 else 1.0)
    const = b.like(x, c, s.flag)
    if s.variant % 3 == 2:
        return b.binary("divide", x, const)
    return b.binary("multiply", *((x, const) if s.variant % 3 == 0 else (const, x)))


def step_amplify(b: Builder, x: Val, s: Step) -> Val:
    """Multiply by a large positive constant: 10 to 1000, or for f16 up to where a 3x3 sum
    of the result comes within a factor of 2-4 of f16's range (large activations, as
    before a sum pool; the original stays finite)."""
    c = 10.0 ** b.rng.uniform(1, 3)
    if x.dtype == "f16":  # (the constant itself must be an f16 too)
        c = min(LIMIT["f16"] / (9 * _mag(x)) * b.rng.uniform(0.5, 1.0), 6e4)
    b.features.add("amplify")
    return b.binary("multiply", x, b.like(x, c, False))


def step_negate(b: Builder, x: Val, s: Step) -> Val:
    return b.unary("negate", x)


def step_abs(b: Builder, x: Val, s: Step) -> Val:
    return b.unary("abs", x)


def step_double(b: Builder, x: Val, s: Step) -> Val:
    return b.binary("add", x, x)


def step_convert(b: Builder, x: Val, s: Step) -> Val:
    targets = [d for d in FLOATS if d != x.dtype]
    target = targets[s.variant % len(targets)]
    b.features.add(_convert_kind(x.dtype, target))
    return b.convert(x, target)


def step_relu6(b: Builder, x: Val, s: Step) -> Val:
    """ReLU6 as clamp(0, x, 6) (variant 0) or minimum(maximum(x, 0), 6) (variant 1), or a
    clamp to [0, hi] with a random hi (variant 2)."""
    variant = s.variant % 3
    if variant == 1:
        return b.binary("minimum", b.binary("maximum", x, _zero(b, x)), b.like(x, 6.0, False))
    hi = 6.0 if variant == 0 else _mag(x) * b.rng.uniform(0.2, 1.0)
    return b.clamp(b.constant(0.0, x.dtype), x, b.constant(hi, x.dtype))


def step_clamp(b: Builder, x: Val, s: Step) -> Val:
    """clamp(lo, x, hi) with a nonzero lower bound of either sign, scalar or (flag) per channel."""
    mag, rng = _mag(x), b.rng
    size = x.channels if s.flag and x.axis is not None else 1
    lo = _nonzero(rng, mag, 0.05, 0.5, size)
    if s.variant % 2 == 1:  # a positive lower bound (a shifted ReLU)
        lo = np.abs(lo)
    hi = lo + mag * rng.uniform(0.3, 1.5, size)
    if np.any(round_to(lo, x.dtype) != 0):
        b.features.add("clamp_nonzero_lo")
    if size > 1:
        return b.clamp(b.like(x, lo, True), x, b.like(x, hi, True))
    return b.clamp(b.constant(lo[0], x.dtype), x, b.constant(hi[0], x.dtype))


def step_threshold(b: Builder, x: Val, s: Step) -> Val:
    """Thresholded ReLU select(x > thr, x, 0) with a nonzero threshold (`flag`: per channel)."""
    thr_v = b.like(x, _thresholds(b, x, s.flag), s.flag)
    b.features.add("threshold_nonzero")
    pred = b.compare(x, thr_v, "GT" if s.variant % 2 == 0 else "GE")
    return b.select(pred, x, _zero(b, x))


def _thresholds(b: Builder, x: Val, per_channel: bool) -> np.ndarray:
    """Nonzero thresholds (one per channel, or one) that keep `THRESHOLD_MARGIN` of the
    value's magnitude away from every value they are compared with."""
    margin = max(THRESHOLD_MARGIN[d] for d in b.dtypes) * _mag(x)
    if per_channel and x.axis is not None:
        groups = list(np.moveaxis(x.value, x.axis, 0).reshape(x.channels, -1))
    else:
        groups = [x.value.reshape(-1)]
    return np.array([_threshold(b.rng, g, margin, x.dtype) for g in groups])


def _threshold(rng: np.random.Generator, values: np.ndarray, margin: float, dtype: str) -> float:
    mag = float(np.max(np.abs(values), initial=0.0)) or 1.0
    for _ in range(64):
        thr = float(round_to(_nonzero(rng, mag, 0.02, 0.9), dtype))
        if abs(thr) >= margin and float(np.min(np.abs(values - thr))) >= margin:
            return thr
    # No gap wide enough: above every value (nothing passes) or below (everything does).
    edge = float(np.max(values)) + 2 * margin if rng.random() < 0.5 else float(np.min(values)) - 2 * margin
    return float(round_to(edge if abs(edge) >= margin else 2 * margin, dtype))


def step_leaky(b: Builder, x: Val, s: Step) -> Val:
    """Leaky ReLU select(x >= 0, x, a * x), a > 0 (variant 3: a < 0)."""
    a = b.rng.uniform(0.01, 0.3, x.channels) * (-1.0 if s.variant % 4 == 3 else 1.0)
    pred = b.compare(x, _zero(b, x), "GE")
    return b.select(pred, x, b.binary("multiply", x, b.like(x, a, s.flag)))


def step_maxmin(b: Builder, x: Val, s: Step) -> Val:
    c = b.like(x, b.rng.uniform(-0.5, 0.5, x.channels) * _mag(x), s.flag)
    name = "maximum" if s.variant % 2 == 0 else "minimum"
    return b.binary(name, *((x, c) if s.pick % 2 == 0 else (c, x)))


def step_relu_add_relu(b: Builder, x: Val, s: Step) -> Val:
    """Several activations in a row: relu, add a constant, then relu (or ReLU6, or a clamp)."""
    y = step_relu(b, x, s)
    y = b.binary("add", y, b.like(y, _nonzero(b.rng, _mag(y), 0.1, 0.5, y.channels), s.flag))
    b.features.add("activations_in_a_row")
    if s.variant % 3 == 1:
        return step_relu6(b, y, Step("relu6", s.pick))
    if s.variant % 3 == 2:
        return step_clamp(b, y, Step("clamp", s.pick, 0, s.flag))
    return step_relu(b, y, Step("relu"))


def step_pool(b: Builder, x: Val, s: Step) -> Val:
    """reduce_window: sum (init 0) or max (init -inf) over non-channel axes; with `flag`,
    a window, dilation or padding also on the channel axis."""
    return _pool(b, x, "stablehlo.add" if s.variant % 2 == 0 else "stablehlo.maximum", s)


def step_sum_pool(b: Builder, x: Val, s: Step) -> Val:
    return _pool(b, x, "stablehlo.add", s)


def _pool(b: Builder, x: Val, reducer: str, s: Step) -> Val:
    rng, rank = b.rng, len(x.shape)
    window, strides, base, dil, padding = [1] * rank, [1] * rank, [1] * rank, [1] * rank, [(0, 0)] * rank
    axes = [d for d in range(rank) if d != x.axis]
    pooled = [d for d in axes if x.shape[d] > 1] or axes or [0]
    for d in pooled[: 1 + s.pick % 2]:
        window[d] = int(rng.integers(2, 4))
        strides[d] = int(rng.integers(1, 3))
        if s.variant % 4 >= 2:
            padding[d] = (int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        if s.variant % 8 >= 6:
            (base if s.pick % 4 >= 2 else dil)[d] = 2
        while window_out((x.shape[d] - 1) * base[d] + 1 + sum(padding[d]), window[d], strides[d],
                         dil[d]) < 1:
            window[d] -= 1
    if s.flag and x.axis is not None:
        a = x.axis
        touch = s.pick % 4
        if touch == 0:
            window[a] = min(2, x.shape[a] + 1)
            padding[a] = (0, 1) if x.shape[a] == 1 else (0, 0)
        elif touch == 1:
            base[a] = 2
        elif touch == 2:
            window[a], dil[a] = (2, 2) if x.shape[a] >= 3 else (1, 2)
        else:
            padding[a] = (1, 0)
        b.features.add("pool_channel")
    init = b.constant(0.0 if reducer == "stablehlo.add" else -np.inf, x.dtype)
    y = b.reduce_window(x, init, reducer, window, strides, base, dil, padding, x.axis)
    b.features.add("sum_pool" if reducer == "stablehlo.add" else "max_pool")
    if reducer == "stablehlo.add" and x.dtype == "f16":
        b.features.add("f16_sum_pool")
    return y


def step_reduce(b: Builder, x: Val, s: Step) -> Val:
    """stablehlo.reduce, sum (init 0) or max (init -inf), over one or more non-channel axes
    (a global pool); with `flag` (and no channel axis left to keep), over every axis but one."""
    axes = [d for d in range(len(x.shape)) if d != x.axis]
    if not axes or (x.axis is None and len(axes) == 1):
        return x
    if s.flag or x.axis is None:
        dims = axes if x.axis is not None else axes[: len(axes) - 1]
    else:
        dims = axes[s.pick % len(axes):][: 1 + s.variant % 2]
    reducer = "stablehlo.add" if s.variant % 3 != 2 else "stablehlo.maximum"
    init = b.constant(0.0 if reducer == "stablehlo.add" else -np.inf, x.dtype)
    b.features.add("reduce")
    return b.reduce(x, init, reducer, dims)


def step_pad(b: Builder, x: Val, s: Step) -> Val:
    """Explicit pad with zero (variant 0) or a nonzero value; `flag`: also the channel axis."""
    rng, rank = b.rng, len(x.shape)
    value = 0.0 if s.variant % 3 == 0 else float(_nonzero(rng, _mag(x), 0.1, 1.0))
    low, high, interior = [0] * rank, [0] * rank, [0] * rank
    for d in range(rank):
        if d != x.axis and rng.random() < 0.6:
            low[d], high[d] = int(rng.integers(0, 3)), int(rng.integers(0, 3))
            if s.variant % 3 == 2 and rng.random() < 0.3:
                interior[d] = 1
    if s.flag and x.axis is not None:
        low[x.axis] = 1
        b.features.add("pad_channel")
    if value != 0:
        b.features.add("pad_nonzero")
    return b.pad(x, b.constant(value, x.dtype), low, high, interior, x.axis)


def step_transpose(b: Builder, x: Val, s: Step) -> Val:
    perm = [int(p) for p in b.rng.permutation(len(x.shape))]
    return b.transpose(x, perm)


def step_reshape(b: Builder, x: Val, s: Step) -> Val:
    """Insert a unit axis (keeps the channel axis), merge two axes or split one (breaks it
    when the channel axis takes part), or drop a unit axis."""
    shape, axis, rank = list(x.shape), x.axis, len(x.shape)
    variant = s.variant % 4
    if variant == 0 or rank == 1:
        pos = s.pick % (rank + 1)
        shape.insert(pos, 1)
        axis = None if axis is None else axis + (1 if pos <= axis else 0)
    elif variant == 1:
        d = s.pick % (rank - 1)
        shape[d:d + 2] = [shape[d] * shape[d + 1]]
        if axis is not None and axis in (d, d + 1):
            axis = d if shape[d] == x.shape[axis] else None
            b.features.add("channel_broken" if axis is None else "channel_kept")
        elif axis is not None and axis > d + 1:
            axis -= 1
    elif variant == 2:
        splittable = [d for d in range(rank) if x.shape[d] % 2 == 0 and x.shape[d] > 2] or [None]
        d = splittable[s.pick % len(splittable)]
        if d is None:
            shape.insert(0, 1)
            axis = None if axis is None else axis + 1
        else:
            shape[d:d + 1] = [2, x.shape[d] // 2]
            if axis == d:
                axis = None
                b.features.add("channel_broken")
            elif axis is not None and axis > d:
                axis += 1
    else:
        units = [d for d in range(rank) if shape[d] == 1 and d != axis]
        if not units:
            return x
        d = units[s.pick % len(units)]
        del shape[d]
        axis = None if axis is None else axis - (1 if d < axis else 0)
    return b.reshape(x, tuple(shape), axis)


def step_broadcast(b: Builder, x: Val, s: Step) -> Val:
    """broadcast_in_dim adding an axis of size 1 or 2 (keeps the channel axis), or
    expanding a unit axis to 2 (breaks it when that axis is the channel axis)."""
    rank = len(x.shape)
    variant = s.variant % 3
    if variant < 2:
        pos = s.pick % (rank + 1)
        dims = [d if d < pos else d + 1 for d in range(rank)]
        shape = list(x.shape)
        shape.insert(pos, 1 + variant)
        axis = None if x.axis is None else dims[x.axis]
        return b.broadcast(x, dims, tuple(shape), axis)
    units = [d for d in range(rank) if x.shape[d] == 1]
    if not units:
        return x
    d = units[s.pick % len(units)]
    shape = list(x.shape)
    shape[d] = 2
    axis = None if x.axis == d else x.axis
    if axis is None and x.axis is not None:
        b.features.add("channel_broken")
    return b.broadcast(x, list(range(rank)), tuple(shape), axis)


def step_residual(b: Builder, x: Val, s: Step) -> Val:
    """Fan-out: add(x, f(x)) with f a ReLU or a scale."""
    y = step_relu(b, x, s) if s.variant % 2 == 0 else step_scale(b, x, Step("scale", 0, s.pick, s.flag))
    b.features.add("fanout")
    return b.binary("add", *((x, y) if s.pick % 2 == 0 else (y, x)))


def step_output(b: Builder, x: Val, s: Step) -> Val:
    """Fan-out: the value is also a function result."""
    b.extra_outputs.append(x)
    b.features.add("fanout")
    return x


def step_norm(b: Builder, x: Val, s: Step) -> Val:
    """A transformer normalization over the channel axis (statistics at run time, loc
    "normK" on the op that multiplies by its weight), read by 1-3 dot_generals with
    constant weights (fan-out), whose outputs are summed. `variant` picks the spelling:
    0 LayerNorm `n * g + b`; 1 Flax `(x - m) * (r * g) + b`; 2 Keras `x * inv + (-m * inv
    + b)` with `inv = r * g`; 3 RMSNorm `w * n`; 4 Gemma `n * (1 + w)`. `flag`: the
    normalized value is also a function result (a use that is not linear: refused); for
    LayerNorm with an odd `pick // 3`, the value partway through its affine (`n * g`
    before `+ b`) is the result instead (refused too)."""
    axis = x.axis
    if axis is None or x.channels < 2 or x.dtype not in FLOATS:
        return x
    c, shape, dtype = x.channels, x.shape, x.dtype
    rest = [d for d in range(len(shape)) if d != axis]
    kind = s.variant % 5
    rows = tuple(shape[d] for d in rest)

    def back(v: Val) -> Val:  # a per-row value (reduced over the channels) back to x's shape
        return b.broadcast(v, rest, shape, axis)

    def mean(v: Val) -> Val:
        total = b.reduce(v, b.constant(0.0, dtype), "stablehlo.add", [axis])
        return b.binary("divide", total, b.broadcast(b.constant(float(c), dtype), [], rows, None))

    centered = kind not in (3, 4)
    m = mean(x) if centered else None
    xm = b.binary("subtract", x, back(m)) if m is not None else x
    var = mean(b.binary("multiply", xm, xm))
    eps = float(round_to(max(1e-5 * float(np.max(var.value, initial=0.0)), 1e-30), dtype))
    r = b.unary("rsqrt", b.binary("add", var, b.broadcast(b.constant(eps, dtype), [], rows, None)))
    rb = back(r)
    loc = f"norm{len(b.norms) + 1}"
    g = b.rng.normal(1.0, 0.5, c)
    beta = b.rng.normal(0.0, 0.5, c)
    partway: Val | None = None
    if kind == 0:
        partway = b.binary("multiply", b.binary("multiply", xm, rb), b.like(x, g, True), loc)
        v = b.binary("add", partway, b.like(x, beta, True))
    elif kind == 1:
        inv = b.binary("multiply", rb, b.like(x, g, True), loc)
        v = b.binary("add", b.binary("multiply", xm, inv), b.like(x, beta, True))
    elif kind == 2:
        assert m is not None
        inv = b.binary("multiply", rb, b.like(x, g, True), loc)
        shift = b.binary("add", b.binary("multiply", back(b.unary("negate", m)), inv),
                         b.like(x, beta, True))
        v = b.binary("add", b.binary("multiply", x, inv), shift)
    elif kind == 3:
        v = b.binary("multiply", b.like(x, g, True), b.binary("multiply", x, rb), loc)
    else:
        w = b.like(x, g - 1.0, True)
        one = b.like(x, 1.0, False)
        weight = b.node("stablehlo.add", [w, one], w.type, w.value + 1.0, axis, mag=w.mag + 1.0)
        v = b.binary("multiply", b.binary("multiply", x, rb), weight, loc)
    b.norms.append(loc)
    v = _norm_path(b, v, s.variant + s.pick, shifted=kind in (0, 1, 2))  # (every path is drawn)
    layers = 1 + s.pick % 3
    out: Val | None = None
    for i in range(layers):
        kernel = b.constant(b.rng.normal(0.0, c ** -0.5, (c, c)), dtype, kernel=True)
        assert v.axis is not None
        y = b.dot(v, kernel, v.axis, 0, False, f"{loc}_layer{i + 1}")
        out = y if out is None else b.binary("add", out, y)
    if s.flag:
        b.extra_outputs.append(partway if partway is not None and (s.pick // 3) % 2 else v)
    elif "norm_sum" in b.features:
        b.features.add("norm_sum_shift")  # a shifted norm's sum, read by its layers only
    b.features.add("norm")
    if layers > 1:
        b.features.add("norm_fan_out")
    assert out is not None
    return out


# The path kinds `_norm_path` draws from, by `pick` (0-14). Sums and means take half the
# draws: they are the only steps that change the shift (`m b`), and a wrong count shows only
# where the norm has one (`norm_sum_shift`): with each kind drawn alike, 12 examples of the
# `norm_path` stratum missed a planted bug in the sum law (the `norm_sum` stratum has one in
# every example).
NORM_PATHS = (0, 1, 2, 3, 4, 5, 6, 2, 3, 2, 3, 2, 3, 3, 2)


def _norm_path(b: Builder, v: Val, pick: int, shifted: bool = True) -> Val:
    """What lies between a norm and its layers (bnfold.laws.NORM_PATH_LAWS), on an axis
    other than the features (`NORM_PATHS`): 0 nothing; 1 a slice (ViT's CLS token); 2 a
    mean (reduce + divide: Swin's and ConvNeXt's pooling); 3 a sum; 4 a pad of zero widths
    (Swin's F.pad when the window divides the map); 5 a real zero pad (refused with a shift:
    the padded positions would read beta); 6 torch.roll (two slices concatenated back,
    Swin's shifted windows). `shifted`: the norm has a shift (beta)."""
    axis = v.axis
    assert axis is not None
    other = [d for d in range(len(v.shape)) if d != axis and v.shape[d] >= 2]
    kind = NORM_PATHS[pick % len(NORM_PATHS)]
    if kind == 0 or not other:
        return v
    d = other[pick // 7 % len(other)]
    b.features.add("norm_path")
    if kind in (2, 3) and shifted:
        b.features.add("norm_sum")
    if kind == 1:
        limit = list(v.shape)
        limit[d] = (v.shape[d] + 1) // 2
        out = _slice(b, v, [0] * len(v.shape), limit)
        return Val(out.name, out.type, out.value, axis, out.mag)
    if kind == 6:
        rank, size = len(v.shape), v.shape[d]
        cut = 1 + pick % (size - 1)
        pieces = []
        for start, limit in ((cut, size), (0, cut)):
            lo, hi = [0] * rank, list(v.shape)
            lo[d], hi[d] = start, limit
            pieces.append(_slice(b, v, lo, hi))
        out = _concat(b, pieces, d)
        return Val(out.name, out.type, out.value, axis, out.mag)
    if kind in (2, 3):
        total = b.reduce(v, b.constant(0.0, v.dtype), "stablehlo.add", [d])
        if kind == 3:
            return total
        return b.binary("divide", total, b.like(total, float(v.shape[d]), False))
    widths = [0] * len(v.shape)
    low = list(widths)
    if kind == 5:
        low[d] = 1
    return b.pad(v, b.constant(0.0, v.dtype), low, widths, widths, axis)


def step_attention(b: Builder, x: Val, s: Step) -> Val:
    """Attention logits: q and k are linear layers of x (features last), their product
    over the last axis (batched over the leading ones) is scaled by 1/sqrt(features),
    loc "scaleK": after the product (variant 0: multiply, 1: divide by sqrt) or on q
    before it (2: divide). `flag`: q is also a function result (the scale must take k's
    way). The logits' last axis carries the channels from here on."""
    axis = x.axis
    if axis is None or x.dtype not in FLOATS or len(x.shape) < 2 or x.channels < 2:
        return x  # (one channel: a scale of 1/sqrt(1), nothing to move)
    c = x.channels
    loc = f"scale{len(b.norms) + 1}"
    q, k = (b.dot(x, b.constant(b.rng.normal(0.0, c ** -0.5, (c, c)), x.dtype, kernel=True),
                  axis, 0, False, f"{loc}_{name}") for name in ("q", "k"))
    if s.flag:
        b.extra_outputs.append(q)
    root = math.sqrt(c)
    if s.variant % 3 == 2:
        q = b.binary("divide", q, b.like(q, root, False), loc)
    rank = len(q.shape)
    batch = list(range(rank - 2))
    out = np.matmul(q.value, np.swapaxes(k.value, -1, -2))
    mag = np.matmul(q.mag, np.swapaxes(k.mag, -1, -2))
    numbers = (f"#stablehlo.dot<lhs_batching_dimensions = [{', '.join(map(str, batch))}], "
               f"rhs_batching_dimensions = [{', '.join(map(str, batch))}], "
               f"lhs_contracting_dimensions = [{rank - 1}], rhs_contracting_dimensions = [{rank - 1}]>")
    logits = b.node("stablehlo.dot_general", [q, k], T(out.shape, x.dtype), out, rank - 1,
                    [("dot_dimension_numbers", numbers)], mag=mag)
    if s.variant % 3 == 0:
        logits = b.binary("multiply", logits, b.like(logits, 1.0 / root, False), loc)
    elif s.variant % 3 == 1:
        logits = b.binary("divide", logits, b.like(logits, root, False), loc)
    b.norms.append(loc)
    b.features.add("attention")
    return logits


def step_helper(b: Builder, x: Val, s: Step) -> Val:
    """A private activation helper: @relu6(x) (clamp or maximum + minimum), @act(x, thr)
    = select(x > thr, x, 0), or @act(x, lo, hi) = clamp(lo, x, hi); with `flag`, a
    helper with constant arguments is called twice with different constants."""
    variant = s.variant % 4
    if variant < 2:
        name = f"relu6_{x.dtype}_{'x'.join(map(str, x.shape))}_{variant}"
        y = b.call(name, [x], lambda bb, a: step_relu6(bb, a[0], Step("relu6", variant)))
        if s.flag:
            y = b.call(name, [y], lambda bb, a: step_relu6(bb, a[0], Step("relu6", variant)))
        return y
    rng, mag = b.rng, _mag(x)
    name = f"act_{x.dtype}_{'x'.join(map(str, x.shape))}_{variant}"
    calls = 2 if s.flag else 1
    y = x
    for _ in range(calls):
        if variant == 2:
            thr = b.like(y, _thresholds(b, y, s.pick % 2 == 1), s.pick % 2 == 1)
            b.features.add("threshold_nonzero")
            y = b.call(name, [y, thr], _threshold_body)
        else:
            lo = float(_nonzero(rng, mag, 0.05, 0.5))
            lo_v, hi_v = b.constant(lo, y.dtype), b.constant(lo + mag * rng.uniform(0.3, 1.5), y.dtype)
            if lo_v.value != 0:
                b.features.add("clamp_nonzero_lo")
            y = b.call(name, [y, lo_v, hi_v], lambda bb, a: bb.clamp(a[1], a[0], a[2]))
    return y


def _threshold_body(b: Builder, args: list[Val]) -> Val:
    x, thr = args
    return b.select(b.compare(x, thr, "GT"), x, _zero(b, x))


STEPS: dict[str, StepFn] = {
    "relu": step_relu, "bias": step_bias, "scale": step_scale, "amplify": step_amplify,
    "negate": step_negate,
    "abs": step_abs, "double": step_double, "convert": step_convert, "relu6": step_relu6,
    "clamp": step_clamp, "threshold": step_threshold, "leaky": step_leaky, "maxmin": step_maxmin,
    "relu_add_relu": step_relu_add_relu, "pool": step_pool, "sum_pool": step_sum_pool,
    "reduce": step_reduce, "pad": step_pad, "transpose": step_transpose, "reshape": step_reshape,
    "broadcast": step_broadcast, "residual": step_residual, "output": step_output,
    "helper": step_helper, "norm": step_norm, "attention": step_attention,
}
# Ordered simplest first: hypothesis shrinks towards the front.
KINDS = ("relu", "bias", "scale", "amplify", "negate", "abs", "double", "relu6", "clamp", "threshold",
         "leaky", "maxmin", "relu_add_relu", "convert", "pool", "reduce", "pad", "transpose", "reshape",
         "broadcast", "residual", "output", "helper", "call", "norm")
# Drawn only when forced (--force-steps attention): with it, the quantize_pc option set's
# `integers` oracle reports weights far from the float set's (not diagnosed yet).
FORCED_ONLY = ("attention",)

# The ops each step kind may emit, besides constants and their broadcasts (checked against
# what is built by test_fuzz::test_the_grammar_emits_what_it_declares). Every law in
# bnfold.laws must be in GRAMMAR_OPS (tests/test_laws.py): a step bnfold looks through is
# a step the fuzzer attacks.
STEP_OPS: dict[str, tuple[str, ...]] = {
    "relu": ("stablehlo.maximum",),
    "bias": ("stablehlo.add", "stablehlo.subtract"),
    "scale": ("stablehlo.multiply", "stablehlo.divide"),
    "amplify": ("stablehlo.multiply",),
    "negate": ("stablehlo.negate",),
    "abs": ("stablehlo.abs",),
    "double": ("stablehlo.add",),
    "relu6": ("stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp"),
    "clamp": ("stablehlo.clamp",),
    "threshold": ("stablehlo.compare", "stablehlo.select"),
    "leaky": ("stablehlo.compare", "stablehlo.select", "stablehlo.multiply"),
    "maxmin": ("stablehlo.maximum", "stablehlo.minimum"),
    "relu_add_relu": ("stablehlo.maximum", "stablehlo.add"),
    "convert": ("stablehlo.convert",),
    "pool": ("stablehlo.reduce_window",),
    "sum_pool": ("stablehlo.reduce_window",),
    "reduce": ("stablehlo.reduce",),
    "pad": ("stablehlo.pad",),
    "transpose": ("stablehlo.transpose",),
    "reshape": ("stablehlo.reshape",),
    "broadcast": ("stablehlo.broadcast_in_dim",),
    "residual": ("stablehlo.add", "stablehlo.maximum"),
    "output": (),
    "helper": ("func.call", "stablehlo.clamp", "stablehlo.compare", "stablehlo.select"),
    "call": ("func.call",),
    "norm": ("stablehlo.reduce", "stablehlo.divide", "stablehlo.subtract", "stablehlo.multiply",
             "stablehlo.add", "stablehlo.rsqrt", "stablehlo.negate", "stablehlo.dot_general",
             "stablehlo.slice", "stablehlo.pad", "stablehlo.broadcast_in_dim",
             "stablehlo.concatenate"),
    "attention": ("stablehlo.dot_general", "stablehlo.multiply", "stablehlo.divide"),
}
# Layers, biases and batch norms (decomposed or not), and the input normalization.
LAYER_OPS = ("stablehlo.convolution", "stablehlo.dot_general", "stablehlo.batch_norm_inference",
             "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
             "stablehlo.rsqrt", "stablehlo.convert", "stablehlo.broadcast_in_dim")
GRAMMAR_OPS = frozenset(op for ops in (*STEP_OPS.values(), LAYER_OPS) for op in ops)


# --- strategies --------------------------------------------------------------------------

DTYPES = ("f32", "f32", "f16", "bf16")


@st.composite
def steps(draw, kinds: Sequence[str] = KINDS) -> Step:
    return Step(draw(st.sampled_from(kinds)), draw(st.integers(0, 7)), draw(st.integers(0, 7)),
                draw(st.booleans()))


@st.composite
def conv_specs(draw, groups: Sequence[str] = ("plain", "plain", "grouped", "depthwise")) -> ConvSpec:
    return ConvSpec(
        groups=draw(st.sampled_from(groups)),
        windows=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        strides=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
        padding=draw(st.sampled_from(["valid", "same", "random"])),
        pads=tuple(draw(st.integers(0, 2)) for _ in range(4)),  # type: ignore[arg-type]
        rhs_dilation=(draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))),
        lhs_dilation=draw(st.sampled_from([1, 1, 1, 1, 2])),
        kernel_perm=draw(st.integers(0, 23)), out_perm=draw(st.integers(0, 23)),
        spatial_perm=draw(st.integers(0, 1)), batch_pick=draw(st.integers(0, 3)))


@st.composite
def layer_specs(draw, groups: Sequence[str] | None = None, conv_only: bool = False) -> LayerSpec:
    if conv_only or draw(st.integers(0, 3)) > 0:
        producer: ConvSpec | DotSpec = draw(conv_specs(groups) if groups else conv_specs())
    else:
        producer = DotSpec(draw(st.booleans()), draw(st.booleans()))
    return LayerSpec(producer=producer, width=draw(st.integers(1, 4)),
                     bn=draw(st.sampled_from(["none", "op", "chain"])),
                     bias=draw(st.sampled_from(["none", "none", "before", "after"])),
                     log_weight=draw(st.floats(-1.5, 1.5)), spread=draw(st.floats(0, 1.5)),
                     high_beta=draw(st.booleans()), feature_pick=draw(st.integers(0, 4)))


@st.composite
def input_norms(draw, dtype: str, large_offset: bool = False, narrowing: bool = False) -> InputNorm:
    log_offset = draw(st.floats(2.2, 5.0) if large_offset else st.floats(-1.0, 5.0))
    if narrowing:
        convert: str | None = draw(st.sampled_from(["bf16", "f16"]))
    else:
        convert = draw(st.sampled_from([None, None, *(d for d in FLOATS if d != dtype)]))
    return InputNorm(draw(st.sampled_from(["sub_div", "mul_add"])), log_offset, convert)


@st.composite
def graphs(draw, dtypes: Sequence[str] = DTYPES, min_layers: int = 1, force_steps: Sequence[str] = (),
           input_norm: bool | None = None, large_offset: bool = False, narrowing: bool = False,
           grouped: bool = False, rising_weights: bool = False) -> Graph:
    """A random graph; the keywords force a stratum (a dtype, steps in a row in the first
    region, an input normalization with large offsets or a narrowing convert, grouped layer 1,
    later layers with larger weights than layer 1: equalization scales layer 1 up)."""
    dtype = "f32" if narrowing else draw(st.sampled_from(dtypes))
    n_layers = draw(st.integers(max(min_layers, 2 if force_steps else 1), 3))
    layers = [draw(layer_specs(("grouped", "depthwise"), conv_only=True) if grouped and i == 0
                   else layer_specs()) for i in range(n_layers)]
    if rising_weights:
        layers = [replace(spec, log_weight=draw(st.floats(-1.5, -0.5) if i == 0 else st.floats(0.5, 1.5)))
                  for i, spec in enumerate(layers)]
    regions = [list(draw(st.lists(steps(), max_size=4))) for _ in range(n_layers)]
    if force_steps:
        position = draw(st.integers(0, len(regions[0])))
        regions[0][position:position] = [draw(steps([kind])) for kind in force_steps]
    with_norm = input_norm if input_norm is not None else (large_offset or narrowing or draw(st.booleans()))
    norm = draw(input_norms(dtype, large_offset, narrowing)) if with_norm else None
    rank = draw(st.integers(1, 2))
    return Graph(dtype=dtype, batch=draw(st.integers(1, 2)),
                 channels=draw(st.integers(2 if grouped else 1, 4)),
                 spatial=tuple(draw(st.integers(2, 6)) for _ in range(rank)),
                 in_perm=draw(st.integers(0, 23)), input_norm=norm, layers=tuple(layers),
                 regions=tuple(tuple(r) for r in regions), seed=draw(st.integers(0, 2**32 - 1)))


# --- attention scales (fold-scale) -----------------------------------------------------------
#
# An attention block around one constant scale (loc "scale0"): the input ids through an
# embedding `gather` or an input x, the q projection as a dot_general or a 1-D convolution
# (an optional bias), heads by reshape and transpose, an optional zero pad of the head
# dim (q and k alike), QK-norm (a sum `reduce`, rsqrt, the norm's weight), RoPE (slice,
# negate, concatenate, multiplies by cos and sin, add), a convert, the scores as a
# dot_general of two values (q k^T or k q^T), a per-head temperature divide, one k head
# broadcast to all (GQA), a mask `select`, a sum over heads, and the scale (multiply or divide by a
# constant scalar: a power of two or not). Every op of bnfold.laws.SCALAR_LAWS is here. A fused
# projection (GPT-2's c_attn, torch's MultiheadAttention in_proj, Swin's qkv) computes q and k
# with one dot_general (or, with `conv`, one 1-D convolution: a qkv 1x1 convolution): q and k
# are slices of its output, either of the flat features or of an axis of a [S, 2, heads,
# head_dim] reshape, so the scale goes into q's (or k's) columns only.


@dataclass(frozen=True)
class AttentionGraph:
    dtype: str
    seq: int
    heads: int
    head_dim: int  # even (RoPE halves)
    model: int
    embed: bool
    conv: bool
    bias: bool
    pad: bool
    qk_norm: bool
    rope: bool
    convert: bool  # q and k converted before the scores (f32 to bf16, bf16 / f16 to f32)
    mask: bool
    divide: bool
    power_of_two: bool
    pool: bool  # the scores summed over heads before the scale (a reduce the scale crosses)
    temperature: bool  # q divided by a per-head constant
    gqa: bool  # one k head broadcast to every head (grouped-query attention)
    swap: bool  # the scores as k q^T (the walk meets k first)
    seed: int
    fused: int = 0  # 0: q and k projected apart; 1: slices of one projection's features;
    # 2: slices of axis 1 of its [S, 2, heads, head_dim] reshape
    tied: bool = False  # with `embed`: an LM head reads the table too, after an RMSNorm
    # of the scaled embedding (Gemma's tied head: one table, 1/c into the norm's weight)


ATTENTION_OPS = ("stablehlo.gather", "stablehlo.dot_general", "stablehlo.convolution",
                 "stablehlo.add", "stablehlo.reshape", "stablehlo.transpose", "stablehlo.pad",
                 "stablehlo.multiply", "stablehlo.reduce", "stablehlo.rsqrt",
                 "stablehlo.divide", "stablehlo.slice", "stablehlo.negate",
                 "stablehlo.concatenate", "stablehlo.convert", "stablehlo.select",
                 "stablehlo.compare", "stablehlo.broadcast_in_dim", "stablehlo.subtract")
GRAMMAR_OPS = GRAMMAR_OPS | frozenset(ATTENTION_OPS)


def _slice(b: Builder, x: Val, start: Sequence[int], limit: Sequence[int]) -> Val:
    index = tuple(slice(s, l) for s, l in zip(start, limit))
    out = x.value[index]
    return b.node("stablehlo.slice", [x], T(out.shape, x.dtype), out, None,
                  [("start_indices", _i64(start)), ("limit_indices", _i64(limit)),
                   ("strides", _i64([1] * len(start)))], mag=x.mag[index])


def _concat(b: Builder, xs: Sequence[Val], dim: int) -> Val:
    out = np.concatenate([x.value for x in xs], dim)
    return b.node("stablehlo.concatenate", list(xs), T(out.shape, xs[0].dtype), out, None,
                  [("dimension", f"{dim} : i64")],
                  mag=np.concatenate([x.mag for x in xs], dim))


def _head_dot(b: Builder, q: Val, k: Val) -> Val:
    """scores[h, i, j] = sum_d q[i, h, d] k[j, h, d] (batching over heads)."""
    out = np.einsum("ihd,jhd->hij", q.value, k.value)
    numbers = ("#stablehlo.dot<lhs_batching_dimensions = [1], rhs_batching_dimensions = [1], "
               "lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]>")
    return b.node("stablehlo.dot_general", [q, k], T(out.shape, q.dtype), out, None,
                  [("dot_dimension_numbers", numbers)],
                  mag=np.einsum("ihd,jhd->hij", q.mag, k.mag))


def _projection(b: Builder, g: AttentionGraph, x: Val, name: str, conv: bool,
                parts: int = 1) -> Val:
    """x [S, model] times W [model, heads * head_dim] (+ bias), as [S, heads, head_dim]; with
    `parts` > 1 (a fused projection), [S, parts * heads * head_dim]."""
    width = g.heads * g.head_dim * parts
    w = _fit(b.rng.standard_normal((g.model, width)) / math.sqrt(g.model), lambda k: k, g.dtype)
    if conv:
        x3 = b.reshape(x, (1, *x.shape), None)
        kernel = b.constant(w.reshape(1, g.model, width), g.dtype, f"{name}_w", kernel=True)
        geometry = ConvGeometry(("b", "0", "f"), ("0", "i", "o"), ("b", "0", "f"), (1,), (1,),
                                ((0, 0),), (1,), (1,), 1)
        y = b.reshape(b.conv(x3, kernel, geometry, name), (g.seq, width), None)
    else:
        y = b.dot(x, b.constant(w, g.dtype, f"{name}_w", kernel=True), 1, 0, False, name)
    if g.bias:  # a bias added, or subtracted (the divide graphs)
        y = b.binary("subtract" if g.divide else "add", y,
                     b.like(y, b.rng.normal(size=width) * 0.1, per_channel=True))
    if parts > 1:
        return y
    heads = b.reshape(y, (g.seq, g.heads, g.head_dim), None)
    if conv:  # heads first and back (Equinox's and Flax's layouts)
        heads = b.transpose(b.transpose(heads, [1, 0, 2]), [1, 0, 2])
    return heads


def _qk_norm(b: Builder, x: Val) -> Val:
    zero = b.constant(0.0, x.dtype)
    total = b.reduce(b.binary("multiply", x, x), zero, "stablehlo.add", [2])
    eps = b.like(total, 1e-3, per_channel=False)
    inv = b.unary("rsqrt", b.binary("add", total, eps))
    normed = b.binary("multiply", x, b.broadcast(inv, [0, 1], x.shape, None))
    w = b.constant(1 + 0.3 * b.rng.standard_normal(x.shape[2]), x.dtype)
    return b.binary("multiply", normed, b.broadcast(w, [2], x.shape, None))


def _rope(b: Builder, x: Val, cos: np.ndarray, sin: np.ndarray) -> Val:
    s, h, d = x.shape
    x1, x2 = _slice(b, x, [0, 0, 0], [s, h, d // 2]), _slice(b, x, [0, 0, d // 2], [s, h, d])
    rotated = _concat(b, [b.unary("negate", x2), x1], 2)
    c = b.broadcast(b.constant(cos, x.dtype), [0, 2], x.shape, None)
    n = b.broadcast(b.constant(sin, x.dtype), [0, 2], x.shape, None)
    return b.binary("add", b.binary("multiply", x, c), b.binary("multiply", rotated, n))


def _fused(b: Builder, g: AttentionGraph, y: Val) -> tuple[Val, Val]:
    """q and k, [S, heads, head_dim] each, sliced from a fused projection's output y."""
    s, w = g.seq, g.heads * g.head_dim
    shape = (s, g.heads, g.head_dim)
    if g.fused == 1:
        return (b.reshape(_slice(b, y, [0, 0], [s, w]), shape, None),
                b.reshape(_slice(b, y, [0, w], [s, 2 * w]), shape, None))
    both = b.reshape(y, (s, 2, g.heads, g.head_dim), None)
    q, k = (b.reshape(_slice(b, both, [0, i, 0, 0], [s, i + 1, g.heads, g.head_dim]), shape, None)
            for i in (0, 1))
    return q, k


def build_attention(g: AttentionGraph) -> Program:
    b = Builder(np.random.default_rng(g.seed))
    b.dtypes.add(g.dtype)
    if g.embed:
        ids = b.rng.integers(0, 11, size=(g.seq, 1)).astype(np.int32)
        arg = Val("%arg0", T((g.seq, 1), "i32"), ids.astype(np.float64), None, np.zeros((g.seq, 1)))
        b.scopes.append(_Scope("main", [arg]))
        table = b.constant(b.rng.standard_normal((11, g.model)), g.dtype, "table", kernel=True)
        rows = table.value[ids[:, 0]]
        x = b.node("stablehlo.gather", [table, arg], T(rows.shape, g.dtype), rows, None,
                   [("dimension_numbers", "#stablehlo.gather<offset_dims = [1], collapsed_slice_dims"
                                          " = [0], start_index_map = [0], index_vector_dim = 1>"),
                    ("slice_sizes", _i64([1, g.model]))], mag=np.abs(table.value)[ids[:, 0]])
        x = b.binary("multiply", x, b.like(x, math.sqrt(g.model), per_channel=False), "escale")
        inputs = [ids]
    else:
        value = round_to(b.rng.standard_normal((g.seq, g.model)), g.dtype)
        arg = Val("%arg0", T((g.seq, g.model), g.dtype), value, None, np.abs(value))
        b.scopes.append(_Scope("main", [arg]))
        x, inputs = arg, [value.astype(NP_DTYPES[g.dtype])]
    if g.fused:
        q, k = _fused(b, g, _projection(b, g, x, "wqk", g.conv, parts=2))
    else:
        q = _projection(b, g, x, "wq", g.conv)
        k = _projection(b, g, x, "wk", False)
    if g.pad:
        zero = b.constant(0.0, g.dtype)
        q, k = (b.pad(v, zero, [0, 0, 0], [0, 0, 2], [0, 0, 0], None) for v in (q, k))
    if g.qk_norm:
        q, k = _qk_norm(b, q), _qk_norm(b, k)
    if g.rope:
        d = q.shape[2]
        angles = np.arange(g.seq)[:, None] / 10000.0 ** (np.arange(d // 2) / (d // 2))[None]
        angles = np.concatenate([angles, angles], 1)
        q, k = (_rope(b, v, np.cos(angles), np.sin(angles)) for v in (q, k))
    if g.temperature:
        t = b.constant(1.0 + b.rng.uniform(0.0, 1.0, g.heads), g.dtype)
        q = b.binary("divide", q, b.broadcast(t, [1], q.shape, None))
    if g.gqa:
        one = _slice(b, k, [0, 0, 0], [k.shape[0], 1, k.shape[2]])
        k = b.broadcast(b.reshape(one, (k.shape[0], k.shape[2]), None), [0, 2], k.shape, None)
    if g.convert:  # f32 narrowed to bf16 (the scale moves before it), bf16/f16 widened
        wide = "bf16" if g.dtype == "f32" else "f32"
        q, k = b.convert(q, wide), b.convert(k, wide)
    scores = _head_dot(b, k, q) if g.swap else _head_dot(b, q, k)
    if g.mask:
        causal = np.triu(np.ones((g.seq, g.seq)), 1)[None].repeat(g.heads, 0)
        limit = b.like(scores, -30.0, per_channel=False)
        pred = b.compare(b.like(scores, 0.0, per_channel=False),
                         b.constant(np.broadcast_to(causal, scores.shape), scores.dtype), "LT")
        scores = b.select(pred, limit, scores)
    if g.pool:
        scores = b.reduce(scores, b.constant(0.0, scores.dtype), "stablehlo.add", [0])
    c = 0.25 if g.power_of_two else 1 / math.sqrt(q.shape[2] + 1)
    if g.divide:
        out = b.binary("divide", scores, b.like(scores, 1 / c, per_channel=False), "scale0")
    else:
        out = b.binary("multiply", scores, b.like(scores, c, per_channel=False), "scale0")
    outs = [out]
    if g.embed and g.tied:
        outs.append(_tied_head(b, x, table))
    scope = b.scopes.pop()
    b.features.add("attention_scale")
    main = Func("main", [arg], scope.nodes, outs, private=False)
    scales = ["escale", "scale0"] if g.embed else ["scale0"]
    return Program([main], inputs, [o.value for o in outs], [o.mag for o in outs], scales, [],
                   True, b.features | b.dtypes, [o.dtype for o in outs], set(b.dtypes))


def _tied_head(b: Builder, x: Val, table: Val) -> Val:
    """logits = (rms_norm(x) W) @ table^T: the LM head reads the embedding's own table, its
    input a linear layer's output (1/c goes into W; a norm weight right before the head
    would be forward-affine's, copying the table first)."""
    zero = b.constant(0.0, x.dtype)
    total = b.reduce(b.binary("multiply", x, x), zero, "stablehlo.add", [1])
    inv = b.unary("rsqrt", b.binary("add", total, b.like(total, 1e-3, per_channel=False)))
    normed = b.binary("multiply", x, b.broadcast(inv, [0], x.shape, None))
    w = _fit(b.rng.standard_normal((x.shape[1], x.shape[1])) / math.sqrt(x.shape[1]),
             lambda k: k, x.dtype)
    hidden = b.dot(normed, b.constant(w, x.dtype, "head_w", kernel=True), 1, 0, False, "head_in")
    b.features.add("tied_table")
    return b.dot(hidden, b.transpose(table, [1, 0]), 1, 0, False, "head")


@st.composite
def attention_graphs(draw, dtypes: Sequence[str] = DTYPES) -> AttentionGraph:
    return AttentionGraph(dtype=draw(st.sampled_from(dtypes)), seq=draw(st.integers(2, 5)),
                          heads=draw(st.integers(1, 3)), head_dim=2 * draw(st.integers(1, 4)),
                          model=draw(st.integers(2, 8)), embed=draw(st.booleans()),
                          conv=draw(st.booleans()), bias=draw(st.booleans()),
                          pad=draw(st.booleans()), qk_norm=draw(st.booleans()),
                          rope=draw(st.booleans()), convert=draw(st.booleans()),
                          mask=draw(st.booleans()), divide=draw(st.booleans()),
                          power_of_two=draw(st.booleans()), pool=draw(st.booleans()),
                          temperature=draw(st.booleans()), gqa=draw(st.booleans()),
                          swap=draw(st.booleans()),
                          seed=draw(st.integers(0, 2**32 - 1)),
                          fused=draw(st.integers(0, 2)), tied=draw(st.booleans()))
