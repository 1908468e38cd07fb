"""How the region decoder finds its libjpeg-turbo (jpeg_library), how a library proves itself before use
(jpeg_region.self_check), and that falling back to OpenCV says so once and still yields the same pixels."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.batch import EncodedSample
from fastdata.image.jpeg.library import library_candidates, pillow_linked_library, wheel_libraries
from fastdata.image.jpeg.region import (
    PROBE_KINDS,
    PROBE_SCALES,
    Region,
    RegionDecoder,
    load_region_decoder,
    probe_boxes,
    probes,
    self_check,
)
from fastdata.image.pipeline import SamplePipeline

# ---------------------------------------------------------------------------------------------- discovery


@pytest.mark.parametrize("folder", ["Pillow.libs", "pillow.libs", "PILLOW.LIBS"])
def test_a_wheel_libs_folder_is_found_whatever_its_case_and_its_library_loads(decoder, tmp_path, folder):
    site = tmp_path / "site-packages"
    (site / "PIL").mkdir(parents=True)
    (site / folder).mkdir()
    (site / folder / "libz-0a1b2c3d.so.1").write_bytes(b"not this one")
    library = site / folder / "libjpeg-0a1b2c3d.so.62.4.0"
    shutil.copyfile(decoder.library, library)
    assert wheel_libraries(site) == [str(library)]
    assert library_candidates(site, None, None) == [str(library)]
    found, reason = load_region_decoder(library_candidates(site, None, None))
    assert found is not None and found.library == str(library), reason
    assert "bit-exact" in found.proof


def test_a_macos_wheel_dylibs_folder_is_found(tmp_path):
    dylibs = tmp_path / "PIL" / ".dylibs"
    dylibs.mkdir(parents=True)
    (dylibs / "libjpeg.62.dylib").write_bytes(b"")
    (dylibs / "libtiff.6.dylib").write_bytes(b"")
    assert wheel_libraries(tmp_path) == [str(dylibs / "libjpeg.62.dylib")]


def test_candidates_are_pillows_linked_library_then_the_wheels_then_the_systems_each_once(tmp_path):
    (tmp_path / "pillow.libs").mkdir()
    first, second = tmp_path / "pillow.libs" / "libjpeg-a.so.62", tmp_path / "pillow.libs" / "libjpeg-b.so.62"
    first.write_bytes(b"")
    second.write_bytes(b"")
    linked = tmp_path / "PIL" / ".." / "pillow.libs" / "libjpeg-b.so.62"  # as the dynamic linker may spell it
    (tmp_path / "PIL").mkdir()
    assert library_candidates(tmp_path, str(linked), "libjpeg.so.8") == [str(linked), str(first), "libjpeg.so.8"]
    assert library_candidates(None, None, None) == []


@pytest.mark.region_extension
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps, Linux only")
def test_pillows_linked_library_is_the_libjpeg_mapped_for_pil_imaging():
    """The dynamic linker's answer (dlsym + dladdr) against an independent one: the libjpeg files mapped into this
    process once PIL._imaging is loaded."""
    from PIL import _imaging  # noqa: F401  (loads Pillow's libjpeg)

    linked = pillow_linked_library()
    assert linked is not None and "jpeg" in Path(linked).name
    with open("/proc/self/maps") as maps:
        mapped = {os.path.realpath(line.split()[-1]) for line in maps if "jpeg" in line.rsplit("/", 1)[-1]}
    assert os.path.realpath(linked) in mapped


def test_the_discovered_library_is_pillows_own(decoder):
    assert os.path.realpath(decoder.library) == os.path.realpath(pillow_linked_library())


@pytest.mark.region_extension
def test_files_that_are_not_libjpeg_turbo_are_refused_each_with_its_reason(tmp_path):
    not_a_library = tmp_path / "libjpeg-fake.so.62"
    not_a_library.write_bytes(b"\x7fELF but not really")
    other_library = ctypes.util.find_library("z")  # a real library without the libjpeg API
    candidates = (str(not_a_library), str(tmp_path / "missing.so"), *([other_library] if other_library else []))
    found, reason = load_region_decoder(candidates)
    assert found is None
    assert reason.startswith("no usable libjpeg-turbo: ")
    assert f"{not_a_library}: cannot load" in reason and "missing.so: cannot load" in reason
    if other_library:
        assert f"{other_library}: " in reason and "no symbol jpeg_std_error" in reason
    assert "looked at" in load_region_decoder(())[1]


# ---------------------------------------------------------------------------------------------- self-check


def test_the_probes_cover_every_kind_and_scale_with_crops_that_need_column_cropping_and_row_skipping():
    import io

    from PIL import Image

    kinds = {probe.kind for probe in probes()}
    assert kinds == set(PROBE_KINDS)
    for probe in probes():
        with Image.open(io.BytesIO(probe.data)) as im:
            sampling = {"4:2:0": ((2, 2), (1, 1), (1, 1)), "4:2:2": ((2, 1), (1, 1), (1, 1)),
                        "4:4:4": ((1, 1), (1, 1), (1, 1))}
            factors = tuple(tuple(layer[1:3]) for layer in im.layer)
            assert factors == sampling[probe.kind.split()[-1]]
            assert ("progression" in im.info) == probe.kind.startswith("progressive")
        assert set(probe.expected) == set(PROBE_SCALES)
        for scale_num, expected in probe.expected.items():
            height, width = expected.shape[:2]
            imcu_rows = 8 * factors[0][1] * scale_num // 8  # output rows per iMCU row at this scale
            boxes = probe_boxes(width, height, scale_num)
            for left, top, box_w, box_h in boxes:
                assert left > 1 and 0 < left + box_w <= width  # jpeg_crop_scanline moves the start left
                assert top >= imcu_rows and 0 < top + box_h <= height  # jpeg_skip_scanlines skips an iMCU row
            (middle_left, middle_top, _, middle_h), (corner_left, *_) = boxes
            assert middle_top > imcu_rows and (middle_top % imcu_rows or imcu_rows == 1)  # and part of the next
            assert middle_top + middle_h < height  # stops before the last row
            assert middle_left % (2 * scale_num) == 0 and corner_left % 2 == 1  # on an iMCU column, and off one


def test_a_good_library_passes_every_case(decoder):
    failure, cases = self_check(decoder)
    assert failure == ""
    assert cases == len(PROBE_KINDS) * len(PROBE_SCALES) * 3  # the whole image and two regions per case
    assert decoder.proof.startswith(f"{cases} decodes bit-exact in ")


class FastIdctDecoder(RegionDecoder):
    """The same library with its fast integer IDCT (JDCT_IFAST), a real way of decoding slightly differently,
    selected through the extension's `fast` argument."""

    def decode(self, data, region, bgr=False, out=None, max_pixels=10**9):
        out = np.empty((region.height, region.width, 3), np.uint8)
        self._module.decode_into(self._api, data, out, region.scale_num, region.left, region.top, bgr, max_pixels, 1)
        return out


