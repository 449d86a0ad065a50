// Export destinations (hf/export_dir.h): a run directory and a Hugging Face model directory are
// told apart; an export never goes into a run directory, replaces only its own earlier export
// (or an empty directory) unless told to overwrite, and then keeps what was there; the files
// appear at --out all at once, with nothing left behind on success or failure.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "file_test_util.h"
#include "hf/export_dir.h"

namespace llmpi {
namespace {

namespace fs = std::filesystem;
using test::error_of;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every entry of dir (names, sorted), hidden ones too.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

const char* kRunConfig = R"({"model": {"family": "gpt2"}, "train": {"steps": 2}, "run": {"dir": "x"}})";
const char* kLlamaConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})";

// An export of one file, name -> text, committed into out.
std::string export_into(const std::string& out, bool overwrite, const std::string& name, const std::string& text) {
  ExportDir e;
  open_export_dir(e, out, overwrite);
  write(e.staging + "/" + name, text);
  return commit_export_dir(e, {{"source", "test"}});
}

struct ExportDirTest : test::TempDirTest {};

TEST_F(ExportDirTest, RunAndModelDirectoriesAreToldApart) {
  const std::string run = path("run"), model = path("model"), ckdir = path("ck");
  write(run + "/config.json", kRunConfig);
  write(run + "/metrics.jsonl", "{}\n");
  write(run + "/checkpoints/step-00000002.h5", "x");
  write(model + "/config.json", kLlamaConfig);
  write(model + "/model.safetensors", "x");
  write(ckdir + "/step-00000004.h5", "x");
  EXPECT_EQ(describe_llmpi_run_dir(run), "checkpoints/ (1 step-*.h5), metrics.jsonl, the run's config.json");
  EXPECT_EQ(describe_llmpi_run_dir(ckdir), "1 checkpoint files (step-*.h5)");
  EXPECT_EQ(describe_llmpi_run_dir(model), "");
  EXPECT_EQ(describe_llmpi_run_dir(path("none")), "");
  std::string what;
  EXPECT_TRUE(is_hf_export_dir(model, &what));
  EXPECT_EQ(what, "a Hugging Face model (config.json of LlamaForCausalLM, model.safetensors)");
  EXPECT_FALSE(is_hf_export_dir(run));
  EXPECT_FALSE(is_hf_export_dir(ckdir));
  write(path("weights-only/model.safetensors"), "x");
  EXPECT_TRUE(is_hf_export_dir(path("weights-only")));
}

TEST_F(ExportDirTest, NewAndEmptyDirectoriesAreWritten) {
  EXPECT_EQ(export_into(path("a/b/new"), false, "config.json", "1"), "");
  EXPECT_EQ(read(path("a/b/new/config.json")), "1");
  const nlohmann::json rec = nlohmann::json::parse(read(path("a/b/new/llmpi_export.json")));
  EXPECT_EQ(rec["format"], "llmpi-export");
  EXPECT_EQ(rec["files"], nlohmann::json({"config.json"}));
  EXPECT_EQ(rec["source"], "test");
  fs::create_directories(path("empty"));
  EXPECT_EQ(export_into(path("empty") + "/", false, "config.json", "2"), "");
  EXPECT_EQ(read(path("empty/config.json")), "2");
  // Nothing else is left beside them (no staging or earlier contents).
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"a", "empty"}));
  EXPECT_EQ(entries(path("a/b")), (std::vector<std::string>{"new"}));
}

