"""The layout holds: imports point one way, down the layers, and close no loop; no module grows over 600 lines and
no room over 15 modules.

Every module of the package (and of `converters/`, installed as `fastdata.converters`) is parsed; every import it
makes, at module level or inside a function, counts. Layers, lowest first (docs/contributing.md, "The layer rule"):

    _version, errors, config, workers, processes, background, output_lock  <  formats  <  order, meter  <  image, text
    <  loader, convert  <  converters  <  tools  <  cli and the package face

A module may import from its own room or from a lower layer, never from a higher one nor from the other room of
its own layer (order and meter, image and text, loader and convert never import each other). No two modules may
import each other, directly or round a loop. Nor may rooms inside a room: within each package, its sub-packages
(image/jpeg, image/device, ...), each seen as one, and its own modules close no loop. So a sub-room may import a
module of its parent room only where that module does not import the sub-room, directly or through other modules of
the parent (image/jpeg/region.py importing image/decode.py, which imports image/jpeg/header.py, was such a loop).
A converter imports no other converter: what several share lives in fastdata/convert/ (the package's registry
and the shared CLI options are not converters).

Sizes (docs/contributing.md, "Conventions"): no module of fastdata/, converters/, benchmarks/ or tests/ has more
than MAX_LINES lines, and no package directory of fastdata/ or converters/ holds more than MAX_MODULES modules, its
`__init__.py` not counted (benchmarks/ and tests/ are folders of scripts and test files, not rooms). A room that
outgrows it moves a group of its modules into a room of its own, named for what they are.

tests/ mirrors the rooms (docs/contributing.md, "Tests"): each folder of tests/ is a room's (tests/image/device for
fastdata/image/device, tests/converters for converters/; tests/builders holds the test data builders), and a test
file in a room's folder whose every import of the package is of one of that room's sub-rooms sits in the
sub-room's folder instead (a test of fastdata/image/device/ only is in tests/image/device/, not tests/image/).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the most lines a module may have: split it by responsibility before that
MAX_LINES = 600
#: the most modules a room (a package directory) may hold, its __init__.py not counted
MAX_MODULES = 15
#: the folders whose modules MAX_LINES holds for, and those whose package directories MAX_MODULES holds for
LINE_LIMITED = ("fastdata", "converters", "benchmarks", "tests")
ROOM_LIMITED = ("fastdata", "converters")

ROOMS: dict[str, str] = {  # module or package -> the room it belongs to
    "fastdata._version": "base", "fastdata.errors": "base", "fastdata.config": "base", "fastdata.workers": "base",
    "fastdata.output_lock": "base", "fastdata.processes": "base", "fastdata.background": "base",
    "fastdata.deprecations": "base",
    "fastdata.formats": "formats",
    "fastdata.order": "order", "fastdata.meter": "meter",
    "fastdata.image": "image", "fastdata.text": "text",
    "fastdata.loader": "loader", "fastdata.convert": "convert",
    "fastdata.converters": "converters",
    "fastdata.tools": "tools",
    "fastdata.cli": "face", "fastdata.__main__": "face", "fastdata": "face",
}
#: modules of the converters room that are not converters: the registry and the CLI options converters share
NOT_CONVERTERS = frozenset({"fastdata.converters", "fastdata.converters.options"})
LAYERS: dict[str, int] = {"base": 0, "formats": 1, "order": 2, "meter": 2, "image": 3, "text": 3, "loader": 4,
                          "convert": 4, "converters": 5, "tools": 6, "face": 7}


def room(module: str) -> str:
    """The room a module belongs to: that of the longest entry of ROOMS that is it or contains it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in ROOMS:
            return ROOMS[prefix]
    raise AssertionError(f"{module} belongs to no room: add it to ROOMS and to the layout in docs/contributing.md")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for fastdata/ and converters/ (as fastdata.converters)."""
    found = {}
    for base, package in (("fastdata", "fastdata"), ("converters", "fastdata.converters")):
        for path in sorted((root / base).rglob("*.py")):
            parts = [p for p in path.relative_to(root / base).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The fastdata modules `path` imports, wherever the import statement is (functions and TYPE_CHECKING
    blocks included). `from package import name` counts as importing `package.name` when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known or candidate.endswith("._jpeg_region") else base)
    return {name for name in found if name == "fastdata" or name.startswith("fastdata.")} - {module}


def packages(root: Path = ROOT) -> set[str]:
    """The package names (directories with an `__init__.py`) of fastdata/ and converters/."""
    return {name for name, path in modules(root).items() if path.name == "__init__.py"}


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = modules(root)
    known = set(files)
    return {name: imports(path, name, known) for name, path in files.items()}


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """One line per import that points up a layer or across to the other room of the same layer."""
    out = []
    for source, targets in sorted(edges.items()):
        here = room(source)
        for target in sorted(targets):
            there = room(target)
            if here == there:
                continue
            if LAYERS[there] > LAYERS[here]:
                out.append(f"{source} ({here}, layer {LAYERS[here]}) imports {target} ({there}, layer "
                           f"{LAYERS[there]}): imports may only point down")
            elif LAYERS[there] == LAYERS[here]:
                out.append(f"{source} ({here}) imports {target} ({there}): rooms of one layer never import "
                           "each other")
    return out


def is_converter(module: str) -> bool:
    """Whether `module` is a converter: one source kind's module of the converters room."""
    return room(module) == "converters" and module not in NOT_CONVERTERS


