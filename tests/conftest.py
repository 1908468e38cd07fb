"""Fixtures (and pytest hooks) shared by the test files; the data they build comes from the builders package.

Session fixtures convert the tricky and the solid ImageFolder trees (see builders/images.py) once, to LMDB and to
WebDataset shards, for every test that only reads them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from builders.coco import write_coco, write_coco_rectangles
from builders.hf import HfSources, write_hf_sources
from builders.images import (
    SMALL_SOLID_COUNT,
    Tree,
    build_bad_tree,
    build_photo_tree,
    build_solid_tree,
    build_tricky_tree,
)
from builders.lists import write_list
from builders.pairs import clip_like_tokenizer, pair_caption, pair_shard_sample, pairs_frame
from builders.segmentation import build_segmentation_rects
from builders.sources import write_zip, zip_source
from builders.text import make_corpus, reference_ids, train_bytelevel, write_jsonl
from builders.webdataset import write_wds_shards

import fastdata
from fastdata.image.jpeg.extension import EXTENSION, HOW_TO_BUILD, NOT_BUILT, extension_built
from fastdata.tools.sample import make_sample_imagefolder

#: why a test that needs the region decoder's C extension is skipped where it was not built, and what to install
NEEDS_EXTENSION = f"needs the region decoder, and {NOT_BUILT}: {HOW_TO_BUILD}"

# The Ctrl-C tests send SIGINT to programs they start, as a terminal does to its foreground job. A shell starts a
# background job (`pytest &`, nohup) with SIGINT ignored, and an ignored signal stays ignored across exec, so those
# programs would never see it: catch it here as an interactive Python does, and the programs start with its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tricky_tree(tmp_path_factory) -> Tree:
    return build_tricky_tree(tmp_path_factory.mktemp("tricky") / "src")


@pytest.fixture(scope="session")
def solid_tree(tmp_path_factory) -> Tree:
    return build_solid_tree(tmp_path_factory.mktemp("solid") / "src")


@pytest.fixture(scope="session")
def small_solid_tree(tmp_path_factory) -> Tree:
    return build_solid_tree(tmp_path_factory.mktemp("small_solid") / "src", count=SMALL_SOLID_COUNT)


@pytest.fixture(scope="session")
def pets_lmdb(tmp_path_factory) -> Path:
    """12 solid images (ids 0..11) in other classes than the solid tree's ("cat", "dog", "eel"): a second source
    for mixtures, whose labels tell it apart."""
    root = tmp_path_factory.mktemp("pets")
    tree = build_solid_tree(root / "src", count=SMALL_SOLID_COUNT, classes=("cat", "dog", "eel"))
    fastdata.convert_imagefolder(tree.root, root / "pets.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    return root / "pets.lmdb"


@pytest.fixture(scope="session")
def text_mix(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Three small text datasets: an LMDB and a WebDataset one made with one tokenizer, and an LMDB one made with
    another (mixtures must share their tokenizer)."""
    root = tmp_path_factory.mktemp("text_mix")
    first, second = make_corpus(40, seed=3), make_corpus(25, seed=4)
    tokenizer = train_bytelevel(root / "bpe.json", first + second)
    a, b, c = root / "a.lmdb", root / "b", root / "c.lmdb"
    fastdata.convert_text(
        write_jsonl(root / "a.jsonl", first),
        a,
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(progress=False),
    )
    fastdata.convert_text(
        write_jsonl(root / "b.jsonl", second),
        b,
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(format="wds", shard_size="2KB", progress=False),
    )
    fastdata.convert_text(
        write_jsonl(root / "c.jsonl", second),
        c,
        tokenizer=train_bytelevel(root / "other.json", second, vocab=300),
        options=fastdata.TextConversionOptions(progress=False),
    )
    return a, b, c


