#!/bin/bash
# shellcheck disable=SC2317,SC2086  # the helpers are called through eval, as nhc calls them
# The tests' stand-in for LBNL NHC's driver (mej/nhc, 'nhc' 1.4.3), written here from how it calls checks;
# no NHC code.  Usage: nhc_harness.sh CONFDIR [VAR=VALUE...]
#
# As nhc does: PATH is /sbin:/usr/sbin:/bin:/usr/bin and pathname expansion is off (set -f); every
# CONFDIR/scripts/*.nhc is sourced; each line "TARGET || CHECK" of CONFDIR/nhc.conf whose TARGET matches
# $HOSTNAME (here: a shell glob) is run by eval, one after the other; a check fails by calling
# 'die RC MESSAGE' (which ends the run with RC) or by returning non-zero without it (then the run dies with
# "Check CHECK returned RC"); TIMEOUT (30 unless given) is the whole run's limit.  The node is marked as
# nhc's default helpers do, by an eval of the helper with HOSTNAME and the note in single quotes:
#   node-mark-offline 'HOSTNAME' 'MESSAGE'   (which prefixes "NHC:"), node-mark-online 'HOSTNAME'
# Here the helpers print what they were given: "offline <host> NHC: <message>", "online <host>".
set -f
PATH="/sbin:/usr/sbin:/bin:/usr/bin"
CONFDIR="$1"
shift
for ASSIGNMENT in "$@"; do
    export "${ASSIGNMENT?}"
done
TIMEOUT="${TIMEOUT:-30}"
HOSTNAME="${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}"
OFFLINE_NODE="harness_mark_offline"
ONLINE_NODE="harness_mark_online"
CHECK_DIED=0

harness_mark_offline() { echo "offline $1 NHC: $2"; }
harness_mark_online() { echo "online $1"; }
dbg() { [[ "${DEBUG:-0}" == 1 ]] && echo "DEBUG:  $*"; return 0; }
log() { echo "$*"; }

die() {
    local RC="$1"
    shift
    CHECK_DIED=1
    log "ERROR:  nhc:  Health check failed:  $*"
    eval $OFFLINE_NODE "'$HOSTNAME'" "'$*'"
    exit "$RC"
}

set +f
SCRIPTS=( "$CONFDIR"/scripts/*.nhc )
set -f
for SCRIPT in "${SCRIPTS[@]}"; do
    # shellcheck disable=SC1090
    [[ -e "$SCRIPT" ]] && . "$SCRIPT"
done

( trap 'kill "$SLEEPER" 2>/dev/null; exit 0' TERM; sleep "$TIMEOUT" & SLEEPER=$!; wait "$SLEEPER" && kill -s ALRM $$ ) \
    </dev/null >/dev/null 2>&1 &
WATCHDOG=$!
trap 'die 142 "Script timed out${CHECK:+ while executing \"$CHECK\"}."' ALRM
trap 'kill $WATCHDOG 2>/dev/null' EXIT

while read -r LINE; do
    TARGET="${LINE%%||*}"
    CHECK="${LINE#*||}"
    TARGET="${TARGET## }"; TARGET="${TARGET%% }"
    CHECK="${CHECK## }"; CHECK="${CHECK%% }"
    [[ -z "$TARGET" || "${TARGET:0:1}" == "#" || "$LINE" != *"||"* ]] && continue
    # shellcheck disable=SC2053
    [[ "$HOSTNAME" == $TARGET ]] || continue
    eval $CHECK
    RET=$?
    if [[ $RET -ne 0 && $CHECK_DIED -eq 0 ]]; then
        die "$RET" "Check $CHECK returned $RET"
    fi
done < "$CONFDIR/nhc.conf"
eval $ONLINE_NODE "'$HOSTNAME'"
exit 0
