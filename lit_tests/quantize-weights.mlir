// RUN: %bnfold-opt --quantize-weights int8 --split-input-file %s | %filecheck %s --check-prefixes=CHECK,INT8
// RUN: %bnfold-opt --quantize-weights int8 --quantize-granularity per-channel --split-input-file %s | %filecheck %s --check-prefixes=CHECK,CHANNEL
// RUN: %bnfold-opt --quantize-weights int4 --split-input-file %s | %filecheck %s --check-prefixes=CHECK,INT4
// RUN: %bnfold-opt --quantize-weights int8 --bias-correction --split-input-file %s | %filecheck %s --check-prefixes=CHECK,INT8,BIAS

// The weight becomes integers and one scale (max |W| / 127 = 0.01; -0.635 / 0.01 =
// -63.5 rounds to even), dequantized in the graph: convert, then multiply by the
// scale broadcast to the kernel (per channel: along o, 0.01 and 0.005).

// CHECK-LABEL: @qdq
// CHECK-SAME:    (%[[X:.+]]: tensor<1x4x4x2xf32>)
// INT8:          %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}127, -64], [30, 0]]]]> : tensor<1x1x2x2xi8>
// INT8-NEXT:     %[[F:.+]] = stablehlo.convert %[[Q]] : (tensor<1x1x2x2xi8>) -> tensor<1x1x2x2xf32>
// INT8-NEXT:     %[[S:.+]] = stablehlo.constant dense<0.00999999977> : tensor<f32>
// INT8-NEXT:     %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [] : (tensor<f32>) -> tensor<1x1x2x2xf32>
// CHANNEL:       %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}127, -127], [30, 1]]]]> : tensor<1x1x2x2xi8>
// CHANNEL-NEXT:  %[[F:.+]] = stablehlo.convert %[[Q]] : (tensor<1x1x2x2xi8>) -> tensor<1x1x2x2xf32>
// CHANNEL-NEXT:  %[[S:.+]] = stablehlo.constant dense<[0.00999999977, 5.000000e-03]> : tensor<2xf32>
// CHANNEL-NEXT:  %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [3] : (tensor<2xf32>) -> tensor<1x1x2x2xf32>
// INT4:          %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}7, -4], [2, 0]]]]> : tensor<1x1x2x2xi4>
// INT4-NEXT:     %[[F:.+]] = stablehlo.convert %[[Q]] : (tensor<1x1x2x2xi4>) -> tensor<1x1x2x2xf32>
// INT4-NEXT:     %[[S:.+]] = stablehlo.constant dense<0.181428567> : tensor<f32>
// INT4-NEXT:     %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = []
// CHECK-NEXT:    %[[W:.+]] = stablehlo.multiply %[[F]], %[[SB]] : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.convolution(%[[X]], %[[W]])
// CHECK-NEXT:    return %[[Y]]
func.func @qdq(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.27, -0.635], [0.3, 0.005]]]]> : tensor<1x1x2x2xf32>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  return %y : tensor<1x4x4x2xf32>
}

// -----

// Bias correction. The first layer reads the function's argument: nothing says what its
// input looks like, so it is quantized uncorrected (the report says why). Its batch
// norm makes its pre-activation N(2, 1) in channel 0 and N(-1, 0.5^2) in channel 1; after
// the ReLU E[x] = 2 Phi(2) + phi(2) = 2.008490 and -Phi(-2) + 0.5 phi(-2) = 0.008491.
// Layer 2's weight [0.3, 1.0] quantizes to [38, 127] / 127: its error is [-0.000787, 0], so
// the expected output shift is -0.000787 * 2.008490 = -0.001581, which the bias (0.5)
// takes back: 0.501581.

