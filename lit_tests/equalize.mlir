// RUN: %bnfold-opt --equalize --split-input-file %s | %filecheck %s

// Layer 1's output ranges are [4, 1], layer 2's input ranges [1, 4], so
// s = sqrt(r1 / r2) = [2, 0.5]: K1 / s along o, bias / s, K2 * s along i,
// and ReLU6 becomes a per-channel clamp to [0, 6 / s] = [0, [3, 12]].

// CHECK-LABEL: @pair_through_relu6
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// CHECK:         %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}2.000000e+00, 2.000000e+00], [1.000000e+00, 5.000000e-01]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.convolution(%[[X]], %[[K1]])
// CHECK:         %[[B:.+]] = stablehlo.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %[[Y]], %[[BB]]
// CHECK:         %[[HI:.+]] = stablehlo.constant dense<[3.000000e+00, 1.200000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[HIB:.+]] = stablehlo.broadcast_in_dim %[[HI]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.clamp %{{.+}}, %[[A]], %[[HIB]] : (tensor<f32>, tensor<1x4x4x2xf32>, tensor<1x4x4x2xf32>)
// CHECK-NEXT:    %[[K2:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<1x1x2x1xf32>
// CHECK-NEXT:    %[[Z:.+]] = stablehlo.convolution(%[[R]], %[[K2]])
// CHECK-NEXT:    return %[[Z]]
func.func @pair_through_relu6(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x1xf32> {
  %k1 = stablehlo.constant dense<[[[[4.0, 1.0], [2.0, 0.25]]]]> : tensor<1x1x2x2xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  %b = stablehlo.constant dense<[2.0, 1.0]> : tensor<2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %a = stablehlo.add %y, %bb : tensor<1x4x4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %six = stablehlo.constant dense<6.0> : tensor<f32>
  %r = stablehlo.clamp %zero, %a, %six : (tensor<f32>, tensor<1x4x4x2xf32>, tensor<f32>) -> tensor<1x4x4x2xf32>
  %k2 = stablehlo.constant dense<[[[[1.0], [4.0]]]]> : tensor<1x1x2x1xf32>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x1xf32>) -> tensor<1x4x4x1xf32>
  return %z : tensor<1x4x4x1xf32>
}

// -----

// conv -> ReLU -> depthwise conv -> ReLU -> conv (the DFQ triplet): all three
// kernels are replaced; ReLU's zero bound divides to zero and stays as it is.

// CHECK-LABEL: @triplet_conv_depthwise_conv
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// The balanced ranges are cube roots of the three layers' range products (2^(1/3) = 1.2599):
// CHECK:         %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.259921{{[0-9]*}}, 0.24662{{[0-9]*}}, 1.85663{{[0-9]*}}], [0.62996{{[0-9]*}}, 0.49324{{[0-9]*}}, 0.23207{{[0-9]*}}]]]]> : tensor<1x1x2x3xf32>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.convolution(%[[X]], %[[K1]])
// CHECK-NEXT:    %[[ZERO:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<1x4x4x3xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.maximum %[[Y]], %[[ZERO]]
// CHECK-NEXT:    %[[KD:.+]] = stablehlo.constant dense<{{\[\[\[\[}}0.62996{{[0-9]*}}, 0.49324{{[0-9]*}}, 0.92831{{[0-9]*}}]], {{.+}}, {{\[\[}}1.259921{{[0-9]*}}, 0.049324{{[0-9]*}}, 1.85663{{[0-9]*}}]], {{.+}}> : tensor<3x3x1x3xf32>
// CHECK-NEXT:    %[[D:.+]] = stablehlo.convolution(%[[R]], %[[KD]]) {{.+}} feature_group_count = 3
// CHECK-NEXT:    %[[R2:.+]] = stablehlo.maximum %[[D]], %[[ZERO]]
// CHECK-NEXT:    %[[K3:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.259921{{[0-9]*}}, 0.62996{{[0-9]*}}], [0.24662{{[0-9]*}}, 0.49324{{[0-9]*}}], [1.85663{{[0-9]*}}, 0.46415{{[0-9]*}}]]]]> : tensor<1x1x3x2xf32>
// CHECK-NEXT:    %[[Z:.+]] = stablehlo.convolution(%[[R2]], %[[K3]])
// CHECK-NEXT:    return %[[Z]]
func.func @triplet_conv_depthwise_conv(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k1 = stablehlo.constant dense<[[[[1.0, 0.01, 8.0], [0.5, 0.02, 1.0]]]]> : tensor<1x1x2x3xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x3xf32>) -> tensor<1x4x4x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x4x4x3xf32>
  %r = stablehlo.maximum %y, %zero : tensor<1x4x4x3xf32>
  %kd = stablehlo.constant dense<[[[[1.0, 30.0, 0.1]], [[1.0, 3.0, 0.1]], [[1.0, 3.0, 0.1]]], [[[1.0, 3.0, 0.1]], [[2.0, 3.0, 0.2]], [[1.0, 3.0, 0.1]]], [[[1.0, 3.0, 0.1]], [[1.0, 3.0, 0.1]], [[1.0, 3.0, 0.1]]]]> : tensor<3x3x1x3xf32>
  %d = stablehlo.convolution(%r, %kd) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 3 : i64} : (tensor<1x4x4x3xf32>, tensor<3x3x1x3xf32>) -> tensor<1x4x4x3xf32>
  %r2 = stablehlo.maximum %d, %zero : tensor<1x4x4x3xf32>
  %k3 = stablehlo.constant dense<[[[[1.0, 0.5], [0.1, 0.2], [4.0, 1.0]]]]> : tensor<1x1x3x2xf32>
  %z = stablehlo.convolution(%r2, %k3) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x3xf32>, tensor<1x1x3x2xf32>) -> tensor<1x4x4x2xf32>
  return %z : tensor<1x4x4x2xf32>
}

