"""Flags shared by every `fastdata convert <kind>` command, and the option object a command's flags make
(`options_from_flags`): the object its Python function takes, so the command line and Python take the same options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from fastdata.convert.encode import NON_JPEG
from fastdata.convert.kept import DEFAULT_MAX_REJECTED
from fastdata.formats.records import DEFAULT_MAX_PIXELS, JPEG_LAYOUTS
from fastdata.formats.registry import DEFAULT_SHARD_SIZE, FORMATS

Options = TypeVar("Options")


def options_from_flags(cls: type[Options], params: Mapping[str, Any], arguments: tuple[str, ...]) -> Options:
    """The option object (`cls`, e.g. `ImageFolderOptions`) of a `fastdata convert` command's parameters: every
    parameter but its `arguments` (SRC, OUT, ...) is the field of its name, and `--quiet` is `progress=False`. So
    a flag is the Python option of the same name (a flag without a field is a TypeError here, which the tests of
    every command catch)."""
    values = {name: value for name, value in params.items() if name not in arguments}
    if "quiet" in values:
        values["progress"] = not values.pop("quiet")
    return cls(**values)


def _storage_options() -> list[Callable]:
    return [
        click.option("--format", "format", type=click.Choice(FORMATS), default=None,
                     help="Storage format. Default: lmdb when OUT ends in .lmdb."),
        click.option("--shard-size", default=None,
                     help=f"--format wds: target shard size, 256MB, 64KB, 1GiB or a byte count (default "
                          f"{DEFAULT_SHARD_SIZE})."),
    ]


def _run_options() -> list[Callable]:
    return [
        click.option("--overwrite", is_flag=True, help="Replace an existing dataset at OUT."),
        click.option("--strict", is_flag=True, help="Stop at the first unusable source file or record (exit 1)."),
        click.option("--max-rejected", default=DEFAULT_MAX_REJECTED, show_default=True, metavar="N|P%",
                     help="Fail (exit 1, nothing committed) when more source files or records than this are "
                          "rejected: a count, or a share of the input such as 5%. OUT.partial keeps the work: rerun "
                          "with a higher limit (100%: any) to commit it without converting again."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    ]


def _decorate(command: Callable, options: list[Callable]) -> Callable:
    for option in reversed(options):
        command = option(command)
    return command


def output_options(command: Callable) -> Callable:
    """Decorate a converter command with the flags every conversion has (format, shard size, overwrite,
    strict, quiet)."""
    return _decorate(command, _storage_options() + _run_options())


def convert_options(command: Callable | None = None, *, max_size: bool = True) -> Callable:
    """Decorate a converter command with the common conversion flags (`max_size=False`: a source whose targets are
    in source pixels, which re-encoding smaller would break, shows no --max-size / --quality)."""
    if command is None:
        return lambda decorated: convert_options(decorated, max_size=max_size)
    resize = [
        click.option("--max-size", type=int, default=None, metavar="PX",
                     help="Re-encode images whose longer side exceeds PX to JPEG (cuts IO and decode)."),
    ] if max_size else []
    options = [
        click.option("--seed", default=0, show_default=True, type=int,
                     help="Seed of the sample order across WebDataset shards."),
        *resize,
        click.option("--quality", default=90, show_default=True, type=int,
                     help="JPEG quality of the images the conversion encodes ("
                          f"{'--max-size, ' if max_size else ''}--non-jpeg jpeg)."),
        click.option("--non-jpeg", type=click.Choice(NON_JPEG), default="keep", show_default=True,
                     help="Images that are not JPEGs (PNG, WebP, BMP, ...): keep their bytes (lossless), or store "
                          "them as JPEGs at --quality (lossy: the pixels the loader decodes, encoded once), so that "
                          "decode='device' decodes every image on the GPU and its workers decode none."),
        click.option("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, show_default=True,
                     help="Refuse images with more pixels than this, read from the header before decoding."),
        click.option("--jpeg-layout", type=click.Choice(JPEG_LAYOUTS), default="original", show_default=True,
                     help="restart: rewrite each JPEG losslessly with a restart marker after every MCU (same "
                          "pixels, a few % larger), so that the loader decodes only the MCUs a crop covers; "
                          "baseline: rewrite only the progressive JPEGs, losslessly, as baseline ones (the GPU's "
                          "hardware JPEG engines take baseline files only); original: keep the source's bytes."),
        click.option("--workers", type=int, default=None, help="Worker processes. Default: all cores."),
        click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Where images are verified and encoded: local processes, or a Ray cluster "
                          "(pip install 'fastdata[ray]'); the same dataset either way."),
        click.option("--ray-address", default=None, metavar="ADDRESS",
                     help="Ray cluster to use with --engine ray (default: start a local Ray instance)."),
    ]
    return _decorate(command, _storage_options() + options + _run_options())
