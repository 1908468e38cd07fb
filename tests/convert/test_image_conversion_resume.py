"""Crash-safe, resumable conversion: a conversion killed with SIGKILL at any point leaves nothing that opens as
a dataset, and rerunning the same command resumes and gives what an uninterrupted conversion gives."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from builders.images import Tree, build_large_tree, build_solid_tree
from builders.runs import KILL_WHEN, assert_one_line_error, cli

import fastdata
from fastdata.errors import IncompleteDatasetError, OutputExistsError, StagingDamagedError
from fastdata.formats.manifest import partial_path

COUNT = 40
LARGE_COUNT = 120

# Runs a conversion in a child process that SIGKILLs itself at a chosen point inside the writer: a real,
# abrupt kill (no cleanup, no atexit), placed deterministically.
KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    src, out, fmt, where, at, workers = sys.argv[1:7]
    at, workers = int(at), int(workers)

    writer = L.LmdbWriter if fmt == "lmdb" else W.WdsWriter
    if where == "add":          # before the record number `at` is added
        kill_when(writer, "add", lambda self: self.count == at)
    elif where == "checkpoint":  # right before the checkpoint number `at` is recorded
        calls = []
        kill_when(writer, "checkpoint", lambda self: calls.append(1) or len(calls) == at)
    elif where == "close":       # after every record, before the data is finalised
        kill_when(writer, "close", lambda self: True)
    elif where == "manifest":    # data complete, manifest not yet written
        import fastdata.formats.manifest as M
        kill_when(M.Manifest, "write", lambda self: True)
    fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(
        format=None if fmt == "lmdb" else "wds", shard_size="3KB", workers=workers, commit_every=4, progress=False))
""")


def killed_conversion(src: Path, out: Path, fmt: str, where: str, at: int = 0, workers: int = 1) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out), fmt, where, str(at), str(workers)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def contents(out: Path) -> list[tuple[str, int, str]]:
    """(source path, label, sha256 of the pixels) of every sample, in path order (WDS is stored shuffled)."""
    ds = fastdata.dataset(out)
    items = []
    if hasattr(ds, "reader"):
        for i in range(len(ds)):
            image, label = ds[i]
            items.append((ds.reader.key(i), label, hashlib.sha256(image.numpy().tobytes()).hexdigest()))
    else:
        for sample in ds.encoded_samples(list(range(len(ds.shards)))):
            items.append((sample.key, sample.label, hashlib.sha256(sample.data).hexdigest()))
    return sorted(items)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("resume") / "src", count=COUNT)


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    refs = {}
    for fmt, name in (("lmdb", "ref.lmdb"), ("wds", "ref-shards")):
        out = root / name
        fastdata.convert_imagefolder(
            tree.root,
            out,
            fastdata.ImageFolderOptions(
                format=None if fmt == "lmdb" else "wds", shard_size="3KB", workers=1, commit_every=4, progress=False
            ),
        )
        refs[fmt] = out
    return refs


@pytest.mark.parametrize(("fmt", "where", "at"), [
    ("lmdb", "add", 0), ("lmdb", "add", 2), ("lmdb", "add", 9), ("lmdb", "checkpoint", 3),
    ("lmdb", "close", 0), ("lmdb", "manifest", 0),
    ("wds", "add", 0), ("wds", "add", 7), ("wds", "checkpoint", 3), ("wds", "close", 0), ("wds", "manifest", 0),
])
def test_sigkill_then_rerun_resumes_to_the_same_dataset(tree, reference, tmp_path, fmt, where, at):
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "shards")
    killed_conversion(tree.root, out, fmt, where, at)
    assert not out.exists()
    with pytest.raises(IncompleteDatasetError, match="rerun the same convert command"):
        fastdata.dataset(out)

    summary = fastdata.convert_imagefolder(
        tree.root,
        out,
        fastdata.ImageFolderOptions(
            format=None if fmt == "lmdb" else "wds", shard_size="3KB", workers=1, commit_every=4, progress=False
        ),
    )
    assert summary.images == COUNT
    if where in ("checkpoint", "close", "manifest") or (where == "add" and at > 4):
        assert summary.resumed_at, "a checkpoint was passed before the kill, so the rerun must resume"
    if summary.resumed_at:  # the rate counts only the images this run converted
        line = next(line for line in str(summary).splitlines() if line.strip().startswith("time"))
        assert f"{(COUNT - summary.resumed_at) / summary.seconds:,.0f} images/s in this run" in line
    assert contents(out) == contents(reference[fmt])
    manifest, ref_manifest = fastdata.info(out), fastdata.info(reference[fmt])
    assert manifest.class_counts == ref_manifest.class_counts
    if fmt == "wds":  # deterministic: the very same shard bytes
        assert [(f.name, f.sha256) for f in manifest.files] == [(f.name, f.sha256) for f in ref_manifest.files]
    assert not Path(str(out) + ".partial").exists()


