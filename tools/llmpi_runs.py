"""llmpi_runs.py — what the measuring tools (zero_measure.py, plan_check.py) share: running one
llmpi command with its output kept, and writing a results file atomically. Standard library only."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def run_command(cmd, env, say, done_file=None, limit_s=900):
    """Runs cmd (its output kept and returned). With done_file: once that file exists the run has
    finished its work; if the processes then do not exit within 30 s (MPICH over TCP between
    network namespaces can hang in MPI_Finalize), they are sent SIGTERM (tools/netns_link.sh removes
    its namespaces on SIGTERM) and the run counts. A run that fails otherwise prints the end of its
    output and raises RuntimeError."""
    say("run: " + " ".join(cmd))
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    t0, done_at = time.time(), None
    while p.poll() is None:
        time.sleep(0.5)
        if done_at is None and done_file and os.path.exists(done_file):
            done_at = time.time()
        if (done_at and time.time() - done_at > 30) or time.time() - t0 > limit_s:
            say("the run " + ("finished its work but did not exit" if done_at else "ran past its limit") +
                ": stopping it")
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            break
    log.seek(0)
    out = log.read()
    if p.returncode != 0 and not (done_file and os.path.exists(done_file)):
        sys.stdout.write(out[-3000:])
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed (exit {p.returncode})")
    return out


def write_json_atomic(path, obj):
    """obj as indented JSON at path, through path.tmp and a rename (no half-written results file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)
