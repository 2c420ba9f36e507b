"""Per-tensor int8 weights after folding: fold / --equalize / --absorb-high-bias, bnfold's
own --quantize-weights (with and without --bias-correction), and AIMET.

Fake-quantized rows: every convolution/dot_general kernel is fake-quantized per
tensor, symmetric int8 (scale = max|K| / 127, round to nearest) by this script,
and the model's output is compared with the float model: SQNR = 10 log10(sum
y^2 / sum (y_q - y)^2) dB. `--quantize-weights` rows run the module bnfold
wrote (integer constants dequantized in the graph, `--bias-correction`'s
corrected biases) as it is, on the same inputs; with bias correction off and
per tensor it holds the same weights as the fake-quantized `--equalize` /
fold module (up to the scale's rounding to f32), which the notes check.

Models (all torch, exported to StableHLO with torchax, so AIMET sees the
very same weights):

  mobilenet_v2   torchvision's MobileNetV2 (width 1.0, 96x96 inputs), random
                 init, batch-norm statistics calibrated on random inputs, then
                 the spread training produces: the gammas (and betas) of every
                 batch norm after a depthwise convolution are multiplied by
                 a ~ log-uniform[1e-3, 1] per channel and the next 1x1
                 convolution's input weights by 1/a (the float function is
                 unchanged except where ReLU6 saturates; reported).
  digits         a small MobileNetV2-style network (inverted residuals,
                 ReLU6) trained here (300 epochs, about a minute) on
                 scikit-learn's digits; accuracy on the held-out quarter is reported too.

bnfold side: `bnfold.fold_source` with FoldOptions(), (equalize=True),
(equalize=True, absorb_high_bias=True), and quantize_weights="int8" per tensor
after equalization and per channel with and without it, each with and without
bias_correction, run on XLA CPU. AIMET side (aimet-torch 2.42, optional):
`fold_all_batch_norms`, `CrossLayerScaling`, `HighBiasFold` on the torch model
as it is (ReLU6 kept), and again after swapping ReLU6 for ReLU (the paper's
recipe; that changes the float model, so its SQNR is against the original
float outputs).

AIMET's bias correction (`aimet_torch.bias_correction.correct_bias`, analytic
for the layers a batch norm feeds) was deprecated in aimet-torch 2.30.0 and
removed in 2.31.0, so 2.42 has none. With `--aimet-bc DIR`, where DIR holds
aimet-torch 2.30.0 (`pip install --no-deps --target DIR aimet-torch==2.30.0`),
a child process (same interpreter, DIR first on its path) runs it after the
same equalization: batch norms found before folding
(`find_all_conv_bn_with_activation`), `perform_only_empirical_bias_corr=False`,
per-tensor symmetric int8 weights (min-max, a quantsim config without
per-channel); the layers no batch norm feeds are left uncorrected (analytic
only, data-free like bnfold) or corrected empirically on calibration inputs
(AIMET's own mix). Those rows quantize the final weights with AIMET's quantizer,
the one the correction assumed (its symmetric int8 grid is [-128, 127] with
scale max(max / 127, -min / 128)), and say what the script's quantizer gives.
Without `--aimet-bc` the rows say why they are empty.

Needs torch 2.13 (CPU), torchax, torchvision, scikit-learn, optionally
aimet-torch; see docs/quantization.md "Results: per-tensor int8 weights". Usage:

    python tools/quant_bench.py [--out results.md] [--no-aimet] [--aimet-bc DIR] [--epochs 300]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the numerics harness

import numerics  # noqa: E402
from bnfold import elements, producers  # noqa: E402
from bnfold.graph import defining_op  # noqa: E402
from bnfold.ir import ir, make_context, parse, stablehlo  # noqa: E402
from bnfold.pipeline import FoldOptions, fold_source  # noqa: E402

_THROUGH = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert", "stablehlo.reverse",
            "stablehlo.broadcast_in_dim")


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# --- quantization and metrics ---------------------------------------------------------


def quantize_int8(w: np.ndarray) -> np.ndarray:
    """Per-tensor symmetric int8 fake quantization."""
    top = float(np.max(np.abs(w)))
    if top == 0:
        return w
    scale = top / 127.0
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(w.dtype)


def fake_quantize(text: str) -> str:
    """Every producer kernel's source constant, fake-quantized per tensor."""
    context = make_context()
    module = parse(text, context)
    with context, ir.Location.unknown():
        sources: dict[int, ir.Operation] = {}

        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if producers.is_producer(op):
                for operand in op.operands:
                    src = defining_op(operand)
                    while src is not None and src.name in _THROUGH:
                        src = defining_op(src.operands[0])
                    if src is not None and src.name == "stablehlo.constant" and \
                            np.prod(ir.RankedTensorType(src.results[0].type).shape) > 1:
                        sources[id(src)] = src
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for src in {id(s): s for s in sources.values()}.values():
            ty = ir.RankedTensorType(src.results[0].type)
            values = elements.read_native(src.attributes["value"])
            new = stablehlo.ConstantOp(elements.dense_attr(quantize_int8(values), ty.element_type),
                                       ip=ir.InsertionPoint(src))
            src.results[0].replace_all_uses_with(new.result)
        return str(module)


