"""Benchmarks: each prints what it measured on this machine, with what it compares against."""
