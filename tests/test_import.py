"""`import numbapool` compiles nothing and needs only numpy, numba and ml_dtypes, and none of
numba's array lowering (numba.np.arrayobj, 18 ms of an import; a compile imports it)."""

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import numbapool
from numbapool._kernels import global_, maxima, parallel, sums, unpool
kernels = [maxima.max_pool_units_with_indices, sums.sum_pool_units, global_.global_max_units,
           *parallel.driver_kernels(), unpool.max_unpool]
optional = ["onnx", "onnxruntime", "torch", "dask", "hypothesis", "tqdm"]
print(json.dumps({"compiled": sum(len(k.signatures) for k in kernels),
                  "optional": [m for m in optional if m in sys.modules],
                  "array_lowering": "numba.np.arrayobj" in sys.modules}))
"""


def test_import_compiles_nothing_and_loads_no_optional_package():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out)
    assert report == {"compiled": 0, "optional": [], "array_lowering": False}
