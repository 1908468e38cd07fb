"""WebDataset shards assembled by processes of their own: the conversion's parent only says where each sample's
bytes go (a place in the shared memory a worker's chunk came in, and a place in the shard), and the shards are the
very bytes, digests and boundaries of a writer that copies every byte itself."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import tarfile

import pytest
from builders.images import build_photo_tree

import fastdata
from fastdata.convert.engines import assembly as assembly_module
from fastdata.convert.engines.assembly import ShardAssembly
from fastdata.convert.engines.messages import OUT_OF_BAND_MIN, SharedMemory, out_of_band, receive, send
from fastdata.errors import WorkerError
from fastdata.formats.tar_shards import PENDING, ShardWriter, tar_members, tar_trailer

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="shared memory files (memfd) are Linux's")


def _samples(count: int, seed: int = 5) -> list[bytes]:
    """Samples laid out as a worker lays them out; some small enough to travel inside the pickle."""
    rng = random.Random(seed)
    sizes = [rng.choice([300, 1500, OUT_OF_BAND_MIN + 10, 9000, 20000]) for _ in range(count)]
    return [tar_members([(f"s{i:04d}.jpg", rng.randbytes(size)), (f"s{i:04d}.cls", b"3")])
            for i, size in enumerate(sizes)]


def _send_chunks(conn, chunks: list[list[bytes]]) -> None:
    for chunk in chunks:
        send(conn, out_of_band(chunk))
    conn.close()


def _received_chunks(chunks: list[list[bytes]]) -> list[tuple[list, SharedMemory | None]]:
    """`chunks` as the conversion parent receives them from a forked worker: each with its shared memory."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=True)
    process = context.Process(target=_send_chunks, args=(theirs, chunks))
    process.start()
    theirs.close()
    got = []
    for _ in chunks:
        shared: list[SharedMemory] = []
        got.append((receive(ours, bytearray(), shared), shared[0] if shared else None))
    process.join(10)
    ours.close()
    return got


def _write(directory, chunks, shard_size: int, assembly: ShardAssembly | None) -> list:
    return _feed(ShardWriter(directory, shard_size, assembly=assembly), chunks)


def _feed(writer: ShardWriter, chunks) -> list:
    """Every sample of `chunks` (as `_received_chunks` gives them) into `writer`, then close it."""
    for blobs, shared in chunks:
        for blob in blobs:
            writer.append_blob(blob, shared)
            writer.sample_done()
    return writer.close()


def test_tar_trailer_is_what_tarfile_writes(tmp_path):
    for size in [0, 512, 9728, 10240, 10752, 123 * 512]:
        path = tmp_path / f"{size}.tar"
        with open(path, "wb") as file, tarfile.open(fileobj=file, mode="w", format=tarfile.PAX_FORMAT) as tar:
            if size:
                tar.addfile(tarfile.TarInfo("x"), None)  # a header block; then the rest of `size` as data
                file.write(bytes(size - 512))
                tar.offset = size
        assert path.read_bytes()[size:] == tar_trailer(size)


