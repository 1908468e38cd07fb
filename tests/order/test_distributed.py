"""Distributed sharding under a real torch.distributed job (gloo, CPU): 2 and 3 processes, each with 2 loader
workers, over LMDB and over WebDataset with fewer shards than ranks x workers. Every rank runs one collective
per batch, as DDP does, so unequal batch counts would fail the job (a timeout), not only the assertions."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from builders.images import SOLID_COUNT, sample_id_of

import fastdata

BATCH = 4
WORKERS = 2


@pytest.fixture(scope="module")
def few_shards(solid_tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "shards"
    fastdata.convert_imagefolder(
        solid_tree.root,
        out,
        fastdata.ImageFolderOptions(format="wds", shard_size="60KB", seed=0, workers=1, progress=False),
    )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, datasets: dict[str, str], out: str) -> None:
    """One rank: take rank and world size from torch.distributed, iterate one epoch of each dataset with an
    all_reduce per batch, and write the sample ids it got."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        result = {}
        for name, path in datasets.items():
            for uneven in ("pad", "drop"):
                loader = fastdata.loader(path, batch_size=BATCH, augment="val", image_size=16, seed=3,
                                         num_workers=WORKERS, uneven=uneven, multiprocessing_context="fork")
                assert (loader.rank, loader.world_size) == (rank, world_size)
                batches = []
                for images, _labels in loader:
                    step = torch.ones(1)
                    dist.all_reduce(step)  # a rank with fewer batches would leave the others waiting here
                    assert int(step) == world_size
                    batches.append([sample_id_of(image) for image in images])
                result[f"{name}-{uneven}"] = {"batches": batches, "len": len(loader)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_every_epoch_evenly(world_size, solid_lmdb, few_shards, tmp_path):
    shards = len(fastdata.info(few_shards).files)
    assert shards < world_size * WORKERS  # shards are split inside, between ranks and workers
    datasets = {"lmdb": str(solid_lmdb), "wds": str(few_shards)}
    mp.start_processes(_rank_main, args=(world_size, _free_port(), datasets, str(tmp_path)), nprocs=world_size,
                       join=True, start_method="fork")  # fork: no second import of torch per rank
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    for key in results[0]:
        per_rank = [result[key] for result in results]
        counts = {len(r["batches"]) for r in per_rank}
        assert len(counts) == 1, f"{key}: ranks yielded different batch counts {counts}"
        assert all(r["len"] == len(r["batches"]) for r in per_rank), key
        ids = [i for r in per_rank for batch in r["batches"] for i in batch]
        padded = -(-SOLID_COUNT // world_size) * world_size
        if key.endswith("pad"):
            assert sorted(set(ids)) == list(range(SOLID_COUNT)), f"{key}: union of the ranks is not the dataset"
            assert len(ids) == padded, f"{key}: {len(ids)} samples, expected {padded} (documented padding)"
        else:  # the last SOLID_COUNT % world_size samples of the epoch's order are left out, none repeated
            assert len(ids) == len(set(ids)) == SOLID_COUNT - SOLID_COUNT % world_size, key
        rank_sets = [{i for batch in r["batches"] for i in batch} for r in per_rank]
        overlap = sum(len(a & b) for n, a in enumerate(rank_sets) for b in rank_sets[n + 1:])
        assert overlap <= padded - SOLID_COUNT, f"{key}: ranks share more samples than the padding"
