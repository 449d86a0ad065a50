#!/usr/bin/env python3
"""tensorboard_check.py — TensorBoard's own reader on a run directory's event files.

  PY tools/tensorboard_check.py RUN_DIR

PY: a Python with the `tensorboard` package (pip install tensorboard). Loads RUN_DIR with
TensorBoard's EventAccumulator (what `tensorboard --logdir` uses, purging the steps a resumed run
replaced), prints every scalar tag with its number of points and its first and last (step, value),
and checks that train/loss, train/learning_rate and train/grad_norm hold metrics.jsonl's steps and
values (as float32) and eval/val_loss eval.jsonl's. Exit 0 when they match, 1 otherwise.
"""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    run = sys.argv[1]
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    if not tags:
        print(f"tensorboard_check: no scalars in {run} (metrics.tensorboard false, or not a run directory?)")
        return 1
    for tag in sorted(tags):
        s = acc.Scalars(tag)
        print(f"{tag:28} {len(s):5} points  first ({s[0].step}, {s[0].value:.6g})  last ({s[-1].step}, {s[-1].value:.6g})")
    bad = 0
    checks = [("train/loss", "metrics.jsonl", "loss"), ("train/learning_rate", "metrics.jsonl", "lr"),
              ("train/grad_norm", "metrics.jsonl", "grad_norm"), ("eval/val_loss", "eval.jsonl", "val_loss")]
    for tag, log, key in checks:
        lines = jsonl(os.path.join(run, log))
        want = {x["step"]: f32(x[key]) for x in lines if key in x}
        if not want:
            continue
        got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
        if got != want:
            missing = sorted(set(want) - set(got))[:5]
            differ = [s for s in want if s in got and got[s] != want[s]][:5]
            print(f"MISMATCH {tag} against {log} '{key}': {len(got)} points for {len(want)} lines; "
                  f"missing steps {missing}, different values at {differ}")
            bad += 1
        else:
            print(f"ok   {tag} = {log} '{key}' at all {len(want)} steps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
