"""The README's Python snippets run as written (dataset names pointed at a tiny converted sample)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fastdata
from fastdata.tools.sample import make_sample_imagefolder

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def train_lmdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    src = make_sample_imagefolder(root / "train", images=24, classes=3, workers=1)
    out = root / "train.lmdb"
    fastdata.convert_imagefolder(src, out, workers=1, progress=False)
    return out


def test_readme_has_python_snippets() -> None:
    assert len(python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_snippet_runs(index: int, train_lmdb: Path) -> None:
    code = python_blocks()[index].replace('"train.lmdb"', repr(str(train_lmdb)))
    namespace: dict = {}
    exec(compile(code, f"README.md snippet {index}", "exec"), namespace)
    if "loader" in namespace and hasattr(namespace["loader"], "dataset"):
        assert namespace["images"].shape[1:] == (3, 224, 224)
        assert namespace["labels"].dtype.is_floating_point is False


def test_readme_setup_is_two_commands() -> None:
    setup = README.read_text().split("## Set-up", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in setup.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2
    assert "pip install" in commands[0] and "fastdata demo" in commands[0]
    assert "pytest" in commands[1]
