"""Every use numbapool makes of numba's internals, and the checks of what each assumes.

Public, and used where it is needed: ``numba.njit`` with its documented options, ``prange``,
``numba.types``, ``numba.extending`` (``intrinsic``, ``overload``) with llvmlite IR and the
lowering context's value helpers that numba's extending guide uses (``make_array``,
``get_value_type``, ``get_data_type``, ``cast``, ``get_constant``, ``get_dummy_value``),
``numba.core.cgutils``, ``numba.config``, a dispatcher's ``compile`` and ``py_func``,
``numba.get_num_threads`` and its kin, ``numba.threading_layer``, and ``numba.core.event``.

Internal, and used only in this module: everything else numba has, in six reaches. Each
says what it buys, what it assumes, and how the assumption is checked: when numbapool
imports (names and signatures, microseconds) or at the first compile that uses it (the
source of a method, the data model, C symbols). A numba that breaks an assumption gets a
NumbaInternalsError naming numba's version and the assumption, or, where numba has a
slower public path, that path after one NumbaInternalsWarning. docs/architecture.md has
the table of what each reach buys today.

1. Jit options ``_nrt``, ``no_cpython_wrapper`` and ``no_cfunc_wrapper`` (KERNEL_OPTIONS,
   INLINED_OPTIONS).
2. The compiler pipeline (LiteralKindsCompiler): numba's pass classes and pass builder, its
   IR classes, the inliner's ``InlineInlinables._do_work`` and
   ``InlineWorker.run_untyped_passes``.
3. The disk cache's classes (njit_cached, cache_directory_for, in_disk_cache):
   ``FunctionCache`` and ``IndexDataCacheFile`` and their private methods, the cache
   locators, ``rtsys.initialize`` and a dispatcher's ``_cache``.
4. Calls by address (compiled_overload, call_at_address, call_at_address_failed,
   compile_trampoline, array_fields): a dispatcher's ``overloads`` and ``typeof_pyval``,
   the calling convention, the argument packer, the array data model, code libraries and
   the compiler lock.
5. The runtime's C functions (allocate_aligned, data_of, release_meminfo, raise_in_kernel,
   borrowed): ``NRT_MemInfo_alloc_aligned``, ``NRT_MemInfo_data``, ``NRT_MemInfo_release``,
   the calling convention's ``return_user_exc`` and ``impl_ret_borrowed``.
6. The threading layer's C functions and state (layer_threads, set_layer_threads,
   set_layer_chunk_size, layer_started, layer_thread_count): ``get_num_threads``,
   ``set_num_threads``, ``get_parallel_chunksize`` and ``set_parallel_chunksize``, and
   ``numba.np.ufunc.parallel``'s ``_is_initialized`` and ``_get_num_threads``.

The kernels also emit LLVM intrinsics by name (``llvm.maximum``, ``llvm.vector.reduce.*``,
``llvm.masked.load``); those are LLVM's, and numba's LLVM must be one that lowers them:
check_llvm refuses an older one at import, where numba 0.61's LLVM 15 aborted the process.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import itertools
import textwrap
import warnings

import llvmlite
import numba
from llvmlite import binding as _llvm
from llvmlite import ir as llvm_ir
from numba import types
from numba.core import caching, cgutils
from numba.core import ir as numba_ir
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_lock import global_compiler_lock
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.imputils import impl_ret_borrowed
from numba.core.runtime import rtsys
from numba.core.typed_passes import NopythonRewrites
from numba.core.untyped_passes import FixupArgs, InlineClosureLikes, InlineInlinables
from numba.extending import intrinsic
from numba.np.ufunc import parallel as _numba_parallel

# The LLVM the oldest numba numbapool supports brings (numba 0.62: llvmlite 0.45, LLVM 20)
_OLDEST_LLVM = (20,)


def oldest_numba() -> str:
    """The oldest numba numbapool supports, as its installed metadata declares it
    (pyproject.toml)."""
    from importlib import metadata

    try:
        requirements = metadata.requires("numbapool") or []
    except metadata.PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        name, _, version = requirement.partition(">=")
        if name.strip() == "numba":
            return version.split(",")[0].split(";")[0].strip()
    return "(see numbapool's pyproject.toml)"


class NumbaInternalsError(RuntimeError):
    """The installed numba differs from what numbapool assumes of its internals."""


class NumbaInternalsWarning(RuntimeWarning):
    """numbapool took numba's slower public path where an internal it uses has changed."""


