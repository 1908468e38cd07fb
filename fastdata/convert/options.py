"""What a conversion takes, as frozen option objects checked when they are made: `ImageConversionOptions` (the image
driver, `fastdata.convert.images.convert_images`) and `DocumentConversionOptions` (the text driver,
`fastdata.convert.text.convert_documents`). Each converter (`fastdata.converters`) extends one of them with the
options of its source kind (`ImageFolderOptions`, `CocoOptions`, ...), and the `fastdata convert` commands build the
same objects from their flags, so the command line and Python take one set of options.

What can be checked without the output, the source or the machine is checked here, in one line naming the option
and the value; what needs them (the format an OUT without `.lmdb` needs, a Ray install, a working JPEG rewriter, a
source whose targets forbid `max_size`) is checked by the driver before it writes anything.

`spelled` turns a call's options into the object: the object itself, or the flat keywords it groups (the old
spelling: still taken, with a `FastdataDeprecationWarning` naming the object to use).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

from fastdata.config import check_bool, check_int, check_optional_int, parse_size
from fastdata.convert.encode import NON_JPEG
from fastdata.convert.engines.ray import ENGINES
from fastdata.convert.kept import DEFAULT_MAX_REJECTED, rejection_limit
from fastdata.convert.layout import check_layout
from fastdata.deprecations import converter_keyword, warn_deprecated
from fastdata.errors import ConfigError
from fastdata.formats.lmdb_text import CHUNK_TOKENS, COMMIT_EVERY_CHUNKS
from fastdata.formats.records import DEFAULT_MAX_PIXELS
from fastdata.formats.registry import FORMATS

DEFAULT_BATCH_SIZE = "1MB"  # text per tokenizer batch
#: a text conversion checkpoints at least this often (source bytes read), whatever the chunk and shard sizes: an
#: interruption loses at most this much tokenizing (plus one batch)
DEFAULT_CHECKPOINT_EVERY = "4MB"


def check_size(name: str, value: str | int) -> int:
    """A size option ("256MB", "64KB", "1GiB" or a byte count) in bytes; ConfigError naming `name` else."""
    try:
        return parse_size(value)
    except ConfigError as error:
        raise ConfigError(f"{name}: {error}") from None


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices`; ConfigError naming `name`, the value and the choices else."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_optional_str(name: str, value: Any) -> str | None:
    """None, or `value` if it is a str; ConfigError naming `name` else."""
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, got {value!r} ({type(value).__name__})")
    return value


def check_column(name: str, value: Any, optional: bool = False) -> str | None:
    """A column (or field, key) name: a non-empty str (`optional`: or None); ConfigError naming `name` else."""
    if (value is None and optional) or (isinstance(value, str) and value):
        return value
    raise ConfigError(f"{name} must be a column name, got {value!r}")


def check_names(name: str, value: Any) -> tuple[str, ...] | None:
    """A list-of-names option (`metadata_columns`) as a tuple: None stays None (not given), a str is split at its
    commas as the command line's `--metadata-columns A,B` is ("": no names), a sequence of str is taken as it is;
    ConfigError naming `name` else."""
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ConfigError(f"{name} must be a list of names (or 'A,B'), got {value!r}")


def check_path(name: str, value: Any) -> str | None:
    """None, or a path option as a str (a `Path` or a str given); ConfigError naming `name` else."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a path, got {value!r} ({type(value).__name__})")
    return os.fspath(value)


def normalise(options: Any, **values: Any) -> None:
    """Set fields of a frozen option object to their checked, normalised values (in its `__post_init__`, so that
    the same options give equal objects whichever way they were spelled: `Path` or str, "A,B" or a list)."""
    for name, value in values.items():
        object.__setattr__(options, name, value)


