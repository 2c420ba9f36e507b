#!/usr/bin/env python3
"""Export small real-framework models with batch norm to StableHLO text test data.

Every model is a real layer stack from its framework, in inference mode, with the
parameters and the running statistics CLOSED OVER by the jitted function, so they arrive
as `stablehlo.constant` ops and `@main` has exactly one argument: the input batch.

Frameworks (``--only`` takes these names; repeat it or separate with commas):

    flax_linen  flax.linen Conv/Dense/ConvTranspose + BatchNorm(use_running_average=True);
                NHWC, plus one NCHW model (a lax.conv layer + BatchNorm(axis=1)).
    flax_nnx    flax.nnx Conv/Linear + BatchNorm, model.eval().
    haiku       hk.Conv2D/DepthwiseConv2D/Linear + hk.BatchNorm(is_training=False), NHWC
                and NCHW (data_format), and a small hk.nets.ResNet.
    equinox     eqx.nn.Conv2d/Linear + eqx.nn.BatchNorm under vmap (NCHW), inference mode,
                mode="ema" and one mode="batch" model (zero-debias chain).
    keras       Keras 3 with KERAS_BACKEND=jax: Conv2D/DepthwiseConv2D/Conv2DTranspose/Dense +
                BatchNormalization(training=False), channels_last and channels_first, a small
                functional ResNet, and keras.applications.MobileNetV2(alpha=0.35, weights=None).
    torchax     torch.nn Conv2d/ConvTranspose2d/Linear + BatchNorm2d/1d in eval(), NCHW,
                turned into JAX with torchax.extract_jax.

Running statistics and affine parameters are replaced with random non-trivial values
(mean ~ N(0, 0.5), var ~ U(0.5, 2.0), gamma ~ U(0.5, 1.5), beta ~ N(0, 0.3)); kernels come
from each framework's own (seeded) initializer; zero-initialised conv/dense biases are
replaced with N(0, 0.1). Exception: with plain random statistics MobileNetV2's output does
not depend on its input (the signal dies out over 52 BN layers), so its running statistics
are calibrated layer by layer on a random batch and then perturbed:
mean = m + N(0, 0.5) * s, var = s^2 * U(0.5, 2.0), with m, s^2 the BN input's actual
statistics (gamma and beta as above). Seeds are fixed, so a re-run writes the same files (export-form
locations name this script's path and line numbers, so they change when the script moves
or is edited).

Two text forms are mixed (the manifest's "form"):
    lower   jax.jit(f).lower(x).as_text()
    export  jax.export.export(jax.jit(f))(x).mlir_module()   (loc(...), hoisted constants)

Output: one ``<framework>_<model>.mlir`` per model and ``manifest.json``, a list of
``{"file", "framework", "layout", "batchnorm_layers", "producers", "input_shape",
"output_shape", "form", "rtol", "description"}``. ``batchnorm_layers`` and ``producers`` (conv,
transposed-conv and dense layers) are counted from the model definition, not from the IR.
With ``--only`` the manifest keeps the other frameworks' entries.

Unless ``--no-verify`` is given, every written file is checked: it parses, ``@main`` has
exactly one argument, XLA CPU compiles and runs it, and its output matches the framework's
own eager forward pass on the same input (rtol 1e-5, atol 1e-5 * max|ref|; for torchax the
reference is torch itself on CPU, except for torchax_conv_transpose_grouped_bn_nchw: torchax
0.0.13 lowers a grouped ConvTranspose2d differently from torch (max abs diff ~1.3 on that
model, torchax's bug, not the exporter's), so that one is checked against jax.jit of the
torchax function), and its output changes when the input does. The manifest's
"rtol" is that tolerance: 5e-5 for MobileNetV2, whose random 53-layer stack amplifies
rounding differences about 20x (eager vs compiled differ by ~2e-5 there).

Environment (its own virtualenv, e.g. /work/venv-export), versions this was run with:
    jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 dm-haiku==0.0.17 equinox==0.13.8
    keras==3.15.1 optax==0.2.8 numpy==2.4.6 torch==2.13.0+cpu torchax==0.0.13
    pip install jax jaxlib flax dm-haiku equinox keras torchax torch==2.13.0
(torch 2.13.0+cpu is the local CPU wheel; do not pull the multi-GB CUDA builds).

torchax note: torchax 0.0.10 - 0.0.13 all fail to import with torch 2.13 because their op
tables name named-tensor overloads torch no longer has, first ``aten::prod.dim_Dimname``:
``AttributeError: The underlying op of 'aten.prod' has no overload name 'dim_Dimname'``.
This script imports torchax with a narrow shim that hands
back an inert placeholder for missing named-tensor overloads (names containing ``dimname``
or ``names``: 22 of them, e.g. ``aten::all.dimname_out``, ``aten::norm.names_out``, which
torchax also looks up lazily, so the shim stays installed in this process). Named tensors
are never used here, and every lookup that succeeds is untouched.
If torchax or torch is not installed the torchax models are skipped with a message.

Full-size models for tools/downstream.py (``--downstream MODELS``, written to
``$TMPDIR/bnfold-downstream-exports`` unless ``--out`` says otherwise, tens of MB each,
never into testdata): keras.applications ResNet50, MobileNetV2 and EfficientNetB0
(weights=None, include_top, no classifier activation) at ``--resolution`` (224) for
every ``--batch`` (1,32) and ``--dtype`` (f32; bf16: the whole model in bfloat16),
exported with jax.export; and torchvision.models resnet50, mobilenet_v2 and efficientnet_b0
(``torchvision_resnet50``, ``torchvision_mobilenetv2``, ``torchvision_efficientnetb0``:
weights=None, eval, NCHW, through torchax; files ``torchax_<model>_...``), e.g.

    python tools/export_testdata.py --downstream keras_resnet50,keras_mobilenetv2 --dtype f32,bf16
    python tools/export_testdata.py --downstream torchvision_resnet50 --batch 1 --dtype f32
    python tools/downstream.py $TMPDIR/bnfold-downstream-exports/*.mlir

The torchvision ones need torch, torchvision and torchax only (no keras); they were run with
torch 2.14.1 / torchvision 0.29.1 / jax 0.10.2 (Python 3.11) and are meant to run with torch
2.11 / jax 0.11 (Python 3.12) too: the torchax shim above only acts where an op is missing.

Run time on 2 CPU cores: about 1 minute (55-80 s) for everything (most of it imports, MobileNetV2
and verification).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ["KERAS_BACKEND"] = "jax"  # must precede any keras import
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "testdata" / "models"
FRAMEWORKS = ("flax_linen", "flax_nnx", "haiku", "equinox", "keras", "torchax", "deployment")
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DIR_BYTES = 25 * 1024 * 1024
RTOL = 1e-5


# --------------------------------------------------------------------------- common


@dataclasses.dataclass
class Case:
    """One model to export, with everything the manifest and the verifier need."""

    name: str  # file stem without the framework prefix
    framework: str
    layout: str  # NHWC, NCHW or NC (dense, features last)
    batchnorm_layers: int
    producers: int
    form: str  # "lower" or "export"
    description: str
    fn: Callable[[Any], Any]  # jax-traceable, closes over every parameter
    x: np.ndarray
    reference: np.ndarray  # the framework's own eager output on x
    # tolerance against `reference`, relative to max|reference|; None: the error is
    # reported, not checked (bf16 models against the f32 reference)
    rtol: float | None = RTOL
    dtype: str = "f32"  # the model's compute dtype (manifest "dtype")
    # The model starts with an input normalization before a zero-padded convolution
    # (manifest "input_normalization": it must fold forward into that convolution).
    input_normalization: bool = False
    # Batch norms that cannot fold (pre-activation: nothing linear next to them);
    # the manifest's "unfoldable": each must be reported with a reason.
    unfoldable: int = 0

    @property
    def file(self) -> str:
        return f"{self.framework}_{self.name}.mlir"


class Stats:
    """Seeded random values for batch-norm statistics, affine parameters and biases."""

    def __init__(self, key: str):
        self.rng = np.random.default_rng(zlib.crc32(key.encode()))

    def mean(self, shape):
        return self.rng.normal(0.0, 0.5, shape).astype(np.float32)

    def var(self, shape):
        return self.rng.uniform(0.5, 2.0, shape).astype(np.float32)

    def gamma(self, shape):
        return self.rng.uniform(0.5, 1.5, shape).astype(np.float32)

    def beta(self, shape):
        return self.rng.normal(0.0, 0.3, shape).astype(np.float32)

    def bias(self, shape):
        return self.rng.normal(0.0, 0.1, shape).astype(np.float32)

    def input(self, shape):
        return self.rng.normal(0.0, 1.0, shape).astype(np.float32)


# Forms whose @main is not a plain one-input function: checked through jax.export.
EXPORTED: dict[int, Any] = {}


def lower(fn: Callable, x: np.ndarray, form: str) -> str:
    """Text of `fn` in one of the forms:

    lower                 jax.jit(fn).lower(x).as_text()
    export                jax.export of the static shape
    export-symbolic       jax.export with a symbolic batch ("b, ...")
    export-multiplatform  jax.export for platforms ("cpu", "cuda")
    """
    import jax

    jitted = jax.jit(fn)
    if form == "lower":
        text = jitted.lower(x).as_text()
    elif form == "export":
        text = jax.export.export(jitted)(jax.ShapeDtypeStruct(x.shape, x.dtype)).mlir_module()
    elif form == "export-symbolic":
        spec = ", ".join(["b"] + [str(n) for n in x.shape[1:]])
        shape = jax.ShapeDtypeStruct(jax.export.symbolic_shape(spec), x.dtype)
        exported = jax.export.export(jitted)(shape)
        EXPORTED[id(fn)] = exported
        text = exported.mlir_module()
    elif form == "export-multiplatform":
        exported = jax.export.export(jitted, platforms=("cpu", "cuda"))(
            jax.ShapeDtypeStruct(x.shape, x.dtype))
        EXPORTED[id(fn)] = exported
        text = exported.mlir_module()
    else:
        raise ValueError(f"unknown form {form!r}")
    return text if text.endswith("\n") else text + "\n"


def _main_arg_count(text: str) -> int:
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir

    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        for op in module.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                return len(ftype.inputs)
    raise ValueError("no @main in module")


def run_on_xla(text: str, x: np.ndarray) -> np.ndarray:
    """Compile StableHLO text with XLA CPU and run it on x (private jaxlib APIs)."""
    import jax
    import jax.extend
    from jax._src.lib import xla_client as xc

    be = jax.extend.backend.get_backend("cpu")
    dev = be.devices()[0]
    exe = be.compile_and_load(text, xc.DeviceList((dev,)), xc.CompileOptions())
    out = exe.execute_sharded([jax.device_put(x, dev)]).disassemble_into_single_device_arrays()
    return np.asarray(out[0][0])


def verify(case: Case, text: str, max_bytes: int | None = MAX_FILE_BYTES) -> float:
    """Check one written file; return the max error relative to max|ref|."""
    nargs = _main_arg_count(text)
    expected_args = 2 if case.form == "export-multiplatform" else 1  # + the platform index
    if nargs != expected_args:
        raise AssertionError(f"{case.file}: @main has {nargs} arguments, expected {expected_args}")
    if max_bytes is not None and len(text.encode()) > max_bytes:
        raise AssertionError(f"{case.file}: {len(text)} bytes > {max_bytes}")
    exported = EXPORTED.get(id(case.fn))
    run = (lambda x: np.asarray(exported.call(x), np.float32)) if exported is not None else \
        (lambda x: run_on_xla(text, x).astype(np.float32))
    out = run(case.x)
    ref = np.asarray(case.reference, dtype=np.float32)
    if out.shape != ref.shape:
        raise AssertionError(f"{case.file}: output shape {out.shape} != reference {ref.shape}")
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    if not np.all(np.isfinite(out)):
        raise AssertionError(f"{case.file}: the output is not finite")
    if case.rtol is not None:
        np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.rtol * scale, err_msg=case.file)
    other = run((case.x[::-1] * np.float32(0.5) + np.float32(0.25)).astype(case.x.dtype))
    if np.allclose(other, out, rtol=1e-3, atol=1e-3 * scale):
        raise AssertionError(f"{case.file}: output does not depend on the input")
    return float(np.max(np.abs(out - ref)) / scale)


def randomize_flax_batch_norms(params: dict, stats: dict, st: Stats) -> list[tuple]:
    """Random statistics and affine parameters for every Flax BatchNorm (flattened dicts).

    Returns the BatchNorm module paths.
    """
    bn_paths = sorted({p[:-1] for p in stats})
    for path in bn_paths:
        stats[path + ("mean",)] = st.mean(stats[path + ("mean",)].shape)
        stats[path + ("var",)] = st.var(stats[path + ("var",)].shape)
        params[path + ("scale",)] = st.gamma(params[path + ("scale",)].shape)
        params[path + ("bias",)] = st.beta(params[path + ("bias",)].shape)
    return bn_paths


def np_out(y) -> np.ndarray:
    return np.asarray(y, dtype=np.float32)


# --------------------------------------------------------------------------- flax linen


def flax_linen_cases() -> Iterator[Case]:
    import jax
    import jax.numpy as jnp
    from flax import linen as nn
    from flax import traverse_util

    fw = "flax_linen"

    class ConvNCHW(nn.Module):
        """A linen layer around lax.conv in NCHW/OIHW (linen's Conv is NHWC only)."""

        features: int
        use_bias: bool = True

        @nn.compact
        def __call__(self, x):
            init = nn.initializers.lecun_normal(in_axis=1, out_axis=0)
            k = self.param("kernel", init, (self.features, x.shape[1], 3, 3))
            y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
            if self.use_bias:
                y = y + self.param("bias", nn.initializers.zeros, (self.features,))[None, :, None, None]
            return y

    class ConvBN(nn.Module):
        features: int = 8
        use_bias: bool = False
        nchw: bool = False
        groups: int = 1
        eps: float = 1e-5

        @nn.compact
        def __call__(self, x):
            if self.nchw:
                x = ConvNCHW(self.features, self.use_bias)(x)
                return nn.BatchNorm(use_running_average=True, axis=1, epsilon=self.eps)(x)
            x = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=self.use_bias, feature_group_count=self.groups)(
                x
            )
            return nn.BatchNorm(use_running_average=True, epsilon=self.eps)(x)

    class DenseBN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(32)(x)
            x = nn.BatchNorm(use_running_average=True)(x)
            return nn.relu(x)

    class ConvTransposeBN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.ConvTranspose(8, (3, 3), strides=(2, 2), padding="SAME", use_bias=False)(x)
            return nn.BatchNorm(use_running_average=True)(x)

    class BasicBlock(nn.Module):
        features: int
        strides: int = 1

        @nn.compact
        def __call__(self, x):
            bn = lambda: nn.BatchNorm(use_running_average=True, epsilon=1.001e-5)
            y = nn.Conv(self.features, (3, 3), (self.strides,) * 2, padding="SAME", use_bias=False)(x)
            y = nn.relu(bn()(y))
            y = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=False)(y)
            y = bn()(y)
            if self.strides != 1 or x.shape[-1] != self.features:
                x = nn.Conv(self.features, (1, 1), (self.strides,) * 2, use_bias=False)(x)
                x = bn()(x)
            return nn.relu(x + y)

    class ResNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(8, (3, 3), padding="SAME", use_bias=False)(x)
            x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
            x = BasicBlock(8)(x)
            x = BasicBlock(16, strides=2)(x)
            x = BasicBlock(16)(x)
            x = jnp.mean(x, axis=(1, 2))
            return nn.Dense(10)(x)

    def make(name, module, in_shape, layout, form, desc, numpy_params=False):
        st = Stats(f"{fw}/{name}")
        x = st.input(in_shape)
        variables = module.init(jax.random.PRNGKey(zlib.crc32(name.encode()) & 0xFFFF), x)
        variables = jax.tree_util.tree_map(np.asarray, variables)
        params = traverse_util.flatten_dict(variables["params"])
        stats = traverse_util.flatten_dict(variables["batch_stats"])
        bn_paths = randomize_flax_batch_norms(params, stats, st)
        producers = 0
        for path in list(params):
            if path[-1] == "kernel":
                producers += 1
            elif path[-1] == "bias" and path[:-1] not in bn_paths:
                params[path] = st.bias(params[path].shape)
        variables = {
            "params": traverse_util.unflatten_dict(params),
            "batch_stats": traverse_util.unflatten_dict(stats),
        }
        if not numpy_params:  # what model.init hands a user; numpy values reshape eagerly
            variables = jax.tree_util.tree_map(jnp.asarray, variables)
        fn = lambda x: module.apply(variables, x)
        return Case(name, fw, layout, len(bn_paths), producers, form, desc, fn, x, np_out(fn(x)))

    yield make(
        "conv_bn_nhwc",
        ConvBN(use_bias=False),
        (2, 16, 16, 3),
        "NHWC",
        "lower",
        "nn.Conv 3x3 SAME no bias -> nn.BatchNorm",
    )
    yield make(
        "conv_bias_bn_nhwc",
        ConvBN(use_bias=True),
        (1, 16, 16, 3),
        "NHWC",
        "export",
        "nn.Conv 3x3 SAME with bias -> nn.BatchNorm; params closed over as numpy arrays, so "
        "gamma/beta arrive as 1x1x1xC constants (no reshape op)",
        numpy_params=True,
    )
    yield make(
        "conv_bn_nchw",
        ConvBN(use_bias=True, nchw=True),
        (2, 3, 16, 16),
        "NCHW",
        "lower",
        "lax.conv_general_dilated NCHW/OIHW with bias -> nn.BatchNorm(axis=1)",
    )
    yield make(
        "depthwise_bn_nhwc",
        ConvBN(features=16, groups=8, eps=1e-3),
        (1, 16, 16, 8),
        "NHWC",
        "export",
        "nn.Conv feature_group_count=8, 8->16 (multiplier 2) -> nn.BatchNorm eps=1e-3",
    )
    yield make("dense_bn", DenseBN(), (2, 20), "NC", "lower", "nn.Dense 20->32 -> nn.BatchNorm -> relu")
    yield make(
        "conv_transpose_bn_nhwc",
        ConvTransposeBN(),
        (1, 8, 8, 4),
        "NHWC",
        "lower",
        "nn.ConvTranspose 3x3 stride 2 SAME no bias -> nn.BatchNorm",
    )
    yield make(
        "resnet_nhwc",
        ResNet(),
        (2, 16, 16, 3),
        "NHWC",
        "export",
        "stem conv-BN-relu + 3 basic blocks (one strided with 1x1 projection+BN) + mean + Dense",
    )