def _versions() -> str:
    return (
        f"numba {numba.__version__} (llvmlite {llvmlite.__version__}, LLVM "
        f"{'.'.join(map(str, _llvm.llvm_version_info))})"
    )


def broken(reach: str, assumption: str) -> NumbaInternalsError:
    """The error for a numba that breaks ``assumption`` of ``reach``."""
    return NumbaInternalsError(
        f"numbapool cannot run on {_versions()}: {reach} assumes {assumption}. numbapool "
        f"supports numba {oldest_numba()} and newer; install a supported release "
        f'(pip install "numba>={oldest_numba()}"), and report this numba to numbapool if '
        f"it is newer."
    )


_WARNED = set()


def fall_back(reach: str, assumption: str, public_path: str) -> None:
    """Warn, once per reach, that ``reach`` takes ``public_path`` instead."""
    if reach in _WARNED:
        return
    _WARNED.add(reach)
    warnings.warn(
        f"numbapool: {_versions()} breaks an assumption of {reach} ({assumption}); "
        f"it uses {public_path} instead. Results are the same.",
        NumbaInternalsWarning,
        stacklevel=3,
    )


def _parameters(function) -> list[str] | None:
    """The parameter names of ``function``, or None if it is missing or not a function."""
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def _missing_methods(owner, expected: dict) -> list[str]:
    """Those of ``expected`` (method name -> parameter names) that ``owner`` lacks or
    takes with other parameters."""
    return [
        f"{owner.__name__}.{name}({', '.join(parameters)})"
        for name, parameters in expected.items()
        if _parameters(getattr(owner, name, None)) != parameters
    ]


# --- LLVM -----------------------------------------------------------------------------


def check_llvm(version: tuple = None) -> None:
    """Raise NumbaInternalsError if numba's LLVM is older than the kernels' intrinsics need
    (``version``: LLVM's, by default the one llvmlite is built with)."""
    version = tuple(_llvm.llvm_version_info if version is None else version)
    if version[: len(_OLDEST_LLVM)] < _OLDEST_LLVM:
        raise broken(
            "the kernels' LLVM intrinsics",
            f"LLVM {_OLDEST_LLVM[0]} or newer, which lowers llvm.maximum on every "
            f"CPU (numba 0.61's LLVM 15 aborts the process on it)",
        )


# --- 1. jit options -------------------------------------------------------------------
# ``_nrt=False`` compiles a kernel without numba's reference counting: numba emits an
# increment and a decrement for every array a statement names, helper by helper, which
# LLVM then optimizes away; the kernels free their own scratch arrays (5. below) and
# would free them twice with it. ``no_cpython_wrapper`` and ``no_cfunc_wrapper`` leave out
# the wrappers of functions that only kernels call, each a compile of its own.

_WRAPPER_OPTIONS = ("no_cpython_wrapper", "no_cfunc_wrapper")


def _jit_options() -> tuple[dict, dict]:
    """(a kernel's options, an inlined helper's): the options numba's CPU target takes."""
    from numba.core.cpu import CPUTargetOptions

    if not hasattr(CPUTargetOptions, "_nrt"):
        raise broken("the kernels' jit options", "numba.njit takes _nrt=False")
    missing = [name for name in _WRAPPER_OPTIONS if not hasattr(CPUTargetOptions, name)]
    if missing:
        fall_back(
            "the kernels' jit options",
            f"numba.njit takes {', '.join(missing)}",
            "numba's wrappers for every helper (first calls slower)",
        )
        return {"_nrt": False}, {"_nrt": False}
    return (
        {"_nrt": False, "no_cfunc_wrapper": True},
        {"_nrt": False, **dict.fromkeys(_WRAPPER_OPTIONS, True)},
    )


