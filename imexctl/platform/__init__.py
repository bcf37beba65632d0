"""The floor: errors, the Host seam to the operating system, safe file I/O, /proc scans, log lines."""
