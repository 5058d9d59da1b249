import os
import sys

from hypothesis import settings

# the test helpers (reference.py, onnx_nodes.py) import as plain modules
sys.path.insert(0, os.path.dirname(__file__))

# CI runs a fixed number of examples per property with no deadline: the first call of
# each kernel compiles it.
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=False)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
