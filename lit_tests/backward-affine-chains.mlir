// RUN: %bnfold-opt --split-input-file %s | %filecheck %s

// The decomposed batch-norm chains real exporters emit (see forms.md), each
// folded into the producer: a new kernel constant, the producer, then exactly
// one add of a broadcast 1-D bias; no rsqrt/sqrt/divide/multiply/subtract left.
// Unless noted, the statistics are gamma [1, 3], beta [0.5, -1], mean [2, -4],
// var [3.75, 0], eps 0.25: scale [0.5, 6], shift [-0.5, 23], and the kernel
// holds [1, 2, 3, 4].

// Flax linen (NHWC): subtract the mean, multiply by rsqrt(var + eps) * gamma
// (via reshape and broadcast_in_dim), add beta.
// CHECK-LABEL: @flax_linen
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @flax_linen(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<f32>
  %mean1 = stablehlo.broadcast_in_dim %mean, dims = [3] : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %var1 = stablehlo.broadcast_in_dim %var, dims = [3] : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean1, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %conv, %mean_b : tensor<1x3x3x2xf32>
  %eps_b = stablehlo.broadcast_in_dim %eps, dims = [] : (tensor<f32>) -> tensor<1x1x1x2xf32>
  %var_eps = stablehlo.add %var1, %eps_b : tensor<1x1x1x2xf32>
  %inv = stablehlo.rsqrt %var_eps : tensor<1x1x1x2xf32>
  %gamma1 = stablehlo.reshape %gamma : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %scale = stablehlo.multiply %inv, %gamma1 : tensor<1x1x1x2xf32>
  %scale_b = stablehlo.broadcast_in_dim %scale, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %centered, %scale_b : tensor<1x3x3x2xf32>
  %beta1 = stablehlo.reshape %beta : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta1, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %beta_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// Flax nnx: a conv bias [1, 2] first, statistics through reshape; one bias
// (bias - mean) * scale + beta = [0, 35].
// CHECK-LABEL: @flax_nnx_with_conv_bias
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, 3.500000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @flax_nnx_with_conv_bias(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %bias = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<f32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %bias1 = stablehlo.reshape %bias : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %bias_b = stablehlo.broadcast_in_dim %bias1, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %biased = stablehlo.add %conv, %bias_b : tensor<1x3x3x2xf32>
  %mean1 = stablehlo.reshape %mean : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %var1 = stablehlo.reshape %var : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean1, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %biased, %mean_b : tensor<1x3x3x2xf32>
  %eps_b = stablehlo.broadcast_in_dim %eps, dims = [] : (tensor<f32>) -> tensor<1x1x1x2xf32>
  %var_eps = stablehlo.add %var1, %eps_b : tensor<1x1x1x2xf32>
  %inv = stablehlo.rsqrt %var_eps : tensor<1x1x1x2xf32>
  %gamma1 = stablehlo.reshape %gamma : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %scale = stablehlo.multiply %inv, %gamma1 : tensor<1x1x1x2xf32>
  %scale_b = stablehlo.broadcast_in_dim %scale, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %centered, %scale_b : tensor<1x3x3x2xf32>
  %beta1 = stablehlo.reshape %beta : (tensor<2xf32>) -> tensor<1x1x1x2xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta1, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %beta_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// Haiku: 1x1x1xC parameters, scale = multiply(gamma, rsqrt(var + eps)).
// CHECK-LABEL: @haiku
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @haiku(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %mean = stablehlo.constant dense<[[[[2.0, -4.0]]]]> : tensor<1x1x1x2xf32>
  %var = stablehlo.constant dense<[[[[3.75, 0.0]]]]> : tensor<1x1x1x2xf32>
  %gamma = stablehlo.constant dense<[[[[1.0, 3.0]]]]> : tensor<1x1x1x2xf32>
  %beta = stablehlo.constant dense<[[[[0.5, -1.0]]]]> : tensor<1x1x1x2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<1x1x1x2xf32>
  %var_eps = stablehlo.add %var, %eps : tensor<1x1x1x2xf32>
  %inv = stablehlo.rsqrt %var_eps : tensor<1x1x1x2xf32>
  %scale = stablehlo.multiply %gamma, %inv : tensor<1x1x1x2xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %conv, %mean_b : tensor<1x3x3x2xf32>
  %scale_b = stablehlo.broadcast_in_dim %scale, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %centered, %scale_b : tensor<1x3x3x2xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %beta_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// Equinox (NCHW/OIHW): reshapes 1x2x3x3 -> 1x1x2x3x3 -> 1x2x3x3 after the conv,
// three broadcasts per vector, sqrt + divide. Kernel scaled along o = axis 0.
// CHECK-LABEL: @equinox_nchw
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x3x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01]], {{\[\[}}1.000000e+00]]], {{\[\[\[}}1.800000e+01]], {{\[\[}}2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<1x2x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @equinox_nchw(%x: tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[4.0]]]]> : tensor<2x2x1x1xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x3xf32>, tensor<2x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %up = stablehlo.reshape %conv : (tensor<1x2x3x3xf32>) -> tensor<1x1x2x3x3xf32>
  %down = stablehlo.reshape %up : (tensor<1x1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<2xf32>
  %mean0 = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<2xf32>) -> tensor<2x1x1xf32>
  %mean1 = stablehlo.broadcast_in_dim %mean0, dims = [1, 2, 3] : (tensor<2x1x1xf32>) -> tensor<1x2x1x1xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %centered = stablehlo.subtract %down, %mean_b : tensor<1x2x3x3xf32>
  %var_eps = stablehlo.add %var, %eps : tensor<2xf32>
  %std = stablehlo.sqrt %var_eps : tensor<2xf32>
  %std0 = stablehlo.broadcast_in_dim %std, dims = [0] : (tensor<2xf32>) -> tensor<2x1x1xf32>
  %std1 = stablehlo.broadcast_in_dim %std0, dims = [1, 2, 3] : (tensor<2x1x1xf32>) -> tensor<1x2x1x1xf32>
  %std_b = stablehlo.broadcast_in_dim %std1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %normed = stablehlo.divide %centered, %std_b : tensor<1x2x3x3xf32>
  %gamma0 = stablehlo.broadcast_in_dim %gamma, dims = [0] : (tensor<2xf32>) -> tensor<2x1x1xf32>
  %gamma1 = stablehlo.broadcast_in_dim %gamma0, dims = [1, 2, 3] : (tensor<2x1x1xf32>) -> tensor<1x2x1x1xf32>
  %gamma_b = stablehlo.broadcast_in_dim %gamma1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %scaled = stablehlo.multiply %normed, %gamma_b : tensor<1x2x3x3xf32>
  %beta0 = stablehlo.broadcast_in_dim %beta, dims = [0] : (tensor<2xf32>) -> tensor<2x1x1xf32>
  %beta1 = stablehlo.broadcast_in_dim %beta0, dims = [1, 2, 3] : (tensor<2x1x1xf32>) -> tensor<1x2x1x1xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %y = stablehlo.add %scaled, %beta_b : tensor<1x2x3x3xf32>
  return %y : tensor<1x2x3x3xf32>
}

