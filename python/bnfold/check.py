"""Check a result on numbers: run the original and the output on XLA CPU.

    result = bnfold.check.check(open("model.mlir").read(), folded_text)
    print(result.summary())       # max relative difference 3.1e-07 (f32 tolerance 1e-05) ...
    assert result.passed

Both modules get the same seeded inputs of `@main`'s argument shapes: floats
from a standard normal, integers (token ids, indices) in [0, 2), booleans at
random. A symbolic dimension (`tensor<?x...>`, a shape-polymorphic export) gets
the size `dims` gives its name (`b`, as jax.export names it, or `argK.D` for
argument K's dimension D), else `DEFAULT_DIM`; the modules are refined to
those shapes (`stablehlo-refine-arguments`, `stablehlo-refine-shapes`) and
their shape assertions dropped (jax checks them when it calls an Exported;
bare XLA has no handler). Arguments the output no longer takes (bound with
`--bind-params`) are fed to the original from `bindings`.

The measure is jax's: per output, `max |output - original| / max |original|`
(robust to outputs that cross zero), within the tolerance (`TOLERANCE`, or
`tolerance`) of the narrowest float type among the output's and those the
original computes in (an f32 output of a bf16 network is held to bf16's: the
fold rounds its kernels there). Where it can, the check also evaluates the
original in float64 (every f16/bf16/f32 type re-typed to f64, constants
widened exactly) and reports both modules' error against it: the precision
contract says the output's error is no worse than the original's own. When
the original cannot be re-typed (e.g. a bitcast_convert, a dense_resource
blob), the result says why instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bnfold import elements
from bnfold.binding import argument_names, resolve
from bnfold.errors import BnfoldError
from bnfold.graph import lookup_function
from bnfold.ir import ir, make_context, parse, run_pipeline, serialize, xla_cpu_run
from bnfold.pipeline import Bindings

__all__ = ["TOLERANCE", "DEFAULT_DIM", "Check", "check", "parse_dims"]

# max |output - original| <= TOLERANCE[type] * max |original|, per output (jax's
# public_test_util tolerances for the types a fold rounds in)
TOLERANCE: dict[str, float] = {"f64": 1e-12, "f32": 1e-5, "f16": 1e-2, "bf16": 6e-2}
DEFAULT_DIM = 2
_FLOAT_TYPES = ("bf16", "f16", "f32")


@dataclass
class Output:
    """One output of the comparison."""

    index: int
    element_type: str
    difference: float  # max |output - original| / max |original|
    tolerance: float
    # the type whose tolerance applies: the narrowest of the output's and the float
    # types the original computes in (an f32 output of a bf16 network has bf16's)
    precision: str = ""
    original_error: float | None = None  # against the float64 evaluation
    output_error: float | None = None

    @property
    def passed(self) -> bool:
        return self.difference <= self.tolerance  # NaN and inf fail


@dataclass
class Check:
    """What `check` measured. `passed` when every output is within its tolerance."""

    outputs: list[Output]
    dims: dict[str, int] = field(default_factory=dict)  # the sizes given to symbolic dims
    float64: str | None = None  # why there is no float64 comparison (None: there is one)
    inputs: list[np.ndarray] = field(default_factory=list, repr=False)  # the original's

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def difference(self) -> float:
        return max((o.difference for o in self.outputs), default=0.0)

    def summary(self) -> str:
        """One line (two on failure): the largest difference, the tolerance, the errors
        against float64 (or why none) and the sizes given to symbolic dimensions."""
        worst = max(self.outputs, key=lambda o: (not o.passed, o.difference / o.tolerance
                                                 if o.tolerance else o.difference),
                    default=None)
        if worst is None:
            return "check: the module has no outputs to compare"
        head = (f"max relative difference {_g(self.difference)} over {len(self.outputs)} "
                f"output(s) on XLA CPU ({_tolerance_name(worst)})")
        errors = [(o.original_error, o.output_error) for o in self.outputs
                  if o.original_error is not None and o.output_error is not None]
        if errors:
            head += (f"; error against float64: original {_g(max(e[0] for e in errors))}, "
                     f"output {_g(max(e[1] for e in errors))}")
        elif self.float64:
            head += f"; no float64 comparison: {self.float64}"
        if self.dims:
            head += "; symbolic dims " + ", ".join(f"{k}={v}" for k, v in self.dims.items())
        if self.passed:
            return f"check passed: {head}"
        bad = [o for o in self.outputs if not o.passed]
        detail = "; ".join(f"output {o.index} ({o.element_type}): {_g(o.difference)} > "
                           f"{_g(o.tolerance)}" for o in bad[:4])
        return f"check failed: {head}\n  {detail}{' ...' if len(bad) > 4 else ''}"


def _tolerance_name(output: Output) -> str:
    """`f32 tolerance 1e-05`, `bf16 tolerance 0.06: the original computes in bf16`, or
    `tolerance 0.05 (given)`."""
    if output.precision == "given":
        return f"tolerance {_g(output.tolerance)} (given)"
    precision = output.precision or output.element_type
    text = f"{precision} tolerance {_g(output.tolerance)}"
    return text if precision == output.element_type else \
        f"{text}: the original computes in {precision}"


def _g(value: float) -> str:
    return f"{value:.3g}"


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """`NAME=SIZE` strings (`--check-dim`) as a mapping; a `ValueError` names a bad one."""
    dims: dict[str, int] = {}
    for item in items:
        name, eq, size = item.partition("=")
        if not eq or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise BnfoldError(f"'{item}' is not NAME=SIZE with a positive integer size "
                              "(e.g. b=4)", location="--check-dim")
        dims[name.strip()] = int(size)
    return dims


def check(original: str | bytes | ir.Module, output: str | bytes | ir.Module, *,
          bindings: Bindings | None = None, dims: Mapping[str, int] | None = None,
          tolerance: float | None = None, seed: int = 0, name: str = "<input>") -> Check:
    """Runs `original` and `output` (text, bytecode, a portable artifact or a parsed
    module) on XLA CPU with the same seeded inputs and compares them.

    Both run from `@main`. `bindings` are the values of `@main`'s arguments the
    output no longer takes (as given to `fold_source` / `--bind-params`: by `argN`
    or name; or a function of the parsed original that returns them). `seed`
    seeds the inputs. `dims` sizes symbolic dimensions by name (default
    `DEFAULT_DIM`). `tolerance` replaces the per-type
    table. Raises `BnfoldError` when the modules cannot be run or do not take
    matching arguments.
    """
    dims = dict(dims or {})
    source = _Module(original, "the original", name)
    result = _Module(output, "the output", name)
    if callable(bindings):  # a function of the parsed module (--bind-params-extra ignore)
        with source.context:
            bindings = bindings(source.module)
    bound = source.resolve(bindings or {})
    kept = [i for i in range(len(source.arg_types)) if i not in bound]
    if len(result.arg_types) != len(kept):
        raise BnfoldError(f"cannot check: the output's @main takes "
                          f"{len(result.arg_types)} argument(s), the original "
                          f"{len(source.arg_types)} with {len(bound)} bound", location=name)
    names = source.dim_names()
    used: dict[str, int] = {}
    shapes = []
    for i, ty in enumerate(source.arg_types):
        shape: list[int] = []
        for d in range(ty.rank):
            if ty.is_dynamic_dim(d):
                label = names.get((i, d), f"arg{i}.{d}")
                used[label] = dims.get(label, DEFAULT_DIM)
                shape.append(used[label])
            else:
                shape.append(ty.shape[d])
        shapes.append(tuple(shape))
    unknown = sorted(set(dims) - set(used))
    if unknown:
        raise BnfoldError(f"{', '.join(unknown)} name(s) no symbolic dimension of @main"
                          + (f" (it has {', '.join(used)})" if used else " (it has none)"),
                          location="--check-dim")
    rng = np.random.default_rng(seed)
    inputs: list[np.ndarray] = []
    for i, (ty, concrete) in enumerate(zip(source.arg_types, shapes, strict=True)):
        if i in bound:
            inputs.append(bound[i])
            continue
        dtype = elements.numpy_dtype(ty.element_type)
        if dtype is None:
            raise BnfoldError(f"cannot check: argument {i} of @main has type {ty}, for "
                              "which no inputs can be made", location=name)
        if dtype.kind == "b":
            inputs.append(rng.integers(0, 2, size=concrete).astype(bool))
        elif dtype.kind in "iu":
            inputs.append(rng.integers(0, 2, size=concrete).astype(dtype))
        else:
            inputs.append(rng.standard_normal(concrete).astype(dtype))
    free = [inputs[i] for i in kept]
    expected = source.run(inputs, shapes)
    actual = result.run(free, [shapes[i] for i in kept])
    if len(actual) != len(expected):
        raise BnfoldError(f"cannot check: the output returns {len(actual)} value(s), the "
                          f"original {len(expected)}", location=name)
    outputs = []
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        element = source.result_types[k] if k < len(source.result_types) else "?"
        precision = max((t for t in (element, *source.float_types) if t in TOLERANCE),
                        key=TOLERANCE.__getitem__, default="f32")
        limit = tolerance if tolerance is not None else TOLERANCE[precision]
        outputs.append(Output(k, element, relative_difference(a, e), limit,
                              precision if tolerance is None else "given"))
    outcome = Check(outputs, used, inputs=inputs)
    reference, why = source.float64(inputs, shapes)
    if reference is None:
        outcome.float64 = why
    else:
        for o, a, e, r in zip(outputs, actual, expected, reference, strict=True):
            if np.asarray(e).dtype.kind == "f" or elements.is_bf16(np.asarray(e).dtype):
                o.original_error = relative_difference(e, r)
                o.output_error = relative_difference(a, r)
    return outcome


def relative_difference(actual: Any, expected: Any) -> float:
    """max |actual - expected| / max |expected| (inf for another shape or NaN pattern)."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    if a.shape != e.shape:
        return float("inf")
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        return float("inf")
    a, e = a[~nan_e], e[~nan_e]
    if a.size == 0:
        return 0.0
    if not np.array_equal(np.isinf(a), np.isinf(e)) or np.any(a[np.isinf(a)] != e[np.isinf(e)]):
        return float("inf")
    finite = ~np.isinf(e)
    a, e = a[finite], e[finite]
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(e))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - e))) / scale


