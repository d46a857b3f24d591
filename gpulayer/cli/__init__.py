"""The `gpulayer` command: typer over gpulayer.client (and, lazily, the local control plane).

    app       the typer app, global options, `main()` (the console script)
    common    global options, parsing and output helpers
    submit    submit                     jobs      job ...
    following a job waited on, its logs      workers   worker ..., join
    fleet     token ..., secret ...      server    server ..., up, explore, artifacts gc
    up        `gpulayer up`              local     `submit --target local`

Only `server`, `up` and `local` import the control plane (gpulayer.server), and
only inside the functions that run it (tests/unit/test_import_contracts.py).
"""


def main(argv=None):
    """The `gpulayer` console script (`gpulayer.cli:main`): with `argv` None the process's command, which
    ends the process (gpulayer.proc.ending); with a list, a call that returns the exit status."""
    from gpulayer.cli.app import main as run
    if argv is not None:
        return run(argv)
    from gpulayer.proc.ending import run_and_end
    from gpulayer.proc.malloc import keep_freed_memory
    keep_freed_memory()  # the process's own: a call with argv (a test, a library) leaves malloc as it is
    run_and_end(run)
