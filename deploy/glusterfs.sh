#!/usr/bin/env bash
# glusterfs.sh	a real GlusterFS volume on this host, served from its own network namespace, for kvtier's shared tier.
#
# usage (as root):
#   deploy/glusterfs.sh up     --state-dir D [--bricks N] [--replica N] [--mounts N] [--bw RATE] [--ping-timeout S]
#   deploy/glusterfs.sh bw     --state-dir D --bw RATE|off
#   deploy/glusterfs.sh down   --state-dir D
#   deploy/glusterfs.sh status --state-dir D
#
# What `up` makes, each recorded in D/gluster.state the moment it exists (so `down` removes exactly that, also after
# an `up` that failed half-way):
#   - a network namespace (the "storage node") and a veth pair into it with a private /30 (10.254.X.Y, X and Y from a
#     hash of D; a /30 whose network any address or route here already uses is skipped). GlusterFS refuses loopback
#     addresses for bricks, hence the namespace;
#   - glusterd inside it, with its working directory (D/glusterd), run directory (pid files), CLI socket and logs
#     (D/log, the bricks' too) under D through its own volfile (D/glusterd.vol), so it shares no state with a system
#     glusterd; only the brick servers' unix sockets go to /var/run/gluster (fixed in glusterd), removed by `down`;
#   - volume `kvtier`: N bricks (D/bricks/bN; distributed, or --replica copies of each file), network.ping-timeout
#     lowered from GlusterFS's 42 s to --ping-timeout (default 5 s): how long a client waits for a silent brick before
#     the operation fails with ENOTCONN;
#   - the volume mounted with the FUSE client in the root namespace at D/mnt (and D/mnt2.. with --mounts N: separate
#     clients, like separate nodes, each with its own caches);
#   - with --bw, a tc tbf on both ends of the veth: RATE each way (tc's units: 800mbit, 100mbps = 100 MB/s).
# `down` unmounts, stops and deletes the volume, stops every process in the namespace, removes the namespace and
# the veth, and deletes D/bricks, D/glusterd and D/run (D/log stays); it is idempotent. `status` prints the state and
# the volume's status.
#
# example:
#   $ deploy/glusterfs.sh up --state-dir /var/tmp/kvgl --bw 200mbps
#   mount  /var/tmp/kvgl/mnt  (10.254.17.42:/kvtier, 2 bricks)
#   $ kvtier ... --shared-dir /var/tmp/kvgl/mnt/kv ...
#   $ deploy/glusterfs.sh down --state-dir /var/tmp/kvgl
set -euo pipefail

die() { echo "glusterfs.sh: $*" >&2; exit 2; }

VOL=kvtier
cmd=${1:-}
[[ $cmd =~ ^(up|down|status|bw)$ ]] || die "usage: glusterfs.sh up|down|status|bw --state-dir DIR [options] (see the header)"
shift
STATE_DIR="" BRICKS=2 REPLICA=1 MOUNTS=1 BW="" PING=5
while [[ $# -gt 0 ]]; do
    case $1 in
        --state-dir) STATE_DIR=${2:-}; shift 2 ;;
        --bricks) BRICKS=${2:-}; shift 2 ;;
        --replica) REPLICA=${2:-}; shift 2 ;;
        --mounts) MOUNTS=${2:-}; shift 2 ;;
        --bw) BW=${2:-}; shift 2 ;;
        --ping-timeout) PING=${2:-}; shift 2 ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ -n $STATE_DIR ]] || die "--state-dir DIR is required"
for n in "$BRICKS" "$REPLICA" "$MOUNTS" "$PING"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "counts and --ping-timeout are positive integers"; done
(( BRICKS % REPLICA == 0 )) || die "--bricks must be a multiple of --replica"
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, mounts)"
mkdir -p "$STATE_DIR"
D=$(cd "$STATE_DIR" && pwd)
STATE=$D/gluster.state

# ---- state: one KEY=VALUE line per thing made, appended the moment it exists ----------------------------------------
record() { echo "$1=$2" >> "$STATE"; }
recorded() { [[ -f $STATE ]] && sed -n "s/^$1=//p" "$STATE" | tail -n 1; }

