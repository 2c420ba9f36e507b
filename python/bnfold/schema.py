"""The options schema's parts: how an option is declared, checked and spelled.

Every option is an `Option(name, default, Meta(...))`; a boolean one, off by default and
spelled from its name, is `switch(name, help)`. The core's own options
(`CORE`: disable, skip_functions, statistics) are declared here; a pattern's
options are declared with it, in its registry entry (`Entry.options`), and
`build` makes `FoldOptions`, a frozen dataclass with one field per option (its
`Meta` in the field's metadata), from a registry:

    Entry("equalize", ..., opt_in="equalize", options=(
        switch("equalize", "after folding, equalize ..."),))  # --equalize, equalize

`bnfold.options` turns the fields into `bnfold-opt` flags; `PassSpec` into the
options of bnfold's passes. Validation runs once, in `FoldOptions.__post_init__`,
and raises an `OptionError` naming the option the user gave, in the spelling they
gave it ("--absorb-high-bias needs --equalize").
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from bnfold.errors import BnfoldError


class Kind(enum.Enum):
    FLAG = "flag"  # a boolean switch
    NAMES = "names"  # a set of names: comma-separated, or repeated on the command line
    CHOICE = "choice"  # one of `choices`


class Meta(NamedTuple):
    """How one option is spelled and checked."""

    help: str
    kind: Kind = Kind.FLAG
    flag: str | None = None  # bnfold-opt's flag; None: no flag (set from other flags or Python)
    pass_option: str | None = None  # the option of bnfold's passes; None: not a pass option
    metavar: str | None = None
    repeat: bool = False  # a NAMES flag given once per name (`--skip-func a --skip-func b`)
    choices: tuple[str, ...] = ()
    requires: str | None = None  # another field that must be set for this one to mean anything
    # Set, it makes folds record their batch norms' statistics (what it builds on them).
    uses_statistics: bool = False


class Option(NamedTuple):
    """One option: its Python name (a `FoldOptions` field), default and spelling."""

    name: str
    default: Any
    meta: Meta


def switch(name: str, help: str, **meta: Any) -> Option:
    """A boolean option, off by default, spelled from its name everywhere:
    `fold_into_narrow_kernels` is `--fold-into-narrow-kernels` and the pass option
    `fold-into-narrow-kernels`."""
    dashed = name.replace("_", "-")
    return Option(name, False, Meta(help, flag=f"--{dashed}", pass_option=dashed, **meta))


CORE_HEAD = (
    Option("disable", frozenset(), Meta(
        "comma-separated pattern names not to run (see below)",
        kind=Kind.NAMES, flag="--disable", pass_option="disable", metavar="NAMES")),
    Option("skip_functions", frozenset(), Meta(
        "leave function NAME alone: not folded, not inlined into its callers, not removed "
        "(repeatable)",
        kind=Kind.NAMES, flag="--skip-func", pass_option="skip-func", metavar="NAME",
        repeat=True)),
)
CORE_TAIL = (
    Option("statistics", True, Meta(
        "recover each decomposed batch norm's statistics into the report's params")),
)


class OptionsBase:
    """What every `FoldOptions` class has (`build` adds one field per option).

    disable: pattern names not to run (see `pattern_names()`); a single name
        or a comma-separated string is accepted too.
    skip_functions: functions left alone: not folded, not inlined into their
        callers, not removed; named as they are (`<lambda>`) or as MLIR prints
        them (`@"<lambda>"`). A name that is no function of the module is an
        error that lists its functions.
    statistics: recover each decomposed batch norm's gamma, beta, mean,
        variance and epsilon from its constants into `Fold.params` (the
        report's `.npz`). On by default; `bnfold-opt` turns it off unless
        `--report-params` asks for them (1 in 10 of a small-layer fold's time).
        What relies on them (an option whose `Meta.uses_statistics`) recovers
        them whatever this says (`needs_statistics`).

    Every other option is declared by the pattern it belongs to (its registry entry's
    `options`); each field's `Meta` says how it is spelled on the command line and in a
    pass pipeline.
    """

    PATTERN_NAMES: ClassVar[tuple[str, ...]] = ()

    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # `build` makes a dataclass
        disable: frozenset[str]
        skip_functions: frozenset[str]
        statistics: bool

        def __init__(self, **options: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        for f in fields(self):
            if meta(f).kind is Kind.NAMES:
                object.__setattr__(self, f.name, names(getattr(self, f.name)))
        object.__setattr__(self, "skip_functions", frozenset(map(symbol, self.skip_functions)))
        _validate(self)

    @functools.cached_property  # asked once per fold; the options never change
    def needs_statistics(self) -> bool:
        """Whether folds record their batch norms' statistics: for the report's params, and
        for what an option builds on them (`Meta.uses_statistics`: the range check of
        equalization, high-bias absorption, bias correction)."""
        return self.statistics or any(
            meta(f).uses_statistics and bool(getattr(self, f.name))
            for f in fields(self))

    def enabled(self, name: str, opt_in: str | None = None) -> bool:
        """Whether pattern `name` runs: not disabled, and its opt-in option (if any) set."""
        return name not in self.disable and (opt_in is None or bool(getattr(self, opt_in)))


class _Declares:
    """What `build` reads of a registry entry (bnfold.patterns.Entry)."""

    name: str
    options: tuple[Option, ...]


def build(entries: Iterable[_Declares]) -> type[OptionsBase]:
    """The `FoldOptions` dataclass of a registry: the core's options and each entry's."""
    entries = list(entries)
    declared = [*CORE_HEAD, *(o for e in entries for o in e.options), *CORE_TAIL]
    seen: set[str] = set()
    for option in declared:
        if option.name in seen:
            raise ValueError(f"option {option.name} is declared twice")
        seen.add(option.name)
    specs = [(o.name, Any, _field(o)) for o in declared]
    cls: type[OptionsBase] = make_dataclass("FoldOptions", specs, bases=(OptionsBase,), frozen=True,
                         kw_only=True, namespace={"__doc__": OptionsBase.__doc__})
    # Pickle finds the class by module and name. Set after creation: Python 3.12's
    # make_dataclass overwrites a `__module__` passed in its namespace with its caller's.
    cls.__module__ = "bnfold.options"
    cls.PATTERN_NAMES = tuple(e.name for e in entries)
    return cls


def _field(option: Option) -> Any:
    default = option.default
    if isinstance(default, frozenset):
        return field(default_factory=lambda: default, metadata={"bnfold": option.meta})
    return field(default=default, metadata={"bnfold": option.meta})


def meta(f: Field[Any]) -> Meta:
    found: Meta = f.metadata["bnfold"]
    return found


def table(cls: type[OptionsBase]) -> dict[str, Field[Any]]:
    """The fields of an options class, by name, in the schema's order."""
    return {f.name: f for f in fields(cls)}


def names(value: str | Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        value = value.split(",")
    return frozenset(n.strip() for n in value if n.strip())


def symbol(name: str) -> str:
    """A function's name as MLIR prints it (`@main`, `"<lambda>"`, `@"<lambda>"`) or as
    it is (`main`, `<lambda>`) -> the name itself."""
    name = name.strip()
    if name.startswith("@"):
        name = name[1:]
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = re.sub(r'\\([0-9A-Fa-f]{2}|["\\])',
                      lambda m: m.group(1) if len(m.group(1)) == 1 else chr(int(m.group(1), 16)),
                      name[1:-1])
    return name


# --- validation -------------------------------------------------------------------

Spelling = Callable[[str], str]  # a field's name -> how the user wrote it


class Ref(NamedTuple):
    """Another option, named in an `OptionError`'s message as the user spells it."""

    field: str


Message = str | Sequence[str | Ref]


class OptionError(BnfoldError):
    """A bad value of option `field`. The message is literal text and `Ref`s to other
    options; both the refs and `field` are spelled as the user wrote them (`spelled`).
    Nothing is formatted over the text: a value the user typed (`--disable 'a}'`) is
    quoted as it is."""

    def __init__(self, message: Message, spelling: Spelling = lambda name: name, *,
                 field: str | None = None) -> None:
        self.parts: tuple[str | Ref, ...] = (message,) if isinstance(message, str) \
            else tuple(message)
        self.field = field
        super().__init__("".join(p if isinstance(p, str) else spelling(p.field)
                                 for p in self.parts),
                         location=spelling(field) if field is not None else None)

    def spelled(self, spelling: Spelling) -> OptionError:
        return OptionError(self.parts, spelling, field=self.field)


def _validate(options: OptionsBase) -> None:
    known = options.PATTERN_NAMES
    unknown = sorted(set(options.disable) - set(known))
    if unknown:
        raise OptionError("unknown pattern name(s) " + ", ".join(unknown)
                          + "; known: " + ", ".join(known), field="disable")
    by_name = table(type(options))
    for name, f in by_name.items():
        m = meta(f)
        value = getattr(options, name)
        if m.kind is Kind.CHOICE and value is not None and value not in m.choices:
            raise OptionError(f"'{value}' is not one of " + ", ".join(m.choices), field=name)
        if m.requires and value != f.default and value and not getattr(options, m.requires):
            raise OptionError(["it needs ", Ref(m.requires), " too (it works on its result)"],
                              field=name)


# --- pass pipelines -----------------------------------------------------------------


@dataclass(frozen=True)
class PassSpec:
    """A bnfold pass: its pipeline name, description and the options it fixes, over the
    options class `schema` (a registry's `FoldOptions`)."""

    name: str
    description: str
    schema: type[OptionsBase] = field(repr=False, compare=False)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] | None = None  # the fields it takes as options (None: all not fixed)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # its own defaults (options win)

    def _meta(self, name: str) -> Meta:
        return meta(table(self.schema)[name])

    def _takes(self, name: str) -> bool:
        return self._meta(name).pass_option is not None and name not in self.fixed and \
            (self.only is None or name in self.only)

    def option_names(self) -> list[str]:
        """The pass options it accepts."""
        return [self._meta(n).pass_option for n in table(self.schema)  # type: ignore[misc]
                if self._takes(n)]

    def spelling(self, name: str) -> str:
        option = self._meta(name).pass_option
        return f"{self.name}{{{option}}}" if option is not None else f"{self.name}"

    def options(self, given: Mapping[str, str | Sequence[str] | None]) -> Any:
        """FoldOptions from `{option: value}` as written in the pipeline: a string, a list
        (`disable=a,b`, parsed by `bnfold.pass_syntax`) or None (the option without a value:
        `{equalize}`); raises OptionError."""
        by_option = {self._meta(n).pass_option: n for n in table(self.schema) if self._takes(n)}
        unknown = sorted(set(given) - set(by_option))
        if unknown:
            raise OptionError(f"{self.name} has no option {', '.join(unknown)}; its options: "
                              f"{', '.join(sorted(o for o in by_option if o))}")
        values: dict[str, Any] = {**self.defaults, **self.fixed}
        for option, value in given.items():
            name = by_option[option]
            values[name] = _parse(name, self._meta(name), value, self)
        try:
            return self.schema(**values)
        except OptionError as e:
            raise e.spelled(self.spelling) from None


def _parse(name: str, meta: Meta, value: str | Sequence[str] | None, spec: PassSpec) -> Any:
    option = meta.pass_option
    if meta.kind is Kind.NAMES:
        if value is None:
            raise OptionError(f"it needs a value: {option}=NAME or {option}=NAME,NAME",
                              spec.spelling, field=name)
        return value  # split by FoldOptions
    if value is not None and not isinstance(value, str):
        if len(value) != 1:
            raise OptionError(f"it takes one value, not the list {','.join(value)}",
                              spec.spelling, field=name)
        value = value[0]
    if meta.kind is Kind.FLAG:
        if value is None:  # `{equalize}`: MLIR's spelling of true
            return True
        flag = value.lower()
        if flag not in ("true", "false", "1", "0"):
            raise OptionError(f"'{value}' is not true or false", spec.spelling, field=name)
        return flag in ("true", "1")
    if value is None:
        example = "int8" if "int8" in meta.choices else meta.choices[0]
        raise OptionError(f"it needs a value: {option}={example} (one of "
                          f"{', '.join(meta.choices)})", spec.spelling, field=name)
    return value  # CHOICE is checked by its validation