class _Module:
    """One side of the comparison, parsed in its own context."""

    def __init__(self, module: str | bytes | ir.Module, what: str, name: str) -> None:
        if isinstance(module, ir.Module):
            with module.context:
                module = serialize(module, "bytecode")
        if not isinstance(module, str | bytes):
            raise TypeError(f"check expects MLIR text, bytes or a jaxlib.mlir.ir.Module for "
                            f"{what}, got {type(module).__qualname__}")
        self.what = what
        self.name = name
        self.context = make_context()
        self.module = parse(module, self.context, name=name)
        with self.context:
            func = lookup_function(self.module, "main")
            if func is None:
                raise BnfoldError(f"cannot check: {what} has no function @main", location=name)
            self.func = func
            func_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
            self.arg_types: list[ir.RankedTensorType] = []
            for i, ty in enumerate(func_type.inputs):
                ranked = elements.ranked_type(ty)
                if ranked is None:
                    raise BnfoldError(f"cannot check: argument {i} of {what}'s @main has type "
                                      f"{ty} (not a ranked tensor)", location=name)
                self.arg_types.append(ranked)
            self.result_types = [str(r.element_type) if (r := elements.ranked_type(t)) else "?"
                                 for t in func_type.results]
            self.float_types = _float_types(self.module)

    def resolve(self, bindings: Mapping[str | int, Any]) -> dict[int, np.ndarray]:
        with self.context:
            names = argument_names(self.func)
        bound: dict[int, np.ndarray] = {}
        for key, value in bindings.items():
            index = resolve(key, names)
            if index is None:
                raise BnfoldError(f"cannot check: '{key}' names no argument of the original's "
                                  f"@main", location=self.name)
            bound[index] = np.asarray(value)
        return bound

    def dim_names(self) -> dict[tuple[int, int], str]:
        """(argument, dimension) -> the name jax.export gave the symbolic dimension: @main
        reads it with get_dimension_size and passes it (converted) to the wrapped function,
        whose argument carries `jax.global_constant = "b"`."""
        found: dict[tuple[int, int], str] = {}
        with self.context:
            block = self.func.regions[0].blocks[0]
            arguments = list(block.arguments)
            for op in block.operations:
                op = op.operation
                if op.name != "stablehlo.get_dimension_size" or op.operands[0] not in arguments:
                    continue
                key = (arguments.index(op.operands[0]), ir.IntegerAttr(op.attributes["dimension"]).value)
                label = self._global_constant(op.results[0])
                if label:
                    found.setdefault(key, label)
        return found

    def _global_constant(self, value: ir.Value, depth: int = 0) -> str | None:
        for use in value.uses:
            user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
            if user.name == "func.call":
                callee = lookup_function(self.module, ir.FlatSymbolRefAttr(
                    user.attributes["callee"]).value)
                if callee is None or "arg_attrs" not in callee.attributes:
                    continue
                attrs = ir.DictAttr(ir.ArrayAttr(callee.attributes["arg_attrs"])[use.operand_number])
                if "jax.global_constant" in attrs:
                    return ir.StringAttr(attrs["jax.global_constant"]).value
            elif depth < 3 and user.name in ("stablehlo.convert", "stablehlo.reshape") and \
                    len(user.results) == 1:
                found = self._global_constant(user.results[0], depth + 1)
                if found:
                    return found
        return None

    def run(self, inputs: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]],
            text: str | None = None) -> list[np.ndarray]:
        program = text if text is not None else self._runnable(shapes, self.module)
        try:
            return [np.asarray(r) for r in xla_cpu_run(program, list(inputs))]
        except Exception as e:  # noqa: BLE001 - XLA's errors are RuntimeErrors of any kind
            raise BnfoldError(f"cannot check: XLA CPU could not run {self.what}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}",
                              location=self.name) from None

    def _runnable(self, shapes: Sequence[tuple[int, ...]], module: ir.Module) -> str:
        """The module as text, refined to `shapes` where it has symbolic dimensions."""
        with self.context, ir.Location.unknown():
            if any(not t.has_static_shape for t in self.arg_types):
                types = ",".join(str(ir.RankedTensorType.get(list(s), t.element_type))
                                 for s, t in zip(shapes, self.arg_types, strict=True))
                module = parse(serialize(module, "bytecode"), self.context, name=self.name)
                try:
                    run_pipeline(module, "builtin.module(stablehlo-refine-arguments{types='"
                                 + types + "'},stablehlo-refine-shapes)")
                except (ir.MLIRError, RuntimeError, ValueError) as e:
                    raise BnfoldError(f"cannot check: {self.what} does not refine to the "
                                      f"shapes {types}: {str(e).splitlines()[0]}",
                                      location=self.name) from None
                _drop_shape_assertions(module)
            return serialize(module, "mlir").decode()

    def float64(self, inputs: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]
                ) -> tuple[list[np.ndarray] | None, str | None]:
        """The original evaluated with every float type f64, or (None, why not)."""
        try:
            text = self._as_float64(shapes)
        except (ValueError, BnfoldError, ir.MLIRError) as e:
            return None, f"the original cannot be re-typed to f64 ({_first_line(e)})"
        wide = [np.asarray(x).astype(np.float64)
                if np.asarray(x).dtype.kind == "f" or elements.is_bf16(np.asarray(x).dtype)
                else x for x in inputs]
        try:
            return self.run(wide, shapes, text=text), None
        except BnfoldError as e:
            return None, f"the f64 original does not run on XLA CPU ({_first_line(e)})"

    def _as_float64(self, shapes: Sequence[tuple[int, ...]]) -> str:
        context = make_context()
        module = parse(self._runnable(shapes, self.module), context, name=self.name)
        with context, ir.Location.unknown():
            constants: list[ir.Operation] = []
            typed: list[str] = []  # ops whose meaning depends on the float type

            def visit(op: ir.Operation) -> ir.WalkResult:
                if op.name == "stablehlo.constant":
                    constants.append(op)
                elif op.name in ("stablehlo.bitcast_convert", "stablehlo.reduce_precision"):
                    typed.append(op.name)
                return ir.WalkResult.ADVANCE

            module.operation.walk(visit)
            if typed:
                raise ValueError(f"it has {typed[0]}, which depends on the float type")
            f64 = ir.F64Type.get()
            for op in constants:
                ty = ir.RankedTensorType(op.results[0].type)
                if str(ty.element_type) not in _FLOAT_TYPES:
                    continue
                values = elements.read(op.attributes["value"])
                full = np.broadcast_to(values, tuple(ty.shape))
                op.attributes["value"] = elements.dense_attr(full, f64)
                # the result type is re-typed with the text below
            text = str(module)
        retyped = _retype(text)
        check_context = make_context()
        parse(retyped, check_context, name=self.name)  # verifies
        return retyped


