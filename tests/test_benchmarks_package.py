"""benchmarks/ is a package: every benchmark imports as `benchmarks.NAME` and runs as `python -m benchmarks.NAME`
(the harness runs it so), no module edits `sys.path` to find another, none imports a private name (of another
benchmark or of fastdata: what they share is public, in common.py, report.py, text_loaders.py), and every one
parses its options with the one shared helper (`common.arguments`: --smoke, --repeats, --images, --data, --json
spelt one way), and the documents quote the commands in that spelling."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from benchmarks import registry, tables
from benchmarks.common import arguments

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
MODULES = sorted(BENCHMARKS.glob("*.py"))
RUNNERS = [b for b in registry.BENCHMARKS if not b.command]
#: sys.path changed in code or in a child's code written as a string (`sys.path.insert(...)`, `sys.path = ...`);
#: a bare GPU machine's PYTHONPATH (device_setup.py: the wheels it installs beside the checkout) is no such edit
PATH_EDIT = re.compile(r"sys\.path\s*(?:\.\s*(?:insert|append|extend|remove)\b|\+?=(?!=))")
#: a command that runs a benchmark as a file (`python benchmarks/cpu_path.py`, `cpu_path.py --images ...`)
SCRIPT_COMMAND = re.compile(r"python3? (?:\S*/)?benchmarks/\w+\.py|(?<![\w/.-])(?:benchmarks/)?\w+\.py --[a-z]")
DOCUMENTS = [ROOT / "README.md", BENCHMARKS / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def path_edits(text: str) -> list[str]:
    """The lines of `text` that change the import path."""
    return [line.strip() for line in text.splitlines() if PATH_EDIT.search(line)]


def private_imports(tree: ast.AST) -> list[str]:
    """`from M import _name` and imports of a module whose dotted path has a `_part` (dunders are public)."""

    def private(name: str) -> bool:
        return any(part.startswith("_") and not part.endswith("__") for part in name.split("."))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if private(a.name) or private(node.module or "")]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if private(a.name)]
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_benchmark_module_edits_the_import_path(path):
    assert path_edits(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_benchmark_module_imports_a_private_name(path):
    assert private_imports(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_guards_catch_what_they_guard():
    """Each check fails on the forms that were in benchmarks/ before it was a package."""
    assert path_edits("sys.path.insert(0, str(Path(__file__).parent))\nx = 1\n") != []
    assert path_edits('CHILD = """\nsys.path.insert(0, sys.argv[5])\n"""') != []
    assert path_edits("sys.path = [here]") != [] and path_edits("sys.path += [here]") != []
    assert path_edits("if sys.path == []: pass\nprint(sys.path[0])") == []
    assert private_imports(ast.parse("from text_throughput import _in_fresh_process")) != []
    assert private_imports(ast.parse("def f():\n    from fastdata.image.device.kernels import _axis_weights")) != []
    assert private_imports(ast.parse("import fastdata._version")) != []
    assert private_imports(ast.parse("from __future__ import annotations\nfrom fastdata import __version__")) == []
    assert SCRIPT_COMMAND.search("python benchmarks/convert_speed.py --images 3000")
    assert SCRIPT_COMMAND.search("`cpu_path.py --images 4000`")
    assert not SCRIPT_COMMAND.search("python -m benchmarks.convert_speed --images 3000; see benchmarks/peers.py")


@pytest.mark.parametrize("entry", RUNNERS, ids=lambda b: b.name)
def test_every_registered_benchmark_imports_as_a_module_with_a_main(entry):
    module = importlib.import_module(entry.runner)
    assert callable(module.main)
    assert entry.target == ("-m", entry.runner)


@pytest.mark.parametrize("runner", sorted({b.runner for b in RUNNERS}))
def test_every_benchmark_parses_its_options_with_the_shared_helper(runner):
    """No parser of its own: `common.arguments` (text_loaders.loading_arguments builds on it) gives every benchmark
    the same --smoke and --repeats."""
    source = (BENCHMARKS / f"{runner.removeprefix('benchmarks.')}.py").read_text(encoding="utf-8")
    assert "ArgumentParser(" not in source and "add_loading_arguments" not in source
    assert re.search(r"\b(?:loading_)?arguments\(", source)


def test_smoke_stands_for_the_registrys_smoke_run_and_what_is_given_beside_it_wins():
    parser = arguments("d", images=3000, repeats=3, module="benchmarks.imagefolder_vs_fastdata", epochs=2)
    assert vars(parser.parse_args([])) | {"data": None} == {"smoke": False, "data": None, "images": 3000,
                                                             "repeats": 3, "epochs": 2}
    smoke = parser.parse_args(["--smoke"])
    assert (smoke.smoke, smoke.images, smoke.repeats) == (True, 60, 1)
    assert parser.parse_args(["--smoke", "--repeats", "2"]).repeats == 2
    assert parser.prog == "python -m benchmarks.imagefolder_vs_fastdata"
    gpu = arguments("d", images=6144, module="benchmarks.gpu_check", json=True, data=False)
    gpu.add_argument("--device", default="cuda")
    gpu.add_argument("--out", default="x")
    feed = next(b for b in registry.BENCHMARKS if b.name == "gpu_check")
    cpu = gpu.parse_args(["--smoke", "--json", "r.json"])
    assert cpu.json == "r.json" and cpu.images in (int(feed.smoke[1]), int(feed.cpu_smoke[1]))
    with pytest.raises(SystemExit, match="not a registered benchmark"):
        arguments("d", module="benchmarks.common").parse_args(["--smoke"])


def test_the_harness_runs_each_benchmark_as_a_module_from_the_root():
    import benchmarks.__main__ as harness

    for benchmark in RUNNERS:
        command = harness.command_of(benchmark, smoke=False, repeats=2)
        assert command[1:3] == ["-m", benchmark.runner] and command[-2:] == (
            ["--repeats", "2"] if benchmark.takes_repeats else command[-2:])
        assert command.count("--repeats") <= 1  # the asked number replaces the registry's, never follows it
    masks = next(b for b in registry.BENCHMARKS if b.name == "detection_masks")
    assert masks.runner == "benchmarks.detection" and registry.of_module("benchmarks.detection").name == "detection"


@pytest.mark.parametrize("path", DOCUMENTS + MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_documents_and_docstrings_quote_benchmark_commands_as_modules(path):
    """`python -m benchmarks.NAME ...`, never a benchmark's file run as a script (it no longer runs so). What the
    markers hold is written from the results, whose runs keep the command as it was run, and is left out."""
    text = tables.MARKER.sub("", path.read_text(encoding="utf-8"))
    assert [m.group() for m in SCRIPT_COMMAND.finditer(text)] == []
