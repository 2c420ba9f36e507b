#!/usr/bin/env python3
"""Benchmark bnfold: fold cost, scaling, memory, graph size and inference speed.

The machine this runs on is assumed to be shared and noisy, so every timing is
reported against a baseline measured in the same run, interleaved with it
(baseline, candidate, baseline, candidate, ...), as the median of --repeat
repetitions after one untimed warm-up of each. Ratios are the median of the
per-pair ratios (robust to slow drift of the machine's load); the range of the
per-pair ratios is printed next to them so the noise is visible. --json keeps
every raw sample.

Sections (select with --only):

  fold       whole-process `python -m bnfold -q IN -o OUT` on the ResNet-50-shaped
             module, text->text and bytecode->bytecode (--emit bytecode), against
             a baseline process that imports jaxlib, builds the same context
             (bnfold.ir.make_context, loaded without bnfold's package __init__, so
             importing the pass is bnfold's cost) and parses + prints / reads +
             writes bytecode with no folding. Targets: text <= 1.10x, bytecode
             <= 1.20x (the 300-layer separable stack: text <= 1.15x).
  scaling    in-process `bnfold.fold_module` time per folded layer (parse and
             print excluded) on stacks of N conv+BN layers, N interleaved, small
             stacks folded several times per sample (fresh parse each time) so
             every sample covers as many layers as the largest stack; target
             max/min per-layer time <= 1.5x.
  memory     peak RSS of the text->text CLI process on the ResNet-50-shaped module
             (os.wait4 rusage of that child) against the module's size on disk;
             target <= 2.5x. The baseline process's peak RSS is shown for scale.
  graph      op counts before and after folding (total, elementwise, constants).
  models     whole-process text fold / round-trip ratio for every testdata/models/*.mlir.
  inference  XLA CPU execution time of the folded vs the unfolded ResNet-18-shaped
             module, batch 1 and 8, compiled once, execution only; once with
             default flags and once with XLA_FLAGS=--xla_cpu_experimental_ynn_
             fusion_type= (each flag setting in its own child process, because
             XLA reads XLA_FLAGS once). No target.
  stem       XLA CPU execution time of image-model stems whose input normalization
             folds forward through zero padding (torchvision (x - mean) / std
             before a 7x7/2 conv; Keras Rescaling(1/127.5, -1) before a 3x3/2
             SAME conv), batch 1 and 8: the original against the default fold
             (exact border correction) and, for the uniform shift, the explicit-pad
             form of --pad-uniform-shift. No target.

--compare REF (repeatable) times the working tree against a git ref on the same
files: REF's python/ tree is extracted with `git archive` into the scratch
directory (no worktree, no install: its processes run with PYTHONPATH pointing
there, in this interpreter and environment), then whole-process `python -m bnfold
-q IN -o OUT` runs in pairs (REF, working tree, REF, ...), inputs and outputs on
/dev/shm, on three workloads: the 300-layer separable stack as text, and the
ResNet-50-shaped module as bytecode in and out and as text. It reports the
median of the per-pair wall-time ratios with their range, the peak RSS of each
side, and whether both wrote the same bytes. Target: ratio <= 1.02. With
--compare, only the sections --only names run (none by default).

Models (ResNets are backbones: stem, bottleneck or basic blocks with projection
shortcuts, global average pool, no classifier) are generated with plain jax (conv_general_dilated + Flax-style
decomposed batch norm `(y - mean) * (rsqrt(var + eps) * gamma) + beta` on
1x1x1xC constants + relu, parameters closed over so they lower to constants)
and cached in --workdir (default: $TMPDIR/bnfold-bench) under a hash of their
specification. bnfold's bytecode caches are written first (an editable install
under PYTHONDONTWRITEBYTECODE=1 would otherwise compile its sources in every
timed process). Outputs of the timed processes go to a scratch directory on
/dev/shm when it exists (no disk write-back noise) and are deleted at exit.

Usage:
    python tools/bench.py                         # everything, full size (~166+ MB models)
    python tools/bench.py --only fold,memory --repeat 9
    python tools/bench.py --size tiny --repeat 1  # seconds; what the smoke test runs
    python tools/bench.py --json bench.json
    python tools/bench.py --compare 2e74257 --repeat 9   # the working tree against a commit
    python tools/bench.py --compare main --only fold      # and the fold section as well
"""

from __future__ import annotations

import argparse
import filecmp
import gc
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("fold", "scaling", "memory", "graph", "models", "inference", "stem")
# bump when the generated modules change (2: the max pool's -inf is typed, as downstream.py's
# bf16 models need: one broadcast fewer)
GENERATOR_VERSION = 2

TARGETS = {
    "fold_text": 1.10,
    "fold_bytecode": 1.20,
    "fold_separable_text": 1.15,
    "scaling": 1.5,
    "memory": 1.10,  # peak RSS of bnfold / peak RSS of the round trip
    "compare": 1.02,  # --compare: working tree / ref, whole process (issue 35)
}

ELEMENTWISE = frozenset(f"stablehlo.{n}" for n in (
    "add", "subtract", "multiply", "divide", "rsqrt", "sqrt", "negate", "broadcast_in_dim"))

YNN_FLAGS = "--xla_cpu_experimental_ynn_fusion_type="

# --- sizes -------------------------------------------------------------------

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "resnet50": {"kind": "resnet", "block": "bottleneck", "hw": 224, "stem": 64,
                     "widths": [64, 128, 256, 512], "blocks": [3, 4, 6, 3]},
        "resnet18": {"kind": "resnet", "block": "basic", "hw": 224, "stem": 64,
                     "widths": [64, 128, 256, 512], "blocks": [2, 2, 2, 2]},
        "stacks": [10, 100, 1000],
        "stack": {"kind": "stack", "hw": 8, "channels": 16},
        "separable": {"kind": "separable", "hw": 14, "channels": 48, "blocks": 150},
        "batches": [1, 8],
        "stem_hw": 224,
    },
    "tiny": {
        "resnet50": {"kind": "resnet", "block": "bottleneck", "hw": 32, "stem": 8,
                     "widths": [8, 16], "blocks": [1, 1]},
        "resnet18": {"kind": "resnet", "block": "basic", "hw": 32, "stem": 8,
                     "widths": [8, 16], "blocks": [1, 1]},
        "stacks": [2, 4, 8],
        "stack": {"kind": "stack", "hw": 8, "channels": 16},
        "separable": {"kind": "separable", "hw": 8, "channels": 8, "blocks": 3},
        "batches": [1, 8],
        "stem_hw": 32,
        "models_limit": 2,
    },
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- model generation --------------------------------------------------------


@dataclass
class Model:
    name: str
    spec: dict[str, Any]
    text: Path
    bytecode: Path
    info: dict[str, Any] = field(default_factory=dict)


