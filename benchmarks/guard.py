"""No measured figure in the documents but one the harness recorded: a number with a unit of measurement (x, %,
ms, s, MB, GiB, images/s, tokens/s, cores, ...) written in README.md, docs/ or benchmarks/README.md outside a
marker of `tables.py` is a figure nobody can trace to a run, and `unguarded()` names it.

What is read: the prose (tables included) and the code blocks that show output (no language, `text`, `console`),
less what `python -m benchmarks tables` writes (the markers), inline code (`--step 120ms` is an argument), link
targets, and the output blocks said to be samples: `<!-- sample -->` on the line before the block, with the text
above it saying "sample" or "example". A figure after an inequality (`<= 12%`, `>= 2x`, `< 50 us`) is a bound or a
target, not a measurement, and passes. What else is not a measurement (a default, a size, a limit, a setting of a
benchmark, a count in an example) is listed in ALLOWED, phrase by phrase, each with why.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.tables import MARKER, ROOT

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_BOUND = r"(?<![<>≤≥=] )(?<![<>≤≥=])"  # "<= 12%", ">= 2x", "< 50 us": a bound or a target, not a measurement
MEASURED = re.compile(
    rf"{_BOUND}(?<![\w.]){_NUMBER}(?:"
    r"\s?[x×](?![\w×]|\s*\d)"                     # 2.73x, 1.22 × (not 500x375, not 10 x 40)
    r"|\s?%"                                       # 26%
    r"|\s?(?:ms|us|µs|ns|s|seconds?|minutes?|hours?)\b"  # 0.65 ms, 24 s
    r"|\s?(?:[kKMGT]i?B|kB)(?:/s)?\b"              # 68 KB, 1.3 MB/s, 23.5 GiB
    r"|(?:\s?[kKM])?\s?(?:img|images|pairs|samples|documents|tokens|steps|batches)/s\b"  # 2,402 images/s
    r"|[\s-](?:host\s)?cores?\b"                   # 4.3 host cores, a 2-core machine
    r"|\s(?:grey|gray) levels?\b"                  # 3 grey levels
    r")"
    rf"|{_BOUND}(?<![\w])[x×]{_NUMBER}")           # x1.39
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_FENCE = re.compile(r"^( {0,3})(```|~~~)([^\n]*)\n(.*?)^ {0,3}\2[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
_SAMPLE = re.compile(r"<!-- sample -->[ \t]*\n\s*$")
_SAYS_SAMPLE = re.compile(r"\b(samples?|examples?)\b", re.IGNORECASE)
OUTPUT_LANGUAGES = ("", "text", "console", "output")

#: documents written from the code by another generator, with a test of their own: their figures are the commands'
#: defaults and examples, not measurements
GENERATED_ELSEWHERE = {"docs/reference/cli.md": "the commands' help, written by docs/hooks/cli_reference.py",
                       "docs/reference/conversion-options.md": "the converters' option fields and their help, written "
                                                               "by docs/hooks/cli_reference.py"}

#: document (relative to the repository) -> phrase -> why its number is not a measurement. A number inside one
#: of these phrases passes; a phrase no longer in its document fails the test (keep the list true).
ALLOWED: dict[str, dict[str, str]] = {
    "benchmarks/README.md": {
        "an axis shrunk 2x or more": "the resize's rule (halve an axis first when shrinking by 2 or more)",
        "with 2% corrupt records": "hardening.py's setting: the share of records it corrupts",
        "add up to what one 600 s device call allows": "the device machine's limit per call (a setting)",
        "the test's bound on heap growth is 5%": "the bound tests/ hold the loader to, not a measurement",
    },
    "docs/benchmarks.md": {
        "up to 512 MB of them": "fastdata bench's cap on the batches it holds for the synthetic upper bound",
        "10% or more in any timed run": "the share of other processes' CPU from which bench says so (a threshold)",
    },
    "docs/index.md": {
        "10% or more, from": "the share of other processes' CPU from which demo says so (a threshold)",
    },
    "docs/distributed.md": {
        "data wait 41% vs median 3%": "an example of the straggler line's wording, not a measurement",
    },
    "docs/gpu.md": {
        "switch interval to 0.5 ms": "the GIL switch interval fastdata's workers set (a setting of the code)",
        "against a target of 1 ms per batch of 256": "issue 43's target for the batched resize, not a measurement",
        "at 1.15x one decoder or more": "the threshold from which gpu_check says a second decoder pays",
        "add up to 540 s with the set-up": "the registry's time caps of the device suite (settings)",
        "fits one 600 s device call": "the device machine's limit per call (a setting of the lending tool)",
        "GPU time against 1 ms": "issue 43's target for the batched resize",
        "reaches 85% of its decoder's": "issue 43's target for the loader alone",
        "reaches 90% of its ceiling and ResNet-50 95%": "issue 43's targets for the training feed",
        "within 5% of the best explicit": "issue 43's target for the defaults",
    },
    "docs/guarantees.md": {
        "= 2,048 images or 16 MiB of records": "the LMDB writer's commit interval (a default)",
        "default 4MB": "--checkpoint-every's default",
        "with 2% corrupt records": "hardening.py's setting: the share of records it corrupts",
        "grows less than 5% from the first": "the bound the test holds a worker's heap to",
    },
    "docs/images.md": {
        "about 30 ms of work": "the chunk size the conversion aims for (a setting of the driver)",
        "close to 100% means": "how to read the summary's figure, not a measurement",
        "median difference at most 1 grey level": "the bound tests/image/test_presets_vs_torchvision.py holds",
        "a bare number below 1 MiB": "the rule --shard-size applies to a number without a unit",
    },
    "docs/meter.md": {
        "a loop of 10 ms steps": "meter_overhead.py's setting: the step it times the meter against",
        "from 30% data wait": "the verdict's threshold (INPUT_BOUND_AT, fastdata/meter/report.py)",
        "under 10%, in between": "the verdict's threshold",
        "Under 10% wait on a saturated CPU (85% busy or more)": "the cpu-contended verdict's thresholds",
        "64 MB in a default container": "Docker's default /dev/shm size, a fact of the platform",
    },
    "docs/text.md": {
        "default 1MB": "--batch-size's default",
        "default 4MB": "--checkpoint-every's default",
        "about 2 MB": "the size of a worker's shared-memory transfer (a setting of the text loader)",
    },
    "docs/trace.md": {
        "default 1 s": "the sampler's default interval",
        "about 60 MB": "the size the cap of 500,000 events allows a trace file (a bound, not a measurement)",
    },
    "docs/tune.md": {
        "data wait under 5%": "the tuner's stopping rule (WAIT_FLOOR, fastdata/tools/tune.py)",
        "falls by more than 10%": "the tuner's stopping rule",
        "within 3% of the fastest": "the tuner's choice rule (TOLERANCE, fastdata/tools/tune.py)",
        "default 60 s": "the default of --budget",
        "the host waits 120 ms": "an example of a --step value",
    },
}


def _blank(text: str, start: int, end: int) -> str:
    """`text` with [start, end) replaced by spaces, its newlines kept (line numbers stay right)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def samples_said(text: str, fence_start: int) -> bool:
    """Whether the code block at `fence_start` is marked a sample (`<!-- sample -->` on the line before it) and
    the text above says so in words."""
    before = text[:fence_start]
    marked = _SAMPLE.search(before)
    return bool(marked) and bool(_SAYS_SAMPLE.search(before[max(0, marked.start() - 400):marked.start()]))