def _sample_photos(root: Path, png_fraction: float, classes: int) -> tuple[Path, Path]:
    """24 real photo crops (`fastdata.tools.sample`: JPEG baseline / progressive / grey, and PNGs at
    `png_fraction`) converted to LMDB and to WebDataset shards."""
    src = make_sample_imagefolder(root / "src", images=24, classes=classes, png_fraction=png_fraction, workers=1)
    fastdata.convert_imagefolder(src, root / "p.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    fastdata.convert_imagefolder(
        src, root / "p-wds", fastdata.ImageFolderOptions(format="wds", shard_size="200KB", workers=1, progress=False)
    )
    return root / "p.lmdb", root / "p-wds"


@pytest.fixture(scope="session")
def photos(tmp_path_factory) -> tuple[Path, Path]:
    """Sample photos with some PNGs among them (decoded in the workers on the device path): (LMDB, WebDataset)."""
    return _sample_photos(tmp_path_factory.mktemp("photos"), png_fraction=0.2, classes=3)


@pytest.fixture(scope="session")
def jpeg_photos(tmp_path_factory) -> tuple[Path, Path]:
    """Sample photos, JPEGs only (every sample reaches the device's decoder): (LMDB, WebDataset)."""
    return _sample_photos(tmp_path_factory.mktemp("jpeg_photos"), png_fraction=0.0, classes=2)


@pytest.fixture(scope="session")
def photo_tree(tmp_path_factory) -> Tree:
    return build_photo_tree(tmp_path_factory.mktemp("photo_like") / "src")


@pytest.fixture(scope="session")
def loader_corpus() -> list[str]:
    """The text loader tests' corpus: 150 documents of varied length (builders.text.make_corpus)."""
    return make_corpus(150, seed=3)


@pytest.fixture(scope="session")
def loader_tokenizer(tmp_path_factory, loader_corpus) -> Path:
    return train_bytelevel(tmp_path_factory.mktemp("loader_tok") / "bpe.json", loader_corpus)


@pytest.fixture(scope="session")
def loader_documents(loader_corpus, loader_tokenizer) -> list[list[int]]:
    """Each document's exact ids (one `encode` each)."""
    return [reference_ids(loader_tokenizer, text) for text in loader_corpus]


@pytest.fixture(scope="session")
def small_text_lmdb(tmp_path_factory) -> Path:
    """A small tokenized text conversion (30 documents, LMDB): for what a loader does with a text dataset."""
    root = tmp_path_factory.mktemp("small_text")
    corpus = make_corpus(30, seed=1)
    out = root / "text.lmdb"
    fastdata.convert_text(
        write_jsonl(root / "corpus.jsonl", corpus),
        out,
        tokenizer=train_bytelevel(root / "bpe.json", corpus),
        options=fastdata.TextConversionOptions(progress=False),
    )
    return out


@pytest.fixture(scope="session")
def hf_tree(tmp_path_factory) -> Tree:
    """A solid tree of 24 images, the content of the Hugging Face sources."""
    return build_solid_tree(tmp_path_factory.mktemp("hf_tree") / "src", count=24)


@pytest.fixture(scope="session")
def hf_sources(hf_tree, tmp_path_factory) -> HfSources:
    """The solid `hf_tree` as every kind of Hugging Face source, written by `datasets` itself."""
    return write_hf_sources(hf_tree, tmp_path_factory.mktemp("hf_sources"))


@pytest.fixture
def bad_tree(tmp_path) -> Tree:
    return build_bad_tree(tmp_path / "bad")


@pytest.fixture(scope="session")
def readme_lmdb(tmp_path_factory) -> Path:
    """A tiny converted sample of photos (24 images, 3 classes): the dataset the README's and the docs' Python
    snippets load in place of their "train.lmdb" and "val.lmdb"."""
    root = tmp_path_factory.mktemp("photos")
    src = make_sample_imagefolder(root / "train", images=24, classes=3, workers=1)
    out = root / "train.lmdb"
    fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    return out


@pytest.fixture
def readme_trees(tmp_path) -> tuple[Path, Path]:
    """Tiny train and val ImageFolder trees of photos (24 and 12 images, 3 classes), for the examples."""
    return (make_sample_imagefolder(tmp_path / "train", images=24, classes=3, workers=1),
            make_sample_imagefolder(tmp_path / "val", images=12, classes=3, seed=1, workers=1))