def _spec_hash(name: str, spec: dict[str, Any]) -> str:
    # The jax version is part of the key: it changes the printed IR.
    key = json.dumps({"name": name, "spec": spec, "gen": GENERATOR_VERSION,
                      "jax": _version("jax")}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def ensure_model(runner: Runner, workdir: Path, name: str, spec: dict[str, Any],
                 regenerate: bool) -> Model:
    stem = f"{name}-{_spec_hash(name, spec)}"
    text, bytecode, meta = (workdir / f"{stem}.mlir", workdir / f"{stem}.mlirbc",
                            workdir / f"{stem}.json")
    if regenerate or not (text.exists() and bytecode.exists() and meta.exists()):
        log(f"generating {name} ({json.dumps(spec)})")
        # In a child: the orchestrating process must stay small (see run_measured).
        info = runner.child("generate", {"spec": spec, "text": str(text),
                                         "bytecode": str(bytecode), "meta": str(meta)})
        log(f"generated {text.name}: {text.stat().st_size / 1e6:.1f} MB text in "
            f"{info['generation_s']} s")
    info = json.loads(meta.read_text())
    info["text_bytes"] = text.stat().st_size
    info["bytecode_bytes"] = bytecode.stat().st_size
    return Model(name, spec, text, bytecode, info)


def child_generate(payload: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    module_text, info = lower_model(payload["spec"])
    _write_atomically(Path(payload["text"]), module_text.encode())
    _write_atomically(Path(payload["bytecode"]), _to_bytecode(module_text))
    info["generation_s"] = round(time.perf_counter() - start, 1)
    _write_atomically(Path(payload["meta"]), json.dumps(info).encode())
    return info


def _to_bytecode(text: str) -> bytes:
    import io

    from bnfold import ir as bir

    context = bir.make_context()
    with context:
        module = bir.ir.Module.parse(text)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    return buf.getvalue()


def lower_model(spec: dict[str, Any], dtype: str = "f32", seed: int | None = None
                ) -> tuple[str, dict[str, Any]]:
    """Lowers the model described by `spec` to StableHLO text with jax: weights,
    activations and batch norms in `dtype` ("f32", "bf16"); the random weights and
    statistics drawn with `seed` (default: from the spec without its batch).
    tools/downstream.py generates its ResNets here."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    jdtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype]
    if seed is None:
        seed = zlib.crc32(json.dumps({k: v for k, v in spec.items() if k != "batch"},
                                     sort_keys=True).encode())
    rng = np.random.default_rng(seed)
    counts = {"params": 0, "conv_bn": 0}

    def conv_bn(cin: int, cout: int, k: int) -> dict[str, Any]:
        kernel = rng.standard_normal((k, k, cin, cout)) * math.sqrt(2.0 / (k * k * cin))
        stats = {
            "mean": rng.normal(0.0, 0.3, cout),
            "var": rng.uniform(0.5, 2.0, cout),
            "gamma": rng.uniform(0.5, 1.5, cout),
            "beta": rng.normal(0.0, 0.3, cout),
        }
        counts["params"] += kernel.size + 4 * cout
        counts["conv_bn"] += 1
        layer = {"k": jnp.asarray(kernel, jdtype)}
        # Flax keeps 1-D params and reshapes them to broadcast against NHWC.
        layer.update({n: jnp.asarray(v, jdtype).reshape(1, 1, 1, cout)
                      for n, v in stats.items()})
        return layer

    def apply(layer: dict[str, Any], x: Any, stride: int = 1) -> Any:
        y = lax.conv_general_dilated(x, layer["k"], (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        # flax.linen.normalization._normalize, inference mode.
        mul = lax.rsqrt(layer["var"] + jnp.asarray(1e-5, jdtype)) * layer["gamma"]
        return (y - layer["mean"]) * mul + layer["beta"]

    relu = jax.nn.relu
    batch = spec.get("batch", 1)
    if spec["kind"] == "separable":
        # MobileNet-style blocks (depthwise 3x3 + BN + relu6, 1x1 + BN + relu), with
        # Keras' scale/shift batch norm: y * s + t, s = rsqrt(var + eps) * gamma.
        c = spec["channels"]
        blocks = []
        for _ in range(spec["blocks"]):
            dw = conv_bn(1, c, 3)
            pw = conv_bn(c, c, 1)
            blocks.append((dw, pw))
        shape = (batch, spec["hw"], spec["hw"], c)

        def keras_bn(layer: dict[str, Any], y: Any) -> Any:
            scale = lax.rsqrt(layer["var"] + jnp.asarray(1e-3, jdtype)) * layer["gamma"]
            return y * scale + (layer["beta"] - layer["mean"] * scale)

        def model(x: Any) -> Any:
            for dw, pw in blocks:
                y = lax.conv_general_dilated(x, dw["k"], (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             feature_group_count=c)
                x = jnp.clip(keras_bn(dw, y), 0.0, 6.0)
                y = lax.conv_general_dilated(x, pw["k"], (1, 1), "VALID",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
                x = relu(keras_bn(pw, y))
            return x
    elif spec["kind"] == "stack":
        c, n = spec["channels"], spec["layers"]
        layers = [conv_bn(c, c, 3) for _ in range(n)]
        shape = (batch, spec["hw"], spec["hw"], c)

        def model(x: Any) -> Any:
            for layer in layers:
                x = relu(apply(layer, x))
            return x
    else:
        stem = conv_bn(3, spec["stem"], 7)
        stages = []
        cin = spec["stem"]
        for s, (width, nblocks) in enumerate(zip(spec["widths"], spec["blocks"])):
            blocks = []
            for b in range(nblocks):
                stride = 2 if (s > 0 and b == 0) else 1
                if spec["block"] == "bottleneck":
                    cout = 4 * width
                    convs = [conv_bn(cin, width, 1), conv_bn(width, width, 3),
                             conv_bn(width, cout, 1)]
                else:
                    cout = width
                    convs = [conv_bn(cin, width, 3), conv_bn(width, cout, 3)]
                proj = conv_bn(cin, cout, 1) if (stride != 1 or cin != cout) else None
                blocks.append((convs, proj, stride))
                cin = cout
            stages.append(blocks)
        shape = (batch, spec["hw"], spec["hw"], 3)

        def model(x: Any) -> Any:
            x = relu(apply(stem, x, 2))
            x = lax.reduce_window(x, jnp.asarray(-jnp.inf, jdtype), lax.max, (1, 3, 3, 1),
                                  (1, 2, 2, 1), "SAME")
            for blocks in stages:
                for convs, proj, stride in blocks:
                    y = x
                    for i, layer in enumerate(convs):
                        # ResNet v1.5 (Flax examples): the stride is on the 3x3 conv.
                        is_strided = (i == 1) if len(convs) == 3 else (i == 0)
                        y = apply(layer, y, stride if is_strided else 1)
                        if i < len(convs) - 1:
                            y = relu(y)
                    shortcut = apply(proj, x, stride) if proj is not None else x
                    x = relu(y + shortcut)
            return jnp.mean(x, axis=(1, 2))

    text = jax.jit(model).lower(jax.ShapeDtypeStruct(shape, jdtype)).as_text()
    header = re.search(r"func\.func public @main\(([^)]*)\)", text)
    if header is None or header.group(1).count("%arg") != 1:
        raise RuntimeError("generated module's @main must take the input only (parameters "
                           "were expected to lower to constants)")
    return text, {"input_shape": list(shape), "params": counts["params"],
                  "conv_bn_layers": counts["conv_bn"]}


def build_models(runner: Runner, size: str, workdir: Path, sections: set[str],
                 regenerate: bool) -> dict[str, Model]:
    cfg = SIZES[size]
    models: dict[str, Model] = {}
    if sections & {"fold", "memory", "graph", "compare"}:
        models["resnet50"] = ensure_model(runner, workdir, "resnet50", cfg["resnet50"], regenerate)
    if sections & {"fold", "graph", "compare"}:
        models["separable"] = ensure_model(runner, workdir, "separable", cfg["separable"],
                                           regenerate)
    if sections & {"scaling", "graph"}:
        for n in cfg["stacks"]:
            models[f"stack{n}"] = ensure_model(runner, workdir, f"stack{n}",
                                               dict(cfg["stack"], layers=n), regenerate)
    if sections & {"graph", "inference"}:
        for b in cfg["batches"]:
            name = "resnet18" if b == 1 else f"resnet18_b{b}"
            if b != 1 and "inference" not in sections:
                continue
            models[name] = ensure_model(runner, workdir, name, dict(cfg["resnet18"], batch=b),
                                        regenerate)
    return models


# --- measuring child processes ------------------------------------------------

# The no-fold baseline of the fold section: the least a tool that reads and
# writes the module has to do: the fastest round trip jaxlib allows.
# bnfold/__init__ is not executed (bnfold.ir and bnfold.errors are loaded from
# the package directory), so this pays for jaxlib, the context,
# `ir.Module.parseFile` (MLIR reads the file, no copy in Python) and a print
# (or bytecode write) streamed straight to the file, and nothing else.
BASELINE = r"""
import importlib.util, os, sys, types
_spec = importlib.util.find_spec("bnfold")
_pkg = types.ModuleType("bnfold")
_pkg.__path__ = list(_spec.submodule_search_locations)
sys.modules["bnfold"] = _pkg
from bnfold.ir import ir, make_context
fmt, src, dst = sys.argv[1:4]
context = make_context()
with context:
    module = ir.Module.parseFile(src)  # MLIR reads the file itself: text or bytecode
tmp = dst + ".tmp"
with open(tmp, "wb") as f:
    if fmt == "bytecode":
        module.operation.write_bytecode(f)
    else:
        module.operation.print(file=f, binary=True, assume_verified=True)
os.replace(tmp, dst)
assert "bnfold.pipeline" not in sys.modules
"""


# The least work any fold must do (issue 35's "floor"): the round trip above, plus every
# constant kernel of a convolution or dot_general read, multiplied in float64 by a
# per-output-channel vector (the last axis: the cost does not depend on which), rounded
# once to its type into a new attribute that replaces the old one. No analysis, no checks.
FLOOR = BASELINE.replace("""tmp = dst + ".tmp"
""", """import numpy as np
from bnfold import elements
LINEAR = ("stablehlo.convolution", "stablehlo.dot_general")
with context, ir.Location.unknown():
    def scale(op):
        if op.name in LINEAR:
            kernel = op.operands[1].owner
            if getattr(kernel, "name", "") == "stablehlo.constant":
                w = elements.read_native(kernel.attributes["value"])
                ty = kernel.results[0].type
                s = np.linspace(0.5, 1.5, w.shape[-1]) if w.ndim else 1.0
                element = ir.RankedTensorType(ty).element_type
                kernel.attributes["value"] = elements.dense_attr(w.astype(np.float64) * s, element)
        return ir.WalkResult.ADVANCE
    module.operation.walk(scale)
tmp = dst + ".tmp"
""")
assert FLOOR != BASELINE


@dataclass
class Sample:
    wall: float
    cpu: float
    maxrss: int  # bytes


def run_measured(cmd: list[str], env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> Sample:
    """Runs `cmd`; wall time, CPU time and peak RSS of exactly that child (os.wait4).

    Linux folds the peak RSS of the address space a process had before execve
    into its ru_maxrss, and subprocess forks with vfork, whose pre-exec address
    space is this process's: the child's ru_maxrss is max(this process's peak,
    the child's own peak). So this process never imports jax or loads a model
    (generation, graph counts and inference run in children), and the memory
    section checks that the children's peaks exceed this process's peak.
    """
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"command failed with exit status {proc.returncode}: "
                               f"{shlex.join(cmd)}\n{err.read().decode(errors='replace')[-3000:]}")
    # ru_maxrss is in kilobytes on Linux.
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)


def own_peak_rss() -> int:
    """This process's peak RSS in bytes (VmHWM), 0 if unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def paired(base: list[float], cand: list[float]) -> dict[str, Any]:
    ratios = [c / b for b, c in zip(base, cand)]
    return {
        "baseline_median": statistics.median(base),
        "candidate_median": statistics.median(cand),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_of_medians": statistics.median(cand) / statistics.median(base),
        "baseline_samples": base,
        "candidate_samples": cand,
    }


class Runner:
    def __init__(self, repeat: int, scratch: Path) -> None:
        self.repeat = repeat
        self.scratch = scratch
        self._cli_runs: dict[tuple[str, str], tuple[list[Sample], list[Sample]]] = {}
        self.commands: dict[str, dict[str, str]] = {}

    def cli_pairs(self, model: Model, fmt: str) -> tuple[list[Sample], list[Sample]]:
        """(baseline samples, bnfold samples) of whole-process runs, interleaved."""
        return self.path_pairs(model.name, model.text if fmt == "mlir" else model.bytecode, fmt)

    def path_pairs(self, name: str, src: Path, fmt: str, baseline: str = BASELINE
                   ) -> tuple[list[Sample], list[Sample]]:
        """Like `cli_pairs`, for any module file; `baseline` is the script bnfold is paired
        with (the round trip, or `FLOOR`)."""
        key = (name, fmt) if baseline == BASELINE else (name, fmt, "floor")
        if key in self._cli_runs:
            return self._cli_runs[key]
        ext = ".mlir" if fmt == "mlir" else ".mlirbc"
        base_out, cli_out = self.scratch / f"base{ext}", self.scratch / f"folded{ext}"
        base_cmd = [sys.executable, "-c", baseline, "bytecode" if fmt != "mlir" else "mlir",
                    str(src), str(base_out)]
        cli_cmd = [sys.executable, "-m", "bnfold", "-q", str(src), "-o", str(cli_out)]
        if fmt != "mlir":
            cli_cmd += ["--emit", "bytecode"]
        log(f"fold {name} {fmt}{' against the floor' if baseline != BASELINE else ''}: "
            f"warm-up, then {self.repeat} interleaved pairs")
        run_measured(base_cmd)
        run_measured(cli_cmd)
        base, cand = [], []
        for i in range(self.repeat):
            base.append(run_measured(base_cmd))
            cand.append(run_measured(cli_cmd))
            log(f"  pair {i + 1}/{self.repeat}: baseline {base[-1].wall:.2f} s, "
                f"bnfold {cand[-1].wall:.2f} s")
        for path in (base_out, cli_out):
            path.unlink(missing_ok=True)
        self._cli_runs[key] = (base, cand)
        if baseline != BASELINE:
            return base, cand
        self.commands[fmt] = {"baseline": shlex.join(base_cmd[:2] + ["$BASELINE"] + base_cmd[3:]),
                              "bnfold": shlex.join(cli_cmd)}
        return base, cand

    def child(self, kind: str, payload: dict[str, Any],
              env: dict[str, str] | None = None) -> dict[str, Any]:
        """Runs a measurement in a fresh process of this script; returns its JSON result."""
        request = self.scratch / f"{kind}-{os.getpid()}-{time.monotonic_ns()}.json"
        request.write_text(json.dumps(payload))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", kind,
               "--_payload", str(request)]
        proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=None, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} child failed with exit status {proc.returncode}: "
                               f"{shlex.join(cmd)}")
        result_path = Path(str(request) + ".out")
        result = json.loads(result_path.read_text())
        request.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)
        return result


