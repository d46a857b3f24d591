"""How a gpulayer process runs, for the agent and the CLI alike: its allocator tuned for streaming (malloc.py)
and its ending, threads stopped before the interpreter's shutdown (ending.py). Imports nothing of gpulayer."""
