# toy: plain Makefile. `make` builds build/libtoy.a, build/libtoy.so and
# build/toy; `make check` runs every test; `make bench` the benchmarks;
# `make deps` installs the Debian packages; `make asan` runs the unit tests
# under AddressSanitizer + UBSan. Sources are found by wildcard, so adding a
# file under src/, cli/ or tests/ needs no edit here.

CC ?= cc
ifeq ($(CC),cc)
CC := gcc
endif

# MPI=1: data parallelism across processes over Open MPI
# (src/train/collective-mpi.c, docs/distributed.md), into build-mpi/ unless
# BUILD says otherwise. The default build needs no MPI.
ifeq ($(MPI),1)
BUILD ?= build-mpi
endif

# CUDA=1: the CUDA backend (src/backends/cuda/, docs/cuda.md) built with
# nvcc from CUDA_HOME, into build-cuda/ unless BUILD says otherwise. Needs
# the CUDA toolkit (cuBLAS, NCCL) but no GPU to build. The default build
# needs no CUDA at all.
ifeq ($(CUDA),1)
BUILD ?= build-cuda
endif
# CUDA_MOCK=1: the CUDA backend's host side over a stand-in runtime whose
# "kernels" are the CPU's (tools/cuda-mock.c): runs tests/test-cuda.c on a
# machine without a GPU, checking the executor, not the kernels.
ifeq ($(CUDA_MOCK),1)
BUILD ?= build-cuda-mock
endif
# CUDA_EMU=1: the CUDA backend with its real kernels, compiled by g++ and
# run on the CPU by an emulator (tools/cuda-emu/: GPU threads as fibers,
# barriers and warp shuffles as switches between them) over the mock's
# runtime: tests/test-cuda.c then checks the kernels' own logic without a GPU.
ifeq ($(CUDA_EMU),1)
BUILD ?= build-cuda-emu
endif

SANITIZE ?=
ifeq ($(SANITIZE),1)
BUILD ?= build-asan
OPT ?= -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
else
BUILD ?= build
OPT ?= -O2 -g
LDSAN :=
endif

# Warnings are errors here and in CI; WERROR= keeps them warnings, for a
# compiler newer than CI's whose new warnings should not stop a build on a
# machine visited once (tools/gpu-check.sh on a GPU machine's image).
WERROR ?= -Werror
CPPFLAGS += -Iinclude -Isrc -D_GNU_SOURCE
# -ffp-contract=off: a * b + c is not fused into an FMA behind the code's back.
# gcc in ISO C mode already does not; clang does by default, and then a
# kernel's scalar tail rounds differently from the reference it must match
# bit for bit. Kernels that want an FMA ask for one by intrinsic.
CFLAGS += -std=c11 $(OPT) -Wall -Wextra $(WERROR) -fPIC -pthread \
          -Wno-unused-parameter -fno-math-errno -ffp-contract=off
