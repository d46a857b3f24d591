"""Where a task's process runs and how it is contained: its bubblewrap sandbox (its own, a spare made ahead, its
job's shared one, or an OCI image's root), its process group, and the groups a killed agent left running."""
