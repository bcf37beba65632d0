"""Test-only code: fakes for the Host and Gpu seams, job environments and ctl documents."""