gcli() {  # the gluster CLI, inside the namespace, talking to this glusterd's own socket
    ip netns exec "$(recorded ns)" gluster --mode=script --glusterd-sock="$D/run/glusterd.socket" \
        --log-file="$D/log/cli.log" "$@"
}

set_bw() {  # set_bw RATE|off: tbf on both ends of the veth (each end shapes what it sends)
    local host_if store_if ns
    host_if=$(recorded veth_host) store_if=$(recorded veth_store) ns=$(recorded ns)
    [[ -n $host_if && -n $ns ]] || die "nothing is up in $D"
    if [[ $1 == off ]]; then
        tc qdisc del dev "$host_if" root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev "$store_if" root 2>/dev/null || true
        return
    fi
    # A burst of 1 MB and 100 ms of queue: enough for GlusterFS's 128 KiB-1 MiB writes at any rate tested here.
    tc qdisc replace dev "$host_if" root tbf rate "$1" burst 1mb latency 100ms || die "tc refused rate $1"
    ip netns exec "$ns" tc qdisc replace dev "$store_if" root tbf rate "$1" burst 1mb latency 100ms
}

free_subnet() {  # a 10.254.X.Y/30 (Y multiple of 4) that no address or route here falls in; X, Y from a hash of D
    local h x y i used
    h=$(printf '%s' "$D" | cksum | cut -d' ' -f1)
    used=$(ip -4 -o addr show; ip -4 route show table all)
    for ((i = 0; i < 64; i++)); do
        x=$(( (h / 64 + i * 7) % 254 + 1 )) y=$(( (h + i) % 64 * 4 ))
        grep -qE "(^|[^0-9])10\.254\.$x\.($y|$((y + 1))|$((y + 2))|$((y + 3)))([^0-9]|$)|10\.254\.0\.0/16|10\.0\.0\.0/8" \
            <<< "$used" || { echo "10.254.$x.$y"; return; }
    done
    die "no free 10.254.x.y/30 found"
}

