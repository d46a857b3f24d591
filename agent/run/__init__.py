"""One task from assignment to finish: the runner's state and its reports, how the task starts, its environment,
supervision, rendezvous, services, and elements leased ahead with their batched finishes."""
