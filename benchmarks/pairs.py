"""Image-text pairs (issue 18): img2dataset-style shards loaded by a `webdataset` library pipeline against
`fastdata.loader` over the same shards converted with `fastdata convert pairs`, in one run.

From the benchmarks' sample photos (`--images`, JPEG, 20 classes) it builds, once, under --data:
  - img2dataset-style shards written by webdataset's ShardWriter (`{key}.jpg`, `{key}.txt` caption naming the
    photo's class and number, `{key}.json` with the caption, url and key), `--shard-samples` a shard;
  - a CLIP-like byte-level BPE tokenizer.json trained on the captions (its post-processor wraps a caption in
    `<|startoftext|>` ... `<|endoftext|>`, as CLIP's does);
  - `fastdata.convert_pairs(shards, ...)` with that tokenizer, to LMDB and to WebDataset shards (untimed; the
    conversion time is printed).
Then loading, every loader giving `(images uint8 [B, 3, 224, 224], input_ids int64 [B, 77])` per batch:
  (a) the `webdataset` library as its docs show: `WebDataset(shards, shardshuffle=True, nodesplitter=...)
      .shuffle(1000).decode("pil").to_tuple("jpg", "txt").map_tuple(transform, tokenize).batched(B)` in a
      `WebLoader`, `transform` the torchvision transform equal to fastdata's preset (as `fastdata bench`'s
      baseline), `tokenize` the tokenizer with truncation and padding to 77 (the baseline);
  (b) `fastdata.loader` over the LMDB conversion, (c) over the WebDataset conversion
  (`text=TextOptions(max_length=77)`).
Target (issue 18): fastdata at least 2x the webdataset pipeline, as the median of the per-run ratios; every
loader is treated alike (benchmarks/README.md, "Fair by construction"). A quiet machine, and:

    python -m benchmarks.pairs --images 3000 --repeats 3      # smoke: python -m benchmarks run pairs --smoke
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import fastdata
from benchmarks.common import arguments, cached_sample_imagefolder, convert_once, loading_race
from fastdata.formats.manifest import read_manifest
from fastdata.tools.bench import BenchConfig, Contender, LoaderResult
from fastdata.tools.bench_baseline import torchvision_transform
from fastdata.tools.bench_fair import dataset_files

TARGET = 2.0  # issue 18: fastdata at least 2x the webdataset pipeline
MAX_LENGTH = 77  # CLIP's context length
SPECIALS = ("<|startoftext|>", "<|endoftext|>")

# ---------------------------------------------------------------------------------------------- the source


def photos(src: Path) -> list[tuple[Path, str]]:
    """(photo, its class name) of the sample ImageFolder, in ImageFolder's order."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    classes, class_to_idx = find_classes(str(src))
    return [(Path(path), classes[label]) for path, label in make_dataset(str(src), class_to_idx, IMG_EXTENSIONS)]


def caption_of(number: int, name: str) -> str:
    return f"a photo of a {name.replace('_', ' ')}, picture number {number} of the sample set"


def write_shards(src: Path, out: Path, per_shard: int) -> list[Path]:
    """img2dataset-style shards of the photos (webdataset's ShardWriter), written once."""
    import webdataset as wds

    found = sorted(out.glob("*.tar"))
    if found:
        return found
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for number, (photo, name) in enumerate(photos(src)):
            caption = caption_of(number, name)
            sink.write({"__key__": f"{number:09d}", "jpg": photo.read_bytes(), "txt": caption,
                        "json": {"key": f"{number:09d}", "url": f"https://example.com/{number}.jpg",
                                 "caption": caption}})
    return sorted(out.glob("*.tar"))


