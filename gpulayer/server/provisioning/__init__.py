"""Growing the fleet through Slurm."""
