import atexit
import os
import shutil
import sys
import tempfile

# The suite compiles into a disk cache of its own, empty when it starts: numba reads
# NUMBA_CACHE_DIR when it is imported, which no test module has done yet. pytest-xdist's
# worker processes (pyproject.toml) inherit it from the controlling process, as do the
# subprocesses that the tests start: what one worker compiles, the other loads, and saves
# to it take turns (_numba.locked_cache).
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numbapool-test-cache-")
    atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], ignore_errors=True)

from hypothesis import settings  # noqa: E402

# the test helpers (reference.py, onnx_nodes.py) import as plain modules
sys.path.insert(0, os.path.dirname(__file__))

# CI runs a fixed number of examples per property with no deadline: the first call of
# each kernel compiles it.
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=False)
settings.register_profile("dev", max_examples=60, deadline=None)
# .ci/run's second environment, on the oldest numba supported: every kernel family and
# dtype still, fewer examples of each
settings.register_profile("oldest-numba", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


import pytest  # noqa: E402


@pytest.fixture(params=["serial", "parallel"])
def execution_path(request, monkeypatch):
    """Run a test through both ways a call can execute: small calls run serially on the
    calling thread, larger ones through the parallel driver. Forcing the threshold lets
    tiny test inputs take either path; plans are rebuilt so that no cached launch leaks."""
    from numbapool import _calls, _dispatch
    from numbapool._kernels import parallel

    threshold = 1 << 62 if request.param == "serial" else 0
    monkeypatch.setattr(_dispatch, "_SERIAL_WORK", threshold)
    # a driver compiles before the call that needs it, which then runs through it
    monkeypatch.setattr(parallel, "COMPILE_IN_BACKGROUND", False)
    _dispatch._WINDOW_PLANS.clear()
    _calls.forget()
    yield request.param
    _dispatch._WINDOW_PLANS.clear()
    _calls.forget()


def pytest_collection_modifyitems(items):
    """test_first_call.py first: its tests are the longest, and started last they would
    leave one worker running alone at the end."""
    items.sort(key=lambda item: item.path.name != "test_first_call.py")
