"""Smoke test of tools/bench.py: every section runs end to end on tiny models.

No timing assertions: the numbers of a --size tiny run mean nothing; this only
checks that the script works (model generation, child processes, the report).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "tools" / "bench.py"

HEADERS = [
    "# bnfold benchmark",
    "## Machine",
    "## Models",
    "## Fold cost",
    "## Scaling",
    "## Memory",
    "## Graph size",
    "## Real exports",
    "## Inference",
    "## Folded stems",
]


def test_bench_tiny_runs_every_section(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--size", "tiny", "--repeat", "1",
         "--workdir", str(tmp_path / "models"), "--json", str(out_json)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for header in HEADERS:
        assert header in proc.stdout, f"missing {header!r} in:\n{proc.stdout}"
    data = json.loads(out_json.read_text())
    assert data["fold"]["separable_text"]["wall"]["ratio"] > 0
    assert data["memory"]["rss_ratio"] > 0 and data["models_ratio"]["rows"]
    assert set(data["sections"]) == {"fold", "scaling", "memory", "graph", "models",
                                     "inference", "stem"}
    # The folded stems compute what the originals do (the fold is exact up to f32 rounding).
    assert len(data["stem"]["rows"]) == 6
    assert all(r["rel_err"] < 1e-5 for r in data["stem"]["rows"]), data["stem"]["rows"]


def test_bench_help() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0
    assert "--only" in proc.stdout and "--repeat" in proc.stdout


def test_bench_rejects_unknown_section() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--only", "fold,nope"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "nope" in proc.stderr


def test_bench_compare_with_a_ref(tmp_path: Path) -> None:
    """--compare HEAD: the working tree against the last commit, on the three workloads."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: --compare needs the repository's history")
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--size", "tiny", "--repeat", "1", "--compare", "HEAD",
         "--workdir", str(tmp_path / "models"), "--json", str(out_json)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "## Compared with HEAD" in proc.stdout, proc.stdout
    assert "| workload | ref | new | ratio (median, range) |" in proc.stdout, proc.stdout
    assert "## Fold cost" not in proc.stdout  # --compare alone runs no section
    data = json.loads(out_json.read_text())
    (compare,) = data["compare"]
    assert compare["ref"] == "HEAD" and len(compare["commit"]) == 40
    assert [r["format"] for r in compare["rows"]] == ["mlir", "bytecode", "mlir"]
    for row in compare["rows"]:
        wall = row["wall"]
        for key in ("ratio", "ratio_min", "ratio_max"):
            assert math.isfinite(wall[key]) and wall[key] > 0, row
        assert row["ref_peak_rss"] > 0 and row["new_peak_rss"] > 0, row
        assert f"{wall['ratio']:.3f}x" in proc.stdout


def test_bench_compare_rejects_an_unknown_ref(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: --compare needs the repository's history")
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--size", "tiny", "--repeat", "1",
         "--compare", "no-such-ref-h4", "--workdir", str(tmp_path / "models")],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "no-such-ref-h4" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
