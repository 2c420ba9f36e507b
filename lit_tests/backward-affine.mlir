// RUN: %bnfold-opt --split-input-file %s | %filecheck %s

// Folds batch_norm_inference into the convolution or dot_general before it.
// Statistics are chosen so that var + eps is 0.25, 1, 4 or 16: every folded
// value is exact in f32 unless the case is about rounding.
//
// BN over 2 channels used below: gamma [1, 3], beta [0.5, -1], mean [2, -4],
// var [3.75, 0], eps 0.25  ->  scale [0.5, 6], shift [-0.5, 23].
// Over 3 channels: gamma [1, 2, 3], beta [0.5, 0.25, -1], mean [1, 2, 3],
// var [3.75, 0, 0.75], eps 0.25  ->  scale [0.5, 4, 3], shift [0, -7.75, -10].
// Over 4 channels: gamma [1, 2, 3, 4], beta [0, 1, 2, 3], mean [0.5, 1, 1.5, 2],
// var [3.75, 0.75, 15.75, 0], eps 0.25  ->  scale [0.5, 2, 0.75, 8],
// shift [-0.25, -1, 0.875, -13].

// CHECK-LABEL: @nhwc_hwio
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 8.000000e+00, 9.000000e+00], [2.000000e+00, 2.000000e+01, 1.800000e+01]]]]> : tensor<1x1x2x3xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, -7.750000e+00, -1.000000e+01]> : tensor<3xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @nhwc_hwio(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]]]> : tensor<1x1x2x3xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x3xf32>) -> tensor<1x3x3x3xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = stablehlo.constant dense<[0.5, 0.25, -1.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[3.75, 0.0, 0.75]> : tensor<3xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<1x3x3x3xf32>
  return %bn : tensor<1x3x3x3xf32>
}

// -----

// The kernel is scaled along o = axis 0 of OIHW; the bias broadcasts along dim 1.
// CHECK-LABEL: @nchw_oihw
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x3x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01]], {{\[\[}}1.000000e+00]]], {{\[\[\[}}1.200000e+01]], {{\[\[}}1.600000e+01]]], {{\[\[\[}}1.500000e+01]], {{\[\[}}1.800000e+01]]]]> : tensor<3x2x1x1xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, -7.750000e+00, -1.000000e+01]> : tensor<3xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @nchw_oihw(%x: tensor<1x2x3x3xf32>) -> tensor<1x3x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[4.0]]], [[[5.0]], [[6.0]]]]> : tensor<3x2x1x1xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x3xf32>, tensor<3x2x1x1xf32>) -> tensor<1x3x3x3xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = stablehlo.constant dense<[0.5, 0.25, -1.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[3.75, 0.0, 0.75]> : tensor<3xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<1x3x3x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<1x3x3x3xf32>
  return %bn : tensor<1x3x3x3xf32>
}

// -----

// Output feature on result axis 2, kernel output feature on kernel axis 0.
// CHECK-LABEL: @odd_dim_permutation
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3x1x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.000000e+00]]], {{\[\[\[}}1.200000e+01, 1.600000e+01]]], {{\[\[\[}}1.500000e+01, 1.800000e+01]]]]> : tensor<3x1x1x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [f, 0, b, 1]x[o, 1, 0, i]->[1, b, f, 0]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, -7.750000e+00, -1.000000e+01]> : tensor<3xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [2] : (tensor<3xf32>) -> tensor<3x1x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<3x1x3x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @odd_dim_permutation(%x: tensor<2x3x1x3xf32>) -> tensor<3x1x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0]]], [[[3.0, 4.0]]], [[[5.0, 6.0]]]]> : tensor<3x1x1x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [f, 0, b, 1]x[o, 1, 0, i]->[1, b, f, 0], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x3x1x3xf32>, tensor<3x1x1x2xf32>) -> tensor<3x1x3x3xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %b = stablehlo.constant dense<[0.5, 0.25, -1.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[3.75, 0.0, 0.75]> : tensor<3xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 2 : i64} : (tensor<3x1x3x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<3x1x3x3xf32>
  return %bn : tensor<3x1x3x3xf32>
}

// -----

