"""The target registry (`fastdata.image.targets.codec`): every target kind a manifest may name has one codec, each
codec does what the pipeline asks of every kind, and a kind this fastdata does not know is refused by name."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import TARGET_KINDS, read_manifest
from fastdata.image.targets.codec import CODECS, CUSTOM_WRAPPERS, TargetCodec, target_codec


def test_every_target_kind_has_a_codec_with_the_whole_interface(solid_lmdb, pairs_lmdb, rect_lmdb, seg_rect_lmdb):
    assert set(CODECS) == set(TARGET_KINDS)
    wanted = [name for name, _ in inspect.getmembers(TargetCodec, inspect.isfunction) if not name.startswith("_")]
    assert sorted(wanted) == ["batch", "deliver", "describe", "from_json", "one", "read"]
    seen = set()
    for path in (solid_lmdb, pairs_lmdb, rect_lmdb, seg_rect_lmdb):
        manifest = read_manifest(path)
        codec = target_codec(manifest, str(path))
        seen.add(manifest.target_kind)
        assert all(callable(getattr(codec, name, None)) for name in wanted), (manifest.target_kind, codec)
        assert isinstance(codec.spatial, bool) and isinstance(codec.whole_images_as_lists, bool)
        if codec.spatial:  # what the sample pipeline asks of a codec whose targets follow the pixels
            assert all(callable(getattr(codec, name, None)) for name in ("record", "whole", "custom_input"))
            assert type(codec) in CUSTOM_WRAPPERS
    assert seen == set(TARGET_KINDS)


def test_an_unknown_kind_and_a_caption_length_for_images_are_refused(solid_lmdb):
    manifest = read_manifest(solid_lmdb)
    with pytest.raises(NotADatasetError, match="unknown target kind 'tracks'"):
        target_codec(dataclasses.replace(manifest, target_kind="tracks"), "somewhere")
    with pytest.raises(ConfigError, match="max_length: for text datasets and image-text pairs only"):
        target_codec(manifest, "somewhere", max_length=77)
