"""The C extension's types (csrc/jpeg_region.c, csrc/jpeg_restart.c): libjpeg-turbo loaded at run time for region
decodes and lossless restart rewrites, and the restart segments of a JPEG (`fastdata.image.jpeg`)."""

from _typeshed import ReadableBuffer, WriteableBuffer

def load(path: str, /) -> object:
    """dlopen a libjpeg-turbo (libjpeg API 6.2) and resolve its entry points (a capsule)."""

def linked_library(path: str, symbol: str, /) -> str | None:
    """The file of the library providing `symbol` to the loaded object `path`, or None."""

def decode_into(api: object, data: ReadableBuffer, out: WriteableBuffer, scale_num: int, left: int, top: int,
                bgr: bool, max_pixels: int, fast: int = 0, /) -> None:
    """Decode the region of out.shape[:2] at (left, top) of the JPEG `data` at scale scale_num/8 into `out`."""

def header(api: object, data: ReadableBuffer, scale_num: int = 8, /) -> tuple[int, int, int]:
    """(width, height, components) of the image decoded at scale_num/8."""

def restart_rewrite(api: object, data: ReadableBuffer, interval_mcus: int, optimize: bool, max_pixels: int, /
                    ) -> tuple[bytes, bytes]:
    """(jpeg, offsets): `data` rewritten with a restart marker every interval_mcus MCUs; offsets uint32 bytes."""

def restart_scan(data: ReadableBuffer, /) -> bytes:
    """Where each restart segment of the first scan starts, then where its entropy-coded data ends (uint32)."""

def restart_assemble(data: ReadableBuffer, offsets: ReadableBuffer, columns: int, keep: int, tables: int, sof: int,
                     c0: int, r0: int, c1: int, r1: int, width: int, height: int, /) -> bytes:
    """The sub-JPEG of MCU columns [c0, c1) x rows [r0, r1) (fastdata.image.jpeg.restart.assemble)."""
