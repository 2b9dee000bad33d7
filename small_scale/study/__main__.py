"""python -m small_scale.study NAME: the study runner (small_scale/study/runner.py)."""

import sys

from small_scale.study.runner import main

sys.exit(main())
