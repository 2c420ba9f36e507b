"""What folded into what, what did not and why; with the original statistics.

    {"folds": [{"id": "fold0", "producer": "model.mlir:12:10",
                "producer_op": "stablehlo.convolution", "norm": "model.mlir:14:10",
                "norm_op": "stablehlo.batch_norm_inference", "form": "batch_norm_inference",
                "direction": "backward", "channels": 16, "ops": [...]}],
     "skipped": [{"op": "model.mlir:30:10", "op_name": "stablehlo.batch_norm_inference",
                  "reason": "batch_norm_inference mean is not constant"}]}

`Fold.params` holds the per-fold numpy arrays (the composed `scale` and
`shift`, and for `batch_norm_inference` the original `gamma`, `beta`, `mean`,
`variance` and `epsilon`); `Report.save_params` writes them as `.npz` with
keys `<fold id>/<name>`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_UIDS = itertools.count()  # every Fold of the process gets its own (ids are renumbered by merge)


@dataclass
class Fold:
    """One folded normalization: where it went and what it did."""

    id: str
    producer: str
    producer_op: str
    norm: str
    norm_op: str
    form: str  # "batch_norm_inference" or "decomposed"
    direction: str  # "backward" (into the producer before) or "forward"
    channels: int
    ops: list[str]
    function: str
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    # max |K.new - K*s| / |K*s| of the folded kernel against float64 (precision contract)
    kernel_rounding: float = 0.0
    # "normalization" (a batch norm, however spelled: a scale and a shift), or
    # "affine" (another per-channel step, e.g. a mean-pool's divide folded forward)
    kind: str = "normalization"
    note: str = ""  # what stayed of the normalization, if anything (and why)
    # A fold into a weight also read elsewhere (an embedding table tied to the LM head):
    # the new kernel is a copy, and the module grows by `copied_bytes`; who else reads it.
    copied_bytes: int = 0
    shared_with: list[str] = field(default_factory=list)
    # Model Explorer nodes (graph, node id) of the folded ops in the input, when
    # recorded (see `bnfold.overlay`).
    nodes: list[tuple[str, str]] = field(default_factory=list, repr=False, compare=False)
    uid: int = field(default_factory=lambda: next(_UIDS), repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "producer": self.producer, "producer_op": self.producer_op,
            "norm": self.norm, "norm_op": self.norm_op, "form": self.form,
            "direction": self.direction, "channels": self.channels, "ops": self.ops,
            "function": self.function, "kernel_rounding": self.kernel_rounding,
            "kind": self.kind,
        } | ({"note": self.note} if self.note else {}) | (
            {"shared_weight": {"copied_bytes": self.copied_bytes, "also_read_by": self.shared_with}}
            if self.copied_bytes else {}) | {"block": self.block}

    @property
    def block(self) -> str:
        """The block of the model its normalization (or scale) is in (`block_of`)."""
        return block_of(self.norm, self.function)


@dataclass
class Skip:
    """A normalization (or equalization pair) left in place, and why.

    `code` is the kind of obstacle (`bnfold.refusal.Code` values, e.g.
    "parameter-argument", "users", "precision"): programs branch on it,
    people read `reason`."""

    op: str
    op_name: str
    reason: str
    function: str
    nodes: list[tuple[str, str]] = field(default_factory=list, repr=False, compare=False)
    code: str = ""
    # A set of layers refused as a whole (an equalization set): their locations, in
    # data-flow order; empty otherwise.
    layers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "op_name": self.op_name, "reason": self.reason,
                "function": self.function, "code": self.code} | \
            ({"layers": self.layers} if self.layers else {}) | {"block": self.block}

    @property
    def block(self) -> str:
        """The block of the model the refused op is in (`block_of`)."""
        return block_of(self.op, self.function)


# Patterns as strings: `re` compiles each on first use (and caches it), not at import.
# A transform in a name path (`jit(f)`, `vmap()`, `pjit(<lambda>)`), not a module.
_TRANSFORM_RE = r"^[\w.<>-]*\(.*\)$"
# A module list's index (`layers.0`, `h/3`) or an indexed block (`BasicBlock_0`, `block_2`,
# `layers_1`; `block_1_expand_BN`: Keras' flat names, the block is `block_1`).
_INDEX_RE = r"^\d+$"
_BLOCK_RE = r"(?i)^(?:\w*(?:block|layer|stage)s?|h)[_-]?\d+(?=$|_)"
_FILE_LOCATION_RE = r":\d+:\d+$"


def block_of(location: str, function: str) -> str:
    """The block an op belongs to, from its location's name path (jax.export's
    `jit(f)/layers.0/attn/mul`, Flax's `ResNet/BasicBlock_0/BatchNorm_0/sub`, a torch
    module path `model.layers.0.self_attn`): the path up to the first module-list index
    (`layers.0`), else up to the last indexed block (`ResNet/BasicBlock_0`); transforms
    (`jit(f)`, `vmap()`) left out. Without either (a file location, a bare name), the
    function's name."""
    if not location or re.search(_FILE_LOCATION_RE, location):
        return function
    tokens: list[tuple[str, str]] = []  # (separator before, segment)
    for i, component in enumerate(_split_top_level(location, "/")):
        if re.match(_TRANSFORM_RE, component):
            continue
        pieces = component.split(".") if "(" not in component else [component]
        for j, piece in enumerate(pieces):
            tokens.append(("." if j else "/" if i and tokens else "", piece))
    names = [t for _, t in tokens]
    cut = next((i for i, t in enumerate(names) if i and re.match(_INDEX_RE, t)), None)
    if cut is None:
        blocks = [i for i, t in enumerate(names[:-1]) if re.match(_BLOCK_RE, t)]
        if not blocks:
            return function
        cut = blocks[-1]
        last = re.match(_BLOCK_RE, names[cut])
        assert last is not None
        tokens[cut] = (tokens[cut][0], last.group(0))
    return "".join(sep + t for sep, t in tokens[:cut + 1]).lstrip("/.") or function


