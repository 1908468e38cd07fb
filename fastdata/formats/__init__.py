"""All storage, both directions: what a converted dataset is on disk and how it is written and read back.

- the registry (`registry`): (kind, format) -> a writer for a conversion and a reader for a dataset; the drivers,
  datasets and loaders ask it instead of switching on format names;
- image storage: LMDB (`lmdb`, read through `mapped_pages`) and WebDataset tar shards (`wds`, over `tar_shards`),
  with what every format stores about a record (`records`), a detection target (`targets`) or a label map
  (`masks`);
- token storage: LMDB (`lmdb_text`) and WebDataset shards with an index per shard (`wds_text`), over what both
  share (`tokens`);
- the manifest (`manifest`): the JSON file written last beside the data, whose presence means the conversion
  completed; it names every file with its size and digest;
- remote shards over fsspec (`remote`) and the node's cache of verified shards (`cache`); the few system calls
  Python lacks (`libc`).

No pickle anywhere on disk: records, targets and manifests are bytes at documented offsets, PNG and JSON.
"""
