// The simulated card's streams and events (tools/cuda_cpu_sim/README.md, "Streams").
//
// Work that the host can do at once (kernels, copies, memsets, GEMMs) still runs on the calling
// thread when it is enqueued; before it runs, reach(stream) waits for what the stream holds.
// What a stream holds is the work that must not run on the calling thread: NCCL operations
// (sim_nccl.cpp: each waits for its peers) and the stream's waits on events. A stream that holds
// any has a thread of its own that takes them in order. Each such item does its work (run) and
// then puts its results into the program's memory (land); an item's results land only when the
// stream needs them, that is, when a later item on the same stream starts, or when something
// waits for the stream (host work on it, an event recorded after the item and waited for or
// queried, a synchronize). So a program that reads a result without the wait CUDA requires
// (cudaStreamWaitEvent, cudaStreamSynchronize, ...) reads the old bytes at every run, not once in
// a while as on a card.
//
// Ordering follows CUDA's: a stream's items in enqueue order; cudaStreamWaitEvent(t, e) holds t's
// later items until the work before e's record has finished; the legacy default stream (null)
// waits for every blocking stream's work, and a blocking stream's work for the legacy stream's
// (cudaStreamCreate; cudaStreamNonBlocking streams do not). cudaFree, cudaFreeHost and
// cudaDeviceSynchronize wait for every stream.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

struct CUstream_st {
  explicit CUstream_st(bool blocking_) : blocking(blocking_) {}
  struct Item {
    std::function<void()> run;   // its work: may wait for peers, or for another stream
    std::function<void()> land;  // its results into the program's memory (may be empty)
  };
  const bool blocking;  // ordered with the legacy default stream
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> items;  // not yet complete; the first is the one the thread works on
  uint64_t enqueued = 0, completed = 0;  // items ever enqueued, ever completed
  uint64_t demand = 0;  // items someone waits for: the first `demand` must land
  bool stop = false;
  std::thread thread;  // started with the first item
};
using cudaStream_t = CUstream_st*;

// An event: the position of its last record in a stream (the first `seq` items of `stream`).
struct CUevent_st {
  CUstream_st* stream = nullptr;  // null: never recorded (waits on it return at once)
  uint64_t seq = 0;
};

namespace llmpi::sim {

// Every stream ever made (streams are never freed: an event may still name a destroyed one),
// the legacy default stream first.
struct Streams {
  std::mutex mu;
  std::vector<CUstream_st*> all;
  std::atomic<bool> any_items{false};  // some stream has held an item (else reach() returns at once)
  Streams() { all.push_back(new CUstream_st(true)); }
};
inline Streams& streams() {
  static Streams* s = new Streams;  // never destroyed: threads may still hold items at exit
  return *s;
}
inline CUstream_st* legacy_stream() { return streams().all.front(); }
inline CUstream_st* resolve(cudaStream_t s) { return s ? s : legacy_stream(); }
inline std::vector<CUstream_st*> all_streams() {
  std::lock_guard<std::mutex> l(streams().mu);
  return streams().all;
}

inline CUstream_st* new_stream(bool blocking) {
  auto* s = new CUstream_st(blocking);
  std::lock_guard<std::mutex> l(streams().mu);
  streams().all.push_back(s);
  return s;
}

inline uint64_t enqueued(CUstream_st* s) {
  std::lock_guard<std::mutex> l(s->mu);
  return s->enqueued;
}

// Waits until the first `seq` items of s have completed (their results landed).
inline void sync_to(CUstream_st* s, uint64_t seq) {
  std::unique_lock<std::mutex> l(s->mu);
  if (s->completed >= seq) return;
  s->demand = std::max(s->demand, seq);
  s->cv.notify_all();
  s->cv.wait(l, [&] { return s->completed >= seq; });
}
// Whether they have; asks for them to land (a host that polls sees them eventually, as on a card)
inline bool reached(CUstream_st* s, uint64_t seq) {
  std::lock_guard<std::mutex> l(s->mu);
  if (s->completed >= seq) return true;
  s->demand = std::max(s->demand, seq);
  s->cv.notify_all();
  return false;
}
inline void sync_stream(CUstream_st* s) { sync_to(s, enqueued(s)); }

// A stream's thread: each item's work, then its landing once the stream needs it.
inline void stream_thread(CUstream_st* s) {
  std::unique_lock<std::mutex> l(s->mu);
  for (;;) {
    s->cv.wait(l, [&] { return !s->items.empty() || s->stop; });
    if (s->items.empty()) return;
    CUstream_st::Item& item = s->items.front();  // deque: push_back keeps references valid
    l.unlock();
    item.run();
    l.lock();
    s->cv.wait(l, [&] { return s->items.size() > 1 || s->demand > s->completed || s->stop; });
    l.unlock();
    if (item.land) item.land();
    l.lock();
    s->items.pop_front();
    s->completed++;
    s->cv.notify_all();
  }
}

inline void push_item(CUstream_st* s, CUstream_st::Item item) {
  streams().any_items.store(true);
  std::lock_guard<std::mutex> l(s->mu);
  s->items.push_back(std::move(item));
  s->enqueued++;
  if (!s->thread.joinable()) s->thread = std::thread(stream_thread, s);
  s->cv.notify_all();
}
// Holds s's later items until the first `seq` items of `on` have completed.
inline void push_wait(CUstream_st* s, CUstream_st* on, uint64_t seq) {
  if (on == s) return;  // a stream's own items are in order already
  {
    std::lock_guard<std::mutex> l(on->mu);
    if (on->completed >= seq) return;
  }
  push_item(s, {[on, seq] { sync_to(on, seq); }, {}});
}
// What work enqueued on s comes after, besides s's own: every blocking stream's for the legacy
// stream, the legacy stream's for a blocking one.
inline void push_implicit_waits(CUstream_st* s) {
  if (!streams().any_items.load()) return;
  CUstream_st* legacy = legacy_stream();
  if (s == legacy) {
    for (CUstream_st* b : all_streams())
      if (b != legacy && b->blocking) push_wait(s, b, enqueued(b));
  } else if (s->blocking) {
    push_wait(s, legacy, enqueued(legacy));
  }
}

// An item of work on stream s (sim_nccl.cpp's operations), after what s must wait for.
inline void enqueue(cudaStream_t stream, CUstream_st::Item item) {
  CUstream_st* s = resolve(stream);
  push_implicit_waits(s);
  push_item(s, std::move(item));
}

// Host work is about to run on `stream` (a kernel, a copy, a GEMM): waits for what it comes after.
inline void reach(cudaStream_t stream) {
  if (!streams().any_items.load()) return;
  CUstream_st* s = resolve(stream);
  CUstream_st* legacy = legacy_stream();
  sync_stream(s);
  if (s == legacy) {
    for (CUstream_st* b : all_streams())
      if (b->blocking) sync_stream(b);
  } else if (s->blocking) {
    sync_stream(legacy);
  }
}

inline void record(CUevent_st* e, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  push_implicit_waits(s);
  e->stream = s;
  e->seq = enqueued(s);
}
inline void wait_event(cudaStream_t stream, const CUevent_st* e) {
  if (e->stream) push_wait(resolve(stream), e->stream, e->seq);
}

inline void device_sync() {
  if (!streams().any_items.load()) return;
  for (CUstream_st* s : all_streams()) sync_stream(s);
}

// cudaStreamDestroy: its work finishes (as CUDA's does), its thread ends; the record stays.
inline void destroy_stream(CUstream_st* s) {
  sync_stream(s);
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  if (s->thread.joinable()) s->thread.join();
}

}  // namespace llmpi::sim
