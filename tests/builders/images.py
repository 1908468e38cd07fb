"""Test data and shared helpers: builders of tiny generated datasets whose content encodes the sample index,
and the small helpers several test files use. Fixtures live in conftest.py; resumability checks in contracts.py.

Two ImageFolder trees are used throughout:

- the *tricky* tree: nested sub-folders (one with a dot in its name), mixed-case extensions, files with
  several dots, two files with the same stem, JPEG (RGB, L, CMYK), PNG (RGB, L, P, RGBA, LA), BMP, and
  non-image files that ImageFolder ignores;
- the *solid* tree: 45 images in 3 classes whose green channel is a constant that encodes the sample id
  (`G = id * GREEN_STEP`) while red/blue are gradients, so that any crop, resize or flip still tells which
  sample it came from, while the augmentation itself is visible in red/blue.

Text corpora name their index in each document ("doc 17 ..."), so that order mistakes show in the decoded text.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from PIL import Image

import fastdata
from fastdata.cli import main
from fastdata.image.jpeg.extension import extension_built
from fastdata.image.jpeg.region import FALLBACK

GREEN_STEP = 5

# Source of `kill_when(cls, method, condition)` for the scripts of conversions run in a child process: SIGKILLs the
# process on a call of `cls.method` when `condition(self)` holds (a real, abrupt kill, placed deterministically).
KILL_WHEN = textwrap.dedent("""
    import os, signal

    def kill_when(cls, method, condition):
        original = getattr(cls, method)
        def wrapped(self, *args, **kwargs):
            if condition(self):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)
        setattr(cls, method, wrapped)
""")

# Source of `pause_when(cls, method, condition, here)` for the scripts of conversions run in a child process: on the
# first call of `cls.method` where `condition(self)` holds, creates the file `here + ".paused"` and waits until the
# file `here + ".go"` exists (the test says when), then goes on. Nothing but files sequences it: no timing.
PAUSE_WHEN = textwrap.dedent("""
    import os, time

    def pause_when(cls, method, condition, here):
        original = getattr(cls, method)
        done = []
        def wrapped(self, *args, **kwargs):
            if not done and condition(self):
                done.append(1)
                open(here + ".paused", "w").close()
                while not os.path.exists(here + ".go"):
                    time.sleep(0.01)
            return original(self, *args, **kwargs)
        setattr(cls, method, wrapped)