@pytest.fixture(scope="module")
def decoder():
    """The region JPEG decoder (fastdata.image.jpeg.region): the test is skipped, saying what to install, where its
    C extension was not built (no compiler or no Python headers at install); where it was, it must load and pass."""
    from fastdata.image.jpeg.region import region_decoder, unavailable_reason

    if not extension_built():
        pytest.skip(NEEDS_EXTENSION)
    found = region_decoder()
    assert found is not None, unavailable_reason()
    return found


@pytest.fixture
def without_extension(monkeypatch):
    """This process as on a machine where the region decoder's C extension was not built (no compiler or no Python
    headers at install): importing it fails, and what was loaded from it is forgotten until the test ends."""
    import fastdata.image
    from fastdata.image.jpeg import region, restart

    def forget() -> None:
        for cached in (region._load, region.warn_fallback, restart._extension):
            cached.cache_clear()

    monkeypatch.setitem(sys.modules, EXTENSION, None)
    monkeypatch.delattr(fastdata.image, EXTENSION.rpartition(".")[2], raising=False)
    forget()
    yield
    forget()  # before monkeypatch puts the extension back: the next use loads it again


@pytest.fixture(scope="session")
def pair_tokenizer(solid_tree, tmp_path_factory) -> Path:
    """A CLIP-like tokenizer.json (post-processor: <|startoftext|> ... <|endoftext|>) trained on the solid
    captions."""
    captions = [pair_caption(i) for i in range(len(solid_tree.images))]
    return clip_like_tokenizer(tmp_path_factory.mktemp("pair_tokenizer") / "tokenizer.json", captions * 4)


@pytest.fixture(scope="session")
def pairs_csv(solid_tree, tmp_path_factory) -> Path:
    """A CSV list (written by pandas) of the solid images, shuffled, with a caption naming each one's id."""
    return write_list(pairs_frame(solid_tree), tmp_path_factory.mktemp("pairs_list") / "pairs.csv")


@pytest.fixture(scope="session")
def pair_shards(solid_tree, tmp_path_factory) -> Path:
    """img2dataset-style shards of the solid images (webdataset's ShardWriter, 6 samples a shard): `.txt`
    captions in `.txt` and `.json`, in `.txt` only, or in `.json` only, in turn."""
    samples = [pair_shard_sample(solid_tree, relative, ("both", "txt", "json")[i % 3])
               for i, relative in enumerate(solid_tree.images)]
    directory = tmp_path_factory.mktemp("pair_shards") / "src"
    write_wds_shards(directory, samples)
    return directory


@pytest.fixture(scope="session")
def pairs_from_shards(pair_shards, tmp_path_factory) -> Path:
    """The img2dataset-style shards converted without a tokenizer (captions as text)."""
    out = tmp_path_factory.mktemp("pairs_from_shards") / "pairs.lmdb"
    fastdata.convert_pairs(pair_shards, out, fastdata.PairsOptions(workers=1, progress=False))
    return out


@pytest.fixture(scope="session")
def seg_rect_list(tmp_path_factory) -> Path:
    """The segmentation rectangles source (builders.segmentation.build_segmentation_rects): 23 pictures with label
    maps."""
    return build_segmentation_rects(tmp_path_factory.mktemp("seg_rects") / "src")


@pytest.fixture(scope="session")
def rect_source(tmp_path_factory):
    """The rectangles COCO source (builders.coco.write_coco_rectangles): 23 images, each a red rectangle in its box."""
    return write_coco_rectangles(tmp_path_factory.mktemp("rects"))


# ------------------------------------------------------------------------------------------------------------------
# Datasets the session converts once, in each storage format. Each row of CONVERSIONS makes the session fixtures
# `{name}_lmdb` and `{name}_wds` (the same source converted into a temporary folder of its own) and, where `each`
# is given, the fixture of that name that runs every test taking it on both formats.

#: how a row converts its source: (fixture lookup, output path, the format's options) -> the output path
Convert = Callable[..., Path]


