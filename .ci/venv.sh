# shellcheck shell=bash
# make_venv DIR LINE...: a virtual environment at DIR, made by Debian's /usr/bin/python3, holding exactly
# the requirement LINEs (each one whole line of a requirements file: markers, extras and options such as
# '-e .[test]' stay intact; never split into shell words). DIR is reused only when everything that made it
# still matches: the interpreter (its version and where it lives) and every requirement line, recorded as
# one hash in DIR/.imexctl-venv; anything else (no stamp, another hash, an interpreter that no longer
# starts) rebuilds it from nothing. A failed install leaves no stamp, so the next run starts again.
make_venv() {
    local dir=$1
    shift
    local want have req
    want=$({
        readlink -f /usr/bin/python3
        /usr/bin/python3 -c 'import sys; print(sys.version)'
        printf '%s\n' "$@"
    } | sha256sum | cut -d' ' -f1)
    have=$(cat "$dir/.imexctl-venv" 2>/dev/null || true)
    if [ "$have" = "$want" ] && "$dir/bin/python" -c '' 2>/dev/null; then
        return 0
    fi
    rm -rf "$dir"
    /usr/bin/python3 -m venv "$dir"
    req=$(mktemp)
    printf '%s\n' "$@" >"$req"
    if ! "$dir/bin/pip" install -q --disable-pip-version-check -r "$req"; then
        rm -f "$req"
        echo "make_venv: pip could not install into $dir:" >&2
        printf '    %s\n' "$@" >&2
        return 1
    fi
    rm -f "$req"
    echo "$want" >"$dir/.imexctl-venv"
}