# --------------------------------------------------------------------------- flax nnx


def flax_nnx_cases() -> Iterator[Case]:
    import jax.numpy as jnp
    from flax import nnx

    fw = "flax_nnx"

    class ConvBN(nnx.Module):
        def __init__(self, cin, cout, *, use_bias, groups=1, rngs):
            self.conv = nnx.Conv(
                cin, cout, (3, 3), padding="SAME", use_bias=use_bias, feature_group_count=groups, rngs=rngs
            )
            self.bn = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.conv(x))

    class DenseBN(nnx.Module):
        def __init__(self, *, rngs):
            self.linear = nnx.Linear(20, 32, rngs=rngs)
            self.bn = nnx.BatchNorm(32, use_running_average=True, rngs=rngs)

        def __call__(self, x):
            return nnx.relu(self.bn(self.linear(x)))

    class BasicBlock(nnx.Module):
        def __init__(self, cin, cout, strides, *, rngs):
            self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=strides, padding="SAME", use_bias=False, rngs=rngs)
            self.bn1 = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)
            self.conv2 = nnx.Conv(cout, cout, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
            self.bn2 = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)
            if strides != 1 or cin != cout:
                self.proj = nnx.Conv(cin, cout, (1, 1), strides=strides, use_bias=False, rngs=rngs)
                self.proj_bn = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)
            else:
                self.proj = None
                self.proj_bn = None

        def __call__(self, x):
            y = nnx.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.proj is not None:
                x = self.proj_bn(self.proj(x))
            return nnx.relu(x + y)

    class ResNet(nnx.Module):
        def __init__(self, *, rngs):
            self.stem = nnx.Conv(3, 8, (3, 3), padding="SAME", rngs=rngs)  # with bias
            self.stem_bn = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)
            self.block1 = BasicBlock(8, 8, 1, rngs=rngs)
            self.block2 = BasicBlock(8, 16, 2, rngs=rngs)
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.stem_bn(self.stem(x)))
            x = self.block2(self.block1(x))
            return self.head(jnp.mean(x, axis=(1, 2)))

    def make(name, ctor, in_shape, layout, form, desc):
        st = Stats(f"{fw}/{name}")
        model = ctor(nnx.Rngs(zlib.crc32(name.encode()) & 0xFFFF))
        model.eval()
        nbn = nprod = 0
        for _, m in nnx.iter_modules(model):
            if isinstance(m, nnx.BatchNorm):
                nbn += 1
                for var, gen in ((m.mean, st.mean), (m.var, st.var), (m.scale, st.gamma), (m.bias, st.beta)):
                    var[...] = jnp.asarray(gen(var[...].shape))
            elif isinstance(m, (nnx.Conv, nnx.Linear, nnx.ConvTranspose)):
                nprod += 1
                if m.bias is not None:
                    m.bias[...] = jnp.asarray(st.bias(m.bias[...].shape))
        x = st.input(in_shape)
        fn = lambda x: model(x)
        return Case(name, fw, layout, nbn, nprod, form, desc, fn, x, np_out(fn(x)))

    yield make(
        "conv_bn_nhwc",
        lambda r: ConvBN(3, 8, use_bias=False, rngs=r),
        (1, 16, 16, 3),
        "NHWC",
        "export",
        "nnx.Conv 3x3 SAME no bias -> nnx.BatchNorm",
    )
    yield make(
        "conv_bias_bn_nhwc",
        lambda r: ConvBN(3, 8, use_bias=True, rngs=r),
        (2, 16, 16, 3),
        "NHWC",
        "lower",
        "nnx.Conv 3x3 SAME with bias -> nnx.BatchNorm",
    )
    yield make(
        "depthwise_bn_nhwc",
        lambda r: ConvBN(8, 16, use_bias=True, groups=8, rngs=r),
        (1, 16, 16, 8),
        "NHWC",
        "lower",
        "nnx.Conv feature_group_count=8, 8->16 with bias -> nnx.BatchNorm",
    )
    yield make(
        "dense_bn", lambda r: DenseBN(rngs=r), (2, 20), "NC", "export", "nnx.Linear 20->32 -> nnx.BatchNorm -> relu"
    )
    yield make(
        "resnet_nhwc",
        lambda r: ResNet(rngs=r),
        (2, 16, 16, 3),
        "NHWC",
        "lower",
        "stem conv(bias)-BN-relu + 2 basic blocks (second strided with 1x1 projection+BN) + Linear",
    )


