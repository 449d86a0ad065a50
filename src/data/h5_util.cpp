#include "data/h5_util.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace llmpi::h5 {

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id = o.id;
    close_fn = o.close_fn;
    o.id = H5I_INVALID_HID;
  }
  return *this;
}

herr_t Id::reset() {
  herr_t rc = 0;
  if (id >= 0 && close_fn) rc = close_fn(id);
  id = H5I_INVALID_HID;
  return rc;
}

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

bool library_threadsafe() {
  hbool_t yes = false;
  return H5is_library_threadsafe(&yes) >= 0 && yes;
}

// No H5_term_library at exit (see h5_util.h). H5dont_atexit works only before the library
// initialises, and static initialisers elsewhere may already use HDF5 (H5T_* constants call
// H5open), so this runs as a constructor of priority 101, before every ordinary static initialiser.
__attribute__((constructor(101))) static void no_hdf5_exit_handler() { H5dont_atexit(); }

void reserve_space(hid_t file, uint64_t bytes, const std::string& path, const std::string& what,
                   const std::string& remedy) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle) {
    H5Eclear2(H5E_DEFAULT);
    return;  // not the POSIX (sec2) driver: nothing to reserve on
  }
  const int fd = *static_cast<int*>(handle);
  if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes)) == 0) return;
  const int err = errno;
  if (err != ENOSPC && err != EDQUOT) return;  // EOPNOTSUPP and the like: write without it
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct statvfs vfs;
  std::string free_text;
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", and %.1f MB are free there", double(vfs.f_bavail) * vfs.f_frsize / 1e6);
    free_text = buf;
  }
  char need[64];
  std::snprintf(need, sizeof need, "%.1f MB", double(bytes) / 1e6);
  fail("cannot write ", what, ": it needs about ", need, " in '", dir, "'", free_text, " (",
       std::strerror(err), "); ", remedy);
}

static herr_t first_error_cb(unsigned, const H5E_error2_t* e, void* data) {
  auto* s = static_cast<std::string*>(data);
  if (s->empty() && e->desc && e->desc[0]) *s = e->desc;
  return 0;
}

std::string detail() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_error_cb, &s);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';  // error messages are one line
  return s.empty() ? std::string() : " (HDF5: " + s + ")";
}

void write_int_attr(hid_t obj, const char* name, int64_t v, const std::string& what) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr, H5T_NATIVE_INT64, &v) < 0)
    fail("cannot write attribute '", name, "' to ", what, detail(),
         "; check the disk space and permissions of its directory");
}

void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& what) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char* p = v.c_str();
  if (!attr.valid() || H5Awrite(attr, type, &p) < 0)
    fail("cannot write attribute '", name, "' to ", what, detail(),
         "; check the disk space and permissions of its directory");
}

// Open a scalar (one-element) attribute; invalid Id when it does not exist.
static Id open_scalar_attr(hid_t obj, const char* name, const std::string& what, const std::string& remedy) {
  htri_t exists = H5Aexists(obj, name);
  if (exists < 0) fail(what, " is damaged: cannot look up attribute '", name, "'", detail(), "; ", remedy);
  if (exists == 0) return Id();
  Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Id space(H5Aget_space(attr), H5Sclose);
  if (!attr.valid() || !space.valid())
    fail(what, " is damaged: cannot open attribute '", name, "'", detail(), "; ", remedy);
  if (H5Sget_simple_extent_npoints(space) != 1)
    fail(what, ": attribute '", name, "' should hold one value but holds several; ", remedy);
  return attr;
}

bool read_string_attr(hid_t obj, const char* name, std::string& out, const std::string& what,
                      const std::string& remedy) {
  Id attr = open_scalar_attr(obj, name, what, remedy);
  if (!attr.valid()) return false;
  Id type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) fail(what, ": attribute '", name, "' should be a string; ", remedy);
  if (H5Tis_variable_str(type) > 0) {
    Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));
    char* p = nullptr;
    if (H5Aread(attr, mem, &p) < 0)
      fail(what, " is damaged: cannot read attribute '", name, "'", detail(), "; ", remedy);
    out = p ? p : "";
    if (p) H5free_memory(p);
  } else {
    size_t n = H5Tget_size(type);
    std::string buf(n + 1, '\0');
    if (H5Aread(attr, type, &buf[0]) < 0)
      fail(what, " is damaged: cannot read attribute '", name, "'", detail(), "; ", remedy);
    out.assign(buf.c_str());  // up to the first NUL (null-terminated or null-padded)
  }
  return true;
}

bool read_int_attr(hid_t obj, const char* name, int64_t& out, const std::string& what, const std::string& remedy) {
  Id attr = open_scalar_attr(obj, name, what, remedy);
  if (!attr.valid()) return false;
  Id type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_INTEGER) fail(what, ": attribute '", name, "' should be an integer; ", remedy);
  if (H5Aread(attr, H5T_NATIVE_INT64, &out) < 0)
    fail(what, " is damaged: cannot read attribute '", name, "'", detail(), "; ", remedy);
  return true;
}

bool has_signature(const std::string& path) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  bool found = false;
  unsigned char buf[8];
  for (long off = 0; !found; off = off ? off * 2 : 512) {
    if (std::fseek(f, off, SEEK_SET) != 0 || std::fread(buf, 1, 8, f) != 8) break;
    found = std::memcmp(buf, sig, 8) == 0;
  }
  std::fclose(f);
  return found;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void commit_tmp_file(const std::string& tmp, const std::string& path, TmpFileGuard& guard) {
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno),
         "; check the permissions of the output directory");
  guard.committed = true;
  const size_t slash = path.find_last_of('/');
  fsync_path(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash), true);
}

TmpFileGuard::~TmpFileGuard() {
  if (!committed) std::remove(path.c_str());
}

}  // namespace llmpi::h5
