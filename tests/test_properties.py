"""Property-based tests: random StableHLO modules (tests/modgen.py) folded by bnfold.

Every generated example is folded with `bnfold.fold_text` and must:
  * parse and verify after folding;
  * be idempotent (folding the output again changes nothing and folds nothing);
  * match the unfolded module on XLA CPU within `bnfold.numerics` tolerances;
  * for f16/bf16, be no less precise than the unfolded module against a float64
    reference (the same module with every type f64 and the same rounded values):
        err(folded) <= PRECISION_SLACK * err(unfolded) + eps(dtype)
    with errors measured like `numerics.relative_error` (max abs error / max |reference|)
    and eps(dtype) the machine epsilon (f16 2**-10, bf16 2**-7): one ulp at the
    output's largest magnitude;
  * fold exactly as the model in modgen.py predicts: the fold count, "unchanged" cases
    textually identical to the parsed-and-printed input with a reason in
    `report.skipped` where a normalization was involved, and fully folded cases with
    no rsqrt/sqrt/divide/batch_norm_inference left.

Profiles (registered here, selected with BNFOLD_HYPOTHESIS_PROFILE): "ci" (default,
`max_examples` per property test, derandomized) and "thorough" (5000 per test).
"""

from __future__ import annotations

import os
from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import bnfold
import modgen
import support
from bnfold import ir as bir
from bnfold import numerics

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
settings.register_profile(
    "thorough", max_examples=5000, deadline=None, derandomize=False, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
PROFILE = os.environ.get("BNFOLD_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

PRECISION_SLACK = 1.5
EPS = {"f16": float(np.finfo(np.float16).eps), "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)}
NORMALIZING_OPS = ("stablehlo.rsqrt", "stablehlo.sqrt", "stablehlo.divide",
                   "stablehlo.batch_norm_inference")
CANONICAL_OPS = {"builtin.module", "func.func", "func.return", "stablehlo.constant",
                 "stablehlo.convolution", "stablehlo.dot_general", "stablehlo.broadcast_in_dim",
                 "stablehlo.add", "stablehlo.reshape"}


# --- known bnfold bugs (each has a strict xfail regression test below) -------------------


def known_stale_skips(report: bnfold.Report) -> list:
    """Skips that a later forward fold made stale (test_regression_forward_bn_report_has_no_stale_skip)."""
    folded_norms = {f.norm for f in report.folds if f.direction == "forward"}
    return [s for s in report.skipped if s.op in folded_norms and
            s.reason == "no convolution or dot_general produces its operand"]


# --- the checks -------------------------------------------------------------------------


def printed(text: str) -> str:
    """The module as bnfold prints an unchanged module (parsed, then printed)."""
    context, module = support.parse(text)
    with context:
        return bir.serialize(module, "mlir").decode()


def inputs_for(arg_shapes, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    np_dtype = modgen.NP_DTYPES[dtype]
    out = []
    for i, shape in enumerate(arg_shapes):
        x = rng.standard_normal(shape)
        if i > 0:  # statistics passed as arguments: keep variances positive
            x = np.abs(x) + 0.5
        out.append(np.asarray(x).astype(np_dtype))
    return out


def is_known_double_add(report: bnfold.Report, report2: bnfold.Report) -> bool:
    """A forward fold put its bias add in front of an existing add, and the second run
    merged the two (test_regression_forward_shift_before_bias_add_is_canonical)."""
    return (any(f.direction == "forward" for f in report.folds) and len(report2.folds) == 1 and
            report2.folds[0].direction == "backward" and len(report2.folds[0].ops) >= 2 and
            all(op == "stablehlo.add" for op in report2.folds[0].ops))


def fold_and_check_common(text: str) -> tuple[str, bnfold.Report, bool]:
    """Folds, verifies, checks idempotence; returns (folded, report, known double-add bug)."""
    folded, report = bnfold.fold_text(text)
    support.parse(folded)  # parses and verifies
    again, report2 = bnfold.fold_text(folded)
    double_add = is_known_double_add(report, report2)
    if double_add:
        # Known bug: check the rest of the contract on the twice-folded text.
        third, report3 = bnfold.fold_text(again)
        assert not report3.folds and third == again, f"not idempotent after two folds:\n{again}"
        return folded, report, True
    assert not report2.folds, f"second fold folded again:\n{report2.dumps()}\n{folded}"
    assert again == folded, f"folding is not idempotent:\n--- once\n{folded}\n--- twice\n{again}"
    return folded, report, False


def check_numerics(text: str, folded: str, dtype: str, arg_shapes, seed: int,
                   reference_text: str | None = None) -> None:
    inputs = inputs_for(arg_shapes, dtype, seed)
    expected = numerics.run_xla(text, inputs)
    actual = numerics.run_xla(folded, inputs)
    numerics.check_close(actual, expected, dtype)
    if reference_text is not None and dtype in EPS:
        reference = numerics.run_xla(reference_text, [x.astype(np.float64) for x in inputs])
        for i, (a, e, r) in enumerate(zip(actual, expected, reference)):
            err_folded = numerics.relative_error(a, r)
            err_orig = numerics.relative_error(e, r)
            bound = PRECISION_SLACK * err_orig + EPS[dtype]
            assert err_folded <= bound, (
                f"output {i}: folded error vs f64 reference {err_folded:.3g} > "
                f"{PRECISION_SLACK} * unfolded error {err_orig:.3g} + eps {EPS[dtype]:.3g}")


def check_case(case: modgen.Case) -> None:
    r = modgen.render(case)
    text = r.text
    try:
        support.parse(text)
    except bnfold.BnfoldError as e:  # a generator bug, not a bnfold bug
        raise AssertionError(f"modgen produced an invalid module: {e}\n{text}") from None
    folded, report, double_add = fold_and_check_common(text)
    exp = r.expect
    forms = "/".join(c.form for c in (case.pre, case.post) if c is not None)
    event(f"{type(case.producer).__name__} {case.dtype} {forms} {case.variant}")
    event(f"expected folds {exp.folds}, got {len(report.folds)}" + (" (full)" if exp.full else ""))
    if double_add:
        event("known bug: double add")
    detail = f"\n{report.dumps()}\n--- input\n{text}\n--- folded\n{folded}"
    if exp.folds is not None:
        assert len(report.folds) == exp.folds, f"expected {exp.folds} fold(s){detail}"
    if exp.unchanged:
        assert folded == printed(text), f"must not change{detail}"
        if exp.reason:
            assert report.skipped and all(s.reason for s in report.skipped), \
                f"no reason in report.skipped{detail}"
        return
    if exp.full:
        names = support.op_names(folded)
        left = [n for n in names if n in NORMALIZING_OPS]
        assert not left, f"left {left}{detail}"
        assert set(names) <= CANONICAL_OPS, f"non-canonical ops {set(names) - CANONICAL_OPS}{detail}"
        adds = Counter(names)["stablehlo.add"]
        assert adds <= 1 or double_add, f"{adds} adds after a full fold (canonical form has one){detail}"
    if exp.clean_report:
        stale = known_stale_skips(report)
        assert not [s for s in report.skipped if s not in stale], f"full fold but skipped entries{detail}"
    if exp.reason and not report.folds:
        assert report.skipped, f"no reason in report.skipped{detail}"
    reference = modgen.render(case, "f64").text if case.dtype in EPS else None
    check_numerics(text, folded, case.dtype, r.arg_shapes, case.seed, reference)


# --- property tests ---------------------------------------------------------------------


@given(modgen.cases(direction="backward", producer="conv"))
def test_backward_conv_folds(case):
    check_case(case)


@given(modgen.cases(direction="backward", producer="dot"))
def test_backward_dot_general_folds(case):
    check_case(case)


@given(modgen.cases(direction="forward"))
def test_forward_folds(case):
    check_case(case)


@given(modgen.cases(direction="backward", variants=modgen.VARIANTS[1:]))
def test_backward_must_not_fold_variants(case):
    check_case(case)


@given(modgen.cases(direction="forward", variants=modgen.VARIANTS[1:]))
def test_forward_must_not_fold_variants(case):
    check_case(case)


@given(modgen.cases(direction="both"))
def test_both_directions(case):
    check_case(case)
