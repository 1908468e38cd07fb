"""The `fastdata` command line: help texts, convert / info / bench, exit codes and one-line errors (every mistake a
user can make: one line naming the problem and the fix, exit code 2, no traceback; Ctrl-C: one line, exit 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from builders.damaged import corrupt_copy
from builders.images import (
    BAD_FILES,
    build_non_utf8_tree,
    build_solid_tree,
    encode,
    pattern,
    solid_pattern,
    write_image,
)
from builders.runs import assert_one_line_error, cli, less_the_fallback_note, run_python
from builders.text import make_corpus, train_bytelevel, write_jsonl

import fastdata
from fastdata.convert.staging import NOT_STARTED_HINT


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


def test_help_lists_every_convert_subcommand_with_its_description(capsys):
    from fastdata.converters import REGISTRY, SUMMARIES

    assert sorted(REGISTRY) == sorted(SUMMARIES) == ["coco", "hf", "imagefolder", "list", "pairs", "text",
                                                     "webdataset"]
    for argv, prefix in ((["--help"], "convert "), (["convert", "--help"], "")):
        code, out, _ = cli(capsys, *argv)
        assert code == 0
        listed = " ".join(out.split()).split("Commands: ", 1)[1]  # the help wraps long lines
        for kind in REGISTRY:
            assert f" {prefix}{kind} {SUMMARIES[kind]} " in f" {listed} "
    code, out, _ = cli(capsys, "convert", "imagefolder", "--help")  # the summary is the command's own too
    assert code == 0 and "Pack an ImageFolder tree SRC" in out


@pytest.mark.parametrize(("preset", "numpy_first", "expected"), [(None, False, "1"), ("3", False, "3"),
                                                                 (None, True, None)])
def test_the_command_line_keeps_numpy_blas_to_one_thread_unless_told(preset, numpy_first, expected):
    """OpenBLAS spins a thread per core at numpy's import (~0.1 s of CPU, taken from the conversion workers): the
    command line asks for one thread, unless the user set OPENBLAS_NUM_THREADS or numpy was already loaded."""
    script = (("import numpy\n" if numpy_first else "") + "import os, sys\nfrom fastdata.cli import main\n"
              "main(['--version'])\nprint('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                            check=False)
    assert result.stdout.splitlines()[-1] == f"BLAS {expected}", result.stdout + result.stderr


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["convert", "--help"], []])
def test_version_and_help_do_not_import_torch(argv):
    """`fastdata --version` / `--help` answer without importing torch (or the converters); the time they take is
    measured by benchmarks/startup.py, not asserted here."""
    script = ("import sys\nfrom fastdata.cli import main\ncode = main(sys.argv[1:])\n"
              "heavy = sorted(m for m in ('torch', 'numpy', 'fastdata.loader', 'fastdata.converters.imagefolder') "
              "if m in sys.modules)\nprint('HEAVY', heavy, code)")
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.stdout.splitlines()[-1] == f"HEAVY [] {2 if not argv else 0}", result.stdout + result.stderr


def test_import_fastdata_does_not_import_torch_and_the_public_names_still_work():
    script = """
import sys
import fastdata
assert "torch" not in sys.modules, "import fastdata imported torch"
from fastdata.loader import loader as loader_function   # binds the submodule `fastdata.loader` ...
import fastdata.meter.stages
assert fastdata.loader is loader_function                # ... yet fastdata.loader is still the function
from fastdata import loader, meter, dataset, info, convert_imagefolder, convert_text
assert callable(fastdata.meter) and meter is fastdata.meter and callable(info)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip() == "ok", result.stderr


def test_unknown_command_is_a_usage_error(capsys):
    code, _, err = cli(capsys, "convert", "nosuchkind", "a", "b")
    assert code == 2
    assert err == "error: No such command 'nosuchkind'. (see 'fastdata convert --help')\n"


@pytest.mark.parametrize(("argv", "line"), [
    (["convert", "imagefolder", "src", "out.lmdb", "--workers", "abc"],
     "error: Invalid value for '--workers': 'abc' is not a valid integer. (see 'fastdata convert imagefolder "
     "--help')"),
    (["convert", "imagefolder"], "error: Missing argument 'SRC'. (see 'fastdata convert imagefolder --help')"),
    (["bench", "x.lmdb", "--augment", "big"],
     "error: Invalid value for '--augment': 'big' is not one of 'train', 'val'. (see 'fastdata bench --help')"),
    (["info", "a", "b"], "error: Got unexpected extra argument (b) (see 'fastdata info --help')"),
])
def test_usage_errors_are_one_line(capsys, argv, line):
    code, out, err = cli(capsys, *argv)
    assert (code, out, err) == (2, "", line + "\n")


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


