"""Pre-registered studies: the runner, its worker processes, the study files' rules and rows, the
statistics that write small_scale/RESULTS.md, a row's rerun, the carry task's properties."""
