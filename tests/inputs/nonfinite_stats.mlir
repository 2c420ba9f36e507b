func.func @main(%arg0: tensor<1x8x8x3xf32>) -> (tensor<1x8x8x4xf32>, tensor<1x8x8x4xf32>) {
  %k = stablehlo.constant dense<0.5> : tensor<3x3x3x4xf32>
  %s = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %v = stablehlo.constant dense<[1.0, -2.0, 3.0, 4.0]> : tensor<4xf32>
  %n = stablehlo.constant dense<[1.0, 0x7FC00000, 3.0, 0x7F800000]> : tensor<4xf32>
  %0 = stablehlo.convolution(%arg0, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x4xf32>) -> tensor<1x8x8x4xf32>
  %1 = "stablehlo.batch_norm_inference"(%0, %s, %s, %s, %v) {epsilon = 1.0e-05 : f32, feature_index = 3 : i64} : (tensor<1x8x8x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x8x8x4xf32>
  %2 = stablehlo.convolution(%arg0, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x4xf32>) -> tensor<1x8x8x4xf32>
  %3 = "stablehlo.batch_norm_inference"(%2, %s, %s, %n, %s) {epsilon = 1.0e-05 : f32, feature_index = 3 : i64} : (tensor<1x8x8x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x8x8x4xf32>
  return %1, %3 : tensor<1x8x8x4xf32>, tensor<1x8x8x4xf32>
}
