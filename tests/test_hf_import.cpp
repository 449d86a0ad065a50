// Hugging Face weights in and out (hf/): the safetensors reader and writer, the import of
// tests/fixtures/hf/{gpt2,llama,bert} (tiny random models saved by transformers, with the
// outputs transformers computed: tools/make_hf_fixtures.py), export, and every error path.
//
// "Relative" differences are normwise: max |ours - theirs| / max |theirs| over the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "file_test_util.h"
#include "hf/hf_export.h"
#include "hf/hf_import.h"
#include "hf/safetensors.h"
#include "model/transformer.h"
#include "runtime/config.h"

using namespace llmpi;
using llmpi::test::TempDirTest;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fixture_dir(const std::string& family) {
  for (std::string base : {"tests/fixtures/hf/", "../tests/fixtures/hf/"})
    if (fs::exists(base + family + "/config.json")) return base + family;
  return "";
}

#define REQUIRE_FIXTURE(dir, family)                                                              \
  const std::string dir = fixture_dir(family);                                                    \
  ASSERT_FALSE(dir.empty()) << "run the tests from the project root (tests/fixtures/hf/" family \
                               " not found)"

json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::vector<float> read_expected(const std::string& dir, const std::string& name, std::vector<int64_t>* shape = nullptr) {
  SafetensorsFile f(dir + "/expected.safetensors");
  const StTensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> v(t->numel());
  f.read_float(*t, v.data());
  if (shape) *shape = t->shape;
  return v;
}

double rel_diff(const std::vector<float>& ours, const std::vector<float>& theirs) {
  EXPECT_EQ(ours.size(), theirs.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(ours.size(), theirs.size()); i++) {
    num = std::max(num, std::fabs(double(ours[i]) - theirs[i]));
    den = std::max(den, std::fabs(double(theirs[i])));
  }
  return den > 0 ? num / den : num;
}

// Bound for llmpi's fp32 forward against transformers' (fp32, on the CPU), on rel_diff's scale:
// both compute every dot product of the model in their own order, each within gamma_K =
// K·u/(1 − K·u), u = 2^-24, of the exact value relative to the magnitude of its terms, passed on
// through the layers, whose norms keep it at the outputs' scale (max|theirs|); the two differ by
// at most 2·gamma_K of it, K the longest sum: the MLP's channels, d_model or the positions.
double fp32_forward_bound(const ModelDesc& d) {
  const double K = std::max({d.d_model, d.ffn_dim, d.max_seq_len}), u = 0x1p-24;
  return 2 * K * u / (1 - K * u);
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, (double)std::fabs(x));
  return m;
}

// Outputs of a forward pass over the fixture's inputs: logits [rows, classes] and the hidden
// state leaving the last block [B*T, C].
struct Outputs {
  std::vector<float> logits, last_hidden;
};

Outputs run_model(const HfModel& m, const json& inputs) {
  Model model(m.desc, cpu_ops());
  cpu_ops().copy_to_device(model.params, m.params.data(), m.params.size() * sizeof(float));
  const auto ids = inputs["input_ids"].get<std::vector<std::vector<int32_t>>>();
  const int B = (int)ids.size(), T = (int)ids[0].size();
  std::vector<int32_t> tokens, zeros((size_t)B * T, 0), types, mask, labels(B, 0);
  for (auto& row : ids) tokens.insert(tokens.end(), row.begin(), row.end());
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens = tokens.data();
  if (m.desc.head == HeadKind::lm) {
    b.targets = zeros.data();
  } else {
    for (auto& row : inputs["token_type_ids"].get<std::vector<std::vector<int32_t>>>())
      types.insert(types.end(), row.begin(), row.end());
    for (auto& row : inputs["attention_mask"].get<std::vector<std::vector<int32_t>>>())
      mask.insert(mask.end(), row.begin(), row.end());
    b.token_types = types.data();
    b.attn_mask = mask.data();
    b.labels = labels.data();
  }
  Activations a;
  a.all_logits = true;  // every row's logits, in contiguous rows
  a.allocate(model, B, T);
  model.forward(a, b, HeadMode::eval);
  Outputs o;
  const size_t rows = model.rows_for_loss(B, T);
  const size_t classes = m.desc.head == HeadKind::lm ? m.desc.vocab_size : m.desc.num_labels;
  o.logits.resize(rows * classes);
  cpu_ops().copy_to_host(o.logits.data(), a.logits, o.logits.size() * sizeof(float));
  o.last_hidden.resize((size_t)B * T * m.desc.d_model);
  cpu_ops().copy_to_host(o.last_hidden.data(), a.output(), o.last_hidden.size() * sizeof(float));
  return o;
}

