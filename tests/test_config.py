"""config.parse_size: byte counts with decimal (KB/MB/GB) and binary (KiB/MiB/GiB) units."""

from __future__ import annotations

import pytest

from fastdata.config import available_cores, parse_size
from fastdata.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MB", 256_000_000),
        ("64KB", 64_000),
        ("1GiB", 2**30),
        ("1000", 1000),
        ("4KB", 4000),
        ("1.5GiB", 3 * 2**29),
        ("2MiB", 2 * 2**20),
        ("512KiB", 512 * 1024),
        ("1GB", 10**9),
        ("64kb", 64_000),
        (" 10 MB ", 10_000_000),
        ("7B", 7),
        ("1TB", 10**12),
        (4096, 4096),
        (1, 1),
    ],
)
def test_parse_size(text, expected):
    value = parse_size(text)
    assert value == expected
    assert isinstance(value, int)


BAD = ["", "abc", "MB", "12XB", "-5", "-5MB", "0", "0KB", "1..5MB", "5 M B", 0, -3]


@pytest.mark.parametrize("text", BAD)
def test_bad_sizes_are_config_errors(text):
    with pytest.raises(ConfigError) as info:
        parse_size(text)
    assert isinstance(info.value, ValueError)
    if isinstance(text, str) and text.strip():
        assert repr(text) in str(info.value)


def test_available_cores():
    assert available_cores() >= 1
