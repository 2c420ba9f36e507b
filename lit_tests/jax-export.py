# RUN: %PYTHON %s | %filecheck %s
# The jax.export hook: parameters passed as arguments are bound, the
# decomposed batch norm folds, and the folded Exported keeps only `x`.

import jax
import numpy as np

from bnfold.jax_export import fold_exported


def apply(params, x):
    y = jax.lax.conv_general_dilated(x, params["k"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (y - params["mean"]) * jax.lax.rsqrt(params["var"] + 1e-5) * params["gamma"] + params["beta"]


params = {"k": np.full((3, 3, 2, 4), 0.5, np.float32),
          "mean": np.array([0.0, 1.0, 2.0, 3.0], np.float32),
          "var": np.array([1.0, 3.0, 0.25, 0.0625], np.float32) - 1e-5,
          "gamma": np.ones(4, np.float32), "beta": np.zeros(4, np.float32)}
x = np.ones((1, 4, 4, 2), np.float32)
exported = jax.export.export(jax.jit(apply))(params, x)
folded, report = fold_exported(exported, params)
print(f"folds={len(report.folds)} inputs={len(folded.in_avals)}")
print(folded.mlir_module())

# CHECK: folds=1 inputs=1
# CHECK-LABEL: func.func public @main
# CHECK-SAME: (%[[X:.+]]: tensor<1x4x4x2xf32>
# CHECK-NOT: stablehlo.rsqrt
# CHECK: %[[K:.+]] = stablehlo.constant dense<{{.*}}> : tensor<3x3x2x4xf32>
# CHECK: %[[C:.+]] = stablehlo.convolution(%[[X]], %[[K]])
# CHECK: %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, -0.577350{{[0-9]*}}, -4.000000e+00, -1.200000e+01]> : tensor<4xf32>
# CHECK: %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
# CHECK: stablehlo.add %[[C]], %[[BB]]
# CHECK-NOT: stablehlo.multiply
# CHECK-NOT: stablehlo.subtract
