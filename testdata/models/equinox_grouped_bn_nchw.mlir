module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x8x16x16xf32>) -> (tensor<1x16x16x16xf32> {jax.result_info = "result"}) {
    %cst = stablehlo.constant dense<"0x28D6A83E869683BE669B563E165BFB3D3B9E3F3EB8789C3EF6F8083E868152BEABC6403D76120C3E004272BD20764C3EEB903A3E16FE66BEB0974B3E7BAC31BE362BF8BD6B94813E00521ABCB617943ED61B41BE40FA803D50D5943EA6B354BE2027A8BE16CD0CBE60AF55BECB8B893E4BD0803E40E8843D8BF638BEE6B54A3EABC78D3EB02641BE560989BE56644CBE8BBDD03D76F8773E4BCD913D46C6203E50B05CBE464E423E7B1172BE5683663E80BCD23C0077CEBC26D933BEDB034BBE4B426BBE06705ABED6A9BE3D0B8F33BE6BD9363DC3F39C3EA08737BE0EC1A9BE1EC8953E583E833EE8B0A4BE6B73C8BD5055353E809910BD56C5BF3DE0518C3D809F823D169AA5BE6B2A093E9B121FBE00C7FBBD431294BE800B913D63B78DBE0BEA58BEAB75663D2B0AB3BDF68AFF3D8B389BBE6B71923D16A7283ED6F27ABE506B8E3E1BEF7FBEABDE4D3E8058B53DEBF913BED68AFF3D502306BE2E458FBE8B9E1BBE70CD5C3EB6CE18BE00EE933B80AC783ECB700EBE80CD023D6615763E0B8097BDAB2F70BDC04995BEFE718ABE8B28C13D43EF8ABE003FE83D0808A7BEF64122BEAB301D3ECB916D3EFB8A05BEFE5D913E36D7903DB0D30ABED6B0E53CD009A7BEBB6461BEC617483ED3B18CBED6EE8A3C4B6D27BEE6F053BEEBAC003D86929BBEC6965C3E4B268A3D564428BCE6B7673E8EAB8E3E36FC41BE3EF795BE46AB463E00EEE2BD2B169FBE6026813E409A113EB8C99DBE30FCA83E08DA96BE8E749ABEE031523E800246BD9BDE063EC64E03BE60E628BE93B8923EEBFDDFBD"> : tensor<16x1x3x3xf32>
    %cst_0 = stablehlo.constant dense<[[[-0.144484147]], [[-0.0373218544]], [[0.0321502127]], [[-0.285204202]], [[-0.115625486]], [[-0.185153008]], [[0.0716419891]], [[-0.0435298905]], [[0.0160576794]], [[-0.026914373]], [[0.105738506]], [[0.0547621958]], [[0.0755160376]], [[0.170469657]], [[-0.0304916818]], [[0.108026721]]]> : tensor<16x1x1xf32>
    %cst_1 = stablehlo.constant dense<[-0.459958583, -0.713019788, 0.533101201, 0.427257717, 0.0680132359, -0.193604544, 0.607483565, 0.256991565, -0.0685574114, 1.23029411, -0.379253119, 0.411147326, 0.383809775, 0.241575807, 0.818313419, -0.566900313]> : tensor<16xf32>
    %cst_2 = stablehlo.constant dense<[1.65421867, 0.62505573, 1.4244585, 1.54141676, 1.12242258, 1.16985834, 1.89843905, 1.21679926, 1.71427107, 1.21979678, 1.87049484, 0.631341815, 0.84957832, 1.69613612, 0.774265348, 0.705753803]> : tensor<16xf32>
    %cst_3 = stablehlo.constant dense<[8.146420e-01, 1.15703869, 1.46850193, 1.39534771, 0.948482096, 0.770423114, 0.832139849, 1.00752485, 1.17500257, 0.531558096, 0.56413281, 1.05576932, 0.812929749, 1.10311091, 0.684992552, 0.626531363]> : tensor<16xf32>
    %cst_4 = stablehlo.constant dense<[-0.135860503, -0.243388832, 0.412129045, -0.320823491, -0.244358212, -0.61148572, 0.556186318, 0.297260523, 0.181338802, 0.0426965579, -0.623453676, 0.215198845, 0.510250032, -0.342006236, 0.16653946, -0.145692647]> : tensor<16xf32>
    %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 2, 3, 4] : (tensor<1x8x16x16xf32>) -> tensor<1x1x8x16x16xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x1x8x16x16xf32>) -> tensor<1x8x16x16xf32>
    %2 = stablehlo.convolution(%1, %cst) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 8 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<1x8x16x16xf32>, tensor<16x1x3x3xf32>) -> tensor<1x16x16x16xf32>
    %3 = stablehlo.reshape %2 : (tensor<1x16x16x16xf32>) -> tensor<1x1x16x16x16xf32>
    %4 = stablehlo.reshape %3 : (tensor<1x1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
    %5 = stablehlo.broadcast_in_dim %cst_0, dims = [1, 2, 3] : (tensor<16x1x1xf32>) -> tensor<1x16x1x1xf32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %7 = stablehlo.add %4, %6 : tensor<1x16x16x16xf32>
    %8 = stablehlo.broadcast_in_dim %cst_1, dims = [0] : (tensor<16xf32>) -> tensor<16x1x1xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [1, 2, 3] : (tensor<16x1x1xf32>) -> tensor<1x16x1x1xf32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %11 = stablehlo.subtract %7, %10 : tensor<1x16x16x16xf32>
    %cst_5 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<16xf32>
    %13 = stablehlo.add %cst_2, %12 : tensor<16xf32>
    %14 = stablehlo.sqrt %13 : tensor<16xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [0] : (tensor<16xf32>) -> tensor<16x1x1xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [1, 2, 3] : (tensor<16x1x1xf32>) -> tensor<1x16x1x1xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %18 = stablehlo.divide %11, %17 : tensor<1x16x16x16xf32>
    %19 = stablehlo.broadcast_in_dim %cst_3, dims = [0] : (tensor<16xf32>) -> tensor<16x1x1xf32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [1, 2, 3] : (tensor<16x1x1xf32>) -> tensor<1x16x1x1xf32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %22 = stablehlo.multiply %18, %21 : tensor<1x16x16x16xf32>
    %23 = stablehlo.broadcast_in_dim %cst_4, dims = [0] : (tensor<16xf32>) -> tensor<16x1x1xf32>
    %24 = stablehlo.broadcast_in_dim %23, dims = [1, 2, 3] : (tensor<16x1x1xf32>) -> tensor<1x16x1x1xf32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0, 1, 2, 3] : (tensor<1x16x1x1xf32>) -> tensor<1x16x16x16xf32>
    %26 = stablehlo.add %22, %25 : tensor<1x16x16x16xf32>
    return %26 : tensor<1x16x16x16xf32>
  }
}
