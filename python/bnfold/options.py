"""The one options schema: `FoldOptions` fields and their metadata.

Each field says how the user spells it on the command line (`flag`) and in a
pass pipeline (`pass_option`), so `bnfold-opt`'s flags, the options of every
bnfold pass and the Python keyword are generated from one place (as xDSL's
pass options are):

    FoldOptions(equalize=True, absorb_high_bias=True)                  # Python
    bnfold-opt model.mlir --equalize --absorb-high-bias                 # CLI
    --pass-pipeline='builtin.module(bnfold-equalize{absorb-high-bias=true})'

Validation runs once, in `FoldOptions.__post_init__`, and raises an
`OptionError` naming the option the user gave, in the spelling they gave it
(`from_cli` and `from_pass` re-spell it): "--absorb-high-bias needs
--equalize", never the name of another flag that happened to be set.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bnfold.errors import BnfoldError


class Kind(enum.Enum):
    FLAG = "flag"  # a boolean switch
    NAMES = "names"  # a set of names: comma-separated, or repeated on the command line
    CHOICE = "choice"  # one of `choices`


@dataclass(frozen=True)
class Meta:
    """How one option is spelled and checked."""

    help: str
    kind: Kind = Kind.FLAG
    flag: str | None = None  # bnfold-opt's flag; None: no flag (set from other flags or Python)
    pass_option: str | None = None  # the option of bnfold's passes; None: not a pass option
    metavar: str | None = None
    repeat: bool = False  # a NAMES flag given once per name (`--skip-func a --skip-func b`)
    choices: tuple[str, ...] = ()
    requires: str | None = None  # another field that must be set for this one to mean anything


def _option(default: Any, meta: Meta) -> Any:
    if isinstance(default, frozenset):
        return field(default_factory=lambda: default, metadata={"bnfold": meta})
    return field(default=default, metadata={"bnfold": meta})


@dataclass(frozen=True, kw_only=True)
class FoldOptions:
    """Options of the pass (every field is also a `bnfold-opt` flag or pass option).

    disable: pattern names not to run (see `pattern_names()`); a single name
        or a comma-separated string is accepted too.
    skip_functions: functions left alone: not folded, not inlined into their
        callers, not removed; named as they are (`<lambda>`) or as MLIR prints
        them (`@"<lambda>"`). A name that is no function of the module is an
        error that lists its functions.
    expand_batch_norm: rewrite every batch_norm_inference that did not fold
        into multiply + add (for back ends and the reference interpreter).
    pad_uniform_shift: fold a uniform shift (Keras Rescaling) through a
        convolution's zero padding by moving the padding into an explicit
        `stablehlo.pad` instead of adding the exact border correction. Off by
        default: XLA CPU runs that form up to 1.7x slower than the original
        stem, while the border correction runs as fast as the original.
    equalize: after folding, equalize the per-channel weight ranges of
        consecutive layers (cross-layer equalization, for per-tensor int8
        weights); the function is unchanged within the dtype's rounding.
    absorb_high_bias: with `equalize`, high-bias absorption: the part of a
        layer's bias that its ReLU/clamp almost surely passes (beta - 3*gamma,
        from the folded batch norm's statistics) moves into the next layer's
        bias. Exact for every input within 3 sigma; the report says how much.
    quantize_weights: "int4" .. "int16": after everything else, every
        constant convolution/dot_general weight becomes a signed integer
        constant with a symmetric scale, dequantized in the graph (QDQ).
    quantize_granularity: "per-tensor" (None, the default) or "per-channel".
    bias_correction: with `quantize_weights`, analytic bias correction: the
        expected output shift of each quantized layer, `(W_q - W) E[x]` with
        E[x] from the folded batch norms before it, leaves its bias.
    statistics: recover each decomposed batch norm's gamma, beta, mean,
        variance and epsilon from its constants into `Fold.params` (the
        report's `.npz`). On by default; `bnfold-opt` turns it off unless
        `--report-params` asks for them (1 in 10 of a small-layer fold's time).
        Equalization, high-bias absorption and bias correction recover them
        whatever this says (`needs_statistics`).
    """

    disable: Collection[str] = _option(frozenset(), Meta(
        "comma-separated pattern names not to run (see below)",
        kind=Kind.NAMES, flag="--disable", pass_option="disable", metavar="NAMES"))
    skip_functions: Collection[str] = _option(frozenset(), Meta(
        "leave function NAME alone: not folded, not inlined into its callers, not removed "
        "(repeatable)",
        kind=Kind.NAMES, flag="--skip-func", pass_option="skip-func", metavar="NAME", repeat=True))
    expand_batch_norm: bool = _option(False, Meta(
        "rewrite every batch_norm_inference that did not fold into multiply + add (for the "
        "reference interpreter and back ends without a batch-norm op)",
        flag="--expand-batch-norm", pass_option="expand-batch-norm"))
    pad_uniform_shift: bool = _option(False, Meta(
        "fold a uniform input shift (Keras Rescaling) through a convolution's zero padding "
        "with an explicit stablehlo.pad (default: an exact border correction added to the "
        "output, which XLA CPU runs faster)",
        flag="--pad-uniform-shift", pass_option="pad-uniform-shift"))
    equalize: bool = _option(False, Meta(
        "after folding, equalize the weight ranges of consecutive layers (cross-layer "
        "equalization, for per-tensor int8 weights; the function is unchanged; ReLU6 "
        "becomes a per-channel clamp)",
        flag="--equalize", pass_option="equalize"))
    absorb_high_bias: bool = _option(False, Meta(
        "with --equalize: move the part of layer 1's bias that the activation passes for "
        "every input within 3 sigma (beta - 3*gamma of its batch norm) into layer 2's bias",
        flag="--absorb-high-bias", pass_option="absorb-high-bias", requires="equalize"))
    quantize_weights: str | None = _option(None, Meta(
        "after folding (and --equalize), store every constant convolution/dot_general weight "
        "as BITS-bit signed integers with a symmetric scale, dequantized in the graph "
        "(convert + multiply) so any StableHLO consumer runs it",
        kind=Kind.CHOICE, flag="--quantize-weights", pass_option="quantize-weights",
        metavar="BITS", choices=tuple(f"int{b}" for b in range(4, 17))))
    quantize_granularity: str | None = _option(None, Meta(
        "one scale per weight tensor (per-tensor, the default: what equalization serves) "
        "or per output channel",
        kind=Kind.CHOICE, flag="--quantize-granularity", pass_option="quantize-granularity",
        metavar="G", choices=("per-tensor", "per-channel"), requires="quantize_weights"))
    bias_correction: bool = _option(False, Meta(
        "with --quantize-weights: remove the expected output shift (W_q - W) E[x] of each "
        "quantized layer from its bias, E[x] from the folded batch norms before it "
        "(analytic, no data)",
        flag="--bias-correction", pass_option="bias-correction", requires="quantize_weights"))
    statistics: bool = _option(True, Meta(
        "recover each decomposed batch norm's statistics into the report's params"))

    def __post_init__(self) -> None:
        for f in fields(self):
            if _meta(f.name).kind is Kind.NAMES:
                object.__setattr__(self, f.name, _names(getattr(self, f.name)))
        object.__setattr__(self, "skip_functions", frozenset(map(symbol, self.skip_functions)))
        _validate(self)

    @property
    def needs_statistics(self) -> bool:
        """Whether folds record their batch norms' statistics: for the report's params, the
        range check of equalization, high-bias absorption and bias correction."""
        return self.statistics or self.equalize or self.absorb_high_bias or self.bias_correction

    @property
    def bits(self) -> int | None:
        """The weight bits of `quantize_weights` ("int8" -> 8), or None."""
        return int(self.quantize_weights[3:]) if self.quantize_weights else None

    def enabled(self, name: str, opt_in: str | None = None) -> bool:
        """Whether pattern `name` runs: not disabled, and its opt-in option (if any) set."""
        return name not in self.disable and (opt_in is None or bool(getattr(self, opt_in)))


def _meta(name: str) -> Meta:
    return _FIELDS[name].metadata["bnfold"]


_FIELDS = {f.name: f for f in fields(FoldOptions)}


def _names(value: str | Iterable[str]) -> frozenset[str]:
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


@dataclass(frozen=True)
class Ref:
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


def _validate(options: FoldOptions) -> None:
    from bnfold.patterns import pattern_names  # the registry imports nothing heavy

    unknown = sorted(set(options.disable) - set(pattern_names()))
    if unknown:
        raise OptionError("unknown pattern name(s) " + ", ".join(unknown)
                          + "; known: " + ", ".join(pattern_names()), field="disable")
    for name in _FIELDS:
        meta = _meta(name)
        value = getattr(options, name)
        if meta.kind is Kind.CHOICE and value is not None and value not in meta.choices:
            raise OptionError(f"'{value}' is not one of " + ", ".join(meta.choices), field=name)
        if meta.requires and value != _FIELDS[name].default and value and \
                not getattr(options, meta.requires):
            raise OptionError(["it needs ", Ref(meta.requires), " too (it works on its result)"],
                              field=name)


# --- the command line -----------------------------------------------------------


def cli_spelling(name: str) -> str:
    flag = _meta(name).flag
    return flag if flag is not None else name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds a flag for every option that has one (in the schema's order)."""
    for name in _FIELDS:
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
    values = {name: getattr(args, name) for name in _FIELDS if _meta(name).flag is not None}
    try:
        return FoldOptions(**values, **derived)
    except OptionError as e:
        raise e.spelled(cli_spelling) from None


def given_on_cli(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Each option the command line set, as (field name, its pass-option spelling with the
    value: `equalize=true`, `disable=a,b`), in the schema's order."""
    given = []
    for name in _FIELDS:
        meta = _meta(name)
        value = getattr(args, name, None) if meta.flag is not None else None
        if not value:
            continue
        if meta.kind is Kind.FLAG:
            text = "true"
        elif meta.kind is Kind.NAMES:
            text = ",".join(sorted(_names(value)))
        else:
            text = str(value)
        given.append((name, f"{meta.pass_option}={text}"))
    return given


# --- pass pipelines -----------------------------------------------------------------


@dataclass(frozen=True)
class PassSpec:
    """A bnfold pass: its pipeline name, description and the options it fixes."""

    name: str
    description: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] | None = None  # the fields it takes as options (None: all not fixed)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # its own defaults (options win)

    def _takes(self, name: str) -> bool:
        return _meta(name).pass_option is not None and name not in self.fixed and \
            (self.only is None or name in self.only)

    def option_names(self) -> list[str]:
        """The pass options it accepts."""
        return [_meta(n).pass_option for n in _FIELDS if self._takes(n)]  # type: ignore[misc]

    def spelling(self, name: str) -> str:
        option = _meta(name).pass_option
        return f"{self.name}{{{option}}}" if option is not None else f"{self.name}"

    def options(self, given: Mapping[str, str | Sequence[str] | None]) -> FoldOptions:
        """FoldOptions from `{option: value}` as written in the pipeline: a string, a list
        (`disable=a,b`, parsed by `bnfold.pass_syntax`) or None (the option without a value:
        `{equalize}`); raises OptionError."""
        by_option = {_meta(n).pass_option: n for n in _FIELDS if self._takes(n)}
        unknown = sorted(set(given) - set(by_option))
        if unknown:
            raise OptionError(f"{self.name} has no option {', '.join(unknown)}; its options: "
                              f"{', '.join(sorted(o for o in by_option if o))}")
        values: dict[str, Any] = {**self.defaults, **self.fixed}
        for option, value in given.items():
            name = by_option[option]
            values[name] = _parse(name, value, self)
        try:
            return FoldOptions(**values)
        except OptionError as e:
            raise e.spelled(self.spelling) from None


def _parse(name: str, value: str | Sequence[str] | None, spec: PassSpec) -> Any:
    meta = _meta(name)
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

