"""The steady-state protocol of benchmarks/gpu_train_feed.py (docs/gpu.md, "Measuring it"), its arithmetic checked
on the CPU: the settle window, the steady rate from per-step marks, the epoch-start stall, the replicated tree."""

from __future__ import annotations

import pytest

from benchmarks.gpu_train_feed import replicate, settle_steps, stall, steady


def test_the_steady_window_starts_once_every_batch_in_flight_has_come():
    assert settle_steps(16, 2) == 36 and settle_steps(4, 2) == 12 and settle_steps(1, 2) == 8


def test_the_steady_rate_counts_only_the_steps_after_the_settle_window():
    """A slow start (the pipeline filling) then 10 ms per step: the steady rate is the 10 ms one, the slow start
    left out; an epoch shorter than the window has none."""
    marks = [0.5, 0.9, 1.0] + [1.0 + 0.01 * k for k in range(1, 98)]
    assert steady(marks, 256, settle=12) == pytest.approx(256 / 0.01)
    assert steady(marks[:13], 256, settle=12) is None


def test_the_epoch_start_stall_is_the_gap_less_one_step():
    assert stall(10.0, 10.8, 0.02) == pytest.approx(0.78)
    assert stall(10.0, 10.01, 0.02) == 0.0


def test_the_sample_is_replicated_as_links_in_its_classes(tmp_path):
    src = tmp_path / "src"
    for name in ("a/x.jpg", "a/y.png", "b/z.jpg"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    out = replicate(src, tmp_path / "x4", 4)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert len(files) == 12 and "a/x-3.jpg" in files and "b/z-0.jpg" in files
    assert (out / "a" / "y-2.png").is_symlink() and (out / "a" / "y-2.png").read_bytes() == b"a/y.png"
    assert replicate(src, out, 4) == out  # made once
