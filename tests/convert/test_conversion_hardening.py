"""Conversion hardening: a decompression bomb is refused from its header without a memory spike, and the pixel
limit is configurable."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zlib

from builders import encode, solid_pattern

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
        summary = fastdata.convert_imagefolder({str(src)!r}, {str(out)!r}, workers=1, progress=False)
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
        fastdata.convert_imagefolder(small_solid_tree.root, tmp_path / "o.lmdb", max_pixels=100, workers=1,
                                     progress=False)
    assert not (tmp_path / "o.lmdb").exists()
