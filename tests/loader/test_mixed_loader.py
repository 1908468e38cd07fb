"""Weighted mixtures through `fastdata.loader([a, b], weights=...)` and `fastdata.mix`: the union label space, the
counts per epoch and per batch, the resume contract (k = 0, 1, middle, last batch), states of another mixture
refused, two ranks with equal batches, a weight of 0, a single source, text mixtures (one tokenizer) and the
sources that cannot be mixed."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections import Counter

import numpy as np
import pytest
import torch
from builders.damaged import corrupt_copy
from builders.images import SMALL_SOLID_COUNT, SOLID_COUNT, sample_id_of, solid_label
from builders.runs import seeded_loader
from contracts import check_checkpoint_loop, check_resumes, clone, same

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError, ResumeError

UNION = ["solid/alpha", "solid/beta", "solid/gamma", "pets/cat", "pets/dog", "pets/eel"]


#: the fields of MixOptions these tests give the helpers below by name
MIXING = ("samples_per_epoch", "epoch_end", "exhausted")


def with_mixing(options: dict) -> dict:
    """`options` with its MixOptions fields given as `mixing=MixOptions(...)`."""
    rule = {name: options.pop(name) for name in MIXING if name in options}
    return {**options, "mixing": fastdata.MixOptions(**rule)} if rule else options


def mixed(solid_lmdb, pets_lmdb, **options):
    settings = dict(weights=[0.7, 0.3], batch_size=10, augment="val")
    settings.update(with_mixing(options))
    return seeded_loader([solid_lmdb, pets_lmdb], **settings)


def identify(images, labels) -> list[tuple[str, int]]:
    """(source, sample id) of every sample of a batch: the label's block tells the source, the pixels the id."""
    found = []
    for image, label in zip(images, labels.tolist(), strict=True):
        source, sample_id = ("solid" if label < 3 else "pets"), sample_id_of(image)
        assert label % 3 == solid_label(sample_id), "the label does not belong to the sample"
        found.append((source, sample_id))
    return found


def test_union_of_class_maps_and_counts_per_epoch(solid_lmdb, pets_lmdb):
    loader = mixed(solid_lmdb, pets_lmdb)
    assert loader.classes == UNION
    for _ in range(2):
        batches = [identify(*batch) for batch in loader]
        assert len(batches) == len(loader)
        seen = Counter(s for batch in batches for s in batch)
        pets = sorted(i for s, i in seen if s == "pets")
        assert pets == list(range(SMALL_SOLID_COUNT))  # the first source to run out: each sample once
        # the epoch ends with the slot of pets' last sample, the 39th: round(0.7 * 39) = 27 are solid's
        assert max(seen.values()) == 1 and sum(1 for s, _ in seen if s == "solid") == 27
        for batch in batches[:-1]:  # every whole batch holds 7 + 3
            assert Counter(s for s, _ in batch) == {"solid": 7, "pets": 3}


def test_identical_class_lists_share_their_ids(solid_lmdb, small_solid_lmdb):
    loader = seeded_loader([solid_lmdb, small_solid_lmdb], weights=[1, 1], batch_size=8, augment="val")
    assert loader.classes == ["alpha", "beta", "gamma"]
    for images, labels in loader:
        assert all(label == solid_label(sample_id_of(image)) for image, label in zip(images, labels.tolist(),
                                                                                     strict=True))


