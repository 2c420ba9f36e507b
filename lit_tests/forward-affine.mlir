// RUN: %bnfold-opt --split-input-file %s | %filecheck %s

// Scale [2, 4] and shift [1, 3] before a 1x1 convolution without padding:
// K' = K * s along i, bias = sum over window and inputs of K * t = [2, 2].

// CHECK-LABEL: @forward_scale_and_shift_without_padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00]]]]> : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<2xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[C]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
func.func @forward_scale_and_shift_without_padding(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x3x3x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x3x3x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[0, 0], [0, 0]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  return %c : tensor<1x3x3x2xf32>
}

// -----

// Zero padding would see the shift where the original saw zeros. The scale
// [2, 4] folds into the kernel's input axis; the shift's output, conv(t), is
// sum(K * t) = 2 where the 1x1 window reads real data and 0 on the padded
// border. Rows and columns each have two classes (border, interior), so the
// exact correction is a 2x2x2 table rebuilt by slices, broadcasts and concatenates.

// CHECK-LABEL: @forward_shift_through_padding_folds_with_a_border_correction
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00]]]]>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-SAME:      pad = {{\[\[}}1, 1], [1, 1]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<{{.*}}[2.000000e+00, 2.000000e+00]]]> : tensor<2x2x2xf32>
// CHECK-NEXT:    %[[EDGE:.+]] = stablehlo.slice %[[T]] [0:1, 0:2, 0:2]
// CHECK-NEXT:    %[[IN:.+]] = stablehlo.slice %[[T]] [1:2, 0:2, 0:2]
// CHECK-NEXT:    %[[INB:.+]] = stablehlo.broadcast_in_dim %[[IN]], dims = [0, 1, 2] : (tensor<1x2x2xf32>) -> tensor<3x2x2xf32>
// CHECK-NEXT:    %[[ROWS:.+]] = stablehlo.concatenate %[[EDGE]], %[[INB]], %[[EDGE]], dim = 0
// CHECK:         %[[FULL:.+]] = stablehlo.concatenate {{.*}}, dim = 1 : {{.*}} -> tensor<5x5x2xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.broadcast_in_dim %[[FULL]], dims = [1, 2, 3] : (tensor<5x5x2xf32>) -> tensor<1x5x5x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[C]], %[[B]]
// CHECK-NEXT:    return %[[R]]
func.func @forward_shift_through_padding_folds_with_a_border_correction(%x: tensor<1x3x3x2xf32>) -> tensor<1x5x5x2xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x3x3x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x3x3x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x5x5x2xf32>
  return %c : tensor<1x5x5x2xf32>
}

// -----

// Keras ZeroPadding2D then Conv2D(padding="valid"): the explicit zero pad
// becomes the convolution's padding, and the shift folds with a correction.
// W = sum_i K * t = 4 per tap; the 3x3 stride-2 window sees 9, 6, 6 and 4 real
// taps, and with one row/column per class the 2x2 table is the correction itself.

// CHECK-LABEL: @forward_explicit_zero_pad_becomes_the_conv_padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// CHECK-NOT:     stablehlo.pad
// CHECK:         %[[C:.+]] = stablehlo.convolution(%[[X]], %{{[^)]+}})
// CHECK-SAME:      stride = [2, 2], pad = {{\[\[}}0, 1], [0, 1]]
// CHECK-NEXT:    %[[T:.+]] = stablehlo.constant dense<{{\[\[\[}}3.600000e+01], [2.400000e+01]], {{\[\[}}2.400000e+01], [1.600000e+01]]]> : tensor<2x2x1xf32>
// CHECK-NEXT:    %[[B:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [1, 2, 3]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[C]], %[[B]]
// CHECK-NEXT:    return %[[R]]
func.func @forward_explicit_zero_pad_becomes_the_conv_padding(%x: tensor<1x4x4x2xf32>) -> tensor<1x2x2x1xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<3x3x2x1xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x4x4x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x4x4x2xf32>
  %p = stablehlo.pad %a, %zero, low = [0, 0, 0, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<1x4x4x2xf32>, tensor<f32>) -> tensor<1x5x5x2xf32>
  %c = stablehlo.convolution(%p, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x5x5x2xf32>, tensor<3x3x2x1xf32>) -> tensor<1x2x2x1xf32>
  return %c : tensor<1x2x2x1xf32>
}