// -----

// The affine ops act on a 1x1x2x3x3 view and a reshape brings the result
// back: the conv folds; the view's reshapes carry no arithmetic.
// CHECK-LABEL: @equinox_chain_on_5d_view
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x3x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01]], {{\[\[}}1.000000e+00]]], {{\[\[\[}}1.800000e+01]], {{\[\[}}2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<1x2x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// The 4-D -> 5-D -> 4-D reshapes around the chain cancel out.
// CHECK-NEXT:    return %[[R]]
func.func @equinox_chain_on_5d_view(%x: tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[4.0]]]]> : tensor<2x2x1x1xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x3xf32>, tensor<2x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %up = stablehlo.reshape %conv : (tensor<1x2x3x3xf32>) -> tensor<1x1x2x3x3xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %std = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean, dims = [2] : (tensor<2xf32>) -> tensor<1x1x2x3x3xf32>
  %std_b = stablehlo.broadcast_in_dim %std, dims = [2] : (tensor<2xf32>) -> tensor<1x1x2x3x3xf32>
  %gamma_b = stablehlo.broadcast_in_dim %gamma, dims = [2] : (tensor<2xf32>) -> tensor<1x1x2x3x3xf32>
  %beta_b = stablehlo.broadcast_in_dim %beta, dims = [2] : (tensor<2xf32>) -> tensor<1x1x2x3x3xf32>
  %centered = stablehlo.subtract %up, %mean_b : tensor<1x1x2x3x3xf32>
  %normed = stablehlo.divide %centered, %std_b : tensor<1x1x2x3x3xf32>
  %scaled = stablehlo.multiply %normed, %gamma_b : tensor<1x1x2x3x3xf32>
  %shifted = stablehlo.add %scaled, %beta_b : tensor<1x1x2x3x3xf32>
  %y = stablehlo.reshape %shifted : (tensor<1x1x2x3x3xf32>) -> tensor<1x2x3x3xf32>
  return %y : tensor<1x2x3x3xf32>
}

