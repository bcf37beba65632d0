"""What Slurm says: the job's environment, node lists, slurm.conf, scontrol, topology files and blocks, addresses."""
