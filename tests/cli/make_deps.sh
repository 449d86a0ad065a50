#!/usr/bin/env bash
# The Makefile installs the Debian packages (the deps stamp) before it compiles anything: on a
# fresh machine `make -j` must not start a compile before apt-get has installed mpicxx. Checked in
# a fresh build folder with every compiler replaced by `echo` and the package step by a 2-second
# wait that prints DEPS-DONE: under -j16 any compile rule without the stamp as a prerequisite
# runs at once, before it. A few seconds; nothing is compiled or installed.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# -k: the archive and link steps fail (no objects are made), the other rules still run. The
# outer make's flags and variables (make test SAN=1 CXX=...) are not passed on.
timeout $((120 * TIME_SCALE)) env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -k -j16 BUILD="$tmp/b" CXX='echo COMPILE' NVCC='echo NVCC' \
  'install_missing=@sleep 2; echo DEPS-DONE' binaries >"$tmp/out" 2>&1
check "make -j16 binaries: the package step runs first" "[ \"\$(grep -m1 -E '^(DEPS-DONE|COMPILE |NVCC )' '$tmp/out')\" = DEPS-DONE ]" ||
  grep -m3 -E '^(COMPILE|NVCC) ' "$tmp/out" | cut -c1-200
check "... and the compile rules ran (simulator objects included)" \
  "[ \$(grep -c '^COMPILE ' '$tmp/out') -gt 50 ] && grep -q '^COMPILE .*cuda_cpu_sim/ops/fiber.o' '$tmp/out' && grep -q '^COMPILE .*nccl_exchange_with_sim_nccl.o' '$tmp/out'"
exit $status
