// The pip `filecheck` has had bugs in CHECK-NOT and CHECK-LABEL. This proves
// that both fail when they must, on real bnfold output, and that each failure
// is the intended one (the error names the directive), not a usage error.
//
// Positive control: the same directives, used correctly, pass.
// RUN: %bnfold-opt %s | %filecheck %s --check-prefix=GOOD
//
// CHECK-NOT as the first directive, the string is before the first match.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=NOTFIRST 2>&1 | %filecheck %s --check-prefix=ERR-NOTFIRST
// CHECK-NOT between two matches.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=NOTMID 2>&1 | %filecheck %s --check-prefix=ERR-NOTMID
// CHECK-NOT as the last directive, the string is after the last match.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=NOTEND 2>&1 | %filecheck %s --check-prefix=ERR-NOTEND
// CHECK-NOT inside the last CHECK-LABEL block.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=NOTINLABEL 2>&1 | %filecheck %s --check-prefix=ERR-NOTINLABEL
// CHECK-NOT just before a CHECK-LABEL (the string is in the block it closes).
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=NOTBEFORELABEL 2>&1 | %filecheck %s --check-prefix=ERR-NOTBEFORELABEL
// A CHECK after a CHECK-LABEL must not match past the next label.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=LABELSCOPE 2>&1 | %filecheck %s --check-prefix=ERR-LABELSCOPE
// A CHECK-LABEL that is not in the input.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=LABELMISSING 2>&1 | %filecheck %s --check-prefix=ERR-LABELMISSING
// CHECK-LABELs out of order.
// RUN: %bnfold-opt %s | not %filecheck %s --check-prefix=LABELORDER 2>&1 | %filecheck %s --check-prefix=ERR-LABELORDER
//
// Input (bnfold leaves both functions as they are):
//   func.func @first  ... stablehlo.abs ... return
//   func.func @second ... stablehlo.exponential ... return

// GOOD-LABEL: @first
// GOOD-NOT:     stablehlo.exponential
// GOOD:         stablehlo.abs
// GOOD-NOT:     stablehlo.exponential
// GOOD:         return
// GOOD-LABEL: @second
// GOOD-NOT:     stablehlo.abs
// GOOD:         stablehlo.exponential
// GOOD-NOT:     stablehlo.abs

// NOTFIRST-NOT: stablehlo.abs
// NOTFIRST:     @second
// ERR-NOTFIRST: error: NOTFIRST{{-}}NOT: excluded string found in input ('stablehlo.abs')

// NOTMID:       @first
// NOTMID-NOT:   stablehlo.abs
// NOTMID:       return
// ERR-NOTMID: error: NOTMID{{-}}NOT: excluded string found in input ('stablehlo.abs')

// NOTEND:       @first
// NOTEND-NOT:   stablehlo.exponential
// ERR-NOTEND: error: NOTEND{{-}}NOT: excluded string found in input ('stablehlo.exponential')

// NOTINLABEL-LABEL: @first
// NOTINLABEL-LABEL: @second
// NOTINLABEL-NOT:   stablehlo.exponential
// ERR-NOTINLABEL: error: NOTINLABEL{{-}}NOT: excluded string found in input ('stablehlo.exponential')

// NOTBEFORELABEL-LABEL: @first
// NOTBEFORELABEL-NOT:   stablehlo.abs
// NOTBEFORELABEL-LABEL: @second
// ERR-NOTBEFORELABEL: error: NOTBEFORELABEL{{-}}NOT: excluded string found in input ('stablehlo.abs')

// LABELSCOPE-LABEL: @first
// LABELSCOPE:       stablehlo.exponential
// LABELSCOPE-LABEL: @second
// ERR-LABELSCOPE: error: Couldn't match "stablehlo.exponential"

// LABELMISSING-LABEL: @first
// LABELMISSING-LABEL: @third
// ERR-LABELMISSING: error: LABELMISSING{{-}}LABEL: Could not find label '@third' in input

// LABELORDER-LABEL: @second
// LABELORDER-LABEL: @first
// ERR-LABELORDER: error: LABELORDER{{-}}LABEL: Could not find label '@first' in input

func.func @first(%x: tensor<2xf32>) -> tensor<2xf32> {
  %y = stablehlo.abs %x : tensor<2xf32>
  return %y : tensor<2xf32>
}

func.func @second(%x: tensor<2xf32>) -> tensor<2xf32> {
  %y = stablehlo.exponential %x : tensor<2xf32>
  return %y : tensor<2xf32>
}
