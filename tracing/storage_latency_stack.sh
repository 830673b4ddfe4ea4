#!/usr/bin/env bash
# storage_latency_stack.sh	Trace the storage I/O of processes, by layer.
#
# USAGE: storage_latency_stack.sh <TARGET[,TARGET...]>... [--pid PID]...
#            [--children] [--no-kv-server] [--per-instance] [--dev DEVICE]
#            [--duration S] [--fio] [--out DIR] [--json] [--no-syscalls]
#
#   TARGET            a name or a pid; several, comma-separated or repeated.
#                     A name matches processes whose task name or program
#                     (executable, python -m MODULE, script) is the name or
#                     starts with it and a separator, case-insensitive: vllm
#                     matches the front end (python -m vllm...), the engine
#                     VLLM::EngineCor and workers VLLM::Worker_TP. Their
#                     children are traced too, also those started while
#                     tracing, and so is the KV cache server an engine
#                     names (--kv-transfer-config lmcache.mp.port). A pid
#                     traces that process and its threads. "all" traces
#                     every process. The matched set is printed at start
#                     and written to DIR/matched.tsv
#   --pid PID         a pid (repeatable); same as giving it as a TARGET
#   --children        pids: their child processes too (names always)
#   --no-kv-server    do not add the KV cache servers the engines name
#   --per-instance    one capture per instance (DIR/group<N>/, a fio job
#                     each); default: one capture of all, broken down by
#                     process and instance in tracing.report
#   --dev DEVICE      only this block device: a name (nvme0n1, vda1),
#                     MAJ:MIN, /dev/NODE, or any path (the disk holding
#                     the filesystem of that path); partitions resolve to
#                     their disk. Default: every device
#   --duration S      stop after S seconds (default: at Ctrl-C)
#   --fio             also distill a fio job, DIR/job.fio
#   --out DIR         where to write (default ./storage-trace-<time>)
#   --json            bpftrace's JSON output (trace.json) instead of text
#                     (trace.txt), plus the parsed histograms.json
#   --no-syscalls     block layer only: no syscall or io_uring probes (see
#                     "missed_events" in tracing/README.md)
#
# What it writes into DIR: trace.txt or trace.json (raw bpftrace output,
# preceded by lines saying which layers were traced and which were not),
# layers.txt, matched.tsv (pid, instance, task name, why, command line;
# processes found while tracing are appended), the generated script
# storage_latency_stack.gen.bt, and, with --fio, job.fio. Needs python3
# (standard library) for names, --children and --fio.
#
# Examples:
#   storage_latency_stack.sh vllm --fio                 # until Ctrl-C
#   storage_latency_stack.sh vllm,lmcache --per-instance --duration 60
#   storage_latency_stack.sh --pid 4242 --children --dev /mnt/nvme --json
#
# Exit: 0 ok, 2 usage or environment error, else bpftrace's status.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BT="$HERE/storage_latency_stack.bt"
TRACEFS=/sys/kernel/tracing
PROG=storage_latency_stack

die() { echo "$PROG: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }
usage() { sed -n '3,50p' "$0" | sed 's/^# \{0,1\}//'; }

names=() pids=() all=0 children=0 kv_server=1 per_instance=0
dev_arg="" duration="" want_fio=0 out="" json=0 no_sys=0
add_target() {
	local t
	IFS=, read -ra parts <<< "$1"
	for t in "${parts[@]}"; do
		[[ -n "$t" ]] || continue
		if [[ "$t" == all ]]; then all=1
		elif [[ "$t" =~ ^[0-9]+$ ]]; then pids+=("$t")
		else
			# the whole name is matched (against the command line too):
			# no 15-character cut as for task names
			[[ "$t" =~ ^[A-Za-z0-9_.:+@-]+$ ]] || die "unsupported characters in process name '$t'"
			names+=("$t")
		fi
	done
}
while [[ $# -gt 0 ]]; do
	case "$1" in
	-h|--help) usage; exit 0 ;;
	--pid) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--pid needs a pid"
		pids+=("$2"); shift 2 ;;
	--children) children=1; shift ;;
	--no-kv-server) kv_server=0; shift ;;
	--per-instance) per_instance=1; shift ;;
	--dev) [[ $# -ge 2 ]] || die "--dev needs a value"; dev_arg="$2"; shift 2 ;;
	--duration) [[ $# -ge 2 ]] || die "--duration needs a value"
		duration="$2"; shift 2 ;;
	--fio) want_fio=1; shift ;;
	--out) [[ $# -ge 2 ]] || die "--out needs a value"; out="$2"; shift 2 ;;
	--json) json=1; shift ;;
	--no-syscalls) no_sys=1; shift ;;
	-*) die "unknown option $1 (see --help)" ;;
	*) add_target "$1"; shift ;;
	esac