// CHECK-LABEL: @conv1d_nwc
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]], {{\[\[}}2.500000e+00, 3.600000e+01], [3.500000e+00, 4.800000e+01]]]> : tensor<2x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [b, 0, f]x[0, i, o]->[b, 0, f]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [2] : (tensor<2xf32>) -> tensor<1x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @conv1d_nwc(%x: tensor<1x4x2xf32>) -> tensor<1x3x2xf32> {
  %k = stablehlo.constant dense<[[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]> : tensor<2x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, f]x[0, i, o]->[b, 0, f], window = {stride = [1], pad = [[0, 0]], lhs_dilate = [1], rhs_dilate = [1], reverse = [false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x2xf32>, tensor<2x2x2xf32>) -> tensor<1x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 2 : i64} : (tensor<1x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x2xf32>
  return %bn : tensor<1x3x2xf32>
}

// -----

// A splat kernel becomes a per-channel (non-splat) kernel.
// CHECK-LABEL: @conv3d_ndhwc
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x2x2x1xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[\[}}5.000000e-01, 6.000000e+00]]]]]> : tensor<1x1x1x1x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [b, 0, 1, 2, f]x[0, 1, 2, i, o]->[b, 0, 1, 2, f]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [4] : (tensor<2xf32>) -> tensor<1x2x2x2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x2x2x2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @conv3d_ndhwc(%x: tensor<1x2x2x2x1xf32>) -> tensor<1x2x2x2x2xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<1x1x1x1x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, 2, f]x[0, 1, 2, i, o]->[b, 0, 1, 2, f], window = {stride = [1, 1, 1], pad = [[0, 0], [0, 0], [0, 0]], lhs_dilate = [1, 1, 1], rhs_dilate = [1, 1, 1], reverse = [false, false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2x1xf32>, tensor<1x1x1x1x2xf32>) -> tensor<1x2x2x2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 4 : i64} : (tensor<1x2x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x2x2x2xf32>
  return %bn : tensor<1x2x2x2x2xf32>
}

// -----

// CHECK-LABEL: @stride2
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      window = {stride = [2, 2], pad = {{\[\[}}0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]}
// CHECK-SAME:      -> tensor<1x2x2x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x2x2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x2x2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @stride2(%x: tensor<1x4x4x2xf32>) -> tensor<1x2x2x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
  return %bn : tensor<1x2x2x2xf32>
}

// -----

// Zero padding: the bias is added after the convolution, so padded border
// outputs get it too (as they did with the BN).
// CHECK-LABEL: @padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x1xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 6.000000e+00]], {{\[\[}}5.000000e-01, 6.000000e+00]]], {{\[\[\[}}5.000000e-01, 6.000000e+00]], {{\[\[}}5.000000e-01, 6.000000e+00]]]]> : tensor<2x2x1x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      pad = {{\[\[}}1, 0], [0, 2]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x4x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x4x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @padding(%x: tensor<1x3x3x1xf32>) -> tensor<1x3x4x2xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<2x2x1x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 0], [0, 2]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x1xf32>, tensor<2x2x1x2xf32>) -> tensor<1x3x4x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x4x2xf32>
  return %bn : tensor<1x3x4x2xf32>
}

// -----

// CHECK-LABEL: @negative_padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      pad = {{\[\[}}-1, 0], [0, -2]]
// CHECK-SAME:      -> tensor<1x3x2x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @negative_padding(%x: tensor<1x4x4x2xf32>) -> tensor<1x3x2x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[-1, 0], [0, -2]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x2x2xf32>
  return %bn : tensor<1x3x2x2xf32>
}

// -----

// A transposed convolution (lhs_dilation): the output feature is still the
// kernel's o axis.
// CHECK-LABEL: @transposed_lhs_dilation
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x2x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]], {{\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]], {{\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]], {{\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<2x2x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      lhs_dilate = [2, 2]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x4x4x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @transposed_lhs_dilation(%x: tensor<1x2x2x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]]], [[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]]]]> : tensor<2x2x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [2, 2], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<2x2x2x2xf32>) -> tensor<1x4x4x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x4x4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x4x4x2xf32>
  return %bn : tensor<1x4x4x2xf32>
}

// -----