# ------------------------------------------------------------------------------- outputs that cannot be made


@pytest.mark.parametrize(("place", "reason"), [
    ("/proc/x.lmdb", "making a folder in /proc fails (No such file or directory)"),
    ("{tmp}/file.txt/out.lmdb", "{tmp}/file.txt is a file, not a folder"),
])
def test_an_output_that_cannot_be_made(capsys, tricky_tree, tmp_path, place, reason):
    (tmp_path / "file.txt").write_text("mine")
    out = place.format(tmp=tmp_path)
    code, stdout, err = convert(capsys, tricky_tree.root, out)
    assert (code, stdout) == (2, "")
    assert err == f"error: {out}: cannot be created: {reason.format(tmp=tmp_path)}; choose another OUT\n"
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_an_output_inside_the_source_is_refused(capsys, tmp_path):
    src = build_solid_tree(tmp_path / "src", count=4).root
    out = src / "alpha" / "out.lmdb"
    code, stdout, err = convert(capsys, src, out)
    assert (code, stdout) == (2, "")
    assert err == (f"error: {out}: is inside the source folder {src}; the next conversion of {src} would take it "
                   "in as data: choose an OUT outside the source\n")
    assert sorted(p.name for p in (src / "alpha").iterdir()) == ["s000.png", "s003.png"]


# --------------------------------------------------------------------------------------- non-UTF-8 file names


def test_file_names_that_are_not_utf8_convert_and_print(tmp_path):
    """In a subprocess, as a user runs it: the summary and `info` print such names as their own bytes."""
    tree = build_non_utf8_tree(tmp_path / "src")
    out = tmp_path / "d.lmdb"
    run = [sys.executable, "-m", "fastdata"]
    converted = subprocess.run([*run, "convert", "imagefolder", tree.root, out, "--workers", "1", "-q"],
                               capture_output=True, timeout=300, check=False)
    assert (converted.returncode, converted.stderr) == (0, b""), converted.stderr.decode(errors="replace")
    assert b"images    6 in 2 classes" in converted.stdout
    shown = subprocess.run([*run, "info", out], capture_output=True, timeout=300, check=False)
    assert (shown.returncode, shown.stderr) == (0, b""), shown.stderr.decode(errors="replace")
    assert b"    caf\xe9 " in shown.stdout and b"    plain " in shown.stdout


# ----------------------------------------------------------------------------------- errors from the workers


def test_a_corrupt_sample_met_by_a_worker_is_one_line_naming_dataset_and_key(capsys, solid_lmdb, tmp_path):
    path, key = corrupt_copy(solid_lmdb, tmp_path, 7, b"not an image")
    code, _, err = cli(capsys, "bench", path, "--workers", "2", "--epochs", "1", "--repeats", "1",
                       "--warmup-passes", "0", "--no-upper-bound", "--batch-size", "4", "--image-size", "16",
                       "--step", "none")
    assert code == 2
    assert "Traceback" not in err and "Caught" not in err
    assert err.splitlines()[-1].startswith(f"error: {path}: sample {key!r}: ")
    assert [line for line in err.splitlines() if not line.startswith("bench: ")] == [err.splitlines()[-1]]


# ----------------------------------------------------------------------------------------------------- Ctrl-C


