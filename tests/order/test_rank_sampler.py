"""`loader.sampler` and `loader.dataset` as code written against a DataLoader uses them, for every loader kind:
`len(loader.sampler)` is this rank's samples per epoch (DistributedSampler's meaning), `len(loader.dataset)` the
whole dataset's, the sampler's indices are the samples the loader yields, `loader.dataset[i]` is sample i as the
batches hold it (the same augmentation, dtype and normalisation), and PyTorch's ImageNet example's DDP
validation (`len(val_loader.sampler) * world_size < len(val_loader.dataset)`, then the rest through a Subset of
`val_loader.dataset`) evaluates every sample exactly once."""

from __future__ import annotations

import pytest
import torch
from builders.images import SOLID_COUNT, sample_id_of
from torch.utils.data import DataLoader, Subset

import fastdata
from fastdata.errors import ConfigError

IMAGE = {"image_size": 16, "batch_size": 4, "num_workers": 0, "augment": "val"}
TEXT = {"text": fastdata.TextOptions(seq_len=8), "batch_size": 4, "num_workers": 0}


@pytest.fixture(scope="module")
def makers(solid_lmdb, solid_wds, pets_lmdb, text_mix):
    return {
        "image lmdb": lambda **o: fastdata.loader(solid_lmdb, **{**IMAGE, **o}),
        "image wds": lambda **o: fastdata.loader(solid_wds, **{**IMAGE, **o}),
        "text lmdb": lambda **o: fastdata.loader(text_mix[0], **{**TEXT, **o}),
        "text wds": lambda **o: fastdata.loader(text_mix[1], **{**TEXT, **o}),
        "image mixture": lambda **o: fastdata.loader([solid_lmdb, pets_lmdb], **{**IMAGE, **o}),
        "text mixture": lambda **o: fastdata.loader(list(text_mix[:2]), **{**TEXT, **o}),
    }


KINDS = ["image lmdb", "image wds", "text lmdb", "text wds", "image mixture", "text mixture"]


def _rows(batch) -> int:
    return len(batch["input_ids"]) if isinstance(batch, dict) else len(batch[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_sampler_and_dataset_lengths_as_a_dataloader_has_them(makers, kind, uneven):
    """Every rank: len(sampler) samples per epoch, what the loader yields in a pass; with uneven="pad" the ranks
    together cover the epoch (repeating at most world_size - 1), with "drop" they leave fewer than world_size
    out, as DistributedSampler(drop_last=...) does; the sampler's attributes are the loader's."""
    world = 3
    whole = makers[kind]()
    total = whole.sampler.total
    assert whole.sampler.num_replicas == 1 and len(whole.sampler) == total
    assert len(whole.dataset) >= 1 and (total == len(whole.dataset) or "mixture" in kind)
    for rank in range(world):
        loader = makers[kind](rank=rank, world_size=world, uneven=uneven)
        sampler = loader.sampler
        assert (sampler.rank, sampler.num_replicas, sampler.drop_last) == (rank, world, uneven == "drop")
        assert loader.batch_sampler is None  # whole batches, as a DataLoader with batch_size=None (Lightning looks)
        assert sum(_rows(batch) for batch in loader) == len(sampler) == len(list(sampler))
        assert sampler.total_size == world * len(sampler) and len(loader.dataset) == len(whole.dataset)
        if uneven == "pad":
            assert total <= sampler.total_size < total + world
        else:
            assert total - world < sampler.total_size <= total
        assert all(0 <= i < len(loader.dataset) for i in sampler)


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_set_epoch_is_the_loaders(makers, kind):
    loader = makers[kind]()
    first = list(loader.sampler)
    loader.sampler.set_epoch(4)
    assert loader.epoch == loader.sampler.epoch == 4 and list(loader.sampler) != first
    with pytest.raises(ConfigError, match="epoch must be at least 0"):
        loader.sampler.set_epoch(-1)


@pytest.mark.parametrize("kind", ["image lmdb", "image mixture"])
@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_the_samplers_indices_give_the_batches_samples(makers, kind, dtype):
    """`loader.dataset[i]` for the sampler's i, in order, is what the batches hold: the same augmentation, and
    the loader's dtype and normalisation (uint8, or normalised floats), not the stored uint8 image."""
    loader = makers[kind](output=fastdata.OutputOptions(dtype=dtype), seed=5)
    loader.set_epoch(2)
    order = list(loader.sampler)
    rows = [(image, label) for images, labels in loader for image, label in zip(images, labels, strict=True)]
    assert len(rows) == len(order)
    for (image, label), index in zip(rows, order, strict=True):
        stored, stored_label = loader.dataset[index]
        assert stored.dtype == image.dtype == (dtype or torch.uint8)
        assert torch.equal(stored, image) and stored_label == label


@pytest.mark.parametrize("kind", ["text lmdb", "text mixture"])
def test_text_rows_are_what_the_batches_hold(makers, kind):
    loader = makers[kind](seed=5)
    order = list(loader.sampler)
    rows = [batch["input_ids"][row] for batch in loader for row in range(len(batch["input_ids"]))]
    for ids, index in zip(rows, order, strict=True):
        assert torch.equal(loader.dataset[index]["input_ids"], ids)
    assert loader.dataset.tokenizer.get_vocab_size() > 0 and len(loader.dataset.documents) >= 1


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_imagenet_examples_ddp_validation_sees_every_sample_once(solid_lmdb, uneven):
    """pytorch/examples imagenet/main.py's validate() under DDP, as ported: each rank evaluates its part; when
    `len(val_loader.sampler) * world_size < len(val_loader.dataset)` the rest comes from
    `Subset(val_loader.dataset, range(len(val_loader.sampler) * world_size, len(val_loader.dataset)))` through a
    plain DataLoader. Every sample is evaluated once (pad: the padding repeats fewer than world_size), and the
    rest comes as the normalised floats the loader gives (the model would see uint8 otherwise)."""
    world = 4
    options = dict(batch_size=5, augment="val", image_size=16, shuffle=False, num_workers=0,
                   output=fastdata.OutputOptions(dtype=torch.float32), world_size=world, uneven=uneven)

    def sample_id(image):  # the solid id its green channel encodes, the normalisation undone
        green = (image[1] * 0.224 + 0.456) * 255
        return sample_id_of(torch.stack([green, green, green]).numpy())

    reference = {sample_id(image): image
                 for images, _ in fastdata.loader(solid_lmdb, **{**options, "world_size": 1, "rank": 0})
                 for image in images}
    seen: list[int] = []
    for rank in range(world):
        val_loader = fastdata.loader(solid_lmdb, rank=rank, **options)
        for images, _ in val_loader:
            seen += [sample_id(image) for image in images]
    rest = len(val_loader.sampler) * world < len(val_loader.dataset)
    assert rest == (uneven == "drop")  # 45 samples over 4 ranks: one left for the rest
    if rest:
        aux = Subset(val_loader.dataset, range(len(val_loader.sampler) * world, len(val_loader.dataset)))
        for images, _ in DataLoader(aux, batch_size=3):
            assert images.dtype == torch.float32
            for image in images:
                seen.append(sample_id(image))
                assert torch.equal(image, reference[seen[-1]])
    assert uneven == "pad" or len(seen) == len(set(seen)) == SOLID_COUNT
    assert set(seen) == set(range(SOLID_COUNT)) and len(seen) - SOLID_COUNT < world
