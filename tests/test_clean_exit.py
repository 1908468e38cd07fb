"""Nothing is printed at exit: a script that iterates a loader and returns (after whole epochs, after `break` out
of the first epoch, after an exception in the loop), with 0 and 2 workers, exits 0 with an empty stderr, for every
dataset kind: image LMDB and WebDataset, detection, segmentation, image-text pairs, text LMDB and WebDataset."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from builders import less_the_fallback_note

SCRIPT = textwrap.dedent("""
    import sys
    import fastdata

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
            "pairs": (pairs_lmdb, image), "text lmdb": (text_mix[0], {"seq_len": 8}),
            "text wds": (text_mix[1], {"seq_len": 8})}


@pytest.mark.parametrize("kind", ["image lmdb", "image wds", "detection", "segmentation", "pairs", "text lmdb",
                                  "text wds"])
def test_a_script_that_returns_prints_nothing_at_exit(kinds, kind, tmp_path):
    path, options = kinds[kind]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(path), repr(options)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert less_the_fallback_note(done.stderr) == "", done.stderr
