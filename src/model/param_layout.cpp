// The parameter table of a part of the model (transformer.h build_param_table): which tensors a
// family's blocks, embedding and head hold, in backward order, and how tensor parallelism cuts them.
#include <cmath>

#include "model/transformer.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

bool is_norm_weight(int role) {
  return role == kEmbNormW || role == kNorm1W || role == kNorm2W || role == kFinalNormW;
}
bool is_bias(int role) {
  return role == kEmbNormB || role == kNorm1B || role == kNorm2B || role == kFinalNormB || role == kQkvB ||
         role == kAttnOutB || role == kFcB || role == kProjB || role == kPoolerB || role == kClsB;
}

struct TableBuilder {
  const ModelDesc& d;
  ParamTable t;
  // How one tensor of a role is cut over the tensor-parallel ranks (ParamSlice's fields).
  struct Cut {
    std::vector<int> whole_shape;
    int split = -1;
    std::vector<std::pair<int, int>> ranges;
  };
  // Adds a role's tensor(s) of `layer`, one shape per Hugging Face name (and, when d.tp > 1 and the
  // role is cut, one Cut each); a family without the role (no name) adds nothing.
  void add(int role, int layer, const std::vector<std::vector<int>>& shapes, const std::vector<Cut>& cuts = {}) {
    const std::vector<std::string> names = family_tensor_names(d.family, role, layer);
    if (names.empty()) return;
    if (names.size() != shapes.size())
      fail("internal: family ", family_name(d.family), " names ", names.size(), " tensors for role ",
           role_name(role), " but the layout has ", shapes.size());
    for (size_t i = 0; i < names.size(); i++) {
      ParamSlice s;
      s.name = names[i];
      s.shape = shapes[i];
      s.layer = layer;
      s.role = role;
      s.decay = shapes[i].size() == 2;
      if (d.tp > 1 && i < cuts.size()) {
        s.whole_shape = cuts[i].whole_shape;
        s.split = cuts[i].split;
        s.ranges = cuts[i].ranges;
      }
      if (is_norm_weight(role)) {
        s.init = InitKind::ones;
      } else if (is_bias(role)) {
        s.init = InitKind::zeros;
      } else {
        s.init = InitKind::normal;
        const bool residual = role == kAttnOutW || role == kProjW;
        s.init_std = d.residual_scaled_init && residual ? d.init_std / std::sqrt(2.0 * d.n_layer) : d.init_std;
      }
      t.add(std::move(s));
    }
  }
  // A dense layer's weight [out, in] (in = 0: its bias [out]) whose output is the parts p of
  // whole_outs[p] rows each, of which this rank holds rows [starts[p], starts[p] + outs[p]) (a
  // column-parallel layer; all of them without tensor parallelism). One tensor per part when the
  // family names the parts apart, else one tensor of all of them.
  void add_rows(int role, int layer, const std::vector<int>& whole_outs, const std::vector<int>& outs,
                const std::vector<int>& starts, int in) {
    const size_t parts = family_tensor_names(d.family, role, layer).size();
    auto shape = [&](int rows) { return in > 0 ? std::vector<int>{rows, in} : std::vector<int>{rows}; };
    std::vector<std::vector<int>> shapes;
    std::vector<Cut> cuts;
    if (parts == outs.size()) {
      for (size_t p = 0; p < outs.size(); p++) {
        shapes.push_back(shape(outs[p]));
        cuts.push_back({shape(whole_outs[p]), 0, {{starts[p], starts[p] + outs[p]}}});
      }
    } else {
      int total = 0, whole_total = 0;
      Cut cut{{}, 0, {}};
      for (size_t p = 0; p < outs.size(); p++) {
        cut.ranges.push_back({whole_total + starts[p], whole_total + starts[p] + outs[p]});
        total += outs[p];
        whole_total += whole_outs[p];
      }
      cut.whole_shape = shape(whole_total);
      shapes.push_back(shape(total));
      cuts.push_back(cut);
    }
    add(role, layer, shapes, cuts);
  }
  // A dense layer's weight [out, whole_in] of which this rank holds the input columns
  // [start, start + in) (a row-parallel layer).
  void add_cols(int role, int layer, int out, int whole_in, int in, int start) {
    add(role, layer, {{out, in}}, {Cut{{out, whole_in}, 1, {{start, start + in}}}});
  }
};

}  // namespace

