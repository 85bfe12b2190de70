"""`python -m planner.cli ...` runs the `fitplan` command."""
import sys

from planner.cli.app import main

sys.exit(main())