LDLIBS += -lopenblas -lpcre2-8 -lutf8proc -ljansson -lmicrohttpd -lz -lstb -lm -lpthread -ldl
LDFLAGS += $(LDSAN) -pthread
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS := $(shell pkg-config --libs ompi-c 2>/dev/null)
ifeq ($(MPI_LIBS),)
$(error MPI=1 needs Open MPI: bash tools/deps.sh --mpi (Debian openmpi-bin, libopenmpi-dev))
endif
CPPFLAGS += -DTOY_MPI $(patsubst -I%,-isystem %,$(MPI_CFLAGS))
LDLIBS += $(MPI_LIBS)
endif

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(wildcard $(NVCC)),)
$(error CUDA=1 needs nvcc: $(NVCC) not found (set CUDA_HOME))
endif
# Hopper machine code plus Ampere PTX, which the driver compiles for newer GPUs
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80
CPPFLAGS += -DTOY_CUDA -isystem $(CUDA_HOME)/include
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter $(if $(WERROR),-Werror all-warnings)
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lnccl -lstdc++
CU_SRC := $(sort $(wildcard src/backends/cuda/*.cu))
endif

ifeq ($(CUDA_MOCK),1)
CUDA_HOME ?= /usr/local/cuda
CPPFLAGS += -DTOY_CUDA -DTOY_CUDA_MOCK -isystem $(CUDA_HOME)/include
MOCK_SRC := tools/cuda-mock.c
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl
endif

ifeq ($(CUDA_EMU),1)
CUDA_HOME ?= /usr/local/cuda
CXX ?= g++
CPPFLAGS += -DTOY_CUDA -DTOY_CUDA_MOCK -DTOY_CUDA_EMU -isystem $(CUDA_HOME)/include
MOCK_SRC := tools/cuda-mock.c
EMU_OBJ := $(patsubst %.cu,$(BUILD)/emu/%.o,$(sort $(wildcard src/backends/cuda/*.cu))) $(BUILD)/tools/cuda-emu/emu.o
EMU_CXXFLAGS := -std=c++17 $(OPT) -Wall -Wextra $(WERROR) -Wno-unused-parameter -Wno-unknown-pragmas -fPIC -pthread
EMU_SELFTEST := $(BUILD)/cuda-emu-selftest
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lstdc++
endif

# Files whose name says which ISA they need get the flags for it; run-time
# dispatch decides whether their code is called.
AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c
AMX_FLAGS := $(AVX512_FLAGS) -mamx-tile -mamx-bf16

LIB_SRC := $(sort $(wildcard src/*/*.c src/*/*/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.o) $(MOCK_SRC:%.c=$(BUILD)/%.o) $(EMU_OBJ)
CLI_SRC := $(sort $(wildcard cli/*.c))
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(TEST_SRC) tests/alloc-count.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

PY ?= /usr/bin/python3

.PHONY: all check check-unit asan bench bench-run bench-build deps deps-quiet clean demo fuzz help install uninstall

# `make install` (PREFIX, DESTDIR, BINDIR, LIBDIR, INCLUDEDIR as usual): the
# toy command, libtoy.a, libtoy.so, the headers under toy/ and a pkg-config
# file, so that `cc app.c $$(pkg-config --cflags --libs toy)` builds against
# it. The soname follows TOY_VERSION (include/toy/toy.h): libtoy.so.MAJOR,
# or libtoy.so.0.MINOR while the major is 0 (each 0.x may change the ABI).
VERSION := $(shell sed -n 's/^\#define TOY_VERSION "\(.*\)"/\1/p' include/toy/toy.h)
VERSION_PARTS := $(subst ., ,$(VERSION))
SONAME := libtoy.so.$(if $(filter 0,$(word 1,$(VERSION_PARTS))),0.$(word 2,$(VERSION_PARTS)),$(word 1,$(VERSION_PARTS)))
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PUBLIC_HEADERS := $(sort $(wildcard include/toy/*.h))

all: $(BUILD)/libtoy.a $(BUILD)/libtoy.so $(BUILD)/toy

help:
	@echo "make            build libtoy.a, libtoy.so and toy (in $(BUILD)/)"
	@echo "make demo       install deps, build, run the demo"
	@echo "make check      install deps, build, run every test"
	@echo "make asan       the unit tests under ASan + UBSan"
	@echo "make bench      benchmarks against peers (PyTorch, BLAS)"
	@echo "make deps       install the Debian packages toy needs"
	@echo "make install    toy, libtoy and its headers + toy.pc under PREFIX (/usr/local)"

$(BUILD)/%-avx2.o: %-avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%-avx512.o: %-avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%-amx.o: %-amx.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(AMX_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# CUDA_EMU=1: a .cu file rewritten as C++ (launch syntax, dynamic shared
# memory), compiled with the emulator's header first
.PRECIOUS: $(BUILD)/emu/%.cc
$(BUILD)/emu/%.cc: %.cu tools/cuda-emu/cu2cc.pl
	@mkdir -p $(dir $@)
	perl tools/cuda-emu/cu2cc.pl $< > $@.tmp && mv $@.tmp $@
$(BUILD)/emu/%.o: $(BUILD)/emu/%.cc tools/cuda-emu/emu.h
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -include tools/cuda-emu/emu.h -MMD -MP -c $< -o $@
$(BUILD)/tools/cuda-emu/emu.o: tools/cuda-emu/emu.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@
# the emulator's own checks (tools/cuda-emu/selftest.cu), run by check-cuda
$(BUILD)/cuda-emu-selftest: $(BUILD)/emu/tools/cuda-emu/selftest.o $(BUILD)/libtoy.a
	$(CXX) $(LDFLAGS) -o $@ $< $(BUILD)/libtoy.a $(LDLIBS)

# tests/test-cuda.c alone: on a GPU with CUDA=1, through the executor with
# CPU kernels with CUDA_MOCK=1, or with the real kernels on the CPU's
# emulator with CUDA_EMU=1 (neither needs a GPU). The emulator's run is in
# its default, shuffled schedule; then again with TOY_EMU_ORDER=forward and
# =reverse (tools/cuda-emu/emu.cc), which between them run every two
# threads of a barrier interval, and every two blocks of a grid, both ways
# round: a kernel missing a barrier fails whichever thread writes first.
# Those two runs leave out the device-optimizer tests (their kernels are
# grid-stride loops and block_sum_d, which the rest run), and the largest
# tests whose kernels smaller ones run too: the k-quant and GPT-2 fused
# decodes (the GEMVs' reductions run unfused and in the Llama's fused
# decode), the backward without room for dS (its dQ recomputing dS runs in
# the bf16 attention tests, at TOY_CUDA_ATTN_DS_MB=0) and the products in
# padded chunks (copies in grid-stride loops): 3/5 of these runs' time.
EMU_ORDER_TESTS := cuda/!(adamw_on_device_*|device_optimizer_*|kquant_fused_*|gpt2_fused_*|attention_backward_without_room_for_ds|products_with_unaligned_c_rows)
.PHONY: check-cuda
check-cuda: $(BUILD)/toy $(BUILD)/toy-tests $(EMU_SELFTEST)
	$(if $(EMU_SELFTEST),./$(EMU_SELFTEST) && rm -f $(BUILD)/emu-kernels.txt)
	$(if $(EMU_SELFTEST),TOY_EMU_KERNELS=$(CURDIR)/$(BUILD)/emu-kernels.txt) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  TOY_BIN=$(BUILD)/toy ./$(BUILD)/toy-tests --filter 'cuda/*' -j2
	$(if $(EMU_SELFTEST),bash tools/cuda-emu/coverage.sh $(BUILD)/emu-kernels.txt)
	$(if $(EMU_SELFTEST),set -e; for o in forward reverse; do echo "check-cuda: TOY_EMU_ORDER=$$o"; \
	  TOY_EMU_ORDER=$$o ./$(EMU_SELFTEST); TOY_EMU_ORDER=$$o LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  TOY_BIN=$(BUILD)/toy ./$(BUILD)/toy-tests --filter '$(EMU_ORDER_TESTS)' -j2; done)

# CUDA=1: the device code's plain arithmetic (dequantizers, indexing) run on
# the host against the CPU library; needs no GPU (tools/cuda-host-check.cu)
.PHONY: cuda-host-check
cuda-host-check: $(BUILD)/cuda-host-check
	./$(BUILD)/cuda-host-check
$(BUILD)/cuda-host-check: $(BUILD)/tools/cuda-host-check.o $(BUILD)/libtoy.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtoy.a $(LDLIBS)

$(BUILD)/libtoy.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libtoy.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)

$(BUILD)/toy: $(CLI_OBJ) $(BUILD)/libtoy.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libtoy.a $(LDLIBS)

# The test binary counts heap allocations (tests/alloc-count.c) through
# the linker's --wrap, to prove a training step allocates nothing.
WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign,--wrap=aligned_alloc
$(BUILD)/toy-tests: $(TEST_OBJ) $(BUILD)/libtoy.a
	$(CC) $(LDFLAGS) $(WRAP) -o $@ $(TEST_OBJ) $(BUILD)/libtoy.a -lcriterion $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(BUILD)/libtoy.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libtoy.a $(LDFLAGS) $(LDLIBS)

# Reference data computed by PyTorch once per build (tests/torch/*.py).
TORCH_REFS := $(BUILD)/refs/ops.json $(BUILD)/refs/train.json
$(BUILD)/refs/ops.json: tests/torch/gen_op_refs.py
	@mkdir -p $(dir $@)
	$(PY) tests/torch/gen_op_refs.py $(dir $@)
$(BUILD)/refs/train.json: tests/torch/gen_train_refs.py
	@mkdir -p $(dir $@)
	$(PY) tests/torch/gen_train_refs.py $(dir $@)

# Every test: the unit tests, then the CLI tests. The last line printed is
# Criterion's "Synthesis: ..." summary.
check: deps-quiet
	@$(MAKE) --no-print-directory check-unit

# The unit tests alone (what `make asan` runs under the sanitizers).
check-unit: all $(BUILD)/toy-tests $(TORCH_REFS)
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp TOY_REFS=$(BUILD)/refs TOY_BIN=$(BUILD)/toy \
	    ./$(BUILD)/toy-tests -j2 --timeout 900

asan:
	$(MAKE) SANITIZE=1 check-unit

bench: deps-quiet
	@$(MAKE) --no-print-directory bench-run

bench-run: all $(BENCH_BIN)
	TOY_BUILD=$(BUILD) PY=$(PY) bash bench/run.sh

# the benchmark programs without running them (CI: they must not rot)
bench-build: $(BENCH_BIN)

demo: deps-quiet
	@$(MAKE) --no-print-directory all
	./$(BUILD)/toy demo

deps:
	@bash tools/deps.sh

deps-quiet:
	@bash tools/deps.sh --quiet

fuzz:
	$(MAKE) -f fuzz/Makefile

# toy.pc names the install folders, so install writes it in place
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/toy
	install -m 755 $(BUILD)/toy $(DESTDIR)$(BINDIR)/toy
	install -m 644 $(BUILD)/libtoy.a $(DESTDIR)$(LIBDIR)/libtoy.a
	install -m 755 $(BUILD)/libtoy.so $(DESTDIR)$(LIBDIR)/libtoy.so.$(VERSION)
	ln -sf libtoy.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libtoy.so
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/toy/
	@{ echo 'prefix=$(PREFIX)'; echo 'libdir=$(LIBDIR)'; echo 'includedir=$(INCLUDEDIR)'; echo; \
	   echo 'Name: toy'; echo 'Description: a small, readable and fast transformer framework'; \
	   echo 'Version: $(VERSION)'; echo 'Requires: jansson'; \
	   echo 'Cflags: -I$${includedir}'; echo 'Libs: -L$${libdir} -ltoy'; \
	   echo 'Libs.private: $(LDFLAGS) $(LDLIBS)'; } > $(DESTDIR)$(LIBDIR)/pkgconfig/toy.pc
	@# the dynamic linker's cache learns the new library (not for a staged DESTDIR)
	$(if $(DESTDIR),,-command -v ldconfig >/dev/null && ldconfig 2>/dev/null)

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/toy $(DESTDIR)$(LIBDIR)/libtoy.a $(DESTDIR)$(LIBDIR)/libtoy.so \
	      $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libtoy.so.$(VERSION) \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/toy.pc $(addprefix $(DESTDIR)$(INCLUDEDIR)/toy/,$(notdir $(PUBLIC_HEADERS)))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/toy 2>/dev/null

clean:
	rm -rf build build-asan build-* 

# the objects' header dependencies, the two CUDA checks' too (cuda-host-check
# includes the kernel sources; the emulator's selftest its header)
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/tools/cuda-host-check.d \
  $(BUILD)/emu/tools/cuda-emu/selftest.d
