"""Crash-safe, resumable conversion: a conversion killed with SIGKILL at any point leaves nothing that opens as
a dataset, and rerunning the same command resumes and gives what an uninterrupted conversion gives."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import KILL_WHEN, build_solid_tree

import fastdata
from fastdata.errors import IncompleteDatasetError, NotADatasetError, OutputExistsError

COUNT = 40

# Runs a conversion in a child process that SIGKILLs itself at a chosen point inside the writer: a real,
# abrupt kill (no cleanup, no atexit), placed deterministically.
KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    src, out, fmt, where, at = sys.argv[1:6]
    at = int(at)

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
    fastdata.convert_imagefolder(src, out, format=None if fmt == "lmdb" else "wds", shard_size="3KB",
                                 workers=1, commit_every=4, progress=False)
""")


def killed_conversion(src: Path, out: Path, fmt: str, where: str, at: int = 0) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out), fmt, where, str(at)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def contents(out: Path) -> list[tuple[str, int, bytes]]:
    """(source path, label, pixels) of every sample, in path order (WDS is stored shuffled)."""
    ds = fastdata.dataset(out)
    items = []
    if hasattr(ds, "reader"):
        for i in range(len(ds)):
            image, label = ds[i]
            items.append((ds.reader.key(i), label, image.numpy().tobytes()))
    else:
        for sample in ds.encoded_samples(list(range(len(ds.shards)))):
            items.append((sample.key, sample.label, sample.data))
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
        fastdata.convert_imagefolder(tree.root, out, format=None if fmt == "lmdb" else "wds", shard_size="3KB",
                                     workers=1, commit_every=4, progress=False)
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

    summary = fastdata.convert_imagefolder(tree.root, out, format=None if fmt == "lmdb" else "wds",
                                           shard_size="3KB", workers=1, commit_every=4, progress=False)
    assert summary.images == COUNT
    if where in ("checkpoint", "close", "manifest") or (where == "add" and at > 4):
        assert summary.resumed_at, "a checkpoint was passed before the kill, so the rerun must resume"
    assert contents(out) == contents(reference[fmt])
    manifest, ref_manifest = fastdata.info(out), fastdata.info(reference[fmt])
    assert manifest.class_counts == ref_manifest.class_counts
    if fmt == "wds":  # deterministic: the very same shard bytes
        assert [(f.name, f.sha256) for f in manifest.files] == [(f.name, f.sha256) for f in ref_manifest.files]
    assert not Path(str(out) + ".partial").exists()


def test_sigkill_at_random_times(tree, reference, tmp_path):
    """Kills at arbitrary moments (no injection): every rerun completes to the reference dataset."""
    rng = np.random.default_rng(7)
    for attempt in range(3):
        out = tmp_path / f"out{attempt}.lmdb"
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import fastdata
            fastdata.convert_imagefolder({str(tree.root)!r}, {str(out)!r}, workers=1, commit_every=4,
                                         progress=False)
        """)])
        try:
            proc.wait(timeout=float(rng.uniform(0.5, 3.0)))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if not (out / "manifest.json").exists():  # killed before the commit: not a dataset until rerun
            with pytest.raises(NotADatasetError):
                fastdata.dataset(out)
            fastdata.convert_imagefolder(tree.root, out, workers=1, commit_every=4, progress=False)
        assert contents(out) == contents(reference["lmdb"])


def test_resume_with_other_options_or_source_is_refused(tree, tmp_path):
    out = tmp_path / "out.lmdb"
    killed_conversion(tree.root, out, "lmdb", "add", 9)
    with pytest.raises(OutputExistsError, match=r"max_size None -> 16"):
        fastdata.convert_imagefolder(tree.root, out, max_size=16, workers=1, progress=False)
    extra = tree.root / tree.images[0]
    copy = extra.with_name("extra-" + extra.name)
    copy.write_bytes(extra.read_bytes())
    try:
        with pytest.raises(OutputExistsError, match="source files changed"):
            fastdata.convert_imagefolder(tree.root, out, workers=1, progress=False)
    finally:
        copy.unlink()
    # --overwrite starts again instead
    summary = fastdata.convert_imagefolder(tree.root, out, max_size=16, overwrite=True, workers=1, progress=False)
    assert summary.images == COUNT and not summary.resumed_at
