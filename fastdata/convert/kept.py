"""What a conversion kept, judged before it is committed: one that keeps nothing fails (no dataset is left, not
even a partial one: there is nothing to resume), and one that rejects most of its input says so prominently,
naming where it looked (the absolute folder its paths are read from, the field it read), since both are most
often a wrong option (`--root`, an images folder, `--field`), not a damaged source."""

from __future__ import annotations

import shutil
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fastdata.errors import SourceError

#: Rejected share of the input above which a conversion warns prominently.
MOSTLY_REJECTED = 0.5


def _common(reasons: Sequence[str], shown: int = 3) -> str:
    """The most frequent reasons (their first 160 characters), with counts."""
    counted = Counter(reason[:160] for reason in reasons).most_common(shown)
    return "; ".join(f"{reason} (x{count:,})" if count > 1 else reason for reason, count in counted)


def check_kept(out: Path, partial: Path, kept: int, rejected: int, reasons: Sequence[str], what: str,
               looked: str) -> str | None:
    """Raise SourceError (after removing `partial`) when nothing of `kept + rejected` `what` (e.g. "images") was
    kept; return the warning line (also warned) when more than MOSTLY_REJECTED of them were rejected, else None.
    `looked` says where the conversion looked ("under /abs/images", "in field 'body'")."""
    total = kept + rejected
    if kept == 0:
        shutil.rmtree(partial, ignore_errors=True)
        detail = f": {_common(reasons)}" if reasons else ""
        raise SourceError(f"{out}: no {what} kept: all {total:,} were rejected, looking {looked}{detail}. Nothing "
                          f"was written; check the source and its options" if total else
                          f"{out}: no {what} kept: the source lists none (looking {looked}). Nothing was written")
    if rejected > MOSTLY_REJECTED * total:
        line = (f"WARNING: {rejected:,} of {total:,} {what} ({rejected / total:.0%}) were rejected, looking "
                f"{looked}: {_common(reasons)}. Is that the right folder or field?")
        warnings.warn(f"{out}: {line}", UserWarning, stacklevel=3)
        return line
    return None
