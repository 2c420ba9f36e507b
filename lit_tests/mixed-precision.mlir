// RUN: %bnfold-opt --split-input-file %s | %filecheck %s
// RUN: %bnfold-opt --split-input-file %s --report - -o /dev/null | %filecheck %s --check-prefix=REPORT
// REPORT: "reason": "precision: the kernel is stored as bf16 but the dot_general result and the normalization are computed in f32

// Flax mixed precision (dtype=bf16, param_dtype=f32): the f32 kernel is
// converted to bf16, the conv runs in bf16, the normalization in f32, and the
// result is narrowed again. The f32 kernel is scaled (rounded once by the
// convert, where the original rounded); the bias is added in f32.
// CHECK-LABEL: @flax_mixed_precision_bf16
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xbf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[KB:.+]] = stablehlo.convert %[[K]] : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xbf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[KB]]
// CHECK-NEXT:    %[[W:.+]] = stablehlo.convert %[[CONV]] : (tensor<1x3x3x2xbf16>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[W]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.convert %[[R]] : (tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xbf16>
// CHECK-NEXT:    return %[[N]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
func.func @flax_mixed_precision_bf16(%x: tensor<1x3x3x2xbf16>) -> tensor<1x3x3x2xbf16> {
  %k32 = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %k = stablehlo.convert %k32 : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xbf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xbf16>, tensor<1x1x2x2xbf16>) -> tensor<1x3x3x2xbf16>
  %wide = stablehlo.convert %conv : (tensor<1x3x3x2xbf16>) -> tensor<1x3x3x2xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %scale = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scale_b = stablehlo.broadcast_in_dim %scale, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %wide, %mean_b : tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %centered, %scale_b : tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %beta_b : tensor<1x3x3x2xf32>
  %narrow = stablehlo.convert %y : (tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xbf16>
  return %narrow : tensor<1x3x3x2xbf16>
}

// -----

// A bf16 kernel with no wider source, under an f32 result (preferred_element_type):
// folding would round the f32 scale into bf16 weights. Refused; the IR is unchanged.
// CHECK-LABEL: @narrow_kernel_wide_result_is_refused
// CHECK:         %[[Y:.+]] = stablehlo.dot_general
// CHECK:         stablehlo.multiply %[[Y]]
func.func @narrow_kernel_wide_result_is_refused(%x: tensor<2x2xbf16>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xbf16>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x2xbf16>, tensor<2x2xbf16>) -> tensor<2x2xf32>
  %s = stablehlo.constant dense<[[0.3, 7.0]]> : tensor<1x2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0, 1] : (tensor<1x2xf32>) -> tensor<2x2xf32>
  %r = stablehlo.multiply %y, %sb : tensor<2x2xf32>
  return %r : tensor<2x2xf32>
}
