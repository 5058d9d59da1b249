"""examples/quickstart.ipynb runs from top to bottom."""

import os

import nbformat
from nbclient import NotebookClient

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")


def test_quickstart_notebook_runs(tmp_path):
    path = os.path.join(EXAMPLES, "quickstart.ipynb")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    ]
    assert not [output for output in outputs if output.output_type == "error"]
    text = "".join(output.get("text", "") for output in outputs)
    assert "| case" in text  # the bench table
    assert "numbapool and onnxruntime agree" in text  # onnxruntime is a test dependency
    html = "".join(output.get("data", {}).get("text/html", "") for output in outputs)
    assert "<th>output shape</th>" in html  # the plan as a table
    assert any("image/png" in output.get("data", {}) for output in outputs)