// -----

// A pad with a non-zero value, or interior padding, is not the convolution's
// zero padding: the chain stops at it and nothing folds.

// CHECK-LABEL: @forward_nonzero_pad_is_not_absorbed
// CHECK:         %[[M:.+]] = stablehlo.multiply
// CHECK:         %[[A:.+]] = stablehlo.add %[[M]]
// CHECK:         %[[P:.+]] = stablehlo.pad %[[A]]
// CHECK:         stablehlo.convolution(%[[P]],
func.func @forward_nonzero_pad_is_not_absorbed(%x: tensor<1x4x4x2xf32>) -> tensor<1x2x2x1xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<3x3x2x1xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %one = stablehlo.constant dense<1.0> : tensor<f32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x4x4x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x4x4x2xf32>
  %p = stablehlo.pad %a, %one, low = [0, 0, 0, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<1x4x4x2xf32>, tensor<f32>) -> tensor<1x5x5x2xf32>
  %c = stablehlo.convolution(%p, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x5x5x2xf32>, tensor<3x3x2x1xf32>) -> tensor<1x2x2x1xf32>
  return %c : tensor<1x2x2x1xf32>
}

// -----

// Where the correction would be too large (a transposed convolution's holes
// make it periodic over the whole 79x79 output: 6241 constants), the scale
// still folds and the shift over the scale, t / s = [0.5, 0.75], stays as one
// add before the convolution (x * s + t == (x + t / s) * s; the holes see
// zeros either way).

// CHECK-LABEL: @forward_shift_with_a_too_large_border_correction_stays
// CHECK-SAME:    (%[[X:.+]]: tensor<1x40x40x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00], [2.000000e+00]]]]>
// CHECK-NEXT:    %[[U:.+]] = stablehlo.constant dense<[5.000000e-01, 7.500000e-01]>
// CHECK-NEXT:    %[[UB:.+]] = stablehlo.broadcast_in_dim %[[U]], dims = [3]
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %[[X]], %[[UB]]
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[A]], %[[K]])
// CHECK-SAME:      lhs_dilate = [2, 2]
// CHECK-NEXT:    return %[[C]]
// CHECK-NOT:     stablehlo.multiply
func.func @forward_shift_with_a_too_large_border_correction_stays(%x: tensor<1x40x40x2xf32>) -> tensor<1x79x79x1xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x1xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x40x40x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x40x40x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x40x40x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x40x40x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {lhs_dilate = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x40x40x2xf32>, tensor<1x1x2x1xf32>) -> tensor<1x79x79x1xf32>
  return %c : tensor<1x79x79x1xf32>
}

// -----

// A zero in the scale folds too when the correction applies (channel 1's
// kernel slice becomes 0; conv(t) still comes from the correction). Where the
// correction is too large, t / s does not exist, so neither part folds.

// CHECK-LABEL: @forward_shift_with_a_zero_scale_and_a_too_large_correction_is_not_folded
// CHECK:         %[[M:.+]] = stablehlo.multiply
// CHECK:         %[[A:.+]] = stablehlo.add %[[M]]
// CHECK:         stablehlo.convolution(%[[A]],
func.func @forward_shift_with_a_zero_scale_and_a_too_large_correction_is_not_folded(%x: tensor<1x40x40x2xf32>) -> tensor<1x79x79x1xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x1xf32>
  %s = stablehlo.constant dense<[2.0, 0.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x40x40x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x40x40x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x40x40x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x40x40x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {lhs_dilate = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x40x40x2xf32>, tensor<1x1x2x1xf32>) -> tensor<1x79x79x1xf32>
  return %c : tensor<1x79x79x1xf32>
}

// -----

// A scale alone folds through padding (0 * s = 0).

// CHECK-LABEL: @forward_scale_through_padding
// CHECK-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// CHECK-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00]]]]>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// CHECK-NEXT:    return %[[C]]
func.func @forward_scale_through_padding(%x: tensor<1x3x3x2xf32>) -> tensor<1x5x5x2xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<1x1x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x3x3x2xf32>
  %c = stablehlo.convolution(%m, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x5x5x2xf32>
  return %c : tensor<1x5x5x2xf32>
}

