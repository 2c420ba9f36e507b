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
from typing import Any, TypeVar

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
        } | ({"note": self.note} if self.note else {})


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
    # An equalization set refused as a whole: its layers' locations, in data-flow order
    # (every adjacent pair of them was not equalized); empty otherwise.
    layers: list[str] = field(default_factory=list)

    @property
    def pairs(self) -> int:
        """How many layer pairs this record leaves unequalized."""
        return max(1, len(self.layers) - 1)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "op_name": self.op_name, "reason": self.reason,
                "function": self.function, "code": self.code} | \
            ({"layers": self.layers} if self.layers else {})


@dataclass
class Equalized:
    """One set of layers equalized together (a pair, a triplet, a longer chain)."""

    id: str
    layers: list[str]  # producer locations, in data-flow order
    layer_ops: list[str]
    between: list[str]  # per link: the ops between the two layers ("add, clamp")
    function: str
    kind: str  # "pair", "triplet" or "chain of N"
    iterations: int
    triplets: int  # conv -> depthwise conv -> conv runs in the set (DFQ's triplets)
    # per layer: max/min over output channels of the channel's max |weight|
    range_ratio_before: list[float]
    range_ratio_after: list[float]
    # "scale0", "scale1", ...: per link, layer 1's output channel c divided by scale[c]
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    high_bias: list[dict[str, Any]] = field(default_factory=list)  # per link, --absorb-high-bias

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind, "layers": self.layers, "layer_ops": self.layer_ops,
            "between": self.between, "function": self.function, "iterations": self.iterations,
            "triplets": self.triplets,
            "range_ratio_before": self.range_ratio_before,
            "range_ratio_after": self.range_ratio_after,
            "scale_range": [[float(v.min()), float(v.max())] for v in self.params.values()],
        } | ({"high_bias": self.high_bias} if self.high_bias else {})


@dataclass
class Quantized:
    """One weight stored as integers (--quantize-weights), and its bias correction."""

    id: str
    producer: str
    producer_op: str
    function: str
    bits: int
    granularity: str  # "per-tensor" or "per-channel"
    storage: str  # the integer type of the stored constant: "i4", "i8" or "i16"
    axis: int  # the kernel axis of output channels (the per-channel scales' axis)
    weight_sqnr_db: float  # 10 log10(sum W^2 / sum (W_q - W)^2) against the float weight
    # {"applied": true, "channels": n, "max_shift": x, "mean_shift": y, "basis": "linear"
    # (E[x] is the batch norms' means through linear steps) or "normal" (an activation's
    # mean under the normal model of a batch norm's pre-activation)} or
    # {"applied": false, "code": ..., "reason": ...}; None without --bias-correction
    bias_correction: dict[str, Any] | None = None
    # "scale": one value per tensor or per output channel; "bias_shift": the expected
    # output shift taken out of the bias (per output channel)
    params: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    # the raw location of the constant the weight came from, and the name of the bound
    # parameter it is (`params/Conv_0/kernel`), when it came from one (--bind-params,
    # fold_exported's pytree; set by `Report.name_parameters`)
    weight_location: str = field(default="", repr=False)
    parameter: str | None = None
    # the module's weight is weight_type(scale_type(q) * scale), the product rounded once in
    # scale_type, then converted to weight_type where they differ
    scale_type: str = "f32"
    weight_type: str = "f32"
    # channels (per tensor: [0]) whose scale max|W| / qmax was below scale_type's smallest
    # normal number and is that number instead (fewer levels; no weight more than half off)
    raised_scales: list[int] = field(default_factory=list)

    @property
    def note(self) -> str:
        if not self.raised_scales:
            return ""
        which = "the tensor's scale" if self.granularity == "per-tensor" else \
            f"channel(s) {', '.join(map(str, self.raised_scales))}"
        return (f"{which}: max|W| / {2 ** (self.bits - 1) - 1} is below {self.scale_type}'s "
                "smallest normal number (flushed to zero by CPUs); the scale is that number "
                "instead, a coarser step with every weight within half of it")

    def to_json(self) -> dict[str, Any]:
        scale = self.params["scale"]
        return {
            "id": self.id, "producer": self.producer, "producer_op": self.producer_op,
            "function": self.function, "bits": self.bits, "granularity": self.granularity,
            "storage": self.storage, "axis": self.axis,
            "scale": float(scale) if scale.ndim == 0 else [float(v) for v in scale],
            "scale_type": self.scale_type, "weight_type": self.weight_type,
            "weight_sqnr_db": self.weight_sqnr_db,
        } | ({"parameter": self.parameter} if self.parameter else {}) | (
            {"raised_scales": self.raised_scales, "note": self.note} if self.raised_scales
            else {}) | ({"bias_correction": self.bias_correction}
                        if self.bias_correction is not None else {})

    def encoding(self) -> list[dict[str, Any]]:
        """AIMET's encoding entries, one per tensor or per output channel, in its strict
        symmetric form: offset -qmax, min = -qmax * scale, max = qmax * scale with qmax =
        2^(bits-1) - 1, exactly the range of the module's integers (AIMET's default signed
        grid reaches -2^(bits-1), a value bnfold never stores, and past the type's largest
        value for a weight at its maximum)."""
        qmax = 2 ** (self.bits - 1) - 1
        return [{"bitwidth": self.bits, "dtype": "int", "is_symmetric": "True",
                 "scale": float(v), "offset": -qmax, "min": -qmax * float(v),
                 "max": qmax * float(v)} for v in np.atleast_1d(self.params["scale"])]




