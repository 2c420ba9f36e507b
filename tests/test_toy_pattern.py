"""The toy pattern (tests/toy_pattern.py) is the example of adding a pattern: its module and
one registry line, and it folds, reports its own records and is held to the driver's rules."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bnfold
import numerics
import support
import test_rules
import toy_pattern
from bnfold import patterns, schema
from bnfold.patterns.base import Stage

# The one registry line.
REGISTRY = patterns.REGISTRY + (patterns.Entry(
    "cancel-negations", "replace negate(negate(x)) by x", "toy_pattern", Stage.FOLD,
    opt_in="cancel_negations", reports="ran", options=toy_pattern.OPTIONS),)

TEXT = """
func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %n = stablehlo.negate %x : tensor<4xf32>
  %r = stablehlo.negate %n : tensor<4xf32>
  %m = stablehlo.negate %y : tensor<4xf32>
  %s = stablehlo.negate %m : tensor<4xf32>
  return %r, %s, %m : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
"""


def fold(**options) -> tuple[str, bnfold.Report]:
    context, module = support.parse(TEXT)
    with context:
        report = bnfold.fold_module(module, schema.build(REGISTRY)(**options), registry=REGISTRY)
        return str(module), report


def test_it_folds_and_reports_its_records():
    text, report = fold(cancel_negations=True)
    # @main's first result is %x again (judged on the numbers, against the original)
    inputs = [np.arange(4, dtype=np.float32) - 1.5, np.ones(4, np.float32)]
    want, got = numerics.run_xla(TEXT, inputs), numerics.run_xla(text, inputs)
    numerics.check_close(got, want, 0.0)
    assert text.count("stablehlo.negate") == 2, text  # the refused pair stays
    data = report.to_json()
    assert list(data)[-2:] == ["cancelled", "not_cancelled"]
    assert len(data["cancelled"]) == 1 and data["cancelled"][0]["outer"].endswith(":4:8")
    [refused] = data["not_cancelled"]
    assert refused["code"] == "users" and "2 users" in refused["reason"]
    assert json.loads(report.dumps()) == data
    table = report.table()
    assert "cancelled  outer" in table and "not cancelled" in table
    assert report.summary().endswith(", skipped 0, cancelled 1 negation pair(s)")
    assert report.cancelled == report.part("cancel-negations").records


def test_it_is_opt_in_and_its_option_is_checked():
    text, report = fold()
    assert text.count("stablehlo.negate") == 4 and "cancelled" not in report.to_json()
    with pytest.raises(TypeError):
        bnfold.FoldOptions(cancel_negations=True)  # not a pattern of the package's registry
    with pytest.raises(bnfold.options.OptionError, match="unknown pattern"):
        schema.build(REGISTRY)(disable="cancel-negation")


def test_it_keeps_the_rules(monkeypatch):
    counts = test_rules.exercise(TEXT, {"cancel_negations": True}, REGISTRY)
    assert counts["cancel-negations"]["apply"] == 1
    for phase in test_rules.PHASES:
        test_rules.planted_change_fails(REGISTRY[-1], phase, TEXT, {"cancel_negations": True},
                                        monkeypatch, REGISTRY)