TEST_F(ExportDirTest, AnEarlierExportIsReplacedWhole) {
  const std::string out = path("exp");
  export_into(out, false, "tokenizer.json", "old tokenizer");
  EXPECT_EQ(export_into(out, false, "model.safetensors", "new"), "");
  EXPECT_EQ(entries(out), (std::vector<std::string>{"llmpi_export.json", "model.safetensors"}))
      << "the earlier export's tokenizer must not stay beside the new weights";
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"exp"}));
  // A file the export did not write makes it someone else's directory.
  write(out + "/README.md", "notes");
  const std::string e = error_of([&] { export_into(out, false, "config.json", "x"); });
  EXPECT_NE(e.find("is not empty: it holds README.md, llmpi_export.json, model.safetensors (an earlier llmpi export, "
                   "and files it did not write: README.md)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("pass --overwrite"), std::string::npos) << e;
  EXPECT_EQ(read(out + "/model.safetensors"), "new");
}

TEST_F(ExportDirTest, AnotherModelIsRefusedUnlessOverwriteWhichKeepsIt) {
  const std::string out = path("llama");
  write(out + "/config.json", kLlamaConfig);
  write(out + "/model.safetensors", "llama weights");
  write(out + "/tokenizer.json", "llama tokenizer");
  const std::string e = error_of([&] { export_into(out, false, "config.json", "gpt2"); });
  EXPECT_NE(e.find("--out '" + out + "' is not empty: it holds config.json, model.safetensors, tokenizer.json (a "
                   "Hugging Face model (config.json of LlamaForCausalLM, model.safetensors), not written by "
                   "llmpi-export)"),
            std::string::npos)
      << e;
  EXPECT_EQ(read(out + "/tokenizer.json"), "llama tokenizer");
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"llama"})) << "a refused export leaves nothing behind";

  const std::string previous = export_into(out, true, "config.json", "gpt2");
  EXPECT_EQ(previous.rfind(out + ".previous-", 0), 0u) << previous;
  EXPECT_EQ(entries(out), (std::vector<std::string>{"config.json", "llmpi_export.json"}));
  EXPECT_EQ(read(out + "/config.json"), "gpt2");
  EXPECT_EQ(entries(previous), (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  EXPECT_EQ(read(previous + "/tokenizer.json"), "llama tokenizer");
  EXPECT_EQ(entries(dir).size(), 2u);
}

TEST_F(ExportDirTest, ARunDirectoryIsNeverAnExportDestination) {
  const std::string run = path("run");
  write(run + "/config.json", kRunConfig);
  write(run + "/checkpoints/step-00000002.h5", "ck");
  for (bool overwrite : {false, true}) {
    const std::string e = error_of([&] { export_into(run, overwrite, "config.json", "hf"); });
    EXPECT_NE(e.find("--out '" + run + "' is an llmpi run directory (it holds checkpoints/ (1 step-*.h5), the run's "
                     "config.json)"),
              std::string::npos)
        << e;
    EXPECT_EQ(read(run + "/config.json"), kRunConfig);
  }
  EXPECT_NE(error_of([&] { export_into(run + "/checkpoints", true, "config.json", "hf"); }).find("llmpi run directory"),
            std::string::npos);
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"run"}));
}

TEST_F(ExportDirTest, FilesAndTheWorkingDirectoryAreRefused) {
  write(path("file"), "x");
  EXPECT_NE(error_of([&] { export_into(path("file"), true, "config.json", "1"); }).find("exists and is not a directory"),
            std::string::npos);
  write(path("cwd/inner/x"), "x");
  const fs::path before = fs::current_path();
  fs::current_path(path("cwd/inner"));
  const std::string e1 = error_of([&] { export_into(path("cwd"), true, "config.json", "1"); });
  const std::string e2 = error_of([&] { export_into(".", true, "config.json", "1"); });
  fs::current_path(before);
  EXPECT_NE(e1.find("is the working directory or holds it"), std::string::npos) << e1;
  EXPECT_NE(e2.find("is the working directory or holds it"), std::string::npos) << e2;
  EXPECT_EQ(entries(path("cwd/inner")), (std::vector<std::string>{"x"}));
}

TEST_F(ExportDirTest, AnUncommittedExportLeavesNothing) {
  {
    ExportDir e;
    open_export_dir(e, path("out"), false);
    write(e.staging + "/model.safetensors", "half");
    EXPECT_TRUE(fs::is_directory(e.staging));
  }  // e.g. a tensor was not finite: the error unwinds past the export
  EXPECT_TRUE(entries(dir).empty());
}

}  // namespace
}  // namespace llmpi