// CHECK-LABEL: @rhs_dilation
// CHECK-SAME:    (%[[X:.+]]: tensor<1x5x5x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00]], {{\[\[}}5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00]]], {{\[\[\[}}5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00]], {{\[\[}}5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00]]]]> : tensor<2x2x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      rhs_dilate = [2, 2]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @rhs_dilation(%x: tensor<1x5x5x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<2x2x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [2, 2], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x5x5x2xf32>, tensor<2x2x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// The kernel is not flipped: window reversal stays an attribute of the conv.
// CHECK-LABEL: @window_reversal
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]], {{\[\[\[}}2.500000e+00, 3.600000e+01], [3.500000e+00, 4.800000e+01]]]]> : tensor<2x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      reverse = [true, false]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x2x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x2x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @window_reversal(%x: tensor<1x3x3x2xf32>) -> tensor<1x2x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]], [[[5.0, 6.0], [7.0, 8.0]]]]> : tensor<2x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [true, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<2x1x2x2xf32>) -> tensor<1x2x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x2x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x3x2xf32>
  return %bn : tensor<1x2x3x2xf32>
}

// -----

// Grouped (2 groups of 2): output channel o uses kernel slice o; no group remapping.
// CHECK-LABEL: @grouped
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x4xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 4.000000e+00, 2.250000e+00, 3.200000e+01], [2.500000e+00, 1.200000e+01, 5.250000e+00, 6.400000e+01]]]]> : tensor<1x1x2x4xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      feature_group_count = 2 : i64
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-2.500000e-01, -1.000000e+00, 8.750000e-01, -1.300000e+01]> : tensor<4xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<4xf32>) -> tensor<1x3x3x4xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x4xf32>
// CHECK-NEXT:    return %[[R]]
func.func @grouped(%x: tensor<1x3x3x4xf32>) -> tensor<1x3x3x4xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]]]> : tensor<1x1x2x4xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x3x3x4xf32>, tensor<1x1x2x4xf32>) -> tensor<1x3x3x4xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = stablehlo.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %m = stablehlo.constant dense<[0.5, 1.0, 1.5, 2.0]> : tensor<4xf32>
  %v = stablehlo.constant dense<[3.75, 0.75, 15.75, 0.0]> : tensor<4xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x3x3x4xf32>
  return %bn : tensor<1x3x3x4xf32>
}

// -----

// CHECK-LABEL: @depthwise
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x4xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 4.000000e+00, 2.250000e+00, 3.200000e+01]]]]> : tensor<1x1x1x4xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      feature_group_count = 4 : i64
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-2.500000e-01, -1.000000e+00, 8.750000e-01, -1.300000e+01]> : tensor<4xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<4xf32>) -> tensor<1x3x3x4xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x4xf32>
// CHECK-NEXT:    return %[[R]]
func.func @depthwise(%x: tensor<1x3x3x4xf32>) -> tensor<1x3x3x4xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0, 3.0, 4.0]]]]> : tensor<1x1x1x4xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 4 : i64} : (tensor<1x3x3x4xf32>, tensor<1x1x1x4xf32>) -> tensor<1x3x3x4xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = stablehlo.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %m = stablehlo.constant dense<[0.5, 1.0, 1.5, 2.0]> : tensor<4xf32>
  %v = stablehlo.constant dense<[3.75, 0.75, 15.75, 0.0]> : tensor<4xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x3x3x4xf32>
  return %bn : tensor<1x3x3x4xf32>
}

// -----

// CHECK-LABEL: @batch_group_count
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      batch_group_count = 2 : i64
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @batch_group_count(%x: tensor<2x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 2 : i64, feature_group_count = 1 : i64} : (tensor<2x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Grouped transposed conv as torch lowers ConvTranspose2d(4, 4, groups=2):
// kernel [i, o, 0, 1] of shape 2x4x1x1, all ones. With scales [0.5, 2, 0.75, 8]
// the folded kernel must read [0.5, 2, 0.75, 8] along o (axis 1) in both
// rows of i: not along axis 0, not per group of 2 (pytorch#180995).
// CHECK-LABEL: @grouped_transposed_iohw
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x2x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01]], {{\[\[}}2.000000e+00]], {{\[\[}}7.500000e-01]], {{\[\[}}8.000000e+00]]], {{\[\[\[}}5.000000e-01]], {{\[\[}}2.000000e+00]], {{\[\[}}7.500000e-01]], {{\[\[}}8.000000e+00]]]]> : tensor<2x4x1x1xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]) dim_numbers = [b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1]
// CHECK-SAME:      lhs_dilate = [2, 2]
// CHECK-SAME:      reverse = [true, true]
// CHECK-SAME:      feature_group_count = 2 : i64
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-2.500000e-01, -1.000000e+00, 8.750000e-01, -1.300000e+01]> : tensor<4xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<4xf32>) -> tensor<1x4x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x4x3x3xf32>
// CHECK-NEXT:    return %[[R]]
func.func @grouped_transposed_iohw(%x: tensor<1x4x2x2xf32>) -> tensor<1x4x3x3xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<2x4x1x1xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [2, 2], rhs_dilate = [1, 1], reverse = [true, true]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x4x2x2xf32>, tensor<2x4x1x1xf32>) -> tensor<1x4x3x3xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = stablehlo.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %m = stablehlo.constant dense<[0.5, 1.0, 1.5, 2.0]> : tensor<4xf32>
  %v = stablehlo.constant dense<[3.75, 0.75, 15.75, 0.0]> : tensor<4xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<1x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x4x3x3xf32>
  return %bn : tensor<1x4x3x3xf32>
}

