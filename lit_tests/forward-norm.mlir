// RUN: %bnfold-opt --split-input-file --report %t.json %s | %filecheck %s
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT

// forward-norm: a normalization's affine (gamma, beta) folds into every linear
// layer that reads the normalized value, whatever the spelling. In every case
// below gamma = [2, 4] and beta = [1, 3] (where there is a beta), W1 =
// [[1, 0, 1], [0, 1, 1]] and W2 = [[1, 1], [1, -1]], so diag(gamma) W1 =
// [[2, 0, 2], [0, 4, 4]], diag(gamma) W2 = [[2, 2], [4, -4]], beta W1 = [1, 3, 4]
// and beta W2 = [4, -2]. The statistics are arguments (%mean, %var): only the
// affine part is constant.

// Plain JAX / PyTorch: (x - mean) * rsqrt(var) * gamma + beta, read by Q and K.

// CHECK-LABEL: @layer_norm_into_two_dots
// CHECK:         %[[XM:.+]] = stablehlo.subtract
// CHECK:         %[[N:.+]] = stablehlo.multiply %[[XM]], %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00, 4.000000e+00]>
// CHECK-NEXT:    %[[B1B:.+]] = stablehlo.broadcast_in_dim %[[B1]], dims = [1]
// CHECK-NEXT:    %[[QB:.+]] = stablehlo.add %[[Q]], %[[B1B]]
// CHECK-NEXT:    %[[W2:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 2.000000e+00], [4.000000e+00, -4.000000e+00]]>
// CHECK-NEXT:    %[[K:.+]] = stablehlo.dot_general %[[N]], %[[W2]]
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<[4.000000e+00, -2.000000e+00]>
// CHECK-NEXT:    %[[B2B:.+]] = stablehlo.broadcast_in_dim %[[B2]], dims = [1]
// CHECK-NEXT:    %[[KB:.+]] = stablehlo.add %[[K]], %[[B2B]]
// CHECK-NEXT:    return %[[QB]], %[[KB]]
func.func @layer_norm_into_two_dots(%x: tensor<4x2xf32>, %mean: tensor<4x1xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %xm = stablehlo.subtract %x, %mb : tensor<4x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %xm, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k : tensor<4x3xf32>, tensor<4x2xf32>
}

// -----

// Flax / Keras: gamma is multiplied into the rsqrt factor before that meets
// x - mean: (x - mean) * (rsqrt(var) * gamma) + beta. The bare value is
// rebuilt without gamma: (x - mean) * rsqrt(var).

// CHECK-LABEL: @flax_gamma_in_the_rsqrt_factor
// CHECK:         %[[XM:.+]] = stablehlo.subtract
// CHECK:         %[[RB:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [0, 1]
// CHECK-NEXT:    %[[N:.+]] = stablehlo.multiply %[[XM]], %[[RB]] : tensor<4x2xf32>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00, 4.000000e+00]>
// CHECK:         %[[W2:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 2.000000e+00], [4.000000e+00, -4.000000e+00]]>
// CHECK-NEXT:    %[[K:.+]] = stablehlo.dot_general %[[N]], %[[W2]]
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<[4.000000e+00, -2.000000e+00]>
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return
func.func @flax_gamma_in_the_rsqrt_factor(%x: tensor<4x2xf32>, %mean: tensor<4x1xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %xm = stablehlo.subtract %x, %mb : tensor<4x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %inv = stablehlo.multiply %rb, %gb : tensor<4x2xf32>
  %s = stablehlo.multiply %xm, %inv : tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k : tensor<4x3xf32>, tensor<4x2xf32>
}

// -----

// Keras 3: inv = rsqrt(var) * gamma; x * inv + (beta - mean * inv). Gamma is on
// both terms; the bare value is x * rsqrt(var) + (-mean) * rsqrt(var).

