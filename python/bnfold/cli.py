"""bnfold-opt: fold batch normalization in StableHLO files, opt-style.

Exit status: 0 on success (whether or not anything folded), 1 on bad input,
bad options or an internal error, 2 when nothing folded and --fail-if-nothing-folded
asked for it (the outputs are written). On failure nothing is written to the
output file: output goes through a temporary file and a rename.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, NoReturn

from bnfold import __version__, options
from bnfold.errors import BnfoldError
from bnfold.options import OptionError, cli_spelling
from bnfold.outputs import Outputs
from bnfold.patterns import PASSES, REGISTRY, Stage
from bnfold.pipeline import Bindings, Folded, FoldOptions, check_skipped_functions, fold_source
from bnfold.report import Report

PROG = "bnfold-opt"
_SPLIT_RE = re.compile(r"^// -----.*$", re.MULTILINE)

EPILOG = """\
patterns (names for --disable):
{patterns}

passes (for --pass-pipeline; options as name=value in braces):
{passes}

quantization (--equalize, --absorb-high-bias, --bias-correction) takes the activations' ranges
and means from the folded batch norms' statistics: statistics that do not describe the data
(never trained or calibrated) can make the quantized model worse; the report warns about
statistics that are exactly their initial values (mean 0, variance 1, gamma 1, beta 0).

examples:
  bnfold-opt model.mlir                        print the folded module, summary on stderr
  bnfold-opt model.mlir -o folded.mlirbc --emit bytecode
  bnfold-opt exported.bin --bind-params params.npz -o folded.bin
                         (a serialized jax.export.Exported in, one out: jax.export.deserialize reads it)
  bnfold-opt model.mlir --emit portable -o folded.vhlo    (a StableHLO portable artifact)
  bnfold-opt model.mlir -o folded.mlir --check   (run both on XLA CPU, compare; exit 1 if off)
  bnfold-opt model.mlir --report report.json --report-params stats.npz
  bnfold-opt model.mlir -o folded.mlir --report-overlay folds.json   (Model Explorer node data)
  bnfold-opt model.mlir -o folded.mlir --visualize     (both graphs in Model Explorer; bnfold[viz])
  bnfold-opt model.mlir --bind-params params.npz          (fold parameters passed as arguments;
                             write the file with bnfold.jax_export.save_params(path, exported, params))
  bnfold-opt model.mlir -o eq.mlir --equalize --report-params scales.npz  (for int8 weights)
  bnfold-opt model.mlir -o q.mlir --equalize --quantize-weights int8 --bias-correction
  bnfold-opt model.mlir --disable forward-affine --skip-func encoder
  cat model.mlir | bnfold-opt - --expand-batch-norm > expanded.mlir
