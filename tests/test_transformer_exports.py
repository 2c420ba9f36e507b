"""Real transformer exports: bnfold folds their norm affines and constant scales and keeps
the numerics.

testdata/transformers/ holds small HF transformers and torchvision models exported through
torchax by `tools/export_transformers.py --small` (random norm affines; every norm,
attention, scaled-embedding and layer-scale module's ops carry its module path in their
locations). The manifest says, from the model definition, how many norm affines and
constant scales each has, and ("bnfold_min", written by `--measure --record`) how many of
them bnfold folded when the files were made: a floor, so a change that folds fewer fails
here. Judged on XLA CPU: the folded module against the original (the tolerance of the
model's type) and against the original evaluated in float64 (no less accurate: the worst
error over a few seeded inputs within 1.5x the original's worst plus one ulp). Needs no torch: only the committed files.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import bnfold

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "testdata" / "transformers"
ENTRIES = json.loads((DATA / "manifest.json").read_text())
EPS = {"f32": float(np.finfo(np.float32).eps), "bf16": 2.0 ** -7}
DRAWS = 4  # seeded inputs each export is judged on


@cache
def tool() -> ModuleType:
    """tools/export_transformers.py: its `classify` (which norm and scale folded, by the
    module scopes in the locations) and `numerics` (XLA CPU and float64)."""
    spec = importlib.util.spec_from_file_location(
        "export_transformers", ROOT / "tools" / "export_transformers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def folded(model: str, disable: str = "") -> tuple[str, str, dict]:
    entry = next(e for e in ENTRIES if e["model"] == model)
    text = (DATA / entry["file"]).read_text()
    options = bnfold.FoldOptions(disable=disable) if disable else None
    out, report = bnfold.fold_text(text, options, source_name=entry["file"])
    return text, out, report.to_json()


def test_the_manifest_matches_the_files():
    """Each file names every norm, attention, scaled-embedding and layer-scale module of
    the manifest in its locations (what `classify` attributes folds by), and is small."""
    assert len(ENTRIES) >= 8
    for entry in ENTRIES:
        text = (DATA / entry["file"]).read_text()
        assert len(text.encode()) < 300 * 1024, entry["file"]
        for kind, paths in entry["scopes"].items():
            in_ir = set(re.findall(rf"{kind}:([A-Za-z0-9_.]+)/", text))
            assert in_ir == set(paths), (entry["file"], kind, in_ir ^ set(paths))
        assert len(entry["scopes"]["norm"]) == entry["norms"], entry["file"]
        assert len(entry["scopes"]["attn"]) == entry["scales"].get("attention", 0)
        assert len(entry["scopes"]["emb"]) == entry["scales"].get("embedding", 0)
        assert len(entry["scopes"]["ls"]) == entry["scales"].get("layer_scale", 0)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["model"] for e in ENTRIES])
def test_norms_and_scales_fold_and_keep_the_numerics(entry):
    text, out, report = folded(entry["model"])
    got = tool().classify(entry, report)
    floor = entry["bnfold_min"]
    assert got["norms_total"] == entry["norms"]
    assert got["norms_folded"] >= floor["norms"], got["misses"]
    assert got["scales_folded"] >= floor["scales"], got["misses"]
    # Judged on DRAWS seeded inputs, the worst error of each against the other (as
    # docs/precision.md measures): one draw alone varies by ~2x at f32's last bits, where
    # XLA CPU fuses the original's ops differently from the folded ones.
    runs = [tool().numerics(text, out, {**entry, "model": entry["model"] + f"/{i}" * (i > 0)})
            for i in range(DRAWS)]
    for n in runs:
        assert n["difference"] <= n["tolerance"], n
        assert "original_error" in n, n.get("float64")
    worst = max(n["output_error"] for n in runs)
    assert worst <= 1.5 * max(n["original_error"] for n in runs) + EPS[entry["dtype"]], runs


def test_the_floor_catches_a_pattern_that_stops_folding():
    """The counts are a guard that can fail: without forward-norm, forward-affine and
    fold-scale, Llama's norms and attention scales stay, below the manifest's floor."""
    entry = next(e for e in ENTRIES if e["model"] == "hf_llama_untied")
    _, out, report = folded("hf_llama_untied", "forward-norm,forward-affine,fold-scale")
    got = tool().classify(entry, report)
    assert got["norms_folded"] < entry["bnfold_min"]["norms"]
    assert got["scales_folded"] < entry["bnfold_min"]["scales"]
    assert out != folded("hf_llama_untied")[1]
