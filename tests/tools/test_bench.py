"""bench (functional only, no timing assertions): both loaders run over a tiny dataset and the table has a
row per loader with a ratio against the baseline; the fairness rules hold by construction (same DataLoader
settings, same warm-up, rejected files left out, a re-encoded dataset compared on its own stored bytes,
ratios as medians of per-run ratios)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders.images import BAD_FILES, build_bad_tree, build_solid_tree, build_tricky_tree

import fastdata
from fastdata.cli import main
from fastdata.errors import ConfigError
from fastdata.formats.manifest import read_manifest
from fastdata.meter.report import BUSY_SHARE
from fastdata.tools.bench import (
    BenchConfig,
    LoaderResult,
    RunResult,
    busy_machine_note,
    format_summary,
    format_table,
    run_bench,
    time_loader,
)
from fastdata.tools.bench_baseline import (
    EXPORT_MARKER,
    export_imagefolder,
    export_path,
    imagefolder_baseline,
    reencoding,
)
from fastdata.tools.bench_fair import (
    alternate,
    evict_page_cache,
    loader_settings,
    median_ratio,
    per_run_ratios,
    warm_page_cache,
)

COUNT = 14
RATIO = re.compile(r"\d+\.\d\dx\s*$")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    tree = build_solid_tree(root / "src", count=COUNT)
    fastdata.convert_imagefolder(tree.root, root / "tiny.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    fastdata.convert_imagefolder(
        tree.root,
        root / "tiny_wds",
        fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=1, progress=False),
    )
    return tree.root, root / "tiny.lmdb", root / "tiny_wds"


@pytest.fixture(scope="module")
def resized(tmp_path_factory):
    """The tricky tree (JPEG, PNG, BMP, odd names) plus an empty class that sorts first, converted with
    --max-size 32: most images re-encoded."""
    root = tmp_path_factory.mktemp("bench_resized")
    tree = build_tricky_tree(root / "src")
    (tree.root / "Aardvark").mkdir()  # empty: every other class's label depends on it being exported too
    fastdata.convert_imagefolder(
        tree.root, root / "small.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False, max_size=32)
    )
    fastdata.convert_imagefolder(
        tree.root,
        root / "small_wds",
        fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=1, progress=False, max_size=32),
    )
    return tree.root, root / "small.lmdb", root / "small_wds"


@pytest.mark.parametrize("augment", ["train", "val"])
def test_run_bench_with_baseline(tiny, augment):
    src, lmdb_out, _ = tiny
    config = BenchConfig(epochs=1, batch_size=4, image_size=24, augment=augment, workers=0, repeats=1)
    progress: list[str] = []
    results = run_bench(lmdb_out, config, baseline_imagefolder=src, progress=progress.append)
    assert [r.name for r in results] == ["torchvision ImageFolder", "fastdata (lmdb)"]
    for result in results:
        assert len(result.runs) == 1
        run = result.runs[0]
        assert run.images == COUNT  # the timed pass, after one untimed warm-up pass
        assert run.seconds > 0 and run.first_batch_s > 0
        assert run.bytes_per_image > 0
        assert result.images_per_s > 0 and result.mb_per_s > 0
    assert sum("run 1/1" in line for line in progress) == 2 and all("bench:" in line for line in progress)
    assert any("read every loader's files once before timing" in line for line in progress)
    table = format_table(results)
    lines = table.splitlines()
    assert lines[0].startswith("baseline: ") and "images/s" in lines[1] and lines[1].rstrip().endswith("vs baseline")
    rows = [line for line in lines if line.startswith(("torchvision", "fastdata"))]
    assert len(rows) == 2
    assert all(RATIO.search(row) for row in rows), table
    assert rows[0].rstrip().endswith("1.00x")
    assert "DIFFERENT INPUTS" not in table and "different inputs" not in format_summary(results)


def test_run_bench_wds_without_baseline_and_repeats(tiny):
    _, _, wds_out = tiny
    config = BenchConfig(epochs=2, batch_size=4, image_size=16, augment="val", workers=0, repeats=2)
    results = run_bench(wds_out, config)
    assert [r.name for r in results] == ["fastdata (wds)"]
    assert len(results[0].runs) == 2
    assert all(run.images == 2 * COUNT for run in results[0].runs)
    table = format_table(results)
    assert "fastdata (wds)" in table and table.rstrip().endswith("1.00x")


def test_ratios_are_medians_of_per_run_ratios():
    rates, base_rates = [300, 500, 400], [100, 200, 400]
    assert per_run_ratios(rates, base_rates) == [3.0, 2.5, 1.0]
    assert median_ratio(rates, base_rates) == 2.5  # the ratio of the medians would be 400 / 200 = 2.0
    with pytest.raises(ConfigError, match="one baseline run per run"):
        median_ratio([1.0, 2.0], [1.0])

    def result(name, rates):
        return LoaderResult(name, [RunResult(name, n, 1.0, 0.1, 1000.0) for n in rates])

    base, fast = result("baseline", base_rates), result("fast", rates)
    assert fast.images_per_s == 400 and base.images_per_s == 200  # medians of the runs
    assert fast.ratio_to(base) == 2.5
    lines = format_table([base, fast]).splitlines()
    assert lines[-2].rstrip().endswith("1.00x")
    assert lines[-1].rstrip().endswith("2.50x")
    assert format_summary([LoaderResult("b", base.runs, role="baseline"), fast]) == "  fast: 2.50x b"


def test_alternate_runs_round_after_round():
    calls = []
    alternate(["a", "b", "c"], 2, lambda name, repeat: calls.append(f"{name}{repeat}"))
    assert calls == ["a0", "b0", "c0", "a1", "b1", "c1"]
    with pytest.raises(ConfigError, match="at least 1"):
        alternate(["a"], 0, lambda *_: None)


def test_bench_defaults_are_fair():
    config = BenchConfig()
    assert config.repeats == 3 and config.warmup_passes == 1 and config.page_cache == "warm"
    with pytest.raises(ConfigError, match="page_cache"):
        BenchConfig(page_cache="hot")


def test_baseline_dataloader_gets_fastdatas_settings(tiny):
    """The baseline factory builds a real DataLoader with the workers, persistence, pinning and prefetch
    that fastdata.loader's own DataLoader has."""
    src, lmdb_out, _ = tiny
    config = BenchConfig(batch_size=4, image_size=24, workers=2)
    baseline = imagefolder_baseline(src, config)()
    fast = fastdata.loader(lmdb_out, batch_size=4, image_size=24, num_workers=2)
    inner = fast._loader  # the torch DataLoader fastdata.loader built with its defaults
    for name in ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor"):
        assert getattr(baseline, name) == getattr(inner, name), name
    assert baseline.persistent_workers is True and baseline.prefetch_factor == inner.prefetch_factor
    settings = loader_settings(2)
    assert settings == config.settings
    passed = fastdata.loader(lmdb_out, batch_size=4, image_size=24, **settings.loader_kwargs())._loader
    assert [getattr(passed, n) for n in ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor")] == \
        [getattr(inner, n) for n in ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor")]
    no_workers = imagefolder_baseline(src, BenchConfig(workers=0))()
    assert no_workers.num_workers == 0 and no_workers.persistent_workers is False


