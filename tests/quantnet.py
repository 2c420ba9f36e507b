"""A MobileNetV2-shaped network with calibrated batch norms, exported to StableHLO by JAX.

What data-free quantization is measured on (Nagel et al. 2019 use MobileNetV2):
a stem convolution, inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1
project, a residual add where the shapes allow), ReLU6, and a global average
pool with a dense classifier. Every convolution is followed by a batch norm in
the decomposed form JAX frameworks export, `(y - mean) * rsqrt(var + eps) *
gamma + beta`, whose statistics are *calibrated*: the mean and variance each
batch norm sees on inputs drawn from `N(0, 1)` (the distribution the tests feed
it), computed layer by layer in float64, as training leaves them.

`spread=True` then gives the depthwise batch norms the per-channel ranges
training produces (as tools/quant_bench.py does to torchvision's model): their
gamma and beta times `a ~ log-uniform[1e-3, 1]` per channel, compensated in
the next 1x1 convolution's input weights by `1 / a` (the float function is kept
except where ReLU6 saturates). Per-tensor int8 weights then need equalization.

    text = quantnet.mobilenet(seed=0).stablehlo()     # parameters are constants
    xs = quantnet.inputs(seed=1, batch=8)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-3
# (expansion, output channels, stride) per block: a MobileNetV2 prefix at width 0.5.
BLOCKS = ((1, 8, 1), (6, 12, 2), (6, 12, 1), (6, 16, 2), (6, 16, 1), (6, 16, 1), (6, 32, 2),
          (6, 32, 1))
# torchvision's MobileNetV2 (width 1.0): (t, c, n, s) rows expanded to blocks.
TORCHVISION = tuple((t, c, s if i == 0 else 1)
                    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2),
                                       (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                                       (6, 320, 1, 1))
                    for i in range(n))


@dataclass
class Conv:
    kernel: np.ndarray  # HWIO
    stride: int
    groups: int
    gamma: np.ndarray = field(default_factory=lambda: np.zeros(0))
    beta: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    var: np.ndarray = field(default_factory=lambda: np.zeros(0))
    relu6: bool = True


@dataclass
class Net:
    stem: Conv
    blocks: list[tuple[Conv, Conv, Conv, bool]]  # expand (or None), depthwise, project, residual
    head: Conv  # 1x1 to the last features
    dense: np.ndarray  # [features, classes]
    dense_bias: np.ndarray
    resolution: int

    def forward(self, x: jax.Array) -> jax.Array:
        y = _layer(self.stem, x)
        for expand, depthwise, project, residual in self.blocks:
            z = _layer(expand, y) if expand is not None else y
            z = _layer(project, _layer(depthwise, z))
            y = y + z if residual else z
        y = _layer(self.head, y)
        pooled = jnp.mean(y, axis=(1, 2))
        return pooled @ self.dense + self.dense_bias

    def stablehlo(self, batch: int = 1) -> str:
        x = jax.ShapeDtypeStruct((batch, self.resolution, self.resolution, 3), jnp.float32)
        return str(jax.jit(self.forward).lower(x).compiler_ir("stablehlo"))


def _conv(conv: Conv, x: jax.Array) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x, jnp.asarray(conv.kernel, x.dtype), (conv.stride, conv.stride), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=conv.groups)


def _layer(conv: Conv, x: jax.Array) -> jax.Array:
    y = _conv(conv, x)
    f = x.dtype
    y = (y - jnp.asarray(conv.mean, f)) * jax.lax.rsqrt(jnp.asarray(conv.var, f) + EPS) \
        * jnp.asarray(conv.gamma, f) + jnp.asarray(conv.beta, f)
    return jnp.clip(y, 0.0, 6.0) if conv.relu6 else y


def inputs(seed: int, batch: int, resolution: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, resolution, resolution, 3)
                                              ).astype(np.float32)


def mobilenet(seed: int = 0, spread: bool = True, calibration: int = 32,
              resolution: int = 32, classes: int = 10, blocks_spec: tuple = BLOCKS,
              stem_channels: int = 16, head_channels: int = 128,
              torchvision_init: bool = False) -> Net:
    """A random MobileNetV2-shaped network, its batch norms calibrated on N(0, 1) inputs.
    `torchvision_init`: gamma 1 and beta 0 (torchvision's batch-norm init; else random)."""
    rng = np.random.default_rng(seed)

    def conv(k: int, cin: int, cout: int, stride: int = 1, groups: int = 1,
             relu6: bool = True) -> Conv:
        fan_in = k * k * cin // groups
        kernel = rng.normal(0, np.sqrt(2.0 / fan_in), size=(k, k, cin // groups, cout))
        if torchvision_init:
            return Conv(kernel, stride, groups, gamma=np.ones(cout), beta=np.zeros(cout),
                        relu6=relu6)
        return Conv(kernel, stride, groups, gamma=rng.uniform(0.5, 1.5, cout),
                    beta=rng.normal(0, 0.5, cout), relu6=relu6)

    stem = conv(3, 3, stem_channels, stride=2)
    blocks = []
    cin = stem_channels
    for t, cout, stride in blocks_spec:
        hidden = cin * t
        expand = conv(1, cin, hidden) if t != 1 else None
        depthwise = conv(3, hidden, hidden, stride=stride, groups=hidden)
        project = conv(1, hidden, cout, relu6=False)
        blocks.append((expand, depthwise, project, stride == 1 and cin == cout))
        cin = cout
    head = conv(1, cin, head_channels)
    net = Net(stem, blocks, head,
              rng.normal(0, np.sqrt(1.0 / head_channels), (head_channels, classes)),
              rng.normal(0, 0.1, classes), resolution)
    _calibrate(net, inputs(seed + 1000, calibration, resolution))
    if spread:
        _spread(net, rng)
    return net


def _calibrate(net: Net, x: np.ndarray) -> None:
    """Each batch norm's mean and variance: what it sees on `x`, layer by layer (float64)."""
    with jax.enable_x64():
        def fit(conv: Conv, value: jax.Array) -> jax.Array:
            y = _conv(conv, value)
            conv.mean = np.asarray(jnp.mean(y, axis=(0, 1, 2)))
            conv.var = np.asarray(jnp.var(y, axis=(0, 1, 2)))
            return _layer(conv, value)

        y = fit(net.stem, jnp.asarray(x, jnp.float64))
        for expand, depthwise, project, residual in net.blocks:
            z = fit(expand, y) if expand is not None else y
            z = fit(project, fit(depthwise, z))
            y = y + z if residual else z
        fit(net.head, y)


def _spread(net: Net, rng: np.random.Generator) -> None:
    """Depthwise batch norms' gamma and beta times a ~ log-uniform[1e-3, 1] per channel,
    the next 1x1 convolution's input weights times 1 / a."""
    for _, depthwise, project, _ in net.blocks:
        a = np.exp(rng.uniform(np.log(1e-3), 0.0, depthwise.gamma.size))
        depthwise.gamma = depthwise.gamma * a
        depthwise.beta = depthwise.beta * a
        project.kernel = project.kernel / a[None, None, :, None]


def sqnr_db(actual: np.ndarray, expected: np.ndarray) -> float:
    """10 log10(sum y^2 / sum (y_q - y)^2) over the batch."""
    expected = np.asarray(expected, np.float64)
    noise = np.sum((np.asarray(actual, np.float64) - expected) ** 2)
    return float(10 * np.log10(np.sum(expected ** 2) / noise)) if noise else float("inf")
