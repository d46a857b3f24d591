"""`python -m gpulayer.cli`: the `gpulayer` command."""
from gpulayer.cli.app import main
from gpulayer.protocol.ending import run_and_end

run_and_end(main)