# --------------------------------------------------------------------------- haiku


def haiku_cases() -> Iterator[Case]:
    import haiku as hk
    import jax
    import jax.numpy as jnp

    fw = "haiku"

    def bn(data_format="channels_last", eps=1e-5):
        return hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9, eps=eps, data_format=data_format)

    # Every body takes is_training: init runs with True (so the EMA state exists), the
    # exported function with False.
    def conv_bn(x, is_training, *, with_bias):
        y = hk.Conv2D(8, 3, padding="SAME", with_bias=with_bias)(x)
        return bn()(y, is_training=is_training)

    def conv_bn_nchw(x, is_training):
        y = hk.Conv2D(8, 3, padding="SAME", with_bias=True, data_format="NCHW")(x)
        return bn("channels_first")(y, is_training=is_training)

    def depthwise_bn(x, is_training):
        y = hk.DepthwiseConv2D(channel_multiplier=2, kernel_shape=3, padding="SAME", with_bias=False)(x)
        return bn(eps=1e-3)(y, is_training=is_training)

    def dense_bn(x, is_training):
        y = hk.Linear(32)(x)
        return jax.nn.relu(bn()(y, is_training=is_training))

    def resnet(x, is_training):
        net = hk.nets.ResNet(
            blocks_per_group=(1, 1, 1, 1),
            num_classes=10,
            bottleneck=False,
            channels_per_group=(8, 16, 16, 32),
            use_projection=(True, True, True, True),
            initial_conv_config={"output_channels": 8, "kernel_shape": 3, "stride": 1},
            logits_config={"w_init": hk.initializers.VarianceScaling()},  # default is zeros
        )
        return net(x, is_training=is_training)

    def make(name, body, in_shape, layout, form, desc, numpy_params=False):
        st = Stats(f"{fw}/{name}")
        x = st.input(in_shape)
        f = hk.transform_with_state(body)
        params, state = f.init(jax.random.PRNGKey(zlib.crc32(name.encode()) & 0xFFFF), x, True)
        params = hk.data_structures.to_mutable_dict(jax.tree_util.tree_map(np.asarray, params))
        state = hk.data_structures.to_mutable_dict(jax.tree_util.tree_map(np.asarray, state))
        bn_modules = sorted(k[: -len("/~/mean_ema")] for k in state if k.endswith("/~/mean_ema"))
        for m in bn_modules:
            for stat, gen in (("mean_ema", st.mean), ("var_ema", st.var)):
                ema = state[f"{m}/~/{stat}"]
                value = gen(ema["average"].shape)
                ema["average"] = value
                ema["hidden"] = value.copy()
            params[m]["scale"] = st.gamma(params[m]["scale"].shape)
            params[m]["offset"] = st.beta(params[m]["offset"].shape)
        nprod = 0
        for p in params.values():
            if "w" in p:
                nprod += 1
                if "b" in p:
                    p["b"] = st.bias(p["b"].shape)
        if not numpy_params:  # what f.init hands a user; numpy values reshape eagerly
            params, state = jax.tree_util.tree_map(jnp.asarray, (params, state))
        fn = lambda x: f.apply(params, state, None, x, False)[0]
        return Case(name, fw, layout, len(bn_modules), nprod, form, desc, fn, x, np_out(fn(x)))

    yield make(
        "conv_bn_nhwc",
        lambda x, t: conv_bn(x, t, with_bias=False),
        (1, 16, 16, 3),
        "NHWC",
        "lower",
        "hk.Conv2D 3x3 SAME no bias -> hk.BatchNorm",
    )
    yield make(
        "conv_bias_bn_nhwc",
        lambda x, t: conv_bn(x, t, with_bias=True),
        (2, 16, 16, 3),
        "NHWC",
        "export",
        "hk.Conv2D 3x3 SAME with bias -> hk.BatchNorm",
    )
    yield make(
        "conv_bn_nchw",
        conv_bn_nchw,
        (2, 3, 16, 16),
        "NCHW",
        "export",
        "hk.Conv2D data_format=NCHW (kernel stays HWIO) with bias -> "
        "hk.BatchNorm(data_format=channels_first); params closed over as numpy arrays",
        numpy_params=True,
    )
    yield make(
        "depthwise_bn_nhwc",
        depthwise_bn,
        (1, 16, 16, 8),
        "NHWC",
        "lower",
        "hk.DepthwiseConv2D channel_multiplier=2 (8->16) -> hk.BatchNorm eps=1e-3",
    )
    yield make("dense_bn", dense_bn, (2, 20), "NC", "lower", "hk.Linear 20->32 -> hk.BatchNorm -> relu")
    yield make(
        "resnet_nhwc",
        resnet,
        (2, 32, 32, 3),
        "NHWC",
        "export",
        "hk.nets.ResNet v1, basic blocks (1,1,1,1), channels (8,16,16,32), projections, 3x3 stem",
    )


# --------------------------------------------------------------------------- equinox


