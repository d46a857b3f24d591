"""`python -m gpulayer.cli`: the `gpulayer` command."""
import sys

from gpulayer.cli.app import main

sys.exit(main())
