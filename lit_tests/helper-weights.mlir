// RUN: %bnfold-opt --report %t.json %s | %filecheck %s
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT
// RUN: %bnfold-opt --skip-func get_kernel %s | %filecheck %s --check-prefix=SKIP

// The kernel comes from a private helper, called twice (constants are evaluated through
// calls). The first fold's kernel is a copy while the other call keeps the helper (+16
// bytes, said in its record); the second fold replaces the last reader, and the helper
// goes with its call. `--skip-func get_kernel` keeps the helper as it is.

// CHECK-LABEL: @helper_kernel_twice
// CHECK:         %[[K0:.+]] = stablehlo.constant dense<{{\[}}[1.000000e+00, 4.000000e+00], [3.000000e+00, 8.000000e+00]]> : tensor<2x2xf32>
// CHECK:         stablehlo.dot_general %arg0, %[[K0]]
// CHECK:         %[[K1:.+]] = stablehlo.constant dense<{{\[}}[3.000000e+00, 2.000000e+00], [9.000000e+00, 4.000000e+00]]> : tensor<2x2xf32>
// CHECK:         stablehlo.dot_general %arg0, %[[K1]]
// CHECK-NOT:     call
// CHECK-NOT:     @get_kernel
// REPORT:        "id": "fold0",
// REPORT:        "note": "the weight is shared (also read by func.call): the folded kernel is a copy, +16 bytes",
// REPORT-NEXT:   "shared_weight": {
// REPORT-NEXT:     "copied_bytes": 16,
// REPORT-NEXT:     "also_read_by": [
// REPORT-NEXT:       "func.call"
// REPORT-NEXT:     ]
// REPORT:        "id": "fold1",
// REPORT-NOT:    "shared_weight"
// REPORT:        "skipped": []
// SKIP-LABEL:    @helper_kernel_twice
// SKIP-NOT:      call
// SKIP:          func.func private @get_kernel
func.func @helper_kernel_twice(%x: tensor<3x2xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>) {
  %k0 = call @get_kernel() : () -> tensor<2x2xf32>
  %y0 = stablehlo.dot_general %x, %k0, contracting_dims = [1] x [0] : (tensor<3x2xf32>, tensor<2x2xf32>) -> tensor<3x2xf32>
  %s0 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %s0b = stablehlo.broadcast_in_dim %s0, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %m0 = stablehlo.multiply %y0, %s0b : tensor<3x2xf32>
  %k1 = call @get_kernel() : () -> tensor<2x2xf32>
  %y1 = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [0] : (tensor<3x2xf32>, tensor<2x2xf32>) -> tensor<3x2xf32>
  %s1 = stablehlo.constant dense<[3.0, 1.0]> : tensor<2xf32>
  %s1b = stablehlo.broadcast_in_dim %s1, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %m1 = stablehlo.multiply %y1, %s1b : tensor<3x2xf32>
  return %m0, %m1 : tensor<3x2xf32>, tensor<3x2xf32>
}
func.func private @get_kernel() -> tensor<2x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  return %w : tensor<2x2xf32>
}
