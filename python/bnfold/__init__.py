"""bnfold: fold batch normalization into convolutions and dot_generals in StableHLO.

    >>> import bnfold
    >>> text, report = bnfold.fold_text(open("model.mlir").read())
    >>> report.folds[0].producer, report.folds[0].channels

`fold_module` works on a parsed `jaxlib.mlir.ir.Module` in place;
`bnfold.jax_export` folds a `jax.export.Exported`.
"""

from __future__ import annotations

from bnfold.errors import BnfoldError
from bnfold.pipeline import FoldOptions, fold_module, pattern_names
from bnfold.report import Fold, Report, Skip

__all__ = [
    "BnfoldError",
    "Fold",
    "FoldOptions",
    "Report",
    "Skip",
    "fold_module",
    "fold_text",
    "pattern_names",
]
__version__ = "0.1.0"


def fold_text(text: str | bytes, options: FoldOptions | None = None, *,
              source_name: str = "<input>", debug_info: bool = False) -> tuple[str, Report]:
    """Parses MLIR text or bytecode, folds it and returns the folded text and the report."""
    from bnfold import ir as bir

    context = bir.make_context()
    parsed = bir.parse(text, context, name=source_name)
    with context:
        report = fold_module(parsed.module, options, source_name=source_name)
        out = bir.serialize(parsed.module, "mlir", debug_info=debug_info).decode()
    return out, report
