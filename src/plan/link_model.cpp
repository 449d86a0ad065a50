#include "plan/link_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"

namespace llmpi {

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::allreduce: return "allreduce";
    case CollOp::reduce_scatter: return "reduce_scatter";
    case CollOp::allgather: return "allgather";
    case CollOp::sendrecv: return "sendrecv";
  }
  return "?";
}

const OpFit* Link::fit(CollOp op, int p) const {
  for (const LinkPoint& pt : points)
    if (pt.world == p && pt.ops[(int)op].present) return &pt.ops[(int)op];
  return nullptr;
}

void Link::alpha_beta(CollOp op, int p, double* alpha, double* beta) const {
  *alpha = alpha_s;
  *beta = beta_s_per_byte;
  const LinkPoint* best = nullptr;
  for (const LinkPoint& pt : points)
    if (pt.ops[(int)op].present && (!best || std::abs(pt.world - p) < std::abs(best->world - p))) best = &pt;
  if (best) {
    const OpFit& f = best->ops[(int)op];
    *alpha = f.alpha_s;
    *beta = f.has_large ? f.large_beta_s_per_byte : f.beta_s_per_byte;
  }
}

// ---- the measured file ----------------------------------------------------------------------------

namespace {

double number_field(const nlohmann::json& o, const char* key, const std::string& where) {
  if (!o.is_object() || !o.contains(key) || !o[key].is_number())
    fail(where, ": '", key, "' is missing or not a number: the file must be written by bench-allreduce_bw "
         "(bench/allreduce_bw.cpp); pass another one with --links FILE");
  return o[key].get<double>();
}

std::string string_field(const nlohmann::json& o, const char* key) {
  return o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
}

}  // namespace

LinkFile parse_link_file(const nlohmann::json& j, const std::string& path) {
  LinkFile f;
  f.path = path;
  if (!j.is_object() || !j.contains("links") || !j["links"].is_array())
    fail("'", path, "' has no 'links' array: it is not a links file of bench-allreduce_bw (bench/allreduce_bw.cpp)");
  f.date = string_field(j, "date");
  f.machine = string_field(j, "machine");
  f.mpi = string_field(j, "mpi");
  f.command = string_field(j, "command");
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < j["links"].size(); i++) {
    const nlohmann::json& e = j["links"][i];
    const std::string where = "'" + path + "' links[" + std::to_string(i) + "]";
    const std::string name = string_field(e, "name");
    if (name.empty()) fail(where, ": 'name' is missing");
    const double world = number_field(e, "world", where);
    if (world < 2 || world != std::floor(world)) fail(where, ": 'world' must be an integer >= 2");
    LinkPoint pt;
    pt.world = (int)world;
    pt.ranks_per_node = e.contains("ranks_per_node") && e["ranks_per_node"].is_number_integer()
                            ? e["ranks_per_node"].get<int>() : pt.world;
    if (!e.contains("ops") || !e["ops"].is_object()) fail(where, ": 'ops' is missing");
    int any = 0;
    for (int k = 0; k < 4; k++) {
      const char* op = coll_op_name((CollOp)k);
      if (!e["ops"].contains(op)) continue;
      const nlohmann::json& o = e["ops"][op];
      const std::string w = where + ".ops." + op;
      // A fit that could not be made is written as null: the op counts as not measured.
      if (o.is_null() || (o.is_object() && (!o.contains("a_s") || o["a_s"].is_null() || !o.contains("b_s_per_byte") ||
                                            o["b_s_per_byte"].is_null())))
        continue;
      OpFit& fit = pt.ops[k];
      fit.present = true;
      fit.a_s = number_field(o, "a_s", w);
      fit.b_s_per_byte = number_field(o, "b_s_per_byte", w);
      fit.alpha_s = number_field(o, "alpha_s", w);
      fit.beta_s_per_byte = number_field(o, "beta_s_per_byte", w);
      if (fit.b_s_per_byte <= 0 || fit.beta_s_per_byte <= 0)
        fail(w, ": b_s_per_byte and beta_s_per_byte must be > 0 (a fit that did not work)");
      if (o.contains("fit_large") && o["fit_large"].is_object()) {
        const nlohmann::json& L = o["fit_large"];
        fit.has_large = true;
        fit.large_min_bytes = number_field(L, "min_bytes", w + ".fit_large");
        fit.large_a_s = number_field(L, "a_s", w + ".fit_large");
        fit.large_b_s_per_byte = number_field(L, "b_s_per_byte", w + ".fit_large");
        fit.large_beta_s_per_byte = number_field(L, "beta_s_per_byte", w + ".fit_large");
        if (fit.large_b_s_per_byte <= 0 || fit.large_beta_s_per_byte <= 0)
          fail(w, ".fit_large: b_s_per_byte and beta_s_per_byte must be > 0 (a fit that did not work)");
      }
      any++;
    }
    if (!any) fail(where, ": 'ops' holds no fit of allreduce, reduce_scatter, allgather or sendrecv");
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      it = by_name.emplace(name, f.links.size()).first;
      Link l;
      l.name = name;
      l.measured = true;
      l.source = "measured: '" + path + "'" + (f.date.empty() ? "" : " (" + f.date + ")");
      f.links.push_back(l);
    }
    f.links[it->second].points.push_back(pt);
  }
  // The link's own α-β (point-to-point formulas, gather_scatter): the measured sendrecv's at the
  // smallest world, else the all-reduce's derived α-β.
  for (Link& l : f.links) {
    std::sort(l.points.begin(), l.points.end(), [](const LinkPoint& a, const LinkPoint& b) { return a.world < b.world; });
    for (CollOp op : {CollOp::sendrecv, CollOp::allreduce, CollOp::reduce_scatter, CollOp::allgather}) {
      const LinkPoint* found = nullptr;
      for (const LinkPoint& pt : l.points)
        if (pt.ops[(int)op].present) { found = &pt; break; }
      if (found) {
        l.alpha_s = found->ops[(int)op].alpha_s;
        l.beta_s_per_byte = found->ops[(int)op].beta_s_per_byte;
        break;
      }
    }
  }
  return f;
}

