"""fastdata tune and num_workers="auto" (functional only, no timing assertions): the search's decisions on a given
table of throughputs (the real search code, with the measurement injected), the result stored and reused by
"auto", a result for other options or another dataset not reused, "auto" without a result warning once and using
the default, tune.json accepted by verify, and the CLI end to end over a tiny dataset with real measurements."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import warnings

import pytest
import torch
from builders.images import build_solid_tree
from builders.runs import assert_one_line_error, cli

import fastdata
from fastdata.config import available_cores
from fastdata.errors import ConfigError
from fastdata.loader.tuning import TUNE_FILE, default_workers
from fastdata.tools.tune import Measured, Point, TuneConfig, ladder, measure_point, placement_note, run_tune, search
from fastdata.tools.tune_steps import parse_step
from fastdata.tools.verify import verify

COUNT = 14
TINY = {"batch_size": 4, "image_size": 16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    tree = build_solid_tree(root / "src", count=COUNT)
    fastdata.convert_imagefolder(tree.root, root / "tiny.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    other = build_solid_tree(root / "src2", count=COUNT + 3)
    fastdata.convert_imagefolder(
        other.root, root / "other.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
    )
    return root / "tiny.lmdb", root / "other.lmdb"


@pytest.fixture
def dataset(tiny, tmp_path):
    """A fresh copy of the tiny dataset (tune writes tune.json into it)."""
    return shutil.copytree(tiny[0], tmp_path / "d.lmdb")


def table(rates: dict[tuple[int, int], float], waits: dict[int, float] | None = None, seconds: float = 1.0):
    """A measurement that answers from a table of images/s per (workers, prefetch), recording what was asked."""
    asked: list[Point] = []

    def measure(point: Point) -> Measured:
        asked.append(point)
        wait = (waits or {}).get(point.num_workers, 0.5)
        return Measured(point, rates[(point.num_workers, point.prefetch_factor)], wait, seconds)

    return measure, asked


def full(rates_by_workers: dict[int, float], prefetch_bonus: dict[int, float] | None = None):
    bonus = prefetch_bonus or {}
    return {(w, p): r * bonus.get(p, 1.0) for w, r in rates_by_workers.items() for p in (2, 4, 8)}


# ------------------------------------------------------------------------------------------------- the search


def test_ladder_doubles_up_to_the_cap():
    assert ladder(1) == [1]
    assert ladder(3) == [1, 2, 3]
    assert ladder(17) == [1, 2, 4, 8, 16, 17]


def test_the_search_picks_the_best_point_it_measured():
    rates = full({1: 100, 2: 180, 3: 250, 4: 240}, {4: 1.1, 8: 0.9})
    measure, asked = table(rates)
    found = search(measure, max_workers=4, budget_s=100, tolerance=0.0, confirm=0)
    measured = {(m.point.num_workers, m.point.prefetch_factor): m.images_per_s for m in found.measured}
    best = max(measured, key=measured.get)
    assert (found.choice.point.num_workers, found.choice.point.prefetch_factor) == best == (3, 4)
    assert len(asked) == len(set(asked))  # no point measured twice
    assert (3, 2) in measured  # the gap between rungs 2 and 4 was bisected


def test_within_tolerance_the_cheaper_point_wins():
    measure, _ = table(full({1: 100, 2: 199, 3: 200}))
    found = search(measure, max_workers=3, budget_s=100, tolerance=0.03)
    assert (found.choice.point.num_workers, found.choice.point.prefetch_factor) == (2, 2)
    assert search(table(full({1: 100, 2: 199, 3: 200}))[0], max_workers=3, budget_s=100,
                  tolerance=0.0).choice.point.num_workers == 3


def test_climbing_stops_when_the_step_is_the_wall():
    """Once the loop no longer waits for data, more workers cannot help: not measured, and prefetch neither."""
    measure, asked = table(full({1: 100, 2: 150, 4: 151, 8: 152}), waits={1: 0.4, 2: 0.01})
    found = search(measure, max_workers=8, budget_s=100, confirm=0)
    assert [p.num_workers for p in asked] == [1, 2]
    assert found.choice.point == Point(2, 2)
    assert any("the step is the wall" in note for note in found.notes)
    assert any(note.startswith("prefetch: not searched") for note in found.notes)


def test_climbing_stops_when_throughput_falls_and_the_gap_is_bisected():
    measure, asked = table(full({1: 100, 2: 180, 3: 200, 4: 260, 5: 250, 6: 230, 8: 150}))
    search(measure, max_workers=8, budget_s=100, prefetch=(2,), confirm=1)
    assert [p.num_workers for p in asked] == [1, 2, 4, 8, 3, 6, 5, 4, 5]  # then the two best again


def test_the_leaders_are_measured_again_and_a_lucky_window_does_not_decide():
    readings = {2: [250.0] * 3, 3: [300.0, 200.0, 200.0]}  # 3 workers: one lucky first window

    def measure(point: Point) -> Measured:
        return Measured(point, readings[point.num_workers].pop(0) if point.num_workers in readings else 100.0,
                        0.5, 1.0)

    found = search(measure, max_workers=3, budget_s=100, prefetch=(2,), confirm=2)
    assert found.choice.point == Point(2, 2)
    assert {m.point.num_workers: m.runs for m in found.points()} == {1: 1, 2: 3, 3: 3}
    assert found.get(Point(3, 2)).images_per_s == pytest.approx(700 / 3)
    readings.update({2: [250.0], 3: [300.0]})
    assert search(measure, max_workers=3, budget_s=100, prefetch=(2,), confirm=0).choice.point == Point(3, 2)


def test_the_budget_bounds_the_search():
    measure, asked = table(full({1: 100, 2: 200, 4: 300, 8: 400, 9: 500}), seconds=10.0)
    found = search(measure, max_workers=9, budget_s=35)
    assert len(asked) == 3  # a fourth point would end at 40 s
    assert found.seconds == 30
    assert any(note.startswith("budget:") for note in found.notes)


def test_every_decode_placement_gets_its_own_climb():
    def measure(point: Point) -> Measured:
        rate = {"worker": {1: 100, 2: 150, 3: 160}, "device": {1: 302, 2: 310, 3: 305}}[point.decode]
        return Measured(point, rate[point.num_workers], 0.5, 1.0)

    found = search(measure, max_workers=3, budget_s=100, decodes=("worker", "device"), prefetch=(2,))
    assert found.choice.point == Point(1, 2, "device")  # 302 is within 3% of 310, with fewer workers
    assert found.best("worker").point == Point(3, 2, "worker")


def test_a_short_budget_still_measures_every_decode_placement_first():
    """Where to decode is measured before how many workers: each placement at the most workers first, then the
    faster placement's climb (a budget spent climbing the first placement never measured the device)."""
    asked: list[Point] = []

    def measure(point: Point) -> Measured:
        asked.append(point)
        rate = {"worker": 100.0 * point.num_workers, "device": 2000.0}[point.decode]
        return Measured(point, rate, 0.5, 10.0)

    found = search(measure, max_workers=16, budget_s=35, decodes=("worker", "device"), prefetch=(2,))
    assert asked[:2] == [Point(16, 2, "worker"), Point(16, 2, "device")]
    assert asked[2].decode == "device"  # the faster placement is searched next
    assert found.choice.point.decode == "device" and set(found_decodes(found)) == {"worker", "device"}


