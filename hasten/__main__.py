"""`python -m hasten` (what torchrun launches) is the `hasten` command."""

import sys

from hasten.cli import main

sys.exit(main())
