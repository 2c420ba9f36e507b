// RUN: %bnfold-opt --split-input-file --report %t.json %s | %filecheck %s
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT

// attention-scale: the scalar scale of q k^T moves back along q into Wq (here
// [[1, 2], [3, 4]] times 0.5) through a bias add (bias [2, 6] times 0.5) and a
// head reshape; the multiply disappears.

// CHECK-LABEL: @scale_after_the_product_into_wq
// CHECK:         %[[WQ:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.000000e+00], [1.500000e+00, 2.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %{{.+}}, %[[WQ]]
// CHECK-NEXT:    %[[B:.+]] = stablehlo.constant dense<{{\[\[}}1.000000e+00, 3.000000e+00]
// CHECK-NEXT:    %[[QB:.+]] = stablehlo.add %[[Q]], %[[B]]
// CHECK-NEXT:    %[[QH:.+]] = stablehlo.reshape %[[QB]]
// CHECK-NEXT:    %[[L:.+]] = stablehlo.dot_general %[[QH]], %{{.+}}, batching_dims
// CHECK-NEXT:    return %[[L]]
// REPORT: "norm_op": "stablehlo.multiply",
// REPORT-NEXT: "form": "scale",
func.func @scale_after_the_product_into_wq(%x: tensor<4x2xf32>, %k: tensor<4x1x2xf32>) -> tensor<1x4x4xf32> {
  %wq = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %bq = stablehlo.constant dense<[[2.0, 6.0], [2.0, 6.0], [2.0, 6.0], [2.0, 6.0]]> : tensor<4x2xf32>
  %c = stablehlo.constant dense<0.5> : tensor<1x4x4xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %qb = stablehlo.add %q, %bq : tensor<4x2xf32>
  %qh = stablehlo.reshape %qb : (tensor<4x2xf32>) -> tensor<4x1x2xf32>
  %l = stablehlo.dot_general %qh, %k, batching_dims = [1] x [1], contracting_dims = [2] x [2] : (tensor<4x1x2xf32>, tensor<4x1x2xf32>) -> tensor<1x4x4xf32>
  %s = stablehlo.multiply %l, %c : tensor<1x4x4xf32>
  return %s : tensor<1x4x4xf32>
}

// -----

// Flax divides q by sqrt(d) before the product: q / 2 = q * 0.5.

// CHECK-LABEL: @scale_on_q_before_the_product
// CHECK:         %[[WQ:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.000000e+00], [1.500000e+00, 2.000000e+00]]>
// CHECK-NEXT:    %[[Q:.+]] = stablehlo.dot_general %{{.+}}, %[[WQ]]
// CHECK-NEXT:    %[[L:.+]] = stablehlo.dot_general %[[Q]], %{{.+}}, contracting_dims = [1] x [1]
// CHECK-NEXT:    return %[[L]]
func.func @scale_on_q_before_the_product(%x: tensor<4x2xf32>, %k: tensor<4x2xf32>) -> tensor<4x4xf32> {
  %wq = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %c = stablehlo.constant dense<2.0> : tensor<4x2xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %qs = stablehlo.divide %q, %c : tensor<4x2xf32>
  %l = stablehlo.dot_general %qs, %k, contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x4xf32>
  return %l : tensor<4x4xf32>
}

// -----

// QK-norm: q is normalized (a norm would undo a scale of Wq), so the scale goes
// into the q-norm's weight [1, 3] -> [0.5, 1.5]; Wq stays.

// CHECK-LABEL: @qk_norm_takes_the_scale_in_its_weight
// CHECK:         %[[WQ:.+]] = stablehlo.constant dense<{{\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]>
// CHECK:         %[[W:.+]] = stablehlo.constant dense<{{\[\[}}5.000000e-01, 1.500000e+00]
// CHECK-NEXT:    %[[QW:.+]] = stablehlo.multiply %{{.+}}, %[[W]]
// CHECK-NEXT:    %[[L:.+]] = stablehlo.dot_general %[[QW]], %{{.+}}, contracting_dims = [1] x [1]
// CHECK-NEXT:    return %[[L]]
func.func @qk_norm_takes_the_scale_in_its_weight(%x: tensor<4x2xf32>, %k: tensor<4x2xf32>, %ms: tensor<4x1xf32>) -> tensor<4x4xf32> {
  %wq = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %w = stablehlo.constant dense<[[1.0, 3.0], [1.0, 3.0], [1.0, 3.0], [1.0, 3.0]]> : tensor<4x2xf32>
  %c = stablehlo.constant dense<0.5> : tensor<4x4xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %r = stablehlo.rsqrt %ms : tensor<4x1xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x2xf32>
  %qn = stablehlo.multiply %q, %rb : tensor<4x2xf32>
  %qw = stablehlo.multiply %qn, %w : tensor<4x2xf32>
  %l = stablehlo.dot_general %qw, %k, contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x4xf32>
  %s = stablehlo.multiply %l, %c : tensor<4x4xf32>
  return %s : tensor<4x4xf32>
}

// -----

// q is also returned: the scale would reach that use too. Refused; nothing changes.

// CHECK-LABEL: @q_with_another_use_is_refused
// CHECK:         %[[L:.+]] = stablehlo.dot_general %{{.+}}, %{{.+}}, contracting_dims = [1] x [1]
// CHECK-NEXT:    %[[S:.+]] = stablehlo.multiply %[[L]], %{{.+}}
// CHECK-NEXT:    return %[[S]]
// REPORT: "reason": "attention-scale: a value on the way back to the layer that would absorb the scale has other uses {{.*}}",
// REPORT-NEXT: "function": "q_with_another_use_is_refused",
// REPORT-NEXT: "code": "fan-out"
func.func @q_with_another_use_is_refused(%x: tensor<4x2xf32>, %k: tensor<4x2xf32>) -> (tensor<4x4xf32>, tensor<4x2xf32>) {
  %wq = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %c = stablehlo.constant dense<0.5> : tensor<4x4xf32>
  %q = stablehlo.dot_general %x, %wq, contracting_dims = [1] x [0] : (tensor<4x2xf32>, tensor<2x2xf32>) -> tensor<4x2xf32>
  %l = stablehlo.dot_general %q, %k, contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x4xf32>
  %s = stablehlo.multiply %l, %c : tensor<4x4xf32>
  return %s, %q : tensor<4x4xf32>, tensor<4x2xf32>
}
