"""Writing results without ever destroying what sits at an output path.

    outputs = Outputs()
    outputs.add("-o", "folded.mlir", write_module)     # bytes, or a function writing to a file
    outputs.add("--report", "report.json", report_bytes)
    outputs.write_all()                                 # all of them, or none

Rules:
- `-` is standard output (at most one output may use it).
- A path that names one of this process's open descriptors (`/dev/stdout`,
  `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`, or a symlink to one) is
  written through that descriptor, as `-` is: reopening it would truncate
  the file behind it (`-o /dev/stdout >> log` would empty the log) or, staged
  and renamed, replace it.
- A regular file or a missing path is written to a temporary file in the
  directory of its real (symlink-resolved) path, then renamed over it: a
  symlink stays a symlink and its target is replaced; an existing file keeps
  its mode, a new one gets the mode `open()` would give it (umask).
- Anything else that already exists (a FIFO, a character device such as
  `/dev/null` or `/dev/stderr`) is opened and written directly, after every
  staged file was written successfully.
- A directory, or the same file named by two outputs, is an error before
  anything is written. Every error path removes its temporary files.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from bnfold.errors import BnfoldError

Data = bytes | Callable[[BinaryIO], None]
STDOUT = "-"


@dataclass
class _Output:
    """One output: where it goes, which flag asked for it, and its staged file."""

    flag: str
    path: str
    data: Data
    real: str = ""
    tmp: str | None = None
    fd: int | None = None  # the open descriptor the path names (`-` is 1), set by check()


@dataclass
class Outputs:
    """A set of outputs written together: all of them or none."""

    _items: list[_Output] = field(default_factory=list)

    def add(self, flag: str, path: str, data: Data) -> None:
        self._items.append(_Output(flag, path, data))

    def set_data(self, flag: str, data: Data) -> None:
        """Fills in what the output added as `flag` will hold."""
        next(o for o in self._items if o.flag == flag).data = data

    def check(self) -> None:
        """Raises BnfoldError for a directory, or two outputs naming one file or stdout."""
        seen: dict[str, str] = {}
        for out in self._items:
            out.fd = _descriptor(out.path)
            if out.fd is not None:
                key = STDOUT if out.fd == 1 else f"descriptor {out.fd}"
            else:
                out.real = os.path.realpath(out.path)
                if os.path.isdir(out.path):
                    raise BnfoldError(f"cannot write '{out.path}' ({out.flag}): it is a "
                                      f"directory")
                key = out.real
            if key in seen:
                what = "standard output" if key == STDOUT else \
                    key if out.fd is not None else f"the same file '{out.path}'"
                raise BnfoldError(f"{seen[key]} and {out.flag} would both write to {what}; "
                                  f"give one of them another path")
            seen[key] = out.flag

    def write_all(self) -> None:
        self.check()
        descriptors = [o for o in self._items if o.fd is not None]
        staged = [o for o in self._items
                  if o not in descriptors and _is_regular_or_missing(o.path)]
        direct = [o for o in self._items if o not in descriptors and o not in staged]
        try:
            for out in staged:
                _stage(out)
            for out in direct:
                _write_direct(out)
            for out in descriptors:
                _write_descriptor(out)
            for out in staged:
                assert out.tmp is not None
                os.replace(out.tmp, out.real)
                out.tmp = None
        finally:
            for out in staged:
                if out.tmp is not None and os.path.exists(out.tmp):
                    os.unlink(out.tmp)


def write_file(path: str, data: Data, flag: str = "output") -> None:
    """Writes one output under the rules above."""
    outputs = Outputs()
    outputs.add(flag, path, data)
    outputs.write_all()


# A descriptor of this process as procfs names it (what /dev/stdout and /dev/fd/N lead to).
_PROC_FD = r"/proc/(self|thread-self|\d+)(?:/task/\d+)?/fd/(\d+)"  # compiled on first use
_MAX_LINKS = 40  # as the kernel's own limit on symlinks in a path


def _descriptor(path: str) -> int | None:
    """The open descriptor of this process that `path` names (`-` is 1), or None.

    Follows symlinks one at a time, resolving only the directories on the way
    (`/dev/fd` is a symlink to `/proc/self/fd`): the last link of `/proc/self/fd/1`
    leads to whatever the descriptor has open (a log file appended to), which
    is not where to write."""
    if path == STDOUT:
        return 1
    current = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        head, tail = os.path.split(current)
        head = os.path.realpath(head)
        current = os.path.join(head, tail)
        found = re.fullmatch(_PROC_FD, current)
        if found is not None:
            owner = found.group(1)
            own = owner in ("self", "thread-self") or int(owner) == os.getpid()
            return int(found.group(2)) if own else None
        if not os.path.islink(current):
            return None
        current = os.path.abspath(os.path.join(head, os.readlink(current)))
    return None


def _write_descriptor(out: _Output) -> None:
    """Writes through the open descriptor itself (its offset, its O_APPEND); standard
    output through sys.stdout, as `-` always did (a caller may have replaced it)."""
    fd = out.fd
    assert fd is not None
    if fd == 1:
        sys.stdout.flush()
        sys.stdout.buffer.write(_bytes(out.data))
        sys.stdout.buffer.flush()
        return
    if fd == 2:
        sys.stderr.flush()
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            _emit(out.data, f)
    except OSError as e:
        raise BnfoldError(f"cannot write '{out.path}' ({out.flag}): {e.strerror}") from None


def _is_regular_or_missing(path: str) -> bool:
    """What `path` (symlinks followed) is: a regular file, or nothing yet."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True


def _bytes(data: Data) -> bytes:
    if isinstance(data, bytes):
        return data
    buffer = io.BytesIO()
    data(buffer)
    return buffer.getvalue()


def _emit(data: Data, file: BinaryIO) -> None:
    if isinstance(data, bytes):
        file.write(data)
    else:
        data(file)


def _stage(out: _Output) -> None:
    directory = os.path.dirname(out.real)
    try:
        fd, out.tmp = _create_temporary(directory)
    except OSError as e:
        raise BnfoldError(f"cannot write '{out.path}' ({out.flag}): {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            _emit(out.data, f)
        os.chmod(out.tmp, _mode_for(out.real))
    except OSError as e:
        raise BnfoldError(f"cannot write '{out.path}' ({out.flag}): {e.strerror}") from None


def _create_temporary(directory: str) -> tuple[int, str]:
    """A new file in `directory`, created exclusively (tempfile.mkstemp without
    importing tempfile, shutil and their compression modules on every run)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(directory or ".", f".bnfold-{os.urandom(6).hex()}")
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", directory)


def _mode_for(path: str) -> int:
    """An existing file's permission bits, or what open() would give a new file."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _write_direct(out: _Output) -> None:
    try:
        with open(out.path, "wb") as f:
            _emit(out.data, f)
    except OSError as e:
        raise BnfoldError(f"cannot write '{out.path}' ({out.flag}): {e.strerror}") from None
