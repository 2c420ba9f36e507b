"""The README's commands and examples keep working: every Python block runs as written
(from the repository root) and prints what its comments say."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys

import pytest

import support

README = (support.ROOT / "README.md").read_text()


def _python_blocks() -> list[tuple[int, str]]:
    """(line, code) of every ```python block."""
    return [(README.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", README, re.S | re.M)]


BLOCKS = _python_blocks()


def _section(line: int) -> str:
    """The heading above a README line."""
    above = README.splitlines()[:line]
    return next(text.lstrip("# ") for text in reversed(above) if text.startswith("#"))


def test_the_readme_has_its_python_examples():
    sections = {_section(line) for line, _ in BLOCKS}
    assert {"Python API", "Pass pipelines", "Using bnfold with jax.export", "Recipes"} <= sections
    assert sum("# needs: " in code for _, code in BLOCKS) == 3  # flax, equinox, keras


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_every_python_block_runs_and_prints_what_it_says(line, code, monkeypatch):
    """A block's `# needs: pkg` (first line) skips it when pkg is not installed (the
    `export` extra); `print(...)  # text ... more` must print each `...`-separated part."""
    needs = re.match(r"# needs: (\w+(?:\.\w+)*)", code)
    if needs and importlib.util.find_spec(needs.group(1)) is None:
        pytest.skip(f"needs {needs.group(1)} (pip install -e '.[export]')")
    monkeypatch.chdir(support.ROOT)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)  # the Keras block sets it
    out = io.StringIO()
    namespace: dict = {"__name__": "__readme__"}
    with contextlib.redirect_stdout(out):
        exec(compile("\n" * (line - 1) + code, "README.md", "exec"), namespace)  # noqa: S102
    printed = out.getvalue()
    for comment in re.findall(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, re.M):
        for part in filter(None, (p.strip(" ,") for p in comment.split("..."))):
            assert part in printed, (comment, printed)
    folded = namespace.get("report") or getattr(namespace.get("folded"), "report", None) or \
        getattr(namespace.get("fold"), "report", None)
    if folded is not None:
        assert folded.folds, "every example folds something"


def test_cli_example_folds_the_shipped_file():
    match = re.search(r"```sh\nbnfold-opt (testdata/\S+\.mlir)\n```", README)
    assert match, "README shows `bnfold-opt testdata/<file>.mlir`"
    proc = subprocess.run([sys.executable, "-m", "bnfold", match.group(1)], cwd=support.ROOT,
                          capture_output=True, text=True, check=True)
    assert "stablehlo.batch_norm_inference" not in proc.stdout
    assert "folded 1 normalization(s)" in proc.stderr


def test_check_example_checks_the_shipped_file(tmp_path):
    """The quick start's `--check` line runs as written and says what its comment says
    (up to the numbers)."""
    match = re.search(r"```sh\nbnfold-opt (testdata/\S+\.mlir) -o folded.mlir --check\n"
                      r"# (bnfold-opt: .*)\n```", README)
    assert match, "README shows how to check a result"
    proc = subprocess.run([sys.executable, "-m", "bnfold", support.ROOT / match.group(1), "-o",
                           tmp_path / "folded.mlir", "--check"], cwd=support.ROOT,
                          capture_output=True, text=True, check=True)
    shape = re.sub(r"\d\.\d+e-\d+", "X", match.group(2).split(": ", 2)[2])
    assert shape in re.sub(r"\d\.\d+e-\d+", "X", proc.stderr), proc.stderr
    assert (tmp_path / "folded.mlir").exists()


def test_setup_commands_are_the_ones_ci_runs():
    setup = README[README.index("## Set up and test"):README.index("## The command-line tool")]
    blocks = re.findall(r"```sh\n(.*?)```", setup, re.S)
    user, contributor = (block.strip().splitlines() for block in blocks[:2])
    assert user == ["pip install ."]
    assert contributor == ["pip install -e '.[test]'", "python -m pytest"]
    ci = (support.ROOT / ".ci" / "run").read_text()
    for command in contributor:
        assert command in ci


def test_pass_pipelines_section_names_every_pass_and_option():
    """The README lists bnfold's passes and their options as the schema has them (issue 26:
    pad-uniform-shift was missing)."""
    from bnfold.patterns import PASSES

    section = README[README.index("## Pass pipelines"):README.index("## Using bnfold with jax")]
    for spec in PASSES:
        assert f"`{spec.name}" in section, spec.name
        for option in spec.option_names():
            assert f"`{option}=" in section, (spec.name, option)


def test_every_refusal_code_is_in_the_readme_list():
    """Issue 31: `nothing-to-do` was missing from the README's list of report codes."""
    from bnfold.refusal import Code

    match = re.search(r"Every refusal has a `code` for programs \((.*?)`bnfold\.refusal\.Code`\)",
                      README, re.S)
    assert match, "the README's list of codes moved"
    listed = re.findall(r"`([a-z-]+)`", match.group(1))
    assert sorted(listed) == sorted(code.value for code in Code)
    assert len(listed) == len(set(listed))