"""


class _Parser(argparse.ArgumentParser):
    """Bad options exit 1 like every other error (argparse's default is 2), in one line
    (not the 15 lines of usage): an unknown flag gets the nearest known one."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(1, f"{self.prog}: error: {_suggest(self, message)} ({self.prog} --help "
                     f"lists the options)\n")


_UNRECOGNIZED = "unrecognized arguments: "


def _suggest(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's "unrecognized arguments: --equalise" -> "unknown option --equalise; did
    you mean --equalize?" (other messages are kept)."""
    if not message.startswith(_UNRECOGNIZED):
        return message
    import difflib

    known = [o for o in parser._option_string_actions if o.startswith("--")]
    parts, extra = [], []
    for arg in message[len(_UNRECOGNIZED):].split(" "):
        if not arg.startswith("-") or arg == "-":
            extra.append(f"'{arg}'")
            continue
        flag = arg.split("=", 1)[0]
        near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        parts.append(f"unknown option {flag}" + (f"; did you mean {near[0]}?" if near else ""))
    if extra:
        parts.append(f"unexpected argument(s) {', '.join(extra)} ({PROG} takes one INPUT)")
    return "; ".join(parts)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter at the terminal's width, found the way
    shutil.get_terminal_size() does but without importing shutil (argparse
    builds a formatter for every add_argument: 3 ms of every run's start)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_terminal_columns() - 2)


class _LazyHelp(str):
    """An argument's help text, made by `make` when it is expanded (`help % params`, as
    argparse and tools/gen_docs.py do): the `--check` help quotes bnfold.check's
    tolerances, and importing that module would cost every run 2 ms."""

    make: Callable[[], str]

    def __new__(cls, make: Callable[[], str]) -> _LazyHelp:
        self = super().__new__(cls, "(help)")
        self.make = make
        return self

    def __mod__(self, params: object) -> str:
        return self.make() % params


def _terminal_columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
        if columns > 0:
            return columns
    except (KeyError, ValueError):
        pass
    stdout = sys.__stdout__
    try:
        return os.get_terminal_size(stdout.fileno()).columns if stdout else 80
    except (ValueError, OSError):
        return 80


# The files a run writes besides the module (-o): flag, metavar, help. `build_parser`
# declares them and `_outputs` stages them (all or nothing, never through a symlink's
# replacement), in this order.
REPORT_FILES: tuple[tuple[str, str, str], ...] = (
    ("--report", "FILE.json",
     "write the fold report (folds and skipped ops with reasons) as "
     "JSON; '-' is stdout (then give -o a file)"),
    ("--report-params", "FILE.npz",
     "save each fold's statistics as <fold id>/<name> arrays: scale, "
     "shift, and gamma/beta/mean/variance/epsilon for batch_norm_inference; "
     "'-' is stdout"),
    ("--quant-encodings", "FILE.json",
     "with --quantize-weights: write each quantized weight's bits, "
     "scale(s) and zero point as an AIMET-style encodings file, keyed "
     "by the parameter's name where the weight was bound "
     "(--bind-params: params/Conv_0/kernel), else by the producer's "
     "location; param_locations maps each key to that location"),
    ("--report-overlay", "FILE.json",
     "write Model Explorer node data: FILE.json for the input graph "
     "(each normalization op folded, into what, or not, and why) and "
     "FILE.output.json for the output graph (each producer that absorbed "
     "folds); load them as node data next to the two modules"),
)


def build_parser() -> argparse.ArgumentParser:
    patterns = "\n".join(f"  {e.name:20s} {e.description}" for e in REGISTRY)
    passes = "\n".join(f"  {p.name:26s} {p.description}\n  {'':26s} options: "
                       f"{', '.join(p.option_names())}" for p in PASSES)
    parser = _Parser(
        prog=PROG,
        description="Fold batch normalization (batch_norm_inference and the decomposed chains "
                    "real exporters emit) into the preceding or following convolution / "
                    "dot_general of a StableHLO module.",
        epilog=EPILOG.format(patterns=patterns, passes=passes),
        formatter_class=_Formatter,
    )
    parser.add_argument("input", nargs="?", default="-", metavar="INPUT",
                        help="MLIR text, MLIR bytecode, a StableHLO portable artifact or a "
                             "serialized jax.export.Exported (Exported.serialize(); format "
                             "detected); '-' or omitted reads stdin (at a terminal, it says so)")
    parser.add_argument("-o", "--output", default="-", metavar="OUTPUT",
                        help="where to write the folded module ('-', the default: stdout); "
                             "a file is replaced atomically (a symlink's target, keeping its "
                             "mode), a FIFO or device is written directly")
    parser.add_argument("--emit", choices=("mlir", "bytecode", "portable", "exported"),
                        default=None,
                        help="output format: MLIR text (the default for MLIR input), MLIR "
                             "bytecode, a StableHLO portable artifact (VHLO bytecode, the "
                             "module inside a jax.export.Exported), or a serialized "
                             "jax.export.Exported (the default for such input; "
                             "jax.export.deserialize reads it)")
    parser.add_argument("--target-version", metavar="V",
                        help="StableHLO version for --emit portable, e.g. 1.0.0 "
                             "(default: the current version)")
    for flag, metavar, help in REPORT_FILES:
        parser.add_argument(flag, metavar=metavar, help=help)
    parser.add_argument("--report-format", choices=("json", "text"), default=None,
                        help="with --report: JSON (default) or a human-readable table")
    parser.add_argument("--visualize", action="store_true",
                        help="after writing the outputs, show the input and the folded module "
                             "with the overlay in Model Explorer's local server (needs the "
                             "'bnfold[viz]' extra); prints the URL on stderr (stdout keeps only "
                             "the module), Ctrl+C stops")
    parser.add_argument("--visualize-port", type=int, default=None, metavar="PORT",
                        help="with --visualize: port of the server on localhost (default: 8080)")
    parser.add_argument("--bind-params", metavar="FILE.npz",
                        help="bind function arguments to these arrays before folding; keys are "
                             "argN or argument names (jax.arg_info / loc names); bound arguments "
                             "become constants and leave the signature")
    parser.add_argument("--bind-params-extra", choices=("error", "ignore"), default=None,
                        help="with --bind-params: keys that name no argument are an error "
                             "(default) or are ignored ('ignore': a full state dict, whose "
                             "unused entries jax.export dropped)")
    parser.add_argument("--bind-func", default=None, metavar="NAME",
                        help="with --bind-params: the function whose arguments it binds "
                             "(default: main)")
    _add_check_arguments(parser)
    parser.add_argument("--pass-pipeline", metavar="PIPELINE",
                        help="run this textual pipeline instead of the default fold, mixing "
                             "bnfold's passes (" + ", ".join(p.name for p in PASSES) + "; see "
                             "'passes' below) with MLIR's, e.g. "
                             "'builtin.module(bnfold-fold{disable=forward-affine},cse,symbol-dce)'")
    options.add_arguments(parser)  # --disable, --skip-func, --equalize, ... (the schema)
    parser.add_argument("--split-input-file", action="store_true",
                        help="treat '// -----' lines as separators of independent modules; a "
                             "bad chunk is reported with its line, the others are still "
                             "processed (printed to stdout; a file output is written only "
                             "when every chunk succeeded), and the exit status is 1")
    parser.add_argument("--fail-if-nothing-folded", action="store_true",
                        help="exit with status 2 when nothing folded (the outputs are still "
                             "written; for CI scripts)")
    parser.add_argument("--mlir-print-debuginfo", "--print-debuginfo", dest="print_debuginfo",
                        action="store_true", help="print locations in MLIR text output "
                                                  "(--emit mlir)")
    parser.add_argument("--mlir-print-op-generic", dest="print_generic", action="store_true",
                        help="print ops in the generic form (--emit mlir)")
    parser.add_argument("--mlir-elide-elementsattrs-if-larger", dest="elide_larger", type=int,
                        metavar="N", help="print constants with more than N elements as "
                                          "dense_resource<__elided__> (readable, not runnable; "
                                          "--emit mlir)")
    parser.add_argument("--emit-bytecode", dest="emit", action="store_const", const="bytecode",
                        help="same as --emit bytecode")
    parser.add_argument("--allow-unregistered-dialect", action="store_true",
                        help="accept ops of dialects bnfold does not know; they pass through "
                             "untouched")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no summary line on stderr")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="the whole of a long error (every parameter that does not bind, "
                             "every argument's names), not its first lines")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


# The modules `run()` never frees (None when `main()` runs in-process, e.g. in
# tests): dropping one destroys every op of the model first (5-15 ms for
# ResNet-50), which the exit below would skip.
_retained: list[Folded] | None = None
_collector_off = False  # `run` turned the cyclic garbage collector off


def run() -> NoReturn:
    """The `bnfold-opt` / `python -m bnfold` entry point: `main()`, then exit
    without tearing down the interpreter and the MLIR context. Every output is
    written and closed by then; freeing each attribute of a large model (the
    original and the folded kernels) one by one costs tens of milliseconds that
    the OS reclaims at once (compilers skip it the same way: clang's
    -disable-free).

    Python's cyclic garbage collector is off until the options are known (`__main__`
    turns it off before the imports too), and stays off for a plain fold
    (`_collector_for`): a fold leaves a few hundred objects in cycles, however large the
    model, so the collector frees nothing while its passes over the bindings' wrappers
    cost ~2% of the run (10 ms of the 300-layer bench)."""
    global _retained, _collector_off
    _retained = []
    gc.disable()
    _collector_off = True
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            code = code or 1
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    name = "<stdin>" if args.input == "-" else args.input
    try:
        return _run(args, name)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); nothing useful left to say.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 1
    except BnfoldError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; no output written", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - reported with a reproducer, never a bare traceback
        print(f"{PROG}: internal error while processing {name}; no output written.\n"
              f"{_save_reproducer(args, argv, traceback.format_exc())}", file=sys.stderr)
        return 1


def _collector_for(args: argparse.Namespace, fold_options: FoldOptions) -> None:
    """Turns the cyclic collector back on (where `run` turned it off) unless the run is a
    plain fold. The quantization stages' records do form cycles that hold per-layer
    arrays (53 of each on ResNet-50), and without the collector that run is 6-25%
    slower (memory the allocator cannot reuse); so are a pass pipeline (it may
    quantize) and `--check` (it runs the model on XLA)."""
    quantizing = any(entry.stage >= Stage.QUANTIZE and fold_options.enabled(entry.name,
                                                                            entry.opt_in)
                     for entry in REGISTRY)
    if _collector_off and (quantizing or args.pass_pipeline is not None or args.check):
        gc.enable()


def _options(args: argparse.Namespace) -> FoldOptions:
    # Statistics recovery costs a tenth of a small fold; only --report-params shows them.
    # The report's warnings (untrained statistics) need them too.
    return options.from_cli(args, statistics=bool(args.report_params or args.report))


_stdin: list[bytes] = []  # what was read from stdin, for a reproducer after a crash


def _read(path: str) -> bytes:
    if path == "-":
        _say_stdin_is_read()
        data = sys.stdin.buffer.read()
        _stdin[:] = [data]
        return data
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise BnfoldError(f"cannot read '{path}': {e.strerror}") from None


def _run(args: argparse.Namespace, name: str) -> int:
    from bnfold import ir as bir

    _check_dependent_flags(args)
    quantizes = False
    if args.pass_pipeline is not None:
        from bnfold import passes

        # A bad pipeline is an error before any work.
        in_pipeline = passes.pipeline_options(args.pass_pipeline)
        _check_pipeline_flags(args, in_pipeline)
        quantizes = any(o.quantize_weights for o in in_pipeline.values())
    options = _options(args)
    quantizes = quantizes or bool(options.quantize_weights)
    _collector_for(args, options)
    emit_default = args.emit is None
    args.emit = args.emit or "mlir"
    if args.split_input_file and args.emit != "mlir":
        raise BnfoldError("--split-input-file works with --emit mlir only")
    if args.target_version and args.emit != "portable":
        raise BnfoldError("--target-version needs --emit portable")
    if args.target_version:
        bir.check_target_version(args.target_version)
    if args.report_overlay and args.split_input_file:
        raise BnfoldError("--report-overlay describes one module; it does not work with "
                          "--split-input-file")
    if args.visualize and (args.input == "-" or args.split_input_file or args.bind_params
                           or args.pass_pipeline):
        raise BnfoldError("--visualize needs an input file and the default pipeline (no "
                          "stdin, --split-input-file, --bind-params or --pass-pipeline)")
    if args.visualize:
        from bnfold import viz

        viz.check_installed()  # before any work
        viz.check_port("localhost", args.visualize_port)
    if args.quant_encodings and not quantizes:
        raise BnfoldError("--quant-encodings needs --quantize-weights, or a pipeline pass "
                          "that quantizes (it describes the quantized weights)")
    if not args.check and (args.check_tolerance is not None or args.check_dim):
        raise BnfoldError("--check-tolerance and --check-dim set up --check; add --check")
    if args.check_tolerance is not None and not 0 < args.check_tolerance < float("inf"):
        raise BnfoldError(f"--check-tolerance {args.check_tolerance:g}: expected a positive "
                          "relative tolerance (e.g. 1e-4)")
    if args.check and args.split_input_file:
        raise BnfoldError("--check compares one module with its output; it does not work "
                          "with --split-input-file")
    if args.report_overlay == "-":
        raise BnfoldError("--report-overlay writes two files (FILE.json and FILE.output.json); "
                          "give it a file name, not '-'")
    _refuse_binary_to_terminal(args)
    outputs = _outputs(args)
    outputs.check()  # a directory or a clash is an error before any work
    params = _load_params(args.bind_params) if args.bind_params else None
    bound: Bindings | None = params
    if params is not None and args.bind_params_extra == "ignore":
        bound = _ignoring_extra_keys(params, args)
    start = time.perf_counter()
    report = Report()
    out: bytes | Callable[[BinaryIO], None]
    overlays: tuple[bytes, bytes] | None = None
    folded_exported: tuple[Any, Folded] | None = None
    data: bytes | None = None
    if args.split_input_file:
        results = [_process(args, options, name, bound, report, data=chunk)
                   for chunk in _split(_read(args.input))]
        folded = [m for m in results if m is not None]
        _check_skipped(args, options, folded)
        out = b"// -----\n".join(m.serialize("mlir", **_print_options(args)) for m in folded)
        if len(folded) != len(results):
            # Like mlir-opt: the other chunks are still printed and the exit status
            # is 1; a file output stays untouched (never a partial file).
            if args.output == "-":
                sys.stdout.buffer.write(out)
                sys.stdout.buffer.flush()
            return 1
    else:
        data = _read("-") if args.input == "-" else _exported_file(args.input)
        if data is not None and _is_exported(data):
            folded_exported = _process_exported(args, options, name, bound, report,
                                                data, emit_default)
            module = folded_exported[1] if folded_exported else None
        elif args.emit == "exported":
            if args.input != "-":
                _read(args.input)  # a missing file says so first
            raise BnfoldError("--emit exported needs a serialized jax.export.Exported as input "
                              "(the bytes of Exported.serialize()); for a module use --emit "
                              "portable (the StableHLO artifact inside an Exported)",
                              location=name)
        elif args.input == "-":
            module = _process(args, options, name, bound, report, data=data)
        else:
            if not os.path.exists(args.input) or os.path.isdir(args.input):
                _read(args.input)  # raises the "cannot read" error
            module = _process(args, options, name, bound, report, path=args.input)
        if module is None:
            return 1
        out = functools.partial(_write_module, module, args)
        if args.emit == "exported" and folded_exported:
            out = bytes(folded_exported[0].serialize())
        if args.report_overlay:
            overlays = _overlays(module, report, name)
        if args.check and not _check(args, name, bound, module, folded_exported, data):
            return 1
    outputs.set_data("-o", out)
    if args.report:
        outputs.set_data("--report", (report.dumps() if args.report_format == "json"
                                      else report.table()).encode())
    if args.report_params:
        outputs.set_data("--report-params", report.params_npz())
    if args.quant_encodings:
        outputs.set_data("--quant-encodings", _json(report.encodings()))
    if overlays is not None:
        outputs.set_data("--report-overlay", overlays[0])
        outputs.set_data(OVERLAY_OUTPUT, overlays[1])
    outputs.write_all()
    if not args.quiet:
        elapsed = time.perf_counter() - start
        print(f"{PROG}: {name}: {report.summary()} in {elapsed:.2f} s", file=sys.stderr)
    status = 0
    if args.fail_if_nothing_folded and not report.folds:
        print(f"{PROG}: {name}: nothing folded; exit status 2 (--fail-if-nothing-folded)",
              file=sys.stderr)
        status = 2
    if args.visualize:
        _visualize(args, options, status)
    return status


def _check_skipped(args: argparse.Namespace, fold_options: FoldOptions,
                   folded: list[Folded]) -> None:
    """--skip-func over a split input: each name must be a function of some chunk."""
    skipped = set(fold_options.skip_functions)
    if args.pass_pipeline is not None:
        from bnfold import passes

        for pass_options in passes.pipeline_options(args.pass_pipeline).values():
            skipped |= set(pass_options.skip_functions)
    if not skipped:
        return
    names = [name for m in folded for name in m.input_functions]
    try:
        check_skipped_functions(skipped, names)
    except OptionError as e:
        raise e.spelled(cli_spelling if args.pass_pipeline is None else
                        lambda name: "--pass-pipeline: skip-func") from None


def _check_pipeline_flags(args: argparse.Namespace, in_pipeline: dict[int, FoldOptions]) -> None:
    """With --pass-pipeline, a fold option given as a flag would apply to no pass: it is an
    error that says how to write it in the pipeline (never silently ignored)."""
    from bnfold import pass_syntax
    from bnfold.passes import PASS_SPECS

    given = options.given_on_cli(args)
    if not given:
        return
    options_given = [written.partition("=")[0] for _, written in given]
    elements = pass_syntax.parse(args.pass_pipeline)
    target = next((elements[i].name for i in in_pipeline
                   if set(options_given) <= set(PASS_SPECS[elements[i].name].option_names())),
                  "bnfold-fold")
    flags = ", ".join(options.cli_spelling(name) for name, _ in given)
    raise BnfoldError(f"with --pass-pipeline, the pipeline's passes take the fold options: "
                      f"{flags} would apply to no pass. Write "
                      f"{'it' if len(given) == 1 else 'them'} in the pipeline as pass options: "
                      f"'{target}{{{' '.join(w for _, w in given)}}}'",
                      location=options.cli_spelling(given[0][0]))


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    def check_help() -> str:
        from bnfold.check import TOLERANCE

        table = ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items())
        return ("run the original and the output on XLA CPU with seeded inputs of @main's "
                "shapes (integers for integer arguments) and print the max relative "
                "difference, and both modules' error against the original evaluated in "
                "float64 where it can be; past the tolerance "
                f"({table}, of the narrowest float type the original computes in) exit 1 "
                "and write nothing")

    def dim_help() -> str:
        from bnfold.check import DEFAULT_DIM

        return ("--check's size of a symbolic dimension (jax.export's name, e.g. b=4, or "
                f"argK.D); default {DEFAULT_DIM}; repeatable")

    parser.add_argument("--check", action="store_true", help=_LazyHelp(check_help))
    parser.add_argument("--check-tolerance", type=float, metavar="RTOL",
                        help="--check's tolerance for every output instead of the table "
                             "(e.g. 0.05 with --quantize-weights, which changes the weights)")
    parser.add_argument("--check-dim", action="append", default=[], metavar="NAME=SIZE",
                        help=_LazyHelp(dim_help))


def _check(args: argparse.Namespace, name: str, bound: Bindings | None,
           module: Folded, folded_exported: tuple[Any, Folded] | None,
           data: bytes | None) -> bool:
    """--check: the original and the output on XLA CPU; prints the verdict."""
    from bnfold import check

    if folded_exported is not None:
        from bnfold.jax_export import deserialize

        assert data is not None
        original: bytes = deserialize(data, name=name).mlir_module_serialized
    else:
        original = data if data is not None else _read(args.input)
    result = check.check(original, module.module, name=name,
                         bindings=bound if args.bind_func == "main" else None,
                         dims=check.parse_dims(args.check_dim),
                         tolerance=args.check_tolerance)
    print(f"{PROG}: {name}: {result.summary()}", file=sys.stderr)
    if not result.passed:
        hint = (" (--quantize-weights changes the weights: give --check-tolerance)"
                if getattr(args, "quantize_weights", None) else "")
        print(f"{PROG}: {name}: the output is not equivalent on XLA CPU{hint}; no output "
              "written", file=sys.stderr)
    return result.passed


def _say_stdin_is_read() -> None:
    """Without an input argument at a terminal, bnfold-opt seems to hang: say why."""
    if _isatty(sys.stdin):
        print(f"{PROG}: reading the module from standard input (end it with Ctrl+D; "
              f"'{PROG} --help' for usage)", file=sys.stderr)
        sys.stderr.flush()


def _isatty(stream: Any) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


def _refuse_binary_to_terminal(args: argparse.Namespace) -> None:
    """Bytecode, a portable artifact or an .npz on a terminal is noise (and can upset it)."""
    binary = [("-o", args.output, f"--emit {args.emit}" if args.emit != "mlir" else None),
              ("--report-params", args.report_params, ".npz")]
    for flag, path, what in binary:
        if what and path in ("-", "/dev/stdout") and _isatty(sys.stdout):
            raise BnfoldError(f"refusing to write binary output ({what}) to a terminal: "
                              f"give {flag} a file name, or redirect stdout")


def _visualize(args: argparse.Namespace, options: FoldOptions, status: int = 0) -> None:
    """Serves both modules until Ctrl+C or SIGTERM; the temporary copies go either way
    (the outputs are written by now: an interrupt here is how the server stops)."""
    from bnfold import viz

    # Model Explorer prints its banner and URL on stdout, which may be the module's stream
    # (`--visualize > folded.mlir`): stdout is stderr until the process exits.
    with viz.stdout_to_stderr():
        try:
            with viz.session(args.input, options=options) as view:
                print(f"{PROG}: Model Explorer: the input (left, {view.input.name}) and the "
                      f"folded module (right, {view.shown.name}, its functions named "
                      f"NAME{viz.FOLDED_SUFFIX}) side by side, each with its node data "
                      f"'{viz.NODE_DATA_NAME}' (temporary files in {view.input.parent}, "
                      f"removed when the server stops)\n"
                      f"{PROG}: legend: {viz.LEGEND}", file=sys.stderr)
                sys.stderr.flush()
                viz.serve(view, port=args.visualize_port)
        except KeyboardInterrupt:
            pass
        print(f"{PROG}: Model Explorer stopped; its temporary files are removed",
              file=sys.stderr)
        # Model Explorer leaves non-daemon threads behind (its server; a PyPI version check
        # that can take a minute without network), which would keep the process alive after
        # Ctrl+C. The outputs and the report are written by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _outputs(args: argparse.Namespace) -> Outputs:
    outputs = Outputs()
    outputs.add("-o", args.output, b"")
    for flag, _, _ in REPORT_FILES:
        if path := getattr(args, flag[2:].replace("-", "_")):
            outputs.add(flag, path, b"")
    if args.report_overlay:
        outputs.add(OVERLAY_OUTPUT, overlay_output_path(args.report_overlay), b"")
    return outputs


OVERLAY_OUTPUT = "--report-overlay (output graph)"


def overlay_output_path(path: str) -> str:
    """FILE.json -> FILE.output.json (the output graph's node data)."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.output.{ext}" if dot and "/" not in ext else f"{path}.output.json"


def _overlays(folded: Folded, report: Report, name: str) -> tuple[bytes, bytes]:
    """Model Explorer node data of the input and of the output graph."""
    from bnfold import overlay

    return _json(overlay.input_overlay(report)), _json(folded.output_nodes or {})


def _json(data: Any) -> bytes:
    import json  # only for --report-overlay (start-up time)

    return (json.dumps(data, indent=1) + "\n").encode()


def _exported_file(path: str) -> bytes | None:
    """The file's bytes when its start looks like a serialized jax.export.Exported (a
    flatbuffer, not MLIR); None otherwise (MLIR reads the file itself)."""
    from bnfold import ir as bir

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if not bir.looks_like_exported(head, head_only=True):
                return None
            return head + f.read()
    except OSError:
        return None  # the MLIR path reports it


def _is_exported(data: bytes) -> bool:
    from bnfold import ir as bir

    return bir.looks_like_exported(data)


def _process_exported(args: argparse.Namespace, options: FoldOptions, name: str,
                      bound: Bindings | None, report: Report, data: bytes,
                      emit_default: bool) -> tuple[Any, Folded] | None:
    """A serialized jax.export.Exported: binds (--bind-params by @main's argument names),
    folds and rebuilds it (`bnfold.jax_export.fold_serialized`); `--emit exported` (the
    default here) writes the new Exported's bytes."""
    from bnfold.jax_export import fold_serialized

    if emit_default:
        args.emit = "exported"
        _refuse_ineffective(args, [f for f in _DEPENDENT if f[2].startswith("--emit")])
    if args.visualize or args.bind_func != "main":
        raise BnfoldError("a serialized jax.export.Exported works without --visualize and "
                          "--bind-func (its parameters are @main's arguments)", location=name)
    try:
        exported, folded = fold_serialized(
            data, bound, name=name, options=options,
            allow_unregistered=args.allow_unregistered_dialect,
            pass_pipeline=args.pass_pipeline, graph_nodes=bool(args.report_overlay))
    except BnfoldError as e:
        print(_error_line(e), file=sys.stderr)
        return None
    report.merge(folded.report)
    if _retained is not None:
        _retained.append(folded)
    return exported, folded


def _write_module(folded: Folded, args: argparse.Namespace, file: BinaryIO) -> None:
    from bnfold import ir as bir

    with folded.context:
        bir.write(folded.module, args.emit, file, target_version=args.target_version,
                  **_print_options(args))


def _print_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"debug_info": args.print_debuginfo, "generic": args.print_generic,
            "elide_larger": args.elide_larger}


