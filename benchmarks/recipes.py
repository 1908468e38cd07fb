"""Modern training recipes at full speed: torchvision's recipes against fastdata's recipe presets, same run, same
bytes, same DataLoader settings (2 workers = the machine's cores by default, batch 128, 224 px).

1. RandomResizedCrop 224 + flip + TrivialAugmentWide + RandomErasing(p=0.25): torchvision ImageFolder + the
   transforms.v2 recipe (PIL until the erasing, as torchvision's reference recipe), fastdata.loader with the same
   v2 transform (a custom transform: uint8 tensors in), fastdata's presets
   (`augment=[RandomResizedCrop(224), TrivialAugmentWide(), RandomErasing(p=0.25)]`), and fastdata's
   RandomResizedCrop preset alone. Targets: the presets >= 2.5x torchvision's recipe and >= 80% of the crop alone.
2. The same with RandAugment(2, 9) in place of TrivialAugmentWide. Target: the presets >= 2.5x torchvision's.
3. MixUp / CutMix (RandomChoice, alpha 0.2 and 1.0), each recipe with and without: fastdata's presets mix each
   batch where the workers build it; torchvision's reference recipe mixes in the DataLoader's collate_fn. Target:
   fastdata's mixing costs at most 3% of its loader's rate.

The sample photos (`fastdata.tools.sample`) are converted to LMDB once (benchmarks/data, shared with the other
benchmarks); torchvision reads the ImageFolder's own files, less any the conversion rejected (the same bytes).
Every contender gets one untimed pass, the page cache warmed with its files and `--repeats` alternating runs
(`fastdata.tools.bench.run_contenders`), the two loaders of each ratio one after the other; the tables give
medians and the medians of the per-run ratios, the notes each run's ratio.

    python -m benchmarks.recipes --images 3000 --repeats 5

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder, dataset_for, per_run_ratios_text
from fastdata.formats.manifest import read_manifest
from fastdata.presets import CutMix, MixUp, RandAugment, RandomChoice, RandomErasing, RandomResizedCrop
from fastdata.presets import TrivialAugmentWide as TrivialAugment
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult, run_contenders
from fastdata.tools.bench_baseline import Baseline, choose_baseline
from fastdata.tools.bench_fair import dataset_files, median_ratio

SIZE = 224
ERASING = 0.25


def torchvision_recipe(policy: str, pil: bool):
    """torchvision's transforms.v2 recipe: RandomResizedCrop + flip + the policy (+ PILToTensor for PIL input) +
    RandomErasing."""
    from torchvision.transforms import v2

    chosen = v2.TrivialAugmentWide() if policy == "trivial" else v2.RandAugment(num_ops=2, magnitude=9)
    to_tensor = [v2.PILToTensor()] if pil else []
    return v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(), chosen, *to_tensor,
                       v2.RandomErasing(p=ERASING)])


def preset_recipe(policy: str | None, mix: bool = False) -> list:
    """fastdata's recipe presets (the crop alone when `policy` is None)."""
    if policy is None:
        return [RandomResizedCrop(SIZE)]
    chosen = TrivialAugment() if policy == "trivial" else RandAugment(2, 9)
    mixing = [RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])] if mix else []
    return [RandomResizedCrop(SIZE), chosen, RandomErasing(p=ERASING), *mixing]


def imagefolder_contender(name: str, source: Baseline, config: BenchConfig, policy: str, classes: int,
                          mix: bool = False) -> Contender:
    """torchvision ImageFolder (PIL decode) + the v2 recipe; with `mix`, MixUp / CutMix in the collate_fn as
    torchvision's reference recipe does (on the batch made float: its MixUp takes no uint8)."""
    import torch
    from torchvision import datasets
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension
    from torchvision.transforms import v2

    transform = torchvision_recipe(policy, pil=True)
    skip, root = source.excluded_paths, source.root
    collate: Callable | None = None
    if mix:
        choice = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0,
                                                                                       num_classes=classes)])

        def collate(batch):  # (torchvision's MixUp takes float images)
            images, labels = torch.utils.data.default_collate(batch)
            return choice(images.float(), labels)

    def valid(path: str) -> bool:
        return has_file_allowed_extension(path, IMG_EXTENSIONS) and Path(path).relative_to(root).as_posix() not in skip

    def make() -> Iterable:
        data = datasets.ImageFolder(str(root), transform=transform, is_valid_file=valid, allow_empty=True)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                                           **config.settings.dataloader_kwargs())

    per_image = sum(p.stat().st_size for p in source.files) / max(1, len(source.files))
    return Contender(LoaderResult(name, role="baseline"), make, per_image, list(source.files))


def fastdata_loader(name: str, path, config: BenchConfig, augment) -> Contender:
    """fastdata.loader over the LMDB with `augment` (presets, or a torchvision transform) and the bench's
    settings."""
    import fastdata

    settings = config.settings

    def make() -> Iterable:
        return fastdata.loader(path, batch_size=config.batch_size, augment=augment, **settings.loader_kwargs())

    manifest = read_manifest(path)
    return Contender(LoaderResult(name), make, manifest.data_bytes / max(1, manifest.num_samples),
                     dataset_files(path))


def ratio(result: LoaderResult, base: LoaderResult) -> float:
    return median_ratio([r.images_per_s for r in result.runs], [b.images_per_s for b in base.runs])


