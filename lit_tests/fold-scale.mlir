// RUN: %bnfold-opt --split-input-file %s | %filecheck %s

// The attention scale 0.25 on q k^T goes into Wq (0.5 * 0.25 = 0.125), through the
// head reshape and the dot_general of two values; the multiply is gone.

// CHECK-LABEL: @attention_scale_into_wq
// CHECK:         %[[WQ:.+]] = stablehlo.constant dense<1.250000e-01> : tensor<8x8xf32>
// CHECK:         stablehlo.dot_general %{{.+}}, %[[WQ]]
// CHECK:         %[[S:.+]] = stablehlo.dot_general {{.+}} batching_dims
// CHECK-NEXT:    return %[[S]]
func.func @attention_scale_into_wq(%x: tensor<4x8xf32>) -> tensor<2x4x4xf32> {
  %wq = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %wk = stablehlo.constant dense<0.75> : tensor<8x8xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %k = stablehlo.dot_general %x, %wk, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %qh = stablehlo.reshape %q : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %kh = stablehlo.reshape %k : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  %c = stablehlo.constant dense<0.25> : tensor<2x4x4xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x4x4xf32>
  return %r : tensor<2x4x4xf32>
}

// -----

// RoPE's halves (slice, negate, concatenate, multiplies by cos and sin, add) are
// linear in q: the divide by 2 goes into Wq (1.0 / 2 = 0.5) and its bias (3.0 / 2).

// CHECK-LABEL: @rope_divide_into_wq_and_bias
// CHECK-DAG:     stablehlo.constant dense<5.000000e-01> : tensor<4x4xf32>
// CHECK-DAG:     stablehlo.constant dense<1.500000e+00> : tensor<4xf32>
// CHECK-NOT:     stablehlo.divide
// CHECK:         return
func.func @rope_divide_into_wq_and_bias(%x: tensor<3x4xf32>, %k: tensor<3x4xf32>, %cos: tensor<3x4xf32>, %sin: tensor<3x4xf32>) -> tensor<3x3xf32> {
  %wq = stablehlo.constant dense<1.0> : tensor<4x4xf32>
  %b = stablehlo.constant dense<3.0> : tensor<4xf32>
  %q0 = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
  %q = stablehlo.add %q0, %bb : tensor<3x4xf32>
  %x1 = stablehlo.slice %q [0:3, 0:2] : (tensor<3x4xf32>) -> tensor<3x2xf32>
  %x2 = stablehlo.slice %q [0:3, 2:4] : (tensor<3x4xf32>) -> tensor<3x2xf32>
  %n2 = stablehlo.negate %x2 : tensor<3x2xf32>
  %rot = stablehlo.concatenate %n2, %x1, dim = 1 : (tensor<3x2xf32>, tensor<3x2xf32>) -> tensor<3x4xf32>
  %a = stablehlo.multiply %q, %cos : tensor<3x4xf32>
  %bq = stablehlo.multiply %rot, %sin : tensor<3x4xf32>
  %qr = stablehlo.add %a, %bq : tensor<3x4xf32>
  %s = stablehlo.dot_general %qr, %k, contracting_dims = [1] x [1] : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x3xf32>
  %two = stablehlo.constant dense<2.0> : tensor<3x3xf32>
  %r = stablehlo.divide %s, %two : tensor<3x3xf32>
  return %r : tensor<3x3xf32>
}

// -----

// QK-norm: a scale before the normalization would be normalized away, so it goes into
// the q-norm's weight (2.0 * 0.25 = 0.5), never into Wq (which stays 1.0).

// CHECK-LABEL: @qk_norm_scale_into_the_norm_weight
// CHECK-DAG:     stablehlo.constant dense<1.000000e+00> : tensor<4x4xf32>
// CHECK-DAG:     stablehlo.constant dense<5.000000e-01> : tensor<4xf32>
// CHECK:         %[[S:.+]] = stablehlo.dot_general
// CHECK-NEXT:    return %[[S]]
func.func @qk_norm_scale_into_the_norm_weight(%x: tensor<3x4xf32>, %k: tensor<3x4xf32>) -> tensor<3x3xf32> {
  %wq = stablehlo.constant dense<1.0> : tensor<4x4xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32>
  %sq = stablehlo.multiply %q, %q : tensor<3x4xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<3x4xf32>, tensor<f32>) -> tensor<3xf32>
  %eps = stablehlo.constant dense<1.0e-6> : tensor<3xf32>
  %v = stablehlo.add %sum, %eps : tensor<3xf32>
  %r0 = stablehlo.rsqrt %v : tensor<3xf32>
  %rb = stablehlo.broadcast_in_dim %r0, dims = [0] : (tensor<3xf32>) -> tensor<3x4xf32>
  %n = stablehlo.multiply %q, %rb : tensor<3x4xf32>
  %w = stablehlo.constant dense<2.0> : tensor<4xf32>
  %wb = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
  %qn = stablehlo.multiply %n, %wb : tensor<3x4xf32>
  %s = stablehlo.dot_general %qn, %k, contracting_dims = [1] x [1] : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x3xf32>
  %c = stablehlo.constant dense<0.25> : tensor<3x3xf32>
  %r = stablehlo.multiply %s, %c : tensor<3x3xf32>
  return %r : tensor<3x3xf32>
}

