"""Bind function arguments to constant values (TVM's `bind_params_by_name`).

JAX exports usually pass parameters as arguments, so nothing is constant and
nothing folds. Binding replaces chosen arguments of a function by
`stablehlo.constant` ops and removes them from its signature:

    func.func @main(%arg0: tensor<4xf32> loc("params['b']"), %arg1: tensor<1x8x8x3xf32>)
  -> bind {"arg0": b} (or {"params['b']": b})
    func.func @main(%arg0: tensor<1x8x8x3xf32>) {
      %cst = stablehlo.constant dense<[...]> : tensor<4xf32>

Arguments are named by `argN`, by their `jax.arg_info` attribute, or by their
location name (jax.export writes `loc("params['b']")`).
`bnfold.jax_export.save_params` writes such a file from an `Exported` and its
parameter pytree, by name, without the leaves jax.export dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from bnfold import elements
from bnfold.errors import BnfoldError
from bnfold.graph import (
    callee_name,
    calls,
    defining_op,
    function_list,
    function_of,
    functions,
    is_private,
    lookup_function,
    printed_symbol,
    symbol_name,
    symbol_table_of,
)
from bnfold.ir import ir, location_name, stablehlo


class BindError(BnfoldError):
    """Parameters that do not bind: a short message (a few lines, each of a bounded
    length) and, in `details`, every problem and every argument's names (`bnfold-opt -v`)."""

    def __init__(self, message: str, details: str, *, location: str | None = None) -> None:
        self.details = details
        super().__init__(message, location=location)


_SHOWN = 3  # problems (and missing keys) in the short message; the rest is in `details`
_LINE = 240  # characters of one line of the short message


def _clip(text: str) -> str:
    return text if len(text) <= _LINE else text[:_LINE - 30] + f" ... ({len(text)} chars)"


def short_list(items: list[str], budget: int = 160) -> str:
    """As many of `items` as fit in about `budget` characters (at least one), and how many
    more there are."""
    shown: list[str] = []
    for item in items:
        if shown and sum(len(s) + 2 for s in shown) + len(item) > budget:
            break
        shown.append(item)
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def unknown_keys(module: ir.Module, keys: list[str | int], *,
                 function: str = "main") -> list[str | int]:
    """The keys that name no argument of `@function` (for `--bind-params-extra ignore`)."""
    names = argument_names(find_function(module, function))
    return [key for key in keys if resolve(key, names) is None]


def find_function(module: ir.Module, name: str) -> ir.Operation:
    func = lookup_function(module, name)
    if func is None:
        raise BnfoldError(f"module has no function {printed_symbol(name)}; its functions: "
                          f"{function_list(module)}")
    return func


def argument_names(func: ir.Operation) -> list[set[str]]:
    """Every name each argument answers to: argN, jax.arg_info, its location name.

    A shape-polymorphic jax.export keeps the names on `@_wrapped_jax_export_main`,
    which `@main` calls with its own arguments: an argument passed straight to
    a private callee also answers to that callee argument's names.
    """
    block = func.regions[0].blocks[0]
    arg_attrs = func.attributes["arg_attrs"] if "arg_attrs" in func.attributes else None
    names: list[set[str]] = []
    for i, arg in enumerate(block.arguments):
        aliases = {f"arg{i}"}
        if arg_attrs is not None:
            attrs = ir.DictAttr(ir.ArrayAttr(arg_attrs)[i])
            if "jax.arg_info" in attrs:
                aliases.add(ir.StringAttr(attrs["jax.arg_info"]).value)
        name = location_name(arg.location)
        if name:
            aliases.add(name)
        names.append(aliases)
    for call in _calls_in(func):
        callee = _callee_of(call)
        if callee is None or not is_private(callee):
            continue
        inner = argument_names(callee)
        for position, operand in enumerate(call.operands):
            if operand in block.arguments:
                outer = list(block.arguments).index(operand)
                names[outer] |= {n for n in inner[position] if not n.startswith("arg")}
    return names


