#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one Debian 12 machine, for hpcppo's tests and demos:
# two emulated compute nodes (n1, n2, one slurmd each), a controller, accounting through slurmdbd
# and a private MariaDB (so `sacct` works as on a real site), and munge.
#
# GPU-shaped partitions without GPUs: four more emulated nodes declare the example GPU sites' hardware
# (128 CPUs, 1-2 TB, 8 GPUs each) under SlurmdParameters=config_overrides; their GPUs are character devices
# with /dev/null's numbers in $STATE_DIR/dev (gres.conf needs File=: with Count= alone slurmd reports 0 GPUs
# and the node goes INVALID). Slurm allocates them and sets CUDA_VISIBLE_DEVICES; the work runs on the CPU.
#   debug   n1,n2  default partition, the real hardware (sites/local-slurm.toml)
#   gpu     g1,g2  like sites/a100-cluster.toml: Feature=a100, Gres=gpu:a100:8, AllowAccounts=proj-rlhf,
#                  AllowQos=normal, MaxTime=2-00:00:00 (also sites/local-slurm-gpu.toml)
#   hopper  h1,h2  like sites/h100-cluster.toml: Gres=gpu:h100:8, AllowAccounts=rl-team, AllowQos=high,
#                  MaxTime=1-00:00:00
# start creates the QOS "high" and the accounts proj-rlhf and rl-team (root a member) in the accounting
# database; EnforcePartLimits=ALL makes sbatch (and sbatch --test-only) refuse what a partition does not allow.
# docs/slurm-dev.md describes the partitions and tests/slurm/test_gpu_shaped.py what is checked on them.
#
# Usage (as root):  tools/slurm-dev-cluster.sh start|stop|status|accounting-off|accounting-on
#
#   start           install missing packages, configure, start what is not running, wait until all six
#                   nodes respond (idle, or busy with someone's jobs) and sacct works, print a summary.
#                   Idempotent and quick when up (1-3 s); restarts slurmctld/slurmd only when slurm.conf
#                   or gres.conf changed.
#   stop            stop the daemons this script started (found by their pid files, never by name).
#   status          print what runs; exit 0 only when the cluster is usable (nodes up, sacct works).
#   accounting-off  stop slurmdbd and MariaDB only (tests check sacct's no-accounting fallback).
#   accounting-on   start them again.
#
# All state (config copies, logs, spool, pid files, the MariaDB datadir) lives in one directory,
# ${HPCPPO_DEV_CLUSTER_DIR:-/var/tmp/hpcppo-dev-cluster}. slurm.conf and slurmdbd.conf are written to
# /etc/slurm, where every Slurm client looks by default, so nothing needs SLURM_CONF.
# start/stop/accounting-* serialise on ${HPCPPO_DEV_CLUSTER_DIR}.lock (several test sessions share one
# cluster). Environment: HPCPPO_DEV_CLUSTER_TIMEOUT (seconds to wait for the nodes, default 90),
# HPCPPO_DEV_CLUSTER_FORCE=1 (replace a slurm.conf this script did not write).
set -euo pipefail

STATE_DIR=${HPCPPO_DEV_CLUSTER_DIR:-/var/tmp/hpcppo-dev-cluster}
CLUSTER_NAME=hpcppo
PARTITION=debug
NODES=(n1 n2)
GPU_NODES=(g1 g2 h1 h2) # GPU-shaped; see the header
NODE_PORT_BASE=17000    # the K-th node of NODES then GPU_NODES (from 1) listens on 17000+K
CTLD_PORT=16817      # not the default 6817/6819, so a site install on the same box cannot clash
DBD_PORT=16819
ETC_DIR=/etc/slurm
SLURM_CONF_PATH=$ETC_DIR/slurm.conf
GRES_CONF_PATH=$ETC_DIR/gres.conf
DBD_CONF_PATH=$ETC_DIR/slurmdbd.conf
MARKER="# Managed by hpcppo tools/slurm-dev-cluster.sh; rewritten on every start."
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
READY_TIMEOUT_S=${HPCPPO_DEV_CLUSTER_TIMEOUT:-90}

RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/log
MUNGE_DIR=$STATE_DIR/munge # owned by the munge user: munged writes its pid and log here
DB_DIR=$STATE_DIR/mariadb
DB_DATA=$DB_DIR/data
DB_SOCK=$DB_DIR/mysqld.sock
DB_PIDFILE=$DB_DIR/mariadbd.pid
DB_PASSFILE=$STATE_DIR/etc/slurmdbd-db-password
DEV_DIR=$STATE_DIR/dev # the fake GPUs: nvidia0..7, character devices 1:3 like /dev/null
MUNGE_PIDFILE=$MUNGE_DIR/munged.pid
CTLD_PIDFILE=$RUN_DIR/slurmctld.pid
DBD_PIDFILE=$RUN_DIR/slurmdbd.pid

log() { printf '[slurm-dev-cluster] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

require_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and writes /etc/slurm)"
}

short_hostname() {
    local h
    h=$(uname -n)
    printf '%s\n' "${h%%.*}"
}

# ---------------------------------------------------------------------------------------------
# Packages

ensure_packages() {
    local missing=() pkg created_policy=0
    for pkg in "${PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]} == 0)) && return 0
    log "installing ${missing[*]}"
    # Package scripts would start the services with their own configs: forbid that for the install.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    } >"/tmp/hpcppo-slurm-apt.$$.log" 2>&1 || rc=$?
    ((created_policy)) && rm -f /usr/sbin/policy-rc.d
    if ((rc != 0)); then
        tail -n 30 "/tmp/hpcppo-slurm-apt.$$.log" >&2
        die "apt-get failed (exit $rc); full log in /tmp/hpcppo-slurm-apt.$$.log"
    fi
    rm -f "/tmp/hpcppo-slurm-apt.$$.log"
}

# ---------------------------------------------------------------------------------------------
# Processes: found by pid file, checked by /proc (a daemon can linger as a zombie after exit)