// -----

// Keras: scale s = rsqrt(var + eps) * gamma, shift t = -mean * s + beta (with
// negate) computed on vectors, then x * s + t, after a conv bias [1, 2].
// CHECK-LABEL: @keras_scale_shift_with_conv_bias
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[0.000000e+00, 3.500000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @keras_scale_shift_with_conv_bias(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %bias = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %bias_b = stablehlo.broadcast_in_dim %bias, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %biased = stablehlo.add %conv, %bias_b : tensor<1x3x3x2xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<2xf32>
  %var_eps = stablehlo.add %var, %eps : tensor<2xf32>
  %inv = stablehlo.rsqrt %var_eps : tensor<2xf32>
  %s = stablehlo.multiply %inv, %gamma : tensor<2xf32>
  %neg_mean = stablehlo.negate %mean : tensor<2xf32>
  %ms = stablehlo.multiply %neg_mean, %s : tensor<2xf32>
  %t = stablehlo.add %ms, %beta : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %biased, %s_b : tensor<1x3x3x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// Keras DepthwiseConv2D: the kernel arrives through a reshape of a constant
// (1x1x2x1 -> 1x1x1x2); the new kernel is a plain constant of the conv's shape.
// CHECK-LABEL: @keras_depthwise_kernel_through_reshape
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01]]]]> : tensor<1x1x1x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @keras_depthwise_kernel_through_reshape(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k0 = stablehlo.constant dense<[[[[1.0], [2.0]]]]> : tensor<1x1x2x1xf32>
  %k = stablehlo.reshape %k0 : (tensor<1x1x2x1xf32>) -> tensor<1x1x1x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %gamma = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %beta = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<2xf32>
  %var_eps = stablehlo.add %var, %eps : tensor<2xf32>
  %inv = stablehlo.rsqrt %var_eps : tensor<2xf32>
  %s = stablehlo.multiply %inv, %gamma : tensor<2xf32>
  %neg_mean = stablehlo.negate %mean : tensor<2xf32>
  %ms = stablehlo.multiply %neg_mean, %s : tensor<2xf32>
  %t = stablehlo.add %ms, %beta : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// torchax (NCHW): (x - mean) * rsqrt(var + eps), then * weight + bias.
// CHECK-LABEL: @torchax_two_multiplies
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x3x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01]], {{\[\[}}1.000000e+00]]], {{\[\[\[}}1.800000e+01]], {{\[\[}}2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<1x2x3x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @torchax_two_multiplies(%x: tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32> {
  %k = stablehlo.constant dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[4.0]]]]> : tensor<2x2x1x1xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x3xf32>, tensor<2x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %weight = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %bias = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<1x2x1x1xf32>
  %var1 = stablehlo.reshape %var : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %var_eps = stablehlo.add %var1, %eps : tensor<1x2x1x1xf32>
  %r = stablehlo.rsqrt %var_eps : tensor<1x2x1x1xf32>
  %mean1 = stablehlo.reshape %mean : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %centered = stablehlo.subtract %conv, %mean_b : tensor<1x2x3x3xf32>
  %r_b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %normed = stablehlo.multiply %centered, %r_b : tensor<1x2x3x3xf32>
  %weight1 = stablehlo.reshape %weight : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %weight_b = stablehlo.broadcast_in_dim %weight1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %scaled = stablehlo.multiply %normed, %weight_b : tensor<1x2x3x3xf32>
  %bias1 = stablehlo.reshape %bias : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %bias_b = stablehlo.broadcast_in_dim %bias1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x3xf32>
  %y = stablehlo.add %scaled, %bias_b : tensor<1x2x3x3xf32>
  return %y : tensor<1x2x3x3xf32>
}

// -----

// Dense followed by a per-feature multiply only [2, -0.5] (tensorflow#39572):
// the weight is scaled along its output axis 1; no shift, so no add.
// CHECK-LABEL: @dense_per_feature_multiply
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, -1.000000e+00], [6.000000e+00, -2.000000e+00], [1.000000e+01, -3.000000e+00]]> : tensor<3x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.dot_general %[[X]], %[[K]]
// CHECK-NEXT:    return %[[CONV]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @dense_per_feature_multiply(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %c = stablehlo.constant dense<[2.0, -0.5]> : tensor<2xf32>
  %c_b = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<2xf32>) -> tensor<2x2xf32>
  %y = stablehlo.multiply %dot, %c_b : tensor<2x2xf32>
  return %y : tensor<2x2xf32>
}