def found_decodes(found) -> list[str]:
    return [m.point.decode for m in found.points()]


# ----------------------------------------------------------------------------------- stored, reused by "auto"


def test_the_result_is_stored_beside_the_dataset_and_auto_reuses_it(dataset):
    rates = full({1: 100, 2: 260, 3: 250}, {4: 1.05, 8: 1.0})
    measure, _ = table(rates)
    config = TuneConfig(max_workers=3, **TINY)
    result = run_tune(dataset, config, measure=measure)
    assert result.stored == dataset / TUNE_FILE
    stored = json.loads((dataset / TUNE_FILE).read_text())
    assert stored["kind"] == "fastdata.tune" and len(stored["entries"]) == 1
    assert (stored["entries"][0]["choice"]["num_workers"], stored["entries"][0]["choice"]["prefetch_factor"]) == (2, 4)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastdata.loader(dataset, num_workers="auto", prefetch_factor="auto", **TINY)
    assert not [w for w in caught if "no tune result" in str(w.message)]
    assert (loader.num_workers, loader.options.prefetch_factor) == (2, 4)
    assert loader.tuned.source == str(dataset / TUNE_FILE)
    assert sum(len(labels) for _, labels in loader) == COUNT
    # only one of them "auto": the other as given
    loader = fastdata.loader(dataset, num_workers="auto", prefetch_factor=3, **TINY)
    assert (loader.num_workers, loader.options.prefetch_factor) == (2, 3)
    assert fastdata.loader(dataset, num_workers=1, **TINY).tuned is None
    assert verify(dataset).ok, str(verify(dataset))


