#!/bin/sh
# enroot hook (/etc/enroot/hooks.d/99-imexctl.sh) for imexctl: shows the
# container exactly the Slurm job's IMEX channel. Runs as the user, before the
# container starts. It stops the start (exit 70/71, one line on stderr) only
# for a job with a channel here under [containers] on_error = closed; an
# imexctl that cannot run at all never stops a container (docs/containers.md).
[ -x /opt/imexctl/bin/python ] || exit 0
/opt/imexctl/bin/python -I -m imexctl.channels.enroot
rc=$?
case $rc in 0 | 70 | 71) exit $rc ;; esac
echo "imexctl enroot hook: /opt/imexctl/bin/python -m imexctl.channels.enroot failed (exit $rc); the container starts as enroot set it up: run 'imexctl doctor' on this tray" >&2
exit 0
