// The RUN lines run the bnfold of this checkout (lit.cfg.py pins it first on PYTHONPATH),
// never whichever bnfold happens to be installed: with an installed copy, a dropped
// `- mean` once passed the whole lit suite.

// RUN: %PYTHON -c "import bnfold, os, sys; got = os.path.realpath(os.path.dirname(bnfold.__file__)); want = os.path.realpath(os.path.join(sys.argv[1], 'bnfold')); sys.exit(0 if got == want else 'bnfold imported from ' + got + ', not ' + want)" %bnfold-src
// RUN: %bnfold-opt %s -o /dev/null --report - | %filecheck %s

// ... also after a builtin that resets PYTHONPATH in lit 23:
// RUN: diff %s %s
// RUN: %PYTHON -c "import bnfold, os, sys; got = os.path.realpath(os.path.dirname(bnfold.__file__)); want = os.path.realpath(os.path.join(sys.argv[1], 'bnfold')); sys.exit(0 if got == want else 'bnfold imported from ' + got + ', not ' + want)" %bnfold-src
// RUN: %bnfold-opt %s -o /dev/null --report - | %filecheck %s

// CHECK-LABEL: "folds": [
// CHECK:       "norm_op": "stablehlo.multiply"
func.func @environment(%x: tensor<1x2xf32>) -> tensor<1x2xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<1x2xf32>, tensor<2x2xf32>) -> tensor<1x2xf32>
  %s = stablehlo.constant dense<[[0.5, 2.0]]> : tensor<1x2xf32>
  %z = stablehlo.multiply %y, %s : tensor<1x2xf32>
  return %z : tensor<1x2xf32>
}