# --- 2. the compiler pipeline ---------------------------------------------------------
# numba types and lowers every branch of a function, even one whose condition compares a
# literal argument with a constant (``if p_kind == 0:`` compiled for
# ``Literal[int](2)``): its dead-branch pruning resolves arguments only against None.
# LiteralArgumentsAsConstants turns each literal integer or boolean argument into a
# constant before numba's pruning runs, so that the pruning (before and after inlining)
# drops the branches a kind never takes, and the callees in them are never compiled. The
# kernels need it: some of a kind's branches do not type for another kind's arguments (a
# vector fold of one element type), so there is no public path to fall back to.
#
# numba's inlining of an ``inline="always"`` function runs its untyped passes (bytecode to
# IR, and the inlining of the helpers it calls in turn) at every call site, in every
# compile. That IR depends on the function and the compile's flags alone, so
# InlineInlinablesOnce keeps it, per function and flags, for the process's later call
# sites, and hands each site a copy of its own. numba's inliner (InlineWorker.inline_ir)
# copies the IR it is given twice, block by block: one copy to change and one it returns
# unchanged, which InlineInlinables discards; each block's copy copies the function's
# whole scope and every variable in it again. The blocks of the copy handed over are
# taken as they are instead (_HandedOverBlock): both of the inliner's copies are then the
# one handed over, which is right only while the unchanged copy is discarded
# (_inliner_problem checks that in numba's source).
#
# Two of numba's passes have nothing to do in a serial kernel, which makes no closures,
# list comprehensions, array expressions or constant arrays: InlineClosureLikes and
# NopythonRewrites; each still walks the IR and works out its variables' lifetimes. A
# serial kernel's pipeline leaves both out (the machine code of every kernel a warmup
# compiles is the same without them); the parallel driver's keeps them.

_PIPELINE = "numbapool's compiler pipeline"


@register_pass(mutates_CFG=False, analysis_only=False)
class LiteralArgumentsAsConstants(FunctionPass):
    """Each literal integer or boolean argument's value becomes a constant of the IR."""

    _name = "literal_arguments_as_constants"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        definitions = getattr(state.func_ir, "_definitions", None)
        if not isinstance(definitions, dict):
            raise broken(_PIPELINE, "a function's IR keeps its definitions in _definitions")
        changed = False
        for block in state.func_ir.blocks.values():
            for i, statement in enumerate(block.body):
                if not (
                    isinstance(statement, numba_ir.Assign)
                    and isinstance(statement.value, numba_ir.Arg)
                ):
                    continue
                given = state.args[statement.value.index]
                if isinstance(given, (types.IntegerLiteral, types.BooleanLiteral)):
                    constant = numba_ir.Const(given.literal_value, statement.loc)
                    block.body[i] = numba_ir.Assign(constant, statement.target, statement.loc)
                    # the definition the pruning reads: left as the argument, the pruning
                    # before inlining kept every branch, and each callee in them was
                    # inlined before a later pruning dropped it
                    definitions[statement.target.name] = [constant]
                    changed = True
        return changed


# (function, flags) -> its IR after numba's untyped passes, as the inliner makes it
_UNTYPED_IR = {}


def _untyped_ir_once(worker, run_untyped_passes, function, enable_ssa=False):
    """``worker.run_untyped_passes(function, enable_ssa)``, made once per function and flags
    (``run_untyped_passes`` is numba's own, bound to ``worker``)."""
    worker.flags.enable_ssa = enable_ssa  # as numba's sets it, on the compile's own flags
    key = (function, worker.flags.copy())
    if key not in _UNTYPED_IR:
        _UNTYPED_IR[key] = run_untyped_passes(function, enable_ssa)
    return _handed_over_copy(_UNTYPED_IR[key])


class _HandedOverBlock(numba_ir.Block):
    """A block of a copy of an inlined function's IR made for one call site alone: numba's
    inliner takes it as its own copy instead of copying it again. An ir.Block again once
    the inlining pass is done (InlineInlinablesOnce.run_pass)."""

    def __deepcopy__(self, memo):
        return self


def _handed_over_copy(function_ir):
    """A copy of ``function_ir`` for one call site, its blocks _HandedOverBlock: copied
    with one memo, they share one copy of the scope, as the blocks copied share theirs."""
    result = function_ir.copy()
    memo = {}
    result.blocks = {}
    for label, block in function_ir.blocks.items():
        block = copy.deepcopy(block, memo)
        block.__class__ = _HandedOverBlock
        result.blocks[label] = block
    return result


@register_pass(mutates_CFG=True, analysis_only=False)
class InlineInlinablesOnce(InlineInlinables):
    """numba's InlineInlinables, each inlined function's untyped IR made once per process
    (_untyped_ir_once) and copied once per call site (_handed_over_copy)."""

    _name = "inline_inlinables_once"

    def run_pass(self, state):
        changed = super().run_pass(state)
        for block in state.func_ir.blocks.values():  # later passes copy blocks for real
            if isinstance(block, _HandedOverBlock):
                block.__class__ = numba_ir.Block
        return changed

    def _do_work(self, state, work_list, block, i, expr, inline_worker):
        if "run_untyped_passes" not in vars(inline_worker):
            inline_worker.run_untyped_passes = functools.partial(
                _untyped_ir_once, inline_worker, inline_worker.run_untyped_passes
            )
        return super()._do_work(state, work_list, block, i, expr, inline_worker)