// Greedy continuation by full recompute (argmax of the last position's logits).
std::vector<int> greedy(const HfModel& m, std::vector<int> ids, int n_new) {
  const size_t prompt = ids.size();
  for (int s = 0; s < n_new; s++) {
    json in = {{"input_ids", {ids}}};
    const Outputs o = run_model(m, in);
    const float* last = o.logits.data() + (ids.size() - 1) * m.desc.vocab_size;
    ids.push_back(int(std::max_element(last, last + m.desc.vocab_size) - last));
  }
  return std::vector<int>(ids.begin() + prompt, ids.end());
}

// A copy of a fixture directory whose safetensors file is rewritten by `edit` (which may drop,
// rename, reshape or add tensors), with config.json edited by `edit_config`.
struct Tensors {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> data;
  void remove(const std::string& n) {
    for (size_t i = 0; i < names.size(); i++)
      if (names[i] == n) {
        names.erase(names.begin() + i), shapes.erase(shapes.begin() + i), data.erase(data.begin() + i);
        return;
      }
    ADD_FAILURE() << "no tensor " << n;
  }
  int index(const std::string& n) const {
    for (size_t i = 0; i < names.size(); i++)
      if (names[i] == n) return (int)i;
    return -1;
  }
  void add(const std::string& n, std::vector<int64_t> shape, float value) {
    size_t numel = 1;
    for (auto d : shape) numel *= d;
    names.push_back(n), shapes.push_back(shape), data.push_back(std::vector<float>(numel, value));
  }
  std::vector<StWriteTensor> view(size_t from = 0, size_t to = SIZE_MAX) const {
    std::vector<StWriteTensor> w;
    for (size_t i = from; i < std::min(to, names.size()); i++) w.push_back({names[i], shapes[i], data[i].data(), {}});
    return w;
  }
};

Tensors read_all(const std::string& path) {
  SafetensorsFile f(path);
  Tensors t;
  for (const StTensor& s : f.tensors()) {
    t.names.push_back(s.name);
    t.shapes.push_back(s.shape);
    t.data.emplace_back(s.numel());
    f.read_float(s, t.data.back().data());
  }
  return t;
}

void copy_fixture(const std::string& from, const std::string& to, const std::function<void(Tensors&)>& edit,
                  const std::function<void(json&)>& edit_config = {}) {
  fs::create_directories(to);
  Tensors t = read_all(from + "/model.safetensors");
  if (edit) edit(t);
  write_safetensors(to + "/model.safetensors", t.view());
  json c = read_json(from + "/config.json");
  if (edit_config) edit_config(c);
  std::ofstream(to + "/config.json") << c.dump(1);
}

// A safetensors image from header text and a data buffer of `data_bytes` zero bytes.
std::string st_image(const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
  std::string out(8, '\0');
  const uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; i++) out[i] = char(n >> (8 * i) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::string st_error(const std::string& image) {
  return llmpi::test::error_of([&] {
    parse_safetensors_header(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x.safetensors");
  });
}

}  // namespace

// ---- safetensors ------------------------------------------------------------------------------

TEST(Safetensors, WriteThenReadGivesTheSameTensors) {
  std::vector<float> a = {1, -2, 3.5f, 1e-30f, -0.0f, 7}, b = {42};
  const std::string bytes = safetensors_bytes({{"a", {2, 3}, a.data(), {}}, {"b.scalar", {}, b.data(), {}}}, {{"k", "v"}});
  EXPECT_EQ((bytes.size() - 8 - 24 - 4) % 8, 0u) << "header padded to 8 bytes";
  const StHeader h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.metadata.at("k"), "v");
  const StTensor* ta = h.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> back(6);
  st_to_float(ta->dtype, reinterpret_cast<const uint8_t*>(bytes.data()) + ta->begin, 6, back.data());
  EXPECT_EQ(0, std::memcmp(back.data(), a.data(), 24));  // Exact: F32 bytes copied back
  EXPECT_EQ(h.find("b.scalar")->numel(), 1u);
}

