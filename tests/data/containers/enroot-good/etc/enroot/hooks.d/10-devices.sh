#! /usr/bin/env bash
# stand-in for enroot's 10-devices.sh (a fresh /dev under ENROOT_RESTRICT_DEV)
exit 0
