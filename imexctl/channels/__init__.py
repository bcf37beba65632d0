"""IMEX channels: the device nodes, the job's channel, the TaskProlog, the enroot hook, notes to the job's user."""