// Found by fuzz/safetensors_fuzz.cpp (its seed scalar_empty.safetensors): an empty tensor's
// buffer is a null pointer, which memcpy must not receive even for 0 bytes (UBSan).
TEST(Safetensors, EmptyTensorsConvertAndWriteWithNullBuffers) {
  st_to_float(StDtype::F32, nullptr, 0, nullptr);
  st_to_float(StDtype::BF16, nullptr, 0, nullptr);
  const std::string bytes = safetensors_bytes({{"empty", {0, 4}, nullptr, {}}});
  const StHeader h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_NE(h.find("empty"), nullptr);
  EXPECT_EQ(h.find("empty")->numel(), 0u);
  EXPECT_EQ(h.find("empty")->shape, (std::vector<int64_t>{0, 4}));
}

TEST(Safetensors, HalfAndBfloat16BecomeFloatExactly) {
  // F16: 1.0 = 0x3c00, -2.5 = 0xc100, 65504 = 0x7bff, 2^-24 (smallest subnormal) = 0x0001,
  //      2^-14 (smallest normal) = 0x0400, inf = 0x7c00, -0 = 0x8000
  const uint16_t h[] = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x0400, 0x7c00, 0x8000, 0x03ff};
  const float want[] = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -14),
                        std::numeric_limits<float>::infinity(), -0.0f, std::ldexp(1023.0f, -24)};
  uint8_t bytes[16];
  for (int i = 0; i < 8; i++) bytes[2 * i] = h[i] & 0xff, bytes[2 * i + 1] = h[i] >> 8;
  float out[8];
  st_to_float(StDtype::F16, bytes, 8, out);
  for (int i = 0; i < 8; i++) {
    EXPECT_EQ(out[i], want[i]) << i;  // Exact: every half is a float
    EXPECT_EQ(std::signbit(out[i]), std::signbit(want[i])) << i;
  }
  // BF16: the upper 16 bits of the float
  const float fl[] = {1.0f, -3.140625f, 1e30f};
  uint8_t bb[6];
  for (int i = 0; i < 3; i++) {
    uint32_t bits;
    std::memcpy(&bits, &fl[i], 4);
    bb[2 * i] = (bits >> 16) & 0xff, bb[2 * i + 1] = bits >> 24;
  }
  st_to_float(StDtype::BF16, bb, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.140625f);
  // Exact: 1e30f with its lower 16 bits cleared (the bf16 read is a widening, no rounding)
  uint32_t bits30;
  std::memcpy(&bits30, &fl[2], 4);
  bits30 &= 0xffff0000u;
  float want30;
  std::memcpy(&want30, &bits30, 4);
  EXPECT_EQ(out[2], want30);
  EXPECT_ERROR_HAS(st_to_float(StDtype::I64, bb, 0, out), "cannot be read as float");
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(st_error(st_image(ok, 8)), "(no error)");
  EXPECT_NE(st_error("abc").find("too short"), std::string::npos);
  EXPECT_NE(st_error(st_image(ok, 8, 1u << 30)).find("runs past the end"), std::string::npos);
  EXPECT_NE(st_error(st_image("[1,2,3]", 0)).find("does not start with a JSON object"), std::string::npos);
  EXPECT_NE(st_error(st_image("{\"a\": ", 0)).find("not a well-formed JSON object"), std::string::npos);
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[2]}})", 8)).find("\"data_offsets\""), std::string::npos);
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8)).find("unknown dtype \"Q4\""),
            std::string::npos);
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)).find("not a size"),
            std::string::npos);
  // out of the file
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)).find("outside the data"),
            std::string::npos);
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)).find("outside the data"),
            std::string::npos);
  // shape and byte range disagree (and a shape whose size overflows)
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16)).find("needs 12 bytes"),
            std::string::npos);
  EXPECT_NE(st_error(st_image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8))
                .find("more bytes than the file holds"),
            std::string::npos);
  // overlapping tensors
  const std::string overlap = st_error(st_image(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  EXPECT_NE(overlap.find("\"a\" and \"b\" overlap"), std::string::npos) << overlap;
  EXPECT_NE(st_error(st_image(R"({"__metadata__":{"k":1}})", 0)).find("not a string"), std::string::npos);
}

TEST_F(TempDirTest, SafetensorsFileIsWrittenAtomicallyAndMapped) {
  std::vector<float> a(1000);
  for (size_t i = 0; i < a.size(); i++) a[i] = float(i) * 0.5f;
  write_safetensors(path("w.safetensors"), {{"w", {10, 100}, a.data(), {}}});
  EXPECT_FALSE(fs::exists(path("w.safetensors.tmp")));
  SafetensorsFile f(path("w.safetensors"));
  std::vector<float> back(1000);
  f.read_float(*f.find("w"), back.data());
  EXPECT_EQ(back, a);  // Exact: the floats written, read back
  EXPECT_ERROR_HAS(SafetensorsFile(path("none.safetensors")), "cannot open");
  std::ofstream(path("bad.safetensors")) << "not a safetensors file at all";
  EXPECT_ERROR_HAS(SafetensorsFile(path("bad.safetensors")), "bad.safetensors");
  EXPECT_ERROR_HAS(write_safetensors(path("no/such/dir/x.safetensors"), {{"w", {1}, a.data(), {}}}), "cannot write");
}

// A tensor given by a fill (called once, when written) gives the bytes of the same values given as
// data, and an error its fill throws leaves no file and no .tmp.
TEST_F(TempDirTest, SafetensorsTensorsFromFillEqualThoseFromData) {
  std::vector<float> a(600), b = {3, -1};
  for (size_t i = 0; i < a.size(); i++) a[i] = float(i) - 0.25f;
  int calls = 0;
  const auto fill_a = [&](float* out) {
    calls++;
    std::copy(a.begin(), a.end(), out);
  };
  write_safetensors(path("d.safetensors"), {{"a", {20, 30}, a.data(), {}}, {"b", {2}, b.data(), {}}});
  write_safetensors(path("f.safetensors"), {{"a", {20, 30}, nullptr, fill_a}, {"b", {2}, b.data(), {}}});
  EXPECT_EQ(calls, 1);
  auto bytes = [&](const std::string& f) {
    std::ifstream in(path(f), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes("f.safetensors"), bytes("d.safetensors"));
  const auto fail_fill = [](float*) { fail("the source is unreadable"); };
  EXPECT_ERROR_HAS(write_safetensors(path("x.safetensors"), {{"b", {2}, b.data(), {}}, {"a", {20, 30}, nullptr, fail_fill}}),
                   "the source is unreadable");
  EXPECT_FALSE(fs::exists(path("x.safetensors")));
  EXPECT_FALSE(fs::exists(path("x.safetensors.tmp")));
}

// ---- the fixtures: llmpi computes what transformers computed -----------------------------------

class HfFamily : public testing::TestWithParam<const char*> {};

TEST_P(HfFamily, LogitsMatchTransformers) {
  const std::string d = fixture_dir(GetParam());
  ASSERT_FALSE(d.empty()) << "run the tests from the project root";
  const json fx = read_json(d + "/fixture.json");
  const HfModel m = load_hf_model(d);
  EXPECT_EQ(family_name(m.desc.family), std::string(GetParam()));
  const Outputs o = run_model(m, fx["inputs"]);
  std::vector<int64_t> shape;
  const std::vector<float> want = read_expected(d, "logits", &shape);
  ASSERT_EQ(o.logits.size(), want.size());
  const double r = rel_diff(o.logits, want);
  EXPECT_LT(r, fp32_forward_bound(m.desc)) << GetParam() << " logits";  // Bound: fp32_forward_bound
  std::printf("%s: logits %s relative difference %.2e (bound %.2e)\n", GetParam(), json(shape).dump().c_str(), r,
              fp32_forward_bound(m.desc));
  if (m.desc.family == Family::bert) {
    const double rh = rel_diff(o.last_hidden, read_expected(d, "last_hidden"));
    EXPECT_LT(rh, fp32_forward_bound(m.desc)) << "bert last hidden state";
    EXPECT_TRUE(m.notes.empty()) << m.notes[0];
  }
}

TEST_P(HfFamily, GreedyGenerationMatchesTransformers) {
  const std::string d = fixture_dir(GetParam());
  ASSERT_FALSE(d.empty());
  const json fx = read_json(d + "/fixture.json");
  if (!fx.contains("generations")) GTEST_SKIP() << GetParam() << " is not a language model";
  const HfModel m = load_hf_model(d);
  for (const json& g : fx["generations"]) {
    const auto want = g["greedy_20"].get<std::vector<int>>();
    // Exact tokens: fp32_forward_bound moves a logit of size about 5 by at most 7.7e-5 (gpt2,
    // K = 128; llama, K = 64: 3.6e-5), a top-1/top-2 gap by twice that; transformers' smallest gap
    // on these steps (min_top2_margin: 7.4e-3 gpt2, 1.2e-2 llama) is 48 times more, so no argmax flips.
    EXPECT_EQ(greedy(m, g["prompt"].get<std::vector<int>>(), 20), want) << GetParam();
  }
}

TEST_P(HfFamily, ImportExportImportIsBitIdentical) {
  const std::string d = fixture_dir(GetParam());
  ASSERT_FALSE(d.empty());
  struct Tmp : llmpi::test::TempDirTest {
    void TestBody() override {}
  } tmp;
  tmp.SetUp();
  const HfModel a = load_hf_model(d);
  export_hf_model(tmp.path("out"), a.desc, a.table, a.params.data());
  const HfModel b = load_hf_model(tmp.path("out"));
  EXPECT_EQ(model_desc_json(a.desc), model_desc_json(b.desc));
  ASSERT_EQ(a.params.size(), b.params.size());
  // Exact: the export writes the floats it read, and the import reads them back
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)));
  // The export holds exactly the tensors transformers saved (names and shapes).
  SafetensorsFile theirs(d + "/model.safetensors"), ours(tmp.path("out/model.safetensors"));
  std::map<std::string, std::vector<int64_t>> t1, t2;
  for (auto& t : theirs.tensors()) t1[t.name] = t.shape;
  for (auto& t : ours.tensors()) t2[t.name] = t.shape;
  EXPECT_EQ(t1, t2);
  // and its config.json the same architecture and shape keys
  const json c1 = read_json(d + "/config.json"), c2 = read_json(tmp.path("out/config.json"));
  EXPECT_EQ(c1["architectures"], c2["architectures"]);
  for (const char* k : {"n_layer", "n_head", "n_embd", "vocab_size", "num_key_value_heads", "hidden_size",
                        "intermediate_size", "num_hidden_layers", "type_vocab_size", "tie_word_embeddings"})
    if (c1.contains(k) && !(std::string(k) == "tie_word_embeddings" && a.desc.family == Family::bert)) {
      EXPECT_EQ(c1[k], c2.contains(k) ? c2[k] : json()) << k;
    }
  tmp.TearDown();
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamily, testing::Values("gpt2", "llama", "bert"));

