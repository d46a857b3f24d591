"""A task's files: the artifact cache by digest, source bundles and inputs placed safely under their caps,
checkpoints restored and uploaded, outputs collected, and paths resolved beneath the task's directory."""