LinkFile read_link_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("cannot read the links file '", path, "': measure the links with bench-allreduce_bw (bench/allreduce_bw.cpp), "
         "pass another file with --links FILE, or use a nominal link class");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("'", path, "' is not valid JSON (", e.what(), "): pass a links file of bench-allreduce_bw with --links FILE");
  }
  return parse_link_file(j, path);
}

// ---- the nominal classes ----------------------------------------------------------------------------
// NOMINAL numbers: line rates from the standards / vendors' data sheets, latencies typical of MPI
// ping-pong on such links (orders of magnitude, not measurements of ours). β = 1 / line rate; real
// collectives reach 80-95 % of it. Listed with their sources in docs/PLAN.md "Link classes".
const std::vector<Link>& nominal_links() {
  static const std::vector<Link> links = [] {
    auto L = [](const char* name, double gbit, double alpha, const char* src) {
      Link l;
      l.name = name;
      l.alpha_s = alpha;
      l.beta_s_per_byte = 8.0 / (gbit * 1e9);
      l.source = std::string("nominal: ") + src;
      return l;
    };
    return std::vector<Link>{
        // IEEE 802.3ab 1000BASE-T line rate; ~50 us MPI-over-TCP latency through the kernel stack.
        L("1gbe", 1, 50e-6, "1 Gbit/s Ethernet line rate (IEEE 802.3), alpha 50 us (MPI over TCP, typical)"),
        // IEEE 802.3ae; ~20 us TCP latency.
        L("10gbe", 10, 20e-6, "10 Gbit/s Ethernet line rate (IEEE 802.3), alpha 20 us (MPI over TCP, typical)"),
        // IEEE 802.3ba; ~5 us with RDMA (RoCE v2).
        L("100gbe", 100, 5e-6, "100 Gbit/s Ethernet line rate (IEEE 802.3), alpha 5 us (RoCE v2, typical)"),
        // InfiniBand HDR 4x: 200 Gbit/s (NVIDIA ConnectX-6 data sheet); MPI latency ~1-2 us.
        L("ib-hdr", 200, 2e-6, "InfiniBand HDR 200 Gbit/s per port (ConnectX-6), alpha 2 us (MPI, typical)"),
        // InfiniBand NDR 4x: 400 Gbit/s (NVIDIA ConnectX-7 data sheet); MPI latency ~1-2 us.
        L("ib-ndr", 400, 2e-6, "InfiniBand NDR 400 Gbit/s per port (ConnectX-7), alpha 2 us (MPI, typical)"),
        // NVLink 4 (H100 SXM): 900 GB/s bidirectional per GPU = 450 GB/s per direction (NVIDIA
        // H100 data sheet); ~3 us per collective step (NCCL, typical).
        L("nvlink", 450 * 8, 3e-6, "NVLink 4 on H100 SXM: 450 GB/s per direction per GPU (NVIDIA), alpha 3 us"),
    };
  }();
  return links;
}

const std::vector<std::string>& measured_link_names() {
  static const std::vector<std::string> names = {"shm", "loopback", "netns-1gbit", "netns-10gbit"};
  return names;
}

