"""MLIR's textual pass-pipeline grammar, parsed with the position of every part.

    pipeline  ::= element (`,` element)*            inside `builtin.module(...)` or bare
    element   ::= name (`(` pipeline `)`)?           an op anchor: `func.func(cse)`
                | name (`{` option* `}`)?            a pass and its options
    option    ::= key (`=` value)?                   options are separated by spaces;
                                                     a key without a value is `true`
    value     ::= (word | `"..."` | `'...'` | `{...}`)+   until a space or the closing `}`

As MLIR parses them, a value is a comma-separated list (`disable=a,b`), a
quoted part is taken as it is (`skip-func="<lambda>"` is `<lambda>`, and a
quoted comma does not split), and a value that is one `{...}` block is the
list inside it (`disable={a,b}`). Unlike MLIR, spaces around `=` are allowed
(`disable = forward-affine`). Every error says what was expected and points
at its column:

    --pass-pipeline: error: expected an option name, found '{' (column 28)
      builtin.module(bnfold-fold{{}})
                                 ^
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bnfold.errors import BnfoldError

_NAME = re.compile(r"[A-Za-z0-9_.$\-]+")
_KEY_END = " \t\r\n={}\"',"
_SPACE = " \t\r\n"


@dataclass(frozen=True)
class Item:
    """One element of an option's list, unquoted, and where it starts."""

    text: str
    at: int


@dataclass(frozen=True)
class Option:
    """`key=value` (or a bare `key`, whose `value` is None) inside a pass's braces."""

    key: str
    at: int  # offset of the key
    value: str | None  # the value as written (quotes and braces kept); None: no `=`
    value_at: int  # offset of the value (of the key when there is none)
    items: tuple[Item, ...]  # the value as a list (comma-separated, unquoted)


@dataclass(frozen=True)
class Element:
    """One pass of a pipeline (with its options) or an op anchor with its nested pipeline."""

    name: str
    at: int
    text: str  # as written, for MLIR's own parser
    options: tuple[Option, ...] = ()
    nested: tuple[Element, ...] | None = None  # `func.func(...)`'s elements

    def walk(self) -> list[Element]:
        """This element and every element nested in it."""
        return [self, *(e for n in self.nested or () for e in n.walk())]


class PipelineError(BnfoldError):
    """A syntax error in a pipeline, with a caret under the offending column."""

    def __init__(self, message: str, text: str, at: int,
                 location: str = "--pass-pipeline") -> None:
        self.at = at
        super().__init__(message + point_at(text, at), location=location)


def point_at(text: str, at: int) -> str:
    """` (column N)` and the text with a caret under offset `at` (two more lines)."""
    shown = re.sub(r"[\t\r\n]", " ", text)
    return f" (column {at + 1})\n  {shown}\n  {' ' * at}^"


def parse(text: str) -> list[Element]:
    """The top-level elements of `builtin.module(a,b{x=1 y=2},func.func(c))` (or of the
    bare list `a,b{x=1 y=2}`); raises PipelineError."""
    parser = _Parser(text)
    elements = parser.elements(closing=None)
    if len(elements) == 1 and elements[0].name == "builtin.module" and \
            elements[0].nested is not None:
        return list(elements[0].nested)
    return list(elements)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, at: int | None = None) -> PipelineError:
        return PipelineError(message, self.text, self.pos if at is None else at)

    def found(self) -> str:
        return f"found '{self.text[self.pos]}'" if self.pos < len(self.text) else \
            "found the end of the pipeline"

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def elements(self, closing: str | None) -> tuple[Element, ...]:
        found: list[Element] = []
        while True:
            found.append(self.element())
            self.skip_space()
            ch = self.peek()
            if ch == ",":
                self.pos += 1
                continue
            if ch == (closing or ""):
                return tuple(found)
            expected = f"',' or '{closing}'" if closing else "',' or the end of the pipeline"
            raise self.error(f"expected {expected} after '{found[-1].name}', {self.found()}")

    def element(self) -> Element:
        self.skip_space()
        start = self.pos
        name = _NAME.match(self.text, self.pos)
        if name is None:
            raise self.error(f"expected a pass name, {self.found()}")
        self.pos = name.end()
        self.skip_space()
        options: tuple[Option, ...] = ()
        nested: tuple[Element, ...] | None = None
        if self.peek() == "(":
            self.pos += 1
            self.skip_space()
            if self.peek() == ")":
                nested = ()
            else:
                nested = self.elements(closing=")")
            self.pos += 1
        elif self.peek() == "{":
            options = self.options()
        return Element(name.group(), start, self.text[start:self.pos].strip(), options, nested)

    def options(self) -> tuple[Option, ...]:
        opened = self.pos
        self.pos += 1
        found: list[Option] = []
        while True:
            self.skip_space()
            ch = self.peek()
            if not ch:
                raise self.error("unterminated '{': expected '}'", opened)
            if ch == "}":
                self.pos += 1
                return tuple(found)
            at = self.pos
            while self.pos < len(self.text) and self.text[self.pos] not in _KEY_END:
                self.pos += 1
            if self.pos == at:
                raise self.error(f"expected an option name, {self.found()}")
            key = self.text[at:self.pos]
            after_key = self.pos
            self.skip_space()
            if self.peek() != "=":
                self.pos = after_key
                found.append(Option(key, at, None, at, ()))
                continue
            self.pos += 1
            self.skip_space()
            value_at = self.pos
            value = self.value()
            if not value:
                raise self.error(f"expected a value after '{key}=', {self.found()}")
            found.append(Option(key, at, value, value_at, self.items(value, value_at)))

    def value(self) -> str:
        """The raw text of one value: up to a space or the options' closing `}`."""
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _SPACE + "}":
            self.pos = self.skip_group(self.pos)
        return self.text[start:self.pos]

    def skip_group(self, at: int) -> int:
        """The offset after the quoted string or `{...}` block at `at` (or after one char)."""
        ch = self.text[at]
        if ch in "\"'":
            end = self.text.find(ch, at + 1)
            if end < 0:
                raise self.error(f"unterminated '{ch}': expected a closing '{ch}'", at)
            return end + 1
        if ch == "{":
            pos = at + 1
            while pos < len(self.text) and self.text[pos] != "}":
                pos = self.skip_group(pos)
            if pos >= len(self.text):
                raise self.error("unterminated '{': expected '}'", at)
            return pos + 1
        return at + 1

    def items(self, value: str, at: int) -> tuple[Item, ...]:
        """`value` as a comma-separated list; a value that is one `{...}` is its inside."""
        if value.startswith("{") and self.skip_group(at) == at + len(value):
            value, at = value[1:-1], at + 1
        found: list[Item] = []
        start = pos = 0
        while pos <= len(value):
            if pos == len(value) or value[pos] == ",":
                found.append(self.item(value[start:pos], at + start))
                start = pos = pos + 1
                continue
            pos = self.skip_group(at + pos) - at
        return tuple(found)

    def item(self, text: str, at: int) -> Item:
        stripped = text.strip(_SPACE)
        at += len(text) - len(text.lstrip(_SPACE))
        if not stripped:
            raise self.error("empty list element", at)
        if len(stripped) >= 2 and stripped[0] in "\"'" and stripped[-1] == stripped[0] and \
                self.skip_group(at) == at + len(stripped):
            return Item(stripped[1:-1], at + 1)
        return Item(stripped, at)
