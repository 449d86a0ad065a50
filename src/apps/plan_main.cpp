// llmpi-plan: memory per rank, step time and scaling efficiency of a run before it is run
// (src/plan/plan.h; docs/PLAN.md). One process, no MPI launch:
//   llmpi-plan --config run.json [--set k=v]... --world 512 --pp 8 --tp 8 --microbatches 32 --zero 1
//              --device h100 --link ib-ndr [--json plan.json]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "apps/arg_checks.h"
#include "backend/cpu/gemm_auto.h"
#include "data/token_file.h"
#include "metrics/metrics.h"
#include "model/model_desc.h"
#include "plan/plan.h"
#include "plan/profile.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "model/memory_estimate.h"

using namespace llmpi;

namespace {

const char* kDefaultLinks = "bench/results/links-b-2026-12-07.json";

bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// The default links file: relative to the working directory (the repository root), else to the
// program (build/llmpi-plan -> build/../bench/results/...), so the planner works from anywhere.
std::string default_links_file() {
  if (file_exists(kDefaultLinks)) return kDefaultLinks;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "";
  std::string dir(exe, (size_t)n);
  dir = dir.substr(0, dir.find_last_of('/'));
  const std::string p = dir + "/../" + kDefaultLinks;
  return file_exists(p) ? p : "";
}

// Whether the configuration names a training file (in the JSON or by --set): without one the model
// needs model.vocab_size or --vocab, and config validation gets a placeholder.
bool names_train_file(const std::string& path, const std::vector<std::string>& sets) {
  bool named = false;
  std::ifstream in(path);
  if (in) {
    try {
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, true, true);
      named = j.contains("data") && j["data"].is_object() && j["data"].contains("train") &&
              j["data"]["train"].is_string() && !j["data"]["train"].get<std::string>().empty();
    } catch (...) {
      // load_config reports the malformed file
    }
  }
  for (const std::string& s : sets)
    if (s.rfind("data.train=", 0) == 0) named = s.size() > 11;
  return named;
}

// An output file (--json, --profile-out) may replace only an earlier llmpi-plan output of its kind
// (a JSON object whose "format" is `format`) or an empty file, unless overwrite.
void check_output_file(const char* flag, const std::string& path, const char* format, bool overwrite) {
  if (path.empty()) return;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;  // a new file
  if (!S_ISREG(st.st_mode)) fail(flag, " '", path, "' exists and is not a file; give a file path");
  if (st.st_size == 0 || overwrite) return;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_object() && j.value("format", "") == format) return;
  fail(flag, " '", path, "' exists and was not written by llmpi-plan ", flag, " (no \"format\": \"", format,
       "\" in it); give another path, or pass --overwrite to replace it");
}

std::string gb(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  return buf;
}