def equinox_cases() -> Iterator[Case]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    fw = "equinox"
    producer_types = (eqx.nn.Conv, eqx.nn.Linear, eqx.nn.ConvTranspose)

    class ConvBN(eqx.Module):
        conv: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm

        def __init__(self, cin, cout, *, use_bias, groups=1, mode="ema", key):
            self.conv = eqx.nn.Conv2d(cin, cout, 3, padding="SAME", use_bias=use_bias, groups=groups, key=key)
            self.bn = eqx.nn.BatchNorm(cout, axis_name="batch", mode=mode)

        def __call__(self, x, state):
            return self.bn(self.conv(x), state)

    class DenseBN(eqx.Module):
        linear: eqx.nn.Linear
        bn: eqx.nn.BatchNorm

        def __init__(self, *, key):
            self.linear = eqx.nn.Linear(20, 32, key=key)
            self.bn = eqx.nn.BatchNorm(32, axis_name="batch", mode="ema")

        def __call__(self, x, state):
            y, state = self.bn(self.linear(x), state)
            return jax.nn.relu(y), state

    class BasicBlock(eqx.Module):
        conv1: eqx.nn.Conv2d
        bn1: eqx.nn.BatchNorm
        conv2: eqx.nn.Conv2d
        bn2: eqx.nn.BatchNorm
        proj: eqx.nn.Conv2d | None
        proj_bn: eqx.nn.BatchNorm | None

        def __init__(self, cin, cout, stride, *, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.conv1 = eqx.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, use_bias=False, key=k1)
            self.bn1 = eqx.nn.BatchNorm(cout, axis_name="batch", mode="ema")
            self.conv2 = eqx.nn.Conv2d(cout, cout, 3, padding=1, use_bias=False, key=k2)
            self.bn2 = eqx.nn.BatchNorm(cout, axis_name="batch", mode="ema")
            if stride != 1 or cin != cout:
                self.proj = eqx.nn.Conv2d(cin, cout, 1, stride=stride, use_bias=False, key=k3)
                self.proj_bn = eqx.nn.BatchNorm(cout, axis_name="batch", mode="ema")
            else:
                self.proj = None
                self.proj_bn = None

        def __call__(self, x, state):
            y, state = self.bn1(self.conv1(x), state)
            y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
            if self.proj is not None:
                x, state = self.proj_bn(self.proj(x), state)
            return jax.nn.relu(x + y), state

    class ResNet(eqx.Module):
        stem: eqx.nn.Conv2d
        stem_bn: eqx.nn.BatchNorm
        block1: BasicBlock
        block2: BasicBlock
        head: eqx.nn.Linear

        def __init__(self, *, key):
            k = jax.random.split(key, 4)
            self.stem = eqx.nn.Conv2d(3, 8, 3, padding=1, use_bias=False, key=k[0])
            self.stem_bn = eqx.nn.BatchNorm(8, axis_name="batch", mode="ema")
            self.block1 = BasicBlock(8, 8, 1, key=k[1])
            self.block2 = BasicBlock(8, 16, 2, key=k[2])
            self.head = eqx.nn.Linear(16, 10, key=k[3])

        def __call__(self, x, state):
            x, state = self.stem_bn(self.stem(x), state)
            x, state = self.block1(jax.nn.relu(x), state)
            x, state = self.block2(x, state)
            return self.head(jnp.mean(x, axis=(1, 2))), state

    is_bn = lambda n: isinstance(n, eqx.nn.BatchNorm)

    def make(name, ctor, in_shape, layout, form, desc, batch_counter=100):
        st = Stats(f"{fw}/{name}")
        model, state = eqx.nn.make_with_state(ctor)(key=jax.random.PRNGKey(zlib.crc32(name.encode()) & 0xFFFF))
        nodes = jax.tree_util.tree_leaves(model, is_leaf=lambda n: is_bn(n) or isinstance(n, producer_types))
        bns = [n for n in nodes if is_bn(n)]
        prods = [n for n in nodes if isinstance(n, producer_types)]
        for b in bns:
            mean, var = st.mean(b.input_size), st.var(b.input_size)
            if b.mode == "ema":
                state = state.set(b.ema_state_index, (jnp.asarray(mean), jnp.asarray(var)))
            else:  # "batch": inference divides the hidden EMA by 1 - momentum**counter
                debias = np.float32(1 - b.momentum**batch_counter)
                state = state.set(b.batch_counter, jnp.asarray(batch_counter))
                state = state.set(b.batch_state_index, (jnp.asarray(mean * debias), jnp.asarray(var * debias)))

        def replace(n):
            if is_bn(n):
                return eqx.tree_at(
                    lambda b: (b.weight, b.bias),
                    n,
                    (jnp.asarray(st.gamma(n.input_size)), jnp.asarray(st.beta(n.input_size))),
                )
            if isinstance(n, producer_types) and n.bias is not None:
                return eqx.tree_at(lambda c: c.bias, n, jnp.asarray(st.bias(n.bias.shape)))
            return n

        model = jax.tree_util.tree_map(replace, model, is_leaf=lambda n: is_bn(n) or isinstance(n, producer_types))
        model = eqx.nn.inference_mode(model)
        batched = jax.vmap(lambda x: model(x, state)[0], axis_name="batch")
        x = st.input(in_shape)
        fn = lambda x: batched(x)
        return Case(name, fw, layout, len(bns), len(prods), form, desc, fn, x, np_out(fn(x)))

    yield make(
        "conv_bn_nchw",
        lambda key: ConvBN(3, 8, use_bias=False, key=key),
        (2, 3, 16, 16),
        "NCHW",
        "lower",
        "eqx.nn.Conv2d 3x3 SAME no bias -> eqx.nn.BatchNorm(mode=ema), vmapped",
    )
    yield make(
        "conv_bias_bn_nchw",
        lambda key: ConvBN(3, 8, use_bias=True, key=key),
        (1, 3, 16, 16),
        "NCHW",
        "export",
        "eqx.nn.Conv2d 3x3 SAME with bias -> eqx.nn.BatchNorm(mode=ema), vmapped",
    )
    yield make(
        "conv_bn_batchmode_nchw",
        lambda key: ConvBN(3, 8, use_bias=True, mode="batch", key=key),
        (2, 3, 16, 16),
        "NCHW",
        "export",
        "eqx.nn.Conv2d with bias -> eqx.nn.BatchNorm(mode=batch): zero-debias counter/where chain",
    )
    yield make(
        "grouped_bn_nchw",
        lambda key: ConvBN(8, 16, use_bias=True, groups=8, key=key),
        (1, 8, 16, 16),
        "NCHW",
        "lower",
        "eqx.nn.Conv2d groups=8, 8->16 with bias -> eqx.nn.BatchNorm",
    )
    yield make(
        "dense_bn",
        lambda key: DenseBN(key=key),
        (2, 20),
        "NC",
        "lower",
        "eqx.nn.Linear 20->32 -> eqx.nn.BatchNorm -> relu, vmapped",
    )
    yield make(
        "resnet_nchw",
        lambda key: ResNet(key=key),
        (2, 3, 16, 16),
        "NCHW",
        "export",
        "stem conv-BN-relu + 2 basic blocks (second strided with 1x1 projection+BN) + Linear",
    )


# --------------------------------------------------------------------------- keras