def converter_imports(edges: dict[str, set[str]]) -> list[str]:
    """One line per import of a converter by another converter (a source kind is one module: what converters share
    belongs in fastdata/convert/)."""
    return [f"{source} imports {target}: a converter imports no other converter; move what they share into "
            "fastdata/convert/"
            for source, targets in sorted(edges.items()) if is_converter(source)
            for target in sorted(targets) if target != source and is_converter(target)]


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: strongly connected groups of more than one module (Tarjan), each as a cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in edges:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [cycle_through(group, edges) for group in groups]


def part_of(package: str, module: str) -> str | None:
    """The part of `package` that `module` lies in: one of its own modules, the sub-package holding it (a room
    inside the room), `package + ".__init__"` for the package itself, or None when it lies outside."""
    if module == package:
        return f"{package}.__init__"
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.')[0]}"


def room_loops(edges: dict[str, set[str]], packages: set[str]) -> list[str]:
    """One line per loop between the parts of a package (its own modules and its sub-packages, each seen as one),
    naming an import that makes each step of it."""
    out = []
    for package in sorted(packages):
        parts: dict[str, set[str]] = {}
        example: dict[tuple[str, str], str] = {}  # (part, part) -> an import between them
        for source, targets in sorted(edges.items()):
            here = part_of(package, source)
            if here is None:
                continue
            parts.setdefault(here, set())
            for target in sorted(targets):
                there = part_of(package, target)
                if there is not None and there != here:
                    parts[here].add(there)
                    example.setdefault((here, there), f"{source} imports {target}")
        for cycle in loops(parts):
            steps = "; ".join(example[step] for step in itertools.pairwise(cycle))
            out.append(f"inside {package}: {' -> '.join(cycle)} ({steps})")
    return out


def cycle_through(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One concrete loop inside a strongly connected group, from its first module back to it."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first, so the loop shown is a shortest one
        nxt = []
        for node in frontier:
            for target in sorted(edges[node] & members):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"no loop found in {group}")


def test_imports_point_down_the_layers() -> None:
    problems = layer_violations(graph())
    assert not problems, "imports that break the layer rule:\n  " + "\n  ".join(problems)


def test_no_import_loops() -> None:
    found = loops(graph())
    assert not found, "import loops:\n  " + "\n  ".join(" -> ".join(cycle) for cycle in found)


def test_rooms_inside_a_room_close_no_loop() -> None:
    found = room_loops(graph(), packages())
    assert not found, ("loops between the rooms inside a room (move what the sub-room needs down, below both, or "
                       "turn the import round):\n  " + "\n  ".join(found))


def test_a_converter_imports_no_other_converter() -> None:
    problems = converter_imports(graph())
    assert not problems, "converters that import another converter:\n  " + "\n  ".join(problems)


def test_every_module_has_a_room() -> None:
    for name in graph():
        room(name)


@pytest.mark.parametrize(("edges", "expected"), [
    ({"fastdata.meter.report": {"fastdata.loader"}, "fastdata.loader": set()}, "imports may only point down"),
    ({"fastdata.formats.lmdb": {"fastdata.image.decode"}}, "imports may only point down"),
    ({"fastdata.image.a": {"fastdata.text.b"}, "fastdata.text.b": set()}, "never import each other"),
])
def test_the_rule_catches_a_wrong_import(edges: dict[str, set[str]], expected: str) -> None:
    assert expected in "\n".join(layer_violations(edges))