def _split_top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside parentheses (`vmap(eqx.nn.Linear)/dot`)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


_PATH_PART_RE = r"\['((?:[^'\\]|\\.)*)'\]|\[(-?\d+)\]|\.([A-Za-z_]\w*)"  # compiled on first use


def parameter_path(name: str) -> str:
    """A pytree key path as a '/'-separated name, as AIMET encodings and Flax write them:
    `params['Conv_0']['kernel']` -> `params/Conv_0/kernel`; `[0].weight` -> `0/weight`;
    any other name as it is."""
    head = re.match(r"[A-Za-z_]\w*", name)
    parts = [head.group(0)] if head else []
    position = head.end() if head else 0
    for match in re.compile(_PATH_PART_RE).finditer(name, position):
        if match.start() != position:
            return name
        parts.append(next(g for g in match.groups() if g is not None))
        position = match.end()
    return "/".join(parts) if position == len(name) and parts else name


UNTRAINED = "untrained-statistics"

# What equalization, high-bias absorption and bias correction take from the batch norms.
STATISTICS_NOTE = ("equalization ranges, high-bias absorption and bias correction take the "
                   "activations' mean and spread from the folded batch norms' statistics: "
                   "statistics that do not describe the data (never trained or calibrated) "
                   "can make the quantized model worse than without them")