# --- sections ------------------------------------------------------------------


def section_fold(runner: Runner, models: dict[str, Model]) -> dict[str, Any]:
    model = models["resnet50"]
    out: dict[str, Any] = {"model": model.name, "baseline_snippet": BASELINE,
                           "floor_snippet": FLOOR}
    for fmt, key in (("mlir", "text"), ("bytecode", "bytecode")):
        base, cand = runner.cli_pairs(model, fmt)
        low, again = runner.path_pairs(model.name, model.text if fmt == "mlir" else
                                       model.bytecode, fmt, FLOOR)
        # "wall" and "cpu" against the round trip; the target holds against the floor.
        out[key] = {"wall": paired([s.wall for s in base], [s.wall for s in cand]),
                    "cpu": paired([s.cpu for s in base], [s.cpu for s in cand]),
                    "floor": {"wall": paired([s.wall for s in low], [s.wall for s in again]),
                              "cpu": paired([s.cpu for s in low], [s.cpu for s in again])},
                    "target": TARGETS[f"fold_{key}"], "commands": runner.commands[fmt]}
    if "separable" in models:
        sep = models["separable"]
        base, cand = runner.cli_pairs(sep, "mlir")
        out["separable_text"] = {"wall": paired([s.wall for s in base], [s.wall for s in cand]),
                                 "cpu": paired([s.cpu for s in base], [s.cpu for s in cand]),
                                 "target": TARGETS["fold_separable_text"],
                                 "model": sep.name}
    return out


