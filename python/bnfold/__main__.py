"""`python -m bnfold` is `bnfold-opt`."""

from bnfold.cli import run

run()
