"""The one options schema: `FoldOptions` fields and their metadata.

Each field says how the user spells it on the command line (`flag`) and in a
pass pipeline (`pass_option`), so `bnfold-opt`'s flags, the options of every
bnfold pass and the Python keyword are generated from one place (as xDSL's
pass options are):

    FoldOptions(equalize=True, absorb_high_bias=True)                  # Python
    bnfold-opt model.mlir --equalize --absorb-high-bias                 # CLI
    --pass-pipeline='builtin.module(bnfold-equalize{absorb-high-bias=true})'

The core's options (disable, skip_functions, statistics) are declared in
`bnfold.schema`; every other option is declared by its pattern, in its registry
entry (`bnfold.patterns.Entry.options`), and `FoldOptions` is built from the
registry (`bnfold.schema.build`). Validation runs once, in
`FoldOptions.__post_init__`, and raises an `OptionError` naming the option the
user gave, in the spelling they gave it (`from_cli` and `from_pass` re-spell
it): "--absorb-high-bias needs --equalize", never the name of another flag that
happened to be set.
"""

from __future__ import annotations

import argparse
from typing import Any

from bnfold.patterns import PASSES, FoldOptions
from bnfold.schema import Kind, Meta, Option, OptionError, PassSpec, Ref, meta, names, symbol, table

__all__ = ["PASSES", "FoldOptions", "Kind", "Meta", "Option", "OptionError", "PassSpec", "Ref",
           "add_arguments", "cli_spelling", "from_cli", "given_on_cli", "symbol"]


def _meta(name: str) -> Meta:
    return meta(table(FoldOptions)[name])


# --- the command line -----------------------------------------------------------


def cli_spelling(name: str) -> str:
    flag = _meta(name).flag
    return flag if flag is not None else name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds a flag for every option that has one (in the schema's order)."""
    for name in table(FoldOptions):
        meta = _meta(name)
        if meta.flag is None:
            continue
        if meta.kind is Kind.FLAG:
            parser.add_argument(meta.flag, dest=name, action="store_true", help=meta.help)
        elif meta.kind is Kind.NAMES:
            parser.add_argument(meta.flag, dest=name, action="append" if meta.repeat else "store",
                                default=[] if meta.repeat else "", metavar=meta.metavar,
                                help=meta.help)
        else:
            parser.add_argument(meta.flag, dest=name, choices=meta.choices, default=None,
                                metavar=meta.metavar, help=meta.help)


def from_cli(args: argparse.Namespace, **derived: Any) -> FoldOptions:
    """The options of a parsed command line; `derived` sets options that have no flag."""
    values = {name: getattr(args, name) for name in table(FoldOptions) if _meta(name).flag is not None}
    try:
        return FoldOptions(**values, **derived)
    except OptionError as e:
        raise e.spelled(cli_spelling) from None


def given_on_cli(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Each option the command line set, as (field name, its pass-option spelling with the
    value: `equalize=true`, `disable=a,b`), in the schema's order."""
    given = []
    for name in table(FoldOptions):
        meta = _meta(name)
        value = getattr(args, name, None) if meta.flag is not None else None
        if not value:
            continue
        if meta.kind is Kind.FLAG:
            text = "true"
        elif meta.kind is Kind.NAMES:
            text = ",".join(sorted(names(value)))
        else:
            text = str(value)
        given.append((name, f"{meta.pass_option}={text}"))
    return given
