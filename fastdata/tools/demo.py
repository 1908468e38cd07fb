"""`fastdata demo`: the whole path on a built-in sample: make photos, convert to LMDB, benchmark against a
torchvision ImageFolder DataLoader, print the table, and beside it what the figures depend on: a busy machine
(other processes took a noticeable share of the CPU while they were timed) and a missing region decoder (the C
extension was not built: what to install)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastdata.converters.imagefolder import ImageFolderOptions, convert_imagefolder
from fastdata.tools.bench import BenchConfig, busy_machine_note, format_table, run_bench
from fastdata.tools.sample import make_sample_imagefolder, photo_paths


def _count_images(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg", ".png"))


def decoder_note() -> str:
    """A line saying that fastdata's figure is without the region decoder, and why (for a C extension that was not
    built: what to install); "" when the region decoder is in use."""
    from fastdata.image.jpeg.region import region_decoder, unavailable_reason

    if region_decoder() is not None:
        return ""
    without = "note: fastdata's figure is without its region decoder (whole JPEGs decoded with OpenCV)"
    return f"{without}: {unavailable_reason()}"


def run_demo(directory: Path, images: int = 1200, epochs: int = 2, batch_size: int = 128,
             workers: int | None = None, echo: Callable[[str], None] = print) -> None:
    """Run the demo in `directory` (reusing a sample already made there)."""
    directory = Path(directory)
    src, out = directory / "sample", directory / "sample.lmdb"
    if not src.is_dir() or _count_images(src) != images:
        if not photo_paths()[0]:
            echo("note: scikit-image is not installed, so the sample uses synthetic scenes instead of photos "
                 "(pip install 'fastdata[sample]' for photos)")
        echo(f"making a sample ImageFolder of {images:,} photos in {src} ...")
        if src.exists():
            import shutil

            shutil.rmtree(src)
        make_sample_imagefolder(src, images=images, workers=workers)
    echo(f"\n$ fastdata convert imagefolder {src} {out}")
    echo(str(convert_imagefolder(src, out, ImageFolderOptions(overwrite=True, workers=workers))))
    echo(f"\n$ fastdata bench {out} --baseline-imagefolder {src}")
    config = BenchConfig(epochs=epochs, batch_size=batch_size, workers=workers, repeats=1)  # a quick look
    results = run_bench(out, config, baseline_imagefolder=src, progress=echo)
    echo("")
    echo(format_table(results))
    for note in (busy_machine_note(results), decoder_note()):
        if note:
            echo(note)
    echo(f"\nIn your training script: loader = fastdata.loader({str(out)!r}, batch_size={batch_size})"
         "  # instead of DataLoader(ImageFolder(...))")
