// RUN: %bnfold-opt --split-input-file --report %t.json %s > /dev/null
// RUN: cat %t.json | %filecheck %s --check-prefix=REPORT

// The JSON report: one entry per fold (producer, norm, form, direction,
// channels, the ops folded) and one per normalization left in place, with
// its reason. Locations are FILE:LINE:COL of this file. Folds come first,
// then skipped entries, each in file order.

// REPORT:      "folds": [
func.func @fold_batch_norm(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  // REPORT:      "id": "fold0",
  // REPORT-NEXT: "producer": "{{.*}}report.mlir:[[# @LINE + 1]]:11",
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  // REPORT-NEXT: "producer_op": "stablehlo.convolution",
  // REPORT-NEXT: "norm": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT-NEXT: "norm_op": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "form": "batch_norm_inference",
  // REPORT-NEXT: "direction": "backward",
  // REPORT-NEXT: "channels": 2,
  // REPORT-NEXT: "ops": [
  // REPORT-NEXT:   "stablehlo.batch_norm_inference"
  // REPORT-NEXT: ],
  // REPORT-NEXT: "function": "fold_batch_norm",
  // REPORT-NEXT: "kernel_rounding": {{[0-9.e+-]+}},
  // REPORT-NEXT: "kind": "normalization"
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// A decomposed chain on NCHW: the report names the first non-bias step as the norm.
func.func @fold_decomposed_chain(%x: tensor<1x2x3x3xf32>) -> tensor<1x3x3x3xf32> {
  %k = stablehlo.constant dense<1.0> : tensor<3x2x1x1xf32>
  // REPORT:      "id": "fold1",
  // REPORT-NEXT: "producer": "{{.*}}report.mlir:[[# @LINE + 1]]:11",
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x3xf32>, tensor<3x2x1x1xf32>) -> tensor<1x3x3x3xf32>
  %m = stablehlo.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>
  %m_b = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
  // REPORT-NEXT: "producer_op": "stablehlo.convolution",
  // REPORT-NEXT: "norm": "{{.*}}report.mlir:[[# @LINE + 1]]:15",
  %centered = stablehlo.subtract %conv, %m_b : tensor<1x3x3x3xf32>
  %s = stablehlo.constant dense<[0.5, 4.0, 3.0]> : tensor<3xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
  %scaled = stablehlo.multiply %centered, %s_b : tensor<1x3x3x3xf32>
  %t = stablehlo.constant dense<[0.5, 0.25, -1.0]> : tensor<3xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x3xf32>
  // REPORT-NEXT: "norm_op": "stablehlo.subtract",
  // REPORT-NEXT: "form": "decomposed",
  // REPORT-NEXT: "direction": "backward",
  // REPORT-NEXT: "channels": 3,
  // REPORT-NEXT: "ops": [
  // REPORT-NEXT:   "stablehlo.subtract",
  // REPORT-NEXT:   "stablehlo.multiply",
  // REPORT-NEXT:   "stablehlo.add"
  // REPORT-NEXT: ],
  // REPORT-NEXT: "function": "fold_decomposed_chain",
  // REPORT-NEXT: "kernel_rounding": {{[0-9.e+-]+}},
  // REPORT-NEXT: "kind": "normalization"
  return %y : tensor<1x3x3x3xf32>
}

// -----

func.func @fold_into_dot_general(%x: tensor<2x3xf32>) -> tensor<2x4xf32> {
  %w = stablehlo.constant dense<1.0> : tensor<3x4xf32>
  // REPORT:      "id": "fold2",
  // REPORT-NEXT: "producer": "{{.*}}report.mlir:[[# @LINE + 1]]:10",
  %dot = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %g = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = stablehlo.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %m = stablehlo.constant dense<[0.5, 1.0, 1.5, 2.0]> : tensor<4xf32>
  %v = stablehlo.constant dense<[3.75, 0.75, 15.75, 0.0]> : tensor<4xf32>
  // REPORT-NEXT: "producer_op": "stablehlo.dot_general",
  // REPORT-NEXT: "norm": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%dot, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<2x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  // REPORT-NEXT: "norm_op": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "form": "batch_norm_inference",
  // REPORT-NEXT: "direction": "backward",
  // REPORT-NEXT: "channels": 4,
  // REPORT:      "function": "fold_into_dot_general",
  // REPORT-NEXT: "kernel_rounding": {{[0-9.e+-]+}},
  // REPORT-NEXT: "kind": "normalization",
  // REPORT-NEXT: "block": "fold_into_dot_general"
  // REPORT-NEXT: }
  // REPORT-NEXT: ],
  return %bn : tensor<2x4xf32>
}

