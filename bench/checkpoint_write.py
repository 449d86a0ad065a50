#!/usr/bin/python3
"""A sharded checkpoint's write against a bare MPI-IO write of the same bytes (`make bench-checkpoint`).

Runs build/bench-checkpoint_sharded (bench/checkpoint_sharded.cpp) under mpiexec on 1, 2 and 4
ranks (--ranks): one checkpoint of a GPT-2-shaped model (params + AdamW m and v; --layers,
--d-model), each rank writing its rows of every tensor, against MPI_File_write_at_all of as many
bytes in the same run; medians of --reps. Prints a table and writes JSON (default
BUILD/bench/checkpoint_write.json) with the machine, the date and the commit.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

from run_reference import cpu_description, write_record  # (bench/run_reference.py, beside this file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--dir", default=None, help="where to write (default: a new directory under /tmp)")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None, help="JSON file (default BUILD/bench/checkpoint_write.json)")
    a = p.parse_args()
    exe = os.path.join(a.build, "bench-checkpoint_sharded")
    if not os.path.exists(exe):
        sys.exit(f"checkpoint_write: {exe} is missing: build it with `make {exe}`")
    work = a.dir or tempfile.mkdtemp(prefix="llmpi-ckpt-bench-")
    rows = []
    for n in [int(x) for x in a.ranks.split(",")]:
        cmd = ["mpiexec", "-n", str(n), exe, "--dir", work, "--layers", str(a.layers), "--d-model", str(a.d_model),
               "--reps", str(a.reps)]
        print("running:", " ".join(cmd), flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            sys.exit(f"checkpoint_write: {' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{'ranks':>5} {'GB':>6} {'llmpi s':>8} {'bare s':>8} {'llmpi GB/s':>10} {'bare GB/s':>9} {'ratio':>6} {'crc s':>6}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['bytes'] / 1e9:>6.2f} {r['llmpi_write_s']:>8.3f} {r['bare_write_at_all_s']:>8.3f} "
              f"{r['llmpi_GBps']:>10.2f} {r['bare_GBps']:>9.2f} {r['ratio']:>6.2f} {r['crc_s']:>6.3f}")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"benchmark": "checkpoint_write", "date": datetime.date.today().isoformat(), "commit": commit,
              "cpu": cpu_description(), "machine": platform.node(), "dir": work,
              "what": "llmpi_write_s: create the file (checksums gathered, datasets allocated), every rank's "
                      "rectangles written with MPI_File_write_at, MPI_File_sync, close, rename; "
                      "bare_write_at_all_s: MPI_File_write_at_all of the same bytes, sync, close; "
                      "ratio = bare / llmpi time (llmpi's bandwidth over the bare write's)",
              "rows": rows}
    write_record(a.out or os.path.join(a.build, "bench", "checkpoint_write.json"), record)


if __name__ == "__main__":
    main()
