"""numba's internals behind one seam (numbapool/_numba.py): each assumption it makes of numba
is checked, and a numba that breaks one gets a clear error naming numba's version and the
assumption, or numba's public path after one warning, never a crash or a wrong answer."""

import ast
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import numba
import numpy as np
import pytest
from llvmlite import ir as llvm_ir
from numba import types
from numba.core import caching
from numba.core.cpu import CPUTargetOptions
from numba.core.registry import cpu_target
from numba.core.untyped_passes import InlineInlinables
from reference import pool

import numbapool
from numbapool import _numba
from numbapool._kernels import parallel

PACKAGE = pathlib.Path(numbapool.__file__).parent
# what numbapool imports of numba outside the seam: what numba's user documentation
# describes as public
PUBLIC = {
    "numba",
    "numba:njit",
    "numba:prange",
    "numba:types",
    "numba.extending:intrinsic",
    "numba.extending:overload",
    "numba.core.extending:intrinsic",
    "numba.core.extending:overload",
    "numba.core:cgutils",
    "numba.core:event",
}
# attributes of numba's objects that only the seam reads
INTERNAL_ATTRIBUTES = {
    "overloads",
    "typeof_pyval",
    "call_conv",
    "get_arg_packer",
    "targetctx",
    "target_context",
    "fndesc",
    "_cache",
    "data_model_manager",
    "create_library",
    "_is_initialized",
    "_get_num_threads",
    "_launch_threads",
    "_locator_classes",
}


@pytest.fixture(autouse=True)
def warn_afresh(monkeypatch):
    """Each test sees the seam's one warning per reach anew."""
    monkeypatch.setattr(_numba, "_WARNED", set())


def _delete(monkeypatch, cls, name):
    """Take ``name`` away from ``cls``, from the class in its MRO that defines it."""
    monkeypatch.delattr(next(owner for owner in cls.__mro__ if name in vars(owner)), name)


def _numba_imports(path: pathlib.Path) -> list[str]:
    """The numba modules and names ``path`` imports (``module`` or ``module:name``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "numba"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numba":
            found += [f"{node.module}:{alias.name}" for alias in node.names]
    return found


def test_nothing_outside_the_seam_uses_numbas_internals():
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_numba.py":
            continue
        private = [entry for entry in _numba_imports(path) if entry not in PUBLIC]
        private += [
            f".{node.attr}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES
        ]
        if private:
            outside[str(path.relative_to(PACKAGE))] = private
    assert outside == {}


def test_an_llvm_older_than_the_kernels_need_is_refused_naming_the_versions():
    _numba.check_llvm()  # the installed one
    with pytest.raises(_numba.NumbaInternalsError) as error:
        _numba.check_llvm((15, 0, 7))
    message = str(error.value)
    assert f"numba {numba.__version__}" in message and "LLVM 20" in message
    assert f"numba>={_numba.oldest_numba()}" in message


def test_the_oldest_numba_named_is_the_one_pyproject_declares():
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert f'"numba>={_numba.oldest_numba()}"' in pyproject


def test_numba_and_llvm_older_than_supported_are_refused_at_import():
    script = (
        "from llvmlite import binding\nbinding.llvm_version_info = (15, 0, 7)\nimport numbapool\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1
    assert "NumbaInternalsError" in run.stderr and "LLVM 20 or newer" in run.stderr


def test_a_numba_without_the_reference_counting_option_is_refused(monkeypatch):
    _delete(monkeypatch, CPUTargetOptions, "_nrt")
    with pytest.raises(_numba.NumbaInternalsError, match="_nrt=False"):
        _numba._jit_options()


def test_a_numba_without_the_wrapper_options_keeps_its_wrappers_after_a_warning(monkeypatch):
    _delete(monkeypatch, CPUTargetOptions, "no_cpython_wrapper")
    with pytest.warns(_numba.NumbaInternalsWarning, match="no_cpython_wrapper"):
        kernel, inlined = _numba._jit_options()
    assert (kernel, inlined) == ({"_nrt": False}, {"_nrt": False})


def test_the_array_layout_is_read_from_numbas_data_model():
    array = types.Array(types.float32, 2, "C")
    fields = _numba.array_fields(cpu_target.target_context, array)
    model = cpu_target.target_context.data_model_manager[array]
    assert [name for name, _ in fields] == [
        name for name in model._fields for _ in range(2 if name in ("shape", "strides") else 1)
    ]


class _ReorderedModel:
    """An array's data model with its fields in another order (or named otherwise)."""

    def __init__(self, model, fields):
        self._model, self._fields = model, fields

    def get_member_fe_type(self, name):
        return self._model.get_member_fe_type(name)