def _discards_unchanged_copy(method) -> bool:
    """Whether ``method``'s source calls ``inline_function`` and drops the first member of
    its result, the inliner's unchanged copy of the inlined IR."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError, SyntaxError):
        return False
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "inline_function"
    ]
    assigned = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value in calls
    ]
    return (
        bool(calls)
        and len(assigned) == len(calls)
        and all(
            isinstance(node.targets[0], ast.Tuple)
            and node.targets[0].elts
            and isinstance(node.targets[0].elts[0], ast.Name)
            and node.targets[0].elts[0].id == "_"
            for node in assigned
        )
    )


@functools.cache
def _inliner_problem() -> str | None:
    """What InlineInlinablesOnce assumes of numba's inliner that does not hold, or None."""
    from numba.core.compiler import Flags
    from numba.core.inline_closurecall import InlineWorker  # imports numba's array lowering

    missing = _missing_methods(
        InlineInlinables,
        {"_do_work": ["self", "state", "work_list", "block", "i", "expr", "inline_worker"]},
    )
    missing += _missing_methods(
        InlineWorker,
        {
            "run_untyped_passes": ["self", "func", "enable_ssa"],
            "inline_function": ["self", "caller_ir", "block", "i", "function", "arg_typs"],
        },
    )
    if missing:
        return f"the methods {', '.join(missing)}"
    if not hasattr(Flags, "enable_ssa"):
        return "compile flags with enable_ssa"
    if not _discards_unchanged_copy(InlineInlinables._do_work):
        return (
            "InlineInlinables._do_work discards the unchanged copy that "
            "InlineWorker.inline_function returns first"
        )
    return None


# numba's passes that find nothing to change in a serial kernel (above)
_NOTHING_TO_DO = (InlineClosureLikes, NopythonRewrites)


class LiteralKindsCompiler(CompilerBase):
    """numba's nopython pipeline, literal arguments made constants before any pruning,
    each inlined function's untyped IR made once (InlineInlinablesOnce), and without
    _NOTHING_TO_DO unless the function is parallel."""

    def define_pipelines(self):
        manager = DefaultPassBuilder.define_nopython_pipeline(self.state)
        present = {pass_ for pass_, _ in manager.passes}
        missing = [p.__name__ for p in (FixupArgs, InlineInlinables) if p not in present]
        if missing:
            raise broken(
                _PIPELINE, f"numba's nopython pipeline has the passes {', '.join(missing)}"
            )
        manager.add_pass_after(LiteralArgumentsAsConstants, FixupArgs)
        inliner = InlineInlinables
        problem = _inliner_problem()
        if problem is None:
            inliner = InlineInlinablesOnce
        else:
            fall_back(_PIPELINE, problem, "numba's own inlining (first calls slower)")
        parallel = self.state.flags.auto_parallel.enabled
        manager.passes = [
            (inliner if pass_ is InlineInlinables else pass_, name)
            for pass_, name in manager.passes
            if parallel or pass_ not in _NOTHING_TO_DO
        ]
        manager.finalize()
        return [manager]


# --- 3. the disk cache ----------------------------------------------------------------
# numba saves a compiled specialization by reading the function's index of entries,
# numbering a data file after the entries it found, and writing the index back whole.
# Two processes saving entries of one function at once could each write an index without
# the other's entry, or number their data files alike and leave an entry naming the
# other's data: a later process would load code compiled for other argument types.
# _LockedIndex holds a lock beside the index from reading it to writing it back, and
# writes the data file before the index names it (a correctness fix).
#
# numba refreshes the whole target context before a load: it imports and installs every
# registry of its typing and lowering (and, through numba.np.linalg, scipy's linalg where
# scipy is installed). Compiled code needs only numba's runtime, which is what numba's
# refresh starts with; _KernelCache.load_overload initializes that alone. A compile, on a
# miss, refreshes the context itself (numba's CompilerBase).

_CACHE = "numbapool's disk cache"
_CACHE_METHODS = {
    caching.FunctionCache: {
        "load_overload": ["self", "sig", "target_context"],
        "_load_overload": ["self", "sig", "target_context"],
        "_index_key": ["self", "sig", "codegen"],
        "_guard_against_spurious_io_errors": ["self"],
    },
    caching.IndexDataCacheFile: {
        "__init__": ["self", "cache_path", "filename_base", "source_stamp"],
        "save": ["self", "key", "data"],
        "_load_index": ["self"],
        "_save_index": ["self", "overloads"],
        "_save_data": ["self", "name", "data"],
        "_data_name": ["self", "number"],
    },
}