def sqnr(reference: np.ndarray, actual: np.ndarray) -> float:
    noise = float(np.sum((actual.astype(np.float64) - reference) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def kernel_range_ratios(text: str) -> list[float]:
    """Per producer: max/min over output channels of max |w| (the per-tensor problem)."""
    context = make_context()
    module = parse(text, context)
    ratios: list[float] = []
    with context:
        def visit(op: ir.Operation) -> ir.WalkResult:
            op = op.operation
            if op.name == "stablehlo.convolution":
                src = defining_op(op.operands[1])
                if src is not None and src.name == "stablehlo.constant":
                    w = np.abs(np.asarray(elements.read_native(src.attributes["value"]), np.float64))
                    axis = producers.conv_dims(op).kernel_output_feature_dimension
                    r = w.max(axis=tuple(d for d in range(w.ndim) if d != axis))
                    if np.all(r > 0):
                        ratios.append(float(r.max() / r.min()))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    return ratios


# --- models ----------------------------------------------------------------------------


def import_torch():
    """torch, torchvision and torchax (the shims live in export_testdata)."""
    # torchvision's PyPI wheel is a CUDA build whose C ops fail to load next to
    # torch+cpu; the models are pure Python, so skip its op registrations.
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))
    from export_testdata import _import_torchax

    torch, torchax = _import_torchax()
    import torchvision

    return torch, torchvision, torchax


def calibrate(model, inputs, torch) -> None:
    """Batch-norm running statistics = the statistics of `inputs` (cumulative average)."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for batch in inputs:
            model(batch)
    model.eval()


def spread_depthwise_scales(model, torch, rng: np.random.Generator) -> int:
    """gamma, beta of each BN after a depthwise conv times a ~ log-uniform[1e-3, 1]; the
    next 1x1 conv's input weights times 1/a. Returns the number of BNs changed."""
    modules = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d))]
    changed = 0
    with torch.no_grad():
        for i, m in enumerate(modules[:-2]):
            if not (isinstance(m, torch.nn.Conv2d) and m.groups == m.in_channels > 1):
                continue
            bn, nxt = modules[i + 1], modules[i + 2]
            if not isinstance(bn, torch.nn.BatchNorm2d) or not isinstance(nxt, torch.nn.Conv2d) \
                    or nxt.kernel_size != (1, 1) or nxt.groups != 1:
                continue
            a = torch.from_numpy(10 ** rng.uniform(-3, 0, bn.num_features)).float()
            bn.weight.mul_(a)
            bn.bias.mul_(a)
            nxt.weight.div_(a.view(1, -1, 1, 1))
            changed += 1
    return changed


