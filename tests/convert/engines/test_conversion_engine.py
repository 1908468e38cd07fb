"""The image conversion engine (`fastdata.convert.engines.pool`, `fastdata.convert.image_work`): every per-sample
step in the workers, which start without torch; the writer's laid-out records byte for byte what it writes from a
record; chunks sized from the measured cost; a worker that dies or raises ends the conversion with the reason;
ImageFolder listed exactly as torchvision lists it, without importing it."""

from __future__ import annotations

import io
import os
import tarfile
import textwrap

import numpy as np
import pytest
from builders.images import build_solid_tree
from builders.runs import run_python
from fastdata.converters.imagefolder import scan
from torchvision.datasets.folder import find_classes, make_dataset

from fastdata.convert.engines.pool import ChunkSizer
from fastdata.convert.images import convert_images
from fastdata.convert.options import ImageConversionOptions
from fastdata.convert.sources import FileReader
from fastdata.errors import WorkerError
from fastdata.formats.records import IMAGE_EXTENSIONS, ImageRecord
from fastdata.formats.tar_shards import tar_members
from fastdata.formats.wds import WdsWriter


def test_conversion_workers_and_their_parent_never_import_torch(tmp_path):
    """A fresh `python` converts with 2 forked workers; the reader records, in each worker, whether torch (or
    torchvision) is loaded, and the parent says the same of itself afterwards."""
    tree = build_solid_tree(tmp_path / "src", count=12)
    program = textwrap.dedent("""
        import os, sys
        from fastdata.convert.sources import FileReader
        from fastdata.converters import imagefolder

        class Spy(FileReader):
            def read(self, key):
                heavy = sorted(m for m in ("torch", "torchvision") if m in sys.modules)
                with open(sys.argv[2], "a") as log:
                    log.write(f"{os.getpid()} {','.join(heavy) or '-'}\\n")
                return super().read(key)

        listing = imagefolder.scan(sys.argv[1])
        listing.reader = Spy(listing.root)
        from fastdata.convert.images import convert_images
        from fastdata.convert.options import ImageConversionOptions
        convert_images(lambda: listing, sys.argv[3], ImageConversionOptions(workers=2, progress=False))
        print("parent", os.getpid(), "torch" in sys.modules, "torchvision" in sys.modules)
    """)
    log = tmp_path / "modules.log"
    done = run_python(program, tree.root, log, tmp_path / "out.lmdb")
    assert done.returncode == 0, done.stderr
    _, parent, torch_loaded, torchvision_loaded = done.stdout.split()
    assert (torch_loaded, torchvision_loaded) == ("False", "False")
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 12 and {heavy for _, heavy in lines} == {"-"}
    assert parent not in {pid for pid, _ in lines}  # the reading was done in the workers


def _tree_with_every_case(root):
    """Nested folders, a symlinked folder, mixed-case extensions, non-image files, an empty class, a file at the
    top."""
    for relative in ("b/x.JPG", "b/sub/deeper/y.png", "b/sub/a.jpeg", "a/z.webp", "a/readme.txt", "a/q.Tiff",
                     "c_empty/notes.md", "top.jpg", "b/sub2/k.bmp"):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (root / "d").mkdir()
    os.symlink(root / "b" / "sub", root / "d" / "linked")
    return root


def test_imagefolder_listing_is_torchvisions(tmp_path, tricky_tree):
    import shutil

    from fastdata.errors import SourceError

    for root in (_tree_with_every_case(tmp_path / "cases"), tricky_tree.root):
        not_classes = [p for p in root.iterdir() if p.is_dir() and any(p.rglob("*")) and not any(
            f.name.lower().endswith(IMAGE_EXTENSIONS) for f in p.rglob("*"))]
        if not_classes:  # files but no image: refused, as torchvision's default (allow_empty=False) refuses it
            _, class_to_idx = find_classes(str(root))
            with pytest.raises(FileNotFoundError):
                make_dataset(str(root), class_to_idx, IMAGE_EXTENSIONS)
            with pytest.raises(SourceError, match="files but no image file"):
                scan(root)
            for folder in not_classes:
                shutil.rmtree(folder)
        classes, class_to_idx = find_classes(str(root))
        expected = [(os.path.relpath(path, root).replace(os.sep, "/"), label)
                    for path, label in make_dataset(str(root), class_to_idx, IMAGE_EXTENSIONS, allow_empty=True)]
        listing = scan(root)
        assert listing.classes == classes
        assert listing.samples == expected and len(expected) > 4


def _record(key: str, **fields) -> ImageRecord:
    return ImageRecord(key, fields.pop("data", b"\xff\xd8 image bytes"), "jpg", fields.pop("label", 3), 7, 5, 0,
                       **fields)


