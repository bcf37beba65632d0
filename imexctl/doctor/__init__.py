"""imexctl doctor: the check framework, then one module per group of checks."""