def _until_a_worker_reads(fifo, process, seconds=120):
    """Open the write end of `fifo` once a reader has it open (a conversion worker reading it as an image)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no worker opened the FIFO"
            time.sleep(0.05)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_during_a_conversion_is_one_line_and_exit_130_and_rerunning_resumes(tmp_path, workers, reap):
    """A real SIGINT to the whole process group (as a terminal's Ctrl-C sends it: the pool workers get it too),
    sent while the conversion is under way: a worker is blocked reading a FIFO that stands as an image."""
    tree = build_solid_tree(tmp_path / "src", count=12)
    fifo = tree.root / "gamma" / "zz.png"
    os.mkfifo(fifo)
    out = tmp_path / "out.lmdb"
    argv = [sys.executable, "-m", "fastdata", "convert", "imagefolder", str(tree.root), str(out), "--workers",
            str(workers), "-q"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    reap(process)
    held = _until_a_worker_reads(fifo, process)
    try:
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        os.close(held)
    assert (process.returncode, stdout) == (130, "")
    assert stderr == "interrupted; rerun the same command to resume the conversion\n"
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # no worker is left in the group
    assert not out.exists() and (tmp_path / "out.lmdb.partial").is_dir()

    rerun = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    reap(rerun)
    held = _until_a_worker_reads(fifo, rerun)
    os.set_blocking(held, True)
    os.write(held, encode(solid_pattern(12, 21, 21), "PNG"))  # this time the "image" arrives
    os.close(held)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert "resumed an interrupted conversion" in stdout
    assert fastdata.info(out).num_samples == 13


def test_ctrl_c_during_a_text_conversion_stuck_in_a_read(tmp_path, reap):
    """The text reader thread waits in a read that does not return (a FIFO stands as a source file, as a stalled
    disk would): Ctrl-C still ends the conversion at once, with the one line and exit code 130."""
    corpus = make_corpus(40, seed=1)
    src = tmp_path / "corpus"
    src.mkdir()
    write_jsonl(src / "a.jsonl", corpus)
    fifo = src / "b.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out.lmdb"
    argv = [sys.executable, "-m", "fastdata", "convert", "text", str(src), str(out), "--tokenizer",
            str(train_bytelevel(tmp_path / "bpe.json", corpus)), "-q"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    reap(process)
    held = _until_a_worker_reads(fifo, process)
    try:
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        os.close(held)
    assert (process.returncode, stdout) == (130, "")
    assert stderr == "interrupted; rerun the same command to resume the conversion\n"
    assert not out.exists()


def test_ctrl_c_of_any_command_is_one_line_and_exit_130(tmp_path, solid_lmdb, reap):
    """bench with DataLoader workers: neither they nor torch print a traceback."""
    argv = [sys.executable, "-m", "fastdata", "bench", str(solid_lmdb), "--workers", "2", "--epochs", "100000",
            "--repeats", "1", "--no-upper-bound", "--batch-size", "4", "--image-size", "16", "--step", "none"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    reap(process)
    started = []
    for line in process.stderr:  # bench announces each run before it starts it
        started.append(line)
        if "run 1/1" in line:
            break
    time.sleep(2)  # into the timed passes, workers running
    os.killpg(process.pid, signal.SIGINT)
    stdout, rest = process.communicate(timeout=120)
    assert process.returncode == 130, "".join(started) + rest
    assert less_the_fallback_note(rest) == "interrupted\n"
    assert stdout == ""
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # no worker is left in the group


# A converter (registered as `slow` by RUN_SLOW_CONVERTER) whose module gets a Ctrl-C while it is imported, and
# swallows it, as torch's C code does when it imports numpy
SWALLOWED_BY_AN_IMPORTER = """
import os, signal, time
import click

try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
except BaseException:
    pass


def cli_command():
    @click.command()
    def slow():
        for _ in range(500):
            time.sleep(0.01)
        click.echo("finished")
    return slow
"""

# A converter whose command gets a Ctrl-C in a fork hook (as logging's, run each time a DataLoader starts a worker),
# where Python cannot let an exception propagate
LOST_IN_A_FORK_HOOK = """
import os, signal, time
import click


def ctrl_c_here():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)


def cli_command():
    @click.command()
    def slow():
        os.register_at_fork(after_in_parent=ctrl_c_here)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        for _ in range(500):
            time.sleep(0.01)
        click.echo("finished")
    return slow
"""

RUN_SLOW_CONVERTER = """
import sys
sys.path.insert(0, sys.argv[1])
from fastdata import converters
converters.REGISTRY["slow"] = "slow_converter"
converters.SUMMARIES["slow"] = "A converter that gets a Ctrl-C where it could be lost."
from fastdata.cli import main
sys.exit(main(["convert", "slow"]))
"""


@pytest.mark.parametrize("converter", [SWALLOWED_BY_AN_IMPORTER, LOST_IN_A_FORK_HOOK], ids=["import", "fork-hook"])
def test_ctrl_c_where_python_would_lose_it_still_ends_the_command(tmp_path, converter):
    """Python's own handler raises KeyboardInterrupt wherever the command is; an importer may swallow it, and a
    fork hook cannot let it out ("Exception ignored in ..."), and the command would run on to the end. The
    interrupt is held there and raised a moment later: one line, exit code 130, the command did not finish."""
    (tmp_path / "slow_converter.py").write_text(converter)
    result = run_python(RUN_SLOW_CONVERTER, tmp_path)
    assert (result.returncode, result.stdout) == (130, ""), result.stderr
    # the slow converter writes nothing: the line says so (no "rerun to resume")
    assert result.stderr == f"interrupted; {NOT_STARTED_HINT}\n"
