#!/usr/bin/env python3
"""Downstream benchmark: what folding buys the compiler that runs the model.

For each model (generated ResNet-shaped exports, or any StableHLO files given), this

1. folds it with bnfold's library API (`bnfold.fold_source`);
2. lifts the weights of the original and of the folded module into arguments of
   `@main`: floating-point, non-splat `stablehlo.constant`s in `@main`'s body become
   new trailing arguments of the same types, fed with the constants' own values, so
   XLA cannot constant-fold or specialize on them and the outputs stay comparable (the
   max relative error of folded against original is reported). Which constants
   (--lift): `kernels` (default), those with two or more dimensions above 1
   (convolution kernels, dense matrices), so per-channel vectors stay constants and XLA
   folds the original's `rsqrt(var + eps) * gamma` at compile time, as it does for an
   export with its weights inside; `all`, every one of two or more elements, as a
   deployment that passes all its parameters runs (the original then computes its
   batch-norm vectors on every call); `none`, the modules as they are. Splats (eps,
   zeros, the -inf of a max pool) and integer constants always stay;
3. compiles both on the local jax backend (the GPU where one is present; --platform
   picks one) and counts the kernels of the optimized HLO (what
   `jax.stages.Compiled.as_text()` prints; --keep-hlo writes it): fusions, custom-calls (cuDNN convolutions,
   cuBLAS gemms, oneDNN ops) and every other instruction that launches work, in the
   entry computation and the computations it `call`s (XLA GPU outlines command
   buffers that way), never inside a fusion;
4. times them alternating after two untimed runs of each: --rounds rounds (5), each
   runs the original --runs times (30 on an accelerator; on CPU enough for about
   0.5 s) back to back and then blocks until all are ready, then the folded the same
   way (the order flips every round); a round's sample is its time per run. The ratio
   is the median of the per-round folded/original ratios, with their range.

tools/gpu_check.sh runs this on a GPU machine in one go (ResNet-50-shaped, batch 1
and 32, f32 and bf16).

Models (--models, generated with plain jax, no framework needed; --size tiny for a
smoke test): resnet50 and resnet18 backbones (the ResNet-50/18 shapes of
tools/bench.py: 7x7/2 stem, max pool, bottleneck or basic blocks with projection
shortcuts, global average pool) with Flax-style decomposed inference batch norms
`(y - mean) * (rsqrt(var + eps) * gamma) + beta` and random statistics, at every
--batch and --dtype (f32, bf16: weights, activations and batch norm in that type).
Files given on the command line are taken as they are (batch and dtype read from
`@main`'s first argument); tools/export_testdata.py --downstream writes
real-framework exports at 224x224.

Usage:
    python tools/downstream.py                          # resnet50 + resnet18, batch 1 and 8 (32 on a GPU), f32
    python tools/downstream.py --batch 1,32 --dtype f32,bf16 --models resnet50
    python tools/downstream.py model.mlir other.mlir --json downstream.json
    python tools/bench.py --downstream ...              # the same (everything after it comes here)
    python tools/downstream.py --size tiny --rounds 2 --runs 2   # seconds; the smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform as platform_module
import re
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
GENERATOR_VERSION = 1  # bump when the generated modules change

ARCHITECTURES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "resnet50": {"block": "bottleneck", "hw": 224, "stem": 64,
                     "widths": [64, 128, 256, 512], "blocks": [3, 4, 6, 3]},
        "resnet18": {"block": "basic", "hw": 224, "stem": 64,
                     "widths": [64, 128, 256, 512], "blocks": [2, 2, 2, 2]},
    },
    "tiny": {
        "resnet50": {"block": "bottleneck", "hw": 32, "stem": 8, "widths": [8, 16], "blocks": [1, 1]},
        "resnet18": {"block": "basic", "hw": 32, "stem": 8, "widths": [8, 16], "blocks": [1, 1]},
    },
}
DTYPES = ("f32", "bf16")

# HLO instructions that launch no kernel of their own.
NOT_KERNELS = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
    "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain",
})
# Instructions whose called computations run as separate kernels (not fused bodies).
CALLING = frozenset({"call", "while", "conditional", "async-start"})


def log(message: str) -> None:
    print(f"[downstream {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- models -------------------------------------------------------------------


def generate_resnet(arch: dict[str, Any], batch: int, dtype: str) -> str:
    """A ResNet backbone lowered with plain jax (parameters closed over, so they
    lower to constants and `@main` takes the image only), as StableHLO text: tools/bench.py's
    generator, in `dtype`, its weights drawn from `arch` alone (every batch the same)."""
    tools = str(Path(__file__).resolve().parent)
    if tools not in sys.path:  # loaded by path (the tests), not run from tools/
        sys.path.insert(0, tools)
    from bench import lower_model

    seed = zlib.crc32(json.dumps(arch, sort_keys=True).encode())
    text, _ = lower_model({"kind": "resnet", **arch, "batch": batch}, dtype, seed)
    return text


def model_label(name: str, size: str) -> str:
    hw = ARCHITECTURES[size][name]["hw"]
    pretty = {"resnet50": "ResNet-50", "resnet18": "ResNet-18"}[name]
    return f"jax {pretty}-shaped ({'tiny, ' if size == 'tiny' else ''}{hw}x{hw})"


def generated_model(workdir: Path, size: str, name: str, batch: int, dtype: str) -> Path:
    """The cached file of a generated model (generated on first use)."""
    import jax

    arch = ARCHITECTURES[size][name]
    key = json.dumps({"arch": arch, "batch": batch, "dtype": dtype, "gen": GENERATOR_VERSION,
                      "jax": jax.__version__}, sort_keys=True)
    path = workdir / f"{name}-{size}-b{batch}-{dtype}-{zlib.crc32(key.encode()):08x}.mlir"
    if not path.exists():
        start = time.perf_counter()
        text = generate_resnet(arch, batch, dtype)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
        log(f"generated {path.name} ({path.stat().st_size / 1e6:.1f} MB) in "
            f"{time.perf_counter() - start:.1f} s")
    return path


# --- weights into arguments ------------------------------------------------------


def lift_constants(module: Any, which: str) -> tuple[list[Any], int]:
    """Turns `@main`'s floating-point, non-splat constants (`which`: "kernels", those
    with two or more dimensions above 1; "all") into trailing arguments of the same
    type, in place; returns their values
    (in the order of the new arguments) and how many such constants other functions
    keep (they stay constants: inline those functions to lift them too).

        %k = stablehlo.constant dense<...> : tensor<3x3x8x8xf32>
        %y = stablehlo.convolution(%x, %k) ...
      ->
        func.func @main(%x: ..., %arg1: tensor<3x3x8x8xf32>) { %y = stablehlo.convolution(%x, %arg1) ...
    """
    import numpy as np

    from bnfold import elements, graph
    from bnfold import ir as bir

    ir = bir.ir
    main = graph.lookup_function(module, "main")
    if main is None:
        raise ValueError(f"no @main function (functions: {graph.function_list(module)})")
    block = main.regions[0].blocks[0]
    values: list[Any] = []
    with module.context, ir.Location.unknown():
        for op in list(block.operations):
            if not _liftable(op, which):
                continue
            values.append(np.array(elements.read_native(op.attributes["value"])))
            arg = block.add_argument(op.result.type, op.location)
            op.result.replace_all_uses_with(arg)
            op.erase()
        old = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in block.arguments], list(old.results)))
        if "arg_attrs" in main.attributes:
            attrs = list(ir.ArrayAttr(main.attributes["arg_attrs"]))
            attrs += [ir.DictAttr.get({})] * (len(block.arguments) - len(attrs))
            main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
        module.operation.verify()
    kept = sum(_count_liftable(function, which) for function in graph.functions(module)
               if graph.symbol_name(function) != "main")
    return values, kept


def _liftable(op: Any, which: str) -> bool:
    from bnfold import elements
    from bnfold import ir as bir

    ir = bir.ir
    if op.operation.name != "stablehlo.constant":
        return False
    ty = elements.ranked_type(op.result.type)
    if ty is None or not elements.is_float(ty.element_type):
        return False
    if sum(d > 1 for d in ty.shape) < (2 if which == "kernels" else 1):
        return False
    try:
        return not ir.DenseElementsAttr(op.attributes["value"]).is_splat
    except ValueError:  # dense_resource: never a splat
        return True


def _count_liftable(op: Any, which: str) -> int:
    return sum(_liftable(inner, which) + _count_liftable(inner, which)
               for region in op.regions for block in region.blocks for inner in block.operations)


# --- kernels in the optimized HLO ---------------------------------------------------

_COMPUTATION_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED_RE = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations|true_computation|false_computation)="
                        r"\{?(%?[\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?")


def _opcode(line: str) -> str | None:
    """The opcode of one HLO instruction line (`%name = TYPE opcode(...), ...`)."""
    _, sep, rest = line.partition(" = ")
    if not sep:
        return None
    rest = rest.lstrip()
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                rest = rest[i + 1:]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    match = re.match(r"\s*([a-z][\w\-]*)\(", rest)
    return match.group(1) if match else None


def count_kernels(hlo_text: str) -> dict[str, Any]:
    """Kernels of an optimized HLO module: fusions, custom-calls, and every other
    instruction that does work, in ENTRY and the computations reached through
    call/while/conditional/async-start (never inside fusions or reductions' bodies)."""
    computations: dict[str, list[str]] = {}
    entry = None
    current: list[str] | None = None
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if current is None:
            match = _COMPUTATION_RE.match(stripped)
            if match and not stripped.startswith("HloModule"):
                current = computations.setdefault(match.group(2), [])
                entry = match.group(2) if match.group(1) else entry
        elif stripped == "}":
            current = None
        elif stripped:
            current.append(stripped.removeprefix("ROOT "))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    by_opcode: dict[str, int] = {}
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for line in computations[name]:
            opcode = _opcode(line)
            if opcode is None or opcode in NOT_KERNELS:
                continue
            if opcode in CALLING:
                for group in _CALLED_RE.findall(line):
                    todo.extend(n.strip().lstrip("%") for n in group.split(","))
                continue
            by_opcode[opcode] = by_opcode.get(opcode, 0) + 1
    return {"fusions": by_opcode.get("fusion", 0), "custom_calls": by_opcode.get("custom-call", 0),
            "kernels": sum(by_opcode.values()), "by_opcode": dict(sorted(by_opcode.items()))}


# --- compile and time ------------------------------------------------------------------


@dataclass
class Executable:
    """One module compiled for one device, with its arguments on that device."""

    label: str
    exe: Any
    device: Any
    args: list[Any]
    compile_s: float
    kernels: dict[str, Any]
    hlo: str = field(repr=False)

    @classmethod
    def build(cls, label: str, module: bytes, inputs: list[Any], platform: str | None) -> Executable:
        import jax

        from bnfold import ir as bir

        start = time.perf_counter()
        exe, device = bir.xla_compile(module, platform)
        compile_s = time.perf_counter() - start
        hlo = optimized_hlo(exe)
        args = [jax.device_put(x, device) for x in inputs]
        return cls(label, exe, device, args, compile_s, count_kernels(hlo), hlo)

    def launch(self) -> Any:
        return self.exe.execute_sharded(self.args)

    def run(self) -> list[Any]:
        import jax

        outs = self.launch().disassemble_into_single_device_arrays()
        return jax.block_until_ready([o[0] for o in outs])

    def time(self, runs: int) -> float:
        """Seconds per run over `runs` back-to-back runs (one wait at the end)."""
        import jax

        start = time.perf_counter()
        pending = [self.launch() for _ in range(runs)]
        jax.block_until_ready([o[0] for p in pending
                               for o in p.disassemble_into_single_device_arrays()])
        return (time.perf_counter() - start) / runs


def optimized_hlo(exe: Any) -> str:
    """The optimized HLO text, as `jax.stages.Compiled.as_text()` gets it."""
    if hasattr(exe, "get_hlo_text"):
        return str(exe.get_hlo_text())
    return "\n\n".join(m.to_string() for m in exe.hlo_modules())


def time_alternating(original: Executable, folded: Executable, rounds: int,
                     runs: int) -> tuple[dict[str, list[float]], int]:
    """Per-round seconds per run of each (the order flips every round), and the runs per
    round (`runs`, or with 0 enough for about 0.5 s per round, at most 30)."""
    start = time.perf_counter()
    for _ in range(2):  # warm-up: first runs allocate and autotune
        original.run()
        folded.run()
    one = (time.perf_counter() - start) / 4
    runs = runs or max(1, min(30, math.ceil(0.5 / max(one, 1e-6))))
    samples: dict[str, list[float]] = {"original": [], "folded": []}
    for r in range(rounds):
        pair = (original, folded) if r % 2 == 0 else (folded, original)
        for exe in pair:
            samples[exe.label].append(exe.time(runs))
    return samples, runs


def rel_err(original: Executable, folded: Executable) -> float:
    import numpy as np

    ref = [np.asarray(o, np.float64) for o in original.run()]
    got = [np.asarray(o, np.float64) for o in folded.run()]
    scale = max(float(np.max(np.abs(r))) for r in ref) or 1.0
    return max(float(np.max(np.abs(g - r))) for r, g in zip(ref, got)) / scale


# --- one model ----------------------------------------------------------------------------


@dataclass
class Case:
    model: str
    path: Path


def device_name(device: Any) -> str:
    if device.platform == "cpu":
        return f"XLA CPU ({os.cpu_count()} cores)"
    return f"{device.device_kind} (XLA {device.platform.upper()})"


def input_of(module: Any) -> tuple[tuple[int, ...], Any, str]:
    """Shape, numpy dtype and short name of `@main`'s first argument."""
    from bnfold import elements, graph

    main = graph.lookup_function(module, "main")
    if main is None:
        raise ValueError("no @main function")
    args = main.regions[0].blocks[0].arguments
    if len(args) == 0:
        raise ValueError("@main takes no arguments")
    ty = elements.ranked_type(args[0].type)
    dtype = elements.numpy_dtype(ty.element_type) if ty is not None else None
    if ty is None or dtype is None or -1 in elements.shape_of(ty):
        raise ValueError(f"@main's first argument must be a static tensor, got {args[0].type}")
    return elements.shape_of(ty), dtype, str(ty.element_type)


def measure(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    import bnfold
    from bnfold import ir as bir

    start = time.perf_counter()
    data = case.path.read_bytes()
    folded = bnfold.fold_source(data, name=case.path.name)
    fold_s = time.perf_counter() - start
    original_module = bir.parse(data, bir.make_context(), name=case.path.name)
    del data
    shape, dtype, type_name = input_of(original_module)
    modules: dict[str, tuple[bytes, list[Any]]] = {}
    kept: dict[str, int] = {}
    for label, module, context in (("original", original_module, original_module.context),
                                   ("folded", folded.module, folded.context)):
        weights: list[Any] = []
        if args.lift != "none":
            weights, kept[label] = lift_constants(module, args.lift)
        with context:
            modules[label] = (bir.serialize(module, "bytecode"), weights)
    del original_module, folded.module
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    exes = {label: Executable.build(label, text, [x, *weights], args.platform)
            for label, (text, weights) in modules.items()}
    original, folded_exe = exes["original"], exes["folded"]
    err = rel_err(original, folded_exe)
    samples, runs = time_alternating(original, folded_exe, args.rounds, args.runs)
    ratios = [f / o for o, f in zip(samples["original"], samples["folded"])]
    if args.keep_hlo:
        for label, exe in exes.items():
            slug = re.sub(r"[^\w.-]+", "_", case.model).strip("_")
            (args.keep_hlo / f"{slug}-b{shape[0]}-{type_name}-{label}.hlo.txt").write_text(exe.hlo)
    device = original.device
    return {
        "model": case.model, "file": str(case.path), "batch": shape[0], "dtype": type_name,
        "input_shape": list(shape), "folds": len(folded.report.folds),
        "skipped": len(folded.report.skipped), "fold_s": round(fold_s, 3),
        "lift": args.lift,
        "lifted": {label: len(w) for label, (_, w) in modules.items()},
        "constants_left_in_other_functions": kept,
        "kernels": {label: {k: v for k, v in e.kernels.items()} for label, e in exes.items()},
        "compile_s": {label: round(e.compile_s, 3) for label, e in exes.items()},
        "rel_err": err,
        "rounds": args.rounds, "runs": runs, "samples": samples,
        "original_s": statistics.median(samples["original"]),
        "folded_s": statistics.median(samples["folded"]),
        "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "device": device_name(device),
    }


# --- report ----------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | batch | dtype | folds | fusions original -> folded | custom-calls | kernels "
        "| ms per run original -> folded | latency folded / original (range) | device |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        o, f = r["kernels"]["original"], r["kernels"]["folded"]
        model = r["model"] + ("" if r["lift"] == "kernels" else f" [lift {r['lift']}]")
        lines.append(
            f"| {model} | {r['batch']} | {r['dtype']} | {r['folds']} "
            f"| {o['fusions']} -> {f['fusions']} | {o['custom_calls']} -> {f['custom_calls']} "
            f"| {o['kernels']} -> {f['kernels']} | {_ms(r['original_s'])} -> {_ms(r['folded_s'])} "
            f"| {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) | {r['device']} |")
    return "\n".join(lines) + "\n"


def method(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    runs = sorted({r["runs"] for r in rows})
    weights = {"kernels": "kernels and dense matrices lifted into `@main` arguments (their own "
                          "values), per-channel vectors left constants",
               "all": "every non-splat float constant lifted into `@main` arguments (their "
                      "own values)",
               "none": "weights left as constants"}[args.lift]
    worst = max((r["rel_err"] for r in rows), default=0.0)
    return (f"{args.rounds} rounds of {'/'.join(map(str, runs))} back-to-back runs, alternating, "
            f"median of per-round ratios; {weights}; max relative error folded vs original "
            f"{worst:.1e}.\n")


# --- command line ----------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="downstream.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, metavar="FILE.mlir",
                        help="StableHLO modules (text or bytecode) to measure as they are")
    parser.add_argument("--models", default=None,
                        help="generated models, comma-separated (resnet50, resnet18; default: "
                             "both when no FILE is given, none otherwise)")
    parser.add_argument("--size", choices=sorted(ARCHITECTURES), default="full",
                        help="full: 224x224 ResNet-50/18; tiny: 32x32, two blocks (smoke test)")
    parser.add_argument("--batch", type=_int_list, default=None,
                        help="batch sizes of generated models (default: 1,32 on an accelerator, "
                             "1,8 on CPU)")
    parser.add_argument("--dtype", default="f32",
                        help=f"dtypes of generated models, comma-separated ({', '.join(DTYPES)})")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default: 5)")
    parser.add_argument("--runs", type=int, default=0,
                        help="back-to-back runs per round (default: 30 on an accelerator; on "
                             "CPU enough for about 0.5 s, at most 30)")
    parser.add_argument("--lift", choices=("kernels", "all", "none"), default="kernels",
                        help="which constants become arguments: kernels (two or more "
                             "dimensions above 1; default), all (non-splat floats), none")
    parser.add_argument("--platform", default=None,
                        help="jax backend (cpu, gpu, ...; default: jax's default backend)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="cache of generated models (default: $TMPDIR/bnfold-downstream)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write every row with its raw samples as JSON")
    parser.add_argument("--keep-hlo", type=Path, metavar="DIR",
                        help="write each optimized HLO module to DIR")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 0:
        parser.error("--rounds must be >= 1 and --runs >= 0")
    names = args.models.split(",") if args.models is not None else \
        ([] if args.files else ["resnet50", "resnet18"])
    args.model_names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in args.model_names if n not in ARCHITECTURES[args.size]]
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if unknown or bad or not dtypes:
        parser.error(f"unknown model(s) {unknown} (known: {', '.join(ARCHITECTURES[args.size])}) "
                     f"or dtype(s) {bad or dtypes} (known: {', '.join(DTYPES)})")
    args.dtypes = dtypes
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if not args.files and not args.model_names:
        parser.error("nothing to measure: give FILEs or --models")
    return args


def _default_platform(args: argparse.Namespace) -> str:
    import jax

    return jax.extend.backend.get_backend(args.platform).platform


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax.extend  # noqa: F401  (jax.extend.backend)

    on_cpu = _default_platform(args) == "cpu"
    batches = args.batch or ([1, 8] if on_cpu else [1, 32])
    workdir = args.workdir or Path(tempfile.gettempdir()) / "bnfold-downstream"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.keep_hlo:
        args.keep_hlo.mkdir(parents=True, exist_ok=True)
    cases = [Case(f.stem, f) for f in args.files]
    for name in args.model_names:
        for dtype in args.dtypes:
            for batch in batches:
                cases.append(Case(model_label(name, args.size),
                                  generated_model(workdir, args.size, name, batch, dtype)))
    if args.runs == 0 and not on_cpu:
        args.runs = 30
    rows = []
    for case in cases:
        log(f"measuring {case.model} ({case.path.name})")
        row = measure(case, args)
        log(f"{case.model} batch {row['batch']} {row['dtype']}: folded/original {row['ratio']:.3f}")
        rows.append(row)
    out = render(rows) + "\n" + method(args, rows)
    sys.stdout.write(out)
    sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join([sys.executable, *sys.argv]), "rows": rows,
            "jax": _versions(), "machine": platform_module.platform()}, indent=1))
    return 0


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("jax", "jaxlib", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


if __name__ == "__main__":
    sys.path.append(str(REPO_ROOT / "python"))  # this checkout's bnfold, unless one is importable
    sys.exit(main())
