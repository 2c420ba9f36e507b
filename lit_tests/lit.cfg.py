# lit configuration: `lit lit_tests` (pip lit + pip filecheck).
#
# The RUN lines test the bnfold of *this checkout*, never an installed one: its source
# directory is put first on PYTHONPATH by every substitution (an `env PYTHONPATH=...`
# prefix, so a builtin such as lit's `diff`, which resets PYTHONPATH for the rest of a
# test file in lit 23, cannot undo it), and lit_tests/environment.mlir checks it.
import os
import shlex
import sys

import lit.formats

config.name = "bnfold"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# python/ in a checkout; src/ in the copy tools/mutation.py makes (mutmut wants src/).
source = next((d for d in (os.path.join(root, "python"), os.path.join(root, "src"))
               if os.path.isfile(os.path.join(d, "bnfold", "__init__.py"))), None)
if source is None:
    lit_config.fatal(f"no bnfold package under {root}/python")
pythonpath = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
env = f"env PYTHONPATH={shlex.quote(pythonpath)}"
python = shlex.quote(sys.executable)
config.substitutions.append(("%PYTHON", f"{env} {python}"))
# Run the tool through the interpreter so tests do not depend on entry points.
config.substitutions.append(("%bnfold-opt", f"{env} {python} -m bnfold -q"))
config.substitutions.append(("%bnfold-src", shlex.quote(source)))
# pip's filecheck ignores FILECHECK_OPTS; pass flags here. Run as a module of this
# interpreter, with the same PYTHONPATH prefix: a filecheck found only on PYTHONPATH (a
# `pip install --target` directory) is then still found after a builtin that resets it.
config.substitutions.append(("%filecheck", f"{env} {python} -m filecheck"))
config.substitutions.append(("%testdata", shlex.quote(os.path.join(root, "testdata"))))
config.environment["PYTHONPATH"] = pythonpath
config.environment["PATH"] = os.environ.get("PATH", "")
# The driver checks its rules (bnfold.driver.CHECKING) when the suite asks it to.
config.environment["BNFOLD_CHECK_RULES"] = os.environ.get("BNFOLD_CHECK_RULES", "")