# Flags that only mean something with another one: (flag, its dest, what it needs, is that
# given?). A flag that cannot take effect is an error naming what it needs, never a no-op.
# --emit defaults to mlir (None until the input's format is known: a serialized Exported
# defaults to exported, and the check runs again then).
_DEPENDENT: tuple[tuple[str, str, str, Callable[[argparse.Namespace], bool]], ...] = (
    ("--report-format", "report_format", "--report", lambda a: bool(a.report)),
    ("--visualize-port", "visualize_port", "--visualize", lambda a: bool(a.visualize)),
    ("--bind-func", "bind_func", "--bind-params", lambda a: bool(a.bind_params)),
    ("--bind-params-extra", "bind_params_extra", "--bind-params", lambda a: bool(a.bind_params)),
    ("--mlir-print-debuginfo", "print_debuginfo", "--emit mlir (bytecode and portable "
     "artifacts always keep locations)", lambda a: a.emit in (None, "mlir")),
    ("--mlir-print-op-generic", "print_generic", "--emit mlir (it is a text form)",
     lambda a: a.emit in (None, "mlir")),
    ("--mlir-elide-elementsattrs-if-larger", "elide_larger", "--emit mlir (bytecode and "
     "portable artifacts keep every constant)", lambda a: a.emit in (None, "mlir")),
)