// -----

// Dense: the scale goes along the contracting dimension of the weight and the
// shift becomes a bias over its free dimension: W' rows [1, 1, 1], [2, 2, 2]; b = 2.

// CHECK-LABEL: @forward_into_dense
// CHECK-SAME:    (%[[X:.+]]: tensor<4x2xf32>)
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}1.000000e+00, 1.000000e+00, 1.000000e+00], [2.000000e+00, 2.000000e+00, 2.000000e+00]]>
// CHECK-NEXT:    %[[D:.+]] = stablehlo.dot_general %[[X]], %[[W]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<3xf32>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [1]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[D]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
func.func @forward_into_dense(%x: tensor<4x2xf32>) -> tensor<4x3xf32> {
  %w = stablehlo.constant dense<0.5> : tensor<2x3xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<4x2xf32>
  %a = stablehlo.add %m, %tb : tensor<4x2xf32>
  %d = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  return %d : tensor<4x3xf32>
}

// -----

// The normalized value has a second user: the chain must stay.

// CHECK-LABEL: @forward_chain_with_second_user_is_not_folded
// CHECK:         %[[M:.+]] = stablehlo.multiply
// CHECK:         stablehlo.dot_general %[[M]],
// CHECK:         return
func.func @forward_chain_with_second_user_is_not_folded(%x: tensor<4x2xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %w = stablehlo.constant dense<0.5> : tensor<2x3xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<4x2xf32>
  %d = stablehlo.dot_general %m, %w, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  return %d, %m : tensor<4x3xf32>, tensor<4x2xf32>
}


// -----

// A dynamic spatial size: the border correction cannot be computed at fold time;
// the scale folds and t / s = [0.5, 0.75] stays as one add before the convolution
// (broadcast to the runtime shape).

// CHECK-LABEL: @forward_shift_through_padding_with_dynamic_spatial_size_stays
// CHECK-SAME:    (%[[X:.+]]: tensor<1x?x?x2xf32>)
// CHECK:         %[[U:.+]] = stablehlo.constant dense<[5.000000e-01, 7.500000e-01]>
// CHECK:         %[[UB:.+]] = stablehlo.dynamic_broadcast_in_dim %[[U]]
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %[[X]], %[[UB]]
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convolution(%[[A]], %{{.+}})
// CHECK-NEXT:    return %[[C]]
// CHECK-NOT:     stablehlo.multiply
func.func @forward_shift_through_padding_with_dynamic_spatial_size_stays(%x: tensor<1x?x?x2xf32>) -> tensor<1x?x?x2xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<3x3x2x2xf32>
  %s = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %t = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %shape = stablehlo.get_dimension_size %x, dim = 1 : (tensor<1x?x?x2xf32>) -> tensor<i32>
  %one = stablehlo.constant dense<1> : tensor<1xi32>
  %two = stablehlo.constant dense<2> : tensor<1xi32>
  %h = stablehlo.reshape %shape : (tensor<i32>) -> tensor<1xi32>
  %w0 = stablehlo.get_dimension_size %x, dim = 2 : (tensor<1x?x?x2xf32>) -> tensor<i32>
  %w = stablehlo.reshape %w0 : (tensor<i32>) -> tensor<1xi32>
  %dims = stablehlo.concatenate %one, %h, %w, %two, dim = 0 : (tensor<1xi32>, tensor<1xi32>, tensor<1xi32>, tensor<1xi32>) -> tensor<4xi32>
  %sb = stablehlo.dynamic_broadcast_in_dim %s, %dims, dims = [3] : (tensor<2xf32>, tensor<4xi32>) -> tensor<1x?x?x2xf32>
  %tb = stablehlo.dynamic_broadcast_in_dim %t, %dims, dims = [3] : (tensor<2xf32>, tensor<4xi32>) -> tensor<1x?x?x2xf32>
  %m = stablehlo.multiply %x, %sb : tensor<1x?x?x2xf32>
  %a = stablehlo.add %m, %tb : tensor<1x?x?x2xf32>
  %c = stablehlo.convolution(%a, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x?x?x2xf32>, tensor<3x3x2x2xf32>) -> tensor<1x?x?x2xf32>
  return %c : tensor<1x?x?x2xf32>
}
