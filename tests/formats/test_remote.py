"""Remote WebDataset loading against real servers started here on 127.0.0.1: an HTTP server (http.server in a
thread) and an S3-compatible one (moto in server mode). Remote batches equal local ones; the cache downloads
each shard once, stays under its bound and never shows a partial file; a shard altered on the server and a
download cut short are clear errors (or a retried success), never training data or a corrupt cache entry."""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
import threading
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError, NotADatasetError, RemoteError
from fastdata.formats.cache import ShardCache


class Server:
    """A static file server over `root` that counts requests and can cut responses short."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: Counter[str] = Counter()
        self.cut: dict[str, int] = {}  # file name -> how many more responses to cut after half the bytes
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(server.root), **kwargs)

            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                server.requests[name] += 1
                if server.cut.get(name, 0) > 0:
                    server.cut[name] -= 1
                    data = (server.root / self.path.lstrip("/")).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(solid_wds, tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    shutil.copytree(solid_wds, root / "ds")
    served = Server(root)
    yield served
    served.close()


def shard_names(path) -> list[str]:
    return [f.name for f in fastdata.info(path).files]


def epochs(path, epochs_count=2, **options):
    settings = dict(batch_size=8, augment="train", image_size=16, num_workers=0, seed=4)
    settings.update(options)
    loader = fastdata.loader(path, **settings)
    return [[(images.clone(), labels.clone()) for images, labels in loader] for _ in range(epochs_count)]


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b)
        for (images_a, labels_a), (images_b, labels_b) in zip(epoch_a, epoch_b, strict=True):
            assert torch.equal(labels_a, labels_b) and torch.equal(images_a, images_b)


def cache_files(directory: Path) -> list[str]:
    """What a reader of the cache directory sees, lock files aside."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_http_batches_equal_local_ones(server, solid_wds):
    local = epochs(solid_wds, num_workers=2)
    assert_same(epochs(server.url("ds"), num_workers=2), local)
    ds = fastdata.dataset(server.url("ds/"))
    assert len(ds) == len(fastdata.dataset(solid_wds)) and ds.classes == ["alpha", "beta", "gamma"]


def test_cache_downloads_each_shard_once_and_holds_only_verified_shards(server, solid_wds, tmp_path):
    names = shard_names(solid_wds)
    before = Counter({name: server.requests[name] for name in names})
    cache = tmp_path / "cache"
    remote = epochs(server.url("ds"), num_workers=2, remote=fastdata.RemoteOptions(cache_dir=cache))
    assert_same(remote, epochs(solid_wds))
    assert all(server.requests[name] - before[name] == 1 for name in names), server.requests
    entries = cache_files(cache)
    assert entries == sorted(f"{f.sha256}.shard" for f in fastdata.info(solid_wds).files)
    for entry in entries:
        assert hashlib.sha256((cache / entry).read_bytes()).hexdigest() == entry.split(".")[0]
    again = epochs(server.url("ds"), epochs_count=1,
                   remote=fastdata.RemoteOptions(cache_dir=cache))  # another process: from the cache
    assert_same(again, remote[:1])
    assert all(server.requests[name] - before[name] == 1 for name in names)


