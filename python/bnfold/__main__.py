"""`python -m bnfold` is `bnfold-opt`."""

import sys

from bnfold.cli import main

sys.exit(main())