class _Models:
    """numba's data model manager, but for the arrays' model looked up by the seam."""

    def __init__(self, models, model):
        self.models, self.model = models, model

    def __getitem__(self, numba_type):
        return self.model

    def __getattr__(self, name):
        return getattr(self.models, name)


@pytest.mark.parametrize(
    "fields",
    [
        ("meminfo", "parent", "data", "itemsize", "nitems", "shape", "strides"),  # data moved
        ("meminfo", "parent", "nitems", "itemsize", "data", "shape", "strides", "flags"),
        ("meminfo", "parent", "size", "itemsize", "data", "shape", "strides"),
    ],
)
def test_an_array_layout_the_driver_cannot_pack_is_refused(fields, monkeypatch):
    context = cpu_target.target_context
    array = types.Array(types.float32, 2, "C")
    model = context.data_model_manager[array]
    monkeypatch.setattr(
        context,
        "data_model_manager",
        _Models(context.data_model_manager, _ReorderedModel(model, fields)),
    )
    with pytest.raises(_numba.NumbaInternalsError, match="array"):
        _numba.array_fields(context, array)


def test_a_layout_with_two_fields_swapped_is_packed_in_numbas_order(monkeypatch):
    # fields of one kind swapped: the block follows the model's order, by name
    context = cpu_target.target_context
    array = types.Array(types.float32, 2, "C")
    model = context.data_model_manager[array]
    swapped = ("meminfo", "parent", "itemsize", "nitems", "data", "shape", "strides")
    monkeypatch.setattr(
        context,
        "data_model_manager",
        _Models(context.data_model_manager, _ReorderedModel(model, swapped)),
    )
    value = np.zeros((3, 5), np.float32)
    slots = parallel._flattened(context, array, value)
    assert [(name, field) for _, field, name in slots][2:4] == [("itemsize", 4), ("nitems", 15)]


def test_a_calling_convention_without_status_and_exception_pointers_is_refused():
    arguments = (types.int64, types.int64)
    plain = llvm_ir.FunctionType(llvm_ir.IntType(32), [llvm_ir.IntType(64)] * 2)
    with pytest.raises(_numba.NumbaInternalsError, match="calling convention"):
        _numba._status_and_exception_first(plain, arguments)


def test_a_dispatcher_without_compiled_overloads_is_refused():
    class Dispatcher:
        overloads = {}

    with pytest.raises(_numba.NumbaInternalsError, match="overloads"):
        _numba.compiled_overload(Dispatcher(), (types.int64,))


@pytest.mark.parametrize("symbol", ["get_num_threads", "set_parallel_chunksize"])
def test_a_threading_layer_without_its_c_functions_is_refused(symbol, monkeypatch):
    lookup = _numba._llvm.address_of_symbol
    monkeypatch.setattr(
        _numba._llvm, "address_of_symbol", lambda name: None if name == symbol else lookup(name)
    )
    with pytest.raises(_numba.NumbaInternalsError, match=symbol):
        _numba.check_threading_layer.__wrapped__()


def test_a_runtime_without_its_c_functions_is_refused(monkeypatch):
    lookup = _numba._llvm.address_of_symbol
    monkeypatch.setattr(
        _numba._llvm,
        "address_of_symbol",
        lambda name: None if name == "NRT_MemInfo_release" else lookup(name),
    )
    with pytest.raises(_numba.NumbaInternalsError, match="NRT_MemInfo_release"):
        _numba.check_runtime.__wrapped__()


