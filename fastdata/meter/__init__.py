"""The throughput meter: loop, report, stages, system and GPU figures (imports nothing of the read side)."""