def mobilenet_v2(torch, torchvision, rng):
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(num_classes=1000)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, m.num_features)).float())
                m.bias.copy_(torch.from_numpy(rng.normal(0, 0.3, m.num_features)).float())
    # After the affine parameters: each layer's statistics then match what reaches it.
    calibrate(model, [torch.randn(8, 3, 96, 96) for _ in range(4)], torch)
    before = copy.deepcopy(model)
    changed = spread_depthwise_scales(model, torch, rng)
    x = torch.from_numpy(rng.standard_normal((16, 3, 96, 96)).astype(np.float32))
    with torch.no_grad():
        drift = sqnr(before(x).numpy(), model(x).numpy())
    note = (f"{changed} depthwise batch norms spread; float model before vs after the spread: "
            f"{drift:.1f} dB (ReLU6 saturation)")
    # AIMET's quantizer encodings and its empirical bias correction read these
    calib = torch.from_numpy(rng.standard_normal((64, 3, 96, 96)).astype(np.float32))
    return model, x, None, note, calib


class TinyMobileNet:
    """A MobileNetV2-style network for 8x8 digits (built lazily: torch is optional)."""

    @staticmethod
    def build(torch):
        nn = torch.nn

        def block(cin, cout, expand, stride):
            hidden = cin * expand
            layers = []
            if expand != 1:
                layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
            layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                       nn.BatchNorm2d(hidden), nn.ReLU6(),
                       nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
            return Residual(nn.Sequential(*layers), cin == cout and stride == 1)

        class Residual(nn.Module):
            def __init__(self, body, skip):
                super().__init__()
                self.body, self.skip = body, skip

            def forward(self, x):
                return x + self.body(x) if self.skip else self.body(x)

        return nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            block(16, 8, 1, 1), block(8, 16, 4, 2), block(16, 16, 4, 1), block(16, 24, 4, 2),
            nn.Conv2d(24, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def digits(torch, epochs: int, rng):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0 - 0.5).astype(np.float32)[:, None]
    y = data.target.astype(np.int64)
    order = rng.permutation(len(x))
    split = len(x) * 3 // 4
    train, test = order[:split], order[split:]
    torch.manual_seed(0)
    model = TinyMobileNet.build(torch)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    start = time.time()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    note = f"trained {epochs} epochs in {time.time() - start:.0f} s on 1347 digits"
    return model, torch.from_numpy(x[test]), y[test], note, xt[:256]


# --- runs ------------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    method: str
    sets: str
    sqnr: float | None  # None: the row could not run (its method says why)
    accuracy: float | None
    ratio: str = ""


def export(model, x, torchax) -> str:
    import jax

    params, jax_fn = torchax.extract_jax(model)
    text = jax.jit(lambda a: jax_fn(params, (a,))).lower(x.numpy()).as_text()
    return text


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> float | None:
    return None if labels is None else float(np.mean(np.argmax(logits, axis=-1) == labels))


def equalized_sets(report) -> str:
    return (f"{sum(len(e.layers) - 1 for e in report.equalized)} pairs, "
            f"{sum(e.triplets for e in report.equalized)} conv-dw-conv triplets "
            f"(in {len(report.equalized)} chains)")


def quantize_variants() -> list[tuple[str, FoldOptions]]:
    """bnfold's own int8 weights: per tensor after equalization, per channel without and
    with it; each without and with bias correction."""
    variants = []
    for equalize, granularity in ((True, None), (False, "per-channel"), (True, "per-channel")):
        for correct in (False, True):
            method = ("bnfold" + " --equalize" * equalize + " --quantize-weights int8" +
                      (f" --quantize-granularity {granularity}" if granularity else "") +
                      " --bias-correction" * correct)
            variants.append((method, FoldOptions(equalize=equalize, quantize_weights="int8",
                                                 quantize_granularity=granularity,
                                                 bias_correction=correct)))
    return variants