// -----

// [2, 0.5] * (c - x) with c = [1, 2]: scale [-2, -0.5], shift [2, 1].
// CHECK-LABEL: @subtract_from_constant
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}-2.000000e+00, -1.000000e+00], [-6.000000e+00, -2.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[2.000000e+00, 1.000000e+00]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func @subtract_from_constant(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %c = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %c_b = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %d = stablehlo.subtract %c_b, %conv : tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[2.0, 0.5]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.multiply %s_b, %d : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// torchax ConvTranspose2d: the kernel comes through `call @_flip` (a private
// function holding stablehlo.reverse along W) and uses layout [i, o, 0, 1].
// The conv then uses a new constant: flip(K) scaled by [0.5, 6] along o (axis 1);
// the call is gone.
// CHECK-LABEL: @torchax_conv_transpose_flip_call
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x2x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 5.000000e-01]], {{\[\[}}2.400000e+01, 1.800000e+01]]], {{\[\[\[}}3.000000e+00, 2.500000e+00]], {{\[\[}}4.800000e+01, 4.200000e+01]]]]> : tensor<2x2x1x2xf32>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<2xf32>) -> tensor<1x2x3x4xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func private @_flip(%k: tensor<2x2x1x2xf32>) -> tensor<2x2x1x2xf32> {
  %r = stablehlo.reverse %k, dims = [3] : tensor<2x2x1x2xf32>
  return %r : tensor<2x2x1x2xf32>
}

func.func @torchax_conv_transpose_flip_call(%x: tensor<1x2x2x2xf32>) -> tensor<1x2x3x4xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0]], [[3.0, 4.0]]], [[[5.0, 6.0]], [[7.0, 8.0]]]]> : tensor<2x2x1x2xf32>
  %kf = call @_flip(%k) : (tensor<2x2x1x2xf32>) -> tensor<2x2x1x2xf32>
  %conv = stablehlo.convolution(%x, %kf) dim_numbers = [b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [1, 1]], lhs_dilate = [2, 2], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<2x2x1x2xf32>) -> tensor<1x2x3x4xf32>
  %mean = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %var = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %weight = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %bias = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %eps = stablehlo.constant dense<2.500000e-01> : tensor<1x2x1x1xf32>
  %var1 = stablehlo.reshape %var : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %var_eps = stablehlo.add %var1, %eps : tensor<1x2x1x1xf32>
  %r = stablehlo.rsqrt %var_eps : tensor<1x2x1x1xf32>
  %mean1 = stablehlo.reshape %mean : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %mean_b = stablehlo.broadcast_in_dim %mean1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x4xf32>
  %centered = stablehlo.subtract %conv, %mean_b : tensor<1x2x3x4xf32>
  %r_b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x4xf32>
  %normed = stablehlo.multiply %centered, %r_b : tensor<1x2x3x4xf32>
  %weight1 = stablehlo.reshape %weight : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %weight_b = stablehlo.broadcast_in_dim %weight1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x4xf32>
  %scaled = stablehlo.multiply %normed, %weight_b : tensor<1x2x3x4xf32>
  %bias1 = stablehlo.reshape %bias : (tensor<2xf32>) -> tensor<1x2x1x1xf32>
  %bias_b = stablehlo.broadcast_in_dim %bias1, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> tensor<1x2x3x4xf32>
  %y = stablehlo.add %scaled, %bias_b : tensor<1x2x3x4xf32>
  return %y : tensor<1x2x3x4xf32>
}

