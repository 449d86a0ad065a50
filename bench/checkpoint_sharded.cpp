// bench-checkpoint_sharded: one sharded checkpoint (checkpoint/sharded.h) of a GPT-2-shaped model,
// params + AdamW m and v, written by every rank of the job, each rank its share of the rows of every
// tensor (as tensor parallelism shards them) -- against a bare MPI-IO collective write
// (MPI_File_write_at_all) of the same bytes, each rank one contiguous share, in the same run.
// Both are timed from the first call to the file synced and closed (llmpi's: the checksums
// gathered, the file created with its datasets, the rectangles written, synced, renamed into
// place), with a barrier before and after. Medians of --reps; one JSON line on rank 0.
//   mpiexec -n R bench-checkpoint_sharded --dir DIR [--layers 16] [--d-model 768] [--reps 3]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/sharded.h"
#include "model/transformer.h"
#include "runtime/config.h"

using namespace llmpi;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int level = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CLI::App app{"Time a sharded checkpoint write against a bare MPI-IO write of the same bytes (docs/PERF.md)."};
  std::string dir;
  int layers = 16, d_model = 768, reps = 3;
  app.add_option("--dir", dir, "directory to write in (on the file system checkpoints go to)")->required();
  app.add_option("--layers", layers, "GPT-2 blocks")->check(CLI::Range(1, 200));
  app.add_option("--d-model", d_model, "model width (a multiple of 64)")->check(CLI::Range(64, 16384));
  app.add_option("--reps", reps, "repetitions")->check(CLI::Range(1, 100));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : 1;
    MPI_Finalize();
    return rc;
  }
  ModelConfig m{};
  m.family = Family::gpt2;
  m.n_layer = layers;
  m.n_head = d_model / 64;
  m.d_model = d_model;
  m.seq_len = 1024;
  m.init_std = 0.02;
  m.norm_eps = 1e-5;
  m.tie_embeddings = true;
  const ModelDesc desc = model_desc_from_config(m, 50257);
  const ParamTable table = build_param_table(desc);
  const int groups = 3;
  // This rank's rows of every tensor, its values made up.
  std::vector<std::vector<float>> values(table.slices.size());
  std::vector<RectWrite> writes;
  uint64_t mine = 0;
  for (size_t t = 0; t < table.slices.size(); t++) {
    const auto [R, C] = rows_cols(table.slices[t].shape);
    const int64_t r0 = R * rank / world, r1 = R * (rank + 1) / world;
    if (r1 == r0) continue;
    values[t].resize((size_t)((r1 - r0) * C));
    for (size_t k = 0; k < values[t].size(); k++) values[t][k] = float((k * 2654435761u + t) % 1000) * 1e-3f;
    for (int g = 0; g < groups; g++) writes.push_back({g, (int)t, 0, {r0, r1 - r0, 0, C}, values[t].data(), 0});
    mine += values[t].size() * sizeof(float) * groups;
  }
  CheckpointInfo info;
  info.step = 1;
  info.optimizer = "adamw";
  info.sync = "allreduce";
  info.world_size = world;
  info.rows = 1;
  info.desc = desc;
  info.n = table.numel;
  info.version = 3;
  info.checksummed = true;
  info.config_json = "{}";
  info.param_table_json = param_table_json(table);
  const uint64_t total = (uint64_t)table.numel * sizeof(float) * groups;
  const std::string path = dir + "/bench-sharded.h5", bare = dir + "/bench-bare.bin";

  std::vector<double> ours, theirs, crc_s;
  for (int rep = 0; rep < reps; rep++) {
    // llmpi's sharded write
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    rect_crcs(writes);
    const double t_crc = MPI_Wtime() - t0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    const std::vector<uint64_t> offsets = create_sharded_file(MPI_COMM_WORLD, path + ".tmp", info, table, groups, writes);
    MPI_File fh;
    MPI_File_open(MPI_COMM_WORLD, (path + ".tmp").c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
    const std::string err = write_rects(fh, table, 1, offsets, writes, path + ".tmp");
    MPI_File_sync(fh);
    MPI_File_close(&fh);
    if (rank == 0) std::filesystem::rename(path + ".tmp", path);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t_ours = MPI_Wtime() - t0;
    if (!err.empty()) {
      std::fprintf(stderr, "bench-checkpoint_sharded: %s\n", err.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // The bare collective write of as many bytes, each rank one contiguous share.
    const uint64_t begin = total * rank / world, end = total * (rank + 1) / world;
    std::vector<char> bytes(end - begin, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    MPI_File_open(MPI_COMM_WORLD, bare.c_str(), MPI_MODE_WRONLY | MPI_MODE_CREATE, MPI_INFO_NULL, &fh);
    const uint64_t chunk = uint64_t(1) << 30, most = (total + world - 1) / world + 1;
    for (uint64_t at = 0; at < most; at += chunk) {  // the same number of calls on every rank
      const uint64_t n = at < bytes.size() ? std::min<uint64_t>(chunk, bytes.size() - at) : 0;
      MPI_File_write_at_all(fh, (MPI_Offset)(begin + at), bytes.data() + std::min<uint64_t>(at, bytes.size()), (int)n,
                            MPI_BYTE, MPI_STATUS_IGNORE);
    }
    MPI_File_sync(fh);
    MPI_File_close(&fh);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t_bare = MPI_Wtime() - t0;
    ours.push_back(t_ours);
    theirs.push_back(t_bare);
    crc_s.push_back(t_crc);
    if (rank == 0) {
      std::filesystem::remove(path);
      std::filesystem::remove(bare);
    }
  }
  if (rank == 0) {
    const double o = median(ours), b = median(theirs);
    std::printf("{\"ranks\": %d, \"params\": %zu, \"bytes\": %llu, \"reps\": %d, \"llmpi_write_s\": %.4f, "
                "\"bare_write_at_all_s\": %.4f, \"llmpi_GBps\": %.3f, \"bare_GBps\": %.3f, \"ratio\": %.3f, "
                "\"crc_s\": %.4f, \"bytes_rank0\": %llu}\n",
                world, table.numel, (unsigned long long)total, reps, o, b, total / o / 1e9, total / b / 1e9, b / o,
                median(crc_s), (unsigned long long)mine);
  }
  MPI_Finalize();
  return 0;
}
