// RUN: not %bnfold-opt --split-input-file %s 2>&1 | %filecheck %s
// Like mlir-opt, the valid chunk is still processed and printed (exit status 1):
// RUN: not %bnfold-opt --split-input-file %s 2>/dev/null | %filecheck %s --check-prefix=VALID
// VALID: func.func @valid_chunk
// VALID-NOT: func.func
// A bad option is diagnosed before reading the input:
// RUN: not %bnfold-opt --disable no-such-pattern %s 2>&1 | %filecheck %s --check-prefix=BADOPT
// BADOPT: --disable: error: unknown pattern name(s) no-such-pattern; known: inline-calls, drop-identity, backward-affine

// Diagnostics are `FILE:LINE:COL: error: ...` with the line in this file
// (--split-input-file keeps line numbers), one per bad chunk, in order.

func.func @valid_chunk(%x: tensor<2xf32>) -> tensor<2xf32> {
  return %x : tensor<2xf32>
}

// -----

func.func @parse_error_unknown_op(%x: tensor<2xf32>) -> tensor<2xf32> {
  // CHECK: {{.*}}backward-affine-invalid.mlir:[[# @LINE + 1]]:8: error: custom op 'stablehlo.frobnicate' is unknown
  %y = stablehlo.frobnicate %x : tensor<2xf32>
  return %y : tensor<2xf32>
}

// -----

func.func @verifier_error_type_mismatch(%x: tensor<2xf32>, %y: tensor<3xf32>) -> tensor<2xf32> {
  // CHECK: {{.*}}backward-affine-invalid.mlir:[[# @LINE + 1]]:8: error: 'stablehlo.add' op requires the same shape for all operands and results
  %z = "stablehlo.add"(%x, %y) : (tensor<2xf32>, tensor<3xf32>) -> tensor<2xf32>
  return %z : tensor<2xf32>
}

// -----

func.func @verifier_error_batch_norm_statistics_size(%x: tensor<1x3x3x2xf32>, %g: tensor<3xf32>) -> tensor<1x3x3x2xf32> {
  // CHECK: {{.*}}backward-affine-invalid.mlir:[[# @LINE + 1]]:9: error: {{.*}}size of single-dimensional operands is 3 and the feature count is 2
  %bn = "stablehlo.batch_norm_inference"(%x, %g, %g, %g, %g) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

func.func @verifier_error_feature_index_out_of_range(%x: tensor<1x3x3x2xf32>, %g: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  // CHECK: {{.*}}backward-affine-invalid.mlir:[[# @LINE + 1]]:9: error: expects featureIndex to be smaller than the rank of multi-dimensional operands; got featureIndex 4, and rank 4
  %bn = "stablehlo.batch_norm_inference"(%x, %g, %g, %g, %g) {epsilon = 2.500000e-01 : f32, feature_index = 4 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

func.func @parse_error_undefined_value(%x: tensor<2xf32>) -> tensor<2xf32> {
  // CHECK: {{.*}}backward-affine-invalid.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: use of undeclared SSA value name
  %y = stablehlo.abs %nope : tensor<2xf32>
  return %y : tensor<2xf32>
}