def keras_cases() -> Iterator[Case]:
    import jax.numpy as jnp
    import keras
    from keras import layers

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"keras backend is {keras.backend.backend()!r}, not 'jax'")
    fw = "keras"
    producer_types = (layers.Conv2D, layers.DepthwiseConv2D, layers.Conv2DTranspose, layers.Dense)

    def all_layers(model):
        return [l for l in model._flatten_layers(include_self=False, recursive=True)]

    def calibrate(model, bn, st, x_cal):
        """Running stats = the BN input's actual statistics, perturbed (see docstring)."""
        probe = keras.Model(model.input, bn.input)
        axes = tuple(a for a in range(len(bn.input.shape)) if a != bn.axis % len(bn.input.shape))
        act = np.asarray(probe(x_cal, training=False), dtype=np.float64)
        mean, var = act.mean(axis=axes), act.var(axis=axes)
        var = np.maximum(var, 0.05 * var.mean() + 1e-3)  # dead channels would amplify noise
        c = mean.shape
        return (mean + st.mean(c) * np.sqrt(var)).astype(np.float32), (var * st.var(c)).astype(np.float32)

    def make(name, build, in_shape, layout, form, desc, calibrated=False, input_normalization=False,
             unfoldable=0):
        st = Stats(f"{fw}/{name}")
        keras.utils.set_random_seed(zlib.crc32(name.encode()) & 0xFFFF)
        model = build()
        x_cal = st.input((8,) + tuple(in_shape[1:])) if calibrated else None
        nbn = nprod = 0
        for layer in all_layers(model):
            if isinstance(layer, layers.BatchNormalization):
                nbn += 1
                c = layer.moving_mean.shape
                if calibrated:
                    mean, var = calibrate(model, layer, st, x_cal)
                else:
                    mean, var = st.mean(c), st.var(c)
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(var)
                if layer.gamma is not None:
                    layer.gamma.assign(st.gamma(c))
                if layer.beta is not None:
                    layer.beta.assign(st.beta(c))
            elif isinstance(layer, producer_types):
                nprod += 1
                if getattr(layer, "bias", None) is not None:
                    layer.bias.assign(st.bias(layer.bias.shape))
        x = st.input(in_shape)
        fn = lambda x: model(x, training=False)
        return Case(
            name,
            fw,
            layout,
            nbn,
            nprod,
            form,
            desc,
            fn,
            x,
            np_out(fn(jnp.asarray(x))),
            rtol=5e-5 if calibrated else RTOL,
            input_normalization=input_normalization,
            unfoldable=unfoldable,
        )

    def seq(in_shape, layer_list):
        # Layers are built inside make(), after the seed is set: Keras initializers draw their
        # seed when constructed.
        return lambda: keras.Sequential([keras.Input(in_shape[1:]), *layer_list()])

    yield make(
        "conv_bn_nhwc",
        seq((1, 16, 16, 3), lambda: [layers.Conv2D(8, 3, padding="same", use_bias=False), layers.BatchNormalization()]),
        (1, 16, 16, 3),
        "NHWC",
        "lower",
        "Conv2D 3x3 same no bias -> BatchNormalization",
    )
    yield make(
        "conv_bias_bn_nhwc",
        seq((2, 16, 16, 3), lambda: [layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU()]),
        (2, 16, 16, 3),
        "NHWC",
        "export",
        "Conv2D 3x3 same with bias -> BatchNormalization -> ReLU",
    )
    yield make(
        "conv_bias_bn_nchw",
        seq(
            (2, 3, 16, 16),
            lambda: [
                layers.Conv2D(8, 3, padding="same", data_format="channels_first"),
                layers.BatchNormalization(axis=1),
            ],
        ),
        (2, 3, 16, 16),
        "NCHW",
        "lower",
        "Conv2D channels_first with bias -> BatchNormalization(axis=1)",
    )
    yield make(
        "depthwise_bn_nhwc",
        seq(
            (1, 16, 16, 8),
            lambda: [
                layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2),
                layers.BatchNormalization(),
                layers.ReLU(6.0),
            ],
        ),
        (1, 16, 16, 8),
        "NHWC",
        "export",
        "DepthwiseConv2D depth_multiplier=2 (8->16) with bias -> BatchNormalization -> ReLU6",
    )
    yield make(
        "conv_transpose_bn_nhwc",
        seq(
            (1, 8, 8, 4), lambda: [layers.Conv2DTranspose(8, 3, strides=2, padding="same"), layers.BatchNormalization()]
        ),
        (1, 8, 8, 4),
        "NHWC",
        "lower",
        "Conv2DTranspose 3x3 stride 2 with bias -> BatchNormalization",
    )
    yield make(
        "dense_bn",
        seq((2, 20), lambda: [layers.Dense(32), layers.BatchNormalization(), layers.ReLU()]),
        (2, 20),
        "NC",
        "export",
        "Dense 20->32 -> BatchNormalization -> ReLU",
    )

    def resnet():
        def block(x, filters, stride):
            y = layers.Conv2D(filters, 3, strides=stride, padding="same")(x)
            y = layers.BatchNormalization(epsilon=1.001e-5)(y)
            y = layers.Activation("relu")(y)
            y = layers.Conv2D(filters, 3, padding="same")(y)
            y = layers.BatchNormalization(epsilon=1.001e-5)(y)
            if stride != 1 or x.shape[-1] != filters:
                x = layers.Conv2D(filters, 1, strides=stride)(x)
                x = layers.BatchNormalization(epsilon=1.001e-5)(x)
            return layers.Activation("relu")(layers.Add()([x, y]))

        inp = keras.Input((32, 32, 3))
        x = layers.ZeroPadding2D(1)(inp)
        x = layers.Conv2D(8, 3)(x)
        x = layers.Activation("relu")(layers.BatchNormalization(epsilon=1.001e-5)(x))
        x = block(x, 8, 1)
        x = block(x, 16, 2)
        x = block(x, 16, 1)
        x = layers.GlobalAveragePooling2D()(x)
        return keras.Model(inp, layers.Dense(10)(x))

    yield make(
        "resnet_nhwc",
        resnet,
        (2, 32, 32, 3),
        "NHWC",
        "lower",
        "functional ResNet: padded stem conv-BN-relu + 3 basic blocks (Add, one 1x1 projection+BN), "
        "biased convs, eps=1.001e-5, GAP + Dense",
    )
    yield make(
        "mobilenetv2_nhwc",
        lambda: keras.applications.MobileNetV2(
            input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10, classifier_activation=None
        ),
        (1, 32, 32, 3),
        "NHWC",
        "export",
        "keras.applications.MobileNetV2(alpha=0.35, weights=None, classes=10), 32x32 input; "
        "running stats calibrated on random inputs, then perturbed",
        calibrated=True,
    )

    # Input normalization before a zero-padded stem (issue: exact forward folding
    # through zero padding): prefixes of the real applications, whose graphs hold
    # the preprocessing layers.
    def prefix(application, last_layer, **kwargs):
        def build():
            full = application(input_shape=(32, 32, 3), weights=None, include_top=False, **kwargs)
            return keras.Model(full.input, full.get_layer(last_layer).output)

        return build

    def efficientnet():
        model = prefix(keras.applications.EfficientNetB0, "block1a_project_bn")()
        norm = next(l for l in all_layers(model) if isinstance(l, layers.Normalization))
        # ImageNet statistics, as efficientnet.py's weights="imagenet" path uses (in 0..1 units).
        norm.adapt_mean.assign(np.array([0.485, 0.456, 0.406], np.float32))
        norm.adapt_variance.assign(np.array([0.229, 0.224, 0.225], np.float32) ** 2)
        norm.finalize_state()  # the layer's broadcast mean/variance from the variables
        return model

    yield make(
        "efficientnet_stem_nhwc",
        efficientnet,
        (1, 32, 32, 3),
        "NHWC",
        "export",
        "keras.applications.EfficientNetB0(weights=None, include_top=False) up to block1a_project_bn: "
        "Rescaling(1/255) then Normalization(ImageNet mean/variance), a per-channel shift, then "
        "ZeroPadding2D(correct_pad: ((0, 1), (0, 1))) as an explicit stablehlo.pad and a VALID 3x3/2 "
        "Conv2D + BN + swish, then a depthwise MBConv block with squeeze-excite; running stats "
        "calibrated on random inputs, then perturbed",
        calibrated=True,
        input_normalization=True,
    )
    yield make(
        "densenet121_block_nhwc",
        prefix(keras.applications.DenseNet121, "conv2_block2_concat"),
        (1, 32, 32, 3),
        "NHWC",
        "lower",
        "keras.applications.DenseNet121(weights=None, include_top=False) up to conv2_block2_concat: "
        "stem conv + BN, max pool, then two dense-block layers whose first batch norms are "
        "pre-activation (after the max pool, after the concatenate, each feeding a ReLU): those two "
        "cannot fold and must be reported with a reason; running stats calibrated, then perturbed",
        calibrated=True,
        unfoldable=2,
    )
    yield make(
        "mobilenetv3_stem_nhwc",
        prefix(keras.applications.MobileNetV3Small, "expanded_conv_project_bn",
               include_preprocessing=True, alpha=0.75),
        (1, 32, 32, 3),
        "NHWC",
        "export",
        "keras.applications.MobileNetV3Small(alpha=0.75, include_preprocessing=True, weights=None) up "
        "to expanded_conv_project_bn: Rescaling(1/127.5, offset=-1), a uniform shift, then a SAME "
        "3x3/2 Conv2D (asymmetric zero padding (0, 1)) + BN + hard_swish, then the first depthwise "
        "block; running stats calibrated on random inputs, then perturbed",
        calibrated=True,
        input_normalization=True,
    )


# --------------------------------------------------------------------------- torchax