def test_the_thread_count_falls_back_to_numbas_own(monkeypatch):
    numba.get_num_threads()  # numba's threads started
    monkeypatch.setattr(_numba, "_numba_parallel", SimpleNamespace(_is_initialized=True))
    with pytest.warns(_numba.NumbaInternalsWarning, match="_get_num_threads"):
        assert _numba.layer_thread_count() == numba.get_num_threads()


def test_whether_numbas_threads_run_falls_back_to_numbas_own(monkeypatch):
    monkeypatch.setattr(_numba, "_numba_parallel", SimpleNamespace())
    with pytest.warns(_numba.NumbaInternalsWarning, match="_is_initialized"):
        assert _numba.layer_started() == (numbapool._threads.threading_layer() is not None)


def _keeps_the_unchanged_copy(self, state, work_list, block, i, expr, inline_worker):
    kept, _, _, new_blocks = inline_worker.inline_function(state.func_ir, block, i, None)
    return kept is not None


def test_an_inliner_that_keeps_its_unchanged_copy_is_found(monkeypatch):
    # the handed-over blocks are right only while InlineInlinables drops the unchanged copy
    monkeypatch.setattr(InlineInlinables, "_do_work", _keeps_the_unchanged_copy)
    _numba._inliner_problem.cache_clear()
    try:
        assert "discards the unchanged copy" in _numba._inliner_problem()
    finally:
        _numba._inliner_problem.cache_clear()


def test_numbas_own_inliner_drops_its_unchanged_copy():
    assert _numba._inliner_problem() is None


def test_an_inliner_with_another_signature_gets_numbas_own_inlining(monkeypatch):
    numbas = InlineInlinables._do_work

    def _do_work(self, state, work_list, block, i, expr, inline_worker, extra=None):
        return numbas(self, state, work_list, block, i, expr, inline_worker)

    monkeypatch.setattr(InlineInlinables, "_do_work", _do_work)
    monkeypatch.setattr(_numba, "_UNTYPED_IR", {})
    _numba._inliner_problem.cache_clear()
    try:

        @numba.njit(inline="always")
        def plus(x, y):
            return x + y

        @numba.njit(pipeline_class=_numba.LiteralKindsCompiler)
        def twice_plus(x):
            return plus(x, x) + plus(x, 1)

        with pytest.warns(_numba.NumbaInternalsWarning, match="_do_work"):
            assert twice_plus(3) == 10
        assert _numba._UNTYPED_IR == {}  # numba's own inlining made the IR
    finally:
        _numba._inliner_problem.cache_clear()


def test_a_pipeline_without_the_pass_the_constants_follow_is_refused(monkeypatch):
    # the kernels compile only with their literal kinds made constants: no public path
    class NotInThePipeline:
        pass

    monkeypatch.setattr(_numba, "FixupArgs", NotInThePipeline)

    @numba.njit(pipeline_class=_numba.LiteralKindsCompiler)
    def by_kind(x, kind):
        return x + 1 if kind == 0 else x * 2

    with pytest.raises(_numba.NumbaInternalsError, match="has the passes NotInThePipeline"):
        by_kind(3, 1)


def test_an_ir_without_its_definitions_is_refused(monkeypatch):
    class State:
        func_ir = object()

    with pytest.raises(_numba.NumbaInternalsError, match="_definitions"):
        _numba.LiteralArgumentsAsConstants().run_pass(State())


@pytest.mark.parametrize("method", ["_save_index", "_load_overload"])
def test_cache_classes_without_their_methods_give_numbas_own_cache(method, monkeypatch, tmp_path):
    owner = caching.IndexDataCacheFile if method == "_save_index" else caching.FunctionCache
    _delete(monkeypatch, owner, method)
    _numba._cache_problem.cache_clear()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    try:

        def add_one(x):
            return x + 1

        with pytest.warns(_numba.NumbaInternalsWarning, match=method):
            dispatcher = _numba.njit_cached(add_one)
        assert not isinstance(dispatcher._cache, _numba._KernelCache)
        assert not _numba.in_disk_cache(dispatcher, (types.int64,))
    finally:
        _numba._cache_problem.cache_clear()


