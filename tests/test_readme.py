"""The README's commands and examples keep working."""

from __future__ import annotations

import re
import subprocess
import sys

import support

README = (support.ROOT / "README.md").read_text()


def test_jax_export_example_runs():
    section = README[README.index("## Using bnfold with jax.export"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert len(namespace["report"].folds) == 1


def test_cli_example_folds_the_shipped_file():
    match = re.search(r"```sh\nbnfold-opt (testdata/\S+\.mlir)\n```", README)
    assert match, "README shows `bnfold-opt testdata/<file>.mlir`"
    proc = subprocess.run([sys.executable, "-m", "bnfold", match.group(1)], cwd=support.ROOT,
                          capture_output=True, text=True, check=True)
    assert "stablehlo.batch_norm_inference" not in proc.stdout
    assert "folded 1 normalization(s)" in proc.stderr


def test_setup_commands_are_the_ones_ci_runs():
    setup = README[README.index("## Set up and test"):README.index("## The command-line tool")]
    commands = re.search(r"```sh\n(.*?)```", setup, re.S).group(1).strip().splitlines()
    ci = (support.ROOT / ".ci" / "run").read_text()
    assert commands == ["pip install -e '.[test]'", "python -m pytest"]
    for command in commands:
        assert command in ci


def test_pass_manager_example_runs():
    section = README[README.index("## Pass pipelines"):README.index("## Using bnfold with jax.export")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    import os
    cwd = os.getcwd()
    os.chdir(support.ROOT)
    try:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        os.chdir(cwd)
    assert len(namespace["fold"].report.folds) == 8


def test_compiler_ir_recipe_runs():
    section = README[README.index("### Recipes"):README.index("## Performance")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert len(namespace["report"].folds) == 1
