"""The README and docs/ keep working: every Python block runs as written (from the
repository root) and prints what its comments say, every `bnfold-opt` command in a shell
block runs and prints the summary its `# bnfold-opt: ...` comment shows, links resolve,
and the tables generated from the code (tools/gen_docs.py) are up to date."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import support

ROOT = support.ROOT
README = (ROOT / "README.md").read_text()
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
MAX_README_LINES = 300


def _blocks(language: str) -> list[tuple[str, int, str]]:
    """(page, line, code) of every ```language block of the README and docs/ (dedented)."""
    return [(page, text.count("\n", 0, m.start()) + 2, textwrap.dedent(m.group(2)))
            for page, text in PAGES.items()  # a block in a list item is indented
            for m in re.finditer(rf"^([ \t]*)```{language}\n(.*?)^\1```", text, re.S | re.M)]


def _section(page: str, line: int) -> str:
    """The heading above a line of a page."""
    above = PAGES[page].splitlines()[:line]
    return next(text.lstrip("# ") for text in reversed(above) if text.startswith("#"))


PYTHON = _blocks("python")


def test_the_readme_is_a_page_with_a_quick_start():
    assert README.count("\n") <= MAX_README_LINES, "move the details into docs/"
    headings = re.findall(r"^#+ (.+)$", README, re.M)
    for heading in ("What it buys", "Install and test", "Quick start", "Command line",
                    "Check a result", "Python", "jax.export", "What folds, in short"):
        assert heading in headings, heading
    sections = {_section(page, line) for page, line, _ in PYTHON if page == "README.md"}
    assert {"Python", "jax.export"} <= sections


def test_the_recipes_have_the_framework_examples():
    needs = [re.match(r"# needs: (\w+)", code) for page, _, code in PYTHON
             if page == "docs/recipes.md"]
    assert sorted(m.group(1) for m in needs if m) == ["equinox", "flax", "keras"]


def test_every_docs_page_is_linked_from_the_readme():
    for page in PAGES:
        if page.startswith("docs/"):
            assert f"]({page})" in README, page


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_links_resolve(page):
    """Relative links name files that exist, and their #anchors headings there."""
    base = (ROOT / page).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", PAGES[page]):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else ROOT / page
        assert file.exists(), (page, target)
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, (page, target)


@pytest.mark.parametrize("page, line, code", PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_every_python_block_runs_and_prints_what_it_says(page, line, code, monkeypatch):
    """A block's `# needs: pkg` (first line) skips it when pkg is not installed (the
    `export` extra); `print(...)  # text ... more` must print each `...`-separated part."""
    needs = re.match(r"# needs: (\w+(?:\.\w+)*)", code)
    if needs and importlib.util.find_spec(needs.group(1)) is None:
        pytest.skip(f"needs {needs.group(1)} (pip install -e '.[export]')")
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)  # the Keras block sets it
    out = io.StringIO()
    namespace: dict = {"__name__": "__readme__"}
    with contextlib.redirect_stdout(out):
        exec(compile("\n" * (line - 1) + code, page, "exec"), namespace)  # noqa: S102
    printed = out.getvalue()
    for comment in re.findall(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, re.M):
        for part in filter(None, (p.strip(" ,") for p in comment.split("..."))):
            assert part in printed, (comment, printed)
    folded = namespace.get("report") or getattr(namespace.get("folded"), "report", None) or \
        getattr(namespace.get("fold"), "report", None)
    if folded is not None:
        assert folded.folds, "every example folds something"


def test_blocks_that_do_not_run_say_so():
    """A Python example the tests cannot run is a ```py block (not ```python) right after
    a line saying "Not run here"."""
    for page, text in PAGES.items():
        for m in re.finditer(r"^```py\n", text, re.M):
            before = text[:m.start()].rstrip("\n").splitlines()[-1]
            assert "Not run here" in before, (page, before)


def _commands() -> list[tuple[str, int, str, str | None]]:
    """(page, line, command, the `# bnfold-opt: ...` line after it or None) of every
    `bnfold-opt` line of a ```sh block, continuation lines joined."""
    found = []
    for page, line, code in _blocks("sh"):
        lines = code.replace("\\\n", " ").splitlines()
        for i, text in enumerate(lines):
            if text.startswith("bnfold-opt "):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                found.append((page, line + i, text,
                              nxt[2:] if nxt.startswith("# bnfold-opt: ") else None))
    return found


COMMANDS = _commands()
_NUMBER = re.compile(r"\d+\.\d+(e[-+]?\d+)?")


def _shape(text: str) -> str:
    """A summary with its decimals blanked (times and differences vary by machine; counts
    do not)."""
    return _NUMBER.sub("N", text)


@pytest.mark.parametrize("page, line, command, says", COMMANDS,
                         ids=[f"{p}:{n}" for p, n, _, _ in COMMANDS])
def test_every_bnfold_opt_command_runs_and_prints_what_it_says(page, line, command, says,
                                                                tmp_path):
    """Run in an empty directory that sees testdata/ (outputs land there); `--visualize`
    (a server that waits for Ctrl+C) is checked by tests/test_overlay.py instead."""
    args = shlex.split(command, comments=True)
    if "--visualize" in args:
        pytest.skip("--visualize starts a server (tests/test_overlay.py covers it)")
    (tmp_path / "testdata").symlink_to(ROOT / "testdata")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "bnfold", *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if says is not None:
        for part in filter(None, (p.strip(" ,") for p in says.split("..."))):
            assert _shape(part) in _shape(proc.stderr), (part, proc.stderr)


def test_cli_example_folds_the_shipped_file():
    match = re.search(r"```sh\nbnfold-opt (testdata/\S+\.mlir)\n```", README)
    assert match, "README shows `bnfold-opt testdata/<file>.mlir`"
    proc = subprocess.run([sys.executable, "-m", "bnfold", match.group(1)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert "stablehlo.batch_norm_inference" not in proc.stdout
    assert "folded 1 normalization(s)" in proc.stderr


def test_the_quick_start_shows_how_to_check_a_result():
    """The line itself runs in test_every_bnfold_opt_command_runs_and_prints_what_it_says."""
    assert re.search(r"```sh\nbnfold-opt testdata/\S+\.mlir -o folded.mlir --check\n"
                     r"# bnfold-opt: .*: check passed: .*\n```", README)