TEST(HfImport, AModelPartReadsOnlyItsTensorsWithTheSameValues) {
  REQUIRE_FIXTURE(d, "llama");
  const HfModel whole = load_hf_model(d);
  ModelPart part;
  part.l0 = 1;
  part.embedding = false;
  const ParamTable t = build_param_table(whole.desc, part);
  std::vector<float> host(t.numel);
  load_hf_params(d, whole.desc, t, 1, host.data());
  for (const ParamSlice& s : t.slices) {  // Exact: the same floats copied from the same file
    const ParamSlice& w = whole.table.at(s.name);
    EXPECT_EQ(0, std::memcmp(host.data() + s.offset, whole.params.data() + w.offset, s.numel * 4)) << s.name;
  }
}

TEST(HfImport, GPT2ConvWeightsAreTransposed) {
  REQUIRE_FIXTURE(d, "gpt2");
  const HfModel m = load_hf_model(d);
  SafetensorsFile f(d + "/model.safetensors");
  const StTensor* t = f.find("transformer.h.0.mlp.c_fc.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->shape, (std::vector<int64_t>{32, 128}));  // Conv1D: [in, out]
  std::vector<float> theirs(t->numel());
  f.read_float(*t, theirs.data());
  const ParamSlice& s = m.table.at("h.0.mlp.c_fc.weight");
  ASSERT_EQ(s.shape, (std::vector<int>{128, 32}));  // ours: [out, in]
  for (int o = 0; o < 128; o += 17)  // Exact: a transposed copy
    for (int i = 0; i < 32; i += 5) EXPECT_EQ(m.params[s.offset + o * 32 + i], theirs[i * 128 + o]);
}

// ---- what a checkpoint may lack or carry ----------------------------------------------------------

TEST_F(TempDirTest, BertModelWithoutClassifierIsInitialisedAndSaysSo) {
  REQUIRE_FIXTURE(src, "bert");
  // A BertModel checkpoint: no "bert." prefix, no classifier, plus the position_ids buffer
  // older checkpoints carry, and one tensor nobody uses.
  copy_fixture(
      src, path("bm"),
      [](Tensors& t) {
        t.remove("classifier.weight");
        t.remove("classifier.bias");
        for (auto& n : t.names)
          if (n.rfind("bert.", 0) == 0) n = n.substr(5);
        t.add("embeddings.position_ids", {1, 64}, 0);
        t.add("cls.predictions.bias", {256}, 0);
      },
      [](json& c) { c["architectures"] = {"BertModel"}; c.erase("id2label"); c.erase("label2id"); });
  const HfModel m = load_hf_model(path("bm"));
  ASSERT_EQ(m.notes.size(), 2u);
  EXPECT_NE(m.notes[0].find("classifier.weight, classifier.bias: initialised"), std::string::npos) << m.notes[0];
  EXPECT_NE(m.notes[1].find("does not use: cls.predictions.bias"), std::string::npos) << m.notes[1];
  EXPECT_EQ(m.desc.num_labels, 2) << "BertModel: the configured (default) number of labels";
  const json fx = read_json(src + "/fixture.json");
  const Outputs o = run_model(m, fx["inputs"]);
  EXPECT_LT(rel_diff(o.last_hidden, read_expected(src, "last_hidden")), fp32_forward_bound(m.desc));  // Bound: (its comment)
  // The classifier starts as init_param_values gives it: zero bias, N(0, init_std) weights.
  const ParamSlice& cb = m.table.at("classifier.bias");
  for (size_t i = 0; i < cb.numel; i++) EXPECT_EQ(m.params[cb.offset + i], 0.0f);  // Exact: set to 0
}

TEST_F(TempDirTest, MissingTensorsAreNamedAndNothingIsRead) {
  REQUIRE_FIXTURE(src, "gpt2");
  copy_fixture(src, path("m"), [](Tensors& t) {
    t.remove("transformer.h.1.ln_2.bias");
    t.remove("transformer.wpe.weight");
  });
  const HfConfig c = read_hf_config(path("m"));
  const ModelDesc d = hf_model_desc(c);
  const ParamTable t = build_param_table(d);
  std::vector<float> host(t.numel, 12345.0f);
  const std::string msg = llmpi::test::error_of([&] { load_hf_params(path("m"), d, t, 1, host.data()); });
  EXPECT_NE(msg.find("lacks 2 tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer.h.1.ln_2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer.wpe.weight"), std::string::npos) << msg;
  // Exact: the fill value, untouched
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](float x) { return x == 12345.0f; })) << "values were read";
}

