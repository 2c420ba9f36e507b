# lit configuration: `lit lit_tests` (pip lit + pip filecheck).
import os
import shlex
import sys

import lit.formats

config.name = "bnfold"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]

python = shlex.quote(sys.executable)
config.substitutions.append(("%PYTHON", python))
# Run the tool through the interpreter so tests do not depend on entry points.
config.substitutions.append(("%bnfold-opt", f"{python} -m bnfold -q"))
# pip's filecheck ignores FILECHECK_OPTS; pass flags here.
config.substitutions.append(("%filecheck", "filecheck"))
config.substitutions.append(("%testdata", shlex.quote(
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata"))))
config.environment["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
config.environment["PATH"] = os.environ.get("PATH", "")