def test_setup_commands_are_the_ones_ci_runs():
    setup = README[README.index("## Install and test"):README.index("## Quick start")]
    blocks = re.findall(r"```sh\n(.*?)```", setup, re.S)
    user, contributor = (block.strip().splitlines() for block in blocks[:2])
    assert user == ["pip install ."]
    assert contributor == ["pip install -e '.[test]'", "python -m pytest"]
    ci = (ROOT / ".ci" / "run").read_text()
    for command in contributor:
        assert command in ci


def test_the_readme_names_every_dependency():
    """pyproject's dependencies are the ones the README lists."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in project["dependencies"]]
    listed = re.search(r"bnfold depends on\s+([^.(]*)", README)
    assert listed, "the README says what bnfold depends on"
    assert sorted(re.findall(r"[a-z]+", listed.group(1).replace(" and ", ", "))) == sorted(names)


# --- the tables generated from the code --------------------------------------------------


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_docs_are_up_to_date():
    stale = _gen_docs().stale()
    assert not stale, f"docs out of date: {', '.join(stale)}; run python tools/gen_docs.py"


def test_a_stale_generated_block_is_found(tmp_path):
    """The check above can fail: a table one row short is out of date."""
    gen = _gen_docs()
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    refusals = tmp_path / "docs" / "refusals.md"
    text = refusals.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `range` |"))
    refusals.write_text(text.replace(row + "\n", ""))
    assert gen.stale(tmp_path / "docs") == ["refusal-codes"]
    assert row in gen.generate(tmp_path / "docs")[refusals]  # regenerating puts it back


def _generated(page: str, name: str) -> str:
    match = re.search(rf"<!-- BEGIN GENERATED {name}\b.*?<!-- END GENERATED {name} -->",
                      PAGES[page], re.S)
    assert match, (page, name)
    return match.group(0)


def test_the_option_tables_name_every_option_pass_and_flag():
    """Read independently of the generator: every FoldOptions field with its flag and pass
    option, every bnfold pass with its options, every bnfold-opt flag, every pattern."""
    from bnfold.cli import build_parser
    from bnfold.options import FoldOptions
    from bnfold.patterns import PASSES, pattern_names

    options = _generated("docs/options.md", "fold-options")
    for f in dataclasses.fields(FoldOptions):
        meta = f.metadata["bnfold"]
        row = next(line for line in options.splitlines() if line.startswith(f"| `{f.name}` |"))
        for spelling in filter(None, (meta.flag, meta.pass_option)):
            assert f"`{spelling}`" in row, (f.name, spelling)
    passes = _generated("docs/options.md", "passes")
    for spec in PASSES:
        row = next(line for line in passes.splitlines() if line.startswith(f"| `{spec.name}` |"))
        assert sorted(re.findall(r"`([a-z-]+)`", row.split(" | ")[-1])) == \
            sorted(spec.option_names()), spec.name
    patterns = _generated("docs/options.md", "patterns")
    assert re.findall(r"^\| `([a-z-]+)` \|", patterns, re.M) == list(pattern_names())
    flags = _generated("docs/cli.md", "cli-flags")
    for option in build_parser()._option_string_actions:
        assert f"`{option}" in flags, option


def test_the_refusal_list_names_every_code():
    from bnfold.refusal import Code

    listed = re.findall(r"^\| `([a-z-]+)` \| `Code\.(\w+)` \| (.+) \|$",
                        _generated("docs/refusals.md", "refusal-codes"), re.M)
    assert sorted((value, name) for value, name, _ in listed) == \
        sorted((code.value, code.name) for code in Code)
    assert all(meaning.strip() for _, _, meaning in listed)


def test_every_refusal_code_is_given_somewhere():
    """A code that no module gives promises a reason (in docs/refusals.md) that no report
    ever carries: `skipped-function` was listed and never given."""
    from bnfold.refusal import Code

    source = "\n".join(p.read_text() for p in (ROOT / "python" / "bnfold").rglob("*.py")
                       if p.name != "refusal.py")  # its doctest names a code
    given = set(re.findall(r"\bCode\.([A-Z_]+)\b", source))
    assert [c.name for c in Code if c.name not in given] == []


def test_gen_docs_reads_the_files_it_names():
    """Each block lives in the docs file the generator writes it to (and nowhere else)."""
    gen = _gen_docs()
    for name, (file, _) in gen.BLOCKS.items():
        holders = [page for page, text in PAGES.items() if f"BEGIN GENERATED {name}" in text]
        assert holders == [f"docs/{file}"], (name, holders)
    assert Path(gen.__file__).resolve() == (ROOT / "tools" / "gen_docs.py").resolve()