@functools.cache
def _cache_problem() -> str | None:
    """What the kernel cache assumes of numba's cache classes that does not hold, or None."""
    missing = [
        entry
        for owner, methods in _CACHE_METHODS.items()
        for entry in _missing_methods(owner, methods)
    ]
    if missing:
        return f"the methods {', '.join(missing)}"
    if _parameters(getattr(rtsys, "initialize", None)) != ["ctx"]:
        return "numba's runtime has initialize(ctx)"
    return None


class _LockedIndex(caching.IndexDataCacheFile):
    """numba's index and data files of one function, saved in turns (above)."""

    def save(self, key, data):
        from ._cache import exclusive

        with exclusive(self._index_path + ".lock"):
            entries = self._load_index()
            name = entries.get(key)
            if name is None:
                taken = set(entries.values())
                name = next(
                    name for name in map(self._data_name, itertools.count(1)) if name not in taken
                )
            self._save_data(name, data)
            if entries.get(key) != name:
                entries[key] = name
                self._save_index(entries)


class _KernelCache(caching.FunctionCache):
    """numba's disk cache of one kernel: saves take turns across processes (_LockedIndex),
    and a load sets up only what loading compiled code needs (above)."""

    def __init__(self, function):
        super().__init__(function)
        index = self._cache_file
        self._cache_file = _LockedIndex(
            index._cache_path, self._impl.filename_base, index._source_stamp
        )
        # the attributes _LockedIndex.save and holds read, looked up now so that a numba
        # naming them otherwise gets numba's own cache (njit_cached), not an error later
        if not (isinstance(self._cache_file._index_path, str) and isinstance(self._enabled, bool)):
            raise AttributeError("_index_path or _enabled")

    def _index_key(self, sig, codegen):
        # numba's key holds the kernel's own bytecode, but a kernel compiles in helpers and
        # intrinsics from the other kernel modules too: without their sources in the key, a
        # change to one of them alone (an editable install updated) loaded the kernel
        # compiled before it
        return (*super()._index_key(sig, codegen), kernel_sources_digest())

    def holds(self, sig, target_context) -> bool:
        """Whether the cache has an entry for ``sig``, without loading it."""
        return self._enabled and (
            self._index_key(sig, target_context.codegen()) in self._cache_file._load_index()
        )

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


