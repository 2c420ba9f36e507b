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


# --- tools/bench.py --downstream (tools/downstream.py) -------------------------------------

DOWNSTREAM = ROOT / "tools" / "downstream.py"
CONV_BN = ROOT / "testdata" / "models" / "flax_linen_conv_bn_nhwc.mlir"


def _downstream_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("downstream", DOWNSTREAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("downstream", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_downstream_smoke(tmp_path: Path) -> None:
    """Original and folded compiled on the local backend (CPU here): a row per model,
    kernel counts, and the folded module computes what the original does on the same
    weights (lifted into arguments with their own values)."""
    out_json = tmp_path / "downstream.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--downstream", str(CONV_BN), "--models", "resnet18",
         "--size", "tiny", "--batch", "2", "--dtype", "f32,bf16", "--rounds", "2", "--runs", "2",
         "--workdir", str(tmp_path / "models"), "--json", str(out_json)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| model | batch | dtype |") and len(table) == 2 + 3, proc.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["model"].split()[0], r["batch"], r["dtype"]) for r in rows] == [
        ("flax_linen_conv_bn_nhwc", 2, "f32"), ("jax", 2, "f32"), ("jax", 2, "bf16")]
    for r in rows:
        assert r["folds"] >= 1 and len(r["samples"]["original"]) == 2
        original, folded = r["kernels"]["original"], r["kernels"]["folded"]
        for counts in (original, folded):
            assert all(isinstance(counts[k], int) for k in ("fusions", "custom_calls", "kernels"))
        # Every batch norm folded: the folded module never needs more kernels.
        assert folded["kernels"] <= original["kernels"] and folded["fusions"] <= original["fusions"]
        # --lift kernels: each convolution's kernel became an argument, on both sides.
        assert r["lifted"] == {"original": r["folds"], "folded": r["folds"]}, r
        assert r["rel_err"] < (1e-5 if r["dtype"] == "f32" else 3e-2), r


def test_bench_downstream_lifts_every_parameter(tmp_path: Path) -> None:
    """--lift all: the batch norm's vectors become arguments too: 5 per conv + BN before
    (kernel, mean, var, gamma, beta), 2 after (kernel, bias); same outputs."""
    out_json = tmp_path / "downstream.json"
    proc = subprocess.run(
        [sys.executable, str(DOWNSTREAM), str(CONV_BN), "--lift", "all", "--rounds", "1",
         "--runs", "1", "--json", str(out_json)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[lift all]" in proc.stdout
    (row,) = json.loads(out_json.read_text())["rows"]
    assert row["folds"] == 1 and row["lifted"] == {"original": 5, "folded": 2}, row
    assert row["rel_err"] < 1e-5 and row["constants_left_in_other_functions"] == {
        "original": 0, "folded": 0}
    assert row["kernels"]["folded"]["kernels"] < row["kernels"]["original"]["kernels"], row


def test_downstream_counts_kernels_of_gpu_hlo() -> None:
    """Kernels as XLA GPU's optimized HLO spells them: cuDNN convolutions as custom-calls
    with tuple results, fusions, a command buffer outlined into a called computation;
    nothing inside fused computations or reducers counts."""
    hlo = """HloModule jit_f, entry_computation_layout={(f32[1,8,8,3]{3,2,1,0})->f32[1,4]{1,0}}

%fused_computation (param_0: f32[1,8,8,4], param_1: f32[4]) -> f32[1,8,8,4] {
  %param_0 = f32[1,8,8,4]{3,2,1,0} parameter(0)
  %param_1 = f32[4]{0} parameter(1)
  %broadcast.1 = f32[1,8,8,4]{3,2,1,0} broadcast(%param_1), dimensions={3}
  ROOT %add.1 = f32[1,8,8,4]{3,2,1,0} add(%param_0, %broadcast.1)
}

%region_add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

%command_buffer (p0: f32[1,8,8,4], p1: f32[4]) -> f32[1,8,8,4] {
  %p0 = f32[1,8,8,4]{3,2,1,0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  ROOT %loop_add_fusion.2 = f32[1,8,8,4]{3,2,1,0} fusion(%p0, %p1), kind=kLoop, calls=%fused_computation
}

ENTRY %main.9 (Arg_0.1: f32[1,8,8,3], Arg_1.2: f32[3,3,3,4], Arg_2.3: f32[4]) -> f32[1,4] {
  %Arg_0.1 = f32[1,8,8,3]{3,2,1,0} parameter(0)
  %Arg_1.2 = f32[3,3,3,4]{3,2,1,0} parameter(1)
  %Arg_2.3 = f32[4]{0} parameter(2)
  %custom-call.1 = (f32[1,8,8,4]{3,2,1,0}, u8[0]{0}) custom-call(%Arg_0.1, %Arg_1.2), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convForward", backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone"}}
  %get-tuple-element.1 = f32[1,8,8,4]{3,2,1,0} get-tuple-element(%custom-call.1), index=0
  %loop_add_fusion = f32[1,8,8,4]{3,2,1,0} fusion(%get-tuple-element.1, %Arg_2.3), kind=kLoop, calls=%fused_computation
  %call.1 = f32[1,8,8,4]{3,2,1,0} call(%loop_add_fusion, %Arg_2.3), to_apply=%command_buffer
  %bitcast.1 = f32[64,4]{1,0} bitcast(%call.1)
  %constant.1 = f32[] constant(0)
  %reduce.1 = f32[4]{0} reduce(%bitcast.1, %constant.1), dimensions={0}, to_apply=%region_add
  ROOT %copy.1 = f32[1,4]{1,0} copy(%reduce.1)
}
"""
    counts = _downstream_module().count_kernels(hlo)
    assert counts["by_opcode"] == {"copy": 1, "custom-call": 1, "fusion": 2, "reduce": 1}, counts
    assert (counts["fusions"], counts["custom_calls"], counts["kernels"]) == (2, 1, 5)


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
