"""End to end: the documented path from an ImageFolder tree to training batches, and the demo."""

from __future__ import annotations

import re

import torch
from builders.images import SOLID_COUNT, sample_id_of, solid_label

import fastdata
from fastdata.cli import main
from fastdata.image.jpeg.extension import HOW_TO_BUILD, NOT_BUILT, extension_built
from fastdata.tools import demo
from fastdata.tools.bench import run_bench
from fastdata.tools.demo import run_demo


def test_cli_convert_then_loader_is_a_drop_in_for_imagefolder(capsys, solid_tree, tmp_path):
    out = tmp_path / "train.lmdb"
    assert main(["convert", "imagefolder", str(solid_tree.root), str(out), "--workers", "2", "-q"]) == 0
    capsys.readouterr()
    loader = fastdata.loader(out, batch_size=10, image_size=20, num_workers=0, seed=0)
    assert len(loader) == 5
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 20, 20)
        for image, label in zip(images, labels, strict=True):
            seen.append(sample_id_of(image))
            assert int(label) == solid_label(seen[-1])
    assert sorted(seen) == list(range(SOLID_COUNT))


def test_cli_convert_wds_then_loader(capsys, solid_tree, tmp_path):
    out = tmp_path / "shards"
    code = main(["convert", "imagefolder", str(solid_tree.root), str(out), "--format", "wds", "--shard-size",
                 "8KB", "--workers", "1", "-q"])
    assert code == 0, capsys.readouterr().err
    loader = fastdata.loader(out, batch_size=10, image_size=20, num_workers=0, augment="val")
    ids = [sample_id_of(image) for images, _ in loader for image in images]
    assert sorted(ids) == list(range(SOLID_COUNT))


def test_demo_runs_on_a_tiny_sample(tmp_path):
    lines: list[str] = []
    run_demo(tmp_path / "demo", images=8, epochs=1, batch_size=4, workers=1, echo=lines.append)
    text = "\n".join(lines)
    assert "wrote" in text
    assert "torchvision ImageFolder" in text and "fastdata (lmdb)" in text
    assert len(re.findall(r"\d+\.\d\dx$", text, flags=re.MULTILINE)) == 2  # a ratio per loader
    assert ("without its region decoder" in text) == (not extension_built())  # said only where it was not built
    assert len(fastdata.dataset(tmp_path / "demo" / "sample.lmdb")) == 8
    # a second run reuses the sample and replaces the dataset
    run_demo(tmp_path / "demo", images=8, epochs=1, batch_size=4, workers=1, echo=lines.append)
    assert fastdata.info(tmp_path / "demo" / "sample.lmdb").num_samples == 8


def test_the_demo_says_beside_its_table_that_the_machine_was_busy_and_the_region_decoder_not_built(
        tmp_path, monkeypatch, without_extension):
    """Other processes' CPU is what the meter measured while each run was timed; it is made busy here by giving the
    bench's results that figure (half of every CPU), not by loading the machine, so that no timing decides the test.
    Without the C extension (installed where no compiler was) the demo also says what to install."""
    def measured_on_a_busy_machine(*args, **kwargs):
        results = run_bench(*args, **kwargs)
        for result in results:
            for run in result.runs:
                run.system = {**run.system, "others_cpu_cores": 0.5 * len(run.system["cpu_per_core_percent"])}
        return results

    monkeypatch.setattr(demo, "run_bench", measured_on_a_busy_machine)
    lines: list[str] = []
    run_demo(tmp_path / "demo", images=8, epochs=1, batch_size=4, workers=1, echo=lines.append)
    last_row = max(i for i, line in enumerate(lines) if re.search(r"\d+\.\d\dx$", line))
    busy, decoder = lines[last_row + 1:last_row + 3]
    assert busy.startswith("note: the machine was busy: other processes took up to 50% of its CPU")
    assert busy.endswith("rerun on a quiet machine for figures to keep")
    assert decoder.startswith("note: fastdata's figure is without its region decoder")
    assert NOT_BUILT in decoder and decoder.endswith(HOW_TO_BUILD)
