// The α-β model of communication that llmpi-plan uses (docs/PLAN.md "Time (per step)").
//
// A message of n bytes between two ranks takes α + n·β. A collective over an S-byte buffer on p
// ranks, with the algorithms MPICH and NCCL use for large buffers:
//
//   ring all-reduce            2(p−1)·α + 2(p−1)/p · S·β     (reduce-scatter, then all-gather)
//   reduce-scatter             (p−1)·α + (p−1)/p · S·β
//   all-gather                 (p−1)·α + (p−1)/p · S·β
//   gather_scatter (via root)  2·(p−1)·(α + S·β)             the root receives p−1 whole buffers and
//                                                            sends p−1 back, one after the other
//   point-to-point             α + n·β
//
// A link class is a name with α and β: either MEASURED on this machine (bench/allreduce_bw.cpp
// writes bench/results/links-*.json; read_link_file reads it) or NOMINAL (published line rates and
// typical latencies, nominal_links(); their sources are in link_model.cpp and docs/PLAN.md "Link classes").
// A measured link carries, per world size measured and per operation, the fitted time of one
// collective t(S) = a + b·S; for that world size the fit is used as it is, for any other the
// formulas above with the operation's per-message α and β.
//
// Hierarchy (two levels): ranks sit ranks_per_node to a node; a collective over a group with k
// members on each of n nodes is done as NCCL's and MPICH's hierarchical algorithms do it:
//   all-reduce       reduce-scatter inside the node (k) + all-reduce across nodes (n) on S/k bytes
//                    + all-gather inside the node (k)
//   reduce-scatter   reduce-scatter inside (k) + reduce-scatter across (n) on S/k
//   all-gather       all-gather across (n) on S/k + all-gather inside (k)
//   gather_scatter   the root's k−1 node peers over the intra link, the other p−k over the inter link
// Every rank of a node communicates across nodes at the same time, so the inter-node β is scaled by
// ranks_per_node / nics_per_node when there are more ranks than NICs (DGX H100: one 400 Gbit/s NIC
// per GPU, so none).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llmpi {

enum class CollOp { allreduce, reduce_scatter, allgather, sendrecv };
const char* coll_op_name(CollOp op);  // the names used in the links file

struct OpFit {
  bool present = false;
  double a_s = 0, b_s_per_byte = 0;          // t(S) = a_s + b_s_per_byte · S, one collective at `world`
  double alpha_s = 0, beta_s_per_byte = 0;   // the per-message α-β derived from it
  // The file's "fit_large" (sizes >= large_min_bytes only), when present: no straight line fits
  // these links over four decades of sizes (docs/PERF.md "Links"), so a collective of at least
  // large_min_bytes is timed with this one, and β for the formulas is taken from it.
  bool has_large = false;
  double large_min_bytes = 0, large_a_s = 0, large_b_s_per_byte = 0, large_beta_s_per_byte = 0;
  double time(double bytes) const {
    return has_large && bytes >= large_min_bytes ? large_a_s + large_b_s_per_byte * bytes : a_s + b_s_per_byte * bytes;
  }
};

struct LinkPoint {  // one measured world size of a link
  int world = 0, ranks_per_node = 0;
  OpFit ops[4];     // indexed by CollOp
};

struct Link {
  std::string name;
  std::string source;         // where the numbers come from (a file and date, or a publication)
  bool measured = false;
  double alpha_s = 0, beta_s_per_byte = 0;  // per message: nominal, or the measured point-to-point's
  std::vector<LinkPoint> points;            // measured only, by world size
  double gbit_s() const { return beta_s_per_byte > 0 ? 8e-9 / beta_s_per_byte : 0; }
  // The fit measured for op at world p, or null.
  const OpFit* fit(CollOp op, int p) const;
  // α and β for the formulas of op: the measured op's derived α-β at the nearest measured world
  // size (the point-to-point's for gather_scatter and sendrecv; β from its large-message fit when
  // the file has one), else the link's own.
  void alpha_beta(CollOp op, int p, double* alpha, double* beta) const;
};

// The measured links file (bench/allreduce_bw.cpp): {"date", "machine", "mpi", "command",
// "links": [{"name", "world", "ranks_per_node", "ops": {"allreduce": {"a_s", "b_s_per_byte",
// "alpha_s", "beta_s_per_byte", ...}, "reduce_scatter", "allgather", "sendrecv"}}]}. Entries of the
// same name (different world sizes) become one Link. Throws Error naming the file and the field.
struct LinkFile {
  std::string path, date, machine, mpi, command;
  std::vector<Link> links;
};
LinkFile read_link_file(const std::string& path);
LinkFile parse_link_file(const nlohmann::json& j, const std::string& path);

// The nominal classes: 1gbe, 10gbe, 100gbe, ib-hdr, ib-ndr, nvlink.
const std::vector<Link>& nominal_links();
// The measured class names: shm (= the file's "shm" entry, else its "loopback"), loopback,
// netns-1gbit, netns-10gbit (and any other name the file holds).
const std::vector<std::string>& measured_link_names();
// Every valid name, for error messages: "shm, loopback, ..., nvlink".
std::string link_names_list(const LinkFile* file);
// The link called `name`: a nominal class, or a measured one from `file` (null: none read).
// Throws Error naming the valid names, or saying which file lacks a measured link.
Link find_link(const std::string& name, const LinkFile* file);

// ---- the formulas (seconds) ----------------------------------------------------------------------
double ring_allreduce_time(int p, double bytes, double alpha, double beta);
double reduce_scatter_time(int p, double bytes, double alpha, double beta);
double allgather_time(int p, double bytes, double alpha, double beta);
double gather_scatter_time(int p, double bytes, double alpha, double beta);
double p2p_time(double bytes, double alpha, double beta);

// One collective of op over `bytes` on p ranks of one link: the measured fit at p when there is
// one, else the formula. `gather_scatter` is not a measured op: pass gather_scatter = true with
// CollOp::sendrecv to get its formula with the point-to-point α-β.
double collective_time(const Link& link, CollOp op, int p, double bytes);
double gather_scatter_time(const Link& link, int p, double bytes);

// Two levels (see above).
struct Fabric {
  Link intra, inter;
  int ranks_per_node = 1, nics_per_node = 1;
  double inter_beta_scale() const;  // max(1, ranks_per_node / nics_per_node)
};
// A group of p ranks with k of them on each node (k = p: one node). op = allreduce, reduce_scatter
// or allgather; gather_scatter with gs = true.
double group_collective_time(const Fabric& f, CollOp op, int p, int k, double bytes, bool gs = false);

}  // namespace llmpi