def quantized_summary(report) -> str:
    """How many weights bnfold stored as integers and, with --bias-correction, how many
    layers got a correction and the most common reasons for the others (the report)."""
    quantized = report.quantized
    granularity = ", ".join(sorted({q.granularity for q in quantized})) or "-"
    text = (f"{len(quantized)} weights int8 {granularity}, weight SQNR median "
            f"{np.median([q.weight_sqnr_db for q in quantized]):.0f} dB")
    if report.not_quantized:
        why = Counter(s.reason.split(" (")[0] for s in report.not_quantized)
        text += f"; {len(report.not_quantized)} not quantized" + \
            "".join(f"; {n}: {k}" for k, n in why.most_common(3))
    corrections = [q.bias_correction for q in quantized if q.bias_correction is not None]
    if corrections:
        applied = [c for c in corrections if c["applied"]]
        why = Counter(f"{c['reason'].split(' (')[0]} [{c['code']}]"
                      for c in corrections if not c["applied"])
        text += (f"; bias corrected in {len(applied)} of {plural(len(corrections), 'layer')}"
                 f" (largest shift {max((c['max_shift'] for c in applied), default=0):.2g})" +
                 "".join(f"; {n} not: {k}" for k, n in why.most_common(3)))
    return text


def bnfold_rows(name: str, text: str, x: np.ndarray, labels, reference: np.ndarray
                ) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    variants = [("bnfold fold", FoldOptions()),
                ("bnfold --equalize", FoldOptions(equalize=True)),
                ("bnfold --equalize --absorb-high-bias",
                 FoldOptions(equalize=True, absorb_high_bias=True))]
    floats: dict[bool, tuple[str, np.ndarray, str]] = {}  # equalize -> module, fake-quantized output, ratios
    for method, options in variants:
        folded = fold_source(text, options=options, name=name)
        out_text = folded.serialize().decode()
        float_out = numerics.run_xla(out_text, [x])[0]
        quant = numerics.run_xla(fake_quantize(out_text), [x])[0]
        report = folded.report
        sets = equalized_sets(report) if options.equalize else "-"
        if options.absorb_high_bias:
            links = [r for e in report.equalized for r in e.high_bias]
            absorbed = [r for r in links if r["absorbed"]]
            why: dict[str, int] = {}
            for r in links:
                if not r["absorbed"]:
                    key = r["reason"].split(":")[0].split(" (")[0]
                    why[key] = why.get(key, 0) + 1
            sets += (f"; high bias absorbed in {len(absorbed)} of {len(links)} links"
                     f" ({plural(sum(r['channels'] for r in absorbed), 'channel')})" +
                     "".join(f"; {n}: {k}" for k, n in sorted(why.items())))
        ratios = kernel_range_ratios(out_text)
        ratio = f"median {np.median(ratios):.0f}, max {max(ratios):.0f}"
        rows.append(Row(name, method, sets, sqnr(reference, quant), accuracy(quant, labels), ratio))
        drift = sqnr(reference, float_out)
        rows[-1].method += f" (float: {drift:.0f} dB)" if drift < 200 else ""
        if not options.absorb_high_bias:
            floats[options.equalize] = (method, quant, ratio)
    # bnfold's own quantization: the module it wrote, run as it is
    for method, options in quantize_variants():
        folded = fold_source(text, options=options, name=name)
        out = numerics.run_xla(folded.serialize().decode(), [x])[0]
        report = folded.report
        rows.append(Row(name, f"{method} ({quantized_summary(report)})",
                        equalized_sets(report) if options.equalize else "-",
                        sqnr(reference, out), accuracy(out, labels), floats[options.equalize][2]))
        if not options.bias_correction and options.quantize_granularity is None:
            base, fake, _ = floats[options.equalize]
            notes.append(f"- {name}: plumbing check: `{method}` gives {sqnr(reference, out):.2f} dB, the "
                         f"script's fake quantization of the `{base}` module {sqnr(reference, fake):.2f} dB; "
                         f"the two quantized outputs agree to {sqnr(fake, out):.0f} dB "
                         "(same integers, scales rounded to f32 in bnfold's module)")
    return rows, notes