def test_cache_stays_under_its_bound(server, solid_wds, tmp_path):
    files = fastdata.info(solid_wds).files
    bound = max(f.bytes for f in files) + min(f.bytes for f in files)
    cache = tmp_path / "cache"
    assert_same(epochs(server.url("ds"), remote=fastdata.RemoteOptions(cache_dir=cache, cache_max_bytes=bound)),
                epochs(solid_wds))
    assert 0 < sum((cache / name).stat().st_size for name in cache_files(cache)) <= bound
    with pytest.raises(ConfigError, match="largest shard"):
        fastdata.loader(server.url("ds"), num_workers=0, remote=fastdata.RemoteOptions(cache_dir=cache,
                                                                                       cache_max_bytes=bound // 4))


@pytest.mark.parametrize("cached", [False, True])
def test_a_shard_altered_on_the_server_is_an_error(server, solid_wds, tmp_path, cached):
    name = shard_names(solid_wds)[1]
    altered = server.root / f"altered-{cached}"
    shutil.copytree(solid_wds, altered)
    data = bytearray((altered / name).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte inside a stored image: same size, other content
    (altered / name).write_bytes(bytes(data))
    cache = tmp_path / "cache"
    options = {"remote": fastdata.RemoteOptions(cache_dir=cache)} if cached else {}
    with pytest.raises(CorruptSampleError, match=rf"{name}.*changed on the server"):
        epochs(server.url(altered.name), epochs_count=1, shuffle=False, **options)
    if cached:
        assert f"{fastdata.info(solid_wds).files[1].sha256}.shard" not in cache_files(cache)
        assert not [n for n in cache_files(cache) if n.endswith(".tmp")]


def test_an_interrupted_download_never_leaves_a_corrupt_cache_entry(server, solid_wds, tmp_path):
    name = shard_names(solid_wds)[0]
    sha = fastdata.info(solid_wds).files[0].sha256
    cache = tmp_path / "cache"
    server.cut[name] = 100  # every response cut half-way
    with pytest.raises(RemoteError, match=rf"{name}: download failed 3 times.*"):
        epochs(server.url("ds"), epochs_count=1, shuffle=False, remote=fastdata.RemoteOptions(cache_dir=cache))
    assert cache_files(cache) == [], "a cut download left a file in the cache"
    server.cut[name] = 1  # the next response is cut, the retry gets the whole shard
    assert_same(epochs(server.url("ds"), shuffle=False, remote=fastdata.RemoteOptions(cache_dir=cache)),
                epochs(solid_wds, shuffle=False))
    assert server.cut[name] == 0
    assert hashlib.sha256((cache / f"{sha}.shard").read_bytes()).hexdigest() == sha


def test_remote_errors_are_clear(server, tricky_lmdb, tmp_path, solid_wds):
    shutil.copytree(tricky_lmdb, server.root / "an.lmdb", dirs_exist_ok=True)
    with pytest.raises(NotADatasetError, match="remote loading reads WebDataset"):
        fastdata.dataset(server.url("an.lmdb"))
    with pytest.raises(NotADatasetError, match=r"manifest\.json is missing"):
        fastdata.dataset(server.url("nothing-here"))
    with pytest.raises(ConfigError, match="unsupported URL scheme 'ftp'"):
        fastdata.dataset("ftp://127.0.0.1/ds")
    with pytest.raises(ConfigError, match="apply to remote URLs"):
        fastdata.dataset(solid_wds, remote=fastdata.RemoteOptions(cache_dir=tmp_path))
    with pytest.raises(ConfigError, match="give cache_dir as well"):
        fastdata.dataset(server.url("ds"), remote=fastdata.RemoteOptions(cache_max_bytes="1GB"))


@pytest.fixture(scope="module")
def s3(solid_wds):
    import boto3  # with moto[server], from the dev extras
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=endpoint, **credentials)
    client.create_bucket(Bucket="data")
    for path in sorted(Path(solid_wds).iterdir()):
        client.upload_file(str(path), "data", f"solid/{path.name}")
    yield {"key": "testing", "secret": "testing",
           "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    moto.stop()


def test_s3_batches_equal_local_ones(s3, solid_wds, tmp_path):
    local = epochs(solid_wds, num_workers=2)
    assert_same(epochs("s3://data/solid", num_workers=2, remote=fastdata.RemoteOptions(storage_options=s3)), local)
    assert_same(epochs("s3://data/solid", remote=fastdata.RemoteOptions(storage_options=s3, cache_dir=tmp_path / "c")),
                local)
    with pytest.raises(NotADatasetError, match="missing"):
        fastdata.dataset("s3://data/elsewhere", remote=fastdata.RemoteOptions(storage_options=s3))


def _open_shared(directory: str, sha: str, out: str) -> None:
    """In another process: open one entry of a shared cache, fetching it with a slow writer."""
    import time

    def fetch(f):
        with open(Path(out) / f"fetch-{multiprocessing.current_process().pid}", "w"):
            pass
        for _ in range(5):
            f.write(b"x" * 1000)
            time.sleep(0.05)

    with ShardCache(directory, max_bytes=None).open(sha, 5000, fetch) as f:
        Path(out, f"read-{multiprocessing.current_process().pid}").write_bytes(f.read())


def test_cache_is_shared_safely_by_processes(tmp_path):
    sha = "ab" * 32
    (tmp_path / "out").mkdir()
    stale = tmp_path / "cache" / f".{sha}.999.1.tmp"  # what a download killed half-way leaves
    stale.parent.mkdir()
    stale.write_bytes(b"half")
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_open_shared, args=(str(tmp_path / "cache"), sha, str(tmp_path / "out")))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    fetched = list((tmp_path / "out").glob("fetch-*"))
    reads = [p.read_bytes() for p in (tmp_path / "out").glob("read-*")]
    assert len(fetched) == 1, "the shard was downloaded more than once"
    assert len(reads) == 4 and all(r == b"x" * 5000 for r in reads)
    assert cache_files(tmp_path / "cache") == [f"{sha}.shard"]  # the stale temporary file is gone


def test_a_failed_fetch_leaves_nothing(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=None)

    def broken(f):
        f.write(b"partial")
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        cache.open("cd" * 32, 100, broken)
    assert cache_files(tmp_path) == []


def test_detection_shards_load_remotely_as_locally(rect_wds, tmp_path):
    """A COCO conversion's shards over http: the same images and target dicts as the local shards."""
    from contracts import clone, same

    shutil.copytree(rect_wds, tmp_path / "www" / "rects")
    served = Server(tmp_path / "www")
    try:
        def run(path):
            loader = fastdata.loader(path, batch_size=5, image_size=24, num_workers=0, seed=2, masks=True,
                                     remote=fastdata.RemoteOptions(
                                         cache_dir=tmp_path / "cache" if "://" in str(path) else None))
            return [clone(batch) for batch in loader]

        remote, local = run(served.url("rects")), run(rect_wds)
        assert same(remote, local) and sum(len(targets) for _, targets in remote) == 23
    finally:
        served.close()
