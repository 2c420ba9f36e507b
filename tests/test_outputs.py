"""Output that never destroys a file: symlinks, FIFOs, devices, modes, clashes (issue 10)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import support

CONV_BN = support.TESTDATA / "conv2d_nhwc_bn.mlir"


def run(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bnfold", "-q", *map(str, args)],
                          capture_output=True, timeout=120, cwd=cwd)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".bnfold-"))


def test_output_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real" / "model.mlir"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.mlir"
    link.symlink_to(target)
    proc = run(CONV_BN, "-o", link)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "stablehlo.convolution" in target.read_text()
    assert leftovers(tmp_path) == [] and leftovers(target.parent) == []


def test_output_keeps_an_existing_files_mode(tmp_path):
    out = tmp_path / "out.mlir"
    out.write_text("old")
    out.chmod(0o640)
    assert run(CONV_BN, "-o", out).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_output_to_a_fifo_writes_into_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    proc = run(CONV_BN, "-o", fifo)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert b"stablehlo.convolution" in received[0]


def test_report_to_a_character_device_is_written_directly(tmp_path):
    out = tmp_path / "out.mlir"
    proc = run(CONV_BN, "-o", out, "--report", "/dev/null", "--report-params", "/dev/null")
    assert proc.returncode != 0 and "same file" in proc.stderr.decode()
    proc = run(CONV_BN, "-o", out, "--report", "/dev/null")
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_report_to_stdout_with_dash(tmp_path):
    out = tmp_path / "out.mlir"
    proc = run(CONV_BN, "-o", out, "--report", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["folds"][0]["norm_op"] == "stablehlo.batch_norm_inference"
    assert "stablehlo.convolution" in out.read_text()


def test_two_outputs_to_stdout_are_an_error_and_write_nothing(tmp_path):
    proc = run(CONV_BN, "--report", "-")
    assert proc.returncode == 1 and proc.stdout == b""
    assert "standard output" in proc.stderr.decode()


def test_the_same_path_twice_is_an_error_and_writes_nothing(tmp_path):
    out = tmp_path / "out.mlir"
    link = tmp_path / "alias.json"
    link.symlink_to(out)
    proc = run(CONV_BN, "-o", out, "--report", link)
    assert proc.returncode == 1 and "same file" in proc.stderr.decode()
    assert not out.exists() and leftovers(tmp_path) == []


def test_output_naming_a_directory_is_a_clean_error(tmp_path):
    proc = run(CONV_BN, "-o", tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "is a directory" in err and "internal error" not in err
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to show /dev/stderr surviving")
def test_report_to_dev_stderr_keeps_the_device(tmp_path):
    before = os.lstat("/dev/stderr")
    proc = run(CONV_BN, "-o", tmp_path / "out.mlir", "--report", "/dev/stderr")
    assert proc.returncode == 0
    after = os.lstat("/dev/stderr")
    assert stat.S_ISLNK(after.st_mode) == stat.S_ISLNK(before.st_mode)
    assert b'"folds"' in proc.stderr


def test_staging_never_reuses_an_existing_file(tmp_path, monkeypatch):
    """The staged file is created exclusively: a name already taken is skipped, never
    truncated (two runs writing into one directory, or a stray file)."""
    from bnfold import outputs

    taken = tmp_path / f".bnfold-{(b'a' * 6).hex()}"
    taken.write_text("someone else's")
    names = iter([b"a" * 6, b"b" * 6])
    monkeypatch.setattr(outputs.os, "urandom", lambda n: next(names))
    outputs.write_file(str(tmp_path / "out.txt"), b"new", "-o")
    assert (tmp_path / "out.txt").read_bytes() == b"new"
    assert taken.read_text() == "someone else's"
    assert leftovers(tmp_path) == [taken.name]


def run_into(log: Path, *args: object, stream: str = "stdout") -> subprocess.CompletedProcess:
    """The CLI with its standard output (or error) appended to `log`, as `>> log` does."""
    with open(log, "ab") as f:
        return subprocess.run([sys.executable, "-m", "bnfold", "-q", *map(str, args)],
                              timeout=120, **{stream: f},
                              **({"stderr": subprocess.PIPE} if stream == "stdout" else
                                 {"stdout": subprocess.PIPE}))


@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1", "link"])
def test_output_to_dev_stdout_appends_to_the_log_behind_it(tmp_path, name):
    """`bnfold-opt m.mlir -o /dev/stdout >> log`: the output goes through the open
    descriptor, after what the log held. (The second breaker run: the path led to the
    log file, which was replaced by the module alone.)"""
    log = tmp_path / "log.txt"
    log.write_text("an earlier line\n")
    if name == "link":
        name = str(tmp_path / "out.mlir")
        os.symlink("/dev/stdout", name)
    proc = run_into(log, CONV_BN, "-o", name)
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert text.startswith("an earlier line\nmodule") and "stablehlo.convolution" in text
    assert leftovers(tmp_path) == []


def test_report_to_dev_stderr_appends_to_the_log_behind_it(tmp_path):
    log = tmp_path / "err.log"
    log.write_text("an earlier line\n")
    proc = run_into(log, CONV_BN, "-o", tmp_path / "out.mlir", "--report", "/dev/stderr",
                    stream="stderr")
    assert proc.returncode == 0
    text = log.read_text()
    assert text.startswith("an earlier line\n{") and '"folds"' in text


def test_dev_stdout_and_dash_are_one_output(tmp_path):
    proc = run(CONV_BN, "-o", "/dev/stdout", "--report", "-")
    assert proc.returncode == 1 and b"both write to standard output" in proc.stderr
    assert proc.stdout == b""


def test_a_closed_descriptor_is_a_clean_error(tmp_path):
    proc = run(CONV_BN, "-o", "/dev/fd/9")
    assert proc.returncode == 1 and b"cannot write '/dev/fd/9' (-o)" in proc.stderr
