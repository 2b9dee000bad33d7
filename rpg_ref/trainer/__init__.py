"""rpg-train's machinery: the loop (``train``) and what it needs; the command line is
rpg_ref/cli.py. The modules are stacked in layers, each importing only its own layer and those
below: docs/architecture.md holds the one table of the layers (tests/test_architecture.py reads it
and holds every import of this folder against it).
"""