# kept as they are: string literals, and scalar float attributes (a batch norm's
# `epsilon = 1.0E-5 : f32` must stay f32)
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"'
                        r"|[-+]?(?:0x[0-9A-Fa-f]+|\d[\d.]*(?:[eE][-+]?\d+)?) : (?:bf16|f16|f32)\b")
# a float type where MLIR prints one: tensor<f32>, 3x4xf32, `: f32`, (f32, f32)
_FLOAT_RE = re.compile(r"(?<=[x<\s(,:])(?:bf16|f16|f32)(?![\w.])")


def _retype(text: str) -> str:
    """Every bf16/f16/f32 type in MLIR text as f64, outside string literals and scalar
    float attributes."""
    pieces = []
    position = 0
    for match in _STRING_RE.finditer(text):
        pieces.append(_FLOAT_RE.sub("f64", text[position:match.start()]))
        pieces.append(match.group(0))
        position = match.end()
    pieces.append(_FLOAT_RE.sub("f64", text[position:]))
    return "".join(pieces)


def _float_types(module: ir.Module) -> set[str]:
    """The float element types of every op result in the module."""
    found: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        for result in op.results:
            ranked = elements.ranked_type(result.type)
            if ranked is not None and str(ranked.element_type) in TOLERANCE:
                found.add(str(ranked.element_type))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _drop_shape_assertions(module: ir.Module) -> None:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.custom_call" and \
                "shape_assertion" in str(op.attributes["call_target_name"]):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        op.erase()


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
