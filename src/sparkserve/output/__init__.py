"""What every tool writes the same way: `atomic_file` (a file replaced whole, never left
half-written) and `plots` (series as a plot draws them)."""
