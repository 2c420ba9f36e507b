#!/usr/bin/env python3
"""Mutation testing of bnfold's transform modules: which changes to the code does a fast test
subset fail to notice?

Runs mutmut (https://github.com/boxed/mutmut) over the modules given by --modules (globs,
relative to the repository) and judges every mutant with the tests given by --tests / -k,
then prints the mutation score per module and overall and every mutant that was not killed
(file, line, diff), so that each one can be killed with a test or explained. --out also writes
the report as markdown.

Install the tool (only the tool; it is not a dependency of bnfold):

    pip install 'mutmut==3.8.1'          # or: pip install -e '.[mutation]'

Why mutmut: it runs pytest in-process and forks one worker per mutant from a process that
has already imported jax, jaxlib and the tests, and it runs, for each mutant, only the tests
that called the mutated function (recorded in one "stats" run of the subset), fastest first
(the harness below orders them), stopping at the first failure. A mutant costs a fraction of a second to a few seconds; a
tool that starts a test process per mutant (cosmic-ray) pays ~1.3 s of jax/bnfold/pytest
start-up and collection first, and runs every test of the subset. It was tried first and
works, so cosmic-ray and pytest-gremlins were not needed.

The working tree is never touched. Everything happens in a scratch copy (a directory
bnfold-mutation-* on /dev/shm, else $TMPDIR) that is deleted at the end, also on Ctrl-C or
SIGTERM (a copy left by a killed run is deleted by the next run). The copy holds the
working tree's files (tracked and untracked, not ignored; --rev REV: a commit instead), with
the package directory python/ renamed src/: mutmut derives module names from paths and
only knows the src/ layout (python/bnfold/x.py would become module "python.bnfold.x", and
no mutant would ever be activated). Reported paths are the repository's.

Per mutant: mutmut gives the tests that cover the mutated function their clean duration
plus --timeout seconds of wall time (and twice that in CPU seconds); a mutant that runs
longer counts as a "timeout", that is killed (an infinite loop is a detected change).

Test harness of the copy (tools/mutation_support/, loaded only into these runs): a
derandomized hypothesis profile without deadline or example database (a verdict must not
depend on the run); a check that `bnfold` is imported from the mutated copy and not from the
editable install; the active mutant handed to subprocesses through PYTHONPATH (lit passes
PYTHONPATH but not mutmut's MUTANT_UNDER_TEST, so the lit suite could otherwise never kill a
mutant; and lit's internal shell leaves PYTHONPATH set to lit's own directory after a `diff`
RUN line, which the harness undoes); the functions subprocesses call charged to the test that
ran them, so that tests/test_lit.py runs for the mutants of the functions the lit suite
exercises; the cheapest tests first.

Score = killed / (killed + survived + no tests), where killed includes timeouts and crashes,
and "no tests" are mutants of functions that no test of the subset calls (they survive).

Usage:
    python tools/mutation.py                                   # default modules and tests (hours)
    python tools/mutation.py --modules 'python/bnfold/border.py' \\
        --tests tests/test_forward.py --max-mutants 40 --out mutation.md
    python tools/mutation.py --modules 'python/bnfold/quant/*.py' --list   # count only
    python tools/mutation.py --tests tests/test_equalize.py -k 'not random' --timeout 20
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

MUTMUT_VERSION = "3.8.1"  # the version this script drives (it reads mutmut's result files)
ROOT = Path(__file__).resolve().parent.parent
SUPPORT = Path(__file__).resolve().parent / "mutation_support"
PREFIX = "bnfold-mutation-"
PID_FILE = "bnfold-mutation.pid"

DEFAULT_MODULES = [  # a glob that matches nothing is reported and skipped (modules move)
    "python/bnfold/patterns/*.py",
    "python/bnfold/quant/*.py",
    "python/bnfold/affine.py",
    "python/bnfold/laws.py",
    "python/bnfold/through.py",
    "python/bnfold/border.py",
    "python/bnfold/precision.py",
]
DEFAULT_TESTS = [  # the transforms' own tests: laws, numerics, refusals, the IR shapes
    "tests/test_laws.py",
    "tests/test_wrong_numbers.py",
    "tests/test_statistics.py",
    "tests/test_edges.py",
    "tests/test_quantize.py",
    "tests/test_forward.py",
    "tests/test_equalize.py",
    "tests/test_precision.py",
    "tests/test_lit.py",
]

# mutmut's statuses, grouped for the score.
KILLED = ("killed", "timeout", "segfault", "caught by type check")
NOT_KILLED = ("survived", "no tests")
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


class Failure(Exception):
    """A problem to report in one line (no traceback)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", nargs="+", default=DEFAULT_MODULES, metavar="GLOB",
                        help="modules to mutate: globs relative to the repository (** allowed); "
                             "default: %(default)s")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, metavar="PATH",
                        help="pytest paths or node ids that judge the mutants; default: %(default)s")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k expression for the subset")
    parser.add_argument("--pytest-args", default="", metavar="ARGS",
                        help="more pytest arguments for every run, one shell-quoted string: --pytest-args='-x -W error'")
    parser.add_argument("--hypothesis-profile", default="ci", metavar="NAME",
                        help="BNFOLD_HYPOTHESIS_PROFILE for the tests (default: %(default)s)")
    parser.add_argument("--max-mutants", type=int, metavar="N",
                        help="test a random sample of N mutants (over all modules) instead of all")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --max-mutants sample (default: 0)")
    parser.add_argument("--functions", metavar="REGEX", type=re.compile,
                        help="only mutants of functions whose name (`name` or `Class.method`) "
                             "matches REGEX (re.search), e.g. the functions a change touched")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="wall seconds a mutant's tests may run beyond their clean duration "
                             "before it counts as a timeout (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, metavar="J",
                        help="mutants tested in parallel (default: the number of CPUs, %(default)s)")
    parser.add_argument("--out", type=Path, metavar="FILE.md", help="also write the report here (markdown)")
    parser.add_argument("--log", type=Path, metavar="FILE", help="keep mutmut's output here")
    parser.add_argument("--rev", metavar="REV", help="test this commit instead of the working tree")
    parser.add_argument("--src-root", metavar="DIR",
                        help="directory that holds the package (default: pyproject's package-dir, python)")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="where the scratch copy goes (default: /dev/shm if writable, else $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    parser.add_argument("--list", action="store_true", help="only list the modules and their mutant counts")
    args = parser.parse_args(argv)
    if args.max_mutants is not None and args.max_mutants < 1:
        parser.error("--max-mutants must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


# --- the scratch copy --------------------------------------------------------------------------

def scratch_parent(requested: Path | None) -> Path:
    if requested is not None:
        return requested
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 << 30:
        return shm
    return Path(tempfile.gettempdir())


def remove_stale_copies(parent: Path) -> None:
    """Delete the scratch copies of runs that were killed (their pid is gone)."""
    for candidate in parent.glob(PREFIX + "*"):
        try:
            pid = int((candidate / PID_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or being created
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
            print(f"mutation: removed {candidate} (left by a killed run)", file=sys.stderr)
        except PermissionError:
            pass


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                          text=True).stdout


def copy_repository(dest: Path, rev: str | None) -> str:
    """The working tree's files (tracked and untracked, not ignored) or a commit's, into dest."""
    dest.mkdir()
    if rev is not None:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        return f"commit {git('rev-parse', '--short', rev).strip()} ({rev})"
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    copied = 0
    for name in filter(None, names):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(source, dest / name)
        except FileNotFoundError:  # deleted while we copy: the tree is being edited
            continue
        copied += 1
    dirty = " with uncommitted changes" if git("status", "--porcelain").strip() else ""
    return f"working tree of {ROOT} (HEAD {git('rev-parse', '--short', 'HEAD').strip()}{dirty}, {copied} files)"


def source_root(requested: str | None) -> str:
    if requested:
        return requested.strip("/")
    try:
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        return pyproject["tool"]["setuptools"]["package-dir"][""].strip("/")
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "src"


def expand_modules(copy: Path, patterns: list[str], src_root: str) -> list[str]:
    """Repository-relative paths of the modules to mutate (globs expanded in the copy)."""
    modules: list[str] = []
    for pattern in patterns:
        matches = sorted(m for m in glob(pattern, root_dir=copy, recursive=True)
                         if m.endswith(".py") and (copy / m).is_file())
        if not matches:
            print(f"mutation: warning: --modules {pattern!r} matches no module (moved?)", file=sys.stderr)
        for match in matches:
            parts = Path(match).parts
            if len(parts) < 3 or parts[0] != src_root:
                raise Failure(f"{match} is not a module of a package under {src_root}/ (see --src-root)")
            if match not in modules:
                modules.append(match)
    if not modules:
        raise Failure(f"no module matches {' '.join(patterns)}")
    return modules


def to_copy(path: str, src_root: str) -> str:
    """python/bnfold/x.py -> src/bnfold/x.py (the copy's src/ layout)."""
    return "src" + path[len(src_root):]


def to_repo(path: str, src_root: str) -> str:
    return src_root + path[len("src"):]


def write_config(copy: Path, modules: list[str], args: argparse.Namespace) -> None:
    """Append mutmut's configuration to the copy's pyproject.toml."""
    pyproject = copy / "pyproject.toml"
    text = pyproject.read_text() if pyproject.exists() else ""
    if "mutmut" in tomllib.loads(text).get("tool", {}):
        raise Failure("pyproject.toml already has a [tool.mutmut] table; this script writes its own")
    packages = sorted({"/".join(Path(m).parts[:2]) for m in modules})
    also_copy = sorted(p.name for p in copy.iterdir() if p.name != "src")
    pytest_args = ["-p", "no:cacheprovider", "-p", "bnfold_mutation_plugin", *shlex.split(args.pytest_args)]
    if args.keyword:
        pytest_args += ["-k", args.keyword]

    def toml(value: object) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        if isinstance(value, str):
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return str(value).lower() if isinstance(value, bool) else repr(value)

    config = {
        "source_paths": packages,
        "only_mutate": modules,
        "also_copy": also_copy,
        "pytest_add_cli_args_test_selection": args.tests,
        "pytest_add_cli_args": pytest_args,
        # Wall limit (clean duration + S) * 1; CPU limit twice that (mutmut's rule).
        "timeout_constant": float(args.timeout),
        "timeout_multiplier": 1.0,
        # Workers fork from a server that only imported the tests: forking a process that has
        # run XLA (threads) or bnfold's kernel thread pool would hang the children.
        "process_isolation": "forkserver",
        "use_git_change_detection": False,
        "use_setproctitle": False,
    }
    lines = ["", "[tool.mutmut]", *(f"{key} = {toml(value)}" for key, value in config.items()), ""]
    pyproject.write_text(text + "\n".join(lines))


# --- mutmut ----------------------------------------------------------------------------------

def require_mutmut() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        installed = version("mutmut")
    except PackageNotFoundError:
        raise Failure(f"mutmut is not installed: pip install 'mutmut=={MUTMUT_VERSION}' "
                      "(or pip install -e '.[mutation]')") from None
    if installed != MUTMUT_VERSION:
        print(f"mutation: warning: mutmut {installed} is installed, this script was written for "
              f"{MUTMUT_VERSION} (pip install 'mutmut=={MUTMUT_VERSION}')", file=sys.stderr)
    return installed


@contextlib.contextmanager
def working_directory(path: Path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def mutant_names(copy: Path, modules: list[str]) -> dict[str, list[str]]:
    """Every mutant mutmut will generate, per copy-relative module path (mutmut's own generator)."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    names: dict[str, list[str]] = {}
    with working_directory(copy):  # mutmut reads its configuration from the working directory
        for module in modules:
            mutated = mutate_file_contents(module, Path(module).read_text())
            names[module] = [get_mutant_name(Path(module), name) for name in mutated.mutant_names]
    return names


@dataclass
class Run:
    env: dict[str, str]
    returncode: int
    output: str
    started: float
    mutating: float | None  # when "Running mutation testing" appeared
    ended: float


def run_mutmut(copy: Path, root: Path, names: list[str], args: argparse.Namespace, log: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in ("MUTANT_UNDER_TEST", "PYTHONPATH")}
    pythonpath = [str(root / "support"), str(copy / "mutants" / "src")]
    if os.environ.get("PYTHONPATH"):
        pythonpath.append(os.environ["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), BNFOLD_MUTATION_ROOT=str(root),
               BNFOLD_HYPOTHESIS_PROFILE=args.hypothesis_profile, PYTHONUNBUFFERED="1")
    # Must exist before Python starts: a PYTHONPATH entry that is missing at start-up is cached
    # as "no finder", and bnfold would then come from the editable install instead.
    (copy / "mutants" / "src").mkdir(parents=True)
    command = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())",
               "run", "--max-children", str(args.jobs), *names]
    started = time.monotonic()
    mutating = None
    last_progress = 0.0
    output: list[str] = []
    proc = subprocess.Popen(command, cwd=copy, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    try:
        with open(log, "w", encoding="utf-8", errors="replace") as out:
            buffer, phase = "", ""
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
                buffer += chunk.decode("utf-8", errors="replace")
                *lines, buffer = re.split(r"[\r\n]", buffer)
                for line in lines:
                    line = line.strip()
                    if not line:
                        continue
                    if line[0] in SPINNER and "/" not in line:  # a spinner frame: the phase's name
                        phase = line.lstrip(SPINNER + " ")
                        continue
                    out.write(line + "\n")
                    output.append(line)
                    now = time.monotonic()
                    if line.startswith("Running mutation testing"):
                        mutating = now
                    if line.startswith("done"):
                        print(f"[{now - started:6.0f} s] mutmut: {phase}: {line}", flush=True)
                    elif re.match(r"^(Running|Stopping|Failed|failed)", line):
                        print(f"[{now - started:6.0f} s] mutmut: {line}", flush=True)
                    elif "/" in line and "🎉" in line and now - last_progress > 20:
                        last_progress = now
                        print(f"[{now - started:6.0f} s] mutmut: {line.lstrip(SPINNER + ' ')}", flush=True)
            out.write(buffer)
        proc.wait()
    except BaseException:
        stop(proc)
        raise
    return Run(env, proc.returncode, "\n".join(output), started, mutating, time.monotonic())


def diagnose(copy: Path, run: Run, args: argparse.Namespace) -> str:
    """mutmut hides the output of the test runs it forks: when it stops before testing mutants
    (the stats run or the clean run failed), run the subset once more, unmutated, in the copy,
    to show why."""
    if run.mutating is not None:
        return ""  # the tests ran clean; the failure is mutmut's own (above)
    print("mutation: mutmut stopped before testing mutants; running the tests once more, "
          "unmutated, in the copy ...", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "--rootdir=.", "-p", "no:cacheprovider",
               "-p", "bnfold_mutation_plugin", *shlex.split(args.pytest_args),
               *(["-k", args.keyword] if args.keyword else []), *args.tests]
    proc = subprocess.run(command, cwd=copy / "mutants", env=dict(run.env, MUTANT_UNDER_TEST=""),
                          capture_output=True, text=True, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    return f"\n\npytest {' '.join(args.tests)} (unmutated, in the copy) exits {proc.returncode}:\n{tail}"


def stop(proc: subprocess.Popen) -> None:
    """End mutmut and its workers: the process group that was started for it."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived mutmut itself


# --- results ---------------------------------------------------------------------------------

@dataclass
class Mutant:
    name: str
    module: str  # repository path
    status: str
    line: int | None = None
    diff: str = ""


@dataclass
class Results:
    mutants: list[Mutant] = field(default_factory=list)
    total_generated: dict[str, int] = field(default_factory=dict)


def read_results(copy: Path, modules: list[str], tested: set[str] | None, src_root: str) -> Results:
    from mutmut.stats import status_by_exit_code

    results = Results()
    for module in modules:
        meta = copy / "mutants" / (module + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        results.total_generated[to_repo(module, src_root)] = len(codes)
        for name, code in codes.items():
            if tested is None or name in tested:
                results.mutants.append(Mutant(name, to_repo(module, src_root), status_by_exit_code[code]))
    return results


def function_name(mutant: str) -> str:
    """`name` or `Class.method` of the function a mutant changes (mutmut's mangled name)."""
    mangled = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        _, cls, name = mangled.split("ǁ", 2)
        return f"{cls}.{name}"
    return mangled[2:]


def function_of(tree: ast.Module, mutant: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function a mutant changes: mutmut names it x_<function> or xǁ<class>ǁ<method>."""
    mangled = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        _, cls, name = mangled.split("ǁ", 2)
        scopes = [n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    else:
        name, scopes = mangled[2:], [tree.body]
    for body in scopes:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
    return None


def place_diff(diff: str, path: str, source: list[str], node: ast.AST | None) -> tuple[str, int | None]:
    """mutmut's diff is relative to the function (and dedented for methods): give it the file's
    line numbers and indentation. Returns the diff and the first changed line."""
    near = getattr(node, "lineno", 1)
    indent = " " * getattr(node, "col_offset", 0)
    stripped = [line.strip() for line in source]
    out = [f"--- {path}", f"+++ {path}"]
    first: int | None = None
    lines = [line for line in diff.splitlines() if not line.startswith(("--- ", "+++ "))]
    hunks: list[tuple[re.Match[str], list[str]]] = []
    for line in lines:
        match = HUNK.match(line)
        if match:
            hunks.append((match, []))
        elif hunks:
            hunks[-1][1].append(line)
    for match, body in hunks:
        old = [line[1:].strip() for line in body if line[:1] in (" ", "-")]
        starts = [i for i in range(len(source) - len(old) + 1) if stripped[i:i + len(old)] == old]
        if not starts:  # keep mutmut's function-relative numbers
            out.append(match.group(0) + " (lines relative to the function)")
            out.extend(body)
            continue
        start = min(starts, key=lambda i: abs(i + 1 - near))
        shift = start + 1 - int(match.group(1))
        out.append(f"@@ -{int(match.group(1)) + shift},{match.group(2) or 1} "
                   f"+{int(match.group(3)) + shift},{match.group(4) or 1} @@{match.group(5)}")
        position = start
        for line in body:
            if line[:1] in (" ", "-"):
                if line[:1] == "-" and first is None:
                    first = position + 1
                out.append(line[:1] + source[position])
                position += 1
            else:
                if first is None:
                    first = position + 1
                out.append("+" + (indent + line[1:] if line[1:].strip() else ""))
    return "\n".join(out), first


def describe(copy: Path, results: Results, src_root: str) -> None:
    """Line and diff of every mutant that was not killed."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    trees: dict[str, tuple[list[str], ast.Module]] = {}
    with working_directory(copy):
        for mutant in results.mutants:
            if mutant.status in KILLED:
                continue
            module = to_copy(mutant.module, src_root)
            if module not in trees:
                text = Path(module).read_text()
                trees[module] = (text.splitlines(), ast.parse(text))
            source, tree = trees[module]
            node = function_of(tree, mutant.name)
            try:
                raw = get_diff_for_mutant(mutant.name, path=module)
            except Exception as error:  # report it, keep the rest
                mutant.diff, mutant.line = f"(no diff: {error})", getattr(node, "lineno", None)
                continue
            mutant.diff, mutant.line = place_diff(raw, mutant.module, source, node)
            if mutant.line is None:
                mutant.line = getattr(node, "lineno", None)


# --- report ----------------------------------------------------------------------------------

def score(counts: Counter[str]) -> str:
    killed = sum(counts[s] for s in KILLED)
    judged = killed + sum(counts[s] for s in NOT_KILLED)
    return f"{100 * killed / judged:.1f}%" if judged else "n/a"


def report(results: Results, run: Run, info: dict[str, str]) -> str:
    by_module: dict[str, Counter[str]] = {m: Counter() for m in results.total_generated}
    for mutant in results.mutants:
        by_module[mutant.module][mutant.status] += 1
    overall: Counter[str] = sum(by_module.values(), Counter())
    lines = ["# Mutation testing report", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    tested = sum(overall[s] for s in overall if s not in ("no tests", "not checked", "skipped"))
    wall = run.ended - run.started
    if run.mutating is not None:
        phase = run.ended - run.mutating
        per = f"{phase / tested:.2f} s wall per mutant ({tested} run in {phase:.0f} s)" if tested else "none run"
        lines.append(f"- time: {wall:.0f} s; set-up (mutants, stats run, clean run) "
                     f"{run.mutating - run.started:.0f} s; mutants: {per}")
    else:
        lines.append(f"- time: {wall:.0f} s")
    lines += ["", "| module | mutants | tested | killed | timeout | survived | no tests | other | score |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def row(name: str, counts: Counter[str], generated: int) -> str:
        other = sum(v for s, v in counts.items() if s not in (*KILLED, *NOT_KILLED))
        killed = counts["killed"] + counts["segfault"] + counts["caught by type check"]
        return (f"| {name} | {generated} | {sum(counts.values())} | {killed} | {counts['timeout']} | "
                f"{counts['survived']} | {counts['no tests']} | {other} | {score(counts)} |")

    for module, counts in by_module.items():
        lines.append(row(f"`{module}`", counts, results.total_generated[module]))
    lines.append(row("**overall**", overall, sum(results.total_generated.values())))
    others = Counter(m.status for m in results.mutants if m.status not in (*KILLED, *NOT_KILLED))
    if others:
        lines += ["", "Other: " + ", ".join(f"{n} {s}" for s, n in sorted(others.items()))
                  + " (not in the score; \"suspicious\": the worker failed oddly, rerun it)"]
    for status, title in (("survived", "Surviving mutants"),
                          ("no tests", "Mutants no test of the subset reaches (survive)"),
                          ("suspicious", "Suspicious mutants")):
        chosen = sorted((m for m in results.mutants if m.status == status),
                        key=lambda m: (m.module, m.line or 0, m.name))
        if not chosen:
            continue
        lines += ["", f"## {title} ({len(chosen)})", ""]
        for mutant in chosen:
            lines += [f"### {mutant.module}:{mutant.line if mutant.line is not None else '?'}"
                      f" `{mutant.name}`", "", "```diff", mutant.diff, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


# --- main ------------------------------------------------------------------------------------

def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: stop mutmut and delete the copy, as on Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python tools/mutation.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        version = require_mutmut()
        src_root = source_root(args.src_root)
        parent = scratch_parent(args.workdir)
        remove_stale_copies(parent)
        root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    except Failure as error:
        print(f"mutation: {error}", file=sys.stderr)
        return 2
    (root / PID_FILE).write_text(str(os.getpid()))
    try:
        copy = root / "repo"
        origin = copy_repository(copy, args.rev)
        modules = expand_modules(copy, args.modules, src_root)
        if src_root != "src":
            if (copy / "src").exists():
                raise Failure(f"the repository has both {src_root}/ and src/; cannot make the src/ layout")
            (copy / src_root).rename(copy / "src")
        modules = [to_copy(m, src_root) for m in modules]
        write_config(copy, modules, args)
        shutil.copytree(SUPPORT, root / "support", ignore=shutil.ignore_patterns("__pycache__"))
        (root / "hits").mkdir()
        names = mutant_names(copy, modules)
        if args.functions is not None:
            names = {m: [n for n in ns if args.functions.search(function_name(n))]
                     for m, ns in names.items()}
        every = [n for module in modules for n in names[module]]
        if not every:
            raise Failure(f"no mutant is in a function matching {args.functions.pattern!r}"
                          if args.functions else "no mutants in these modules")
        print(f"mutation: {len(modules)} module(s), {len(every)} mutants, copy in {root}", flush=True)
        if args.list:
            for module in modules:
                print(f"  {len(names[module]):5d}  {to_repo(module, src_root)}")
            return 0
        sample = every if args.functions is not None else None
        if args.max_mutants is not None and args.max_mutants < len(every):
            sample = sorted(random.Random(args.seed).sample(every, args.max_mutants))
        log = args.log or root / "mutmut.log"
        run = run_mutmut(copy, root, sample or [], args, log)
        if run.returncode != 0 or not (copy / "mutants" / "mutmut-stats.json").exists():
            raise Failure(f"mutmut failed (exit {run.returncode}); its last lines:\n"
                          + "\n".join(run.output.splitlines()[-30:]) + diagnose(copy, run, args))
        results = read_results(copy, modules, set(sample) if sample else None, src_root)
        describe(copy, results, src_root)
        info = {
            "tool": f"mutmut {version}",
            "command": f"`{command}`",
            "source": origin,
            "modules": ", ".join(f"`{to_repo(m, src_root)}`" for m in modules),
            "tests": " ".join(f"`{t}`" for t in args.tests)
            + (f" `-k {args.keyword}`" if args.keyword else "")
            + (f" `{args.pytest_args}`" if args.pytest_args else "")
            + f" (BNFOLD_HYPOTHESIS_PROFILE={args.hypothesis_profile})",
            "mutants": (f"random sample of {len(sample)} of {len(every)} (seed {args.seed})"
                        if sample and len(sample) < len(every) else f"all {len(every)}")
            + (f" in functions matching `{args.functions.pattern}`" if args.functions else ""),
            "limits": f"{args.jobs} job(s); a mutant's tests get their clean duration + {args.timeout:g} s",
        }
        text = report(results, run, info)
        print()
        print(text, end="")
        if args.out:
            args.out.write_text(text)
            print(f"\nmutation: report written to {args.out}")
        return 0
    except Failure as error:
        print(f"mutation: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr
        print(f"mutation: {' '.join(map(str, error.cmd))} failed: {(stderr or '').strip()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mutation: interrupted; the working tree was not touched", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"mutation: scratch copy kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
