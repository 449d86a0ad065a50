// Small helpers over the serial HDF5 C API, shared by token files and checkpoints: an owning
// handle, quiet error handling (failures become llmpi::Error with HDF5's innermost message),
// scalar attributes, and the pieces of an atomic write (.tmp guard, fsync).
//
// Messages name the object with `what` (e.g. "token file 'x.h5'") and end with `remedy`
// (e.g. "remake it with llmpi-prep").
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>

namespace llmpi::h5 {

// Owning HDF5 identifier: closes itself with the given H5?close function.
struct Id {
  hid_t id = H5I_INVALID_HID;
  herr_t (*close_fn)(hid_t) = nullptr;
  Id() = default;
  Id(hid_t i, herr_t (*fn)(hid_t)) : id(i), close_fn(fn) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id(o.id), close_fn(o.close_fn) { o.id = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept;
  ~Id() { reset(); }
  // Close now; returns the close function's status (0 when there was nothing to close).
  herr_t reset();
  bool valid() const { return id >= 0; }
  operator hid_t() const { return id; }
};

// HDF5 prints its whole error stack to stderr by default; we turn failures into Errors instead.
// (In a thread-safe build the setting is the calling thread's: each thread that calls HDF5 calls it.)
void quiet();

// Whether the HDF5 library in use was built thread-safe (calls from two threads serialised by
// its global lock; Debian's serial build is, its parallel builds are not).
bool library_threadsafe();

// HDF5's exit handler is switched off (H5dont_atexit, from a static initializer in h5_util.cpp):
// when a write fails (disk full), H5Fclose fails too and leaves the file half-closed in HDF5's
// table, and the exit handler then crashes closing it. Every handle we open is an Id closed by
// its destructor, so there is nothing left for the handler to do; the operating system closes
// what a failed close leaves behind.

// Reserve `bytes` of disk for an HDF5 file being written (fallocate with FALLOC_FL_KEEP_SIZE on
// the file's descriptor), so that a disk without room fails here, with the sizes in the message,
// before anything large is written. File systems without fallocate skip the reservation.
void reserve_space(hid_t file, uint64_t bytes, const std::string& path, const std::string& what,
                   const std::string& remedy);
// The innermost message on HDF5's error stack, as " (HDF5: ...)", and clear the stack.
std::string detail();

void write_int_attr(hid_t obj, const char* name, int64_t v, const std::string& what);
void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& what);  // UTF-8, variable length
// Read a scalar attribute of string / any integer type. False when absent; Error when present
// but of the wrong kind or unreadable.
bool read_string_attr(hid_t obj, const char* name, std::string& out, const std::string& what,
                      const std::string& remedy);
bool read_int_attr(hid_t obj, const char* name, int64_t& out, const std::string& what, const std::string& remedy);

// Is there an HDF5 signature at offset 0, 512, 1024, 2048, ... (where HDF5 looks for it)?
bool has_signature(const std::string& path);

// fsync a file or a directory (after a rename), ignoring failures to open it.
void fsync_path(const std::string& path, bool directory);

// Removes the temporary file unless the write got to the rename.
// Make a finished temporary file the real one, atomically and durably: fsync tmp, rename it to
// path, fsync path's directory; then the guard keeps the file. A reader sees the old file or the
// new one, never a partial one; a crash never loses the previous version.
struct TmpFileGuard;
void commit_tmp_file(const std::string& tmp, const std::string& path, TmpFileGuard& guard);

struct TmpFileGuard {
  std::string path;
  bool committed = false;
  ~TmpFileGuard();
};

}  // namespace llmpi::h5