// CHECK-LABEL: @keras_scale_and_shift_form
// CHECK:         %[[RB:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [0, 1]
// CHECK:         %[[NM:.+]] = stablehlo.multiply %{{.+}}, %[[RB]]
// CHECK-NEXT:    %[[NX:.+]] = stablehlo.multiply %{{.+}}, %[[RB]]
// CHECK-NEXT:    %[[N:.+]] = stablehlo.add %[[NX]], %[[NM]]
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00, 4.000000e+00]>
// CHECK:         %[[W2:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 2.000000e+00], [4.000000e+00, -4.000000e+00]]>
// CHECK-NEXT:    %[[K:.+]] = stablehlo.dot_general %[[N]], %[[W2]]
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<[4.000000e+00, -2.000000e+00]>
func.func @keras_scale_and_shift_form(%x: tensor<4x2xf32>, %mean: tensor<4x1xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %inv = stablehlo.multiply %rb, %gb : tensor<4x2xf32>
  %negm = stablehlo.negate %mean : tensor<4x1xf32>
  %nmb = stablehlo.broadcast_in_dim %negm, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %mi = stablehlo.multiply %nmb, %inv : tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %res = stablehlo.add %mi, %bb : tensor<4x2xf32>
  %xi = stablehlo.multiply %x, %inv : tensor<4x2xf32>
  %v = stablehlo.add %xi, %res : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k : tensor<4x3xf32>, tensor<4x2xf32>
}

// -----

// Hugging Face RMSNorm in bf16: f32 statistics, the normalized value converted
// back to bf16, then multiplied by the bf16 weight (which rounds, in bf16: the
// fold moves that rounding into the weight, README precision rule 7). Gate and
// up read it; there is no shift, so no bias add.

// CHECK-LABEL: @hf_rms_norm_bf16_into_gate_and_up
// CHECK:         %[[N32:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.convert %[[N32]] : (tensor<4x2xf32>) -> tensor<4x2xbf16>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]> : tensor<2x3xbf16>
// CHECK-NEXT:    %[[G:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK-NEXT:    %[[W2:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 2.000000e+00], [4.000000e+00, -4.000000e+00]]> : tensor<2x2xbf16>
// CHECK-NEXT:    %[[U:.+]] = stablehlo.dot_general %[[N]], %[[W2]]
// CHECK-NEXT:    return %[[G]], %[[U]]
func.func @hf_rms_norm_bf16_into_gate_and_up(%x: tensor<4x2xf32>, %ms: tensor<4x1xf32>) -> (tensor<4x3xbf16>, tensor<4x2xbf16>) {
  %w = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xbf16>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xbf16>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xbf16>
  %r = stablehlo.rsqrt %ms : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n32 = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %n = stablehlo.convert %n32 : (tensor<4x2xf32>) -> tensor<4x2xbf16>
  %wb = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<2xbf16>) -> tensor<4x2xbf16>
  %v = stablehlo.multiply %wb, %n : tensor<4x2xbf16>
  %gate = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x3xbf16>) -> tensor<4x3xbf16>
  %up = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x2xbf16>) -> tensor<4x2xbf16>
  return %gate, %up : tensor<4x3xbf16>, tensor<4x2xbf16>
}

// -----

// Gemma: the weight is 1 + w (here w = [1, 3]), multiplied in f32, then the
// result is converted to bf16 before the layers. A scale may cross a narrowing
// convert into bf16 (same exponent range, rule 4), so it folds.

// CHECK-LABEL: @gemma_one_plus_w_across_a_convert
// CHECK:         %[[N32:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.convert %[[N32]] : (tensor<4x2xf32>) -> tensor<4x2xbf16>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]> : tensor<2x3xbf16>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK:         %[[K:.+]] = stablehlo.dot_general %[[N]], %{{.+}}
// CHECK-NEXT:    return %[[Q]], %[[K]]
func.func @gemma_one_plus_w_across_a_convert(%x: tensor<4x2xf32>, %ms: tensor<4x1xf32>) -> (tensor<4x3xbf16>, tensor<4x2xbf16>) {
  %w = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %one = stablehlo.constant dense<1.0> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xbf16>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xbf16>
  %r = stablehlo.rsqrt %ms : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %w1p = stablehlo.add %w, %one : tensor<2xf32>
  %wb = stablehlo.broadcast_in_dim %w1p, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %wb : tensor<4x2xf32>
  %v = stablehlo.convert %s : (tensor<4x2xf32>) -> tensor<4x2xbf16>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x3xbf16>) -> tensor<4x3xbf16>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x2xbf16>) -> tensor<4x2xbf16>
  return %q, %k : tensor<4x3xbf16>, tensor<4x2xbf16>
}

// -----

// ConvNeXt's LayerNorm over channels: normalized in NHWC (features last), then
// transposed back to NCHW for two 1x1 convolutions. The kernel's input axis
// (i of [o, i, 0, 1]) takes gamma.

