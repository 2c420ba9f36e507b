#!/usr/bin/env python3
"""Checks that the working tree folds every testdata module exactly as a git ref does.

    python tools/same_outputs.py main            # or any commit; default HEAD

For each side (REF's python/ tree from `git archive`, and the working tree's),
one child process runs bnfold-opt's `main` on every testdata/**/*.mlir
(`-q FILE -o OUT --report REPORT.json`) and on each again with `--emit
bytecode`; the outputs, the reports and the exit statuses must be byte for byte
the same. Exit status 1 lists the files that differ. For performance work: a
change that only makes bnfold faster must not change what it writes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys
from pathlib import Path
import bnfold.cli as cli
cli._retained = []
paths, out = json.loads(sys.argv[1]), Path(sys.argv[2])
status = {}
for i, path in enumerate(paths):
    for fmt in ("mlir", "bytecode"):
        stem = out / f"{i}.{fmt}"
        argv = ["-q", path, "-o", str(stem) + ".out", "--report", str(stem) + ".json"]
        if fmt == "bytecode":
            argv += ["--emit", "bytecode"]
        status[f"{path} {fmt}"] = cli.main(argv)
print(json.dumps({"status": status, "bnfold": __import__("bnfold").__file__}))
"""


def fold_all(python_dir: Path, paths: list[str], out: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(python_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths), str(out)], env=env,
                          capture_output=True, text=True, check=False, cwd=out)
    if proc.returncode != 0:
        raise SystemExit(f"folding with {python_dir} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.splitlines()[-1])
    if not Path(result["bnfold"]).is_relative_to(python_dir):
        raise SystemExit(f"bnfold imported from {result['bnfold']}, not {python_dir}")
    return result["status"]


def main() -> int:
    ref = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    paths = sorted(str(p) for p in (ROOT / "testdata").rglob("*.mlir"))
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK)
                                     else None) as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "python"],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(base / "ref", filter="data")
        outs = {}
        for side, python_dir in (("ref", base / "ref" / "python"), ("new", ROOT / "python")):
            (base / f"out-{side}").mkdir()
            outs[side] = fold_all(python_dir, paths, base / f"out-{side}")
        differ = [key for key in outs["ref"] if outs["ref"][key] != outs["new"].get(key)]
        for name in sorted(os.listdir(base / "out-ref")):
            a, b = base / "out-ref" / name, base / "out-new" / name
            if not b.exists() or a.read_bytes() != b.read_bytes():
                i, fmt = name.split(".")[:2]
                differ.append(f"{paths[int(i)]} {fmt} ({name.rsplit('.', 1)[-1]})")
        extra = set(os.listdir(base / "out-new")) - set(os.listdir(base / "out-ref"))
        differ += [f"only the working tree wrote {n}" for n in sorted(extra)]
    print(f"{len(paths)} modules, text and bytecode: {ref} ({commit[:9]}) and the working tree "
          + ("write the same outputs, reports and exit statuses" if not differ else
             f"differ in {len(differ)}:\n  " + "\n  ".join(differ)))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
