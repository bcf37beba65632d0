"""NVML and the NVLink fabric: this tray's clique and its NVLink domain."""
