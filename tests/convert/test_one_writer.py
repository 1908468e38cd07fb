"""One writer per output: a conversion holds its OUT (`fastdata.output_lock`) from before it looks at OUT to after
its dataset is in place. A second conversion into the same OUT (with --overwrite too) stops at once, naming the
first, and changes nothing; the first completes and verifies. A conversion killed with SIGKILL holds nothing: its
rerun resumes. A reader of an incomplete dataset is told whether a conversion is writing it now (which one) or was
interrupted (rerun to resume).

Conversions that must be caught in the middle run in a child process that pauses at a chosen point
(`pause_when`) until the test says go: every step waits for the one before it, nothing depends on timing."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from builders.coco import write_coco
from builders.images import build_solid_tree, solid_id_of_path
from builders.runs import PAUSE_WHEN, assert_one_line_error, cli, no_process_left, wait_for_file
from builders.text import make_corpus, train_bytelevel, write_jsonl
from builders.webdataset import wds_sample, write_wds_shards

import fastdata
from fastdata.convert.staging import NOT_STARTED_HINT, RESUME_HINT, Staging
from fastdata.errors import IncompleteDatasetError, OutputBusyError, StagingDamagedError
from fastdata.formats.manifest import partial_path
from fastdata.output_lock import OutputLock, lock_path, read_holder, running_conversion
from fastdata.tools.verify import verify

COUNT = 30
HUNG_S = 600  # a bound for a hung child on a loaded machine, not a measure of speed

# A conversion (`fastdata convert imagefolder SRC OUT`, as a user types it) that pauses before its writer adds the
# record number 5 (after its first checkpoint: commit_every 4) until the test says go.
PAUSED = PAUSE_WHEN + textwrap.dedent("""
    import sys
    from fastdata.formats import lmdb as L, wds as W
    from fastdata.cli import main

    here, fmt, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    writer = L.LmdbWriter if fmt == "lmdb" else W.WdsWriter
    pause_when(writer, "add", lambda self: self.count == 5, here)
    sys.exit(main(argv))