@pytest.mark.parametrize(("processes", "hash_step"), [(1, None), (3, None), (1, 1), (3, 1), (2, 7_000)])
def test_assembled_shards_are_the_bytes_a_writer_copying_them_writes(tmp_path, monkeypatch, processes, hash_step):
    if hash_step is not None:  # shards hashed as they grow (by every run written, or every few), not at their end
        monkeypatch.setattr(assembly_module, "_HASH_STEP", hash_step)
    samples = _samples(160)
    sizes = [1, 7, 2, 40, 1, 1, 13, 30, 25, 40]  # samples per chunk, as workers hand them back
    chunks, start = [], 0
    for size in sizes:
        chunks.append(samples[start:start + size])
        start += size
    assert start == len(samples)
    shard_size = 60_000  # shards begin and end inside chunks, and chunks span shards
    copied = _write(tmp_path / "copied", [(chunk, None) for chunk in chunks], shard_size, None)
    received = _received_chunks(chunks)
    assert any(shared is not None for _, shared in received)
    assert any(isinstance(blob, bytes) for blobs, _ in received for blob in blobs)  # small ones came in the pickle
    with ShardAssembly(processes).start() as assembly:
        assembled = _write(tmp_path / "assembled", received, shard_size, assembly)
    assert len(copied) > 5
    assert [(e.name, e.bytes, e.sha256, e.samples) for e in assembled] == \
        [(e.name, e.bytes, e.sha256, e.samples) for e in copied]
    for entry in assembled:
        data = (tmp_path / "assembled" / entry.name).read_bytes()
        assert data == (tmp_path / "copied" / entry.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    assert sorted(p.name for p in (tmp_path / "assembled").iterdir()) == [e.name for e in copied]  # no .tmp left


def test_a_checkpoint_listing_a_shard_waits_for_its_digest(tmp_path):
    chunks = _received_chunks([_samples(12)])
    with ShardAssembly(1).start() as assembly:
        writer = ShardWriter(tmp_path, 30_000, assembly=assembly)
        blobs, shared = chunks[0]
        for blob in blobs:
            writer.append_blob(blob, shared)
            writer.sample_done()
            if writer.checkpoint_due():
                names = [e.name for e in writer.finished_shards]
                writer.checkpoint(("[" + ",".join(f'"{PENDING}{n}"' for n in names) + "]").encode())
                if (tmp_path / "progress.json").exists():  # a checkpoint on disk never lacks a digest
                    assert PENDING not in (tmp_path / "progress.json").read_text()
        entries = writer.close()
    progress = (tmp_path / "progress.json").read_text()
    assert len(entries) > 2
    assert PENDING not in progress
    # the last checkpoint lists every shard but the one close() finished
    assert all(e.sha256 in progress for e in entries[:-1]) and entries[-1].sha256 not in progress


def test_a_shard_that_cannot_be_written_is_named(tmp_path):
    chunks = _received_chunks([_samples(6)])
    with pytest.raises(WorkerError, match=r"shard-000000\.tar: writing the shard failed: .*run the same command"), \
            ShardAssembly(1).start() as assembly:
        writer = ShardWriter(tmp_path, 1 << 30, assembly=assembly)
        writer.append_blob(b"x" * 512)  # the shard's .tmp exists now; make it a directory, which cannot be written
        os.unlink(tmp_path / "shard-000000.tar.tmp")
        os.mkdir(tmp_path / "shard-000000.tar.tmp")
        _feed(writer, chunks)


def test_a_killed_assembler_is_reported(tmp_path):
    chunks = _received_chunks([_samples(6)])
    assembly = ShardAssembly(1).start()
    with pytest.raises(WorkerError, match=r"a process writing WebDataset shards \(pid \d+\) died \(killed by "
                                          r"signal 9\)"), assembly:
        os.kill(assembly._workers[0].pid, signal.SIGKILL)
        _feed(ShardWriter(tmp_path, 1 << 30, assembly=assembly), chunks)


def test_conversion_with_workers_gives_the_shards_of_one_worker(tmp_path):
    """The whole conversion: 2 workers (shards assembled elsewhere) against 1 (the parent writes), photos large
    enough to come through shared memory and small ones that come in the pickle, and two paths that sanitize to
    the same key (the later one's members renamed in the parent)."""
    tree = build_photo_tree(tmp_path / "src")
    photo = (tree.root / "jpeg" / "landscape.jpg").read_bytes()
    for name in ("x y.jpg", "x_y.jpg", "x?y.jpg"):
        (tree.root / "jpeg" / name).write_bytes(photo)
    results = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        summary = fastdata.convert_imagefolder(
            tree.root,
            out,
            fastdata.ImageFolderOptions(format="wds", shard_size="64KB", workers=workers, progress=False),
        )
        results[workers] = [(f.name, f.bytes, f.sha256, f.samples) for f in fastdata.info(out).files]
        assert summary.images == sum(f[3] for f in results[workers]) == len(tree.images) + 3
    assert len(results[1]) > 3
    assert results[2] == results[1]