def section_models(runner: Runner, size: str) -> dict[str, Any]:
    """Fold / round-trip ratio (text, whole process) for every model in testdata/models."""
    rows = []
    paths = sorted((REPO_ROOT / "testdata" / "models").glob("*.mlir"))
    for path in paths[:SIZES[size].get("models_limit")]:
        base, cand = runner.path_pairs(path.stem, path, "mlir")
        wall = paired([s.wall for s in base], [s.wall for s in cand])
        rows.append({"model": path.name, "bytes": path.stat().st_size, "wall": wall})
    return {"rows": rows}


def section_memory(runner: Runner, models: dict[str, Model]) -> dict[str, Any]:
    model = models["resnet50"]
    base, cand = runner.cli_pairs(model, "mlir")
    size = model.info["text_bytes"]
    cli_rss = statistics.median(s.maxrss for s in cand)
    base_rss = statistics.median(s.maxrss for s in base)
    parent = own_peak_rss()
    valid = min(s.maxrss for s in base + cand) > parent
    if not valid:
        log(f"memory: WARNING: a child's peak RSS does not exceed the orchestrator's "
            f"({parent / 1e6:.0f} MB); the figures are upper bounds")
    return {
        "model": model.name,
        "valid": valid,
        "orchestrator_peak_rss": parent,
        "module_bytes": size,
        "bnfold_peak_rss": cli_rss,
        "bnfold_ratio": cli_rss / size,
        "rss_ratio": cli_rss / base_rss,
        "baseline_peak_rss": base_rss,
        "baseline_ratio": base_rss / size,
        "bnfold_samples": [s.maxrss for s in cand],
        "baseline_samples": [s.maxrss for s in base],
        "target": TARGETS["memory"],
    }


def section_scaling(runner: Runner, models: dict[str, Model], size: str) -> dict[str, Any]:
    stacks = [models[f"stack{n}"] for n in SIZES[size]["stacks"]]
    log(f"scaling: {runner.repeat} interleaved rounds over {[m.name for m in stacks]}")
    result = runner.child("scaling", {"repeat": runner.repeat,
                                      "models": [[m.info["conv_bn_layers"], str(m.text)]
                                                 for m in stacks]})
    rows = []
    for n, samples, folds, inner in result["rows"]:
        med = statistics.median(samples)
        rows.append({"layers": n, "folds": folds, "folds_per_sample": inner,
                     "fold_median_s": med, "per_layer_s": med / n, "samples": samples})
    per_layer = [r["per_layer_s"] for r in rows]
    marginal = None
    if len(rows) >= 2:
        a, b = rows[-2], rows[-1]
        marginal = (b["fold_median_s"] - a["fold_median_s"]) / (b["layers"] - a["layers"])
    # Least-squares t(N) = fixed + per_layer * N over the medians.
    ns = [r["layers"] for r in rows]
    ts = [r["fold_median_s"] for r in rows]
    mean_n, mean_t = statistics.fmean(ns), statistics.fmean(ts)
    var_n = sum((n - mean_n) ** 2 for n in ns)
    slope = (sum((n - mean_n) * (t - mean_t) for n, t in zip(ns, ts)) / var_n
             if var_n else 0.0)
    return {"rows": rows, "ratio": max(per_layer) / min(per_layer),
            "marginal_per_layer_s": marginal,
            "fit": {"fixed_s": mean_t - slope * mean_n, "per_layer_s": slope},
            "target": TARGETS["scaling"]}


def section_graph(runner: Runner, models: dict[str, Model]) -> dict[str, Any]:
    names = [n for n in models if n == "resnet50" or n == "resnet18" or n.startswith("stack")]
    log(f"graph: counting ops of {names}")
    result = runner.child("graph", {"models": [[n, str(models[n].text)] for n in names]})
    return {"rows": result["rows"]}


def section_inference(runner: Runner, models: dict[str, Model], size: str) -> dict[str, Any]:
    batches = SIZES[size]["batches"]
    payload = {"repeat": runner.repeat, "models": [
        [b, str(models["resnet18" if b == 1 else f"resnet18_b{b}"].text),
         models["resnet18" if b == 1 else f"resnet18_b{b}"].info["input_shape"]]
        for b in batches]}
    out: dict[str, Any] = {"model": "resnet18", "settings": []}
    for label, flags in (("default", None), ("ynn fusion off", YNN_FLAGS)):
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if flags is not None:
            env["XLA_FLAGS"] = flags
        log(f"inference ({label}): compile once, {runner.repeat} interleaved rounds per batch")
        result = runner.child("inference", payload, env=env)
        out["settings"].append({"label": label, "xla_flags": flags or "", "rows": result["rows"]})
    return out