def _refuse_ineffective(args: argparse.Namespace, flags: Sequence[tuple[str, str, str, Callable[
        [argparse.Namespace], bool]]]) -> None:
    for flag, dest, needs, given in flags:
        value = getattr(args, dest, None)
        if value is not None and value is not False and not given(args):
            raise BnfoldError(f"{flag} needs {needs}; without it, it would do nothing")


def _check_dependent_flags(args: argparse.Namespace) -> None:
    _refuse_ineffective(args, _DEPENDENT)
    if args.report_format is None:
        args.report_format = "json"
    if args.visualize_port is None and args.visualize:
        from bnfold.viz import DEFAULT_PORT

        args.visualize_port = DEFAULT_PORT
    if args.bind_func is None:
        args.bind_func = "main"


def _process(args: argparse.Namespace, options: FoldOptions, name: str,
             bound: Bindings | None,
             report: Report, *, data: bytes | None = None,
             path: str | None = None) -> Folded | None:
    """Parses, binds and folds one module; prints errors and returns None on failure."""
    try:
        folded = fold_source(data, path=path, name=name, options=options, bindings=bound,
                             bind_function=args.bind_func,
                             allow_unregistered=args.allow_unregistered_dialect,
                             pass_pipeline=args.pass_pipeline,
                             graph_nodes=bool(args.report_overlay),
                             check_skipped=not args.split_input_file)
    except BnfoldError as e:
        if isinstance(e, OptionError):  # named as the command line spells it
            e = e.spelled(cli_spelling)
        print(_error_line(e), file=sys.stderr)
        details = getattr(e, "details", None)  # a long error's whole text (binding.BindError)
        if details and args.verbose:
            print(details, file=sys.stderr)
        return None
    report.merge(folded.report)
    if _retained is not None:
        _retained.append(folded)
    return folded


