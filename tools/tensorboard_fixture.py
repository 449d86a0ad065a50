#!/usr/bin/env python3
"""tensorboard_fixture.py — the reference event file of tests/test_tensorboard.cpp, written by
TensorBoard's own protocol buffers and record writer (PyPI `tensorboard`).

  PY tools/tensorboard_fixture.py [--out tests/fixtures/tensorboard/reference.tfevents]

PY: a Python with the `tensorboard` package (e.g. a virtual environment with `pip install
tensorboard`). The events (the C++ test builds the same ones and compares bytes):
  1. wall_time 1765000000.25, file_version "brain.Event:2"
  2. wall_time 1765000001.5, step 0: train/loss 4.1875, train/learning_rate 3e-4 (as float)
  3. wall_time 1765000002.75, step 300: eval/val_loss 2.0, eval/accuracy 0.0 (a zero value: kept,
     simple_value is a oneof member)
  4. wall_time 1765000003.0, step 12: SessionLog START
  5. wall_time 1765000004.125, step 4294967301 (past 32 bits): perf/tokens_per_s 123456.789
"""
import argparse
import os

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scalars(pairs):
    return Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in pairs])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tensorboard", "reference.tfevents"))
    a = p.parse_args()
    events = [
        Event(wall_time=1765000000.25, file_version="brain.Event:2"),
        Event(wall_time=1765000001.5, step=0, summary=scalars([("train/loss", 4.1875), ("train/learning_rate", 3e-4)])),
        Event(wall_time=1765000002.75, step=300, summary=scalars([("eval/val_loss", 2.0), ("eval/accuracy", 0.0)])),
        Event(wall_time=1765000003.0, step=12, session_log=SessionLog(status=SessionLog.START)),
        Event(wall_time=1765000004.125, step=4294967301, summary=scalars([("perf/tokens_per_s", 123456.789)])),
    ]
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        w = RecordWriter(f)
        for e in events:
            w.write(e.SerializeToString())
        w.flush()
    os.replace(tmp, a.out)
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes, {len(events)} events)")


if __name__ == "__main__":
    main()