TEST_F(TempDirTest, WrongShapesAndDtypesAreNamedBeforeAnythingIsRead) {
  REQUIRE_FIXTURE(src, "llama");
  copy_fixture(src, path("s"), [](Tensors& t) {
    const int i = t.index("model.layers.0.self_attn.k_proj.weight");
    t.shapes[i] = {32, 16};  // transposed
  });
  const HfConfig c = read_hf_config(path("s"));
  const ModelDesc d = hf_model_desc(c);
  const ParamTable t = build_param_table(d);
  std::vector<float> host(t.numel, 7.0f);
  const std::string msg = llmpi::test::error_of([&] { load_hf_params(path("s"), d, t, 1, host.data()); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight is [32, 16], the model needs [16, 32]"), std::string::npos)
      << msg;
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](float x) { return x == 7.0f; }));  // Exact: untouched
  // an integer tensor where a parameter belongs
  Tensors tt = read_all(src + "/model.safetensors");
  json h = json::object();
  std::string data;
  for (size_t i = 0; i < tt.names.size(); i++) {
    const bool as_int = tt.names[i] == "model.norm.weight";
    h[tt.names[i]] = {{"dtype", as_int ? "I32" : "F32"}, {"shape", tt.shapes[i]},
                      {"data_offsets", {data.size(), data.size() + tt.data[i].size() * 4}}};
    data.append(reinterpret_cast<const char*>(tt.data[i].data()), tt.data[i].size() * 4);
  }
  fs::create_directories(path("i"));
  fs::copy(src + "/config.json", path("i/config.json"));
  std::ofstream(path("i/model.safetensors"), std::ios::binary) << st_image(h.dump(), 0) + data;
  EXPECT_ERROR_HAS(load_hf_model(path("i")), "model.norm.weight has dtype I32, not a float type");
}

