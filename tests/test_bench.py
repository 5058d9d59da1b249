"""The comparison command and the benchmark case table run."""

import os
import subprocess
import sys

import numba
import pytest

from numbapool import _bench, _cases


def test_bench_command_prints_the_table():
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", "--quick", "--cases", "tiny", "global max"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(line for line in lines if line.startswith("threads: "))
    threads, cores = (part.split(": ")[1] for part in first.split("; ")[:2])
    if hasattr(os, "sched_setaffinity"):  # the process was held to as many cores as threads
        assert len(_cores_named(cores)) == int(threads)
    header = next(i for i, line in enumerate(lines) if line.startswith("| case"))
    columns = [cell.strip() for cell in lines[header].split("|")[1:-1]]
    rows = [
        dict(zip(columns, (cell.strip() for cell in line.split("|")[1:-1])))
        for line in lines[header + 2 :]
    ]
    assert [row["case"] for row in rows] == ["tiny", "global max"]
    peers = [name[:-3] for name in columns[2:] if name.endswith(" ms")]
    assert columns[1] == "numbapool ms" and {"onnxruntime", "torch"} <= set(peers)
    for row in rows:
        numbapool_ms = float(row["numbapool ms"])
        peer_ms = {name: float(row[f"{name} ms"]) for name in peers if row[f"{name} ms"] != "n/a"}
        assert numbapool_ms > 0 and peer_ms["onnxruntime"] > 0  # onnxruntime is a test dep
        # the ratios come from the same rounds as the times (test_a_row_s_figures): here only
        # their form, as a few rounds of a noisy machine can put them anywhere
        assert row["best peer"] in peer_ms and float(row["numbapool / best peer"]) > 0


def test_a_row_s_figures():
    times = {
        "numbapool": [1.0, 2.0, 3.0, 10.0, 1.0],
        "slow": [4.0, 4.0, 4.0, 4.0, 4.0],
        "fast": [0.5, 4.0, 1.0, 5.0, 2.0],
        "copy": [0.25, 1.0, 1.0, 1.0, 4.0],
    }  # a copy of 2000 bytes, round by round
    row = _bench.summarize("case", times, bytes_moved=4_000, copy_bytes=2_000)
    assert row["numbapool ms"] == 2000.0 and row["fast ms"] == 2000.0 and row["slow ms"] == 4000.0
    # per-round ratios to "fast": 2, 0.5, 3, 2, 0.5 -> median 2, where the medians' ratio is 1
    assert row["best peer"] == "fast" and row["vs best peer"] == 2.0
    # the copy's speed per round: 8000, 2000, 2000, 2000, 500 bytes/s -> median 2000; the
    # rooflines of 4000 bytes at those speeds: 0.5, 2, 2, 2, 8 s -> per-round ratios 2, 1,
    # 1.5, 5, 0.125 -> median 1.5, where the medians' ratio (2 s / 2 s) is 1
    assert row["copy GB/s"] == 2000 / 1e9 and row["vs roofline"] == 1.5
    assert "copy" not in row and "copy ms" not in row
    alone = _bench.summarize("alone", {"numbapool": [1.0], "copy": [1.0]}, 1, 1)
    assert alone["best peer"] is None and alone["vs roofline"] == 1.0


def _cores_named(text: str) -> list:
    """The cores of describe_cores' "0-2,5" form, written out."""
    cores = []
    for run in text.split(","):
        first, _, last = run.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


def test_a_block_times_only_the_calls_after_its_warmup(monkeypatch):
    # a clock that moves 10 ms at each reading: the warmup's calls are made and left out
    readings = iter(range(1000))
    monkeypatch.setattr(_bench.time, "perf_counter", lambda: next(readings) * 0.01)
    calls = []
    seconds = _bench._timed_block(lambda: calls.append(None), warmup=0.02)
    # warmup: readings 0 (start), 1 and 2 after its two calls; then the block: reading 3
    # (start), and 4, 5 and 6 after its three calls, 30 ms in all
    assert len(calls) == 5
    assert seconds == pytest.approx(0.01)


def test_each_engine_s_block_starts_after_its_warmup(monkeypatch):
    warmups = []
    monkeypatch.setattr(
        _bench, "_timed_block", lambda function, warmup=0.0: warmups.append(warmup) or 1e-3
    )
    monkeypatch.setattr(_bench, "_peer_runners", lambda case, x, threads: {})
    copy = (lambda: None, 1)
    _bench.measure(_cases.CASES_BY_NAME["tiny"], 1, 3, copy)
    assert warmups == [_bench.WARMUP_SECONDS] * 6  # numbapool and the copy, 3 rounds


def test_cores_are_described_as_runs():
    assert _bench.describe_cores([0, 1, 2, 5, 7, 8]) == "cores: 0-2,5,7-8"
    assert _bench.describe_cores([3]) == "cores: 3"
    assert _cores_named("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert "not pinned" in _bench.describe_cores(None)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_pinning_holds_threads_started_before_and_after():
    """pin_to_cores holds the threads that exist already (an engine's pool started at its
    import), not only the calling thread and the threads it starts later."""
    script = """if True:
        import os, threading
        from numbapool._bench import pin_to_cores
        started, release = threading.Event(), threading.Event()
        def wait():
            started.set()
            release.wait()
        before = threading.Thread(target=wait)
        before.start()
        started.wait()
        allowed = sorted(os.sched_getaffinity(0))
        cores = pin_to_cores(1, first=[allowed[-1]])
        after = {}
        later = threading.Thread(target=lambda: after.update(
            cores=os.sched_getaffinity(threading.get_native_id())))
        later.start()
        later.join()
        print(cores == [allowed[-1]], os.sched_getaffinity(0) == set(cores),
              os.sched_getaffinity(before.native_id) == set(cores), after["cores"] == set(cores))
        release.set()
    """
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 4


@pytest.mark.parametrize(
    "arguments, words",
    [
        (["--rounds", "0"], "--rounds: need at least 1 round, got 0"),
        (["--threads", "0"], "--threads: between 1 and"),
    ],
)
def test_bench_rejects_bad_counts(arguments, words):
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", *arguments], capture_output=True, text=True
    )
    assert result.returncode == 2 and words in result.stderr