@dataclass(frozen=True)
class Conversion:
    """One source converted once per session, to LMDB (`lmdb`) and/or WebDataset shards (`wds`): each format a
    (temporary folder, output name, options) triple, None where the session does not need it."""

    name: str
    convert: Convert
    lmdb: tuple[str, str, dict[str, Any]] | None
    wds: tuple[str, str, dict[str, Any]] | None = None
    each: str | None = None
    about: str = ""


def _imagefolder(tree: str) -> Convert:
    """Convert the ImageFolder tree of fixture `tree` (`fastdata.convert_imagefolder`)."""
    def convert(fixture, out: Path, **options) -> Path:
        fastdata.convert_imagefolder(fixture(tree).root, out, fastdata.ImageFolderOptions(progress=False, **options))
        return out

    convert.__doc__ = f"the ImageFolder tree `{tree}`."
    return convert


def _multi_label(fixture, out: Path, **options) -> Path:
    """the solid tree as a multi-label dataset with metadata (`builders.sources.multi_labels`,
    `builders.sources.solid_metadata`), its bytes read from a zip archive: a source whose samples are not files."""
    from fastdata.convert.images import convert_images
    from fastdata.convert.options import ImageConversionOptions

    solid_tree = fixture("solid_tree")
    listing = zip_source(solid_tree, write_zip(solid_tree, out.parent / "images.zip"), multi=True, metadata=True)
    convert_images(lambda: listing, out, ImageConversionOptions(workers=1, progress=False, **options))
    return out


def _loader_text(fixture, out: Path, **options) -> Path:
    """the loader corpus, as JSONL beside `out`, tokenized with the loader tokenizer."""
    source = write_jsonl(out.parent / "c.jsonl", fixture("loader_corpus"))
    fastdata.convert_text(source, out, fastdata.TextConversionOptions(progress=False, **options),
                          tokenizer=fixture("loader_tokenizer"))
    return out


def _pairs(fixture, out: Path, **options) -> Path:
    """the solid pairs list (`pairs_csv`) with token ids (`pair_tokenizer`)."""
    fastdata.convert_pairs(fixture("pairs_csv"), out, fastdata.PairsOptions(
        root=fixture("solid_tree").root, tokenizer=fixture("pair_tokenizer"), workers=1, progress=False, **options))
    return out


def _seg_rects(fixture, out: Path, **options) -> Path:
    """the segmentation rectangles source (`seg_rect_list`) with its label maps."""
    fastdata.convert_list(fixture("seg_rect_list"), out,
                          fastdata.FileListOptions(mask_column="mask", workers=1, progress=False, **options))
    return out


def _convert_coco(source, out: Path, **options) -> Path:
    fastdata.convert_coco(
        source.annotations, source.images, out, fastdata.CocoOptions(workers=1, progress=False, **options)
    )
    return out


def _rects(fixture, out: Path, **options) -> Path:
    """the rectangles COCO source (`rect_source`)."""
    return _convert_coco(fixture("rect_source"), out, **options)


def _coco(fixture, out: Path, **options) -> Path:
    """the converter tests' COCO source (builders.coco.write_coco: polygons of several parts, compressed and
    uncompressed RLE crowds), written beside `out`."""
    return _convert_coco(write_coco(out.parent), out, **options)


def _shards(shard_size: str, **options: Any) -> dict[str, Any]:
    return {"format": "wds", "shard_size": shard_size, **options}