TEST_F(TempDirTest, ShardedCheckpointsLoadLikeOneFile) {
  REQUIRE_FIXTURE(src, "gpt2");
  fs::create_directories(path("sh"));
  fs::copy(src + "/config.json", path("sh/config.json"));
  Tensors t = read_all(src + "/model.safetensors");
  const size_t half = t.names.size() / 2;
  write_safetensors(path("sh/model-00001-of-00002.safetensors"), t.view(0, half));
  write_safetensors(path("sh/model-00002-of-00002.safetensors"), t.view(half));
  json map = json::object();
  for (size_t i = 0; i < t.names.size(); i++)
    map[t.names[i]] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  std::ofstream(path("sh/model.safetensors.index.json")) << json{{"metadata", json::object()}, {"weight_map", map}}.dump();
  const HfModel a = load_hf_model(src), b = load_hf_model(path("sh"));
  EXPECT_EQ(a.params, b.params);  // Exact: the same floats from two files
  // an index naming a tensor its shard does not hold, and one escaping the directory
  map["transformer.wte.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(path("sh/model.safetensors.index.json")) << json{{"weight_map", map}}.dump();
  EXPECT_ERROR_HAS(load_hf_model(path("sh")), "lists \"transformer.wte.weight\" in model-00001-of-00002.safetensors");
  map["transformer.wte.weight"] = "../x.safetensors";
  std::ofstream(path("sh/model.safetensors.index.json")) << json{{"weight_map", map}}.dump();
  EXPECT_ERROR_HAS(load_hf_model(path("sh")), "must be a file name in the same directory");
}

TEST_F(TempDirTest, UnsupportedConfigurationsAreRefusedByKey) {
  REQUIRE_FIXTURE(src, "gpt2");
  auto with = [&](const std::string& name, const std::function<void(json&)>& edit) {
    copy_fixture(src, path(name), {}, edit);
    return llmpi::test::error_of([&] { read_hf_config(path(name)); });
  };
  EXPECT_NE(with("a", [](json& c) { c["architectures"] = {"GPT2ForTokenClassification"}; })
                .find("architecture \"GPT2ForTokenClassification\" is not supported"),
            std::string::npos);
  EXPECT_NE(with("b", [](json& c) { c["activation_function"] = "relu"; }).find("\"activation_function\" = \"relu\""),
            std::string::npos);
  EXPECT_NE(with("c", [](json& c) { c["n_layer"] = "two"; }).find("\"n_layer\" must be a non-negative integer"),
            std::string::npos);
  REQUIRE_FIXTURE(lsrc, "llama");
  copy_fixture(lsrc, path("r"), {}, [](json& c) { c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}}; });
  EXPECT_ERROR_HAS(read_hf_config(path("r")), "only plain RoPE");
  EXPECT_ERROR_HAS(read_hf_config(path("nothing-here")), "config.json");
  fs::create_directories(path("empty"));
  fs::copy(src + "/config.json", path("empty/config.json"));
  EXPECT_ERROR_HAS(load_hf_model(path("empty")), "neither model.safetensors nor model.safetensors.index.json");
}

