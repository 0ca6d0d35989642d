"""Execution layer: knows Slurm, containers and SSH; never imports pytest."""
