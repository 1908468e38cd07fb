"""Ctrl-C delivered at controlled points, so that each guarantee (one line on stderr, exit code 130, no process of
the group left, no traceback) is checked where it is hardest to keep, not wherever a timer happened to land.

The program under test runs in a child process of its own session (as a terminal's foreground job). A hook placed at
one point of it says "at <point>" on stdout and waits there; the test then sends SIGINT to the whole process group,
as a terminal's Ctrl-C does. The hook waits until the signal has come: handled there by the handler in place
(Python's raises KeyboardInterrupt; fastdata's, while processes start, notes it for later), or pending while the
start-up blocks it; then it returns, or raises. Nothing depends on timing: each step waits for the one before it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from builders.images import build_solid_tree
from builders.runs import less_the_fallback_note, no_process_left

import fastdata

# Installs the hook (argv[1]: the point), then runs argv[2:] as the program: "loader DATASET" (a user's training
# loop over fastdata.loader with 2 workers; "loader-device": decode="device" on the CPU, decoding ahead) or
# "convert SRC OUT" (`fastdata convert imagefolder` with 2 workers)
DRIVER = textwrap.dedent("""
    import multiprocessing.process, signal, sys, threading, time

    point, program = sys.argv[1], sys.argv[2:]

    def wait_for_ctrl_c():
        # say where, and wait until the Ctrl-C has come: handled by the handler in place (which may raise
        # KeyboardInterrupt here, or note it for later), or pending while the start-up blocks it
        came, handler = [], signal.getsignal(signal.SIGINT)

        def note_and_handle(signum, frame):
            came.append(signum)
            signal.signal(signal.SIGINT, handler)
            if callable(handler):
                handler(signum, frame)

        signal.signal(signal.SIGINT, note_and_handle)
        print(f"at {point}", flush=True)
        while not came and signal.SIGINT not in signal.sigpending():
            time.sleep(0.01)
        if not came:
            signal.signal(signal.SIGINT, handler)

    starts = []
    original_start = multiprocessing.process.BaseProcess.start

    def start(self):
        first = not starts and threading.current_thread() is threading.main_thread()
        starts.append(self)
        if first and point == "before-workers-start":
            wait_for_ctrl_c()
        original_start(self)
        if first and point == "while-workers-start":  # one process started, the others not yet
            wait_for_ctrl_c()

    multiprocessing.process.BaseProcess.start = start

    if program[0] in ("loader", "loader-device"):
        import fastdata
        device = dict(device="cpu", decode="device") if program[0] != "loader" else {}
        loader = fastdata.loader(program[1], batch_size=4, augment="train", image_size=16, num_workers=2, **device)
        try:
            for epoch in range(3):
                for number, batch in enumerate(loader):
                    if point == "mid-epoch" and epoch == 1 and number == 2:
                        wait_for_ctrl_c()
        except KeyboardInterrupt:
            print(f"{len(starts)} processes started", flush=True)
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        print("finished", file=sys.stderr)
    else:
        from fastdata.cli import main
        code = main(["convert", "imagefolder", program[1], program[2], "--workers", "2", "-q"])
        print(f"{len(starts)} processes started", flush=True)
        sys.exit(code)
""")

# generous: a bound for a hung child on a loaded machine, not a measure of speed
HUNG_S = 600


def interrupt_at(point: str, *program: str) -> tuple[int, str, str, int]:
    """Run DRIVER at `point` over `program`, send Ctrl-C to its process group once it is there: (exit code,
    stdout, stderr, process group id)."""
    process = subprocess.Popen([sys.executable, "-c", DRIVER, point, *program], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        announced = process.stdout.readline()
        if announced != f"at {point}\n":
            rest, err = process.communicate(timeout=HUNG_S)
            raise AssertionError(f"the program never reached {point}: {announced + rest!r} {err!r}")
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=HUNG_S)
    except BaseException:  # a hung or failed program: nothing of its group is left running on the machine
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    return process.returncode, stdout, stderr, process.pid


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("ctrl_c") / "src", count=24)


@pytest.fixture(scope="module")
def dataset(tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ctrl_c_lmdb") / "d.lmdb"
    fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    return out


@pytest.mark.parametrize("point", ["before-workers-start", "while-workers-start", "mid-epoch"])
def test_ctrl_c_in_a_training_loop(point, dataset):
    """The loop's own line is all stderr holds (no worker or torch traceback), exit code 130, no worker left; a
    Ctrl-C while the workers start is held until all are started (never a start-up broken in the middle)."""
    code, stdout, stderr, group = interrupt_at(point, "loader", str(dataset))
    assert (code, less_the_fallback_note(stderr)) == (130, "interrupted\n")
    if point != "mid-epoch":  # held back while the workers start: both were started, then it was raised
        assert stdout == "2 processes started\n"
    assert no_process_left(group)


def test_ctrl_c_mid_epoch_of_the_device_path_decoding_ahead(dataset):
    """The same with decode="device" and its feeder and decode threads (which leave Ctrl-C to the training
    thread): one line, exit code 130, no worker left."""
    code, _, stderr, group = interrupt_at("mid-epoch", "loader-device", str(dataset))
    assert (code, less_the_fallback_note(stderr)) == (130, "interrupted\n")
    assert no_process_left(group)


@pytest.mark.parametrize("point", ["before-workers-start", "while-workers-start"])
def test_ctrl_c_while_a_conversion_starts_its_pool(point, tree, tmp_path):
    """The conversion's one line, exit code 130, the pool's start-up not broken in the middle, no worker left,
    nothing that looks complete; the same command run again finishes the conversion."""
    out = tmp_path / "out.lmdb"
    code, stdout, stderr, group = interrupt_at(point, "convert", str(tree.root), str(out))
    assert (code, stderr) == (130, "interrupted; rerun the same command to resume the conversion\n")
    assert stdout == "2 processes started\n"  # held back while the pool starts: both workers were started
    assert no_process_left(group) and not out.exists()
    rerun = subprocess.run([sys.executable, "-m", "fastdata", "convert", "imagefolder", str(tree.root), str(out),
                            "--workers", "2", "-q"], capture_output=True, text=True, timeout=HUNG_S, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert fastdata.info(out).num_samples == 24
