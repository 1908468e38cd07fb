"""Image-text pairs (fastdata convert pairs): captions that name their image's solid sample id, lists and
img2dataset-style shards of them, and a CLIP-like tokenizer."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .images import Tree, solid_id_of_path
from .text import UNICODE, WORDS, train_bytelevel
from .webdataset import wds_key

CAPTION_ID = re.compile(r"sample (\d+)\b")


def pair_caption(sample_id: int) -> str:
    """Solid sample `sample_id`'s caption: it names the id (`caption_id`); some are long (longer than a small
    `max_length` in tokens), some hold unicode."""
    caption = f"a photo of sample {sample_id}"
    if sample_id % 5 == 2:
        caption += " " + " ".join(WORDS[(sample_id + j) % len(WORDS)] for j in range(12))
    if sample_id % 7 == 3:
        caption += " " + UNICODE[sample_id % 2]
    return caption


def caption_id(caption: str) -> int:
    """The solid sample id a `pair_caption` names."""
    found = CAPTION_ID.search(caption)
    assert found is not None, caption
    return int(found.group(1))


def pairs_frame(tree: Tree, seed: int = 5):
    """A pandas DataFrame of the solid `tree`'s images in a shuffled order: `path` (tree-relative), `caption`
    (`pair_caption`) and a metadata column `id`."""
    import pandas as pd

    order = np.random.default_rng(seed).permutation(len(tree.images))
    rows = [{"path": tree.images[i], "caption": pair_caption(solid_id_of_path(tree.images[i])),
             "id": solid_id_of_path(tree.images[i])} for i in order]
    return pd.DataFrame(rows)


def pair_shard_sample(tree: Tree, relative: str, caption: str = "both") -> dict:
    """The solid image `relative` as img2dataset writes a sample: `.jpg`/`.png`, a `.json` ({"key", "url"}) and
    its caption: `caption="both"` a `.txt` and the .json "caption" (img2dataset's way), "txt" the `.txt` only,
    "json" the .json "caption" only."""
    sample_id = solid_id_of_path(relative)
    meta = {"key": f"{sample_id:09d}", "url": f"https://example.com/{sample_id}.jpg"}
    sample = {"__key__": wds_key(sample_id), relative.rsplit(".", 1)[1]: tree.path(relative).read_bytes()}
    if caption in ("both", "json"):
        meta["caption"] = pair_caption(sample_id)
    if caption in ("both", "txt"):
        sample["txt"] = pair_caption(sample_id)
    sample["json"] = meta
    return sample


def clip_like_tokenizer(path: Path, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer.json whose post-processor wraps every text in `<|startoftext|>` ...
    `<|endoftext|>`, as CLIP's does (no padding token: padding falls back to the end-of-text token)."""
    from tokenizers import Tokenizer, processors

    train_bytelevel(path, texts, vocab=500, specials=("<|startoftext|>", "<|endoftext|>"))
    tok = Tokenizer.from_file(str(path))
    start, end = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", start), ("<|endoftext|>", end)])
    tok.save(str(path))
    return path


def reference_rows(tokenizer_file: Path, captions: list[str], max_length: int) -> tuple[list, list]:
    """(input_ids, attention_mask) of `captions` as the `tokenizers` library itself truncates and pads them to
    `max_length` (padding with the end-of-text token)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.enable_truncation(max_length)
    tok.enable_padding(length=max_length, pad_id=tok.token_to_id("<|endoftext|>"), pad_token="<|endoftext|>")
    encodings = tok.encode_batch(captions)
    return [e.ids for e in encodings], [e.attention_mask for e in encodings]