_PATH_PART_RE = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(-?\d+)\]|\.([A-Za-z_]\w*)")


def parameter_path(name: str) -> str:
    """A pytree key path as a '/'-separated name, as AIMET encodings and Flax write them:
    `params['Conv_0']['kernel']` -> `params/Conv_0/kernel`; `[0].weight` -> `0/weight`;
    any other name as it is."""
    head = re.match(r"[A-Za-z_]\w*", name)
    parts = [head.group(0)] if head else []
    position = head.end() if head else 0
    for match in _PATH_PART_RE.finditer(name, position):
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


def _missed(title: str, column: str, skips: list[Skip]) -> list[str]:
    """A numbered table of what a stage left alone (op, or a refused set's layers), and why."""
    if not skips:
        return []
    rows = [(title, column, "op name", "code", "reason")]
    rows += [(str(i), " -> ".join(s.layers) or s.op, s.op_name, s.code, s.reason)
             for i, s in enumerate(skips, 1)]
    return ["", *_columns(rows)]


_Numbered = TypeVar("_Numbered", bound="Equalized | Quantized")


def _renumbered(records: list[_Numbered], prefix: str, offset: int) -> list[_Numbered]:
    """`records` of another report, their ids ("eq0", "q3") moved past this one's."""
    for record in records:
        record.id = f"{prefix}{offset + int(record.id[len(prefix):])}"
    return records


