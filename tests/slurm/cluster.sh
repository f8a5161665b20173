#!/usr/bin/env bash
# A real one-node Slurm on this machine for the test suite (Debian 12's Slurm 22.05 with accounting):
#   bash tests/slurm/cluster.sh install|start|stop|status|up|env (up = install + start; install and start need root)
# Everything lives in one state directory, $ARITHMECH_SLURM_DIR (default /var/lib/arithmech-slurm): the configs
# written from the templates next to this script, munge's key and socket, the database, spool, logs, PID files.
# Its configs are code to every Slurm client, root writes and chowns in it and `stop` kills by its PID files: it
# must be root's alone, so every command refuses a state directory that is not root's, is writable by anyone
# else, or lies under a directory that another user could change (`state_problem`). Root-owned /var/lib (not a
# name in /tmp, which anyone could create first) and on disk (the database is ~100 MB; /run is often a small tmpfs).
# Clients need only SLURM_CONF: `eval "$(bash tests/slurm/cluster.sh env)"` exports it (and the account and
# partitions), after checking the state directory and that the cluster is up; the pytest fixture reads the same.
# The cluster: node `localhost` with this machine's CPUs, RealMemory below its memory, 2 GPUs as a GRES (device
# files are symlinks to /dev/null), partitions `gpu` (default) and `cpu`, account `proj42` (root's default, and
# $SUDO_USER's) and account `other`, which no user may use. The daemons listen on 0.0.0.0:6817-6819 (Slurm 22.05
# has no bind option) and mariadb on 127.0.0.1:$DB_PORT; `stop` ends every process this script started, by PID.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEFAULT_STATE=/var/lib/arithmech-slurm
LEGACY_STATE=/tmp/arithmech-slurm # earlier versions' default: daemons root started from there are stopped (below)
STATE="${ARITHMECH_SLURM_DIR:-$DEFAULT_STATE}"
DB_PORT="${ARITHMECH_SLURM_DB_PORT:-6820}"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd) # in start order
NODE=localhost
ACCOUNT=proj42
OTHER_ACCOUNT=other
CAPPED_QOS=submit1 # a QOS that holds one job of a user at a time: sbatch refuses the second
MAX_REAL_MEMORY_MB=8000 # jobs get room, and leave the rest of the machine alone
export SLURM_CONF="$STATE/etc/slurm.conf"

