"""Fold a `jax.export.Exported` whose parameters are arguments.

    exported = jax.export.export(jax.jit(apply))(params, x)
    folded, report = bnfold.jax_export.fold_exported(exported, params, argnums=0)
    folded.call(x)                      # params are now constants, BN folded
    jax.jit(folded.call)(x)
    blob = folded.serialize()           # and jax.export.deserialize(blob) works

`fold_exported` also takes the bytes of `Exported.serialize()`, and
`fold_serialized` (what `bnfold-opt exported.bin` runs) binds by the module's
argument names instead of a pytree.

The caller's `Exported` is never mutated: its module is deserialized into a
fresh MLIR context, the bound arguments become constants and leave the
signature, the module is folded and serialized again, and a new `Exported`
is built with `in_avals`, `in_tree`, `module_kept_var_idx`,
`in_shardings_hlo` and `_in_named_shardings` updated consistently.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfold.binding import find_function
from bnfold.errors import BnfoldError
from bnfold.pipeline import Bindings, Folded, FoldOptions, fold_source
from bnfold.report import Report

__all__ = ["fold_exported", "fold_function", "fold_serialized", "FoldedFunction", "save_params"]


def fold_exported(exported: Any, params: Any = None, *,
                  argnums: int | Sequence[int] | None = None,
                  options: FoldOptions | None = None) -> tuple[Any, Report]:
    """Binds positional arguments `argnums` to `params` and folds the module.

    `params` is the pytree passed as argument `argnums` (default 0) at export
    time (a tuple of pytrees when `argnums` is a sequence). Without `params`
    nothing is bound (an export whose weights are constants already; the same
    as `argnums=()`). Returns the new `Exported` and the fold report.
    Raises `BnfoldError` (a ValueError) listing every mismatched pytree path,
    shape or dtype.

    `exported` may also be the bytes of `Exported.serialize()` (what a JAX team
    saves to a file): they are deserialized first, and the result is an
    `Exported` all the same (call `.serialize()` on it for bytes). Anything else
    (a function, a jitted function, MLIR text) is a `TypeError` that says what
    to pass.
    """
    exported = as_exported(exported, "fold_exported")
    nums, bound_flat = _flat_params(exported, params, argnums)

    folded = fold_source(exported.mlir_module_serialized, name=exported.fun_name,
                         options=options, bindings=_by_module_arg(exported, bound_flat))
    return _rebuild(exported, nums, set(bound_flat), folded), folded.report


def _module_offset(exported: Any, module: Any) -> int:
    """How many arguments of @main come before the kept inputs (platform index, tokens)."""
    n_inputs = len(find_function(module, "main").regions[0].blocks[0].arguments)
    offset = n_inputs - len(exported.module_kept_var_idx)
    if offset < 0:
        raise BnfoldError("exported main has fewer arguments than kept inputs")
    return offset


def _by_module_arg(exported: Any, bound_flat: Mapping[int, np.ndarray]
                   ) -> Callable[[Any], dict[str | int, Any]]:
    kept = list(exported.module_kept_var_idx)

    def by_module_arg(module: Any) -> dict[str | int, Any]:
        """Flat input positions -> argument indices of the module's @main."""
        offset = _module_offset(exported, module)
        return {offset + kept.index(flat): value
                for flat, value in bound_flat.items() if flat in kept}

    return by_module_arg


