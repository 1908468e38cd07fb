"""fastdata in PyTorch Lightning: a `LightningDataModule` with train and val loaders, and a small fit.

    pip install 'fastdata[lightning]'
    python examples/lightning_datamodule.py --train train/ --val val/ --steps 200

`prepare_data` packs each ImageFolder tree into LMDB once (Lightning runs it on one process per node);
`train_dataloader` / `val_dataloader` return `fastdata.loader`s, built after Lightning has set up DDP, so each rank
takes its own part of every epoch (no DistributedSampler: Lightning leaves loaders that are not DataLoaders
alone). Batches arrive as uint8 and `on_after_batch_transfer` makes them float and normalised on the device.

Epochs: Lightning calls `set_epoch` only on a DataLoader's sampler, so the `SetEpoch` callback calls the loader's
own at the start of every training epoch. Resuming: a fastdata loader has `state_dict` / `load_state_dict`, which
Lightning saves in its checkpoints and restores, so a run resumed from a checkpoint taken during training
(`ModelCheckpoint(every_n_train_steps=...)`, say) continues with exactly the batches the uninterrupted run had.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torchvision
from torch import nn

import fastdata

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class FastdataImageModule(L.LightningDataModule):
    """Train and val loaders over ImageFolder trees, packed into LMDB once by `prepare_data`."""

    def __init__(self, train_dir: Path, val_dir: Path, batch_size: int = 64, image_size: int = 224,
                 num_workers: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.train_dir, self.val_dir = Path(train_dir), Path(val_dir)
        self.batch_size, self.image_size, self.num_workers, self.seed = batch_size, image_size, num_workers, seed
        self.train_loader: Any = None
        self.classes: list[str] = []

    @property
    def train_lmdb(self) -> Path:
        return self.train_dir.parent / f"{self.train_dir.name}.lmdb"

    @property
    def val_lmdb(self) -> Path:
        return self.val_dir.parent / f"{self.val_dir.name}.lmdb"

    @staticmethod
    def _converted(path: Path) -> bool:
        return (path / "manifest.json").exists()

    def prepare_data(self) -> None:
        for src, out in ((self.train_dir, self.train_lmdb), (self.val_dir, self.val_lmdb)):
            if not self._converted(out):
                print(fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(progress=False)), flush=True)

    def setup(self, stage: str) -> None:
        self.classes = fastdata.dataset(self.train_lmdb).classes

    def train_dataloader(self) -> Any:
        self.train_loader = fastdata.loader(self.train_lmdb, batch_size=self.batch_size, augment="train",
                                            image_size=self.image_size, num_workers=self.num_workers,
                                            seed=self.seed, drop_last=True)
        return self.train_loader

    def val_dataloader(self) -> Any:
        return fastdata.loader(self.val_lmdb, batch_size=self.batch_size, augment="val", image_size=self.image_size,
                               num_workers=self.num_workers, shuffle=False)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        images, labels = batch
        mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1) * 255
        return (images.float() - mean) / std, labels


class SetEpoch(L.Callback):
    """Keep the fastdata train loader on Lightning's epoch counter (as DistributedSampler.set_epoch would be)."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loader = trainer.datamodule.train_loader
        if loader is not None:
            loader.set_epoch(trainer.current_epoch)


class Classifier(L.LightningModule):
    """A torchvision ResNet trained with SGD: the model side is plain Lightning."""

    def __init__(self, num_classes: int, arch: str = "resnet18", lr: float = 0.05) -> None:
        super().__init__()
        self.model = getattr(torchvision.models, arch)(num_classes=num_classes)
        self.lr = lr
        self.criterion = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = self.criterion(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        logits = self.model(images)
        self.log("val_loss", self.criterion(logits, labels), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, required=True, help="the training ImageFolder tree")
    parser.add_argument("--val", type=Path, required=True, help="the validation ImageFolder tree")
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--steps", type=int, default=100, help="training steps (Trainer max_steps)")
    parser.add_argument("--val-batches", type=int, default=None, help="val batches per check (default: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)

    L.seed_everything(0, workers=False)
    data = FastdataImageModule(args.train, args.val, batch_size=args.batch_size, image_size=args.image_size,
                               num_workers=args.workers)
    data.prepare_data()  # here, once, to know the classes before the model is built (Lightning calls it again)
    data.setup("fit")
    model = Classifier(num_classes=len(data.classes), arch=args.arch)
    trainer = L.Trainer(max_steps=args.steps, limit_val_batches=args.val_batches, accelerator="auto", devices=1,
                        callbacks=[SetEpoch()], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=data)
    metrics = {name: round(float(value), 4) for name, value in trainer.callback_metrics.items()}
    print(f"done: {trainer.global_step} steps; train loader's next epoch {data.train_loader.epoch}; {metrics}",
          flush=True)


if __name__ == "__main__":
    main()