# --- comparing with a git ref ------------------------------------------------------

# The workloads of `--compare` (issue 35): (model, input format, label).
COMPARE_WORKLOADS = (
    ("separable", "mlir", "300 small conv+BN layers, text"),
    ("resnet50", "bytecode", "ResNet-50-shaped, bytecode in and out"),
    ("resnet50", "mlir", "ResNet-50-shaped, text"),
)


@dataclass
class Side:
    """One build of bnfold: the `python/` directory a process imports it from."""

    label: str
    python_dir: Path
    env: dict[str, str]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _side(label: str, python_dir: Path, scratch: Path) -> Side:
    """A side whose processes import bnfold from `python_dir` (first on PYTHONPATH: it
    wins over an editable install), with its bytecode caches written (as a wheel's are);
    checked by importing it."""
    import compileall

    compileall.compile_dir(str(python_dir / "bnfold"), quiet=1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(python_dir)] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    found = subprocess.run([sys.executable, "-c", "import bnfold; print(bnfold.__file__)"],
                           env=env, cwd=scratch, capture_output=True, text=True, check=False)
    if found.returncode != 0 or not Path(found.stdout.strip()).is_relative_to(python_dir):
        raise RuntimeError(f"{label}: bnfold does not import from {python_dir}: "
                           f"{found.stdout.strip()} {found.stderr[-2000:]}")
    return Side(label, python_dir, env)