def untrained(fold: Fold) -> dict[str, Any] | None:
    """A warning when `fold`'s batch-norm statistics are exactly their initial values (mean 0
    and variance 1 in every channel; with gamma 1 and beta 0 too, a layer never trained):
    they describe no data, and what is built on them (equalization ranges, high-bias
    absorption, bias correction) is then wrong. None otherwise, or without statistics."""
    params = fold.params
    if fold.kind != "normalization" or not {"mean", "variance"} <= params.keys():
        return None
    if not (np.all(params["mean"] == 0) and np.all(params["variance"] == 1)):
        return None
    # gamma and beta of a decomposed chain are recovered in float64 from f32 constants:
    # within a few units of f32 roundoff of 1 and 0.
    fresh = "gamma" in params and "beta" in params and \
        bool(np.all(np.abs(params["gamma"] - 1) <= 1e-6) and np.all(np.abs(params["beta"]) <= 1e-6))
    what = ("mean 0, variance 1, gamma 1, beta 0 in every channel: a layer never trained"
            if fresh else "running mean 0 and variance 1 in every channel: never updated from "
                          "data")
    return {"code": UNTRAINED, "fold": fold.id, "norm": fold.norm, "message":
            f"the batch norm's statistics are their initial values ({what}); they do not "
            f"describe the activations, so --equalize, --absorb-high-bias and "
            f"--bias-correction, which rely on them, can make a quantized model worse: "
            f"export after training or calibration"}


def missed(title: str, column: str, skips: list[Skip]) -> list[str]:
    """A numbered table of what a pattern left alone (op, or a refused set's layers), and why."""
    if not skips:
        return []
    rows = [(title, column, "op name", "code", "reason")]
    rows += [(str(i), " -> ".join(s.layers) or s.op, s.op_name, s.code, s.reason)
             for i, s in enumerate(skips, 1)]
    return ["", *columns(rows)]


class Section:
    """How one pattern reports what it did, beyond the folds and skips every report has:
    its records (`Part.records`, e.g. equalized sets, quantized weights, inlined callees),
    its refusals (`Part.refused`, `Skip`s) and how they render. A pattern module that
    records its own decisions declares `RECORDS = MySection()` and its registry entry says
    when its section is in the report (`Entry.reports`). Nothing here names a pattern.

    `order` places the section among the others (JSON keys, tables, summary parts);
    a section that is `always` reported (its JSON keys even when its pattern did not
    run) comes before the report's warnings, the others after them. `statistics`: what
    the pattern built relies on the folded batch norms' statistics (the report then
    carries `STATISTICS_NOTE` and says how many of them look untrained). `prefix`: the
    records' ids (`eq0`, `q3`), renumbered when reports merge; "" for records without ids.
    """

    order: int = 100
    always: bool = False
    statistics: bool = False
    prefix: str = ""
    # (records, refusals, ran): the names under which a section of records and refusals
    # answers `Report` attributes and JSON keys (`"equalized", "not_equalized",
    # "equalize"`), for the common case; None: the section says itself.
    keys: tuple[str, str, str] | None = None
    # with `keys`, the text table: its header (one `row` per record), and the column
    # that names what each refusal left alone ("layers", a refused set's)
    header: tuple[str, ...] = ()
    refused_column: str = "op"

    def attributes(self, part: Part) -> dict[str, Any]:
        """`Report` attributes this section answers (`report.equalized`, ...)."""
        if self.keys is None:
            return {}
        records, refused, ran = self.keys
        return {records: part.records, refused: part.refused, ran: part.ran}

    def to_json(self, part: Part) -> dict[str, Any]:
        if self.keys is None:
            return {}
        records, refused, _ = self.keys
        return {records: [r.to_json() for r in part.records],
                refused: [s.to_json() for s in part.refused]}

    def table(self, part: Part) -> list[str]:
        """The text report's lines of this section (none: no table). With `keys` and a
        `header`: the records' table and its `notes` (or `nothing equalized`), then the
        numbered refusals (`not equalized`)."""
        if self.keys is None or not self.header:
            return []
        records, refused, _ = self.keys
        lines = columns([self.header, *map(self.row, part.records)]) + self.notes(part) \
            if part.records else [f"nothing {records}"]
        return lines + missed(refused.replace("_", " "), self.refused_column, part.refused)

    def row(self, record: Any) -> tuple[str, ...]:
        """A record's row of the text table, under `header`."""
        raise NotImplementedError

    def notes(self, part: Part) -> list[str]:
        """Lines after the records' table."""
        return []

    def summary(self, part: Part) -> str:
        """This section's part of the one-line summary (`, inlined 2 call(s)`), or ""."""
        return ""

    def params(self, part: Part) -> dict[str, np.ndarray]:
        """`{"<record id>/<name>": array}` of every record that has `params`."""
        return {f"{r.id}/{k}": v for r in part.records for k, v in getattr(r, "params", {}).items()}

    def name_parameters(self, part: Part, names: dict[str, str]) -> None:
        """Names records by the bound parameters they came from (raw location -> name)."""

    def encodings(self, part: Part) -> dict[str, Any] | None:
        """An encodings file of this section's records, if it has one (`--quant-encodings`)."""
        return None