def test_a_result_for_other_options_or_another_dataset_is_not_reused(dataset, tiny, tmp_path):
    measure, _ = table(full({1: 100, 2: 50, 3: 40}))
    run_tune(dataset, TuneConfig(max_workers=3, **TINY), measure=measure)
    with pytest.warns(RuntimeWarning, match=r"batch_size 4 \(this loader: 8\).*--batch-size 8 --image-size 16"):
        loader = fastdata.loader(dataset, num_workers="auto", batch_size=8, image_size=16)
    assert (loader.num_workers, loader.tuned.source) == (default_workers(), "default")
    with pytest.warns(RuntimeWarning, match=r"image_size \[16, 16\] \(this loader: \[24, 24\]\)"):
        fastdata.loader(dataset, num_workers="auto", batch_size=4, image_size=24)
    with pytest.warns(RuntimeWarning, match=r"augment train \(this loader: val\)"):
        fastdata.loader(dataset, num_workers="auto", augment="val", **TINY)
    # another dataset: its own fingerprint, so even a copied tune.json does not apply
    other = shutil.copytree(tiny[1], tmp_path / "other.lmdb")
    shutil.copy(dataset / TUNE_FILE, other / TUNE_FILE)
    with pytest.warns(RuntimeWarning, match=r"the stored results differ: dataset "):
        loader = fastdata.loader(other, num_workers="auto", **TINY)
    assert loader.num_workers == default_workers()


