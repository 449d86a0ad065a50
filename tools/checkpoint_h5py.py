#!/usr/bin/python3
"""Read an llmpi checkpoint (version 3: a dataset per tensor) with h5py, as a user would.

  tools/checkpoint_h5py.py CKPT.h5 [REFERENCE.h5]

Lists the groups and tensors with their shapes, recomputes the CRC-32C of every rectangle the
file's crc32c_rects attributes name (each rank's part) and checks that they cover every tensor
once. With a REFERENCE checkpoint (another layout's save of the same run at the same step, e.g.
one rank's), compares every tensor by name: the largest difference against the reference's
largest magnitude. Exits 1 on a checksum, coverage or name mismatch. Needs h5py and numpy
(Debian: python3-h5py).
"""
import sys

import h5py
import numpy as np

_TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _TABLE.append(c)
_TABLE = np.array(_TABLE, dtype=np.uint32)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as src/runtime/crc32c.h computes it."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = int(_TABLE[(crc ^ b) & 0xFF]) ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def tensors(f):
    for group in ("params", "adam_m", "adam_v"):
        if group in f:
            for name, d in f[group].items():
                yield group, name, d


def check(path):
    bad = 0
    with h5py.File(path, "r") as f:
        print(f"{path}: version {f.attrs['version']}, step {f.attrs['step']}, replicas {f.attrs.get('replicas', 1)}")
        assert f.attrs["version"] >= 3, "tools/checkpoint_h5py.py reads version 3 (a dataset per tensor)"
        for group, name, d in tensors(f):
            a = d[()].astype("<f4")
            view = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(-1, 1)
            rects = d.attrs["crc32c_rects"].reshape(-1, 6)
            covered = np.zeros(view.shape, dtype=np.int32)
            for replica, r0, rows, c0, cols, crc in rects:
                assert replica == 0, "several replicas: not handled by this script"
                block = np.ascontiguousarray(view[r0:r0 + rows, c0:c0 + cols])
                covered[r0:r0 + rows, c0:c0 + cols] += 1
                if crc32c(block.tobytes()) != int(crc):
                    print(f"  {group}/{name}: rows [{r0}, {r0 + rows}), columns [{c0}, {c0 + cols}) fails its checksum")
                    bad += 1
            if not (covered == 1).all():
                print(f"  {group}/{name}: its rectangles do not cover it once")
                bad += 1
            print(f"  {group}/{name} {list(d.shape)}: {len(rects)} rectangle(s)")
    return bad


def compare(path, ref):
    bad = 0
    with h5py.File(path, "r") as f, h5py.File(ref, "r") as g:
        names = {(gr, n) for gr, n, _ in tensors(f)}
        ref_names = {(gr, n) for gr, n, _ in tensors(g)}
        if names != ref_names:
            print("tensors differ:", sorted(names ^ ref_names))
            return 1
        worst = 0.0
        for group, name, d in tensors(f):
            a, b = d[()], g[group][name][()]
            scale = float(np.abs(b).max()) or 1.0
            diff = float(np.abs(a - b).max()) / scale
            worst = max(worst, diff)
            print(f"  {group}/{name}: max |a - b| / max |b| = {diff:.2e}")
        print(f"largest difference against {ref}: {worst:.2e}")
    return bad


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    bad = check(sys.argv[1])
    if len(sys.argv) == 3:
        bad += compare(sys.argv[1], sys.argv[2])
    print("checksums and coverage:", "all verify" if bad == 0 else f"{bad} problem(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
