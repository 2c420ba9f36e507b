// RUN: %bnfold-opt --equalize --absorb-high-bias --split-input-file %s | %filecheck %s

// conv -> batch norm (beta - 3|gamma| = [2.5, -1.3, 2.25]) -> ReLU6 -> conv:
// channels 0 and 2 move c = (beta - 3|gamma|) / s out of layer 1's bias and
// ReLU6's upper bound, into a new bias add after layer 2 (sum of K2 * c).

// CHECK-LABEL: @absorbs_into_a_new_bias_after_layer_2
// CHECK:         %[[Y:.+]] = stablehlo.convolution
// CHECK:         %[[B1:.+]] = stablehlo.add %[[Y]], %{{.+}}
// CHECK:         %[[R:.+]] = stablehlo.clamp %{{.+}}, %[[B1]], %{{.+}} : (tensor<f32>, tensor<2x4x4x3xf32>, tensor<2x4x4x3xf32>)
// CHECK:         %[[Z:.+]] = stablehlo.convolution(%[[R]], %{{.+}})
// K2 . c: c = [2.5, 0, 2.25] (the equalization scale cancels), rows [1, -2] and [-1, 3].
// CHECK-NEXT:    %[[C:.+]] = stablehlo.constant dense<[{{0\.2499999[0-9]*|2\.500000e-01}}, {{1\.7500[0-9]*|1\.750000e\+00}}]> : tensor<2xf32>
// CHECK-NEXT:    %[[CB:.+]] = stablehlo.broadcast_in_dim %[[C]], dims = [3]
// CHECK-NEXT:    %[[O:.+]] = stablehlo.add %[[Z]], %[[CB]]
// CHECK-NEXT:    return %[[O]]
func.func @absorbs_into_a_new_bias_after_layer_2(%x: tensor<2x4x4x2xf32>) -> tensor<2x4x4x2xf32> {
  %k1 = stablehlo.constant dense<[[[[0.02, -0.01, 0.03], [0.01, 0.02, -0.02]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x2xf32>, tensor<1x1x2x3xf32>) -> tensor<2x4x4x3xf32>
  %g = stablehlo.constant dense<[0.5, 0.5, 0.25]> : tensor<3xf32>
  %b = stablehlo.constant dense<[4.0, 0.2, 3.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[0.0, 0.1, 0.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[1.0, 1.0, 0.25]> : tensor<3xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 3 : i64} : (tensor<2x4x4x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x4x4x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %six = stablehlo.constant dense<6.0> : tensor<f32>
  %r = stablehlo.clamp %zero, %n, %six : (tensor<f32>, tensor<2x4x4x3xf32>, tensor<f32>) -> tensor<2x4x4x3xf32>
  %k2 = stablehlo.constant dense<[[[[1.0, -2.0], [0.5, 0.1], [-1.0, 3.0]]]]> : tensor<1x1x3x2xf32>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x3xf32>, tensor<1x1x3x2xf32>) -> tensor<2x4x4x2xf32>
  return %z : tensor<2x4x4x2xf32>
}

// -----

// No fire: nothing between the layers clips at zero, so there is no bias a
// ReLU "almost surely passes"; equalization alone, no add after layer 2.

// CHECK-LABEL: @no_fire_without_relu
// CHECK:         %[[Y:.+]] = stablehlo.dot_general
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]]
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %[[Y]], %[[BB]]
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant
// CHECK-NEXT:    %[[Z:.+]] = stablehlo.dot_general %[[A]], %[[K]]
// CHECK-NEXT:    return %[[Z]]
func.func @no_fire_without_relu(%x: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %g = stablehlo.constant dense<[0.5, 0.5]> : tensor<2xf32>
  %b = stablehlo.constant dense<[4.0, 3.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[0.0, 0.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 1 : i64} : (tensor<4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0], [4.0]]> : tensor<2x1xf32>
  %z = stablehlo.dot_general %n, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}

// -----

// Layer 2 zero-pads (3x3 SAME): its padded taps stood for relu(y) = 0 and
// would now stand for c, so the shift is not one bias per channel. An exact
// correction table of row classes (corners, edges, interior) is rebuilt by
// slices and concatenates and added after layer 2.

// CHECK-LABEL: @zero_padded_layer_2_gets_an_exact_border_correction
// CHECK:         %[[Z:.+]] = stablehlo.convolution(%{{.+}}, %{{.+}}) {{.*}}pad = {{\[\[}}1, 1], [1, 1]]
// 0.5 * (2.5 + 2.25) per tap: 4 taps in a corner, 6 on an edge, 9 inside.
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<{{\[\[\[}}9.500000e+00], [9.500000e+00], [1.425000e+01]], {{\[\[}}9.500000e+00], [9.500000e+00], [1.425000e+01]], {{\[\[}}1.425000e+01], [1.425000e+01], [2.137500e+01]]]> : tensor<3x3x1xf32>
// CHECK:         %[[ROWS:.+]] = stablehlo.concatenate {{.*}}, dim = 0 : {{.*}} -> tensor<4x3x1xf32>
// CHECK:         %[[TABLE:.+]] = stablehlo.concatenate {{.*}}, dim = 1 : {{.*}} -> tensor<4x4x1xf32>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.broadcast_in_dim %[[TABLE]], dims = [1, 2, 3] : (tensor<4x4x1xf32>) -> tensor<2x4x4x1xf32>
// CHECK-NEXT:    %[[O:.+]] = stablehlo.add %[[Z]], %[[C]]
// CHECK-NEXT:    return %[[O]]
func.func @zero_padded_layer_2_gets_an_exact_border_correction(%x: tensor<2x4x4x2xf32>) -> tensor<2x4x4x1xf32> {
  %k1 = stablehlo.constant dense<[[[[0.02, -0.01, 0.03], [0.01, 0.02, -0.02]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x2xf32>, tensor<1x1x2x3xf32>) -> tensor<2x4x4x3xf32>
  %g = stablehlo.constant dense<[0.5, 0.5, 0.25]> : tensor<3xf32>
  %b = stablehlo.constant dense<[4.0, 0.2, 3.0]> : tensor<3xf32>
  %m = stablehlo.constant dense<[0.0, 0.1, 0.0]> : tensor<3xf32>
  %v = stablehlo.constant dense<[1.0, 1.0, 0.25]> : tensor<3xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 3 : i64} : (tensor<2x4x4x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x4x4x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %six = stablehlo.constant dense<6.0> : tensor<f32>
  %r = stablehlo.clamp %zero, %n, %six : (tensor<f32>, tensor<2x4x4x3xf32>, tensor<f32>) -> tensor<2x4x4x3xf32>
  %k2 = stablehlo.constant dense<0.5> : tensor<3x3x3x1xf32>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x4x3xf32>, tensor<3x3x3x1xf32>) -> tensor<2x4x4x1xf32>
  return %z : tensor<2x4x4x1xf32>
}
