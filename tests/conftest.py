"""The suite runs bnfold's driver in checking mode (`bnfold.driver.CHECKING`): every pattern's
`roots`, `match` and `plan` are checked not to change the IR, `apply` only to create ops,
in-process and in every `bnfold` subprocess the tests start (lit included)."""

from __future__ import annotations

import os

os.environ["BNFOLD_CHECK_RULES"] = "1"  # before bnfold is imported; subprocesses inherit it

from bnfold import driver  # noqa: E402

driver.CHECKING = True
