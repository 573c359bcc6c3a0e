# Step helpers for the VM, sourced by the /host/run.sh that `cargo xtask rxe` generates
# (xtask/src/rxe/guest.rs). Every step leaves its record in /host/out/<dir>/:
#   stdout, stderr   what the program printed
#   rc               its exit status (137 when the timeout killed it)
#   start, end       guest uptime in seconds, for the duration
#   pid              while it runs
#   killed           (servers only) it outlived its client and was killed
#   not-run          (clients only) why it was not started: its server never listened

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

# await_listen DIR PORT SECS: wait until something listens on TCP PORT, at most SECS seconds,
# giving up early when the server half (started by `server`) exits. On failure the client
# recorded in DIR must not run: DIR/not-run says why, a server still running is killed, and
# the status is 1. Polling only avoids a fixed sleep; SECS bounds the failure path alone, so
# it is generous (QEMU TCG on a loaded host).
await_listen() {
    local dir="/host/out/$1" port="$2" limit="$3" tries=0 why
    while :; do
        netstat -ltn 2>/dev/null | grep -q ":$port " && return 0
        if ! kill -0 "$SERVER" 2>/dev/null; then
            why="the server exited before listening on TCP port $port"
            break
        fi
        if [ "$tries" -ge $((limit * 10)) ]; then
            why="the server was not listening on TCP port $port after $limit s"
            kill -KILL "$(cat "$dir/server/pid")" 2>/dev/null
            break
        fi
        usleep 100000
        tries=$((tries + 1))
    done
    mkdir -p "$dir"
    echo "$why" >"$dir/not-run"
    begin "$why: client not run"
    return 1
}

# reap DIR SECS: wait for the server half recorded in DIR. It gets SECS seconds after its
# client ended (perftest and the pingpongs end together); after that it is waiting for a
# client that failed, so it is killed rather than left to run into its timeout.
reap() {
    local tries=0
    while kill -0 "$SERVER" 2>/dev/null && [ "$tries" -lt $(($2 * 10)) ]; do
        usleep 100000
        tries=$((tries + 1))
    done
    if kill -0 "$SERVER" 2>/dev/null; then
        echo killed >"/host/out/$1/killed"
        kill -KILL "$(cat "/host/out/$1/pid")" 2>/dev/null
    fi
    wait "$SERVER"
}