done
(( all || ${#names[@]} || ${#pids[@]} )) || { usage >&2; die "missing <process-name|pid>"; }
if (( all )) && (( ${#names[@]} || ${#pids[@]} )); then
	die "'all' traces every process: give it alone"
fi
if [[ -n "$duration" && ! "$duration" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
	die "--duration must be a number of seconds, got '$duration'"
fi

[[ "$(id -u)" -eq 0 ]] || die "must run as root (bpftrace attaches kernel tracepoints); try: sudo $0 ..."
command -v bpftrace >/dev/null 2>&1 ||
	die "bpftrace not found; install it (Debian/Ubuntu: apt-get install bpftrace)"
[[ -r "$BT" ]] || die "missing $BT (copy the whole tracing/ folder)"
for p in ${pids[@]+"${pids[@]}"}; do
	[[ -d "/proc/$p" ]] || die "no process with pid $p"
done
# one pid alone, no children: no python needed, the kernel filter is all
simple=0
(( ${#names[@]} == 0 && children == 0 )) && simple=1
if (( ! all && ! simple )) || (( want_fio || json )); then
	command -v python3 >/dev/null 2>&1 ||
		die "python3 not found: needed for names, --children, --fio and --json (or give pids alone)"
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
	if (( no_sys )) && [[ "$name" =~ ^(syscalls|filebytes|fadvise|libaio|io_uring)$ ]]; then
		layer_on[$name]=0; off_list="$off_list $name(--no-syscalls)"; continue
	fi
	layer_on[$name]=$ok
	if (( ok )); then on_list="$on_list $name"
	else off_list="$off_list $name(missing${missing})"; fi
done < <(sed -n 's|^[[:space:]]*//@layer \([a-z_]*\) \(.*\)$|\1 \2|p' "$BT")
# telling files from sockets reads the kernel's file table: needs its BTF
if [[ "${layer_on[filebytes]:-0}" == 1 && ! -r /sys/kernel/btf/vmlinux ]]; then
	layer_on[filebytes]=0
	on_list="$(echo " $on_list " | sed "s/ filebytes / /; s/^ *//; s/ *$//")"
	off_list="$off_list filebytes(no /sys/kernel/btf/vmlinux)"
fi
if [[ "${layer_on[block]:-0}" != 1 ]]; then
	say "WARNING: no block tracepoints: only the syscall layer will be seen"
	# these extend the block layer's probes and maps
	for dep in owner perproc queue requeue merge; do
		if [[ "${layer_on[$dep]:-0}" == 1 ]]; then
			layer_on[$dep]=0
			on_list="$(echo " $on_list " | sed "s/ $dep / /; s/^ *//; s/ *$//")"
			off_list="$off_list $dep(needs block)"
		fi
	done
fi
owned=0
if (( ! all )); then
	if [[ "${layer_on[owner]:-0}" == 1 ]]; then
		owned=1
	else
		say "WARNING: no block:block_io_start: block layer NOT filtered by process"
		off_list="$off_list block-process-filter"
	fi
fi
if [[ -e "$TRACEFS/kprobe_events" ]]; then kp="offered (not needed)"; else
	kp="not offered by this kernel (not needed: tracepoints only)"; fi

# layers this capture does not need
# (not storage layers: left out of layers_off, which says what was not seen)
drop_layer() {
	if [[ "${layer_on[$1]:-0}" == 1 ]]; then
		layer_on[$1]=0
		on_list=" $(echo " $on_list " | sed "s/ $1 / /; s/^ *//; s/ *$//")"
	fi
}
if (( all || simple )); then
	drop_layer follow; drop_layer mailbox
	# one process (or all): its per-process bytes are the totals
	(( ${#pids[@]} > 1 )) || drop_layer perproc
elif [[ "${layer_on[follow]:-0}" != 1 ]]; then
	say "WARNING: no task:task_newtask: children started while tracing are added by a rescan each second, not from their start"
fi

# --- output ----------------------------------------------------------------
[[ -n "$out" ]] || out="./storage-trace-$(date +%Y%m%d-%H%M%S)"
created_out=1
[[ -e "$out" ]] && created_out=0
mkdir -p "$out" || die "cannot create --out $out"
out="$(cd "$out" && pwd)"

# --- targets: the matched set, grouped by instance --------------------------
# The tracer itself is never a target (its command line holds the names).
tgt_args=(${names[@]+"${names[@]}"})
for p in ${pids[@]+"${pids[@]}"}; do tgt_args+=(--pid "$p"); done
(( children )) && tgt_args+=(--children)
(( kv_server )) || tgt_args+=(--no-kv-server)
tgt_args+=(--exclude $$)
targets() { ( cd "$HERE/.." && python3 -m tracing.targets "$@" ); }
matched="$out/matched.tsv"
if (( all )); then
	printf '# pid\tgroup\tcomm\twhy\tcmdline\n' > "$matched"
elif (( simple )); then
	{
		printf '# pid\tgroup\tcomm\twhy\tcmdline\n'
		for p in "${pids[@]}"; do
			printf '%s\t1\t%s\t--pid\t%s\n' "$p" "$(cat "/proc/$p/comm" 2>/dev/null)" \
				"$(tr '\0\t\n' '   ' < "/proc/$p/cmdline" 2>/dev/null)"
		done
	} > "$matched"
else
	targets resolve "${tgt_args[@]}" --out "$out" > /dev/null ||
		die "matching the targets failed (python3 -m tracing.targets)"
fi
n_matched=$(grep -vc '^#' "$matched" || true)
target_desc="$( (( all )) && echo all || echo "${names[*]+${names[*]}}${pids[*]+ pid ${pids[*]}}" | sed 's/^ //')"
if (( all )); then
	say "targets: every process"
elif (( n_matched == 0 )); then
	say "no process matches '$target_desc' yet; tracing what matches once it starts (rescanned each second)"
else
	say "targets: $n_matched process$( (( n_matched > 1 )) && echo es) matched by '$target_desc' (pid [instance] task: why: command line):"
	while IFS=$'\t' read -r p g c w cmd; do
		[[ "$p" == \#* ]] && continue
		say "  $p [$g] $c: $w: ${cmd:0:90}"
	done < "$matched"
fi
groups=$(awk -F'\t' '!/^#/ {print $2}' "$matched" | sort -un)
[[ -n "$groups" ]] || groups=1
if (( per_instance )) && [[ "$(echo "$groups" | wc -l)" -gt 1 ]]; then
	captures=$groups
else
	captures=0
	(( per_instance )) && say "--per-instance: one instance matched, one capture"
fi

# --- one capture per instance (or one of all) ------------------------------
ncpu="$(getconf _NPROCESSORS_CONF 2>/dev/null || nproc)"
if (( ncpu > 64 )); then
	say "WARNING: $ncpu CPUs: queue depth sums the first 64 CPUs' counters only"
	ncpu=64
fi
filter=$(( all ? 0 : 1 ))
# the watcher mails processes that match while tracing to every bpftrace;
# its pid is each script's MAILER, so it starts first (and waits for them)
mailer=0 watcher=""
traces=()
for g in $captures; do
	d="$out"; (( g == 0 )) || d="$out/group$g"
	mkdir -p "$d"
	traces+=("$d/trace.$( (( json )) && echo json || echo txt)")
done
if (( ! all && ! simple )); then
	watch_args=(); for t in "${traces[@]}"; do watch_args+=(--trace "$t"); done
	( cd "$HERE/.." && exec python3 -m tracing.targets watch "${tgt_args[@]}" --out "$out" "${watch_args[@]}" \
		--captures "$(echo $captures | tr ' ' ,)" ) &
	watcher=$! mailer=$watcher
fi

bt_pids=() k=0
for g in $captures; do
	d="$out"; (( g == 0 )) || d="$out/group$g"
	trace="${traces[$k]}"; k=$((k + 1))
	gen="$d/storage_latency_stack.gen.bt"
	# seeds: the matched pids of this capture (every group when combined)
	seeds="$(awk -F'\t' -v g="$g" '!/^#/ && (g == 0 || $2 == g) {printf "\t@traced[%d] = %d;\n", $1, $2}' "$matched")"$'\n'
	awk -v on="$on_list" -v seeds="$seeds" '
		BEGIN { n = split(on, a, " "); for (i = 1; i <= n; i++) keep[a[i]] = 1; depth = 0; skip = 0 }
		/^[[:space:]]*\/\/@layer / { depth++; if (!skip && !($2 in keep)) skip = depth; next }
		/^[[:space:]]*\/\/@end/ { if (skip == depth) skip = 0; depth--; next }
		/^[[:space:]]*\/\/@seed/ { if (!skip) printf "%s", seeds; next }
		{ if (!skip) print }
	' "$BT" > "$gen"
	{
		echo "layers_on:${on_list:- none}"
		echo "layers_off:${off_list:- none}"
		echo "kprobes: $kp"
		echo "filter: $target_desc$( (( g )) && echo " instance $g") dev $devname"
	} > "$d/layers.txt"
	(( k == 1 )) && while read -r l; do say "$l"; done < "$d/layers.txt"
	if (( json )); then
		printf '{"type": "kvtier_meta", "data": {"layers_on": "%s", "layers_off": "%s", "filter": "%s", "dev": "%s"}}\n' \
			"${on_list# }" "$(o="${off_list# }"; echo "${o:-none}")" "$target_desc$( (( g )) && echo " instance $g")" "$devname" > "$trace"
		fmt=(-f json)
	else
		sed 's/^/# kvtier /' "$d/layers.txt" > "$trace"
		fmt=()
	fi
	# bpftrace gets SIGINT from Ctrl-C (same process group) or from us at
	# the end of --duration; either way it runs END and prints its maps.
	bpftrace ${fmt[@]+"${fmt[@]}"} "$gen" "$filter" "$mailer" "$devt" "$region_gib" "$owned" "$ncpu" "$g" \
		>> "$trace" 2> "$d/bpftrace.stderr" &
	bt_pids+=($!)
done

# The kernel skips a BPF program that would run while another one runs on
# the same CPU (recursion guard); on kernels whose syscall tracepoints run
# preemptible, block events are lost this way. Count the skips, so the
# capture's health is known rather than guessed.
record_misses() {
	local f n=0 m k=0 g d
	for g in $captures; do
		d="$out"; (( g == 0 )) || d="$out/group$g"
		n=0
		for f in /proc/"${bt_pids[$k]}"/fdinfo/*; do
			m="$(sed -n 's/^recursion_misses:[[:space:]]*//p' "$f" 2>/dev/null || true)"
			if [[ "$m" =~ ^[0-9]+$ ]]; then n=$(( n + m )); fi
		done
		echo "$n" > "$d/missed_events"
		k=$((k + 1))
	done
}
# SIGINT, repeated: a first SIGINT has been seen to go unnoticed by
# bpftrace 0.17 now and then; END still runs on the second one.
interrupt() {
	record_misses
	local b alive
	kill -INT "${bt_pids[@]}" 2>/dev/null || true
	for _ in 1 2 3 4 5 6; do
		sleep 2
		alive=()
		for b in "${bt_pids[@]}"; do kill -0 "$b" 2>/dev/null && alive+=("$b"); done
		(( ${#alive[@]} )) || return 0
		kill -INT "${alive[@]}" 2>/dev/null || true
	done
	say "bpftrace ignores SIGINT; terminating it (no histograms)"
	kill -TERM "${bt_pids[@]}" 2>/dev/null || true
}
stopper=""
stop() { [[ -n "$stopper" ]] && return; ( interrupt ) & stopper=$!; }
trap stop INT TERM
timer=""
if [[ -n "$duration" ]]; then
	# the capture lasts S seconds from attach (attaching takes seconds on
	# a loaded machine), or from now when bpftrace never says it attached
	(
		for t in "${traces[@]}"; do
			for _ in $(seq 600); do
				grep -q 'Tracing storage I/O by layer' "$t" 2>/dev/null && break
				sleep 0.1
			done
		done
		sleep "$duration"; interrupt
	) & timer=$!
fi
say "tracing $target_desc on $devname into ${traces[*]}$([[ -n $duration ]] && echo " for ${duration}s" || echo "; Ctrl-C to end")"
rc=0 k=0
for b in "${bt_pids[@]}"; do
	r=0
	while kill -0 "$b" 2>/dev/null; do
		wait "$b" && r=0 || r=$?
	done
	[[ $r -eq 0 || $r -eq 130 ]] || rc=$r
done
for p in $timer $stopper $watcher; do kill "$p" 2>/dev/null || true; done
[[ -z "$watcher" ]] || wait "$watcher" 2>/dev/null || true
trap - INT TERM
k=0
for g in $captures; do
	d="$out"; (( g == 0 )) || d="$out/group$g"
	trace="${traces[$k]}"; k=$((k + 1))
	grep -v 'RLIMIT_MEMLOCK' "$d/bpftrace.stderr" >&2 || true
	missed="$(cat "$d/missed_events" 2>/dev/null || echo unknown)"
	echo "missed_events: $missed" >> "$d/layers.txt"
	if (( json )); then
		printf '{"type": "kvtier_meta", "data": {"missed_events": "%s"}}\n' "$missed" >> "$trace"
	else
		echo "# kvtier missed_events: $missed" >> "$trace"
	fi
	if [[ "$missed" =~ ^[0-9]+$ && "$missed" -gt 0 ]]; then
		say "WARNING: the kernel skipped $missed probe runs (BPF recursion guard): counts are low and queue depth may drift; --no-syscalls keeps the block layer whole"
	fi
done
# what the capture does not show, one line each: completions the probes
# lost, file bytes the page cache kept from the block layer
if command -v python3 >/dev/null 2>&1; then
	for t in "${traces[@]}"; do
		( cd "$HERE/.." && python3 -m tracing.report "$t" --health 2>/dev/null ) |
			while read -r l; do say "$l"; done || true
	done
fi
n_now=$(grep -vc '^#' "$matched" || true)
(( all )) || say "traced $n_now process$( (( n_now == 1 )) || echo es) (matched.tsv), $((n_now - n_matched)) of them found while tracing"
# A tracer run with sudo leaves its output to the user who asked for it:
# the folder when it made it, else only the files it wrote (never what was
# there before, never through a link)
chown_out() {
	[[ -n "${SUDO_UID:-}" && -n "${SUDO_GID:-}" ]] || return 0
	if (( created_out )); then
		chown -R -P "$SUDO_UID:$SUDO_GID" "$out" 2>/dev/null || true
		return 0
	fi
	local f
	for f in "$out"/{trace.txt,trace.json,layers.txt,matched.tsv,missed_events,bpftrace.stderr,storage_latency_stack.gen.bt,job.fio,histograms.json} "$out"/group*; do
		[[ -e "$f" && ! -L "$f" ]] && chown -R -P "$SUDO_UID:$SUDO_GID" "$f" 2>/dev/null
	done
	return 0
}
# 130 = ended by SIGINT, which is how every capture ends
if [[ $rc -ne 0 ]]; then
	say "bpftrace failed (exit $rc); see $out/bpftrace.stderr"
	chown_out
	exit "$rc"
fi

if (( json )) || (( want_fio )); then
	k=0
	for g in $captures; do
		d="$out"; (( g == 0 )) || d="$out/group$g"
		trace="${traces[$k]}"; k=$((k + 1))
		name="${names[0]:-pid${pids[0]:-all}}"
		(( g == 0 )) || name="$name-instance$g"
		( cd "$HERE/.." && python3 -m tracing.distill -i "$trace" \
			$( (( json )) && echo "--dump-json $d/histograms.json" ) \
			$( (( want_fio )) && echo "-o $d/job.fio" ) \
			--process "$name" ) ||
			say "distilling failed; the raw trace is in $trace"
	done
fi
chown_out
say "done: $out"
