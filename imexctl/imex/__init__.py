"""The IMEX daemon: its config files, its service backends, its processes, nvidia-imex-ctl's output, peer TLS."""