// -----

// conv + bias, then BN: one bias, (bias - mean) * scale + beta = [0, 35].
// CHECK-LABEL: @existing_bias_merged
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, 3.500000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @existing_bias_merged(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %bias = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %bias_b = stablehlo.broadcast_in_dim %bias, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %biased = stablehlo.add %conv, %bias_b : tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%biased, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Dense (Flax/Keras): weight in x out, scaled along axis 1.
// CHECK-LABEL: @dot_general_1x0
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01], [2.500000e+00, 3.600000e+01]]> : tensor<3x2xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]], contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[DOT]], %[[BB]] : tensor<2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @dot_general_1x0(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
  return %bn : tensor<2x2xf32>
}

// -----

// torch Linear: weight out x in, contracting [1] x [1], scaled along axis 0.
// CHECK-LABEL: @torch_linear_1x1
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.000000e+00, 1.500000e+00], [2.400000e+01, 3.000000e+01, 3.600000e+01]]> : tensor<2x3xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]], contracting_dims = [1] x [1] : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[DOT]], %[[BB]] : tensor<2x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @torch_linear_1x1(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
  return %bn : tensor<2x2xf32>
}

// -----

// CHECK-LABEL: @dot_general_rank3
// CHECK-SAME:    (%[[X:.+]]: tensor<2x5x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01], [2.500000e+00, 3.600000e+01]]> : tensor<3x2xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]], contracting_dims = [2] x [0]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [2] : (tensor<2xf32>) -> tensor<2x5x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[DOT]], %[[BB]] : tensor<2x5x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @dot_general_rank3(%x: tensor<2x5x3xf32>) -> tensor<2x5x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [2] x [0] : (tensor<2x5x3xf32>, tensor<3x2xf32>) -> tensor<2x5x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 2 : i64} : (tensor<2x5x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x5x2xf32>
  return %bn : tensor<2x5x2xf32>
}

// -----

// The constant is the dot_general's lhs: result axis 0 comes from lhs axis 0.
// CHECK-LABEL: @dot_general_weight_is_lhs
// CHECK-SAME:    (%[[X:.+]]: tensor<3x5xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.000000e+00, 1.500000e+00], [2.400000e+01, 3.000000e+01, 3.600000e+01]]> : tensor<2x3xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[W]], %[[X]], contracting_dims = [1] x [0]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [0] : (tensor<2xf32>) -> tensor<2x5xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[DOT]], %[[BB]] : tensor<2x5xf32>
// CHECK-NEXT:    return %[[R]]
func.func @dot_general_weight_is_lhs(%x: tensor<3x5xf32>) -> tensor<2x5xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %dot = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<2x5xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 0 : i64} : (tensor<2x5xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x5xf32>
  return %bn : tensor<2x5xf32>
}

// -----

// Batched dot_general: the weight's batch slices are all scaled along its last axis.
// CHECK-LABEL: @dot_general_batching_dims
// CHECK-SAME:    (%[[X:.+]]: tensor<2x4x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01], [2.500000e+00, 3.600000e+01]], {{\[\[}}5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00], [5.000000e-01, 6.000000e+00]]]> : tensor<2x3x2xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]], batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [2] : (tensor<2xf32>) -> tensor<2x4x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[DOT]], %[[BB]] : tensor<2x4x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @dot_general_batching_dims(%x: tensor<2x4x3xf32>) -> tensor<2x4x2xf32> {
  %w = stablehlo.constant dense<[[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]]> : tensor<2x3x2xf32>
  %dot = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x4x3xf32>, tensor<2x3x2xf32>) -> tensor<2x4x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 2 : i64} : (tensor<2x4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x4x2xf32>
  return %bn : tensor<2x4x2xf32>
}