""")


def wait_for_file(path: Path, process: subprocess.Popen, bound_s: float = 600) -> None:
    """Wait until `path` exists (a child's `pause_when` says it has paused); AssertionError with the child's output
    when the child ends first. `bound_s` only bounds a hung child on a loaded machine: it measures nothing."""
    import time

    deadline = time.monotonic() + bound_s
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the child ended (exit code {process.returncode}) before {path.name}: {out} {err}")
        assert time.monotonic() < deadline, f"the child never made {path}"
        time.sleep(0.01)


def no_process_left(group: int) -> bool:
    """Whether every process of the process group `group` has exited."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


# ----------------------------------------------------------------------------------------------------
# pixel patterns


def pattern(index: int, width: int, height: int) -> np.ndarray:
    """An RGB uint8 (H, W, 3) picture that encodes `index`: a base colour from the index plus gradients."""
    y, x = np.mgrid[0:height, 0:width]
    r = (index * 37 + x * 3) % 256
    g = (index * 59 + y * 4) % 256
    b = (index * 11 + (x + y) * 2) % 256
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def solid_pattern(sample_id: int, width: int, height: int) -> np.ndarray:
    """Green is the constant `sample_id * GREEN_STEP`; red and blue are gradients across the image."""
    y, x = np.mgrid[0:height, 0:width]
    r = x * 255 // max(1, width - 1)
    g = np.full_like(x, sample_id * GREEN_STEP)
    b = y * 255 // max(1, height - 1)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def sample_id_of(image_chw) -> int:
    """The sample id encoded by `solid_pattern` in a CHW (tensor or array) image, however it was cropped."""
    green = np.asarray(image_chw)[1]
    return round(float(np.median(green)) / GREEN_STEP)


def encode(array: np.ndarray, fmt: str, mode: str | None = None, **save_args) -> bytes:
    im = Image.fromarray(array)
    if mode == "P":
        im = im.quantize(colors=64)
    elif mode is not None:
        im = im.convert(mode)
    out = io.BytesIO()
    im.save(out, fmt, **save_args)
    return out.getvalue()


def rgb_of_file(path: Path) -> np.ndarray:
    """What torchvision's ImageFolder loader sees: PIL `convert("RGB")`, HWC uint8."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def chw(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.transpose(2, 0, 1))


# ----------------------------------------------------------------------------------------------------
# tree builders


@dataclass
class Tree:
    """A generated ImageFolder tree."""

    root: Path
    images: list[str] = field(default_factory=list)  # source-relative posix paths of the image files
    ignored: list[str] = field(default_factory=list)  # source-relative paths of the non-image files
    exact: set[str] = field(default_factory=set)  # images whose decode must be pixel-exact (lossless codecs)

    def path(self, relative: str) -> Path:
        return self.root / relative


# (relative path, width, height, kind) of the tricky tree; kind = how the file is encoded
TRICKY_LAYOUT: list[tuple[str, int, int, str]] = [
    ("Bird/a01.jpg", 31, 23, "jpeg"),
    ("Bird/a02.JPG", 45, 37, "jpeg"),
    ("Bird/a03.png", 29, 41, "png"),
    ("Bird/a04.PNG", 53, 21, "png-L"),
    ("Bird/zz/deep/a05.Jpeg", 33, 47, "jpeg-L"),
    ("Bird/zz/a06.jpeg", 41, 27, "jpeg-cmyk"),
    ("Bird/a07.bmp", 25, 25, "bmp"),
    ("Bird/twin.jpg", 27, 35, "jpeg"),
    ("Bird/twin.png", 35, 27, "png"),
    ("cat/b01.png", 39, 29, "png-P"),
    ("cat/b02.png", 23, 43, "png-RGBA"),
    ("cat/b03.png", 47, 33, "png-LA"),
    ("cat/b04.JPEG", 61, 39, "jpeg"),
    ("cat/sub/b05.jpg", 21, 21, "jpeg-progressive"),
    ("cat/sub/b06.PNG", 37, 51, "png-P"),
    ("cat/sub/b07.jpeg", 57, 45, "jpeg-cmyk"),
    ("cat/v1.2/b08.jpg", 43, 31, "jpeg"),
    ("cat/v1.2/img.v2.final.PNG", 33, 29, "png-RGBA"),
    ("cat/B09.jpg", 35, 23, "jpeg-L"),
    ("cat/b10.jpg", 67, 49, "jpeg"),
    ("dog.v2/c01.png", 27, 31, "png"),
    ("dog.v2/c02.jpg", 49, 35, "jpeg"),
    ("dog.v2/sub/c03.Jpeg", 23, 29, "jpeg"),
    ("dog.v2/sub/c04.png", 31, 53, "png-L"),
    ("dog.v2/sub/inner/c05.JPG", 39, 41, "jpeg"),
    ("dog.v2/sub/inner/c06.png", 45, 23, "png-P"),
    ("dog.v2/c07.jpg", 69, 55, "jpeg-L"),
]

TRICKY_IGNORED = ["README", "notes.txt", "Bird/labels.txt", "cat/sub/meta.json", "dog.v2/sub/inner/info.JSON"]


def write_image(path: Path, array: np.ndarray, kind: str) -> bool:
    """Write `array` as `kind`; returns whether the stored pixels are exactly PIL-decodable (lossless)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jpeg":
        data = encode(array, "JPEG", quality=92)
    elif kind == "jpeg-L":
        data = encode(array, "JPEG", "L", quality=92)
    elif kind == "jpeg-cmyk":
        data = encode(array, "JPEG", "CMYK", quality=92)
    elif kind == "jpeg-progressive":
        data = encode(array, "JPEG", quality=85, progressive=True)
    elif kind == "png":
        data = encode(array, "PNG")
    elif kind.startswith("png-"):
        mode = kind.split("-", 1)[1]
        if mode in ("RGBA", "LA"):
            alpha = np.linspace(0, 255, array.shape[0] * array.shape[1]).reshape(array.shape[:2])
            array = np.dstack([array, alpha.astype(np.uint8)])
            im = Image.fromarray(array, "RGBA")
            if mode == "LA":
                im = im.convert("LA")
            out = io.BytesIO()
            im.save(out, "PNG")
            data = out.getvalue()
        else:
            data = encode(array, "PNG", mode)
    elif kind == "bmp":
        data = encode(array, "BMP")
    else:  # pragma: no cover - a typo in a layout
        raise AssertionError(kind)
    path.write_bytes(data)
    return not kind.startswith("jpeg")


def build_tricky_tree(root: Path) -> Tree:
    """The tricky ImageFolder tree (see module docstring) under `root`."""
    tree = Tree(root)
    for index, (relative, width, height, kind) in enumerate(TRICKY_LAYOUT):
        if write_image(root / relative, pattern(index, width, height), kind):
            tree.exact.add(relative)
        tree.images.append(relative)
    for relative in TRICKY_IGNORED:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("not an image\n")
        tree.ignored.append(relative)
    return tree


SOLID_CLASSES = ("alpha", "beta", "gamma")
SOLID_COUNT = 45
SMALL_SOLID_COUNT = 12  # the small solid tree (conftest's small_solid_tree)


def solid_label(sample_id: int) -> int:
    return sample_id % len(SOLID_CLASSES)


def build_solid_tree(root: Path, count: int = SOLID_COUNT, classes: tuple[str, ...] = SOLID_CLASSES) -> Tree:
    """`count` images in 3 classes (named `classes`), id encoded in the green channel (see `solid_pattern`).
    Sizes vary (21..69 px, odd); every third image is a 4:4:4 quality-100 JPEG, the rest PNG."""
    tree = Tree(root)
    rng = np.random.default_rng(1234)
    for sample_id in range(count):
        width, height = (int(v) * 2 + 1 for v in rng.integers(10, 35, size=2))
        name = classes[solid_label(sample_id)]
        array = solid_pattern(sample_id, width, height)
        if sample_id % 3 == 1:
            relative = f"{name}/s{sample_id:03d}.jpg"
            data = encode(array, "JPEG", quality=100, subsampling=0)
        else:
            relative = f"{name}/s{sample_id:03d}.png"
            data = encode(array, "PNG")
            tree.exact.add(relative)
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
        tree.images.append(relative)
    return tree


#: (name, width, height) of the photo-like tree: landscape, portrait, odd, very wide, small, square
PHOTO_SHAPES = [("landscape", 500, 375), ("portrait", 375, 500), ("odd", 333, 257), ("wide", 641, 97),
                 ("small", 97, 130), ("square", 256, 256)]


def photo_like(seed: int, width: int, height: int) -> np.ndarray:
    """A smooth scene with hard-edged discs, slightly blurred (what resampling meets in photographs: gradients,
    edges and detail at several scales), as RGB uint8 (H, W, 3)."""
    from PIL import ImageFilter

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.005, 0.08, 2)
        image[..., c] = 128 + 90 * np.sin(fx * x + fy * y + rng.uniform(0, 6.3))
    for _ in range(20):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(3, max(width, height) / 5)
        image[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    image += rng.uniform(-60, 60, (height, width, 1))  # texture: fine detail everywhere, as in photographs
    picture = Image.fromarray(image.clip(0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(1))
    return np.asarray(picture)


def build_photo_tree(root: Path) -> Tree:
    """One class per codec (`jpeg`: quality 95, 4:2:0; `png`), each holding a photo-like picture of every
    PHOTO_SHAPES shape: what the presets are compared with torchvision on."""
    tree = Tree(root)
    for index, (name, width, height) in enumerate(PHOTO_SHAPES):
        for kind in ("jpeg", "png"):
            relative = f"{kind}/{name}.{'jpg' if kind == 'jpeg' else 'png'}"
            if write_image(root / relative, photo_like(index, width, height), kind):
                tree.exact.add(relative)
            tree.images.append(relative)
    return tree


#: (class/name, width, height, how) of the sampling tree: a JPEG of every chroma sampling OpenCV writes, grayscale,
#: progressive, with restart markers already (every 2 MCUs), a PNG and a CMYK JPEG (neither is rewritten)
SAMPLING_LAYOUT = [("a/s420.jpg", 301, 223, "420"), ("a/s422.jpg", 256, 190, "422"), ("a/s444.jpg", 197, 260, "444"),
                   ("a/s440.jpg", 240, 240, "440"), ("b/gray.jpg", 277, 181, "gray"), ("b/prog.jpg", 320, 207,
                   "progressive"), ("b/rst.jpg", 233, 300, "restart"), ("b/flat.png", 150, 111, "png"),
                   ("b/ink.jpg", 120, 97, "cmyk")]


def sampling_jpeg(array: np.ndarray, how: str) -> bytes:
    """`array` as a JPEG of one SAMPLING_LAYOUT kind (OpenCV; CMYK and PNG with Pillow), quality 90."""
    import cv2

    if how == "png":
        return encode(array, "PNG")
    if how == "cmyk":
        return encode(array, "JPEG", "CMYK", quality=90)
    options = [cv2.IMWRITE_JPEG_QUALITY, 90]
    if how == "gray":
        array = array[:, :, 1]
    if how == "progressive":
        options += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    if how == "restart":
        options += [cv2.IMWRITE_JPEG_RST_INTERVAL, 2]
    if how in ("420", "422", "444", "440"):
        options += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{how}")]
    ok, encoded = cv2.imencode(".jpg", array[:, :, ::-1] if array.ndim == 3 else array, options)
    assert ok
    return encoded.tobytes()


def build_sampling_tree(root: Path) -> Tree:
    """The sampling tree (SAMPLING_LAYOUT) of photo-like pictures, for the restart layout (issue 21)."""
    tree = Tree(root)
    for index, (relative, width, height, how) in enumerate(SAMPLING_LAYOUT):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(sampling_jpeg(photo_like(40 + index, width, height), how))
        tree.images.append(relative)
    return tree


def damaged_entropy_jpeg(array: np.ndarray, progressive: bool = False) -> bytes:
    """A JPEG whose scans end half-way in an EOI marker: Pillow (and so a conversion's verification) reads it,
    filling the rest grey; the lossless rewrites refuse it ("damaged entropy data")."""
    original = encode(array, "JPEG", quality=90, progressive=progressive)
    scan = original.rindex(b"\xff\xda")  # a progressive file's last scan: Pillow refuses an earlier one cut
    return original[:scan + (len(original) - scan) // 2] + b"\xff\xd9"


def build_large_tree(root: Path, count: int, width: int = 700, height: int = 600) -> Tree:
    """`count` large PNGs (solid pattern, 3 classes): each takes milliseconds to verify, so that a conversion of
    the tree lasts long enough to be killed in its middle. Saved with fast compression to build quickly."""
    tree = Tree(root)
    for sample_id in range(count):
        relative = f"{SOLID_CLASSES[solid_label(sample_id)]}/l{sample_id:03d}.png"
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(solid_pattern(sample_id, width + sample_id, height)).save(root / relative, compress_level=1)
        tree.images.append(relative)
        tree.exact.add(relative)
    return tree


#: (class folder, file name) as bytes: names that are not UTF-8 (Latin-1 é, à, ÿ, ï), as an old archive holds them
NON_UTF8_LAYOUT: list[tuple[bytes, bytes]] = [
    (b"caf\xe9", b"s000.png"), (b"caf\xe9", b"d\xe9j\xe0.png"), (b"caf\xe9", b"s002.jpg"),
    (b"plain", b"na\xefve\xff.png"), (b"plain", b"s004.png"), (b"plain", b"\xe9t\xe9.jpg"),
]


def build_non_utf8_tree(root: Path) -> Tree:
    """An ImageFolder tree whose class folder and file names hold bytes that are not UTF-8 (`NON_UTF8_LAYOUT`),
    made with bytes paths. `Tree.images` holds the names as Python's os functions give them (undecodable bytes
    as lone surrogates, PEP 383, as torchvision lists them); sample i's green channel encodes i (`solid_pattern`)."""
    tree = Tree(root)
    for sample_id, (folder, name) in enumerate(NON_UTF8_LAYOUT):
        directory = os.fsencode(root) + b"/" + folder
        os.makedirs(directory, exist_ok=True)
        array = solid_pattern(sample_id, 21 + 2 * sample_id, 23)
        data = encode(array, "JPEG", quality=100, subsampling=0) if name.endswith(b".jpg") else encode(array, "PNG")
        with open(directory + b"/" + name, "wb") as file:
            file.write(data)
        tree.images.append(os.fsdecode(folder + b"/" + name))
    return tree


def solid_id_of_path(relative: str) -> int:
    return int(Path(relative).stem[1:])


def with_size(data: bytes, width: int, height: int) -> bytes:
    """`data` (a JPEG or PNG) with the width and height in its header replaced: a tampered file. The bytes after
    the header are the original's, so a decoder that believed the header would allocate for it, then fail."""
    if data.startswith(b"\x89PNG"):
        return data[:16] + width.to_bytes(4, "big") + height.to_bytes(4, "big") + data[24:]
    sof = next(data.index(marker) for marker in (b"\xff\xc0", b"\xff\xc2") if marker in data)
    return data[:sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9:]


def truncated_jpeg(array: np.ndarray) -> bytes:
    data = encode(array, "JPEG", quality=95)
    return data[: len(data) // 2]


def build_bad_tree(root: Path) -> Tree:
    """A small tree with good images plus a truncated JPEG, a .jpg holding text and an empty .png."""
    tree = Tree(root)
    layout = [("good/g1.png", 25, 21), ("good/g2.jpg", 33, 27), ("more/m1.png", 21, 29),
              ("more/m2.png", 27, 23)]
    for index, (relative, width, height) in enumerate(layout):
        kind = "jpeg" if relative.endswith("jpg") else "png"
        write_image(root / relative, pattern(index, width, height), kind)
        tree.images.append(relative)
    (root / "good/truncated.jpg").write_bytes(truncated_jpeg(pattern(9, 61, 47)))
    (root / "more/text.jpg").write_text("this is not a JPEG at all\n")
    (root / "more/empty.png").write_bytes(b"")
    (root / "more/readme.txt").write_text("ignored\n")
    tree.ignored.append("more/readme.txt")
    return tree


BAD_FILES = ("good/truncated.jpg", "more/empty.png", "more/text.jpg")


# ----------------------------------------------------------------------------------------------------
# sources whose samples are not files, multi-labels and metadata (fastdata.convert.sources)


class ZipReader:
    """A SampleReader over the members of a zip archive: a source whose samples are not files (key = member name).
    Opens the archive lazily, once per process, and drops the handle when pickled into a conversion worker."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_zip": None}

    def read(self, key: str) -> bytes:
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path)
        try:
            return self._zip.read(key)
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such member in the archive", key) from None

    def locate(self, key: str) -> str:
        return f"{self.path}!{key}"

    def describe(self) -> str:
        return str(self.path.resolve())

    def digest(self, keys) -> str:
        stat = self.path.stat()
        return f"{stat.st_size}:{stat.st_mtime_ns}"


def multi_labels(sample_id: int) -> tuple[int, ...]:
    """The classes of solid sample `sample_id` in multi-label tests: the bits of `sample_id % 8` over the 3 solid
    classes (every subset, the empty one included)."""
    return tuple(c for c in range(len(SOLID_CLASSES)) if (sample_id % 8) >> c & 1)


def solid_metadata(sample_id: int) -> dict:
    """The metadata of solid sample `sample_id` in metadata tests: one JSON scalar of each kind."""
    return {"id": sample_id, "name": f"sample {sample_id} é", "score": sample_id / 4, "odd": bool(sample_id % 2),
            "note": None if sample_id % 3 else "third"}


def write_zip(tree: Tree, archive: Path, missing: tuple[str, ...] = ()) -> Path:
    """The solid `tree`'s images as the (stored) members of the zip `archive`, but those in `missing`."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for relative in tree.images:
            if relative not in missing:
                out.write(tree.path(relative), relative)
    return archive


def zip_source(tree: Tree, archive: Path, multi: bool = False, metadata: bool = False):
    """Every image of the solid `tree` listed as an ImageSource whose bytes are read from the members of `archive`
    (`write_zip`) through ZipReader. Labels: the solid classes, or with `multi` the `multi_labels` of each sample
    id; with `metadata`, each sample's `solid_metadata`."""
    from fastdata.convert.sources import ImageSource

    ids = [solid_id_of_path(relative) for relative in tree.images]
    labels = [multi_labels(i) if multi else solid_label(i) for i in ids]
    return ImageSource("zip", archive.parent, list(SOLID_CLASSES), list(zip(tree.images, labels, strict=True)),
                       reader=ZipReader(archive), label_kind="multi" if multi else "single",
                       metadata=[solid_metadata(i) for i in ids] if metadata else None)


def multi_hot(ids: tuple[int, ...], classes: int = len(SOLID_CLASSES)) -> list[float]:
    return [1.0 if c in ids else 0.0 for c in range(classes)]


# ----------------------------------------------------------------------------------------------------
# file lists (fastdata convert list), written with pandas


def list_frame(tree: Tree, labels: str = "names", prefix: str = "", seed: int = 5):
    """A pandas DataFrame listing the solid `tree`'s images in a shuffled order (so that row order is not path
    order): `path` (`prefix` + the tree-relative path), `label` and the `solid_metadata` columns. `labels`:
    "names" (class names), "ids" (class ids), "name-sets" / "id-sets" (lists of names / ids: `multi_labels`)."""
    import pandas as pd

    order = np.random.default_rng(seed).permutation(len(tree.images))
    rows = []
    for index in order:
        relative = tree.images[index]
        sample_id = solid_id_of_path(relative)
        label = listed_label(sample_id, labels)
        rows.append({"path": prefix + relative, "label": label, **solid_metadata(sample_id)})
    return pd.DataFrame(rows)


def listed_label(sample_id: int, labels: str = "names"):
    """Solid sample `sample_id`'s label as `list_frame` lists it."""
    if labels == "names":
        return SOLID_CLASSES[solid_label(sample_id)]
    if labels == "ids":
        return solid_label(sample_id)
    ids = multi_labels(sample_id)
    return [SOLID_CLASSES[c] for c in ids] if labels == "name-sets" else list(ids)


def write_list(frame, path: Path) -> Path:
    """`frame` written as the list file `path`, in the format its suffix names, as pandas writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    elif suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:  # pragma: no cover - a typo in a test
        raise AssertionError(suffix)
    return path


# ----------------------------------------------------------------------------------------------------
# WebDataset shards as other tools write them (the `webdataset` library's ShardWriter; fastdata.converters.webdataset)

#: Class names of the solid samples in WebDataset sources labelled by name: first met in the opposite of sorted order.
WDS_NAMES = ("zebra", "yak", "xerus")


def wds_key(sample_id: int) -> str:
    return f"sample{sample_id:04d}"


def wds_sample(tree: Tree, relative: str, labels: str | None = "cls", caption: bool = True) -> dict:
    """The solid image `relative` of `tree` as a webdataset sample (key `wds_key(id)`, the image's bytes under its
    extension), with a `.json` of metadata ({"id", "url", "score", "tags", "nothing"}), a `.txt` caption and its
    label: `labels="cls"` a `.cls` member (the solid class id); "name" the .json "label" (its `WDS_NAMES` name);
    "multi" the .json "label" as the list of the names of its `multi_labels`; None no label."""
    sample_id = solid_id_of_path(relative)
    meta = {"id": sample_id, "url": f"https://example.com/{sample_id}.jpg", "score": sample_id / 4,
            "tags": ["t", sample_id], "nothing": None}
    sample = {"__key__": wds_key(sample_id), relative.rsplit(".", 1)[1]: tree.path(relative).read_bytes()}
    if labels == "cls":
        sample["cls"] = solid_label(sample_id)
    elif labels == "name":
        meta["label"] = WDS_NAMES[solid_label(sample_id)]
    elif labels == "multi":
        meta["label"] = [WDS_NAMES[c] for c in multi_labels(sample_id)]
    sample["json"] = meta
    if caption:
        sample["txt"] = f"a photo of sample {sample_id}"
    return sample


def write_wds_shards(directory: Path, samples: list[dict], maxcount: int = 6, pattern: str = "part-%06d.tar"
                     ) -> list[Path]:
    """`samples` written by webdataset's ShardWriter into `directory` (`maxcount` samples a shard); the shards."""
    import webdataset as wds

    directory.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(directory / pattern), maxcount=maxcount, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    return sorted(directory.glob("*.tar"))


def webdataset_reading(shards: list[Path]) -> list[dict]:
    """The samples of `shards` as the `webdataset` library itself reads them (raw bytes, in order)."""
    import webdataset as wds

    return list(wds.WebDataset([str(p) for p in shards], shardshuffle=False))


# ----------------------------------------------------------------------------------------------------
# damaged copies of a conversion


def corrupt_copy(solid_lmdb, tmp_path, index: int, payload: bytes):
    """A copy of the solid LMDB dataset whose record `index` holds `payload`; returns (path, key)."""
    copy = tmp_path / "corrupt.lmdb"
    shutil.copytree(solid_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=4, subdir=True, map_size=1 << 26)
    try:
        images = env.open_db(b"images", create=False)
        keys = env.open_db(b"keys", create=False)
        with env.begin(write=True) as txn:
            assert txn.get(struct.pack(">Q", index), db=images) is not None
            txn.put(struct.pack(">Q", index), payload, db=images)
            key = bytes(txn.get(struct.pack(">Q", index), db=keys)).decode()
    finally:
        env.close()
    (copy / "lock.mdb").unlink(missing_ok=True)
    return copy, key


def corrupt_ids_copy(path, tmp_path, sample_ids: set[int], payload: bytes = b"not an image"):
    """A copy of a solid conversion (LMDB or WebDataset) whose samples with the given ids hold `payload` instead
    of their image bytes (the WebDataset shards are rewritten member by member, in order)."""
    import tarfile

    from fastdata.formats.wds import IMAGE_EXTS

    copy = tmp_path / f"corrupt-{path.name}"
    shutil.copytree(path, copy)
    if path.suffix == ".lmdb":
        env = lmdb.open(str(copy), max_dbs=4, subdir=True, map_size=1 << 26)
        try:
            images, keys = env.open_db(b"images", create=False), env.open_db(b"keys", create=False)
            with env.begin(write=True) as txn:
                for index_bytes, key in list(txn.cursor(db=keys)):
                    if solid_id_of_path(bytes(key).decode()) in sample_ids:
                        txn.put(bytes(index_bytes), payload, db=images)
        finally:
            env.close()
        (copy / "lock.mdb").unlink(missing_ok=True)
        return copy
    for shard in sorted(copy.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        with tarfile.open(shard, "w") as tar:
            for member, data in members:
                if member.name.rsplit(".", 1)[-1] in IMAGE_EXTS and solid_id_of_path(member.name) in sample_ids:
                    data = payload
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return copy


def corrupt_shard_copy(wds: Path, tmp_path: Path) -> tuple[Path, Path, str]:
    """A copy of a WebDataset image conversion whose second shard's first image holds garbage of its own size (the
    tar stays whole); returns (copy, that shard, the sample's key: its image member's name)."""
    copy = tmp_path / "corrupt_shards"
    shutil.copytree(wds, copy)
    shard = copy / fastdata.info(copy).files[1].name
    with tarfile.open(shard) as tar:
        victim = next(m for m in tar.getmembers() if m.name.rpartition(".")[2] not in ("json", "cls"))
    with open(shard, "r+b") as file:
        file.seek(victim.offset_data)
        file.write(b"\xff" * victim.size)
    return copy, shard, victim.name


def damaged_text_copy(data: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of a text conversion with tokens missing (LMDB: its first token chunk cut to one token; WebDataset:
    its first shard cut after its first tar header); returns (copy, how the loader's error starts)."""
    copy = tmp_path / f"damaged_{data.name}"
    shutil.copytree(data, copy)
    if (copy / "data.mdb").is_file():
        env = lmdb.open(str(copy), max_dbs=8, subdir=True)
        try:
            with env.begin(write=True) as txn:
                tokens = env.open_db(b"tokens", txn=txn, create=False)
                txn.put(struct.pack(">Q", 0), b"\0" * 8, db=tokens)
        finally:
            env.close()
        (copy / "lock.mdb").unlink(missing_ok=True)
        return copy, f"{copy}: token chunk 0 is missing or short; the dataset is damaged"
    shard = copy / fastdata.info(copy).files[0].name
    os.truncate(shard, 512)  # its first tar header only
    return copy, f"{shard}: document "


# ----------------------------------------------------------------------------------------------------
# text corpora and tokenizers

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "data", "loader", "token", "block")
UNICODE = ["日本語のテキストと中文文本", "emoji 🎉🚀👩‍👩‍👧 end", "combining e\u0301 a\u0308 n\u0303 Å",
           "tab\tand\nnewline\r\n"]


def make_corpus(count: int = 120, seed: int = 0) -> list[str]:
    """Documents of varied length (some empty), with unicode; document i starts with `doc i`."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(count):
        if i % 17 == 5:
            docs.append("")
            continue
        words = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), int(rng.integers(0, 60))))
        extra = UNICODE[i % len(UNICODE)] if i % 3 == 0 else ""
        docs.append(f"doc {i}: {words} {extra}".rstrip())
    return docs


def train_bytelevel(path: Path, texts: list[str], vocab: int = 400, specials=("<|endoftext|>", "<pad>")) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


#: Pieces of text that tokenizers treat specially: added tokens (special or not, one taking the spaces around it),
#: contractions, digits, combining and compatibility characters, whitespace runs, scripts without spaces.
TRICKY = ("the", "cat", "don't", "I'll", "x=1;", "12345", "3.14", "naïve", "café", "e\u0301", "日本語", "—", "...",
          "(a)", "<|endoftext|>", "[SEP]", "<mask>", "foo's", "ВОДА", "?!", "a\u00a0b", "ﬁ", "İstanbul", "🎉")


def tricky_text(words: int, seed: int) -> str:
    """Text of `words` TRICKY pieces, mostly single spaces between them, sometimes none, several or newlines."""
    rng = np.random.default_rng(seed)
    gaps = (" ", " ", " ", " ", "", "\n", "  ", "\n\n", "\t")
    return "".join(TRICKY[i] + gaps[g] for i, g in zip(rng.integers(0, len(TRICKY), words),
                                                        rng.integers(0, len(gaps), words), strict=True))


#: The tokenizer kinds `train_tokenizer` builds (offline, trained on the texts given).
TOKENIZER_KINDS = ("bytelevel", "bytelevel-prefix", "gpt2-split", "llama3-split", "qwen2-split", "wordpiece",
                   "unigram-metaspace", "replace-metaspace", "llama2-prepend")


def train_tokenizer(path: Path, texts: list[str], kind: str) -> Path:
    """A small tokenizer of one of TOKENIZER_KINDS trained on `texts`, with the special tokens `<|endoftext|>`,
    `[SEP]`, `[UNK]`, `<unk>` and the added token `<mask>` (which takes the spaces on both sides), saved to `path`:
    byte-level BPE as GPT-2's (with or without a prefix space), byte-level BPE behind a Split on GPT-2's, GPT-4 /
    Llama 3's or Qwen 2's regex, BERT's WordPiece, a Unigram with a Metaspace pre-tokenizer, a BPE whose normalizer
    makes spaces "▁" before a Metaspace, and Llama 2's layout (a Prepend normalizer, no pre-tokenizer)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    from fastdata.text.splitting import GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX

    specials = ["<|endoftext|>", "[SEP]", "[UNK]", "<unk>"]
    alphabet = pre.ByteLevel.alphabet()
    bpe = dict(vocab_size=500, special_tokens=specials, show_progress=False)
    regexes = {"gpt2-split": GPT2_REGEX, "llama3-split": LLAMA3_REGEX, "qwen2-split": QWEN2_REGEX}
    if kind in ("bytelevel", "bytelevel-prefix"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=kind == "bytelevel-prefix")
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, **bpe)
    elif kind in regexes:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre.Sequence([pre.Split(Regex(regexes[kind]), "isolated"),
                                          pre.ByteLevel(add_prefix_space=False, use_regex=False)])
        trainer = trainers.BpeTrainer(initial_alphabet=alphabet, **bpe)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    elif kind == "unigram-metaspace":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    elif kind == "replace-metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre.Metaspace(prepend_scheme="never")
        trainer = trainers.BpeTrainer(**bpe)
    elif kind == "llama2-prepend":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        trainer = trainers.BpeTrainer(**bpe)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    tok.save(str(path))
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({field: doc, "id": len(doc)}, ensure_ascii=False) + "\n")
    return path


def reference_ids(tokenizer_file: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.no_truncation()
    tok.no_padding()
    return tok.encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------------------------------
# loaders and the command line


def seeded_loader(path, **options):
    """`fastdata.loader` with the settings the loader-state tests share (batches of 8: the 45 solid samples make
    6 batches an epoch, the last one short), overridden by `options`; image_size=16 for the presets (a custom
    transform sets its own size)."""
    settings = dict(batch_size=8, augment="train", num_workers=0, seed=7)
    settings.update(options)
    if isinstance(settings["augment"], str):
        settings.setdefault("image_size", 16)
    return fastdata.loader(path, **settings)


# Source of a user's program that replaces a loader after it raised. argv: a dataset that raises, one that does
# not, the loader's options as JSON. Prints what the first raised, then the batch count of two passes of the second.
REPLACE_AFTER_ERROR = textwrap.dedent("""
    import json, sys
    import fastdata
    from fastdata.errors import CorruptSampleError

    bad, good, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    loader = fastdata.loader(bad, **options)
    try:
        for batch in loader:
            pass
    except CorruptSampleError as exc:
        print("raised:", exc)
    loader = fastdata.loader(good, **options)
    for number in range(2):
        print("pass", number, sum(1 for batch in loader))
""")

# Source of a user's training loop that stops on Ctrl-C. argv: a dataset, the loader's options as JSON. Prints
# `training` once the first batch is in, and `interrupted` on stderr with exit code 130 on Ctrl-C.
TRAIN_UNTIL_CTRL_C = textwrap.dedent("""
    import json, sys
    import fastdata

    loader = fastdata.loader(sys.argv[1], **json.loads(sys.argv[2]))
    try:
        for epoch in range(10**6):
            for number, batch in enumerate(loader):
                if epoch == number == 0:
                    print("training", flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
""")


def less_the_fallback_note(stderr: str) -> str:
    """`stderr` of a program that loaded JPEGs, less the one note it prints where the region decoder's C extension
    was not built (`warn_fallback`: a Python warning and its source line, or the CLI's `note:` line), so that what a
    test says about the rest holds there too. Unchanged where the extension was built: the note is a fault there."""
    if extension_built():
        return stderr
    kept, source_line_next = [], False
    for line in stderr.splitlines(keepends=True):
        if FALLBACK in line:
            source_line_next = "Warning: " in line  # Python prints a warning's source line after it, indented
            continue
        if not (source_line_next and line.startswith("  ")):
            kept.append(line)
        source_line_next = False
    return "".join(kept)


def run_python(source: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the Python program `source` with `args` in a child process, as a user would: exit code, stdout and
    stderr (text)."""
    return subprocess.run([sys.executable, "-c", source, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run `fastdata ARGS` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, err)


# ----------------------------------------------------------------------------------------------------
# fastdata.meter's trace files (Chrome / Perfetto Trace Event Format)

# The Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) as far
# as this trace uses it: complete events (X), counters (C), metadata (M).
_NUMBER = {"type": "number"}
TRACE_SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "otherData": {"type": "object"},
    },
    "additionalProperties": False,  # Perfetto's JSON reader stops at a top-level key it does not know
    "$defs": {
        "event": {
            "type": "object",
            "required": ["name", "ph", "pid"],
            "properties": {"name": {"type": "string"}, "ph": {"enum": ["X", "C", "M"]}, "pid": {"type": "integer"},
                           "tid": {"type": "integer"}, "ts": _NUMBER, "dur": _NUMBER, "args": {"type": "object"}},
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur", "tid"], "properties": {"dur": {"minimum": 0}}}},
                {"if": {"properties": {"ph": {"const": "C"}}},
                 "then": {"required": ["ts", "args"],
                          "properties": {"args": {"minProperties": 1, "additionalProperties": _NUMBER}}}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"required": ["args"], "properties": {
                     "name": {"enum": ["process_name", "thread_name", "process_sort_index", "thread_sort_index"]}}}},
            ],
        },
    },
}


def check_trace(path: Path) -> dict:
    """Load a trace file and check it as Perfetto and chrome://tracing read it; returns it."""
    import jsonschema  # the dev extra

    text = Path(path).read_text(encoding="utf-8")
    trace = json.loads(text)
    jsonschema.validate(trace, TRACE_SCHEMA)
    # Perfetto's JSON tokenizer: traceEvents first, no \u escapes, no array as an event's own value
    assert text.startswith('{"traceEvents":['), text[:40]
    assert "\\u" not in text
    events = trace["traceEvents"]
    assert not [e for e in events if any(isinstance(v, list) for v in e.values())]
    timed = [e for e in events if e["ph"] != "M"]
    assert timed, "no events"
    assert all(e["ph"] == "M" for e in events[: len(events) - len(timed)]), "metadata events come first"
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed), "events are not in time order"
    meta = [e for e in events if e["ph"] == "M"]
    named_processes = {e["pid"] for e in meta if e["name"] == "process_name"}
    named_threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert all(e.get("tid") != 0 for e in events), "tid 0 is the idle thread's in Perfetto"
    assert {e["pid"] for e in timed} <= named_processes, "a process without a name"
    assert {(e["pid"], e["tid"]) for e in timed if e["ph"] == "X"} <= named_threads, "a track without a name"
    open_slices: dict[tuple[int, int], list[tuple[int, str]]] = {}  # track -> stack of (end ns, name)
    for e in timed:  # slices nest on each track as Perfetto reads them: a slice ends inside the one it starts in
        if e["ph"] != "X":
            continue
        start, end = perfetto_ns(e["ts"]), perfetto_ns(e["ts"]) + perfetto_ns(e["dur"])
        stack = open_slices.setdefault((e["pid"], e["tid"]), [])
        while stack and stack[-1][0] <= start:
            stack.pop()
        assert not stack or end <= stack[-1][0], f"{e} overlaps {stack[-1][1]!r} without nesting in it"
        stack.append((end, e["name"]))
    return trace


def perfetto_ns(us: float) -> int:
    """A trace's microseconds as Perfetto's JSON importer reads them: `int(value * 1000)`, truncated."""
    return int(us * 1000)


# ----------------------------------------------------------------------------------------------------
# Hugging Face datasets (converters/hf.py), built with the `datasets` library itself

# ClassLabel names, in the dataset's own (unsorted) order: a conversion must keep it, and the ids with it.
HF_CLASSES = ("moth", "ant", "zebra")
HF_METADATA = ["tags", "id", "name", "score", "odd", "note"]  # kept as metadata: JSON scalars and lists of them


def hf_row_ids(count: int) -> list[int]:
    """The solid sample id of each row of the HF test datasets: a fixed shuffle, so that row order is not the
    tree's order."""
    return [int(i) for i in np.random.default_rng(11).permutation(count)]


def hf_features(image: bool = True):
    from datasets import ClassLabel, Features, Image, Sequence, Value

    columns = {"image": Image()} if image else {"text": Value("string")}
    return Features({**columns, "label": ClassLabel(names=list(HF_CLASSES)),
                     "tags": Sequence(ClassLabel(names=list(HF_CLASSES))), "id": Value("int64"),
                     "name": Value("string"), "score": Value("float64"), "odd": Value("bool"),
                     "note": Value("string")})


def hf_dataset(tree: Tree, broken: dict[int, bytes | None] | None = None, paths: bool = False):
    """The solid `tree` as a `datasets.Dataset`: row r is solid sample `hf_row_ids(...)[r]`: its file's bytes in
    the Image column (`paths`: only its path, relative to the tree's root), its class (`solid_label`) as label, its
    `multi_labels` as tags and its `solid_metadata` columns. `broken` maps rows to other image bytes (None: a null
    image)."""
    from datasets import Dataset

    ids = hf_row_ids(len(tree.images))
    by_id = {solid_id_of_path(relative): relative for relative in tree.images}
    images = []
    for row, sample_id in enumerate(ids):
        relative = by_id[sample_id]
        if broken is not None and row in broken:
            images.append(None if broken[row] is None else {"bytes": broken[row], "path": None})
        elif paths:
            images.append({"bytes": None, "path": relative})
        else:
            images.append({"bytes": tree.path(relative).read_bytes(), "path": Path(relative).name})
    metadata = [solid_metadata(i) for i in ids]
    return Dataset.from_dict({"image": images, "label": [solid_label(i) for i in ids],
                              "tags": [list(multi_labels(i)) for i in ids],
                              **{name: [m[name] for m in metadata] for name in HF_METADATA if name != "tags"}},
                             features=hf_features())


@dataclass
class HfSources:
    """The solid tree as each kind of Hugging Face source (`write_hf_sources`)."""

    saved: Path  # save_to_disk of a Dataset, in 3 Arrow files
    saved_dict: Path  # save_to_disk of a DatasetDict: "train" (the first 4 rows) and "test" (all rows)
    parquet: Path  # a Hub-style folder: data/train-0000{0,1}-of-00002.parquet, row groups of 5 rows
    cache: Path  # a Hugging Face datasets cache holding the Hub dataset HUB_NAME (train: all rows)


HUB_NAME = "fastdata-tests/solid"


def write_hub_cache(cache: Path, name: str, data_files: dict[str, list[str]]) -> Path:
    """Place the Hub dataset `name` in the datasets cache `cache` as `datasets.load_dataset(name)` leaves it there
    (prepared by datasets' own Parquet builder from `data_files`), without the network."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    namespace, _, dataset = name.rpartition("/")
    builder = Parquet(cache_dir=str(cache / ".scratch"), dataset_name=dataset, data_files=data_files)
    builder.download_and_prepare(output_dir=str(cache / f"{namespace}___{dataset}" / "default" / "0.0.0" / "f00d"))
    shutil.rmtree(cache / ".scratch", ignore_errors=True)
    return cache


def write_hf_sources(tree: Tree, root: Path) -> HfSources:
    from datasets import DatasetDict

    ds = hf_dataset(tree)
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    DatasetDict({"train": ds.select(range(4)), "test": ds}).save_to_disk(str(root / "dict"))
    (root / "hub" / "data").mkdir(parents=True)
    parts = [str(root / "hub" / "data" / f"train-0000{i}-of-00002.parquet") for i in range(2)]
    for i, part in enumerate(parts):
        ds.shard(2, i, contiguous=True).to_parquet(part, batch_size=5)
    (root / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")
    write_hub_cache(root / "cache", HUB_NAME, {"train": parts})
    return HfSources(root / "saved", root / "dict", root / "hub", root / "cache")


# ----------------------------------------------------------------------------------------------------
# image-text pairs (fastdata convert pairs): captions that name their image's solid sample id

CAPTION_ID = re.compile(r"sample (\d+)\b")


def pair_caption(sample_id: int) -> str:
    """Solid sample `sample_id`'s caption: it names the id (`caption_id`); some are long (longer than a small
    `max_length` in tokens), some hold unicode."""
    caption = f"a photo of sample {sample_id}"
    if sample_id % 5 == 2:
        caption += " " + " ".join(WORDS[(sample_id + j) % len(WORDS)] for j in range(12))
    if sample_id % 7 == 3:
        caption += " " + UNICODE[sample_id % 2]
    return caption


def caption_id(caption: str) -> int:
    """The solid sample id a `pair_caption` names."""
    found = CAPTION_ID.search(caption)
    assert found is not None, caption
    return int(found.group(1))


def pairs_frame(tree: Tree, seed: int = 5):
    """A pandas DataFrame of the solid `tree`'s images in a shuffled order: `path` (tree-relative), `caption`
    (`pair_caption`) and a metadata column `id`."""
    import pandas as pd

    order = np.random.default_rng(seed).permutation(len(tree.images))
    rows = [{"path": tree.images[i], "caption": pair_caption(solid_id_of_path(tree.images[i])),
             "id": solid_id_of_path(tree.images[i])} for i in order]
    return pd.DataFrame(rows)


def pair_shard_sample(tree: Tree, relative: str, caption: str = "both") -> dict:
    """The solid image `relative` as img2dataset writes a sample: `.jpg`/`.png`, a `.json` ({"key", "url"}) and
    its caption: `caption="both"` a `.txt` and the .json "caption" (img2dataset's way), "txt" the `.txt` only,
    "json" the .json "caption" only."""
    sample_id = solid_id_of_path(relative)
    meta = {"key": f"{sample_id:09d}", "url": f"https://example.com/{sample_id}.jpg"}
    sample = {"__key__": wds_key(sample_id), relative.rsplit(".", 1)[1]: tree.path(relative).read_bytes()}
    if caption in ("both", "json"):
        meta["caption"] = pair_caption(sample_id)
    if caption in ("both", "txt"):
        sample["txt"] = pair_caption(sample_id)
    sample["json"] = meta
    return sample


def clip_like_tokenizer(path: Path, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer.json whose post-processor wraps every text in `<|startoftext|>` ...
    `<|endoftext|>`, as CLIP's does (no padding token: padding falls back to the end-of-text token)."""
    from tokenizers import Tokenizer, processors

    train_bytelevel(path, texts, vocab=500, specials=("<|startoftext|>", "<|endoftext|>"))
    tok = Tokenizer.from_file(str(path))
    start, end = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", start), ("<|endoftext|>", end)])
    tok.save(str(path))
    return path


def reference_rows(tokenizer_file: Path, captions: list[str], max_length: int) -> tuple[list, list]:
    """(input_ids, attention_mask) of `captions` as the `tokenizers` library itself truncates and pads them to
    `max_length` (padding with the end-of-text token)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.enable_truncation(max_length)
    tok.enable_padding(length=max_length, pad_id=tok.token_to_id("<|endoftext|>"), pad_token="<|endoftext|>")
    encodings = tok.encode_batch(captions)
    return [e.ids for e in encodings], [e.attention_mask for e in encodings]


# COCO instances files (converters/coco.py), written as users have them: a JSON dict of images, annotations and
# categories over image files, masks as polygons (several parts), compressed RLE and uncompressed RLE (crowds)

# category ids are not contiguous and not in order: the contiguous labels are their ranks (car 0, train 1, zebra 2)
COCO_CATEGORIES = [{"id": 90, "name": "zebra", "supercategory": "animal"},
                   {"id": 3, "name": "car", "supercategory": "vehicle"},
                   {"id": 7, "name": "train", "supercategory": "vehicle"}]
COCO_CLASSES = ["car", "train", "zebra"]
# (image id, file_name, width, height, kind): ids not contiguous, names in sub-folders, one image without annotations
COCO_IMAGES = [(101, "train/000101.jpg", 64, 48, "jpeg"), (7, "train/sub/000007.png", 40, 56, "png"),
               (55, "val/000055.jpg", 50, 50, "jpeg"), (3, "000003.png", 33, 41, "png"),
               (200, "empty.jpg", 30, 20, "jpeg")]


@dataclass
class CocoFiles:
    """A written COCO source: the annotation file, the images folder, and the dict the file holds."""

    annotations: Path
    images: Path
    data: dict


def uncompressed_rle(binary: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts of a 0/1 [H, W] mask: run lengths in column-major order, zeros first."""
    flat = binary.flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [len(flat)]])
    counts = np.diff(bounds).tolist()
    return [0, *counts] if flat[0] else counts


def _polygon_area(polygon: list[float]) -> float:
    xs, ys = np.array(polygon[0::2]), np.array(polygon[1::2])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def _polygon_box(polygons: list[list[float]]) -> list[float]:
    xs = [v for p in polygons for v in p[0::2]]
    ys = [v for p in polygons for v in p[1::2]]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


def coco_dict(masks: bool = True) -> dict:
    """The instances dict of the COCO test source (see COCO_*): per image a few annotations of each kind, listed out
    of image order; `masks=False`: boxes only (no segmentation)."""
    from pycocotools import mask

    annotations = []
    next_id = iter(range(1000, 100000, 13))
    for number, (image_id, _, width, height, _) in enumerate(COCO_IMAGES[:-1]):
        triangle = [1.0 + number, 2.0, width - 3.5, 4.0, width / 2, height - 2.0]
        parts = [[2.0, 2.0, 10.0, 2.0, 10.0, 9.0, 2.0, 9.0], [12.5, 12.0, 20.0, 12.0, 16.0, 19.5]]
        for category, polygons in ((COCO_CATEGORIES[number % 3]["id"], [triangle]), (3, parts)):
            annotations.append({"id": next(next_id), "image_id": image_id, "category_id": category, "iscrowd": 0,
                                "segmentation": polygons, "area": sum(_polygon_area(p) for p in polygons),
                                "bbox": _polygon_box(polygons)})
        binary = np.zeros((height, width), np.uint8)
        binary[height // 3:height - 2, width // 4: width // 4 + 7 + number] = 1
        binary[height - 4:, :3] = 1
        rle = mask.encode(np.asfortranarray(binary))
        counts: Any = uncompressed_rle(binary) if number % 2 else rle["counts"].decode("ascii")
        annotations.append({"id": next(next_id), "image_id": image_id, "category_id": 7, "iscrowd": 1,
                            "segmentation": {"size": [height, width], "counts": counts},
                            "area": float(mask.area(rle)), "bbox": mask.toBbox(rle).tolist()})
    # a box reaching half a pixel past the right edge: within the tolerance, kept as given
    first = COCO_IMAGES[0]
    annotations.append({"id": 7, "image_id": first[0], "category_id": 90, "iscrowd": 0, "area": 40.0,
                        "segmentation": [[first[2] - 8.0, 1.0, first[2] + 0.5, 1.0, first[2] + 0.5, 6.0]],
                        "bbox": [first[2] - 8.0, 1.0, 8.5, 5.0]})
    annotations = annotations[1::2] + annotations[0::2]  # not grouped by image
    if not masks:
        for ann in annotations:
            del ann["segmentation"]
    images = [{"id": i, "file_name": name, "width": w, "height": h, "license": 1} for i, name, w, h, _ in COCO_IMAGES]
    return {"info": {"description": "fastdata test"}, "licenses": [], "images": images, "annotations": annotations,
            "categories": [dict(c) for c in COCO_CATEGORIES]}


def write_coco(root: Path, data: dict | None = None, name: str = "instances.json") -> CocoFiles:
    """Write the COCO test images under `root/images` (pixels: `pattern(image id)`) and `data` (default
    `coco_dict()`) as `root/name`."""
    data = coco_dict() if data is None else data
    images = root / "images"
    for image_id, file_name, width, height, kind in COCO_IMAGES:
        if not (images / file_name).exists():
            write_image(images / file_name, pattern(image_id, width, height), kind)
    path = root / name
    path.write_text(json.dumps(data))
    return CocoFiles(path, images, data)


# A COCO source for detection loading: every image a background whose green encodes its position in the list
# (RECT_GREEN0 + RECT_GREEN_STEP * number; red always RECT_BACKGROUND_RED, blue 200) with one filled red rectangle,
# annotated by its box and polygon (pixel edges), and a second, smaller box elsewhere; JPEGs and PNGs of odd sizes
# alternate; ids not contiguous; the last image has no annotations.
RECT_GREEN0, RECT_GREEN_STEP, RECT_BACKGROUND_RED = 30, 9, 40


def rect_image_id(number: int) -> int:
    return 1000 + 3 * number


def rect_of(number: int, width: int, height: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of image `number`'s red rectangle (pixel edges): a quarter of each side, even edges."""
    x0, y0 = (width // 4 + number % 3) // 2 * 2, height // 3 // 2 * 2
    return x0, y0, x0 + max(4, width // 4) // 2 * 2, y0 + max(4, height // 4) // 2 * 2


def rect_size(number: int) -> tuple[int, int]:
    return 40 + (number * 7) % 50, 30 + (number * 11) % 40


def rect_picture(number: int, rectangle: bool = True) -> np.ndarray:
    width, height = rect_size(number)
    image = np.empty((height, width, 3), np.uint8)
    image[...] = (RECT_BACKGROUND_RED, RECT_GREEN0 + RECT_GREEN_STEP * number, 200)
    if rectangle:
        x0, y0, x1, y1 = rect_of(number, width, height)
        image[y0:y1, x0:x1] = (255, 0, 0)
    return image


def rect_number_of(green: float) -> int:
    """The list position an image's background green encodes."""
    return round((green - RECT_GREEN0) / RECT_GREEN_STEP)


def write_coco_rectangles(root: Path, count: int = 23) -> CocoFiles:
    """Write the rectangles COCO source (see RECT_*) of `count` images under `root`."""
    images, annotations = [], []
    ann_id = iter(range(5, 10**6, 7))
    for number in range(count):
        width, height = rect_size(number)
        kind = "png" if number % 2 else "jpeg"
        name = f"img/{number:03d}.{'png' if kind == 'png' else 'jpg'}"
        write_image(root / "images" / name, rect_picture(number, number < count - 1), kind)
        image_id = rect_image_id(number)
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        if number == count - 1:
            continue
        x0, y0, x1, y1 = rect_of(number, width, height)
        polygon = [float(v) for v in (x0, y0, x1, y0, x1, y1, x0, y1)]
        annotations.append({"id": next(ann_id), "image_id": image_id, "category_id": 1, "iscrowd": 0,
                            "segmentation": [polygon], "area": float((x1 - x0) * (y1 - y0)),
                            "bbox": [x0, y0, x1 - x0, y1 - y0]})
        small = [2.0, 2.0, 8.0, 2.0, 8.0, 6.0, 2.0, 6.0]
        annotations.append({"id": next(ann_id), "image_id": image_id, "category_id": 2, "iscrowd": 0,
                            "segmentation": [small], "area": 24.0, "bbox": [2.0, 2.0, 6.0, 4.0]})
    data = {"images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "rectangle"}, {"id": 2, "name": "corner"}]}
    path = root / "instances.json"
    path.write_text(json.dumps(data))
    return CocoFiles(path, root / "images", data)


# ----------------------------------------------------------------------------------------------------
# semantic segmentation lists (fastdata convert list --mask-column): images with PNG label maps, written with PIL

SEG_COUNT = 9
SEG_CLASSES = 21  # VOC's
SEG_IGNORE = 255


def seg_ids(sample_id: int, width: int, height: int, wide: bool = False) -> np.ndarray:
    """Sample `sample_id`'s label map: class ids that depend on the sample and the pixel, with an ignore-index
    border (VOC-like); `wide`: uint16 ids up to ~1000."""
    y, x = np.mgrid[0:height, 0:width]
    if wide:
        return ((x * 37 + y * 11 + sample_id * 101) % 1000).astype(np.uint16)
    ids = ((x // 3 + y // 2 + sample_id) % SEG_CLASSES).astype(np.uint8)
    ids[0, :] = SEG_IGNORE
    return ids


def write_label_map(path: Path, ids: np.ndarray, mode: str = "L") -> Path:
    """`ids` saved as a PNG label map: "L" (8-bit greyscale), "P" (palette indices = ids, VOC's colours),
    "I;16" (16-bit greyscale), "RGB" (a colour map: ids as red), "JPEG" (a lossy 8-bit map)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "P":
        image = Image.fromarray(ids, mode="P")
        image.putpalette([(i * 67 + c * 29) % 256 for i in range(256) for c in range(3)])
    elif mode == "I;16":
        image = Image.frombytes("I;16", (ids.shape[1], ids.shape[0]), ids.astype("<u2").tobytes())
    elif mode == "RGB":
        image = Image.fromarray(np.stack([ids, ids * 0, ids * 0], axis=-1).astype(np.uint8))
    else:
        image = Image.fromarray(ids.astype(np.uint8), mode="L")
    image.save(path, "JPEG" if mode == "JPEG" else "PNG")
    return path


def seg_size(sample_id: int) -> tuple[int, int]:
    return 19 + 2 * sample_id, 13 + sample_id  # odd sizes, one per sample


def build_segmentation_list(root: Path, suffix: str = ".csv", wide: bool = False, labels: bool = False):
    """Images `img/sNN.png` (the solid pattern of their sample id) with label maps `ann/sNN.png` (mode "L" and
    "P" alternating; all "I;16" when `wide`), listed in a shuffled order by a `suffix` list file written with
    pandas: columns `path`, `mask`, `note` (and `label`, a class name, with `labels`). Returns (list path, frame)."""
    import pandas as pd

    rows = []
    for sample_id in np.random.default_rng(3).permutation(SEG_COUNT).tolist():
        width, height = seg_size(sample_id)
        Image.fromarray(solid_pattern(sample_id, width, height)).save(_mkdir(root / f"img/s{sample_id:02d}.png"))
        mode = "I;16" if wide else ("P" if sample_id % 2 else "L")
        write_label_map(root / f"ann/s{sample_id:02d}.png", seg_ids(sample_id, width, height, wide), mode)
        row = {"path": f"img/s{sample_id:02d}.png", "mask": f"ann/s{sample_id:02d}.png", "note": f"n{sample_id}"}
        if labels:
            row["label"] = ("indoor", "outdoor")[sample_id % 2]
        rows.append(row)
    frame = pd.DataFrame(rows)
    return write_list(frame, root / f"list{suffix}"), frame


def _mkdir(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------------
# segmentation rectangles (fastdata convert list --mask-column): the rectangles' pictures (rect_picture: the
# background's green encodes the list position, a red rectangle) as JPEGs and PNGs alternating, each with a label
# map holding SEG_RECT_CLASS over exactly the rectangle's pixels and SEG_BACKGROUND0 + number elsewhere

SEG_RECT_CLASS, SEG_BACKGROUND0 = 7, 30


def seg_rect_ids(number: int) -> np.ndarray:
    """Picture `number`'s label map: its own background class, the rectangle's class over the red pixels."""
    width, height = rect_size(number)
    ids = np.full((height, width), SEG_BACKGROUND0 + number, np.uint8)
    x0, y0, x1, y1 = rect_of(number, width, height)
    ids[y0:y1, x0:x1] = SEG_RECT_CLASS
    return ids


def build_segmentation_rects(root: Path, count: int = 23) -> Path:
    """Write the segmentation rectangles source (see SEG_RECT_CLASS) of `count` samples under `root`; returns its
    CSV list (columns `path`, `mask`)."""
    import pandas as pd

    rows = []
    for number in range(count):
        kind = "png" if number % 2 else "jpeg"
        name = f"img/{number:03d}.{'png' if kind == 'png' else 'jpg'}"
        write_image(root / name, rect_picture(number), kind)
        write_label_map(root / f"ann/{number:03d}.png", seg_rect_ids(number))
        rows.append({"path": name, "mask": f"ann/{number:03d}.png"})
    return write_list(pd.DataFrame(rows), root / "list.csv")


# ----------------------------------------------------------------------------------------------------
# many-sample datasets written straight through the storage writers (start-up at scale)


def _commit_written(manifest, partial: Path, out: Path) -> Path:
    (partial / "progress.json").unlink(missing_ok=True)
    manifest.write(partial)
    partial.rename(out)
    return out


def write_many_images(out: Path, count: int, fmt: str = "lmdb", classes: int = 10) -> Path:
    """`count` samples of one tiny JPEG (sample i: key `c{label}/{i}.jpg`, label i % classes), written by the
    storage writer of `fmt` with a manifest: a real dataset of many samples in well under a second per 10k."""
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.records import CODEC_CV_JPEG, ImageRecord
    from fastdata.formats.registry import WriterOptions, storage

    data = encode(pattern(0, 8, 8), "JPEG")
    partial = out.with_name(out.name + ".partial")
    writer = storage("image", fmt).open_writer(partial, WriterOptions())
    for i in range(count):
        writer.add(ImageRecord(f"c{i % classes}/{i}.jpg", data, "jpg", i % classes, 8, 8, CODEC_CV_JPEG))
    files = writer.close()
    counts = np.bincount(np.arange(count) % classes, minlength=classes).tolist()
    return _commit_written(Manifest(format=fmt, kind="image", num_samples=count,
                                    classes=[f"c{c}" for c in range(classes)], class_counts=counts, files=files),
                           partial, out)


def many_document(index: int) -> np.ndarray:
    """Document `index` of `write_many_documents`: 1..9 token ids that encode its index (ids 2..257)."""
    return (2 + (index + np.arange(1 + index % 9)) % 256).astype(np.uint16)


def write_many_documents(out: Path, count: int, fmt: str = "lmdb", **writer_options) -> Path:
    """`count` short documents (`many_document`), written by the text storage writer of `fmt` with a manifest
    (end-of-text id 0)."""
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.registry import WriterOptions, storage

    partial = out.with_name(out.name + ".partial")
    writer = storage("text", fmt).open_writer(partial, WriterOptions(dtype=np.dtype("<u2"), **writer_options))
    total = longest = 0
    for i in range(count):
        doc = many_document(i)
        writer.add(doc)
        total, longest = total + len(doc), max(longest, len(doc))
    files, layout = writer.close()
    text = {"dtype": "uint16", "documents": count, "total_tokens": total, "max_document_tokens": longest,
            "vocab_size": 258, "eos_token": "<eos>", "eos_token_id": 0, "pad_token": None, "pad_token_id": None,
            **layout}
    return _commit_written(Manifest(format=fmt, kind="text", num_samples=count, classes=[], class_counts=[],
                                    files=files, text=text), partial, out)
