"""bnfold: fold batch normalization into convolutions and dot_generals in StableHLO.

    >>> import bnfold
    >>> text, report = bnfold.fold_text(open("model.mlir").read())
    >>> report.folds[0].producer, report.folds[0].channels

`fold_module` works on a parsed `jaxlib.mlir.ir.Module` in place;
`bnfold.jax_export` folds a `jax.export.Exported`.
"""

from __future__ import annotations

from bnfold import _jaxlib_version

_jaxlib_version.check_installed()  # before anything touches jaxlib.mlir

from bnfold.errors import BnfoldError  # noqa: E402
from bnfold.pipeline import Folded, FoldOptions, fold_module, fold_source, pattern_names  # noqa: E402
from bnfold.report import Fold, Report, Skip  # noqa: E402

__all__ = [
    "BnfoldError",
    "Fold",
    "FoldOptions",
    "Folded",
    "Report",
    "Skip",
    "fold_module",
    "fold_source",
    "fold_text",
    "pattern_names",
]
__version__ = "0.1.0"


def fold_text(text: str | bytes, options: FoldOptions | None = None, *,
              source_name: str = "<input>", debug_info: bool = False) -> tuple[str, Report]:
    """Parses MLIR text or bytecode, folds it and returns the folded text and the report.

    `text` is the module's contents, not a file name: a one-line string that names a
    file or ends like one (`.mlir`, `.mlirbc`) is refused (read it first, or use
    `fold_source(path=...)`). Raises `TypeError` for anything but str/bytes.
    """
    from bnfold.pipeline import check_source

    check_source(text, "fold_text")
    folded = fold_source(text, name=source_name, options=options)
    return folded.serialize("mlir", debug_info=debug_info).decode(), folded.report