up() {
    [[ -f $STATE ]] && die "$D already holds a volume (deploy/glusterfs.sh down --state-dir $D first)"
    command -v glusterd > /dev/null || die "glusterd not found (apt-get install glusterfs-server glusterfs-client)"
    local tag net a_host a_store ns vh vs b bricks=() m
    tag=$(printf '%s' "$D" | sha1sum | cut -c1-8)
    ns=kvgl-$tag vh=kvgl${tag:0:6}h vs=kvgl${tag:0:6}s
    net=$(free_subnet)
    a_host=${net%.*}.$(( ${net##*.} + 1 )) a_store=${net%.*}.$(( ${net##*.} + 2 ))
    # Any failure from here on (a failed command under set -e, or die) removes what was made so far.
    trap 'echo "glusterfs.sh: up failed; removing what it made" >&2; down' EXIT
    ip netns add "$ns"; record ns "$ns"
    ip link add "$vh" type veth peer name "$vs"; record veth_host "$vh"; record veth_store "$vs"
    ip link set "$vs" netns "$ns"
    ip addr add "$a_host/30" dev "$vh"; ip link set "$vh" up
    ip netns exec "$ns" ip addr add "$a_store/30" dev "$vs"
    ip netns exec "$ns" ip link set "$vs" up
    ip netns exec "$ns" ip link set lo up
    record addr "$a_store"
    mkdir -p "$D/glusterd" "$D/run" "$D/log" "$D/bricks"
    # The option groups (`gluster volume set V group X`) are read from the working directory.
    [[ -d /var/lib/glusterd/groups ]] && cp -r /var/lib/glusterd/groups "$D/glusterd/"
    cat > "$D/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $D/glusterd
    option run-directory $D/run
    option glusterd-sockfile $D/run/glusterd.socket
    option logging-directory $D/log
    option transport-type socket
    option transport.socket.bind-address $a_store
    option transport.socket.listen-port 24007
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option ping-timeout 0
    option event-threads 1
end-volume
EOF
    ip netns exec "$ns" glusterd -f "$D/glusterd.vol" -p "$D/run/glusterd.pid" -l "$D/log/glusterd.log"
    record glusterd_pid "$(cat "$D/run/glusterd.pid")"
    for ((i = 0; i < 50; i++)); do gcli volume list > /dev/null 2>&1 && break; sleep 0.2; done
    for ((b = 1; b <= BRICKS; b++)); do mkdir -p "$D/bricks/b$b"; bricks+=("$a_store:$D/bricks/b$b"); done
    local layout=()
    (( REPLICA > 1 )) && layout=(replica "$REPLICA")
    # force: the bricks live on the root filesystem, which GlusterFS otherwise refuses.
    gcli volume create "$VOL" "${layout[@]}" transport tcp "${bricks[@]}" force > /dev/null; record volume "$VOL"
    gcli volume set "$VOL" network.ping-timeout "$PING" > /dev/null
    # open-behind (on by default) answers an open at once and opens on the brick only at the first read: a file
    # another client unlinks in between is then gone (ENOENT) for a reader that had opened it. Off, an open file
    # stays readable after an unlink elsewhere, as POSIX has it and as the shared tier expects.
    gcli volume set "$VOL" performance.open-behind off > /dev/null
    gcli volume start "$VOL" > /dev/null
    for ((m = 1; m <= MOUNTS; m++)); do
        local mnt=$D/mnt
        ((m > 1)) && mnt+=$m
        mkdir -p "$mnt"
        mount -t glusterfs -o "log-file=$D/log/mnt$m.log" "$a_store:/$VOL" "$mnt"; record mount "$mnt"
    done
    [[ -n $BW ]] && { set_bw "$BW"; record bw "$BW"; }
    trap - EXIT
    echo "mount  $D/mnt  ($a_store:/$VOL, $BRICKS bricks${BW:+, $BW each way})"
}

down() {
    [[ -f $STATE ]] || { echo "glusterfs.sh: nothing up in $D"; return 0; }
    local ns mnt pid sockets=()
    ns=$(recorded ns)
    # Brick servers keep their unix sockets in /var/run/gluster whatever glusterd's run directory: noted while they
    # run (from their command lines), removed once they are stopped.
    if [[ -n $ns ]] && ip netns pids "$ns" > /dev/null 2>&1; then
        for pid in $(ip netns pids "$ns"); do
            sockets+=($(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n '/^-S$/{n;p}' | grep '^/var/run/gluster/' || true))
        done
    fi
    while read -r mnt; do
        [[ -z $mnt ]] && continue
        if mountpoint -q "$mnt"; then umount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
        rmdir "$mnt" 2>/dev/null || true
    done < <(sed -n 's/^mount=//p' "$STATE")
    if [[ -n $(recorded volume) ]] && [[ -n $ns ]] && ip netns exec "$ns" true 2>/dev/null; then
        gcli volume stop "$VOL" force > /dev/null 2>&1 || true
        gcli volume delete "$VOL" > /dev/null 2>&1 || true
    fi
    # Every process in the namespace is ours (glusterd, its bricks and helpers): TERM, then KILL what is left.
    if [[ -n $ns ]] && ip netns pids "$ns" > /dev/null 2>&1; then
        for pid in $(ip netns pids "$ns"); do kill "$pid" 2>/dev/null || true; done
        for ((i = 0; i < 25; i++)); do [[ -z $(ip netns pids "$ns") ]] && break; sleep 0.2; done
        for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
    fi
    [[ ${#sockets[@]} -gt 0 ]] && rm -f "${sockets[@]}"
    pid=$(recorded glusterd_pid)
    [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
    [[ -n $ns ]] && ip netns del "$ns" 2>/dev/null || true
    local vh
    vh=$(recorded veth_host)
    [[ -n $vh ]] && ip link del "$vh" 2>/dev/null || true
    rm -rf "$D/bricks" "$D/glusterd" "$D/run" "$D/glusterd.vol"
    rm -f "$STATE"
    echo "glusterfs.sh: down ($D)"
}

status() {
    [[ -f $STATE ]] || { echo "nothing up in $D"; return 0; }
    cat "$STATE"
    gcli volume status "$VOL" 2>&1 || true
}

case $cmd in
    up) up ;;
    down) down ;;
    status) status ;;
    bw)
        [[ -n $BW ]] || die "bw needs --bw RATE|off"
        set_bw "$BW"
        [[ -f $STATE ]] && record bw "$BW"
        ;;
esac
