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
from typing import TYPE_CHECKING, Any, NamedTuple

from bnfold.patterns.base import Stage
from bnfold.schema import Kind, Meta, Option, OptionsBase, PassSpec, build, switch

if TYPE_CHECKING:
    from bnfold.patterns.base import Pattern
    from bnfold.report import Section


class Entry(NamedTuple):
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
    # The options it adds to the schema (FoldOptions fields, bnfold-opt flags, pass options).
    options: tuple[Option, ...] = ()

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
    Entry("drop-identity",
          "remove a multiply by exactly 1 and an add of exactly 0 (torchax's `a + b * 1`): "
          "exact, reported apart from the folds",
          "bnfold.patterns.drop_identity", Stage.FOLD, reports="ran"),
    Entry("backward-affine",
          "fold a per-channel affine chain (batch_norm_inference or its decomposed spellings) "
          "into the convolution/dot_general before it",
          "bnfold.patterns.backward_affine", Stage.FOLD, options=(
              switch("fold_into_narrow_kernels",
                  "fold an affine that the original applies in a wider type than its "
                  "producer's, and whose result stays wide (convert(bf16 dot_general) to f32, "
                  "times a scale, returned in f32), into the narrow kernel anyway: the scaled "
                  "weights are rounded to the kernel's type, which the original never does "
                  "(docs/precision.md, rule 9; default: refused)"),)),
    Entry("forward-affine",
          "fold a per-channel affine chain into the convolution/dot_general after it (through "
          "zero padding with an exact border correction)",
          "bnfold.patterns.forward_affine", Stage.FOLD, options=(
              switch("pad_uniform_shift",
                  "fold a uniform input shift (Keras Rescaling) through a convolution's zero "
                  "padding with an explicit stablehlo.pad (default: an exact border correction "
                  "added to the output, which XLA CPU runs faster)"),)),
    Entry("forward-norm",
          "fold a normalization's affine (LayerNorm, RMSNorm, Gemma's 1 + w, in every "
          "spelling) into every convolution/dot_general that reads it",
          "bnfold.patterns.forward_norm", Stage.FOLD),
    Entry("merge-bias",
          "merge a forward fold's new bias with the affine steps after its producer",
          "bnfold.patterns.merge_bias", Stage.FOLD),
    Entry("fold-scale",
          "move a constant scalar scale (attention's 1/sqrt(head_dim), Gemma's embedding "
          "scale and soft-cap) into the weight behind it",
          "bnfold.patterns.fold_scale", Stage.FOLD),
    Entry("expand-batch-norm",
          "rewrite each batch_norm_inference that did not fold into multiply + add "
          "(opt-in: --expand-batch-norm)",
          "bnfold.patterns.expand_batch_norm", Stage.LOWER, opt_in="expand_batch_norm",
          reports="always", options=(
              switch("expand_batch_norm",
                  "rewrite every batch_norm_inference that did not fold into multiply + add (for "
                  "the reference interpreter and back ends without a batch-norm op)"),)),
    Entry("equalize",
          "cross-layer equalization of convolution/dot_general pairs and triplets "
          "(opt-in: --equalize)",
          "bnfold.quant.equalize", Stage.QUANTIZE, opt_in="equalize", reports="ran", options=(
              switch("equalize",
                  "after folding, equalize the weight ranges of consecutive layers (cross-layer "
                  "equalization, for per-tensor int8 weights; the function is unchanged; ReLU6 "
                  "becomes a per-channel clamp)", uses_statistics=True),)),
    Entry("absorb-high-bias",
          "move the bias a ReLU passes for every input within 3 sigma into the next layer "
          "(opt-in: --absorb-high-bias)",
          "bnfold.quant.high_bias", Stage.QUANTIZE, opt_in="absorb_high_bias", options=(
              switch("absorb_high_bias",
                  "with --equalize: move the part of layer 1's bias that the activation passes "
                  "for every input within 3 sigma (beta - 3*gamma of its batch norm) into layer "
                  "2's bias", requires="equalize",
                  uses_statistics=True),)),
    Entry("quantize-weights",
          "store every constant convolution/dot_general weight as signed integers with a "
          "symmetric scale, dequantized in the graph, with analytic bias correction if asked "
          "(opt-in: --quantize-weights)",
          "bnfold.quant.weights", Stage.QUANTIZE, opt_in="quantize_weights", reports="ran",
          options=(
              Option("quantize_weights", None, Meta(
                  "after folding (and --equalize), store every constant convolution/dot_general "
                  "weight as BITS-bit signed integers with a symmetric scale, dequantized in the "
                  "graph (convert + multiply) so any StableHLO consumer runs it",
                  kind=Kind.CHOICE, flag="--quantize-weights", pass_option="quantize-weights",
                  metavar="BITS", choices=tuple(f"int{b}" for b in range(4, 17)))),
              Option("quantize_granularity", None, Meta(
                  "one scale per weight tensor (per-tensor, the default: what equalization "
                  "serves) or per output channel",
                  kind=Kind.CHOICE, flag="--quantize-granularity",
                  pass_option="quantize-granularity", metavar="G",
                  choices=("per-tensor", "per-channel"), requires="quantize_weights")),
              switch("bias_correction",
                  "with --quantize-weights: remove the expected output shift (W_q - W) E[x] of "
                  "each quantized layer from its bias, E[x] from the folded batch norms before "
                  "it (analytic, no data)", requires="quantize_weights", uses_statistics=True))),
)

# The options schema of this registry: the core's options and every entry's.
if TYPE_CHECKING:
    class FoldOptions(OptionsBase):
        """Options of the pass (bnfold.schema.OptionsBase; one field per option)."""

        def __init__(self, **options: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...
else:
    FoldOptions = build(REGISTRY)

PASSES: tuple[PassSpec, ...] = (
    PassSpec("bnfold-fold", "fold batch normalization (every spelling) into convolutions and "
                            "dot_generals", FoldOptions),
    PassSpec("bnfold-expand-batch-norm", "rewrite every batch_norm_inference as multiply + add",
             FoldOptions, fixed={"expand_batch_norm": True, "disable": frozenset(
                 e.name for e in REGISTRY if e.name != "expand-batch-norm")},
             only=("skip_functions",)),
    PassSpec("bnfold-equalize", "fold, then equalize the weight ranges of consecutive layers "
                                "(cross-layer equalization)", FoldOptions, fixed={"equalize": True}),
    PassSpec("bnfold-quantize-weights", "fold, then store the weights as integers (int8 per "
                                        "tensor unless its options say otherwise)",
             FoldOptions, defaults={"quantize_weights": "int8"}),
)


@functools.cache
def _load(module: str) -> Pattern:
    pattern: Pattern = importlib.import_module(module).PATTERN
    return pattern


def pattern_names() -> list[str]:
    return [entry.name for entry in REGISTRY]


__all__ = ["PASSES", "REGISTRY", "Entry", "FoldOptions", "pattern_names"]
