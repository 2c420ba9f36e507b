func.func @main(%arg0: tensor<1x8x8x3xf32>) -> tensor<1x8x8x4xf32> {
  %k = stablehlo.constant dense<0.5> : tensor<3x3x3x4xf32>
  %big = stablehlo.constant dense<2.0> : tensor<4096x4096x64xf32>
  %s = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %0 = stablehlo.convolution(%arg0, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x4xf32>) -> tensor<1x8x8x4xf32>
  %sp = stablehlo.constant dense<3.0> : tensor<1x8x8x4xf32>
  %1 = stablehlo.multiply %0, %sp : tensor<1x8x8x4xf32>
  %2 = stablehlo.add %1, %sp : tensor<1x8x8x4xf32>
  return %2 : tensor<1x8x8x4xf32>
}