@functools.cache
def kernel_sources_digest() -> str:
    """A digest of the sources every compiled kernel may take code from: the modules of
    numbapool._kernels and this one, whose compiler pipeline compiles them."""
    import hashlib
    import pathlib

    here = pathlib.Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted((here / "_kernels").glob("*.py")) + [here / "_numba.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def locked_cache(function) -> caching.FunctionCache:
    """numba's disk cache of ``function``, whose saves take turns across processes."""
    return _KernelCache(function)


def njit_cached(function, **options):
    """``numba.njit(**options)(function)``, cached on disk by a _KernelCache, or by numba's
    own cache after one warning where numba's cache classes differ."""
    problem = _cache_problem()
    cache = None
    if problem is None:
        try:
            cache = locked_cache(function)
        except (AttributeError, TypeError) as error:
            problem = f"a function's cache has the attribute {error}"
    if problem is not None:
        fall_back(
            _CACHE,
            problem,
            "numba's own disk cache (its saves do not take turns "
            "across processes; warm first calls slower)",
        )
        return numba.njit(cache=True, **options)(function)
    dispatcher = numba.njit(**options)(function)
    dispatcher._cache = cache
    return dispatcher


def in_disk_cache(dispatcher, signature) -> bool:
    """Whether ``dispatcher``'s disk cache holds ``signature``, without loading it (False
    where numba's own cache serves it)."""
    cache = getattr(dispatcher, "_cache", None)
    return isinstance(cache, _KernelCache) and cache.holds(signature, dispatcher.targetctx)


def cache_directory_for(source: str) -> str | None:
    """The directory numba's own search would cache the functions of the module file
    ``source`` in, or None where none of numba's locators applies."""
    implementation = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    locator_classes = getattr(implementation, "_locator_classes", None)
    if locator_classes is None:
        raise broken(_CACHE, "caching.CacheImpl._locator_classes lists numba's cache locators")

    def a_function():
        pass

    for locator_class in locator_classes:
        try:
            locator = locator_class.from_function(a_function, source)
        except Exception:  # a locator that does not apply to a plain module
            locator = None
        if locator is not None:
            return locator.get_cache_path()
    return None


# --- 4. calls by address --------------------------------------------------------------
# The parallel driver calls a compiled kernel through a trampoline at the address of its
# machine code (_kernels/parallel.py), so that the driver compiles once for every kernel
# and the kernel's loops once; called by name, numba would link and compile the kernel's
# code again in every driver. A trampoline loads the kernel's arguments from a block of
# memory laid out as numba's argument packer flattens them; an array as the fields of
# numba's array data model, read here from the model itself (array_fields).

_CALLS = "the parallel driver's calls by address"
compiler_lock = global_compiler_lock


def argument_type(dispatcher, value):
    """numba's type of ``value`` as ``dispatcher`` receives it as an argument."""
    return dispatcher.typeof_pyval(value)


def compiled_overload(dispatcher, signature) -> tuple:
    """(the Python-callable compiled function, the address of its machine code, numba's
    target context that compiled it) of ``dispatcher`` compiled for ``signature``."""
    try:
        result = dispatcher.overloads[signature]
        return (
            result.entry_point,
            result.library.get_pointer_to_function(result.fndesc.llvm_func_name),
            result.target_context,
        )
    except (AttributeError, KeyError) as error:
        raise broken(
            _CALLS,
            "a dispatcher's overloads[signature] has entry_point, "
            f"library, fndesc and target_context (missing: {error})",
        ) from None


def flat_argument_types(context, argument_types: tuple) -> tuple:
    """The LLVM types numba's calling convention passes ``argument_types`` as, flattened."""
    return tuple(context.get_arg_packer(argument_types).argument_types)


# numba's array data model, as array_fields maps it: each field's name, and the struct
# code of each of its flat members
_ARRAY_FIELDS = {
    "meminfo": "P",
    "parent": "P",
    "nitems": "q",
    "itemsize": "q",
    "data": "P",
    "shape": "q",
    "strides": "q",
}


def array_fields(context, array_type) -> list[tuple[str, str]]:
    """(field name, struct code) of each flat member of ``array_type`` as numba passes it,
    in numba's order, read from numba's data model and checked against the LLVM types its
    argument packer flattens it to."""
    model = context.data_model_manager[array_type]
    names = list(getattr(model, "_fields", ()))
    if sorted(names) != sorted(_ARRAY_FIELDS):
        raise broken(
            _CALLS,
            f"numba's array data model has the fields {sorted(_ARRAY_FIELDS)} (it has {names})",
        )
    fields = []
    for name in names:
        member = model.get_member_fe_type(name)
        count = len(member) if isinstance(member, types.BaseTuple) else 1
        fields += [(name, _ARRAY_FIELDS[name])] * count
    flat = flat_argument_types(context, (array_type,))
    expected = [llvm_ir.PointerType if code == "P" else llvm_ir.IntType for _, code in fields]
    if (
        len(flat) != len(fields)
        or not all(isinstance(t, kind) for t, kind in zip(flat, expected))
        or not all(t.width == 64 for t in flat if isinstance(t, llvm_ir.IntType))
    ):
        raise broken(
            _CALLS,
            f"numba passes an array as its fields {fields} (it passes {[str(t) for t in flat]})",
        )
    return fields


def _status_and_exception_first(function_type, argument_types: tuple) -> None:
    """Raise unless numba's calling convention passes a status and an exception pointer
    before the arguments, as the trampolines take them."""
    arguments = function_type.args
    if not (
        len(arguments) == 2 + len(argument_types)
        and all(isinstance(t, llvm_ir.PointerType) for t in arguments[:2])
    ):
        raise broken(
            _CALLS,
            "numba's calling convention passes a status and an exception "
            f"pointer before the arguments (its function type is {function_type})",
        )


def _call_by_address(context, builder, address, argument_types: tuple, values: list):
    function_type = context.call_conv.get_function_type(types.none, argument_types)
    _status_and_exception_first(function_type, argument_types)
    callee = builder.inttoptr(address, function_type.as_pointer())
    status, _ = context.call_conv.call_function(builder, callee, types.none, argument_types, values)
    return status


def call_at_address(context, builder, address, argument_types: tuple, values: list) -> None:
    """Emit a call of the compiled function at ``address`` (taking ``argument_types``,
    returning nothing) in numba's calling convention; an error it raises propagates."""
    status = _call_by_address(context, builder, address, argument_types, values)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)