def resolve_ref(ref: str) -> str:
    """The commit `ref` names in this repository; exits with a message if none."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"bench.py: --compare: {ref!r} is not a commit of {REPO_ROOT}") from None


def checkout_ref(commit: str, scratch: Path) -> Path:
    """`commit`'s `python/` tree extracted under `scratch` (git archive: the repository and
    its worktrees are not touched); returns that python directory."""
    import io
    import tarfile

    into = scratch / f"ref-{commit[:12]}"
    if not into.exists():
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar",
                                  commit, "python"], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
    return into / "python"


def section_compare(runner: Runner, models: dict[str, Model], ref: str,
                    commit: str) -> dict[str, Any]:
    """The working tree against `ref`: whole-process `python -m bnfold -q IN -o OUT` on the
    same input files (copied to the scratch directory, on /dev/shm where it exists), in
    pairs ref, new, ref, new, ... after one untimed warm-up of each; peak RSS per side."""
    ref_python = checkout_ref(commit, runner.scratch)
    new_label = "working tree"
    try:
        new_label += f" ({_git('describe', '--always', '--dirty')})"
    except (OSError, subprocess.CalledProcessError):
        pass
    sides = [_side(f"{ref} ({commit[:9]})", ref_python, runner.scratch),
             _side(new_label, REPO_ROOT / "python", runner.scratch)]
    rows = []
    for name, fmt, label in COMPARE_WORKLOADS:
        model = models[name]
        ext = ".mlir" if fmt == "mlir" else ".mlirbc"
        src = runner.scratch / f"input-{name}{ext}"
        if not src.exists():
            shutil.copyfile(model.text if fmt == "mlir" else model.bytecode, src)
        cmds, outs = [], []
        for i in range(len(sides)):
            out = runner.scratch / f"compare-{i}{ext}"
            cmd = [sys.executable, "-m", "bnfold", "-q", str(src), "-o", str(out)]
            if fmt != "mlir":
                cmd += ["--emit", "bytecode"]
            cmds.append(cmd)
            outs.append(out)
        log(f"compare {label}: warm-up, then {runner.repeat} pairs {ref} / working tree")
        for side, cmd in zip(sides, cmds):
            run_measured(cmd, side.env, runner.scratch)
        samples: list[list[Sample]] = [[], []]
        for i in range(runner.repeat):
            for side, cmd, got in zip(sides, cmds, samples):
                got.append(run_measured(cmd, side.env, runner.scratch))
            log(f"  pair {i + 1}/{runner.repeat}: {ref} {samples[0][-1].wall:.2f} s, "
                f"working tree {samples[1][-1].wall:.2f} s")
        # Compared in chunks: reading them whole would raise this process's peak RSS,
        # which later children inherit in their ru_maxrss (see run_measured).
        same = filecmp.cmp(outs[0], outs[1], shallow=False)
        for path in outs:
            path.unlink(missing_ok=True)
        rows.append({
            "workload": label, "model": name, "format": fmt, "same_output": same,
            "wall": paired([s.wall for s in samples[0]], [s.wall for s in samples[1]]),
            "cpu": paired([s.cpu for s in samples[0]], [s.cpu for s in samples[1]]),
            "ref_peak_rss": statistics.median(s.maxrss for s in samples[0]),
            "new_peak_rss": statistics.median(s.maxrss for s in samples[1]),
            "ref_rss_samples": [s.maxrss for s in samples[0]],
            "new_rss_samples": [s.maxrss for s in samples[1]],
            "commands": {"ref": shlex.join(cmds[0]), "new": shlex.join(cmds[1])},
        })
    parent = own_peak_rss()
    valid = all(min(r["ref_rss_samples"] + r["new_rss_samples"]) > parent for r in rows)
    return {"ref": ref, "commit": commit, "ref_label": sides[0].label,
            "new_label": sides[1].label, "rows": rows, "rss_valid": valid,
            "target": TARGETS["compare"]}


def render_compare(c: dict[str, Any], repeat: int) -> list[str]:
    lines = ["", f"## Compared with {c['ref']} ({c['commit'][:9]})", "",
             f"Whole process `python -m bnfold -q IN -o OUT`, new = {c['new_label']}, "
             f"{repeat} pairs ({c['ref']}, new, {c['ref']}, new, ...); ratio: median of the "
             f"per-pair new/ref wall-time ratios [min–max]; peak RSS: median ru_maxrss.", "",
             "| workload | ref | new | ratio (median, range) | CPU ratio | "
             "peak RSS new / ref | same output | result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in c["rows"]:
        w = r["wall"]
        lines.append(
            f"| {r['workload']} | {_t(w['baseline_median'])} | {_t(w['candidate_median'])} | "
            f"{w['ratio']:.3f}x [{w['ratio_min']:.2f}–{w['ratio_max']:.2f}] | "
            f"{r['cpu']['ratio']:.3f}x | {r['new_peak_rss'] / 2**20:.0f} / "
            f"{r['ref_peak_rss'] / 2**20:.0f} MiB | {'yes' if r['same_output'] else 'no'} | "
            f"{_target(w['ratio'], c['target'])} |")
    if not c["rss_valid"]:
        lines += ["", "**WARNING: a peak RSS is not above the orchestrating process's own; "
                  "those figures are upper bounds.**"]
    return lines



# --- children (fresh processes) -------------------------------------------------


def child_scaling(payload: dict[str, Any]) -> dict[str, Any]:
    import bnfold
    from bnfold import ir as bir

    texts = [(n, Path(p).read_bytes()) for n, p in payload["models"]]

    def fold_once(text: bytes) -> tuple[float, int]:
        context = bir.make_context()
        module = bir.parse(text, context)
        gc.collect()
        with context:
            start = time.perf_counter()
            report = bnfold.fold_module(module)
            elapsed = time.perf_counter() - start
        return elapsed, len(report.folds)

    for _, text in texts:  # warm-up: lazy imports, first-use costs
        fold_once(text)
    # Small stacks fold several times per sample (each on a fresh parse), so
    # every sample covers about as many layers, and as much wall time, as the
    # largest stack: equal exposure to the machine's noise, and resolution.
    largest = max(n for n, _ in texts)
    inner = {n: max(1, min(100, largest // n)) for n, _ in texts}
    samples: dict[int, list[float]] = {n: [] for n, _ in texts}
    folds: dict[int, int] = {}
    for i in range(payload["repeat"]):
        order = texts if i % 2 == 0 else texts[::-1]  # no position bias within a round
        for n, text in order:
            total = 0.0
            for _ in range(inner[n]):
                elapsed, folds[n] = fold_once(text)
                total += elapsed
            samples[n].append(total / inner[n])
    for n, _ in texts:
        if folds[n] != n:
            raise RuntimeError(f"stack of {n} layers: bnfold folded {folds[n]} normalizations")
    return {"rows": [[n, samples[n], folds[n], inner[n]] for n, _ in texts]}


def _count_ops(module: Any) -> dict[str, int]:
    from bnfold import ir as bir

    counts = {"total": 0, "elementwise": 0, "constants": 0, "convolutions": 0}

    def visit(op: Any) -> Any:
        name = op.name
        if name not in ("builtin.module", "func.func", "func.return"):
            counts["total"] += 1
        if name in ELEMENTWISE:
            counts["elementwise"] += 1
        elif name == "stablehlo.constant":
            counts["constants"] += 1
        elif name == "stablehlo.convolution":
            counts["convolutions"] += 1
        return bir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


def child_graph(payload: dict[str, Any]) -> dict[str, Any]:
    import bnfold
    from bnfold import ir as bir

    rows = []
    for name, path in payload["models"]:
        context = bir.make_context()
        module = bir.parse(Path(path).read_bytes(), context)
        with context:
            before = _count_ops(module)
            report = bnfold.fold_module(module)
            after = _count_ops(module)
        rows.append({"model": name, "before": before, "after": after,
                     "folds": len(report.folds), "skipped": len(report.skipped)})
        del module, context
    return {"rows": rows}


class _Executables:
    """Modules compiled once on XLA CPU (the compile-once / execute pattern of
    bnfold.ir.xla_cpu_run, with the executables kept so only execution is
    timed), run interleaved on one input."""

    def __init__(self, modules: dict[str, str], x: Any) -> None:
        import jax
        import jax.extend
        from jax._src.lib import xla_client as xc

        backend = jax.extend.backend.get_backend("cpu")
        device = backend.devices()[0]
        self.exes: dict[str, Any] = {}
        self.compile_s: dict[str, float] = {}
        for label, module in modules.items():
            start = time.perf_counter()
            self.exes[label] = backend.compile_and_load(module, xc.DeviceList((device,)),
                                                        xc.CompileOptions())
            self.compile_s[label] = time.perf_counter() - start
        self.x = jax.device_put(x, device)

    def run(self, label: str) -> Any:
        import jax

        outs = self.exes[label].execute_sharded([self.x]).disassemble_into_single_device_arrays()
        return jax.block_until_ready([o[0] for o in outs])[0]

    def rel_err(self, label: str, reference: str) -> float:
        import numpy as np

        ref = np.asarray(self.run(reference), np.float64)
        got = np.asarray(self.run(label), np.float64)
        return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))

    def time(self, repeat: int) -> tuple[dict[str, list[float]], int]:
        """Per-label samples (seconds per run), and the inner loop length."""
        start = time.perf_counter()
        for _ in range(2):  # warm-up, and an inner loop long enough (~0.3 s) for a stable sample
            for label in self.exes:
                self.run(label)
        one = (time.perf_counter() - start) / (2 * len(self.exes))
        inner = max(1, min(100, math.ceil(0.3 / max(one, 1e-6))))
        samples: dict[str, list[float]] = {label: [] for label in self.exes}
        for _ in range(repeat):
            for label in self.exes:
                start = time.perf_counter()
                for _ in range(inner):
                    self.run(label)
                samples[label].append((time.perf_counter() - start) / inner)
        return samples, inner


def child_inference(payload: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    import bnfold

    rows = []
    for batch, path, shape in payload["models"]:
        text = Path(path).read_text()
        folded, report = bnfold.fold_text(text)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        exes = _Executables({"unfolded": text, "folded": folded}, x)
        rel_err = exes.rel_err("folded", "unfolded")
        samples, inner = exes.time(payload["repeat"])
        stats = paired(samples["unfolded"], samples["folded"])
        rows.append({"batch": batch, "folds": len(report.folds), "inner": inner,
                     "rel_err": rel_err, "compile_s": exes.compile_s, **stats})
    return {"rows": rows, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def _stems() -> dict[str, tuple[Any, Any, bool]]:
    """name: (jax function of an NHWC image, kernel, whether the shift is uniform)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], np.float32) * 255
    k7 = rng.normal(0, 0.1, (7, 7, 3, 64)).astype(np.float32)
    k3 = rng.normal(0, 0.1, (3, 3, 3, 16)).astype(np.float32)

    def conv(v: Any, k: Any, pad: Any) -> Any:
        return jax.lax.conv_general_dilated(v, k, (2, 2), pad,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    return {
        "torchvision 7x7/2 (x - mean) / std": (
            lambda v: conv((v - mean) / std, k7, ((3, 3), (3, 3))), k7, False),
        "keras 3x3/2 SAME Rescaling(1/127.5, -1)": (
            lambda v: conv(v * (1 / 127.5) - 1.0, k3, "SAME"), k3, True),
    }


def child_stem(payload: dict[str, Any]) -> dict[str, Any]:
    import jax
    import numpy as np

    import bnfold

    rows = []
    for name, (fn, _, uniform) in _stems().items():
        for batch in payload["batches"]:
            hw = payload["hw"]
            x = np.random.default_rng(1).uniform(0, 255, (batch, hw, hw, 3)).astype(np.float32)
            text = jax.jit(fn).lower(x).as_text()
            modules = {"original": text}
            folded, report = bnfold.fold_text(text)
            if len(report.folds) != 1 or report.folds[0].note is None or \
                    "border correction" not in report.folds[0].note:
                raise RuntimeError(f"{name}: expected one fold with a border correction, got "
                                   f"{report.to_json()}")
            modules["border correction"] = folded
            if uniform:
                padded, _ = bnfold.fold_text(text, options=bnfold.FoldOptions(pad_uniform_shift=True))
                modules["explicit pad"] = padded
            exes = _Executables(modules, x)
            samples, inner = exes.time(payload["repeat"])
            for label in modules:
                if label == "original":
                    continue
                rows.append({"stem": name, "batch": batch, "form": label, "inner": inner,
                             "rel_err": exes.rel_err(label, "original"),
                             **paired(samples["original"], samples[label])})
    return {"rows": rows, "hw": payload["hw"]}


def section_stem(runner: Runner, size: str) -> dict[str, Any]:
    log(f"stem: compile once, {runner.repeat} interleaved rounds per stem and batch")
    return runner.child("stem", {"repeat": runner.repeat, "batches": SIZES[size]["batches"],
                                 "hw": SIZES[size]["stem_hw"]})


CHILDREN = {"generate": child_generate, "scaling": child_scaling, "graph": child_graph,
            "inference": child_inference, "stem": child_stem}


# --- report ----------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    commit = "?"
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": affinity,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "numpy": _version("numpy"),
        "bnfold": _version("bnfold"),
        "bnfold_commit": commit,
        "platform": platform.platform(),
    }


