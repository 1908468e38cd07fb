"""One exception hierarchy for fastdata. Every message names the file/record and what to do about it."""

from __future__ import annotations


class FastdataError(Exception):
    """Base class of every error fastdata raises on purpose (the CLI prints these as one line)."""


class SourceError(FastdataError):
    """The conversion source is missing, empty or not laid out as expected."""


class OutputError(FastdataError):
    """The conversion output cannot be written where it was asked for: its folder cannot be created there, or it
    lies inside the source."""


class OutputExistsError(OutputError):
    """The conversion output already exists (or holds leftovers of an interrupted conversion)."""


class OutputBusyError(OutputError):
    """Another conversion is writing the same output now (it holds the output's lock,
    `fastdata.output_lock`): refused before anything is changed; the message names that process."""


class TooManyRejectedError(SourceError):
    """A conversion rejected more of its input than `--max-rejected` allows: nothing is committed, and the
    staging `OUT.partial` keeps the work, so that a rerun with a higher limit completes it without converting
    again (the CLI exits with 1, as for --strict)."""


class MostlyRejectedWarning(UserWarning):
    """A conversion rejected most of its input and was allowed to (`--max-rejected`): said once, first. The command
    line shows it as the summary's first line (and not a second time as a note)."""


#: The remedy every StagingDamagedError message ends with.
START_AGAIN = "the interrupted conversion cannot be resumed: pass --overwrite to start it again"


class StagingDamagedError(OutputExistsError):
    """The leftovers of an interrupted conversion (`OUT.partial`) cannot be resumed: damaged or unreadable. Never
    discarded silently: the message names the cause, and `--overwrite` starts the conversion again."""


class NotADatasetError(FastdataError):
    """A path that was expected to hold a fastdata dataset does not."""


class IncompleteDatasetError(NotADatasetError):
    """A path holds an interrupted conversion, never a complete dataset."""


class CorruptSampleError(FastdataError):
    """A stored or source sample cannot be decoded."""


class UnsupportedJpegError(FastdataError):
    """A JPEG the lossless restart-marker rewrite does not handle (arithmetic coding, not 8-bit, lossless, CMYK/YCCK,
    damaged entropy data), or stored bytes that are not a restart-indexed JPEG: keep (or decode) the original."""


class DeviceDecodeError(FastdataError):
    """The device decoder (decode="device") ran out of memory or keeps failing; the message names the batch."""


class ConfigError(FastdataError, ValueError):
    """An option has a value that cannot work."""


class ResumeError(ConfigError):
    """A loader state cannot be restored into this loader (another dataset, other options, a world size the
    epoch cannot be split over again, or a state from another version)."""


class RemoteError(FastdataError):
    """A remote dataset could not be fetched (the message names the URL and the cause)."""


class WorkerError(FastdataError):
    """A loader worker died or stopped answering; the message names the worker and what it was loading."""


class RejectedFileError(SourceError):
    """A source file could not be used and the conversion was asked to be strict about it."""


def from_worker(exc: FastdataError) -> FastdataError:
    """Our own error back from torch's wrapping of it. An exception raised in a DataLoader worker reaches the main
    process as `type(exc)("Caught <Type> in DataLoader worker process N.\nOriginal Traceback ...")`: the worker's
    whole traceback in place of the message, which then no longer starts with the dataset, shard and key. This
    gives a new exception of the same type with the original message (raise it `from exc` to keep the worker's
    traceback), or `exc` itself when it was not wrapped."""
    text = str(exc)
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return exc
    marker = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    at = text.rfind(marker)
    if at < 0:
        return exc
    try:
        return type(exc)(text[at + len(marker):].rstrip("\n"))
    except Exception:  # a subclass whose constructor takes more than a message
        return exc
