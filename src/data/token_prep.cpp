// llmpi-prep's main work on N ranks. Contract: token_prep.h.
#include "data/token_prep.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "runtime/large_count.h"
#include "data/h5_util.h"
#include "data/path_util.h"
#include "data/prep_manifest.h"
#include "data/text_input.h"
#include "data/token_file.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"
#include "tokenizer/tokenizer.h"

namespace llmpi {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// 1234567 -> "1,234,567"
std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return v < 0 ? "-" + s : s;
}

// Every rank runs f; when one fails, every rank throws the first failure's message.
template <class F>
void collective(MPI_Comm comm, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
  }
  const std::string agreed = agree_on_error(comm, err);
  if (!agreed.empty()) throw Error(agreed);
}

void bcast_string(MPI_Comm comm, std::string& s) {
  int64_t n = int64_t(s.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, comm);
  s.resize(size_t(n));
  if (n > 0) MPI_Bcast(&s[0], mpi_count(s.size(), "a message of the preparation's ranks"), MPI_CHAR, 0, comm);
}

// Rank 0 runs f; its failure reaches every rank.
template <class F>
void on_root(MPI_Comm comm, int rank, F&& f) {
  std::string err;
  if (rank == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "unknown error";
    }
  }
  bcast_string(comm, err);
  if (!err.empty()) throw Error(err);
}

void sum_in_place(MPI_Comm comm, std::vector<int64_t>& v) {
  if (!v.empty())  // one total per input unit
    MPI_Allreduce(MPI_IN_PLACE, v.data(), mpi_count(v.size(), "per-unit totals"), MPI_INT64_T, MPI_SUM, comm);
}

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string work_file(const std::string& work, size_t unit, const char* ext) {
  char name[32];
  std::snprintf(name, sizeof name, "u%07zu.%s", unit, ext);
  return join_path(work, name);
}

nlohmann::json units_to_json(const std::vector<InputUnit>& units) {
  nlohmann::json a = nlohmann::json::array();
  for (const InputUnit& u : units)
    a.push_back({u.path, int(u.format), u.compressed, u.stream, u.begin, u.end, u.bytes});
  return a;
}
std::vector<InputUnit> units_from_json(const nlohmann::json& a) {
  std::vector<InputUnit> units;
  for (const nlohmann::json& e : a) {
    InputUnit u;
    u.path = e[0].get<std::string>();
    u.format = InputFormat(e[1].get<int>());
    u.compressed = e[2].get<bool>();
    u.stream = e[3].get<bool>();
    u.begin = e[4].get<int64_t>();
    u.end = e[5].get<int64_t>();
    u.bytes = e[6].get<int64_t>();
    units.push_back(u);
  }
  return units;
}

// Largest first, each to the least loaded rank; streams (standard input, named pipes) to rank 0.
std::vector<int> assign_units(const std::vector<InputUnit>& units, int ranks) {
  std::vector<int> owner(units.size(), 0);
  std::vector<size_t> order(units.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return units[a].bytes > units[b].bytes; });
  std::vector<int64_t> load(size_t(ranks), 0);
  for (size_t i : order) {
    int r = 0;
    if (!units[i].stream) r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[size_t(r)] += std::max<int64_t>(units[i].bytes, 1);
  }
  return owner;
}

// ---- progress ---------------------------------------------------------------------------------

// Rank 0 prints every ~2 s: input read by all ranks, rate, time left. The other ranks send their
// counts to rank 0 about once a second (a non-blocking send, skipped while the last is in flight)
// and a final message when they finish.
struct Progress {
  static constexpr int kTag = 7341, kDoneTag = 7342;
  MPI_Comm comm;
  int rank = 0, size = 1;
  int64_t total_bytes = 0;  // 0: unknown (standard input)
  Clock::time_point start = Clock::now(), last_send = Clock::now(), last_print = Clock::now();
  bool tty = isatty(2), printed = false;
  int64_t msg[2] = {0, 0};
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int64_t> bytes, tokens;  // rank 0: every rank's latest counts
  int done = 0;

