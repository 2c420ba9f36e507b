module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3x16x16xf32>) -> (tensor<2x8x16x16xf32> {jax.result_info = "result"}) {
    %cst = stablehlo.constant dense<"0x09FA00BD7BBB1B3E6A4424BE3C550C3CCF3A213E17D83C3D0C982DBDE37362BD2A7B1BBE24D2FF3D147A253EC714553D359D18BE0FF22EBE55C237BE644BB63D511A733DA17E32BEE68D98BB9318383EE4742FBD12252FBEBC1B76BC99B91A3ED4BDFA3DCA5E32BEF5F9583DF8F40C3EA2092B3E9493AE3D1F2ED73D5C6A09BE9ABF0CBEC040BC3D8F2DB2BD0490013E9B9167BD68B6A63CFABB16BCCEB374BDF1C50EBEDF4F1EBDD34897BDBB093FBE9CDA4DBD81BF2A3EFC4D953D5121E8BD99C3FD3D800909BE0F7312BD8A31853C96AD07BC3D7FBEBD4E8EF1BD2CEC943C0AC22FBE42A3F5BDDF0A04BE1F9CEBBD395B3CBEC271923CE81697BD062F133E7EDA8D3DA280133CFF62033EAD5105BEDDA95ABDECB70DBDCB8B7E3C8E91033D195115BEB0EA95BC3C53B63D9D50D33D4EFF02BEF3E4F0BD378142BE18BEE53CCA920D3EC8684E3DF2BC7BBD5574873D4F480E3ED084243E0B14053DB443323EAE30013E4A621E3EE091C83CAB470E3EBF2740BE77432D3EF0BA003E8D17B6BC761AA83DE63D21BE14F0EFBD12E25C3D700319BEB0855B3D6BB536BE7A4CA13C5E4E15BE7DFC87BCF9212CBED7C79ABD1B8922BEBDB0B6BD47DF063CEBD317BE732F093DE260E2BD4EC1383C5FBB7DBD327D903C578BDBBD0BE0B7BCEBA7133EE4472B3ED668243CEF6E463D38781B3EF04790BDA7A91BBE1D5A043E313C0F3D4CA0C6BC6275283EBAC0C6BDA334B3BB934E0EBE32A5213D195F7E3D5F12A33DFFB0CE375A7BF93C71B706BD57D3DB3D023F933DD80033BEA83893BD62F4D2BDAA9FBE3C444303BE74C7133DA7411CBEB33E07BE3F8CC4BDB22B1B3EE6D9F6BDE095D0BDFB43643D2F5D0A3E2917153EA4C39CBD48D4023C3A13D03DB2E01B3E3C7B52BD2FC32A3DC19B233EBCA3893D3B9B053E98A8663DA8C53BBD0EE3A6BD9384B6BC9B801DBD75A22C3E617EEA3CB808ADBCCB11953D7E83EC3B9422713DB5D7CB3DA87F21BE3ECAE1BD9501B9BD8B284D3D35553A3EA0120CBEF41E8EBD3B713FBE1DD2FBBDFCDFB93DB817DA3D63E0C3BDA53DDCBD8C286ABC793E1F3E1B6F91BCF9F60F3E019B143DD07D563DADEDC13CFF31973D51DE5C3D41735A3DDA9B3E3E12DB063ECD8AF6BD384E213E66B4FEBD0FFBBB3D7303103EDDBBFF3C2DF4E23DBC47243B447A7CBD6121DC3D224430BE6CD2213DFD790B3EC660D23B"> : tensor<8x3x3x3xf32>
    %cst_0 = stablehlo.constant dense<[-0.647608399, 4.875950e-02, 0.36785391, 0.753962934, 0.171731442, 0.763753235, -0.457255423, -0.218513831]> : tensor<8xf32>
    %cst_1 = stablehlo.constant dense<[1.40199637, 1.27348506, 1.4681716, 0.952979564, 1.96809614, 1.72625959, 0.870667159, 1.94549584]> : tensor<8xf32>
    %cst_2 = stablehlo.constant dense<[0.95807451, 1.00624394, 1.0382756, 1.17045248, 0.814983785, 1.20714486, 0.963958442, 1.43886125]> : tensor<8xf32>
    %cst_3 = stablehlo.constant dense<[0.134175822, -0.549355567, -0.0195813943, 0.281977475, -0.0836294814, 0.243467078, -0.157999218, -0.156724378]> : tensor<8xf32>
    %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 2, 3, 4] : (tensor<2x3x16x16xf32>) -> tensor<2x1x3x16x16xf32>
    %1 = stablehlo.reshape %0 : (tensor<2x1x3x16x16xf32>) -> tensor<2x3x16x16xf32>
    %2 = stablehlo.convolution(%1, %cst) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x3x16x16xf32>, tensor<8x3x3x3xf32>) -> tensor<2x8x16x16xf32>
    %3 = stablehlo.reshape %2 : (tensor<2x8x16x16xf32>) -> tensor<2x1x8x16x16xf32>
    %4 = stablehlo.reshape %3 : (tensor<2x1x8x16x16xf32>) -> tensor<2x8x16x16xf32>
    %5 = stablehlo.broadcast_in_dim %cst_0, dims = [0] : (tensor<8xf32>) -> tensor<8x1x1xf32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x1x1xf32>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<2x8x16x16xf32>
    %8 = stablehlo.subtract %4, %7 : tensor<2x8x16x16xf32>
    %cst_4 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %10 = stablehlo.add %cst_1, %9 : tensor<8xf32>
    %11 = stablehlo.sqrt %10 : tensor<8xf32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0] : (tensor<8xf32>) -> tensor<8x1x1xf32>
    %13 = stablehlo.broadcast_in_dim %12, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x1x1xf32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<2x8x16x16xf32>
    %15 = stablehlo.divide %8, %14 : tensor<2x8x16x16xf32>
    %16 = stablehlo.broadcast_in_dim %cst_2, dims = [0] : (tensor<8xf32>) -> tensor<8x1x1xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x1x1xf32>
    %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<2x8x16x16xf32>
    %19 = stablehlo.multiply %15, %18 : tensor<2x8x16x16xf32>
    %20 = stablehlo.broadcast_in_dim %cst_3, dims = [0] : (tensor<8xf32>) -> tensor<8x1x1xf32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [1, 2, 3] : (tensor<8x1x1xf32>) -> tensor<1x8x1x1xf32>
    %22 = stablehlo.broadcast_in_dim %21, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<2x8x16x16xf32>
    %23 = stablehlo.add %19, %22 : tensor<2x8x16x16xf32>
    return %23 : tensor<2x8x16x16xf32>
  }
}