// ---- config.json fills model.* --------------------------------------------------------------------

TEST(HfImport, ConfigFillsModelKeysAndConflictsNameBoth) {
  REQUIRE_FIXTURE(d, "llama");
  const HfConfig c = read_hf_config(d);
  const std::string base = R"({"data": {"train": "x.h5"}, "model": {"seq_len": 32}})";
  const Config cfg = parse_config(base, "run.json", {}, &c.source);
  EXPECT_EQ(cfg.model.family, Family::llama);
  EXPECT_EQ(cfg.model.n_layer, 2);
  EXPECT_EQ(cfg.model.n_kv_head, 2);
  EXPECT_EQ(cfg.model.ffn_dim, 64);
  EXPECT_EQ(cfg.model.vocab_size, 320);
  EXPECT_EQ(cfg.model.max_seq_len, 64);
  EXPECT_EQ(cfg.model.norm_eps, 1e-5);  // Exact: config.json's 1e-05 and the literal parse to one double
  EXPECT_FALSE(cfg.model.tie_embeddings);
  EXPECT_EQ(cfg.model.seq_len, 32);
  // The same value set by the user is fine; another is an error naming both.
  EXPECT_NO_THROW(parse_config(base, "run.json", {"model.n_layer=2", "model.family=llama"}, &c.source));
  const std::string msg =
      llmpi::test::error_of([&] { parse_config(base, "run.json", {"model.n_layer=3"}, &c.source); });
  EXPECT_NE(msg.find("'model.n_layer' is set to 3 but '" + d + "/config.json' has 2"), std::string::npos) << msg;
  EXPECT_ERROR_HAS(parse_config(R"({"data": {"train": "x.h5"}, "model": {"family": "gpt2"}})", "run.json", {}, &c.source),
                   "'model.family' is set to \"gpt2\" but");
  // Dropout is the user's when set, else config.json's (Exact: 0.25 and 0 are doubles exactly).
  EXPECT_EQ(parse_config(base, "run.json", {"model.dropout=0.25"}, &c.source).model.dropout, 0.25);
  REQUIRE_FIXTURE(b, "bert");
  const HfConfig cb = read_hf_config(b);
  const Config bc = parse_config(R"({"data": {"train": "x.h5"}, "model": {"seq_len": 16}})", "run.json", {}, &cb.source);
  EXPECT_EQ(bc.model.num_labels, 3);
  EXPECT_EQ(bc.model.dropout, 0.0);  // the fixture's hidden_dropout_prob
  // A seq_len beyond the checkpoint's positions is refused when the model is described.
  const Config longer =
      parse_config(R"({"data": {"train": "x.h5"}, "model": {"seq_len": 128}})", "run.json", {}, &cb.source);
  EXPECT_ERROR_HAS(model_desc_from_config(longer.model, 320), "'model.max_seq_len' (64) is shorter than 'model.seq_len' (128)");
}

