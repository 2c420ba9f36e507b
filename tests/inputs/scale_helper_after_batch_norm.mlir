// Fuzzer seed 11 (grouped stratum): an f16 grouped convolution, a batch_norm_inference, a
// bias and a reshape, then a private helper that scales by a scalar, then a dot_general.
module @fuzz {
  func.func @main(%arg0: tensor<4x3x6x2xf32>) -> (tensor<1x24x2x2xf16>) {
    %v1 = "stablehlo.constant"() {value = dense<"0x34429640A60C713E21E1783C"> : tensor<3xf32>} : () -> tensor<3xf32> loc("bn0")
    %v2 = "stablehlo.broadcast_in_dim"(%v1) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<4x3x6x2xf32> loc("bn0")
    %v3 = "stablehlo.multiply"(%arg0, %v2) : (tensor<4x3x6x2xf32>, tensor<4x3x6x2xf32>) -> tensor<4x3x6x2xf32> loc("bn0")
    %v4 = "stablehlo.constant"() {value = dense<"0x6FA7C5C096E19AC08083E3C0"> : tensor<3xf32>} : () -> tensor<3xf32> loc("bn0")
    %v5 = "stablehlo.broadcast_in_dim"(%v4) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<4x3x6x2xf32> loc("bn0")
    %v6 = "stablehlo.add"(%v3, %v5) : (tensor<4x3x6x2xf32>, tensor<4x3x6x2xf32>) -> tensor<4x3x6x2xf32> loc("bn0")
    %v7 = "stablehlo.convert"(%v6) : (tensor<4x3x6x2xf32>) -> tensor<4x3x6x2xf16> loc("cvt0")
    %v8 = "stablehlo.constant"() {value = dense<"0x32BEFF3D19B9A4BF8C422B481EC697C8224490C235C3F742E13B50487EB715460D4AB3C87343DEC80145BB389545C4BA2CC29DC974BD5947E1B762C2B6B90ACB74B521C8D6C919CA07C7DFC737C8924165C828C924C1502FAD4A0EC347497739E7C5D346294042C968C94646"> : tensor<1x6x3x3xf16>} : () -> tensor<1x6x3x3xf16>
    %v9 = "stablehlo.convolution"(%v7, %v8) {batch_group_count = 1 : i64, feature_group_count = 3 : i64, dimension_numbers = #stablehlo.conv<[0, f, b, 1]x[i, o, 1, 0]->[b, 0, f, 1]>, window_strides = array<i64: 1, 1>, padding = dense<[[1, 1], [1, 1]]> : tensor<2x2xi64>, lhs_dilation = array<i64: 1, 1>, rhs_dilation = array<i64: 1, 1>} : (tensor<4x3x6x2xf16>, tensor<1x6x3x3xf16>) -> tensor<6x4x6x2xf16> loc("layer1")
    %v10 = "stablehlo.constant"() {value = dense<"0x70C290363247AD40E542F1AF"> : tensor<6xf16>} : () -> tensor<6xf16> loc("bn1")
    %v11 = "stablehlo.constant"() {value = dense<"0xEA441BB0A2487E4A2A4EA539"> : tensor<6xf16>} : () -> tensor<6xf16> loc("bn1")
    %v12 = "stablehlo.constant"() {value = dense<"0x8BAF5539963E9646E9B93FBF"> : tensor<6xf16>} : () -> tensor<6xf16> loc("bn1")
    %v13 = "stablehlo.constant"() {value = dense<"0x5F56AC5878571259465CA759"> : tensor<6xf16>} : () -> tensor<6xf16> loc("bn1")
    %v14 = "stablehlo.batch_norm_inference"(%v9, %v10, %v11, %v12, %v13) {epsilon = 1.000000047e-03 : f32, feature_index = 2 : i64} : (tensor<6x4x6x2xf16>, tensor<6xf16>, tensor<6xf16>, tensor<6xf16>, tensor<6xf16>) -> tensor<6x4x6x2xf16> loc("bn1")
    %v15 = "stablehlo.constant"() {value = dense<"0x3FBBFA484BC718B4AC4B40C5"> : tensor<6xf16>} : () -> tensor<6xf16> loc("bias1")
    %v16 = "stablehlo.broadcast_in_dim"(%v15) {broadcast_dimensions = array<i64: 2>} : (tensor<6xf16>) -> tensor<6x4x6x2xf16> loc("bias1")
    %v17 = "stablehlo.add"(%v14, %v16) : (tensor<6x4x6x2xf16>, tensor<6x4x6x2xf16>) -> tensor<6x4x6x2xf16> loc("bias1")
    %v18 = "stablehlo.reshape"(%v17) : (tensor<6x4x6x2xf16>) -> tensor<24x6x2xf16>
    %v19 = "func.call"(%v18) {callee = @block0} : (tensor<24x6x2xf16>) -> tensor<1x24x6x2xf16>
    %v20 = "stablehlo.constant"() {value = dense<"0x6A3672B497BC6B283131D53212B87E29BBB16C2A14B42DB0"> : tensor<2x6xf16>} : () -> tensor<2x6xf16>
    %v21 = "stablehlo.dot_general"(%v19, %v20) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>} : (tensor<1x24x6x2xf16>, tensor<2x6xf16>) -> tensor<1x24x2x2xf16> loc("layer2")
    %v22 = "stablehlo.constant"() {value = dense<"0xC652F2CD"> : tensor<2xf16>} : () -> tensor<2xf16> loc("bias2")
    %v23 = "stablehlo.broadcast_in_dim"(%v22) {broadcast_dimensions = array<i64: 3>} : (tensor<2xf16>) -> tensor<1x24x2x2xf16> loc("bias2")
    %v24 = "stablehlo.add"(%v21, %v23) : (tensor<1x24x2x2xf16>, tensor<1x24x2x2xf16>) -> tensor<1x24x2x2xf16> loc("bias2")
    "func.return"(%v24) : (tensor<1x24x2x2xf16>) -> ()
  }
  func.func private @block0(%block0_a0: tensor<24x6x2xf16>) -> (tensor<1x24x6x2xf16>) {
    %h1 = "stablehlo.broadcast_in_dim"(%block0_a0) {broadcast_dimensions = array<i64: 1, 2, 3>} : (tensor<24x6x2xf16>) -> tensor<1x24x6x2xf16>
    %h2 = "stablehlo.constant"() {value = dense<"0x294E"> : tensor<f16>} : () -> tensor<f16>
    %h3 = "stablehlo.broadcast_in_dim"(%h2) {broadcast_dimensions = array<i64>} : (tensor<f16>) -> tensor<1x24x6x2xf16>
    %h4 = "stablehlo.multiply"(%h1, %h3) : (tensor<1x24x6x2xf16>, tensor<1x24x6x2xf16>) -> tensor<1x24x6x2xf16>
    "func.return"(%h4) : (tensor<1x24x6x2xf16>) -> ()
  }
}