@pytest.mark.parametrize(("edges", "expected"), [
    ({"fastdata.converters.pairs": {"fastdata.converters.filelist"}},
     ["fastdata.converters.pairs imports fastdata.converters.filelist: a converter imports no other converter; move "
      "what they share into fastdata/convert/"]),
    ({"fastdata.converters.pairs": {"fastdata.converters.options", "fastdata.converters",
                                    "fastdata.convert.source_files.file_lists"}}, []),
    ({"fastdata.converters": {"fastdata.converters.pairs"}, "fastdata.converters.options": set()}, []),
])
def test_the_converter_rule_catches_a_converter_import(edges: dict[str, set[str]], expected: list[str]) -> None:
    assert converter_imports(edges) == expected


def test_the_loop_finder_names_the_loop() -> None:
    edges = {"fastdata.image.a": {"fastdata.image.b"}, "fastdata.image.b": {"fastdata.image.c"},
             "fastdata.image.c": {"fastdata.image.a"}, "fastdata.image.d": {"fastdata.image.a"}}
    assert loops(edges) == [["fastdata.image.a", "fastdata.image.b", "fastdata.image.c", "fastdata.image.a"]]


def test_the_room_rule_catches_an_import_back_up_into_the_parent_room() -> None:
    """The import this rule was written for (image/jpeg/region.py -> image/decode.py -> image/jpeg/header.py): no
    two modules import each other, yet the jpeg room and decode.py do."""
    edges = {"fastdata.image.decode": {"fastdata.image.jpeg.header"}, "fastdata.image.jpeg.header": set(),
             "fastdata.image.jpeg.region": {"fastdata.image.decode", "fastdata.image.geometry"},
             "fastdata.image.geometry": set(), "fastdata.image.pipeline": {"fastdata.image.jpeg.region"}}
    rooms = {"fastdata", "fastdata.image", "fastdata.image.jpeg"}
    assert loops(edges) == []
    assert room_loops(edges, rooms) == [
        "inside fastdata.image: fastdata.image.decode -> fastdata.image.jpeg -> fastdata.image.decode "
        "(fastdata.image.decode imports fastdata.image.jpeg.header; fastdata.image.jpeg.region imports "
        "fastdata.image.decode)"]
    del edges["fastdata.image.jpeg.region"]  # the sub-room importing a parent module that does not import it: fine
    edges["fastdata.image.jpeg.region"] = {"fastdata.image.geometry", "fastdata.image.opencv"}
    assert room_loops(edges, rooms) == []


def long_modules(root: Path = ROOT, folders: tuple[str, ...] = LINE_LIMITED, limit: int = MAX_LINES) -> list[str]:
    """One line per module of `folders` (under `root`) with more than `limit` lines."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                out.append(f"{path.relative_to(root)}: {lines} lines, over {limit}: split it by responsibility")
    return out


def crowded_rooms(root: Path = ROOT, folders: tuple[str, ...] = ROOM_LIMITED, limit: int = MAX_MODULES) -> list[str]:
    """One line per package directory of `folders` (under `root`) holding more than `limit` modules besides its
    `__init__.py`."""
    out = []
    for folder in folders:
        for directory in sorted({path.parent for path in (root / folder).rglob("__init__.py")}):
            count = sum(1 for path in directory.glob("*.py") if path.name != "__init__.py")
            if count > limit:
                out.append(f"{directory.relative_to(root)}/: {count} modules, over {limit}: move a group of them into "
                           "a room of its own, named for what they are")
    return out


def test_no_module_is_over_the_line_limit() -> None:
    found = long_modules()
    assert not found, "modules over the size limit:\n  " + "\n  ".join(found)


def test_no_room_holds_more_than_the_module_limit() -> None:
    found = crowded_rooms()
    assert not found, "rooms over the size limit:\n  " + "\n  ".join(found)


def test_the_size_guards_name_what_is_over(tmp_path: Path) -> None:
    package = tmp_path / "fastdata"
    (package / "big").mkdir(parents=True)
    for name in ("__init__.py", *(f"m{i}.py" for i in range(MAX_MODULES))):
        (package / name).write_text("x = 1\n" * MAX_LINES)  # at the limits: fine
        (package / "big" / name).write_text("")
    (package / "big" / "one_more.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(tmp_path, ("fastdata", "benchmarks")) == [
        f"fastdata/big/one_more.py: {MAX_LINES + 1} lines, over {MAX_LINES}: split it by responsibility",
        f"benchmarks/long.py: {MAX_LINES + 1} lines, over {MAX_LINES}: split it by responsibility"]
    assert crowded_rooms(tmp_path, ("fastdata",)) == [
        f"fastdata/big/: {MAX_MODULES + 1} modules, over {MAX_MODULES}: move a group of them into a room of its own, "
        "named for what they are"]


def loader_subclasses(sources: dict[str, str], base: str = "ImageLoader") -> list[str]:
    """The classes of `sources` (module name -> source) that derive from `base` by name, other than the
    mixtures' own (`Mixed...`, which differ in their order, not their batches)."""
    found = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("Mixed"):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if base in bases:
                    found.append(f"{module}.{node.name}")
    return found


