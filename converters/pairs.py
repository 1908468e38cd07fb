"""Image-text pairs -> the image conversion driver (`fastdata.convert.images`): `fastdata convert pairs SRC OUT`.

SRC is either
- a file list (a `.csv`, `.tsv`, `.jsonl` or `.parquet` file, or a folder or glob of them, read as
  `fastdata convert list` reads lists): one row per image, its path in `--image-column` (default `path`, relative
  to `--root`, default the list's folder) and its caption in `--caption-column` (default `caption`); every other
  column (or those of `--metadata-columns`) kept as per-sample metadata. In CSV/TSV every cell is text, read as it
  is (an empty cell is an empty caption; "NA" or "null" are captions too, not missing values);
- or WebDataset shards as img2dataset writes them (a folder of uncompressed `.tar` files, one `.tar`, or a brace
  pattern; indexed as `fastdata convert webdataset` indexes shards): a sample's image is its first member with an
  image extension (`--image-ext`), its caption the `{key}.txt` member (UTF-8), else the `--caption-column` field
  of `{key}.json`; the other `.json` fields are kept as metadata.

Each caption is stored with its image as UTF-8 text. With `--tokenizer tokenizer.json` (a `tokenizers` file, copied
into the dataset) it is also stored as its token ids, `tokenizer.encode(caption).ids`: whole (no truncation, no
padding), with the special tokens the tokenizer's post-processor adds (CLIP's `<|startoftext|>` ... `<|endoftext|>`,
as `CLIPTokenizer(caption)` gives them), as uint16 when the vocabulary fits, else uint32. The loader pads or
truncates them to its `max_length` (truncation keeps the post-processor's closing tokens, as a `tokenizers`
Tokenizer with truncation does), padding with the tokenizer's pad token, else its end-of-text token, else id 0.

An empty caption is kept (it is text: an image may have none; it tokenizes to the special tokens alone); the
conversion warns once with their count and the first, and the manifest's `pairs.empty_captions` counts them.
Refused with one line naming the list file and row (lists) or the shard and sample key (shards), before anything is
written: a caption that is not text (null, a number, a list, ...), a missing caption column or field (naming the
columns or fields there are), a `.txt` caption that is not UTF-8, and everything `convert list` and `convert
webdataset` refuse. The samples have no classes (one class, "unlabelled"); the manifest says `target_kind: "pairs"`
(format version 2).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from fastdata.config import available_cores, check_bool
from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.options import ImageConversionOptions, check_column, check_names, check_path, normalise, spelled
from fastdata.convert.source_files import file_lists
from fastdata.convert.source_files.tar_samples import (
    TarMemberReader,
    choose_images,
    image_exts,
    index_shards,
    parsed_json,
    refuse_duplicates,
    sample_metadata,
    shard_files,
    where,
)
from fastdata.convert.sources import NO_LABEL_CLASS, ImageSource
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.manifest import Manifest
from fastdata.formats.tokens import TOKENIZER_FILE, token_dtype
from fastdata.text.tokenizer import load_tokenizer, resolve_eos, resolve_pad, vocab_size

_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


@dataclass(frozen=True)
class PairOptions:
    """How a pair source is read (recorded in the manifest, so that `verify --source` reads it again the same
    way)."""

    root: str | None = None
    image_column: str = "path"
    caption_column: str = "caption"
    allow_outside_root: bool = False
    metadata_columns: tuple[str, ...] | None = None  # None: every other column
    image_ext: tuple[str, ...] | None = None  # shards: image member extensions, in order of preference


def is_shard_source(src: str | os.PathLike[str]) -> bool:
    """Whether SRC names WebDataset shards (a `.tar`, a folder of them, a brace pattern) rather than file lists."""
    text = os.fspath(src)
    if "{" in text:
        return True
    path = Path(text)
    if path.is_dir():
        entries = [p.name.lower() for p in path.iterdir() if p.is_file()]
        shards = any(name.endswith(_SHARD_SUFFIXES) for name in entries)
        lists = any(name.endswith(file_lists.SUFFIXES) for name in entries)
        if shards and lists:
            raise SourceError(f"{path}: holds both .tar shards and list files; name the one source to convert (a "
                              "list file, or a brace pattern of the shards)")
        return shards
    return path.name.lower().endswith(_SHARD_SUFFIXES)


# ------------------------------------------------------------------------------------------------ captions


def _caption_problem(value: Any) -> str | None:
    """Why `value` is not a caption, or None when it is one (text)."""
    if isinstance(value, str):
        return None
    if value is None:
        return "no caption (null)"
    return f"{file_lists.type_name(value)} ({value!r}), not a caption (text)"


def _warn_empty(captions: Sequence[str], place: Callable[[int], str], note: bool = True) -> int:
    """Count the empty captions (kept), warning once with the first's place (with `note`)."""
    empty = [i for i, caption in enumerate(captions) if not caption]
    if empty and note:
        warnings.warn(f"{len(empty)} empty caption(s) kept (the first: {place(empty[0])}); each is stored as empty "
                      "text (token ids: the tokenizer's special tokens alone)", stacklevel=3)
    return len(empty)


