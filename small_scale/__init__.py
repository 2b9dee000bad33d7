"""The small-scale studies and benchmarks of rpg-ref, run as modules from the repository's root
(small_scale/README.md draws the rooms)."""
