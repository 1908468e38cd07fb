"""`fastdata verify`: every kind of damage is detected and named; an intact dataset passes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import threading

import lmdb
import pytest
from builders.images import build_solid_tree
from builders.runs import cli

import fastdata
from fastdata.cli import main
from fastdata.errors import WorkerError
from fastdata.formats.lmdb import release_environments
from fastdata.formats.manifest import CHECKSUM_FIELD, content_checksum, sha256_file
from fastdata.tools.verify import verify

HUNG_S = 120  # only a hang waits this long


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("verify") / "src", count=24)


@pytest.fixture
def lmdb_copy(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("v") / "d.lmdb"
    fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    return out


@pytest.fixture
def wds_copy(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("v") / "shards"
    fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(format="wds", shard_size="4KB", workers=1, progress=False)
    )
    return out


def rewrite_manifest(out, edit, keep_checksum_valid: bool) -> None:
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    if keep_checksum_valid:
        data[CHECKSUM_FIELD] = content_checksum(data)
    path.write_text(json.dumps(data))


def test_intact_datasets_pass_including_source_and_decode(tree, lmdb_copy, wds_copy, capsys):
    for out in (lmdb_copy, wds_copy):
        report = verify(out, source=tree.root, decode=True)
        assert report.ok, report.problems
        assert main(["verify", str(out), "--source", str(tree.root), "--decode"]) == 0
        assert capsys.readouterr().out.startswith("OK:")


def test_flipped_bit_is_detected(lmdb_copy, capsys):
    """A bit flipped in a stored image, and one in a per-sample array (the labels), each named."""
    reader = fastdata.dataset(lmdb_copy).reader
    image, labels = reader.read(1), reader._array("labels").tobytes()
    release_environments()
    data = lmdb_copy / "data.mdb"
    raw = bytearray(data.read_bytes())
    for value, at, bit in ((image, 10, 0x10), (labels, 4, 0x01)):  # a byte of the image; sample 1's label
        # every copy of the value: a free page may still hold an older one, and only the live copy counts
        found = [m.start() for m in re.finditer(re.escape(value), raw)]
        assert found
        for start in found:
            raw[start + at] ^= bit
    data.write_bytes(bytes(raw))
    report = verify(lmdb_copy)
    assert any("data.mdb: record 1 (" in p and "(damaged)" in p for p in report.problems), report.problems
    assert any("per-sample array 'labels'" in p for p in report.problems), report.problems
    assert main(["verify", str(lmdb_copy)]) == 1
    assert "data.mdb" in capsys.readouterr().out


def test_deleted_shard_and_extra_file_are_detected(wds_copy):
    manifest = fastdata.info(wds_copy)
    assert len(manifest.files) >= 3
    (wds_copy / manifest.files[1].name).unlink()
    (wds_copy / "stray.tar").write_bytes(b"x")
    problems = verify(wds_copy).problems
    assert any(manifest.files[1].name in p and "missing" in p for p in problems)
    assert any("stray.tar" in p and "not part of the dataset" in p for p in problems)


def test_truncated_shard_is_detected(wds_copy):
    name = fastdata.info(wds_copy).files[0].name
    path = wds_copy / name
    path.write_bytes(path.read_bytes()[:-1024])
    assert any(name in p and "bytes" in p for p in verify(wds_copy).problems)


def test_edited_label_map_is_detected(lmdb_copy):
    rewrite_manifest(lmdb_copy, lambda d: d["classes"].reverse(), keep_checksum_valid=False)
    assert any("checksum" in p for p in verify(lmdb_copy).problems)


def test_label_map_edited_with_a_valid_checksum_is_caught_by_the_source_and_counts(tree, lmdb_copy):
    def swap(d):
        d["classes"][0], d["classes"][1] = d["classes"][1], d["classes"][0]
        d["class_counts"][0] += 1
    rewrite_manifest(lmdb_copy, swap, keep_checksum_valid=True)
    problems = verify(lmdb_copy, source=tree.root).problems
    assert any("class list differs" in p for p in problems)
    assert any("class_counts" in p or "per-class" in p for p in problems)


def test_undecodable_sample_with_consistent_hashes_is_caught_by_decode(lmdb_copy):
    env = lmdb.open(str(lmdb_copy), max_dbs=5)
    images = env.open_db(b"images")  # outside the write transaction: open_db starts one of its own
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", 3), b"\xff\xd8 not really a jpeg", db=images)
    env.close()
    (lmdb_copy / "lock.mdb").unlink(missing_ok=True)

    def rehash(d):
        d["files"][0]["bytes"] = (lmdb_copy / "data.mdb").stat().st_size
        d["files"][0]["sha256"] = sha256_file(lmdb_copy / "data.mdb")
    rewrite_manifest(lmdb_copy, rehash, keep_checksum_valid=True)
    assert verify(lmdb_copy).ok  # consistent files and labels ...
    key = fastdata.dataset(lmdb_copy).reader.key(3)
    problems = verify(lmdb_copy, decode=True).problems  # ... but one sample does not decode
    assert len(problems) == 1 and key in problems[0]


def test_source_differences_are_named(tree, lmdb_copy, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tree.root, src)
    moved = src / tree.images[0]
    moved.rename(moved.with_name("renamed-" + moved.name))
    problems = verify(lmdb_copy, source=src).problems
    assert any("in the source but not in the dataset" in p and "renamed-" in p for p in problems)
    assert any("in the dataset but not in the source" in p and tree.images[0] in p for p in problems)


def test_not_a_dataset(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "not a fastdata dataset" in capsys.readouterr().err


def spoil_image(path, data: bytes) -> None:
    """Overwrite the first bytes of the stored image `data` inside the file `path`, wherever it is stored (same
    length: the container's structure stays intact, the image no longer decodes). LMDB may also hold a stale copy
    in a page freed by an earlier transaction; spoiling every copy spoils the live one."""
    raw = bytearray(path.read_bytes())
    at = raw.find(data)
    assert at >= 0
    while at >= 0:
        raw[at:at + 16] = b"\0" * 16
        at = raw.find(data, at + 1)
    path.write_bytes(bytes(raw))


def test_damaged_shards_name_their_undecodable_samples_and_the_check_goes_on(wds_copy, capsys):
    ds = fastdata.dataset(wds_copy)
    files = fastdata.info(wds_copy).files
    assert len(files) >= 4
    damaged = {}
    for shard_id in (1, len(files) - 1):  # an early shard and the last one: the check goes on past the first
        sample = list(ds.shard_samples(shard_id))[1][1]
        spoil_image(wds_copy / files[shard_id].name, sample.data)
        damaged[files[shard_id].name] = sample.key
    report = verify(wds_copy, decode=True)
    assert len(report.problems) == 6, report.problems
    for name, key in damaged.items():
        assert any(p.startswith(f"{name}: sha256 differs") for p in report.problems)
        assert any(p.startswith(f"{name}: sample 1 (") and key in p and "differ from its record digest" in p
                   for p in report.problems)  # named by the shard's record digests
        assert any(p.startswith("undecodable:") and f"{name}: sample {key!r}" in p for p in report.problems)
    assert not any(f.name in p for f in files if f.name not in damaged for p in report.problems)
    assert main(["verify", str(wds_copy), "--decode"]) == 1
    out = capsys.readouterr().out
    assert all(key in out for key in damaged.values())
    without_decode = verify(wds_copy).problems  # the damaged files, and their samples by their record digests
    assert len(without_decode) == 4
    assert all(any(name in p and key in p and "record digest" in p for p in without_decode)
               for name, key in damaged.items())


def test_damaged_lmdb_names_its_undecodable_sample(lmdb_copy):
    ds = fastdata.dataset(lmdb_copy)
    key, data = ds.reader.key(5), ds.reader.read(5)
    release_environments()  # this process read the file: let the next read see the damage
    spoil_image(lmdb_copy / "data.mdb", data)
    problems = verify(lmdb_copy, decode=True).problems
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"data.mdb: record 5 ({key!r}") and problems[0].endswith("(damaged)")
    assert problems[1].startswith("undecodable:") and f"sample {key!r}" in problems[1]


def test_text_verify_checks_the_source_it_is_given(tmp_path):
    """`fastdata verify corpus.lmdb --source OTHER.jsonl` for a text dataset: the same corpus passes; a changed
    corpus, another file and a path that does not exist are each named as a problem."""
    from tests.builders.text import make_corpus, train_bytelevel, write_jsonl

    corpus = make_corpus(30)
    source = write_jsonl(tmp_path / "corpus.jsonl", corpus)
    tokenizer = train_bytelevel(tmp_path / "bpe.json", corpus)
    fastdata.convert_text(
        source, tmp_path / "c.lmdb", tokenizer=tokenizer, options=fastdata.TextConversionOptions(progress=False)
    )
    assert verify(tmp_path / "c.lmdb", source=source).ok
    other = write_jsonl(tmp_path / "other.jsonl", corpus[:-1])
    for wrong in (other, tmp_path / "missing.jsonl"):
        report = verify(tmp_path / "c.lmdb", source=wrong)
        assert not report.ok and any(str(wrong) in problem for problem in report.problems), report.problems
    write_jsonl(source, [*corpus[:-1], corpus[-1] + " and more"])  # the same name, changed
    assert not verify(tmp_path / "c.lmdb", source=source).ok


def test_text_verify_compares_the_content_of_the_source(tmp_path, capsys):
    """An edited corpus of the same size (one letter changed) is not the one converted: the conversion recorded each
    source file's sha256, and verify --source names the file whose content differs. A dataset converted before the
    digests were recorded is still compared, by names and sizes, and the report says that is all it compared."""
    from fastdata.formats.manifest import MANIFEST_NAME, Manifest, sha256_file
    from tests.builders.text import make_corpus, train_bytelevel, write_jsonl

    corpus = make_corpus(30)
    source = write_jsonl(tmp_path / "corpus.jsonl", corpus)
    tokenizer = train_bytelevel(tmp_path / "bpe.json", corpus)
    out = tmp_path / "c.lmdb"
    fastdata.convert_text(source, out, tokenizer=tokenizer, options=fastdata.TextConversionOptions(progress=False))
    manifest = fastdata.info(out)
    assert manifest.source["files"] == [{"name": str(source), "bytes": source.stat().st_size,
                                         "sha256": sha256_file(source)}]
    report = verify(out, source=source)
    assert report.ok and "against the source" in report.checked[-1] and "content" in report.checked[-1]
    edited = source.read_bytes().replace(b"doc 7:", b"doc 8:", 1)
    assert edited != source.read_bytes() and len(edited) == source.stat().st_size
    source.write_bytes(edited)
    report = verify(out, source=source)
    assert report.problems == [f"the source {source} is not the one converted: the content of 1 file(s) differs from "
                               f"what the conversion read (sha256): {source}"]
    code, stdout, _ = cli(capsys, "verify", out, "--source", source)
    assert code == 1 and "content of 1 file(s) differs" in stdout
    # a dataset from before content digests: its manifest without them (rewritten with a valid checksum)
    data = json.loads((out / MANIFEST_NAME).read_text())
    for entry in data["source"]["files"]:
        del entry["sha256"]
    Manifest.from_dict(data).write(out)
    report = verify(out, source=source)
    assert report.ok and "names and sizes only" in report.checked[-1] and "older fastdata" in report.checked[-1]


def test_verify_names_each_damaged_record_by_its_digest(tmp_path, capsys):
    """An LMDB conversion stores a digest per record (no sha256 of the whole file): verify checks them on every
    core and names exactly the records damaged in place, by key and source file, exit code 1."""
    from fastdata.formats.lmdb import DATA_FILE
    from fastdata.tools.sample import make_sample_imagefolder

    src = make_sample_imagefolder(tmp_path / "src", images=24, classes=3, workers=1)
    out = tmp_path / "o.lmdb"
    fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    manifest = fastdata.info(out)
    assert manifest.record_digests["records"] == 24 and manifest.files[0].sha256 == ""
    assert verify(out).ok
    reader = fastdata.dataset(out).reader
    victims = {3: reader.key(3), 11: reader.key(11), 20: reader.key(20)}
    stored = [reader.read(i) for i in victims]
    release_environments()
    raw = bytearray((out / DATA_FILE).read_bytes())
    for data in stored:  # flip a byte inside each victim's image bytes, in place (every copy: a free page may
        found = [m.start() for m in re.finditer(re.escape(data), raw)]  # still hold an older one)
        assert found
        for at in found:
            raw[at + len(data) // 2] ^= 0x5A
    (out / DATA_FILE).write_bytes(bytes(raw))
    report = verify(out)
    damaged = [p for p in report.problems if "(damaged)" in p]
    assert len(damaged) == 3, report.problems
    for index, key in victims.items():
        assert any(f"record {index} ({key!r}, source file " in p for p in damaged), damaged
    assert main(["verify", str(out)]) == 1
    assert "(damaged)" in capsys.readouterr().out


def test_a_dataset_with_the_whole_files_digest_verifies_as_before(tmp_path):
    """A dataset from before per-record digests (its data.mdb's sha256 in the manifest) still verifies."""
    from fastdata.formats.lmdb import DATA_FILE
    from fastdata.tools.sample import make_sample_imagefolder

    src = make_sample_imagefolder(tmp_path / "src", images=6, classes=2, workers=1)
    out = tmp_path / "o.lmdb"
    fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    data = json.loads((out / "manifest.json").read_text())
    del data["record_digests"]
    data["files"][0]["sha256"] = sha256_file(out / DATA_FILE)
    data[CHECKSUM_FIELD] = content_checksum({k: v for k, v in data.items() if k != CHECKSUM_FIELD})
    (out / "manifest.json").write_text(json.dumps(data))
    assert verify(out).ok
    with open(out / DATA_FILE, "r+b") as handle:
        handle.seek(-100, 2)
        handle.write(b"\x01")
    assert any("sha256 differs from the manifest" in p for p in verify(out).problems)


def test_info_says_an_lmdb_dataset_has_a_digest_per_record(tmp_path):
    from fastdata.tools.info import describe

    tree = build_solid_tree(tmp_path / "src", count=6)
    fastdata.convert_imagefolder(tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    line = next(line for line in describe(tmp_path / "o.lmdb").splitlines() if "data.mdb" in line)
    root = fastdata.info(tmp_path / "o.lmdb").record_digests["root"]
    assert f"a sha256 per record (root {root[:16]}" in line


@pytest.fixture(scope="module")
def photo_shards(tmp_path_factory):
    """Nine JPEG photos in three classes, converted to WebDataset shards of a few samples each."""
    from builders.images import photo_like, write_image

    root = tmp_path_factory.mktemp("photo_shards")
    for i in range(9):
        write_image(root / "src" / f"c{i % 3}" / f"p{i}.jpg", photo_like(i, 64, 48), "jpeg")
    out = root / "shards"
    fastdata.convert_imagefolder(
        root / "src", out, fastdata.ImageFolderOptions(format="wds", shard_size="16KB", workers=1, progress=False)
    )
    return out


def test_a_webdataset_conversion_keeps_a_digest_per_sample_beside_each_shard(photo_shards):
    """The shards stay what the `webdataset` library reads (the same samples and members as before, nothing
    added to them); each has a `.digests` file of 32 bytes per sample, whose root the manifest records."""
    import hashlib

    from builders.webdataset import webdataset_reading

    from fastdata.formats.wds import digests_name

    manifest = fastdata.info(photo_shards)
    assert len(manifest.files) >= 2 and manifest.record_digests["records"] == 9
    table = b""
    for entry in manifest.files:
        digests = (photo_shards / digests_name(entry.name)).read_bytes()
        assert len(digests) == 32 * entry.samples
        table += digests
    assert hashlib.sha256(table).hexdigest() == manifest.record_digests["root"]
    read = webdataset_reading([photo_shards / entry.name for entry in manifest.files])
    assert len(read) == 9
    assert all({name for name in sample if not name.startswith("__")} == {"jpg", "cls", "json"} for sample in read)
    assert verify(photo_shards, decode=True).ok


def test_verify_names_the_damaged_sample_of_a_shard_even_when_it_still_decodes(photo_shards, tmp_path, capsys):
    """One byte flipped inside a JPEG member's entropy data: the image still decodes (other pixels), so only the
    digests can tell; plain verify and --decode both name the shard and the sample's key."""
    import tarfile

    copy = tmp_path / "shards"
    shutil.copytree(photo_shards, copy)
    shard = copy / fastdata.info(copy).files[1].name
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    victim = next(m for m in members if m.name.endswith(".jpg"))
    data = bytearray(shard.read_bytes())
    at = victim.offset_data + victim.size // 2
    while data[at] == 0xFF or data[at] ^ 0x10 == 0xFF:  # not a marker, before or after
        at += 1
    data[at] ^= 0x10
    shard.write_bytes(bytes(data))
    key = victim.name.rsplit(".", 1)[0]
    named = (f"{shard.name}: sample 0 ({key!r}: {key}.jpg, {key}.cls, {key}.json): its bytes differ from its record "
             "digest (damaged)")
    for decode in (False, True):
        report = verify(copy, decode=decode)
        assert named in report.problems, report.problems
        assert not any(p.startswith("undecodable") for p in report.problems)  # it still decodes
    code, stdout, _ = cli(capsys, "verify", copy, "--decode")
    assert code == 1 and named in stdout


def test_a_webdataset_dataset_from_before_record_digests_still_loads_and_verifies(photo_shards, tmp_path):
    """Its manifest has no record digests and no .digests files are there: it loads, verifies by its shards'
    sha256, and the report says it has no record digests."""
    from fastdata.formats.manifest import MANIFEST_NAME, Manifest
    from fastdata.formats.wds import DIGESTS_SUFFIX

    copy = tmp_path / "old"
    shutil.copytree(photo_shards, copy)
    for path in copy.glob(f"*{DIGESTS_SUFFIX}"):
        path.unlink()
    data = json.loads((copy / MANIFEST_NAME).read_text())
    del data["record_digests"]
    Manifest.from_dict(data).write(copy)
    assert len(fastdata.dataset(copy)) == 9
    report = verify(copy, decode=True)
    assert report.ok, report.problems
    assert any(item.startswith("no record digests (converted by an older fastdata") for item in report.checked)


def _dies_on_a_later_range(task):
    """A record check whose worker dies (as one killed for memory would) on every range but the first."""
    if task[1] > 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return []


def _never_ends_a_later_range(task):
    """A record check that never ends on every range but the first, and that SIGTERM does not end (a worker stuck
    in a library's exit handler after a SIGTERM handler it inherited ran)."""
    if task[1] > 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Event().wait()
    return []


def _records_checked_in_a_thread(lmdb_copy, monkeypatch, check_range, progress) -> list[BaseException]:
    """check_records over 2 workers, ranges of 2 records checked by `check_range`, in a thread: what it raised.
    Only a pool that waits for a range it lost waits HUNG_S: the calling test then fails."""
    from fastdata.formats.manifest import read_manifest
    from fastdata.tools.verify import records

    monkeypatch.setattr(records, "CHUNK", 2)
    monkeypatch.setattr(records, "_check_range", check_range)
    raised: list[BaseException] = []

    def check():
        try:
            records.check_records(lmdb_copy, read_manifest(lmdb_copy), [], progress, workers=2)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    thread.join(HUNG_S)
    assert not thread.is_alive(), "check_records waited for its workers"
    return raised


def test_an_error_while_records_are_checked_stops_the_workers_at_once(lmdb_copy, monkeypatch):
    """The checks that are left are not waited for: a pool closed and joined instead would wait for good for the
    range a stuck worker holds."""

    def stop_at_the_first_progress(_line):
        raise KeyboardInterrupt  # as Ctrl-C would, once the first range is in

    raised = _records_checked_in_a_thread(lmdb_copy, monkeypatch, _never_ends_a_later_range,
                                          stop_at_the_first_progress)
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)


def test_a_worker_that_dies_while_records_are_checked_is_named_not_waited_for(lmdb_copy, monkeypatch):
    """A worker killed mid-check (as one out of memory would) is reported with the records it had in hand, and the
    others are stopped: a pool that waits for the lost range would wait for good."""
    raised = _records_checked_in_a_thread(lmdb_copy, monkeypatch, _dies_on_a_later_range, None)
    assert len(raised) == 1 and isinstance(raised[0], WorkerError), raised
    assert re.search(r"^a verify worker \(pid \d+\) died \(killed by signal 9\) while working on check records "
                     r"\d+\.\.\d+; .*Run verify again$", str(raised[0])), str(raised[0])