// -----

// REPORT-NEXT: "skipped": [
func.func @skip_statistics_are_arguments(%x: tensor<1x3x3x2xf32>, %g: tensor<2xf32>, %b: tensor<2xf32>, %m: tensor<2xf32>, %v: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "reason": "batch_norm_inference gamma is not constant: it is function argument %arg1; bind parameters first (--bind-params FILE.npz, or bnfold.jax_export.fold_exported)",
  // REPORT-NEXT: "function": "skip_statistics_are_arguments",
  // REPORT-NEXT: "code": "parameter-argument"
  return %bn : tensor<1x3x3x2xf32>
}

// -----

func.func @skip_kernel_is_argument(%x: tensor<1x3x3x2xf32>, %k: tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32> {
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "reason": "the kernel (which carries axis 3) is not constant: it is function argument %arg1; bind parameters first (--bind-params FILE.npz, or bnfold.jax_export.fold_exported)",
  // REPORT-NEXT: "function": "skip_kernel_is_argument",
  // REPORT-NEXT: "code": "kernel-argument"
  return %bn : tensor<1x3x3x2xf32>
}

// -----

func.func @skip_feature_index_is_spatial(%x: tensor<1x2x3x2xf32>) -> tensor<1x2x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 1 : i64} : (tensor<1x2x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "reason": "feature_index 1 is not the producer's output-feature axis 3",
  // REPORT-NEXT: "function": "skip_feature_index_is_spatial",
  // REPORT-NEXT: "code": "axis"
  return %bn : tensor<1x2x3x2xf32>
}

// -----

func.func @skip_conv_has_second_user(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "reason": "producer result has 2 users",
  // REPORT-NEXT: "function": "skip_conv_has_second_user",
  // REPORT-NEXT: "code": "users"
  return %bn, %conv : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}

// -----

func.func @skip_block_argument(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:9",
  %bn = "stablehlo.batch_norm_inference"(%x, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.batch_norm_inference",
  // REPORT-NEXT: "reason": "no convolution or dot_general produces its operand (it is a block argument); forward: it feeds func.return, which is not linear",
  // REPORT-NEXT: "function": "skip_block_argument",
  // REPORT-NEXT: "code": "no-producer"
  return %bn : tensor<1x3x3x2xf32>
}

// -----

func.func @skip_divide_by_zero(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %d = stablehlo.constant dense<[2.0, 0.0]> : tensor<2xf32>
  %d_b = stablehlo.broadcast_in_dim %d, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:8",
  %y = stablehlo.divide %conv, %d_b : tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.divide",
  // REPORT-NEXT: "reason": "division by a per-channel constant that is zero",
  // REPORT-NEXT: "function": "skip_divide_by_zero",
  // REPORT-NEXT: "code": "precision"
  return %y : tensor<1x3x3x2xf32>
}

// -----

func.func @skip_intermediate_has_second_user(%x: tensor<1x3x3x2xf32>) -> (tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>) {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %m_b = stablehlo.broadcast_in_dim %m, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %centered = stablehlo.subtract %conv, %m_b : tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  // REPORT:      "op": "{{.*}}report.mlir:[[# @LINE + 1]]:13",
  %scaled = stablehlo.multiply %centered, %s_b : tensor<1x3x3x2xf32>
  // REPORT-NEXT: "op_name": "stablehlo.multiply",
  // REPORT-NEXT: "reason": "intermediate value has 2 users",
  // REPORT-NEXT: "function": "skip_intermediate_has_second_user",
  // REPORT-NEXT: "code": "users",
  // REPORT-NEXT: "block": "skip_intermediate_has_second_user"
  // REPORT-NEXT: }
  // REPORT-NEXT: ],
  // REPORT-NEXT: "expanded": 0,
  // REPORT-NEXT: "inlined": [],
  // REPORT-NEXT: "warnings": []
  // REPORT-NEXT: }
  %t = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y, %centered : tensor<1x3x3x2xf32>, tensor<1x3x3x2xf32>
}
