"""The scripts in examples/ run as a user runs them (a subprocess, from the repository root) on tiny ImageFolder
trees, for a few steps, and train: the ResNet script with either loader, the Lightning DataModule with its train
and val loaders. Lightning is the `lightning` extra, which CI installs: without it the Lightning test fails."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import fastdata

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--batch-size", "8", "--image-size", "32", "--workers", "1"]  # 24 images: 3 batches an epoch


def run_example(script: str, *args: str) -> str:
    """Run examples/<script> with `args`; its output, or an AssertionError carrying it if it failed."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"examples/{script} exited with {done.returncode}:\n{output[-4000:]}"
    return output


def last_loss(output: str) -> float:
    return float(re.search(r"last loss (\S+)", output).group(1))


def test_train_resnet_with_fastdata_converts_then_trains(readme_trees: tuple[Path, Path]) -> None:
    train, _ = readme_trees
    output = run_example("train_resnet.py", "--data", str(train), "--loader", "fastdata", "--steps", "4", *TINY)
    assert fastdata.info(train.parent / "train.lmdb").num_samples == 24  # packed beside the tree, whole
    assert "done: 4 steps, 32 images" in output and "with the fastdata loader" in output
    assert "epoch 1" in output  # step 4 is the first of the second epoch
    assert math.isfinite(last_loss(output))


def test_train_resnet_with_torchvision_reads_the_tree(readme_trees: tuple[Path, Path]) -> None:
    train, _ = readme_trees
    output = run_example("train_resnet.py", "--data", str(train), "--loader", "torchvision", "--steps", "4", *TINY)
    assert not (train.parent / "train.lmdb").exists()  # the torchvision path converts nothing
    assert "done: 4 steps, 32 images" in output and "with the torchvision loader" in output
    assert math.isfinite(last_loss(output))


def test_lightning_datamodule_fits_with_train_and_val_loaders(readme_trees: tuple[Path, Path]) -> None:
    train, val = readme_trees
    output = run_example("lightning_datamodule.py", "--train", str(train), "--val", str(val), "--steps", "4", *TINY)
    assert fastdata.info(train.parent / "train.lmdb").num_samples == 24
    assert fastdata.info(val.parent / "val.lmdb").num_samples == 12
    done = re.search(r"done: (\d+) steps; train loader's next epoch (\d+); (\{.*\})", output)
    assert done, output[-4000:]
    assert done.group(1) == "4" and done.group(2) == "2"  # epochs 0 and 1 yielded, in Lightning's order
    assert "val_acc" in done.group(3) and "train_loss" in done.group(3)


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lightning_checkpoint_mid_epoch_resumes_the_same_batches(readme_trees: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    """Lightning saves the fastdata loader's state in its checkpoints and restores it: a run resumed from a
    checkpoint taken mid-epoch (after step 4, of 3-batch epochs) trains on exactly the batches the uninterrupted
    run had."""
    example = load_example("lightning_datamodule")
    L = example.L  # lightning.pytorch, as the example imports it
    from lightning.pytorch.callbacks import ModelCheckpoint

    train, val = readme_trees

    def fit(steps: int, checkpoints: Path, resume: Path | None = None) -> list[tuple[list[int], float]]:
        seen: list[tuple[list[int], float]] = []

        class Record(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                seen.append((batch[1].tolist(), float(batch[0].double().sum())))

        data = example.FastdataImageModule(train, val, batch_size=8, image_size=32, num_workers=1)
        data.prepare_data()
        data.setup("fit")
        trainer = L.Trainer(max_steps=steps, limit_val_batches=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=[example.SetEpoch(), Record(),
                                       ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=4, save_top_k=-1)])
        trainer.fit(example.Classifier(len(data.classes), arch="mobilenet_v3_small"), datamodule=data, ckpt_path=resume)
        return seen

    uninterrupted = fit(6, tmp_path / "run")
    (checkpoint,) = (tmp_path / "run").glob("*step=4*.ckpt")
    resumed = fit(6, tmp_path / "resumed", resume=checkpoint)
    assert len(uninterrupted) == 6
    assert resumed == uninterrupted[4:]