def _error_line(e: BnfoldError) -> str:
    """MLIR's located diagnostics as they are (`file:line:col: error: ...`, as mlir-opt
    prints them); an error about an option or without a place gets the program's name."""
    located = e.preformatted or (e.location is not None and not e.location.startswith("-"))
    return str(e) if located else f"{PROG}: {e}"


def _split(data: bytes) -> list[bytes]:
    """Splits on '// -----', padding each chunk so line numbers match the file."""
    text = data.decode("utf-8", errors="replace")
    chunks = []
    line = 0
    for piece in _SPLIT_RE.split(text):
        chunks.append(("\n" * line + piece).encode())
        line += piece.count("\n")
    return chunks


def _load_params(path: str) -> dict[str | int, Any]:
    import numpy as np

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"PK\x03\x04":  # an .npz is a zip archive; np.load would try pickle
            raise BnfoldError("not an .npz archive (write one with numpy.savez(path, "
                              "**{'argN' or name: array}))", location=path)
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as e:
        if isinstance(e, BnfoldError):
            raise
        raise BnfoldError(f"cannot read parameters '{path}': {getattr(e, 'strerror', None) or e}"
                          ) from None


def _without_input(argv: list[str]) -> list[str]:
    """`argv` without the input argument (the first positional one), every other argument
    kept, '-' included (`-o -` stays `-o -`), each quoted for a shell."""
    import shlex  # only after a crash (start-up time)

    actions = build_parser()._option_string_actions
    takes_value = {s for s, action in actions.items() if action.nargs != 0}
    kept: list[str] = []
    value_next = dropped = positional_only = False
    for arg in argv:
        if value_next:
            value_next = False
        elif positional_only or arg == "-" or not arg.startswith("-"):
            if not dropped:
                dropped = True
                continue
        elif arg == "--":
            positional_only = True
        elif "=" not in arg and (arg in takes_value or (arg.startswith("--") and any(
                s.startswith(arg) for s in takes_value) and not any(
                s.startswith(arg) for s in set(actions) - takes_value))):
            value_next = True
        kept.append(arg)
    return [shlex.quote(a) for a in kept]