def call_at_address_failed(context, builder, address, argument_types: tuple, values: list):
    """Emit a call as call_at_address does, but the error stays here: the i1 value is
    whether the call raised (its exception is dropped)."""
    return _call_by_address(context, builder, address, argument_types, values).is_error


def compile_trampoline(
    context,
    name: str,
    argument_types: tuple,
    emit_arguments,
    entry_address: int,
    entry_types: tuple,
) -> tuple:
    """(address, library) of a function ``name`` compiled by LLVM alone, taking
    ``argument_types`` in numba's calling convention: it calls the compiled function at
    ``entry_address`` (taking ``entry_types``) on ``emit_arguments(builder, arguments)``
    and returns its status. The caller keeps the library as long as it calls the address."""
    library = context.codegen().create_library(name)
    module = library.create_ir_module(name)
    function_type = context.call_conv.get_function_type(types.none, argument_types)
    _status_and_exception_first(function_type, argument_types)
    function = cgutils.get_or_insert_function(module, function_type, name)
    builder = llvm_ir.IRBuilder(function.append_basic_block())
    status, exception, *arguments = function.args
    entry_type = context.call_conv.get_function_type(types.none, entry_types)
    entry = builder.inttoptr(
        llvm_ir.Constant(llvm_ir.IntType(64), entry_address), entry_type.as_pointer()
    )
    # the entry point's status and exception go straight to the caller's
    builder.ret(builder.call(entry, [status, exception] + emit_arguments(builder, arguments)))
    library.add_ir_module(module)
    library.finalize()
    return library.get_pointer_to_function(name), library


# --- 5. the runtime's C functions -----------------------------------------------------
# A kernel's scratch arrays are MemInfos of numba's runtime that the kernel allocates and
# frees itself (it compiles without reference counting, 1. above), through the C
# functions numba's own lowering calls; numba's Python API for them requires reference
# counting on.

_RUNTIME = "the kernels' scratch arrays"
_RUNTIME_FUNCTIONS = ("NRT_MemInfo_alloc_aligned", "NRT_MemInfo_data", "NRT_MemInfo_release")


def _check_symbols(reach: str, names) -> None:
    missing = [name for name in names if not _llvm.address_of_symbol(name)]
    if missing:
        raise broken(reach, f"numba's runtime gives LLVM the C functions {', '.join(missing)}")


def _runtime_function(builder, name, result, arguments):
    return cgutils.get_or_insert_function(
        builder.module, llvm_ir.FunctionType(result, arguments), name
    )


@functools.cache
def check_runtime() -> None:
    """Start numba's runtime, then raise unless it has the C functions ``allocate_aligned``,
    ``data_of`` and ``release_meminfo`` call (entry.EntryPoint.compile checks, before a
    kernel's first compile or load)."""
    from numba.core.registry import cpu_target

    rtsys.initialize(cpu_target.target_context)
    _check_symbols(_RUNTIME, _RUNTIME_FUNCTIONS)


def allocate_aligned(context, builder, size, alignment: int):
    """Emit a new MemInfo of ``size`` bytes aligned to ``alignment`` (null if no memory)."""
    allocate = _runtime_function(
        builder,
        "NRT_MemInfo_alloc_aligned",
        cgutils.voidptr_t,
        [cgutils.intp_t, llvm_ir.IntType(32)],
    )
    allocate.return_value.add_attribute("noalias")
    return builder.call(allocate, [size, llvm_ir.Constant(llvm_ir.IntType(32), alignment)])


def data_of(builder, meminfo):
    """Emit the data pointer of ``meminfo``."""
    data = _runtime_function(builder, "NRT_MemInfo_data", cgutils.voidptr_t, [cgutils.voidptr_t])
    return builder.call(data, [meminfo])


def release_meminfo(builder, meminfo) -> None:
    """Emit the release of ``meminfo`` (a free of its data: the kernel holds its one
    reference)."""
    release = _runtime_function(
        builder, "NRT_MemInfo_release", llvm_ir.VoidType(), [cgutils.voidptr_t]
    )
    builder.call(release, [meminfo])


def raise_in_kernel(context, builder, exception: type, arguments: tuple) -> None:
    """Emit ``raise exception(*arguments)`` from the function being lowered."""
    context.call_conv.return_user_exc(builder, exception, arguments)