CONVERSIONS = [
    Conversion("tricky", _imagefolder("tricky_tree"), ("tricky_out", "data.lmdb", {"workers": 1}),
               ("tricky_wds", "shards", _shards("4KB", seed=3, workers=2))),
    Conversion("solid", _imagefolder("solid_tree"), ("solid_out", "solid.lmdb", {"workers": 1}),
               ("solid_wds", "shards", _shards("12KB", seed=0, workers=1)), each="solid",
               about="Each test that takes it runs on the solid conversion in both formats."),
    Conversion("small_solid", _imagefolder("small_solid_tree"), ("small_solid_out", "d.lmdb", {"workers": 1})),
    Conversion("photo", _imagefolder("photo_tree"), ("photo_like_out", "photos.lmdb", {"workers": 1})),
    Conversion("loader_text", _loader_text, ("loader_lmdb", "d.lmdb", {}), ("loader_wds", "d", _shards("2KB")),
               each="loader_text", about="The loader corpus converted, in each format (WebDataset: shards of 2KB)."),
    Conversion("multi_label", _multi_label, ("multi_lmdb", "multi.lmdb", {}),
               ("multi_wds", "multi-shards", _shards("12KB")), each="multi_label",
               about="Each test that takes it runs on the multi-label solid conversion in both formats."),
    Conversion("pairs", _pairs, ("pairs_out", "pairs.lmdb", {}), ("pairs_wds", "shards", _shards("12KB")),
               each="pairs", about="The solid pairs with token ids, as LMDB and as WebDataset shards."),
    Conversion("seg_rect", _seg_rects, ("seg_rects_lmdb", "seg.lmdb", {}), ("seg_rects_wds", "seg-wds", _shards("6KB")),
               each="seg_rects", about="The segmentation rectangles converted, as LMDB and as WebDataset shards."),
    Conversion("rect", _rects, ("rects_lmdb", "rects.lmdb", {}), ("rects_wds", "rects-wds", _shards("6KB")),
               each="rects", about="The rectangles COCO source converted, as LMDB and as WebDataset shards."),
    Conversion("coco", _coco, ("coco_lmdb", "coco.lmdb", {})),
]


def _converted(row: Conversion, fmt: str, folder: str, name: str, options: dict[str, Any]):
    """The session fixture `{row.name}_{fmt}`: `row`'s source converted into `folder`/`name` with `options`."""
    def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return row.convert(request.getfixturevalue, tmp_path_factory.mktemp(folder) / name, **options)

    fixture.__doc__ = (f"The {row.name} source converted once per session, to "
                       f"{'LMDB' if fmt == 'lmdb' else 'WebDataset shards'}: {row.convert.__doc__}")
    return pytest.fixture(scope="session", name=f"{row.name}_{fmt}")(fixture)


def _each_format(row: Conversion):
    """The fixture `row.each`: every test that takes it runs once on `row`'s LMDB and once on its shards."""
    def fixture(request: pytest.FixtureRequest) -> Path:
        return request.getfixturevalue(f"{row.name}_{request.param}")

    fixture.__doc__ = row.about
    return pytest.fixture(params=["lmdb", "wds"], name=row.each)(fixture)


def _fixtures(rows: list[Conversion]) -> dict[str, Any]:
    """Every fixture of `rows`, by name (pytest finds a conftest's fixtures among its module's names)."""
    made = {}
    for row in rows:
        for fmt, where in (("lmdb", row.lmdb), ("wds", row.wds)):
            if where is not None:
                made[f"{row.name}_{fmt}"] = _converted(row, fmt, *where)
        if row.each is not None:
            made[row.each] = _each_format(row)
    return made


globals().update(_fixtures(CONVERSIONS))


@pytest.fixture(autouse=True)
def _release_readers():
    """Let each test start without LMDB readers left open by an earlier failed one (the failure's traceback,
    kept in sys.last_traceback, holds its frames and with them its datasets)."""
    yield
    from fastdata.formats.lmdb import release_environments

    release_environments()  # so that a later test may open a dataset's LMDB file directly
    if getattr(sys, "last_traceback", None) is not None:
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run wherever a CUDA GPU is visible, those marked `region_extension` wherever the region
    decoder's C extension was built; elsewhere they are skipped with the reason (and what to install)."""
    import torch

    skips = {"cuda": None if torch.cuda.is_available() else
             pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here"),
             "region_extension": None if extension_built() else pytest.mark.skip(reason=NEEDS_EXTENSION)}
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture
def reap():
    """`reap(process)` for a process started in a session of its own: when the test ends, whatever happened (a
    failed assertion, a timeout), nothing of its process group is left running on the machine."""
    started: list[subprocess.Popen] = []
    yield started.append
    for process in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
