"""The tools on datasets converted from file lists: `fastdata verify --source LIST` lists the source again as the
conversion did and names what differs (samples, labels, metadata); `fastdata bench --baseline-list LIST` times a
torchvision-style Dataset over the listed images (less the rejected ones; the exported stored bytes when the
dataset was re-encoded), with multi-label targets as multi-hot rows."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from builders.images import build_solid_tree, sample_id_of
from builders.lists import list_frame, write_list
from builders.runs import assert_one_line_error, cli
from builders.sources import multi_hot, multi_labels

import fastdata
from fastdata.tools.bench import BenchConfig, run_bench
from fastdata.tools.bench_baseline import choose_baseline, list_baseline
from fastdata.tools.verify import verify

COUNT = 12


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """A list of the solid tree with one missing image (rejected), its multi-label LMDB conversion, and a re-encoded
    (--max-size) one."""
    root = tmp_path_factory.mktemp("listed")
    tree = build_solid_tree(root / "images", count=COUNT)
    frame = pd.concat([list_frame(tree, labels="name-sets"),
                       pd.DataFrame([{"path": "beta/gone.png", "label": ["beta"]}])], ignore_index=True)
    list_path = write_list(frame, tree.root / "train.jsonl")
    fastdata.convert_list(list_path, root / "multi.lmdb", fastdata.FileListOptions(workers=1, progress=False))
    fastdata.convert_list(
        list_path, root / "small.lmdb", fastdata.FileListOptions(workers=1, progress=False, max_size=16)
    )
    return tree, frame, list_path, root / "multi.lmdb", root / "small.lmdb"


def test_verify_against_the_list(listed, tmp_path, capsys):
    tree, frame, list_path, out, _ = listed
    report = verify(out, source=list_path, decode=True)
    assert report.ok, str(report)
    assert any("against the source" in item for item in report.checked)

    changed = frame.copy()
    changed.at[0, "label"] = ["alpha", "beta", "gamma"] if changed.at[0, "label"] != ["alpha", "beta", "gamma"] \
        else ["alpha"]
    changed.loc[1, "name"] = "renamed"
    other = write_list(changed, tree.root / "changed.jsonl")
    report = verify(out, source=other)
    problems = "\n".join(report.problems)
    assert f"1 sample(s) labelled differently: {frame.at[0, 'path']}" in problems
    assert f"1 sample(s) with other metadata: {frame.at[1, 'path']}" in problems
    code, stdout, _ = cli(capsys, "verify", out, "--source", other)
    assert code == 1 and "labelled differently" in stdout


def test_bench_baseline_is_a_dataset_over_the_list(listed):
    _, _, list_path, out, _ = listed
    config = BenchConfig(epochs=1, batch_size=4, image_size=16, augment="val", workers=0, repeats=1,
                         warmup_passes=0)
    results = run_bench(out, config, baseline_list=list_path)
    assert [r.name for r in results] == ["torchvision Dataset", "fastdata (lmdb)"]
    assert [r.runs[0].images for r in results] == [COUNT, COUNT]  # the rejected row left out of the baseline
    assert any("left out" in note and "beta/gone.png" in note for note in results[0].notes)


def test_the_list_baseline_gives_multi_hot_targets_like_the_loader(listed):
    _, _, list_path, out, _ = listed
    config = BenchConfig(epochs=1, batch_size=4, image_size=16, augment="val", workers=0, repeats=1)
    baseline = choose_baseline(out, list_path)
    assert baseline.samples is not None and len(baseline.samples) == COUNT and not baseline.different_inputs
    seen = []
    for images, targets in list_baseline(baseline.samples, config, baseline.num_classes, baseline.label_kind)():
        assert targets.dtype == torch.float32 and targets.shape == (len(images), 3)
        for image, target in zip(images, targets, strict=True):
            seen.append(sample_id_of(image))
            assert target.tolist() == multi_hot(multi_labels(seen[-1]))
    assert sorted(seen) == list(range(COUNT))


def test_a_re_encoded_list_dataset_is_compared_with_its_exported_bytes(listed, tmp_path):
    _, _, list_path, _, small = listed
    baseline = choose_baseline(small, list_path, export_dir=tmp_path / "export")
    ds = fastdata.dataset(small)
    assert [path.read_bytes() for path, _ in baseline.samples] == [ds.reader.read(i) for i in range(len(ds))]
    assert [label for _, label in baseline.samples] == [ds.reader.label(i) for i in range(len(ds))]
    again = choose_baseline(small, list_path, export_dir=tmp_path / "export")  # reused, labels included
    assert again.samples == baseline.samples
    original = choose_baseline(small, list_path, baseline_source=True, export_dir=tmp_path / "unused")
    assert original.different_inputs and not (tmp_path / "unused").exists()


def test_bench_flags_must_fit_how_the_dataset_was_converted(listed, solid_lmdb, solid_tree, capsys):
    _, _, list_path, out, _ = listed
    code, _, err = cli(capsys, "bench", out, "--baseline-imagefolder", list_path.parent)
    assert code == 2
    assert_one_line_error(err, "converted from a file list", "--baseline-list")
    code, _, err = cli(capsys, "bench", solid_lmdb, "--baseline-list", list_path)
    assert code == 2
    assert_one_line_error(err, "converted from an ImageFolder, not a file list", "--baseline-imagefolder")
