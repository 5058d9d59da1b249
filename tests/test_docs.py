"""Every ```python block of the README and of docs/ runs as printed: each file's blocks in
order, as one script, in a fresh process in an empty directory."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks(page: pathlib.Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def test_the_readme_has_blocks_to_run():
    assert len(_blocks(ROOT / "README.md")) >= 2


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_code_blocks_run_as_printed(page, tmp_path):
    script = tmp_path / "blocks.py"
    script.write_text("\n".join(_blocks(page)))
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-4000:]
