import sys

from rpg_ref.audit.cli import main

sys.exit(main())
