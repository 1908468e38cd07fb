"""The generated API reference (docs/reference/api.md, rendered by mkdocstrings) covers the public API: every name
in `fastdata.__all__` has an entry there, and every function it documents, `fastdata.loader` first, lists each of
its parameters in its docstring's `Args:` section, parsed by griffe as the site renders it. So a new option is
documented where it is defined, or this fails naming it."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import griffe
import pytest

import fastdata

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md"


def entries() -> list[str]:
    """The dotted paths of the page's `::: path` entries, in page order."""
    return re.findall(r"^::: (\S+)$", API_PAGE.read_text(), flags=re.M)


def resolve(path: str) -> Any:
    """The object a `:::` entry documents: a module when one has that path (as griffe resolves it, so
    `fastdata.loader` is the module fastdata/loader.py, not the function), else an attribute of the longest
    importable prefix."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise AssertionError(f"{API_PAGE.name}: ::: {path} does not resolve")


DOCUMENTED_FUNCTIONS = [path for path in entries() if inspect.isfunction(resolve(path))]


def documented_parameters(function: Any) -> list[str]:
    """The parameter names of `function`'s Google-style `Args:` section, as griffe parses it for the site."""
    docstring = griffe.Docstring(inspect.getdoc(function) or "", lineno=1)
    return [parameter.name.lstrip("*") for section in docstring.parse("google")
            if section.kind is griffe.DocstringSectionKind.parameters for parameter in section.value]


@pytest.mark.parametrize("name", [name for name in fastdata.__all__ if name != "__version__"])
def test_every_public_name_has_an_entry(name: str) -> None:
    public = getattr(fastdata, name)
    documented = [resolve(path) for path in entries()]
    assert any(public is thing for thing in documented), (
        f"fastdata.{name} has no entry in {API_PAGE.relative_to(API_PAGE.parents[2])}: add "
        f"'::: {public.__module__}.{public.__qualname__}' (a module of the same name would be documented instead "
        f"of a bare 'fastdata.{name}')")


def test_loader_is_documented() -> None:
    assert any(resolve(path) is fastdata.loader for path in DOCUMENTED_FUNCTIONS)


@pytest.mark.parametrize("path", DOCUMENTED_FUNCTIONS)
def test_every_parameter_is_documented(path: str) -> None:
    function = resolve(path)
    parameters = [name for name in inspect.signature(function).parameters if name != "self"]
    documented = documented_parameters(function)
    missing = [name for name in parameters if name not in documented]
    assert not missing, f"{path}: parameters missing from the docstring's Args: section: {', '.join(missing)}"
    unknown = [name for name in documented if name not in parameters]
    assert not unknown, f"{path}: Args: names what is no parameter: {', '.join(unknown)}"


def test_resolve_prefers_the_module_as_griffe_does() -> None:
    """`::: fastdata.meter` documents the package, not the function (which is why the page names the function's
    module): the resolver above must agree with the renderer."""
    assert isinstance(resolve("fastdata.meter"), ModuleType)
    assert resolve("fastdata.meter.loop.meter") is fastdata.meter


PUBLIC_MODULES = {"fastdata", "fastdata.presets", "fastdata.options"}  # what user code may import from


def user_code() -> list[tuple[str, str]]:
    """(where, code) of what users run: the README's and the docs' Python blocks, and examples/."""
    root = API_PAGE.parents[2]
    found = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)):
            found.append((f"{page.relative_to(root)} block {number + 1}", block))
    found += [(str(path.relative_to(root)), path.read_text()) for path in sorted((root / "examples").glob("*.py"))]
    return found


def internal_imports(code: str) -> list[str]:
    """The fastdata modules `code` imports that are not public."""
    named = re.findall(r"^\s*from (fastdata[\w.]*) import", code, flags=re.M)
    named += re.findall(r"^\s*import (fastdata[\w.]*)", code, flags=re.M)
    return [module for module in named if module not in PUBLIC_MODULES]


def test_user_code_imports_only_the_public_names() -> None:
    """No snippet of the docs or README, and no example, names an internal module: the curated names
    (`fastdata.*`, `fastdata.presets`) are all a user needs, and the internal layout may move."""
    code = user_code()
    assert len(code) > 20  # the pages and examples were found
    wrong = [f"{where}: imports {module}" for where, text in code for module in internal_imports(text)]
    assert wrong == []


def test_the_public_import_rule_catches_an_internal_import() -> None:
    assert internal_imports("from fastdata.image.detection_presets import ScaleJitterCrop\n") == [
        "fastdata.image.detection_presets"]
    assert internal_imports("import fastdata\nfrom fastdata.presets import ScaleJitterCrop\n") == []