def _calls_in(func: ir.Operation) -> list[ir.Operation]:
    """The `func.call` ops directly in the function's body."""
    return [op.operation for op in func.regions[0].blocks[0].operations
            if op.operation.name == "func.call"]


def _callee_of(call: ir.Operation) -> ir.Operation | None:
    func = function_of(call)
    module_op = func.parent if func is not None else None
    if module_op is None:
        return None
    return symbol_table_of(module_op.operation).get(callee_name(call))


def bind_arguments(module: ir.Module, values: Mapping[str | int, Any], *,
                   function: str = "main", source_name: str | None = None,
                   names_out: dict[str, str] | None = None) -> list[int]:
    """Replaces the named arguments of `@function` by constants; returns their indices.

    `names_out` receives, for each bound argument, its location (the constant's, as
    `str(location)`) and the parameter's name: the key given, else the name jax.export
    recorded (`params['conv']`), else `argN` (a location several arguments share is
    left out: it would name other constants too).

    Raises `BnfoldError` listing every key that names no argument and every
    value whose shape or dtype does not match, before changing anything.
    """
    func = find_function(module, function)
    block = func.regions[0].blocks[0]
    names = argument_names(func)
    chosen: dict[int, np.ndarray] = {}
    keys: dict[int, str | int] = {}
    problems: list[str] = []
    misses: list[str] = []
    for key, value in values.items():
        index = resolve(key, names)
        if index is None:
            misses.append(f"'{key}'")
            continue
        if index in chosen:
            problems.append(f"'{key}' binds argument {index} a second time")
            continue
        array = np.asarray(value)
        arg_type = elements.tensor_type(block.arguments[index].type)
        if arg_type is None:
            problems.append(f"argument {index} ('{key}') has a dynamic or non-tensor type")
            continue
        expected = elements.numpy_dtype(arg_type.element_type)
        if tuple(array.shape) != tuple(arg_type.shape) or expected is None or array.dtype != expected:
            problems.append(f"'{key}' is {array.dtype}{list(array.shape)} but argument {index} is "
                            f"{arg_type}")
            continue
        chosen[index] = array
        keys[index] = key
    if misses or problems:
        raise _bind_error(misses, problems, names, function, source_name)
    if names_out is not None:
        _parameter_names(func, keys, names, names_out)
    _replace_arguments(func, chosen, keep_signature=is_private(func))
    propagate_constants(module, func)
    return sorted(chosen)


def _parameter_names(func: ir.Operation, keys: Mapping[int, str | int],
                     names: list[set[str]], out: dict[str, str]) -> None:
    block = func.regions[0].blocks[0]
    where = [str(arg.location) for arg in block.arguments]
    for index, key in keys.items():
        location = where[index]
        if location == "loc(unknown)" or where.count(location) > 1:
            continue
        if isinstance(key, str) and key != f"arg{index}":
            out[location] = key
            continue
        given = location_name(block.arguments[index].location)
        others = sorted((n for n in names[index] if not n.startswith("arg")), key=len)
        out[location] = given or (others[0] if others else f"arg{index}")


def propagate_constants(module: ir.Module, func: ir.Operation, _depth: int = 0) -> None:
    """Makes constants passed to a private helper with one call site constants inside it.

    After binding, `@main` passes the parameters on to `@_wrapped_jax_export_main`
    (shape-polymorphic exports) as `stablehlo.constant` values; inside the callee
    they are still arguments. Each such argument's uses become a copy of the
    constant (the same uniqued attribute, no data copy); signatures stay as
    they are, so every call still verifies. Callees with several call sites
    are left alone.
    """
    if _depth > 8:
        return
    counts: dict[str, int] = {}
    for call in calls(functions(module)):
        counts[callee_name(call)] = counts.get(callee_name(call), 0) + 1
    for call in _calls_in(func):
        callee = _callee_of(call)
        if callee is None or not is_private(callee) or counts.get(symbol_name(callee)) != 1 or \
                len(callee.regions[0].blocks) != 1:
            continue
        block = callee.regions[0].blocks[0]
        first = list(block.operations)[0]
        changed = False
        for operand, argument in zip(call.operands, block.arguments, strict=True):
            owner = defining_op(operand)
            if owner is None or owner.name != "stablehlo.constant" or \
                    not any(True for _ in argument.uses):
                continue
            with ir.InsertionPoint(first), owner.location:
                const = stablehlo.ConstantOp(owner.attributes["value"])
            argument.replace_all_uses_with(const.result)
            changed = True
        if changed:
            propagate_constants(module, callee, _depth + 1)



