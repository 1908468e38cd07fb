"""Restart-indexed JPEGs (fastdata.image.jpeg.restart, csrc/jpeg_restart.c): the lossless rewrite decodes to exactly the
original's pixels (Pillow and OpenCV) for every chroma sampling, grayscale, progressive sources and sources that
already have restart markers, keeping EXIF/ICC/comments; a sub-JPEG assembled from the pieces a region covers
decodes to the whole image's pixels of that region, bit for bit, at every DCT scale (the region decoder, OpenCV's
reduced modes, Pillow); the index round-trips and refuses damage; JPEGs the rewrite does not handle are refused
with UnsupportedJpegError (kept as they are by a converter)."""

from __future__ import annotations

import contextlib
import io
import struct
import threading

import cv2
import numpy as np
import pytest
from PIL import Image

from fastdata.errors import CorruptSampleError, UnsupportedJpegError
from fastdata.image.jpeg.region import Region, scaled_size
from fastdata.image.jpeg.restart import (
    RestartIndex,
    _assemble_numpy,
    _segment_offsets_numpy,
    assemble,
    build_index,
    crop_jpeg,
    decode_region,
    rewrite,
    same_pixels,
    segment_offsets,
    self_check,
    sub_jpeg_for,
)


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Waves of several frequencies, hard edges and noise: every IDCT, upsampling and edge path marks the pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [128 + 90 * np.sin(x * 0.13 + y * 0.05 + c) + 30 * ((x // 11 + y // 7 + c) % 2) for c in range(3)]
    return np.clip(np.stack(channels, 2) + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8)


def cv2_jpeg(array: np.ndarray, sampling: str = "420", progressive: bool = False, restart: int = 0) -> bytes:
    options = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive),
               cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    if array.ndim == 3:
        options += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling}")]
    ok, encoded = cv2.imencode(".jpg", array, options)
    assert ok
    return encoded.tobytes()


def pil_jpeg(array: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def gray_2x2(data: bytes) -> bytes:
    """A grayscale JPEG whose one component says 2x2 sampling (legal, decoded as 1x1; an MCU is still a block)."""
    out = bytearray(data)
    at = out.index(b"\xff\xc0")
    assert out[at + 9] == 1 and out[at + 11] == 0x11
    out[at + 11] = 0x22
    return bytes(out)


ICC = b"\x00\x00\x02\x0cfake icc profile for the test" + bytes(range(256)) * 3


def exif_bytes() -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "fastdata test camera"  # Make
    return exif.tobytes()


EXIF = exif_bytes()

SOURCES = {
    "4:4:4": lambda: cv2_jpeg(photo(117, 75), "444"),
    "4:2:2": lambda: cv2_jpeg(photo(117, 75), "422"),
    "4:2:0": lambda: cv2_jpeg(photo(117, 75), "420"),
    "4:4:0": lambda: cv2_jpeg(photo(117, 75), "440"),
    "4:1:1": lambda: cv2_jpeg(photo(117, 75), "411"),
    "grayscale": lambda: cv2_jpeg(photo(117, 75)[:, :, 1]),
    "progressive 4:2:0": lambda: cv2_jpeg(photo(117, 75), "420", progressive=True),
    "grayscale, 2x2 sampling factors": lambda: gray_2x2(cv2_jpeg(photo(117, 75)[:, :, 2])),
    "progressive grayscale": lambda: cv2_jpeg(photo(117, 75)[:, :, 0], progressive=True),
    "restart every 3 MCUs 4:2:2": lambda: cv2_jpeg(photo(117, 75), "422", restart=3),
    "Pillow 4:2:0 with EXIF, ICC, comment": lambda: pil_jpeg(photo(117, 75), exif=EXIF, icc_profile=ICC,
                                                              comment=b"a comment"),
    "RGB colour space (Adobe marker)": lambda: pil_jpeg(photo(117, 75), keep_rgb=True, subsampling=0),
    "tiny 5x3 4:2:0": lambda: cv2_jpeg(photo(5, 3), "420"),
    "one MCU 16x16 4:2:0": lambda: cv2_jpeg(photo(16, 16), "420"),
    "tall 9x203 4:2:2": lambda: cv2_jpeg(photo(9, 203), "422"),
}


@pytest.fixture(scope="module")
def rewritten(decoder) -> dict[str, tuple[bytes, bytes, RestartIndex]]:
    """Each source kind: (original, rewritten, index)."""
    found = {}
    for kind, make in SOURCES.items():
        original = make()
        jpeg, index = rewrite(original, decoder)
        found[kind] = (original, jpeg, index)
    return found


def pil_pixels(data: bytes | bytearray) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def cv2_pixels(data: bytes | bytearray, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    assert decoded is not None
    return decoded


@pytest.mark.parametrize("kind", SOURCES)
def test_the_rewrite_decodes_to_exactly_the_originals_pixels(rewritten, kind):
    original, jpeg, index = rewritten[kind]
    assert jpeg != original
    for decode in (pil_pixels, cv2_pixels):
        before, after = decode(original), decode(jpeg)
        assert before.shape == after.shape and np.array_equal(before, after), decode.__name__
    assert same_pixels(original, jpeg)
    with Image.open(io.BytesIO(jpeg)) as image:
        assert (image.width, image.height) == (index.width, index.height)
        assert not image.info.get("progressive") and not image.info.get("progression")


@pytest.mark.parametrize("kind", SOURCES)
def test_the_rewrite_has_a_restart_marker_after_every_mcu(rewritten, kind):
    _, jpeg, index = rewritten[kind]
    offsets = index.offsets
    assert len(offsets) == index.columns * index.rows + 1
    data = np.frombuffer(jpeg, np.uint8)
    markers = data[offsets[1:].astype(np.int64) - 1]
    assert list(markers[:-1]) == [0xD0 + i % 8 for i in range(len(markers) - 1)] and markers[-1] == 0xD9
    assert offsets[-1] == len(jpeg)
    assert np.array_equal(_segment_offsets_numpy(jpeg), offsets)  # the numpy scan finds what the C scan found


def test_mcu_size_follows_the_sampling(rewritten):
    sizes = {kind: (index.mcu_width, index.mcu_height) for kind, (_, _, index) in rewritten.items()}
    assert sizes["4:4:4"] == sizes["grayscale"] == sizes["grayscale, 2x2 sampling factors"] == (8, 8)
    assert sizes["4:2:2"] == (16, 8)
    assert sizes["4:2:0"] == (16, 16) and sizes["4:4:0"] == (8, 16) and sizes["4:1:1"] == (32, 8)


def random_regions(width: int, height: int, scale_num: int, count: int, rng) -> list[Region]:
    """`count` random regions of the image at scale_num/8, plus the whole image and its bottom-right pixel."""
    w, h = scaled_size(width, scale_num), scaled_size(height, scale_num)
    regions = [Region(scale_num, 0, 0, w, h), Region(scale_num, w - 1, h - 1, 1, 1)]
    for _ in range(count):
        left, top = int(rng.integers(0, w)), int(rng.integers(0, h))
        regions.append(Region(scale_num, left, top, int(rng.integers(1, w - left + 1)),
                              int(rng.integers(1, h - top + 1))))
    return regions


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("scale_num", range(1, 9))
def test_a_sub_jpeg_decodes_a_region_as_the_whole_image_does(decoder, rewritten, kind, scale_num):
    original, jpeg, index = rewritten[kind]
    rng = np.random.default_rng(scale_num)
    w, h = scaled_size(index.width, scale_num), scaled_size(index.height, scale_num)
    whole = decoder.decode(original, Region(scale_num, 0, 0, w, h))
    assert np.array_equal(decoder.decode(jpeg, Region(scale_num, 0, 0, w, h)), whole)
    for region in random_regions(index.width, index.height, scale_num, 12, rng):
        got = decode_region(decoder, jpeg, index, region)
        expected = whole[region.top:region.top + region.height, region.left:region.left + region.width]
        assert np.array_equal(got, expected), region


@pytest.mark.parametrize("kind", ["4:2:0", "4:2:2", "4:4:0", "4:1:1", "progressive 4:2:0", "tiny 5x3 4:2:0",
                                  "tall 9x203 4:2:2"])
def test_every_region_edge_position_decodes_as_the_whole_image(decoder, rewritten, kind):
    """Every start and end position of a region, across every MCU column (row), at every scale: where the margin
    and the minimum span are decided (subsampled chroma only)."""
    _, jpeg, index = rewritten[kind]
    for scale_num in range(1, 9):
        w, h = scaled_size(index.width, scale_num), scaled_size(index.height, scale_num)
        whole = decoder.decode(jpeg, Region(scale_num, 0, 0, w, h))
        across = [Region(scale_num, left, h // 3, size, max(1, h // 3)) for left in range(w)
                  for size in (1, 2, 3, 9) if left + size <= w]
        down = [Region(scale_num, w // 3, top, max(1, w // 3), size) for top in range(h)
                for size in (1, 2, 3, 9) if top + size <= h]
        for region in across + down:
            got = decode_region(decoder, jpeg, index, region)
            assert np.array_equal(got, whole[region.top:region.top + region.height,
                                             region.left:region.left + region.width]), region


@pytest.mark.parametrize("kind", ["4:4:4", "4:2:0", "4:2:2", "4:4:0", "grayscale",
                                  "Pillow 4:2:0 with EXIF, ICC, comment"])
@pytest.mark.parametrize("reduction", [1, 2, 4, 8])
def test_opencv_decodes_a_sub_jpeg_at_reduced_scale_as_the_whole_image(rewritten, kind, reduction):
    _, jpeg, index = rewritten[kind]
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
             8: cv2.IMREAD_REDUCED_COLOR_8}[reduction]
    whole = cv2_pixels(jpeg, flags)
    rng = np.random.default_rng(reduction)
    for region in random_regions(index.width, index.height, 8 // reduction, 8, rng):
        sub = sub_jpeg_for(jpeg, index, region)
        inside = sub.region(region)
        got = cv2_pixels(sub.data, flags)[inside.top:inside.top + inside.height,
                                          inside.left:inside.left + inside.width]
        assert np.array_equal(got, whole[region.top:region.top + region.height,
                                         region.left:region.left + region.width]), region


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:0", "grayscale", "progressive 4:2:0"])
def test_pillow_decodes_a_cropped_box_as_the_whole_image(rewritten, kind):
    _, jpeg, index = rewritten[kind]
    whole = pil_pixels(jpeg)
    rng = np.random.default_rng(7)
    for _ in range(10):
        left, top = int(rng.integers(0, index.width)), int(rng.integers(0, index.height))
        width, height = int(rng.integers(1, index.width - left + 1)), int(rng.integers(1, index.height - top + 1))
        sub = crop_jpeg(jpeg, index, left, top, width, height)
        assert sub.left % index.mcu_width == 0 and sub.top % index.mcu_height == 0
        x, y = left - sub.left, top - sub.top
        got = pil_pixels(sub.data)
        assert got.shape[:2] == (sub.height, sub.width)
        assert np.array_equal(got[y:y + height, x:x + width], whole[top:top + height, left:left + width])


def test_the_margin_is_needed_where_chroma_is_subsampled(rewritten):
    """Without the one-MCU margin a 4:2:0 sub-JPEG's edge pixels differ from the whole image's (its edges are
    image edges to chroma upsampling); with it they are the same: the tests above can fail."""
    _, jpeg, index = rewritten["4:2:0"]
    whole = cv2_pixels(jpeg)
    box = (2 * index.mcu_width, 2 * index.mcu_height, 3 * index.mcu_width, 2 * index.mcu_height)
    bare = crop_jpeg(jpeg, index, *box, margin_mcus=0)
    assert (bare.left, bare.top, bare.width, bare.height) == box
    left, top, width, height = box
    assert not np.array_equal(cv2_pixels(bare.data), whole[top:top + height, left:left + width])
    padded = crop_jpeg(jpeg, index, *box)
    x, y = left - padded.left, top - padded.top
    assert (x, y) == (index.mcu_width, index.mcu_height)
    assert np.array_equal(cv2_pixels(padded.data)[y:y + height, x:x + width],
                          whole[top:top + height, left:left + width])


def test_a_sub_jpeg_has_the_covered_pieces_renumbered_and_no_exif(rewritten):
    _, jpeg, index = rewritten["Pillow 4:2:0 with EXIF, ICC, comment"]
    sub = assemble(jpeg, index, 1, 1, 5, 4)
    assert (sub.left, sub.top, sub.width, sub.height) == (16, 16, 64, 48)
    offsets = segment_offsets(bytes(sub.data))
    assert len(offsets) == 4 * 3 + 1
    data = np.frombuffer(sub.data, np.uint8)
    assert list(data[offsets[1:].astype(np.int64) - 1]) == [0xD0 + i % 8 for i in range(11)] + [0xD9]
    for k, (row, column) in enumerate((r, c) for r in range(1, 4) for c in range(1, 5)):
        piece = index.offsets[row * index.columns + column]
        assert bytes(sub.data[offsets[k]:offsets[k + 1] - 2]) == jpeg[piece:index.offsets[row * index.columns +
                                                                                           column + 1] - 2]
    assert b"Exif" not in sub.data and b"a comment" not in sub.data and b"JFIF" in sub.data
    # the whole image through assemble is the rewritten file less its EXIF, ICC and comment
    whole = assemble(jpeg, index, 0, 0, index.columns, index.rows)
    assert len(whole.data) < len(jpeg) - len(EXIF) - len(ICC) and np.array_equal(cv2_pixels(whole.data),
                                                                                   cv2_pixels(jpeg))


def test_exif_icc_and_comments_are_kept(rewritten):
    original, jpeg, _ = rewritten["Pillow 4:2:0 with EXIF, ICC, comment"]
    with Image.open(io.BytesIO(original)) as before, Image.open(io.BytesIO(jpeg)) as after:
        assert after.info["exif"] == before.info["exif"] == EXIF
        assert after.info["icc_profile"] == before.info["icc_profile"] == ICC
        assert after.info["comment"] == before.info["comment"] == b"a comment"
        assert after.info["dpi"] == before.info["dpi"] and after.info["jfif_version"] == before.info["jfif_version"]


def test_a_jpeg_from_another_encoder_with_one_mcu_restarts_is_indexed_as_it_is(decoder):
    """OpenCV's own 1-MCU restart JPEG needs no rewrite: build_index takes it, and its sub-JPEGs decode right."""
    original = cv2_jpeg(photo(117, 75), "420", restart=1)
    index = build_index(original)
    whole = cv2_pixels(original)
    sub = crop_jpeg(original, index, 40, 20, 30, 30)
    x, y = 40 - sub.left, 20 - sub.top
    assert np.array_equal(cv2_pixels(sub.data)[y:y + 30, x:x + 30], whole[20:50, 40:70])


@pytest.mark.parametrize("kind", ["4:2:0", "grayscale", "tall 9x203 4:2:2"])
def test_the_index_round_trips_in_one_byte_per_mcu(rewritten, kind):
    index = rewritten[kind][2]
    stored = index.to_bytes()
    assert np.diff(index.offsets).max() < 256 and len(stored) == 28 + index.columns * index.rows
    again = RestartIndex.from_bytes(stored)
    assert again.offsets.dtype == np.uint32 and np.array_equal(again.offsets, index.offsets)
    fields = ("width", "height", "mcu_width", "mcu_height", "sof_offset", "keep_until", "tables_from")
    assert [getattr(again, f) for f in fields] == [getattr(index, f) for f in fields]
    with pytest.raises(CorruptSampleError, match="expected"):
        RestartIndex.from_bytes(stored[:-1], "shard 3/key")
    with pytest.raises(CorruptSampleError, match="shard 3/key: not a version-1 restart index"):
        RestartIndex.from_bytes(b"XXXX" + stored[4:], "shard 3/key")
    with pytest.raises(CorruptSampleError, match="truncated"):
        RestartIndex.from_bytes(stored[:10])


def test_long_pieces_are_indexed_after_the_short_ones():
    lengths = [100, 254, 255, 256, 70000, 3]
    offsets = np.concatenate([[600], 600 + np.cumsum(lengths)]).astype(np.uint32)
    index = RestartIndex(48, 8, 8, 8, 2, 2, 2, offsets)
    stored = index.to_bytes()
    assert len(stored) == 28 + 6 + 3 * 4 and np.array_equal(RestartIndex.from_bytes(stored).offsets, offsets)
    with pytest.raises(CorruptSampleError, match="expected 46 for 6 MCUs"):
        RestartIndex.from_bytes(stored[:-1])


def test_build_index_refuses_a_jpeg_without_one_restart_per_mcu(rewritten):
    with pytest.raises(UnsupportedJpegError, match=r"a\.jpg: no restart marker after every MCU"):
        build_index(cv2_jpeg(photo(40, 40)), name="a.jpg")
    with pytest.raises(UnsupportedJpegError, match="restart interval 1"):
        build_index(cv2_jpeg(photo(40, 40), restart=2))
    _, jpeg, index = rewritten["4:2:0"]
    with pytest.raises(UnsupportedJpegError, match=r"39 restart segments .* expected 40 .* and EOI"):
        build_index(jpeg[:int(index.offsets[-2]) - 2] + b"\xff\xd9")  # the last MCU left out
    with pytest.raises(UnsupportedJpegError, match="no baseline"):
        build_index(cv2_jpeg(photo(40, 40), progressive=True, restart=1))


def patched_sof(data: bytes, marker: int | None = None, precision: int | None = None) -> bytes:
    """`data` with its SOF marker or sample precision changed in the header (what the refusal reads)."""
    out = bytearray(data)
    at = out.index(b"\xff\xc0")
    if marker is not None:
        out[at + 1] = marker
    if precision is not None:
        out[at + 4] = precision
    return bytes(out)


def cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(photo(33, 21)).convert("CMYK").save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.mark.parametrize("make, reason", [
    (cmyk_jpeg, "not 1 or 3 components"),
    (lambda: patched_sof(cv2_jpeg(photo(33, 21)), marker=0xC9), "arithmetic coding"),
    (lambda: patched_sof(cv2_jpeg(photo(33, 21)), marker=0xC3), "lossless"),
    (lambda: patched_sof(cv2_jpeg(photo(33, 21)), precision=12), "precision other than 8 bits"),
])
def test_jpegs_the_rewrite_does_not_handle_are_refused(decoder, make, reason):
    with pytest.raises(UnsupportedJpegError, match=f"b.jpg: unsupported JPEG.*{reason}.*keep its original bytes"):
        rewrite(make(), decoder, name="b.jpg")


def test_damaged_entropy_data_is_refused_and_unreadable_bytes_are_corrupt(decoder):
    original = cv2_jpeg(photo(64, 64))
    scan = segment_offsets(original)[0]
    cut = scan + (len(original) - scan) // 2
    with pytest.raises(UnsupportedJpegError, match="damaged entropy data"):
        rewrite(original[:cut] + b"\xff\xd9", decoder)  # ends early: libjpeg would fill the rest with grey
    with pytest.raises(CorruptSampleError, match=r"c\.jpg: cannot be rewritten"):
        rewrite(original[:cut], decoder, name="c.jpg")  # truncated
    with pytest.raises(CorruptSampleError, match="cannot be rewritten"):
        rewrite(b"not a jpeg at all", decoder)
    with pytest.raises(CorruptSampleError, match="over the limit"):
        rewrite(original, decoder, max_pixels=64 * 63)


def test_the_numpy_assembly_equals_the_extensions(rewritten):
    for kind in ("4:2:0", "grayscale", "Pillow 4:2:0 with EXIF, ICC, comment", "restart every 3 MCUs 4:2:2"):
        _, jpeg, index = rewritten[kind]
        for span in ((0, 0, index.columns, index.rows), (1, 1, 2, 2), (2, 1, index.columns, 3)):
            sub = assemble(jpeg, index, *span)
            sof = index.sof_offset - (index.tables_from - index.keep_until)
            assert _assemble_numpy(jpeg, index, *span, sof, sub.width, sub.height) == sub.data, (kind, span)


def test_an_index_that_does_not_match_its_jpeg_is_refused(rewritten):
    _, jpeg, index = rewritten["4:2:0"]
    _, other, _ = rewritten["4:2:2"]
    with pytest.raises(ValueError, match="does not match"):
        assemble(other, index, 0, 0, index.columns, index.rows)
    with pytest.raises(ValueError, match="does not match"):
        _assemble_numpy(other, index, 0, 0, index.columns, index.rows, index.sof_offset, 16, 16)
    with pytest.raises(ValueError, match="does not match"):
        assemble(jpeg[:len(jpeg) // 2], index, 0, 0, index.columns, index.rows)


def test_boxes_and_regions_outside_the_image_are_refused(rewritten):
    _, jpeg, index = rewritten["4:2:0"]
    with pytest.raises(ValueError, match="outside"):
        crop_jpeg(jpeg, index, 100, 0, 18, 10)
    with pytest.raises(ValueError, match="outside"):
        sub_jpeg_for(jpeg, index, Region(4, 0, 0, 60, 10))
    with pytest.raises(ValueError, match="outside"):
        assemble(jpeg, index, 2, 0, 2, 1)


def test_the_rewrite_is_optimised_and_runs_in_threads(decoder):
    """Optimised Huffman tables make the rewrite smaller than with the standard tables; concurrent rewrites (the GIL
    is released) give identical bytes."""
    original = pil_jpeg(photo(200, 150))
    optimised, _ = rewrite(original, decoder)
    standard, offsets = decoder.restart_rewrite(original, 1, False)
    assert len(optimised) < len(standard) and np.array_equal(pil_pixels(standard), pil_pixels(original))
    every_four, offsets_four = decoder.restart_rewrite(original, 4, True)
    assert len(offsets_four) - 1 == -(-(len(offsets) - 1) // 4) and len(every_four) < len(optimised)
    results: list[bytes] = []

    def work() -> None:
        for _ in range(5):
            results.append(rewrite(original, decoder)[0])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20 and set(results) == {optimised}


def test_the_sof_patch_is_the_sub_images_size(rewritten):
    _, jpeg, index = rewritten["4:2:2"]
    sub = assemble(jpeg, index, 3, 2, index.columns, index.rows)  # to the right and bottom edges
    assert (sub.width, sub.height) == (index.width - 48, index.height - 16)
    at = bytes(sub.data).index(b"\xff\xc0")
    assert struct.unpack_from(">HH", sub.data, at + 5) == (sub.height, sub.width)


def test_the_self_check_passes_and_fails_where_sub_jpegs_would_be_wrong(decoder, monkeypatch):
    failure, cases = self_check(decoder)
    assert failure == "" and cases > 100
    monkeypatch.setattr("fastdata.image.jpeg.restart.EDGE_GUARD", 0)  # no margin where a region starts on an MCU edge
    failure, _ = self_check(decoder)
    assert "at scale 8/8: the sub-JPEG of Region(" in failure and "decodes to other pixels" in failure


def test_same_pixels_tells_a_lossless_rewrite_from_a_reencode(rewritten):
    original, jpeg, _ = rewritten["4:2:0"]
    reencoded = cv2_jpeg(cv2_pixels(original), "420")
    assert same_pixels(original, jpeg) and not same_pixels(original, reencoded)
    assert not same_pixels(original, b"garbage") and not same_pixels(original, rewritten["grayscale"][1])


def raised(call, *args) -> str:
    """The name of the exception `call(*args)` raises, or "" (any exception type shows in a failing test)."""
    try:
        call(*args)
    except Exception as exc:  # what is raised is the test's subject
        return type(exc).__name__
    return ""


def test_damaged_jpegs_and_indexes_raise_one_clear_error(rewritten):
    """Random damage to a rewritten JPEG or its stored index: build_index raises UnsupportedJpegError,
    RestartIndex.from_bytes CorruptSampleError, assemble ValueError (a decoder then says what is wrong), never
    anything else."""
    rng = np.random.default_rng(5)
    seen: dict[str, set[str]] = {"build_index": set(), "assemble": set(), "from_bytes": set()}
    for kind in ("4:2:0", "grayscale", "Pillow 4:2:0 with EXIF, ICC, comment"):
        _, jpeg, index = rewritten[kind]
        stored = index.to_bytes()
        for _ in range(200):
            damaged = bytearray(jpeg)
            for _ in range(int(rng.integers(1, 4))):
                damaged[int(rng.integers(0, len(damaged)))] = int(rng.integers(0, 256))
            damaged = bytes(damaged[:int(rng.integers(2, len(damaged) + 1))] if rng.random() < 0.3 else damaged)
            seen["build_index"].add(raised(build_index, damaged))
            seen["assemble"].add(raised(assemble, damaged, index, 0, 0, index.columns, index.rows))
            bad_index = bytearray(stored)
            bad_index[int(rng.integers(0, len(bad_index)))] = int(rng.integers(0, 256))
            seen["from_bytes"].add(raised(RestartIndex.from_bytes, bytes(bad_index)))
            with contextlib.suppress(CorruptSampleError):
                again = RestartIndex.from_bytes(bytes(bad_index))
                seen["assemble"].add(raised(assemble, jpeg, again, 0, 0, again.columns, again.rows))
    assert seen == {"build_index": {"", "UnsupportedJpegError"}, "assemble": {"", "ValueError"},
                    "from_bytes": {"", "CorruptSampleError"}}
