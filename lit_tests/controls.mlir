// RUN: %bnfold-opt --split-input-file %s | %filecheck %s --check-prefix=DEFAULT
// RUN: %bnfold-opt --split-input-file --disable backward-affine %s | %filecheck %s --check-prefix=DISABLE
// RUN: %bnfold-opt --split-input-file --skip-func skipped %s | %filecheck %s --check-prefix=SKIP
//
// Idempotence: folding the folded output changes nothing. The same DEFAULT
// checks hold after two runs, and the second output is byte-identical.
// RUN: %bnfold-opt --split-input-file %s | %bnfold-opt --split-input-file - | %filecheck %s --check-prefix=DEFAULT
// RUN: %bnfold-opt --split-input-file %s > %t.once.mlir
// RUN: %bnfold-opt --split-input-file %t.once.mlir > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// The same with --expand-batch-norm (nothing left to expand the second time).
// RUN: %bnfold-opt --split-input-file --expand-batch-norm %s > %t.expanded.mlir
// RUN: %bnfold-opt --split-input-file --expand-batch-norm %t.expanded.mlir | diff %t.expanded.mlir -
//
// Last, so that a failure here does not hide the checks above:
// RUN: %bnfold-opt --split-input-file --expand-batch-norm %s | %filecheck %s --check-prefix=EXPAND

// BN over 2 channels: scale [0.5, 6], shift [-0.5, 23].

// DEFAULT-LABEL: @foldable
// DEFAULT-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// DEFAULT-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// DEFAULT-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// DEFAULT-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// DEFAULT-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// DEFAULT-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// DEFAULT-NEXT:    return %[[R]]

// --disable backward-affine: the module comes back as it went in.
// DISABLE-LABEL: @foldable
// DISABLE-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// DISABLE-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// DISABLE-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// DISABLE-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// DISABLE-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// DISABLE-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// DISABLE-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// DISABLE-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// DISABLE-NEXT:    return %[[BN]]

// SKIP-LABEL: @foldable
// SKIP-NOT:     stablehlo.batch_norm_inference
// SKIP:         stablehlo.add
// SKIP-NOT:     stablehlo.batch_norm_inference
// SKIP:         return