def test_bench_rejects_an_unknown_case():
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", "--cases", "nope"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "unknown case 'nope'" in result.stderr


@pytest.mark.parametrize("offset", [0, 8, 16, 48])
def test_an_input_placed_in_its_cache_line(offset):
    x = _cases.make_input((2, 3, 5, 7), "float64")
    placed = _bench.placed_input(x, offset)
    assert placed.ctypes.data % 64 == offset == _bench.line_offset(placed)
    assert placed.tobytes() == x.tobytes() and placed.shape == x.shape
    assert placed.dtype == x.dtype and placed.flags.c_contiguous


@pytest.mark.parametrize(
    "arguments, words",
    [
        (["--offset", "64"], "--offset: between 0 and 63 bytes, got 64"),
        (["--offset", "4", "--cases", "float64"], "4 is not a multiple of float64's 8 bytes"),
    ],
)
def test_bench_rejects_an_offset_it_cannot_place(arguments, words):
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", *arguments], capture_output=True, text=True
    )
    assert result.returncode == 2 and words in result.stderr


def test_every_case_runs_on_a_small_input():
    # the full sizes belong to the benchmarks; here each case's call path runs on a slice
    for case in _cases.CASES:
        shape = (1, 2) + tuple(min(n, 12) for n in case.shape[2:])
        x = _cases.make_input(shape, case.dtype, case.data)
        outputs = _cases.run(case, x)
        assert outputs[0].dtype == x.dtype, case.name
        assert len(outputs) == (2 if case.return_indices else 1)


def test_stream_copy_copies():
    call, copied = _bench.stream_copy()
    call()
    assert copied == 2 * 256 * 2**20


def test_scaling_report():
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", "--quick", "--scaling"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    rows = [
        line.split("|")[1:-1]
        for line in result.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| case") and "---" not in line
    ]
    names = [row[0].strip() for row in rows]
    assert names[:3] == ["N*C = 1", "lp p=3 3x3", "big kernel"]
    header = next(line for line in result.stdout.splitlines() if line.startswith("| case"))
    n = _bench.thread_ladder(numba.config.NUMBA_NUM_THREADS)
    assert [cell.strip() for cell in header.split("|")[3 : 3 + len(n)]] == [
        f"{c} thread{'s' if c > 1 else ''} ms" for c in n
    ]
    # the machine's arithmetic alone, beside the pools
    assert names[-2:] == [
        "float64 square roots (no pooling)",
        "8 chained products and sums (no pooling)",
    ]
    for row in rows:
        assert all(float(cell) > 0 for cell in row[1:])


def test_thread_ladder_doubles_up_to_the_count():
    assert _bench.thread_ladder(1) == [1]
    assert _bench.thread_ladder(2) == [1, 2]
    assert _bench.thread_ladder(6) == [1, 2, 4, 6]
    assert _bench.thread_ladder(16) == [1, 2, 4, 8, 16]


def test_first_call_report():
    # one operator: each row compiles in a fresh process on an empty cache
    lines = _bench.first_call(["GlobalMaxPool"], warmup=False).splitlines()
    assert lines[0].startswith("| first call, fresh process")
    row = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert row[0] == "GlobalMaxPool"
    imports = [float(v) for v in row[1].split(" / ")]
    cold, cold_mb, warm, warm_mb = (float(v) for v in row[2:])
    assert min(imports) > 0 and cold > 0 and warm > 0
    assert cold_mb > 0 and warm_mb == cold_mb  # the warm process wrote nothing more


def test_bench_under_load_prints_both_thread_counts_and_stops_its_busy_processes():
    """``bench --busy 0``: each case at N threads and 1 thread, quiet and beside a process
    spinning on core 0, which is gone once the command ends."""
    before = set(os.listdir("/proc")) if os.path.isdir("/proc") else None
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "numbapool",
            "bench",
            "--quick",
            "--busy",
            "0",
            "--cases",
            "tiny",
            "global max",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(line for line in lines if line.startswith("threads: "))
    n = int(first.split(";")[0].split()[1])
    assert "parallel calls: " in first and first.endswith("cores 0")
    header = next(i for i, line in enumerate(lines) if line.startswith("| case"))
    columns = [cell.strip() for cell in lines[header].split("|")[1:-1]]
    assert columns == [
        "case",
        f"quiet {n} threads ms",
        "quiet 1 thread ms",
        f"quiet {n} / 1",
        f"busy {n} threads ms",
        "busy 1 thread ms",
        f"busy {n} / 1",
    ]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[header + 2 :]]
    assert [row[0] for row in rows] == ["tiny", "global max"]
    assert all(float(cell) > 0 for row in rows for cell in row[1:])
    if before is not None:  # no spinning child left behind
        for pid in set(os.listdir("/proc")) - before:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    assert b"while True" not in f.read()
            except OSError:  # gone meanwhile
                pass


def test_bench_under_load_rejects_a_core_it_may_not_use():
    result = subprocess.run(
        [sys.executable, "-m", "numbapool", "bench", "--busy", "4096"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "core 4096" in result.stderr