def _ignoring_extra_keys(bound: dict[str | int, Any], args: argparse.Namespace
                         ) -> Callable[[Any], dict[str | int, Any]]:
    """--bind-params-extra ignore: the keys that name an argument of the parsed module (a
    full state dict's other entries are left out, and a line on stderr says which)."""

    def known(module: Any) -> dict[str | int, Any]:
        from bnfold.binding import short_list, unknown_keys

        unknown = unknown_keys(module, list(bound), function=args.bind_func)
        if unknown and not args.quiet:
            shown = short_list([f"'{k}'" for k in unknown])
            print(f"{PROG}: --bind-params: ignored {len(unknown)} key(s) that name no argument "
                  f"of @{args.bind_func} (--bind-params-extra ignore): {shown}", file=sys.stderr)
        return {k: v for k, v in bound.items() if k not in unknown}

    return known


def _save_reproducer(args: argparse.Namespace, argv: list[str], trace: str) -> str:
    """torch-mlir style: keep the input and the traceback, print the exact command."""
    import shlex
    import tempfile  # only after a crash

    directory = tempfile.mkdtemp(prefix="bnfold-repro-")
    source = os.path.join(directory, "input")
    data: bytes | None = _stdin[0] if args.input == "-" and _stdin else None
    if data is None and args.input != "-" and os.path.isfile(args.input):
        try:
            with open(args.input, "rb") as src:
                data = src.read()
        except OSError:
            data = None
    if data is not None:
        with open(source, "wb") as dst:
            dst.write(data)
    with open(os.path.join(directory, "traceback.txt"), "w") as f:
        f.write(trace)
    flags = _without_input(argv)
    saved = "the input and traceback.txt" if data is not None else \
        "traceback.txt; the input could not be saved"
    command = f"  {PROG} {shlex.quote(source if data is not None else args.input)} " \
        f"{' '.join(flags)}".rstrip()
    return (f"Saved a reproducer in {directory} ({saved}). Reproduce with:\n{command}\n"
            f"Please file it with the traceback: this is a bnfold bug.")


if __name__ == "__main__":
    sys.exit(main())