// -----

// f16: folded in float64 and rounded once. scale = [1, 3] / sqrt([1, 0.25] + eps)
// with eps = f32(1e-3) -> kernel [[0.9995, 11.98], [2.998, 23.95]] in f16. Doing
// the arithmetic in f16 would give 1.0 for the first element. The epsilon
// attribute stays f32; the new constants are f16.
// CHECK-LABEL: @f16
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}9.995110e-01, 1.197660e+01], [2.998050e+00, 2.395310e+01]]]]> : tensor<1x1x2x2xf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      (tensor<1x3x3x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x3x3x2xf16>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-1.499020e+00, 2.295310e+01]> : tensor<2xf16>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf16>) -> tensor<1x3x3x2xf16>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf16>
// CHECK-NEXT:    return %[[R]]
func.func @f16(%x: tensor<1x3x3x2xf16>) -> tensor<1x3x3x2xf16> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x3x3x2xf16>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf16>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf16>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf16>
  %v = stablehlo.constant dense<[1.0, 0.25]> : tensor<2xf16>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 1.000000e-03 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>) -> tensor<1x3x3x2xf16>
  return %bn : tensor<1x3x3x2xf16>
}

// -----

// f16, chosen so that each way of getting it wrong shows: kernel * scale in
// float64 rounded once gives [[1.1543, 3.99219], [3.46094, 9.97656]] and shift
// [-1.80762, 6.98438]. Rounding the scale to f16 first gives 3.46289, 9.98438
// and -1.80859; doing everything in f16 gives 1.15332 and -1.80664.
// CHECK-LABEL: @f16_rounded_once
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.154300e+00, 3.992190e+00], [3.460940e+00, 9.976560e+00]]]]> : tensor<1x1x2x2xf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-1.807620e+00, 6.984380e+00]> : tensor<2xf16>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf16>) -> tensor<1x3x3x2xf16>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf16>
// CHECK-NEXT:    return %[[R]]
func.func @f16_rounded_once(%x: tensor<1x3x3x2xf16>) -> tensor<1x3x3x2xf16> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 5.0]]]]> : tensor<1x1x2x2xf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x3x3x2xf16>
  %g = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf16>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf16>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf16>
  %v = stablehlo.constant dense<[0.75, 0.25]> : tensor<2xf16>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 1.000000e-03 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>, tensor<2xf16>) -> tensor<1x3x3x2xf16>
  return %bn : tensor<1x3x3x2xf16>
}

// -----

// CHECK-LABEL: @bf16
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xbf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xbf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      (tensor<1x3x3x2xbf16>, tensor<1x1x2x2xbf16>) -> tensor<1x3x3x2xbf16>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xbf16>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xbf16>) -> tensor<1x3x3x2xbf16>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @bf16(%x: tensor<1x3x3x2xbf16>) -> tensor<1x3x3x2xbf16> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xbf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xbf16>, tensor<1x1x2x2xbf16>) -> tensor<1x3x3x2xbf16>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xbf16>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xbf16>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xbf16>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xbf16>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xbf16>, tensor<2xbf16>, tensor<2xbf16>, tensor<2xbf16>, tensor<2xbf16>) -> tensor<1x3x3x2xbf16>
  return %bn : tensor<1x3x3x2xbf16>
}

// -----

// bf16 constants written in hex (kernel [1, 2, 3, 4], gamma [1, 3]) and as a
// splat (beta 0.5): shift = [0.5 - 2 * 0.5, 0.5 + 4 * 6] = [-0.5, 24.5].
// CHECK-LABEL: @bf16_hex_and_splat_constants
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xbf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xbf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.450000e+01]> : tensor<2xbf16>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xbf16>) -> tensor<1x3x3x2xbf16>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xbf16>
// CHECK-NEXT:    return %[[R]]
func.func @bf16_hex_and_splat_constants(%x: tensor<1x3x3x2xbf16>) -> tensor<1x3x3x2xbf16> {
  %k = stablehlo.constant dense<"0x803F004040408040"> : tensor<1x1x2x2xbf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xbf16>, tensor<1x1x2x2xbf16>) -> tensor<1x3x3x2xbf16>
  %g = stablehlo.constant dense<"0x803F4040"> : tensor<2xbf16>
  %b = stablehlo.constant dense<5.000000e-01> : tensor<2xbf16>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xbf16>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xbf16>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xbf16>, tensor<2xbf16>, tensor<2xbf16>, tensor<2xbf16>, tensor<2xbf16>) -> tensor<1x3x3x2xbf16>
  return %bn : tensor<1x3x3x2xbf16>
}