borrowed = impl_ret_borrowed  # an intrinsic's result that borrows its argument's data


# --- 6. the threading layer -----------------------------------------------------------
# A parallel kernel sets numbapool's thread count for the call, and its chunk size, on
# entry and gives numba's back on exit, through the threading layer's own C functions,
# the ones numba's prange loops call: numba.set_num_threads from Python takes a
# process-wide lock and goes through ctypes on every call, and numba's jitted versions of
# these functions are not cacheable.

_THREADS = "numbapool's thread count inside a kernel"
_LAYER_FUNCTIONS = (
    "get_num_threads",
    "set_num_threads",
    "get_parallel_chunksize",
    "set_parallel_chunksize",
)


@functools.cache
def check_threading_layer() -> None:
    """Start numba's threads (its public get_num_threads does), then raise unless the
    layer gives LLVM the C functions the thread intrinsics call (parallel.ready_driver
    checks, before the driver's first compile or load)."""
    numba.get_num_threads()
    _check_symbols(_THREADS, _LAYER_FUNCTIONS)


def _layer_function(builder, name, result, arguments):
    # declared as numba's prange loops declare them, in the same module
    return cgutils.get_or_insert_function(
        builder.module, llvm_ir.FunctionType(result, arguments), name
    )


@intrinsic
def layer_threads(typingctx):
    """The threading layer's thread count for the calling thread."""
    check_threading_layer()

    def codegen(context, builder, signature, args):
        return builder.call(_layer_function(builder, "get_num_threads", cgutils.intp_t, []), [])

    return types.intp(), codegen


@intrinsic
def set_layer_threads(typingctx, count):
    """Set the threading layer's thread count for the calling thread."""
    if not isinstance(count, types.Integer):
        return None
    check_threading_layer()

    def codegen(context, builder, signature, args):
        int32 = llvm_ir.IntType(32)
        set_ = _layer_function(builder, "set_num_threads", llvm_ir.VoidType(), [int32])
        builder.call(set_, [context.cast(builder, args[0], signature.args[0], types.int32)])
        return context.get_dummy_value()

    return types.void(count), codegen


@intrinsic
def set_layer_chunk_size(typingctx, size):
    """Set the threading layer's parallel chunk size for the calling thread; returns the
    size before."""
    if not isinstance(size, types.Integer):
        return None
    check_threading_layer()

    def codegen(context, builder, signature, args):
        get = _layer_function(builder, "get_parallel_chunksize", cgutils.intp_t, [])
        set_ = _layer_function(
            builder, "set_parallel_chunksize", llvm_ir.VoidType(), [cgutils.intp_t]
        )
        before = builder.call(get, [])
        builder.call(set_, [context.cast(builder, args[0], signature.args[0], types.intp)])
        return before

    return types.intp(size), codegen


# numba.get_num_threads starts numba's threads if they are not, under a process-wide lock
# taken on every call; once they run, the layer's own count is read directly: a parallel
# call of 0.2 to 1 ms then takes 0.91 to 0.93 of the time
_LAYER_STATE = "numbapool's reading of numba's thread count"
_LAYER_STATE_ASSUMPTION = (
    "numba.np.ufunc.parallel has _is_initialized, and _get_num_threads() once it is true"
)


def layer_started() -> bool:
    """Whether numba's threading layer is chosen and its threads started."""
    started = getattr(_numba_parallel, "_is_initialized", None)
    if isinstance(started, bool):
        return started
    fall_back(_LAYER_STATE, _LAYER_STATE_ASSUMPTION, "numba.threading_layer")
    try:
        numba.threading_layer()
    except ValueError:
        return False
    return True


def layer_thread_count() -> int:
    """numba's thread count for the calling thread (numba.get_num_threads). Before numba's
    threading layer has started, NUMBA_NUM_THREADS, which numba.get_num_threads would return
    after starting the layer's threads (numbapool's pool needs none of them)."""
    if getattr(_numba_parallel, "_is_initialized", False) is True:
        read = getattr(_numba_parallel, "_get_num_threads", None)
        if callable(read):
            return read()
        fall_back(_LAYER_STATE, _LAYER_STATE_ASSUMPTION, "numba.get_num_threads")
    elif getattr(_numba_parallel, "_is_initialized", None) is False:
        return numba.config.NUMBA_NUM_THREADS
    return numba.get_num_threads()


check_llvm()
KERNEL_OPTIONS, INLINED_OPTIONS = _jit_options()