def aimet_rows(name: str, model, x, labels, reference: np.ndarray, torch) -> list[Row]:
    from aimet_torch.cross_layer_equalization import (
        CrossLayerScaling,
        HighBiasFold,
        fold_all_batch_norms,
    )

    rows = []
    shape = tuple(x.shape[1:])
    for swap in (False, True):
        m = copy.deepcopy(model).eval()
        if swap:
            _swap_relu6(m, torch)
        dummy = torch.randn(1, *shape)
        pairs = fold_all_batch_norms(m, None, dummy_input=dummy)
        sets = CrossLayerScaling.scale_model(m, None, dummy_input=dummy)
        bn_dict = {conv: bn for conv, bn in pairs}
        HighBiasFold.bias_fold(sets, bn_dict)
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                    mod.weight.copy_(torch.from_numpy(quantize_int8(mod.weight.numpy())))
            quant = m(x).numpy()
        triplets = sum(len(s.cls_pair_info_list) == 2 for s in sets)
        pairs = sum(len(s.cls_pair_info_list) for s in sets)
        method = "AIMET equalize_model" + (" after ReLU6 -> ReLU" if swap else "")
        if swap:  # the swap changed the float model: measure against both
            own = swapped_reference(model, x, torch)
            method += (f" (vs its own float model: {sqnr(own, quant):.1f} dB; "
                       f"float change from the swap: {sqnr(reference, own):.1f} dB)")
        rows.append(Row(name, method, f"{pairs} pairs, {triplets} triplets (in {len(sets)} sets)",
                        sqnr(reference, quant), accuracy(quant, labels)))
    return rows


# --- AIMET's bias correction (aimet-torch 2.30.0, in a child process) --------------------------

# (ReLU6 -> ReLU first, mode): "analytic" corrects only the layers a batch norm feeds and
# leaves the others (data-free, like bnfold); "analytic+empirical" is AIMET's own mix with
# perform_only_empirical_bias_corr=False (the others on calibration inputs); "empirical"
# corrects every layer on calibration inputs (AIMET's default), for reference.
AIMET_BC_VARIANTS = [(False, "analytic"), (True, "analytic"), (True, "analytic+empirical"),
                     (True, "empirical")]

# Per-tensor symmetric int8 weights, min-max: AIMET's default config, written out (quantsim
# v2 requires output quantizers on; correct_bias turns them off, and the model input is not
# quantized, so only weights are).
AIMET_PER_TENSOR_CONFIG = {
    "defaults": {"ops": {"is_output_quantized": "True"},
                 "params": {"is_quantized": "True", "is_symmetric": "True"},
                 "strict_symmetric": "False", "per_channel_quantization": "False"},
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {}, "supergroups": [], "model_input": {}, "model_output": {},
}

AIMET_BC_MISSING = ("aimet-torch 2.42 has no bias correction: aimet_torch.bias_correction was "
                    "deprecated in 2.30.0 and removed in 2.31.0; pass --aimet-bc DIR with "
                    "aimet-torch==2.30.0 installed there (pip install --no-deps --target DIR)")


def aimet_bc_method(swap: bool, mode: str) -> str:
    return ("AIMET equalize_model" + (" after ReLU6 -> ReLU" if swap else "") +
            f" + bias correction ({mode})")


