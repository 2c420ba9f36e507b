func.func @main(%arg0: tensor<1x8x8x3xi8>) -> tensor<1x8x8x4xi32> {
  %k = stablehlo.constant dense<2> : tensor<3x3x3x4xi8>
  %s = stablehlo.constant dense<[1, 2, 3, 4]> : tensor<4xi32>
  %0 = stablehlo.convolution(%arg0, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xi8>, tensor<3x3x3x4xi8>) -> tensor<1x8x8x4xi32>
  %b = stablehlo.broadcast_in_dim %s, dims = [3] : (tensor<4xi32>) -> tensor<1x8x8x4xi32>
  %1 = stablehlo.multiply %0, %b : tensor<1x8x8x4xi32>
  %2 = stablehlo.add %1, %b : tensor<1x8x8x4xi32>
  return %2 : tensor<1x8x8x4xi32>
}
