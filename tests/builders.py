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

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import numpy as np
from PIL import Image

import fastdata
from fastdata.cli import main

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


def build_solid_tree(root: Path, count: int = SOLID_COUNT) -> Tree:
    """`count` images in 3 classes, id encoded in the green channel (see `solid_pattern`). Sizes vary
    (21..69 px, odd); every third image is a 4:4:4 quality-100 JPEG, the rest PNG."""
    tree = Tree(root)
    rng = np.random.default_rng(1234)
    for sample_id in range(count):
        width, height = (int(v) * 2 + 1 for v in rng.integers(10, 35, size=2))
        name = SOLID_CLASSES[solid_label(sample_id)]
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
    6 batches an epoch, the last one short), overridden by `options`."""
    settings = dict(batch_size=8, augment="train", image_size=16, num_workers=0, seed=7)
    settings.update(options)
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
