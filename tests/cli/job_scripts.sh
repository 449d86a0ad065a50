#!/usr/bin/env bash
# The job scripts of jobs/ run without a scheduler: each runs with bash in a scratch copy of the
# checkout's layout, with the variables Slurm or PBS would set and stand-ins first on PATH for srun,
# mpiexec, scontrol, qsub, qrerun and qstat that record their arguments and environment; the
# launchers run a stand-in trainer once and pass USR1 and TERM on to it, as srun and Hydra do.
#   every script       bash -n, and shellcheck when it is installed
#   train-gpu.*        the launch line starts nodes x 8 ranks with the binding options, the trainer
#                      gets --set runtime.device=cuda and parallel.sync=nccl, the threads per rank,
#                      NCCL_DEBUG=WARN (a user's value and the site's NCCL_* kept); USR1 to the
#                      script (Slurm's --signal=B:USR1, or the PBS walltime timer) reaches the trainer
#                      once and ends in a requeue (scontrol requeue / a continuation qsub / qrerun);
#                      TERM to the script is not passed on and does not requeue
#   errors             a missing config or trainer, a rank count that is not one per GPU, a
#                      failing trainer: one line naming it, a non-zero exit, no launch or no requeue
#   CPU scripts        train.*, train-requeue.* (srun and mpiexec), prep.* with one rank and many
# Every wait is bounded; the whole script takes about 15 s.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
ROOT=$(pwd)
tmp=$(mktemp -d)
job=
# reap: ends the stand-ins a case left running (their pids are in the log; only a process whose
# environment holds this STUB_LOG is one of them).
reap() {
  local f p
  for f in "$tmp"/log/*.pid; do
    [ -f "$f" ] && p=$(cat "$f") && [ -n "$p" ] && [ -r "/proc/$p/environ" ] || continue
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "STUB_LOG=$tmp/log" && kill -KILL "$p" 2>/dev/null
  done
}
cleanup() {  # only the processes this script started: the job under test and the stand-ins
  [ -n "$job" ] && kill -KILL "$job" 2>/dev/null
  reap
  rm -rf "$tmp"
}
trap cleanup EXIT

# ---- the scratch checkout: jobs/ of this one, a config, a stand-in trainer -------------------------
work=$tmp/work log=$tmp/log
mkdir -p "$work/build" "$work/data" "$tmp/bin" "$log"
ln -s "$ROOT/jobs" "$work/jobs"
cp data/demo.json "$work/data/demo.json"

# The trainer: records its arguments (one a line), environment and pid; STUB_TRAIN=ok exits 0,
# fail exits 3, wait waits (at most 30 s) for USR1 or TERM, then writes RUN_DIR/PREEMPTED as
# llmpi-train does after its pre-emption checkpoint, and exits 0.
cat >"$work/build/llmpi-train" <<'EOF'
#!/bin/bash
got=
trap 'got=USR1; echo USR1 >>"$STUB_LOG/train.signals"' USR1
trap 'got=TERM; echo TERM >>"$STUB_LOG/train.signals"' TERM
printf '%s\n' "$@" >"$STUB_LOG/train.args"
env | sort >"$STUB_LOG/train.env"
echo $$ >"$STUB_LOG/train.pid"
run_dir= prev=
for a in "$@"; do [[ $prev == --set && $a == run.dir=* ]] && run_dir=${a#run.dir=}; prev=$a; done
touch "$STUB_LOG/train.started"
case ${STUB_TRAIN:-ok} in
  ok) exit 0 ;;
  fail) echo "llmpi-train: error: the stand-in fails" >&2; exit 3 ;;
  wait)
    for ((i = 0; i < 300; i++)); do [ -n "$got" ] && break; sleep 0.1; done
    [ -n "$got" ] || exit 9
    mkdir -p "$run_dir/checkpoints"
    printf 'step 7\ncheckpoint %s/checkpoints/step-00000007.h5\n' "$run_dir" >"$run_dir/PREEMPTED"
    exit 0 ;;
esac
EOF
# srun and mpiexec: record, drop their options, run the program once, pass USR1 and TERM on.
cat >"$tmp/bin/srun" <<'EOF'
#!/bin/bash
me=$(basename "$0") child=
trap '[ -n "$child" ] && kill -USR1 "$child"' USR1
trap '[ -n "$child" ] && kill -TERM "$child"' TERM
printf '%s\n' "$@" >"$STUB_LOG/$me.args"
env | sort >"$STUB_LOG/$me.env"
echo "$me $*" >>"$STUB_LOG/calls"
echo $$ >"$STUB_LOG/$me.pid"
while [ $# -gt 0 ]; do case $1 in -n | -np | -f | -ppn) shift 2 ;; -*) shift ;; *) break ;; esac; done
"$@" &
child=$!
while :; do
  wait "$child"; rc=$?
  kill -0 "$child" 2>/dev/null && continue
  wait "$child" 2>/dev/null; r=$?; [ $r != 127 ] && rc=$r
  break
done
exit $rc
EOF
cp "$tmp/bin/srun" "$tmp/bin/mpiexec"
# The scheduler's commands: record the call; qsub prints a job id, qstat the walltime STUB_WALLTIME.
for c in scontrol qsub qrerun qstat; do
  printf '#!/bin/bash\necho "%s $*" >>"$STUB_LOG/calls"\n' "$c" >"$tmp/bin/$c"
done
echo 'echo 1001.pbs' >>"$tmp/bin/qsub"
echo '[ -n "${STUB_WALLTIME:-}" ] && echo "    Resource_List.walltime = $STUB_WALLTIME"; exit 0' >>"$tmp/bin/qstat"
chmod +x "$work/build/llmpi-train" "$tmp/bin"/*

# start NAME SCRIPT VAR=VALUE...: SCRIPT (relative to the checkout) under bash in the background, in
# $work, with only these variables (and PATH, HOME, STUB_LOG); $job is the script's shell.
start() {
  local name=$1 script=$2
  shift 2
  reap
  rm -rf "$log" "$work/runs"; mkdir -p "$log"
  (cd "$work" && exec env -i PATH="$tmp/bin:$PATH" HOME="$HOME" STUB_LOG="$log" "$@" bash "$script" \
     >"$tmp/$name.out" 2>&1) &
  job=$!
}
# finish SECONDS: wait for the job at most SECONDS (then kill it: rc 137); $rc = its exit status.
finish() {
  wait_for "! kill -0 $job 2>/dev/null" $(($1 * TIME_SCALE)) || kill -KILL "$job" 2>/dev/null
  wait "$job"; rc=$?; job=
}
# run NAME SCRIPT VAR=VALUE...: start and finish within 10 s.
run() { start "$@"; finish 10; }
started() { wait_for "[ -f '$log/train.started' ]" $((10 * TIME_SCALE)); }
has_line() { grep -qxF -- "$2" "$log/$1"; }       # has_line FILE LINE: FILE (in the log) has LINE
has_pair() { grep -A1 -xF -- "$2" "$log/$1" | grep -qxF -- "$3"; }   # LINE2 right after LINE1
called() { grep -qF -- "$1" "$log/calls" 2>/dev/null; }
errors() { grep -c 'error' "$tmp/$1.out"; }         # lines that say error
show() { echo "  --- $1:"; sed 's/^/  | /' "$tmp/$1.out"; [ -f "$log/calls" ] && sed 's/^/  | call: /' "$log/calls"; }

# ---- every script parses; shellcheck --------------------------------------------------------------
scripts=(jobs/slurm/*.sbatch jobs/pbs/*.pbs)
for s in "${scripts[@]}"; do check "bash -n $s" "bash -n '$s'"; done
if command -v shellcheck >/dev/null; then
  check "shellcheck: no findings in the ${#scripts[@]} job scripts" "shellcheck ${scripts[*]} >'$tmp/sc' 2>&1" || cat "$tmp/sc"
else
  skip "shellcheck of the job scripts: shellcheck is not installed"
fi
if [ -x "$B/llmpi-train" ]; then
  "$B/llmpi-train" --help >"$tmp/help" 2>&1
  ok=1
  for k in run.dir runtime.threads runtime.device parallel.sync checkpoint.every runtime.step_timeout_s; do
    grep -q "^  $k " "$tmp/help" || { ok=0; echo "not in llmpi-train --help: $k"; }
  done
  grep -q 'parallel.sync .*"nccl"' "$tmp/help" && grep -q 'runtime.device .*"cuda"' "$tmp/help" || ok=0
  check "llmpi-train --help lists every key the scripts set, and the values cuda and nccl" "[ $ok = 1 ]"
else
  skip "the scripts' keys against llmpi-train --help: $B/llmpi-train is not built"
fi

# ---- Slurm, 2 GPU nodes: the launch, then USR1 before the time limit -> requeue -------------------
slurm=(SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2 SLURM_NNODES=2 SLURM_NTASKS=16 SLURM_NTASKS_PER_NODE=8
       SLURM_TASKS_PER_NODE='8(x2)' SLURM_CPUS_PER_TASK=12 SLURM_SUBMIT_DIR="$work")
start sgpu jobs/slurm/train-gpu.sbatch "${slurm[@]}" SLURM_RESTART_COUNT=0 STUB_TRAIN=wait NCCL_SOCKET_IFNAME=ib0
if started; then
  check "slurm gpu: srun starts 2 nodes x 8 = 16 ranks, 8 a node" \
    "has_line srun.args --ntasks=16 && has_line srun.args --ntasks-per-node=8"
  check "slurm gpu: srun binds each rank to its 12 cores, ranks filling a socket first; no per-task GPU binding" \
    "has_line srun.args --cpu-bind=cores && has_line srun.args --cpus-per-task=12 && has_line srun.args --distribution=block:block && ! grep -q -- '--gpu' '$log/srun.args'"
  check "slurm gpu: the trainer gets --set runtime.device=cuda and --set parallel.sync=nccl" \
    "has_pair train.args --set runtime.device=cuda && has_pair train.args --set parallel.sync=nccl"
  check "slurm gpu: --config, the run directory, 12 threads (--cpus-per-task), --resume auto" \
    "has_pair train.args --config data/demo.json && has_pair train.args --set run.dir=runs/slurm-4242 &&
     has_pair train.args --set runtime.threads=12 && has_pair train.args --resume auto"
  check "slurm gpu: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS 12, OMP_PROC_BIND close" \
    "has_line train.env OMP_NUM_THREADS=12 && has_line train.env OPENBLAS_NUM_THREADS=12 && has_line train.env OMP_PROC_BIND=close"
  check "slurm gpu: NCCL_DEBUG=WARN exported, the site's NCCL_SOCKET_IFNAME kept" \
    "has_line train.env NCCL_DEBUG=WARN && has_line train.env NCCL_SOCKET_IFNAME=ib0"
  kill -USR1 "$job"
  finish 20
  check "slurm gpu: USR1 to the script reaches the trainer once; exit 0" "[ $rc = 0 ] && [ \"\$(cat '$log/train.signals')\" = USR1 ]" || show sgpu
  check "slurm gpu: after the pre-emption checkpoint the job requeues itself (scontrol requeue 4242)" \
    "called 'scontrol requeue 4242' && grep -q 'requeueing job 4242' '$tmp/sgpu.out'" || show sgpu
else
  check "slurm gpu: the trainer starts" false; finish 1; show sgpu
fi

# TERM to the job script (a started job): not passed on to the ranks, the script waits for them;
# then TERM to the trainer, as the scheduler sends it to every process of the job, and the job ends.
term_is_not_passed_on() {
  kill -TERM "$job"
  sleep 1
  check "$1: TERM to the script is not passed on to the ranks; the script waits for them" \
    "[ ! -e '$log/train.signals' ] && kill -0 $job 2>/dev/null"
  kill -TERM "$(cat "$log/train.pid")"
  finish 20
}

# ---- TERM to the script: not passed on, no requeue (the ranks get TERM from Slurm itself) -----------
start sterm jobs/slurm/train-gpu.sbatch "${slurm[@]}" SLURM_RESTART_COUNT=3 STUB_TRAIN=wait NCCL_DEBUG=INFO
if started; then
  check "slurm gpu: a user's NCCL_DEBUG=INFO is kept" "has_line train.env NCCL_DEBUG=INFO"
  term_is_not_passed_on "slurm gpu"
  check "slurm gpu: TERM: exit 0, no requeue, says how to go on (sbatch jobs/slurm/train-gpu.sbatch)" \
    "[ $rc = 0 ] && ! called scontrol && grep -q 'stopped by SIGTERM.*sbatch jobs/slurm/train-gpu.sbatch' '$tmp/sterm.out'" || show sterm
else
  check "slurm gpu (TERM): the trainer starts" false; finish 1; show sterm
fi

# ---- Slurm errors: one line, a non-zero exit, nothing launched ---------------------------------------
run smiss jobs/slurm/train-gpu.sbatch "${slurm[@]}" CONFIG=missing.json
check "slurm gpu: a missing config: exit 2, one error naming it, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors smiss) = 1 ] && grep -q \"config 'missing.json' does not exist\" '$tmp/smiss.out' && [ ! -e '$log/calls' ]" || show smiss
run snoexe jobs/slurm/train-gpu.sbatch "${slurm[@]}" LLMPI_TRAIN=build/none
check "slurm gpu: a missing trainer: exit 2, one error naming it, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors snoexe) = 1 ] && grep -q \"'build/none' is not an executable\" '$tmp/snoexe.out' && [ ! -e '$log/calls' ]" || show snoexe
run sranks jobs/slurm/train-gpu.sbatch SLURM_JOB_ID=4243 SLURM_JOB_NUM_NODES=2 SLURM_NTASKS=8 SLURM_CPUS_PER_TASK=8
check "slurm gpu: 4 tasks a node for 8 GPUs: exit 2, one error naming --ntasks-per-node=8, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors sranks) = 1 ] && grep -q 'ntasks-per-node=8' '$tmp/sranks.out' && [ ! -e '$log/calls' ]" || show sranks
run suneven jobs/slurm/train-gpu.sbatch "${slurm[@]}" SLURM_TASKS_PER_NODE=10,6
check "slurm gpu: 16 tasks dealt 10 and 6 to the nodes: exit 2, one error, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors suneven) = 1 ] && grep -q '(10,6 a node)' '$tmp/suneven.out' && [ ! -e '$log/calls' ]" || show suneven
run sgpus jobs/slurm/train-gpu.sbatch "${slurm[@]}" GPUS_PER_NODE=eight
check "slurm gpu: GPUS_PER_NODE not a number: exit 2, one error" \
  "[ $rc = 2 ] && [ \$(errors sgpus) = 1 ] && grep -q 'GPUS_PER_NODE must be' '$tmp/sgpus.out'" || show sgpus
mkdir -p "$tmp/elsewhere"
(cd "$tmp/elsewhere" && env -i PATH="$tmp/bin:$PATH" STUB_LOG="$log" "${slurm[@]}" \
   timeout $((10 * TIME_SCALE)) bash "$ROOT/jobs/slurm/train-gpu.sbatch" >"$tmp/snodir.out" 2>&1); rc=$?
check "slurm gpu: submitted outside the checkout: exit 2, one error saying where to submit from" \
  "[ $rc = 2 ] && [ \$(errors snodir) = 1 ] && grep -q 'submit from the llmpi checkout' '$tmp/snodir.out'" || show snodir
run sfail jobs/slurm/train-gpu.sbatch "${slurm[@]}" STUB_TRAIN=fail
check "slurm gpu: a failing trainer: its exit status (3), no requeue" \
  "[ $rc = 3 ] && ! called scontrol && grep -q 'llmpi-train failed (exit 3): not requeueing' '$tmp/sfail.out'" || show sfail

# ---- Slurm, CPUs: train-requeue.sbatch with srun and with mpiexec; train.sbatch ----------------------
cpu=(SLURM_JOB_ID=51 SLURM_JOB_NUM_NODES=2 SLURM_NNODES=2 SLURM_NTASKS=4 SLURM_CPUS_PER_TASK=4)
run scpu jobs/slurm/train-requeue.sbatch "${cpu[@]}"
check "slurm cpu: srun --cpu-bind=cores --cpus-per-task=4 alone, no cuda or nccl, 4 threads; finished: exit 0, no requeue" \
  "[ $rc = 0 ] && called 'srun --cpu-bind=cores --cpus-per-task=4 build/llmpi-train' &&
   ! grep -q 'cuda\|nccl' '$log/train.args' && has_pair train.args --set runtime.threads=4 && ! called scontrol &&
   ! grep -q NCCL_DEBUG '$log/train.env'" || show scpu
run smpi jobs/slurm/train-requeue.sbatch "${cpu[@]}" LAUNCHER=mpiexec
check "slurm cpu: LAUNCHER=mpiexec: mpiexec -n 4, OMP_PROC_BIND not set (Hydra leaves the ranks unbound)" \
  "[ $rc = 0 ] && called 'mpiexec -n 4 build/llmpi-train' && ! grep -q OMP_PROC_BIND '$log/train.env'" || show smpi
start smax jobs/slurm/train-requeue.sbatch "${cpu[@]}" SLURM_RESTART_COUNT=20 STUB_TRAIN=wait
if started; then kill -USR1 "$job"; fi
finish 20
check "slurm cpu: USR1 after MAX_RESTARTS (20) restarts: exit 0, no requeue" \
  "[ $rc = 0 ] && ! called scontrol && grep -q 'restarted 20 times (MAX_RESTARTS=20): not requeueing' '$tmp/smax.out'" || show smax
run strain jobs/slurm/train.sbatch "${cpu[@]}"
check "slurm train.sbatch: srun --cpu-bind=cores --cpus-per-task=4 build/llmpi-train with the run directory and 4 threads" \
  "[ $rc = 0 ] && called 'srun --cpu-bind=cores --cpus-per-task=4 build/llmpi-train --config data/demo.json --set run.dir=runs/slurm-51 --set runtime.threads=4'" || show strain

# ---- PBS, 2 GPU nodes: the launch, then the walltime timer's USR1 -> a continuation job ----------------
printf 'gnode1\n%.0s' {1..8} >"$tmp/nodes16" && printf 'gnode2\n%.0s' {1..8} >>"$tmp/nodes16"
printf 'gnode1\n%.0s' {1..4} >"$tmp/nodes4" && printf 'gnode2\n%.0s' {1..4} >>"$tmp/nodes4"
pbs=(PBS_JOBID=777.pbs PBS_O_WORKDIR="$work" PBS_NODEFILE="$tmp/nodes16" OMP_NUM_THREADS=8)
# qstat says 00:02:01 of walltime; MARGIN_S is 120: USR1 one second after the start.
start pgpu jobs/pbs/train-gpu.pbs "${pbs[@]}" STUB_WALLTIME=00:02:01 STUB_TRAIN=wait
finish 20
check "pbs gpu: mpiexec starts 16 ranks from the host file (2 nodes x 8)" \
  "has_pair mpiexec.args -n 16 && has_pair mpiexec.args -f '$tmp/nodes16'" || show pgpu
check "pbs gpu: the trainer gets runtime.device=cuda, parallel.sync=nccl, 8 threads (ompthreads), the run directory" \
  "has_pair train.args --set runtime.device=cuda && has_pair train.args --set parallel.sync=nccl &&
   has_pair train.args --set runtime.threads=8 && has_pair train.args --set run.dir=runs/pbs-777 && has_pair train.args --resume auto"
check "pbs gpu: NCCL_DEBUG=WARN, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS 8" \
  "has_line train.env NCCL_DEBUG=WARN && has_line train.env OMP_NUM_THREADS=8 && has_line train.env OPENBLAS_NUM_THREADS=8"
check "pbs gpu: the walltime from qstat; the timer's USR1 reaches the trainer once; exit 0" \
  "[ $rc = 0 ] && called 'qstat -f 777.pbs' && grep -q 'walltime 121s: USR1 in 1s' '$tmp/pgpu.out' && [ \"\$(cat '$log/train.signals')\" = USR1 ]" || show pgpu
check "pbs gpu: a continuation of train-gpu.pbs after this job, with GPUS_PER_NODE=8, RESTARTS=1, the walltime" \
  "called 'qsub -W depend=afterany:777.pbs -l walltime=121 -v RUN_DIR=runs/pbs-777,CONFIG=data/demo.json,THREADS=8,' &&
   grep -q 'RESTARTS=1,.*JOB_SCRIPT=jobs/pbs/train-gpu.pbs,GPUS_PER_NODE=8 jobs/pbs/train-gpu.pbs$' '$log/calls'" || show pgpu

start pterm jobs/pbs/train-gpu.pbs "${pbs[@]}" WALLTIME_S=3600 STUB_TRAIN=wait
if started; then
  term_is_not_passed_on "pbs gpu"
  check "pbs gpu: TERM: exit 0, no continuation, says how to go on" \
    "[ $rc = 0 ] && ! called qsub && ! called qrerun && grep -q 'stopped by SIGTERM.*qsub -v RUN_DIR=runs/pbs-777,CONFIG=data/demo.json jobs/pbs/train-gpu.pbs' '$tmp/pterm.out'" || show pterm
else
  check "pbs gpu (TERM): the trainer starts" false; finish 1; show pterm
fi
start pqrerun jobs/pbs/train-gpu.pbs "${pbs[@]}" WALLTIME_S=121 REQUEUE=qrerun STUB_TRAIN=wait
finish 20
check "pbs gpu: REQUEUE=qrerun: qrerun 777.pbs after the checkpoint, no qsub" \
  "[ $rc = 0 ] && called 'qrerun 777.pbs' && ! called qsub" || show pqrerun

run pranks jobs/pbs/train-gpu.pbs PBS_JOBID=778.pbs PBS_O_WORKDIR="$work" PBS_NODEFILE="$tmp/nodes4" WALLTIME_S=3600
check "pbs gpu: 4 MPI processes a node for 8 GPUs: exit 2, one error naming mpiprocs=8, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors pranks) = 1 ] && grep -q 'mpiprocs=8' '$tmp/pranks.out' && ! called mpiexec" || show pranks
run pmiss jobs/pbs/train-gpu.pbs "${pbs[@]}" WALLTIME_S=3600 CONFIG=missing.json
check "pbs gpu: a missing config: exit 2, one error naming it, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors pmiss) = 1 ] && grep -q \"config 'missing.json' does not exist\" '$tmp/pmiss.out' && [ ! -e '$log/calls' ]" || show pmiss
run pnoexe jobs/pbs/train-gpu.pbs "${pbs[@]}" WALLTIME_S=3600 LLMPI_TRAIN=build/none
check "pbs gpu: a missing trainer: exit 2, one error naming it, nothing launched" \
  "[ $rc = 2 ] && [ \$(errors pnoexe) = 1 ] && grep -q \"'build/none' is not an executable\" '$tmp/pnoexe.out' && [ ! -e '$log/calls' ]" || show pnoexe

# ---- PBS, CPUs: train-requeue.pbs and train.pbs ----------------------------------------------------
printf 'cnode1\ncnode1\ncnode2\ncnode2\n' >"$tmp/nodes-cpu"
pcpu=(PBS_JOBID=90.pbs PBS_O_WORKDIR="$work" PBS_NODEFILE="$tmp/nodes-cpu" OMP_NUM_THREADS=4)
start pcpu jobs/pbs/train-requeue.pbs "${pcpu[@]}" WALLTIME_S=121 STUB_TRAIN=wait
finish 20
check "pbs cpu: mpiexec -n 4 -f the host file, no cuda or nccl; USR1 from the timer: a continuation of train-requeue.pbs" \
  "[ $rc = 0 ] && called \"mpiexec -n 4 -f $tmp/nodes-cpu build/llmpi-train\" && ! grep -q 'cuda\|nccl' '$log/train.args' &&
   grep -q 'JOB_SCRIPT=jobs/pbs/train-requeue.pbs,GPUS_PER_NODE=0,WALLTIME_S=121 jobs/pbs/train-requeue.pbs$' '$log/calls'" || show pcpu
run ptrain jobs/pbs/train.pbs "${pcpu[@]}"
check "pbs train.pbs: mpiexec -n 4 -f the host file, the run directory, 4 threads (ompthreads)" \
  "[ $rc = 0 ] && called \"mpiexec -n 4 -f $tmp/nodes-cpu build/llmpi-train --config data/demo.json --set run.dir=runs/pbs-90 --set runtime.threads=4\"" || show ptrain
run ptrain6 jobs/pbs/train.pbs "${pcpu[@]}" THREADS=6
check "pbs train.pbs: THREADS=6 wins over ompthreads" "[ $rc = 0 ] && has_pair train.args --set runtime.threads=6 && has_line train.env OMP_NUM_THREADS=6" || show ptrain6

# ---- prep: one rank runs llmpi-prep itself, more go through srun / mpiexec --------------------------
if [ -x "$B/llmpi-prep" ]; then
  awk 'BEGIN { for (d = 0; d < 60; d++) { for (l = 0; l < 3; l++) print "document " d " line " l " of some text."; print "" } }' \
    >"$work/corpus.txt"
  run prep1 jobs/slurm/prep.sbatch SLURM_JOB_ID=61 SLURM_NTASKS=1 INPUT=corpus.txt OUT=out1 LLMPI_PREP="$B/llmpi-prep"
  check "slurm prep.sbatch, 1 task: llmpi-prep without srun, both splits inspected, names data.train=out1/train" \
    "[ $rc = 0 ] && [ ! -e '$log/calls' ] && grep -q '^split: *train of out1' '$tmp/prep1.out' && grep -q '^split: *val of out1' '$tmp/prep1.out' &&
     grep -q 'train with --set data.train=out1/train --set data.val=out1/val' '$tmp/prep1.out'" || show prep1
  run prep4 jobs/slurm/prep.sbatch SLURM_JOB_ID=62 SLURM_NTASKS=4 INPUT=corpus.txt OUT=out4 LLMPI_PREP="$B/llmpi-prep" \
    PREP_ARGS="--shard-tokens 2K"
  check "slurm prep.sbatch, 4 tasks: srun runs llmpi-prep; sharded splits are inspected by name" \
    "[ $rc = 0 ] && called \"srun --cpu-bind=cores --cpus-per-task=1 $B/llmpi-prep --tokenizer byte --input corpus.txt --out out4\" &&
     [ -f '$work/out4/train-00000.h5' ] && grep -q '^shards: *[2-9]' '$tmp/prep4.out'" || show prep4
  run pprep jobs/pbs/prep.pbs PBS_JOBID=63.pbs PBS_O_WORKDIR="$work" PBS_NODEFILE="$tmp/nodes-cpu" INPUT=corpus.txt OUT=outp \
    LLMPI_PREP="$B/llmpi-prep"
  check "pbs prep.pbs, 4 MPI processes: mpiexec -n 4 -f the host file runs llmpi-prep" \
    "[ $rc = 0 ] && called \"mpiexec -n 4 -f $tmp/nodes-cpu $B/llmpi-prep\" && grep -q '^split: *val of outp' '$tmp/pprep.out'" || show pprep
else
  skip "prep scripts with llmpi-prep: $B/llmpi-prep is not built"
fi
run pnoinput jobs/slurm/prep.sbatch SLURM_JOB_ID=64 SLURM_NTASKS=1
check "slurm prep.sbatch without INPUT: exit 2, one error" \
  "[ $rc = 2 ] && [ \$(errors pnoinput) = 1 ] && grep -q 'set INPUT' '$tmp/pnoinput.out'" || show pnoinput
exit $status
