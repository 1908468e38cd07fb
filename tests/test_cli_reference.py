"""The command-line reference (docs/reference/cli.md) is generated from the click commands themselves
(docs/hooks/cli_reference.py) and committed as it is generated: it lists every command and sub-command with its
options, their defaults and help, and this fails when the page and the commands differ."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click
import pytest

from fastdata.cli import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commands() -> list[tuple[str, click.Command, click.Context]]:
    """(path, command, context) of every command, sub-commands included."""
    found = []

    def walk(command: click.Command, ctx: click.Context) -> None:
        found.append((ctx.command_path, command, ctx))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))

    walk(cli, click.Context(cli, info_name="fastdata", **cli.context_settings))
    return found


def test_the_committed_page_is_what_the_commands_give(generator):
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert page == generator.render(), "docs/reference/cli.md differs from the commands: run " \
                                       "`python docs/hooks/cli_reference.py` and commit it"
    assert generator.main(["--check"]) == 0


def test_every_command_option_and_default_is_on_the_page(generator):
    page = generator.render()
    paths = commands()
    assert {"fastdata convert imagefolder", "fastdata convert text", "fastdata verify", "fastdata bench"} <= {
        path for path, _, _ in paths}
    for path, command, ctx in paths:
        assert f"## `{path}`" in page
        section = page.split(f"## `{path}`\n", 1)[1].split("\n## ", 1)[0]
        for param in command.get_params(ctx):
            if isinstance(param, click.Option):
                assert f"`{', '.join([*param.opts, *param.secondary_opts])}" in section, (path, param.opts)
    imagefolder = page.split("## `fastdata convert imagefolder`\n", 1)[1].split("\n## ", 1)[0]
    assert "- `--max-rejected N|P%` (default `50%`): Fail (exit 1, nothing committed)" in imagefolder
    assert "- `--workers INTEGER` (no default): Worker processes. Default: all cores." in imagefolder
    assert "- `--strict` (a flag, off by default)" in imagefolder
    assert "- `SRC`: required" in imagefolder


def test_a_changed_command_no_longer_matches_the_page(generator, monkeypatch):
    """What the drift check guards against: an option added to a command (or a default changed) makes the
    generated page differ from the committed one."""
    info = cli.commands["info"]
    monkeypatch.setattr(info, "params", [*info.params, click.Option(["--new-flag"], is_flag=True, help="New.")])
    assert generator.render() != (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert generator.main(["--check"]) == 1


# ------------------------------------------------------------------------------------------------ conversion options


def option_classes() -> list[type]:
    """Every converter's option class, and the drivers' classes they extend."""
    from fastdata.converters import REGISTRY, load

    from fastdata.convert.options import DocumentConversionOptions, ImageConversionOptions

    return [ImageConversionOptions, DocumentConversionOptions, *(load(kind).OPTIONS for kind in sorted(REGISTRY))]


def test_the_committed_options_page_is_what_the_options_give(generator):
    page = (ROOT / "docs" / "reference" / "conversion-options.md").read_text(encoding="utf-8")
    assert page == generator.render_options(), "docs/reference/conversion-options.md differs from the option " \
                                               "objects: run `python docs/hooks/cli_reference.py` and commit it"


@pytest.mark.parametrize("cls", option_classes(), ids=lambda cls: cls.__name__)
def test_every_option_is_documented_and_every_documented_option_is_one(generator, cls):
    """The docstrings' `Attributes:` lists (what the API reference and the options page show) name exactly the
    fields, each with a description."""
    import dataclasses

    documented = generator.option_docs(cls)
    fields = [field.name for field in dataclasses.fields(cls)]
    assert sorted(documented) == sorted(fields), f"{cls.__name__}: documented {sorted(set(documented) - set(fields))}" \
                                                 f" are not options; options {sorted(set(fields) - set(documented))}" \
                                                 " are not documented"
    assert all(documented.values())


def test_every_option_and_flag_is_on_the_options_page(generator):
    import dataclasses

    from fastdata.converters import REGISTRY, load

    page = generator.render_options()
    for kind in sorted(REGISTRY):
        cls = load(kind).OPTIONS
        section = page.split(f"## `{cls.__name__}`\n", 1)[1].split("\n## ", 1)[0]
        assert f"`fastdata convert {kind}`" in section
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in section, (kind, field.name)
    imagefolder = page.split("## `ImageFolderOptions`\n", 1)[1].split("\n## ", 1)[0]
    assert "| `workers` | `None` | `--workers` | processes verifying and encoding images (None: all cores). |" \
           in imagefolder
    assert "| `progress` | `True` | `--quiet` (False) |" in imagefolder
    assert "| `commit_every` | `2048` | Python only |" in imagefolder
    assert "| `metadata` | `True` | `--metadata/--no-metadata` |" in page


def test_a_changed_option_no_longer_matches_the_options_page(generator, monkeypatch):
    """What the drift check guards against: an option's documentation changed (or an option added) makes the
    generated page differ from the committed one."""
    from fastdata.convert.options import ImageConversionOptions

    monkeypatch.setattr(ImageConversionOptions, "__doc__", ImageConversionOptions.__doc__.replace(
        "processes verifying and encoding images", "threads verifying images"))
    assert generator.render_options() != (ROOT / "docs" / "reference" / "conversion-options.md").read_text(
        encoding="utf-8")
    assert generator.main(["--check"]) == 1
