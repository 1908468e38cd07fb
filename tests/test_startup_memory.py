"""Start-up at scale: opening a loader and taking its first batch builds no Python object per sample (keys, labels,
document ends, batches of the epoch, wanted positions stay in arrays, on disk, or are made as they are needed).
Measured as the memory Python allocates (tracemalloc, numpy arrays included) over a dataset of 20k samples
against one of 2k: what it grows by per added sample stays far below what one Python object per sample costs (a
list of ints: 36 bytes a sample, a dict entry or a short string: 70 and more). No timing is asserted
(benchmarks/startup_scale.py measures the time)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from builders.many import write_many_documents, write_many_images

import fastdata
from fastdata.formats import lmdb_text

SMALL, LARGE = 2_000, 20_000
# bytes a loader may allocate per sample: image datasets keep 13 bytes of sizes, codec and label per sample
# (LMDB) and an int64 epoch order (both); text keeps the packed stream's end-of-text positions (an int64 per
# document, made chunk by chunk) and an int64 order over blocks (fewer than documents here)
PER_SAMPLE = {"image": 32, "text": 24}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[tuple[str, str, int], object]:
    root = tmp_path_factory.mktemp("many")
    chunk = lmdb_text.ENDS_PER_CHUNK
    lmdb_text.ENDS_PER_CHUNK = 1024  # several index chunks, as a large corpus has (module-scoped: set by hand)
    try:
        return {(kind, fmt, n): (write_many_images if kind == "image" else write_many_documents)(
                    root / f"{kind}-{n}.{fmt}", n, fmt, **({} if kind == "image" else {"shard_bytes": 2 << 20}))
                for kind in ("image", "text") for fmt in ("lmdb", "wds") for n in (SMALL, LARGE)}
    finally:
        lmdb_text.ENDS_PER_CHUNK = chunk


def start_up_bytes(path) -> int:
    """Peak bytes Python allocates to open a loader over `path` (no workers: all of it in this process) and take
    its first batch."""
    options = dict(text=fastdata.TextOptions(seq_len=8), batch_size=2) if fastdata.info(path).kind == "text" else \
        dict(image_size=8, augment="val", batch_size=64)
    gc.collect()
    tracemalloc.start()
    try:
        loader = fastdata.loader(path, num_workers=0, **options)
        next(iter(loader))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("kind", ["image", "text"])
def test_start_up_allocates_no_python_object_per_sample(datasets, kind, fmt):
    small, large = datasets[(kind, fmt, SMALL)], datasets[(kind, fmt, LARGE)]
    start_up_bytes(small)  # imports and one-time set-up out of the way
    growth = (start_up_bytes(large) - start_up_bytes(small)) / (LARGE - SMALL)
    assert growth < PER_SAMPLE[kind], f"{kind}/{fmt}: {growth:.1f} bytes per added sample"


def test_samples_and_targets_are_sequences_over_storage(datasets):
    ds = fastdata.dataset(datasets[("image", "lmdb", LARGE)])
    gc.collect()
    tracemalloc.start()
    try:
        samples, targets = ds.samples, ds.targets
        assert len(samples) == len(targets) == LARGE
        assert samples[12_345] == ("c5/12345.jpg", 5) and samples[-1] == (f"c9/{LARGE - 1}.jpg", 9)
        assert targets[7] == 7 and targets[1:4] == [1, 2, 3]
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert allocated < 300_000 + 13 * LARGE  # the label arrays; no list of keys or ints
    labels = np.asarray(targets)
    assert labels.dtype == np.int32 and labels.tolist() == [i % 10 for i in range(LARGE)]
    assert list(samples) == [(f"c{i % 10}/{i}.jpg", i % 10) for i in range(LARGE)]
    assert samples == list(samples) and list(targets) == targets and targets != [0] * LARGE
    with pytest.raises(IndexError, match=f"sample {LARGE} out of range"):
        samples[LARGE]
