"""Pictures whose pixels encode the sample id, and the ImageFolder trees made of them.

Two trees are used throughout:

- the *tricky* tree: nested sub-folders (one with a dot in its name), mixed-case extensions, files with
  several dots, two files with the same stem, JPEG (RGB, L, CMYK), PNG (RGB, L, P, RGBA, LA), BMP, and
  non-image files that ImageFolder ignores;
- the *solid* tree: 45 images in 3 classes whose green channel is a constant that encodes the sample id
  (`G = id * GREEN_STEP`) while red/blue are gradients, so that any crop, resize or flip still tells which
  sample it came from, while the augmentation itself is visible in red/blue.

Also here: photo-like pictures of odd shapes, JPEGs of every chroma sampling, large, non-UTF-8 and bad trees.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

GREEN_STEP = 5

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