// CHECK-LABEL: @channels_layer_norm_through_a_transpose
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<1x2x2x2xf32>
// CHECK-NEXT:    %[[T:.+]] = stablehlo.transpose %[[N]], dims = [0, 3, 1, 2]
// CHECK-NEXT:    %[[K1:.+]] = stablehlo.constant dense<{{\[\[\[\[}}2.000000e+00]], {{\[\[}}4.000000e+00]]]]> : tensor<1x2x1x1xf32>
// CHECK-NEXT:    %[[C1:.+]] = stablehlo.convolution(%[[T]], %[[K1]])
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<4.000000e+00> : tensor<1xf32>
// CHECK-NEXT:    %[[B1B:.+]] = stablehlo.broadcast_in_dim %[[B1]], dims = [1]
// CHECK-NEXT:    %[[R1:.+]] = stablehlo.add %[[C1]], %[[B1B]]
// CHECK-NEXT:    %[[K2:.+]] = stablehlo.constant dense<{{\[\[\[\[}}2.000000e+00]], {{\[\[}}-4.000000e+00]]]]> : tensor<1x2x1x1xf32>
// CHECK-NEXT:    %[[C2:.+]] = stablehlo.convolution(%[[T]], %[[K2]])
// CHECK-NEXT:    %[[B2:.+]] = stablehlo.constant dense<-2.000000e+00> : tensor<1xf32>
func.func @channels_layer_norm_through_a_transpose(%x: tensor<1x2x2x2xf32>, %var: tensor<1x2x2x1xf32>) -> (tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %k1 = stablehlo.constant dense<1.0> : tensor<1x2x1x1xf32>
  %k2 = stablehlo.constant dense<[[[[1.0]], [[-1.0]]]]> : tensor<1x2x1x1xf32>
  %r = stablehlo.rsqrt %var : tensor<1x2x2x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3] : (tensor<1x2x2x1xf32>) -> tensor<1x2x2x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<1x2x2x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [3] : (tensor<2xf32>) -> tensor<1x2x2x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<2xf32>) -> tensor<1x2x2x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<1x2x2x2xf32>
  %v = stablehlo.add %s, %bb : tensor<1x2x2x2xf32>
  %t = stablehlo.transpose %v, dims = [0, 3, 1, 2] : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %c1 = stablehlo.convolution(%t, %k1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x1x1xf32>) -> tensor<1x1x2x2xf32>
  %c2 = stablehlo.convolution(%t, %k2) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x1x1xf32>) -> tensor<1x1x2x2xf32>
  return %c1, %c2 : tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32>
}

// -----

// Attention heads: one layer reads the value through a reshape that keeps the
// feature axis whole (4x2 -> 2x2x2), the other directly.

// CHECK-LABEL: @through_a_head_reshape
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.reshape %[[N]] : (tensor<4x2xf32>) -> tensor<2x2x2xf32>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[R]], %[[W1]], contracting_dims = [2] x [0]
// CHECK:         stablehlo.dot_general %[[N]]
func.func @through_a_head_reshape(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<2x2x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %vr = stablehlo.reshape %v : (tensor<4x2xf32>) -> tensor<2x2x2xf32>
  %q = stablehlo.dot_general %vr, %w1, contracting_dims = [2] x [0] : (tensor<2x2x2xf32>, tensor<2x3xf32>) -> tensor<2x2x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k : tensor<2x2x3xf32>, tensor<4x2xf32>
}

// -----

// The law of `c - x`: beta - n * gamma = (-n) * gamma + beta. The bare value is
// the negated normalized value.

// CHECK-LABEL: @constant_minus_the_scaled_value
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[NEG:.+]] = stablehlo.negate %[[N]] : tensor<4x2xf32>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[NEG]], %[[W1]]
// CHECK-NEXT:    %[[B1:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00, 4.000000e+00]>
// CHECK:         stablehlo.dot_general %[[NEG]]
func.func @constant_minus_the_scaled_value(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.subtract %bb, %s : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k : tensor<4x3xf32>, tensor<4x2xf32>
}

// -----

// Post-norm (BERT): the normalized value also feeds the residual add. Nothing
// folds; the affine and both layers stay as they were.

// CHECK-LABEL: @post_norm_residual_is_refused
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK:         %[[S:.+]] = stablehlo.multiply %[[N]], %{{.+}} : tensor<4x2xf32>
// CHECK:         %[[V:.+]] = stablehlo.add %[[S]], %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[V]], %{{.+}}, contracting_dims = [1] x [0]
// CHECK-NEXT:    %[[K:.+]] = stablehlo.dot_general %[[V]], %{{.+}}, contracting_dims = [1] x [0]
// CHECK-NEXT:    stablehlo.add %[[V]], %[[K]]
// REPORT: "reason": "forward-norm: the normalized value feeds stablehlo.add at {{[^ ]*}}:[[# @LINE + 17]]:10 (a residual or other non-linear use); its affine can fold only where every use is a convolution or dot_general with a constant kernel",
// REPORT-NEXT: "function": "post_norm_residual_is_refused",
// REPORT-NEXT: "code": "nonlinear-consumer"
func.func @post_norm_residual_is_refused(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %res = stablehlo.add %v, %k : tensor<4x2xf32>
  return %q, %res : tensor<4x3xf32>, tensor<4x2xf32>
}

