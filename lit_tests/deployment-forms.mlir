// RUN: %bnfold-opt --split-input-file %s | %filecheck %s
// RUN: %bnfold-opt --split-input-file %s --disable inline-calls | %filecheck %s --check-prefix=NOINLINE
// NOINLINE-LABEL: @jit_helper
// NOINLINE: call @conv
// NOINLINE: stablehlo.multiply

// Shape-polymorphic batch (jax.export with symbolic_shape): the statistics arrive
// through dynamic_broadcast_in_dim; the bias is broadcast to the result's own
// runtime shape, so the module verifies and refines for every batch size.
// CHECK-LABEL: @symbolic_batch
// CHECK-SAME:    (%[[X:.+]]: tensor<?x3x3x2xf32>, %{{.+}}: tensor<i32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.get_dimension_size %[[CONV]], dim = 0
// CHECK-NEXT:    %[[N1:.+]] = stablehlo.reshape %[[N]] : (tensor<i32>) -> tensor<1xi32>
// CHECK-NEXT:    %[[C3:.+]] = stablehlo.constant dense<3> : tensor<1xi32>
// CHECK-NEXT:    %[[C2:.+]] = stablehlo.constant dense<2> : tensor<1xi32>
// CHECK-NEXT:    %[[SHAPE:.+]] = stablehlo.concatenate %[[N1]], %[[C3]], %[[C3]], %[[C2]], dim = 0
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.dynamic_broadcast_in_dim %[[B]], %[[SHAPE]], dims = [3] : (tensor<2xf32>, tensor<4xi32>) -> tensor<?x3x3x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]] : tensor<?x3x3x2xf32>
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.multiply
func.func @symbolic_batch(%x: tensor<?x3x3x2xf32>, %b: tensor<i32>) -> tensor<?x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<?x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<?x3x3x2xf32>
  %c3 = stablehlo.constant dense<3> : tensor<1xi32>
  %c2 = stablehlo.constant dense<2> : tensor<1xi32>
  %b1 = stablehlo.reshape %b : (tensor<i32>) -> tensor<1xi32>
  %shape = stablehlo.concatenate %b1, %c3, %c3, %c2, dim = 0 : (tensor<1xi32>, tensor<1xi32>, tensor<1xi32>, tensor<1xi32>) -> tensor<4xi32>
  %s = stablehlo.constant dense<[[[[0.5, 6.0]]]]> : tensor<1x1x1x2xf32>
  %t = stablehlo.constant dense<[[[[-0.5, 23.0]]]]> : tensor<1x1x1x2xf32>
  %s_b = stablehlo.dynamic_broadcast_in_dim %s, %shape, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>, tensor<4xi32>) -> tensor<?x3x3x2xf32>
  %t_b = stablehlo.dynamic_broadcast_in_dim %t, %shape, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>, tensor<4xi32>) -> tensor<?x3x3x2xf32>
  %m = stablehlo.multiply %conv, %s_b : tensor<?x3x3x2xf32>
  %y = stablehlo.add %m, %t_b : tensor<?x3x3x2xf32>
  return %y : tensor<?x3x3x2xf32>
}

// -----