class TokenColumn(Sequence):
    """Every caption's token ids in one flat array with offsets: a million captions stay two arrays."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        return self.ids[self.offsets[index]:self.offsets[index + 1]]


def closing_tokens(tokenizer: Any) -> int:
    """How many special tokens the tokenizer's post-processor appends after a text (CLIP's `<|endoftext|>`: 1)."""
    mask = tokenizer.encode("a").special_tokens_mask
    count = 0
    while count < len(mask) and mask[len(mask) - 1 - count]:
        count += 1
    return count


def tokenize(captions: Sequence[str], tokenizer_path: str | os.PathLike[str]) -> tuple[TokenColumn, dict, bytes]:
    """(each caption's token ids, the manifest's facts about them, the tokenizer file's bytes)."""
    path = Path(tokenizer_path)
    tokenizer = load_tokenizer(path)
    data = path.read_bytes()
    vocab = vocab_size(tokenizer)
    dtype = token_dtype(vocab)
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    lengths = np.zeros(len(captions) + 1, dtype=np.int64)
    parts = []
    step = 65536
    for start in range(0, len(captions), step):
        for i, encoding in enumerate(encode_batch(list(captions[start:start + step])), start=start):
            parts.append(np.asarray(encoding.ids, dtype=dtype))
            lengths[i + 1] = len(encoding.ids)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    pad = resolve_pad(tokenizer) or resolve_eos(tokenizer, None, str(path))
    facts = {"tokens": True, "dtype": np.dtype(dtype).name, "tokenizer": TOKENIZER_FILE,
             "tokenizer_sha256": hashlib.sha256(data).hexdigest(), "vocab_size": vocab,
             "special_tokens": "the tokenizer's post-processor", "closing_tokens": closing_tokens(tokenizer),
             "pad_token": pad[0] if pad else None, "pad_token_id": pad[1] if pad else 0,
             "max_caption_tokens": int(lengths.max()) if len(captions) else 0}
    return TokenColumn(ids, np.cumsum(lengths)), facts, data


# ------------------------------------------------------------------------------------------------ file lists


@dataclass
class _Found:
    """What listing a pair source found: one key and caption per sample, and where each is in the source."""

    root: Path
    keys: list[str]
    captions: list[str]
    metadata: Any  # per-sample dicts, or None
    origin: Callable[[int], dict[str, Any]]  # sample index -> its manifest place ({"list", "row"} / {"shard"})
    place: Callable[[int], str]  # sample index -> where it is, for messages
    details: dict[str, Any]
    reader: TarMemberReader | None = None  # None: files under root
    ignored: list[str] = field(default_factory=list)


def _csv_texts(path: Path, column: str) -> list[str]:
    """A CSV/TSV column read as text, every cell as it is (pyarrow would read "", "NA", "null", ... as nulls)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    table = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter),
                          convert_options=pcsv.ConvertOptions(include_columns=[column],
                                                              column_types={column: pa.string()},
                                                              strings_can_be_null=False,
                                                              quoted_strings_can_be_null=False))
    return table.column(column).to_pylist()


def _scan_list(spec: str | os.PathLike[str], options: PairOptions) -> _Found:
    """The pairs the lists SPEC names."""
    files = file_lists.list_files(spec)
    root = Path(options.root) if options.root is not None else file_lists.default_root(spec)
    if not root.is_dir():
        raise SourceError(f"{root}: the root of the list's image paths is not a folder (--root)")
    as_list = file_lists.ListOptions(None, options.image_column, options.caption_column, None,
                                     options.allow_outside_root, options.metadata_columns)
    paths: list[Any] = []
    captions: list[Any] = []
    columns: dict[str, list[Any]] = {}
    starts: list[int] = []
    for path in files:
        table = file_lists.read_table(path, (options.image_column, options.caption_column))
        names = list(table.column_names)
        for role, name in (("--image-column", options.image_column), ("--caption-column", options.caption_column)):
            if name not in names:
                raise SourceError(f"{path}: no column {name!r} (its columns: {', '.join(names) or 'none'}); name "
                                  f"the right one with {role}")
        starts.append(len(paths))
        for name in file_lists.metadata_names(path, names, as_list):
            values = file_lists.metadata_values(path, name, table.column(name).to_pylist())
            columns.setdefault(name, [None] * len(paths)).extend(values)
        paths.extend(table.column(options.image_column).to_pylist())
        if path.suffix.lower() in (".csv", ".tsv"):
            captions.extend(_csv_texts(path, options.caption_column))
        else:
            captions.extend(table.column(options.caption_column).to_pylist())
        for values in columns.values():
            values.extend([None] * (len(paths) - len(values)))  # a column this file lacks
    rows = file_lists.Rows(files, starts)
    if not paths:
        raise SourceError(f"{spec}: the list has no rows (every image to convert is one row)")
    for index, value in enumerate(captions):
        problem = _caption_problem(value)
        if problem is not None:
            raise SourceError(f"{rows.name(index)}: column {options.caption_column!r} holds {problem}")
    keys = file_lists.path_keys(paths, rows, root, as_list)
    metadata = file_lists.ColumnMetadata(columns, list(range(len(paths)))) if columns else None
    details = {"lists": [str(p) for p in files], "root": str(root.absolute())}
    return _Found(root, keys, captions, metadata, rows.origin, rows.name, details)


# ------------------------------------------------------------------------------------------------ shards


def _scan_shards(src: str | os.PathLike[str], options: PairOptions, workers: int | None) -> _Found:
    """The pairs of the shards SRC names."""
    exts = image_exts(options.image_ext)
    root, paths, described = shard_files(src)
    names = [p.resolve().relative_to(root).as_posix() for p in paths]
    samples, ignored = index_shards(paths, names, frozenset({"json", "txt"}),
                                    available_cores() if workers is None else workers)
    if not samples:
        raise SourceError(f"{described}: no samples in its {len(paths)} shard(s)")
    refuse_duplicates(samples, names)
    chosen = choose_images(samples, exts, names)
    field_name = options.caption_column
    captions: list[str] = []
    rows: list[dict[str, Any]] = []
    for sample in samples:
        meta = parsed_json(sample, names)
        if "txt" in sample.texts:
            try:
                captions.append(sample.texts["txt"].decode("utf-8"))
            except UnicodeDecodeError:
                raise SourceError(f"{where(sample, names)}: its .txt caption is not UTF-8 text") from None
        elif meta is not None and field_name in meta:
            problem = _caption_problem(meta[field_name])
            if problem is not None:
                raise SourceError(f"{where(sample, names)}: its .json field {field_name!r} holds {problem}")
            captions.append(meta[field_name])
        else:
            fields = ", ".join(meta) if meta else "none"
            raise SourceError(f"{where(sample, names)}: no caption: no .txt member and no {field_name!r} field in "
                              f"its .json (members: {', '.join(sorted(sample.members))}; .json fields: {fields}); "
                              "name the field with --caption-column")
        rows.append(sample_metadata(sample, meta, field_name, False, names))
    for sample, image in zip(samples, chosen, strict=True):
        ignored += [f"{names[sample.shard]}!{m.name}" for ext, m in sample.members.items()
                    if ext not in (image, "json", "txt")]
    keys = [s.members[image].name for s, image in zip(samples, chosen, strict=True)]
    table = {key: (s.shard, s.members[image].offset, s.members[image].size)
             for key, s, image in zip(keys, samples, chosen, strict=True)}
    shard_of = [s.shard for s in samples]
    reader = TarMemberReader(described, list(paths), names, table)
    return _Found(root, keys, captions, rows if any(rows) else None,
                  lambda index: {"shard": names[shard_of[index]]}, lambda index: where(samples[index], names),
                  {"shards": len(paths), "image_ext": list(exts)}, reader, ignored)


# ------------------------------------------------------------------------------------------------ API and CLI


def scan(src: str | os.PathLike[str], options: PairOptions | None = None, tokenizer: str | os.PathLike[str] |
         None = None, workers: int | None = None, notes: bool = True) -> ImageSource:
    """List the image-text pairs of SRC (see the module docstring), tokenizing the captions with `tokenizer` if
    given; SourceError/ConfigError naming the list file and row, or the shard and sample, of the first problem.
    `notes=False` leaves out what the conversion already said of the source (its empty captions)."""
    options = options or PairOptions()
    if is_shard_source(src):
        if options.root is not None or options.image_column != "path" or options.allow_outside_root:
            raise ConfigError("--root, --image-column and --allow-outside-root apply to file lists; SRC names "
                              "WebDataset shards")
        found = _scan_shards(src, options, workers)
    else:
        if options.image_ext is not None:
            raise ConfigError("--image-ext applies to WebDataset shards; SRC names file lists")
        found = _scan_list(src, options)
    pairs: dict[str, Any] = {"captions": len(found.captions), "tokens": False}
    tokens, files = None, {}
    if tokenizer is not None:
        tokens, facts, data = tokenize(found.captions, tokenizer)
        pairs.update(facts)
        files = {TOKENIZER_FILE: data}
    pairs["empty_captions"] = _warn_empty(found.captions, found.place, notes)
    details = {**found.details, "pair_options": asdict(options),
               "tokenizer": None if tokenizer is None else str(Path(tokenizer).resolve())}
    return ImageSource("pairs", found.root, [NO_LABEL_CLASS], [(key, 0) for key in found.keys], found.ignored,
                       reader=found.reader, metadata=found.metadata, origin=found.origin, details=details,
                       captions=found.captions, caption_tokens=tokens, pairs=pairs, files=files)


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The pairs a dataset was converted from, read again as its conversion read them (`fastdata verify --source`)."""
    recorded = dict(manifest.source.get("pair_options", {}))
    for name in ("metadata_columns", "image_ext"):
        if recorded.get(name) is not None:
            recorded[name] = tuple(recorded[name])
    # the conversion said (and its manifest counts) the source's empty captions: not said again
    return scan(src, PairOptions(**recorded), manifest.source.get("tokenizer"), notes=False)


@dataclass(frozen=True, kw_only=True)
class PairsOptions(ImageConversionOptions):
    """How `fastdata.convert_pairs` converts image-text pairs: how the pairs are read and their captions stored
    (below), and the options of every image conversion (`fastdata.convert.options.ImageConversionOptions`).
    Checked when made.

    Attributes:
        caption_column: lists: the column holding each caption; shards: the `.json` field holding it when a sample
            has no `.txt` member.
        image_column: lists: the column holding each image's path.
        root: lists: the folder the image paths are relative to (None: the list's folder).
        tokenizer: a `tokenizers` tokenizer.json: also store each caption's token ids (copied into OUT).
        allow_outside_root: lists: accept image paths outside `root`.
        metadata_columns: lists: the columns kept as per-sample metadata, a list or "A,B" (None: every other
            column; empty: none).
        image_ext: shards: the image member extensions, in order of preference, a list or "jpg,png" (None: every
            image extension).
    """

    caption_column: str = "caption"
    image_column: str = "path"
    root: str | os.PathLike[str] | None = None
    tokenizer: str | os.PathLike[str] | None = None
    allow_outside_root: bool = False
    metadata_columns: str | Sequence[str] | None = None
    image_ext: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value), paths and lists normalised (a str, a
        tuple)."""
        super().__post_init__()
        check_column("caption_column", self.caption_column)
        check_column("image_column", self.image_column)
        check_bool("allow_outside_root", self.allow_outside_root)
        normalise(self, root=check_path("root", self.root), tokenizer=check_path("tokenizer", self.tokenizer),
                  metadata_columns=check_names("metadata_columns", self.metadata_columns),
                  image_ext=None if self.image_ext is None else image_exts(self.image_ext))

    def pair_options(self) -> PairOptions:
        """How the pairs are read (what the manifest records)."""
        return PairOptions(self.root, self.image_column, self.caption_column,  # type: ignore[arg-type]
                           self.allow_outside_root, self.metadata_columns, self.image_ext)  # type: ignore[arg-type]


def convert_pairs(src: str | os.PathLike[str], out: str | os.PathLike[str], options: PairsOptions | None = None,
                  **keywords: Any) -> ConversionSummary:
    """Pack image-text pairs into `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards): each image with its
    caption (UTF-8 text) and, with `tokenizer`, the caption's token ids; every image verified by decoding it,
    unusable ones rejected and named. `fastdata.loader(out)` then yields `{"images", "captions"}` dicts (with
    stored tokens `{"images", "input_ids", "attention_mask", "captions"}`).

    Args:
        src: a file list (`.csv`, `.tsv`, `.jsonl`, `.parquet`, or a folder or glob of them), or WebDataset shards
            as img2dataset writes them (a folder of `.tar` files, one `.tar`, or a brace pattern).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: how to read the pairs and convert (`fastdata.options.PairsOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(PairsOptions, options, keywords, "fastdata.convert_pairs")
    return convert_images(lambda: scan(src, settings.pair_options(), settings.tokenizer, settings.workers), out,
                          settings)


