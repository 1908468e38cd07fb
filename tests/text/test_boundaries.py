"""Packed batches that know their documents (`boundaries=True`): position_ids, cu_seqlens and max_seqlen equal a
reference built from each batch's input_ids by a plain loop, for packed blocks and best-fit rows, both formats, with
and without workers; the rest of the batch is unchanged; `mask_cross_document` drops exactly the labels at
end-of-text tokens; and FlexAttention's document mask built from the batch gives each document's own attention."""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from contracts import clone

import fastdata
from fastdata.text.blocks import IGNORE_INDEX

EOS = 0


@pytest.fixture
def data(loader_text) -> Path:
    return loader_text


def reference(input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[list, list, int]:
    """(position_ids, cu_seqlens, max_seqlen), one position at a time: a segment starts at each row's start and
    after each end-of-text token that is a token (not padding)."""
    rows, width = input_ids.shape
    positions, starts = [], []
    for r in range(rows):
        row, position = [], 0
        for j in range(width):
            if j == 0 or (int(input_ids[r, j - 1]) == EOS and (mask is None or int(mask[r, j - 1]) == 1)):
                position = 0
                starts.append(r * width + j)
            row.append(position)
            position += 1
        positions.append(row)
    bounds = [*starts, rows * width]
    return positions, bounds, max(b - a for a, b in itertools.pairwise(bounds))


@pytest.mark.parametrize(("workers", "kernel"), [(0, True), (2, True), (2, False)])
@pytest.mark.parametrize("packing", [True, "best-fit"])
def test_boundaries_match_a_reference_built_from_the_input_ids(data, packing, workers, kernel):
    """kernel=False: numpy makes the batches (where the C extension was not built), the workers find the
    segments and hand over their starts."""
    options = dict(batch_size=5, seed=1)
    plain = [clone(b) for b in fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(seq_len=24,
                                                                                              packing=packing),
                                               **options)]
    loader = fastdata.loader(data, num_workers=workers,
                             text=fastdata.TextOptions(seq_len=24, packing=packing, boundaries=True), **options)
    loader.batcher.form = dataclasses.replace(loader.batcher.form, kernel=kernel)
    batches = [clone(b) for b in loader]
    assert len(batches) == len(plain) == len(loader)
    segments = 0
    for batch, same in zip(batches, plain, strict=True):
        assert set(batch) == {*same, "position_ids", "cu_seqlens", "max_seqlen"}
        assert all(torch.equal(batch[key], same[key]) for key in same)  # the rest of the batch is unchanged
        positions, bounds, longest = reference(batch["input_ids"], batch.get("attention_mask"))
        assert batch["position_ids"].dtype == torch.int64 and batch["position_ids"].tolist() == positions
        cu = batch["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu.dim() == 1 and cu.tolist() == bounds
        assert type(batch["max_seqlen"]) is int and batch["max_seqlen"] == longest
        segments += len(bounds) - 1
    assert segments > 1.3 * sum(len(b["input_ids"]) for b in batches)  # rows do hold several documents


def test_mask_cross_document_drops_exactly_the_labels_at_end_of_text_tokens(data):
    options = dict(batch_size=5, num_workers=2, seed=1)
    plain = [clone(b) for b in fastdata.loader(data, text=fastdata.TextOptions(seq_len=24), **options)]
    masked = [clone(b) for b in fastdata.loader(data, text=fastdata.TextOptions(seq_len=24, mask_cross_document=True),
                                                **options)]
    for a, b in zip(plain, masked, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
        at_eos = a["input_ids"] == EOS
        assert b["labels"][at_eos].eq(IGNORE_INDEX).all() and not a["labels"][at_eos].eq(IGNORE_INDEX).any()
        assert torch.equal(b["labels"][~at_eos], a["labels"][~at_eos])
    assert sum(int((b["input_ids"] == EOS).sum()) for b in plain) > len(plain)


def test_boundaries_apply_to_packed_rows_only(data):
    with pytest.raises(fastdata.errors.ConfigError, match="packed rows"):
        fastdata.loader(data, num_workers=0, text=fastdata.TextOptions(packing=False, boundaries=True))


def test_a_mixture_of_packed_datasets_carries_boundaries(data):
    loader = fastdata.loader([data, data], weights=[1, 1], batch_size=4, num_workers=0,
                             text=fastdata.TextOptions(seq_len=16, boundaries=True, mask_cross_document=True))
    for batch in loader:
        positions, bounds, longest = reference(batch["input_ids"])
        assert batch["position_ids"].tolist() == positions and batch["cu_seqlens"].tolist() == bounds
        assert batch["max_seqlen"] == longest
        assert batch["labels"][batch["input_ids"] == EOS].eq(IGNORE_INDEX).all()


def test_flex_attention_document_mask_from_a_batch_keeps_each_document_to_itself(data):
    """The consumer in docs/text.md: document ids from position_ids, a FlexAttention block mask of (same document
    and causal), equal to causal attention computed separately over each segment cu_seqlens names."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch = next(iter(fastdata.loader(data, batch_size=2, num_workers=0, text=fastdata.TextOptions(seq_len=64,
                                                                                                   boundaries=True))))
    rows, width = batch["input_ids"].shape
    document = (batch["position_ids"] == 0).cumsum(-1)

    def same_document_causal(b, h, q, kv):
        return (document[b, q] == document[b, kv]) & (q >= kv)

    block_mask = create_block_mask(same_document_causal, rows, None, width, width, device="cpu")
    q, k, v = torch.randn(3, rows, 2, width, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    with warnings.catch_warnings():  # without torch.compile FlexAttention says it runs unfused: on the CPU, fine
        warnings.simplefilter("ignore")
        out = flex_attention(q, k, v, block_mask=block_mask)
    flat = lambda t: t.transpose(1, 2).reshape(rows * width, 2, 8)  # noqa: E731 ([B, H, L, D] -> [B * L, H, D])
    expected = torch.empty(rows * width, 2, 8)
    bounds = batch["cu_seqlens"].tolist()
    for a, b in itertools.pairwise(bounds):
        seg = [flat(t)[a:b].transpose(0, 1) for t in (q, k, v)]  # [H, n, D]
        expected[a:b] = torch.nn.functional.scaled_dot_product_attention(*seg, is_causal=True).transpose(0, 1)
    assert len(bounds) > rows + 1
    torch.testing.assert_close(flat(out), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [True, False])
def test_the_hand_over_is_compact(data, kernel):
    """Workers hand over int32 in shared memory: the rows of L + 1 tokens alone, as without boundaries. The main
    process finds the segments as it makes the batch (the C extension); with numpy the workers find them and
    their starts (`cu_seqlens`, a few int32) travel beside the rows."""
    from fastdata.text.dataset import TextBatches
    from fastdata.text.kernel import extension_built

    batcher = fastdata.dataset(data).packed(24).shaped(boundaries=True)
    batcher.form = dataclasses.replace(batcher.form, kernel=kernel)
    flat, layouts = TextBatches(batcher)[(0, [np.arange(5), np.arange(5, 10)])]
    assert flat.dtype == torch.int32 and flat.numel() == 2 * 5 * 25
    for shapes, cu_seqlens in layouts:
        assert shapes == [(5, 25)]
        if kernel and extension_built():
            assert cu_seqlens is None
        else:
            assert cu_seqlens.dtype == np.int32 and 5 + 1 <= len(cu_seqlens) < 5 * 24 and cu_seqlens[-1] == 5 * 24


@pytest.mark.parametrize("seq_len", [1, 2, 7])
def test_segments_from_rows_match_the_reference_at_every_edge(seq_len):
    """Rows of L + 1 made to hold end-of-text tokens everywhere (first input, last input, the label column,
    several in a row) and best-fit padding (IGNORE_INDEX at the end of a row): the bounds and positions the
    workers find and the positions the main process makes of them equal the reference built from the inputs."""
    from fastdata.text.boundaries import positions, segment_starts

    rng = np.random.default_rng(seq_len)
    for _ in range(50):
        rows = rng.choice([EOS, 5, 6, 7], size=(int(rng.integers(1, 6)), seq_len + 1), p=[0.4, 0.2, 0.2, 0.2])
        held = rng.integers(0, seq_len + 2, len(rows))
        for row, count in zip(rows, held, strict=True):
            row[count:] = IGNORE_INDEX
        cu_seqlens = segment_starts(rows.astype(np.int32), EOS)
        inputs = torch.from_numpy(rows[:, :-1].astype(np.int64))
        expected_positions, expected_bounds, longest = reference(inputs, (inputs != IGNORE_INDEX).long())
        assert cu_seqlens.dtype == np.int32 and cu_seqlens.tolist() == expected_bounds
        flat, max_seqlen = positions(cu_seqlens)
        assert flat.dtype == np.int64 and flat.reshape(inputs.shape).tolist() == expected_positions
        assert max_seqlen == longest


@pytest.mark.parametrize("seq_len", [1, 2, 7, 40])
def test_the_one_pass_kernel_makes_the_numpy_batch_exactly(seq_len):
    """The C extension's batch (every array in one pass over the rows) equals numpy's, the reference, for packed
    and best-fit rows (a padding id that is the end-of-text id too), with and without boundaries and
    cross-document masking, on rows with end-of-text tokens everywhere and padding of every length; and its
    positions and segments equal the reference built from the inputs."""
    from fastdata.text.forms import RowsForm
    from fastdata.text.kernel import extension_built

    if not extension_built():
        pytest.skip("the C extension fastdata.text._rows was not built here: numpy makes every batch")
    rng = np.random.default_rng(seq_len)
    for pad_id, boundaries, mask_cross in itertools.product([None, 3, EOS], [False, True], [False, True]):
        for _ in range(20):
            rows = rng.choice([EOS, 5, 6, 7], size=(int(rng.integers(1, 6)), seq_len + 1), p=[0.4, 0.2, 0.2, 0.2])
            if pad_id is not None:
                for row, count in zip(rows, rng.integers(0, seq_len + 2, len(rows)), strict=True):
                    row[count:] = IGNORE_INDEX
            rows = rows.astype(np.int32)
            numpy_form = RowsForm(seq_len, EOS, pad_id, boundaries, mask_cross, kernel=False)
            expected = numpy_form.batch([rows.copy()], numpy_form.fill([rows.copy()]))
            form = RowsForm(seq_len, EOS, pad_id, boundaries, mask_cross)
            assert form.fill([rows]) is None  # nothing travels beside the rows
            batch = form.batch([rows])
            assert batch.keys() == expected.keys()
            for key, value in batch.items():
                if key == "max_seqlen":
                    assert type(value) is int and value == expected[key]
                else:
                    assert value.dtype == expected[key].dtype and value.is_contiguous()
                    assert torch.equal(value, expected[key]), key
            if boundaries:
                mask = batch.get("attention_mask")
                positions, bounds, longest = reference(batch["input_ids"] if pad_id is None else
                                                       torch.from_numpy(rows[:, :-1].astype(np.int64)), mask)
                assert batch["position_ids"].tolist() == positions and batch["cu_seqlens"].tolist() == bounds
                assert batch["max_seqlen"] == longest