def readable(text: str) -> str:
    """`text` as the guard reads it: what is generated, commented, code, a sample or a link target blanked out."""
    fences = [(m.start(), m.start(4), m.end(4), m.end(), m.group(3).strip().lower(), samples_said(text, m.start()))
              for m in _FENCE.finditer(text)]
    for pattern in (MARKER, _COMMENT):
        for match in reversed(list(pattern.finditer(text))):
            text = _blank(text, match.start(), match.end())
    for start, body, body_end, end, language, sample in reversed(fences):
        if language in OUTPUT_LANGUAGES and not sample:  # output: read it, less its fence lines
            text = _blank(_blank(text, body_end, end), start, body)
        else:
            text = _blank(text, start, end)
    for pattern in (_CODE, _LINK_TARGET):
        for match in reversed(list(pattern.finditer(text))):
            text = _blank(text, match.start(), match.end())
    return text


def _phrase(phrase: str) -> re.Pattern:
    return re.compile(r"\s+".join(re.escape(word) for word in phrase.split()))


def unguarded(path: Path) -> list[tuple[int, str]]:
    """(line, the figure in its words) of every measured-looking figure of `path` outside a marker and not in
    an allowed phrase."""
    if _name(path) in GENERATED_ELSEWHERE:
        return []
    text = readable(path.read_text(encoding="utf-8"))
    allowed = [(m.start(), m.end()) for phrase in ALLOWED.get(_name(path), {})
               for m in _phrase(phrase).finditer(text)]
    found = []
    for match in MEASURED.finditer(text):
        if any(a <= match.start() and match.end() <= b for a, b in allowed):
            continue
        line = text.count("\n", 0, match.start()) + 1
        context = text[max(0, match.start() - 40):match.end() + 20].split("\n")
        found.append((line, " ".join(" ".join(context).split())))
    return found


def unused_allowances(documents: tuple[Path, ...]) -> list[str]:
    """Phrases of ALLOWED that their document no longer has (or whose document is not read)."""
    texts = {_name(p): readable(p.read_text(encoding="utf-8")) for p in documents}
    return [f"{name}: {phrase!r}" for name, phrases in ALLOWED.items() for phrase in phrases
            if name not in texts or not _phrase(phrase).search(texts[name])]


def _name(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else path.name


HOW_TO_ADD = """A measured figure is written in these documents only from a results file, so that it names its run and a
hand edit fails `python -m benchmarks tables --check`. To add one:
  1. the benchmark prints it as a table cell (`report.table(...)` in its runner in benchmarks/; a new runner is
     registered in benchmarks/registry.py);
  2. the harness records it: `python -m benchmarks run SUITE --json benchmarks/results/SUITE.json` (a quiet
     machine; never a --smoke run);
  3. the document names the cell, and its run's caption in the same section:
       <!-- fig: SUITE.json BENCHMARK TABLE ROW COLUMN --><!-- /fig -->   (TABLE: index or part of its title;
       ROW: index or first-cell text; COLUMN: index or name; "quote" text with spaces; a ratio of two cells:
       ... ROW COLUMN / ROW COLUMN)
       <!-- measured: SUITE.json BENCHMARK --><!-- /measured -->   (or a whole table: <!-- results: SUITE.json
       BENCHMARK TABLE --> + <!-- /results -->);
  4. `python -m benchmarks tables` writes them.
A sample of a command's output: generate it (<!-- output: ... -->) or put <!-- sample --> on the line before the
code block and say "sample" in the text above it. Not a measurement at all (a default, a size, a limit, a
benchmark's setting, a count in an example)? Add the phrase to ALLOWED in benchmarks/guard.py, with why."""