def _target(value: float, limit: float) -> str:
    if value <= limit:
        return "met"
    return f"**MISSED** by {value - limit:.2f}x ({100 * (value / limit - 1):.0f}% over)"


def _t(seconds: float) -> str:
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def render(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# bnfold benchmark",
        "",
        f"Command: `{data['command']}`  ",
        f"Size: {data['size']}, repeat: {data['repeat']} (medians; ratios are medians of "
        f"interleaved per-pair ratios, [min–max] of the pairs)",
        "",
        "## Machine",
        "",
        "| CPU | cores (usable) | load avg at start | python | jax / jaxlib | numpy | bnfold |",
        "|---|---|---|---|---|---|---|",
        f"| {m['cpu']} | {m['cores']} ({m['usable_cores']}) | "
        f"{' '.join(map(str, m['load_average_at_start']))} | {m['python']} | "
        f"{m['jax']} / {m['jaxlib']} | {m['numpy']} | {m['bnfold']} ({m['bnfold_commit']}) |",
        "",
        "## Models",
        "",
        "| model | input | conv+BN layers | params | text | bytecode |",
        "|---|---|---|---|---|---|",
    ]
    for name, info in data["models"].items():
        lines.append(f"| {name} | {'x'.join(map(str, info['input_shape']))} | "
                     f"{info['conv_bn_layers']} | {info['params'] / 1e6:.2f}M | "
                     f"{_mb(info['text_bytes'])} | {_mb(info['bytecode_bytes'])} |")
    if "fold" in data:
        f = data["fold"]
        lines += ["", f"## Fold cost (whole process, {f['model']})", "",
                  "| conversion | baseline | baseline time | bnfold | wall ratio [range] | "
                  "target | CPU ratio | result |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, label in (("text", "text → text"), ("bytecode", "bytecode → bytecode")):
            r = f[key]
            w = r["wall"]
            lines.append(
                f"| {label} | round trip | {_t(w['baseline_median'])} | "
                f"{_t(w['candidate_median'])} | "
                f"{w['ratio']:.3f}x [{w['ratio_min']:.2f}–{w['ratio_max']:.2f}] | - | "
                f"{r['cpu']['ratio']:.3f}x | |")
            if "floor" in r:
                w = r["floor"]["wall"]
                lines.append(
                    f"| {label} | floor | {_t(w['baseline_median'])} | "
                    f"{_t(w['candidate_median'])} | "
                    f"{w['ratio']:.3f}x [{w['ratio_min']:.2f}–{w['ratio_max']:.2f}] | "
                    f"≤ {r['target']:.2f}x | {r['floor']['cpu']['ratio']:.3f}x | "
                    f"{_target(w['ratio'], r['target'])} |")
        if "separable_text" in f:
            r = f["separable_text"]
            w = r["wall"]
            lines.append(
                f"| text → text, {r['model']} | round trip | {_t(w['baseline_median'])} | "
                f"{_t(w['candidate_median'])} | {w['ratio']:.3f}x [{w['ratio_min']:.2f}–"
                f"{w['ratio_max']:.2f}] | ≤ {r['target']:.2f}x | {r['cpu']['ratio']:.3f}x | "
                f"{_target(w['ratio'], r['target'])} |")
        lines += ["", "Timed: `" + f["text"]["commands"]["bnfold"] + "` (and with `--emit "
                  "bytecode` on the bytecode input). Baseline: the fastest round trip, a `python "
                  "-c` process that imports jaxlib, builds `bnfold.ir.make_context()` (without "
                  "importing the bnfold pass), `ir.Module.parseFile` and a print (or bytecode "
                  "write) streamed to the output file. Floor (issue 35's least work any fold "
                  "must do): the round trip plus every constant convolution or dot_general "
                  "kernel read, multiplied in float64 by a per-channel vector and rounded once "
                  "into a new attribute (`FLOOR` in tools/bench.py); the ResNet-50 targets hold "
                  "against it, the 300-layer one against the round trip. CPU ratio: user + "
                  "system time."]
    if "scaling" in data:
        s = data["scaling"]
        lines += ["", "## Scaling (in-process `fold_module`, parse/print excluded)", "",
                  "| layers | folds | fold time | per layer | folds per sample |",
                  "|---|---|---|---|---|"]
        for r in s["rows"]:
            lines.append(f"| {r['layers']} | {r['folds']} | {_t(r['fold_median_s'])} | "
                         f"{_t(r['per_layer_s'])} | {r['folds_per_sample']} |")
        marginal = s["marginal_per_layer_s"]
        lines += ["", f"Max/min per-layer time: **{s['ratio']:.2f}x** (target ≤ "
                  f"{s['target']:.1f}x: {_target(s['ratio'], s['target'])})."
                  + (f" Marginal cost between the two largest stacks: {_t(marginal)} per "
                     f"layer." if marginal is not None else "")
                  + f" Least-squares fit: t(N) ≈ {_t(s['fit']['fixed_s'])} + "
                    f"{_t(s['fit']['per_layer_s'])} · N."]
    if "memory" in data:
        mem = data["memory"]
        lines += ["", f"## Memory (text → text, {mem['model']})", "",
                  "| process | peak RSS | / module size | / round trip | target | result |",
                  "|---|---|---|---|---|---|",
                  f"| bnfold CLI | {_mb(mem['bnfold_peak_rss'])} | {mem['bnfold_ratio']:.2f}x | "
                  f"{mem['rss_ratio']:.2f}x | ≤ {mem['target']:.2f}x | "
                  f"{_target(mem['rss_ratio'], mem['target'])} |",
                  f"| round trip (parse + print) | {_mb(mem['baseline_peak_rss'])} | "
                  f"{mem['baseline_ratio']:.2f}x | 1.00x | | |",
                  "", f"Module size on disk: {_mb(mem['module_bytes'])}. Peak RSS: ru_maxrss of "
                  f"each child (os.wait4), median of the interleaved text → text runs."
                  + ("" if mem["valid"] else " **WARNING: not above the orchestrating "
                     "process's own peak RSS; these are upper bounds.**")]
    if "graph" in data:
        lines += ["", "## Graph size (ops before → after folding)", "",
                  "| model | folds | convolutions | ops | elementwise | constants |",
                  "|---|---|---|---|---|---|"]
        for r in data["graph"]["rows"]:
            b, a = r["before"], r["after"]
            lines.append(f"| {r['model']} | {r['folds']} | {a['convolutions']} | "
                         f"{b['total']} → {a['total']} | {b['elementwise']} → "
                         f"{a['elementwise']} | {b['constants']} → {a['constants']} |")
        lines += ["", "Elementwise: add, subtract, multiply, divide, rsqrt, sqrt, negate, "
                  "broadcast_in_dim. Ops exclude module, func.func and func.return."]
    if "models_ratio" in data:
        lines += ["", "## Real exports (testdata/models, text → text, whole process)", "",
                  "| model | size | round trip | bnfold | ratio [range] |", "|---|---|---|---|---|"]
        for r in data["models_ratio"]["rows"]:
            w = r["wall"]
            lines.append(f"| {r['model']} | {_mb(r['bytes'])} | {_t(w['baseline_median'])} | "
                         f"{_t(w['candidate_median'])} | {w['ratio']:.3f}x "
                         f"[{w['ratio_min']:.2f}–{w['ratio_max']:.2f}] |")
    if "inference" in data:
        inf = data["inference"]
        lines += ["", f"## Inference (XLA CPU, {inf['model']}, compiled once, execution only)",
                  "", "| XLA_FLAGS | batch | unfolded | folded | folded/unfolded [range] | "
                  "max rel. diff |", "|---|---|---|---|---|---|"]
        for setting in inf["settings"]:
            for r in setting["rows"]:
                lines.append(
                    f"| {'`' + setting['xla_flags'] + '`' if setting['xla_flags'] else '(default)'}"
                    f" | {r['batch']} | {_t(r['baseline_median'])} | "
                    f"{_t(r['candidate_median'])} | {r['ratio']:.3f}x "
                    f"[{r['ratio_min']:.2f}–{r['ratio_max']:.2f}] | {r['rel_err']:.1e} |")
        lines += ["", "No target. Each flag setting runs in its own process; each sample "
                  "averages an inner loop of ≥ 0.3 s; max rel. diff compares the "
                  "folded output with the unfolded one."]
    if "stem" in data:
        lines += ["", f"## Folded stems (XLA CPU, {data['stem']['hw']}x{data['stem']['hw']} input, "
                  "compiled once, execution only)",
                  "", "| stem | batch | form | original | folded | folded/original [range] | "
                  "max rel. diff |", "|---|---|---|---|---|---|---|"]
        for r in data["stem"]["rows"]:
            lines.append(f"| {r['stem']} | {r['batch']} | {r['form']} | "
                         f"{_t(r['baseline_median'])} | {_t(r['candidate_median'])} | "
                         f"{r['ratio']:.3f}x [{r['ratio_min']:.2f}–{r['ratio_max']:.2f}] | "
                         f"{r['rel_err']:.1e} |")
        lines += ["", "No target. The input normalization folds into the convolution; "
                  "\"border correction\" is the default exact form, \"explicit pad\" the "
                  "`--pad-uniform-shift` form."]
    for c in data.get("compare", []):
        lines += render_compare(c, data["repeat"])
    return "\n".join(lines) + "\n"


# --- main --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="full",
                        help="full: ResNet-50/18 at 224x224, stacks of 10/100/1000 layers; "
                             "tiny: a 2-block resnet, stacks of 2/4/8 (for the smoke test)")
    parser.add_argument("--repeat", type=int, default=5, metavar="N",
                        help="timed repetitions per measurement (default: 5)")
    parser.add_argument("--only", metavar="SECTIONS",
                        help=f"comma-separated sections to run (default: all, or none with "
                             f"--compare): {','.join(SECTIONS)}")
    parser.add_argument("--compare", action="append", default=[], metavar="REF",
                        help="time the working tree against git ref REF (a commit of this "
                             "repository; repeatable), whole process, paired, on the "
                             "fold section's three workloads, with peak RSS")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="where generated models are cached (default: "
                             "$TMPDIR/bnfold-bench)")
    parser.add_argument("--regenerate", action="store_true",
                        help="regenerate the models even if cached")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write all results, with raw samples, as JSON")
    parser.add_argument("--downstream", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="run tools/downstream.py with the arguments after it instead "
                             "(original vs folded compiled on the local jax backend, kernels "
                             "and latency; see tools/downstream.py --help)")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_payload", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.only is None:
        args.only = "" if args.compare else ",".join(SECTIONS)
        only = [] if args.compare else list(SECTIONS)
    else:
        only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown or not (only or args.compare):
        parser.error(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                     f"known: {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in only]
    return args


def compile_sources() -> None:
    """Writes bnfold's bytecode caches, as installing a wheel does.

    An editable install under PYTHONDONTWRITEBYTECODE=1 (this sandbox, CI)
    never writes them, so every timed process would compile bnfold's sources
    again: about 40 ms per process on this machine, charged to bnfold only
    (the baseline imports jaxlib, whose caches were written at install)."""
    import compileall

    compileall.compile_dir(str(REPO_ROOT / "python" / "bnfold"), quiet=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.downstream is not None:
        import downstream  # tools/ is on sys.path when this runs as a script

        return downstream.main(args.downstream)
    if args._child:
        payload = json.loads(Path(args._payload).read_text())
        result = CHILDREN[args._child](payload)
        Path(args._payload + ".out").write_text(json.dumps(result))
        return 0

    command = shlex.join([sys.executable, *sys.argv])
    refs = [(ref, resolve_ref(ref)) for ref in args.compare]
    compile_sources()
    machine = machine_info()
    workdir = args.workdir or Path(tempfile.gettempdir()) / "bnfold-bench"
    workdir.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix="bnfold-bench-",
                                    dir=shm if shm.is_dir() and os.access(shm, os.W_OK)
                                    else workdir))
    runner = Runner(args.repeat, scratch)
    data: dict[str, Any] = {"command": command, "size": args.size, "repeat": args.repeat,
                            "sections": args.sections, "machine": machine}
    try:
        models = build_models(runner, args.size, workdir,
                              set(args.sections) | ({"compare"} if args.compare else set()),
                              args.regenerate)
        data["models"] = {n: m.info for n, m in models.items()}
        for section in args.sections:
            if section == "fold":
                data["fold"] = section_fold(runner, models)
            elif section == "scaling":
                data["scaling"] = section_scaling(runner, models, args.size)
            elif section == "memory":
                data["memory"] = section_memory(runner, models)
            elif section == "graph":
                data["graph"] = section_graph(runner, models)
            elif section == "models":
                data["models_ratio"] = section_models(runner, args.size)
            elif section == "inference":
                data["inference"] = section_inference(runner, models, args.size)
            elif section == "stem":
                data["stem"] = section_stem(runner, args.size)
        if args.compare:
            data["compare"] = [section_compare(runner, models, ref, commit)
                               for ref, commit in refs]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    data["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    sys.stdout.write(render(data))
    sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
