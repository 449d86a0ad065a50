// fiber.h's scheduler. On x86-64 a switch saves and loads the callee-saved registers, the SSE and
// x87 control words and the stack pointer (llmpi_sim_switch below, ~a dozen instructions);
// elsewhere (or with -DLLMPI_SIM_UCONTEXT) it is ucontext's swapcontext (a system call per
// switch: slower, the same schedule).
// Stacks are 256 KB of reserved memory each (only the pages a kernel touches are committed), a
// guard page below each, kept per OS thread for the next block. Under AddressSanitizer (SAN=1)
// every switch is announced to it (__sanitizer_start/finish_switch_fiber).
#include "fiber.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if !defined(__x86_64__) || defined(LLMPI_SIM_UCONTEXT)
#define LLMPI_SIM_USE_UCONTEXT 1
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define LLMPI_SIM_ASAN 1
#endif

namespace llmpi::sim {
namespace {

constexpr size_t kStackBytes = 256 * 1024, kGuardBytes = 4096;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cuda_cpu_sim: %s\n", what);
  std::abort();
}

struct Stack {
  char* low = nullptr;  // the lowest usable byte (the guard page is below it)
};
Stack new_stack() {
  void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) fail("mmap of a fiber stack failed");
  if (mprotect(p, kGuardBytes, PROT_NONE) != 0) fail("mprotect of a fiber stack's guard page failed");
  return {static_cast<char*>(p) + kGuardBytes};
}

#ifndef LLMPI_SIM_USE_UCONTEXT
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Scheduler {
  int n = 0;
  void (*enter)(int, void*) = nullptr;
  void* arg = nullptr;
  int current = -1;
  Context home;                 // the OS thread's own context, to which every fiber switches back
  std::vector<Context> fiber;   // each fiber's saved context
  std::vector<Wait> state;
#ifdef LLMPI_SIM_ASAN
  std::vector<void*> fake_stack;  // ASan's per-fiber bookkeeping
  void* home_fake_stack = nullptr;
  const void* home_bottom = nullptr;
  size_t home_size = 0;
#endif
};
thread_local Scheduler* t_scheduler = nullptr;
thread_local std::vector<Stack> t_stacks;  // reused by every block this OS thread runs

}  // namespace
}  // namespace llmpi::sim

#ifndef LLMPI_SIM_USE_UCONTEXT
// void llmpi_sim_switch(void** save_sp, void* load_sp): saves this context on its stack and its
// stack pointer in *save_sp, then resumes the context saved at load_sp. The saved frame, from
// the stack pointer up: 8 bytes unused, MXCSR (4), x87 control word (2), 2 unused, r15, r14, r13,
// r12, rbx, rbp, return address.
extern "C" void llmpi_sim_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .globl llmpi_sim_switch
    .hidden llmpi_sim_switch
    .type llmpi_sim_switch, @function
