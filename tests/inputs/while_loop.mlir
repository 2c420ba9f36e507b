func.func @main(%arg0: tensor<1x8x8x4xf32>) -> tensor<1x8x8x4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.while(%i = %c0, %x = %arg0) : tensor<i32>, tensor<1x8x8x4xf32>
    cond {
      %n = stablehlo.constant dense<3> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %k = stablehlo.constant dense<0.125> : tensor<3x3x4x4xf32>
      %s = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x4xf32>, tensor<3x3x4x4xf32>) -> tensor<1x8x8x4xf32>
      %1 = "stablehlo.batch_norm_inference"(%0, %s, %s, %s, %s) {epsilon = 1.0e-05 : f32, feature_index = 3 : i64} : (tensor<1x8x8x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<1x8x8x4xf32>
      %j = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %j, %1 : tensor<i32>, tensor<1x8x8x4xf32>
    }
  return %r#1 : tensor<1x8x8x4xf32>
}