  Progress(MPI_Comm c, int r, int s, int64_t total) : comm(c), rank(r), size(s), total_bytes(total) {
    bytes.assign(size_t(s), 0);
    tokens.assign(size_t(s), 0);
  }
  void receive_pending() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st);
      if (!flag) return;
      int64_t m[2];
      MPI_Recv(m, 2, MPI_INT64_T, st.MPI_SOURCE, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
      bytes[size_t(st.MPI_SOURCE)] = m[0];
      tokens[size_t(st.MPI_SOURCE)] = m[1];
      done += st.MPI_TAG == kDoneTag;
    }
  }
  void print(bool force) {
    if (!force && std::chrono::duration<double>(Clock::now() - last_print).count() < 2.0) return;
    last_print = Clock::now();
    int64_t b = 0, t = 0;
    for (int r = 0; r < size; r++) b += bytes[size_t(r)], t += tokens[size_t(r)];
    const double s = seconds_since(start), rate = s > 0 ? b / s : 0.0;
    char eta[64] = "";
    if (total_bytes > 0 && rate > 0 && b < total_bytes) {
      const int64_t left = int64_t((total_bytes - b) / rate);
      std::snprintf(eta, sizeof eta, ", %lld:%02lld:%02lld left", (long long)(left / 3600),
                    (long long)(left / 60 % 60), (long long)(left % 60));
    }
    char of[48] = "";
    if (total_bytes > 0) std::snprintf(of, sizeof of, " / %.1f MB", total_bytes / 1e6);
    std::fprintf(stderr, "%sllmpi-prep: read %.1f%s, %s tokens, %.1f MB/s on %d rank%s%s%s", tty ? "\r" : "",
                 b / 1e6, of, with_commas(t).c_str(), rate / 1e6, size, size == 1 ? "" : "s", eta,
                 tty ? "\033[K" : "\n");
    std::fflush(stderr);
    printed = true;
  }
  void tick(int64_t my_bytes, int64_t my_tokens) {
    if (rank == 0) {
      bytes[0] = my_bytes;
      tokens[0] = my_tokens;
      if (size > 1) receive_pending();
      print(false);
      return;
    }
    if (std::chrono::duration<double>(Clock::now() - last_send).count() < 1.0) return;
    last_send = Clock::now();
    if (req != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (!flag) return;
    }
    msg[0] = my_bytes;
    msg[1] = my_tokens;
    MPI_Isend(msg, 2, MPI_INT64_T, 0, kTag, comm, &req);
  }
  // Every rank calls it once, after its last unit (also after a failure).
  void finish(int64_t my_bytes, int64_t my_tokens) {
    if (rank != 0) {
      if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
      msg[0] = my_bytes;
      msg[1] = my_tokens;
      MPI_Send(msg, 2, MPI_INT64_T, 0, kDoneTag, comm);
      return;
    }
    bytes[0] = my_bytes;
    tokens[0] = my_tokens;
    while (done < size - 1) {
      receive_pending();
      print(false);
      if (done < size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (printed) {
      print(true);
      if (tty) std::fputc('\n', stderr);
    }
  }
};

// ---- work files ---------------------------------------------------------------------------------

struct File {
  FILE* f = nullptr;
  std::string path;
  File(const std::string& p, const char* mode) : path(p) {
    f = std::fopen(p.c_str(), mode);
    if (!f) fail("cannot open '", p, "': ", std::strerror(errno), "; check the space and permissions of --out");
    std::setvbuf(f, nullptr, _IOFBF, size_t(1) << 22);
  }
  ~File() {
    if (f) std::fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  void write(const void* p, size_t bytes) {
    if (bytes && std::fwrite(p, 1, bytes, f) != bytes)
      fail("cannot write '", path, "': ", std::strerror(errno), "; check the disk space of --out");
  }
  size_t read(void* p, size_t bytes) {
    const size_t n = std::fread(p, 1, bytes, f);
    if (n < bytes && std::ferror(f)) fail("cannot read '", path, "': ", std::strerror(errno));
    return n;
  }
  void close() {
    FILE* g = f;
    f = nullptr;
    if (std::fclose(g) != 0) fail("cannot write '", path, "': ", std::strerror(errno), "; check the disk space of --out");
  }
};

struct UnitCounts {
  int64_t docs = 0, empty_docs = 0, tokens = 0, text_bytes = 0, input_bytes = 0;
};

// Step 2 for one unit: documents to DIR/.llmpi-prep-work/uNNNNNNN.tok (tokens, each document
// preceded by eot_id) and .len (each document's token count, uint32).
UnitCounts tokenize_unit(const InputUnit& unit, DocSplit split, const Tokenizer& tok, bool allow_special,
                         const std::string& tok_path, const std::string& len_path, Progress& progress,
                         int64_t bytes_before, int64_t tokens_before) {
  File tok_file(tok_path, "wb"), len_file(len_path, "wb");
  const bool narrow = tok.vocab_size <= 65535;
  DocumentReader reader(unit, split);
  UnitCounts c;
  std::vector<uint32_t> ids;
  std::vector<uint16_t> ids16;
  std::string_view doc;
  while (reader.next(doc)) {
    ids.clear();
    ids.push_back(uint32_t(tok.eot_id));
    encode_append(tok, doc, ids, allow_special);
    if (ids.size() > UINT32_MAX)
      fail("a document of '", unit.path, "' has ", ids.size() - 1, " tokens, more than llmpi-prep takes (",
           UINT32_MAX - 1, "); split it into smaller documents");
    if (narrow) {
      ids16.assign(ids.begin(), ids.end());
      tok_file.write(ids16.data(), ids16.size() * 2);
    } else {
      tok_file.write(ids.data(), ids.size() * 4);
    }
    const uint32_t n = uint32_t(ids.size());
    len_file.write(&n, 4);
    c.docs++;
    c.tokens += n;
    c.text_bytes += int64_t(doc.size());
    if ((c.docs & 63) == 0 || doc.size() > (1u << 20))
      progress.tick(bytes_before + reader.input_bytes(), tokens_before + c.tokens);
  }
  tok_file.close();
  len_file.close();
  c.empty_docs = reader.empty_documents;
  c.input_bytes = reader.input_bytes();
  return c;
}

// Where each unit's documents are in the global order, and the selection state at its start.
struct UnitLayout {
  std::vector<int64_t> first_doc;    // global index of the unit's first document
  std::vector<int64_t> val_before;   // validation documents before it
};

// Walk a unit's document lengths with the validation choice: f(is_val, length, offset in the unit).
template <class F>
void for_each_document(const std::string& len_path, int64_t first_doc, int64_t val_before,
                       const ValidationChoice& choice, F&& f) {
  File lens(len_path, "rb");
  std::vector<uint32_t> buf(size_t(1) << 16);
  int64_t i = first_doc, chosen = val_before, offset = 0;
  for (size_t n; (n = lens.read(buf.data(), buf.size() * 4) / 4) > 0;) {
    for (size_t j = 0; j < n; j++, i++) {
      const bool val = choice.is_val(i, chosen);
      chosen += val;
      if (!f(val, int64_t(buf[j]), offset)) return;
      offset += buf[j];
    }
  }
}

// A unit's .tok file read forward through a window of 1M tokens (its documents' tokens are asked
// for in increasing order, those of the other split skipped).
struct TokenSpill {
  int fd = -1;
  std::string path;
  int width = 2;
  std::vector<char> raw = std::vector<char>(size_t(4) << 20);
  std::vector<uint32_t> wide;
  int64_t win_start = 0, win_end = 0;  // tokens held in raw
  TokenSpill(const std::string& p, int w) : path(p), width(w) {
    fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot read '", p, "': ", std::strerror(errno));
  }
  ~TokenSpill() { ::close(fd); }
  TokenSpill(const TokenSpill&) = delete;
  TokenSpill& operator=(const TokenSpill&) = delete;
  // Tokens [at, at + count) of the file to the writer.
  void copy(int64_t at, int64_t count, TokenFileWriter& w) {
    while (count > 0) {
      if (at < win_start || at >= win_end) {
        const ssize_t r = ::pread(fd, raw.data(), raw.size(), off_t(at * width));
        if (r < width) fail("cannot read '", path, "': ", r < 0 ? std::strerror(errno) : "it is shorter than expected");
        win_start = at;
        win_end = at + r / width;
      }
      const int64_t n = std::min(count, win_end - at);
      wide.resize(size_t(n));
      const char* p = raw.data() + (at - win_start) * width;
      if (width == 2) {
        for (int64_t k = 0; k < n; k++) {
          uint16_t v;
          std::memcpy(&v, p + 2 * k, 2);
          wide[size_t(k)] = v;
        }
      } else {
        std::memcpy(wide.data(), p, size_t(n) * 4);
      }
      w.append(wide.data(), size_t(n));
      at += n;
      count -= n;
    }
  }
};

struct SplitPlan {
  std::string name;
  bool is_val = false;
  int64_t documents = 0, tokens = 0;
  std::vector<int64_t> unit_tokens;  // this split's tokens per unit, each document with its eot
  std::vector<std::string> files;
  int64_t shard_tokens = 0;
  int64_t first_shard = 0;  // index over all shards (train's, then val's)
};

int64_t peak_rss_bytes_here() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

}  // namespace

bool ValidationChoice::is_val(int64_t i, int64_t chosen) const {
  const uint64_t u = mix64(mix64(seed ^ 0x7072657076616cull) + uint64_t(i));
  const uint64_t scaled = uint64_t((__uint128_t(u) * uint64_t(n - i)) >> 64);
  return int64_t(scaled) < k - chosen;
}

void run_token_prep(const TokenPrepOptions& o, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto t_start = Clock::now();
  const DocSplit split = o.split_docs == "file" ? DocSplit::file : DocSplit::blank_line;

  Tokenizer tok;
  collective(comm, [&] { tok = load_tokenizer(o.tokenizer, o.gpt2_encoder, o.gpt2_merges, o.lowercase); });

  // 1. The destination and the units.
  PrepDestination dest;
  std::vector<InputUnit> units;
  std::string shared;
  on_root(comm, rank, [&] {
    units = plan_input_units(o.inputs, o.input_format, split, o.split_bytes);
    if (units.size() > 10000000)
      fail("the inputs make ", with_commas(int64_t(units.size())), " units of --split-bytes ", o.split_bytes,
           "; give a larger --split-bytes");
    std::vector<std::string> input_paths;
    for (const InputUnit& u : units) input_paths.push_back(u.path);
    dest = open_prep_destination(o.out, o.overwrite, input_paths);  // (held until this function returns)
    for (const std::string& n : dest.notes) std::fprintf(stderr, "llmpi-prep: %s\n", n.c_str());
    if (!dest.leftovers.empty()) {
      std::string names;
      for (size_t i = 0; i < dest.leftovers.size() && i < 3; i++) names += (i ? ", '" : "'") + dest.leftovers[i] + "'";
      if (dest.leftovers.size() > 3) names += " and " + with_commas(int64_t(dest.leftovers.size()) - 3) + " more";
      std::fprintf(stderr, "llmpi-prep: note: removing %s, left by an interrupted llmpi-prep run\n", names.c_str());
    }
    for (const std::string& f : dest.leftovers) {
      std::error_code ec;
      fs::remove_all(f, ec);
      if (ec) fail("cannot remove '", f, "': ", ec.message(), "; remove it by hand");
    }
    const std::string work = join_path(o.out, kPrepWorkDirName);
    std::error_code ec;
    fs::create_directory(work, ec);
    if (ec) fail("cannot create '", work, "': ", ec.message(), "; check the permissions of --out");
    shared = nlohmann::json{{"units", units_to_json(units)}, {"generation", dest.next_generation}}.dump();
  });
  bcast_string(comm, shared);
  const nlohmann::json sj = nlohmann::json::parse(shared);
  if (rank != 0) units = units_from_json(sj["units"]);
  const int64_t generation = sj["generation"].get<int64_t>();
  const std::string work = join_path(o.out, kPrepWorkDirName);
  const std::vector<int> owner = assign_units(units, size);
  const size_t m = units.size();

  std::vector<std::string> new_files;  // committed files of this run (deleted on failure)
  bool switched = false;
  try {
    // 2. Tokenize this rank's units.
    int64_t total_bytes = 0;
    for (const InputUnit& u : units) total_bytes = u.stream || total_bytes < 0 ? -1 : total_bytes + u.bytes;
    Progress progress(comm, rank, size, std::max<int64_t>(total_bytes, 0));
    std::vector<int64_t> docs_of(m, 0);
    UnitCounts mine;
    const auto t_tok = Clock::now();
    std::string err;
    try {
      for (size_t u = 0; u < m; u++) {
        if (owner[u] != rank) continue;
        UnitCounts c = tokenize_unit(units[u], split, tok, o.allow_special, work_file(work, u, "tok"),
                                     work_file(work, u, "len"), progress, mine.input_bytes, mine.tokens);
        docs_of[u] = c.docs;
        mine.docs += c.docs;
        mine.empty_docs += c.empty_docs;
        mine.tokens += c.tokens;
        mine.text_bytes += c.text_bytes;
        mine.input_bytes += c.input_bytes;
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    progress.finish(mine.input_bytes, mine.tokens);
    collective(comm, [&] {
      if (!err.empty()) throw Error(err);
    });
    const double tok_seconds = seconds_since(t_tok);
    std::vector<int64_t> totals = {mine.docs, mine.empty_docs, mine.tokens, mine.text_bytes, mine.input_bytes};
    sum_in_place(comm, totals);
    sum_in_place(comm, docs_of);

    // 3. The validation documents.
    ValidationChoice choice;
    choice.n = totals[0];
    choice.seed = o.seed;
    const int64_t n_docs = totals[0];
    if (n_docs == 0)
      fail("the inputs hold no documents (", with_commas(totals[4]),
           " bytes, all blank or empty); check the --input files and --input-format");
    choice.k = std::llround(o.val_fraction * double(n_docs));
    if (choice.k == 0 || choice.k == n_docs)
      fail("--val-fraction ", o.val_fraction, " of ", n_docs, " document", n_docs == 1 ? "" : "s", " leaves ",
           choice.k == 0 ? "the val split" : "the train split", " empty; ",
           n_docs < 2 ? "give more than one document (e.g. --split-docs blank-line, or several "
                        "--input files with --split-docs file)"
                      : "choose a fraction that gives both splits at least one document");
    UnitLayout layout;
    layout.first_doc.assign(m, 0);
    layout.val_before.assign(m, 0);
    {
      int64_t i = 0, chosen = 0;
      for (size_t u = 0; u < m; u++) {
        layout.first_doc[u] = i;
        layout.val_before[u] = chosen;
        for (const int64_t end = i + docs_of[u]; i < end; i++) chosen += choice.is_val(i, chosen);
      }
    }

    // 4. Each split's tokens per unit, then its shards.
    SplitPlan plans[2];
    plans[0].name = "train";
    plans[1].name = "val";
    plans[1].is_val = true;
    plans[0].documents = n_docs - choice.k;
    plans[1].documents = choice.k;
    for (SplitPlan& p : plans) p.unit_tokens.assign(m, 0);
    collective(comm, [&] {
      for (size_t u = 0; u < m; u++) {
        if (owner[u] != rank) continue;
        for_each_document(work_file(work, u, "len"), layout.first_doc[u], layout.val_before[u], choice,
                          [&](bool val, int64_t len, int64_t) {
                            plans[val].unit_tokens[u] += len;
                            return true;
                          });
      }
    });
    int64_t shards_before = 0;
    for (SplitPlan& p : plans) {
      sum_in_place(comm, p.unit_tokens);
      for (int64_t t : p.unit_tokens) p.tokens += t;
      p.tokens -= 1;  // the stream starts with its first document, not with an eot_id
      const int64_t n_shards = std::max<int64_t>(1, (p.tokens + o.shard_tokens - 1) / o.shard_tokens);
      if (n_shards > kMaxShardsPerSplit)
        fail("the ", p.name, " split holds ", with_commas(p.tokens), " tokens, which makes ", with_commas(n_shards),
             " shards of --shard-tokens ", with_commas(o.shard_tokens), ", more than ", with_commas(kMaxShardsPerSplit),
             "; give a larger --shard-tokens");
      p.shard_tokens = o.shard_tokens;
      p.first_shard = shards_before;
      shards_before += n_shards;
      for (int64_t j = 0; j < n_shards; j++) p.files.push_back(shard_file_name(p.name, j, n_shards, generation));
    }
    on_root(comm, rank, [&] {
      for (const SplitPlan& p : plans)
        for (const std::string& f : p.files)
          if (fs::exists(join_path(o.out, f)) && !o.overwrite)
            fail("'", join_path(o.out, f), "' exists and was not made by llmpi-prep; move it away, or give "
                 "--overwrite to replace it");
    });

    // Each rank writes shards j = rank, rank + N, ...: the stream's tokens [a, b), which are the
    // tokens [a + 1, b + 1) of the units' documents of the split (each with its leading eot_id).
    TokenFileAttrs attrs;
    attrs.vocab_size = tok.vocab_size;
    attrs.eot_id = tok.eot_id;
    attrs.tokenizer = tok.description;
    attrs.created_by = "llmpi-prep";
    const int width = tok.vocab_size <= 65535 ? 2 : 4;
    const int64_t n_all = shards_before;
    std::vector<int64_t> shard_tokens(size_t(n_all), 0), shard_hash(size_t(n_all), 0);
    const auto t_write = Clock::now();
    collective(comm, [&] {
      for (const SplitPlan& p : plans) {
        std::vector<int64_t> starts(m + 1, 0);  // where each unit's part begins in the split
        for (size_t u = 0; u < m; u++) starts[u + 1] = starts[u] + p.unit_tokens[u];
        for (size_t j = 0; j < p.files.size(); j++) {
          const int64_t global = p.first_shard + int64_t(j);
          if (global % size != rank) continue;
          const int64_t a = int64_t(j) * p.shard_tokens + 1, b = std::min(a - 1 + p.shard_tokens, p.tokens) + 1;
          const std::string path = join_path(o.out, p.files[j]);
          TokenFileWriter w;
          w.create(path, b - a, attrs);
          for (size_t u = 0; u < m; u++) {
            if (starts[u + 1] <= a || starts[u] >= b) continue;
            const int64_t lo = std::max(a, starts[u]) - starts[u], hi = std::min(b, starts[u + 1]) - starts[u];
            TokenSpill spill(work_file(work, u, "tok"), width);
            int64_t in_split = 0;  // this split's tokens of the unit before the current document
            for_each_document(work_file(work, u, "len"), layout.first_doc[u], layout.val_before[u], choice,
                              [&](bool val, int64_t len, int64_t offset) {
                                if (val != p.is_val) return true;
                                const int64_t x0 = std::max(in_split, lo), x1 = std::min(in_split + len, hi);
                                if (x0 < x1) spill.copy(offset + (x0 - in_split), x1 - x0, w);
                                in_split += len;
                                return in_split < hi;
                              });
          }
          const std::string hash = w.finish();
          new_files.push_back(path);
          shard_tokens[size_t(global)] = b - a;
          shard_hash[size_t(global)] = int64_t(std::stoull(hash, nullptr, 16));
          if (global == 0) prep_crash_point("after-first-shard");
        }
      }
    });
    const double write_seconds = seconds_since(t_write);
    sum_in_place(comm, shard_tokens);
    sum_in_place(comm, shard_hash);
    std::vector<int64_t> rss = {peak_rss_bytes_here()};
    std::vector<int64_t> all_rss(size_t(size), 0);
    MPI_Gather(rss.data(), 1, MPI_INT64_T, all_rss.data(), 1, MPI_INT64_T, 0, comm);

    // 5. The manifest (the switch), then the previous data set's files go.
    on_root(comm, rank, [&] {
      PrepManifest man;
      man.generation = generation;
      man.created_by = "llmpi-prep";
      man.tokenizer = tok.description;
      man.vocab_size = tok.vocab_size;
      man.eot_id = tok.eot_id;
      for (const SplitPlan& p : plans) {
        SplitEntry e;
        e.documents = p.documents;
        for (size_t j = 0; j < p.files.size(); j++) {
          const size_t g = size_t(p.first_shard) + j;
          char hex[20];
          std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)uint64_t(shard_hash[g]));
          e.shards.push_back({p.files[j], shard_tokens[g], hex});
          e.size += shard_tokens[g];
        }
        e.content_hash = split_content_hash(e.shards);
        man.splits[p.name] = e;
      }
      prep_crash_point("before-manifest");
      write_prep_manifest_v2(o.out, man);
      switched = true;
      prep_crash_point("after-switch");
      try {  // after the switch nothing may fail the run: the new data set is in place
        std::vector<std::string> keep = man.files();
        bool first = true;
        for (const std::string& f : dest.manifest ? dest.manifest->files() : std::vector<std::string>()) {
          if (std::find(keep.begin(), keep.end(), f) != keep.end()) continue;
          std::remove(join_path(o.out, f).c_str());
          if (first) prep_crash_point("during-cleanup");
          first = false;
        }
        std::error_code ec;
        fs::remove_all(work, ec);
        h5::fsync_path(o.out, true);

        // The summary.
        const int64_t empty = totals[1];
        const std::string skipped = empty ? " (" + with_commas(empty) + " empty skipped)" : std::string();
        std::set<std::string> files;
        for (const InputUnit& u : units) files.insert(u.path);
        std::printf("llmpi-prep: %zu input%s, %.2f MB read, %s documents%s; tokenizer %s (vocab %d, eot %d); "
                    "%d rank%s\n",
                    files.size(), files.size() == 1 ? "" : "s", totals[4] / 1e6, with_commas(n_docs).c_str(),
                    skipped.c_str(), tok.description.c_str(), tok.vocab_size, tok.eot_id, size, size == 1 ? "" : "s");
        for (const SplitPlan& p : plans) {
          std::string where = join_path(o.out, p.files[0]);
          if (p.files.size() > 1)
            where += " .. " + p.files.back() + " (" + with_commas(int64_t(p.files.size())) + " shards)";
          std::printf("  %-6s %12s documents %14s tokens -> %s\n", (p.name + ":").c_str(),
                      with_commas(p.documents).c_str(), with_commas(p.tokens).c_str(), where.c_str());
        }
        std::printf("  manifest: %s (generation %lld; names every file with its content hash)\n",
                    join_path(o.out, kPrepManifestName).c_str(), (long long)generation);
        int64_t max_rss = 0;
        int max_rank = 0;
        for (int r = 0; r < size; r++)
          if (all_rss[size_t(r)] > max_rss) max_rss = all_rss[size_t(r)], max_rank = r;
        std::printf("  tokenized in %.2f s (%.2f MB/s, %.2f MB/s per rank, %.2fM tokens/s); shards written in %.2f s; "
                    "%.2f s in all; peak RSS %.0f MB (rank %d)\n",
                    tok_seconds, tok_seconds > 0 ? totals[3] / tok_seconds / 1e6 : 0.0,
                    tok_seconds > 0 ? totals[3] / tok_seconds / 1e6 / size : 0.0,
                    tok_seconds > 0 ? totals[2] / tok_seconds / 1e6 : 0.0, write_seconds, seconds_since(t_start),
                    max_rss / 1e6, max_rank);
        std::fflush(stdout);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "llmpi-prep: warning: after writing the data set: %s\n", e.what());
      }
    });
  } catch (...) {
    // Nothing of this run stays: the previous data set (if any) is as it was.
    // (Failures are agreed, so every rank is here, and none after the switch: nothing after it throws.)
    if (!switched) {
      for (const std::string& f : new_files) std::remove(f.c_str());
      MPI_Barrier(comm);  // every rank has removed its files
      if (rank == 0) {
        std::error_code ec;
        fs::remove_all(work, ec);
        dest.lock.reset();  // (its file goes with it)
        if (dest.created) fs::remove(o.out, ec);  // only when empty: a directory this run made
      }
    }
    throw;
  }
}

}  // namespace llmpi