// -----

// A bf16 kernel of 128 elements (printed as hex), values (i mod 7) - 3, scaled
// by 3 / sqrt(3.75 + 0.25) = 1.5; the shift is zero, so there is no add.
// CHECK-LABEL: @bf16_large_hex_kernel
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x2x2xbf16>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<"0x90C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0C0BF0000C03F4040904090C040C0"> : tensor<1x1x2x64xbf16>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    return %[[CONV]]
func.func @bf16_large_hex_kernel(%x: tensor<1x2x2x2xbf16>) -> tensor<1x2x2x64xbf16> {
  %k = stablehlo.constant dense<"0x40C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C080BF0000803F0040404040C000C0"> : tensor<1x1x2x64xbf16>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xbf16>, tensor<1x1x2x64xbf16>) -> tensor<1x2x2x64xbf16>
  %g = stablehlo.constant dense<3.0> : tensor<64xbf16>
  %b = stablehlo.constant dense<0.0> : tensor<64xbf16>
  %m = stablehlo.constant dense<0.0> : tensor<64xbf16>
  %v = stablehlo.constant dense<3.75> : tensor<64xbf16>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x2x2x64xbf16>, tensor<64xbf16>, tensor<64xbf16>, tensor<64xbf16>, tensor<64xbf16>) -> tensor<1x2x2x64xbf16>
  return %bn : tensor<1x2x2x64xbf16>
}

// -----

// f64 with epsilon = 1e-5 as an f32 attribute: the epsilon used is the f32
// value 9.99999974737875e-06 (not the decimal 1e-5), then all in f64.
// CHECK-LABEL: @f64
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf64>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}0.99999500003762609, 2.9999962500071256], [2.9999850001128783, 5.9999925000142511]]]]> : tensor<1x1x2x2xf64>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-1.4999900000752522, 4.9999925000142511]> : tensor<2xf64>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf64>) -> tensor<1x3x3x2xf64>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf64>
// CHECK-NEXT:    return %[[R]]
func.func @f64(%x: tensor<1x3x3x2xf64>) -> tensor<1x3x3x2xf64> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf64>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf64>, tensor<1x1x2x2xf64>) -> tensor<1x3x3x2xf64>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf64>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf64>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf64>
  %v = stablehlo.constant dense<[1.0, 4.0]> : tensor<2xf64>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 1.000000e-05 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf64>, tensor<2xf64>, tensor<2xf64>, tensor<2xf64>, tensor<2xf64>) -> tensor<1x3x3x2xf64>
  return %bn : tensor<1x3x3x2xf64>
}

// -----

