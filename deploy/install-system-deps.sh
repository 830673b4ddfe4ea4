#!/usr/bin/env bash
# Debian packages the tests use for real: fio (reference I/O), bpftrace (tracing), redis-server (shared tier),
# sysstat (iostat), openmpi-bin/libopenmpi-dev (mpirun for the multi-host bench tests; mpi4py builds against it when
# no wheel fits), fuse3 (fusermount3 and libfuse3 for kvtier throttlefs), sudo (a user's
# `kvtier bench --enable-latency-tracing` starts only the tracer as root through `sudo -n`), glusterfs-server and
# glusterfs-client (deploy/glusterfs.sh: a GlusterFS volume as the shared tier, and its tests), strace (the tests
# that watch the write path's system calls: the directory fsync before a put is acknowledged), prometheus (promtool
# and `run-stack.sh up --prometheus`: the stack's metrics scraped, its recording rules), chromium and chromium-driver (the HTML
# report's test loads each report in a headless browser through selenium), ceph-mon, ceph-mgr, ceph-osd, radosgw and
# ceph-common (deploy/ceph.py: a Ceph cluster with radosgw, the S3 tier's tests), ceph-mds and ceph-fuse (its
# CephFS, mounted with ceph-fuse), s3fs (its bucket as a POSIX directory: the MLPerf rules' object-storage gateway),
# munge, slurmctld, slurmd and slurm-client (deploy/slurm.py: Slurm over the namespace nodes, sbatch/srun jobs).
# Installs only what is
# missing; needs root for that, otherwise says what to install.
set -euo pipefail
want=(fio bpftrace redis-server sysstat openmpi-bin libopenmpi-dev fuse3 sudo glusterfs-server glusterfs-client strace
      prometheus chromium chromium-driver ceph-mon ceph-mgr ceph-osd radosgw ceph-common
      ceph-mds ceph-fuse s3fs munge slurmctld slurmd slurm-client)
missing=()
for pkg in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "kvtier: missing Debian packages: ${missing[*]} (run: sudo apt-get install ${missing[*]}); tests needing them will skip" >&2
    exit 0
fi
echo "kvtier: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