// -----

// Gemma's embedding scale goes into the table when nothing else reads it (0.5 * 4).

// CHECK-LABEL: @embedding_scale_into_the_table
// CHECK:         %[[T:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<10x4xf32>
// CHECK:         %[[G:.+]] = "stablehlo.gather"(%[[T]]
// CHECK-NEXT:    return %[[G]]
func.func @embedding_scale_into_the_table(%ids: tensor<3x1xi32>) -> tensor<3x4xf32> {
  %t = stablehlo.constant dense<0.5> : tensor<10x4xf32>
  %g = "stablehlo.gather"(%t, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 4>} : (tensor<10x4xf32>, tensor<3x1xi32>) -> tensor<3x4xf32>
  %c = stablehlo.constant dense<4.0> : tensor<3x4xf32>
  %r = stablehlo.multiply %g, %c : tensor<3x4xf32>
  return %r : tensor<3x4xf32>
}

// -----

// A table tied to the LM head is not copied: the embedding multiply stays.

// CHECK-LABEL: @tied_table_keeps_the_scale
// CHECK:         %[[T:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<10x4xf32>
// CHECK:         %[[G:.+]] = "stablehlo.gather"(%[[T]]
// CHECK:         stablehlo.multiply %[[G]]
func.func @tied_table_keeps_the_scale(%ids: tensor<3x1xi32>) -> (tensor<3x4xf32>, tensor<3x10xf32>) {
  %t = stablehlo.constant dense<0.5> : tensor<10x4xf32>
  %g = "stablehlo.gather"(%t, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 4>} : (tensor<10x4xf32>, tensor<3x1xi32>) -> tensor<3x4xf32>
  %c = stablehlo.constant dense<4.0> : tensor<3x4xf32>
  %h = stablehlo.multiply %g, %c : tensor<3x4xf32>
  %l = stablehlo.dot_general %h, %t, contracting_dims = [1] x [1] : (tensor<3x4xf32>, tensor<10x4xf32>) -> tensor<3x10xf32>
  %e = stablehlo.exponential %l : tensor<3x10xf32>
  return %h, %e : tensor<3x4xf32>, tensor<3x10xf32>
}

// -----

// x * 0.5 next to erf(x * 0.7) is a term of GELU, not a scale of x: both stay.

// CHECK-LABEL: @gelu_terms_stay
// CHECK:         stablehlo.multiply
// CHECK:         stablehlo.multiply
// CHECK:         stablehlo.multiply
func.func @gelu_terms_stay(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %w = stablehlo.constant dense<1.0> : tensor<4x4xf32>
  %h = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32>
  %half = stablehlo.constant dense<0.5> : tensor<3x4xf32>
  %c = stablehlo.constant dense<0.7> : tensor<3x4xf32>
  %a = stablehlo.multiply %h, %half : tensor<3x4xf32>
  %b = stablehlo.multiply %h, %c : tensor<3x4xf32>
  %t = stablehlo.tanh %b : tensor<3x4xf32>
  %r = stablehlo.multiply %a, %t : tensor<3x4xf32>
  return %r : tensor<3x4xf32>
}

// -----

// x feeds the scale twice: directly, and as the input of x W2. With x scaled, the scale
// must not go into W2 as well (c^2 on that branch): it goes into W1 alone (1.0 * 1.5),
// and W2 stays 2.0.

