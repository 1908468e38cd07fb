"""Pure order and position: epoch permutations, rank splits, stream plans, batch samplers, loader state."""
