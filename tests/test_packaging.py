"""Installing on a fresh machine of any kind. The region decoder is a C extension (setup.py): without a C compiler or
Python's headers the build still succeeds and says, once, that it was not built and what to install; a wheel build
(cibuildwheel, FASTDATA_REQUIRE_EXTENSION) fails instead; where a compiler and the headers are present it was built;
and the tests that need it are skipped, saying what to install, where it was not."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from fastdata.image.jpeg.extension import EXTENSION, HOW_TO_BUILD, NOT_BUILT, WITHOUT_IT, extension_built
from fastdata.text import kernel as text_kernel

ROOT = Path(__file__).resolve().parents[1]
REQUIRE = "FASTDATA_REQUIRE_EXTENSION"
# a compiler that fails every call (as one without Python's headers does), and one that is not there at all
NO_COMPILER = {"failing": shutil.which("false") or "/bin/false", "missing": "/nonexistent/bin/cc"}


def source_copy(into: Path) -> Path:
    """What `setup.py build_ext` reads, copied into `into`: setup.py, pyproject.toml and the README it names, the C
    sources, the version and the extension modules' words (setup.py runs them for their messages)."""
    for name in ("setup.py", "pyproject.toml", "README.md", "fastdata/_version.py", "fastdata/image/jpeg/extension.py",
                 "fastdata/text/kernel.py"):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, into / name)
    shutil.copytree(ROOT / "csrc", into / "csrc")
    return into


def build_ext(source: Path, **env: str) -> tuple[int, str]:
    """Run `python setup.py build_ext --inplace` in `source` with `env` added: (exit code, stdout + stderr)."""
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=source, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="CC picks the compiler of distutils' Unix toolchain only")
@pytest.mark.parametrize("compiler", sorted(NO_COMPILER))
def test_without_a_compiler_the_build_succeeds_and_says_once_what_to_install(tmp_path, compiler):
    pytest.importorskip("setuptools", reason="setup.py needs setuptools (the dev extra installs it)")
    source = source_copy(tmp_path)
    code, output = build_ext(source, CC=NO_COMPILER[compiler])
    assert code == 0, output
    assert output.count(NOT_BUILT) == 1, output  # said once, with what it changes and what to install
    assert WITHOUT_IT in output and HOW_TO_BUILD in output
    assert output.count(text_kernel.NOT_BUILT) == 1 and text_kernel.WITHOUT_IT in output, output  # the text kernel's
    assert not [p.name for p in source.rglob("_jpeg_region*") if p.suffix in (".so", ".pyd")]
    assert not [p.name for p in source.rglob("_rows*") if p.suffix in (".so", ".pyd")]


@pytest.mark.skipif(sys.platform == "win32", reason="CC picks the compiler of distutils' Unix toolchain only")
def test_a_wheel_build_fails_rather_than_ship_without_the_extension(tmp_path):
    pytest.importorskip("setuptools", reason="setup.py needs setuptools (the dev extra installs it)")
    code, output = build_ext(source_copy(tmp_path), CC=NO_COMPILER["failing"], **{REQUIRE: "1"})
    assert code != 0 and NOT_BUILT not in output, output


def test_the_wheels_are_built_by_cibuildwheel_with_the_extension_required():
    """The wheels workflow runs cibuildwheel, whose settings (pyproject.toml) make setup.py fail without the
    extension and check that each wheel's extension loads and passes its self-check."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "wheels.yml").read_text())
    steps = [step.get("uses", "") for step in workflow["jobs"]["build_wheels"]["steps"]]
    assert any(uses.startswith("pypa/cibuildwheel@v") for uses in steps)
    settings = (ROOT / "pyproject.toml").read_text().split("[tool.cibuildwheel]", 1)[1].split("\n[tool.", 1)[0]
    assert re.search(rf'^environment = \{{ {REQUIRE} = "1" \}}$', settings, flags=re.M)
    assert re.search(r"^test-command = .*region_decoder", settings, flags=re.M)
    assert f'"{REQUIRE}"' in (ROOT / "setup.py").read_text()


def test_the_extension_was_built_where_a_compiler_and_pythons_headers_are():
    """Where the extensions could be built they must have been: a broken C build fails here instead of hiding
    behind the skips of the tests that need it (or behind numpy, for the text kernel)."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which(compiler) is None or not headers.is_file():
        pytest.skip(f"no C compiler ({compiler}) or no Python headers ({headers}) here: {NOT_BUILT}")
    assert extension_built(), f"{compiler} and {headers} are here, yet {NOT_BUILT}: run the same pip install again"
    assert text_kernel.extension_built(), f"{compiler} and {headers} are here, yet {text_kernel.NOT_BUILT}"


def test_the_tests_that_need_the_extension_are_skipped_saying_what_to_install(tmp_path):
    """A pytest run of test modules that need the extension (by fixture and by marker), in a process where importing
    it fails as where it was not built: nothing fails, and every test that needs it is skipped with the reason."""
    (tmp_path / "without_the_extension.py").write_text(f"import sys\n\nsys.modules[{EXTENSION!r}] = None\n")
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "without_the_extension", "-p",
                           "no:cacheprovider", f"--junitxml={report}", "tests/image/jpeg/test_jpeg_region.py",
                           "tests/image/jpeg/test_restart_loading.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    cases = ET.parse(report).getroot().iter("testcase")
    skipped = [case.find("skipped").get("message", "") for case in cases if case.find("skipped") is not None]
    for_the_extension = [reason for reason in skipped if not reason.startswith("needs a CUDA GPU")]
    assert len(for_the_extension) >= 20
    assert all(NOT_BUILT in reason and HOW_TO_BUILD in reason for reason in for_the_extension), set(skipped)


def test_every_package_is_in_the_wheel():
    """pyproject.toml names its packages one by one (converters/ installs as `fastdata.converters`); a sub-package
    left out is missing from the wheel, though an editable install and this suite still find it."""
    section = (ROOT / "pyproject.toml").read_text().split("\n[tool.setuptools]\n", 1)[1].split("\n[", 1)[0]
    written = re.search(r"^packages = (\[.*?\])", section, re.S | re.M)  # read as text: Python 3.10 has no tomllib
    assert written is not None, "pyproject.toml's [tool.setuptools] names no packages"
    listed = set(ast.literal_eval(written.group(1)))
    found = set()
    for base, package in (("fastdata", "fastdata"), ("converters", "fastdata.converters")):
        for init in (ROOT / base).rglob("__init__.py"):
            found.add(".".join([package, *init.parent.relative_to(ROOT / base).parts]))
    assert sorted(found - listed) == [], "packages missing from pyproject.toml's [tool.setuptools] packages"
    assert sorted(listed - found) == [], "listed in pyproject.toml, but no such package"