// Inexact f32 statistics and Keras' epsilon 1.001e-5: values computed in
// float64 from the f32 inputs and rounded once to f32.
// CHECK-LABEL: @epsilon_f32_rounding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.581130e+00, 1.0606575], [4.743390e+00, 2.121315]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-0.374339044, -0.571230114]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @epsilon_f32_rounding(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.5, 0.75]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.1, -0.2]> : tensor<2xf32>
  %m = stablehlo.constant dense<[0.3, 0.7]> : tensor<2xf32>
  %v = stablehlo.constant dense<[0.9, 2.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 1.001000e-05 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// beta = mean * scale exactly: the folded shift is zero and no add is emitted.
// CHECK-LABEL: @zero_shift_has_no_add
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    return %[[CONV]]
func.func @zero_shift_has_no_add(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 12.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, 2.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Splat statistics: scale 2 / sqrt(4) = 1, shift 1 - 0.5 = 0.5.
// CHECK-LABEL: @splat_statistics
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @splat_statistics(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<2.0> : tensor<2xf32>
  %b = stablehlo.constant dense<1.0> : tensor<2xf32>
  %m = stablehlo.constant dense<0.5> : tensor<2xf32>
  %v = stablehlo.constant dense<3.75> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Two conv + BN pairs in a row: both fold; the second conv reads the first add.
// Second BN: scale [2, 0.25], shift [-2, 0.75].
// CHECK-LABEL: @two_convs_two_norms
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV1:.+]] = stablehlo.convolution(%[[X]], %[[K1]])
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB1:.+]] = stablehlo.broadcast_in_dim %[[B1]], dims = [3]
// CHECK-NEXT:    %[[R1:.+]] = stablehlo.add %[[CONV1]], %[[BB1]]
// CHECK-NEXT:    %[[K2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}-2.000000e+00, 2.500000e-01], [4.000000e+00, -5.000000e-01]]]]>
// CHECK-NEXT:    %[[CONV2:.+]] = stablehlo.convolution(%[[R1]], %[[K2]])
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<[-2.000000e+00, 7.500000e-01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB2:.+]] = stablehlo.broadcast_in_dim %[[B2]], dims = [3]
// CHECK-NEXT:    %[[R2:.+]] = stablehlo.add %[[CONV2]], %[[BB2]]
// CHECK-NEXT:    return %[[R2]]
func.func @two_convs_two_norms(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %k2 = stablehlo.constant dense<[[[[-1.0, 1.0], [2.0, -2.0]]]]> : tensor<1x1x2x2xf32>
  %conv2 = stablehlo.convolution(%bn, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g2 = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %b2 = stablehlo.constant dense<[0.0, 1.0]> : tensor<2xf32>
  %m2 = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf32>
  %v2 = stablehlo.constant dense<[1.0, 4.0]> : tensor<2xf32>
  %bn2 = "stablehlo.batch_norm_inference"(%conv2, %g2, %b2, %m2, %v2) {epsilon = 0.000000e+00 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn2 : tensor<1x3x3x2xf32>
}

// -----

// BN after BN composes into one fold: scale [0.5, 6] * [2, 0.25] = [1, 1.5],
// shift [-0.5, 23] * [2, 0.25] + [-2, 0.75] = [-3, 6.5].
// CHECK-LABEL: @norm_after_norm
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 3.000000e+00], [3.000000e+00, 6.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-3.000000e+00, 6.500000e+00]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<1x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
func.func @norm_after_norm(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %g2 = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %b2 = stablehlo.constant dense<[0.0, 1.0]> : tensor<2xf32>
  %m2 = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf32>
  %v2 = stablehlo.constant dense<[1.0, 4.0]> : tensor<2xf32>
  %bn2 = "stablehlo.batch_norm_inference"(%bn, %g2, %b2, %m2, %v2) {epsilon = 0.000000e+00 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn2 : tensor<1x3x3x2xf32>
}

// -----

// CHECK-LABEL: @no_fold_statistics_are_arguments
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>, %[[G:.+]]: tensor<2xf32>, %[[B:.+]]: tensor<2xf32>, %[[M:.+]]: tensor<2xf32>, %[[V:.+]]: tensor<2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-SAME:      epsilon = 2.500000e-01 : f32, feature_index = 3 : i64
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_statistics_are_arguments(%x: tensor<1x3x3x2xf32>, %g: tensor<2xf32>, %b: tensor<2xf32>, %m: tensor<2xf32>, %v: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// CHECK-LABEL: @no_fold_kernel_is_argument
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>, %[[K:.+]]: tensor<1x1x2x2xf32>)
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_kernel_is_argument(%x: tensor<1x3x3x2xf32>, %k: tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32> {
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// feature_index 1 is the H axis of an NHWC conv (H = C = 2 so the types check).
// CHECK-LABEL: @no_fold_feature_index_is_spatial
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-SAME:      feature_index = 1 : i64
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_feature_index_is_spatial(%x: tensor<1x2x3x2xf32>) -> tensor<1x2x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<1x2x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x3x2xf32>
  return %bn : tensor<1x2x3x2xf32>
}

// -----

// The conv result is also returned: scaling the kernel would change that output.
// CHECK-LABEL: @no_fold_conv_has_second_user
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-NEXT:    return %[[BN]], %[[CONV]]
func.func @no_fold_conv_has_second_user(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn, %conv : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

// CHECK-LABEL: @no_fold_block_argument
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[X]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_block_argument(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%x, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Normalizing the dot_general's lhs free axis would need the lhs (an argument) scaled.
// CHECK-LABEL: @no_fold_dot_general_lhs_axis
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00], [5.000000e+00, 6.000000e+00]]> : tensor<3x2xf32>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]], contracting_dims = [1] x [0]
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[DOT]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-SAME:      feature_index = 0 : i64
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_dot_general_lhs_axis(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 0 : i64} : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
  return %bn : tensor<2x2xf32>
}