// ---- the real pretrained model (make pretrained) --------------------------------------------------

TEST(HfPretrained, MiniLMLastHiddenStateMatchesTransformersOnRTE) {
  std::string dir;
  for (std::string base : {"pretrained/all-MiniLM-L6-v2", "../pretrained/all-MiniLM-L6-v2"})
    if (fs::exists(base + "/model.safetensors")) dir = base;
  if (dir.empty()) GTEST_SKIP() << "pretrained/all-MiniLM-L6-v2 not found: run `make pretrained` to fetch it";
  std::string fx_path;
  for (std::string base : {"tests/fixtures/hf/", "../tests/fixtures/hf/"})
    if (fs::exists(base + "minilm_rte.json")) fx_path = base + "minilm_rte.json";
  ASSERT_FALSE(fx_path.empty()) << "tests/fixtures/hf/minilm_rte.json not found";
  const json fx = read_json(fx_path);
  const HfModel m = load_hf_model(dir);
  EXPECT_EQ(m.desc.n_layer, 6);
  EXPECT_EQ(m.desc.d_model, 384);
  ASSERT_EQ(m.notes.size(), 1u);  // BertModel: the classifier is initialised
  EXPECT_NE(m.notes[0].find("classifier.weight, classifier.bias: initialised"), std::string::npos) << m.notes[0];
  const int dims = fx["hidden_dims_recorded"];
  for (const json& p : fx["pairs"]) {
    const auto ids = p["input_ids"].get<std::vector<int32_t>>();
    json in = {{"input_ids", {ids}},
               {"token_type_ids", {p["token_type_ids"]}},
               {"attention_mask", {std::vector<int32_t>(ids.size(), 1)}}};
    const Outputs o = run_model(m, in);
    std::vector<float> ours, theirs, norms_ours, norms_theirs;
    for (size_t t = 0; t < ids.size(); t++) {
      const float* row = o.last_hidden.data() + t * m.desc.d_model;
      for (int k = 0; k < dims; k++) ours.push_back(row[k]);
      double n2 = 0;
      for (int k = 0; k < m.desc.d_model; k++) n2 += double(row[k]) * row[k];
      norms_ours.push_back(float(std::sqrt(n2)));
      for (const json& v : p["last_hidden_leading"][t]) theirs.push_back(v.get<float>());
      norms_theirs.push_back(p["last_hidden_row_norms"][t].get<float>());
    }
    // Bound: fp32_forward_bound (K = 1536, the MLP: 1.8e-4), and the fixture's decimals: values
    // rounded to 7 places, norms to 6 (half a unit of the last place over the largest).
    EXPECT_LT(rel_diff(ours, theirs), fp32_forward_bound(m.desc) + 0.5e-7 / max_abs(theirs)) << p["sentence2"];
    EXPECT_LT(rel_diff(norms_ours, norms_theirs), fp32_forward_bound(m.desc) + 0.5e-6 / max_abs(norms_theirs))
        << p["sentence2"];
  }
}