say() { echo "cluster.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

# --- the state directory: root's alone --------------------------------------------------------------------------

state_problem() { # state_problem DIR: print why DIR cannot hold this cluster's state (nothing: it can)
    local dir="$1" path="" part uid mode
    local -a parts paths=(/)
    [[ "$dir" == /* ]] || { echo "$dir is not an absolute path"; return; }
    IFS=/ read -ra parts <<<"${dir#/}"
    for part in "${parts[@]}"; do
        case "$part" in "") continue ;; . | ..) echo "$dir is not a normalised path"; return ;; esac
        path="$path/$part"
        paths+=("$path")
    done
    for path in "${paths[@]}"; do
        if [ -L "$path" ]; then echo "$path is a symlink"; return; fi
        [ -e "$path" ] || return 0 # the rest does not exist yet: root creates it (cmd_start), then checks again
        [ -d "$path" ] || { echo "$path is not a directory"; return; }
        read -r uid mode < <(stat -c '%u %a' "$path")
        [ "$uid" = 0 ] || { echo "$path is owned by uid $uid, not by root"; return; }
        # group- or world-writable: refused, but for a parent with the sticky bit (/tmp: no one may rename or
        # remove another's entry there)
        if ((8#$mode & 8#022)) && { [ "$path" = "${paths[-1]}" ] || ! ((8#$mode & 8#1000)); }; then
            echo "$path is writable by group or others (mode $mode)"
            return
        fi
    done
}

check_state() { # check_state DIR: die unless DIR can hold the state
    local problem
    problem="$(state_problem "$1")"
    [ -z "$problem" ] || die "refusing the state directory $1: $problem. It must be root's alone, and every" \
        "directory above it root's and writable by no one else (unless sticky): remove it, or set" \
        "ARITHMECH_SLURM_DIR to another path"
}

use_state() { # use_state DIR: the commands below act on the cluster whose state is in DIR
    STATE="$1"
    export SLURM_CONF="$STATE/etc/slurm.conf"
}

need_root() {
    [ "$(id -u)" = 0 ] || die "'$1' needs root (it $2); run: sudo bash tests/slurm/cluster.sh $1"
}

installed() {
    local p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
    done
}

cmd_install() {
    if installed; then say "packages already installed: ${PACKAGES[*]}"; return; fi
    need_root install "installs the Debian packages ${PACKAGES[*]}"
    command -v apt-get >/dev/null || die "apt-get not found: install ${PACKAGES[*]} (Slurm with slurmdbd) by hand"
    say "installing ${PACKAGES[*]}"
    apt-get update -qq
    # where no policy-rc.d holds them back, the system's own munge and mariadb services start too: they use the
    # default socket and port, apart from this cluster's
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

# --- processes -----------------------------------------------------------------------------------------------

alive() { # a process that exited but was not reaped yet (a zombie) is not alive
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    [ "$(echo "${stat##*) }" | cut -d' ' -f1)" != Z ]
}

pid_of() { # the live PID recorded in a PID file, or nothing
    local pid
    [ -s "$1" ] || return 1
    pid="$(tr -dc 0-9 <"$1")"
    [ -n "$pid" ] && alive "$pid" && echo "$pid"
}

running() { pid_of "$(pidfile "$1")" >/dev/null; }

pidfile() {
    case "$1" in
        munged) echo "$STATE/munge/munged.pid" ;;
        mariadbd) echo "$STATE/mysql/mysqld.pid" ;;
        *) echo "$STATE/run/$1.pid" ;;
    esac
}

logfile() { echo "$STATE/log/$1.log"; }

wait_for() { # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
    local deadline=$((SECONDS + $1)) what="$2"
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            say "timed out waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

fail_with_log() { # fail_with_log DAEMON MESSAGE
    say "error: $2; the last lines of $(logfile "$1"):"
    tail -n 20 "$(logfile "$1")" >&2 2>/dev/null || true
    exit 1
}

stop_pid() { # stop_pid NAME PID: SIGTERM, then SIGKILL after 20 s
    local name="$1" pid="$2" i
    kill "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        alive "$pid" || { say "stopped $name (pid $pid)"; return 0; }
        sleep 0.2
    done
    say "$name (pid $pid) ignored SIGTERM for 20 s: killing it"
    kill -9 "$pid" 2>/dev/null || true
}

stop_daemon() {
    local pid
    if pid="$(pid_of "$(pidfile "$1")")"; then stop_pid "$1" "$pid"; fi
    rm -f "$(pidfile "$1")"
}

# --- configuration -------------------------------------------------------------------------------------------

render() { # render TEMPLATE DEST: fill in the @NAME@ placeholders
    sed -e "s|@STATE@|$STATE|g" -e "s|@CPUS@|$CPUS|g" -e "s|@REAL_MEMORY@|$REAL_MEMORY|g" \
        -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g" -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@DB_PASS@|$DB_PASS|g" \
        "$HERE/$1" >"$2.tmp"
    mv "$2.tmp" "$2"
}

write_configs() {
    local total_mb
    CPUS="$(nproc)"
    total_mb="$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
    REAL_MEMORY=$((total_mb * 3 / 4 < MAX_REAL_MEMORY_MB ? total_mb * 3 / 4 : MAX_REAL_MEMORY_MB))
    DEF_MEM_PER_CPU=$((REAL_MEMORY / CPUS / 2)) # a job without --mem leaves room for another
    mkdir -p "$STATE"/{etc,run,log,dev,spool/slurmctld,spool/slurmd,munge,mysql}
    chmod 755 "$STATE" "$STATE/etc"
    [ -s "$STATE/etc/db-password" ] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$STATE/etc/db-password")
    DB_PASS="$(cat "$STATE/etc/db-password")"
    render slurm.conf.in "$STATE/etc/slurm.conf"
    render cgroup.conf.in "$STATE/etc/cgroup.conf"
    render gres.conf.in "$STATE/etc/gres.conf"
    render my.cnf.in "$STATE/etc/my.cnf"
    (umask 077 && render slurmdbd.conf.in "$STATE/etc/slurmdbd.conf") # slurmdbd refuses a readable one
    chmod 644 "$STATE"/etc/{slurm,cgroup,gres}.conf "$STATE/etc/my.cnf"
    ln -sfn /dev/null "$STATE/dev/gpu0"
    ln -sfn /dev/null "$STATE/dev/gpu1"
    rm -f "$STATE/env.sh" # earlier versions' file for `source`: `cluster.sh env` says the same, checked
}

# Inside a job, the executor plugin's job step drops every SLURM_* variable, SLURM_CONF too, before its nested
# `srun`, which then reads the default path: point that at this cluster unless a site config lives there.
DEFAULT_CONF=/etc/slurm/slurm.conf

link_default_conf() {
    if [ -L "$DEFAULT_CONF" ] || [ ! -e "$DEFAULT_CONF" ]; then
        mkdir -p "$(dirname "$DEFAULT_CONF")"
        ln -sfn "$STATE/etc/slurm.conf" "$DEFAULT_CONF"
    else
        say "warning: $DEFAULT_CONF is a site's config, left alone: a job's nested srun without SLURM_CONF reads it"
    fi
}

unlink_default_conf() {
    [ "$(readlink "$DEFAULT_CONF" 2>/dev/null)" = "$STATE/etc/slurm.conf" ] && rm -f "$DEFAULT_CONF"
    return 0
}

# --- the daemons, in the order they need each other ----------------------------------------------------------

start_munged() {
    running munged && return
    chown munge:munge "$STATE/munge"
    chmod 755 "$STATE/munge"
    touch "$(logfile munged)" && chown munge:munge "$(logfile munged)"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        (umask 077 && head -c 1024 /dev/urandom >"$STATE/munge/munge.key")
        chown munge:munge "$STATE/munge/munge.key"
    fi
    runuser -u munge -- munged --socket="$STATE/munge/munge.socket" --key-file="$STATE/munge/munge.key" \
        --pid-file="$(pidfile munged)" --log-file="$(logfile munged)" --seed-file="$STATE/munge/munged.seed" 9>&- \
        || fail_with_log munged "munged did not start"
    wait_for 10 munged running munged || fail_with_log munged "munged wrote no PID file"
}

sql() { mariadb --defaults-file="$STATE/etc/my.cnf" -u root "$@"; }

start_mariadb() {
    running mariadbd && return
    local fresh=""
    chown mysql:mysql "$STATE/mysql"
    touch "$(logfile mariadb)" && chown mysql:mysql "$(logfile mariadb)"
    if [ ! -d "$STATE/mysql/data/mysql" ]; then
        fresh=1
        mariadb-install-db --defaults-file="$STATE/etc/my.cnf" --user=mysql --skip-test-db \
            >"$STATE/log/mariadb-install.log" 2>&1 || fail_with_log mariadb-install "mariadb-install-db failed"
    fi
    setsid mariadbd --defaults-file="$STATE/etc/my.cnf" --user=mysql </dev/null >/dev/null 2>&1 9>&- &
    wait_for 60 "mariadb's socket" sql -e "SELECT 1" || fail_with_log mariadb "mariadb did not start"
    chmod 644 "$(pidfile mariadbd)" # mariadbd writes it 0660: `status` as any user reads it
    if [ -n "$fresh" ]; then # slurmdbd connects over TCP from 127.0.0.1 (names are not resolved)
        sql -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
                GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    fi
}

start_slurmdbd() {
    running slurmdbd && return
    slurmdbd 9>&- || # reads slurmdbd.conf next to $SLURM_CONF
        fail_with_log slurmdbd "slurmdbd did not start"
    wait_for 60 "slurmdbd to answer" sacctmgr -n show cluster || fail_with_log slurmdbd "slurmdbd does not answer"
}

add_record() { # add_record WHAT NAME [sacctmgr add arguments]: add it unless sacctmgr already lists it
    local what="$1" name="$2"
    shift 2
    if [ -z "$(sacctmgr -n -P show "$what" names="$name" 2>/dev/null)" ]; then
        sacctmgr -i -Q add "$what" "$name" "$@" >/dev/null
    fi
}

add_records() {
    local user
    add_record cluster arithmech
    add_record account "$ACCOUNT" cluster=arithmech description=arithmech-tests organization=arithmech
    add_record account "$OTHER_ACCOUNT" cluster=arithmech description=nobody-may-use-it organization=arithmech
    add_record qos "$CAPPED_QOS" MaxSubmitJobsPerUser=1
    for user in root ${SUDO_USER:-}; do
        if [ -z "$(sacctmgr -n -P show assoc cluster=arithmech account="$ACCOUNT" user="$user" format=user)" ]; then
            sacctmgr -i -Q add user "$user" cluster=arithmech account="$ACCOUNT" defaultaccount="$ACCOUNT" >/dev/null
        fi
        case ",$(sacctmgr -n -P show assoc cluster=arithmech account="$ACCOUNT" user="$user" format=qos)," in
            *",$CAPPED_QOS,"*) ;;
            *) sacctmgr -i -Q modify user "$user" where cluster=arithmech account="$ACCOUNT" \
                set qos+="$CAPPED_QOS" >/dev/null ;;
        esac
    done
}

start_slurmctld() {
    running slurmctld && return
    slurmctld 9>&- || fail_with_log slurmctld "slurmctld did not start"
    wait_for 30 "slurmctld to answer" scontrol ping || fail_with_log slurmctld "slurmctld does not answer"
}

start_slurmd() {
    running slurmd && return
    slurmd -N "$NODE" 9>&- || fail_with_log slurmd "slurmd did not start"
}

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | sort -u | tr '\n' ' '; }

node_ready() { # idle, or running jobs
    case "$(node_state)" in "idle " | "mixed " | "allocated ") return 0 ;; *) return 1 ;; esac
}

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do running "$d" || return 1; done
}

any_running() {
    local d
    for d in "${DAEMONS[@]}"; do running "$d" && return 0; done
    return 1
}

# After an unclean end (slurmctld killed, a reboot that kept $STATE) slurmctld recovers jobs as running whose
# processes are gone, and Slurm 22.05 never reaps them: they would hold the node's CPUs for good. With no job
# process alive on this node, a job that started before this `start` is such a ghost.
cancel_ghost_jobs() { # cancel_ghost_jobs SINCE
    local ghosts
    [ -z "$(job_pids)" ] || return 0
    ghosts="$(squeue -h -t running -o '%i %S' | awk -v since="$1" '$2 < since {print $1}' | tr '\n' ' ')"
    [ -n "${ghosts// /}" ] || return 0
    say "cancelling jobs recovered as running with no process left: $ghosts"
    # shellcheck disable=SC2086
    scancel $ghosts
}

cmd_start() {
    if all_running && node_ready; then # as root, a cluster started by an earlier version gets this one's records
        if [ "$(id -u)" = 0 ]; then add_records; fi
        say "already up ($STATE)"
        return
    fi
    need_root start "starts munged, mariadbd, slurmdbd, slurmctld and slurmd as root"
    installed || die "Slurm is not installed; run: sudo bash tests/slurm/cluster.sh up"
    stop_legacy # its daemons hold the ports this cluster's need
    (umask 022 && mkdir -p "$STATE")
    check_state "$STATE" # again, now that it exists: root created it, no one else
    exec 9>"$STATE/.lock" # the daemons are started with 9>&-: they must not hold the lock
    flock 9 # two test sessions starting at once start one cluster
    if all_running && node_ready; then say "already up ($STATE)"; return; fi
    local t0=$SECONDS since
    since="$(date +%Y-%m-%dT%H:%M:%S)"
    write_configs
    link_default_conf
    start_munged
    start_mariadb
    start_slurmdbd
    add_records
    start_slurmctld
    start_slurmd
    if [[ "$(node_state)" == *drain* ]]; then # e.g. slurmd was killed with a job on it; a test node may go on
        say "resuming node $NODE, drained for: $(sinfo -h -R -n "$NODE" -o %E)"
        scontrol update nodename="$NODE" state=resume
    fi
    wait_for 60 "node $NODE to be idle" node_ready || {
        say "node $NODE is '$(node_state)'; reason: $(sinfo -h -R -n "$NODE" -o %E)"
        fail_with_log slurmd "the node did not become idle"
    }
    cancel_ghost_jobs "$since"
    say "up in $((SECONDS - t0))s (SLURM_CONF=$SLURM_CONF); a client's environment: eval \"\$(bash $0 env)\""
}

no_jobs() { [ -z "$(squeue -h -o %A 2>/dev/null)" ]; }

# PIDs in this node's job cgroups (cgroup v1; slurmstepd sits in the job's, the job's processes in the step's):
# what jobs left behind when no slurmctld could cancel them.
job_pids() { find "/sys/fs/cgroup/freezer/slurm_$NODE" -name cgroup.procs -exec cat {} + 2>/dev/null || true; }

# The daemons of an earlier version's state directory, $LEGACY_STATE, when root made it (as checked for any state
# directory) and ARITHMECH_SLURM_DIR does not name a state: stopped, so that this one may start.
legacy_running() {
    [ -z "${ARITHMECH_SLURM_DIR:-}" ] && [ "$STATE" != "$LEGACY_STATE" ] && [ -d "$LEGACY_STATE" ] || return 1
    [ -z "$(state_problem "$LEGACY_STATE")" ] || return 1
    (use_state "$LEGACY_STATE" && any_running)
}

stop_legacy() {
    legacy_running || return 0
    say "the daemons of $LEGACY_STATE (where earlier versions kept the state) are running: stopping them"
    (use_state "$LEGACY_STATE" && cmd_stop)
    say "$LEGACY_STATE is no longer used: remove it with rm -rf $LEGACY_STATE"
}

cmd_stop() {
    stop_legacy
    if ! any_running; then
        [ "$(id -u)" != 0 ] || unlink_default_conf
        say "nothing running ($STATE)"
        return
    fi
    need_root stop "stops daemons that run as root"
    exec 9>"$STATE/.lock"
    flock 9
    local t0=$SECONDS pid jobs
    if running slurmctld; then # end the jobs first, so their steps exit with them
        jobs="$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')"
        if [ -n "${jobs// /}" ]; then
            say "cancelling jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs || true
            wait_for 30 "the jobs to end" no_jobs || true
        fi
    fi
    stop_daemon slurmd
    stop_daemon slurmctld
    for pid in $(job_pids); do
        say "killing pid $pid left in a job's cgroup ($(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null))"
        kill -9 "$pid" 2>/dev/null || true
    done
    stop_daemon slurmdbd
    stop_daemon mariadbd
    stop_daemon munged
    unlink_default_conf
    say "stopped in $((SECONDS - t0))s"
}

cmd_status() {
    local d pid rc=0
    echo "state directory: $STATE"
    for d in "${DAEMONS[@]}"; do
        if pid="$(pid_of "$(pidfile "$d")")"; then echo "$d: running (pid $pid)"; else echo "$d: stopped"; rc=1; fi
    done
    if [ "$rc" = 0 ]; then
        sinfo -o "%P %a %D %T %c %m %G" || rc=1
        node_ready || { echo "node $NODE is not usable: $(node_state)$(sinfo -h -R -n "$NODE" -o %E)"; rc=1; }
    fi
    if legacy_running; then
        echo "daemons started from $LEGACY_STATE (earlier versions' state directory) are running:" \
            "sudo bash tests/slurm/cluster.sh stop stops them"
        rc=1
    fi
    return "$rc"
}

# What a Slurm client needs, as shell `export` lines (for eval): the cluster's config and its account and
# partitions. Written from this script's own values, not read from a file, once the state and the cluster pass.
cmd_env() {
    all_running || die "the test cluster is not up ($STATE); start it: sudo bash tests/slurm/cluster.sh up"
    printf 'export %s=%q\n' SLURM_CONF "$SLURM_CONF" ARITHMECH_SLURM_ACCOUNT "$ACCOUNT" \
        ARITHMECH_SLURM_OTHER_ACCOUNT "$OTHER_ACCOUNT" ARITHMECH_SLURM_PARTITION gpu ARITHMECH_SLURM_CPU_PARTITION cpu \
        ARITHMECH_SLURM_CAPPED_QOS "$CAPPED_QOS"
}

case "${1:-}" in
    install) cmd_install ;;
    start) check_state "$STATE" && cmd_start ;;
    stop) check_state "$STATE" && cmd_stop ;;
    status) check_state "$STATE" && cmd_status ;;
    up) check_state "$STATE" && cmd_install && cmd_start ;;
    env) check_state "$STATE" && cmd_env ;;
    *) die "usage: bash tests/slurm/cluster.sh install|start|stop|status|up|env" ;;
esac