// -----

// gamma comes from a private function call.
// CHECK-LABEL: @statistic_through_call
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.rsqrt
// CHECK-NOT:     stablehlo.sqrt
// CHECK-NOT:     stablehlo.divide
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.subtract
// CHECK-NOT:     stablehlo.negate
// CHECK-NOT:     stablehlo.add
func.func private @_gamma() -> tensor<2xf32> {
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  return %g : tensor<2xf32>
}

func.func @statistic_through_call(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = call @_gamma() : () -> tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// A multiply by a constant that varies along H ends the foldable prefix: the
// multiply + add before it fold, the spatial multiply stays.
// CHECK-LABEL: @partial_fold_stops_at_spatial_multiply
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    %[[H:.+]] = stablehlo.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[HB:.+]] = stablehlo.broadcast_in_dim %[[H]], dims = [1]
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.multiply %[[R]], %[[HB]]
// CHECK-NEXT:    return %[[Y]]
func.func @partial_fold_stops_at_spatial_multiply(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %shifted = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  %h = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %h_b = stablehlo.broadcast_in_dim %h, dims = [1] : (tensor<3xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.multiply %shifted, %h_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// The multiplier varies along H (dims = [1, 3]): not per channel.
// CHECK-LABEL: @no_fold_multiply_varies_along_spatial_axis
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[H:.+]] = stablehlo.constant
// CHECK-NEXT:    %[[HB:.+]] = stablehlo.broadcast_in_dim %[[H]], dims = [1, 3]
// CHECK-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[CONV]], %[[HB]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[MUL]], %[[TB]]
// CHECK-NEXT:    return %[[R]]
func.func @no_fold_multiply_varies_along_spatial_axis(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %h = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %h_b = stablehlo.broadcast_in_dim %h, dims = [1, 3] : (tensor<3x2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %h_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// A relu (maximum with 0) between the conv and the affine ops.
// CHECK-LABEL: @no_fold_relu_between
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00>
// CHECK-NEXT:    %[[RELU:.+]] = stablehlo.maximum %[[CONV]], %[[ZERO]]
// CHECK-NEXT:    %[[S:.+]] = stablehlo.constant dense<[5.000000e-01, 6.000000e+00]>
// CHECK-NEXT:    %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [3]
// CHECK-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[RELU]], %[[SB]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[MUL]], %[[TB]]
// CHECK-NEXT:    return %[[R]]
func.func @no_fold_relu_between(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x3x3x2xf32>
  %relu = stablehlo.maximum %conv, %zero : tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %relu, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// The scale is a function argument.
// CHECK-LABEL: @no_fold_scale_is_argument
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>, %[[S:.+]]: tensor<2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [3]
// CHECK-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[CONV]], %[[SB]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[MUL]], %[[TB]]
// CHECK-NEXT:    return %[[R]]
func.func @no_fold_scale_is_argument(%x: tensor<1x3x3x2xf32>, %s: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// Division by a per-channel constant with a zero: folding would put inf in the kernel.
// CHECK-LABEL: @no_fold_divide_by_zero_channel
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[D:.+]] = stablehlo.constant dense<[2.000000e+00, 0.000000e+00]>
// CHECK-NEXT:    %[[DB:.+]] = stablehlo.broadcast_in_dim %[[D]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.divide %[[CONV]], %[[DB]]
// CHECK-NEXT:    return %[[R]]
func.func @no_fold_divide_by_zero_channel(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %d = stablehlo.constant dense<[2.0, 0.0]> : tensor<2xf32>
  %d_b = stablehlo.broadcast_in_dim %d, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.divide %conv, %d_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// The centered value (conv - mean) is also returned: folding the multiply and
// add past it would need a second copy of the conv.
// CHECK-LABEL: @no_fold_centered_value_has_second_user
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// CHECK-NEXT:    %[[MB:.+]] = stablehlo.broadcast_in_dim %[[M]], dims = [3]
// CHECK-NEXT:    %[[C:.+]] = stablehlo.subtract %[[CONV]], %[[MB]]
// CHECK-NEXT:    %[[S:.+]] = stablehlo.constant dense<[5.000000e-01, 6.000000e+00]>
// CHECK-NEXT:    %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [3]
// CHECK-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[C]], %[[SB]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// CHECK-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[MUL]], %[[TB]]
// CHECK-NEXT:    return %[[R]], %[[C]]
func.func @no_fold_centered_value_has_second_user(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %m_b = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %conv, %m_b : tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %centered, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y, %centered : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

// The scaled value (conv * s) is also returned. Folding s into the kernel is
// still exact (every user of the multiply wants conv * s); the add after it
// then cannot fold, because the new conv has two users.
// CHECK-LABEL: @scaled_value_has_second_user
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[TB]]
// CHECK-NEXT:    return %[[R]], %[[CONV]]
func.func @scaled_value_has_second_user(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y, %scaled : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

// A reshape that merges the feature axis with others (1x3x3x2 -> 1x18): backward-affine
// refuses it; the scale is a scalar, which commutes with any reshape, so fold-scale moves
// it into the kernel (x 2).
// CHECK-LABEL: @no_fold_reshape_merges_feature_axis
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}2.000000e+00, 4.000000e+00], [6.000000e+00, 8.000000e+00]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[FLAT:.+]] = stablehlo.reshape %[[CONV]] : (tensor<1x3x3x2xf32>) -> tensor<1x18xf32>
// CHECK-NEXT:    return %[[FLAT]]
func.func @no_fold_reshape_merges_feature_axis(%x: tensor<1x3x3x2xf32>) -> tensor<1x18xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %flat = stablehlo.reshape %conv : (tensor<1x3x3x2xf32>) -> tensor<1x18xf32>
  %s = stablehlo.constant dense<2.0> : tensor<1x18xf32>
  %y = stablehlo.multiply %flat, %s : tensor<1x18xf32>
  return %y : tensor<1x18xf32>
}

// -----

// Dense + multiply along the batch axis 0 (not the feature axis): the lhs
// (an argument) would have to be scaled.
// CHECK-LABEL: @no_fold_dense_multiply_along_batch_axis
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00], [5.000000e+00, 6.000000e+00]]>
// CHECK-NEXT:    %[[DOT:.+]] = stablehlo.dot_general %[[X]], %[[W]]
// CHECK-NEXT:    %[[C:.+]] = stablehlo.constant dense<[2.000000e+00, 3.000000e+00]>
// CHECK-NEXT:    %[[CB:.+]] = stablehlo.broadcast_in_dim %[[C]], dims = [0]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.multiply %[[DOT]], %[[CB]]
// CHECK-NEXT:    return %[[R]]
func.func @no_fold_dense_multiply_along_batch_axis(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf32>
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %c = stablehlo.constant dense<[2.0, 3.0]> : tensor<2xf32>
  %c_b = stablehlo.broadcast_in_dim %c, dims = [0] : (tensor<2xf32>) -> tensor<2x2xf32>
  %y = stablehlo.multiply %dot, %c_b : tensor<2x2xf32>
  return %y : tensor<2x2xf32>
}

// -----

// Full-size (1x2x2x2) scale and shift constants that vary only along channels.
// CHECK-LABEL: @full_size_per_channel_constants
// CHECK-SAME:    (%[[X:.+]]: tensor<1x2x2x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x2x2x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.multiply
// CHECK-NOT:     stablehlo.add
func.func @full_size_per_channel_constants(%x: tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x2x2xf32>
  %s = stablehlo.constant dense<[[[[0.5, 6.0], [0.5, 6.0]], [[0.5, 6.0], [0.5, 6.0]]]]> : tensor<1x2x2x2xf32>
  %scaled = stablehlo.multiply %conv, %s : tensor<1x2x2x2xf32>
  %t = stablehlo.constant dense<[[[[-0.5, 23.0], [-0.5, 23.0]], [[-0.5, 23.0], [-0.5, 23.0]]]]> : tensor<1x2x2x2xf32>
  %y = stablehlo.add %scaled, %t : tensor<1x2x2x2xf32>
  return %y : tensor<1x2x2x2xf32>
}