// CHECK-LABEL: @value_read_where_the_scale_does_not_pass
// CHECK-DAG:     stablehlo.constant dense<1.500000e+00> : tensor<2x2xf32>
// CHECK-DAG:     stablehlo.constant dense<2.000000e+00> : tensor<2x2xf32>
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return
func.func @value_read_where_the_scale_does_not_pass(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %w1 = stablehlo.constant dense<1.0> : tensor<2x2xf32>
  %x = stablehlo.dot_general %a, %w1, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %w2 = stablehlo.constant dense<2.0> : tensor<2x2xf32>
  %xw = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %s = stablehlo.add %x, %xw : tensor<2x2xf32>
  %c = stablehlo.constant dense<1.5> : tensor<2x2xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x2xf32>
  return %r : tensor<2x2xf32>
}

// -----

// The scale sits in a private helper (a jitted attention core, as jax.export writes it)
// that two layers call with their own q and k: each call site gets its own copy, and
// each scale goes into its own layer's Wq (0.5 * 0.25 and 2.0 * 0.25); the helper goes.

// CHECK-LABEL: @scale_inside_a_helper_called_twice
// CHECK-DAG:     stablehlo.constant dense<1.250000e-01> : tensor<8x8xf32>
// CHECK-DAG:     stablehlo.constant dense<5.000000e-01> : tensor<8x8xf32>
// CHECK-NOT:     call
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return
// CHECK-NOT:     func.func private @core
func.func @scale_inside_a_helper_called_twice(%x: tensor<4x8xf32>) -> (tensor<2x4x4xf32>, tensor<2x4x4xf32>) {
  %wq1 = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %wq2 = stablehlo.constant dense<2.0> : tensor<8x8xf32>
  %wk = stablehlo.constant dense<0.75> : tensor<8x8xf32>
  %q1 = stablehlo.dot_general %x, %wq1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %q2 = stablehlo.dot_general %x, %wq2, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %k = stablehlo.dot_general %x, %wk, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %kh = stablehlo.reshape %k : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %kh2 = stablehlo.reshape %k : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %s1 = func.call @core(%q1, %kh) : (tensor<4x8xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  %s2 = func.call @core(%q2, %kh2) : (tensor<4x8xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  return %s1, %s2 : tensor<2x4x4xf32>, tensor<2x4x4xf32>
}
func.func private @core(%q: tensor<4x8xf32>, %kh: tensor<4x2x4xf32>) -> tensor<2x4x4xf32> {
  %qh = stablehlo.reshape %q : (tensor<4x8xf32>) -> tensor<4x2x4xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x4x4xf32>
  %c = stablehlo.constant dense<0.25> : tensor<2x4x4xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x4x4xf32>
  return %r : tensor<2x4x4xf32>
}

// -----

// A fused QKV projection (GPT-2's c_attn): q, k and v are slices of one linear's output
// features. The scale 0.25 goes into q's 4 columns of the kernel (0.5 * 0.25 = 0.125) and
// of the bias (2.0 * 0.25 = 0.5) only; k's and v's columns stay as they were.

// CHECK-LABEL: @fused_qkv_scale_into_q_columns
// CHECK-DAG:     stablehlo.constant dense<{{\[}}[1.250000e-01, 1.250000e-01, 1.250000e-01, 1.250000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01]{{.*}}]> : tensor<4x12xf32>
// CHECK-DAG:     stablehlo.constant dense<[5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 2.000000e+00, 2.000000e+00, 2.000000e+00, 2.000000e+00, 2.000000e+00, 2.000000e+00, 2.000000e+00, 2.000000e+00]> : tensor<12xf32>
// CHECK-NOT:     dense<2.500000e-01>
// CHECK:         %[[S:.+]] = stablehlo.dot_general {{.+}} batching_dims
// CHECK-NEXT:    return %[[S]]
func.func @fused_qkv_scale_into_q_columns(%x: tensor<3x4xf32>) -> (tensor<2x3x3xf32>, tensor<3x4xf32>) {
  %w = stablehlo.constant dense<0.5> : tensor<4x12xf32>
  %b = stablehlo.constant dense<2.0> : tensor<12xf32>
  %y0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x12xf32>) -> tensor<3x12xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<12xf32>) -> tensor<3x12xf32>
  %y = stablehlo.add %y0, %bb : tensor<3x12xf32>
  %q = stablehlo.slice %y [0:3, 0:4] : (tensor<3x12xf32>) -> tensor<3x4xf32>
  %k = stablehlo.slice %y [0:3, 4:8] : (tensor<3x12xf32>) -> tensor<3x4xf32>
  %v = stablehlo.slice %y [0:3, 8:12] : (tensor<3x12xf32>) -> tensor<3x4xf32>
  %qh = stablehlo.reshape %q : (tensor<3x4xf32>) -> tensor<3x2x2xf32>
  %kh = stablehlo.reshape %k : (tensor<3x4xf32>) -> tensor<3x2x2xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<3x2x2xf32>, tensor<3x2x2xf32>) -> tensor<2x3x3xf32>
  %c = stablehlo.constant dense<0.25> : tensor<2x3x3xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x3x3xf32>
  return %r, %v : tensor<2x3x3xf32>, tensor<3x4xf32>
}

