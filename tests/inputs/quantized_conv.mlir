func.func @main(%arg0: tensor<1x8x8x3x!quant.uniform<i8:f32, 0.1>>) -> tensor<1x8x8x4x!quant.uniform<i32:f32, 0.01>> {
  %k = stablehlo.constant() {value = dense<2> : tensor<3x3x3x4xi8>} : () -> tensor<3x3x3x4x!quant.uniform<i8:f32, 0.1>>
  %0 = stablehlo.convolution(%arg0, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3x!quant.uniform<i8:f32, 0.1>>, tensor<3x3x3x4x!quant.uniform<i8:f32, 0.1>>) -> tensor<1x8x8x4x!quant.uniform<i32:f32, 0.01>>
  return %0 : tensor<1x8x8x4x!quant.uniform<i32:f32, 0.01>>
}
