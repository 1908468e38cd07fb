"""Every name the code and the docs point a reader to exists: each dotted `fastdata.` name in a docstring, comment
or page resolves (a module, or an attribute reached from the package or a module), and each path of the
repository's own folders named in them is there. Moving a module without updating what names it fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import fastdata

ROOT = Path(__file__).resolve().parents[1]
READ = sorted([*ROOT.glob("fastdata/**/*.py"), *ROOT.glob("converters/**/*.py"), *ROOT.glob("benchmarks/*.py"),
               *ROOT.glob("docs/**/*.md"), ROOT / "README.md", ROOT / "benchmarks" / "README.md"])
# a dotted name, not inside a longer word, path or string literal ("fastdata.tune" names a kind of JSON file)
DOTTED = re.compile(r"""(?<![\w./"'-])fastdata(?:\.[A-Za-z_]\w*)+""")
# a path inside the repository's own folders (benchmarks/data/ is made by the benchmarks, not kept; a suite's
# results file, benchmarks/results/<suite>.json, by the harness's run of that suite: named before it is measured)
PATH = re.compile(r"(?<![\w./-])(?:fastdata|converters|tests|benchmarks(?!/data|/results/(?:read|convert|text|device|"
                  r"memory|startup|SUITE)\.json))/[\w/.-]*\w")
# the C extensions setup.py builds: named wherever they are, built only where a compiler and Python's headers were
EXTENSIONS = frozenset(re.findall(r'Extension\(\s*"([\w.]+)"', (ROOT / "setup.py").read_text()))


def resolves(name: str) -> bool:
    """Whether `name` is reached by attributes from the package (its public names: `fastdata.meter.tensorboard`),
    or is a module, or an attribute chain from the longest importable module prefix."""
    parts = name.split(".")
    obj: object = fastdata
    try:
        for part in parts[1:]:
            obj = getattr(obj, part)
        return True
    except AttributeError:
        pass
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ImportError:
            if (ROOT / Path(*parts[:cut])).with_suffix(".py").exists():  # an optional extra is missing here
                return True
            if module in EXTENSIONS:  # not built here
                return True
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


# the deprecations page names the old spellings on purpose: they resolve (and say they are deprecated)
@pytest.mark.filterwarnings("ignore::fastdata.deprecations.FastdataDeprecationWarning")
@pytest.mark.parametrize("page", READ, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_module_and_path_exists(page: Path) -> None:
    text = page.read_text()
    missing = sorted({m.group(0) for m in DOTTED.finditer(text) if not resolves(m.group(0))} |
                     {m.group(0) for m in PATH.finditer(text) if not (ROOT / m.group(0)).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_a_moved_module_is_caught() -> None:
    assert resolves("fastdata.image.buffers.BatchBuffers") and resolves("fastdata.meter.tensorboard")
    assert "fastdata.image._jpeg_region" in EXTENSIONS and resolves("fastdata.image._jpeg_region")
    assert not resolves("fastdata.batch_buffers") and not resolves("fastdata.image.buffers.NoSuchThing")
