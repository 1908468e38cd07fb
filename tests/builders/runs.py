"""Programs run in a child process (kill and pause points placed deterministically, a user's loop that stops
on Ctrl-C), seeded loaders and the command line called as a user calls it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fastdata
from fastdata.cli import main
from fastdata.image.jpeg.extension import extension_built
from fastdata.image.jpeg.region import FALLBACK

# Source of `kill_when(cls, method, condition)` for the scripts of conversions run in a child process: SIGKILLs the
# process on a call of `cls.method` when `condition(self)` holds (a real, abrupt kill, placed deterministically).
KILL_WHEN = textwrap.dedent("""
    import os, signal

    def kill_when(cls, method, condition):
        original = getattr(cls, method)
        def wrapped(self, *args, **kwargs):
            if condition(self):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)
        setattr(cls, method, wrapped)
""")

# Source of `pause_when(cls, method, condition, here)` for the scripts of conversions run in a child process: on the
# first call of `cls.method` where `condition(self)` holds, creates the file `here + ".paused"` and waits until the
# file `here + ".go"` exists (the test says when), then goes on. Nothing but files sequences it: no timing.
PAUSE_WHEN = textwrap.dedent("""
    import os, time

    def pause_when(cls, method, condition, here):
        original = getattr(cls, method)
        done = []
        def wrapped(self, *args, **kwargs):
            if not done and condition(self):
                done.append(1)
                open(here + ".paused", "w").close()
                while not os.path.exists(here + ".go"):
                    time.sleep(0.01)
            return original(self, *args, **kwargs)
        setattr(cls, method, wrapped)
""")


def wait_for_file(path: Path, process: subprocess.Popen, bound_s: float = 600) -> None:
    """Wait until `path` exists (a child's `pause_when` says it has paused); AssertionError with the child's output
    when the child ends first. `bound_s` only bounds a hung child on a loaded machine: it measures nothing."""
    import time

    deadline = time.monotonic() + bound_s
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the child ended (exit code {process.returncode}) before {path.name}: {out} {err}")
        assert time.monotonic() < deadline, f"the child never made {path}"
        time.sleep(0.01)


def no_process_left(group: int) -> bool:
    """Whether every process of the process group `group` has exited."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False

# ----------------------------------------------------------------------------------------------------
# loaders and the command line


def seeded_loader(path, **options):
    """`fastdata.loader` with the settings the loader-state tests share (batches of 8: the 45 solid samples make
    6 batches an epoch, the last one short), overridden by `options`; image_size=16 for the presets (a custom
    transform sets its own size)."""
    settings = dict(batch_size=8, augment="train", num_workers=0, seed=7)
    settings.update(options)
    if isinstance(settings["augment"], str):
        settings.setdefault("image_size", 16)
    return fastdata.loader(path, **settings)


# Source of a user's program that replaces a loader after it raised. argv: a dataset that raises, one that does
# not, the loader's options as JSON. Prints what the first raised, then the batch count of two passes of the second.
REPLACE_AFTER_ERROR = textwrap.dedent("""
    import json, sys
    import fastdata
    from fastdata.errors import CorruptSampleError

    bad, good, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    loader = fastdata.loader(bad, **options)
    try:
        for batch in loader:
            pass
    except CorruptSampleError as exc:
        print("raised:", exc)
    loader = fastdata.loader(good, **options)
    for number in range(2):
        print("pass", number, sum(1 for batch in loader))
""")

# Source of a user's training loop that stops on Ctrl-C. argv: a dataset, the loader's options as JSON. Prints
# `training` once the first batch is in, and `interrupted` on stderr with exit code 130 on Ctrl-C.
TRAIN_UNTIL_CTRL_C = textwrap.dedent("""
    import json, sys
    import fastdata

    loader = fastdata.loader(sys.argv[1], **json.loads(sys.argv[2]))
    try:
        for epoch in range(10**6):
            for number, batch in enumerate(loader):
                if epoch == number == 0:
                    print("training", flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
""")


def less_the_fallback_note(stderr: str) -> str:
    """`stderr` of a program that loaded JPEGs, less the one note it prints where the region decoder's C extension
    was not built (`warn_fallback`: a Python warning and its source line, or the CLI's `note:` line), so that what a
    test says about the rest holds there too. Unchanged where the extension was built: the note is a fault there."""
    if extension_built():
        return stderr
    kept, source_line_next = [], False
    for line in stderr.splitlines(keepends=True):
        if FALLBACK in line:
            source_line_next = "Warning: " in line  # Python prints a warning's source line after it, indented
            continue
        if not (source_line_next and line.startswith("  ")):
            kept.append(line)
        source_line_next = False
    return "".join(kept)


def run_python(source: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the Python program `source` with `args` in a child process, as a user would: exit code, stdout and
    stderr (text)."""
    return subprocess.run([sys.executable, "-c", source, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run `fastdata ARGS` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, err)