// CHECK-LABEL: @bias_correction
// CHECK:         stablehlo.convolution
// INT8:          %[[Q2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}38], [127]]]]> : tensor<1x1x2x1xi8>
// CHANNEL:       %[[Q2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}38], [127]]]]> : tensor<1x1x2x1xi8>
// INT4:          %[[Q2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}2], [7]]]]> : tensor<1x1x2x1xi4>
// CHECK:         %[[Z:.+]] = stablehlo.convolution
// BIAS-NEXT:     %[[B:.+]] = stablehlo.constant dense<0.50158{{[0-9]*}}> : tensor<1xf32>
// INT8-NOT:      stablehlo.constant dense<0.50158
func.func @bias_correction(%x: tensor<1x4x4x1xf32>) -> tensor<1x4x4x1xf32> {
  %k1 = stablehlo.constant dense<[[[[1.0, 1.0]]]]> : tensor<1x1x1x2xf32>
  %y = stablehlo.convolution(%x, %k1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x1xf32>, tensor<1x1x1x2xf32>) -> tensor<1x4x4x2xf32>
  %g = stablehlo.constant dense<[1.0, 0.5]> : tensor<2xf32>
  %b = stablehlo.constant dense<[2.0, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[0.0, 0.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[1.0, 1.0]> : tensor<2xf32>
  %n = "stablehlo.batch_norm_inference"(%y, %g, %b, %m, %v) {epsilon = 0.0 : f32, feature_index = 3 : i64} : (tensor<1x4x4x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x4x4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x4x4x2xf32>
  %r = stablehlo.maximum %n, %zero : tensor<1x4x4x2xf32>
  %k2 = stablehlo.constant dense<[[[[0.3], [1.0]]]]> : tensor<1x1x2x1xf32>
  %z = stablehlo.convolution(%r, %k2) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x1xf32>) -> tensor<1x4x4x1xf32>
  %c = stablehlo.constant dense<0.5> : tensor<1x4x4x1xf32>
  %o = stablehlo.add %z, %c : tensor<1x4x4x1xf32>
  return %o : tensor<1x4x4x1xf32>
}

// -----

// A bf16 weight: the integers are converted to f32 and multiplied by an f32 scale there
// (max |W| = 1.2734375 in bf16; / 127 = 0.0100270668 in f32), and the product is
// converted once to bf16.

// CHECK-LABEL: @qdq_bf16
// INT8:          %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}127, -64], [30, 0]]]]> : tensor<1x1x2x2xi8>
// INT8-NEXT:     %[[F:.+]] = stablehlo.convert %[[Q]] : (tensor<1x1x2x2xi8>) -> tensor<1x1x2x2xf32>
// INT8-NEXT:     %[[S:.+]] = stablehlo.constant dense<0.0100270668> : tensor<f32>
// INT8-NEXT:     %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [] : (tensor<f32>) -> tensor<1x1x2x2xf32>
// INT8-NEXT:     %[[W:.+]] = stablehlo.multiply %[[F]], %[[SB]] : tensor<1x1x2x2xf32>
// CHECK:         %[[WB:.+]] = stablehlo.convert %{{.+}} : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xbf16>
// CHECK-NEXT:    stablehlo.convolution(%{{.+}}, %[[WB]])
func.func @qdq_bf16(%x: tensor<1x4x4x2xbf16>) -> tensor<1x4x4x2xbf16> {
  %k = stablehlo.constant dense<[[[[1.27, -0.635], [0.3, 0.005]]]]> : tensor<1x1x2x2xbf16>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xbf16>, tensor<1x1x2x2xbf16>) -> tensor<1x4x4x2xbf16>
  return %y : tensor<1x4x4x2xbf16>
}

// -----

// An f16 weight at f16's largest value: the scale 65504 / 127 = 515.779541 in f32, and
// 127 * scale (65504.0001 in f32) converts to 65504 in f16; with the scale rounded to f16
// (516) it was 65532, inf in f16.

// CHECK-LABEL: @f16_largest
// INT8:          %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}127, 0], [0, 0]]]]> : tensor<1x1x2x2xi8>
// INT8:          stablehlo.constant dense<515.779541> : tensor<f32>
// CHANNEL:       %[[Q:.+]] = stablehlo.constant dense<{{\[\[\[\[}}127, 32], [0, -127]]]]> : tensor<1x1x2x2xi8>
// CHANNEL:       stablehlo.constant dense<[515.779541, 0.00787401571]> : tensor<2xf32>
// INT4:          stablehlo.constant dense<9357.71386> : tensor<f32>
// CHECK:         %[[W:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<1x1x2x2xf32>
// CHECK-NEXT:    %[[WH:.+]] = stablehlo.convert %[[W]] : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf16>
// CHECK-NEXT:    stablehlo.convolution(%{{.+}}, %[[WH]])
func.func @f16_largest(%x: tensor<1x4x4x2xf16>) -> tensor<1x4x4x2xf16> {
  %k = stablehlo.constant dense<[[[[65504.0, 0.25], [-0.9985, -1.0]]]]> : tensor<1x1x2x2xf16>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf16>, tensor<1x1x2x2xf16>) -> tensor<1x4x4x2xf16>
  return %y : tensor<1x4x4x2xf16>
}

// -----

// Output channel 1 holds weights around 1e-37: per channel its scale 1e-37 / 127 would be
// subnormal in f32 (XLA CPU flushes it to zero); it is f32's smallest normal number
// 1.17549435E-38 instead, and the integers are W / that (8.507 -> 9, -4.25 -> -4). Per
// tensor the channel rounds to 0 as any small weight does.

// CHECK-LABEL: @tiny_channel
// INT8:          stablehlo.constant dense<{{\[\[\[\[}}127, 0], [30, 0]]]]> : tensor<1x1x2x2xi8>
// CHANNEL:       stablehlo.constant dense<{{\[\[\[\[}}127, 9], [30, -4]]]]> : tensor<1x1x2x2xi8>
// CHANNEL:       stablehlo.constant dense<[0.00999999977, 1.17549435E-38]> : tensor<2xf32>
// CHECK:         %[[W:.+]] = stablehlo.multiply
// CHECK-NEXT:    stablehlo.convolution(%{{.+}}, %[[W]])
func.func @tiny_channel(%x: tensor<1x4x4x2xf32>) -> tensor<1x4x4x2xf32> {
  %k = stablehlo.constant dense<[[[[1.27, 1.0e-37], [0.3, -5.0e-38]]]]> : tensor<1x1x2x2xf32>
  %y = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x4x4x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x4x4x2xf32>
  return %y : tensor<1x4x4x2xf32>
}

// -----

// A splat kernel stays a splat: one integer (0.37 / (0.37 / 127) = 127), never expanded.

// CHECK-LABEL: @splat
// INT8:          stablehlo.constant dense<127> : tensor<3x4xi8>
// CHANNEL:       stablehlo.constant dense<127> : tensor<3x4xi8>
// CHANNEL:       stablehlo.constant dense<0.00291338586> : tensor<4xf32>
// INT4:          stablehlo.constant dense<7> : tensor<3x4xi4>
// CHECK:         stablehlo.dot_general
func.func @splat(%x: tensor<2x3xf32>) -> tensor<2x4xf32> {
  %k = stablehlo.constant dense<0.37> : tensor<3x4xf32>
  %y = stablehlo.dot_general %x, %k, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