@pytest.mark.parametrize(("where", "at"), [("add", 13), ("checkpoint", 2), ("checkpoint", 5), ("close", 0)])
def test_shards_hashed_elsewhere_resume_to_the_same_shards(tree, reference, tmp_path, where, at):
    """With 2 workers, finished WebDataset shards are hashed by processes of their own and a checkpoint listing one
    is held until its digest is in: a kill never leaves a checkpoint without digests, and the rerun (2 workers
    again) gives the very shards, digests and counts of an uninterrupted 1-worker conversion."""
    out = tmp_path / "shards"
    killed_conversion(tree.root, out, "wds", where, at, workers=2)
    progress = partial_path(out) / "progress.json"
    if progress.exists():
        assert "pending-sha256:" not in progress.read_text()
    summary = fastdata.convert_imagefolder(
        tree.root,
        out,
        fastdata.ImageFolderOptions(format="wds", shard_size="3KB", workers=2, commit_every=4, progress=False),
    )
    assert summary.images == COUNT
    manifest, ref_manifest = fastdata.info(out), fastdata.info(reference["wds"])
    assert len(manifest.files) > 4
    assert [(f.name, f.bytes, f.sha256) for f in manifest.files] == \
        [(f.name, f.bytes, f.sha256) for f in ref_manifest.files]
    assert all(f.sha256 == hashlib.sha256((out / f.name).read_bytes()).hexdigest() for f in manifest.files)
    assert contents(out) == contents(reference["wds"])


# An uninterrupted conversion in a child process, without any injection: what the random-time kills interrupt.
CONVERT = "import sys, fastdata; fastdata.convert_imagefolder(sys.argv[1], sys.argv[2], " \
          "fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False))"


def start_conversion(src: Path, out: Path) -> tuple[subprocess.Popen, float | None]:
    """A child converting `src` to `out`, and the moment its staging `OUT.partial` appeared, i.e. the conversion
    began (None when the child ended before that)."""
    proc = subprocess.Popen([sys.executable, "-c", CONVERT, str(src), str(out)], stderr=subprocess.PIPE, text=True)
    staging = partial_path(out)
    while not staging.exists():
        if proc.poll() is not None:
            return proc, None
        time.sleep(0.001)
    return proc, time.perf_counter()


def conversion_seconds(src: Path, out: Path) -> float:
    """How long a conversion runs in a child, from its staging appearing to the finished dataset in place."""
    proc, began = start_conversion(src, out)
    assert began is not None, proc.communicate()[1]
    while not out.exists():
        assert proc.poll() in (None, 0), proc.communicate()[1]
        time.sleep(0.001)
    seconds = time.perf_counter() - began
    assert proc.wait() == 0, proc.communicate()[1]
    return seconds


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[Tree, Path]:
    """A tree slow enough to convert (about 0.1 s or more) to be killed in its middle, and its reference LMDB."""
    root = tmp_path_factory.mktemp("large")
    tree = build_large_tree(root / "src", LARGE_COUNT)
    fastdata.convert_imagefolder(
        tree.root, root / "ref.lmdb", fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False)
    )
    return tree, root / "ref.lmdb"


def test_sigkill_at_random_times(large, tmp_path):
    """Kills at arbitrary moments of the conversion itself (no injection): the clock starts when the child's
    staging appears, and the kill comes after a random fraction of the time a whole conversion takes. A kill that
    came too late (the dataset was already in place) is tried again, sooner, so that every kill lands mid-conversion:
    the child died of it, its staging is there and no dataset is. Every rerun completes to the reference."""
    tree, reference = large
    seconds = conversion_seconds(tree.root, tmp_path / "timed.lmdb")
    expected = contents(reference)
    rng = np.random.default_rng(7)
    for attempt, fraction in enumerate(rng.uniform(0.05, 0.95, size=3)):
        for retry in range(8):
            out = tmp_path / f"out{attempt}-{retry}.lmdb"
            proc, began = start_conversion(tree.root, out)
            assert began is not None, proc.communicate()[1]
            time.sleep(max(0.0, began + fraction * seconds - time.perf_counter()))
            proc.send_signal(signal.SIGKILL)
            returncode, stderr = proc.wait(), proc.communicate()[1]
            if returncode == -signal.SIGKILL and not out.exists():
                break  # killed during the conversion
            assert returncode in (0, -signal.SIGKILL), stderr  # the conversion had finished: kill sooner
            fraction /= 2
        else:
            pytest.fail(f"no kill landed during the conversion ({seconds:.3f} s long)")
        assert partial_path(out).is_dir()
        with pytest.raises(IncompleteDatasetError, match="rerun the same convert command"):
            fastdata.dataset(out)
        summary = fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False)
        )
        assert summary.images == LARGE_COUNT
        assert contents(out) == expected
        assert not partial_path(out).exists()


