"""The command line: info, warmup; and the disk cache's fallback."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import numbapool
from numbapool import _warmup


def run_numbapool(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "numbapool", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_info_json_is_valid_and_complete():
    result = run_numbapool("info", "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["numbapool"] == numbapool.__version__
    for key in ("numba", "numpy", "llvmlite"):
        assert facts[key].split(".")[0].isdigit()
    assert facts["threading_layer"] in ("omp", "tbb", "workqueue")
    assert 1 <= facts["threads"] <= facts["thread_limit"]
    assert isinstance(facts["cached_kernels"], dict)
    assert isinstance(facts["cpu_features"], list)


def test_info_text_shows_threads_in_force():
    result = run_numbapool("info", env={**os.environ, "NUMBA_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert any(line.split() == ["threads", "1"] for line in result.stdout.splitlines())


def test_warmup_command_compiles_with_a_progress_bar_when_asked():
    result = run_numbapool(
        "warmup", "--ops", "GlobalMaxPool", "--dtypes", "float32", "float64", "--progress"
    )
    assert result.returncode == 0, result.stderr
    assert "2 operator and dtype pairs ready" in result.stdout
    assert "numbapool warmup" in result.stderr and "4/4" in result.stderr  # 2 tasks a dtype


def test_warmup_command_draws_no_bar_into_a_log():
    # stderr is a pipe here, as in a CI log
    result = run_numbapool("warmup", "--ops", "GlobalMaxPool", "--dtypes", "float32")
    assert result.returncode == 0, result.stderr
    assert "1 operator and dtype pairs ready" in result.stdout
    assert "numbapool warmup" not in result.stderr and "\r" not in result.stderr


def test_version():
    result = run_numbapool("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"numbapool {numbapool.__version__}"


def test_warmup_command_names_a_bad_operator():
    result = run_numbapool("warmup", "--ops", "MaxPoool")
    assert result.returncode == 2
    assert "'MaxPoool'" in result.stderr


def test_warmup_skips_dtypes_an_operator_does_not_allow(monkeypatch):
    # what warmup chooses to exercise, not the compiling itself (other tests do that)
    exercised = []
    monkeypatch.setattr(
        _warmup, "_exercise_task", lambda op, name, number: exercised.append((op, name))
    )
    done = numbapool.warmup(["AveragePool", "MaxPool"], ["uint8"], progress=False, processes=1)
    assert done == [("MaxPool", "uint8")]
    assert set(exercised) == {("MaxPool", "uint8")}
    with pytest.raises(ValueError, match="'float128'"):
        numbapool.warmup(["MaxPool"], ["float128"])
    for processes in (0, -2, 1.5, "2", True):
        with pytest.raises(ValueError, match=re.escape(f"not {processes!r}")):
            numbapool.warmup(["MaxPool"], ["float32"], processes=processes)


def test_unwritable_cache_directory_warns_once_and_still_works(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    script = (
        "import warnings, numpy as np\n"
        "warnings.simplefilter('always')\n"
        "import numbapool\n"
        "x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)\n"
        "print(numbapool.max_pool(x, [2, 2], strides=[2, 2]).ravel().tolist())\n"
        "print(numbapool.max_pool(x, [2, 2], strides=[2, 2]).ravel().tolist())\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(not_a_directory / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[5.0, 7.0, 13.0, 15.0]"] * 2
    assert result.stderr.count("RuntimeWarning") == 1
    assert "will not be cached" in result.stderr and str(not_a_directory) in result.stderr


def test_read_only_install_and_home_warn_once_and_still_work():
    # Every directory refuses new files, as on a read-only install with no writable home.
    script = (
        "import tempfile, warnings\n"
        "def refuse(*args, **kwargs):\n"
        "    raise PermissionError(13, 'Read-only file system')\n"
        "tempfile.TemporaryFile = refuse\n"
        "warnings.simplefilter('always')\n"
        "import numpy as np, numbapool\n"
        "from numbapool import _cache\n"
        "print(_cache.CACHE_DIRECTORY)\n"
        "print(numbapool.global_max_pool(np.arange(6.0).reshape(1, 2, 3)).ravel().tolist())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["None", "[2.0, 5.0]"]
    assert result.stderr.count("RuntimeWarning") == 1
    assert "no writable cache location" in result.stderr


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "numbapool")
    assert os.path.exists(script), "pip install puts the numbapool script beside python"
    result = subprocess.run([script, "info", "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["numbapool"] == numbapool.__version__


def test_warmup_compiles_every_family_kind():
    # in a fresh process: warmup compiles each family's kinds by signature; then every
    # family's examples, and a call at a parallel size, compile nothing more
    script = (
        "import numpy as np\n"
        "import numbapool\n"
        "from numba.core import event\n"
        "from numba import types\n"
        "from numbapool import _warmup\n"
        "from numbapool._kernels import choice, parallel\n"
        "ops = ['MaxPool', 'AveragePool', 'LpPool', 'GlobalMaxPool', 'GlobalAveragePool',\n"
        "       'GlobalLpPool']\n"
        "numbapool.warmup(ops, ['float32'], progress=False)\n"
        "dtype = np.dtype(np.float32)\n"
        "missing = []\n"
        "for op in ops:\n"
        "    for family, kinds in _warmup._compilations(op, dtype):\n"
        "        literals = tuple(types.literal(kind) for kind in kinds)\n"
        "        if not any(s[len(s) - len(kinds):] == literals\n"
        "                   for s in family.entry.signatures):\n"
        "            missing.append((family.name, kinds))\n"
        "calls = {'MaxPool': numbapool.max_pool, 'AveragePool': numbapool.average_pool,\n"
        "         'LpPool': numbapool.lp_pool, 'GlobalMaxPool': numbapool.global_max_pool,\n"
        "         'GlobalAveragePool': numbapool.global_average_pool,\n"
        "         'GlobalLpPool': numbapool.global_lp_pool}\n"
        "with event.install_recorder('numba:compile') as compiles:\n"
        "    for family in choice.FAMILIES:\n"
        "        for op, shape, attrs in family.examples:\n"
        "            kwargs = {'return_indices': True} if family.indices else {}\n"
        "            calls[op](np.ones(shape, dtype), **attrs, **kwargs)\n"
        "    numbapool.max_pool(np.ones((2, 16, 64, 64), dtype), [3, 3], strides=[2, 2])\n"
        "    parallel.wait_for_drivers()\n"
        "missing += [e.data['dispatcher'].py_func.__name__ for _, e in compiles.buffer]\n"
        "print(missing)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_warmup_tasks_take_the_dtypes_in_turn():
    # two workers on consecutive tasks then never compile one kernel at once; every task
    # is there once: each op's kernels no family holds, then each family kind
    # (float32 has kinds float16 lacks: columns.row_units' whole passes)
    pairs = [("MaxPool", "float16"), ("MaxPool", "float32"), ("MaxUnpool", "float32")]
    tasks = _warmup._tasks(pairs)
    kernels = {
        name: len(_warmup._compilations("MaxPool", np.dtype(name)))
        for name in ("float16", "float32")
    }
    assert kernels["float16"] < kernels["float32"]
    assert len(tasks) == len(set(tasks)) == sum(kernels.values()) + 3
    assert tasks[:4] == [
        ("MaxPool", "float16", None),
        ("MaxPool", "float32", None),
        ("MaxPool", "float16", 0),
        ("MaxPool", "float32", 0),
    ]
    assert tasks[-1] == ("MaxUnpool", "float32", None)


_FAILING_TASK = """
import multiprocessing

