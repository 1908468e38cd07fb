"""Train a ResNet on an ImageFolder tree, loaded by torchvision or by fastdata: one flag switches.

    python examples/train_resnet.py --data train/ --loader torchvision --steps 200
    python examples/train_resnet.py --data train/ --loader fastdata --steps 200   # packs train/ into train.lmdb once

Both loaders apply the same augmentation (random resized crop + horizontal flip) and the same ImageNet
normalisation. What differs is where the work happens: torchvision's DataLoader decodes, crops and normalises each
image in its workers and ships float32 batches; fastdata's workers build whole uint8 batches (a quarter of the
bytes) and the model's device makes them float and normalises them. Runs on the GPU when there is one, else on the
CPU. `--meter` wraps either loader in `fastdata.meter` and prints its verdict (is the loop waiting for data?).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torchvision
from torch import nn

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an ImageFolder tree (class folders of images)")
    parser.add_argument("--loader", choices=("torchvision", "fastdata"), default="fastdata")
    parser.add_argument("--lmdb", type=Path, default=None,
                        help="fastdata's converted dataset (default: DATA.lmdb beside DATA, made if missing)")
    parser.add_argument("--arch", default="resnet18", help="a torchvision.models constructor (default: resnet18)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to train for")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="loader worker processes (default: one per available core, for both loaders)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--meter", action="store_true", help="print fastdata.meter's report at the end")
    return parser.parse_args(argv)


def torchvision_loader(args: argparse.Namespace) -> tuple[torch.utils.data.DataLoader, list[str]]:
    """The usual ImageFolder pipeline: PIL decode + transforms per image in the workers, float32 batches."""
    from torchvision import transforms as T

    transform = T.Compose([T.RandomResizedCrop(args.image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.data, transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=torch.cuda.is_available(),
                                         persistent_workers=args.workers > 0)
    return loader, dataset.classes


def fastdata_loader(args: argparse.Namespace) -> tuple[Iterable, list[str]]:
    """fastdata over the same tree, packed once into LMDB: uint8 batches built whole in the workers."""
    import fastdata

    lmdb = args.lmdb or args.data.parent / f"{args.data.name}.lmdb"
    if not (lmdb / "manifest.json").exists():
        print(f"converting {args.data} to {lmdb} (once; a rerun resumes an interrupted conversion)", flush=True)
        summary = fastdata.convert_imagefolder(args.data, lmdb, fastdata.ImageFolderOptions(progress=False))
        print(summary, flush=True)
    loader = fastdata.loader(lmdb, batch_size=args.batch_size, augment="train", image_size=args.image_size,
                             num_workers=args.workers, seed=args.seed, drop_last=True)
    return loader, loader.classes


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loader, classes = torchvision_loader(args) if args.loader == "torchvision" else fastdata_loader(args)
    if len(loader) == 0:
        raise SystemExit(f"{args.data}: fewer images than --batch-size {args.batch_size}, so no full batch")

    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    model = getattr(torchvision.models, args.arch)(num_classes=len(classes))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    criterion = nn.CrossEntropyLoss()

    batches: Iterable = loader
    metered = None
    if args.meter:
        import fastdata

        batches = metered = fastdata.meter(loader)
    print(f"training {args.arch} ({len(classes)} classes) on {device} with the {args.loader} loader: "
          f"{len(loader)} batches of {args.batch_size} per epoch, {args.steps} steps", flush=True)
    model.train()
    step, epoch, seen, loss = 0, 0, 0, torch.tensor(float("nan"))
    start = time.perf_counter()
    while step < args.steps:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)  # fastdata: reshuffles each pass anyway; this keeps it on our epoch counter
        for images, labels in batches:
            images = images.to(device, non_blocking=True)
            if images.dtype == torch.uint8:  # fastdata's batches: float and normalised here, on the device
                images = (images.float() - mean) / std
            images = images.contiguous(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step, seen = step + 1, seen + len(labels)
            if step % args.log_every == 0 or step == args.steps:
                rate = seen / (time.perf_counter() - start)
                print(f"step {step:>6}  epoch {epoch}  loss {loss.item():.4f}  {rate:,.1f} images/s", flush=True)
            if step == args.steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    print(f"done: {step} steps, {seen} images in {seconds:.1f} s ({seen / seconds:,.1f} images/s) with the "
          f"{args.loader} loader; last loss {loss.item():.4f}", flush=True)
    if metered is not None:
        print(metered.report(), flush=True)


if __name__ == "__main__":
    main()