ParamTable build_param_table(const ModelDesc& d, const ModelPart& part_in) {
  check_model_sizes(d);  // (before anything is built: the widths below are ints, the counts 64-bit)
  ModelPart part = part_in;
  if (part.l1 < 0) part.l1 = d.n_layer;
  if (part.l0 < 0 || part.l0 > part.l1 || part.l1 > d.n_layer)
    fail("model part: blocks [", part.l0, ", ", part.l1, ") are not within [0, ", d.n_layer, ")");
  // Tensor parallelism (d.tp > 1, "Tensor parallelism" in transformer.h): this rank's shard —
  // QKV and the MLP's first projection by output rows, the output projections by input columns,
  // the token embedding and the LM head by vocabulary rows; the rest whole.
  const int C = d.d_model, V = d.vocab_size, hs = d.head_dim(), r = d.tp_rank;
  const int F = d.ffn_dim, Fl = d.ffn(), V0 = d.vocab_begin(), Vl = d.vocab_rows();
  const int qd = d.n_head * hs, kvd = d.n_kv_head * hs, qdl = d.heads() * hs, kvdl = d.kv_heads() * hs;
  const bool layer_norm = d.norm == NormKind::layernorm;
  TableBuilder b{d, {}};
  // Backward order: the head, the blocks from last to first, the embedding.
  if (part.head) {
    if (d.head == HeadKind::lm) {
      if (!d.tie_embeddings) b.add_rows(kLmHead, -1, {V}, {Vl}, {V0}, C);
      if (d.final_norm) {
        b.add(kFinalNormW, -1, {{C}});
        if (layer_norm) b.add(kFinalNormB, -1, {{C}});
      }
    } else {
      b.add(kClsW, -1, {{d.num_labels, C}});
      b.add(kClsB, -1, {{d.num_labels}});
      b.add(kPoolerW, -1, {{C, C}});
      b.add(kPoolerB, -1, {{C}});
    }
  }
  for (int l = part.l1 - 1; l >= part.l0; l--) {
    auto norm = [&](int w, int bias) {
      b.add(w, l, {{C}});
      if (layer_norm) b.add(bias, l, {{C}});
    };
    auto mlp = [&] {
      b.add_cols(kProjW, l, C, F, Fl, r * Fl);
      if (d.bias) b.add(kProjB, l, {{C}});
      const bool two = d.mlp == MlpKind::swiglu;
      const std::vector<int> whole = two ? std::vector<int>{F, F} : std::vector<int>{F};
      const std::vector<int> mine = two ? std::vector<int>{Fl, Fl} : std::vector<int>{Fl};
      const std::vector<int> starts = two ? std::vector<int>{r * Fl, r * Fl} : std::vector<int>{r * Fl};
      b.add_rows(kFcW, l, whole, mine, starts, C);
      if (d.bias) b.add_rows(kFcB, l, whole, mine, starts, 0);
    };
    auto attn = [&] {
      b.add_cols(kAttnOutW, l, C, qd, qdl, r * qdl);
      if (d.bias) b.add(kAttnOutB, l, {{C}});
      b.add_rows(kQkvW, l, {qd, kvd, kvd}, {qdl, kvdl, kvdl}, {r * qdl, r * kvdl, r * kvdl}, C);
      if (d.bias) b.add_rows(kQkvB, l, {qd, kvd, kvd}, {qdl, kvdl, kvdl}, {r * qdl, r * kvdl, r * kvdl}, 0);
    };
    if (d.pre_norm) {  // backward: MLP branch, norm2, attention branch, norm1
      mlp();
      norm(kNorm2W, kNorm2B);
      attn();
      norm(kNorm1W, kNorm1B);
    } else {           // backward: norm2, MLP branch, norm1, attention branch
      norm(kNorm2W, kNorm2B);
      mlp();
      norm(kNorm1W, kNorm1B);
      attn();
    }
  }
  if (part.embedding) {
    if (d.embedding_norm) {
      b.add(kEmbNormW, -1, {{C}});
      b.add(kEmbNormB, -1, {{C}});
    }
    if (d.type_vocab_size > 0) b.add(kTypeEmb, -1, {{d.type_vocab_size, C}});
    if (d.learned_positions) b.add(kPosEmb, -1, {{d.max_seq_len, C}});
    b.add_rows(kTokEmb, -1, {V}, {Vl}, {V0}, C);
  } else if (part.head && d.head == HeadKind::lm && d.tie_embeddings) {
    b.add_rows(kTokEmb, -1, {V}, {Vl}, {V0}, C);  // this part's copy of the tied matrix, for the head
  }
  return b.t;
}

}  // namespace llmpi