@dataclass
class Part:
    """One section's records in one report."""

    name: str  # the pattern's name
    section: Section
    records: list[Any] = field(default_factory=list)
    refused: list[Skip] = field(default_factory=list)
    ran: bool = False  # the pattern ran (a section that is not `always` is shown only then)

    @property
    def shown(self) -> bool:
        return self.ran or self.section.always

    def merge(self, other: Part) -> None:
        prefix = self.section.prefix
        if prefix:
            for record in other.records:
                record.id = f"{prefix}{len(self.records) + int(record.id[len(prefix):])}"
        self.records.extend(other.records)
        self.refused.extend(other.refused)
        self.ran = self.ran or other.ran


def _sections(always_only: bool) -> list[Part]:
    """Empty parts of the registry's reporting patterns (every one, or the `always` ones)."""
    from bnfold.patterns import REGISTRY  # the registry imports no pattern module

    return [Part(e.name, e.section()) for e in REGISTRY
            if e.reports == "always" or (e.reports and not always_only)]


@dataclass
class Report:
    """What one run of the pass did.

    folds    every fold (`Fold`: producer and norm locations, form, direction,
             channels, kernel rounding, kind, and in `params` the composed
             scale/shift and the original statistics);
    skipped  every normalization that did not fold (`Skip`), one per op,
             with a reason that says what to do;
    parts    what each other pattern recorded (`Part`, rendered by the `Section` the
             pattern declares), e.g. with --equalize `report.equalized` (each set of
             layers equalized) and `report.not_equalized`; with --quantize-weights
             `report.quantized` and `report.not_quantized`; `report.expanded`
             (batch_norm_inference ops rewritten by --expand-batch-norm) and
             `report.inlined` (private callees inlined, once per call site).

    `summary()` is the CLI's one-line summary, `dumps()` the JSON report,
    `table()` the text one, `save_params()` the statistics as .npz.
    """

    folds: list[Fold] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)

    def __post_init__(self) -> None:
        have = {p.name for p in self.parts}
        self.parts += [p for p in _sections(always_only=True) if p.name not in have]
        self._sort()

    def _sort(self) -> None:
        self.parts.sort(key=lambda p: p.section.order)

    def __getattr__(self, name: str) -> Any:
        """An attribute of a pattern's section (`report.equalized`); an empty one where the
        pattern did not run."""
        if name.startswith("_") or name in ("folds", "skipped", "parts"):
            raise AttributeError(name)
        for part in self._all_parts():
            found = part.section.attributes(part)
            if name in found:
                return found[name]
        raise AttributeError(f"'Report' object has no attribute '{name}'")

    def part(self, name: str) -> Part | None:
        return next((p for p in self.parts if p.name == name), None)

    def _all_parts(self) -> list[Part]:
        """Its parts, and an empty one for every other reporting pattern of the registry."""
        have = {p.name for p in self.parts}
        return self.parts + [p for p in _sections(always_only=False) if p.name not in have]

    def _shown(self) -> list[Part]:
        return [p for p in self.parts if p.shown]

    def _relies_on_statistics(self) -> bool:
        return any(p.ran and p.section.statistics for p in self.parts)

    def merge(self, other: Report) -> None:
        offset = len(self.folds)
        for fold in other.folds:
            fold.id = f"fold{offset + int(fold.id[4:])}"
        self.folds.extend(other.folds)
        self.skipped.extend(other.skipped)
        for part in other.parts:
            mine = self.part(part.name)
            if mine is None:
                self.parts.append(Part(part.name, part.section))
                mine = self.parts[-1]
            mine.merge(part)
        self._sort()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"folds": [f.to_json() for f in self.folds],
                                "skipped": [s.to_json() for s in self.skipped]}
        shown = self._shown()
        for part in shown:
            if part.section.always:
                data |= part.section.to_json(part)
        data["warnings"] = self.warnings()
        for part in shown:
            if not part.section.always:
                data |= part.section.to_json(part)
        if self._relies_on_statistics():
            data["statistics_note"] = STATISTICS_NOTE
        return data

    def warnings(self) -> list[dict[str, Any]]:
        """`{"code", "fold", "norm", "message"}` per fold whose batch-norm statistics are
        exactly their initial values (`untrained`), when the statistics were recovered
        (batch_norm_inference always; a decomposed chain with `FoldOptions.statistics`,
        --report or --report-params, or what needs them: --equalize, --bias-correction)."""
        return [w for w in map(untrained, self.folds) if w is not None]

    def encodings(self) -> dict[str, Any]:
        """The encodings file of the section that has one (`--quant-encodings`: the
        quantized weights, AIMET-style; see that section's `encodings`)."""
        for part in self._all_parts():
            found = part.section.encodings(part)
            if found is not None:
                return found
        return {}

    def name_parameters(self, names: dict[str, str]) -> None:
        """Names each record read from a bound parameter's constant (a quantized weight):
        `names` maps the raw location of each bound argument to the parameter's name."""
        for part in self.parts:
            part.section.name_parameters(part, names)

    def dumps(self) -> str:
        import json  # only when a report is written (start-up time)

        return json.dumps(self.to_json(), indent=2) + "\n"

    def table(self) -> str:
        """A human-readable table: each fold (and what stayed of it), then each skipped op
        with its reason, then each pattern's own section.

            fold   direction  producer          norm              channels  rounding  kind
            fold0  backward   model.mlir:12:10  model.mlir:14:10  16        5.9e-08   normalization
            ...

            fold   what stayed of it, and why
            fold3  shift folded exactly through zero padding: a border correction built ...

            skipped  op                 op name                         code    reason
            1        model.mlir:30:10   stablehlo.batch_norm_inference  ...     the mean is ...

        and, where the module has more than one block, every decision by block (`_blocks`).
        """
        rows = [("fold", "direction", "producer", "norm", "channels", "rounding", "kind")]
        rows += [(f.id, f.direction, f.producer, f.norm, str(f.channels),
                  f"{f.kernel_rounding:.1e}", f.kind) for f in self.folds]
        lines = columns(rows) if self.folds else ["no folds"]
        notes = [(f.id, f.note) for f in self.folds if f.note]
        if notes:
            lines += [""] + columns([("fold", "what stayed of it, and why")] + notes)
        warnings = [(w["fold"], w["code"], w["message"]) for w in self.warnings()]
        if warnings:
            lines += [""] + columns([("warning", "code", "message")] + warnings)
        lines.append("")
        if self.skipped:
            skips = [("skipped", "op", "op name", "code", "reason")]
            skips += [(str(i), s.op, s.op_name, s.code, s.reason)
                      for i, s in enumerate(self.skipped, 1)]
            lines += columns(skips)
        else:
            lines.append("nothing skipped")
        lines += self._blocks()
        for part in self._shown():
            table = part.section.table(part)
            if table:
                lines += ["", *table]
        if self._relies_on_statistics():
            lines += ["", f"note: {STATISTICS_NOTE}"]
        lines += ["", self.summary()]
        return "\n".join(lines) + "\n"

    def _blocks(self) -> list[str]:
        """Every decision (a fold, or a skipped op by its number in the skipped table) grouped
        by the block it is in (`block_of`), where the module has more than one block:

            block                decision   kind           into / code
            model.layers.0       fold0      normalization  jit(f)/model.layers.0/q/dot_general
                                 fold1      scale          jit(f)/model.layers.0/q/dot_general
                                 skipped 2  add            nonlinear-consumer
        """
        rows: dict[str, list[tuple[str, str, str]]] = {}
        for f in self.folds:
            rows.setdefault(f.block, []).append((f.id, f.kind, f.producer))
        for i, s in enumerate(self.skipped, 1):
            rows.setdefault(s.block, []).append((f"skipped {i}", _short(s.op_name), s.code))
        if len(rows) < 2:
            return []
        table = [("block", "decision", "kind", "into / code")]
        for block, decisions in rows.items():
            table += [(block if i == 0 else "", *d) for i, d in enumerate(decisions)]
        return ["", *columns(table)]

    def params(self) -> dict[str, np.ndarray]:
        """Flat `{"fold0/gamma": array, ..., "eq0/scale0": array, "q0/scale": array}` for
        every fold and every record of the patterns' sections."""
        found = {f"{fold.id}/{k}": v for fold in self.folds for k, v in fold.params.items()}
        for part in self.parts:
            found |= part.section.params(part)
        return found

    def params_npz(self) -> bytes:
        import io
        buf = io.BytesIO()
        arrays: dict[str, Any] = dict(self.params())  # numpy's stub types **kwds as bool
        np.savez(buf, **arrays)
        return buf.getvalue()

    def save_params(self, path: str) -> None:
        from bnfold.outputs import write_file
        write_file(path, self.params_npz(), "--report-params")

    def summary(self) -> str:
        """One line: `folded 53 normalization(s) (...) (+1 other affine: ...), skipped 0`."""
        norms = [f for f in self.folds if f.kind == "normalization"]
        others = [f for f in self.folds if f.kind != "normalization"]
        text = f"folded {len(norms)} normalization(s)"
        if norms:
            text += f" ({count(f'{f.direction} {f.form}' for f in norms)})"
        if others:
            steps = count(f"{_short(f.norm_op)} folded {f.direction}" for f in others)
            text += f" (+{len(others)} other affine: {steps})"
        text += f", skipped {len(self.skipped)}"
        copies = [f for f in self.folds if f.copied_bytes]
        if copies:
            grown = _bytes(sum(f.copied_bytes for f in copies))
            text += (f", copied {len(copies)} shared weight(s) (+{grown}: "
                     f"{', '.join(f.id for f in copies)}; a tied weight stays for its other "
                     f"readers)")
        for part in self._shown():
            text += part.section.summary(part)
        if self._relies_on_statistics():
            warned = self.warnings()
            if warned:
                text += (f"; {len(warned)} batch norm(s) with untrained statistics, which "
                         f"these results rely on (see the report's warnings)")
        text += _bind_hint(self)
        return text


_PARAMETER, _KERNEL = "parameter-argument", "kernel-argument"


def _bind_hint(report: Report) -> str:
    """When nothing folded because parameters are arguments: say which, and how to bind."""
    codes = {s.code for s in report.skipped}
    if report.folds or not report.skipped or not codes <= {_PARAMETER, _KERNEL}:
        return ""
    what = {frozenset({_PARAMETER}): "every normalization's parameters are function arguments",
            frozenset({_KERNEL}): "every normalized producer's kernel is a function argument",
            }.get(frozenset(codes), "the normalizations' parameters or their producers' "
                                    "kernels are function arguments")
    return (f"; {what}: bind them with --bind-params FILE.npz "
            "(or bnfold.jax_export.fold_exported)")


def _bytes(n: int) -> str:
    """`98304 bytes` as `96 KiB` (exact bytes below 1 KiB)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _short(op_name: str) -> str:
    return op_name.removeprefix("stablehlo.")


def count(labels: Iterable[str]) -> str:
    """`2 backward decomposed, 1 forward decomposed` (sorted by label)."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))


def columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)] + [r[-1]])
            for r in rows]