// EXPAND-LABEL: @foldable
// EXPAND-NOT:     stablehlo.batch_norm_inference
// EXPAND:         %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// EXPAND-NOT:     stablehlo.multiply
// EXPAND:         stablehlo.add
// EXPAND-NOT:     stablehlo.multiply
// EXPAND:         return
func.func @foldable(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// --disable backward-affine also leaves a decomposed chain alone.
// DEFAULT-LABEL: @foldable_chain
// DEFAULT-NOT:     stablehlo.multiply
// DEFAULT:         stablehlo.convolution
// DEFAULT-NEXT:    stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// DEFAULT-NEXT:    stablehlo.broadcast_in_dim
// DEFAULT-NEXT:    stablehlo.add
// DEFAULT-NEXT:    return

// DISABLE-LABEL: @foldable_chain
// DISABLE-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// DISABLE-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// DISABLE-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// DISABLE:         %[[MUL:.+]] = stablehlo.multiply %[[CONV]], %{{.+}}
// DISABLE:         %[[R:.+]] = stablehlo.add %[[MUL]], %{{.+}}
// DISABLE-NEXT:    return %[[R]]
func.func @foldable_chain(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %s = stablehlo.constant dense<[0.5, 6.0]> : tensor<2xf32>
  %s_b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %scaled = stablehlo.multiply %conv, %s_b : tensor<1x3x3x2xf32>
  %t = stablehlo.constant dense<[-0.5, 23.0]> : tensor<2xf32>
  %t_b = stablehlo.broadcast_in_dim %t, dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
  %y = stablehlo.add %scaled, %t_b : tensor<1x3x3x2xf32>
  return %y : tensor<1x3x3x2xf32>
}

// -----

// --skip-func skipped: @skipped stays exactly as written (its dead-looking
// constants too); @not_skipped in the same module still folds.
// SKIP-LABEL: @skipped
// SKIP-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// SKIP-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}1.000000e+00, 2.000000e+00], [3.000000e+00, 4.000000e+00]]]]>
// SKIP-NEXT:    %[[UNUSED:.+]] = stablehlo.constant dense<7.000000e+00> : tensor<2xf32>
// SKIP-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// SKIP-NEXT:    %[[G:.+]] = stablehlo.constant dense<[1.000000e+00, 3.000000e+00]>
// SKIP-NEXT:    %[[B:.+]] = stablehlo.constant dense<[5.000000e-01, -1.000000e+00]>
// SKIP-NEXT:    %[[M:.+]] = stablehlo.constant dense<[2.000000e+00, -4.000000e+00]>
// SKIP-NEXT:    %[[V:.+]] = stablehlo.constant dense<[3.750000e+00, 0.000000e+00]>
// SKIP-NEXT:    %[[BN:.+]] = "stablehlo.batch_norm_inference"(%[[CONV]], %[[G]], %[[B]], %[[M]], %[[V]])
// SKIP-NEXT:    return %[[BN]]
// SKIP-LABEL: @not_skipped
// SKIP-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// SKIP-NEXT:    %[[K:.+]] = stablehlo.constant dense<{{\[\[\[\[}}5.000000e-01, 1.200000e+01], [1.500000e+00, 2.400000e+01]]]]>
// SKIP-NEXT:    %[[CONV:.+]] = stablehlo.convolution(%[[X]], %[[K]])
// SKIP-NEXT:    %[[B:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]>
// SKIP-NEXT:    %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3]
// SKIP-NEXT:    %[[R:.+]] = stablehlo.add %[[CONV]], %[[BB]]
// SKIP-NEXT:    return %[[R]]

// Without --skip-func both fold.
// DEFAULT-LABEL: @skipped
// DEFAULT-NOT:     stablehlo.batch_norm_inference
// DEFAULT:         stablehlo.add
// DEFAULT-LABEL: @not_skipped
// DEFAULT-NOT:     stablehlo.batch_norm_inference
// DEFAULT:         stablehlo.add
func.func @skipped(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %unused = stablehlo.constant dense<7.0> : tensor<2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

func.func @not_skipped(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Statistics are arguments: no fold; --expand-batch-norm writes the spec's
// decomposition (x - mean) / sqrt(var + eps) * gamma + beta.
// DEFAULT-LABEL: @expand_statistics_are_arguments
// DEFAULT:         "stablehlo.batch_norm_inference"

// EXPAND-LABEL: @expand_statistics_are_arguments
// EXPAND-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>, %[[G:.+]]: tensor<2xf32>, %[[B:.+]]: tensor<2xf32>, %[[M:.+]]: tensor<2xf32>, %[[V:.+]]: tensor<2xf32>)
// EXPAND-NOT:     stablehlo.batch_norm_inference
// EXPAND:         %[[CONV:.+]] = stablehlo.convolution(%[[X]],
// EXPAND-DAG:     %[[EPS:.+]] = stablehlo.constant dense<2.500000e-01> : tensor<1x3x3x2xf32>
// EXPAND-DAG:     %[[MB:.+]] = stablehlo.broadcast_in_dim %[[M]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-DAG:     %[[VB:.+]] = stablehlo.broadcast_in_dim %[[V]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-DAG:     %[[GB:.+]] = stablehlo.broadcast_in_dim %[[G]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-DAG:     %[[BB:.+]] = stablehlo.broadcast_in_dim %[[B]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-DAG:     %[[CENTERED:.+]] = stablehlo.subtract %[[CONV]], %[[MB]]
// EXPAND-DAG:     %[[VE:.+]] = stablehlo.add %[[VB]], %[[EPS]]
// EXPAND-DAG:     %[[STD:.+]] = stablehlo.sqrt %[[VE]]
// EXPAND-DAG:     %[[NORMED:.+]] = stablehlo.divide %[[CENTERED]], %[[STD]]
// EXPAND-DAG:     %[[SCALED:.+]] = stablehlo.multiply %[[NORMED]], %[[GB]]
// EXPAND-DAG:     %[[R:.+]] = stablehlo.add %[[SCALED]], %[[BB]]
// EXPAND:         return %[[R]]
func.func @expand_statistics_are_arguments(%x: tensor<1x3x3x2xf32>, %g: tensor<2xf32>, %b: tensor<2xf32>, %m: tensor<2xf32>, %v: tensor<2xf32>) -> tensor<1x3x3x2xf32> {
  %k = stablehlo.constant dense<[[[[1.0, 2.0], [3.0, 4.0]]]]> : tensor<1x1x2x2xf32>
  %conv = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x3x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x3x3x2xf32>
  %bn = "stablehlo.batch_norm_inference"(%conv, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}

// -----

// Constant statistics on a block argument: no producer to fold into;
// --expand-batch-norm writes x * [0.5, 6] + [-0.5, 23] with folded constants,
// and the statistics constants it no longer needs are removed.
// DEFAULT-LABEL: @expand_block_argument
// DEFAULT:         "stablehlo.batch_norm_inference"

// EXPAND-LABEL: @expand_block_argument
// EXPAND-SAME:    (%[[X:.+]]: tensor<1x3x3x2xf32>)
// EXPAND-NEXT:    %[[S:.+]] = stablehlo.constant dense<[5.000000e-01, 6.000000e+00]> : tensor<2xf32>
// EXPAND-NEXT:    %[[SB:.+]] = stablehlo.broadcast_in_dim %[[S]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-NEXT:    %[[T:.+]] = stablehlo.constant dense<[-5.000000e-01, 2.300000e+01]> : tensor<2xf32>
// EXPAND-NEXT:    %[[TB:.+]] = stablehlo.broadcast_in_dim %[[T]], dims = [3] : (tensor<2xf32>) -> tensor<1x3x3x2xf32>
// EXPAND-NEXT:    %[[MUL:.+]] = stablehlo.multiply %[[X]], %[[SB]]
// EXPAND-NEXT:    %[[R:.+]] = stablehlo.add %[[MUL]], %[[TB]]
// EXPAND-NEXT:    return %[[R]]
func.func @expand_block_argument(%x: tensor<1x3x3x2xf32>) -> tensor<1x3x3x2xf32> {
  %g = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
  %b = stablehlo.constant dense<[0.5, -1.0]> : tensor<2xf32>
  %m = stablehlo.constant dense<[2.0, -4.0]> : tensor<2xf32>
  %v = stablehlo.constant dense<[3.75, 0.0]> : tensor<2xf32>
  %bn = "stablehlo.batch_norm_inference"(%x, %g, %b, %m, %v) {epsilon = 2.500000e-01 : f32, feature_index = 3 : i64} : (tensor<1x3x3x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x3x3x2xf32>
  return %bn : tensor<1x3x3x2xf32>
}
