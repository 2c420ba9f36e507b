// RUN: %bnfold-opt %s | %filecheck %s
// RUN: %bnfold-opt %s --pad-uniform-shift | %filecheck %s --check-prefix=PAD
// RUN: %bnfold-opt %s --pass-pipeline='builtin.module(bnfold-fold{pad-uniform-shift=true})' | %filecheck %s --check-prefix=PAD

// By default a uniform shift folds like any other, with the exact border
// correction: sum(K * t) = 1.5 where the 1x1 window reads real data, 0 on the
// padded border.
// CHECK-LABEL: @forward_uniform_shift_through_padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00]]]]>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      pad = {{\[\[}}1, 1], [1, 1]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<{{.*}}[1.500000e+00, 1.500000e+00]]]> : tensor<2x2x2xf32>
// CHECK-NOT:     stablehlo.pad
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [1, 2, 3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[C]], %[[B]]
// CHECK-NEXT:    return %[[R]]

// With --pad-uniform-shift:
// A uniform shift over the scale (Keras Rescaling: s = [2, 4], t = [1, 2], so
// t / s = 0.5 on every channel) folds exactly through the zero padding: the
// padding moves into an explicit pad of the unshifted input with value -0.5,
// the convolution becomes VALID, and 0.5 * sum(K * s) is the new bias.

// PAD-LABEL: @forward_uniform_shift_through_padding
// PAD-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// PAD-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00]]]]>
// PAD-NEXT:    %[[V:.+]] = stablehlo.constant dense<-5.000000e-01> : tensor<f32>
// PAD-NEXT:    %[[P:.+]] = stablehlo.pad %[[X]], %[[V]], low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0]
// PAD-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[P]], %[[K]])
// PAD-SAME:      pad = {{\[\[}}0, 0], [0, 0]]
// PAD-NEXT:    %[[B:.+]] = stablehlo.constant dense<1.500000e+00> : tensor<2xf32>
// PAD-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// PAD-NEXT:    %[[R:.+]] = stablehlo.add %[[C]], %[[BB]]
// PAD-NEXT:    return %[[R]]
func.func @forward_uniform_shift_through_padding(%x: tensor<1x3x3x2xf32>) -> tensor<1x5x5x2xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x3x3x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x3x3x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x5x5x2xf32>
  return %c : tensor<1x5x5x2xf32>
}
