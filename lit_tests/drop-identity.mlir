// RUN: %bnfold-opt --split-input-file %s | %filecheck %s
// RUN: %bnfold-opt --split-input-file --report %t.json %s > /dev/null
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT
// RUN: %bnfold-opt --split-input-file --disable drop-identity %s | %filecheck %s --check-prefix=KEPT

// torchax's `a + b * 1` after a linear layer: the multiply goes, the add reads the
// dot_general, whose weight is not rewritten (no fold); `+ 0` goes too.

// CHECK-LABEL: @residual_times_one
// CHECK:         %[[W:.+]] = stablehlo.constant dense<5.000000e-01> : tensor<8x8xf32>
// CHECK:         %[[Y:.+]] = stablehlo.dot_general %arg0, %[[W]]
// CHECK-NEXT:    %[[R:.+]] = stablehlo.add %arg1, %[[Y]]
// CHECK-NEXT:    return %[[R]]
// REPORT:        "folds": [],
// REPORT:        "identities": [
// REPORT-NEXT:     {
// REPORT-NEXT:       "op": "{{.*}}drop-identity.mlir:[[# @LINE + 13]]:8",
// REPORT-NEXT:       "op_name": "stablehlo.multiply",
// REPORT-NEXT:       "kind": "identity",
// REPORT:            "op_name": "stablehlo.add",
// REPORT-NEXT:       "kind": "identity",
// KEPT-LABEL:    @residual_times_one
// KEPT:          %[[Z:.+]] = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
// KEPT:          stablehlo.add %arg1, %[[Z]]
func.func @residual_times_one(%x: tensor<2x8xf32>, %a: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %w = stablehlo.constant dense<0.5> : tensor<8x8xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %ob = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %m = stablehlo.multiply %y, %ob : tensor<2x8xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<2x8xf32>
  %z = stablehlo.add %a, %zero : tensor<2x8xf32>
  %r = stablehlo.add %z, %m : tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}

// -----

// A divide by 1 and a subtract of 0 (only on the right) go; `0 - x` and a multiply by
// 1.0000001 stay.

// CHECK-LABEL: @only_exact_identities
// CHECK-NOT:     stablehlo.divide
// CHECK:         %[[N:.+]] = stablehlo.subtract %{{.+}}, %arg0
// CHECK-NEXT:    %[[M:.+]] = stablehlo.multiply %[[N]], %{{.+}}
// CHECK-NEXT:    return %[[M]]
func.func @only_exact_identities(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.000000e+00> : tensor<4xf32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
  %near = stablehlo.constant dense<1.00000012> : tensor<4xf32>
  %d = stablehlo.divide %x, %one : tensor<4xf32>
  %s = stablehlo.subtract %d, %zero : tensor<4xf32>
  %n = stablehlo.subtract %zero, %s : tensor<4xf32>
  %m = stablehlo.multiply %n, %near : tensor<4xf32>
  return %m : tensor<4xf32>
}