def aimet_bc_rows(name: str, model, x, calib, labels, reference: np.ndarray, torch,
                  path: str | None) -> tuple[list[Row], list[str]]:
    """AIMET's CLE + bias correction, run by `--aimet-bc-worker` in a child process whose
    path starts with `path` (aimet-torch 2.30.0); the rows say why when it cannot run."""
    def empty(reason: str) -> list[Row]:
        return [Row(name, f"{aimet_bc_method(swap, mode)}: not run ({reason})", "-", None, None)
                for swap, mode in AIMET_BC_VARIANTS]

    if path is None:
        return empty(AIMET_BC_MISSING), []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.save(model.state_dict(), work / "model.pt")
        np.save(work / "x.npy", x.numpy())
        np.save(work / "calib.npy", calib.numpy())
        (work / "spec.json").write_text(json.dumps({"model": name}))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(path).resolve()), os.environ.get("PYTHONPATH")) if p))
        run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--aimet-bc-worker", tmp],
                             env=env, capture_output=True, text=True)
        if run.returncode != 0 or not (work / "result.json").exists():
            lines = run.stderr.strip().splitlines()
            return empty(f"the child process failed: {lines[-1] if lines else run.returncode}"), []
        result = json.loads((work / "result.json").read_text())
        with np.load(work / "out.npz") as data:
            out = dict(data)
    version = result["version"]
    notes = [f"- {name}: AIMET bias correction rows: aimet-torch {version} (its quantizer: symmetric "
             f"int8 in [-128, 127], scale max(max / 127, -min / 128) per tensor); its rebuilt float "
             f"model vs the original: {sqnr(reference, out['float']):.0f} dB"]
    if "error" in result:
        return empty(result["error"]), notes
    rows = []
    own = swapped_reference(model, x, torch)
    for i, ((swap, mode), info) in enumerate(zip(AIMET_BC_VARIANTS, result["variants"], strict=True)):
        method = aimet_bc_method(swap, mode)
        if "error" in info:
            rows.append(Row(name, f"{method}: failed ({info['error']})", "-", None, None))
            continue
        bc = out[f"v{i}_bc"]
        method += (f" (aimet-torch {version}; {info['layers']}; equalization alone with the same "
                   f"quantizer: {sqnr(reference, out[f'v{i}_cle']):.1f} dB; the script's quantizer "
                   f"after the correction: {sqnr(reference, out[f'v{i}_bc_script']):.1f} dB")
        if swap:
            method += f"; vs its own float model: {sqnr(own, bc):.1f} dB"
        rows.append(Row(name, method + ")", info["sets"], sqnr(reference, bc), accuracy(bc, labels)))
        if i == 0 or swap and mode == "analytic":
            notes.append(f"- {name}: aimet-torch {version}'s equalization"
                         f"{' after ReLU6 -> ReLU' if swap else ''} with the script's quantizer: "
                         f"{sqnr(reference, out[f'v{i}_cle_script']):.1f} dB (the aimet-torch 2.42 row above "
                         "should match)")
    return rows, notes


def aimet_bc_worker(work: Path) -> int:
    """The child process: rebuilds the model, runs each AIMET_BC_VARIANTS entry, writes
    result.json and out.npz into `work`."""
    torch, torchvision, _ = import_torch()
    torch.set_num_threads(2)
    spec = json.loads((work / "spec.json").read_text())
    model = (torchvision.models.mobilenet_v2(num_classes=1000) if spec["model"] == "mobilenet_v2"
             else TinyMobileNet.build(torch))
    model.load_state_dict(torch.load(work / "model.pt"))
    model.eval()
    x = torch.from_numpy(np.load(work / "x.npy"))
    calib = torch.from_numpy(np.load(work / "calib.npy"))
    import aimet_torch

    result: dict = {"version": aimet_torch.__version__, "variants": []}
    outputs: dict[str, np.ndarray] = {}
    with torch.no_grad():
        outputs["float"] = model(x).numpy()
    try:
        from aimet_torch import bias_correction  # noqa: F401
    except ImportError as e:
        result["error"] = f"aimet-torch {aimet_torch.__version__} has no bias correction ({e})"
    else:
        config = work / "quantsim_config.json"
        config.write_text(json.dumps(AIMET_PER_TENSOR_CONFIG))
        for i, (swap, mode) in enumerate(AIMET_BC_VARIANTS):
            try:
                info, found = aimet_bc_variant(model, x, calib, torch, swap, mode, str(config))
            except Exception as e:  # the row says what failed
                info, found = {"error": f"{type(e).__name__}: {e}"}, {}
            result["variants"].append(info)
            outputs.update({f"v{i}_{key}": value for key, value in found.items()})
    np.savez(work / "out.npz", **outputs)
    (work / "result.json").write_text(json.dumps(result))
    return 0