_POSITIONAL = r"^'arr_\d+'$"  # compiled on first use


def _bind_error(misses: list[str], problems: list[str], names: list[set[str]], function: str,
                source_name: str | None) -> BindError:
    """A few lines (the first problems, each clipped), and every one of them in details."""
    lines, full = [], []
    aliases = ["/".join(sorted(a, key=len)) for a in names]
    if misses:
        verb = "names" if len(misses) == 1 else "name"
        lines.append(f"{len(misses)} key(s) {verb} no argument of @{function}: "
                     f"{short_list(misses)}")
        lines.append(f"its {len(names)} argument(s) answer to: {short_list(aliases)}")
        full.append(f"{', '.join(misses)} {verb} no argument of @{function}; its "
                    f"{len(names)} arguments answer to: {_describe(names)}")
    lines += problems[:_SHOWN]
    full += problems
    clipped = [_clip(line) for line in lines]
    hidden = len(problems) > _SHOWN or clipped != lines or \
        (bool(misses) and (short_list(misses) != ", ".join(misses) or
                           short_list(aliases) != ", ".join(aliases)))
    if len(problems) > _SHOWN:
        clipped.append(f"... and {len(problems) - _SHOWN} more mismatch(es)")
    if misses and all(re.match(_POSITIONAL, m) for m in misses):
        clipped.append("arr_0, arr_1, ... are numpy.savez(path, *arrays)'s keys: positions "
                       "that jax.export's dropped (unused) leaves misalign; write names with "
                       "bnfold.jax_export.save_params(path, exported, params)")
    elif misses:
        clipped.append("to skip keys that name no argument (a full state dict): "
                       "bnfold-opt --bind-params-extra ignore")
    if hidden:
        clipped.append("(bnfold-opt -v, or the error's `details`, lists them all)")
    return BindError("cannot bind parameters:\n  " + "\n  ".join(clipped),
                     "\n".join(full), location=source_name)


def resolve(key: str | int, names: list[set[str]]) -> int | None:
    """The index of the argument `key` names (an index, argN, or one of its names)."""
    if isinstance(key, int):
        return key if 0 <= key < len(names) else None
    for i, aliases in enumerate(names):
        if key in aliases:
            return i
    return None


def _describe(names: list[set[str]]) -> str:
    return ", ".join("/".join(sorted(a, key=len)) for a in names)


def _replace_arguments(func: ir.Operation, chosen: Mapping[int, np.ndarray], *,
                       keep_signature: bool = False) -> None:
    """Replaces the chosen arguments' uses by constants and, unless
    `keep_signature` (private functions: their callers still pass them),
    removes the arguments from the signature."""
    block = func.regions[0].blocks[0]
    first = list(block.operations)[0]
    for index, array in chosen.items():
        arg = block.arguments[index]
        ty = ir.RankedTensorType(arg.type)
        with ir.InsertionPoint(first), arg.location:
            const = stablehlo.ConstantOp(elements.array_attr(array, ty))
        arg.replace_all_uses_with(const.result)
    if keep_signature:
        return
    for index in sorted(chosen, reverse=True):
        block.erase_argument(index)
    func_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    inputs = [t for i, t in enumerate(func_type.inputs) if i not in chosen]
    func.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(inputs, list(func_type.results)))
    if "arg_attrs" in func.attributes:
        kept = [a for i, a in enumerate(ir.ArrayAttr(func.attributes["arg_attrs"])) if i not in chosen]
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(kept)

