"""Run mypy on fastdata as it is installed: `converters/` checked as `fastdata.converters`.

setuptools installs `converters/` as `fastdata.converters` ([tool.setuptools.package-dir] in pyproject.toml), a
mapping mypy cannot read: `mypy fastdata converters` would check a top-level `converters` package and leave every
`fastdata.converters` import unresolved. This script hands mypy the files of each mapped package under its installed
name; everything else (what to check, how strictly) is mypy's own configuration, [tool.mypy] in pyproject.toml.

    python .ci/typecheck.py [mypy options]      # from the repository root, with the interpreter of the tests
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import build, util
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy depends on tomli before Python 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def mapped_sources(pyproject: Path) -> list[BuildSource]:
    """Every .py file of each [tool.setuptools.package-dir] entry, named as the package it installs as."""
    package_dir = tomllib.loads(pyproject.read_text())["tool"]["setuptools"].get("package-dir", {})
    sources = []
    for package, folder in package_dir.items():
        for path in sorted((pyproject.parent / folder).rglob("*.py")):
            parts = path.relative_to(pyproject.parent / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            sources.append(BuildSource(str(path.relative_to(ROOT)), ".".join((package, *parts)), None, str(ROOT)))
    return sources


def main(args: list[str]) -> int:
    os.chdir(ROOT)  # mypy reads [tool.mypy] from the current directory
    fscache = FileSystemCache()
    sources, options = process_options(args, fscache=fscache)  # [tool.mypy] files, plus any options given here
    sources += mapped_sources(ROOT / "pyproject.toml")
    messages: list[str] = []

    def report(_file: str | None, new: list[str], _serious: bool) -> None:
        messages.extend(new)
        print("\n".join(new), flush=True)

    try:
        build.build(sources, options, flush_errors=report, fscache=fscache)
    except build.CompileError as error:  # a blocking error (a syntax error): mypy printed nothing yet
        print("\n".join(error.messages))
        return 2
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, _notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), use_color=False))
        return 1
    print(formatter.format_success(len(sources), use_color=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
