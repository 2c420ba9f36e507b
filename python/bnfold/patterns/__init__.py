"""The registry: every rewrite bnfold has, in the order the driver runs them.

Each entry names a module that defines `PATTERN`, an object following
`bnfold.patterns.base.Pattern` (pure `match` and `plan`, an `apply` that goes
through the rewriter). Modules are imported only when their pattern runs, so a
plain fold never pays for the quantization code. Adding a pattern is one
module plus one entry here (see CONTRIBUTING.md).

The bnfold passes of a pipeline are listed here too, each with the options
it fixes; every other option of the schema (`bnfold.options`) is a pass option.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bnfold.options import PassSpec
from bnfold.patterns.base import Stage

if TYPE_CHECKING:
    from bnfold.patterns.base import Pattern
    from bnfold.report import Section


@dataclass(frozen=True)
class Entry:
    """A registered pattern: its `--disable` name, what it does, where it lives, when it
    runs, and the option that turns it on (None: on unless disabled)."""

    name: str
    description: str
    module: str
    stage: Stage
    opt_in: str | None = None
    # Whether the pattern reports records of its own (its module's `RECORDS`, a
    # `bnfold.report.Section`): "always" (in every report, even when it did not run), "ran"
    # (when it ran), None (it reports through the folds and skips every report has).
    reports: str | None = None

    def load(self) -> Pattern:
        return _load(self.module)

    def section(self) -> Section:
        section: Section = importlib.import_module(self.module).RECORDS
        return section


REGISTRY: tuple[Entry, ...] = (
    Entry("inline-calls",
          "inline private helpers (jax.jit, filter_jit, nested at any depth) where a fold or "
          "equalization needs to see through them, one copy per call site",
          "bnfold.patterns.inline_calls", Stage.PREPARE, reports="always"),
    Entry("backward-affine",
          "fold a per-channel affine chain (batch_norm_inference or its decomposed spellings) "
          "into the convolution/dot_general before it",
          "bnfold.patterns.backward_affine", Stage.FOLD),
    Entry("forward-affine",
          "fold a per-channel affine chain into the convolution/dot_general after it (through "
          "zero padding with an exact border correction)",
          "bnfold.patterns.forward_affine", Stage.FOLD),
    Entry("merge-bias",
          "merge a forward fold's new bias with the affine steps after its producer",
          "bnfold.patterns.merge_bias", Stage.FOLD),
    Entry("expand-batch-norm",
          "rewrite each batch_norm_inference that did not fold into multiply + add "
          "(opt-in: --expand-batch-norm)",
          "bnfold.patterns.expand_batch_norm", Stage.LOWER, opt_in="expand_batch_norm",
          reports="always"),
    Entry("equalize",
          "cross-layer equalization of convolution/dot_general pairs and triplets "
          "(opt-in: --equalize)",
          "bnfold.quant.equalize", Stage.QUANTIZE, opt_in="equalize", reports="ran"),
    Entry("absorb-high-bias",
          "move the bias a ReLU passes for every input within 3 sigma into the next layer "
          "(opt-in: --absorb-high-bias)",
          "bnfold.quant.high_bias", Stage.QUANTIZE, opt_in="absorb_high_bias"),
    Entry("quantize-weights",
          "store every constant convolution/dot_general weight as signed integers with a "
          "symmetric scale, dequantized in the graph, with analytic bias correction if asked "
          "(opt-in: --quantize-weights)",
          "bnfold.quant.weights", Stage.QUANTIZE, opt_in="quantize_weights", reports="ran"),
)

FOLDING = ("backward-affine", "forward-affine")

PASSES: tuple[PassSpec, ...] = (
    PassSpec("bnfold-fold", "fold batch normalization (every spelling) into convolutions and "
                            "dot_generals"),
    PassSpec("bnfold-expand-batch-norm", "rewrite every batch_norm_inference as multiply + add",
             fixed={"expand_batch_norm": True,
                    "disable": frozenset(e.name for e in REGISTRY if e.name != "expand-batch-norm")},
             only=("skip_functions",)),
    PassSpec("bnfold-equalize", "fold, then equalize the weight ranges of consecutive layers "
                                "(cross-layer equalization)", fixed={"equalize": True}),
    PassSpec("bnfold-quantize-weights", "fold, then store the weights as integers (int8 per "
                                        "tensor unless its options say otherwise)",
             defaults={"quantize_weights": "int8"}),
)


@functools.cache
def _load(module: str) -> Pattern:
    pattern: Pattern = importlib.import_module(module).PATTERN
    return pattern


def pattern_names() -> list[str]:
    return [entry.name for entry in REGISTRY]


def entry(name: str) -> Entry:
    return next(e for e in REGISTRY if e.name == name)


__all__ = ["FOLDING", "PASSES", "REGISTRY", "Entry", "entry", "pattern_names"]