""")


def start_paused(tmp_path: Path, src: Path, out: Path, fmt: str, workers: int = 1) -> tuple[subprocess.Popen, Path]:
    """A child converting `src` into `out`, paused in the middle of writing: (the child, the path whose `.go`
    lets it go on). Its own process group, so that the test can wait for every process of it."""
    here = tmp_path / f"pause-{out.name}"
    fmt_args = [] if fmt == "lmdb" else ["--format", "wds", "--shard-size", "3KB"]
    argv = ["convert", "imagefolder", str(src), str(out), "-q", "--workers", str(workers), *fmt_args]
    process = subprocess.Popen([sys.executable, "-c", PAUSED, str(here), fmt, *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_file(here.with_name(here.name + ".paused"), process, HUNG_S)
    return process, here


def go_on(here: Path) -> None:
    here.with_name(here.name + ".go").touch()


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """(size, mtime, sha256) of every file under `root`, and the folders as such."""
    found: dict[str, tuple[int, int, str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            found[str(path.relative_to(root))] = (-1, -1, "dir")
        else:
            stat = path.stat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def wait_group_gone(group: int) -> None:
    """Wait until every process of the child's group has exited (a killed conversion's workers stop at once, their
    parent gone); the bound only catches a hang."""
    deadline = time.monotonic() + HUNG_S
    while not no_process_left(group):
        assert time.monotonic() < deadline, "a process of the killed conversion never exited"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("one_writer") / "src", count=COUNT)


@pytest.fixture(scope="module")
def references(tree, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("one_writer_ref")
    refs = {"lmdb": root / "ref.lmdb", "wds": root / "ref-shards"}
    fastdata.convert_imagefolder(tree.root, refs["lmdb"], fastdata.ImageFolderOptions(workers=1, progress=False))
    fastdata.convert_imagefolder(
        tree.root, refs["wds"], fastdata.ImageFolderOptions(format="wds", shard_size="3KB", workers=1, progress=False)
    )
    return refs


def stored(out: Path) -> list[tuple[str, int, str]]:
    """(key, label, sha256 of the stored bytes) of every sample, in key order."""
    ds = fastdata.dataset(out)
    if hasattr(ds, "encoded"):
        samples = [ds.encoded(i) for i in range(len(ds))]
    else:
        samples = list(ds.encoded_samples(list(range(len(ds.shards)))))
    return sorted((s.key, s.label, hashlib.sha256(bytes(s.data)).hexdigest()) for s in samples)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_second_conversion_into_the_same_output_is_refused_and_changes_nothing(tree, references, tmp_path, capsys,
                                                                                 fmt):
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "shards")
    first, here = start_paused(tmp_path, tree.root, out, fmt)
    try:
        before = snapshot(tmp_path)
        assert partial_path(out).is_dir() and lock_path(out).is_file()
        fmt_args = [] if fmt == "lmdb" else ["--format", "wds", "--shard-size", "3KB"]
        for extra in ([], ["--overwrite"]):  # --overwrite takes the same lock
            code, out_text, err = cli(capsys, "convert", "imagefolder", tree.root, out, "-q", "--workers", "1",
                                      *fmt_args, *extra)
            assert (code, out_text) == (2, "")
            assert_one_line_error(err, str(out), "another conversion is writing it", f"pid {first.pid}",
                                  "convert imagefolder", "since")
            assert snapshot(tmp_path) == before  # not even OUT.partial or the lock file changed
        # a reader is told that a conversion is running now, and which
        with pytest.raises(IncompleteDatasetError, match=f"a conversion is writing it now: pid {first.pid} "
                                                         r"\(`.*convert imagefolder") as caught:
            fastdata.dataset(out)
        assert "rerun" not in str(caught.value)
        for command in ("info", "verify"):
            code, _, err = cli(capsys, command, out)
            assert code == 2
            assert_one_line_error(err, "a conversion is writing it now", f"pid {first.pid}", "wait for it to finish")
    finally:
        go_on(here)
        stdout, stderr = first.communicate(timeout=HUNG_S)
    assert first.returncode == 0, stderr
    assert stdout.startswith(f"wrote {out}")
    assert verify(out).ok, str(verify(out))
    assert stored(out) == stored(references[fmt])
    assert not lock_path(out).exists() and not partial_path(out).exists()


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_conversion_killed_with_sigkill_holds_nothing_and_its_rerun_resumes(tree, references, tmp_path, fmt):
    """Its worker processes (forked: they share the lock) exit once their parent is gone; then the rerun takes the
    output over, resumes from the last checkpoint and gives what an uninterrupted conversion gives."""
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "shards")
    first, _ = start_paused(tmp_path, tree.root, out, fmt, workers=2)
    os.kill(first.pid, signal.SIGKILL)  # `kill -9 PID`: the conversion's own process, not its workers
    first.communicate(timeout=HUNG_S)
    assert first.returncode == -signal.SIGKILL
    wait_group_gone(first.pid)
    assert lock_path(out).is_file() and read_holder(out).pid == first.pid  # stale: it names a dead process
    assert running_conversion(out) is None
    with pytest.raises(IncompleteDatasetError, match="interrupted: no conversion is running; rerun the same "
                                                     "convert command to resume it"):
        fastdata.dataset(out)
    summary = fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False,
                                           **({} if fmt == "lmdb" else {"format": "wds", "shard_size": "3KB"})))
    assert summary.resumed_at is not None  # the leftovers were resumed, not discarded
    assert verify(out).ok, str(verify(out))
    assert stored(out) == stored(references[fmt])
    assert not lock_path(out).exists()


def test_a_second_staging_in_this_process_is_refused(tree, tmp_path):
    """The lock is per open file, not per process: this process holding OUT refuses its own second conversion."""
    out = tmp_path / "out.lmdb"
    with Staging(out).owned(overwrite=False) as staging:
        staging.fresh()
        with pytest.raises(IncompleteDatasetError, match=f"a conversion is writing it now: pid {os.getpid()}"):
            fastdata.loader(out, batch_size=2)
        holder = read_holder(out)
        assert holder is not None and holder.pid == os.getpid() and holder.alive()
        with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"), Staging(out).owned(overwrite=True):
            pass
        with pytest.raises(OutputBusyError, match="another conversion is writing it"):
            fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb.lock", "out.lmdb.partial"]
        with pytest.raises(IncompleteDatasetError, match=f"a conversion is writing it now: pid {os.getpid()}"):
            fastdata.info(out)
    assert not lock_path(out).exists()
    with pytest.raises(IncompleteDatasetError, match="interrupted: no conversion is running"):
        fastdata.info(out)
    fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False)
    )  # the lock is free again
    assert fastdata.info(out).num_samples == COUNT


def test_every_converter_and_engine_takes_the_lock(tree, hf_sources, tmp_path):
    """Each source kind (and the Ray engine, the text driver) meets the held lock before it writes anything."""
    import pandas as pd

    rows = [{"path": path, "label": path.split("/")[0]} for path in sorted(tree.images)]
    listed = tmp_path / "list.csv"
    pd.DataFrame(rows).to_csv(listed, index=False)
    pairs = tmp_path / "pairs.csv"
    pd.DataFrame([{"path": path, "caption": f"image {solid_id_of_path(path)}"} for path in sorted(tree.images)]
                 ).to_csv(pairs, index=False)
    shards = tmp_path / "shards"
    write_wds_shards(shards, [wds_sample(tree, path) for path in sorted(tree.images)])
    coco = write_coco(tmp_path / "coco")
    corpus = make_corpus(20)
    tokenizer = train_bytelevel(tmp_path / "bpe.json", corpus)
    write_jsonl(tmp_path / "corpus.jsonl", corpus)
    out = tmp_path / "held" / "out.lmdb"
    conversions = {
        "imagefolder": lambda: fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False)
        ),
        "imagefolder wds": lambda: fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(format="wds", workers=2, progress=False)
        ),
        "list": lambda: fastdata.convert_list(
            listed, out, fastdata.FileListOptions(root=tree.root, workers=1, progress=False)
        ),
        "pairs": lambda: fastdata.convert_pairs(
            pairs, out, fastdata.PairsOptions(root=tree.root, workers=1, progress=False)
        ),
        "webdataset": lambda: fastdata.convert_webdataset(
            shards, out, fastdata.WebDatasetOptions(workers=1, progress=False)
        ),
        "coco": lambda: fastdata.convert_coco(
            coco.annotations, coco.images, out, fastdata.CocoOptions(workers=1, progress=False)
        ),
        "hf": lambda: fastdata.convert_hf(hf_sources.saved, out, fastdata.HfOptions(workers=1, progress=False)),
        "text": lambda: fastdata.convert_text(
            tmp_path / "corpus.jsonl",
            out,
            tokenizer=tokenizer,
            options=fastdata.TextConversionOptions(progress=False),
        ),
    }
    if _has_ray():
        conversions["ray"] = lambda: fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(engine="ray", workers=1, progress=False)
        )
    with OutputLock(out):
        for name, convert in conversions.items():
            with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
                convert()
            assert sorted(p.name for p in out.parent.iterdir()) == ["out.lmdb.lock"], name
    assert not out.parent.exists()  # the folder the lock needed, made for it, is removed with it


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_writer_that_finds_records_it_did_not_write_says_so_in_one_line(tmp_path):
    """What two conversions without the lock met: the second writer's records beside the first's. The first's close
    names it as a damaged staging (StagingDamagedError, one line in the CLI), never a raw IndexError."""
    from fastdata.formats.lmdb import LmdbWriter
    from fastdata.formats.records import CODEC_PIL, ImageRecord

    def record(i: int) -> ImageRecord:
        return ImageRecord(f"a/{i}.png", b"x" * 10, "png", 0, 1, 1, CODEC_PIL)

    directory = tmp_path / "out.lmdb.partial"
    first = LmdbWriter(directory, commit_every=2)
    for i in range(2):
        first.add(record(i))
    first.checkpoint(b"{}")
    other = textwrap.dedent("""
        import sys
        from fastdata.formats.lmdb import LmdbWriter
        from fastdata.formats.records import CODEC_PIL, ImageRecord
        writer = LmdbWriter(sys.argv[1])
        for i in range(writer.count, writer.count + 3):
            writer.add(ImageRecord(f"b/{i}.png", b"y" * 10, "png", 0, 1, 1, CODEC_PIL))
        writer.checkpoint(b"{}")
        writer.abort()
    """)
    # the first writer's open transaction holds LMDB's writer mutex; between two of its transactions the other
    # process writes, as it did in the trial
    first._txn.abort()
    subprocess.run([sys.executable, "-c", other, str(directory)], check=True, timeout=HUNG_S)
    first._txn = first._env.begin(write=True)
    with pytest.raises(StagingDamagedError, match="holds 5 records where this conversion wrote 2: another process "
                                                  "wrote into it"):
        first.close()


def test_ctrl_c_before_a_conversion_starts_says_there_is_nothing_to_resume(tree, tmp_path, capsys, monkeypatch):
    """A Ctrl-C that comes while the source is still being listed: nothing was written, and the line says so
    (not "rerun to resume"); one that comes after the staging was made says to rerun."""
    from fastdata.converters import imagefolder

    def interrupted(src):
        raise KeyboardInterrupt

    out = tmp_path / "out.lmdb"
    monkeypatch.setattr(imagefolder, "scan", interrupted)
    code, stdout, stderr = cli(capsys, "convert", "imagefolder", tree.root, out, "-q", "--workers", "1")
    assert (code, stdout, stderr) == (130, "", f"interrupted; {NOT_STARTED_HINT}\n")
    assert not partial_path(out).exists() and not lock_path(out).exists()
    monkeypatch.undo()

    from fastdata.convert import images

    def interrupted_write(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(images, "_write_all", interrupted_write)
    code, stdout, stderr = cli(capsys, "convert", "imagefolder", tree.root, out, "-q", "--workers", "1")
    assert (code, stdout, stderr) == (130, "", f"interrupted; {RESUME_HINT}\n")
    assert partial_path(out).is_dir() and not lock_path(out).exists()


def test_a_conversion_into_a_held_output_stops_before_it_lists_its_source(tree, tmp_path, monkeypatch):
    """Listing a large source takes long: a conversion whose OUT a running conversion holds says so first."""
    from fastdata.converters import imagefolder

    def listed(src):
        raise AssertionError("the source was listed")

    monkeypatch.setattr(imagefolder, "scan", listed)
    out = tmp_path / "out.lmdb"
    with OutputLock(out), pytest.raises(OutputBusyError, match="another conversion is writing it"):
        fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))


def test_a_stale_lock_file_naming_a_reused_pid_is_no_running_conversion(tmp_path):
    """A lock file left by a killed conversion whose pid a later process took: that process did not start when the
    file says, so it is not the holder; readers say the conversion was interrupted, and a conversion takes it over
    (the file is not locked)."""
    import json
    import socket

    out = tmp_path / "out.lmdb"
    partial_path(out).mkdir()
    lock_path(out).write_text(json.dumps({"pid": os.getpid(), "command": "fastdata convert imagefolder a out.lmdb",
                                          "since": 1.0, "host": socket.gethostname(), "process_started": 1.0}))
    assert read_holder(out).pid == os.getpid() and running_conversion(out) is None
    with pytest.raises(IncompleteDatasetError, match="interrupted: no conversion is running"):
        fastdata.dataset(out)
    with Staging(out).owned(overwrite=False):
        holder = read_holder(out)
        assert holder.process_started != 1.0 and running_conversion(out) == holder
    assert not lock_path(out).exists()
