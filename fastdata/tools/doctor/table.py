"""The doctor's table: one row per check (PASS / INFO / WARN / FAIL, what was found, the fix), and the exit code.

INFO is a fact worth knowing that asks nothing of the user (e.g. no pinned memory on a machine without a GPU);
WARN asks for a look; only FAIL makes the exit code 1."""

from __future__ import annotations

from dataclasses import dataclass

PASS, INFO, WARN, FAIL = "PASS", "INFO", "WARN", "FAIL"
GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    name: str
    status: str  # PASS, INFO, WARN or FAIL
    detail: str
    fix: str = ""


def exit_code(checks: list[Check]) -> int:
    """1 when any check FAILs, else 0."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def format_checks(checks: list[Check]) -> str:
    """The table: status, check, what was found, and under it the fix for each WARN / FAIL."""
    width = max([len(c.name) for c in checks] + [5])
    lines = [f"{'status':<6}  {'check':<{width}}  detail", f"{'-' * 6}  {'-' * width}  {'-' * 40}"]
    for c in checks:
        lines.append(f"{c.status:<6}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            lines.append(f"{'':<6}  {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, INFO, WARN, FAIL)}
    lines.append(f"\n{counts[PASS]} PASS, {counts[INFO]} INFO, {counts[WARN]} WARN, {counts[FAIL]} FAIL")
    return "\n".join(lines)