def aimet_bc_variant(model, x, calib, torch, swap: bool, mode: str, config: str
                     ) -> tuple[dict, dict[str, np.ndarray]]:
    """CLE as aimet_rows does it, then `correct_bias`; outputs with AIMET's quantizer and
    the script's, before and after the correction."""
    from aimet_torch import bias_correction
    from aimet_torch._base.quantsim import QuantParams
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.cross_layer_equalization import (
        CrossLayerScaling,
        HighBiasFold,
        fold_all_batch_norms,
    )

    m = copy.deepcopy(model).eval()
    if swap:
        _swap_relu6(m, torch)
    dummy = torch.randn(1, *x.shape[1:])
    # The batch norm (and activation) before each layer, found before folding removes them:
    # the analytic correction's E[x] comes from their gamma and beta (AIMET's recipe).
    conv_bn = bias_correction.find_all_conv_bn_with_activation(m, dummy)
    pairs = fold_all_batch_norms(m, None, dummy_input=dummy)
    sets = CrossLayerScaling.scale_model(m, None, dummy_input=dummy)
    HighBiasFold.bias_fold(sets, dict(pairs))
    outputs = {"cle": aimet_quantized_output(m, x, dummy, torch, config),
               "cle_script": script_quantized_output(m, x, torch)}
    layers = [mod for mod in m.modules() if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear))]
    fed = [mod for mod in layers if mod in conv_bn and conv_bn[mod].input_bn is not None]
    others = [mod for mod in layers if not any(mod is f for f in fed)]
    inputs = Counter(conv_bn[mod].in_activation_type.name for mod in fed)
    before = [None if mod.bias is None else mod.bias.detach().clone() for mod in layers]
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(calib, torch.zeros(len(calib))), batch_size=16)
    params = QuantParams(weight_bw=8, act_bw=8, round_mode="nearest",
                         quant_scheme=QuantScheme.post_training_tf, config_file=config)
    bias_correction.correct_bias(m, params, num_quant_samples=len(calib), data_loader=loader,
                                 num_bias_correct_samples=len(calib), conv_bn_dict=conv_bn,
                                 perform_only_empirical_bias_corr=mode == "empirical",
                                 layers_to_ignore=others if mode == "analytic" else None)
    changed = sum(b is None or not torch.equal(b, mod.bias) for b, mod in zip(before, layers))
    kinds = ", ".join(f"{n} {k}" for k, n in inputs.most_common())
    if mode == "analytic":
        layers_text = (f"analytic in the {len(fed)} layers a batch norm feeds ({kinds}), "
                       f"the other {len(others)} uncorrected")
    elif mode == "analytic+empirical":
        layers_text = (f"analytic in the {len(fed)} layers a batch norm feeds ({kinds}), "
                       f"empirical on {len(calib)} calibration inputs in the other {len(others)} "
                       "(the first layer: analytic with E[x] = 0)")
    else:
        layers_text = f"empirical on {len(calib)} calibration inputs in all {len(layers)} layers"
    outputs["bc"] = aimet_quantized_output(m, x, dummy, torch, config)
    outputs["bc_script"] = script_quantized_output(m, x, torch)
    triplets = sum(len(s.cls_pair_info_list) == 2 for s in sets)
    pair_count = sum(len(s.cls_pair_info_list) for s in sets)
    return ({"sets": f"{pair_count} pairs, {triplets} triplets (in {len(sets)} sets)",
             "layers": f"{layers_text}; {changed} of {len(layers)} biases changed"}, outputs)


def aimet_quantized_output(m, x, dummy, torch, config: str) -> np.ndarray:
    """The output with every weight quantized by AIMET's own quantizer (a QuantizationSimModel
    with the same config as the bias correction's), activations in float."""
    from aimet_torch.bias_correction import get_quantized_dequantized_weight
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantsim import QuantizationSimModel

    sim = QuantizationSimModel(m, dummy_input=dummy, quant_scheme=QuantScheme.post_training_tf,
                               default_output_bw=8, default_param_bw=8, config_file=config)
    with torch.no_grad():
        sim.compute_encodings(lambda model, _: model(dummy), None)
        q = copy.deepcopy(m)
        modules = dict(q.named_modules())
        done = 0
        for name, mod in sim.model.named_modules():
            quantizers = getattr(mod, "param_quantizers", None)
            if quantizers is not None and "weight" in quantizers and quantizers["weight"] is not None:
                modules[name].weight.copy_(get_quantized_dequantized_weight(mod))
                done += 1
        expected = sum(isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)) for mod in q.modules())
        assert done == expected, f"AIMET quantized {done} of {expected} weights"
        return q(x).numpy()