# pid_of PIDFILE COMM: print the pid if the file names a live (non-zombie) process called COMM.
pid_of() {
    local file=$1 comm=$2 pid state name
    # The daemon may remove its pid file while we read it: treat that as "not running".
    pid=$(tr -dc '0-9' 2>/dev/null <"$file") || return 1
    [[ -n $pid && -r /proc/$pid/status ]] || return 1
    name=$(awk '/^Name:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || return 1
    state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || return 1
    # A stale pid file whose pid was reused by another program must never be signalled.
    [[ $name == "$comm" && $state != Z ]] || return 1
    printf '%s\n' "$pid"
}

is_running() { pid_of "$1" "$2" >/dev/null; }

# stop_pidfile PIDFILE COMM LABEL: TERM, wait up to 30 s, then KILL.
stop_pidfile() {
    local file=$1 comm=$2 label=$3 pid i
    if ! pid=$(pid_of "$file" "$comm"); then
        rm -f "$file"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        is_running "$file" "$comm" || break
        sleep 0.1
    done
    if is_running "$file" "$comm"; then
        log "$label (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$file"
    log "stopped $label (pid $pid)"
}

# wait_for DESCRIPTION TIMEOUT_S COMMAND...: poll every 0.2 s until COMMAND succeeds.
wait_for() {
    local what=$1 timeout=$2 i
    shift 2
    for ((i = 0; i < timeout * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    log "timed out after ${timeout}s waiting for $what"
    return 1
}

# ---------------------------------------------------------------------------------------------
# Configuration

# write_if_changed PATH MODE: write stdin to PATH atomically; exit 0 if the content changed.
write_if_changed() {
    local path=$1 mode=$2 tmp
    tmp=$(mktemp "$path.tmp.XXXXXX")
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        chmod "$mode" "$path"
        return 1
    fi
    mv -f "$tmp" "$path"
    return 0
}

# A slurm.conf we did not write belongs to someone else: never overwrite it silently.
check_foreign_conf() {
    local path=$1
    if [[ -f $path ]] && ! grep -qxF "$MARKER" "$path"; then
        if [[ ${HPCPPO_DEV_CLUSTER_FORCE:-0} == 1 ]]; then
            cp -p "$path" "$STATE_DIR/etc/$(basename "$path").orig"
            log "replacing foreign $path (saved to $STATE_DIR/etc/)"
        else
            die "$path exists and was not written by this script; set HPCPPO_DEV_CLUSTER_FORCE=1 to replace it (a copy is kept in $STATE_DIR/etc/)"
        fi
    fi
}

hardware_line() {
    # `slurmd -C` prints "NodeName=host CPUs=.. Boards=.. ... RealMemory=.."; keep all but the name.
    local line
    line=$(slurmd -C 2>/dev/null | head -n 1) || true
    [[ $line == NodeName=* ]] || die "slurmd -C printed no hardware line"
    printf '%s\n' "${line#* }"
}

render_slurm_conf() {
    local host=$1 hw=$2 i node
    cat <<EOF
$MARKER
# Local dev cluster: ${#NODES[@]} emulated nodes on $host. State in $STATE_DIR.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$STATE_DIR/slurmctld
SlurmctldPidFile=$CTLD_PIDFILE
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdSpoolDir=$STATE_DIR/slurmd-%n
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Fast turnaround for tests: short kill wait, scheduling right after submit, frequent backfill.
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# The GPU-shaped nodes declare more than this machine has; their GPUs are listed in gres.conf.
SlurmdParameters=config_overrides
GresTypes=gpu
# Refuse at submission a job its partition would never run (MaxTime, AllowAccounts, AllowQos...), as
# production sites do; with NO such a job is accepted and pends forever, and sbatch --test-only says yes.
EnforcePartLimits=ALL
# GPUs in sacct's AllocTRES (gres/gpu=16), as GPU sites account them.
AccountingStorageTRES=gres/gpu
EOF
    for i in "${!NODES[@]}"; do
        node=${NODES[$i]}
        printf 'NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d %s State=UNKNOWN\n' \
            "$node" "$host" $((NODE_PORT_BASE + i + 1)) "$hw"
    done
    # GPU-shaped nodes: declared hardware, not this machine's (config_overrides); sized so that the
    # a100 site's 8 x 12 CPUs and 8 x 120G and the h100 site's 8 x 16 CPUs and 8 x 200G fit one node.
    local gpu_hw='CPUs=128 Boards=1 SocketsPerBoard=2 CoresPerSocket=64 ThreadsPerCore=1'
    for i in "${!GPU_NODES[@]}"; do
        node=${GPU_NODES[$i]}
        printf 'NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d %s %s State=UNKNOWN\n' \
            "$node" "$host" $((NODE_PORT_BASE + ${#NODES[@]} + i + 1)) "$gpu_hw" "$(gpu_node_shape "$node")"
    done
    local IFS=,
    printf 'PartitionName=%s Nodes=%s Default=YES MaxTime=02:00:00 DefaultTime=01:00:00 State=UP\n' \
        "$PARTITION" "${NODES[*]}"
    echo 'PartitionName=gpu Nodes=g1,g2 Default=NO MaxTime=2-00:00:00 DefaultTime=01:00:00 AllowAccounts=proj-rlhf AllowQos=normal State=UP'
    echo 'PartitionName=hopper Nodes=h1,h2 Default=NO MaxTime=1-00:00:00 DefaultTime=01:00:00 AllowAccounts=rl-team AllowQos=high State=UP'
}

# gpu_node_shape NODE: the node's memory, features and GRES (the example GPU sites' hardware).
gpu_node_shape() {
    case $1 in
    g*) echo 'RealMemory=1031000 Feature=a100 Gres=gpu:a100:8' ;; # 1 TB, 8x A100 (a DGX A100)
    h*) echo 'RealMemory=2063000 Gres=gpu:h100:8' ;;              # 2 TB, 8x H100 (a DGX H100)
    esac
}

render_gres_conf() {
    cat <<EOF
$MARKER
# The GPU-shaped nodes' GPUs: character devices with /dev/null's numbers (see the header of the script).
NodeName=g[1-2] Name=gpu Type=a100 File=$DEV_DIR/nvidia[0-7]
NodeName=h[1-2] Name=gpu Type=h100 File=$DEV_DIR/nvidia[0-7]
EOF
}

ensure_fake_gpus() {
    local i dev
    mkdir -p "$DEV_DIR"
    for i in 0 1 2 3 4 5 6 7; do
        dev=$DEV_DIR/nvidia$i
        [[ -c $dev ]] && continue
        rm -f "$dev"
        mknod -m 0666 "$dev" c 1 3 || die "mknod $dev failed (the GPU-shaped nodes need character devices)"
    done
}

render_dbd_conf() {
    cat <<EOF
$MARKER
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$DBD_PIDFILE
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$(cat "$DB_PASSFILE")
StorageLoc=slurm_acct_db
EOF
}

ensure_hosts() {
    # Jobs rendezvous at MASTER_ADDR=n1, and SlurmctldHost must resolve: map them to 127.0.0.1.
    # /etc/hosts may be a bind mount, so append in place instead of replacing the file.
    local name
    for name in "$@"; do
        if ! awk -v n="$name" '!/^[[:space:]]*#/ { for (i = 2; i <= NF; i++) if ($i == n) f = 1 } END { exit !f }' /etc/hosts; then
            printf '127.0.0.1 %s\n' "$name" >>/etc/hosts
            log "added $name to /etc/hosts"
        fi
    done
}

# Render the config files; print "slurm" (slurm.conf or gres.conf) and/or "dbd" for each that changed.
configure() {
    local host hw changed=()
    host=$(short_hostname)
    mkdir -p "$STATE_DIR/etc" "$RUN_DIR" "$LOG_DIR" "$STATE_DIR/slurmctld" "$ETC_DIR"
    chmod 0755 "$STATE_DIR"
    ensure_hosts "$host" "${NODES[@]}" "${GPU_NODES[@]}"
    ensure_fake_gpus
    if [[ ! -s $DB_PASSFILE ]]; then
        (umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$DB_PASSFILE")
    fi
    check_foreign_conf "$SLURM_CONF_PATH"
    check_foreign_conf "$DBD_CONF_PATH"
    check_foreign_conf "$GRES_CONF_PATH"
    hw=$(hardware_line)
    if render_slurm_conf "$host" "$hw" | write_if_changed "$SLURM_CONF_PATH" 0644; then
        changed+=(slurm)
    fi
    # A GRES change needs slurmctld and the slurmd restarted, like slurm.conf's (scontrol reconfigure is not enough).
    if render_gres_conf | write_if_changed "$GRES_CONF_PATH" 0644; then
        changed+=(slurm)
    fi
    # slurmdbd refuses a slurmdbd.conf readable by others (it holds the database password).
    if render_dbd_conf | write_if_changed "$DBD_CONF_PATH" 0600; then
        changed+=(dbd)
    fi
    cp -p "$SLURM_CONF_PATH" "$DBD_CONF_PATH" "$GRES_CONF_PATH" "$STATE_DIR/etc/"
    printf '%s\n' "${changed[@]}"
}

# ---------------------------------------------------------------------------------------------
# Daemons

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    # A munged that someone else started (e.g. the host's service) is fine: use it, never stop it.
    munge_works && return 0
    mkdir -p "$MUNGE_DIR" /run/munge
    chown munge:munge "$MUNGE_DIR" /run/munge
    chmod 0700 "$MUNGE_DIR"
    chmod 0755 /run/munge
    runuser -u munge -- munged --pid-file="$MUNGE_PIDFILE" --log-file="$MUNGE_DIR/munged.log" 9>&-
    wait_for munged 10 munge_works || die "munged did not come up; see $MUNGE_DIR/munged.log"
    log "started munged"
}

start_mariadb() {
    is_running "$DB_PIDFILE" mariadbd && return 0
    mkdir -p "$DB_DIR"
    chown mysql:mysql "$DB_DIR"
    if [[ ! -d $DB_DATA/mysql ]]; then
        rm -rf "$DB_DATA"
        mariadb-install-db --no-defaults --datadir="$DB_DATA" --user=mysql \
            --auth-root-authentication-method=socket --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed; see $LOG_DIR/mariadb-install.log"
    fi
    rm -f "$DB_SOCK"
    # Socket only (skip-networking): nothing outside this machine can reach the accounting database.
    setsid mariadbd --no-defaults --datadir="$DB_DATA" --socket="$DB_SOCK" --pid-file="$DB_PIDFILE" \
        --skip-networking --user=mysql --log-error="$LOG_DIR/mariadb.log" \
        --innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >>"$LOG_DIR/mariadb.log" 2>&1 9>&- &
    wait_for mariadb 30 mariadb-admin --no-defaults --socket="$DB_SOCK" -u root ping ||
        die "MariaDB did not come up; see $LOG_DIR/mariadb.log"
    local pw
    pw=$(cat "$DB_PASSFILE")
    mariadb --no-defaults --socket="$DB_SOCK" -u root <<EOF || die "could not create the accounting database"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
    log "started MariaDB"
}

sacctmgr_works() { sacctmgr -n -P show cluster format=cluster; }

start_slurmdbd() {
    if ! is_running "$DBD_PIDFILE" slurmdbd; then
        # libmariadb honours MYSQL_UNIX_PORT: that points slurmdbd at our private socket.
        MYSQL_UNIX_PORT=$DB_SOCK slurmdbd 9>&-
        log "started slurmdbd"
    fi
    wait_for slurmdbd 30 sacctmgr_works || die "slurmdbd does not answer; see $LOG_DIR/slurmdbd.log"
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
        log "registered cluster $CLUSTER_NAME in the accounting database"
    fi
    # The GPU-shaped partitions allow the example sites' accounts and QOS only: create them, with root a
    # member of both accounts (without an association Slurm swaps a job's account for the user's default,
    # root, which AllowAccounts then refuses). slurmctld resolves AllowQos names in the database.
    if ! sacctmgr -n -P show qos format=name | grep -qx high; then
        sacctmgr -i add qos high >/dev/null
        log "created QOS high in the accounting database"
    fi
    local account
    for account in proj-rlhf rl-team; do
        if ! sacctmgr -n -P show assoc cluster="$CLUSTER_NAME" user=root account="$account" format=account | grep -qx "$account"; then
            sacctmgr -i add account "$account" cluster="$CLUSTER_NAME" >/dev/null 2>&1 || true # may exist already
            sacctmgr -i add user root account="$account" cluster="$CLUSTER_NAME" >/dev/null
            log "created account $account (user root) in the accounting database"
        fi
    done
}

start_accounting() {
    start_mariadb
    start_slurmdbd
}

stop_accounting() {
    stop_pidfile "$DBD_PIDFILE" slurmdbd slurmdbd
    stop_pidfile "$DB_PIDFILE" mariadbd MariaDB
}

start_slurm() {
    local node
    if ! is_running "$CTLD_PIDFILE" slurmctld; then
        slurmctld 9>&-
        log "started slurmctld"
    fi
    for node in "${NODES[@]}" "${GPU_NODES[@]}"; do
        mkdir -p "$STATE_DIR/slurmd-$node"
        if ! is_running "$RUN_DIR/slurmd-$node.pid" slurmd; then
            slurmd -N "$node" 9>&-
            log "started slurmd $node"
        fi
    done
}

stop_slurm() {
    local node
    for node in "${NODES[@]}" "${GPU_NODES[@]}"; do
        stop_pidfile "$RUN_DIR/slurmd-$node.pid" slurmd "slurmd $node"
    done
    stop_pidfile "$CTLD_PIDFILE" slurmctld slurmctld
}

# Short node states from sinfo, one "name state" per line ("idle", "alloc", "mix", "idle*", "down"...),
# for the nodes of every partition.
node_states() { sinfo -h -N -o '%N %t' | sort -u; }

nodes_ready() {
    local states node st
    states=$(node_states 2>/dev/null) || return 1
    for node in "${NODES[@]}" "${GPU_NODES[@]}"; do
        st=$(awk -v n="$node" '$1 == n {print $2}' <<<"$states")
        case $st in idle | alloc | mix | comp) ;; *) return 1 ;; esac
    done
}

resume_stuck_nodes() {
    # A node left drained/down by an earlier run (e.g. killed mid-job) would never become idle.
    local node st
    while read -r node st; do
        # inval: a node whose GRES its slurmd reported short (e.g. started before the fake devices existed).
        case $st in drain | drng | down | fail | failg | inval)
            scontrol update NodeName="$node" State=RESUME 2>/dev/null && log "resumed node $node (was $st)"
            ;;
        esac
    done < <(node_states 2>/dev/null || true)
}

sacct_works() { sacct -n -X -S now -o JobID; }

wait_ready() {
    local i
    for ((i = 0; i < READY_TIMEOUT_S * 5; i++)); do
        nodes_ready && break
        ((i % 25 == 24)) && resume_stuck_nodes
        sleep 0.2
    done
    nodes_ready || {
        node_states >&2 || true
        die "nodes did not become ready within ${READY_TIMEOUT_S}s; see $LOG_DIR/"
    }
    wait_for sacct 30 sacct_works || die "sacct does not work; see $LOG_DIR/slurmdbd.log"
}

summary() {
    printf 'Slurm dev cluster "%s" (state in %s, config %s)\n' "$CLUSTER_NAME" "$STATE_DIR" "$SLURM_CONF_PATH"
    sinfo -N -o '%10N %10P %8t %5c %10m %8f %G' 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
# Commands

cmd_start() {
    local t0=$SECONDS changed
    ensure_packages
    changed=$(configure)
    start_munge
    if [[ $changed == *dbd* ]] && is_running "$DBD_PIDFILE" slurmdbd; then
        log "slurmdbd.conf changed: restarting slurmdbd"
        stop_pidfile "$DBD_PIDFILE" slurmdbd slurmdbd
    fi
    start_accounting
    if [[ $changed == *slurm* ]] && is_running "$CTLD_PIDFILE" slurmctld; then
        log "slurm.conf changed: restarting slurmctld and slurmd"
        stop_slurm
    fi
    start_slurm
    wait_ready
    summary
    log "ready in $((SECONDS - t0)) s"
}

cmd_stop() {
    stop_slurm
    stop_accounting
    # Only a munged we started has its pid file here; a system one is left alone.
    stop_pidfile "$MUNGE_PIDFILE" munged munged
}

cmd_status() {
    local ok=0 node pid
    report() { # LABEL PIDFILE COMM
        if pid=$(pid_of "$2" "$3"); then
            printf '  %-12s running (pid %s)\n' "$1" "$pid"
        else
            printf '  %-12s not running\n' "$1"
            ok=1
        fi
    }
    printf 'Slurm dev cluster (state in %s)\n' "$STATE_DIR"
    if munge_works; then printf '  %-12s working\n' munge; else
        printf '  %-12s not working\n' munge
        ok=1
    fi
    report mariadb "$DB_PIDFILE" mariadbd
    report slurmdbd "$DBD_PIDFILE" slurmdbd
    report slurmctld "$CTLD_PIDFILE" slurmctld
    for node in "${NODES[@]}" "${GPU_NODES[@]}"; do
        report "slurmd $node" "$RUN_DIR/slurmd-$node.pid" slurmd
    done
    if nodes_ready; then printf '  %-12s ready\n' nodes; else
        printf '  %-12s not ready\n' nodes
        ok=1
    fi
    if sacct_works >/dev/null 2>&1; then printf '  %-12s working\n' sacct; else
        printf '  %-12s not working\n' sacct
        ok=1
    fi
    node_states 2>/dev/null | sed 's/^/    /' || true
    if ((ok == 0)); then echo "usable: yes"; else echo "usable: no"; fi
    return "$ok"
}

# Several test sessions may call start/stop at once: one at a time, or daemons would start twice.
# Every daemon is started with fd 9 closed (9>&-): a daemon inheriting it would hold the lock forever.
take_lock() {
    require_root
    local lock=${STATE_DIR%/}.lock
    exec 9>>"$lock"
    flock -w 300 9 || die "another $0 holds $lock for more than 300 s"
}

main() {
    local cmd=${1:-}
    case $cmd in
    start) take_lock && cmd_start ;;
    stop) take_lock && cmd_stop ;;
    status) cmd_status ;;
    accounting-off) take_lock && stop_accounting ;;
    accounting-on)
        take_lock
        start_accounting
        wait_for sacct 30 sacct_works || die "sacct does not work; see $LOG_DIR/slurmdbd.log"
        ;;
    *)
        echo "usage: $0 start|stop|status|accounting-off|accounting-on" >&2
        exit 2
        ;;
    esac
}

main "$@"
