# Step helpers for the VM, sourced by the /host/run.sh that `cargo xtask rxe` generates
# (xtask/src/rxe.rs). Every step leaves its record in /host/out/<dir>/:
#   stdout, stderr   what the program printed
#   rc               its exit status (137 when the timeout killed it)
#   start, end       guest uptime in seconds, for the duration
#   pid              while it runs
#   killed           (servers only) it outlived its client and was killed

# begin TEXT: progress line for the host's live view.
begin() {
    echo "@rxe $*"
}

# step DIR TIMEOUT PROGRAM [ARGS...]: run PROGRAM under TIMEOUT seconds, recording it in DIR.
step() {
    local dir="/host/out/$1" limit="$2" t0 t1 rc _
    shift 2
    mkdir -p "$dir"
    read -r t0 _ </proc/uptime
    echo "$t0" >"$dir/start"
    timeout -s KILL "$limit" "$@" >"$dir/stdout" 2>"$dir/stderr" </dev/null &
    echo $! >"$dir/pid"
    wait $!
    rc=$?
    read -r t1 _ </proc/uptime
    echo "$t1" >"$dir/end"
    echo "$rc" >"$dir/rc"
    return "$rc"
}

# server DIR TIMEOUT PROGRAM [ARGS...]: start the server half of a client/server pair in the
# background, recorded like a step.
server() {
    step "$@" &
    SERVER=$!
}

# await_listen PORT: wait until something listens on TCP PORT, at most 10 s, giving up early
# when the server already exited. The client runs either way; this only avoids a fixed sleep.
await_listen() {
    local tries=0
    while [ "$tries" -lt 100 ]; do
        netstat -ltn 2>/dev/null | grep -q ":$1 " && return 0
        kill -0 "$SERVER" 2>/dev/null || return 1
        usleep 100000
        tries=$((tries + 1))
    done
    return 1
}

# reap DIR: wait for the server half recorded in DIR. It gets 10 s after its client ended
# (perftest and the pingpongs end together); after that it is waiting for a client that
# failed, so it is killed rather than left to run into its timeout.
reap() {
    local tries=0
    while kill -0 "$SERVER" 2>/dev/null && [ "$tries" -lt 100 ]; do
        usleep 100000
        tries=$((tries + 1))
    done
    if kill -0 "$SERVER" 2>/dev/null; then
        echo killed >"/host/out/$1/killed"
        kill -KILL "$(cat "/host/out/$1/pid")" 2>/dev/null
    fi
    wait "$SERVER"
}
