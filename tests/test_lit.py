"""Runs the lit suite (lit_tests/) so one `pytest` command runs everything."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import support


def test_lit_suite_passes():
    lit = shutil.which("lit", path=os.path.dirname(sys.executable)) or shutil.which("lit")
    assert lit, "lit is not installed: pip install -e '.[test]'"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run([lit, "-sv", str(support.ROOT / "lit_tests")], capture_output=True,
                          text=True, env=env, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-20000:]
    passed = re.search(r"Passed\s*:\s*(\d+)", output)
    assert passed and int(passed.group(1)) >= 5, output[-5000:]
    # lit counts files; the cases are the CHECK-LABELed functions inside them.
    labels = sum(f.read_text().count("CHECK-LABEL:") for f in (support.ROOT / "lit_tests").glob("*.mlir"))
    assert labels >= 25, labels