def test_resume_with_other_options_or_source_is_refused(tree, tmp_path):
    out = tmp_path / "out.lmdb"
    killed_conversion(tree.root, out, "lmdb", "add", 9)
    with pytest.raises(OutputExistsError, match=r"max_size None -> 16"):
        fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(max_size=16, workers=1, progress=False)
        )
    extra = tree.root / tree.images[0]
    copy = extra.with_name("extra-" + extra.name)
    copy.write_bytes(extra.read_bytes())
    try:
        with pytest.raises(OutputExistsError, match="source files changed"):
            fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    finally:
        copy.unlink()
    # --overwrite starts again instead
    summary = fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(max_size=16, overwrite=True, workers=1, progress=False)
    )
    assert summary.images == COUNT and not summary.resumed_at


def test_leftovers_that_cannot_be_reopened_are_an_error_never_a_silent_restart(tree, reference, tmp_path, capsys):
    """A damaged interrupted conversion (LMDB data file, WebDataset progress record, a finished shard gone) is
    refused with the cause and the way out named; nothing is discarded until --overwrite says so."""
    lmdb_out = tmp_path / "out.lmdb"
    killed_conversion(tree.root, lmdb_out, "lmdb", "add", 9)  # two checkpoints recorded
    data = partial_path(lmdb_out) / "data.mdb"
    raw = data.read_bytes()
    data.write_bytes(b"\xff" * 8192 + raw[8192:])  # both LMDB meta pages overwritten
    with pytest.raises(StagingDamagedError, match=r"out\.lmdb\.partial: an interrupted conversion whose data cannot "
                                                  r"be reopened \(.+\); .*pass --overwrite to start it again"):
        fastdata.convert_imagefolder(
            tree.root, lmdb_out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False)
        )
    assert data.read_bytes()[8192:] == raw[8192:]  # left as it was
    code, _, err = cli(capsys, "convert", "imagefolder", tree.root, lmdb_out, "-q")
    assert code == 2
    assert_one_line_error(err, "cannot be reopened", "--overwrite")
    summary = fastdata.convert_imagefolder(
        tree.root, lmdb_out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False, overwrite=True)
    )
    assert summary.resumed_at is None and contents(lmdb_out) == contents(reference["lmdb"])

    wds_out = tmp_path / "shards"
    killed_conversion(tree.root, wds_out, "wds", "checkpoint", 3)  # finished shards and their progress
    progress = partial_path(wds_out) / "progress.json"
    saved = progress.read_bytes()
    progress.write_bytes(saved[: len(saved) // 2])  # cut short
    with pytest.raises(StagingDamagedError, match=r"the progress record of an interrupted conversion cannot be "
                                                  r"read \(ValueError: not JSON .+\); .*--overwrite"):
        fastdata.convert_imagefolder(
            tree.root,
            wds_out,
            fastdata.ImageFolderOptions(format="wds", shard_size="3KB", workers=1, commit_every=4, progress=False),
        )
    progress.write_bytes(saved)
    finished = json.loads(saved)["files"]
    assert finished, "the kill came after a shard was recorded as finished"
    (partial_path(wds_out) / finished[0]["name"]).unlink()
    with pytest.raises(StagingDamagedError, match=rf"{finished[0]['name']}: a finished shard of the last "
                                                  "checkpoint is missing; .*--overwrite"):
        fastdata.convert_imagefolder(
            tree.root,
            wds_out,
            fastdata.ImageFolderOptions(format="wds", shard_size="3KB", workers=1, commit_every=4, progress=False),
        )
    assert progress.read_bytes() == saved  # nothing discarded


def test_a_checkpoint_record_holds_every_rejected_sample_as_it_grows():
    """The progress record serialises each rejected entry once and keeps them all, in order, through checkpoint
    after checkpoint (it is what a resumed run reports as rejected)."""
    import dataclasses

    from fastdata.convert.images import _Progress

    state = _Progress(fingerprint={"source": "x"}, counts=[0, 0])
    records = []
    for i in range(5):
        state.rejected.append({"path": f"class_a/{i}.jpg", "reason": f'not a decodable image ("{i}" é)'})
        state.next_task, state.counts = 10 * i, [i, 2 * i]
        records.append(state.to_json())
        assert json.loads(records[-1]) == dataclasses.asdict(state)
    resumed = _Progress.parse(records[2])
    assert [r["path"] for r in resumed.rejected] == ["class_a/0.jpg", "class_a/1.jpg", "class_a/2.jpg"]
    assert resumed.next_task == 20