class NoFancyUpsamplingInRegionsDecoder(RegionDecoder):
    """Whole images as they should be, regions without fancy chroma upsampling: differs only where a crop is."""

    def decode(self, data, region, bgr=False, out=None, max_pixels=10**9):
        out = np.empty((region.height, region.width, 3), np.uint8)
        whole = (region.left, region.top) == (0, 0)
        self._module.decode_into(self._api, data, out, region.scale_num, region.left, region.top, bgr, max_pixels,
                                 0 if whole else 2)
        return out


def test_a_library_that_decodes_differently_fails_and_the_reason_names_the_case(decoder):
    from fastdata.image import _jpeg_region

    api = _jpeg_region.load(decoder.library)
    failure, cases = self_check(FastIdctDecoder(_jpeg_region, api, decoder.library))
    assert failure == "4:2:0 JPEG at scale 8/8: the whole-image decode differs from OpenCV's" and cases == 1
    failure, _ = self_check(NoFancyUpsamplingInRegionsDecoder(_jpeg_region, api, decoder.library))
    left, top, width, height = probe_boxes(99, 75, 8)[0]
    assert failure == (f"4:2:0 JPEG at scale 8/8: the {width}x{height} region at ({left}, {top}) differs from the "
                       "whole-image decode cropped")


def test_the_self_check_is_independent_of_the_library_loaded_for_another_decoder(decoder, tmp_path):
    """Each load resolves its own entry points: trying a bad library never replaces the one in use."""
    (tmp_path / "libjpeg-bad.so").write_bytes(b"junk")
    assert load_region_decoder((str(tmp_path / "libjpeg-bad.so"),))[0] is None
    probe = probes()[0]
    height, width = probe.expected[8].shape[:2]
    assert np.array_equal(decoder.decode(probe.data, Region(8, 0, 0, width, height)), probe.expected[8])


# ---------------------------------------------------------------------------------------------- fallback


def _samples(count: int) -> list[EncodedSample]:
    import io

    from PIL import Image

    samples = []
    for i in range(count):
        width, height = 90 + 7 * i, 70 + 3 * i
        y, x = np.mgrid[0:height, 0:width]
        array = np.stack([(x * 3 + i) % 256, (y * 5) % 256, (x + y) % 256], axis=2).astype(np.uint8)
        encoded = io.BytesIO()
        Image.fromarray(array).save(encoded, "JPEG", quality=90)
        samples.append(EncodedSample(f"img{i}", encoded.getvalue(), i % 3, width, height, CODEC_CV_JPEG, (i,)))
    return samples


@pytest.mark.region_extension
def test_falling_back_to_opencv_warns_once_with_the_reason_and_still_yields_the_pixels(tmp_path):
    libraries = (str(tmp_path / "libjpeg-not-a-library.so.62"),)
    Path(libraries[0]).write_bytes(b"not a library")
    samples = _samples(6)
    fallback = SamplePipeline("train", 32, seed=5, source="test", jpeg_libraries=libraries)
    whole = SamplePipeline("train", 32, seed=5, source="test")
    whole.region_decode = False  # OpenCV whole-image decode on purpose: nothing to warn about
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(3):
            got = fallback.batch(samples, epoch, "raise")
            want = whole.batch(samples, epoch, "raise")
            assert got.images.shape == (6, 3, 32, 32) and got.labels.tolist() == [0, 1, 2, 0, 1, 2]
            assert np.array_equal(got.images.numpy(), want.images.numpy())
        again = SamplePipeline("train", 32, seed=5, source="test", jpeg_libraries=libraries)  # same process
        again.batch(samples, 0, "raise")
    fallbacks = [w for w in caught if "decoded whole with OpenCV" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert fallbacks[0].category is RuntimeWarning
    assert f"{libraries[0]}: cannot load" in str(fallbacks[0].message)


def test_no_warning_when_the_region_decoder_is_in_use_or_switched_off(decoder):
    samples = _samples(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SamplePipeline("train", 32, seed=5, source="test").batch(samples, 0, "raise")
        switched_off = SamplePipeline("train", 32, seed=5, source="test", jpeg_libraries=("/nonexistent.so",))
        switched_off.region_decode = False
        switched_off.batch(samples, 0, "raise")
    assert not [w for w in caught if "decoded whole with OpenCV" in str(w.message)]
