#!/usr/bin/env python3
"""Regenerate the tables in docs/ that are read from the code, between marker comments.

    python tools/gen_docs.py           # rewrite the generated blocks in place
    python tools/gen_docs.py --check   # exit 1, naming each stale block, if any differs

A block is everything between `<!-- BEGIN GENERATED name ... -->` and
`<!-- END GENERATED name -->`; the text around it is written by hand.
`tests/test_readme.py` runs the check, so a change to an option, a flag or a
refusal code fails the tests until this script is run. What it reads:

    fold-options   (docs/options.md)  dataclasses.fields(bnfold.options.FoldOptions): each
                   field's name and default, and its metadata["bnfold"] (a
                   bnfold.options.Meta: flag, pass_option, kind, metavar, choices,
                   requires, help)
    passes         (docs/options.md)  bnfold.patterns.PASSES: .name, .description,
                   .option_names()
    patterns       (docs/options.md)  bnfold.patterns.REGISTRY: .name, .description
                   (the names --disable takes)
    cli-flags      (docs/cli.md)      bnfold.cli.build_parser(): every argparse action's
                   option strings, metavar, choices and help (argparse's `_actions`)
    refusal-codes  (docs/refusals.md) bnfold.refusal.Code: each member's name and value,
                   and the `# comment` after it in refusal.py's source (MEANINGS below
                   for the members without one)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMAND = "python tools/gen_docs.py"

# Meanings of the refusal codes whose enum member has no comment in refusal.py (a
# comment there wins; a code with neither fails generation).
MEANINGS = {
    "not-float": "the producer's result or kernel is not a float tensor",
    "nothing-to-do": "nothing to rewrite here: no per-channel step to fold, nothing to "
                     "absorb, a weight already quantized, a layer whose input is a constant",
    "not-homogeneous": "an op between two layers does not commute with a positive "
                       "per-channel scale (sigmoid, swish, gelu, tanh, a select by a scaled "
                       "value)",
    "fan-out": "layer 1's output has another reader (another branch, a second layer, a "
               "function result) that the scale would change",
    "no-statistics": "no batch-norm statistics describe the value (bias correction's E[x], "
                     "a bound for high-bias absorption)",
    "already-balanced": "already equalized: every scale within 0.1% of 1",
}


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _text(text: str) -> str:
    """Prose from the code (help, descriptions) as literal Markdown: `<fold id>` is no
    HTML tag, `__elided__` not bold."""
    return re.sub(r"([\\`*<>\[\]])", r"\\\1", text).replace("__", "\\_\\_")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: str | None) -> str:
    return f"`{text}`" if text else "-"


def fold_options() -> str:
    from bnfold.options import FoldOptions

    rows = []
    for f in dataclasses.fields(FoldOptions):
        meta = f.metadata["bnfold"]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default  # type: ignore[misc]
        values = {"flag": "true / false", "names": f"{meta.metavar or 'NAME'},..."}.get(
            meta.kind.value, ", ".join(meta.choices))
        default_text = "empty" if isinstance(default, frozenset) and not default else repr(default)
        needs = _code(meta.requires)
        rows.append([f"`{f.name}`", _code(meta.flag), _code(meta.pass_option), values,
                     f"`{default_text}`", needs, _text(meta.help)])
    return _table(["FoldOptions", "bnfold-opt", "pass option", "values", "default", "needs",
                   "what it does"], rows)


def passes() -> str:
    from bnfold.patterns import PASSES

    return _table(["pass", "what it does", "options"],
                  ([f"`{p.name}`", _text(p.description), ", ".join(f"`{o}`" for o in p.option_names())]
                   for p in PASSES))


def patterns() -> str:
    from bnfold.patterns import REGISTRY

    return _table(["pattern (for `--disable`)", "what it does"],
                  ([f"`{e.name}`", _text(e.description)] for e in REGISTRY))


def cli_flags() -> str:
    from bnfold.cli import build_parser
    from bnfold.options import FoldOptions

    schema = {f.name for f in dataclasses.fields(FoldOptions)}
    rows = []
    for action in build_parser()._actions:
        if action.help == argparse.SUPPRESS:
            continue
        names = action.option_strings or [action.metavar or action.dest]
        arg = action.metavar or ("{" + ",".join(action.choices) + "}" if action.choices else "")
        takes = action.nargs != 0 and action.option_strings
        spelled = ", ".join(f"`{n} {arg}`" if takes and arg else f"`{n}`" for n in names)
        help_text = (action.help or "") % {"default": action.default, "prog": "bnfold-opt"}
        help_text = _text(help_text)
        if action.dest in schema:
            help_text += f" (FoldOptions `{action.dest}`)"
        rows.append([spelled, help_text])
    return _table(["flag", "what it does"], rows)


def refusal_codes() -> str:
    from bnfold.refusal import Code

    source = inspect.getsource(Code)
    comments = {m.group(1): m.group(2) for m in
                re.finditer(r'^\s+([A-Z_]+) = "[a-z-]+"[ \t]*#[ \t]*(.+)$', source, re.M)}
    rows = []
    for code in Code:
        meaning = comments.get(code.name) or MEANINGS.get(code.value)
        if not meaning:
            raise SystemExit(f"gen_docs: refusal code {code.value} has no meaning: add a "
                             f"comment after Code.{code.name} in python/bnfold/refusal.py")
        rows.append([f"`{code.value}`", f"`Code.{code.name}`", _text(meaning)])
    return _table(["code", "enum member", "meaning"], rows)


BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "fold-options": ("options.md", fold_options),
    "passes": ("options.md", passes),
    "patterns": ("options.md", patterns),
    "cli-flags": ("cli.md", cli_flags),
    "refusal-codes": ("refusals.md", refusal_codes),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN GENERATED {re.escape(name)}\b[^\n]*-->\n)(.*?)"
                      rf"(<!-- END GENERATED {re.escape(name)} -->)", re.S)


def generate(docs: Path = DOCS) -> dict[Path, str]:
    """Each docs file that holds generated blocks -> its text with the blocks regenerated."""
    out: dict[Path, str] = {}
    for name, (file, make) in BLOCKS.items():
        path = docs / file
        text = out.get(path) or path.read_text()
        pattern = _pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"gen_docs: {path} has no block {name} (its markers: "
                             f"<!-- BEGIN GENERATED {name}: {COMMAND} --> ... "
                             f"<!-- END GENERATED {name} -->)")
        body = make()
        out[path] = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(3), text)
    return out


def stale(docs: Path = DOCS) -> list[str]:
    """The names of the generated blocks that differ from what the code says."""
    new = generate(docs)
    return [name for name, (file, _) in BLOCKS.items()
            if _pattern(name).search(new[docs / file]).group(2)  # type: ignore[union-attr]
            != _pattern(name).search((docs / file).read_text()).group(2)]  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated block is out of date")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"docs/{BLOCKS[name][0]}: block {name} is out of date; run {COMMAND}",
                  file=sys.stderr)
        return 1 if names else 0
    for path, text in generate().items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "python"))
    sys.exit(main())
