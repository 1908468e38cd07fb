"""The README and the documentation stay true and self-contained: every ```python block of README.md and of
docs/ runs as written (its "train.lmdb" / "val.lmdb" pointed at a tiny converted sample, "pairs.lmdb" at tiny
image-text pairs, "coco.lmdb" at a tiny COCO conversion, "seg.lmdb" at tiny label maps), the set-up is two
commands, the README stays short, and every local link points at a file inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
DATASET_NAMES = ('"train.lmdb"', '"val.lmdb"')
PAIRS_NAME = '"pairs.lmdb"'  # image-text pairs (docs/pairs.md): pointed at the solid pairs with token ids
COCO_NAME = '"coco.lmdb"'  # detection (docs/detection.md): pointed at the converter tests' COCO source, with masks
SEG_NAME = '"seg.lmdb"'  # semantic segmentation (docs/segmentation.md): pointed at the segmentation rectangles


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


SNIPPETS = [(page, index) for page in PAGES for index in range(len(python_blocks(page)))]


def test_readme_has_python_snippets() -> None:
    assert len(python_blocks(README)) >= 2


@pytest.mark.parametrize(("page", "index"), SNIPPETS,
                         ids=[f"{page.relative_to(ROOT)}-{index}" for page, index in SNIPPETS])
def test_snippet_runs(page: Path, index: int, readme_lmdb: Path, pairs_lmdb: Path, coco_lmdb: Path,
                      seg_rect_lmdb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # what a snippet writes (a trace, logs) lands there
    code = python_blocks(page)[index]
    for name in DATASET_NAMES:
        code = code.replace(name, repr(str(readme_lmdb)))
    code = code.replace(PAIRS_NAME, repr(str(pairs_lmdb)))
    code = code.replace(COCO_NAME, repr(str(coco_lmdb)))
    code = code.replace(SEG_NAME, repr(str(seg_rect_lmdb)))
    namespace: dict = {}
    exec(compile(code, f"{page.relative_to(ROOT)} snippet {index}", "exec"), namespace)
    if "targets" in namespace:  # detection: a canvas of the asked size, a target dict per image
        images, targets = namespace["images"], namespace["targets"]
        assert images.shape[1:] == (3, *images.shape[-2:]) and len(targets) == len(images)
        assert all(t["boxes"].shape[1:] == (4,) for t in targets)
    elif "masks" in namespace:  # segmentation: a mask of class ids per image, the canvas' size
        images, masks = namespace["images"], namespace["masks"]
        assert masks.shape == (len(images), *images.shape[-2:]) and masks.dtype == torch.uint8
    elif "loader" in namespace and hasattr(namespace["loader"], "dataset"):
        assert namespace["images"].shape[1:] == (3, 224, 224)
        if "labels" in namespace:  # image-text pairs have captions instead
            assert namespace["labels"].dtype.is_floating_point is False


def setup_commands(page: Path) -> list[str]:
    """The commands of a page's set-up section (its first bash block), each less its trailing comment."""
    setup = page.read_text().split("## Set-up", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in setup.splitlines() if line.strip() and
            not line.startswith("#")]


def test_readme_setup_is_two_commands() -> None:
    """Two commands that hold on any Python 3.10+: the first makes the clone's own virtual environment and activates
    it (a distribution's Python refuses installs outside one, PEP 668), installs into it and runs the demo; the
    second runs the tests with the interpreter of that environment."""
    commands = setup_commands(README)
    assert len(commands) == 2
    first, second = commands
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "pip install -e" in first and first.endswith("&& fastdata demo")
    assert second == "python -m pytest"
    assert setup_commands(ROOT / "docs" / "index.md") == commands  # the documentation's home page says the same


def test_ci_runs_the_readme_commands_as_a_newcomer_types_them() -> None:
    """.ci/run runs the README's two commands word for word, in order (lint and docs between them), so that CI
    checks what a newcomer types; `set -e` does not stop at a failure inside an && list, so the first one's status
    is checked with `|| exit`."""
    first, second = setup_commands(README)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert f"{first} || exit" in ci and second in ci
    assert ci.index(f"{first} || exit") < ci.index("ruff check .") < ci.index(second)
    assert not [line for line in ci if "pip install" in line and line != f"{first} || exit"]  # nothing else installs


def test_readme_is_short() -> None:
    """The README teaches in five minutes; everything else lives in docs/."""
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_local_links_stay_in_the_repository(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} links to a missing file: {target}"


def test_readme_says_what_the_mixing_page_says_about_shares() -> None:
    """The README's one line about a mixture's shares is the mixing page's own sentence, word for word."""
    def words(page: Path) -> str:
        return " ".join(page.read_text().split())

    promise = ("every batch holds each dataset's share, rounded, the same way every epoch, on every rank, and a "
               "resumed run continues exactly")
    assert promise in words(README) and promise in words(ROOT / "docs" / "mixing.md")
