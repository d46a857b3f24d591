"""`python -m gpulayer.cli`: the `gpulayer` command."""
from gpulayer.cli import main

main()
