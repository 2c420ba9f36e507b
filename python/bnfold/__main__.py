"""`python -m bnfold` is `bnfold-opt`."""

import gc

gc.disable()  # before the imports as well: see bnfold.cli.run

from bnfold.cli import run  # noqa: E402

run()