llmpi_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw 12(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw 12(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size llmpi_sim_switch, .-llmpi_sim_switch
)");
#endif

namespace llmpi::sim {
namespace {

void switch_context(Context& from, Context& to) {
#ifndef LLMPI_SIM_USE_UCONTEXT
  llmpi_sim_switch(&from.sp, to.sp);
#else
  if (swapcontext(&from.uc, &to.uc) != 0) fail("swapcontext failed");
#endif
}

// (ASan) the switches from and back to the OS thread's own stack
void announce_to_fiber(Scheduler& s, int t) {
#ifdef LLMPI_SIM_ASAN
  __sanitizer_start_switch_fiber(&s.home_fake_stack, t_stacks[t].low, kStackBytes);
#else
  (void)s, (void)t;
#endif
}
void arrived_in_fiber(Scheduler& s, int t) {
#ifdef LLMPI_SIM_ASAN
  __sanitizer_finish_switch_fiber(s.fake_stack[t], &s.home_bottom, &s.home_size);
#else
  (void)s, (void)t;
#endif
}
void announce_to_home(Scheduler& s, int t, bool returned) {
#ifdef LLMPI_SIM_ASAN
  __sanitizer_start_switch_fiber(returned ? nullptr : &s.fake_stack[t], s.home_bottom, s.home_size);
#else
  (void)s, (void)t, (void)returned;
#endif
}
void arrived_home(Scheduler& s) {
#ifdef LLMPI_SIM_ASAN
  __sanitizer_finish_switch_fiber(s.home_fake_stack, nullptr, nullptr);
#else
  (void)s;
#endif
}

// Where every fiber starts, on its own stack; it never returns (its last switch is home)
[[noreturn]] void fiber_main() {
  Scheduler& s = *t_scheduler;
  const int t = s.current;
  arrived_in_fiber(s, t);
  s.enter(t, s.arg);
  s.state[t] = Wait::returned;
  announce_to_home(s, t, true);
  switch_context(s.fiber[t], s.home);
  fail("a returned fiber was resumed");
}

void prepare(Scheduler& s, int t) {
  char* top = t_stacks[t].low + kStackBytes;  // 16-byte aligned (mmap gives pages)
#ifndef LLMPI_SIM_USE_UCONTEXT
  auto* sp = reinterpret_cast<uint64_t*>(top) - 10;  // llmpi_sim_switch's frame, then a fake return slot
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = 0;
  sp[1] = mxcsr | static_cast<uint64_t>(fpucw) << 32;
  for (int r = 2; r < 8; r++) sp[r] = 0;                  // r15 .. rbp
  sp[8] = reinterpret_cast<uint64_t>(&fiber_main);          // the switch's `ret` goes here, leaving
  sp[9] = 0;                                                // the stack as a call would (rsp = 8 mod 16)
  s.fiber[t].sp = sp;
#else
  ucontext_t& uc = s.fiber[t].uc;
  if (getcontext(&uc) != 0) fail("getcontext failed");
  uc.uc_stack.ss_sp = t_stacks[t].low;
  uc.uc_stack.ss_size = kStackBytes;
  uc.uc_link = nullptr;
  makecontext(&uc, reinterpret_cast<void (*)()>(&fiber_main), 0);
  (void)top;
#endif
}

[[noreturn]] void deadlock(const Scheduler& s) {
  std::fprintf(stderr, "cuda_cpu_sim: a block's threads wait at barriers that cannot complete:\n");
  for (int w = 0; 32 * w < s.n; w++) {
    int at_block = 0, returned = 0;
    std::fprintf(stderr, "  warp %d: lanes at __syncwarp (or a shuffle):", w);
    for (int t = 32 * w; t < std::min(s.n, 32 * w + 32); t++) {
      if (s.state[t] == Wait::warp) std::fprintf(stderr, " %d", t % 32);
      at_block += s.state[t] == Wait::block;
      returned += s.state[t] == Wait::returned;
    }
    std::fprintf(stderr, "; %d at __syncthreads; %d returned\n", at_block, returned);
  }
  fail("deadlock (a GPU would hang or misbehave here)");
}

}  // namespace

Schedule schedule() {
  static const Schedule s = [] {
    const char* e = std::getenv("LLMPI_SIM_SCHEDULE");
    if (!e || std::strcmp(e, "lowest") == 0) return Schedule::lowest_first;
    if (std::strcmp(e, "highest") == 0) return Schedule::highest_first;
    fail("LLMPI_SIM_SCHEDULE is `lowest` (the default) or `highest`");
  }();
  return s;
}

void run_fibers(int n, void (*enter)(int, void*), void* arg) {
  if (n <= 0 || n > 1024) fail("run_fibers: a block of 1 to 1024 threads");
  if (t_scheduler) fail("run_fibers inside run_fibers");
  while (static_cast<int>(t_stacks.size()) < n) t_stacks.push_back(new_stack());
  Scheduler s;
  s.n = n;
  s.enter = enter;
  s.arg = arg;
  s.fiber.resize(n);
  s.state.assign(n, Wait::none);
#ifdef LLMPI_SIM_ASAN
  s.fake_stack.assign(n, nullptr);
#endif
  for (int t = 0; t < n; t++) prepare(s, t);
  t_scheduler = &s;

  const int warps = (n + 31) / 32;
  std::vector<int> live_in_warp(warps), waiting_in_warp(warps, 0);
  for (int w = 0; w < warps; w++) live_in_warp[w] = std::min(32, n - 32 * w);
  int live = n, waiting_in_block = 0;
  // the threads that can run, one bit each: the next to run is the lowest (or the highest)
  std::vector<uint64_t> ready((n + 63) / 64, 0);
  auto set_ready = [&](int t) { ready[t / 64] |= uint64_t(1) << (t % 64); };
  for (int t = 0; t < n; t++) set_ready(t);
  const bool highest_first = schedule() == Schedule::highest_first;
  auto next_ready = [&]() -> int {
    const int words = static_cast<int>(ready.size());
    for (int i = 0; i < words; i++) {
      const int w = highest_first ? words - 1 - i : i;
      if (ready[w] == 0) continue;
      return 64 * w + (highest_first ? 63 - __builtin_clzll(ready[w]) : __builtin_ctzll(ready[w]));
    }
    return -1;
  };
  auto release_warp = [&](int w) {
    if (waiting_in_warp[w] == 0 || waiting_in_warp[w] != live_in_warp[w]) return;
    for (int t = 32 * w; t < std::min(n, 32 * w + 32); t++)
      if (s.state[t] == Wait::warp) s.state[t] = Wait::none, set_ready(t);
    waiting_in_warp[w] = 0;
  };
  auto release_block = [&] {
    if (waiting_in_block == 0 || waiting_in_block != live) return;
    for (int t = 0; t < n; t++)
      if (s.state[t] == Wait::block) s.state[t] = Wait::none, set_ready(t);
    waiting_in_block = 0;
  };
  for (int t = next_ready(); t >= 0; t = next_ready()) {
    ready[t / 64] &= ~(uint64_t(1) << (t % 64));
    s.current = t;
    announce_to_fiber(s, t);
    switch_context(s.home, s.fiber[t]);
    arrived_home(s);
    const int w = t / 32;
    switch (s.state[t]) {
      case Wait::warp:
        waiting_in_warp[w]++;
        release_warp(w);
        break;
      case Wait::block:
        waiting_in_block++;
        release_block();
        break;
      case Wait::returned:
        live--;
        live_in_warp[w]--;
        release_warp(w);
        release_block();
        break;
      case Wait::none:
        fail("a fiber came back without waiting or returning");
    }
  }
  t_scheduler = nullptr;
  if (live > 0) deadlock(s);
}

void suspend(Wait w) {
  Scheduler* s = t_scheduler;
  if (!s) fail("a barrier outside a simulated block");
  const int t = s->current;
  s->state[t] = w;
  announce_to_home(*s, t, false);
  switch_context(s->fiber[t], s->home);
  arrived_in_fiber(*s, t);
}

}  // namespace llmpi::sim
