"""Nothing is printed at exit: a script that iterates a loader and returns (after whole epochs, after `break` out
of the first epoch, after an exception in the loop), with 0 and 2 workers, exits 0 with an empty stderr, for every
dataset kind: image LMDB and WebDataset, detection, segmentation, image-text pairs, text LMDB and WebDataset; so
does a script that leaves an iterator alive in the middle of its pass when the interpreter exits."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from builders.runs import less_the_fallback_note

from fastdata.options import TextOptions

SCRIPT = textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.options import TextOptions  # (named by the options' repr)

    path, options = sys.argv[1], eval(sys.argv[2])
    kept = []  # every loader stays alive until the interpreter exits
    for workers in (0, 2):
        loader = fastdata.loader(path, batch_size=4, num_workers=workers, **options)
        kept.append(loader)
        for _ in loader:  # a whole epoch
            pass
        for number, _ in enumerate(loader):  # break out of the next one
            if number == 1:
                break
        try:
            for _ in loader:
                raise ValueError("the training step failed")
        except ValueError:
            pass
    print("done")
""")


@pytest.fixture(scope="module")
def kinds(solid_lmdb, solid_wds, coco_lmdb, seg_rect_lmdb, pairs_lmdb, text_mix):
    image = {"image_size": 16}
    return {"image lmdb": (solid_lmdb, image), "image wds": (solid_wds, image),
            "detection": (coco_lmdb, {"image_size": 32}), "segmentation": (seg_rect_lmdb, {"image_size": 16}),
            "pairs": (pairs_lmdb, image), "text lmdb": (text_mix[0], {"text": TextOptions(seq_len=8)}),
            "text wds": (text_mix[1], {"text": TextOptions(seq_len=8)})}


KINDS = ["image lmdb", "image wds", "detection", "segmentation", "pairs", "text lmdb", "text wds"]


def run_script(source: str, dataset, tmp_path) -> None:
    """Run `source` as a user's script over `dataset` (path, loader options): it exits 0, prints "done" and
    nothing on stderr."""
    path, options = dataset
    script = tmp_path / "train.py"
    script.write_text(source)
    done = subprocess.run([sys.executable, str(script), str(path), repr(options)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert less_the_fallback_note(done.stderr) == "", done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_script_that_returns_prints_nothing_at_exit(kinds, kind, tmp_path):
    run_script(SCRIPT, kinds[kind], tmp_path)


# A script that leaves an iterator of each loader alive, in the middle of its pass, in a module global: the
# interpreter finalises the generators while it clears the modules' globals, so the loader's own clean-up must not
# read a module global that may already be None.
ALIVE_AT_EXIT = textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.options import TextOptions  # (named by the options' repr)

    path, options = sys.argv[1], eval(sys.argv[2])
    loaders, iterators = [], []
    for workers in (0, 2):
        loader = fastdata.loader(path, batch_size=4, num_workers=workers, **options)
        batches = iter(loader)
        next(batches)
        loaders.append(loader)
        iterators.append(batches)
    print("done")
""")


@pytest.mark.parametrize("kind", KINDS)
def test_an_iterator_alive_at_exit_prints_nothing(kinds, kind, tmp_path):
    run_script(ALIVE_AT_EXIT, kinds[kind], tmp_path)