// -----

// torch's MultiheadAttention and Swin: the fused output reshaped to [tokens, 3, heads,
// head_dim] and q taken as index 0 of the 3: the same columns through the reshape.

// CHECK-LABEL: @fused_qkv_through_a_reshape
// CHECK-DAG:     stablehlo.constant dense<{{\[}}[1.250000e-01, 1.250000e-01, 1.250000e-01, 1.250000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01, 5.000000e-01]{{.*}}]> : tensor<4x8xf32>
// CHECK-NOT:     stablehlo.multiply
// CHECK:         return
func.func @fused_qkv_through_a_reshape(%x: tensor<3x4xf32>) -> tensor<2x3x3xf32> {
  %w = stablehlo.constant dense<0.5> : tensor<4x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x8xf32>) -> tensor<3x8xf32>
  %y4 = stablehlo.reshape %y : (tensor<3x8xf32>) -> tensor<3x2x2x2xf32>
  %yt = stablehlo.transpose %y4, dims = [1, 0, 2, 3] : (tensor<3x2x2x2xf32>) -> tensor<2x3x2x2xf32>
  %q1 = stablehlo.slice %yt [0:1, 0:3, 0:2, 0:2] : (tensor<2x3x2x2xf32>) -> tensor<1x3x2x2xf32>
  %k1 = stablehlo.slice %yt [1:2, 0:3, 0:2, 0:2] : (tensor<2x3x2x2xf32>) -> tensor<1x3x2x2xf32>
  %q = stablehlo.reshape %q1 : (tensor<1x3x2x2xf32>) -> tensor<3x2x2xf32>
  %k = stablehlo.reshape %k1 : (tensor<1x3x2x2xf32>) -> tensor<3x2x2xf32>
  %c = stablehlo.constant dense<0.25> : tensor<3x2x2xf32>
  %qs = stablehlo.multiply %q, %c : tensor<3x2x2xf32>
  %s = stablehlo.dot_general %qs, %k, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<3x2x2xf32>, tensor<3x2x2xf32>) -> tensor<2x3x3xf32>
  return %s : tensor<2x3x3xf32>
}

// -----

// k also reads two of q's columns (an overlapping slice): scaling q's columns would
// change k, so the scale stays (a `users` refusal in the report).

// CHECK-LABEL: @fused_overlapping_slices_keep_the_scale
// CHECK:         stablehlo.multiply
func.func @fused_overlapping_slices_keep_the_scale(%x: tensor<3x4xf32>) -> tensor<2x3x3xf32> {
  %w = stablehlo.constant dense<0.5> : tensor<4x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x8xf32>) -> tensor<3x8xf32>
  %q = stablehlo.slice %y [0:3, 0:4] : (tensor<3x8xf32>) -> tensor<3x4xf32>
  %k = stablehlo.slice %y [0:3, 2:6] : (tensor<3x8xf32>) -> tensor<3x4xf32>
  %qh = stablehlo.reshape %q : (tensor<3x4xf32>) -> tensor<3x2x2xf32>
  %kh = stablehlo.reshape %k : (tensor<3x4xf32>) -> tensor<3x2x2xf32>
  %s = stablehlo.dot_general %qh, %kh, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<3x2x2xf32>, tensor<3x2x2xf32>) -> tensor<2x3x3xf32>
  %c = stablehlo.constant dense<0.25> : tensor<2x3x3xf32>
  %r = stablehlo.multiply %s, %c : tensor<2x3x3xf32>
  return %r : tensor<2x3x3xf32>
}

// -----

// An int8 layer's i32 output converted to f32 and scaled (its dequantization scale,
// breaker 3b): integer weights cannot take the scale; it stays (code quantized-kernel).

