# llmpi — the one build entry point.
#   make            build everything into build/ (CUDA part too when nvcc is found; CUDA=0 to skip)
#   make run        install missing packages, build, make the demo data set, train on 2 ranks
#   make test       install missing packages, build, run unit + MPI integration tests
#   make deps       install missing Debian packages (as root), or print the command to run
#   make bench      the reference-configuration throughput benchmark (see docs/PERF.md)
# Variables: BUILD=dir (default build), CUDA=0|1, NP=ranks for `run` (default 2), OPT=-O3 flags.

BUILD ?= build
NP    ?= 2
SHELL := /bin/bash

# ---- dependencies ---------------------------------------------------------------------------
DEB_PACKAGES := mpich libmpich-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libopenblas-dev \
                libcli11-dev libgtest-dev libbenchmark-dev pkg-config
DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all deps run test bench clean demo-data help
all: $(DEPS_STAMP) binaries

deps: $(DEPS_STAMP)
$(DEPS_STAMP):
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "llmpi: installing missing packages: $$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  else \
	    echo "llmpi: missing packages: $$missing"; \
	    echo "llmpi: install them with:  sudo apt-get install -y $$missing"; exit 1; \
	  fi; \
	fi
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
CXXFLAGS := -std=c++17 $(OPT) -g -fopenmp -Wall -Wextra -Wno-unused-parameter -MMD -MP \
            -Isrc $(HDF5_CFLAGS)
LDLIBS   := $(HDF5_LIBS) -lopenblas -fopenmp -lpthread

ifeq ($(SAN),1)
CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer
LDLIBS   += -fsanitize=address,undefined
endif

# CUDA: compiled when nvcc exists unless CUDA=0.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),0)
NVCC :=
endif

# ---- sources --------------------------------------------------------------------------------
# Library: every .cpp under src/ except the program mains in src/apps/.
LIB_SRC  := $(shell find src -name '*.cpp' -not -path 'src/apps/*' | sort)
LIB_OBJ  := $(LIB_SRC:%.cpp=$(BUILD)/obj/%.o)
APPS     := llmpi-train llmpi-prep llmpi-demo-corpus
APP_BINS := $(APPS:%=$(BUILD)/%)
TEST_SRC := $(sort $(wildcard tests/*.cpp))
TEST_OBJ := $(TEST_SRC:%.cpp=$(BUILD)/obj/%.o)
BENCH_SRC:= $(sort $(wildcard bench/*.cpp))
BENCH_BINS := $(BENCH_SRC:bench/%.cpp=$(BUILD)/bench-%)

binaries: $(APP_BINS) $(BUILD)/llmpi-tests $(BENCH_BINS)

$(BUILD)/obj/%.o: %.cpp | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/libllmpi.a: $(LIB_OBJ)
	@rm -f $@ && ar rcs $@ $^

$(BUILD)/llmpi-%: $(BUILD)/obj/src/apps/%_main.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(LDLIBS)

$(BUILD)/llmpi-demo-corpus: $(BUILD)/obj/src/apps/demo_corpus_main.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(LDLIBS)

$(BUILD)/llmpi-tests: $(TEST_OBJ) $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ -lgtest -lpthread $(LDLIBS)

$(BUILD)/bench-%: $(BUILD)/obj/bench/%.o $(BUILD)/libllmpi.a
	$(CXX) $^ -o $@ $(LDLIBS)

# ---- the two quick-start commands -----------------------------------------------------------
DEMO_DIR := $(BUILD)/demo
demo-data: $(DEMO_DIR)/train.h5
$(DEMO_DIR)/train.h5: $(BUILD)/llmpi-demo-corpus $(BUILD)/llmpi-prep
	@mkdir -p $(DEMO_DIR)
	$(BUILD)/llmpi-demo-corpus --out $(DEMO_DIR)/corpus.txt --seed 1234 --megabytes 4
	$(BUILD)/llmpi-prep --tokenizer byte --input $(DEMO_DIR)/corpus.txt --out $(DEMO_DIR) \
	    --val-fraction 0.05

run: all demo-data
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpiexec -n $(NP) $(BUILD)/llmpi-train \
	    --config data/demo.json --set run.dir=$(BUILD)/runs/demo

test: all
	BUILD=$(BUILD) tools/run_tests.sh

bench: all
	BUILD=$(BUILD) /usr/bin/python3 bench/run_reference.py

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
