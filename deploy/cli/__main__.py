"""`python -m deploy.cli COMMAND ...`: the same as `shoal COMMAND ...`."""

import sys

from deploy.cli import main

sys.exit(main())
