#!/bin/sh
# enroot hook (/etc/enroot/hooks.d/99-imexctl.sh) for imexctl: shows the
# container exactly the Slurm job's IMEX channel. Runs as the user, before the
# container starts; a failure stops the start with one line on stderr.
[ -x /opt/imexctl/bin/python ] || exit 0
exec /opt/imexctl/bin/python -I -m imexctl.enroothook
