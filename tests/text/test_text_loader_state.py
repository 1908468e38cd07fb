"""The text loaders keep the resume contract (contracts.py) over LMDB and WebDataset, packed, best-fit (with
document boundaries) or padded and bucketed, with 0 or 2 workers, from a training loop's checkpoints; and the ranks
split every epoch evenly."""

from __future__ import annotations

import pytest
from builders.runs import seeded_loader
from builders.text import make_corpus, train_bytelevel, write_jsonl
from contracts import check_checkpoint_loop, check_resumes, clone, same
from fastdata.converters.text import convert_text

from fastdata.errors import ResumeError
from fastdata.options import TextConversionOptions, TextOptions


@pytest.fixture(scope="module", params=["lmdb", "wds"])
def text_data(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"state_{request.param}")
    corpus = make_corpus(60, seed=5)
    tokenizer = train_bytelevel(root / "bpe.json", corpus)
    out = root / ("d.lmdb" if request.param == "lmdb" else "d")
    convert_text(write_jsonl(root / "c.jsonl", corpus), out,
                 TextConversionOptions(format=request.param, shard_size="2KB", progress=False), tokenizer=tokenizer)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["packed", "packed-unshuffled", "bucketed", "best-fit"])
def test_text_resume_grid(text_data, mode, workers):
    options = {"text": TextOptions(seq_len=16), "shuffle": mode != "packed-unshuffled"} if mode.startswith("packed") \
        else {"text": TextOptions(packing=False, max_length=24, bucketing=True)} if mode == "bucketed" else \
        {"text": TextOptions(packing="best-fit", seq_len=16, boundaries=True)}
    check_resumes(lambda w: seeded_loader(text_data, num_workers=w, batch_size=4, augment=None, **options),
                  lambda n: [0, 1, n // 2, n], workers)


@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("packing", [True, "best-fit"])
def test_text_checkpoint_loop_sees_exactly_the_uninterrupted_run(text_data, workers, packing):
    check_checkpoint_loop(lambda w: seeded_loader(text_data, batch_size=4, augment=None, num_workers=w,
                                                  text=TextOptions(seq_len=16, packing=packing)), workers)


def test_best_fit_epochs_have_their_own_length_and_resume_into_it(text_data):
    """Each epoch's rows are planned anew, so an epoch's number of batches is its own: `len()` is that of the epoch
    under way (else the next one), and a state restored mid-epoch continues that epoch's plan to its end."""
    def make():
        return seeded_loader(text_data, batch_size=2, augment=None, text=TextOptions(seq_len=16,
                                                                                              packing="best-fit"))

    loader = make()
    lengths = []
    for _ in range(4):
        expected = len(loader)
        lengths.append(sum(1 for _ in loader))
        assert lengths[-1] == expected
    loader = make()
    loader.set_epoch(2)
    taken = [clone(b) for _, b in zip(range(3), loader, strict=False)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == lengths[2]
    rest = [clone(b) for b in resumed]
    reference = make()
    reference.set_epoch(2)
    assert same(taken + rest, [clone(b) for b in reference])


def test_best_fit_state_is_refused_by_a_packed_loader(text_data):
    state = seeded_loader(text_data, batch_size=4, augment=None, text=TextOptions(seq_len=16,
                                                                                           packing="best-fit")).state_dict()
    with pytest.raises(ResumeError, match="packing='best-fit' in the state, True here"):
        seeded_loader(text_data, batch_size=4, augment=None,
                      text=TextOptions(seq_len=16)).load_state_dict(state)


@pytest.mark.parametrize("mode", ["packed", "bucketing", "best-fit"])
def test_text_ranks_split_every_epoch_evenly(text_data, mode):
    """Text: each of 3 ranks gets its own part of the epoch, the same number of batches, together every block
    (or document, or best-fit row) once plus the documented padding; order the same for any number of workers."""
    text = TextOptions(packing=False, max_length=24, bucketing=True) if mode == "bucketing" else \
        TextOptions(seq_len=16, packing="best-fit") if mode == "best-fit" else TextOptions(seq_len=16)
    options = {"text": text}

    def rows_of(batches):  # padded rows trimmed to their real tokens (padding width depends on the batch)
        return [tuple(row[:int(mask.sum())].tolist()) if mode == "bucketing" else tuple(row.tolist())
                for b in batches for row, mask in zip(b["input_ids"], b.get("attention_mask", b["input_ids"]),
                                                      strict=True)]

    rows = []
    counts = set()
    for rank in range(3):
        loader = seeded_loader(text_data, batch_size=4, augment=None, rank=rank, world_size=3, **options)
        batches = [clone(b) for b in loader]
        counts.add((len(batches), len(loader)))
        assert same(batches, [clone(b) for b in seeded_loader(text_data, batch_size=4, augment=None, rank=rank,
                                                               world_size=3, num_workers=2, **options)])
        rows += rows_of(batches)
    assert len(counts) == 1 and len({n for n, _ in counts} | {n for _, n in counts}) == 1
    single = rows_of(seeded_loader(text_data, batch_size=4, augment=None, **options))
    assert set(rows) == set(single) and len(rows) - len(single) < 3