def _rebuild(exported: Any, nums: Sequence[int], bound_flat: Collection[int],
             folded_module: Folded, *, keep_module: bool = False) -> Any:
    """A new `Exported`: `folded_module` as its module, without the positional
    arguments `nums` (whose flat inputs are `bound_flat`). Writing the portable
    artifact turns the module into VHLO in place: `keep_module` writes a copy."""
    from jax import tree_util

    from bnfold.ir import parse

    args_tree, kwargs_tree = exported.in_tree.children()
    arg_trees = args_tree.children()
    kept = list(exported.module_kept_var_idx)
    source = folded_module
    if keep_module:
        source = Folded(parse(folded_module.serialize("bytecode"), folded_module.context),
                        folded_module.context, folded_module.report)
    serialized = source.serialize("portable", target_version=_target_version())
    remaining = [i for i in range(len(exported.in_avals)) if i not in bound_flat]
    renumber = {old: new for new, old in enumerate(remaining)}
    # Rebuild (args, kwargs) from placeholders: the export's treedefs may come
    # from a registry treedef_tuple refuses to mix.
    placeholders = tuple(tree_util.tree_unflatten(t, [0] * t.num_leaves)
                         for i, t in enumerate(arg_trees) if i not in nums)
    kwargs = tree_util.tree_unflatten(kwargs_tree, [0] * kwargs_tree.num_leaves)
    return dataclasses.replace(
        exported,
        in_tree=tree_util.tree_structure((placeholders, kwargs)),
        in_avals=tuple(exported.in_avals[i] for i in remaining),
        in_shardings_hlo=tuple(exported.in_shardings_hlo[i] for i in remaining),
        _in_named_shardings=tuple(exported._in_named_shardings[i] for i in remaining),
        module_kept_var_idx=tuple(renumber[i] for i in kept if i in renumber),
        mlir_module_serialized=serialized,
        _get_vjp=None,  # the original VJP would differentiate the unfolded module
    )


def fold_serialized(data: bytes, params: Bindings | None = None, *,
                    name: str = "<input>", options: FoldOptions | None = None,
                    **source_options: Any) -> tuple[Any, Folded]:
    """Folds the `jax.export.Exported` that `data` (its `serialize()` bytes) holds.

    `params` binds inputs by the names of the module's @main arguments, as
    `--bind-params` does (`params['conv']`, `x`, or `argN`); the bound inputs
    must be whole positional arguments of the exported function (every leaf of
    its pytree that the module uses). Returns the new `Exported` (the bound
    arguments gone) and the folded module with its report. `source_options` go
    to `fold_source` (allow_unregistered, pass_pipeline, graph_nodes).
    """
    from jax import tree_util

    exported = deserialize(data, name=name)
    kept = list(exported.module_kept_var_idx)
    chosen: list[int] = []

    def bindings(module: Any) -> dict[str | int, Any]:
        from bnfold.binding import argument_names, resolve

        offset = _module_offset(exported, module)
        names = argument_names(find_function(module, "main"))
        found: dict[str | int, Any] = {}
        given = params(module) if callable(params) else params
        for key, value in (given or {}).items():
            index = resolve(key, names)
            if index is not None and index < offset:
                raise BnfoldError(f"'{key}' names argument {index} of @main, which jax.export "
                                  "added (platform index or effect token): it cannot be bound",
                                  location=name)
            if index is not None:
                chosen.append(kept[index - offset])
            found[key if index is None else index] = value
        return found

    folded = fold_source(data=exported.mlir_module_serialized, name=name, options=options,
                         bindings=bindings, **source_options)
    args_tree, kwargs_tree = exported.in_tree.children()
    arg_trees = args_tree.children()
    starts = np.cumsum([0] + [t.num_leaves for t in arg_trees])
    nums: list[int] = []
    problems: list[str] = []
    paths = [tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(
        tree_util.tree_unflatten(exported.in_tree, [0] * exported.in_tree.num_leaves))[0]]
    for n in range(len(arg_trees)):
        used = [i for i in range(int(starts[n]), int(starts[n + 1])) if i in kept]
        bound = [i for i in used if i in chosen]
        if bound and len(bound) < len(used):
            missing = [paths[i] for i in used if i not in chosen]
            problems.append(f"positional argument {n} is bound in part: bind all of its "
                            f"leaves (missing {', '.join(missing[:8])}"
                            f"{' ...' if len(missing) > 8 else ''}) or none")
        elif bound:
            nums.append(n)
    if any(i >= int(starts[-1]) for i in chosen):
        problems.append("keyword arguments cannot be bound (bind positional arguments only)")
    if problems:
        raise BnfoldError("cannot bind parameters to the exported function:\n  "
                          + "\n  ".join(problems), location=name)
    bound_flat = {i for n in nums for i in range(int(starts[n]), int(starts[n + 1]))}
    return _rebuild(exported, nums, bound_flat, folded, keep_module=True), folded


