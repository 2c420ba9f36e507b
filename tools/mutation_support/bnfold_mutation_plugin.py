"""pytest plugin of tools/mutation.py, loaded with `-p bnfold_mutation_plugin` into mutmut's
pytest runs (stats, clean run, every mutant) and into nothing else.

* A derandomized hypothesis profile without deadline or example database, so that a mutant's
  verdict does not depend on the run or on the mutants tested before it (a test module that
  loads a profile of its own, like tests/test_properties.py's "ci", replaces it with that).
* Refuses to run (usage error) unless `bnfold` is imported from the mutated copy: the editable
  install's path (/work/main/python) is on sys.path too, and a silent fallback to it would
  report every mutant as surviving.
* Hands the active mutant to subprocesses through PYTHONPATH (see sitecustomize.py): lit
  passes PYTHONPATH on but drops MUTANT_UNDER_TEST, so without this `python -m bnfold` under
  lit would always run the original code and the lit suite could never kill a mutant.
* During mutmut's stats run, charges the functions a test's subprocesses called (written by
  sitecustomize.py) to that test, so the lit suite is run for the mutants of the functions it
  exercises (mutmut only sees calls made in its own process).
* Runs the cheapest tests first (durations from mutmut's stats), so that -x stops early.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(os.environ["BNFOLD_MUTATION_ROOT"]).resolve()
MUTANTS = ROOT / "repo" / "mutants"
CONTEXT = ROOT / "context"  # PYTHONPATH entries <ROOT>/context/<mutant name> (never created)
HITS = ROOT / "hits"        # <pid>.txt: functions a subprocess called during the stats run

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - the test extra installs it
    pass
else:
    settings.register_profile("bnfold-mutation", derandomize=True, deadline=None, database=None,
                              suppress_health_check=list(HealthCheck))
    settings.load_profile("bnfold-mutation")


def _mutant() -> str:
    return os.environ.get("MUTANT_UNDER_TEST", "")


def pytest_configure(config: pytest.Config) -> None:
    spec = importlib.util.find_spec("bnfold")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None or MUTANTS not in origin.parents:
        raise pytest.UsageError(f"tools/mutation.py: bnfold would be imported from {origin}, "
                                f"not from the mutated copy under {MUTANTS}")
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if entry and Path(entry).parent != CONTEXT]
    if _mutant():
        entries.insert(0, str(CONTEXT / _mutant()))
    os.environ["PYTHONPATH"] = os.pathsep.join(entries)
    if _mutant() == "stats":
        for stale in HITS.glob("*.txt"):
            stale.unlink()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    try:
        durations = json.loads((MUTANTS / "mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return  # the stats run itself: no durations yet
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


@pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook reads the hits
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if _mutant() != "stats":
        return
    from mutmut.state import state

    for path in sorted(HITS.glob("*.txt")):
        state()._stats.update(path.read_text().split())
        path.unlink()