import numbapool._warmup as warmup
exercise = warmup._exercise_task


def fail_on_float32(op, name, number):
    if name == "float32" and multiprocessing.parent_process() is not None:
        raise RuntimeError("a task failed in a worker")
    return exercise(op, name, number)


warmup._exercise_task = fail_on_float32
"""


def test_warmup_raises_the_error_of_a_task_in_a_worker(tmp_path):
    # every process, the spawned workers too, imports sitecustomize at its start: the
    # calling process compiles float64 (the last task: the cache is cold), a worker fails
    # on float32 (where the calling process would not); the warmup fails with that error,
    # and its workers, which hold the pipes this run reads to their end, are gone when it
    # does
    (tmp_path / "sitecustomize.py").write_text(_FAILING_TASK)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    result = run_numbapool(
        "warmup",
        "--ops",
        "GlobalMaxPool",
        "--dtypes",
        "float32",
        "float64",
        "--processes",
        "2",
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    assert "RuntimeError: a task failed in a worker" in result.stderr
    assert "_compile_in_workers" in result.stderr


def test_warmup_workers_default_to_the_cpus_at_most_eight(monkeypatch):
    # each worker holds numba and LLVM (hundreds of MB): a 64-core machine gets 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert _warmup._worker_count(None, 1000) == 8
    assert _warmup._worker_count(None, 3) == 3  # no more workers than tasks
    assert _warmup._worker_count(12, 1000) == 12  # asked for