@dataclass
class Report:
    """What one run of the pass did.

    folds    every fold (`Fold`: producer and norm locations, form, direction,
             channels, kernel rounding, kind, and in `params` the composed
             scale/shift and the original statistics);
    skipped  every normalization that did not fold (`Skip`), one per op,
             with a reason that says what to do;
    expanded batch_norm_inference ops rewritten by --expand-batch-norm;
    inlined  private callees inlined (once per call site) to enable folds.
    equalized / not_equalized
             with --equalize: each set of layers equalized (`Equalized`), and
             each pair or set that was not, with the reason (`Skip`, op = layer 1,
             layers = the refused set's layers).
    quantized / not_quantized
             with --quantize-weights: each weight stored as integers
             (`Quantized`: bits, scales, weight SQNR, bias correction), and
             each producer whose weight was not, with the reason (`Skip`).

    `summary()` is the CLI's one-line summary, `dumps()` the JSON report,
    `table()` the text one, `save_params()` the statistics as .npz.
    """

    folds: list[Fold] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    expanded: int = 0
    inlined: list[str] = field(default_factory=list)  # callees inlined, once per call site
    equalized: list[Equalized] = field(default_factory=list)
    not_equalized: list[Skip] = field(default_factory=list)
    equalize: bool = False  # equalization ran (the JSON then has its two lists)
    quantized: list[Quantized] = field(default_factory=list)
    not_quantized: list[Skip] = field(default_factory=list)
    quantize: bool = False  # weight quantization ran (the JSON then has its two lists)

    def merge(self, other: Report) -> None:
        offset = len(self.folds)
        for fold in other.folds:
            fold.id = f"fold{offset + int(fold.id[4:])}"
        self.folds.extend(other.folds)
        self.skipped.extend(other.skipped)
        self.expanded += other.expanded
        self.inlined.extend(other.inlined)
        self.equalized.extend(_renumbered(other.equalized, "eq", len(self.equalized)))
        self.not_equalized.extend(other.not_equalized)
        self.equalize = self.equalize or other.equalize
        self.quantized.extend(_renumbered(other.quantized, "q", len(self.quantized)))
        self.not_quantized.extend(other.not_quantized)
        self.quantize = self.quantize or other.quantize

    def to_json(self) -> dict[str, Any]:
        data = {"folds": [f.to_json() for f in self.folds],
                "skipped": [s.to_json() for s in self.skipped],
                "expanded": self.expanded, "inlined": self.inlined,
                "warnings": self.warnings()}
        if self.equalize:
            data["equalized"] = [e.to_json() for e in self.equalized]
            data["not_equalized"] = [s.to_json() for s in self.not_equalized]
        if self.quantize:
            data["quantized"] = [q.to_json() for q in self.quantized]
            data["not_quantized"] = [s.to_json() for s in self.not_quantized]
        if self.equalize or self.quantize:
            data["statistics_note"] = STATISTICS_NOTE
        return data

    def warnings(self) -> list[dict[str, Any]]:
        """`{"code", "fold", "norm", "message"}` per fold whose batch-norm statistics are
        exactly their initial values (`untrained`), when the statistics were recovered
        (batch_norm_inference always; a decomposed chain with `FoldOptions.statistics`,
        --report or --report-params, or what needs them: --equalize, --bias-correction)."""
        return [w for w in map(untrained, self.folds) if w is not None]

    def encodings(self) -> dict[str, Any]:
        """The quantized weights as an AIMET-style encodings file (`--quant-encodings`):
        `{"version": ..., "param_encodings": {name: [entry, ...]}, "param_locations":
        {name: producer location}}`. A weight that came from a bound parameter
        (--bind-params, fold_exported's pytree) is keyed by the parameter's name
        (`params/Conv_0/kernel`, as tools that read AIMET encodings expect), any other by
        its producer's location; a key used twice (a producer inlined into several call
        sites, a parameter shared by two layers) gets `#1`, `#2`, ..."""
        found: dict[str, Any] = {}
        where: dict[str, str] = {}
        for q in self.quantized:
            base = q.parameter or q.producer
            key, n = base, 1
            while key in found:
                key, n = f"{base}#{n}", n + 1
            found[key] = q.encoding()
            where[key] = q.producer
        return {"version": "0.6.1", "activation_encodings": {}, "param_encodings": found,
                "param_locations": where}

    def name_parameters(self, names: dict[str, str]) -> None:
        """Names each quantized weight read from a bound parameter's constant: `names`
        maps the raw location of each bound argument to the parameter's name."""
        for q in self.quantized:
            name = names.get(q.weight_location) if q.weight_location else None
            if name is not None:
                q.parameter = parameter_path(name)

    def dumps(self) -> str:
        import json  # only when a report is written (start-up time)

        return json.dumps(self.to_json(), indent=2) + "\n"

    def table(self) -> str:
        """A human-readable table: each fold (and what stayed of it), then each skipped op
        with its reason.

            fold   direction  producer          norm              channels  rounding  kind
            fold0  backward   model.mlir:12:10  model.mlir:14:10  16        5.9e-08   normalization
            ...

            fold   what stayed of it, and why
            fold3  shift folded exactly through zero padding: a border correction built ...

            skipped  op                 op name                         code    reason
            1        model.mlir:30:10   stablehlo.batch_norm_inference  ...     the mean is ...
        """
        rows = [("fold", "direction", "producer", "norm", "channels", "rounding", "kind")]
        rows += [(f.id, f.direction, f.producer, f.norm, str(f.channels),
                  f"{f.kernel_rounding:.1e}", f.kind) for f in self.folds]
        lines = _columns(rows) if self.folds else ["no folds"]
        notes = [(f.id, f.note) for f in self.folds if f.note]
        if notes:
            lines += [""] + _columns([("fold", "what stayed of it, and why")] + notes)
        warnings = [(w["fold"], w["code"], w["message"]) for w in self.warnings()]
        if warnings:
            lines += [""] + _columns([("warning", "code", "message")] + warnings)
        lines.append("")
        if self.skipped:
            skips = [("skipped", "op", "op name", "code", "reason")]
            skips += [(str(i), s.op, s.op_name, s.code, s.reason)
                      for i, s in enumerate(self.skipped, 1)]
            lines += _columns(skips)
        else:
            lines.append("nothing skipped")
        if self.equalize:
            lines.append("")
            lines += self._equalize_table()
        if self.quantize:
            lines.append("")
            lines += self._quantize_table()
        if self.equalize or self.quantize:
            lines += ["", f"note: {STATISTICS_NOTE}"]
        lines += ["", self.summary()]
        return "\n".join(lines) + "\n"

    def _equalize_table(self) -> list[str]:
        lines: list[str] = []
        if self.equalized:
            rows = [("set", "kind", "layers", "range ratio before -> after")]
            rows += [(e.id, e.kind, " -> ".join(e.layers),
                      ", ".join(f"{b:.3g}->{a:.3g}" for b, a in
                                zip(e.range_ratio_before, e.range_ratio_after, strict=True)))
                     for e in self.equalized]
            lines += _columns(rows)
        else:
            lines.append("nothing equalized")
        return lines + _missed("not equalized", "layers", self.not_equalized)

    def _quantize_table(self) -> list[str]:
        lines: list[str] = []
        if self.quantized:
            rows = [("weight", "producer", "bits", "granularity", "weight SQNR dB",
                     "bias correction")]
            rows += [(q.id, q.producer, str(q.bits), q.granularity, f"{q.weight_sqnr_db:.1f}",
                      _correction_text(q.bias_correction)) for q in self.quantized]
            lines += _columns(rows)
            notes = [(q.id, q.note) for q in self.quantized if q.note]
            if notes:
                lines += [""] + _columns([("weight", "note")] + notes)
        else:
            lines.append("nothing quantized")
        return lines + _missed("not quantized", "producer", self.not_quantized)

    def params(self) -> dict[str, np.ndarray]:
        """Flat `{"fold0/gamma": array, ..., "eq0/scale0": array, "q0/scale": array}` for
        every fold, equalized set and quantized weight."""
        found = {f"{fold.id}/{k}": v for fold in self.folds for k, v in fold.params.items()}
        found |= {f"{eq.id}/{k}": v for eq in self.equalized for k, v in eq.params.items()}
        return found | {f"{q.id}/{k}": v for q in self.quantized for k, v in q.params.items()}

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
            text += f" ({_count(f'{f.direction} {f.form}' for f in norms)})"
        if others:
            steps = _count(f"{_short(f.norm_op)} folded {f.direction}" for f in others)
            text += f" (+{len(others)} other affine: {steps})"
        text += f", skipped {len(self.skipped)}"
        if self.expanded:
            text += f", expanded {self.expanded} batch_norm_inference"
        if self.inlined:
            text += f", inlined {len(self.inlined)} call(s)"
        if self.equalize:
            text += f", equalized {len(self.equalized)} set(s)"
            if self.equalized:
                text += f" ({_count(e.kind for e in self.equalized)})"
            text += f", {sum(s.pairs for s in self.not_equalized)} pair(s) not equalized"
        if self.quantize:
            text += f", quantized {len(self.quantized)} weight(s)"
            if self.quantized:
                text += f" ({_count(f'int{q.bits} {q.granularity}' for q in self.quantized)})"
            corrections = [q.bias_correction for q in self.quantized if q.bias_correction]
            if corrections:
                applied = sum(1 for c in corrections if c["applied"])
                text += f", bias-corrected {applied} ({len(corrections) - applied} not)"
            if self.not_quantized:
                text += f", {len(self.not_quantized)} not quantized"
        if self.equalize or self.quantize:
            warned = self.warnings()
            if warned:
                text += (f"; {len(warned)} batch norm(s) with untrained statistics, which "
                         f"these results rely on (see the report's warnings)")
        text += _bind_hint(self)
        return text


_PARAMETER, _KERNEL = "parameter-argument", "kernel-argument"


def _correction_text(correction: dict[str, Any] | None) -> str:
    if correction is None:
        return "-"
    if correction["applied"]:
        return (f"{correction['channels']} channels, max |shift| {correction['max_shift']:.3g}"
                f" ({correction.get('basis', 'linear')})")
    return f"not applied ({correction['code']}): {correction['reason']}"


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


def _short(op_name: str) -> str:
    return op_name.removeprefix("stablehlo.")


def _count(labels: Iterable[str]) -> str:
    """`2 backward decomposed, 1 forward decomposed` (sorted by label)."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)] + [r[-1]])
            for r in rows]