def clip_like_tokenizer(path: Path, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer.json trained on `texts`, wrapping each in <|startoftext|> ... <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if path.is_file():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2000, special_tokens=list(SPECIALS),
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    start, end = (tok.token_to_id(s) for s in SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<|startoftext|> $A <|endoftext|>",
                                                       special_tokens=[(SPECIALS[0], start), (SPECIALS[1], end)])
    tok.save(str(path))
    return path


# ---------------------------------------------------------------------------------------------- loaders


class Pairs:
    """A loader's batches as `(images, input_ids)`: what every contender yields, and what the bench loop takes."""

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for batch in self.loader:
            yield (batch["images"], batch["input_ids"]) if isinstance(batch, dict) else batch


def webdataset_contender(shards: list[Path], tokenizer_file: Path, config: BenchConfig, count: int) -> Contender:
    """The `webdataset` library's pipeline over the shards, as its docs show (see the module docstring)."""
    import torch
    import webdataset as wds
    from tokenizers import Tokenizer

    transform = torchvision_transform(config)
    settings = config.settings
    workers = max(1, settings.num_workers)
    per_worker = -(-count // (config.batch_size * workers))  # batches a worker yields per epoch

    def tokenize(caption: str) -> torch.Tensor:
        tok = tokenizer()
        return torch.tensor(tok.encode(caption).ids, dtype=torch.int64)

    def tokenizer() -> Any:
        global _TOKENIZER
        if _TOKENIZER is None:
            _TOKENIZER = Tokenizer.from_file(str(tokenizer_file))
            pad = _TOKENIZER.token_to_id(SPECIALS[1])
            _TOKENIZER.enable_truncation(MAX_LENGTH)
            _TOKENIZER.enable_padding(length=MAX_LENGTH, pad_id=pad, pad_token=SPECIALS[1])
        return _TOKENIZER

    def make() -> Iterable:
        dataset = (wds.WebDataset([str(s) for s in shards], shardshuffle=len(shards), nodesplitter=wds.split_by_node,
                                  workersplitter=wds.split_by_worker, empty_check=False)
                   .shuffle(1000).decode("pil").to_tuple("jpg", "txt").map_tuple(transform, tokenize)
                   .batched(config.batch_size, partial=True))
        loader = wds.WebLoader(dataset, batch_size=None, **settings.dataloader_kwargs())
        return loader.with_epoch(per_worker * workers)

    size = sum(s.stat().st_size for s in shards)
    return Contender(LoaderResult("webdataset library pipeline", role="baseline"), make, size / count, shards)


_TOKENIZER: Any = None  # the baseline's tokenizer, made once per worker process


def fastdata_contender(path: Path, config: BenchConfig, name: str) -> Contender:
    manifest = read_manifest(path)
    settings = config.settings

    def make() -> Iterable:
        return Pairs(fastdata.loader(path, batch_size=config.batch_size, augment=config.augment,
                                     image_size=config.image_size,
                                     text=fastdata.TextOptions(max_length=MAX_LENGTH),
                                     **settings.loader_kwargs()))

    return Contender(LoaderResult(name), make, manifest.data_bytes / max(1, manifest.num_samples),
                     dataset_files(path))


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = arguments(__doc__, images=3000, epochs=2, batch_size=256, workers=None, augment="train")
    parser.add_argument("--shard-samples", type=int, default=None,
                        help="Samples per source shard. Default: 4 shards per worker, so that webdataset's split by "
                             "worker keeps every worker busy.")
    args = parser.parse_args()

    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment=args.augment, workers=args.workers,
                         repeats=args.repeats)
    per_shard = args.shard_samples or max(1, -(-args.images // (4 * max(1, config.num_workers))))
    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    here = args.data / f"pairs-{args.images}-{per_shard}"
    shards = write_shards(src, here / "img2dataset", per_shard)
    captions = [caption_of(n, name) for n, (_, name) in enumerate(photos(src))]
    tokenizer = clip_like_tokenizer(here / "tokenizer.json", captions)
    outputs = {"lmdb": here / "pairs.lmdb", "wds": here / "pairs-wds"}
    convert_once(outputs, lambda fmt, out: fastdata.convert_pairs(shards[0].parent, out, fastdata.PairsOptions(
        tokenizer=tokenizer, format=fmt, workers=args.workers, progress=False)))
    for out in outputs.values():
        pairs = json.loads((out / "manifest.json").read_text())["pairs"]
        print(f"  {out.name}: {pairs['captions']:,} pairs, token dtype {pairs['dtype']}, longest caption "
              f"{pairs['max_caption_tokens']} tokens")

    print(f"\n{len(shards)} source shards of up to {per_shard} pairs; DataLoader settings for every loader "
          f"(fastdata.loader given the same): {config.settings}")
    contenders = [
        webdataset_contender(shards, tokenizer, config, len(captions)),
        fastdata_contender(outputs["lmdb"], config, "fastdata.loader, pairs -> LMDB"),
        fastdata_contender(outputs["wds"], config, "fastdata.loader, pairs -> WebDataset"),
    ]
    loading_race(f"loading pairs, augment={config.augment}: {config.warmup_passes} untimed + {config.epochs} timed "
                 f"passes per run, batch {config.batch_size}, image size {config.image_size}, {config.num_workers} "
                 f"workers, {config.repeats} alternating runs, input_ids [B, {MAX_LENGTH}]", contenders, config,
                 f"{len(captions):,} pairs", TARGET, unit="pairs/s")


if __name__ == "__main__":
    main()
