#!/usr/bin/env bash
# storage_latency_stack.sh	Trace one process's storage I/O by layer.
#
# USAGE: storage_latency_stack.sh <process-name|pid> [--dev DEVICE]
#            [--duration S] [--fio] [--out DIR] [--json] [--no-syscalls]
#
#   process-name|pid  a pid traces that process and all its threads; a
#                     name traces tasks whose comm is that name (Linux
#                     keeps 15 characters); "all" traces every process
#   --dev DEVICE      only this block device: a name (nvme0n1, vda1),
#                     MAJ:MIN, /dev/NODE, or any path (the disk holding
#                     the filesystem of that path); partitions resolve to
#                     their disk. Default: every device
#   --duration S      stop after S seconds (default: at Ctrl-C)
#   --fio             also distill a fio job, DIR/job.fio (needs python3)
#   --out DIR         where to write (default ./storage-trace-<time>)
#   --json            bpftrace's JSON output (trace.json) instead of text
#                     (trace.txt), plus the parsed histograms.json
#   --no-syscalls     block layer only: no syscall or io_uring probes (see
#                     "missed_events" in tracing/README.md)
#
# What it writes into DIR: trace.txt or trace.json (raw bpftrace output,
# preceded by lines saying which layers were traced and which were not),
# layers.txt, the generated script storage_latency_stack.gen.bt, and,
# with --fio, job.fio.
#
# Examples:
#   storage_latency_stack.sh vllm --fio                 # until Ctrl-C
#   storage_latency_stack.sh 4242 --dev /mnt/nvme --duration 30 --json
#
# Exit: 0 ok, 2 usage or environment error, else bpftrace's status.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BT="$HERE/storage_latency_stack.bt"
TRACEFS=/sys/kernel/tracing
PROG=storage_latency_stack

die() { echo "$PROG: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }
usage() { sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; }

target="" dev_arg="" duration="" want_fio=0 out="" json=0 no_sys=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	-h|--help) usage; exit 0 ;;
	--dev) [[ $# -ge 2 ]] || die "--dev needs a value"; dev_arg="$2"; shift 2 ;;
	--duration) [[ $# -ge 2 ]] || die "--duration needs a value"
		duration="$2"; shift 2 ;;
	--fio) want_fio=1; shift ;;
	--out) [[ $# -ge 2 ]] || die "--out needs a value"; out="$2"; shift 2 ;;
	--json) json=1; shift ;;
	--no-syscalls) no_sys=1; shift ;;
	-*) die "unknown option $1 (see --help)" ;;
	*) [[ -z "$target" ]] || die "only one process-name|pid, got '$target' and '$1'"
		target="$1"; shift ;;
	esac
