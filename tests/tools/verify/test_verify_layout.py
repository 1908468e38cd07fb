"""`fastdata verify --decode` of a restart-layout dataset: rewritten JPEGs are whole restart-indexed JPEGs whose crops
decode from their sub-JPEGs to the whole image's pixels, their count is the manifest's, and with `--source` each
decodes to exactly its source file's pixels (a changed source file is named)."""

from __future__ import annotations

import shutil

import pytest

import fastdata
from fastdata.tools.verify import verify
from tests.builders.images import SAMPLING_LAYOUT, build_sampling_tree, damaged_entropy_jpeg, photo_like, sampling_jpeg
from tests.builders.runs import cli

REWRITTEN = sum(how not in ("png", "cmyk") for _, _, _, how in SAMPLING_LAYOUT)

pytestmark = pytest.mark.region_extension


@pytest.fixture(scope="module")
def restart_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify_layout")
    tree = build_sampling_tree(root / "src")
    (tree.root / "b" / "cut.jpg").write_bytes(damaged_entropy_jpeg(photo_like(3, 96, 80)))
    out = root / "d.lmdb"
    fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout="restart")
    )
    return tree, out


def test_verify_decode_checks_the_rewritten_jpegs_against_their_sources(restart_dataset, capsys):
    tree, out = restart_dataset
    report = verify(out, source=tree.root, decode=True)
    assert report.ok, report.problems
    assert (f"restart layout: {REWRITTEN} rewritten JPEGs whole (index, a crop's sub-JPEG), 1 kept original, "
            f"{REWRITTEN} same pixels as their source files") in report.checked
    code, text, _ = cli(capsys, "verify", out, "--decode")
    assert code == 0 and f"{REWRITTEN} rewritten JPEGs whole" in text and "same pixels" not in text


def test_a_source_file_with_other_pixels_is_named(restart_dataset, tmp_path):
    tree, out = restart_dataset
    source = tmp_path / "src"
    shutil.copytree(tree.root, source)
    relative, width, height, how = SAMPLING_LAYOUT[0]
    (source / relative).write_bytes(sampling_jpeg(photo_like(99, width, height), how))
    report = verify(out, source=source, decode=True)
    assert len(report.problems) == 1
    assert f"sample {relative!r}: the rewritten JPEG decodes to other pixels than the source file" in \
        report.problems[0]
