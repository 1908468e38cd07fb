"""`fastdata bench` on datasets converted from sources that are not files torchvision reads (`convert hf`,
`convert webdataset`): `--baseline-export` times a torchvision Dataset over the dataset's stored bytes exported as
files (the same bytes and labels fastdata reads); `--baseline-imagefolder` / `--baseline-list` on such a dataset
stop with one line naming the flag that fits, not a traceback or a comparison with unrelated files."""

from __future__ import annotations

import pytest
from builders.images import build_solid_tree
from builders.runs import assert_one_line_error, cli
from builders.webdataset import wds_sample, write_wds_shards

import fastdata
from fastdata.tools.bench import BenchConfig, run_bench
from fastdata.tools.bench_baseline import export_samples

WDS_COUNT = 10


@pytest.fixture(scope="module")
def converted(hf_sources, tmp_path_factory):
    """The saved HF dataset converted to LMDB, and WebDataset shards (multi-label) converted to WebDataset shards."""
    root = tmp_path_factory.mktemp("bench_sources")
    fastdata.convert_hf(hf_sources.saved, root / "hf.lmdb", fastdata.HfOptions(workers=1, progress=False))
    tree = build_solid_tree(root / "tree", count=WDS_COUNT)
    shards = write_wds_shards(root / "shards", [wds_sample(tree, r, "multi") for r in tree.images])
    fastdata.convert_webdataset(
        shards[0].parent,
        root / "wds_out",
        fastdata.WebDatasetOptions(format="wds", label_key="label", shard_size="8KB", workers=1, progress=False),
    )
    return {"hf": (hf_sources.saved, root / "hf.lmdb"), "webdataset": (shards[0].parent, root / "wds_out")}


def stored(path) -> list[tuple[bytes, object]]:
    ds = fastdata.dataset(path)
    samples = (ds.encoded(i) for i in range(len(ds))) if hasattr(ds, "encoded") else \
        ds.encoded_samples(list(range(len(ds.shards))))
    return [(s.data, s.label) for s in samples]


@pytest.mark.parametrize("kind", ["hf", "webdataset"])
def test_the_export_baseline_reads_the_stored_bytes(converted, kind, tmp_path):
    _, out = converted[kind]
    config = BenchConfig(epochs=1, batch_size=4, image_size=16, augment="val", workers=0, repeats=1,
                         warmup_passes=0)
    progress: list[str] = []
    results = run_bench(out, config, baseline_export=True, export_dir=tmp_path / "export", progress=progress.append)
    count = len(fastdata.dataset(out))
    assert results[0].name == "torchvision Dataset" and results[0].role == "baseline"
    assert [r.runs[0].images for r in results] == [count, count]
    assert not results[0].different_inputs and "the same bytes fastdata reads" in results[0].inputs
    samples = export_samples(out, tmp_path / "export")  # the bench's export, reused (its marker names the dataset)
    assert sorted((path.read_bytes(), label) for path, label in samples) == sorted(stored(out))


@pytest.mark.parametrize("kind", ["hf", "webdataset"])
def test_source_flags_name_the_baseline_that_fits(converted, kind, capsys):
    src, out = converted[kind]
    for flag in ("--baseline-imagefolder", "--baseline-list"):
        code, _, err = cli(capsys, "bench", out, flag, src, "--epochs", "1", "--repeats", "1", "--workers", "0")
        assert code == 2
        assert_one_line_error(err, "--baseline-export")
    code, _, err = cli(capsys, "bench", out, "--baseline-export", "--baseline-source")
    assert code == 2
    assert_one_line_error(err, "--baseline-source")


def test_bench_cli_with_the_export_baseline(converted, tmp_path, capsys):
    _, out = converted["webdataset"]
    code, stdout, err = cli(capsys, "bench", out, "--baseline-export", "--export-dir", tmp_path / "export",
                            "--epochs", "1", "--repeats", "1", "--batch-size", "4", "--workers", "0",
                            "--image-size", "16", "--step", "none", "--no-upper-bound")
    assert code == 0, err
    rows = [line.split("  ")[0] for line in stdout.splitlines() if line.startswith(("torchvision", "fastdata"))]
    assert rows == ["torchvision Dataset", "fastdata (wds)"]
    assert f"baseline inputs: the stored bytes of {out} exported as files" in stdout
    assert (tmp_path / "export").is_dir()  # --export-dir applies to --baseline-export, and is kept


def test_image_text_pairs_have_no_export_baseline(pairs_lmdb, tmp_path, capsys):
    """Their samples carry captions, which the baseline's (image, label) Dataset cannot read: one line saying so,
    not a TypeError from writing the export's marker."""
    code, _, err = cli(capsys, "bench", pairs_lmdb, "--baseline-export", "--export-dir", tmp_path / "export",
                       "--epochs", "1", "--repeats", "1", "--workers", "0")
    assert code == 2
    assert_one_line_error(err, "captions")
    with pytest.raises(fastdata.errors.ConfigError, match="captions"):
        export_samples(pairs_lmdb, tmp_path / "export")