done
[[ -n "$target" ]] || { usage >&2; die "missing <process-name|pid>"; }
if [[ -n "$duration" && ! "$duration" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
	die "--duration must be a number of seconds, got '$duration'"
fi

[[ "$(id -u)" -eq 0 ]] || die "must run as root (bpftrace attaches kernel tracepoints); try: sudo $0 ..."
command -v bpftrace >/dev/null 2>&1 ||
	die "bpftrace not found; install it (Debian/Ubuntu: apt-get install bpftrace)"
[[ -r "$BT" ]] || die "missing $BT (copy the whole tracing/ folder)"

# --- process filter --------------------------------------------------------
pid=0 comm="-"
if [[ "$target" == "all" ]]; then
	:
elif [[ "$target" =~ ^[0-9]+$ ]]; then
	pid="$target"
	[[ -d "/proc/$pid" ]] || die "no process with pid $pid"
else
	comm="$target"
	if [[ ${#comm} -gt 15 ]]; then
		comm="${comm:0:15}"
		say "process names are 15 characters in the kernel: matching '$comm'"
	fi
	[[ "$comm" =~ ^[A-Za-z0-9_.:+@-]+$ ]] || die "unsupported characters in process name '$target'"
	pgrep -x "$comm" >/dev/null 2>&1 ||
		say "no process named '$comm' runs yet; tracing it when it starts"
fi

# --- device filter: MAJ:MIN of a disk (partitions resolved to the disk) ----
devt=0 devname="all devices" region_gib=8
resolve_dev() {
	local arg="$1" mm=""
	if [[ "$arg" =~ ^[0-9]+:[0-9]+$ ]]; then
		mm="$arg"
	elif [[ -b "$arg" ]]; then
		mm="$(printf '%d:%d' "0x$(stat -L -c %t "$arg")" "0x$(stat -L -c %T "$arg")")"
	elif [[ -b "/dev/$arg" ]]; then
		mm="$(printf '%d:%d' "0x$(stat -L -c %t "/dev/$arg")" "0x$(stat -L -c %T "/dev/$arg")")"
	elif [[ -e "$arg" ]]; then
		mm="$(stat -L -c '%Hd:%Ld' "$arg")"
		[[ "${mm%%:*}" != 0 ]] ||
			die "$arg is on a filesystem without a block device (tmpfs, overlay or network?)"
	else
		die "--dev '$arg' is neither a device, MAJ:MIN nor an existing path"
	fi
	local sys="/sys/dev/block/$mm"
	[[ -e "$sys" ]] || die "no block device $mm (from --dev $arg)"
	if [[ -e "$sys/partition" ]]; then
		local disk
		disk="$(cat "$(readlink -f "$sys")/../dev")"
		say "$mm is a partition; tracing its disk $disk"
		mm="$disk"; sys="/sys/dev/block/$mm"
	fi
	echo "$mm"
}
if [[ -n "$dev_arg" ]]; then
	mm="$(resolve_dev "$dev_arg")"
	major="${mm%%:*}" minor="${mm##*:}"
	devt=$(( (major << 20) | minor ))
	devname="$(basename "$(readlink -f "/sys/dev/block/$mm")") ($mm)"
	sectors="$(cat "/sys/dev/block/$mm/size" 2>/dev/null || echo 0)"
	# about 64 regions over the disk, at least 1 GiB each
	region_gib=$(( sectors / 2097152 / 64 ))
	(( region_gib >= 1 )) || region_gib=1
fi

# --- tracefs and the layers this kernel offers -----------------------------
if [[ ! -d "$TRACEFS/events" ]]; then
	mount -t tracefs nodev "$TRACEFS" 2>/dev/null ||
		die "tracefs is not mounted and mounting it failed: mount -t tracefs nodev $TRACEFS"
	say "mounted tracefs on $TRACEFS"
fi
# tracepoint:CATEGORY:NAME exists when tracefs has events/CATEGORY/NAME
has_tp() { local t="${1#tracepoint:}"; [[ -d "$TRACEFS/events/${t%%:*}/${t#*:}" ]]; }

declare -A layer_on=()
on_list="" off_list=""
# every "//@layer NAME PROBE..." marker names the tracepoints it needs
while read -r name probes; do
	[[ -n "${layer_on[$name]+x}" ]] && continue
	ok=1 missing=""
	for p in $probes; do
		has_tp "$p" || { ok=0; missing="$missing $p"; }
	done
	if (( no_sys )) && [[ "$name" =~ ^(syscalls|fadvise|libaio|io_uring)$ ]]; then
		layer_on[$name]=0; off_list="$off_list $name(--no-syscalls)"; continue
	fi
	layer_on[$name]=$ok
	if (( ok )); then on_list="$on_list $name"
	else off_list="$off_list $name(missing${missing})"; fi
done < <(sed -n 's|^[[:space:]]*//@layer \([a-z_]*\) \(.*\)$|\1 \2|p' "$BT")
if [[ "${layer_on[block]:-0}" != 1 ]]; then
	say "WARNING: no block tracepoints: only the syscall layer will be seen"
	# these extend the block layer's probes and maps
	for dep in owner queue requeue merge; do
		if [[ "${layer_on[$dep]:-0}" == 1 ]]; then
			layer_on[$dep]=0
			on_list="$(echo " $on_list " | sed "s/ $dep / /; s/^ *//; s/ *$//")"
			off_list="$off_list $dep(needs block)"
		fi
	done
fi
owned=0
if [[ "$pid" != 0 || "$comm" != "-" ]]; then
	if [[ "${layer_on[owner]:-0}" == 1 ]]; then
		owned=1
	else
		say "WARNING: no block:block_io_start: block layer NOT filtered by process"
		off_list="$off_list block-process-filter"
	fi
fi
if [[ -e "$TRACEFS/kprobe_events" ]]; then kp="offered (not needed)"; else
	kp="not offered by this kernel (not needed: tracepoints only)"; fi

# --- output ----------------------------------------------------------------
[[ -n "$out" ]] || out="./storage-trace-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out" || die "cannot create --out $out"
out="$(cd "$out" && pwd)"
gen="$out/storage_latency_stack.gen.bt"
awk -v on="$on_list" '
	BEGIN { n = split(on, a, " "); for (i = 1; i <= n; i++) keep[a[i]] = 1; depth = 0; skip = 0 }
	/^[[:space:]]*\/\/@layer / { depth++; if (!skip && !($2 in keep)) skip = depth; next }
	/^[[:space:]]*\/\/@end/ { if (skip == depth) skip = 0; depth--; next }
	{ if (!skip) print }
' "$BT" > "$gen"
{
	echo "layers_on:${on_list:- none}"
	echo "layers_off:${off_list:- none}"
	echo "kprobes: $kp"
	echo "filter: pid $pid comm $comm dev $devname"
} > "$out/layers.txt"
while read -r l; do say "$l"; done < "$out/layers.txt"

if (( json )); then
	trace="$out/trace.json"
	printf '{"type": "kvtier_meta", "data": {"layers_on": "%s", "layers_off": "%s", "filter_pid": %d, "filter_comm": "%s", "dev": "%s"}}\n' \
		"${on_list# }" "$(o="${off_list# }"; echo "${o:-none}")" "$pid" "$comm" "$devname" > "$trace"
	fmt=(-f json)
else
	trace="$out/trace.txt"
	sed 's/^/# kvtier /' "$out/layers.txt" > "$trace"
	fmt=()
fi

# bpftrace gets SIGINT from Ctrl-C (same process group) or from us at the
# end of --duration; either way it runs END and prints its maps.
ncpu="$(getconf _NPROCESSORS_CONF 2>/dev/null || nproc)"
if (( ncpu > 64 )); then
	say "WARNING: $ncpu CPUs: queue depth sums the first 64 CPUs' counters only"
	ncpu=64
fi
bpftrace "${fmt[@]}" "$gen" "$pid" "$comm" "$devt" "$region_gib" "$owned" "$ncpu" \
	>> "$trace" 2> "$out/bpftrace.stderr" &
bt_pid=$!
# The kernel skips a BPF program that would run while another one runs on
# the same CPU (recursion guard); on kernels whose syscall tracepoints run
# preemptible, block events are lost this way. Count the skips, so the
# capture's health is known rather than guessed.
record_misses() {
	local f n=0 m
	for f in /proc/"$bt_pid"/fdinfo/*; do
		m="$(sed -n 's/^recursion_misses:[[:space:]]*//p' "$f" 2>/dev/null || true)"
		if [[ "$m" =~ ^[0-9]+$ ]]; then n=$(( n + m )); fi
	done
	echo "$n" > "$out/missed_events"
}
# SIGINT, repeated: a first SIGINT has been seen to go unnoticed by
# bpftrace 0.17 now and then; END still runs on the second one.
interrupt() {
	record_misses
	kill -INT "$bt_pid" 2>/dev/null || return 0
	for _ in 1 2 3 4 5 6; do
		sleep 2
		kill -0 "$bt_pid" 2>/dev/null || return 0
		kill -INT "$bt_pid" 2>/dev/null || return 0
	done
	say "bpftrace ignores SIGINT; terminating it (no histograms)"
	kill -TERM "$bt_pid" 2>/dev/null || true
}
stopper=""
stop() { [[ -n "$stopper" ]] && return; ( interrupt ) & stopper=$!; }
trap stop INT TERM
timer=""
if [[ -n "$duration" ]]; then
	( sleep "$duration"; interrupt ) & timer=$!
fi
say "tracing $([[ $pid != 0 ]] && echo "pid $pid" || echo "comm $comm") on $devname into $trace$([[ -n $duration ]] && echo " for ${duration}s" || echo "; Ctrl-C to end")"
rc=0
while kill -0 "$bt_pid" 2>/dev/null; do
	wait "$bt_pid" && rc=0 || rc=$?
done
for p in $timer $stopper; do kill "$p" 2>/dev/null || true; done
trap - INT TERM
grep -v 'RLIMIT_MEMLOCK' "$out/bpftrace.stderr" >&2 || true
missed="$(cat "$out/missed_events" 2>/dev/null || echo unknown)"
echo "missed_events: $missed" >> "$out/layers.txt"
if (( json )); then
	printf '{"type": "kvtier_meta", "data": {"missed_events": "%s"}}\n' "$missed" >> "$trace"
else
	echo "# kvtier missed_events: $missed" >> "$trace"
fi
if [[ "$missed" =~ ^[0-9]+$ && "$missed" -gt 0 ]]; then
	say "WARNING: the kernel skipped $missed probe runs (BPF recursion guard): counts are low and queue depth may drift; --no-syscalls keeps the block layer whole"
fi
# 130 = ended by SIGINT, which is how every capture ends
if [[ $rc -ne 0 && $rc -ne 130 ]]; then
	say "bpftrace failed (exit $rc); see $out/bpftrace.stderr"
	exit "$rc"
fi

if (( json )) || (( want_fio )); then
	if ! command -v python3 >/dev/null 2>&1; then
		say "python3 not found: raw trace kept, no histograms.json/job.fio"
		exit 0
	fi
	( cd "$HERE/.." && python3 -m tracing.distill -i "$trace" \
		$( (( json )) && echo "--dump-json $out/histograms.json" ) \
		$( (( want_fio )) && echo "-o $out/job.fio" ) \
		--process "$([[ $comm != - ]] && echo "$comm" || echo "pid$pid")" ) ||
		say "distilling failed; the raw trace is in $trace"
fi
say "done: $out"
