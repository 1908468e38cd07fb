"""The `fastdata` command line: help texts, convert / info / bench, exit codes and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from builders import BAD_FILES, assert_one_line_error, build_solid_tree, cli, pattern, write_image

import fastdata


def convert(capsys, src, out, *extra):
    return cli(capsys, "convert", "imagefolder", src, out, "--workers", "1", "-q", *extra)


# ------------------------------------------------------------------------------------------------------ help


def test_python_m_fastdata_help_runs_in_a_subprocess():
    result = subprocess.run([sys.executable, "-m", "fastdata", "--help"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    for command in ("convert", "info", "bench", "demo"):
        assert command in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        ([], ["convert", "info", "bench", "demo"]),
        (["convert"], ["imagefolder"]),
        (["convert", "imagefolder"], ["SRC", "OUT", "--format", "--shard-size", "--seed", "--max-size",
                                      "--quality", "--workers", "--overwrite", "--strict", "-q"]),
        (["info"], ["PATH"]),
        (["bench"], ["PATH", "--baseline-imagefolder", "--epochs", "--batch-size", "--image-size",
                     "--workers"]),
        (["demo"], ["--dir", "--images", "--epochs"]),
    ],
)
def test_help_of_every_command(capsys, argv, needles):
    code, out, err = cli(capsys, *argv, "--help")
    assert code == 0, err
    assert "Usage:" in out
    for needle in needles:
        assert needle in out, needle


def test_version(capsys):
    code, out, _ = cli(capsys, "--version")
    assert code == 0
    assert fastdata.__version__ in out


def test_unknown_command_is_a_usage_error(capsys):
    code, _, err = cli(capsys, "convert", "nosuchkind", "a", "b")
    assert code == 2
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------------- convert


def test_convert_lmdb_and_info(capsys, tricky_tree, tmp_path):
    out = tmp_path / "train.lmdb"
    code, stdout, err = convert(capsys, tricky_tree.root, out)
    assert code == 0, err
    assert "wrote" in stdout and str(out) in stdout
    assert "27 in 3 classes" in stdout
    assert "ignored   5 non-image files" in stdout
    assert err == ""  # -q: no progress bar
    assert len(fastdata.dataset(out)) == 27

    code, stdout, err = cli(capsys, "info", out)
    assert code == 0, err
    assert "image" in stdout and "lmdb" in stdout
    assert "samples     27" in stdout
    assert "classes     3" in stdout
    for name in ("Bird", "cat", "dog.v2"):
        assert name in stdout
    assert "data.mdb" in stdout


def test_convert_wds_same_shards_as_the_api(capsys, tricky_tree, tricky_wds, tmp_path):
    out = tmp_path / "shards"
    code, stdout, err = convert(capsys, tricky_tree.root, out, "--format", "wds", "--shard-size", "4KB",
                                "--seed", "3")
    assert code == 0, err
    assert "wds" in stdout
    ours = [(f.name, f.sha256) for f in fastdata.info(out).files]
    assert ours == [(f.name, f.sha256) for f in fastdata.info(tricky_wds).files]
    code, stdout, _ = cli(capsys, "info", out)
    assert code == 0
    assert "wds" in stdout and "shard-000000.tar" in stdout


def test_convert_max_size(capsys, tricky_tree, tmp_path):
    out = tmp_path / "small.lmdb"
    code, _, err = convert(capsys, tricky_tree.root, out, "--max-size", "30", "--quality", "80")
    assert code == 0, err
    ds = fastdata.dataset(out)
    assert max(max(ds[i][0].shape[1:]) for i in range(len(ds))) == 30
    assert fastdata.info(out).options["quality"] == 80


def test_convert_reports_rejected_files(capsys, bad_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    code, stdout, err = convert(capsys, bad_tree.root, out)
    assert code == 0, err
    assert "rejected  3 files" in stdout
    for path in BAD_FILES:
        line = next(line for line in stdout.splitlines() if path in line)
        assert line.split(path, 1)[1].strip(": ")  # a reason follows the path
    assert len(fastdata.dataset(out)) == 4


def test_strict_exit_code_1_and_nothing_written(capsys, bad_tree, tmp_path):
    out = tmp_path / "out.lmdb"
    code, _, err = convert(capsys, bad_tree.root, out, "--strict")
    assert code == 1
    assert_one_line_error(err, "error:")
    assert any(str(bad_tree.path(p)) in err for p in BAD_FILES), err
    assert not out.exists()
    assert not (tmp_path / "out.lmdb.partial").exists()


# ---------------------------------------------------------------------------------------------------- errors


def test_missing_source(capsys, tmp_path):
    code, _, err = convert(capsys, tmp_path / "missing", tmp_path / "out.lmdb")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "missing"), "does not exist")


def test_empty_source(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = convert(capsys, tmp_path / "empty", tmp_path / "out.lmdb")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "empty"), "empty")


def test_source_without_class_folders(capsys, tmp_path):
    flat = tmp_path / "flat"
    write_image(flat / "a.png", pattern(0, 21, 21), "png")
    code, _, err = convert(capsys, flat, tmp_path / "out.lmdb")
    assert code == 2
    assert_one_line_error(err, str(flat), "class folders")


def test_output_without_lmdb_suffix_or_format(capsys, tricky_tree, tmp_path):
    code, _, err = convert(capsys, tricky_tree.root, tmp_path / "out")
    assert code == 2
    assert_one_line_error(err, str(tmp_path / "out"), "--format wds")
    assert not (tmp_path / "out").exists()


def test_bad_option_values(capsys, tricky_tree, tmp_path):
    code, _, err = convert(capsys, tricky_tree.root, tmp_path / "o", "--format", "wds", "--shard-size", "big")
    assert code == 2
    assert_one_line_error(err, "big")
    code, _, err = convert(capsys, tricky_tree.root, tmp_path / "o", "--format", "zip")
    assert code == 2
    assert "Traceback" not in err and "zip" in err
    assert sorted(tmp_path.iterdir()) == []


def test_existing_dataset_refused_then_overwritten(capsys, tmp_path):
    small = build_solid_tree(tmp_path / "small", count=4)
    large = build_solid_tree(tmp_path / "large", count=7)
    out = tmp_path / "out.lmdb"
    assert convert(capsys, small.root, out)[0] == 0
    code, _, err = convert(capsys, large.root, out)
    assert code == 2
    assert_one_line_error(err, str(out), "--overwrite")
    assert fastdata.info(out).num_samples == 4
    code, _, err = convert(capsys, large.root, out, "--overwrite")
    assert code == 0, err
    assert fastdata.info(out).num_samples == 7


def test_existing_non_dataset_refused_even_with_overwrite(capsys, tricky_tree, tmp_path):
    out = tmp_path / "notes.lmdb"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        code, _, err = convert(capsys, tricky_tree.root, out, *extra)
        assert code == 2
        assert_one_line_error(err, str(out), "not a fastdata dataset")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_partial_leftovers(capsys, tmp_path):
    src = build_solid_tree(tmp_path / "src", count=4)
    out = tmp_path / "out.lmdb"
    partial = tmp_path / "out.lmdb.partial"
    partial.mkdir()
    (partial / "data.mdb").write_bytes(b"\0" * 100)
    code, _, err = cli(capsys, "info", out)
    assert code == 2
    assert_one_line_error(err, str(out), "incomplete conversion", "rerun the same convert command")
    # leftovers that cannot be reopened are not discarded behind the user's back ...
    code, _, err = convert(capsys, src.root, out)
    assert code == 2
    assert_one_line_error(err, str(partial), "cannot be reopened", "MDB_INVALID", "--overwrite")
    assert (partial / "data.mdb").read_bytes() == b"\0" * 100
    code, _, err = convert(capsys, src.root, out, "--overwrite")  # ... until asked
    assert code == 0, err
    assert fastdata.info(out).num_samples == 4
    # leftovers with nothing to resume (killed before the storage was written) are replaced by a fresh run
    out = tmp_path / "again.lmdb"
    partial = tmp_path / "again.lmdb.partial"
    partial.mkdir()
    (partial / "data.mdb").write_bytes(b"")
    code, _, err = convert(capsys, src.root, out)
    assert code == 0, err
    assert not partial.exists()
    assert fastdata.info(out).num_samples == 4


def test_info_on_something_that_is_not_a_dataset(capsys, tricky_tree, tmp_path):
    for path in (tmp_path / "missing", tricky_tree.root, tricky_tree.path("cat/b01.png")):
        code, out, err = cli(capsys, "info", path)
        assert code == 2
        assert out == ""
        assert_one_line_error(err, "error:", str(path))


def test_bench_on_something_that_is_not_a_dataset(capsys, tmp_path):
    code, _, err = cli(capsys, "bench", tmp_path, "--epochs", "1", "--workers", "0")
    assert code == 2
    assert_one_line_error(err, str(tmp_path))