// CHECK-LABEL: @integer_layer_keeps_its_scale
// CHECK:         stablehlo.dot_general {{.+}} -> tensor<4x8xi32>
// CHECK-NEXT:    %[[F:.+]] = stablehlo.convert
// CHECK:         stablehlo.multiply %[[F]], %{{.+}} : tensor<4x8xf32>
func.func @integer_layer_keeps_its_scale(%x: tensor<4x8xi8>) -> tensor<4x8xf32> {
  %w = stablehlo.constant dense<3> : tensor<8x8xi8>
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xi8>, tensor<8x8xi8>) -> tensor<4x8xi32>
  %f = stablehlo.convert %d : (tensor<4x8xi32>) -> tensor<4x8xf32>
  %c = stablehlo.constant dense<0.125> : tensor<4x8xf32>
  %r = stablehlo.multiply %f, %c : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

// -----

// A table tied to the LM head stays one table (rule 10): the embedding scale 4 goes
// into it for the gather and the head alike (0.5 * 4 = 2), and 1/4 into the weight of
// the layer before the head (2 / 4 = 0.5), so the head computes what it did. The
// multiply is gone and no second table is written.

// CHECK-LABEL: @tied_table_keeps_one_table
// CHECK:         %[[T:.+]] = stablehlo.constant dense<2.000000e+00> : tensor<10x4xf32>
// CHECK-NEXT:    %[[G:.+]] = "stablehlo.gather"(%[[T]]
// CHECK-NEXT:    %[[A:.+]] = stablehlo.tanh %[[G]]
// CHECK-NEXT:    %[[W:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<4x4xf32>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.dot_general %[[A]], %[[W]]
// CHECK-NEXT:    %[[TT:.+]] = stablehlo.transpose %[[T]], dims = [1, 0]
// CHECK-NEXT:    %[[L:.+]] = stablehlo.dot_general %[[N]], %[[TT]]
// CHECK-NEXT:    return %[[G]], %[[L]]
// CHECK-NOT:     stablehlo.constant {{.*}} : tensor<10x4xf32>
func.func @tied_table_keeps_one_table(%ids: tensor<3x1xi32>) -> (tensor<3x4xf32>, tensor<3x10xf32>) {
  %t = stablehlo.constant dense<0.5> : tensor<10x4xf32>
  %g = "stablehlo.gather"(%t, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 4>} : (tensor<10x4xf32>, tensor<3x1xi32>) -> tensor<3x4xf32>
  %c = stablehlo.constant dense<4.0> : tensor<3x4xf32>
  %h = stablehlo.multiply %g, %c : tensor<3x4xf32>
  %a = stablehlo.tanh %h : tensor<3x4xf32>
  %w = stablehlo.constant dense<2.0> : tensor<4x4xf32>
  %n = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32>
  %tt = stablehlo.transpose %t, dims = [1, 0] : (tensor<10x4xf32>) -> tensor<4x10xf32>
  %l = stablehlo.dot_general %n, %tt, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x10xf32>) -> tensor<3x10xf32>
  return %h, %l : tensor<3x4xf32>, tensor<3x10xf32>
}

// -----

// The same in bf16 with a scale that is not a power of two (3): one table would make
// the head read round(3 T) / 3 instead of T, a rounding the original never made
// (measured: less accurate, rule 10), and a copy is not made: the multiply stays
// (`shared-weight`, naming the copy's bytes and the precision reason).

// CHECK-LABEL: @tied_bf16_table_keeps_the_scale
// CHECK:         %[[T:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<10x4xbf16>
// CHECK-NEXT:    %[[G:.+]] = "stablehlo.gather"(%[[T]]
// CHECK-NEXT:    %[[C:.+]] = stablehlo.constant dense<3.000000e+00> : tensor<3x4xbf16>
// CHECK-NEXT:    %[[H:.+]] = stablehlo.multiply %[[G]], %[[C]]
// CHECK:         stablehlo.constant dense<2.000000e+00> : tensor<4x4xbf16>
// CHECK:         stablehlo.transpose %[[T]], dims = [1, 0]
// CHECK-NOT:     stablehlo.constant {{.*}} : tensor<10x4xbf16>
func.func @tied_bf16_table_keeps_the_scale(%ids: tensor<3x1xi32>) -> (tensor<3x4xbf16>, tensor<3x10xbf16>) {
  %t = stablehlo.constant dense<0.5> : tensor<10x4xbf16>
  %g = "stablehlo.gather"(%t, %ids) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 4>} : (tensor<10x4xbf16>, tensor<3x1xi32>) -> tensor<3x4xbf16>
  %c = stablehlo.constant dense<3.0> : tensor<3x4xbf16>
  %h = stablehlo.multiply %g, %c : tensor<3x4xbf16>
  %a = stablehlo.tanh %h : tensor<3x4xbf16>
  %w = stablehlo.constant dense<2.0> : tensor<4x4xbf16>
  %n = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<3x4xbf16>, tensor<4x4xbf16>) -> tensor<3x4xbf16>
  %tt = stablehlo.transpose %t, dims = [1, 0] : (tensor<10x4xbf16>) -> tensor<4x10xbf16>
  %l = stablehlo.dot_general %n, %tt, contracting_dims = [1] x [0] : (tensor<3x4xbf16>, tensor<4x10xbf16>) -> tensor<3x10xbf16>
  return %h, %l : tensor<3x4xbf16>, tensor<3x10xbf16>
}