def main() -> None:
    args = arguments(__doc__, images=3000, epochs=2, batch_size=128, workers=None).parse_args()
    src = cached_sample_imagefolder(args.data, args.images)
    path = dataset_for(args.data, args.images)
    source = choose_baseline(path, src)
    classes = len(read_manifest(path).classes)
    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, image_size=SIZE, augment="train",
                         workers=args.workers, repeats=args.repeats)
    # run in this order, round after round: the two loaders of each ratio the tables give run one after the other
    # (fastdata's recipe beside the crop alone, its mixing and torchvision's recipe), so that a drift of the
    # machine between them is small
    contenders = {
        "fd-crop": fastdata_loader("fastdata RandomResizedCrop preset alone", path, config, preset_recipe(None)),
        "fd-trivial": fastdata_loader("fastdata presets recipe", path, config, preset_recipe("trivial")),
        "fd-trivial-mix": fastdata_loader("fastdata presets recipe + RandomChoice([MixUp, CutMix])", path, config,
                                          preset_recipe("trivial", mix=True)),
        "tv-trivial": imagefolder_contender("torchvision ImageFolder + v2 recipe", source, config, "trivial",
                                            classes),
        "tv-trivial-mix": imagefolder_contender("torchvision ImageFolder + v2 recipe, MixUp/CutMix in collate_fn",
                                                source, config, "trivial", classes, mix=True),
        "fd-v2-trivial": fastdata_loader("fastdata.loader + the same v2 transform", path, config,
                                         torchvision_recipe("trivial", pil=False)),
        "fd-rand": fastdata_loader("fastdata presets recipe", path, config, preset_recipe("rand")),
        "tv-rand": imagefolder_contender("torchvision ImageFolder + v2 recipe", source, config, "rand", classes),
        "fd-v2-rand": fastdata_loader("fastdata.loader + the same v2 transform", path, config,
                                      torchvision_recipe("rand", pil=False)),
    }
    print(f"{config.warmup_passes} untimed + {config.epochs} timed passes x {args.images} images per run, batch "
          f"{config.batch_size}, {SIZE} px, {config.repeats} alternating runs each, DataLoader settings "
          f"{config.settings}")
    for line in source.notes():
        print(line)
    results = dict(zip(contenders, run_contenders(list(contenders.values()), config,
                                                  lambda line: print(f"  {line}", flush=True),
                                                  f"{args.images:,} images"), strict=True))
    runs = f"medians of {config.repeats} alternating runs, ratios the medians of the per-run ratios"

    def verdict(key: str, base: str, target: float, what: str) -> str:
        got = ratio(results[key], results[base])
        met = "meets" if got >= target else "MISSES"
        return (f"{results[key].name} {what}: {got:.2f}x ({met} the {target:g}x target; per run: "
                f"{per_run_ratios_text(results[key], results[base])})")

    trivial = ["tv-trivial", "fd-v2-trivial", "fd-trivial", "fd-crop"]
    report.table(f"RandomResizedCrop {SIZE} + flip + TrivialAugmentWide + RandomErasing(p={ERASING}): {runs}",
                 ["loader", "images/s", "vs torchvision", "vs the crop preset alone"],
                 [[results[k].name, f"{results[k].images_per_s:,.0f}",
                   f"{ratio(results[k], results['tv-trivial']):.2f}x",
                   f"{ratio(results[k], results['fd-crop']):.2f}x"] for k in trivial],
                 notes=[verdict("fd-trivial", "tv-trivial", 2.5, "vs torchvision"),
                        verdict("fd-trivial", "fd-crop", 0.8, "vs the crop preset alone")])
    rand = ["tv-rand", "fd-v2-rand", "fd-rand"]
    report.table(f"RandomResizedCrop {SIZE} + flip + RandAugment(2, 9) + RandomErasing(p={ERASING}): {runs}",
                 ["loader", "images/s", "vs torchvision"],
                 [[results[k].name, f"{results[k].images_per_s:,.0f}",
                   f"{ratio(results[k], results['tv-rand']):.2f}x"] for k in rand],
                 notes=[verdict("fd-rand", "tv-rand", 2.5, "vs torchvision")])
    pairs = [("tv-trivial", "tv-trivial-mix"), ("fd-trivial", "fd-trivial-mix")]
    cost = 1 - ratio(results["fd-trivial-mix"], results["fd-trivial"])
    report.table(f"MixUp / CutMix (RandomChoice, alpha 0.2 / 1.0) on the TrivialAugmentWide recipe: {runs}",
                 ["loader", "images/s without", "images/s with", "cost"],
                 [[results[mixed].name, f"{results[plain].images_per_s:,.0f}",
                   f"{results[mixed].images_per_s:,.0f}", f"{100 * (1 - ratio(results[mixed], results[plain])):.1f}%"]
                  for plain, mixed in pairs],
                 notes=[f"fastdata's mixing costs {100 * cost:.1f}% of its loader's rate "
                        f"({'meets' if cost <= 0.03 else 'MISSES'} the 3% target; rate with / without per run: "
                        f"{per_run_ratios_text(results['fd-trivial-mix'], results['fd-trivial'])})"])


if __name__ == "__main__":
    main()