def test_a_val_bench_gives_everyone_the_val_loaders_persistence(tiny):
    """fastdata.loader keeps no workers between passes for augment="val": the baselines of a val bench get the
    same setting, and fastdata is run with it."""
    src, lmdb_out, _ = tiny
    config = BenchConfig(batch_size=4, image_size=24, workers=2, augment="val")
    own = fastdata.loader(lmdb_out, batch_size=4, image_size=24, augment="val", num_workers=2)._loader
    assert config.settings.persistent_workers is False is own.persistent_workers
    assert imagefolder_baseline(src, config)().persistent_workers is False
    assert BenchConfig(workers=2).settings.persistent_workers is True


def test_warmup_passes_are_untimed_and_alike():
    passes = []

    class Passes:
        """A re-iterable loader of 3 batches of 2 that records each pass."""

        def __iter__(self):
            passes.append(len(passes))
            for _ in range(3):
                yield [0, 0], [1, 2]

    run = time_loader("x", Passes, epochs=2, bytes_per_image=1.0, warmup_passes=1)
    assert len(passes) == 3 and run.images == 2 * 6  # one untimed pass, two timed ones
    passes.clear()
    run = time_loader("x", Passes, epochs=2, bytes_per_image=1.0, warmup_passes=0)
    assert len(passes) == 2 and run.images == 2 * 6 and run.first_batch_s > 0
    assert run.data_wait_fraction is not None  # timed through fastdata.meter
    passes.clear()
    run = time_loader("x", Passes, epochs=1, bytes_per_image=1.0, metered=False)  # a bare loop
    assert len(passes) == 2 and run.images == 6 and run.data_wait_fraction is None and run.timeline == {}