def _import_torchax():
    """Import torchax, shimming the aten ops and overloads newer torch no longer has (see
    the docstring): torch 2.13 - 2.14 lack named-tensor overloads such as
    ``aten::prod.dim_Dimname``, torch 2.14 whole ops such as ``aten::cholesky``, which
    torchax 0.0.13's tables name. Torch versions that have them (2.11) import unshimmed."""
    import torch
    import torch._ops as torch_ops

    try:
        import torchax

        return torch, torchax
    except AttributeError as e:
        text = str(e).lower()
        if "dimname" not in text and "'aten' object has no attribute" not in text:
            raise
    for mod in [m for m in sys.modules if m == "torchax" or m.startswith("torchax.")]:
        del sys.modules[mod]

    class _MissingOverload:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f"<missing overload {self.name}>"

        def __call__(self, *args, **kwargs):
            raise NotImplementedError(f"{self.name} does not exist in torch {torch.__version__}")

        def __getattr__(self, key):  # a missing op's overloads (.default, .out, ...)
            if key.startswith("__"):
                raise AttributeError(key)
            return _MissingOverload(f"{self.name}.{key}")

    original = torch_ops.OpOverloadPacket.__getattr__

    def getattr_with_shim(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if "dimname" in key.lower() or "names" in key:  # named-tensor overloads only
                return _MissingOverload(f"{self._qualified_op_name}.{key}")
            raise

    # Stays installed: torchax looks up more such overloads lazily (decompositions load on
    # first use). It only changes lookups that would otherwise raise AttributeError.
    torch_ops.OpOverloadPacket.__getattr__ = getattr_with_shim
    # Whole ops: only while torchax imports and loads its op tables (default_env()), and
    # only in aten, so that `hasattr(torch.ops.aten, name)` tells the truth afterwards.
    namespace_getattr = torch_ops._OpNamespace.__getattr__

    def namespace_getattr_with_shim(self, op_name):
        try:
            return namespace_getattr(self, op_name)
        except AttributeError:
            if self.name != "aten" or op_name.startswith("__"):
                raise
            return _MissingOverload(f"aten::{op_name}")

    torch_ops._OpNamespace.__getattr__ = namespace_getattr_with_shim
    try:
        import torchax

        torchax.default_env()
    finally:
        torch_ops._OpNamespace.__getattr__ = namespace_getattr

    return torch, torchax


def torchax_cases() -> Iterator[Case]:
    try:
        torch, torchax = _import_torchax()
    except ImportError as e:
        print(f"torchax: skipped ({e})", file=sys.stderr)
        return
    from torch import nn

    fw = "torchax"

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Identity()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(self.shortcut(x) + y)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
            self.blocks = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2), BasicBlock(16, 16, 1))
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(x.mean(dim=(2, 3)))

    class NormalizedStem(nn.Module):
        """torchvision's preprocessing baked into the export: (x - mean) / std, then a
        ResNet stem (7x7/2 pad 3 conv, BN, ReLU, 3x3/2 max pool) and a basic block."""

        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
            self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.block = BasicBlock(8, 8, 1)

        def forward(self, x):
            x = (x - self.mean) / self.std
            return self.block(self.pool(torch.relu(self.bn1(self.conv1(x)))))

    def make(name, build, in_shape, layout, form, desc, torch_reference=True,
             input_normalization=False):
        st = Stats(f"{fw}/{name}")
        torch.manual_seed(zlib.crc32(name.encode()) & 0xFFFF)
        model = build().eval()
        nbn = nprod = 0
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    nbn += 1
                    c = m.num_features
                    m.running_mean.copy_(torch.from_numpy(st.mean(c)))
                    m.running_var.copy_(torch.from_numpy(st.var(c)))
                    m.weight.copy_(torch.from_numpy(st.gamma(c)))
                    m.bias.copy_(torch.from_numpy(st.beta(c)))
                elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                    nprod += 1  # torch's own init already gives random biases
            x = st.input(in_shape)
            reference = model(torch.from_numpy(x)).numpy()
        params, jax_fn = torchax.extract_jax(model)
        fn = lambda x: jax_fn(params, (x,))
        if not torch_reference:
            import jax

            reference = np_out(jax.jit(fn)(x))
        return Case(name, fw, layout, nbn, nprod, form, desc, fn, x, reference,
                    input_normalization=input_normalization)

    seq = nn.Sequential
    yield make(
        "conv_bn_nchw",
        lambda: seq(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)),
        (2, 3, 16, 16),
        "NCHW",
        "lower",
        "nn.Conv2d 3x3 pad 1 no bias -> nn.BatchNorm2d, eval()",
    )
    yield make(
        "conv_bias_bn_nchw",
        lambda: seq(nn.Conv2d(3, 8, 3, padding="same"), nn.BatchNorm2d(8), nn.ReLU()),
        (1, 3, 16, 16),
        "NCHW",
        "export",
        "nn.Conv2d 3x3 padding=same with bias -> nn.BatchNorm2d -> ReLU, eval()",
    )
    yield make(
        "grouped_bn_nchw",
        lambda: seq(nn.Conv2d(8, 16, 3, padding=1, groups=8), nn.BatchNorm2d(16)),
        (1, 8, 16, 16),
        "NCHW",
        "lower",
        "nn.Conv2d groups=8, 8->16 with bias -> nn.BatchNorm2d",
    )
    yield make(
        "conv_transpose_bn_nchw",
        lambda: seq(nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1), nn.BatchNorm2d(8)),
        (1, 4, 8, 8),
        "NCHW",
        "lower",
        "nn.ConvTranspose2d 4->8 stride 2 with bias -> nn.BatchNorm2d",
    )
    yield make(
        "conv_transpose_grouped_bn_nchw",
        lambda: seq(nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1, groups=2), nn.BatchNorm2d(8)),
        (1, 4, 8, 8),
        "NCHW",
        "export",
        "nn.ConvTranspose2d groups=2, 4->8, stride 2, with bias -> nn.BatchNorm2d. torchax 0.0.13 "
        "lowers grouped ConvTranspose2d to something torch disagrees with; the module is still a valid "
        "grouped transposed conv + BN, verified against torchax's own jit output, not torch",
        torch_reference=False,
    )
    yield make(
        "dense_bn",
        lambda: seq(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU()),
        (2, 20),
        "NC",
        "export",
        "nn.Linear 20->32 -> nn.BatchNorm1d -> ReLU, eval()",
    )
    yield make(
        "resnet_nchw",
        ResNet,
        (2, 3, 16, 16),
        "NCHW",
        "lower",
        "stem conv-BN-relu + 3 basic blocks (one strided with 1x1 projection+BN) + mean + Linear",
    )
    yield make(
        "normalized_stem_nchw",
        NormalizedStem,
        (1, 3, 32, 32),
        "NCHW",
        "lower",
        "torchvision-style (x - mean) / std with the ImageNet constants (per-channel subtract and "
        "divide), then a ResNet stem: nn.Conv2d 7x7 stride 2 padding 3 no bias -> BatchNorm2d -> "
        "ReLU -> MaxPool2d(3, 2, 1) -> one basic block (torchvision itself has no CPU build here; "
        "the modules are written out as torchvision defines them)",
        input_normalization=True,
    )


# --------------------------------------------------------------------------- deployment


