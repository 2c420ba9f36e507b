module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x8x16x16xf32>) -> (tensor<1x16x16x16xf32> {jax.result_info = "result"}) {
    %cst = stablehlo.constant dense<"0xE3032E3EAB9B8F3EEB36EEBC9E48A1BEC6FF13BE0BAC653E06C18BBD166F57BE9365093ECE1507BE9369A03E26DEA0BE06FBFDBDF0C89E3EE8DB15BE162D0F3DAB169B3A505B353E2B872C3D8AEA843EF669423EDFE88A3E0FD7A3BE2BCE47BE407805BDD32778BE3B1A0BBE03D319BEB070E23D607250BD8E5F69BE9B89CEBDF3E5313ECA138ABE009F343ECBB1D53D066B7A3EE00F63BDDBCE0E3EF3BF333E56AD823E56473D3BC04F823EF843983EA7F9A2BE302652BEE3C81CBEEC428F3E7B3A36BE26F17DBE7A99993E162419BE987C5B3E2BAA5B3E50DE9ABD0BF54E3EE85F42BE5E3A6CBEB68E3BBE4B698D3E5680743C1459A23E56A9DE3C2A9DA7BE6B4C2D3E7CD7A6BEA0BAA83E4F4798BEF37772BE6BDB9D3D369B92BDD03F56BE6B61343E808033BCB81457BE08F5A63E80630E3DBCC5883ED067993EB328773EF35DA83E60F37E3D9025F23DF6D49CBDD06DA1BD02BA8FBE2B7D263E2B9C4ABE267E093EA0CC21BE2A8C853EC028E73C40A536BDD79695BE471D9FBE4BF9093D60E86BBE2610D33DFE410A3E3C8F97BEC0E7A8BE0BDEA2BEFEC06CBEC097433E66FD30BECBAE993D4E44A8BE8B2CE3BD70D5BB3D3312003EAADA9EBED6E5963D6B2CA9BC6BA87EBE009CB1BD00BECE3BF69E9C3E10D893BE966CC93CABEFD53BAB387DBEB62F773E1BC8A13D20FD2BBE1B718FBEC0B1D8BD570288BE7BB7883DDE228ABE9CA5AA3ECBEF523D66BA71BE865273BE9059F8BDABCFEDBD567AA6BDABDE973BE8A97D3EAB2B6BBDABD9CC3D3BDEE43D50801BBE78AD413ECBA7A93E"> : tensor<16x1x3x3xf32>
    %cst_0 = stablehlo.constant dense<[0.144754291, 0.123516761, -0.183929801, -0.134791344, -0.322648972, -0.133416772, 0.187115431, 0.315615475, -0.177888244, 0.2422795, 0.0502316169, 0.0900067091, -0.220551535, 0.173325747, -1.885620e-01, 0.207753986]> : tensor<16xf32>
    %cst_1 = stablehlo.constant dense<[1.31895781, 1.45589387, 1.21993065, 0.904207468, 0.844939231, 0.67751205, 0.885492325, 1.02740717, 1.855090e+00, 1.83868587, 1.24463749, 1.98399127, 1.19492018, 1.89950609, 0.732693254, 1.02010763]> : tensor<16xf32>
    %cst_2 = stablehlo.constant dense<[-9.683650e-01, 0.520457745, -0.264604539, 0.0593257584, -0.33251217, 0.440345913, -0.818360328, 0.0934525281, 0.00730897533, 0.130011618, 0.739216924, -0.125045344, -0.203698218, 0.294295669, 1.03949785, 0.278247833]> : tensor<16xf32>
    %cst_3 = stablehlo.constant dense<[1.48207486, 1.4527986, 1.03527558, 0.971973836, 1.21730065, 1.37357044, 0.778518557, 0.980208277, 0.670427978, 1.13599145, 0.78044492, 0.517310917, 0.873889148, 1.12750614, 1.06596279, 0.754282474]> : tensor<16xf32>
    %cst_4 = stablehlo.constant dense<[-0.136321858, -0.29760462, -0.130838647, 0.502805948, 0.0824117064, 0.170354843, 0.204207346, -0.115602426, 0.394110382, -0.608994066, 0.463842064, -3.179500e-03, 0.0854998603, 0.50292635, 0.18875286, 0.209848627]> : tensor<16xf32>
    %0 = stablehlo.convolution(%arg0, %cst) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 8 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<1x8x16x16xf32>, tensor<16x1x3x3xf32>) -> tensor<1x16x16x16xf32>
    %1 = stablehlo.reshape %cst_0 : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %3 = stablehlo.add %0, %2 : tensor<1x16x16x16xf32>
    %4 = stablehlo.reshape %cst_1 : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
    %cst_5 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<1x16x1x1xf32>
    %6 = stablehlo.add %4, %5 : tensor<1x16x1x1xf32>
    %7 = stablehlo.rsqrt %6 : tensor<1x16x1x1xf32>
    %8 = stablehlo.reshape %cst_2 : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %10 = stablehlo.subtract %3, %9 : tensor<1x16x16x16xf32>
    %11 = stablehlo.broadcast_in_dim %7, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %12 = stablehlo.multiply %10, %11 : tensor<1x16x16x16xf32>
    %13 = stablehlo.reshape %cst_3 : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %15 = stablehlo.multiply %12, %14 : tensor<1x16x16x16xf32>
    %16 = stablehlo.reshape %cst_4 : (tensor<16xf32>) -> tensor<1x16x1x1xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %18 = stablehlo.add %15, %17 : tensor<1x16x16x16xf32>
    return %18 : tensor<1x16x16x16xf32>
  }
}
