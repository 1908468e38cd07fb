"""Where a conversion's per-sample work runs, and how its results come back:

    pool.py       the local engine: forked worker processes sent chunks sized from the measured cost
    messages.py   what the parent and its workers send each other (large byte strings in shared memory)
    assembly.py   WebDataset shards written, flushed and hashed by processes of their own
    ray.py        the Ray engine (`--engine ray`)
"""