std::string fmt_s(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // --profile times this CPU's GEMMs: on OpenBLAS's generic kernels where it does not recognise the
  // CPU they would be the wrong ones, so start again on the kernels llmpi-train runs.
  cpu::exec_with_fitting_openblas_kernels(argv);
  CLI::App app{"llmpi-plan: memory per rank, step time and scaling efficiency of a training run, before running it.\n"
               "Usage: llmpi-plan --config run.json [--set key=value]... --world W [--pp S] [--tp T] [--microbatches M] "
               "[--zero 0|1|2|3]\n       [--device h100|h200|cpu] [--link CLASS] [--intra-link CLASS] [--json OUT]\n"
               "Memory: fp32 and bf16 as the code allocates them, and a bf16 projection with every activation in bf16;\n"
               "time is\n"
               "a model (docs/PLAN.md): per-layer compute from --profile or the device table, the pipeline\n"
               "simulated, data-parallel sync from an alpha-beta model of the links."};
  std::string config_path, device_name = "cpu", link_name, intra_name, links_path, precision = "fp32", json_out;
  std::string profile_in, profile_out, schedule;
  std::vector<std::string> sets;
  int world = 1, pp = 0, tp = 0, microbatches = 0, zero = -1, vocab = 0, ranks_per_node = 0, nics_per_node = 0;
  int cores_per_rank = 0, profile_reps = 5, node_cores = 0;
  double mfu = 0, fs_gbs = 1;
  bool profile = false;
  app.add_option("--config", config_path, "JSON run configuration (as llmpi-train reads it)")->required();
  app.add_option("--set", sets, "override one configuration key, e.g. --set model.n_layer=48 (repeatable)");
  auto* vocab_opt = app.add_option(
      "--vocab", vocab, "vocabulary size when model.vocab_size is 0 and there is no data.train file to take it from");
  app.add_option("--world", world,
                 "ranks in the run (data-parallel replicas x pipeline stages x tensor-parallel ranks; default 1)");
  auto* pp_opt = app.add_option("--pp", pp, "pipeline stages (default: parallel.pp_stages)");
  auto* tp_opt = app.add_option("--tp", tp,
                                "tensor-parallel ranks sharing each layer, inside a node (default: parallel.tp)");
  auto* mb_opt = app.add_option("--microbatches", microbatches,
                                "micro-batches per step per replica (default: parallel.microbatches)");
  auto* zero_opt =
      app.add_option("--zero", zero, "the run's ZeRO stage, 0 to 3 (default: parallel.zero); all are always planned");
  app.add_option("--schedule", schedule,
                 "the run's schedule: gpipe, 1f1b or zb-h1 (default: parallel.schedule); all three are planned");
  app.add_option("--device", device_name, "device table entry: h100, h200 or cpu (this machine; default)");
  app.add_option("--precision", precision,
                 "precision of the compute for the time: fp32 (the code as built; default), tf32 or bf16 (projections)");
  auto* mfu_opt = app.add_option("--mfu", mfu,
                                 "assumed fraction of the device's peak reached by the compute, in (0, 1] (default: "
                                 "the device's, printed; not used with a profile)");
  auto* cpr_opt = app.add_option("--cores-per-rank", cores_per_rank, "cpu: cores per rank (default runtime.threads, or 1)");
  auto* cpn_opt = app.add_option("--cores-per-node", node_cores,
                 "cpu: cores of a node (default: this machine's); ranks x cores per rank beyond it share the cores, "
                 "which slows the compute by that ratio");
  app.add_option("--link", link_name, "link class between nodes: shm, loopback, netns-1gbit, netns-10gbit (measured), "
                                      "1gbe, 10gbe, 100gbe, ib-hdr, ib-ndr, nvlink (nominal); default ib-ndr on GPUs, "
                                      "none on cpu (needed when the ranks span nodes)");
  app.add_option("--intra-link", intra_name, "link class inside a node (default nvlink on GPUs, shm on cpu)");
  auto* gpn_opt = app.add_option("--gpus-per-node", ranks_per_node,
                                 "ranks per node (default 8 on GPUs; cpu: all ranks on one node)");
  auto* npn_opt = app.add_option("--nics-per-node", nics_per_node,
                 "network ports per node shared by its ranks (default one per GPU; cpu: 1)");
  app.add_option("--links", links_path, std::string("measured links file of bench-allreduce_bw (default ") +
                                            kDefaultLinks + " when it exists)");
  auto* fs_opt = app.add_option("--fs-bandwidth", fs_gbs,
                                "GB/s the ranks write a checkpoint at, all together (the file system's share; "
                                "default 1; make bench-checkpoint measures one): for the checkpoint's time");
  app.add_flag("--profile", profile, "measure the per-layer costs on this machine's CPU backend (a few seconds)");
  app.add_option("--profile-reps", profile_reps, "repetitions per measured cost (median; default 5)");
  app.add_option("--profile-out", profile_out, "write the measured (or table) per-layer costs to this JSON file");
  app.add_option("--profile-in", profile_in, "read per-layer costs from a file written by --profile-out");
  app.add_option("--json", json_out, "write the whole plan (every stage, schedule, ZeRO stage and precision) as JSON");
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite,
               "let --json and --profile-out replace an existing file that llmpi-plan did not write");
  app.footer(
      "\nLink classes: measured ones come from the links file (tools/measure_links.sh runs bench/allreduce_bw.cpp);\n"
      "nominal ones are published line rates with typical latencies (docs/PLAN.md lists the sources). A\n"
      "data-parallel collective that spans nodes is modelled in two levels (inside the node over --intra-link,\n"
      "across nodes over --link).\n"
      "Scaling efficiency = tokens/s at the world size / (world x tokens/s of one rank doing the whole global batch).\n"
      "Exit status 2 on bad input.");
  if (const int status = parse_command_line(app, argc, argv, "llmpi-plan", 2); status >= 0) return status;

  try {
    // Every numeric option in its range; those whose default (0 or -1) means "the configuration's
    // value" only when given.
    require_at_least("--world", world, 1, "ranks in the run");
    if (vocab_opt->count()) require_at_least("--vocab", vocab, 1, "vocabulary size");
    if (pp_opt->count()) require_at_least("--pp", pp, 1, "pipeline stages");
    if (tp_opt->count()) require_at_least("--tp", tp, 1, "tensor-parallel ranks per group");
    if (mb_opt->count()) require_at_least("--microbatches", microbatches, 1, "micro-batches per step per replica");
    if (zero_opt->count()) require_range("--zero", zero, 0, 3, "the run's ZeRO stage");
    if (cpr_opt->count()) require_at_least("--cores-per-rank", cores_per_rank, 1, "cores per rank");
    if (cpn_opt->count()) require_at_least("--cores-per-node", node_cores, 1, "cores of a node");
    if (gpn_opt->count()) require_at_least("--gpus-per-node", ranks_per_node, 1, "ranks per node");
    if (npn_opt->count()) require_at_least("--nics-per-node", nics_per_node, 1, "network ports per node");
    if (fs_opt->count() && !(fs_gbs > 0))
      fail("--fs-bandwidth must be a positive number of GB/s (the file system's write bandwidth), got ", fs_gbs);
    require_at_least("--profile-reps", profile_reps, 1, "repetitions per measured cost");
    if (mfu_opt->count() && !(mfu > 0 && mfu <= 1))
      fail("--mfu must be in (0, 1] (the fraction of the device's peak the compute reaches), got ", mfu);
    check_output_file("--json", json_out, "llmpi-plan", overwrite);
    check_output_file("--profile-out", profile_out, "llmpi-plan-profile", overwrite);
    const bool has_data = names_train_file(config_path, sets);
    std::vector<std::string> all_sets = sets;
    if (!has_data) all_sets.push_back("data.train=(none: llmpi-plan)");
    const Config cfg = load_config(config_path, all_sets);
    int V = cfg.model.vocab_size;
    if (V > 0 && vocab > 0 && vocab != V)
      fail("--vocab ", vocab, " contradicts model.vocab_size ", V, ": give one of them");
    if (V == 0) V = vocab;
    if (V == 0) {
      if (!has_data)
        fail("model.vocab_size is 0 (take it from the data) but the configuration names no data.train file: set "
             "model.vocab_size, or give --vocab N");
      if (cfg.model.family == Family::bert)
        fail("model.vocab_size is 0: give --vocab N (or set model.vocab_size) for a bert plan");
      V = (int)open_token_file_info(cfg.data.train).vocab_size;
    }
    PlanInputs in = plan_inputs_from_config(cfg, model_desc_from_config(cfg.model, V), world);
    if (pp > 0) in.pp = pp;
    if (tp > 0) in.tp = tp;
    // (each rank holds whole heads: at most one per rank; tensor_shard checks that tp divides them)
    require_range("--tp", in.tp, 1, in.desc.n_head, "tensor-parallel ranks per group, at most model.n_head");
    if (microbatches > 0) in.microbatches = microbatches;
    if (zero >= 0) in.zero = zero;
    if (!schedule.empty() && !parse_option(schedule, &in.schedule))
      fail("unknown schedule '", schedule, "': use ", option_words<ScheduleKind>());
    if (pp > 0 && pp != cfg.parallel.pp_stages) in.stage_layers.clear();  // balanced for the new stage count
    in.device = find_device(device_name);
    in.desc.attention = resolve_attention(cfg.runtime.attention, in.device.gpu, in.desc.head_dim());  // P or lse
    in.desc.lm_head_chunk_rows = cfg.runtime.lm_head_chunk_rows;  // the LM head's chunk buffer
    if (!parse_gemm_precision(precision, &in.precision))
      fail("--precision must be ", option_words<GemmPrecision>(), ", got '", precision, "'");
    if (in.precision != GemmPrecision::fp32 && !in.device.gpu)
      fail("--precision ", precision, " is a GPU projection: use --precision fp32 with --device cpu");
    in.mfu = mfu;
    in.fs_bandwidth = fs_gbs * 1e9;
    if (cores_per_rank > 0) in.cores_per_rank = cores_per_rank;
    if (!in.device.gpu) in.node_cores = node_cores > 0 ? node_cores : (int)std::thread::hardware_concurrency();
    // train.batch_per_rank gives the global batch of this world's data-parallel replicas
    Config run_cfg = cfg;
    resolve_batch(run_cfg, data_parallel_replicas(in));
    in.global_batch = run_cfg.train.global_batch;
    // Links: the measured file when one is named or the default exists.
    in.fabric.ranks_per_node = ranks_per_node > 0 ? ranks_per_node
                                                  : (in.device.gpu ? in.device.default_ranks_per_node : in.world);
    in.fabric.nics_per_node = nics_per_node > 0 ? nics_per_node : (in.device.gpu ? in.fabric.ranks_per_node : 1);
    const std::string intra = intra_name.empty() ? (in.device.gpu ? "nvlink" : "shm") : intra_name;
    const std::string inter = link_name.empty() ? (in.device.gpu ? "ib-ndr" : "") : link_name;
    const bool spans_nodes = in.world > in.fabric.ranks_per_node;
    const bool within_node = std::min(in.world, in.fabric.ranks_per_node) > 1;
    // The measured links file: read when named, or (the default file) when a link in use is not nominal.
    auto nominal = [](const std::string& n) {
      for (const Link& l : nominal_links())
        if (l.name == n) return true;
      return false;
    };
    LinkFile file;
    const LinkFile* fp = nullptr;
    const bool needs_file = (within_node && !nominal(intra)) || (spans_nodes && !inter.empty() && !nominal(inter));
    if (!links_path.empty()) {
      file = read_link_file(links_path);
      fp = &file;
    } else if (needs_file && !default_links_file().empty()) {
      file = read_link_file(default_links_file());
      fp = &file;
    }
    if (within_node) in.fabric.intra = find_link(intra, fp);
    if (spans_nodes) {
      if (inter.empty())
        fail("the run spans ", (in.world + in.fabric.ranks_per_node - 1) / in.fabric.ranks_per_node, " nodes of ",
             in.fabric.ranks_per_node, " ranks: give the link between nodes with --link (one of ", link_names_list(fp), ")");
      in.fabric.inter = find_link(inter, fp);
    }
    // Costs: a profile read back, measured now, or the device table.
    if (!profile_in.empty() && profile) fail("--profile measures and --profile-in reads: give one of them");
    PlanResult r = plan(in);  // validates the inputs (and gives the micro-batch)
    if (!profile_in.empty()) {
      std::ifstream pin(profile_in);
      if (!pin) fail("cannot read the profile '", profile_in, "': write one with --profile --profile-out FILE");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(pin);
      } catch (const std::exception& e) {
        fail("'", profile_in, "' is not valid JSON (", e.what(), ")");
      }
      in.profile = LayerCosts::from_json(j.contains("costs") ? j["costs"] : j, profile_in);
      in.have_profile = true;
    } else if (profile) {
      if (in.device.gpu) fail("--profile measures this machine's CPU backend: use --device cpu with it");
      std::fprintf(stderr, "llmpi-plan: profiling one micro-batch of %d x %d tokens (%d repetitions)...\n",
                   r.micro_batch, in.seq_len, profile_reps);
      in.profile = measure_profile(in.desc, r.micro_batch, in.seq_len, profile_reps, in.cores_per_rank);
      in.have_profile = true;
    }
    if (in.have_profile) r = plan(in);
    if (!profile_out.empty()) {
      nlohmann::json pj = {{"format", "llmpi-plan-profile"}, {"version", 1}, {"model", model_desc_json(in.desc)},
                           {"costs", r.costs.to_json()}};
      write_file_atomic(profile_out, pj.dump(2) + "\n");
    }

    // ---- the report ----
    const ModelDesc& d = in.desc;
    const int S = in.pp;
    std::printf("model %s: %d layers, d_model %d, %d heads, ffn %d, seq_len %d, vocab %d: %.2fM parameters, %.3g "
                "FLOP/token\n",
                family_name(d.family), d.n_layer, d.d_model, d.n_head, d.ffn_dim, in.seq_len, d.vocab_size,
                build_param_table(d).numel / 1e6, r.flops_per_token);
    std::printf("run: world %d = %d data-parallel x %d stage%s%s; global batch %d -> %d per replica, %d micro-batch%s of "
                "%d; sync %s%s, buckets %g MB, optimizer %s, recompute %s\n",
                in.world, r.dp, S, S > 1 ? "s" : "", in.tp > 1 ? (" x tp " + std::to_string(in.tp)).c_str() : "",
                in.global_batch, r.local_batch, in.microbatches,
                in.microbatches > 1 ? "es" : "", r.micro_batch, option_name(in.sync), in.overlap ? " (overlap)" : "",
                in.bucket_mb, option_name(in.optimizer), option_name(in.recompute));
    if (S > 1) {
      std::printf("layers per stage:");
      for (int n : r.layer_counts) std::printf(" %d", n);
      std::printf(" (embedding on stage 0, head on stage %d)\n", S - 1);
    }
    if (in.tp > 1) {
      const ModelDesc shard = tensor_shard(d, in.tp, in.tp - 1);
      std::printf("tensor parallelism: %d adjacent ranks per group, each with %d of %d heads (%d of %d key/value), %d of "
                  "%d MLP channels, %d of %d vocabulary rows (the largest shard's); %.2fM parameters per rank\n",
                  in.tp, shard.heads(), d.n_head, shard.kv_heads(), d.n_kv_head, shard.ffn(), d.ffn_dim,
                  shard.vocab_rows(), d.vocab_size, build_param_table(shard).numel / 1e6);
    }
    std::printf("device: %s (%s)\n", in.device.name.c_str(), in.device.source.c_str());
    std::printf("costs: %s\n", r.costs.source.c_str());
    if (within_node) std::printf("link inside a node: %s (%s)\n", in.fabric.intra.name.c_str(), in.fabric.intra.source.c_str());
    if (spans_nodes)
      std::printf("link between nodes: %s (%s), %d ranks and %d NICs per node\n", in.fabric.inter.name.c_str(),
                  in.fabric.inter.source.c_str(), in.fabric.ranks_per_node, in.fabric.nics_per_node);
    std::string run_sch = S > 1 ? schedule_kind_name(in.schedule) : "-";
    if (run_sch == "interleaved") {
      std::printf("(the run's schedule 'interleaved' is not planned: its memory is shown as 1f1b's)\n");
      run_sch = "1f1b";
    }
    for (const char* prec : kMemoryPrecisions) {
      const std::string ps = prec;
      std::printf("\nmemory per rank, %s, schedule %s, ZeRO-%d:\n",
                  ps == "fp32"         ? "fp32 (the code as built)"
                  : ps == "bf16-built" ? "bf16 as built (fp32 state + a bf16 weight copy; activations mostly fp32)"
                                       : "bf16 PROJECTION (bf16 weights + fp32 master, grads, AdamW; every activation in bf16)",
                  run_sch.c_str(), in.zero);
      std::printf("  %-5s %-26s %6s %10s %10s %10s %12s %10s %10s %10s\n", "stage", "holds", "slots", "params", "grads",
                  "optimizer", "activations", "scratch", "buffers", "total");
      for (int s = 0; s < S; s++) {
        const MemoryRow* m = r.memory_row(prec, run_sch, in.zero, s);
        if (!m) continue;
        const ModelPart& p = r.stages[s].part;
        std::string holds = "layers [" + std::to_string(p.l0) + "," + std::to_string(p.l1 < 0 ? d.n_layer : p.l1) + ")";
        if (p.embedding) holds += " +emb";
        if (p.head) holds += " +head";
        std::printf("  %-5d %-26s %6d %10s %10s %10s %12s %10s %10s %10s\n", s, holds.c_str(), m->slots,
                    gb(m->params).c_str(), gb(m->grads).c_str(), gb(m->optimizer).c_str(), gb(m->activations).c_str(),
                    gb(m->scratch).c_str(), gb(m->buffers).c_str(), gb(m->total).c_str());
      }
    }
    std::printf("\nlargest rank (GB), every schedule and ZeRO stage%s:\n",
                in.device.memory_bytes > 0 ? (" (device has " + gb(in.device.memory_bytes) + ")").c_str() : "");
    std::printf("  %-8s %-6s %12s %12s %12s\n", "schedule", "zero", "fp32", "bf16 built", "bf16 proj.");
    std::vector<std::string> schs = S > 1 ? std::vector<std::string>{"gpipe", "1f1b", "zb-h1"} : std::vector<std::string>{"-"};
    for (const std::string& sch : schs)
      for (int z = 0; z <= 3; z++) {
        if (!r.memory_row("fp32", sch, z, 0)) continue;  // (zb-h1 with recomputation: not planned)
        double mx[std::size(kMemoryPrecisions)] = {};
        int i = 0;
        for (const char* prec : kMemoryPrecisions) {
          for (int s = 0; s < S; s++)
            if (const MemoryRow* m = r.memory_row(prec, sch, z, s)) mx[i] = std::max(mx[i], m->total);
          i++;
        }
        std::printf("  %-8s %-6d %12.2f %12.2f %12.2f%s\n", sch.c_str(), z, mx[0] / 1e9, mx[1] / 1e9, mx[2] / 1e9,
                    in.device.memory_bytes > 0 && mx[1] > in.device.memory_bytes ? "  (bf16 as built does not fit)" : "");
      }
    std::printf("\ntime per step (%s compute; %s):\n", gemm_precision_name(in.precision),
                r.mfu_assumed > 0 ? ("MFU " + std::to_string(r.mfu_assumed).substr(0, 5) + " assumed").c_str()
                                  : "measured profile");
    std::printf("  %-8s %-4s %10s %10s %10s %10s %10s %10s %12s %6s %6s\n", "schedule", "zero", "compute", "bubble",
                "sync", "exposed", "optimizer", "step", "tokens/s", "MFU", "eff.");
    for (const TimeRow& t : r.time)
      std::printf("  %-8s %-4d %10s %10s %10s %10s %10s %10s %12.0f %5.1f%% %5.1f%%\n", t.schedule.c_str(), t.zero,
                  fmt_s(t.compute_s).c_str(), fmt_s(t.bubble_s).c_str(), fmt_s(t.sync_s).c_str(),
                  fmt_s(t.exposed_sync_s).c_str(), fmt_s(t.optimizer_s).c_str(), fmt_s(t.step_s).c_str(), t.tokens_per_s,
                  100 * t.mfu, 100 * t.efficiency);
    std::printf("  (one rank alone: %.0f tokens/s; efficiency = tokens/s / (%d x that))\n", r.single_rank_tokens_per_s,
                in.world);
    if (in.tp > 1) {
      std::printf("\ntensor-parallel all-reduces per step (part of compute above), busiest stage:\n");
      std::printf("  %-8s %-4s %10s %14s\n", "schedule", "zero", "time", "sent per rank");
      for (const TimeRow& t : r.time)
        std::printf("  %-8s %-4d %10s %14s\n", t.schedule.c_str(), t.zero, fmt_s(t.tp_s).c_str(),
                    gb(t.tp_bytes_per_rank).c_str());
    }
    const CheckpointPlan& cp = r.checkpoint;
    std::printf("\ncheckpoint (one file, every rank writing its turn of the tensors): %s of params%s; %.1f s at "
                "%g GB/s (--fs-bandwidth)\n",
                gb(cp.state_bytes).c_str(), in.optimizer == OptimizerKind::adamw ? " + AdamW m and v" : "", cp.write_s,
                in.fs_bandwidth / 1e9);
    std::printf("  %-5s %18s %18s\n", "stage", "staging (save)", "resume buffer");
    for (int s = 0; s < S; s++)
      std::printf("  %-5d %18s %18s\n", s, gb(cp.staging[s]).c_str(), gb(cp.resume[s]).c_str());
    std::printf("  (host memory of the busiest rank; staging: checkpoint.async or a GPU keeps a copy of what the rank "
                "writes for the whole run, a synchronous save on the CPU none; a resume reads one state at a time)\n");
    std::printf("  llmpi-export holds one tensor at a time: the largest, %s\n", gb(cp.export_bytes).c_str());
    if (cp.every_to_hide > 0) {
      std::string run;  // what the run's own checkpoint.every does
      if (in.checkpoint_every > 0)
        run = " (the run's " + std::to_string(in.checkpoint_every) +
              (in.checkpoint_every >= cp.every_to_hide ? " does)" : " does not: the next save waits for it)");
      std::printf("  with checkpoint.async the write runs behind the steps: checkpoint.every >= %d steps hides it%s\n",
                  cp.every_to_hide, run.c_str());
    } else {
      std::printf("  the step that saves waits for the write (checkpoint.async false)\n");
    }
    for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
    if (!json_out.empty()) {
      nlohmann::json j = r.to_json();
      j["format"] = "llmpi-plan";
      j["inputs"] = {{"config", config_path}, {"set", sets}, {"world", in.world}, {"pp", in.pp}, {"tp", in.tp},
                     {"microbatches", in.microbatches}, {"zero", in.zero}, {"schedule", schedule_kind_name(in.schedule)},
                     {"sync", option_name(in.sync)}, {"overlap", in.overlap}, {"bucket_mb", in.bucket_mb},
                     {"device", in.device.name}, {"device_source", in.device.source},
                     {"precision", gemm_precision_name(in.precision)}, {"recompute", option_name(in.recompute)},
                     {"cores_per_rank", in.cores_per_rank}, {"fs_bandwidth_bytes_per_s", in.fs_bandwidth},
                     {"ranks_per_node", in.fabric.ranks_per_node}, {"nics_per_node", in.fabric.nics_per_node},
                     {"intra_link", within_node ? in.fabric.intra.name : ""},
                     {"inter_link", spans_nodes ? in.fabric.inter.name : ""},
                     {"links_file", fp ? fp->path : ""}};
      j["model"] = model_desc_json(d);
      j["seq_len"] = in.seq_len;
      j["global_batch"] = in.global_batch;
      j["n_params"] = build_param_table(d).numel;
      write_file_atomic(json_out, j.dump(2) + "\n");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "llmpi-plan: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  return 0;
}