def as_exported(value: Any, caller: str) -> Any:
    """`value` as a `jax.export.Exported`: itself, or the one its serialized bytes hold.

    Raises `TypeError` naming what was expected for any other object, and
    `BnfoldError` for bytes that are not a serialized `Exported`.
    """
    import jax

    if isinstance(value, jax.export.Exported):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return deserialize(bytes(value), name="<bytes>")
    if isinstance(value, str):
        hint = ("MLIR text: use bnfold.fold_text" if value.lstrip().startswith(("module", "func", "#"))
                or "\n" in value else "a path? read it (open(path, 'rb').read()) and pass the bytes")
        got = f"a str ({hint})"
    elif callable(value):
        got = (f"a function ({getattr(value, '__name__', type(value).__name__)}): export it first "
               "(jax.export.export(jax.jit(f))(params, x)), or use "
               "bnfold.jax_export.fold_function(f, params, x)")
    else:
        got = type(value).__qualname__
    raise TypeError(f"{caller} expects a jax.export.Exported (jax.export.export(jax.jit(f))(*args)) "
                    f"or the bytes of its serialize(); got {got}")


def deserialize(data: bytes, *, name: str = "<input>") -> Any:
    """`jax.export.deserialize(data)`, or a `BnfoldError` that says what `data` is not."""
    from bnfold import ir as bir

    exported = bir.deserialize_exported(data)
    if exported is None:
        raise BnfoldError(f"not a serialized jax.export.Exported (expected the bytes of "
                          f"Exported.serialize(); {bir.ACCEPTED_FORMATS})", location=name)
    return exported


def _flat_params(exported: Any, params: Any, argnums: int | Sequence[int] | None
                 ) -> tuple[tuple[int, ...], dict[int, np.ndarray]]:
    """The positional arguments `argnums` of `exported` to bind, and `params`' leaves by
    flat input position; raises `BnfoldError` listing every mismatch."""
    from jax import tree_util

    if params is None and argnums not in (None, ()):
        raise BnfoldError(f"argnums={argnums!r} names arguments to bind, but no params were "
                          "given: pass the pytree(s) to bind, or leave argnums out to fold "
                          "without binding")
    if argnums is None:
        argnums = 0 if params is not None else ()
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    values = (params,) if isinstance(argnums, int) else tuple(params or ())
    if len(values) != len(nums):
        raise BnfoldError(f"argnums {nums} needs {len(nums)} parameter pytrees, got {len(values)}")

    args_tree, kwargs_tree = exported.in_tree.children()
    arg_trees = args_tree.children()
    for n in nums:
        if not 0 <= n < len(arg_trees):
            raise BnfoldError(f"argnums {n} does not exist: the exported function takes "
                             f"{len(arg_trees)} positional argument(s)")
    if len(set(nums)) != len(nums):
        raise BnfoldError(f"argnums {nums} repeats an argument")

    kept = set(exported.module_kept_var_idx)
    # Flat positions of every positional argument's leaves among in_avals.
    starts = np.cumsum([0] + [t.num_leaves for t in arg_trees])
    bound_flat: dict[int, np.ndarray] = {}
    problems: list[str] = []
    for n, value in zip(nums, values, strict=True):
        leaves, tree = tree_util.tree_flatten(value)
        if tree != arg_trees[n]:
            problems.append(f"argument {n}: the pytree does not match the exported one: "
                            f"{_tree_difference(value, arg_trees[n])}")
            continue
        paths = [tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(value)[0]]
        for k, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
            flat = int(starts[n]) + k
            aval = exported.in_avals[flat]
            array = np.asarray(leaf)
            if flat not in kept:  # dropped by jax.export: compared as jax saw it
                array = _as_jax_passed(array, np.dtype(aval.dtype))
            if tuple(array.shape) != tuple(aval.shape) or array.dtype != np.dtype(aval.dtype):
                problems.append(f"argument {n}{path}: got {array.dtype}{list(array.shape)}, "
                                f"the export expects {aval.str_short()}")
                continue
            bound_flat[flat] = array
    if problems:
        raise BnfoldError("cannot bind parameters to the exported function:\n  " +
                         "\n  ".join(problems))
    return nums, bound_flat


def _as_jax_passed(array: np.ndarray, expected: np.dtype) -> np.ndarray:
    """`array` in the dtype jax gave it at export time: without jax_enable_x64, an int64
    leaf (torch's num_batches_tracked) was exported as int32. Only for leaves jax dropped,
    which are never bound; a bound leaf must have the exported dtype exactly."""
    from jax import dtypes

    if array.dtype != expected and dtypes.canonicalize_dtype(array.dtype) == expected:
        return array.astype(expected)
    return array