#: the option object of `fastdata convert pairs`, and its parameters that are not options (its arguments)
OPTIONS = PairsOptions
ARGUMENTS = ("src", "out")


def cli_command() -> click.Command:
    """`fastdata convert pairs SRC OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("pairs")
    @click.argument("src")
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--caption-column", default="caption", show_default=True,
                  help="Lists: the column holding each caption. Shards: the .json field, when a sample has no .txt.")
    @click.option("--image-column", default="path", show_default=True, help="Lists: the column of image paths.")
    @click.option("--root", type=click.Path(path_type=Path), default=None, metavar="DIR",
                  help="Lists: the folder the image paths are relative to. Default: the folder of SRC.")
    @click.option("--tokenizer", type=click.Path(path_type=Path), default=None, metavar="tokenizer.json",
                  help="Also store each caption's token ids (copied into OUT; the loader then gives input_ids).")
    @click.option("--allow-outside-root", is_flag=True, help="Lists: accept image paths outside --root.")
    @click.option("--metadata-columns", default=None, metavar="A,B",
                  help="Lists: columns kept as per-sample metadata. Default: every other column; '' keeps none.")
    @click.option("--image-ext", default=None, metavar="EXT,...",
                  help="Shards: image member extensions, in order of preference.")
    @convert_options
    def command(src: str, out: Path, **flags: Any) -> None:
        """Pack image-text pairs SRC into OUT: each image with its caption (and token ids with --tokenizer).

        SRC: a .csv, .tsv, .jsonl or .parquet list (a path and a caption per row), or WebDataset shards as
        img2dataset writes them (.jpg + .txt caption or a .json caption field): a folder of .tar files, one
        .tar, or a brace pattern. OUT ending in .lmdb writes one LMDB dataset; --format wds writes shards.
        """
        click.echo(str(convert_pairs(src, out, options_from_flags(OPTIONS, flags, ARGUMENTS))))

    return command
