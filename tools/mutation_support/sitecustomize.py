"""Start-up hook of every Python process of a tools/mutation.py run (its directory is put on
PYTHONPATH for that run only; nothing else imports it).

A process whose sys.path holds <ROOT>/context/<mutant> (put there by bnfold_mutation_plugin,
carried by PYTHONPATH through lit, which drops other variables) runs that mutant: it sets
MUTANT_UNDER_TEST, which mutmut's trampolines read. In mutmut's stats run ("stats") it also
writes the functions it calls to <ROOT>/hits/<pid>.txt, for the plugin to charge to the
running test. In lit's own process it repairs lit's internal shell (see _repair_lit). Any
other sitecustomize on sys.path is run afterwards.
"""

from __future__ import annotations

import os
import sys


def _record_hits(root: str) -> None:
    """Append every function this process calls to <root>/hits/<pid>.txt as it is first called
    (not at exit: `python -m bnfold` leaves through os._exit, which skips atexit)."""
    cwd = os.getcwd()
    try:
        os.chdir(os.path.join(root, "repo"))  # mutmut reads [tool.mutmut] from the working directory
        from mutmut.configuration import config

        config()
    finally:
        os.chdir(cwd)
    from mutmut.state import state

    path = os.path.join(root, "hits", f"{os.getpid()}.txt")

    class Hits(set):
        def add(self, name: str) -> None:
            if name not in self:
                super().add(name)
                with open(path, "a") as f:
                    f.write(name + "\n")

    state()._stats = Hits()


def _activate() -> None:
    for entry in sys.path:
        context, mutant = os.path.split(entry)
        root = os.path.dirname(context)
        if os.path.basename(context) == "context" and os.path.isfile(os.path.join(root, "bnfold-mutation.pid")):
            os.environ["MUTANT_UNDER_TEST"] = mutant
            if mutant == "stats":
                _record_hits(root)
            return


def _repair_lit() -> None:
    """lit's internal shell runs its out-of-process builtins (`diff`, `cat`) with PYTHONPATH set
    to lit's directory, and that assignment stays in the test's shell environment for its later
    RUN lines (lit 23: `cmd_shenv.env["PYTHONPATH"] = ...`, cmd_shenv being the test's shell).
    A `%bnfold-opt` after a `diff` would import the editable install instead of the mutated
    copy, without the active mutant. Put PYTHONPATH back after every command."""
    try:
        from lit import TestRunner
    except ImportError:
        return
    original = TestRunner._executeShCmd

    def execute(cmd, shenv, *args, **kwargs):
        saved = shenv.env.get("PYTHONPATH")
        try:
            return original(cmd, shenv, *args, **kwargs)
        finally:
            if saved is None:
                shenv.env.pop("PYTHONPATH", None)
            else:
                shenv.env["PYTHONPATH"] = saved

    TestRunner._executeShCmd = execute


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_activate()
if os.path.basename(sys.argv[0] if sys.argv else "") == "lit":
    _repair_lit()
_chain()
