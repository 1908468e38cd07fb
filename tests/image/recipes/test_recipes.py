"""Recipes in the loader (`augment=[RandomResizedCrop(...), TrivialAugmentWide(), RandomErasing(...),
RandomChoice([MixUp(...), CutMix(...)])]`): the per-sample presets are the drawn operations applied to the crop,
seeded from (seed, epoch, sample); the batch presets are torchvision v2's MixUp / CutMix on the same batch; the
same batches for any worker count, exact resume, every rank the same number of batches; and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from builders.damaged import corrupt_copy
from builders.images import SOLID_CLASSES, SOLID_COUNT
from builders.runs import seeded_loader
from contracts import check_resumes, clone, same
from torchvision.transforms import v2

import fastdata
from fastdata.errors import ConfigError, ResumeError
from fastdata.image.augment import RandomResizedCropFlip
from fastdata.image.output import OutputFormat
from fastdata.image.recipes.mixing import batch_rng
from fastdata.options import OutputOptions
from fastdata.order.epoch import sample_rng
from fastdata.presets import (
    AutoAugment,
    CutMix,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomResizedCrop,
    ResizeCenterCrop,
    TrivialAugmentWide,
)

SIZE = 24
RECIPE = [RandomResizedCrop(SIZE), TrivialAugmentWide(), RandomErasing(p=0.5),
          RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])]


def every_batch(loader) -> list:
    return [clone(batch) for batch in loader]


@pytest.mark.parametrize("bgr", [False, True])
@pytest.mark.parametrize("policy", [TrivialAugmentWide(), RandAugment(2, 9), AutoAugment(),
                                    RandAugment(3, 20, interpolation="bilinear", fill=(200, 10, 60))])
def test_a_recipe_is_its_drawn_operations_on_the_crop(photos, policy, bgr, monkeypatch):
    """The loader's images are the crop preset's images with the policy, then the erasing, drawn from each sample's
    RNG after the crop's draw and applied to them (the operations are checked against torchvision in
    test_recipe_ops). `bgr`: without the region decoder the crop is decoded whole by OpenCV, in BGR order, which
    the grey weights, the fill and the erasing's colour follow."""
    if bgr:
        from fastdata.image import pipeline

        monkeypatch.setattr(pipeline, "region_decoder", lambda *_: None)
        monkeypatch.setattr(pipeline, "warn_fallback", lambda *_: None)
    path = photos[0]
    common = dict(batch_size=64, shuffle=False, num_workers=0, seed=3)
    plain = fastdata.loader(path, augment=RandomResizedCrop(SIZE), **common)
    erasing = RandomErasing(p=0.7, value=(1, 2, 3))
    recipe = fastdata.loader(path, augment=[RandomResizedCrop(SIZE), policy, erasing], **common)
    assert recipe.dataset.pipeline.bgr == bgr
    (crops, _), (got, _) = next(iter(plain)), next(iter(recipe))
    dataset = fastdata.dataset(path)
    preset = RandomResizedCropFlip(SIZE)
    for index, (crop, image) in enumerate(zip(crops, got, strict=True)):
        rng = sample_rng(3, 0, index)
        preset.params(int(dataset.reader.widths[index]), int(dataset.reader.heights[index]), rng)  # the crop's draw
        expected = np.ascontiguousarray(crop.permute(1, 2, 0).numpy())
        policy.apply(expected, rng, policy.context(False))
        erasing.apply(expected, rng, (1, 2, 3), OutputFormat(), False)
        assert np.array_equal(image.permute(1, 2, 0).numpy(), expected), index


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_the_same_batches_for_any_worker_count(fmt, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    runs = [every_batch(seeded_loader(path, augment=RECIPE, num_workers=workers)) for workers in (0, 2)]
    assert len(runs[0]) == -(-SOLID_COUNT // 8)
    assert same(runs[0], runs[1])
    again = every_batch(seeded_loader(path, augment=RECIPE, num_workers=0))
    assert same(runs[0], again)
    other_seed = every_batch(seeded_loader(path, augment=RECIPE, num_workers=0, seed=8))
    assert not same(runs[0], other_seed)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_recipe_resumes_exactly(fmt, workers, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    check_resumes(lambda w: seeded_loader(path, augment=RECIPE, num_workers=w), lambda n: [1, n // 2, n], workers)


def test_a_state_with_another_recipe_is_refused(solid_lmdb):
    state = seeded_loader(solid_lmdb, augment=RECIPE).state_dict()
    for other in ([RandomResizedCrop(SIZE), TrivialAugmentWide()], RandomResizedCrop(SIZE),
                  [RandomResizedCrop(SIZE), RandAugment(2, 9), RandomErasing(p=0.5)]):
        with pytest.raises(ResumeError, match="recipe"):
            seeded_loader(solid_lmdb, augment=other).load_state_dict(state)


class _GivenMixUp(v2.MixUp):
    """torchvision's MixUp with the lam fastdata drew (its own draw replaced)."""

    def __init__(self, lam: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lam = lam

    def make_params(self, flat_inputs):
        return {"lam": self.lam}


class _GivenCutMix(v2.CutMix):
    def __init__(self, box, lam: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.box, self.lam = box, lam

    def make_params(self, flat_inputs):
        return {"box": self.box, "lam_adjusted": self.lam}


@pytest.mark.parametrize("batch_preset", [MixUp(alpha=0.4), CutMix(alpha=1.0), MixUp(1.0, num_classes=5)])
def test_batch_presets_are_torchvisions_mixup_and_cutmix(solid_lmdb, batch_preset):
    """Float batches (normalised in the workers) mixed by fastdata equal torchvision v2's MixUp / CutMix of the
    unmixed batch with the same draw; labels float32 [B, num_classes], rows summing to 1."""
    options = dict(shuffle=False, output=OutputOptions(dtype=torch.float32))
    plain = every_batch(seeded_loader(solid_lmdb, augment=RandomResizedCrop(SIZE), **options))
    mixed = every_batch(seeded_loader(solid_lmdb, augment=[RandomResizedCrop(SIZE), batch_preset], **options))
    classes = batch_preset.num_classes or len(SOLID_CLASSES)
    for number, ((images, labels), (got, got_labels)) in enumerate(zip(plain, mixed, strict=True)):
        drawn = batch_preset.draw(batch_rng(7, 0, number * 8), SIZE, SIZE)  # keyed by the batch's first sample
        if drawn.kind == "mixup":
            reference = _GivenMixUp(drawn.lam, num_classes=classes)
        else:
            reference = _GivenCutMix(drawn.box, drawn.lam, num_classes=classes)
        want, want_labels = reference(images, labels)
        assert got_labels.dtype == torch.float32 and got_labels.shape == (len(labels), classes)
        assert torch.allclose(got_labels.sum(1), torch.ones(len(labels)))
        assert torch.allclose(got_labels, want_labels)
        assert torch.allclose(got, want, atol=1e-5), number


def test_uint8_batches_are_mixed_to_the_nearest_level(solid_lmdb):
    plain = every_batch(seeded_loader(solid_lmdb, augment=RandomResizedCrop(SIZE), shuffle=False))
    mixed = every_batch(seeded_loader(solid_lmdb, augment=[RandomResizedCrop(SIZE), MixUp(0.4)], shuffle=False))
    for number, ((images, _), (got, _)) in enumerate(zip(plain, mixed, strict=True)):
        lam = MixUp(0.4).draw(batch_rng(7, 0, number * 8), SIZE, SIZE).lam
        want = (images.float() * lam + images.roll(1, 0).float() * (1 - lam)).round()
        assert got.dtype == torch.uint8 and (got.float() - want).abs().max() <= 1


def erased(plain: torch.Tensor, got: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image that changed: the changed pixels of `got` (3 x N), and whether they form one rectangle."""
    found = []
    for before, after in zip(plain, got, strict=True):
        changed = (before != after).any(0)
        if changed.any():
            rows, cols = changed.any(1).nonzero(), changed.any(0).nonzero()
            top, bottom, left, right = int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())
            found.append((after[:, top:bottom + 1, left:right + 1].reshape(3, -1), changed.sum()))
    return found


def test_random_erasing_fills_in_the_batches_units(photos):
    """uint8 batches: the value's grey levels; floating batches: normalised units (0: the mean colour)."""
    path = photos[0]
    common = dict(batch_size=64, shuffle=False, num_workers=0, seed=1)
    plain, _ = next(iter(fastdata.loader(path, augment=RandomResizedCrop(SIZE), **common)))
    recipe = [RandomResizedCrop(SIZE), RandomErasing(p=1.0, value=(10, 20, 30))]
    got, _ = next(iter(fastdata.loader(path, augment=recipe, **common)))
    rectangles = erased(plain, got)
    assert len(rectangles) >= len(plain) * 0.8  # (10 tries can all miss)
    for pixels, _ in rectangles:
        assert (pixels == torch.tensor([[10], [20], [30]], dtype=torch.uint8)).all()
    floating = OutputOptions(dtype=torch.float32)
    plain_f, _ = next(iter(fastdata.loader(path, augment=RandomResizedCrop(SIZE), output=floating, **common)))
    recipe = [RandomResizedCrop(SIZE), RandomErasing(p=1.0)]
    got_f, _ = next(iter(fastdata.loader(path, augment=recipe, output=floating, **common)))
    for pixels, _ in erased(plain_f, got_f):
        assert pixels.abs().max() <= 0.5 / 255 / 0.224 + 1e-6  # the mean colour's nearest grey level
    with pytest.raises(ConfigError, match="floating batches"):
        fastdata.loader(path, augment=[RandomResizedCrop(SIZE), RandomErasing(value="random")], **common)


def test_every_rank_yields_the_same_number_of_batches(solid_lmdb):
    """DDP: each rank's loader yields len(loader) batches of one shape, labels mixed over all classes; a sample's
    augmentation is the same whichever rank (and world size) reads it."""
    by_rank = [every_batch(seeded_loader(solid_lmdb, augment=RECIPE, rank=r, world_size=3, shuffle=False))
               for r in range(3)]
    assert len({len(batches) for batches in by_rank}) == 1
    for batches in by_rank:
        for images, labels in batches:
            assert images.shape[1:] == (3, SIZE, SIZE) and labels.shape == (len(images), len(SOLID_CLASSES))
            assert torch.allclose(labels.sum(1), torch.ones(len(labels)))
    per_sample = [RandomResizedCrop(SIZE), TrivialAugmentWide(), RandomErasing(p=0.5)]
    whole = torch.cat([b[0] for b in every_batch(seeded_loader(solid_lmdb, augment=per_sample, shuffle=False,
                                                                batch_size=SOLID_COUNT))])
    for rank in range(3):
        images = torch.cat([b[0] for b in every_batch(seeded_loader(solid_lmdb, augment=per_sample, rank=rank,
                                                                    world_size=3, shuffle=False))])
        assert torch.equal(images, whole[rank::3])


@pytest.mark.parametrize(("augment", "match"), [
    ([RandomResizedCrop(SIZE), "not a preset"], "not a fastdata preset"),
    ([RandomResizedCrop(SIZE), MixUp(), CutMix()], "RandomChoice"),
    ([RandomResizedCrop(SIZE), MixUp(), TrivialAugmentWide()], "batch preset last"),
    ([TrivialAugmentWide()], "starts with the crop"),
    (TrivialAugmentWide(), "follows a crop"),
    ([], "starts with the crop"),
    ([RandomResizedCrop(SIZE), MixUp(num_classes=2)], "at least"),
    ([RandomResizedCrop(SIZE), RandomErasing(value=300)], "0..255"),
])
def test_wrong_recipes_are_refused(solid_lmdb, augment, match):
    with pytest.raises(ConfigError, match=match):
        seeded_loader(solid_lmdb, augment=augment)


def test_recipes_are_refused_where_they_cannot_run(solid_lmdb, small_text_lmdb):
    with pytest.raises(ConfigError, match="run on each crop in the workers"):
        seeded_loader(solid_lmdb, augment=[RandomResizedCrop(SIZE), TrivialAugmentWide()], decode="device",
                      device="cpu")
    with pytest.raises(ConfigError, match="mixes whole batches"):
        fastdata.dataset(solid_lmdb, augment=[RandomResizedCrop(SIZE), MixUp()])
    with pytest.raises(ConfigError, match="one dataset's loader"):
        seeded_loader([solid_lmdb, solid_lmdb], augment=RECIPE)
    with pytest.raises(ConfigError, match="holds text"):
        fastdata.loader(small_text_lmdb, augment=[RandomResizedCrop(SIZE), TrivialAugmentWide()])
    with pytest.raises(ConfigError, match="alpha"):
        MixUp(alpha=0)
    with pytest.raises(ConfigError, match="ImageNet"):
        AutoAugment(policy="cifar10")


def test_a_dataset_applies_the_per_sample_presets(solid_lmdb):
    """fastdata.dataset(augment=[crop, policy, ...]): ds[i] is the loader's sample i (no batch preset)."""
    recipe = [ResizeCenterCrop(SIZE), RandAugment(2, 15), RandomErasing(p=1.0, value=0)]
    ds = fastdata.dataset(solid_lmdb, augment=recipe)
    ds.set_epoch(0)
    images, _ = next(iter(fastdata.loader(solid_lmdb, batch_size=4, augment=recipe, shuffle=False, num_workers=0)))
    assert all(torch.equal(ds[i][0], images[i]) for i in range(4))


def test_a_floating_dataset_erases_in_normalised_units_as_its_loader_does(photos):
    """fastdata.dataset(output=floating): RandomErasing's value is in normalised units there too (0: the mean
    colour), so ds[i] is the loader's row i; "random" noise is refused for uint8 images when the dataset is made."""
    floating = OutputOptions(dtype=torch.float32)
    recipe = [RandomResizedCrop(SIZE), RandomErasing(p=1.0, value=0)]
    ds = fastdata.dataset(photos[0], augment=recipe, output=floating)
    ds.set_epoch(0)
    images, _ = next(iter(fastdata.loader(photos[0], batch_size=8, augment=recipe, output=floating, shuffle=False,
                                          num_workers=0)))
    assert all(torch.equal(ds[i][0], images[i]) for i in range(8))
    plain = fastdata.dataset(photos[0], augment=RandomResizedCrop(SIZE), output=floating)
    plain.set_epoch(0)
    for i in range(8):
        changed = (ds[i][0] != plain[i][0]).any(0)
        assert changed.any() and ds[i][0][:, changed].abs().max() <= 0.5 / 255 / 0.224 + 1e-6
    noise = [RandomResizedCrop(SIZE), RandomErasing(value="random")]
    assert fastdata.dataset(photos[0], augment=noise, output=floating)[0][0].dtype == torch.float32
    with pytest.raises(ConfigError, match="floating batches"):
        fastdata.dataset(photos[0], augment=noise)


def test_the_device_path_mixes_on_the_device(photos):
    """decode="device" (here device="cpu"): the batch preset mixes the device's batch; labels float [B, C] rows
    summing to 1; the same for any worker count and after a resume."""
    recipe = [RandomResizedCrop(SIZE), RandomChoice([MixUp(alpha=0.4), CutMix(alpha=1.0)])]

    def make(workers):
        return seeded_loader(photos[0], augment=recipe, num_workers=workers, decode="device", device="cpu")

    runs = [every_batch(make(workers)) for workers in (0, 1)]
    assert same(runs[0], runs[1])
    unmixed = every_batch(seeded_loader(photos[0], augment=RandomResizedCrop(SIZE), decode="device",
                                        device="cpu"))
    assert not same(runs[0], unmixed)
    for images, labels in runs[0]:
        assert labels.dtype == torch.float32 and labels.shape == (len(images), 3)
        assert torch.allclose(labels.sum(1), torch.ones(len(labels)))
    check_resumes(make, lambda n: [1], 1)


def test_a_borrowed_batch_gets_the_batch_presets_labels(solid_lmdb, tmp_path):
    """A batch whose samples were all skipped borrows one (fastdata.order.borrow): its labels are float rows over
    the classes like every other batch's."""
    path, _key = corrupt_copy(solid_lmdb, tmp_path, 2, b"not an image")
    loader = seeded_loader(path, augment=[RandomResizedCrop(SIZE), MixUp()], batch_size=1, shuffle=False,
                           on_error="skip")
    with pytest.warns(UserWarning, match="borrowed"):
        batches = every_batch(loader)
    assert len(batches) == SOLID_COUNT and len(loader.borrowed) == 1
    for _, labels in batches:
        assert labels.dtype == torch.float32 and labels.shape == (1, len(SOLID_CLASSES))
        assert torch.allclose(labels.sum(1), torch.ones(1))


def test_crops_wait_for_the_recipe_in_chunks_and_keep_their_rows(solid_lmdb, tmp_path, monkeypatch):
    """The workers apply the per-sample presets to chunks of crops (`RECIPE_CHUNK_BYTES`), not one by one: every
    row is still its own sample's crop with its own operations (`ds[i]`, which applies them sample by sample), with
    chunks ending mid-batch and a skipped sample shifting the rows after it; floating batches are the same in
    chunks of any size."""
    from fastdata.image import pipeline

    path, _ = corrupt_copy(solid_lmdb, tmp_path, 4, b"not an image")
    recipe = [RandomResizedCrop(SIZE), RandAugment(2, 15), RandomErasing(p=0.7, value=(9, 99, 199))]
    common = dict(batch_size=8, augment=recipe, shuffle=False, num_workers=0, on_error="skip")
    floating = OutputOptions(dtype=torch.float32)
    whole, _ = next(iter(fastdata.loader(path, output=floating, **common)))
    monkeypatch.setattr(pipeline, "RECIPE_CHUNK_BYTES", 3 * SIZE * SIZE * 3 + 5)  # 3 crops
    images, _ = next(iter(fastdata.loader(path, **common)))
    ds = fastdata.dataset(path, augment=recipe)
    ds.set_epoch(0)
    rows = [0, 1, 2, 3, 5, 6, 7]  # sample 4 is skipped
    assert len(images) == len(rows)
    for row, index in enumerate(rows):
        assert torch.equal(ds[index][0], images[row]), (row, index)
    chunked, _ = next(iter(fastdata.loader(path, output=floating, **common)))
    assert torch.equal(chunked, whole)


def test_a_recipe_on_a_batch_is_the_recipe_on_each_image():
    """`Recipe.apply_batch` (each operation on every image that drew it in turn) gives `apply`'s pixels image by
    image, and leaves each sample's RNG where `apply` leaves it (erasing's noise drawn last)."""
    from fastdata.image.recipes.ops import OpContext
    from fastdata.image.recipes.recipe import Recipe

    recipe = Recipe.of([RandAugment(3, 20, fill=(5, 6, 7)), RandomErasing(p=0.8, value="random"), AutoAugment()])
    output = OutputFormat(dtype=torch.float32)
    images = np.random.default_rng(0).integers(0, 256, (9, 20, 28, 3), dtype=np.uint8)
    for bgr in (False, True):
        one_by_one, batched = images.copy(), images.copy()
        rngs = [sample_rng(1, 2, index) for index in range(len(images))]
        for image, rng in zip(one_by_one, rngs, strict=True):
            recipe.apply(image, rng, OpContext(bgr), output)
        batch_rngs = [sample_rng(1, 2, index) for index in range(len(images))]
        recipe.apply_batch(batched, batch_rngs, OpContext(bgr), output)
        assert np.array_equal(batched, one_by_one)
        assert [r.random() for r in rngs] == [r.random() for r in batch_rngs]
