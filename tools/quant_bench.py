"""Per-tensor int8 weights after folding: plain fold vs --equalize vs --absorb-high-bias, and AIMET.

Every convolution/dot_general kernel is fake-quantized per tensor, symmetric
int8 (scale = max|K| / 127, round to nearest), and the model's output is
compared with the float model: SQNR = 10 log10(sum y^2 / sum (y_q - y)^2) dB.

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

bnfold side: `bnfold.fold_source` with FoldOptions(), (equalize=True) and
(equalize=True, absorb_high_bias=True), run on XLA CPU. AIMET side
(aimet-torch 2.42, optional): `fold_all_batch_norms`, `CrossLayerScaling`,
`HighBiasFold` on the torch model as it is (ReLU6 kept), and again after
swapping ReLU6 for ReLU (the paper's recipe; that changes the float model,
so its SQNR is against the original float outputs).

Needs torch 2.13 (CPU), torchax, torchvision, scikit-learn, optionally
aimet-torch; see README "Quantization". Usage:

    python tools/quant_bench.py [--out results.md] [--no-aimet] [--epochs 300]
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
import types
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
    return model, x, None, note


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
    return model, torch.from_numpy(x[test]), y[test], note


# --- runs ------------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    method: str
    sets: str
    sqnr: float
    accuracy: float | None
    ratio: str = ""


def export(model, x, torchax) -> str:
    import jax

    params, jax_fn = torchax.extract_jax(model)
    text = jax.jit(lambda a: jax_fn(params, (a,))).lower(x.numpy()).as_text()
    return text


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> float | None:
    return None if labels is None else float(np.mean(np.argmax(logits, axis=-1) == labels))


def bnfold_rows(name: str, text: str, x: np.ndarray, labels, reference: np.ndarray) -> list[Row]:
    rows = []
    variants = [("bnfold fold", FoldOptions()),
                ("bnfold --equalize", FoldOptions(equalize=True)),
                ("bnfold --equalize --absorb-high-bias",
                 FoldOptions(equalize=True, absorb_high_bias=True))]
    for method, options in variants:
        folded = fold_source(text, options=options, name=name)
        out_text = folded.serialize().decode()
        float_out = numerics.run_xla(out_text, [x])[0]
        quant = numerics.run_xla(fake_quantize(out_text), [x])[0]
        report = folded.report
        sets = (f"{sum(len(e.layers) - 1 for e in report.equalized)} pairs, "
                f"{sum(e.triplets for e in report.equalized)} conv-dw-conv triplets "
                f"(in {len(report.equalized)} chains)") if options.equalize else "-"
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
        rows.append(Row(name, method, sets, sqnr(reference, quant), accuracy(quant, labels),
                        f"median {np.median(ratios):.0f}, max {max(ratios):.0f}"))
        drift = sqnr(reference, float_out)
        rows[-1].method += f" (float: {drift:.0f} dB)" if drift < 200 else ""
    return rows


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
        lines.append(f"| {r.model} | {r.method} | {r.sets} | {r.sqnr:.1f} | {acc} | {r.ratio or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the Markdown table here too")
    parser.add_argument("--no-aimet", action="store_true", help="skip the AIMET comparison")
    parser.add_argument("--epochs", type=int, default=300,
                        help="training epochs of the digits model (fixed, so runs repeat; "
                             "300 take about a minute on 2 cores)")
    parser.add_argument("--only", choices=("mobilenet_v2", "digits"))
    args = parser.parse_args(argv)
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
        model, x, labels, note = build()
        notes.append(f"- {name}: {note}")
        with torch.no_grad():
            reference = model(x).numpy()
        text = export(model, x, torchax)
        float_acc = accuracy(reference, labels)
        if float_acc is not None:
            notes.append(f"- {name}: float accuracy {100 * float_acc:.1f}%")
        rows += bnfold_rows(name, text, x.numpy(), labels, reference)
        if not args.no_aimet:
            try:
                rows += aimet_rows(name, model, x, labels, reference, torch)
            except ImportError as e:
                notes.append(f"- AIMET not available ({e}); pip install aimet-torch==2.42.0")
        print(table(rows), file=sys.stderr)
    result = table(rows) + "\n" + "\n".join(notes) + "\n"
    print(result)
    if args.out:
        Path(args.out).write_text(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