// -----

// A helper holding a scale is inlined only where the scale's walk reaches a weight
// behind the call. hard_sigmoid's `/ 6` stops at relu6 (no law passes a clamp): it
// and the helpers it calls stay calls. @scaled's `* 0.125` reaches the caller's
// dot_general: inlined, and 0.125 goes into its weight (0.5 * 0.125 = 0.0625).

// CHECK-LABEL: @helper_inlined_only_for_a_fold
// CHECK:         call @hard_sigmoid
// CHECK-NOT:     call @scaled
// CHECK:         stablehlo.constant dense<6.250000e-02> : tensor<8x8xf32>
// CHECK-NOT:     call @scaled
// CHECK:         func.func private @hard_sigmoid
// CHECK:         call @relu6
// CHECK-NOT:     func.func private @scaled
func.func @helper_inlined_only_for_a_fold(%x: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %w = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %t = stablehlo.tanh %y : tensor<2x8xf32>
  %h = call @hard_sigmoid(%t) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %w2 = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %v = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %s = call @scaled(%v) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %h, %s : tensor<2x8xf32>, tensor<2x8xf32>
}
func.func private @hard_sigmoid(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %three = stablehlo.constant dense<3.000000e+00> : tensor<2x8xf32>
  %a = stablehlo.add %arg0, %three : tensor<2x8xf32>
  %r = call @relu6(%a) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %six = stablehlo.constant dense<6.000000e+00> : tensor<2x8xf32>
  %d = stablehlo.divide %r, %six : tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}
func.func private @relu6(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
  %six = stablehlo.constant dense<6.000000e+00> : tensor<2x8xf32>
  %m = stablehlo.maximum %arg0, %zero : tensor<2x8xf32>
  %c = stablehlo.minimum %m, %six : tensor<2x8xf32>
  return %c : tensor<2x8xf32>
}
func.func private @scaled(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %c = stablehlo.constant dense<1.250000e-01> : tensor<2x8xf32>
  %m = stablehlo.multiply %arg0, %c : tensor<2x8xf32>
  return %m : tensor<2x8xf32>
}

// -----

// q is a slice of one copy of concatenate(%y, %y), k the same channels of the other copy:
// a scale on q's channels of W would scale k too. Refused (users); nothing changes.

// CHECK-LABEL: func.func @concat_of_itself_keeps_its_scale
// CHECK:       %[[W:.+]] = stablehlo.constant dense<{{\[}}[5.000000e-01, -1.000000e+00, 2.500000e-01, 2.000000e+00]
// CHECK:       %[[Y:.+]] = stablehlo.dot_general %arg0, %[[W]]
// CHECK:       stablehlo.concatenate %[[Y]], %[[Y]], dim = 1
// CHECK:       stablehlo.multiply
// CHECK:       return
func.func @concat_of_itself_keeps_its_scale(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[0.5, -1.0, 0.25, 2.0], [1.5, 0.75, -0.5, 1.0]]> : tensor<2x4xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %b = stablehlo.concatenate %y, %y, dim = 1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  %q = stablehlo.slice %b [0:2, 0:2] : (tensor<2x8xf32>) -> tensor<2x2xf32>
  %k = stablehlo.slice %b [0:2, 4:6] : (tensor<2x8xf32>) -> tensor<2x2xf32>
  %c = stablehlo.constant dense<3.000000e-01> : tensor<2x2xf32>
  %qs = stablehlo.multiply %q, %c : tensor<2x2xf32>
  %s = stablehlo.dot_general %qs, %k, contracting_dims = [1] x [1] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %s : tensor<2x2xf32>
}
