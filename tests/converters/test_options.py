"""Every converter takes one option object, checked when it is made: an unknown option or a bad value is a one-line
error naming it; `fastdata convert <kind>` builds the same object from its flags as Python does from the same
options; the old flat keywords still work, with a deprecation warning at the user's call."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import click
import pytest
from builders.images import build_solid_tree
from fastdata.converters import REGISTRY, load
from fastdata.converters.options import options_from_flags

import fastdata
from fastdata.convert.options import DocumentConversionOptions, ImageConversionOptions, spelled
from fastdata.deprecations import FastdataDeprecationWarning
from fastdata.errors import ConfigError

#: kind -> its option class, by its public name
CLASSES = {"coco": "CocoOptions", "hf": "HfOptions", "imagefolder": "ImageFolderOptions", "list": "FileListOptions",
           "pairs": "PairsOptions", "text": "TextConversionOptions", "webdataset": "WebDatasetOptions"}
#: kind -> the arguments its command needs before any flag
POSITIONAL = {"coco": ["ann.json", "images", "out.lmdb"], "text": ["a.jsonl", "out.lmdb", "--tokenizer", "t.json"]}

#: kind -> (flags, the same options in Python): every flag the command has beyond the shared ones, and some of those
SAME_OPTIONS = {
    "imagefolder": (["--format", "wds", "--shard-size", "64KB", "--seed", "3", "--max-size", "256", "--quality", "80",
                     "--non-jpeg", "jpeg", "--max-pixels", "1000000", "--jpeg-layout", "restart", "--workers", "2",
                     "--overwrite", "--strict", "--max-rejected", "5%", "--quiet"],
                    {"format": "wds", "shard_size": "64KB", "seed": 3, "max_size": 256, "quality": 80,
                     "non_jpeg": "jpeg", "max_pixels": 1_000_000, "jpeg_layout": "restart", "workers": 2,
                     "overwrite": True, "strict": True, "max_rejected": "5%", "progress": False}),
    "list": (["--root", "imgs", "--image-column", "file", "--label-column", "cls", "--num-classes", "7",
              "--allow-outside-root", "--metadata-columns", "a, b", "--mask-column", "mask", "--ignore-index", "0",
              "--engine", "ray", "--ray-address", "auto"],
             {"root": Path("imgs"), "image_column": "file", "label_column": "cls", "num_classes": 7,
              "allow_outside_root": True, "metadata_columns": ["a", "b"], "mask_column": "mask", "ignore_index": 0,
              "engine": "ray", "ray_address": "auto"}),
    "pairs": (["--caption-column", "text", "--image-column", "file", "--root", "imgs", "--tokenizer", "t.json",
               "--allow-outside-root", "--metadata-columns", "", "--image-ext", "png,jpg"],
              {"caption_column": "text", "image_column": "file", "root": "imgs", "tokenizer": Path("t.json"),
               "allow_outside_root": True, "metadata_columns": (), "image_ext": ["png", "jpg"]}),
    "coco": (["--skip-empty", "--quality", "70"], {"skip_empty": True, "quality": 70}),
    "hf": (["--split", "test", "--image-column", "img", "--label-column", "fine", "--config", "cifar100",
            "--cache-dir", "cache", "--no-metadata"],
           {"split": "test", "image_column": "img", "label_column": "fine", "config": "cifar100",
            "cache_dir": Path("cache"), "metadata": False}),
    "webdataset": (["--image-ext", "jpg", "--label-key", "label", "--num-classes", "10"],
                   {"image_ext": ("jpg",), "label_key": "label", "num_classes": 10}),
    "text": (["--field", "content", "--txt-mode", "line", "--eos-token", "</s>", "--batch-size", "2MB",
              "--checkpoint-every", "8MB", "--workers", "0", "--format", "wds", "--shard-size", "1MB", "--overwrite",
              "--strict", "--max-rejected", "0", "-q"],
             {"field": "content", "txt_mode": "line", "eos_token": "</s>", "batch_size": "2MB",
              "checkpoint_every": "8MB", "workers": 0, "format": "wds", "shard_size": "1MB", "overwrite": True,
              "strict": True, "max_rejected": "0", "progress": False}),
}

#: kind -> (an option, a value it refuses, what the one-line error says)
BAD_VALUES = {
    "imagefolder": ("workers", 0, "--workers must be at least 1, got 0"),
    "list": ("num_classes", 0, "--num-classes must be at least 1, got 0"),
    "pairs": ("image_ext", "jpg,docx", "--image-ext: docx: image extensions are"),
    "coco": ("max_size", 512, "--max-size: COCO boxes and masks are in source pixels"),
    "hf": ("label_column", "", "label_column must be a column name, got ''"),
    "webdataset": ("label_key", "json", "--label-key json: a label cannot be an image or the .json member"),
    "text": ("txt_mode", "paragraph", "--txt-mode must be one of file, line, got 'paragraph'"),
}


def options_class(kind: str) -> type:
    return getattr(fastdata, CLASSES[kind])


def from_command_line(kind: str, flags: list[str]) -> object:
    """The option object `fastdata convert <kind>` builds from `flags` (the command's own parse and build)."""
    module = load(kind)
    command = module.cli_command()
    args = POSITIONAL.get(kind, ["src", "out.lmdb"]) + flags
    ctx = command.make_context(kind, args)
    return options_from_flags(module.OPTIONS, ctx.params, module.ARGUMENTS)


def test_every_converter_is_covered() -> None:
    assert set(CLASSES) == set(REGISTRY) == set(SAME_OPTIONS) == set(BAD_VALUES)
    for kind in REGISTRY:
        assert load(kind).OPTIONS is options_class(kind) is getattr(fastdata, CLASSES[kind])


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_the_command_line_and_python_make_the_same_object(kind: str) -> None:
    flags, python = SAME_OPTIONS[kind]
    cls = options_class(kind)
    assert from_command_line(kind, flags) == cls(**python)
    assert from_command_line(kind, []) == cls()  # the same defaults too


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_flag_is_an_option_with_the_same_default(kind: str) -> None:
    """A flag without a field (or named otherwise) would be dropped or refused; a default set twice could differ."""
    module = load(kind)
    command = module.cli_command()
    given = command.make_context(kind, POSITIONAL.get(kind, ["src", "out.lmdb"])).params  # no flag: the defaults
    fields = {field.name: field for field in dataclasses.fields(module.OPTIONS)}
    for param in command.params:
        if param.name in module.ARGUMENTS or param.name in ("quiet", "help"):
            continue
        assert param.name in fields, f"fastdata convert {kind}: {param.opts[0]} sets no option of {CLASSES[kind]}"
        assert given[param.name] == fields[param.name].default, (kind, param.name)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_an_unknown_option_is_refused_in_one_line_naming_it(kind: str, tmp_path: Path) -> None:
    cls = options_class(kind)
    with pytest.raises(TypeError, match="unexpected keyword argument 'wrokers'"):
        cls(wrokers=2)
    function = getattr(fastdata, next(name for name in fastdata.__all__ if name.startswith("convert_")
                                      and getattr(fastdata, name).__module__ == load(kind).__name__))
    args = [tmp_path / "src", tmp_path / "out.lmdb"] if kind != "coco" else [tmp_path / "a.json", tmp_path,
                                                                              tmp_path / "out.lmdb"]
    extra = {"tokenizer": tmp_path / "t.json"} if kind == "text" else {}
    with pytest.raises(ConfigError) as info:
        function(*args, wrokers=2, **extra)
    assert str(info.value) == f"fastdata.{function.__name__}: unknown option 'wrokers' (did you mean 'workers'?)"
    with pytest.raises(click.NoSuchOption, match=r"No such option.*--wrokers"):
        from_command_line(kind, ["--wrokers", "2"])
    assert not (tmp_path / "out.lmdb").exists()


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_a_bad_value_is_refused_in_one_line_naming_it(kind: str) -> None:
    option, value, message = BAD_VALUES[kind]
    with pytest.raises(ConfigError) as info:
        options_class(kind)(**{option: value})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("cls", "option", "value", "message"), [
    (ImageConversionOptions, "quality", 101, "--quality must be within 1..100, got 101"),
    (ImageConversionOptions, "seed", "1", "seed must be an int, got '1' (str)"),
    (ImageConversionOptions, "format", "tar", "unknown format 'tar'; choose one of lmdb, wds"),
    (ImageConversionOptions, "shard_size", "big", "shard_size: cannot read 'big' as a size"),
    (ImageConversionOptions, "max_rejected", "5 percent", "--max-rejected must be a count"),
    (ImageConversionOptions, "jpeg_layout", "progressive", "--jpeg-layout must be one of original, restart, baseline"),
    (ImageConversionOptions, "progress", "no", "progress must be True or False, got 'no' (str)"),
    (ImageConversionOptions, "commit_every", 0, "commit_every must be at least 1, got 0"),
    (DocumentConversionOptions, "workers", -1, "--workers must be 0 (this process) or more, got -1"),
    (DocumentConversionOptions, "batch_size", "0MB", "batch_size: a size must be positive, got '0MB'"),
    (DocumentConversionOptions, "eos_token", 2, "eos_token must be a str, got 2 (int)"),
    (DocumentConversionOptions, "split_documents", None, "split_documents must be True or False, got None"),
])
def test_the_shared_options_are_checked_when_made(cls: type, option: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        cls(**{option: value})
    assert str(info.value).startswith(message)


def test_paths_and_lists_are_normalised_so_equal_options_make_equal_objects() -> None:
    assert fastdata.FileListOptions(root=Path("a"), metadata_columns="x,y") == fastdata.FileListOptions(
        root="a", metadata_columns=("x", "y"))
    assert fastdata.PairsOptions(image_ext=".PNG, jpg").image_ext == ("png", "jpg")
    assert fastdata.FileListOptions(metadata_columns="").metadata_columns == ()
    with pytest.raises(ConfigError, match=r"^metadata_columns must be a list of names \(or 'A,B'\), got \[1\]$"):
        fastdata.FileListOptions(metadata_columns=[1])


def test_the_object_is_frozen() -> None:
    options = fastdata.ImageFolderOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 3  # type: ignore[misc]


def test_spelled_takes_one_spelling() -> None:
    given = ImageConversionOptions(workers=2)
    assert spelled(ImageConversionOptions, given, {}, "f") is given
    assert spelled(ImageConversionOptions, None, {}, "f") == ImageConversionOptions()
    with pytest.raises(ConfigError, match=r"^f: options given twice, as a ImageConversionOptions and as keywords "
                                          r"\(seed\); put them all in the ImageConversionOptions$"):
        spelled(ImageConversionOptions, given, {"seed": 1}, "f")
    with pytest.raises(ConfigError, match=r"^f: options must be a ImageConversionOptions, got "
                                          r"DocumentConversionOptions$"):
        spelled(ImageConversionOptions, DocumentConversionOptions(), {}, "f")
    with pytest.raises(ConfigError, match=r"^f: unknown option 'colour'; its options: format, shard_size, seed"):
        spelled(ImageConversionOptions, None, {"colour": 1}, "f")


def test_the_old_keywords_still_convert_with_a_warning_at_the_call(tmp_path: Path) -> None:
    src = build_solid_tree(tmp_path / "src", count=4).root
    with pytest.warns(FastdataDeprecationWarning) as record:
        old = fastdata.convert_imagefolder(src, tmp_path / "old.lmdb", workers=1, progress=False)
    assert len(record) == 1 and record[0].filename == __file__
    assert "fastdata.convert_imagefolder(..., OPTION=...) is deprecated: use fastdata.convert_imagefolder(..., " \
           "fastdata.options.ImageFolderOptions(OPTION=...))" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastdataDeprecationWarning)
        new = fastdata.convert_imagefolder(src, tmp_path / "new.lmdb", fastdata.ImageFolderOptions(workers=1,
                                                                                                   progress=False))
    assert (old.images, old.classes, [f.sha256 for f in old.files]) == (new.images, new.classes,
                                                                        [f.sha256 for f in new.files])
