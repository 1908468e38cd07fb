"""`fastdata info`: what a converted dataset holds, from its manifest."""

from __future__ import annotations

import os
from pathlib import Path

from fastdata.formats.manifest import Manifest, read_manifest, rejected_place
from fastdata.tools.gpu_kinds import gpu_kinds_line, recorded_gpu_kinds, scan_gpu_kinds


def info(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the dataset at `path` (raises NotADatasetError with the reason if it is none).

    Args:
        path: a converted dataset (LMDB or WebDataset directory).
    """
    return read_manifest(Path(path))


def describe(path: str | os.PathLike[str], max_classes: int = 20, max_files: int = 10,
             scan_gpu: bool = False) -> str:
    """A human-readable description of the dataset at `path`. `scan_gpu`: count the stored images by how the GPU's
    JPEG decoders take them from their headers when the conversion did not record it
    (`fastdata.tools.gpu_kinds`)."""
    m = info(path)
    lines = [
        f"{path}",
        f"  kind        {m.kind}",
        f"  format      {m.format} (format version {m.format_version}, written by fastdata {m.fastdata_version})",
        f"  samples     {m.num_samples:,}",
    ]
    if m.kind == "text" and m.text:
        lines += _text_lines(m)
    else:
        kind = " (multi-label: a sample counts once for each class it holds)" if m.label_kind == "multi" else ""
        lines.append(f"  classes     {len(m.classes)}{kind}")
    for name, count in list(zip(m.classes, m.class_counts, strict=True))[:max_classes]:
        lines.append(f"    {name:<24} {count:>10,}")
    if len(m.classes) > max_classes:
        lines.append(f"    ... {len(m.classes) - max_classes} more")
    stats = m.stats
    lines.append(f"  bytes       {m.data_bytes / 1e6:,.1f} MB stored"
                 + (f" (from {stats['bytes_in'] / 1e6:,.1f} MB of source files)" if "bytes_in" in stats else ""))
    options = ", ".join(f"{k}={v}" for k, v in m.options.items() if v is not None)
    lines.append(f"  options     {options}")
    if m.kind == "text":
        paths = m.source.get("path", "?")
        paths = ", ".join(paths) if isinstance(paths, list) else paths
        lines.append(f"  source      {len(m.source.get('files', []))} file(s) from {paths}")
    elif m.source.get("kind") == "coco":
        lines.append(f"  source      {m.source.get('annotations', '?')} (images under {m.source.get('root', '?')})")
    elif m.source.get("lists"):  # convert list
        lists = m.source["lists"]
        shown = ", ".join(lists[:3]) + (f", ... ({len(lists)} lists)" if len(lists) > 3 else "")
        lines.append(f"  source      {shown} (images under {m.source.get('root', '?')})")
    else:
        lines.append(f"  source      {m.source.get('path', '?')} ({m.source.get('kind', 'imagefolder')}, "
                     f"{m.source.get('ignored', 0)} non-image files ignored)")
    if m.jpeg_layout != "original":
        j = stats.get("jpeg_layout") or {}
        what = "JPEGs rewritten with restart markers" if m.jpeg_layout == "restart" else \
            "progressive JPEGs rewritten baseline"
        lines.append(f"  layout      {m.jpeg_layout}: {j.get('rewritten', 0):,} {what}, "
                     f"{sum((j.get('kept_original') or {}).values()):,} kept original, JPEG bytes "
                     f"x{j.get('size_ratio', 1.0):.3f}")
    if m.options.get("non_jpeg") == "jpeg":
        lines.append(f"  non-JPEG    stored as JPEGs (quality {m.options.get('quality', 90)}): --non-jpeg jpeg")
    if m.kind == "image":
        kinds = recorded_gpu_kinds(m)
        if kinds is None and scan_gpu:
            kinds = scan_gpu_kinds(path)
        lines.append(gpu_kinds_line(kinds, m.jpeg_layout))
    if m.metadata_fields:
        lines.append(f"  metadata    {', '.join(m.metadata_fields)} (fastdata.dataset(PATH, metadata=True))")
    if m.target_kind == "detection":
        t = m.targets or {}
        lines.append(f"  targets     {m.target_kind}: {t.get('annotations', 0):,} annotations ({t.get('crowd', 0):,} "
                     f"crowd), {'with' if t.get('masks') else 'no'} masks (fastdata.dataset(PATH) gives (image, "
                     "target dict))")
    elif m.target_kind == "segmentation":
        t = m.targets or {}
        bound = f" of --num-classes {t['num_classes']}" if t.get("num_classes") is not None else ""
        lines.append(f"  targets     segmentation: label maps ({t.get('mask_dtype', 'uint8')} masks), "
                     f"{t.get('classes_seen', 0)} class ids seen{bound}, largest {t.get('max_class_id')}, ignore "
                     f"index {t.get('ignore_index')} (fastdata.dataset(PATH) gives (image, mask))")
    lines.append(f"  rejected    {m.stats.get('rejected_records', len(m.rejected))}")
    for r in m.rejected[:10]:
        lines.append(f"    {rejected_place(r)}: {r['reason']}")
    lines.append(f"  files       {len(m.files)}")
    for f in m.files[:max_files]:
        digest = (f"sha256 {f.sha256[:16]}…" if f.sha256 else
                  f"a sha256 per record (root {str((m.record_digests or {}).get('root'))[:16]}…)")
        if f.sha256 and m.record_digests is not None:
            digest += ", a sha256 per sample"
        lines.append(f"    {f.name:<20} {f.bytes:>14,} B {f.samples:>9,} samples  {digest}")
    if len(m.files) > max_files:
        lines.append(f"    ... {len(m.files) - max_files} more")
    return "\n".join(lines)


def _text_lines(m: Manifest) -> list[str]:
    t = m.text or {}
    eos = f"{t['eos_token']} (id {t['eos_token_id']})" if t.get("eos_token") is not None else "none"
    documents = max(t.get("documents", 0), 1)
    return [
        f"  documents   {t.get('documents', 0):,}",
        f"  tokens      {t.get('total_tokens', 0):,} ({t.get('dtype')}; {t.get('total_tokens', 0) / documents:,.1f} "
        f"per document, longest {t.get('max_document_tokens', 0):,})",
        f"  tokenizer   {t.get('tokenizer')} (vocabulary {t.get('vocab_size', 0):,}, "
        f"sha256 {str(t.get('tokenizer_sha256'))[:16]}…)",
        f"  eos         {eos}",
    ]
