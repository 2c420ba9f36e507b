// RUN: %bnfold-opt --split-input-file --report %t.json %s | %filecheck %s
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT
// RUN: %bnfold-opt --split-input-file --report %t.txt --report-format text %s > /dev/null
// RUN: cat %t.txt | %filecheck %s --check-prefix=TEXT

// A final norm's gamma into an LM head whose weight is the embedding table (a gather
// reads the same constant): the fold writes a new kernel and the table stays, so the
// record says the weight is shared and what the copy adds (4 x 2 f32: 32 bytes).

// CHECK-LABEL: @tied_head
// CHECK-DAG:     %[[T:.+]] = stablehlo.constant dense<{{\[}}[1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00], [5.000000e+00, 6.000000e+00], [7.000000e+00, 8.000000e+00]]> : tensor<4x2xf32>
// CHECK-DAG:     %[[K:.+]] = stablehlo.constant dense<{{\[}}[5.000000e-01, 6.000000e+00], [1.500000e+00, 1.200000e+01], [2.500000e+00, 1.800000e+01], [3.500000e+00, 2.400000e+01]]> : tensor<4x2xf32>
// CHECK-DAG:     stablehlo.dot_general %arg0, %[[K]]
// CHECK-DAG:     "stablehlo.gather"(%[[T]], %arg1)
// REPORT:        "kind": "affine",
// REPORT-NEXT:   "note": "the weight is shared (also read by stablehlo.gather): the folded kernel is a copy, +32 bytes",
// REPORT-NEXT:   "shared_weight": {
// REPORT-NEXT:     "copied_bytes": 32,
// REPORT-NEXT:     "also_read_by": [
// REPORT-NEXT:       "stablehlo.gather"
// REPORT-NEXT:     ]
// REPORT-NEXT:   },
// TEXT:          fold0  the weight is shared (also read by stablehlo.gather): the folded kernel is a copy, +32 bytes
// TEXT:          copied 1 shared weight(s) (+32 bytes: fold0; a tied weight stays for its other readers)
func.func @tied_head(%x: tensor<3x2xf32>, %ids: tensor<3x1xi32>) -> (tensor<3x4xf32>, tensor<3x2xf32>) {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]> : tensor<4x2xf32>
  %g = stablehlo.constant dense<[0.5, 3.0]> : tensor<2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %n = stablehlo.multiply %x, %gb : tensor<3x2xf32>
  %logits = stablehlo.dot_general %n, %w, contracting_dims = [1] x [1] : (tensor<3x2xf32>, tensor<4x2xf32>) -> tensor<3x4xf32>
  %e = "stablehlo.gather"(%w, %ids) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 2>}> : (tensor<4x2xf32>, tensor<3x1xi32>) -> tensor<3x2xf32>
  return %logits, %e : tensor<3x4xf32>, tensor<3x2xf32>
}
