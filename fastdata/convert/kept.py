"""What a conversion kept, judged before it is committed, the same for every converter (images and text):

- one that keeps nothing fails (no dataset is left, not even a partial one: there is nothing to resume);
- one that rejects more of its input than `--max-rejected` allows (default: half of it) fails with exit code 1 and
  commits nothing, naming where it looked and the commonest reasons; its staging `OUT.partial` keeps the work, so
  that a rerun with a higher limit (`--max-rejected 100%`: any) commits it without converting again;
- one that rejects most of its input but is allowed to says so once, first (a warning, and the summary's first
  line); fewer rejections are listed in the summary and the manifest.

Most rejections of most of the input come from a wrong option (`--root`, an images folder, `--field`), not a damaged
source, so the messages name where the conversion looked: the absolute folder its paths are read from, the field it
read. `--strict` stops at the first rejection instead, writing nothing."""

from __future__ import annotations

import re
import shutil
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fastdata.errors import ConfigError, MostlyRejectedWarning, SourceError, TooManyRejectedError

#: Rejected share of the input above which a conversion that is allowed to go on warns prominently.
MOSTLY_REJECTED = 0.5
#: The default of `--max-rejected`: more than half of the input rejected fails the conversion.
DEFAULT_MAX_REJECTED = "50%"


@dataclass(frozen=True)
class RejectionLimit:
    """`--max-rejected`: a count of rejected items, or a share of the input (`share`), that a conversion may reject
    and still commit."""

    given: str
    count: int | None = None
    share: float | None = None

    def exceeded(self, rejected: int, total: int) -> bool:
        if self.count is not None:
            return rejected > self.count
        assert self.share is not None
        return rejected > self.share * total


def rejection_limit(value: str | int | float) -> RejectionLimit:
    """Parse `--max-rejected`: a count (`0`, `25`) or a percentage of the input (`5%`, `100%`); ConfigError else."""
    text = str(value).strip()
    if isinstance(value, bool):
        raise ConfigError(f"--max-rejected must be a count or a percentage such as 5%, got {value!r}")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if match:
        share = float(match.group(1)) / 100
        if share > 1:
            raise ConfigError(f"--max-rejected {text}: a percentage of the input is at most 100%")
        return RejectionLimit(text, share=share)
    if re.fullmatch(r"\d+", text):
        return RejectionLimit(text, count=int(text))
    raise ConfigError(f"--max-rejected must be a count (e.g. 0 or 25) or a percentage of the input (e.g. 5% or "
                      f"100%), got {value!r}")


def _common(reasons: Sequence[str], shown: int = 3) -> str:
    """The most frequent reasons (their first 160 characters), with counts."""
    counted = Counter(reason[:160] for reason in reasons).most_common(shown)
    return "; ".join(f"{reason} (x{count:,})" if count > 1 else reason for reason, count in counted)


def _share(part: int, total: int) -> str:
    """`part` of `total` as a percentage that says 100% only when it is all, 0% only when it is none."""
    share = f"{part / total:.0%}"
    if share == "100%" and part < total:
        return ">99%"
    if share == "0%" and part:
        return "<1%"
    return share


def check_kept(out: Path, partial: Path, kept: int, rejected: int, reasons: Sequence[str], what: str,
               looked: str, limit: RejectionLimit | None = None) -> str | None:
    """Judge a conversion that kept `kept` and rejected `rejected` `what` (e.g. "images") for `reasons` (those
    recorded), looking `looked` ("for files under /abs/images", "in field 'body'"), before it commits:
    SourceError (after removing `partial`) when nothing was kept; TooManyRejectedError (`partial` kept) when the
    rejections exceed `limit` (default DEFAULT_MAX_REJECTED); else the warning line (also warned, once, as a
    MostlyRejectedWarning) when more than MOSTLY_REJECTED of the input was rejected, or None."""
    limit = limit or rejection_limit(DEFAULT_MAX_REJECTED)
    total = kept + rejected
    if kept == 0:
        shutil.rmtree(partial, ignore_errors=True)
        detail = f": {_common(reasons)}" if reasons else ""
        raise SourceError(f"{out}: no {what} kept: all {total:,} were rejected, looking {looked}{detail}. Nothing "
                          f"was written; check the source and its options" if total else
                          f"{out}: no {what} kept: the source lists none (looking {looked}). Nothing was written")
    if limit.exceeded(rejected, total):
        raise TooManyRejectedError(
            f"{out}: {rejected:,} of {total:,} {what} ({_share(rejected, total)}) were rejected, more than "
            f"--max-rejected {limit.given} allows, looking {looked}: {_common(reasons)}. Nothing was committed: "
            f"{partial} keeps the work; rerun the same command with --max-rejected 100% to commit it as it is "
            "(nothing is converted again), or correct the source or its options and rerun with --overwrite")
    if rejected > MOSTLY_REJECTED * total:
        line = (f"WARNING: {rejected:,} of {total:,} {what} ({_share(rejected, total)}) were rejected, looking "
                f"{looked}: {_common(reasons)}. Is that the right folder or field?")
        warnings.warn(f"{out}: {line}", MostlyRejectedWarning, stacklevel=3)
        return line
    return None
