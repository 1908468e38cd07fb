"""Conversion hardening: a decompression bomb is refused from its header without a memory spike, and the pixel
limit is configurable."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zlib

from builders.images import encode, solid_pattern

import fastdata


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height (8-bit grayscale) but holds one compressed row: a decompression bomb's
    header, tiny on disk."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1)))
            + chunk(b"IEND", b""))


def convert_in_subprocess(src, out) -> tuple[int, list, int]:
    """(images, rejected, peak RSS in KB) of a conversion run in a fresh process."""
    code = textwrap.dedent(f"""
        import json, resource, fastdata
        summary = fastdata.convert_imagefolder({str(src)!r}, {str(out)!r},
                                               fastdata.ImageFolderOptions(workers=1, progress=False))
        print(json.dumps([summary.images, summary.rejected, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(run.stdout.strip().splitlines()[-1]))


def test_30k_by_30k_png_is_refused_from_its_header_without_a_memory_spike(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "fine.jpg").write_bytes(encode(solid_pattern(1, 40, 30), "JPEG"))
    _, _, baseline_kb = convert_in_subprocess(src, tmp_path / "base.lmdb")
    (src / "a" / "bomb.png").write_bytes(png_header_only(30_000, 30_000))
    images, rejected, peak_kb = convert_in_subprocess(src, tmp_path / "out.lmdb")
    assert images == 1
    assert rejected[0]["path"] == "a/bomb.png"
    assert rejected[0]["reason"].startswith("refused:") and "900000000 pixels" in rejected[0]["reason"]
    # decoding it would take 900 MB (grey) or 2.7 GB (RGB): the peak stays where the same run without it is
    assert peak_kb - baseline_kb < 400_000


def test_max_pixels_is_configurable(small_solid_tree, tmp_path):
    import pytest

    from fastdata.errors import SourceError

    with pytest.raises(SourceError, match=f"no images kept: all {len(small_solid_tree.images)} were rejected.*"
                                          "refused: .* exceeds the limit of 100 \\(--max-pixels\\)"):
        fastdata.convert_imagefolder(
            small_solid_tree.root,
            tmp_path / "o.lmdb",
            fastdata.ImageFolderOptions(max_pixels=100, workers=1, progress=False),
        )
    assert not (tmp_path / "o.lmdb").exists()


def test_pillows_own_bomb_warning_is_not_printed_beside_fastdatas_line(tmp_path, capsys):
    """An image over Pillow's warning level (89.5 M pixels) but under its hard limit: Pillow warns "could be
    decompression bomb DOS attack" as it opens it; fastdata checks the same limit and says so in its own line (the
    rejection), so Pillow's is not printed besides, neither on the command line nor to a Python caller."""
    import warnings

    from builders.runs import cli

    from fastdata.convert.encode import EncodeOptions, verify_record

    bomb = png_header_only(10_000, 10_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            verify_record(bomb, "a/bomb.png", 0, EncodeOptions())
        except ValueError as exc:
            reason = str(exc)
    assert reason.startswith("refused: 10000x10000 = 100,000,000 pixels exceeds the limit of 89,478,485")
    assert [str(w.message) for w in caught] == []
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"fine{i}.jpg").write_bytes(encode(solid_pattern(i, 40, 30), "JPEG"))
    (src / "a" / "bomb.png").write_bytes(bomb)
    code, stdout, stderr = cli(capsys, "convert", "imagefolder", src, tmp_path / "out.lmdb", "-q", "--workers", "1")
    assert code == 0, stderr
    assert "DOS attack" not in stderr + stdout and stderr == ""
    assert "a/bomb.png: refused: 10000x10000 = 100,000,000 pixels exceeds the limit" in stdout