def script_quantized_output(m, x, torch) -> np.ndarray:
    """The output with every weight quantized by `quantize_int8` (as aimet_rows does)."""
    q = copy.deepcopy(m)
    with torch.no_grad():
        for mod in q.modules():
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                mod.weight.copy_(torch.from_numpy(quantize_int8(mod.weight.numpy())))
        return q(x).numpy()


def swapped_reference(model, x, torch) -> np.ndarray:
    m = copy.deepcopy(model).eval()
    _swap_relu6(m, torch)
    with torch.no_grad():
        return m(x).numpy()


def _swap_relu6(model, torch) -> None:
    """ReLU6 -> ReLU, the DFQ paper's (and AIMET's) recipe; changes the function."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, torch.nn.ReLU6):
                setattr(parent, child_name, torch.nn.ReLU())


def table(rows: list[Row]) -> str:
    lines = ["| model | method | equalized | int8 weights: output SQNR (dB) | accuracy | "
             "weight range ratio per conv |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        acc = "-" if r.accuracy is None else f"{100 * r.accuracy:.1f}%"
        value = "-" if r.sqnr is None else f"{r.sqnr:.1f}"
        lines.append(f"| {r.model} | {r.method} | {r.sets} | {value} | {acc} | {r.ratio or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the Markdown table here too")
    parser.add_argument("--no-aimet", action="store_true", help="skip the AIMET comparison")
    parser.add_argument("--epochs", type=int, default=300,
                        help="training epochs of the digits model (fixed, so runs repeat; "
                             "300 take about a minute on 2 cores)")
    parser.add_argument("--only", choices=("mobilenet_v2", "digits"))
    parser.add_argument("--aimet-bc", metavar="DIR",
                        help="a directory with aimet-torch 2.30.0 installed (pip install --no-deps "
                             "--target DIR aimet-torch==2.30.0): run AIMET's bias correction rows "
                             "with it in a child process (2.31.0 and later have none)")
    parser.add_argument("--aimet-bc-worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.aimet_bc_worker:
        return aimet_bc_worker(Path(args.aimet_bc_worker))
    torch, torchvision, torchax = import_torch()
    torch.set_num_threads(2)
    rows: list[Row] = []
    notes: list[str] = []
    # one generator per model, so --only repeats the full run's numbers
    builders = {"mobilenet_v2": lambda: mobilenet_v2(torch, torchvision, np.random.default_rng(0)),
                "digits": lambda: digits(torch, args.epochs, np.random.default_rng(1))}
    for name, build in builders.items():
        if args.only and name != args.only:
            continue
        model, x, labels, note, calib = build()
        notes.append(f"- {name}: {note}")
        with torch.no_grad():
            reference = model(x).numpy()
        text = export(model, x, torchax)
        float_acc = accuracy(reference, labels)
        if float_acc is not None:
            notes.append(f"- {name}: float accuracy {100 * float_acc:.1f}%")
        found, checks = bnfold_rows(name, text, x.numpy(), labels, reference)
        rows += found
        notes += checks
        if not args.no_aimet:
            try:
                rows += aimet_rows(name, model, x, labels, reference, torch)
            except ImportError as e:
                notes.append(f"- AIMET not available ({e}); pip install aimet-torch==2.42.0")
            else:
                found, checks = aimet_bc_rows(name, model, x, calib, labels, reference, torch,
                                              args.aimet_bc)
                rows += found
                notes += checks
        print(table(rows), file=sys.stderr)
    result = table(rows) + "\n" + "\n".join(notes) + "\n"
    print(result)
    if args.out:
        Path(args.out).write_text(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
