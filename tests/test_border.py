"""bnfold.border, the exact output of a convolution whose input is a per-channel constant.

`border.correction` stores C = conv(T, K), T holding t[c] at every position of channel c,
as a small table of row classes with a run-length encoding per spatial axis. Expanded
in numpy (independently of bnfold's IR builder), it must equal XLA's convolution of that
constant input, for random layouts, strides, padding (negative too), lhs and rhs
dilation, window reversal and feature groups, in float64.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import modgen
from bnfold import border, producers
from bnfold import ir as bir
from test_properties import PROFILE, run_xla


def expand(corr: border.Correction, window: border.Window) -> np.ndarray:
    """C over [output spatial..., features] from its table and runs."""
    table = corr.table
    for d, runs in enumerate(corr.runs):
        if runs:
            index = np.concatenate([np.full(length, cls) for cls, length in runs])
            table = np.take(table, index, axis=d)
        else:
            assert table.shape[d] == window.output_sizes[d]
    return table


@settings(max_examples=40 if PROFILE == "ci" else 2000)
@given(modgen.convs(modes=("plain", "groups")), st.integers(0, 2**16))
def test_correction_is_the_convolution_of_a_constant_input(conv_and_axis, seed):
    conv = conv_and_axis[0]
    rng = np.random.default_rng(seed)
    kernel = rng.normal(0, 1, conv.kernel_shape())
    b = modgen.Builder("f64")
    x = b.arg(conv.in_shape())
    y = conv.render(b, x, b.const(kernel, kernel.shape, "k"))
    text = b.module([y])
    context = bir.make_context()
    module = bir.parse(text, context)
    with context:
        op = next(o.operation for o in module.body.operations[0].regions[0].blocks[0].operations
                  if o.operation.name == "stablehlo.convolution")
        dims = producers.conv_dims(op)
        win = border.window(op)
        assert isinstance(win, border.Window)
        mapping = producers.input_scale_map(op, 0, dims.input_feature_dimension)
        assert isinstance(mapping, producers.InputScaleMap)
        shift = rng.normal(0, 1, conv.in_features)
        weighted = kernel * mapping.expand(shift, kernel.shape)
        corr = border.correction(op, win, weighted, limit=10**9)
        assert isinstance(corr, border.Correction)
        spatial_out = list(dims.output_spatial_dimensions)
        feature_out = dims.output_feature_dimension
        in_feature = dims.input_feature_dimension
    constant = np.broadcast_to(shift.reshape([-1 if d == in_feature else 1
                                              for d in range(len(conv.in_shape()))]),
                               conv.in_shape())
    out = run_xla(text, [np.ascontiguousarray(constant)])[0]
    # [batch 0, spatial..., feature] of XLA's output, every batch the same
    expected = np.moveaxis(out, [spatial_out[i] for i in range(len(spatial_out))] + [feature_out],
                           list(range(len(spatial_out))) + [len(spatial_out)])
    expected = expected.reshape(expected.shape[:len(spatial_out) + 1] + (-1,))[..., 0]
    np.testing.assert_allclose(expand(corr, win), expected, rtol=1e-12, atol=1e-12)
