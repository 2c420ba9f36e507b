"""Test infrastructure: run modules on XLA CPU and the StableHLO reference interpreter,
and compare outputs.

One tolerance table per dtype and one `check_close`, so every numerics test
means the same thing by "equal". The error measure is the maximum absolute
difference relative to the maximum magnitude of the reference output, which
is robust to outputs that cross zero (conv + BN outputs usually do).

The reference interpreter aborts the whole process (an LLVM fatal error, not
an exception) on `batch_norm_inference` and on `custom_call @check.*`, so
`interpret` first rewrites every batch norm as the StableHLO specification
defines it (`expand_batch_norms`, written here from the spec, independent of
bnfold's own `expand-batch-norm` pattern) and refuses modules that still
contain ops it cannot run.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bnfold import elements
from bnfold.errors import BnfoldError
from bnfold.graph import lookup_function
from bnfold.ir import interpret as _interpret
from bnfold.ir import ir, make_context, parse, serialize, stablehlo

# max |actual - expected| <= RTOL[dtype] * max(|expected|)
RTOL: dict[str, float] = {
    "f64": 1e-12,
    "f32": 1e-5,
    "f16": 1e-2,
    "bf16": 6e-2,
}

_UNSUPPORTED_BY_INTERPRETER = ("stablehlo.batch_norm_inference", "stablehlo.custom_call")


@dataclass(frozen=True)
class Signature:
    """The entry function's argument shapes and types."""

    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype]
    element_types: list[str]


def main_signature(module: ir.Module, name: str = "main") -> Signature:
    """Argument shapes and dtypes of the public entry function."""
    func = lookup_function(module, name)
    if func is None:
        raise BnfoldError(f"module has no function @{name}")
    func_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    shapes, dtypes, names = [], [], []
    for ty in func_type.inputs:
        ranked = elements.tensor_type(ty)
        if ranked is None:
            raise BnfoldError(f"@{name} has an argument of dynamic or non-tensor type {ty}")
        dtype = elements.numpy_dtype(ranked.element_type)
        if dtype is None:
            raise BnfoldError(f"@{name} has an argument of unsupported type {ty}")
        shapes.append(tuple(ranked.shape))
        dtypes.append(dtype)
        names.append(str(ranked.element_type))
    return Signature(shapes, dtypes, names)


def random_inputs(signature: Signature, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in zip(signature.shapes, signature.dtypes, strict=True):
        if dtype.kind in "iub":
            out.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        return float("inf")
    a, e = a[~nan_e], e[~nan_e]
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(e))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - e))) / scale


def tolerance(element_type: str) -> float:
    return RTOL.get(element_type, RTOL["f32"])


def check_close(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                element_type: str = "f32", *, rtol: float | None = None) -> float:
    """Raises AssertionError unless every output matches; returns the worst error."""
    if len(actual) != len(expected):
        raise AssertionError(f"{len(actual)} outputs, expected {len(expected)}")
    limit = tolerance(element_type) if rtol is None else rtol
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        err = relative_error(a, e)
        if not err <= limit:
            raise AssertionError(f"output {i}: relative error {err:.3g} > {limit:.3g} ({element_type})")
        worst = max(worst, err)
    return worst