def save_params(path: Any, exported: Any, params: Any, *,
                argnums: int | Sequence[int] | None = None) -> list[str]:
    """Writes the `--bind-params` file for `bnfold-opt` from an `Exported` and the
    parameter pytree(s) it was exported with (`argnums` as for `fold_exported`).

        exported = jax.export.export(jax.jit(apply))(params, x)
        bnfold.jax_export.save_params("params.npz", exported, params)
        # bnfold-opt model.mlir --bind-params params.npz   (model.mlir: exported.mlir_module())

    Each leaf is keyed by a name only its module argument answers to (jax.export's
    `params['bn']['mean']`; `argN` where it has none), so the file does not depend on
    leaf order: the leaves jax.export dropped because the function never reads them
    (Equinox's boolean state, torch's `num_batches_tracked`) are left out, where a
    positional `numpy.savez(path, *leaves)` would shift every later one. `path` is a
    file name (numpy adds `.npz` to a name without it) or a binary file object.
    Returns the keys written; raises `BnfoldError` like `fold_exported` when the
    pytree does not match the export.
    """
    from bnfold import ir as bir
    from bnfold.binding import argument_names

    if params is None:
        raise BnfoldError("save_params needs the parameter pytree(s) the function was "
                          "exported with")
    _, bound_flat = _flat_params(exported, params, argnums)
    kept = list(exported.module_kept_var_idx)
    context = bir.make_context()
    module = bir.parse(exported.mlir_module_serialized, context, name=exported.fun_name)
    with context:
        offset = _module_offset(exported, module)
        names = argument_names(find_function(module, "main"))
    arrays: dict[str, np.ndarray] = {}
    for flat, value in sorted(bound_flat.items()):
        if flat not in kept:
            continue  # jax.export dropped the leaf: the module has no argument for it
        index = offset + kept.index(flat)
        # argN names the argument by position; prefer a name, one no other argument has
        # (binding takes the first argument that answers to a key).
        unique = sorted(n for n in names[index] if not re.fullmatch(r"arg\d+", n)
                        and not any(n in other for j, other in enumerate(names) if j != index))
        arrays[unique[0] if unique else f"arg{index}"] = value
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return list(arrays)


def _target_version() -> str:
    from bnfold.ir import stablehlo

    return stablehlo.get_version_from_compatibility_requirement(
        stablehlo.StablehloCompatibilityRequirement.WEEK_4)


@dataclass(frozen=True)
class FoldedFunction:
    """A folded function: call it like the original without the parameters."""

    exported: Any
    report: Report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.exported.call(*args, **kwargs)


def _tree_difference(value: Any, expected_tree: Any) -> str:
    """The leaf paths only one side has (a readable diff, not two treedefs)."""
    from jax import tree_util

    def paths(tree_value: Any) -> set[str]:
        return {tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(tree_value)[0]}

    given = paths(value)
    expected = paths(tree_util.tree_unflatten(expected_tree, [0] * expected_tree.num_leaves))
    missing, extra = sorted(expected - given), sorted(given - expected)
    parts = []
    if missing:
        parts.append(f"missing {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
    if extra:
        parts.append(f"unexpected {', '.join(extra[:8])}" + (" ..." if len(extra) > 8 else ""))
    return "; ".join(parts) or "same leaf paths, different container types"


def fold_function(fn: Callable[..., Any], params: Any, *example_args: Any,
                  options: FoldOptions | None = None, **example_kwargs: Any) -> FoldedFunction:
    """Exports `fn(params, *example_args, **example_kwargs)`, binds `params` and folds.

        folded = bnfold.jax_export.fold_function(model.apply, variables, x)
        y = folded(x)              # same as model.apply(variables, x)

    Keyword arguments are part of the exported signature: call the result with
    the same keywords (e.g. `train=False` for a module that takes it).
    """
    import jax

    exported = jax.export.export(jax.jit(fn))(params, *example_args, **example_kwargs)
    folded, report = fold_exported(exported, params, argnums=0, options=options)
    return FoldedFunction(folded, report)
