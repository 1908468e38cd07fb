"""Test data and the small helpers several test files use, one module per kind of data (fixtures live in
conftest.py; resumability checks in contracts.py). Every builder makes tiny data whose content encodes the sample
index. Import each name from its module: this package re-exports nothing.

    images.py        pictures whose pixels encode the sample id; the ImageFolder trees (tricky, solid, photo-like,
                     sampling, large, non-UTF-8, bad)
    sources.py       sources whose samples are not files (a zip archive), multi-labels and metadata
    lists.py         file lists (fastdata convert list), written with pandas
    webdataset.py    WebDataset shards as other tools write them
    damaged.py       damaged copies of a conversion
    text.py          text corpora and tokenizers
    runs.py          programs run in a child process, seeded loaders, the command line
    trace.py         the meter's trace files, checked against the Trace Event Format
    hf.py            Hugging Face datasets, built with the `datasets` library
    pairs.py         image-text pairs: captions naming their image's sample id
    coco.py          COCO instances files and the rectangles source of detection loading
    segmentation.py  segmentation lists: images with PNG label maps
    many.py          many-sample datasets written straight through the storage writers
"""
