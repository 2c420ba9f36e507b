"""Fold a `jax.export.Exported` whose parameters are arguments.

    exported = jax.export.export(jax.jit(apply))(params, x)
    folded, report = bnfold.jax_export.fold_exported(exported, params, argnums=0)
    folded.call(x)                      # params are now constants, BN folded
    jax.jit(folded.call)(x)
    blob = folded.serialize()           # and jax.export.deserialize(blob) works

The caller's `Exported` is never mutated: its module is deserialized into a
fresh MLIR context, the bound arguments become constants and leave the
signature, the module is folded and serialized again, and a new `Exported`
is built with `in_avals`, `in_tree`, `module_kept_var_idx`,
`in_shardings_hlo` and `_in_named_shardings` updated consistently.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfold.binding import find_function
from bnfold.errors import BnfoldError
from bnfold.pipeline import FoldOptions, fold_source
from bnfold.report import Report

__all__ = ["fold_exported", "fold_function", "FoldedFunction", "save_params"]


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
    """
    from jax import tree_util

    nums, bound_flat = _flat_params(exported, params, argnums)
    args_tree, kwargs_tree = exported.in_tree.children()
    arg_trees = args_tree.children()
    kept = list(exported.module_kept_var_idx)

    def by_module_arg(module: Any) -> dict[str | int, Any]:
        """Flat input positions -> argument indices of the module's @main."""
        offset = _kept_offset(module, kept)
        return {offset + kept.index(flat): value
                for flat, value in bound_flat.items() if flat in kept}

    folded_module = fold_source(exported.mlir_module_serialized, name=exported.fun_name,
                                options=options, bindings=by_module_arg)
    report = folded_module.report
    serialized = folded_module.serialize("portable", target_version=_target_version())

    remaining = [i for i in range(len(exported.in_avals)) if i not in bound_flat]
    renumber = {old: new for new, old in enumerate(remaining)}
    # Rebuild (args, kwargs) from placeholders: the export's treedefs may come
    # from a registry treedef_tuple refuses to mix.
    placeholders = tuple(tree_util.tree_unflatten(t, [0] * t.num_leaves)
                         for i, t in enumerate(arg_trees) if i not in nums)
    kwargs = tree_util.tree_unflatten(kwargs_tree, [0] * kwargs_tree.num_leaves)
    folded = dataclasses.replace(
        exported,
        in_tree=tree_util.tree_structure((placeholders, kwargs)),
        in_avals=tuple(exported.in_avals[i] for i in remaining),
        in_shardings_hlo=tuple(exported.in_shardings_hlo[i] for i in remaining),
        _in_named_shardings=tuple(exported._in_named_shardings[i] for i in remaining),
        module_kept_var_idx=tuple(renumber[i] for i in kept if i in renumber),
        mlir_module_serialized=serialized,
        _get_vjp=None,  # the original VJP would differentiate the unfolded module
    )
    return folded, report


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


def _kept_offset(module: Any, kept: list[int]) -> int:
    """The index of @main's first kept input: platform index / effect tokens come first."""
    n_inputs = len(find_function(module, "main").regions[0].blocks[0].arguments)
    offset = n_inputs - len(kept)
    if offset < 0:
        raise BnfoldError("exported main has fewer arguments than kept inputs")
    return offset


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
        offset = _kept_offset(module, kept)
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