// -----

// A residual add of a non-constant between the conv and the BN.
// CHECK-LABEL: @no_fold_residual_add_between
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>, %[[Y:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[SUM:.+]] = stablehlo.add %[[CONV]], %[[Y]]
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[SUM]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_residual_add_between(%x: tensor<1x3x3x2xf32>, %y: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %sum = stablehlo.add %conv, %y : tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%sum, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// One kernel constant, two convolutions, only the first normalized. The fold
// fires on the first; the second must keep the ORIGINAL kernel (pytorch#197539).
// CHECK-LABEL: @shared_kernel_other_conv_keeps_original
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-DAG:     %[[KORIG:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-DAG:     %[[KNEW:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]> : tensor<1x1x2x2xf32>
// CHECK:         %[[CONV1:.+]] = stablehlo.convolution(%[[X]], %[[KNEW]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV1]], %[[BB]]
// CHECK-NEXT:    %[[CONV2:.+]] = stablehlo.convolution(%[[X]], %[[KORIG]])
// CHECK-NEXT:    return %[[R]], %[[CONV2]]
func.func @shared_kernel_other_conv_keeps_original(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %conv2 = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  return %bn, %conv2 : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

// One kernel constant, two convolutions, each with its own BN (second BN:
// scale [1, 0.75], shift [-1.5, 2]): each conv gets its own new kernel.
// CHECK-LABEL: @two_convs_share_kernel_both_normalized
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV1:.+]] = stablehlo.convolution(%[[X]], %[[K1]])
// CHECK-NEXT:    %[[K2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.500000e+00], [3.000000e+00, 3.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV2:.+]] = stablehlo.convolution(%[[X]], %[[K2]])
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB1:.+]] = stablehlo.broadcast_in_dim %[[B1]], dims = [3]
// CHECK-NEXT:    %[[R1:.+]] = stablehlo.add %[[CONV1]], %[[BB1]]
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<[-1.500000e+00, 2.000000e+00]>
// CHECK-NEXT:    %[[BB2:.+]] = stablehlo.broadcast_in_dim %[[B2]], dims = [3]
// CHECK-NEXT:    %[[R2:.+]] = stablehlo.add %[[CONV2]], %[[BB2]]
// CHECK-NEXT:    return %[[R1]], %[[R2]]
func.func @two_convs_share_kernel_both_normalized(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %conv2 = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %v2 = stablehlo.constant dense<[0.75, 15.75]> : tensor<2xf32>
  %bn2 = "stablehlo.batch_norm_inference"(%conv2, %g, %b, %m, %v2) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn, %bn2 : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

// var + eps < 0 in channel 1: no real scale exists.
// CHECK-LABEL: @no_fold_negative_variance
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, -1.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_negative_variance(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, -1.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// feature_index 0 is the dot_general's batching dimension.
// CHECK-LABEL: @no_fold_dot_general_batch_axis
// CHECK-SAME:    (%[[X:.+]]: tensor<2x4x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00], [5.000000e+00, 6.000000e+00]], {{\[\[}}1.000000e+00, 1.000000e+00], [1.000000e+00, 1.000000e+00], [1.000000e+00, 1.000000e+00]]]>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]]
// CHECK-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[DOT]], %[[G]], %[[B]], %[[M]], %[[V]])
// CHECK-SAME:      feature_index = 0 : i64
// CHECK-NEXT:    return %[[BN]]
func.func @no_fold_dot_general_batch_axis(%x: tensor<2x4x3xf32>) -> tensor<2x4x2xf32> {
  %w = stablehlo.constant dense<[[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]]> : tensor<2x3x2xf32>
  %dot = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x4x3xf32>, tensor<2x3x2xf32>) -> tensor<2x4x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 0 : i64} : (tensor<2x4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x4x2xf32>
  return %bn : tensor<2x4x2xf32>
}
