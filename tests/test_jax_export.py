"""The jax.export hook: bind parameters passed as arguments, fold, and keep a working Exported."""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest

import bnfold
import support
from bnfold.jax_export import fold_exported, fold_function

NORM_OPS = ("stablehlo.batch_norm_inference", "stablehlo.rsqrt", "stablehlo.sqrt",
            "stablehlo.divide", "stablehlo.subtract", "stablehlo.multiply")


def _bn(y, p, axis):
    shape = [1] * y.ndim
    shape[axis] = -1
    r = lambda v: v.reshape(shape)  # noqa: E731
    return (y - r(p["mean"])) * jax.lax.rsqrt(r(p["var"]) + 1e-5) * r(p["gamma"]) + r(p["beta"])


def _bn_params(rng, c):
    return {"gamma": rng.uniform(0.5, 1.5, c).astype(np.float32),
            "beta": rng.normal(0, 0.3, c).astype(np.float32),
            "mean": rng.normal(0, 0.5, c).astype(np.float32),
            "var": rng.uniform(0.5, 2.0, c).astype(np.float32)}


def conv_bn_nhwc(params, x):
    y = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(_bn(y, params["bn"], 3))


def conv_bn_nchw(params, x):
    y = jax.lax.conv_general_dilated(x, params["conv"], (2, 2), ((1, 1), (1, 1)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return _bn(y, params["bn"], 1)


def dense_bn(params, x):
    return _bn(x @ params["w"] + params["b"], params["bn"], 1)


def residual_block(params, x):
    conv = lambda v, k: jax.lax.conv_general_dilated(  # noqa: E731
        v, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(_bn(conv(x, params["c1"]), params["bn1"], 3))
    y = _bn(conv(y, params["c2"]), params["bn2"], 3)
    return jax.nn.relu(x + y)


def _models():
    rng = np.random.default_rng(0)
    return {
        "conv_bn_nhwc": (conv_bn_nhwc, {"conv": rng.normal(0, .3, (3, 3, 3, 4)).astype(np.float32),
                                        "bn": _bn_params(rng, 4)},
                         rng.normal(size=(2, 8, 8, 3)).astype(np.float32), 1),
        "conv_bn_nchw": (conv_bn_nchw, {"conv": rng.normal(0, .3, (6, 3, 3, 3)).astype(np.float32),
                                        "bn": _bn_params(rng, 6)},
                         rng.normal(size=(1, 3, 9, 9)).astype(np.float32), 1),
        "dense_bn": (dense_bn, {"w": rng.normal(0, .3, (5, 7)).astype(np.float32),
                                "b": rng.normal(0, .3, 7).astype(np.float32),
                                "bn": _bn_params(rng, 7)},
                     rng.normal(size=(3, 5)).astype(np.float32), 1),
        "residual_block": (residual_block,
                           {"c1": rng.normal(0, .3, (3, 3, 4, 4)).astype(np.float32),
                            "c2": rng.normal(0, .3, (3, 3, 4, 4)).astype(np.float32),
                            "bn1": _bn_params(rng, 4), "bn2": _bn_params(rng, 4)},
                           rng.normal(size=(1, 6, 6, 4)).astype(np.float32), 2),
    }


MODELS = _models()


def _op_names(exported) -> list[str]:
    return support.op_names(exported.mlir_module())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fold_exported_end_to_end(name):
    fn, params, x, n_bn = MODELS[name]
    exported = jax.export.export(jax.jit(fn))(params, x)
    before_blob = exported.mlir_module_serialized
    folded, report = fold_exported(exported, params, argnums=0)

    assert exported.mlir_module_serialized == before_blob  # caller's Exported untouched
    assert len(report.folds) == n_bn and not report.skipped
    assert len(folded.in_avals) == 1 and folded.in_tree == jax.tree_util.tree_structure(((x,), {}))
    names = _op_names(folded)
    assert not [n for n in names if n in NORM_OPS], names
    assert names.count("stablehlo.add") <= n_bn + (1 if name in ("dense_bn", "residual_block") else 0)

    expected = np.asarray(exported.call(params, x))
    for got in (folded.call(x), jax.jit(folded.call)(x)):
        support.numerics.check_close([np.asarray(got)], [expected], "f32")

    restored = jax.export.deserialize(folded.serialize())
    support.numerics.check_close([np.asarray(restored.call(x))], [expected], "f32")
    with pytest.raises(ValueError, match="VJP"):  # inference only: differentiate the original
        folded.vjp()


@pytest.mark.parametrize("unused", ["unused", "a_unused"])  # after / before every used leaf
def test_unused_parameters_dropped_by_export_are_handled(unused):
    """jax.export drops unused leaves (module_kept_var_idx): a used leaf's module argument
    is its place among the kept leaves, not in the flat pytree (`a_unused` comes first)."""
    fn, params, x, _ = MODELS["conv_bn_nhwc"]
    params = {**params, unused: np.full(4, 7.0, np.float32)}
    exported = jax.export.export(jax.jit(fn))(params, x)
    assert len(exported.module_kept_var_idx) < len(exported.in_avals)
    folded, report = fold_exported(exported, params)
    assert folded.module_kept_var_idx == (0,) and len(report.folds) == 1
    support.numerics.check_close([np.asarray(folded.call(x))],
                                 [np.asarray(exported.call(params, x))], "f32")


def test_binding_a_later_argument_keeps_the_first():
    def fn(x, params):
        return conv_bn_nhwc(params, x)

    _, params, x, _ = MODELS["conv_bn_nhwc"]
    exported = jax.export.export(jax.jit(fn))(x, params)
    folded, report = fold_exported(exported, params, argnums=1)
    assert len(report.folds) == 1
    support.numerics.check_close([np.asarray(folded.call(x))],
                                 [np.asarray(exported.call(x, params))], "f32")


def test_errors_list_every_offender():
    fn, params, x, _ = MODELS["conv_bn_nhwc"]
    exported = jax.export.export(jax.jit(fn))(params, x)
    bad = {"conv": params["conv"][..., :2], "bn": dict(params["bn"], mean=params["bn"]["mean"].astype(np.float64))}
    with pytest.raises(ValueError) as info:
        fold_exported(exported, bad)
    assert "['conv']" in str(info.value) and "['bn']['mean']" in str(info.value)
    with pytest.raises(ValueError, match=r"pytree does not match.*missing \['bn'\]"):
        fold_exported(exported, {"conv": params["conv"]})
    with pytest.raises(ValueError, match="argnums 5 does not exist"):
        fold_exported(exported, params, argnums=5)
    with pytest.raises(ValueError, match=r"argnums \(0, 0\) repeats an argument"):
        fold_exported(exported, (params, params), argnums=(0, 0))


def test_fold_without_binding_folds_closed_over_params():
    fn, params, x, _ = MODELS["conv_bn_nchw"]
    exported = jax.export.export(jax.jit(lambda v: fn(params, v)))(x)
    folded, report = fold_exported(exported, argnums=())
    assert len(report.folds) == 1
    support.numerics.check_close([np.asarray(folded.call(x))], [np.asarray(exported.call(x))], "f32")


def test_fold_exported_without_params_binds_nothing():
    """The plain call on an export whose weights are constants (breaker run 2: the default
    argnums=0 tried to bind the input to None, 'the pytree does not match')."""
    fn, params, x, _ = MODELS["conv_bn_nchw"]
    exported = jax.export.export(jax.jit(lambda v: fn(params, v)))(x)
    folded, report = fold_exported(exported)
    assert len(report.folds) == 1
    support.numerics.check_close([np.asarray(folded.call(x))], [np.asarray(exported.call(x))], "f32")
    with pytest.raises(ValueError, match=r"argnums=1 names arguments to bind, but no params"):
        fold_exported(exported, argnums=1)


def test_fold_function_convenience():
    fn, params, x, _ = MODELS["residual_block"]
    folded = fold_function(fn, params, x)
    assert len(folded.report.folds) == 2
    support.numerics.check_close([np.asarray(folded(x))], [np.asarray(fn(params, x))], "f32")
    assert isinstance(folded.report, bnfold.Report)


def test_cli_binds_arguments_by_exported_name(tmp_path):
    """bnfold-opt --bind-params with the names jax.export records (loc("params['k']"))."""
    from bnfold.cli import main

    fn, params, x, _ = MODELS["conv_bn_nhwc"]
    exported = jax.export.export(jax.jit(fn))(params, x)
    source = tmp_path / "exported.mlir"
    source.write_text(exported.mlir_module())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    named = {f"params{jax.tree_util.keystr(path)}": np.asarray(leaf) for path, leaf in leaves}
    np.savez(tmp_path / "params.npz", **named)
    out = tmp_path / "folded.mlir"
    assert main([str(source), "-o", str(out), "-q", "--bind-params",
                 str(tmp_path / "params.npz")]) == 0
    folded = out.read_text()
    assert support.signature(folded).shapes == [x.shape]
    assert not [n for n in support.op_names(folded) if n in NORM_OPS]
    numerics = support.numerics
    numerics.check_close(numerics.run_xla(folded, [x]), [np.asarray(exported.call(params, x))], "f32")


def test_pytree_mismatch_names_the_differing_leaf_paths():
    def f(p, x):
        return x @ p["w"]

    p = {"w": np.ones((3, 2), np.float32)}
    exported = jax.export.export(jax.jit(f))(p, np.ones((1, 3), np.float32))
    with pytest.raises(ValueError) as info:
        fold_exported(exported, {"w": p["w"], "extra": p["w"]}, argnums=0)
    message = str(info.value)
    assert "unexpected ['extra']" in message and "PyTreeDef" not in message


def test_fold_function_forwards_keyword_arguments():
    def f(p, x, *, scale):
        return (x @ p["w"]) * scale

    p = {"w": np.ones((3, 2), np.float32)}
    folded = fold_function(f, p, np.ones((1, 3), np.float32), scale=np.float32(2))
    out = folded(np.ones((1, 3), np.float32), scale=np.float32(2))
    np.testing.assert_allclose(np.asarray(out), [[6.0, 6.0]])


def test_unknown_binding_names_are_listed_once_with_the_argument_names():
    text = jax.jit(lambda x, w: x @ w).lower(np.ones((1, 3), np.float32),
                                             np.ones((3, 2), np.float32)).as_text()
    with pytest.raises(bnfold.BnfoldError) as info:
        bnfold.fold_source(text, bindings={"nope": np.ones(2), "nada": np.ones(2)})
    message = str(info.value)
    assert message.count("answer to") == 1 and "'nope', 'nada'" in message


def _mobilenet_block(params, x):
    """expand -> BN -> relu6 -> depthwise -> BN -> relu6 -> project: jax.nn.relu6 is
    jitted, so the export calls a private @relu6 shared by both activations."""
    conv = lambda v, k, groups=1: jax.lax.conv_general_dilated(  # noqa: E731
        v, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups)
    y = jax.nn.relu6(_bn(conv(x, params["expand"]), params["bn1"], 3))
    y = jax.nn.relu6(_bn(conv(y, params["dw"], 8), params["bn2"], 3))
    return conv(y, params["project"])


def test_fold_exported_with_equalization_keeps_a_working_exported():
    rng = np.random.default_rng(1)
    spread = 10 ** rng.uniform(-3, 0, 8).astype(np.float32)
    params = {"expand": rng.normal(0, .3, (1, 1, 4, 8)).astype(np.float32),
              "bn1": _bn_params(rng, 8),
              "dw": (rng.normal(0, .3, (3, 3, 1, 8)) * spread).astype(np.float32),
              "bn2": _bn_params(rng, 8),
              "project": rng.normal(0, .3, (1, 1, 8, 4)).astype(np.float32)}
    x = rng.normal(size=(2, 6, 6, 4)).astype(np.float32)
    exported = jax.export.export(jax.jit(_mobilenet_block))(params, x)
    assert "call @relu6" in exported.mlir_module()
    folded, report = fold_exported(exported, params,
                                   options=bnfold.FoldOptions(equalize=True))
    [eq] = report.equalized
    assert eq.triplets == 1 and len(eq.layers) == 3
    assert "call @relu6" not in folded.mlir_module()
    expected = np.asarray(exported.call(params, x))
    for got in (folded.call(x), jax.export.deserialize(folded.serialize()).call(x)):
        support.numerics.check_close([np.asarray(got)], [expected], "f32")


# --- a serialized Exported through the command line (issue 32 item 1) -----------------------


def _saved_export(tmp_path, name="conv_bn_nhwc"):
    fn, params, x, _ = MODELS[name]
    exported = jax.export.export(jax.jit(fn))(params, x)
    source = tmp_path / "exported.bin"
    source.write_bytes(exported.serialize())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    np.savez(tmp_path / "params.npz", **{f"params{jax.tree_util.keystr(path)}": np.asarray(leaf)
                                         for path, leaf in leaves})
    return exported, params, x, source


def test_cli_folds_a_serialized_exported_into_one_that_deserializes(tmp_path):
    """What a JAX team saves (Exported.serialize()) in, a serialized Exported out (the
    default for such input): it deserializes, calls, jits and serializes again, and its
    numbers match the original's on XLA."""
    from bnfold.cli import main

    exported, params, x, source = _saved_export(tmp_path)
    out = tmp_path / "folded.bin"
    assert main([str(source), "-o", str(out), "-q", "--bind-params",
                 str(tmp_path / "params.npz")]) == 0
    folded = jax.export.deserialize(bytearray(out.read_bytes()))
    assert len(folded.in_avals) == 1 and folded.in_tree == jax.tree_util.tree_structure(((x,), {}))
    assert not [n for n in _op_names(folded) if n in NORM_OPS]
    expected = np.asarray(exported.call(params, x))
    for got in (folded.call(x), jax.jit(folded.call)(x)):
        support.numerics.check_close([np.asarray(got)], [expected], "f32")
    again = jax.export.deserialize(folded.serialize())
    support.numerics.check_close([np.asarray(again.call(x))], [expected], "f32")
    # --emit mlir of the same input: the folded StableHLO module as text (not VHLO)
    text = tmp_path / "folded.mlir"
    assert main([str(source), "-o", str(text), "-q", "--emit", "mlir", "--bind-params",
                 str(tmp_path / "params.npz")]) == 0
    support.numerics.check_close(support.numerics.run_xla(text.read_text(), [x]), [expected],
                                 "f32")


def test_cli_exported_from_stdin_without_params_folds_nothing_but_stays_an_exported(tmp_path):
    exported, params, x, source = _saved_export(tmp_path)
    out = tmp_path / "same.bin"
    proc = subprocess.run([sys.executable, "-m", "bnfold", "-", "-o", str(out)],
                          input=source.read_bytes(), capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"--bind-params" in proc.stderr  # the report says to bind the parameters
    restored = jax.export.deserialize(bytearray(out.read_bytes()))
    support.numerics.check_close([np.asarray(restored.call(params, x))],
                                 [np.asarray(exported.call(params, x))], "f32")


def test_cli_exported_errors(tmp_path, capsys):
    from bnfold.cli import main

    exported, params, x, source = _saved_export(tmp_path)
    # part of a positional argument bound: the rebuilt Exported could not drop it
    np.savez(tmp_path / "part.npz", **{"params['conv']": params["conv"]})
    out = tmp_path / "o.bin"
    assert main([str(source), "-o", str(out), "--bind-params", str(tmp_path / "part.npz")]) == 1
    err = capsys.readouterr().err
    assert "bound in part" in err and "['bn']['mean']" in err and str(source) in err
    assert not out.exists()
    # --emit exported of a module that is not an Exported
    assert main([str(support.TESTDATA / "conv2d_nhwc_bn.mlir"), "-o", str(out), "--emit",
                 "exported"]) == 1
    assert "--emit exported needs a serialized jax.export.Exported" in capsys.readouterr().err
    # garbage names the formats bnfold reads
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4)
    assert main([str(garbage), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "serialized jax.export.Exported" in err and "MLIR bytecode" in err
    assert "Traceback" not in err and not out.exists()


# --- what the Python API says about a wrong argument (issue 32 item 6) ----------------------


def test_fold_exported_accepts_serialized_bytes():
    fn, params, x, _ = MODELS["conv_bn_nhwc"]
    exported = jax.export.export(jax.jit(fn))(params, x)
    folded, report = fold_exported(exported.serialize(), params)
    assert len(report.folds) == 1
    support.numerics.check_close([np.asarray(folded.call(x))],
                                 [np.asarray(exported.call(params, x))], "f32")


def test_python_api_names_what_it_expected(tmp_path):
    fn, params, x, _ = MODELS["conv_bn_nhwc"]
    with pytest.raises(TypeError, match=r"expects a jax.export.Exported.*fold_function"):
        fold_exported(jax.jit(fn), params)
    with pytest.raises(TypeError, match=r"expects a jax.export.Exported.*fold_text"):
        fold_exported(exported_text := jax.jit(fn).lower(params, x).as_text(), params)
    assert exported_text
    with pytest.raises(bnfold.BnfoldError, match="not a serialized jax.export.Exported"):
        fold_exported(b"\x00" * 64, params)
    with pytest.raises(TypeError, match=r"fold_module expects a parsed .*Module.*fold_text"):
        bnfold.fold_module("func.func @f() { return }")
    with pytest.raises(bnfold.BnfoldError, match=r"looks like a path.*fold_source\(path="):
        bnfold.fold_text("path/to/model.mlir")
    existing = tmp_path / "model"
    existing.write_text("func.func @f() { return }")
    with pytest.raises(bnfold.BnfoldError, match="looks like a path"):
        bnfold.fold_text(str(existing))
    with pytest.raises(TypeError, match="fold_text expects MLIR text or bytes"):
        bnfold.fold_text(existing)  # a Path object
    assert bnfold.fold_text("func.func @f() { return }")[0]  # text still works


# --- quantization encodings keyed by parameter name (issue 32 item 8) -----------------------


def test_quant_encodings_are_keyed_by_the_bound_parameter_name(tmp_path):
    """--bind-params names each quantized weight by its parameter (params/c1), the
    producer's location kept in param_locations; each name's scale is the one of the
    weight its layer computes with on XLA (read back with numerics.kernel_module: c1's
    and c2's scales differ, so swapped names fail)."""
    import json

    from bnfold.cli import main

    fn, params, x, _ = MODELS["residual_block"]
    exported = jax.export.export(jax.jit(fn))(params, x)
    source = tmp_path / "exported.mlir"
    source.write_text(exported.mlir_module())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    np.savez(tmp_path / "params.npz", **{f"params{jax.tree_util.keystr(path)}": np.asarray(leaf)
                                         for path, leaf in leaves})
    out, encodings = tmp_path / "q.mlir", tmp_path / "enc.json"
    assert main([str(source), "-o", str(out), "-q", "--bind-params", str(tmp_path / "params.npz"),
                 "--quantize-weights", "int8", "--quant-encodings", str(encodings)]) == 0
    data = json.loads(encodings.read_text())
    assert sorted(data["param_encodings"]) == ["params/c1", "params/c2"]
    assert all("conv_general_dilated" in loc for loc in data["param_locations"].values())
    kernels, _ = support.numerics.kernel_module(out.read_text())
    weights = support.numerics.run_xla(kernels, [])  # in program order: c1's layer, then c2's
    for name, weight in zip(("params/c1", "params/c2"), weights, strict=True):
        [entry] = data["param_encodings"][name]
        assert np.isclose(entry["scale"] * 127, np.max(np.abs(weight)), rtol=1e-6), name
    # constants that were never parameters keep the producer's location as the key
    closed = jax.export.export(jax.jit(lambda v: fn(params, v)))(x)
    source.write_text(closed.mlir_module())
    assert main([str(source), "-o", str(out), "-q", "--quantize-weights", "int8",
                 "--quant-encodings", str(encodings)]) == 0
    keys = list(json.loads(encodings.read_text())["param_encodings"])
    assert len(keys) == 2 and all("conv_general_dilated" in k for k in keys), keys


def test_parameter_path():
    from bnfold.report import parameter_path

    assert parameter_path("params['Conv_0']['kernel']") == "params/Conv_0/kernel"
    assert parameter_path("[0].weight") == "0/weight"
    assert parameter_path("jit(apply)/Conv_0/conv_general_dilated") == \
        "jit(apply)/Conv_0/conv_general_dilated"


def test_cli_folds_a_shape_polymorphic_serialized_exported(tmp_path):
    """A symbolic batch survives: the folded Exported calls at two batch sizes."""
    from bnfold.cli import main

    fn, params, x, _ = MODELS["residual_block"]
    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(fn))(
        params, jax.ShapeDtypeStruct((b, *x.shape[1:]), np.float32))
    source = tmp_path / "poly.bin"
    source.write_bytes(exported.serialize())
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    np.savez(tmp_path / "params.npz", **{f"params{jax.tree_util.keystr(path)}": np.asarray(leaf)
                                         for path, leaf in leaves})
    out = tmp_path / "folded.bin"
    assert main([str(source), "-o", str(out), "-q", "--bind-params",
                 str(tmp_path / "params.npz")]) == 0
    folded = jax.export.deserialize(bytearray(out.read_bytes()))
    assert not [n for n in _op_names(folded) if n in NORM_OPS]
    for batch in (x, np.concatenate([x, x, x])):
        support.numerics.check_close([np.asarray(folded.call(batch))],
                                     [np.asarray(exported.call(params, batch))], "f32")


# --- save_params: the --bind-params file from an Exported (issue 32 item 4) ----------------


def _with_unused_leaves(params, x):
    """conv_bn_nhwc; `params` also holds leaves the function never reads (jax.export drops
    them: Equinox's boolean state, torch's num_batches_tracked)."""
    return conv_bn_nhwc(params, x)


def _state_with_unused_leaves(rng):
    # "a_count" and "bn/num_batches_tracked" sort before used leaves: a positional file
    # (argN or arr_N by leaf order) is shifted by them.
    return {"a_count": np.int32(7), "conv": rng.normal(0, .3, (3, 3, 3, 4)).astype(np.float32),
            "bn": {**_bn_params(rng, 4), "num_batches_tracked": np.int64(100)}}


def _cli(capsys, *args):
    from bnfold.cli import main

    capsys.readouterr()
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def test_save_params_writes_names_without_the_leaves_jax_dropped(tmp_path, capsys):
    rng = np.random.default_rng(3)
    params = _state_with_unused_leaves(rng)
    x = rng.normal(size=(1, 6, 6, 3)).astype(np.float32)
    exported = jax.export.export(jax.jit(_with_unused_leaves))(params, x)
    assert len(exported.module_kept_var_idx) < len(exported.in_avals)  # leaves were dropped
    from bnfold.jax_export import save_params

    keys = save_params(tmp_path / "params.npz", exported, params)
    assert sorted(keys) == sorted(["params['conv']"] + [f"params['bn']['{k}']" for k in
                                                        ("gamma", "beta", "mean", "var")])
    with np.load(tmp_path / "params.npz") as npz:
        assert sorted(npz.files) == sorted(keys)
        np.testing.assert_array_equal(npz["params['bn']['mean']"], params["bn"]["mean"])
    model = tmp_path / "model.mlir"
    model.write_text(exported.mlir_module())
    status, out, err = _cli(capsys, model, "--bind-params", tmp_path / "params.npz")
    assert status == 0 and "folded 1 normalization(s)" in err, err
    # Each argument was bound to its own leaf: the folded module computes the original.
    assert "stablehlo.convolution" in out and "rsqrt" not in out
    got = support.numerics.run_xla(out, [x])
    support.numerics.check_close([np.asarray(got[0])], [np.asarray(exported.call(params, x))],
                                 "f32")


def test_save_params_refuses_a_pytree_that_does_not_match(tmp_path):
    rng = np.random.default_rng(3)
    params = _state_with_unused_leaves(rng)
    exported = jax.export.export(jax.jit(_with_unused_leaves))(
        params, np.ones((1, 6, 6, 3), np.float32))
    from bnfold.jax_export import save_params

    wrong = {**params, "conv": np.ones((3, 3, 3, 5), np.float32)}
    with pytest.raises(bnfold.BnfoldError, match=r"argument 0\['conv'\]: got float32\[3, 3, 3, 5\]"):
        save_params(tmp_path / "p.npz", exported, wrong)
    assert not (tmp_path / "p.npz").exists()


def _exported_with_unused_leaves(tmp_path):
    rng = np.random.default_rng(3)
    params = _state_with_unused_leaves(rng)
    exported = jax.export.export(jax.jit(_with_unused_leaves))(
        params, np.ones((1, 6, 6, 3), np.float32))
    model = tmp_path / "model.mlir"
    model.write_text(exported.mlir_module())
    return params, model


def test_a_full_state_dict_binds_with_bind_params_extra_ignore(tmp_path, capsys):
    params, model = _exported_with_unused_leaves(tmp_path)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    state = {f"params{jax.tree_util.keystr(p)}": np.asarray(v) for p, v in leaves}
    np.savez(tmp_path / "state.npz", **state)  # every leaf, the two unused ones too
    status, out, err = _cli(capsys, model, "--bind-params", tmp_path / "state.npz")
    assert status == 1 and out == ""
    assert "2 key(s) name no argument of @main: 'params['a_count']', " in err
    assert "bnfold-opt --bind-params-extra ignore" in err and len(err.splitlines()) <= 6, err
    status, out, err = _cli(capsys, model, "--bind-params", tmp_path / "state.npz",
                            "--bind-params-extra", "ignore")
    assert status == 0 and "folded 1 normalization(s)" in err, err
    assert "ignored 2 key(s) that name no argument of @main (--bind-params-extra ignore): " \
           "'params['a_count']', 'params['bn']['num_batches_tracked']'" in err


def test_positional_savez_keys_point_to_save_params(tmp_path, capsys):
    params, model = _exported_with_unused_leaves(tmp_path)
    np.savez(tmp_path / "p.npz", *jax.tree_util.tree_leaves(params))
    status, _, err = _cli(capsys, model, "--bind-params", tmp_path / "p.npz")
    assert status == 1
    assert "are numpy.savez(path, *arrays)'s keys" in err
    assert "bnfold.jax_export.save_params(path, exported, params)" in err


def test_a_long_binding_error_is_a_few_lines_and_all_of_it_with_v(tmp_path, capsys):
    """Issue 32: one error line was 4.5 KB."""
    _, model = _exported_with_unused_leaves(tmp_path)
    names = {f"params['encoder']['layer_{i}']['batch_norm']['running_variance']": np.ones(1)
             for i in range(60)}
    names["params['conv']"] = np.ones((2, 2), np.float32)  # and mismatches
    names["params['bn']['mean']"] = np.ones(5, np.float32)
    np.savez(tmp_path / "p.npz", **names)
    status, _, err = _cli(capsys, model, "--bind-params", tmp_path / "p.npz")
    lines = err.splitlines()
    assert status == 1 and len(lines) <= 8 and max(map(len, lines)) <= 260, err
    assert "60 key(s) name no argument" in err and "and 58 more" in err
    assert "'params['conv']' is float32[2, 2] but argument" in err
    assert "bnfold-opt -v" in err
    status, _, verbose = _cli(capsys, model, "--bind-params", tmp_path / "p.npz", "-v")
    assert status == 1 and verbose.startswith(err)
    assert all(name in verbose for name in names)
