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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bnfold.binding import find_function
from bnfold.errors import BnfoldError
from bnfold.pipeline import FoldOptions, fold_source
from bnfold.report import Report

__all__ = ["fold_exported", "fold_function", "FoldedFunction"]


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
            if tuple(array.shape) != tuple(aval.shape) or array.dtype != np.dtype(aval.dtype):
                problems.append(f"argument {n}{path}: got {array.dtype}{list(array.shape)}, "
                                f"the export expects {aval.str_short()}")
                continue
            bound_flat[flat] = array
    if problems:
        raise BnfoldError("cannot bind parameters to the exported function:\n  " +
                         "\n  ".join(problems))

    kept = list(exported.module_kept_var_idx)

    def by_module_arg(module: Any) -> dict[str | int, Any]:
        """Flat input positions -> argument indices of the module's @main."""
        n_inputs = len(find_function(module, "main").regions[0].blocks[0].arguments)
        offset = n_inputs - len(kept)  # platform index / effect tokens come first
        if offset < 0:
            raise BnfoldError("exported main has fewer arguments than kept inputs")
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