def deployment_cases() -> Iterator[Case]:
    """The forms deployed exports take (manifest framework "deployment"):
    mixed precision (Flax's ImageNet dtype setup), symbolic batch (Flax, Keras 3),
    multi-platform, a jitted conv helper shared by layers, Equinox filter_jit."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import keras
    from flax import linen as nn
    from flax import traverse_util
    from keras import layers

    fw = "deployment"

    class Block(nn.Module):
        features: int
        strides: int
        dtype: Any

        @nn.compact
        def __call__(self, x):
            conv = lambda f, k, s: nn.Conv(f, (k, k), (s, s), padding="SAME", use_bias=False,
                                           dtype=self.dtype, param_dtype=jnp.float32)
            bn = lambda: nn.BatchNorm(use_running_average=True, dtype=self.dtype,
                                      param_dtype=jnp.float32)
            y = nn.relu(bn()(conv(self.features, 3, self.strides)(x)))
            y = bn()(conv(self.features, 3, 1)(y))
            if self.strides != 1 or x.shape[-1] != self.features:
                x = bn()(conv(self.features, 1, self.strides)(x))
            return nn.relu(x + y)

    class ResNet18(nn.Module):
        """ResNet-18's layout (stem, 4 stages x 2 basic blocks, 20 BN) at widths 8-64."""

        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            x = nn.Conv(8, (3, 3), padding="SAME", use_bias=False, dtype=self.dtype,
                        param_dtype=jnp.float32)(x)
            x = nn.relu(nn.BatchNorm(use_running_average=True, dtype=self.dtype,
                                     param_dtype=jnp.float32)(x))
            for i, width in enumerate((8, 16, 32, 64)):
                x = Block(width, 1 if i == 0 else 2, self.dtype)(x)
                x = Block(width, 1, self.dtype)(x)
            x = jnp.mean(x, axis=(1, 2))
            return nn.Dense(10, dtype=self.dtype, param_dtype=jnp.float32)(x).astype(jnp.float32)

    def flax_model(name, dtype):
        st = Stats(f"{fw}/{name}")
        module = ResNet18(dtype=dtype)
        x = st.input((2, 32, 32, 3))
        variables = module.init(jax.random.PRNGKey(zlib.crc32(name.encode()) & 0xFFFF), x)
        params = traverse_util.flatten_dict(jax.tree_util.tree_map(np.asarray, variables["params"]))
        stats = traverse_util.flatten_dict(jax.tree_util.tree_map(np.asarray, variables["batch_stats"]))
        bn_paths = randomize_flax_batch_norms(params, stats, st)
        variables = jax.tree_util.tree_map(jnp.asarray, {
            "params": traverse_util.unflatten_dict(params),
            "batch_stats": traverse_util.unflatten_dict(stats)})
        producers = sum(1 for p in params if p[-1] == "kernel")
        return module, variables, x, len(bn_paths), producers

    for dtype, tag, rtol in ((jnp.bfloat16, "bf16", 6e-2), (jnp.float16, "f16", 1e-2)):
        module, variables, x, nbn, nprod = flax_model(f"resnet18_{tag}", dtype)
        fn = lambda x, module=module, variables=variables: module.apply(variables, x)
        yield Case(f"flax_resnet18_{tag}_nhwc", fw, "NHWC", nbn, nprod, "lower",
                   f"Flax linen ResNet-18 layout (widths 8-64), dtype={tag}, param_dtype=f32: "
                   "f32 params converted in the graph, conv in {tag}, BN math widened to f32",
                   fn, x, np_out(fn(x)), rtol=rtol, dtype=tag)

    module, variables, x, nbn, nprod = flax_model("resnet18_symbolic", jnp.float32)
    fn = lambda x: module.apply(variables, x)
    yield Case("flax_resnet18_symbolic_nhwc", fw, "NHWC", nbn, nprod, "export-symbolic",
               "Flax linen ResNet-18 layout, f32, jax.export with a symbolic batch 'b'",
               fn, x, np_out(fn(x)))
    module, variables, x, nbn, nprod = flax_model("resnet18_multiplatform", jnp.float32)
    fn2 = lambda x: module.apply(variables, x)
    yield Case("flax_resnet18_multiplatform_nhwc", fw, "NHWC", nbn, nprod, "export-multiplatform",
               "Flax linen ResNet-18 layout, f32, jax.export for platforms cpu and cuda",
               fn2, x, np_out(fn2(x)))

    # Keras 3 with a symbolic batch.
    st = Stats(f"{fw}/keras_symbolic")
    keras.utils.set_random_seed(7)
    inputs = keras.Input((16, 16, 3))
    y = layers.Conv2D(8, 3, padding="same")(inputs)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(y)
    y = layers.ReLU(6.0)(layers.BatchNormalization()(y))
    y = layers.Conv2D(16, 1, use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    model = keras.Model(inputs, y)
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            c = layer.moving_mean.shape
            layer.moving_mean.assign(st.mean(c))
            layer.moving_variance.assign(st.var(c))
            layer.gamma.assign(st.gamma(c))
            layer.beta.assign(st.beta(c))
    x = st.input((2, 16, 16, 3))
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    kfn = lambda x: model.stateless_call(trainable, frozen, x, training=False)[0]
    yield Case("keras_sepconv_symbolic_nhwc", fw, "NHWC", 3, 3, "export-symbolic",
               "Keras 3 Conv2D/DepthwiseConv2D/Conv2D + BatchNormalization + ReLU/ReLU6 via "
               "stateless_call, jax.export with a symbolic batch", kfn, x, np_out(kfn(x)))

    # A jitted conv helper shared by four layers.
    st = Stats(f"{fw}/jit_helper")

    @jax.jit
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    widths = (3, 8, 8, 16, 16)
    layers_ = [dict(k=st.input((3, 3, a, b)) * np.float32(0.3), mean=st.mean(b), var=st.var(b),
                    gamma=st.gamma(b), beta=st.beta(b)) for a, b in zip(widths, widths[1:])]

    def helper_model(x):
        for p in layers_:
            y = conv(x, jnp.asarray(p["k"]))
            x = jax.nn.relu((y - p["mean"]) / jnp.sqrt(p["var"] + 1e-5) * p["gamma"] + p["beta"])
        return x

    x = st.input((2, 8, 8, 3))
    yield Case("jax_jit_conv_helper_nhwc", fw, "NHWC", 4, 4, "lower",
               "plain JAX: a @jax.jit conv helper called by 4 layers with different kernels, "
               "BN as (y - mean) / sqrt(var + eps) * gamma + beta", helper_model, x,
               np_out(helper_model(x)))

    # Equinox with filter_jit inside the model.
    st = Stats(f"{fw}/equinox_filter_jit")

    class ConvBN(eqx.Module):
        conv: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm

        def __init__(self, cin, cout, *, key):
            self.conv = eqx.nn.Conv2d(cin, cout, 3, padding=1, use_bias=False, key=key)
            self.bn = eqx.nn.BatchNorm(cout, axis_name="batch", mode="ema")

        @eqx.filter_jit
        def __call__(self, x, state):
            y, state = self.bn(self.conv(x), state)
            return jax.nn.relu(y), state

    class Net(eqx.Module):
        a: ConvBN
        b: ConvBN

        def __init__(self, *, key):
            k1, k2 = jax.random.split(key)
            self.a, self.b = ConvBN(3, 8, key=k1), ConvBN(8, 8, key=k2)

        def __call__(self, x, state):
            x, state = self.a(x, state)
            return self.b(x, state)

    net, state = eqx.nn.make_with_state(Net)(key=jax.random.PRNGKey(3))
    for b in (net.a.bn, net.b.bn):
        state = state.set(b.ema_state_index, (jnp.asarray(st.mean(8)), jnp.asarray(st.var(8))))
    net = eqx.tree_at(lambda n: (n.a.bn.weight, n.a.bn.bias, n.b.bn.weight, n.b.bn.bias), net,
                      (jnp.asarray(st.gamma(8)), jnp.asarray(st.beta(8)),
                       jnp.asarray(st.gamma(8)), jnp.asarray(st.beta(8))))
    inference = eqx.nn.inference_mode(net)

    def eqx_fn(x):
        return jax.vmap(lambda xi: inference(xi, state)[0], axis_name="batch")(x)

    x = st.input((2, 3, 8, 8))
    yield Case("equinox_filter_jit_nchw", fw, "NCHW", 2, 2, "lower",
               "Equinox Conv2d + BatchNorm blocks whose __call__ is eqx.filter_jit (private "
               "functions with the parameters as arguments), vmap over the batch",
               eqx_fn, x, np_out(eqx_fn(x)))


# --------------------------------------------------------------------------- downstream

# Full-size applications for tools/downstream.py (--downstream): what folding buys a
# compiler. Written outside testdata (tens of MB each), at every --batch and --dtype.
DOWNSTREAM_MODELS = {
    "keras_resnet50": ("ResNet50", 53, "keras.applications.ResNet50"),
    "keras_mobilenetv2": ("MobileNetV2", 52, "keras.applications.MobileNetV2(alpha=1.0)"),
    "keras_efficientnetb0": ("EfficientNetB0", 49, "keras.applications.EfficientNetB0"),
    # torchvision through torchax (NCHW; files torchax_<model>_...)
    "torchvision_resnet50": ("resnet50", 53, "torchvision.models.resnet50"),
    "torchvision_mobilenetv2": ("mobilenet_v2", 52, "torchvision.models.mobilenet_v2"),
    "torchvision_efficientnetb0": ("efficientnet_b0", 49, "torchvision.models.efficientnet_b0"),
}
DEFAULT_DOWNSTREAM_OUT = Path(os.environ.get("TMPDIR", "/tmp")) / "bnfold-downstream-exports"


def downstream_cases(models: list[str], batches: list[int], dtypes: list[str],
                     resolution: int) -> Iterator[Case]:
    """The keras_* models (keras_downstream_cases), then the torchvision_* ones
    (torchvision_downstream_cases)."""
    keras_models = [m for m in models if m.startswith("keras_")]
    tv_models = [m for m in models if m.startswith("torchvision_")]
    if keras_models:
        yield from keras_downstream_cases(keras_models, batches, dtypes, resolution)
    if tv_models:
        yield from torchvision_downstream_cases(tv_models, batches, dtypes, resolution)


def torchvision_downstream_cases(models: list[str], batches: list[int], dtypes: list[str],
                                 resolution: int) -> Iterator[Case]:
    """torchvision.models resnet50, mobilenet_v2 and efficientnet_b0 (weights=None, eval,
    NCHW) through torchax, exported with jax.export, the parameters closed over. As for
    the keras models, every BatchNorm2d's running statistics are calibrated on a random
    batch (each layer sees the calibrated layers before it: a forward pre-hook sets its
    statistics from its actual input, then it runs) and perturbed, mean = m + N(0, 0.5) s,
    var = s^2 U(0.5, 2.0); gamma and beta random (Stats); conv biases random. bf16 is the
    whole model `.to(torch.bfloat16)`, its error against the f32 model's torch eager output
    reported, not checked. Works with torch 2.11 - 2.14 and torchax 0.0.13 (the import
    shim only acts where torch lacks an op torchax names)."""
    torch, torchax = _import_torchax()
    import torchvision
    from torch import nn

    for key in models:
        ctor, nbn, desc = DOWNSTREAM_MODELS[key]
        st = Stats(f"downstream/{key}")
        torch.manual_seed(zlib.crc32(key.encode()) & 0xFFFF)
        model = getattr(torchvision.models, ctor)(weights=None).eval()
        bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        if len(bns) != nbn:
            raise AssertionError(f"{key}: {len(bns)} BatchNorm2d layers, expected {nbn}")
        nprod = sum(1 for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear))

        def calibrate(bn, inputs, st=st):
            x = inputs[0].detach().double()
            mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
            var = torch.clamp(var, min=float(0.05 * var.mean() + 1e-3))
            c = bn.num_features
            bn.running_mean.copy_((mean + torch.from_numpy(st.mean(c)).double() * var.sqrt()).float())
            bn.running_var.copy_((var * torch.from_numpy(st.var(c)).double()).float())
            bn.weight.copy_(torch.from_numpy(st.gamma(c)))
            bn.bias.copy_(torch.from_numpy(st.beta(c)))

        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Conv2d) and m.bias is not None:
                    m.bias.copy_(torch.from_numpy(st.bias(m.bias.shape)))
            hooks = [bn.register_forward_pre_hook(calibrate) for bn in bns]
            model(torch.from_numpy(st.input((4, 3, resolution, resolution))))
            for h in hooks:
                h.remove()
        for dtype in dtypes:
            typed = model if dtype == "f32" else copy.deepcopy(model).to(torch.bfloat16).eval()
            params, jax_fn = torchax.extract_jax(typed)
            fn = lambda x, params=params, jax_fn=jax_fn: jax_fn(params, (x,))
            for batch in batches:
                x = st.input((batch, 3, resolution, resolution))
                with torch.no_grad():
                    reference = model(torch.from_numpy(x)).numpy()
                if dtype == "bf16":
                    import jax.numpy as jnp

                    x = x.astype(jnp.bfloat16)
                yield Case(
                    f"{key.split('_', 1)[1]}_{resolution}_b{batch}_{dtype}_nchw",
                    "torchax", "NCHW", nbn, nprod, "export",
                    f"{desc}(weights=None).eval() through torchax, {resolution}x{resolution}, "
                    f"{dtype}, batch {batch}; batch-norm statistics calibrated on a random batch, "
                    f"then perturbed; random conv biases",
                    fn, x, reference, rtol=RTOL * 10 if dtype == "f32" else None, dtype=dtype)