def test_auto_without_a_result_warns_once_and_uses_the_default(dataset, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = fastdata.loader(dataset, num_workers="auto", prefetch_factor="auto", tune_dir=tmp_path / "none",
                                **TINY)
        second = fastdata.loader(dataset, num_workers="auto", prefetch_factor="auto", tune_dir=tmp_path / "none",
                                 **TINY)
    ours = [w for w in caught if "no tune result" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert f"nothing stored in {dataset / TUNE_FILE}" in str(ours[0].message)
    assert "fastdata tune" in str(ours[0].message)
    for loader in (first, second):
        assert (loader.num_workers, loader.options.prefetch_factor) == (min(available_cores(), 16), 2)
        assert loader.tuned.source == "default"


def test_a_tune_dir_keeps_the_result_where_only_loaders_given_it_look(dataset, tmp_path):
    measure, _ = table(full({1: 300, 2: 100, 3: 100}))
    result = run_tune(dataset, TuneConfig(max_workers=3, **TINY), tune_dir=tmp_path / "cache", measure=measure)
    assert result.stored.parent == tmp_path / "cache" and not (dataset / TUNE_FILE).exists()
    assert fastdata.loader(dataset, num_workers="auto", tune_dir=tmp_path / "cache", **TINY).num_workers == 1
    with pytest.warns(RuntimeWarning, match="no tune result"):
        fastdata.loader(dataset, num_workers="auto", tune_dir=tmp_path / "elsewhere", **TINY)


def test_a_damaged_tune_file_is_one_error_naming_it(dataset):
    (dataset / TUNE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match=rf"{TUNE_FILE}: not a fastdata tune result .*delete it"):
        fastdata.loader(dataset, num_workers="auto", **TINY)


def test_num_workers_takes_an_int_or_auto(dataset):
    with pytest.raises(ConfigError, match="num_workers must be an int or 'auto', got 'many'"):
        fastdata.loader(dataset, num_workers="many", **TINY)
    with pytest.raises(ConfigError, match="prefetch_factor must be an int or 'auto'"):
        fastdata.loader(dataset, prefetch_factor="2", **TINY)
    with pytest.raises(ConfigError, match="tune_dir applies to num_workers='auto' or prefetch_factor='auto'"):
        fastdata.loader(dataset, num_workers=1, tune_dir=dataset, **TINY)


# ------------------------------------------------------------------------------------------ real measurement


def test_a_real_point_measures_images_and_data_wait(dataset):
    config = TuneConfig(window_s=0.05, **TINY)
    before = {p.pid for p in multiprocessing.active_children()}
    measured = measure_point(dataset, Point(2, 2), config, parse_step("2ms"))
    assert measured.images_per_s > 0 and measured.seconds > 0
    assert measured.data_wait is not None and 0 <= measured.data_wait <= 1
    assert {p.pid for p in multiprocessing.active_children()} <= before  # its workers are gone


def test_steps_parse():
    assert parse_step("50ms").name == "50ms" and parse_step("7").name == "7ms"
    assert parse_step("none").work is None
    with pytest.raises(ConfigError, match="step must be none, to-device, a step time"):
        parse_step("50 seconds!")


def test_cli_tune_then_auto(capsys, dataset, tmp_path):
    code, out, err = cli(capsys, "tune", dataset, "--batch-size", 4, "--image-size", 16, "--budget", 30,
                         "--window", "0.05", "--max-workers", 2, "--step", "1ms")
    assert code == 0, err
    assert "<- choice" in out and "choice: num_workers=" in out and f"kept in {dataset / TUNE_FILE}" in out
    assert "tune: workers=1 prefetch=2 decode=worker" in err and "Traceback" not in err
    entry = json.loads((dataset / TUNE_FILE).read_text())["entries"][0]
    assert entry["step"] == "1ms" and entry["key"]["batch_size"] == 4
    loader = fastdata.loader(dataset, num_workers="auto", prefetch_factor="auto", **TINY)
    assert loader.num_workers == entry["choice"]["num_workers"] in (1, 2)
    assert loader.options.prefetch_factor == entry["choice"]["prefetch_factor"]


def test_cli_tune_refuses_a_bad_step(capsys, dataset):
    code, _, err = cli(capsys, "tune", dataset, "--step", "fast!")
    assert code == 2 and err.startswith("error: step must be none, to-device")


def test_cli_tune_over_text_is_refused_in_one_line(capsys, text_mix):
    """Not about an image option the user never gave (the CLI's defaults are image options): tune says in one
    line that it measures image loaders, for text datasets in either format."""
    for path in text_mix[:2]:
        code, out, err = cli(capsys, "tune", path)
        assert code == 2 and out == ""
        assert_one_line_error(err, f"{path}: holds text; fastdata tune measures image loaders")
        assert "augment" not in err and not (path / TUNE_FILE).exists()


def test_auto_over_text_warns_and_uses_the_default(small_text_lmdb):
    with pytest.warns(RuntimeWarning, match="fastdata tune measures image datasets; give a text loader its"):
        loader = fastdata.loader(small_text_lmdb, num_workers="auto", batch_size=2,
                                 text=fastdata.TextOptions(seq_len=16))
    assert (loader.num_workers, loader.tuned.source) == (default_workers(), "default")


def test_webdataset_shards_are_tuned_and_reused_too(tiny, tmp_path):
    src = build_solid_tree(tmp_path / "src", count=COUNT).root
    shards = tmp_path / "shards"
    fastdata.convert_imagefolder(
        src, shards, fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=1, progress=False)
    )
    measure, _ = table(full({1: 100, 2: 300, 3: 90}))
    assert run_tune(shards, TuneConfig(max_workers=3, **TINY), measure=measure).stored == shards / TUNE_FILE
    loader = fastdata.loader(shards, num_workers="auto", **TINY)
    assert (loader.num_workers, loader.tuned.source) == (2, str(shards / TUNE_FILE))
    assert verify(shards).ok, str(verify(shards))


def test_placements_compared_without_a_model_step_say_what_they_cannot_see():
    both = ("worker", "device")
    for step in ("none", "to-device", "50ms"):
        note = placement_note(both, parse_step(step).name)
        assert note is not None and "--step resnet50" in note and "shares the GPU" in note
    assert placement_note(both, "resnet18") is None  # a real step: the device path measured as it will run
    assert placement_note(("worker",), "none") is None  # one placement: nothing compared


def test_decode_auto_takes_the_placement_measured_faster_with_the_loaders_own_workers(dataset, monkeypatch):
    """A stored result chose decoding in the workers at its own worker count (2); a loader with 1 worker, where the
    device path measured faster, decodes on the device, and one with 2 decodes in the workers (the real search on
    a table of rates; the loader is only built: on this CPU machine it never starts CUDA)."""
    from fastdata.loader.tuning import TuneEntry, now_utc, write_entry
    from fastdata.tools.tune import tune_key

    rates = {"worker": {1: 1000.0, 2: 2000.0}, "device": {1: 1500.0, 2: 1950.0}}

    def measure(point: Point) -> Measured:
        return Measured(point, rates[point.decode][point.num_workers], 0.5, 1.0)

    found = search(measure, max_workers=2, budget_s=100, decodes=("worker", "device"), prefetch=(2,))
    assert found.choice.point == Point(2, 2, "worker")
    import importlib

    tuning = importlib.import_module("fastdata.loader.tuning")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # loaders for a GPU (made, never iterated here)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(tuning, "cuda_device_name", lambda device: "Stand-in GPU")
    key, root = tune_key(dataset, TuneConfig(batch_size=4, image_size=16, device="cuda"))
    entry = TuneEntry(key=key, choice=found.choice.as_choice(),
                      by_decode={d: found.best(d).as_choice() for d in ("worker", "device")},
                      measured=[m.as_choice() for m in found.points()], created=now_utc())
    write_entry(root / TUNE_FILE, entry)
    options = dict(batch_size=4, image_size=16, device="cuda")
    assert fastdata.loader(dataset, num_workers=1, **options).decode == "device"
    assert fastdata.loader(dataset, num_workers=2, **options).decode == "worker"
    assert fastdata.loader(dataset, num_workers=8, **options).decode == "worker"  # 2 workers: the most measured
