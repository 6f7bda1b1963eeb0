"""Two Sparks serving one model: the pair's checks, its watch and its plan (docs/CLUSTER.md)."""