std::string link_names_list(const LinkFile* file) {
  std::vector<std::string> names = measured_link_names();
  if (file)
    for (const Link& l : file->links)
      if (std::find(names.begin(), names.end(), l.name) == names.end()) names.push_back(l.name);
  for (const Link& l : nominal_links()) names.push_back(l.name);
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

Link find_link(const std::string& name, const LinkFile* file) {
  for (const Link& l : nominal_links())
    if (l.name == name) return l;
  const bool known_measured =
      std::find(measured_link_names().begin(), measured_link_names().end(), name) != measured_link_names().end();
  if (file) {
    for (const Link& l : file->links)
      if (l.name == name) return l;
    if (name == "shm")
      for (const Link& l : file->links)
        if (l.name == "loopback") {
          Link s = l;
          s.name = "shm";
          s.source += " (its 'loopback' entry: shared memory on this machine)";
          return s;
        }
    if (known_measured)
      fail("the link '", name, "' is measured, but '", file->path, "' has no entry of that name: measure it with "
           "bench-allreduce_bw, pass another file with --links FILE, or use one of: ", link_names_list(file));
  } else if (known_measured) {
    std::string nominal;
    for (const Link& l : nominal_links()) nominal += (nominal.empty() ? "" : ", ") + l.name;
    fail("the link '", name, "' is measured on this machine, but no links file was read: run bench-allreduce_bw "
         "(bench/allreduce_bw.cpp) or pass --links FILE; nominal classes need no file: ", nominal);
  }
  fail("unknown link class '", name, "': use one of ", link_names_list(file));
}

// ---- formulas -----------------------------------------------------------------------------------------

double ring_allreduce_time(int p, double S, double a, double b) {
  return p <= 1 ? 0 : 2.0 * (p - 1) * a + 2.0 * (p - 1) / p * S * b;
}
double reduce_scatter_time(int p, double S, double a, double b) {
  return p <= 1 ? 0 : (p - 1) * a + (double)(p - 1) / p * S * b;
}
double allgather_time(int p, double S, double a, double b) { return reduce_scatter_time(p, S, a, b); }
double gather_scatter_time(int p, double S, double a, double b) { return p <= 1 ? 0 : 2.0 * (p - 1) * (a + S * b); }
double p2p_time(double n, double a, double b) { return a + n * b; }

double collective_time(const Link& link, CollOp op, int p, double bytes) {
  if (p <= 1) return 0;
  if (const OpFit* f = link.fit(op, p)) return f->time(bytes);
  double a, b;
  link.alpha_beta(op, p, &a, &b);
  switch (op) {
    case CollOp::allreduce: return ring_allreduce_time(p, bytes, a, b);
    case CollOp::reduce_scatter: return reduce_scatter_time(p, bytes, a, b);
    case CollOp::allgather: return allgather_time(p, bytes, a, b);
    case CollOp::sendrecv: return p2p_time(bytes, a, b);
  }
  return 0;
}

double gather_scatter_time(const Link& link, int p, double bytes) {
  double a, b;
  link.alpha_beta(CollOp::sendrecv, p, &a, &b);
  return gather_scatter_time(p, bytes, a, b);
}

double Fabric::inter_beta_scale() const {
  return nics_per_node > 0 && ranks_per_node > nics_per_node ? (double)ranks_per_node / nics_per_node : 1.0;
}

double group_collective_time(const Fabric& f, CollOp op, int p, int k, double bytes, bool gs) {
  if (p <= 1) return 0;
  k = std::max(1, std::min(k, p));
  Link inter = f.inter;  // the NIC shared by the node's ranks: a larger β (the fits too)
  const double sc = f.inter_beta_scale();
  inter.beta_s_per_byte *= sc;
  for (LinkPoint& pt : inter.points)
    for (OpFit& o : pt.ops)
      o.b_s_per_byte *= sc, o.beta_s_per_byte *= sc, o.large_b_s_per_byte *= sc, o.large_beta_s_per_byte *= sc;
  if (gs) {
    if (k >= p) return gather_scatter_time(f.intra, p, bytes);
    double ai, bi, ae, be;
    f.intra.alpha_beta(CollOp::sendrecv, p, &ai, &bi);
    inter.alpha_beta(CollOp::sendrecv, p, &ae, &be);
    return 2.0 * ((k - 1) * (ai + bytes * bi) + (p - k) * (ae + bytes * be));
  }
  if (k >= p) return collective_time(f.intra, op, p, bytes);
  const int n = (p + k - 1) / k;
  if (k == 1) return collective_time(inter, op, p, bytes);
  const double shard = bytes / k;
  switch (op) {
    case CollOp::allreduce:
      return collective_time(f.intra, CollOp::reduce_scatter, k, bytes) + collective_time(inter, CollOp::allreduce, n, shard) +
             collective_time(f.intra, CollOp::allgather, k, bytes);
    case CollOp::reduce_scatter:
      return collective_time(f.intra, CollOp::reduce_scatter, k, bytes) +
             collective_time(inter, CollOp::reduce_scatter, n, shard);
    case CollOp::allgather:
      return collective_time(inter, CollOp::allgather, n, shard) + collective_time(f.intra, CollOp::allgather, k, bytes);
    case CollOp::sendrecv: return collective_time(inter, op, p, bytes);
  }
  return 0;
}

}  // namespace llmpi