// -----

// A value that leaves the function (a block's output that is also returned).

// CHECK-LABEL: @returned_value_is_refused
// CHECK:         %[[V:.+]] = stablehlo.add
// CHECK-NEXT:    stablehlo.dot_general %[[V]]
// CHECK-NEXT:    stablehlo.dot_general %[[V]]
// REPORT: "reason": "forward-norm: the normalized value leaves the function (func.return); its affine can fold only where every use is a convolution or dot_general with a constant kernel",
// REPORT-NEXT: "function": "returned_value_is_refused",
// REPORT-NEXT: "code": "nonlinear-consumer"
func.func @returned_value_is_refused(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k, %v : tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>
}

// -----

// A shift computed in f32 and rounded to bf16 before the layers (Flax, Keras
// and Equinox LayerNorms with a bf16 dtype): the shift may not cross the
// narrowing convert (rule 4), so nothing folds.

// CHECK-LABEL: @shift_before_a_narrowing_convert_is_refused
// CHECK:         %[[V:.+]] = stablehlo.add %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[C:.+]] = stablehlo.convert %[[V]]
// CHECK-NEXT:    stablehlo.dot_general %[[C]], %{{.+}}, contracting_dims
// CHECK-NEXT:    stablehlo.dot_general %[[C]], %{{.+}}, contracting_dims
// REPORT: "code": "narrowing-convert"
func.func @shift_before_a_narrowing_convert_is_refused(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xbf16>, tensor<4x2xbf16>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xbf16>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xbf16>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %c = stablehlo.convert %v : (tensor<4x2xf32>) -> tensor<4x2xbf16>
  %q = stablehlo.dot_general %c, %w1, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x3xbf16>) -> tensor<4x3xbf16>
  %k = stablehlo.dot_general %c, %w2, contracting_dims = [1] x [0] : (tensor<4x2xbf16>, tensor<2x2xbf16>) -> tensor<4x2xbf16>
  return %q, %k : tensor<4x3xbf16>, tensor<4x2xbf16>
}

// -----

// Swin / ConvNeXt's head: the final norm, a mean over the tokens (a sum over
// axis 0, then / 4), the classifier. The sum is over another axis than the
// features, so it commutes with the affine and turns beta into 4 beta; the
// divide by 4 folds into the head first (forward-affine: W1 / 4), then the norm:
// diag(gamma) W1 / 4 = [[0.5, 0, 0.5], [0, 1, 1]] and 4 beta W1 / 4 = [1, 3, 4].

