"""MLIR context, parsing, printing and artifact I/O.

This is the only module that imports private paths of jaxlib and jax
(`jaxlib.mlir._mlir_libs`, `jax._src`). Everything else in bnfold goes through
the names re-exported here, so a jaxlib upgrade touches one file.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Literal, cast

# What `import jax` does first: XLA's C++ logging reads its level when jaxlib loads, and
# without it the CPU backend's start (--check) prints its devices at INFO on stderr.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import jaxlib.mlir._mlir_libs._jax_mlir_ext as _jax_mlir_ext
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir._mlir_libs._mlir import rewrite
from jaxlib.mlir.dialects import func, stablehlo

from bnfold.errors import BnfoldError

__all__ = [
    "ir",
    "passmanager",
    "run_pipeline",
    "func",
    "stablehlo",
    "rewrite",
    "Format",
    "make_context",
    "parse",
    "serialize",
    "format_location",
    "format_diagnostics",
    "interpret",
]

Format = Literal["mlir", "bytecode", "portable"]

_BYTECODE_MAGIC = b"ML\xefR"


def make_context(*, allow_unregistered: bool = False) -> ir.Context:
    """A context with every dialect a JAX export can contain.

    `allow_unregistered` lets ops of unknown dialects parse (and pass through
    untouched), as mlir-opt's --allow-unregistered-dialect does.
    """
    context = ir.Context()
    context.allow_unregistered_dialects = allow_unregistered
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    for register in _jax_dialect_registrations():
        register(context)
    return context


@functools.cache
def _jax_dialect_registrations() -> tuple[Callable[[ir.Context], None], ...]:
    """Registration of chlo, sdy and mhlo, from their native modules.

    bnfold builds no op of these dialects, it only has to parse and print them, and the
    Python wrappers (`jaxlib.mlir.dialects.mhlo`, ...) generate op classes on import:
    30 ms of every run (mhlo alone 17 ms), a tenth of a small fold's process. A
    jaxlib that moves the native modules gets the wrappers, which re-export them.
    """
    try:
        from jaxlib.mlir._mlir_libs import _chlo, _mlirHlo, _sdy

        return (_chlo.register_dialect, _sdy.register_dialect, _mlirHlo.register_mhlo_dialect)
    except (ImportError, AttributeError):  # pragma: no cover - a jaxlib layout not released yet
        from jaxlib.mlir.dialects import chlo, mhlo, sdy

        return (chlo.register_dialect, sdy.register_dialect, mhlo.register_mhlo_dialect)


def detect_format(data: bytes) -> Format:
    """Text, plain MLIR bytecode, or a StableHLO portable artifact (VHLO bytecode)."""
    if not data.startswith(_BYTECODE_MAGIC):
        return "mlir"
    # The producer string of a portable artifact names StableHLO and the
    # payload uses the vhlo dialect; plain bytecode never mentions vhlo.
    return "portable" if b"vhlo" in data[:4096] or b"StableHLO_v" in data[:64] else "bytecode"


ACCEPTED_FORMATS = ("expected MLIR text, MLIR bytecode, a StableHLO portable artifact "
                    "(VHLO bytecode) or a serialized jax.export.Exported "
                    "(Exported.serialize())")


def looks_like_exported(data: bytes, *, head_only: bool = False) -> bool:
    """The start of a flatbuffer as `jax.export.Exported.serialize()` writes it: a root
    table offset, its vtable inside the data, and the module's portable artifact (MLIR
    bytecode) somewhere in it (not checked when `data` is only the file's head). A
    cheap test: `deserialize_exported` decides."""
    if len(data) < 16 or data.startswith(_BYTECODE_MAGIC):
        return False
    root = int.from_bytes(data[:4], "little")
    if root < 4 or root % 4 or root + 4 > len(data):
        return False
    vtable = root - int.from_bytes(data[root:root + 4], "little", signed=True)
    if not 4 <= vtable <= len(data) - 4:
        return head_only and vtable >= 4
    size = int.from_bytes(data[vtable:vtable + 2], "little")
    return 4 <= size <= 256 and size % 2 == 0 and (head_only or _BYTECODE_MAGIC in data)


def deserialize_exported(data: bytes) -> object | None:
    """The `jax.export.Exported` that `data` (the bytes of `Exported.serialize()`)
    holds, or None when it holds none (the reader does not validate: any error of
    it, or a module that is not a portable artifact, means "not an Exported")."""
    if not looks_like_exported(data):
        return None
    import jax

    try:
        exported = jax.export.deserialize(bytearray(data))
        module = exported.mlir_module_serialized
    except Exception:  # noqa: BLE001 - an unvalidated flatbuffer fails in any way
        return None
    return exported if isinstance(module, bytes) and module.startswith(_BYTECODE_MAGIC) \
        else None


def parse(data: bytes | str, context: ir.Context, *, name: str = "<input>") -> ir.Module:
    """Parses text, bytecode or a portable artifact; verifies the result.

    Raises `BnfoldError` carrying the MLIR diagnostics (with `name` in place of
    the parser's "-" file name) on any failure.
    """
    raw = data.encode() if isinstance(data, str) else data
    fmt = detect_format(raw)  # empty input: an empty module (mlir-opt's convention)
    if fmt == "mlir" and b"\x00" in raw[:4096]:
        raise BnfoldError(f"input is not a format bnfold reads: {ACCEPTED_FORMATS}"
                          + ("; this looks like a serialized jax.export.Exported, which "
                             "the command line and bnfold.jax_export.fold_exported read"
                             if looks_like_exported(raw) else ""), location=name)
    with context, _read_errors(name):
        if fmt == "portable":
            return _deserialize(raw, context, name)
        return ir.Module.parse(raw)


def _deserialize(raw: bytes, context: ir.Context, name: str) -> ir.Module:
    """A portable artifact; its reader prints diagnostics itself (with "-" as the file)
    and raises a bare "failed to deserialize": collect them into one located error."""
    diagnostics: list[str] = []

    def collect(diagnostic: ir.Diagnostic) -> bool:
        where = format_location(diagnostic.location, name)
        where = name if where in ("unknown", f"{name}:0:0") else where
        diagnostics.append(f"{where}: error: {diagnostic.message}")
        return True  # handled: nothing printed behind our back

    handler = cast(ir.DiagnosticHandler, context.attach_diagnostic_handler(collect))
    try:
        return stablehlo.deserialize_portable_artifact(context, raw)
    except (RuntimeError, ValueError) as e:
        raise BnfoldError("\n".join(diagnostics) or f"{name}: error: cannot read input: {e}",
                          preformatted=True) from None
    finally:
        handler.detach()


def parse_path(path: str, context: ir.Context, *, name: str | None = None) -> ir.Module:
    """Like `parse`, but lets MLIR read the file itself (no copy of it in Python)."""
    name = name or path
    with open(path, "rb") as f:
        head = f.read(4096)
    fmt = detect_format(head)
    if fmt == "portable" or (fmt == "mlir" and b"\x00" in head):
        with open(path, "rb") as f:
            return parse(f.read(), context, name=name)
    with context, _read_errors(name):
        return ir.Module.parseFile(path)


@contextlib.contextmanager
def _read_errors(name: str) -> Iterator[None]:
    """MLIR's parse errors as a `BnfoldError` with the diagnostics, `name` as the file."""
    try:
        yield
    except BnfoldError:
        raise
    except ir.MLIRError as e:
        raise BnfoldError(format_diagnostics(e, name), preformatted=True) from None
    except (RuntimeError, ValueError) as e:
        raise BnfoldError(f"cannot read input: {e}", location=name) from None


def write(module: ir.Module, fmt: Format, file: BinaryIO, *, target_version: str | None = None,
          debug_info: bool = False, generic: bool = False,
          elide_larger: int | None = None) -> None:
    """Streams the module to a binary file object (no full copy in Python for text).

    Text options follow mlir-opt: `debug_info` (--mlir-print-debuginfo),
    `generic` (--mlir-print-op-generic), `elide_larger`
    (--mlir-elide-elementsattrs-if-larger: constants with more elements print
    as `dense_resource<__elided__>`).
    """
    if fmt == "portable":
        file.write(serialize(module, fmt, target_version=target_version))
    elif fmt == "bytecode":
        module.operation.write_bytecode(file)
    else:
        module.operation.print(file=file, binary=True, enable_debug_info=debug_info,
                               print_generic_op_form=generic, large_elements_limit=elide_larger,
                               assume_verified=True)


def serialize(module: ir.Module, fmt: Format, *, target_version: str | None = None,
              debug_info: bool = False, generic: bool = False,
              elide_larger: int | None = None) -> bytes:
    """The module as text, bytecode or a portable artifact."""
    if fmt == "portable":
        target = target_version or stablehlo.get_current_version()
        check_target_version(target)
        # Shardy (sdy) ops and attributes ride along, as jax.export does.
        try:
            return stablehlo.serialize_portable_artifact(module, target, True)
        except (ir.MLIRError, RuntimeError, ValueError) as e:
            raise BnfoldError(f"cannot serialize a portable artifact for StableHLO "
                              f"{target}: {e}") from None
    buf = io.BytesIO()
    write(module, fmt, buf, debug_info=debug_info, generic=generic, elide_larger=elide_larger)
    return buf.getvalue()


def check_target_version(version: str) -> None:
    """A StableHLO version this jaxlib can write: minimum <= version <= current."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    low, high = stablehlo.get_minimum_version(), stablehlo.get_current_version()
    if not re.fullmatch(r"\d+\.\d+\.\d+", version) or not key(low) <= key(version) <= key(high):
        raise BnfoldError(f"invalid --target-version '{version}': expected a StableHLO "
                          f"version between {low} and {high}")


_NAME_LOC_RE = re.compile(r'^"((?:[^"\\]|\\.)*)"\(')


# The typed location class of jaxlib's bindings (op.location is one), where it has it.
_FILE_LINE_COL = getattr(ir, "FileLineColLoc", None)
# File names MLIR prints as they are: printable ASCII without a quote or a backslash.
_PLAIN_FILE = re.compile(r'[ !#-\[\]-~]*')


def format_location(loc: ir.Location, name: str | None = None) -> str:
    """`file:line:col` for file locations, the name for name locations.

    `name` replaces the parser's "-" file name of text parsed from memory.
    Name locations keep only their name (jax.export names ops like
    `jit(f)/BatchNorm_0/sub`; the call stack behind it is noise in a report).
    """
    if type(loc) is _FILE_LINE_COL:
        # A point in a plainly named file, read from its fields: what the printed
        # form gives below, without printing it (a fold's record asks twice)
        point: Any = loc  # the stubs know only ir.Location
        file = name if name is not None and point.filename == "-" else point.filename
        line, col = point.start_line, point.start_col
        if (point.end_line, point.end_col) == (line, col) and _PLAIN_FILE.fullmatch(file):
            return f"{file}:{line}:{col}"
    text = str(loc)
    if text.startswith("loc(") and text.endswith(")"):
        text = text[4:-1]
    if name is not None and text.startswith('"-":'):
        text = f'"{name}":' + text[4:]
    match = _NAME_LOC_RE.match(text)
    if match:
        return match.group(1)
    return text.replace('"', "") if text.count('"') == 2 and text.startswith('"') else text


# A name location: loc("name") or loc("name"(child)), not a file location loc("f":1:2).
_LOC_NAME_RE = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"[()]')


def location_name(loc: ir.Location) -> str | None:
    """The name of a name location (jax.export names arguments `params['k']`)."""
    match = _LOC_NAME_RE.match(str(loc))
    return match.group(1).replace('\\"', '"') if match else None


def format_diagnostics(error: ir.MLIRError, name: str) -> str:
    lines = []
    for diag in error.error_diagnostics:
        lines.append(f"{format_location(diag.location, name)}: error: {diag.message}")
        for note in diag.notes:
            lines.append(f"{format_location(note.location, name)}: note: {note.message}")
    return "\n".join(lines) or f"{name}: error: {error}"


# --- upstream passes -----------------------------------------------------------

_PASSES_REGISTERED = False


def register_passes() -> None:
    """Registers StableHLO's passes (once) so textual pipelines can name them."""
    global _PASSES_REGISTERED
    if not _PASSES_REGISTERED:
        stablehlo.register_stablehlo_passes()
        _PASSES_REGISTERED = True


def run_pipeline(module: ir.Module, pipeline: str) -> None:
    """Runs a textual MLIR pass pipeline (upstream and StableHLO passes) on `module`."""
    register_passes()
    with module.context:
        passmanager.PassManager.parse(pipeline).run(module.operation)


# --- operation identity ------------------------------------------------------

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_OPERATION_CAPSULE = b"jaxlib.mlir.ir.Operation._CAPIPtr"


def _checked_op_id(op: ir.Operation | ir.OpView) -> int:
    return int(_capsule_pointer(op.operation._CAPIPtr, _OPERATION_CAPSULE))


# A capsule's pointer is the field after its object header (CPython's PyCapsule struct);
# reading it costs 0.3 us where the checked call through ctypes costs 2, and a fold asks
# for thousands of ops' identities. Used only when it reads what the checked call does
# (`_capsule_layout_known`), else `_checked_op_id`.
_HEADER = object.__basicsize__
_read_pointer = ctypes.c_void_p.from_address


def _fast_op_id(op: ir.Operation | ir.OpView) -> int:
    capsule = op.operation._CAPIPtr  # alive while its field is read
    return _read_pointer(id(capsule) + _HEADER).value or 0


def _capsule_layout_known() -> bool:
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"bnfold.probe")
    for address in (0x1234560, 0x7FFF_F000_0010):
        capsule = new(address, name, None)
        if _read_pointer(id(capsule) + _HEADER).value != address:
            return False
    return True


# `op_id(op)`: the address of the underlying MLIR operation, a stable dictionary key.
# Python wrappers of one operation compare equal but hash by object identity, and a
# walk hands out fresh wrappers, so `hash(op)` cannot key a dictionary across lookups.
# Valid while the operation is not erased. (The function itself, not a wrapper: a
# 300-layer fold asks 10k times.)
op_id: Callable[[ir.Operation | ir.OpView], int] = \
    _fast_op_id if _capsule_layout_known() else _checked_op_id


# --- dense_resource blobs ------------------------------------------------------

_BLOB_RE = re.compile(rb'^\s*[^\s:]+:\s*"0x([0-9A-Fa-f]*)"', re.MULTILINE)


def resource_blob(attr: ir.Attribute) -> bytes:
    """The raw bytes of a `dense_resource<...>` attribute's blob.

    jaxlib exposes no reader for resource blobs, so a one-constant module is
    printed (its resource section holds only the blob it references) and the
    hex read back; the blob's 4-byte alignment header is dropped. Raises
    ValueError when the blob is not available (e.g. elided).
    """
    with attr.context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            stablehlo.ConstantOp(attr)
        buf = io.BytesIO()
        module.operation.print(file=buf, binary=True)
    text = buf.getvalue()
    section = text.find(b"dialect_resources")
    match = _BLOB_RE.search(text, section) if section >= 0 else None
    if match is None:
        raise ValueError(f"the blob of {attr} is not in the module")
    return bytes.fromhex(match.group(1).decode())[4:]


# --- execution -------------------------------------------------------------


def interpret(module: ir.Module, inputs: Sequence[ir.Attribute]) -> list[ir.Attribute]:
    """Runs `module` on the StableHLO reference interpreter.

    The interpreter aborts the process on ops it does not support; callers
    must expand or reject those first (see `bnfold.numerics`).
    """
    return list(stablehlo.eval_module(module, list(inputs)))


def xla_cpu_run(module: str | bytes, inputs: Sequence[object]) -> list[object]:
    """Compiles a StableHLO module (text or bytecode) on XLA CPU, runs it once and
    returns its outputs as numpy arrays (jax has no public API for running a module
    that was not traced from Python: this uses its backend's compile_and_load)."""
    import jax
    import jax.extend
    import numpy as np
    from jax._src.lib import xla_client as xc

    backend = jax.extend.backend.get_backend("cpu")
    device = backend.devices()[0]
    exe = backend.compile_and_load(module, xc.DeviceList((device,)), xc.CompileOptions())
    # enable_x64 keeps f64/i64 inputs and outputs 64-bit for this call only.
    with jax.enable_x64(True):
        args = [jax.device_put(np.asarray(x), device) for x in inputs]
        results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
        return [np.asarray(r[0]) for r in results]


def xla_compile(module: str | bytes, platform: str | None = None) -> tuple[object, object]:
    """Compiles a StableHLO module (text or bytecode) with jax's backend for `platform`
    ("cpu", "gpu", ...; None: jax's default backend, the accelerator where one is
    present) for that backend's first device. Returns the loaded executable and the
    device: `executable.execute_sharded([jax arrays on the device])` runs it, and
    `executable.hlo_modules()` holds the optimized HLO (what `Compiled.as_text()` shows)."""
    import jax
    import jax.extend
    from jax._src.lib import xla_client as xc

    backend = jax.extend.backend.get_backend(platform)
    device = backend.devices()[0]
    return backend.compile_and_load(module, xc.DeviceList((device,)), xc.CompileOptions()), device