// Multi-platform export: the convolution is lowered per platform inside a
// stablehlo.case; every branch's kernel is scaled, the bias follows the case.
// CHECK-LABEL: @platform_case
// CHECK:         %[[CASE:.+]] = "stablehlo.case"
// CHECK-NEXT:      %[[K0:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01]
// CHECK-NEXT:      %[[C0:.+]] = stablehlo.convolution(%{{.+}}, %[[K0]]
// CHECK-NEXT:      stablehlo.return %[[C0]]
// CHECK:           %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01]
// CHECK-NEXT:      %[[C1:.+]] = stablehlo.convolution(%{{.+}}, %[[K1]]
// CHECK-NEXT:      stablehlo.return %[[C1]]
// CHECK:         %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CASE]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     stablehlo.multiply
func.func @platform_case(%i: tensor<i32>, %x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = "stablehlo.case"(%i) ({
    %c = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
    stablehlo.return %c : tensor<1x3x3x2xf32>
  }, {
    %c = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
    stablehlo.return %c : tensor<1x3x3x2xf32>
  }) : (tensor<i32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[[[[0.5, 6.0]]]]> : tensor<1x1x1x2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[[[[-0.5, 23.0]]]]> : tensor<1x1x1x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %y = stablehlo.add %m, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// A jax.jit helper computing the convolution, called with a constant kernel:
// inlined at its call site, then folded; the helper, left without callers, goes.
// CHECK-LABEL: @jit_helper
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     call @conv
// CHECK-NOT:     @conv
func.func @jit_helper(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = func.call @conv(%x, %k) : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[[[[0.5, 6.0]]]]> : tensor<1x1x1x2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[[[[-0.5, 23.0]]]]> : tensor<1x1x1x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %y = stablehlo.add %m, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}
func.func private @conv(%a: tensor<1x3x3x2xf32>, %w: tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32> {
  %c = stablehlo.convolution(%a, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  return %c : tensor<1x3x3x2xf32>
}

// -----

// A jit block of jitted layers, each layer a convolution and its batch norm:
// the kernel and statistics are constant only at the outer call site
// (@jit_block -> @block -> @layer); both levels are inlined, then folded.
// CHECK-LABEL: @jit_block
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// CHECK-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
// CHECK-NOT:     call @
// CHECK-NOT:     @layer
func.func @jit_block(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %y = func.call @block(%x, %k, %s, %t) : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}
func.func private @block(%a: tensor<1x3x3x2xf32>, %w: tensor<1x1x2x2xf32>, %s: tensor<2xf32>, %t: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %c = func.call @layer(%a, %w, %s, %t) : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %c : tensor<1x3x3x2xf32>
}
func.func private @layer(%a: tensor<1x3x3x2xf32>, %w: tensor<1x1x2x2xf32>, %s: tensor<2xf32>, %t: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %c = stablehlo.convolution(%a, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %c, %s_b : tensor<1x3x3x2xf32>
  %y = stablehlo.add %m, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// One branch computes something else: the case result is not a producer's in
// every branch, so nothing folds and the normalization gets a reason.
// CHECK-LABEL: @platform_case_mixed_branches
// CHECK:         "stablehlo.case"
// CHECK:         stablehlo.multiply
// CHECK:         stablehlo.add
func.func @platform_case_mixed_branches(%i: tensor<i32>, %x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = "stablehlo.case"(%i) ({
    %c = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
    stablehlo.return %c : tensor<1x3x3x2xf32>
  }, {
    stablehlo.return %x : tensor<1x3x3x2xf32>
  }) : (tensor<i32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[[[[0.5, 6.0]]]]> : tensor<1x1x1x2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[[[[-0.5, 23.0]]]]> : tensor<1x1x1x2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [0, 1, 2, 3] : (tensor<1x1x1x2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %y = stablehlo.add %m, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// A dot_general with the weight on the left and a symbolic free dimension on
// the right: the scale varies along the weight's (static) rows and folds into it.
// CHECK-LABEL: @symbolic_free_dimension
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.000000e+00, 1.500000e+00, 2.000000e+00], [3.000000e+01, 3.600000e+01, 4.200000e+01, 4.800000e+01]]>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.dot_general %[[W]], %{{.+}}, contracting_dims = [1] x [0]
// CHECK-NEXT:    return %[[Y]]
func.func @symbolic_free_dimension(%x: tensor<4x?xf32>, %n: tensor<2xi32>) -> tensor<2x?xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]> : tensor<2x4xf32>
  %y = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x?xf32>) -> tensor<2x?xf32>
  %s = stablehlo.constant dense<[[0.5, 6.0]]> : tensor<1x2xf32>
  %s_b = stablehlo.dynamic_broadcast_in_dim %s, %n, dims = [1, 0] : (tensor<1x2xf32>, tensor<2xi32>) -> tensor<2x?xf32>
  %m = stablehlo.multiply %y, %s_b : tensor<2x?xf32>
  return %m : tensor<2x?xf32>
}
