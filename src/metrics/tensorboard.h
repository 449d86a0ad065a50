// TensorBoard event files: the training curves where TensorBoard looks for them
// (metrics.tensorboard; `tensorboard --logdir` on run.dir or on a folder of run directories).
//
// An event file is a sequence of TFRecords, each one serialised `Event` protocol buffer
// (tensorflow/core/util/event.proto):
//   record  = uint64 length (little-endian) | uint32 masked CRC-32C of the length's 8 bytes
//           | length bytes of data | uint32 masked CRC-32C of the data
//   masked  = ((crc >> 15) | (crc << 17)) + 0xa282ead8
//   Event   = 1: wall_time (double, seconds since the epoch) | 2: step (int64)
//           | 3: file_version (string, the first event: "brain.Event:2")
//           | 5: summary (Summary = repeated 1: Value; Value = 1: tag (string) | 2: simple_value (float))
//           | 7: session_log (SessionLog = 1: status (enum, START = 1))
// The writer encodes exactly these fields, in field order, as the protocol buffer library does,
// so its bytes equal TensorBoard's own writer's for the same events (tests/test_tensorboard.cpp
// holds a file written by PyPI's tensorboard as the reference).
//
// A resumed run writes a new file that begins, after the version, with a SessionLog START at its
// first step: TensorBoard then drops what earlier files logged at that step and later (the steps
// the interrupted run logged after its checkpoint), as llmpi-train trims metrics.jsonl.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace llmpi {

// One event as read back (read_tensorboard_events): what the writer can put in one.
struct TensorboardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                         // "" unless the file's first event
  std::vector<std::pair<std::string, float>> values;  // the summary's scalars, in order
  bool session_start = false;                       // a SessionLog START
};

// The writer of one event file; each event is flushed as it is written, so TensorBoard shows a
// run live and a killed job keeps what it logged.
struct TensorboardWriter {
  // Creates dir/events.out.tfevents.<seconds>.<host>.<pid>.llmpi (a name TensorBoard takes as an
  // event file; a new one, with a suffix .1, .2, ... where that name exists) and writes the version event; with start_step > 0 also the SessionLog START at
  // start_step. wall_clock: seconds since the epoch for every event (tests pass a fixed clock; by
  // default the system's). Throws Error naming the file and the fix when it cannot be written.
  TensorboardWriter(const std::string& dir, int64_t start_step, double (*wall_clock)() = nullptr);
  ~TensorboardWriter();
  TensorboardWriter(const TensorboardWriter&) = delete;
  TensorboardWriter& operator=(const TensorboardWriter&) = delete;
  // One event at `step` holding these scalars (tag, value), as float (TensorBoard's simple_value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  FILE* f_ = nullptr;
  std::string path_;
  double (*clock_)() = nullptr;
  void write_event(const std::string& event);
};

// The encoded Event (the record's data) of one event: exposed for tests, which compare bytes.
std::string encode_tensorboard_event(const TensorboardEvent& e);
// The TFRecord framing of data (length, masked CRCs).
std::string tensorboard_record(const std::string& data);

// Every event of an event file, checking both CRCs of every record; throws Error naming the file
// and the record on a bad CRC, a truncated record or a field this reader does not know how to skip.
std::vector<TensorboardEvent> read_tensorboard_events(const std::string& path);

// The event files of dir (names containing "tfevents"), sorted.
std::vector<std::string> tensorboard_files(const std::string& dir);

}  // namespace llmpi
