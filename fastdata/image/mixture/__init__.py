"""Mixtures of image datasets read by index, as one dataset and one loader (`loader([a, b], weights=...)`).

    indexed_shards.py  local WebDataset shards read by index (each sample from its tar header's position), and the
                       key reader every dataset made of parts (shards, sources) gives the loader
    mixed.py           MixedImageDataset (the sources one after the other, one label space) and MixedImageLoader
"""