def test_a_cache_without_the_attributes_it_reads_gives_numbas_own_cache(monkeypatch, tmp_path):
    numbas = caching.IndexDataCacheFile.__init__

    def without_stamp(self, cache_path, filename_base, source_stamp):
        numbas(self, cache_path, filename_base, source_stamp)
        del self._source_stamp

    monkeypatch.setattr(caching.IndexDataCacheFile, "__init__", without_stamp)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))

    def add_one(x):
        return x + 1

    with pytest.warns(_numba.NumbaInternalsWarning, match="_source_stamp"):
        dispatcher = _numba.njit_cached(add_one)
    assert not isinstance(dispatcher._cache, _numba._KernelCache)


def test_the_kernels_run_right_after_every_fallback(tmp_path):
    # the public paths in one fresh process: numba's wrappers, pipeline, inlining, cache
    script = """
import sys, warnings
from numba.core import caching, cpu
from numba.core.untyped_passes import InlineInlinables
delattr(next(c for c in cpu.CPUTargetOptions.__mro__ if "no_cfunc_wrapper" in vars(c)),
        "no_cfunc_wrapper")
index_key = caching.FunctionCache._index_key
caching.FunctionCache._index_key = lambda self, sig, codegen, extra=None: index_key(
    self, sig, codegen)
do_work = InlineInlinables._do_work
InlineInlinables._do_work = lambda self, state, work_list, block, i, expr, inline_worker, \\
    extra=None: do_work(self, state, work_list, block, i, expr, inline_worker)
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import numpy as np, numbapool
    x = np.arange(2 * 3 * 7 * 7, dtype=np.float32).reshape(2, 3, 7, 7) % 11
    y = numbapool.average_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    z = numbapool.lp_pool(x, [2, 2], p=3)
print(sorted({str(w.message).split("assumption of ")[1].split(" (")[0] for w in caught
              if w.category.__name__ == "NumbaInternalsWarning"}))
np.save(sys.argv[1], np.concatenate([y.ravel(), z.ravel()]))
"""
    out = tmp_path / "results.npy"
    run = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(
        sorted(
            ["numbapool's compiler pipeline", "numbapool's disk cache", "the kernels' jit options"]
        )
    )
    x = np.arange(2 * 3 * 7 * 7, dtype=np.float32).reshape(2, 3, 7, 7) % 11
    expected = np.concatenate(
        [
            pool("AveragePool", x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]).ravel(),
            pool("LpPool", x, [2, 2], p=3).ravel(),
        ]
    )
    np.testing.assert_allclose(np.load(out), expected, rtol=2e-6)


_CACHED_CALL = """
import json, sys
from numba.core import event
import numpy as np

compiled = []


class Record(event.Listener):
    def on_start(self, compilation):
        compiled.append(compilation.data["dispatcher"].py_func.__qualname__)

    def on_end(self, compilation):
        pass


event.register("numba:compile", Record())
import numbapool
x = np.arange(2 * 3 * 7 * 7, dtype=np.float32).reshape(2, 3, 7, 7) % 5
assert numbapool.global_max_pool(x).ravel().tolist() == [4.0] * 6
print(json.dumps(compiled))
"""


def test_a_change_to_a_helper_module_alone_compiles_its_kernels_again(tmp_path):
    """A kernel compiles in code from other kernel modules (here GlobalMaxPool's, in
    global_.py, takes global_vectors.py's intrinsics): a copy of numbapool whose helper
    module alone changed must not load the kernel the cache holds from before the change,
    which numba's own key, the kernel's bytecode, would."""
    import shutil

    copy = tmp_path / "package"
    shutil.copytree(
        pathlib.Path(numbapool.__file__).parent,
        copy / "numbapool",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(copy), "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def compiled():
        run = subprocess.run(
            [sys.executable, "-c", _CACHED_CALL],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        return [
            name
            for name in __import__("json").loads(run.stdout.splitlines()[-1])
            if name == "global_max_units"
        ]

    assert compiled() == ["global_max_units"]
    assert compiled() == []  # loaded from the cache
    helper = copy / "numbapool" / "_kernels" / "global_vectors.py"
    helper.write_text(helper.read_text() + "\n# changed\n")
    assert compiled() == ["global_max_units"]
    assert compiled() == []