def test_page_cache_helpers(tmp_path):
    files = []
    for i, size in enumerate((0, 5, 3 << 20)):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * size)
        files.append(path)
    assert warm_page_cache(files, chunk=1 << 20) == 5 + (3 << 20)
    assert evict_page_cache(files) is True
    with pytest.raises(FileNotFoundError):
        warm_page_cache([tmp_path / "missing"])


def test_cold_page_cache_and_no_warmup_run(tiny):
    src, lmdb_out, _ = tiny
    config = BenchConfig(epochs=1, batch_size=4, image_size=16, workers=0, repeats=1, warmup_passes=0,
                         page_cache="cold")
    progress: list[str] = []
    results = run_bench(lmdb_out, config, baseline_imagefolder=src, progress=progress.append)
    assert [r.runs[0].images for r in results] == [COUNT, COUNT]
    assert not any("page cache" in line for line in progress)


# ------------------------------------------------------------------------------------------- rejected files


def test_bench_leaves_out_the_files_the_conversion_rejected(tmp_path, capsys):
    tree = build_bad_tree(tmp_path / "src")
    out = tmp_path / "bad.lmdb"
    summary = fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert sorted(r["path"] for r in summary.rejected) == sorted(BAD_FILES)
    code = main(["bench", str(out), "--baseline-imagefolder", str(tree.root), "--epochs", "1", "--batch-size", "2",
                 "--workers", "0", "--image-size", "16", "--repeats", "1", "--no-upper-bound", "--step", "none"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith(("torchvision", "fastdata"))]
    assert len(rows) == 2 and all(RATIO.search(row) for row in rows)
    note = next(line for line in captured.out.splitlines() if "left out" in line)
    assert f"{len(BAD_FILES)} file(s)" in note and "rejected" in note
    assert all(path in note for path in BAD_FILES)
    assert "left out" in captured.err  # said before the runs too


def test_baseline_reads_exactly_the_accepted_files(tmp_path):
    tree = build_bad_tree(tmp_path / "src")
    out = tmp_path / "bad.lmdb"
    fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    config = BenchConfig(epochs=1, batch_size=2, image_size=16, workers=0, repeats=1)
    results = run_bench(out, config, baseline_imagefolder=tree.root)
    assert [r.runs[0].images for r in results] == [len(tree.images), len(tree.images)]
    assert len(results[0].notes) == 2 and "3 file(s)" in results[0].notes[1]


def test_baseline_refuses_a_tree_that_is_not_the_source(tmp_path, tiny):
    _, lmdb_out, _ = tiny
    other = build_bad_tree(tmp_path / "other")  # classes good/more, not alpha/beta/gamma
    with pytest.raises(ConfigError, match="classes"):
        run_bench(lmdb_out, BenchConfig(workers=0, repeats=1), baseline_imagefolder=other.root)


# ------------------------------------------------------------------------------------------- re-encoded data


def stored(path: Path) -> dict[str, tuple[bytes, int]]:
    ds = fastdata.dataset(path)
    samples = (ds.encoded(i) for i in range(len(ds))) if hasattr(ds, "encoded") else \
        ds.encoded_samples(list(range(len(ds.shards))))
    return {s.key: (s.data, s.label) for s in samples}


@pytest.mark.parametrize("which", ["lmdb", "wds"])
def test_export_holds_the_stored_bytes_with_the_same_labels(resized, tmp_path, which):
    from torchvision.datasets import ImageFolder

    src, lmdb_out, wds_out = resized
    dataset = lmdb_out if which == "lmdb" else wds_out
    manifest = read_manifest(dataset)
    assert reencoding(manifest) == {"max_size": 32}
    files = export_imagefolder(dataset, tmp_path / "export")
    want = stored(dataset)
    assert len(files) == len(want) == manifest.num_samples
    folder = ImageFolder(str(tmp_path / "export"), loader=lambda p: Path(p).read_bytes(), allow_empty=True)
    assert folder.classes == manifest.classes and manifest.classes[0] == "Aardvark"
    got = sorted((folder[i][0], folder[i][1]) for i in range(len(folder)))
    assert got == sorted(want.values())  # every stored sample's bytes, once, under its own label
    changed = [key for key, (data, _) in want.items() if data != (src / key).read_bytes()]
    assert len(changed) > len(want) // 2  # most were re-encoded: the source's bytes are not the stored ones
    assert (tmp_path / "export" / EXPORT_MARKER).is_file()
    assert export_imagefolder(dataset, tmp_path / "export") == files  # an export of the same dataset is reused
    with pytest.raises(ConfigError, match="not an export"):
        export_imagefolder(dataset, src)


def test_reencoded_dataset_is_compared_on_its_stored_bytes_by_default(resized, tmp_path, capsys):
    src, lmdb_out, _ = resized
    export = tmp_path / "export"
    args = ["bench", str(lmdb_out), "--baseline-imagefolder", str(src), "--epochs", "1", "--batch-size", "4",
            "--workers", "0", "--image-size", "16", "--repeats", "1", "--no-upper-bound", "--step", "none"]
    assert main([*args, "--export-dir", str(export)]) == 0
    out = capsys.readouterr()
    assert "different inputs" not in out.out.lower()
    assert "same stored bytes" in out.out and "max_size=32" in out.out
    exported = {p.relative_to(export).as_posix(): p.read_bytes() for p in export.rglob("*")
                if p.is_file() and p.name != EXPORT_MARKER}
    for key, (data, label) in stored(lmdb_out).items():
        path = export_path(key, read_manifest(lmdb_out).classes[label], "jpg" if data[:2] == b"\xff\xd8" else
                           Path(key).suffix.lower().lstrip("."))
        assert exported[str(path)] == data, key

    assert main([*args, "--baseline-source"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("DIFFERENT INPUTS: torchvision ImageFolder (original files) reads the "
                                          f"original files of {src}")
    assert "(different inputs)" in out


def test_default_export_goes_to_a_temporary_directory(resized):
    src, lmdb_out, _ = resized
    config = BenchConfig(epochs=1, batch_size=4, image_size=16, workers=0, repeats=1)
    progress: list[str] = []
    results = run_bench(lmdb_out, config, baseline_imagefolder=src, progress=progress.append)
    assert results[0].runs[0].images == read_manifest(lmdb_out).num_samples and not results[0].different_inputs
    where = next(line for line in progress if "exporting its stored bytes" in line).split(" into ")[1].split()[0]
    assert not Path(where).exists()  # removed after the run


def test_export_paths():
    assert str(export_path("cat/a/b.JPEG", "cat", "jpg")) == "cat/a/b.JPEG"
    assert str(export_path("cat/v1.2/img.v2.final.PNG", "cat", "jpg")) == "cat/v1.2/img.v2.final.PNG.jpg"
    assert str(export_path("x.tif", "dog", "tiff")) == "dog/x.tif"  # a key outside its class folder
    for key in ("/etc/passwd", "cat/../../x.jpg", ""):
        with pytest.raises(ConfigError, match="not a relative path"):
            export_path(key, "cat", "jpg")


# ------------------------------------------------------------------------------------------- a busy machine


def metered(name: str, others: float | None, cpus: int = 2) -> LoaderResult:
    """A loader's result whose one timed run the meter saw other processes take `others` cores beside (of the
    machine's `cpus`); None: not metered. The figure is given, never made by loading the machine."""
    system = None if others is None else {"others_cpu_cores": others, "cores": cpus,
                                          "cpu_per_core_percent": [50.0] * cpus}
    return LoaderResult(name, [RunResult(name, 100, 1.0, 0.1, 1000.0, system=system)])


def test_the_busy_machine_note_says_what_other_processes_took_and_to_rerun_on_a_quiet_machine():
    note = busy_machine_note([metered("baseline", 0.1), metered("fast", 0.9)])
    assert note.startswith("note: the machine was busy: other processes took up to 45% of its CPU (0.9 cores, "
                           "while fast was timed)")
    assert note.endswith("rerun on a quiet machine for figures to keep")
    at_the_threshold = BUSY_SHARE * 2
    assert busy_machine_note([metered("fast", at_the_threshold)]) != ""
    assert busy_machine_note([metered("baseline", 0.0), metered("fast", at_the_threshold * 0.99)]) == ""
    assert busy_machine_note([metered("fast", 0.9, cpus=16)]) == ""  # a share of the whole machine: 6% here
    assert busy_machine_note([metered("baseline", None), metered("fast", None)]) == ""  # not metered: nothing to say


def test_the_bench_command_prints_the_note_beside_its_table(capsys, tiny, monkeypatch):
    _, lmdb_out, _ = tiny
    results = [metered("torchvision ImageFolder", 0.05), metered("fastdata (lmdb)", 1.2)]
    monkeypatch.setattr("fastdata.tools.bench.run_bench", lambda *args, **kwargs: results)
    assert main(["bench", str(lmdb_out), "--repeats", "1", "--no-upper-bound"]) == 0
    lines = capsys.readouterr().out.splitlines()
    last_row = max(i for i, line in enumerate(lines) if RATIO.search(line))
    assert lines[last_row + 1] == busy_machine_note(results) and "60% of its CPU" in lines[last_row + 1]


# ------------------------------------------------------------------------------------------------------ CLI


def test_bench_cli(capsys, tiny):
    src, lmdb_out, _ = tiny
    code = main(["bench", str(lmdb_out), "--baseline-imagefolder", str(src), "--epochs", "1", "--repeats", "1",
                 "--batch-size", "4", "--workers", "0", "--image-size", "24"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith(("torchvision", "fastdata"))]
    assert [row.split("  ")[0] for row in rows] == ["torchvision ImageFolder", "fastdata (lmdb)"]
    assert all(RATIO.search(row) for row in rows), captured.out
    assert "bench:" in captured.err  # progress goes to stderr, the table to stdout
    assert "Traceback" not in captured.err


def test_bench_cli_baseline_options_need_a_baseline(capsys, tiny):
    _, lmdb_out, _ = tiny
    assert main(["bench", str(lmdb_out), "--baseline-source"]) == 2
    assert "apply to --baseline-imagefolder" in capsys.readouterr().err


def test_the_benchmarks_readme_sample_has_the_layout_fastdata_bench_prints():
    """benchmarks/README.md shows what `fastdata bench` printed on the demo sample: an output block written from the
    harness's run of benchmarks/bench_sample.py (never typed by hand), which runs the very command the text names;
    once measured, its header and rows have the columns `format_table` prints for the same loaders today."""
    from benchmarks.bench_sample import bench_command

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"

    text = (benchmarks / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### `fastdata bench` on the demo sample"):]
    section = section[:section.index("\n### ")]
    assert "<!-- output: read.json bench_sample 0 -->" in section
    command = " ".join(bench_command(2, 128, 3)[:-2])  # as the text names it, less --repeats (bench's default)
    assert command in " ".join(section.split()).replace("` `", " ")
    if "```\n" not in section:  # not measured yet: the block says so, and names the command that measures it
        assert "Not measured yet" in section
        return
    sample = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)].splitlines()
    names = ["torchvision ImageFolder", "fastdata (lmdb)", "synthetic upper bound"]
    results = [LoaderResult(name, [RunResult(name, 100, 1.0, 0.5, 1000.0, 0.5)]) for name in names]
    printed = format_table(results, data_wait=True).splitlines()
    header = next(i for i, line in enumerate(sample) if line.startswith("loader "))
    assert sample[header:header + 2] == printed[1:3]
    for line, name in zip(sample[header + 2:header + 5], names, strict=True):
        assert re.fullmatch(re.escape(name) + r" +[\d,]+ +[\d.]+ +[\d.]+ +\d+ +\d+% +[\d.]+x", line), line
        assert len(line) == len(printed[3])
