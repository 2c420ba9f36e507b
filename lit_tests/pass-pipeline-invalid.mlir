// Pass-pipeline syntax errors (MLIR's grammar: `name{key=value key}`, values quoted,
// braced or comma-separated lists): a clear error that points at the column, exit 1,
// before the input is read.
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{{}})' 2>&1 | %filecheck %s --check-prefix=BRACE
// BRACE: bnfold-opt: --pass-pipeline: error: expected an option name, found '{' (column 28)
// BRACE-NEXT: builtin.module(bnfold-fold{{[{]}}{}})
// BRACE-NEXT: {{^ +\^$}}
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{quantize-weights=})' 2>&1 | %filecheck %s --check-prefix=EMPTY
// EMPTY: error: expected a value after 'quantize-weights=', found '}' (column 45)
// EMPTY-NOT: true
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{quantize-weights})' 2>&1 | %filecheck %s --check-prefix=NOVALUE
// NOVALUE: bnfold-fold{quantize-weights}: error: it needs a value: quantize-weights=int8 (one of int4,
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{disable=forward-affine,nope})' 2>&1 | %filecheck %s --check-prefix=NAME
// NAME: bnfold-fold{disable}: error: unknown pattern name(s) nope; known: {{.*}} (column 51)
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{disable="forward-affine})' 2>&1 | %filecheck %s --check-prefix=QUOTE
// QUOTE: error: unterminated '"': expected a closing '"' (column 36)
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{colour=blue})' 2>&1 | %filecheck %s --check-prefix=OPTION
// OPTION: error: bnfold-fold has no option 'colour'; its options: absorb-high-bias, {{.*}} (column 28)
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold,cse' 2>&1 | %filecheck %s --check-prefix=PAREN
// PAREN: error: expected ',' or ')' after 'cse', found the end of the pipeline (column 31)
// A fold flag beside --pass-pipeline applies to no pass: an error that says how to write it.
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold,cse)' --quantize-weights int8 --equalize 2>&1 | %filecheck %s --check-prefix=FLAG
// FLAG: bnfold-opt: --equalize: error: with --pass-pipeline, the pipeline's passes take the fold options: --equalize, --quantize-weights would apply to no pass. Write them in the pipeline as pass options: 'bnfold-fold{equalize=true quantize-weights=int8}'
// A function to skip that the input lacks lists the functions there are.
// RUN: not %bnfold-opt %s --pass-pipeline 'builtin.module(bnfold-fold{skip-func=mian})' 2>&1 | %filecheck %s --check-prefix=SKIP
// SKIP: bnfold-opt: --pass-pipeline: bnfold-fold{skip-func}: error: the module has no function @mian; its functions: @main (column 38)
// SKIP-NEXT: builtin.module(bnfold-fold{skip-func=mian})
// SKIP-NEXT: {{^ {39}\^$}}

func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  return %x : tensor<2xf32>
}