def test_one_image_loader_serves_every_target_kind() -> None:
    """A target kind shapes its batches in its codec (`TargetCodec.deliver`), not in a loader subclass."""
    sources = {path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."): path.read_text(encoding="utf-8")
               for path in (ROOT / "fastdata").rglob("*.py")}
    assert loader_subclasses(sources) == []
    assert loader_subclasses({"m": "class DetectionLoader(ImageLoader):\n    pass\n"}) == ["m.DetectionLoader"]


#: folders of tests/ that are no room's: the test data builders
TEST_HELPERS = frozenset({"builders"})


def folders_without_a_room(root: Path = ROOT) -> list[str]:
    """One line per folder of tests/ that mirrors no room: tests/a/b is fastdata/a/b's (a package there),
    tests/converters is converters/'s; TEST_HELPERS are not rooms."""
    tests = root / "tests"
    out = []
    for directory in sorted(p for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        parts = directory.relative_to(tests).parts
        if parts[0] in TEST_HELPERS:
            continue
        package = (root / "converters" / Path(*parts[1:]) if parts[0] == "converters"
                   else root / "fastdata" / Path(*parts))
        if not (package / "__init__.py").is_file():
            out.append(f"tests/{'/'.join(parts)}/: no room {package.relative_to(root)}/ to mirror: name the folder "
                       "after the room its tests are of")
    return out


def misplaced_tests(root: Path = ROOT) -> list[str]:
    """One line per test file in a room's folder of tests/ whose every import of the package (its base modules and
    its face left aside) is of one sub-room of that room: it belongs in that sub-room's folder."""
    files = modules(root)
    known = set(files)
    rooms = {name for name, path in files.items() if path.name == "__init__.py"}

    def home(module: str) -> str:  # the innermost package holding `module`
        parts = module.split(".")
        return next(".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in rooms)

    out = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        folder = path.parent.relative_to(root / "tests").parts
        if not folder or folder[0] in TEST_HELPERS or folder[0] == "converters":
            continue
        here = ".".join(("fastdata", *folder))
        homes = {home(module) for module in imports(path, "tests", known) if room(module) not in ("base", "face")}
        if len(homes) == 1 and (sub := homes.pop()).startswith(here + "."):
            target = "tests/" + "/".join(sub.split(".")[1:])
            out.append(f"{path.relative_to(root)}: tests only {sub}: move it into {target}/")
    return out


def test_tests_mirror_the_rooms() -> None:
    found = folders_without_a_room() + misplaced_tests()
    assert not found, "tests outside their room's folder:\n  " + "\n  ".join(found)


def test_the_mirror_rule_names_what_is_out_of_place(tmp_path: Path) -> None:
    for name in ("fastdata/__init__.py", "fastdata/errors.py", "fastdata/image/__init__.py", "fastdata/image/decode.py",
                 "fastdata/image/device/__init__.py", "fastdata/image/device/feeder.py", "converters/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    only_device = "import fastdata\nfrom fastdata.errors import ConfigError\nfrom fastdata.image.device import feeder\n"
    written = {"tests/image/test_flat.py": only_device,  # a test of the sub-room, in its parent's folder
               "tests/image/device/test_placed.py": only_device,
               "tests/image/test_both.py": "import fastdata.image.decode\nimport fastdata.image.device.feeder\n",
               "tests/test_top.py": only_device, "tests/converters/test_c.py": only_device,
               "tests/builders/images.py": "", "tests/imaging/test_x.py": ""}
    for name, source in written.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    assert misplaced_tests(tmp_path) == [
        "tests/image/test_flat.py: tests only fastdata.image.device: move it into tests/image/device/"]
    assert folders_without_a_room(tmp_path) == [
        "tests/imaging/: no room fastdata/imaging/ to mirror: name the folder after the room its tests are of"]
