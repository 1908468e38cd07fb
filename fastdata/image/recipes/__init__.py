"""Training recipes beyond the crop: torchvision's augmentation policies, erasing and batch mixing, run where the
batch is built, and the image size a loader's epochs are made at (progressive resizing).

    ops.py        the policies' operations on an H x W x 3 uint8 crop, in place, in OpenCV (LUTs, one warp)
    policies.py   TrivialAugmentWide, RandAugment, AutoAugment: torchvision's operations and magnitude bins
    erasing.py    RandomErasing, in the units of the batches the loader delivers
    mixing.py     MixUp, CutMix, RandomChoice: one batch's images and labels mixed, seeded per batch
    recipe.py     a preset list (`augment=[RandomResizedCrop(224), TrivialAugmentWide(), ...]`) parsed and run
    sizes.py      ImageSizes: the size each epoch is made at, shared with the workers (`set_image_size`)

docs/images.md says what they give, how they agree with torchvision and what they cost.
"""