def mixture_interrupts(n: int) -> list[int]:
    return [0, 1, n // 2, n - 1, n]  # before the first batch, after the first, middle, before the last, after it


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("rule", [{}, {"epoch_end": "last"}, {"samples_per_epoch": 53, "exhausted": "stop"}])
def test_mixture_resume_grid(solid_lmdb, pets_lmdb, rule, workers):
    check_resumes(lambda w: mixed(solid_lmdb, pets_lmdb, num_workers=w, augment="train", **rule),
                  mixture_interrupts, workers)


@pytest.mark.filterwarnings("error::UserWarning")
def test_mixture_checkpoint_loop_sees_exactly_the_uninterrupted_run(solid_lmdb, pets_lmdb):
    check_checkpoint_loop(lambda w: mixed(solid_lmdb, pets_lmdb, num_workers=w, epoch_end="last"), 0)


def test_state_is_small_json_with_each_source_position(solid_lmdb, pets_lmdb):
    loader = mixed(solid_lmdb, pets_lmdb, epoch_end="last")
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 1200
    positions = state["positions"]
    assert [p["consumed"] for p in positions] == [21, 9]  # 3 batches of 7 + 3
    for _ in iterator:
        pass
    done = mixed(solid_lmdb, pets_lmdb, epoch_end="last")
    done.load_state_dict(state)
    assert done.state_dict()["positions"] == positions
    end = loader.state_dict()
    assert end["epoch"] == 1 and end["positions"] == [{"consumed": 0, "cycle": 0}] * 2
    state["positions"][1]["consumed"] = 8
    with pytest.raises(ResumeError, match="per-source positions"):
        mixed(solid_lmdb, pets_lmdb, epoch_end="last").load_state_dict(state)


@pytest.mark.parametrize(("other", "named"), [({"weights": [0.6, 0.4]}, "weights="),
                                              ({"epoch_end": "last"}, "epoch_end="),
                                              ({"paths": "swapped"}, "mix=")])
def test_a_state_of_another_mixture_is_refused_naming_the_difference(solid_lmdb, pets_lmdb, other, named):
    loader = mixed(solid_lmdb, pets_lmdb)
    next(iter(loader))
    state = loader.state_dict()
    restored = mixed(pets_lmdb, solid_lmdb) if other.get("paths") else mixed(solid_lmdb, pets_lmdb, **other)
    with pytest.raises(ResumeError, match=named):
        restored.load_state_dict(state)


def test_two_ranks_get_equal_batches_each_holding_the_weights(solid_lmdb, pets_lmdb):
    per_rank = [[identify(*batch) for batch in mixed(solid_lmdb, pets_lmdb, rank=rank, world_size=2,
                                                     epoch_end="last", batch_size=10)]
                for rank in range(2)]
    lengths = {len(batches) for batches in per_rank}
    assert len(lengths) == 1 and lengths == {len(mixed(solid_lmdb, pets_lmdb, rank=1, world_size=2,
                                                         epoch_end="last"))}
    for batches in per_rank:
        for batch in batches[:-1]:
            assert Counter(s for s, _ in batch) == {"solid": 7, "pets": 3}
    solid = sorted(i for batches in per_rank for batch in batches for s, i in batch if s == "solid")
    assert solid[:SOLID_COUNT] == list(range(SOLID_COUNT)) or set(solid) == set(range(SOLID_COUNT))
    single = [identify(*batch) for batch in mixed(solid_lmdb, pets_lmdb, epoch_end="last", batch_size=20)]
    together = [a + b for a, b in zip(*per_rank, strict=True)]
    assert [Counter(b) for b in together] == [Counter(b) for b in single]  # ranks split one global stream


def test_a_weight_of_zero_never_appears_and_does_not_end_the_epoch(solid_lmdb, pets_lmdb):
    loader = mixed(solid_lmdb, pets_lmdb, weights=[1, 0])
    seen = [s for batch in loader for s in identify(*batch)]
    assert sorted(seen) == [("solid", i) for i in range(SOLID_COUNT)] and loader.classes == UNION


def test_a_single_source_is_the_plain_loader(solid_lmdb):
    plain = [clone(b) for b in seeded_loader(solid_lmdb)]
    single = seeded_loader([solid_lmdb], weights=[1])
    assert same([clone(b) for b in single], plain)
    assert single.state_dict() == seeded_loader(solid_lmdb).state_dict() | {"epoch": 1}


def test_mix_for_your_own_dataloader(solid_lmdb, pets_lmdb):
    mixture = fastdata.mix([solid_lmdb, pets_lmdb], weights=[0.7, 0.3], batch_size=10, augment="val",
                           image_size=16, seed=7)
    data = torch.utils.data.DataLoader(mixture.dataset, batch_sampler=mixture.batch_sampler)
    assert mixture.classes == UNION and len(data) == len(mixture)
    targets = mixture.dataset.targets
    assert len(targets) == SOLID_COUNT + SMALL_SOLID_COUNT
    for index in (0, SOLID_COUNT - 1, SOLID_COUNT, SOLID_COUNT + 5):  # both sources, at their edges
        image, label = mixture.dataset[index]
        assert targets[index] == label == (3 if index >= SOLID_COUNT else 0) + solid_label(sample_id_of(image))
    epochs = []
    for epoch in range(2):
        mixture.set_epoch(epoch)
        batches = [identify(images, labels) for images, labels in data]
        assert all(Counter(s for s, _ in b) == {"solid": 7, "pets": 3} for b in batches[:-1])
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    loader = mixed(solid_lmdb, pets_lmdb)  # the loader draws the same schedule
    assert [identify(*b) for b in loader] == epochs[0]


@pytest.mark.parametrize("packing", [True, False])
def test_text_mixture_resumes_and_splits_evenly(text_mix, packing):
    a, b, _ = text_mix
    text = fastdata.TextOptions(seq_len=16) if packing else fastdata.TextOptions(packing=False, max_length=24)

    def make(workers, **more):
        return seeded_loader([a, b], weights=[0.5, 0.5], batch_size=4, augment=None, num_workers=workers,
                             mixing=fastdata.MixOptions(epoch_end="last"), text=text, **more)

    check_resumes(make, mixture_interrupts, 0)
    ranks = [make(0, rank=r, world_size=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == sum(1 for _ in ranks[1])
    state = make(0).state_dict()
    assert state["config"]["mix"] == ["a", "b"] and state["config"]["format"] == "text-mix"


def test_text_mixture_documents_keep_their_ids(text_mix):
    a, b, _ = text_mix
    mixture = fastdata.mix([a, b], weights=[1, 3], batch_size=4, seed=1, mixing=fastdata.MixOptions(epoch_end="last",
                                                                                                    exhausted="stop"))
    docs = {len(fastdata.dataset(a)) + i: fastdata.dataset(b)[i]["input_ids"] for i in range(3)}
    for index, ids in docs.items():
        assert torch.equal(mixture.dataset[index]["input_ids"], ids)
    indices = [i for batch in mixture.batch_sampler for i in batch]
    assert sorted(indices) == list(range(len(mixture.dataset)))  # "last" + "stop": every document once


def test_text_mixtures_share_one_tokenizer(text_mix):
    a, _, c = text_mix
    with pytest.raises(ConfigError, match=r"a\.lmdb and .*c\.lmdb were tokenized with different tokenizers"):
        seeded_loader([a, c], augment=None, text=fastdata.TextOptions(seq_len=16))


def test_sources_that_cannot_be_mixed_are_refused(solid_lmdb, multi_label_lmdb, text_mix, pets_lmdb):
    cases = [([solid_lmdb, multi_label_lmdb], "cannot mix single-label and multi-label"),
             ([solid_lmdb, text_mix[0]], "cannot mix images and text"),
             ([solid_lmdb, solid_lmdb], "weights has 1 number for 2 datasets")]
    for paths, message in cases:
        with pytest.raises(ConfigError, match=message):
            seeded_loader(paths, weights=[1] if "weights" in message else None)
    with pytest.raises(ConfigError, match="apply to a mixture: pass a list"):
        seeded_loader(solid_lmdb, weights=[1])
    with pytest.raises(ConfigError, match=r"use fastdata\.mix\(paths, weights=\.\.\.\)"):
        fastdata.dataset([solid_lmdb, pets_lmdb])


def test_multi_label_datasets_mix_into_multi_hot_rows(multi_label_lmdb):
    loader = seeded_loader([multi_label_lmdb, multi_label_lmdb], weights=[1, 1], batch_size=8, augment="val")
    plain = fastdata.dataset(multi_label_lmdb)
    row_of = {sample_id_of(image): row for image, row in plain}  # each sample's multi-hot row, read alone
    assert loader.classes == plain.classes
    for images, labels in loader:
        assert labels.dtype == torch.float32 and labels.shape == (len(images), len(plain.classes))
        assert all(torch.equal(row, row_of[sample_id_of(image)]) for image, row in zip(images, labels, strict=True))


def test_mixture_batches_are_the_same_for_any_number_of_workers(solid_lmdb, pets_lmdb):
    zero = [clone(b) for b in mixed(solid_lmdb, pets_lmdb, augment="train")]
    two = [clone(b) for b in mixed(solid_lmdb, pets_lmdb, augment="train", num_workers=2)]
    assert same(zero, two) and not np.array_equal(zero[0][1].numpy(), zero[1][1].numpy())


def test_a_mid_epoch_state_resumes_on_another_world_size(solid_lmdb, pets_lmdb):
    """Two ranks stop after 2 batches each; one process resumes: together they see the epoch's samples once."""
    def make(**ranks):
        return mixed(solid_lmdb, pets_lmdb, epoch_end="last", uneven="drop", **ranks)

    seen, state = [], None
    for rank in range(2):
        loader = make(rank=rank, world_size=2)
        iterator = iter(loader)
        seen += [s for _ in range(2) for s in identify(*next(iterator))]
        state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    seen += [s for batch in resumed for s in identify(*batch)]
    whole = [s for batch in make() for s in identify(*batch)]
    assert Counter(seen) == Counter(whole)


def test_a_skipped_sample_is_named_with_its_source(solid_lmdb, pets_lmdb, tmp_path):
    broken, key = corrupt_copy(pets_lmdb, tmp_path, 4, b"not an image")
    loader = mixed(solid_lmdb, broken, on_error="skip")
    sizes = [len(labels) for _images, labels in loader]
    assert [k for k, _reason in loader.skipped] == [f"corrupt/{key}"]
    assert sum(sizes) == sum(len(labels) for _images, labels in mixed(solid_lmdb, pets_lmdb)) - 1
    with pytest.raises(Exception, match=f"corrupt/{key}"):
        list(mixed(solid_lmdb, broken))


def test_auto_workers_over_a_mixture_warns_and_uses_the_defaults(solid_lmdb, pets_lmdb):
    with pytest.warns(UserWarning, match="over a mixture: `fastdata tune` results are per dataset"):
        loader = fastdata.loader([solid_lmdb, pets_lmdb], weights=[1, 1], batch_size=4, num_workers="auto",
                                 image_size=8)
    assert loader.tuned is None and loader.num_workers >= 1


# ----------------------------------------------------------------------------- every kind of image dataset


def test_detection_datasets_mix_with_their_shares_and_resume(coco_lmdb):
    """COCO with COCO: (images, targets) batches, each holding its share of each source, resuming exactly."""
    options = dict(batch_size=4, image_size=32, num_workers=0, seed=5, masks=True)
    loader = fastdata.loader([coco_lmdb, coco_lmdb], weights=[0.75, 0.25], **options)
    batches = list(loader)
    assert batches and all(isinstance(targets, list) and len(targets) == len(images) and
                           all("boxes" in t and "masks" in t for t in targets) for images, targets in batches)
    first = next(iter(fastdata.loader([coco_lmdb, coco_lmdb], weights=[0.75, 0.25], **options)))
    resumed = fastdata.loader([coco_lmdb, coco_lmdb], weights=[0.75, 0.25], **options)
    iterator = iter(resumed)
    next(iterator)
    state = resumed.state_dict()
    again = fastdata.loader([coco_lmdb, coco_lmdb], weights=[0.75, 0.25], **options)
    again.load_state_dict(state)
    assert torch.equal(next(iter(again))[0], batches[1][0]) and torch.equal(first[0], batches[0][0])


def test_pairs_and_segmentation_datasets_mix(pairs_lmdb, seg_rect_lmdb):
    batch = next(iter(fastdata.loader([pairs_lmdb, pairs_lmdb], weights=[0.5, 0.5], batch_size=4, image_size=16,
                                      num_workers=0)))
    assert set(batch) >= {"images", "captions", "input_ids"} and len(batch["captions"]) == 4
    _images, masks = next(iter(fastdata.loader([seg_rect_lmdb, seg_rect_lmdb], weights=[0.5, 0.5], batch_size=4,
                                              image_size=16, num_workers=0)))
    assert masks.shape == (4, 16, 16)


def test_datasets_whose_batches_differ_are_refused_in_one_line_naming_both(coco_lmdb, pairs_lmdb, solid_lmdb):
    for paths, words in (([coco_lmdb, pairs_lmdb], ("detection targets", "image-text pairs")),
                         ([solid_lmdb, coco_lmdb], ("class labels", "detection targets"))):
        with pytest.raises(ConfigError) as raised:
            seeded_loader(paths, weights=[0.5, 0.5])
        message = str(raised.value)
        assert "\n" not in message and str(paths[0]) in message and str(paths[1]) in message
        assert all(word in message for word in words), message


WDS_UNION = ["shards/alpha", "shards/beta", "shards/gamma", "pets/cat", "pets/dog", "pets/eel"]


def test_local_webdataset_shards_mix_with_lmdb(solid_wds, pets_lmdb):
    """Shards are read by index (each sample alone from its first tar header): every label belongs to its pixels,
    the first source to run out gives each sample once, and two workers give the batches one gives."""
    def make(workers: int = 0, **options):
        settings = dict(weights=[0.7, 0.3], batch_size=10, augment="val", num_workers=workers)
        return seeded_loader([solid_wds, pets_lmdb], **{**settings, **with_mixing(options)})

    loader = make()
    assert loader.classes == WDS_UNION
    batches = [identify(*batch) for batch in loader]
    seen = Counter(s for batch in batches for s in batch)
    assert sorted(i for s, i in seen if s == "pets") == list(range(SMALL_SOLID_COUNT))
    assert max(seen.values()) == 1 and sum(1 for s, _ in seen if s == "solid") == 27
    assert same([clone(b) for b in make()], [clone(b) for b in make(2)])
    check_resumes(lambda w: make(w, augment="train", epoch_end="last"), lambda n: [1, n // 2], 2)


def test_indexed_shards_follow_the_stored_stream(solid_wds, pets_lmdb, solid_lmdb):
    """`fastdata.mix` over shards: index i of the shards is the i-th sample `fastdata.dataset` iterates, label and
    pixels, and every index of the mixture reads its own sample."""
    mixture = fastdata.mix([solid_wds, pets_lmdb], weights=[1, 1], batch_size=8, augment="val", image_size=16)
    streamed = list(fastdata.dataset(solid_wds, augment="val", image_size=16))
    assert len(mixture.dataset) == len(streamed) + SMALL_SOLID_COUNT == SOLID_COUNT + SMALL_SOLID_COUNT
    for index in [len(streamed) - 1, 0, 17, 5, len(streamed) - 2]:  # out of order: each read on its own
        image, label = mixture.dataset[index]
        assert torch.equal(image, streamed[index][0]) and label == streamed[index][1]
    listed = mixture.dataset.samples[:len(streamed)]  # (path, label) in stream order, paths as the LMDB lists them
    assert [label for _, label in listed] == [label for _, label in streamed]
    assert sorted(path for path, _ in listed) == sorted(f"shards/{path}" for path, _ in
                                                        fastdata.dataset(solid_lmdb).samples)


def test_a_mixture_names_each_sample_by_its_source_and_its_own_key(solid_wds, pets_lmdb):
    """What the loader's messages name a sample by (`dataset.reader.key(i)`): the source's name, then the shard's
    file and the sample's number in it (shards read by index) or the LMDB dataset's own key."""
    mixture = fastdata.mix([solid_wds, pets_lmdb], weights=[1, 1], batch_size=8, augment="val", image_size=16)
    files = fastdata.dataset(solid_wds).manifest.files
    pets = fastdata.dataset(pets_lmdb)
    expected = [f"shards/{file.name}#{number}" for file in files for number in range(file.samples)]
    expected += [f"pets/{pets.reader.key(i)}" for i in range(len(pets))]
    reader = mixture.dataset.reader
    assert [reader.key(i) for i in range(len(mixture.dataset))] == expected
    assert len(set(expected)) == len(expected)
    reader.release_mapped()  # after a batch: each source's reader gives its mapped pages back


def test_a_shard_changed_after_conversion_is_named(solid_wds, pets_lmdb, tmp_path):
    """A shard that lost a sample since its manifest was written: reading by index names it and says so."""
    changed = tmp_path / "shards"
    shutil.copytree(solid_wds, changed)
    first = sorted(changed.glob("*.tar"))[0]
    with tarfile.open(first) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    dropped = members[0][0].name.split(".")[0]
    with tarfile.open(first, "w") as tar:
        for member, data in members:
            if member.name.split(".")[0] != dropped:
                tar.addfile(member, io.BytesIO(data))
    mixture = fastdata.mix([changed, pets_lmdb], weights=[1, 1], batch_size=8, augment="val", image_size=16)
    with pytest.raises(CorruptSampleError, match=rf"{first.name}: holds \d+ samples, its manifest says \d+"):
        mixture.dataset[0]


def equal_items(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(equal_items(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal_items(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("kind", ["pairs", "segmentation", "multi-label", "detection"])
def test_shards_of_every_kind_mix_with_their_lmdb_twin(kind, request):
    """Pairs, label maps, multi-label rows and detection targets read by index from shards are the samples the
    shards stream."""
    shards, lmdb = {"pairs": ("pairs_wds", "pairs_lmdb"), "segmentation": ("seg_rect_wds", "seg_rect_lmdb"),
                    "multi-label": ("multi_label_wds", "multi_label_lmdb"), "detection": ("rect_wds", "rect_lmdb")
                    }[kind]
    shards, lmdb = request.getfixturevalue(shards), request.getfixturevalue(lmdb)
    mixture = fastdata.mix([shards, lmdb], weights=[1, 1], batch_size=4, augment="val", image_size=16)
    streamed = list(fastdata.dataset(shards, augment="val", image_size=16))
    for index in [len(streamed) - 1, 0, len(streamed) // 2]:
        assert equal_items(mixture.dataset[index], streamed[index]), index
    batches = list(fastdata.loader([shards, lmdb], weights=[1, 1], batch_size=4, image_size=16, num_workers=2))
    assert len(batches) >= 2
