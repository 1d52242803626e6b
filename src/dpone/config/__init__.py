"""Configuration: workload files and the composition root (bootstrap)."""