def run_xla(module: ir.Module | str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    text = module if isinstance(module, str) else serialize(module, "mlir").decode()
    return [np.asarray(r) for r in xla_cpu_run(text, list(inputs))]


def xla_cpu_run(text: str, inputs: Sequence[object]) -> list[object]:
    """Compiles StableHLO text on XLA CPU and runs it; returns numpy arrays."""
    import jax
    import jax.extend
    from jax._src.lib import xla_client as xc  # test infrastructure: no public API for this

    backend = jax.extend.backend.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(text, xc.DeviceList((device,)), xc.CompileOptions())
    # enable_x64 keeps f64/i64 inputs and outputs 64-bit for this call only.
    with jax.enable_x64(True):
        args = [jax.device_put(np.asarray(x), device) for x in inputs]
        results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
        return [np.asarray(r[0]) for r in results]


class InterpreterCrash(RuntimeError):
    """The reference interpreter aborted (it reports some bugs as LLVM fatal errors)."""


def interpret(module: ir.Module | str, inputs: Sequence[np.ndarray], *,
              isolate: bool = True) -> list[np.ndarray]:
    """Runs a module on the StableHLO reference interpreter (expanding batch norms).

    With `isolate` (the default) it runs in a child process, so an
    interpreter abort raises `InterpreterCrash` instead of killing the caller.
    """
    text = module if isinstance(module, str) else serialize(module, "mlir").decode()
    if not isolate:
        return _interpret_here(text, inputs)
    with tempfile.TemporaryDirectory(prefix="bnfold-interp-") as tmp:
        request = os.path.join(tmp, "request.pkl")
        with open(request, "wb") as f:
            pickle.dump((text, [np.asarray(x) for x in inputs]), f)
        proc = subprocess.run([sys.executable, __file__, request],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise InterpreterCrash(f"reference interpreter exited with {proc.returncode}: {tail}")
        with open(request + ".out", "rb") as f:
            outcome = pickle.load(f)
    if isinstance(outcome, str):
        raise BnfoldError(outcome, preformatted=True)
    return outcome


def _interpret_here(text: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    context = make_context()
    module = parse(text, context, name="<interpret>")
    with context, ir.Location.unknown():
        expand_batch_norms(module)
        for name in _ops_in(module):
            if name in _UNSUPPORTED_BY_INTERPRETER:
                raise BnfoldError(f"the reference interpreter cannot run {name}")
        args = [elements.array_attr(np.asarray(x)) for x in inputs]
        results = _interpret(module, args)
        return [elements.read_native(r) for r in results]


def expand_batch_norms(module: ir.Module) -> int:
    """Rewrites every `batch_norm_inference` in place as the StableHLO specification
    defines it, and returns how many:

        centered = operand - broadcast(mean)
        stddev = sqrt(broadcast(variance) + broadcast(epsilon))
        result = broadcast(scale) * (centered / stddev) + broadcast(offset)

    each broadcast along `feature_index`, epsilon a constant of the operand's element
    type. Run under the module's context and a location."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.batch_norm_inference":
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        ty = ir.RankedTensorType(op.results[0].type)
        axis = ir.IntegerAttr(op.attributes["feature_index"]).value
        epsilon = ir.FloatAttr(op.attributes["epsilon"]).value
        operand, scale, offset, mean, variance = list(op.operands)
        with ir.InsertionPoint(op), op.location:
            def along(v: ir.Value, dims: list[int]) -> ir.Value:
                return stablehlo.BroadcastInDimOp(ty, v, dims).result

            eps = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                ir.RankedTensorType.get([], ty.element_type),
                ir.FloatAttr.get(ty.element_type, epsilon))).result
            centered = stablehlo.SubtractOp(operand, along(mean, [axis])).result
            stddev = stablehlo.SqrtOp(stablehlo.AddOp(along(variance, [axis]),
                                                      along(eps, [])).result).result
            normalized = stablehlo.DivOp(centered, stddev).result
            value = stablehlo.AddOp(stablehlo.MulOp(along(scale, [axis]), normalized).result,
                                    along(offset, [axis])).result
        op.results[0].replace_all_uses_with(value)
        op.erase()
    return len(found)


def _ops_in(module: ir.Module) -> set[str]:
    names: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        names.add(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return names


def _child(request: str) -> None:
    with open(request, "rb") as f:
        text, inputs = pickle.load(f)
    try:
        outcome: list[np.ndarray] | str = _interpret_here(text, inputs)
    except BnfoldError as e:
        outcome = str(e)
    with open(request + ".out", "wb") as f:
        pickle.dump(outcome, f)


if __name__ == "__main__":
    _child(sys.argv[1])


# --- the weights a module really uses -----------------------------------------------------

_PRODUCERS = ("stablehlo.convolution", "stablehlo.dot_general")


def kernel_module(text: str) -> tuple[str, list[str]] | None:
    """A module whose @main takes nothing and returns the kernel of every producer
    whose kernel is computed from constants alone (a plain constant, or a quantized
    weight's dequantization), in program order, and those producers' locations.

    Run it on XLA to read back the weights the program computes with, whatever
    arithmetic spells them (independent of bnfold's own evaluation). None when no
    producer has a constant kernel.
    """
    from bnfold.ir import func, make_context  # noqa: PLC0415 - test helper

    with make_context(), ir.Location.unknown():
        source = ir.Module.parse(text)
        slices: list[list[ir.Operation]] = []
        where: list[str] = []

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.name in _PRODUCERS:
                for operand in (1, 0):
                    found = _constant_slice(op.operands[operand])
                    if found is not None:
                        slices.append(found)
                        where.append(str(op.location))
                        break
            return ir.WalkResult.ADVANCE

        source.operation.walk(visit)
        if not slices:
            return None
        module = ir.Module.create()
        types = [ops[-1].results[0].type for ops in slices]
        with ir.InsertionPoint(module.body):
            main = func.FuncOp("main", ir.FunctionType.get([], types))
            main.attributes["sym_visibility"] = ir.StringAttr.get("public")
            with ir.InsertionPoint(main.add_entry_block()):
                results = []
                for ops in slices:
                    copies: dict[ir.Value, ir.Value] = {}
                    for op in ops:
                        copy = op.clone()
                        for i, operand in enumerate(op.operands):
                            copy.operands[i] = copies[operand]
                        copies[op.results[0]] = copy.results[0]
                    results.append(copies[ops[-1].results[0]])
                func.ReturnOp(results)
        return str(module), where


def _constant_slice(value: ir.Value) -> list[ir.Operation] | None:
    """The ops computing `value` from constants alone, operands first; None otherwise."""
    order: list[ir.Operation] = []
    done: list[ir.Operation] = []

    def visit(v: ir.Value) -> bool:
        if isinstance(v.owner, ir.Block):
            return False  # a function or region argument
        op = v.owner.operation
        if op.regions or len(op.results) != 1 or op.name == "func.call":
            return False
        if any(op == d for d in done):
            return True
        if not all(visit(operand) for operand in op.operands):
            return False
        done.append(op)
        order.append(op)
        return True

    return order if visit(value) else None
