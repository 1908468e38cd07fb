"""Captions as the read side hands them over, for image-text pair datasets (`target_kind: "pairs"`): the caption
text of each sample, and when the dataset stores token ids (converted with a tokenizer) int64 `input_ids` and
`attention_mask` rows of `max_length` tokens. `CaptionCodec` takes the place of `LabelCodec` in the sample pipeline
(the same methods: read a sample's target from storage, batch the targets of the samples a batch kept), so that a
caption travels with its image through every path of the loader: a skipped image drops its caption, a borrowed
sample brings its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import Manifest

#: Tokens per row when `max_length` is not given: CLIP's context length.
DEFAULT_MAX_LENGTH = 77


@dataclass(frozen=True)
class Caption:
    """One sample's caption: its text and, when the dataset stores them, its token ids (whole, as converted)."""

    text: str
    ids: np.ndarray | None = None


@dataclass
class CaptionBatch:
    """The captions of a batch, in the batch's order: `texts`, and with stored tokens int64 `input_ids` and
    `attention_mask` `[B, max_length]` (1 over the caption's tokens, 0 over the padding)."""

    texts: list[str]
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, rows: list[int]) -> CaptionBatch:
        """The captions of `rows` (as a tensor of labels indexed by a list of rows: the samples a batch keeps)."""
        texts = [self.texts[row] for row in rows]
        if self.input_ids is None or self.attention_mask is None:
            return CaptionBatch(texts)
        return CaptionBatch(texts, self.input_ids[rows], self.attention_mask[rows])

    def pin_memory(self) -> CaptionBatch:
        if self.input_ids is None or self.attention_mask is None:
            return self
        return replace(self, input_ids=self.input_ids.pin_memory(), attention_mask=self.attention_mask.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> CaptionBatch:
        if self.input_ids is None or self.attention_mask is None:
            return self
        return replace(self, input_ids=self.input_ids.to(device, non_blocking=non_blocking),
                       attention_mask=self.attention_mask.to(device, non_blocking=non_blocking))

    def as_dict(self) -> dict[str, Any]:
        """`{"captions": [...]}`, with `"input_ids"` and `"attention_mask"` when the dataset stores tokens."""
        out: dict[str, Any] = {}
        if self.input_ids is not None:
            out["input_ids"], out["attention_mask"] = self.input_ids, self.attention_mask
        out["captions"] = self.texts
        return out


@dataclass(frozen=True)
class CaptionCodec:
    """How a pair dataset's captions become a batch: texts, and with stored tokens rows of `max_length` ids,
    truncated keeping the tokenizer's `closing` trailing special tokens (CLIP's end-of-text, on which it pools, as a
    `tokenizers` Tokenizer with truncation does) and padded with `pad_id`."""

    tokens: bool = False  # the dataset stores token ids
    dtype: str = "uint16"
    max_length: int = DEFAULT_MAX_LENGTH
    pad_id: int = 0
    closing: int = 0  # trailing special tokens the tokenizer's post-processor appends, kept on truncation

    @classmethod
    def of(cls, manifest: Manifest, where: str, max_length: int | None = None) -> CaptionCodec:
        pairs = manifest.pairs or {}
        tokens = bool(pairs.get("tokens"))
        if max_length is not None:
            if not tokens:
                raise ConfigError(f"{where}: max_length applies to pairs stored with token ids; this dataset was "
                                  "converted without --tokenizer, so it gives caption texts (convert it again with "
                                  "--tokenizer tokenizer.json for input_ids)")
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
                raise ConfigError(f"max_length must be a positive int, got {max_length!r}")
        if not tokens:
            return cls()
        try:
            codec = cls(True, str(np.dtype(pairs["dtype"])), max_length or DEFAULT_MAX_LENGTH,
                        int(pairs["pad_token_id"]), int(pairs.get("closing_tokens", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise NotADatasetError(f"{where}: the manifest's pairs section is incomplete ({exc!r}); the dataset is "
                                   "damaged") from exc
        if codec.closing >= codec.max_length:
            raise ConfigError(f"max_length={codec.max_length} leaves no room for a caption beside the tokenizer's "
                              f"{codec.closing} closing special token(s)")
        return codec

    def describe(self) -> dict[str, Any]:
        """What a loader state must match to resume (the rows' length)."""
        return {"tokens": self.tokens, "max_length": self.max_length if self.tokens else None}

    spatial: ClassVar[bool] = False
    whole_images_as_lists: ClassVar[bool] = False

    @staticmethod
    def deliver(batch: tuple) -> dict[str, Any]:
        """A batch as the loader gives it: `{"images", "captions"}`, with stored token ids `{"images",
        "input_ids", "attention_mask", "captions"}` (int64 `[B, max_length]`), and `"metadata"` when asked."""
        images, captions, *metadata = batch
        return {"images": images, **captions.as_dict(), **({"metadata": metadata[0]} if metadata else {})}

    def read(self, reader: Any, index: int) -> Caption:
        """Sample `index`'s caption from an LMDB reader."""
        ids = reader.caption_tokens(index, np.dtype(self.dtype)) if self.tokens else None
        return Caption(reader.caption(index), ids)

    def from_json(self, meta: dict) -> Caption:
        """A sample's caption from its WebDataset `.json`; KeyError, TypeError or ValueError when it is not there or
        not of the right type (the caller names the sample)."""
        text = meta["caption"]
        if not isinstance(text, str):
            raise TypeError(f"caption {text!r} is not text")
        ids = None
        if self.tokens:
            ids = np.asarray(meta["tokens"], dtype=np.int64)
            if ids.ndim != 1:
                raise ValueError(f"tokens {meta['tokens']!r} are not a list of ids")
        return Caption(text, ids)

    def rows(self, captions: Sequence[Caption]) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 `input_ids` and `attention_mask` `[len(captions), max_length]`."""
        length = self.max_length
        ids = torch.full((len(captions), length), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(captions), length), dtype=torch.int64)
        for row, caption in enumerate(captions):
            tokens = caption.ids
            assert tokens is not None
            if len(tokens) > length:  # keep the head and the closing special tokens
                head = length - self.closing
                tokens = np.concatenate([tokens[:head], tokens[len(tokens) - self.closing:]])
            ids[row, : len(tokens)] = torch.from_numpy(tokens.astype(np.int64))
            mask[row, : len(tokens)] = 1
        return ids, mask

    def batch(self, captions: Sequence[Caption]) -> CaptionBatch:
        texts = [caption.text for caption in captions]
        if not self.tokens:
            return CaptionBatch(texts)
        return CaptionBatch(texts, *self.rows(captions))

    def one(self, caption: Caption) -> str | dict[str, Any]:
        """One sample's caption: its text, or with stored tokens `{"caption", "input_ids", "attention_mask"}`
        (int64 `[max_length]` each)."""
        if not self.tokens:
            return caption.text
        ids, mask = self.rows([caption])
        return {"caption": caption.text, "input_ids": ids[0], "attention_mask": mask[0]}
