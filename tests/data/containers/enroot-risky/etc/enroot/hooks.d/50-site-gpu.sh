#! /usr/bin/env bash
# a site hook that hands the container whatever channel the user asks for
exec nvidia-container-cli --user configure --imex-channel="${NVIDIA_IMEX_CHANNELS}" "${ENROOT_ROOTFS}"
