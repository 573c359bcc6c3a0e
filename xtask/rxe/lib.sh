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

# counters: the kernel counts behind the rxe tick diagnosis, one "name value" a line:
# tasklet softirqs, ksoftirqd CPU time (all CPUs, in ticks), local timer interrupts,
# context switches, and rxe0's own counters (hw_counters: completer_sched counts completer
# work deferred to a tasklet). rdma_rxe of this kernel (6.1) runs its tasks inline in the
# poster's system call unless it defers them to a tasklet; a tasklet raised from process
# context is left to ksoftirqd, a normal thread that busy pollers must make room for.
counters() {
    local ks=0 d comm f
    for d in /proc/[0-9]*; do
        { read -r comm <"$d/comm"; } 2>/dev/null || continue
        case $comm in
        ksoftirqd/*) ks=$((ks + $(awk '{print $14 + $15}' "$d/stat" 2>/dev/null || echo 0))) ;;
        esac
    done
    awk '/TASKLET:/ {for (i = 2; i <= NF; i++) s += $i} END {print "tasklet", s + 0}' /proc/softirqs
    echo "ksoftirqd_ticks $ks"
    awk '/LOC:/ {for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i} END {print "timer_irqs", s + 0}' /proc/interrupts
    awk '/^ctxt/ {print "ctxt", $2}' /proc/stat
    for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
        [ -f "$f" ] && echo "rxe.${f##*/} $(cat "$f")"
    done
}

# placement: one sample of where the busy pollers run: "cpus/pollers", e.g. "1/2" when both
# runnable pollers (perftest's ib_*, hotverbs-perf and its passive thread) share one CPU.
placement() {
    local f line n=0 cpus=" " comm state
    for f in /proc/[0-9]*/task/*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        # shellcheck disable=SC2086 # split the stat line into fields
        set -- $line
        comm=$2 state=$3
        case $comm in
        "(hotverbs-perf)" | "(passive)" | "(ib_"*) ;;
        *) continue ;;
        esac
        [ "$state" = R ] || continue
        shift 38
        n=$((n + 1))
        case $cpus in
        *" $1 "*) ;;
        *) cpus="$cpus$1 " ;;
        esac
    done
    set -- $cpus
    echo "$#/$n"
}

# counted PROGRAM [ARGS...]: runs PROGRAM and prints on stderr how the counters of
# `counters` moved meanwhile (those that moved; they are machine-wide: a pair's server
# counts too; $HZ, when set, is quoted), and how often, sampled every 0.2 s, two runnable
# pollers shared one CPU.
counted() {
    local pid rc samples=0 shared=0 p
    counters >/tmp/counters.before
    "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        usleep 200000
        p=$(placement)
        case $p in
        1/2 | 1/3 | 2/3) shared=$((shared + 1)) ;;
        esac
        samples=$((samples + 1))
    done
    wait "$pid"
    rc=$?
    counters >/tmp/counters.after
    awk -v hz="${HZ:-?}" -v placed="$shared of $samples" '
        NR == FNR { before[$1] = $2; next }
        { d = $2 - before[$1]; if (d != 0) out = out " " $1 " +" d }
        END { print "kernel counters during the run (HZ " hz "):" out "; pollers sharing a CPU in " placed " samples" }
    ' /tmp/counters.before /tmp/counters.after >&2
    return "$rc"
}