@dataclass(frozen=True, kw_only=True)
class ImageConversionOptions:
    """How images are converted: what every image converter (`fastdata.convert_imagefolder`, `convert_list`, ...)
    takes, and `fastdata.convert.images.convert_images` itself. Each value is checked when the object is made.

    Attributes:
        format: "lmdb" or "wds" (None: "lmdb" when OUT ends in `.lmdb`).
        shard_size: target WebDataset shard size: "256MB", "64KB", "1GiB" or a byte count (None: 256MB; ignored,
            with a warning, for LMDB).
        seed: the seed of the sample order across WebDataset shards.
        max_size: re-encode images whose longer side exceeds this many pixels to JPEG (None: keep every image's
            original bytes).
        quality: JPEG quality (1..100) of the images the conversion encodes (`max_size`, `non_jpeg="jpeg"`).
        non_jpeg: images that are not JPEGs (PNG, WebP, BMP, ...): "keep" their bytes, or store them as "jpeg"
            (the pixels the loader decodes from them, at `quality`; lossy), so that `decode="device"` decodes every
            image on the GPU.
        max_pixels: refuse images with more pixels than this, read from the header before decoding.
        jpeg_layout: "original" (store each JPEG's bytes), "restart" (rewrite each JPEG losslessly with a restart
            marker after every MCU, so that a loader decodes a crop in proportion to its area) or "baseline"
            (rewrite the progressive JPEGs losslessly as baseline ones, which the GPU's hardware JPEG engines take).
        workers: processes verifying and encoding images (None: all cores).
        engine: "local" (processes on this machine) or "ray" (a Ray cluster: `pip install 'fastdata[ray]'`).
        ray_address: the Ray cluster for `engine="ray"` (None: start a local Ray instance).
        overwrite: replace an existing dataset at OUT.
        strict: stop at the first unusable source file or record, writing nothing.
        max_rejected: the rejected images a conversion may commit with: a count (0: none) or a share of the input
            ("5%"; "100%": any); more raise TooManyRejectedError, nothing committed, the work kept in `OUT.partial`
            for a rerun with a higher limit.
        progress: show a progress bar (the command line's `--quiet` turns it off).
        commit_every: LMDB: images between checkpoints at most (where an interrupted conversion resumes); a
            checkpoint also comes after every 16 MiB of records.
    """

    format: str | None = None
    shard_size: str | int | None = None
    seed: int = 0
    max_size: int | None = None
    quality: int = 90
    non_jpeg: str = "keep"
    max_pixels: int = DEFAULT_MAX_PIXELS
    jpeg_layout: str = "original"
    workers: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    overwrite: bool = False
    strict: bool = False
    max_rejected: str | int = DEFAULT_MAX_REJECTED
    progress: bool = True
    commit_every: int = 2048

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value)."""
        _check_storage(self.format, self.shard_size, self.overwrite, self.strict, self.max_rejected, self.progress)
        check_int("seed", self.seed)
        check_int("commit_every", self.commit_every, minimum=1)
        max_size = check_optional_int("max_size", self.max_size)
        if max_size is not None and max_size < 1:
            raise ConfigError(f"--max-size must be a positive number of pixels, got {self.max_size}")
        if check_int("max_pixels", self.max_pixels) < 1:
            raise ConfigError(f"--max-pixels must be positive, got {self.max_pixels}")
        if not 1 <= check_int("quality", self.quality) <= 100:
            raise ConfigError(f"--quality must be within 1..100, got {self.quality}")
        check_choice("non_jpeg", self.non_jpeg, NON_JPEG)
        check_layout(self.jpeg_layout)
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if check_optional_str("ray_address", self.ray_address) is not None and self.engine != "ray":
            raise ConfigError("--ray-address applies to --engine ray")
        workers = check_optional_int("workers", self.workers)
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")


@dataclass(frozen=True, kw_only=True)
class DocumentConversionOptions:
    """How documents are tokenized and stored: what the text converter (`fastdata.convert_text`) takes, and
    `fastdata.convert.text.convert_documents` itself. Each value is checked when the object is made.

    Attributes:
        format: "lmdb" or "wds" (None: "lmdb" when OUT ends in `.lmdb`).
        shard_size: target WebDataset shard size: "256MB", "64KB", "1GiB" or a byte count (None: 256MB; ignored,
            with a warning, for LMDB).
        eos_token: the end-of-text token appended to every document when packing (None: found among the
            tokenizer's special tokens: `<|endoftext|>`, `</s>`, `[SEP]`, ...).
        batch_size: text per tokenizer batch, bounding memory: "1MB", "512KB", ... or a byte count.
        checkpoint_every: source read between checkpoints ("4MB", ... or a byte count): an interrupted conversion
            resumes from its last one. It does not change the dataset, so a rerun may pass another value.
        workers: tokenize on this many worker processes, one thread each (None: one per usable core; 0: in this
            process, on the tokenizer's own thread pool). The ids, and so the dataset, are the same either way.
        split_documents: cut documents longer than a worker task (64K characters) into pieces tokenized in
            parallel, where the tokenizer provably gives the ids of the whole (False: always whole). The ids are
            the same either way.
        overwrite: replace an existing dataset at OUT.
        strict: stop at the first unusable record, writing nothing.
        max_rejected: the rejected records a conversion may commit with: a count (0: none) or a share of the input
            ("5%"; "100%": any); more raise TooManyRejectedError, nothing committed, the work kept in `OUT.partial`.
        progress: show a progress bar (the command line's `--quiet` turns it off).
        chunk_tokens: LMDB: token ids per stored chunk.
        commit_every_chunks: LMDB: chunks between commits.
    """

    format: str | None = None
    shard_size: str | int | None = None
    eos_token: str | None = None
    batch_size: str | int = DEFAULT_BATCH_SIZE
    checkpoint_every: str | int = DEFAULT_CHECKPOINT_EVERY
    workers: int | None = None
    split_documents: bool = True
    overwrite: bool = False
    strict: bool = False
    max_rejected: str | int = DEFAULT_MAX_REJECTED
    progress: bool = True
    chunk_tokens: int = CHUNK_TOKENS
    commit_every_chunks: int = COMMIT_EVERY_CHUNKS

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value)."""
        _check_storage(self.format, self.shard_size, self.overwrite, self.strict, self.max_rejected, self.progress)
        if check_optional_str("eos_token", self.eos_token) is not None and not self.eos_token:
            raise ConfigError("eos_token must be a token of the tokenizer, got ''")
        check_size("batch_size", self.batch_size)
        check_size("checkpoint_every", self.checkpoint_every)
        workers = check_optional_int("workers", self.workers)
        if workers is not None and workers < 0:
            raise ConfigError(f"--workers must be 0 (this process) or more, got {self.workers}")
        check_bool("split_documents", self.split_documents)
        check_int("chunk_tokens", self.chunk_tokens, minimum=1)
        check_int("commit_every_chunks", self.commit_every_chunks, minimum=1)


def _check_storage(format: Any, shard_size: Any, overwrite: Any, strict: Any, max_rejected: Any,
                   progress: Any) -> None:
    """The options every conversion has, checked."""
    if format is not None and format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    if shard_size is not None:
        check_size("shard_size", shard_size)
    check_bool("overwrite", overwrite)
    check_bool("strict", strict)
    rejection_limit(max_rejected)
    check_bool("progress", progress)


Options = TypeVar("Options")


def option_names(cls: type) -> tuple[str, ...]:
    """The options an option class (a dataclass) takes, in order."""
    return tuple(f.name for f in fields(cast(Any, cls)))


def spelled(cls: type[Options], options: Options | None, keywords: Mapping[str, Any], function: str) -> Options:
    """The options of a call of `function` as one `cls` object: `options` itself, `cls()` when neither is given,
    or the flat keywords (the old spelling: a `FastdataDeprecationWarning` naming the object to use). An unknown
    keyword, both spellings at once, or an object of another class is a one-line ConfigError."""
    if options is not None and not isinstance(options, cls):
        raise ConfigError(f"{function}: options must be a {cls.__name__}, got {type(options).__name__}")
    names = option_names(cls)
    for name in keywords:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; its options: {', '.join(names)}"
            raise ConfigError(f"{function}: unknown option {name!r}{hint}")
    if not keywords:
        return cls() if options is None else options
    if options is not None:
        raise ConfigError(f"{function}: options given twice, as a {cls.__name__} and as keywords "
                          f"({', '.join(keywords)}); put them all in the {cls.__name__}")
    settings = cls(**keywords)  # a value that cannot work is said first, whatever the warning filter
    warn_deprecated(converter_keyword(function))
    return settings