def test_laid_out_tar_members_are_what_tarfile_writes():
    """Headers, payloads and padding as `TarFile.addfile` writes them: plain names (the patched ustar template),
    names of exactly 100 and 101 characters, long and non-ASCII names (PAX headers)."""
    members = [("a/" + "long" * 40 + ".jpg", b"x" * 1000), ("ü/naïve.json", b"{}"), ("odd\udcff.cls", b"12"),
               ("empty.txt", b""), ("n01440764/n01440764_10026.jpg", b"y" * 53_117), ("k" * 100, b"z" * 512),
               ("k" * 101, b"z" * 513), ("plain/name with spaces.cls", b"7")]
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o444, 0
            tar.addfile(info, io.BytesIO(payload))
    laid = tar_members(members)
    assert expected.getvalue()[: len(laid)] == laid
    assert not expected.getvalue()[len(laid):].strip(b"\0")  # what follows is the end-of-archive padding


def test_a_laid_out_sample_whose_key_is_taken_is_renamed(tmp_path):
    """Two paths that sanitize to the same key: the second sample's members get the next free key, as `add` of the
    records themselves gives them."""
    records = [_record("a/x.jpg", label=1), _record("a/x.png", label=2, metadata={"k": 1}),
               _record("a/x_jpg.jpg", label=3), _record("a/x.jpeg", label=4, caption="a cat",
                                                        tokens=np.array([5, 6], dtype=np.uint16))]
    shards = []
    for laid in (False, True):
        writer = WdsWriter(tmp_path / f"laid{laid}", shard_size=1 << 20)
        for record in records:
            writer.add(writer.lay_out(record) if laid else record)
        shards.append((writer.close()[0].sha256, writer.directory / "shard-000000.tar"))
    assert shards[0][0] == shards[1][0]
    with tarfile.open(shards[1][1]) as tar:
        names = tar.getnames()
    assert [n for n in names if n.endswith(".json")] == ["a/x.json", "a/x_1.json", "a/x_jpg.json", "a/x_2.json"]


def test_chunks_follow_the_measured_cost_and_end_together():
    sizer = ChunkSizer(workers=4, target_seconds=0.05, probe=2, largest=1000)
    assert sizer.next_size(10_000) == 2  # nothing measured yet: a probe
    sizer.observe(2, 0.002)  # 1 ms an item
    assert sizer.next_size(10_000) == 50
    assert sizer.next_size(40) == 5  # the last items: an even share of what is left for 4 workers x 2 chunks
    sizer.observe(100, 10.0)  # slow items (about 0.1 s each): one at a time
    assert sizer.next_size(10_000) == 1
    fast = ChunkSizer(workers=2, target_seconds=0.05, largest=64)
    fast.observe(1000, 0.001)
    assert fast.next_size(10_000) == 64


class _DyingReader(FileReader):
    """Kills the worker process that reads `victim` (as an out-of-memory kill would)."""

    def __init__(self, root, victim: str) -> None:
        super().__init__(root)
        self.victim = victim

    def read(self, key: str) -> bytes:
        if key == self.victim:
            os.kill(os.getpid(), 9)
        return super().read(key)


class _BrokenReader(_DyingReader):
    """Raises a bug-like error (not an OSError, which would reject the sample) on `victim`."""

    def read(self, key: str) -> bytes:
        if key == self.victim:
            raise KeyError(f"no row for {key}")
        return super(_DyingReader, self).read(key)


def test_a_worker_that_dies_or_raises_ends_the_conversion_with_the_reason(tmp_path):
    tree = build_solid_tree(tmp_path / "src", count=20)
    listing = scan(tree.root)
    victim = listing.samples[7][0]
    listing.reader = _DyingReader(tree.root, victim)
    with pytest.raises(WorkerError, match=r"conversion worker \(pid \d+\) died \(killed by signal 9\) while working "
                                          r"on write positions \d+\.\.\d+"):
        convert_images(lambda: listing, tmp_path / "dead.lmdb", ImageConversionOptions(workers=2, progress=False))
    listing.reader = _BrokenReader(tree.root, victim)
    with pytest.raises(KeyError, match="no row for"):  # the worker's own exception, raised in the parent
        convert_images(lambda: listing, tmp_path / "broken.lmdb", ImageConversionOptions(workers=2, progress=False))


def test_the_summary_reports_rates_and_the_writers_wait(tmp_path):
    tree = build_solid_tree(tmp_path / "src", count=10)
    summary = convert_images(lambda: scan(tree.root), tmp_path / "o.lmdb",
                             ImageConversionOptions(workers=2, progress=False))
    assert 0 <= summary.writer_waited <= 1 and "of the writing time" in str(summary)
    assert "images/s" in str(summary) and "MB/s, the writer waited for the workers" in str(summary)
