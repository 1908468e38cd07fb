"""The source files several converters read, each read one way for all of them (what a sample's label or caption is
stays with each converter):

    file_lists.py   list files (.csv, .tsv, .jsonl, .parquet) of image paths, read as tables
    tar_samples.py  existing WebDataset tar shards: their samples indexed, an image read by its offset
    tables.py       rows of Arrow or Parquet files (Hugging Face datasets): a row's image bytes read by key
    metadata.py     what a sample's metadata may hold, the same for every source kind
"""