// CHECK-LABEL: @mean_pool_into_the_head
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[S:.+]] = stablehlo.reduce(%[[N]] init: %{{.+}}) applies stablehlo.add across dimensions = [0]
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 0.000000e+00, 5.000000e-01], [0.000000e+00, 1.000000e+00, 1.000000e+00]]>
// CHECK-NEXT:    %[[Y:.+]] = stablehlo.dot_general %[[S]], %[[W]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00, 4.000000e+00]>
// CHECK-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [0]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %[[Y]], %[[BB]]
// CHECK-NEXT:    return %[[R]]
func.func @mean_pool_into_the_head(%x: tensor<4x2xf32>, %mean: tensor<4x1xf32>, %var: tensor<4x1xf32>) -> tensor<3xf32> {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %four = stablehlo.constant dense<4.0> : tensor<2xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %xm = stablehlo.subtract %x, %mb : tensor<4x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %xm, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %sum = stablehlo.reduce(%v init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
  %avg = stablehlo.divide %sum, %four : tensor<2xf32>
  %q = stablehlo.dot_general %avg, %w1, contracting_dims = [0] x [0] : (tensor<2xf32>, tensor<2x3xf32>) -> tensor<3xf32>
  return %q : tensor<3xf32>
}

// -----

// A relu reads `n * gamma` before `+ beta` (breaker 3a): that multiply stays for the
// relu, and the layers read the bare `n` with gamma and beta folded into them
// (diag(gamma) W and beta W): what every reader computes is unchanged.

// CHECK-LABEL: @relu_partway_through_the_affine_keeps_its_multiply
// CHECK:         %[[N:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4x2xf32>
// CHECK:         %[[S:.+]] = stablehlo.multiply %[[N]], %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[R:.+]] = stablehlo.maximum %[[S]], %{{.+}}
// CHECK-NEXT:    stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]>
// CHECK-NEXT:    stablehlo.dot_general %[[N]], %{{.+}}
// CHECK:         stablehlo.dot_general %[[N]], %{{.+}}
// CHECK:         return %{{.+}}, %{{.+}}, %[[R]]
func.func @relu_partway_through_the_affine_keeps_its_multiply(%x: tensor<4x2xf32>, %var: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>) {
  %g = stablehlo.constant dense<[2.0, 4.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %z = stablehlo.constant dense<0.0> : tensor<4x2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %r = stablehlo.rsqrt %var : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %x, %rb : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %gb : tensor<4x2xf32>
  %relu = stablehlo.maximum %s, %z : tensor<4x2xf32>
  %v = stablehlo.add %s, %bb : tensor<4x2xf32>
  %q = stablehlo.dot_general %v, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %v, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k, %relu : tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>
}

// -----

// Gemma's embedding scale: `table[ids] * 4` is the norm's input, also read by the
// statistics and the residual (returned). It is not part of the norm's affine (its
// multiply would still run for those readers): the layers take only 1 + w = [2, 4],
// and fold-scale puts the 4 into the table (its own decision); the multiply is gone.

// CHECK-LABEL: @gemma_embedding_scale_goes_into_the_table
// CHECK:         %[[T:.+]] = stablehlo.constant dense<{{\[\[}}4.000000e+00, 8.000000e+00], [1.200000e+01, 1.600000e+01], [2.000000e+01, 2.400000e+01], [2.800000e+01, 3.200000e+01]]> : tensor<4x2xf32>
// CHECK-NEXT:    %[[H:.+]] = "stablehlo.gather"(%[[T]]
// CHECK-NEXT:    stablehlo.multiply %[[H]], %[[H]]
// CHECK:         %[[N:.+]] = stablehlo.multiply %[[H]], %{{.+}} : tensor<4x2xf32>
// CHECK-NEXT:    %[[W1:.+]] = stablehlo.constant dense<{{\[\[}}2.000000e+00, 0.000000e+00, 2.000000e+00], [0.000000e+00, 4.000000e+00, 4.000000e+00]]> : tensor<2x3xf32>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %[[N]], %[[W1]]
// CHECK:         return %[[Q]], %{{.+}}, %[[H]]
func.func @gemma_embedding_scale_goes_into_the_table(%ids: tensor<4x1xi32>) -> (tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>) {
  %t = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]> : tensor<4x2xf32>
  %e = "stablehlo.gather"(%t, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 2>} : (tensor<4x2xf32>, tensor<4x1xi32>) -> tensor<4x2xf32>
  %c = stablehlo.constant dense<4.0> : tensor<4x2xf32>
  %h = stablehlo.multiply %e, %c : tensor<4x2xf32>
  %sq = stablehlo.multiply %h, %h : tensor<4x2xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x2xf32>, tensor<f32>) -> tensor<4xf32>
  %half = stablehlo.constant dense<0.5> : tensor<4xf32>
  %ms = stablehlo.multiply %sum, %half : tensor<4xf32>
  %eps = stablehlo.constant dense<1.0e-6> : tensor<4xf32>
  %mse = stablehlo.add %ms, %eps : tensor<4xf32>
  %r = stablehlo.rsqrt %mse : tensor<4xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<4xf32>) -> tensor<4x2xf32>
  %n = stablehlo.multiply %h, %rb : tensor<4x2xf32>
  %w = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %one = stablehlo.constant dense<1.0> : tensor<2xf32>
  %w1p = stablehlo.add %w, %one : tensor<2xf32>
  %wb = stablehlo.broadcast_in_dim %w1p, dims = [1] : (tensor<2xf32>) -> tensor<4x2xf32>
  %s = stablehlo.multiply %n, %wb : tensor<4x2xf32>
  %w1 = stablehlo.constant dense<[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]> : tensor<2x3xf32>
  %w2 = stablehlo.constant dense<[[1.0, 1.0], [1.0, -1.0]]> : tensor<2x2xf32>
  %q = stablehlo.dot_general %s, %w1, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %k = stablehlo.dot_general %s, %w2, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  return %q, %k, %h : tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x2xf32>
}