// -----

// Leaky ReLU as JAX spells it: select(x >= 0, x, x * 0.1). The comparison
// with zero and the slope are unchanged; only the kernels are.

// CHECK-LABEL: @pair_through_leaky_relu
// CHECK:         %[[K1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 2.000000e+00], [1.000000e+00, 5.000000e-01]]> : tensor<2x2xf32>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.dot_general %{{.+}}, %[[K1]]
// CHECK:         stablehlo.compare  GE, %[[Y]]
// CHECK:         %[[K2:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<2x1xf32>
// CHECK-NEXT:    stablehlo.dot_general %{{.+}}, %[[K2]]
func.func @pair_through_leaky_relu(%x: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %slope = stablehlo.constant dense<0.1> : tensor<4x2xf32>
  %ge = stablehlo.compare GE, %y, %zero : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xi1>
  %leak = stablehlo.multiply %y, %slope : tensor<4x2xf32>
  %r = stablehlo.select %ge, %y, %leak : tensor<4x2xi1>, tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0], [4.0]]> : tensor<2x1xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}

// -----

// JAX exports call a private @relu6 (shared by layers of the same shape):
// each call site gets its own copy, with its own per-channel bounds.

// CHECK-LABEL: @pair_through_private_relu6
// CHECK-NOT:     call
// CHECK:         %[[HI:.+]] = stablehlo.constant dense<[3.000000e+00, 1.200000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[HIB:.+]] = stablehlo.broadcast_in_dim %[[HI]], dims = [1]
// CHECK-NEXT:    stablehlo.minimum %{{.+}}, %[[HIB]]
// CHECK-NOT:     func.func private @relu6
func.func @pair_through_private_relu6(%x: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %r = call @relu6(%y) : (tensor<4x2xf32>) -> tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0], [4.0]]> : tensor<2x1xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}
func.func private @relu6(%a: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %six = stablehlo.constant dense<6.0> : tensor<4x2xf32>
  %m = stablehlo.maximum %a, %zero : tensor<4x2xf32>
  %n = stablehlo.minimum %m, %six : tensor<4x2xf32>
  return %n : tensor<4x2xf32>
}

// -----

// No fire: a residual branch also reads layer 1's output (fan-out).

// CHECK-LABEL: @no_fire_fan_out
// CHECK:         stablehlo.constant dense<{{\[\[}}4.000000e+00, 1.000000e+00], [2.000000e+00, 2.500000e-01]]>
// CHECK:         stablehlo.constant dense<{{\[\[}}1.000000e+00, 0.000000e+00], [0.000000e+00, 4.000000e+00]]>
func.func @no_fire_fan_out(%x: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %r = stablehlo.maximum %y, %zero : tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0, 0.0], [0.0, 4.0]]> : tensor<2x2xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.add %z, %r : tensor<4x2xf32>
  return %s : tensor<4x2xf32>
}

// -----

// No fire: sigmoid is not positively homogeneous.

// CHECK-LABEL: @no_fire_sigmoid
// CHECK:         stablehlo.constant dense<{{\[\[}}4.000000e+00, 1.000000e+00], [2.000000e+00, 2.500000e-01]]>
// CHECK:         stablehlo.logistic
// CHECK:         stablehlo.constant dense<{{\[\[}}1.000000e+00], [4.000000e+00]]>
func.func @no_fire_sigmoid(%x: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %r = stablehlo.logistic %y : tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0], [4.0]]> : tensor<2x1xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}

// -----

// No fire: layer 2's kernel is a function argument.

// CHECK-LABEL: @no_fire_kernel_argument
// CHECK:         stablehlo.constant dense<{{\[\[}}4.000000e+00, 1.000000e+00], [2.000000e+00, 2.500000e-01]]>
// CHECK:         stablehlo.dot_general %{{.+}}, %arg1
func.func @no_fire_kernel_argument(%x: tensor<4x2xf32>, %k2: tensor<2x1xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %r = stablehlo.maximum %y, %zero : tensor<4x2xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}

// -----

// No fire: a gate that is not constant (squeeze-and-excitation) scales the
// activation by a runtime value.

// CHECK-LABEL: @no_fire_runtime_gate
// CHECK:         stablehlo.constant dense<{{\[\[}}4.000000e+00, 1.000000e+00], [2.000000e+00, 2.500000e-01]]>
// CHECK:         stablehlo.multiply %{{.+}}, %arg1
func.func @no_fire_runtime_gate(%x: tensor<4x2xf32>, %g: tensor<4x2xf32>) -> tensor<4x1xf32> {
  %k1 = stablehlo.constant dense<[[4.0, 1.0], [2.0, 0.25]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %r = stablehlo.multiply %y, %g : tensor<4x2xf32>
  %k2 = stablehlo.constant dense<[[1.0], [4.0]]> : tensor<2x1xf32>
  %z = stablehlo.dot_general %r, %k2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x1xf32>) -> tensor<4x1xf32>
  return %z : tensor<4x1xf32>
}