def keras_downstream_cases(models: list[str], batches: list[int], dtypes: list[str],
                           resolution: int) -> Iterator[Case]:
    """keras.applications models (weights=None, include_top, no classifier activation)
    at resolution x resolution, NHWC, exported with jax.export. Batch-norm statistics
    and affine parameters are random as for the test data (Stats), conv biases too;
    bf16 is the whole model in bfloat16 (dtype policy "bfloat16", the f32 model's
    weights cast), as torchvision's `.to(torch.bfloat16)` is. The reference is the
    f32 model's eager output; a bf16 model's error against it is reported, not checked
    (a whole model in bf16 drifts far from f32: EfficientNetB0 by the size of its
    output), beyond a finite output that depends on the input. As for
    keras_mobilenetv2_nhwc, the running statistics are calibrated layer by layer on a
    random batch and then perturbed (with plain random statistics the signal of these
    deep stacks dies out or grows without bound)."""
    import jax.numpy as jnp
    import keras
    from keras import layers

    for key in models:
        app, nbn, desc = DOWNSTREAM_MODELS[key]
        st = Stats(f"downstream/{key}")
        keras.utils.set_random_seed(zlib.crc32(key.encode()) & 0xFFFF)

        def build(dtype: str, app=app) -> Any:
            keras.config.set_dtype_policy({"f32": "float32", "bf16": "bfloat16"}[dtype])
            try:
                return getattr(keras.applications, app)(
                    input_shape=(resolution, resolution, 3), weights=None,
                    classifier_activation=None)
            finally:
                keras.config.set_dtype_policy("float32")

        model = build("f32")
        x_cal = st.input((4, resolution, resolution, 3))
        count = nprod = 0
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, layers.BatchNormalization):
                count += 1
                c = layer.moving_mean.shape
                probe = keras.Model(model.input, layer.input)
                act = np.asarray(probe(x_cal, training=False), dtype=np.float64)
                mean, var = act.mean(axis=(0, 1, 2)), act.var(axis=(0, 1, 2))
                var = np.maximum(var, 0.05 * var.mean() + 1e-3)  # dead channels would amplify noise
                layer.moving_mean.assign((mean + st.mean(c) * np.sqrt(var)).astype(np.float32))
                layer.moving_variance.assign((var * st.var(c)).astype(np.float32))
                layer.gamma.assign(st.gamma(c))
                layer.beta.assign(st.beta(c))
            elif isinstance(layer, layers.Conv2D | layers.DepthwiseConv2D | layers.Dense):
                nprod += 1
                if getattr(layer, "bias", None) is not None:
                    layer.bias.assign(st.bias(layer.bias.shape))
        if count != nbn:
            raise AssertionError(f"{key}: {count} BatchNormalization layers, expected {nbn}")
        f32_fn = lambda x, model=model: model(x, training=False)
        for dtype in dtypes:
            typed = model
            if dtype != "f32":
                typed = build(dtype)
                typed.set_weights(model.get_weights())
            fn = lambda x, typed=typed: typed(x, training=False)
            for batch in batches:
                x = st.input((batch, resolution, resolution, 3))
                reference = np_out(f32_fn(jnp.asarray(x)))
                if dtype == "bf16":
                    x = x.astype(jnp.bfloat16)
                yield Case(
                    f"{key.split('_', 1)[1]}_{resolution}_b{batch}_{dtype}_nhwc",
                    "keras", "NHWC", nbn, nprod, "export",
                    f"{desc}(input_shape=({resolution}, {resolution}, 3), weights=None, "
                    f"classifier_activation=None), {dtype}, batch {batch}; batch-norm "
                    f"statistics calibrated on a random batch, then perturbed; random conv biases",
                    fn, x, reference, rtol=RTOL * 10 if dtype == "f32" else None, dtype=dtype)


BUILDERS: dict[str, Callable[[], Iterator[Case]]] = {
    "flax_linen": flax_linen_cases,
    "flax_nnx": flax_nnx_cases,
    "haiku": haiku_cases,
    "equinox": equinox_cases,
    "keras": keras_cases,
    "torchax": torchax_cases,
    "deployment": deployment_cases,
}


# --------------------------------------------------------------------------- driver


def manifest_entry(case: Case, output_shape) -> dict:
    return {
        "file": case.file,
        "framework": case.framework,
        "layout": case.layout,
        "batchnorm_layers": case.batchnorm_layers,
        "producers": case.producers,
        "input_shape": list(case.x.shape),
        "output_shape": list(output_shape),
        "form": case.form,
        "rtol": case.rtol,
        "dtype": case.dtype,
        "description": case.description,
        **({"input_normalization": True} if case.input_normalization else {}),
        **({"unfoldable": case.unfoldable} if case.unfoldable else {}),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Frameworks: " + ", ".join(FRAMEWORKS),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output directory (default: {DEFAULT_OUT.relative_to(REPO_ROOT)} in the repo)",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="FRAMEWORK",
        help="export only these frameworks (repeatable or comma-separated)",
    )
    parser.add_argument(
        "--no-verify", action="store_true", help="skip compiling and comparing each file with the framework's output"
    )
    group = parser.add_argument_group(
        "full-size models for tools/downstream.py (written outside testdata: tens of MB each)")
    group.add_argument(
        "--downstream",
        metavar="MODELS",
        help="export these full-size models instead of the test data, comma-separated: "
        + ", ".join(DOWNSTREAM_MODELS) + f" (--out defaults to {DEFAULT_DOWNSTREAM_OUT})",
    )
    group.add_argument("--batch", default="1,32", help="batch sizes, comma-separated (default: 1,32)")
    group.add_argument("--dtype", default="f32", help="f32, bf16 or both, comma-separated (default: f32)")
    group.add_argument("--resolution", type=int, default=224, help="image height and width (default: 224)")
    args = parser.parse_args(argv)
    if args.downstream is not None:
        args.downstream = [m.strip() for m in args.downstream.split(",") if m.strip()]
        unknown = [m for m in args.downstream if m not in DOWNSTREAM_MODELS]
        try:
            args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
        except ValueError:
            parser.error(f"--batch: expected comma-separated integers, got {args.batch!r}")
        args.dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
        bad = [d for d in args.dtypes if d not in ("f32", "bf16")]
        if unknown or bad or not args.downstream or not args.dtypes or not args.batches \
                or min(args.batches) < 1 or args.resolution < 32:
            parser.error(f"--downstream: unknown model(s) {unknown} (known: {', '.join(DOWNSTREAM_MODELS)}), "
                         f"dtype(s) {bad} (known: f32, bf16), or a batch < 1 or resolution < 32")
        if args.only:
            parser.error("--downstream and --only exclude each other")
        if args.out == DEFAULT_OUT:
            args.out = DEFAULT_DOWNSTREAM_OUT
    selected = []
    for item in args.only or list(FRAMEWORKS):
        for name in item.split(","):
            name = name.strip()
            if name not in FRAMEWORKS:
                parser.error(f"unknown framework {name!r}; choose from {', '.join(FRAMEWORKS)}")
            if name not in selected:
                selected.append(name)
    args.frameworks = selected
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    old_entries = json.loads(manifest_path.read_text()) if manifest_path.exists() else []
    downstream = args.downstream is not None
    # Test data: the selected frameworks' entries are rewritten; full-size models: the
    # files written replace their own entries only.
    entries = {e["file"]: e for e in old_entries
               if downstream or e["framework"] not in args.frameworks}
    builders = BUILDERS
    if downstream:  # one family of full-size models (keras_* and torchvision_* keys)
        args.frameworks = ["downstream"]
        builders = {"downstream": lambda: downstream_cases(args.downstream, args.batches,
                                                           args.dtypes, args.resolution)}

    t_start = time.perf_counter()
    failures = []
    for fw in args.frameworks:
        t0 = time.perf_counter()
        count = 0
        for case in builders[fw]():
            text = lower(case.fn, case.x, case.form)
            (out / case.file).write_text(text)
            status = "not verified"
            try:
                if not args.no_verify:
                    err = verify(case, text, max_bytes=None if downstream else MAX_FILE_BYTES)
                    status = f"ok, max rel err {err:.1e}"
            except AssertionError as e:
                status = "FAILED"
                failures.append(f"{case.file}: {e}")
            entries[case.file] = manifest_entry(case, case.reference.shape)
            count += 1
            print(
                f"  {case.file:45s} {len(text.encode()) / 1024:8.1f} KiB  bn={case.batchnorm_layers:<3d}"
                f" producers={case.producers:<3d} {case.form:6s} {status}"
            )
        print(f"{fw}: {count} models in {time.perf_counter() - t0:.1f} s")

    ordered = sorted(entries.values(), key=lambda e: (FRAMEWORKS.index(e["framework"]), e["file"]))
    manifest_path.write_text(json.dumps(ordered, indent=2) + "\n")
    total = sum(p.stat().st_size for p in out.glob("*") if p.is_file())
    print(
        f"wrote {manifest_path} ({len(ordered)} entries); directory {total / 2**20:.2f} MiB;"
        f" {time.perf_counter() - t_start:.1f} s"
    )
    if total > MAX_DIR_BYTES and not downstream:
        failures.append(f"directory is {total} bytes > {MAX_DIR_BYTES}")
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
