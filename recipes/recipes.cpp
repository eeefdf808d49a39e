#include "recipes/recipes.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/text.h"

namespace tessera {

namespace {

using ojson = nlohmann::ordered_json;

// A JSON value's type as an error message names it.
std::string type_of(const ojson& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number";
  return v.type_name();
}

// The constructor's keyword arguments: each read once with its type and PyTorch's default;
// finish() refuses what no read asked for.
class Config {
 public:
  Config(const std::string& arch, const std::vector<RecipeSetting>& settings)
      : where_("recipe " + arch) {
    for (const auto& [name, value] : settings)
      if (!values_.emplace(name, value).second)
        fail(ErrorCode::Arg, where_, "--set " + name + " is given twice");
  }
  const std::string& where() const { return where_; }

  int64_t integer(const char* name, std::optional<int64_t> def) {
    const ojson* v = get(name);
    if (!v) {
      if (!def) fail(ErrorCode::Arg, where_, std::string("missing required argument ") + name);
      return *def;
    }
    if (!v->is_number_integer()) type_error(name, "an integer", *v);
    return v->get<int64_t>();
  }
  std::optional<int64_t> optional_integer(const char* name) {
    const ojson* v = get(name);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number_integer()) type_error(name, "an integer or null", *v);
    return v->get<int64_t>();
  }
  double number(const char* name, double def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_number()) type_error(name, "a number", *v);
    return v->get<double>();
  }
  bool boolean(const char* name, bool def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_boolean()) type_error(name, "a boolean", *v);
    return v->get<bool>();
  }
  std::string string(const char* name, const std::string& def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_string()) type_error(name, "a string", *v);
    return v->get<std::string>();
  }
  // The raw value (null when absent), for arguments with their own structure.
  const ojson* raw(const char* name) { return get(name); }
  // An argument that takes a Python callable, class or module: only its default, None, is
  // expressible here.
  void callable(const char* name) {
    const ojson* v = get(name);
    if (v && !v->is_null())
      fail(ErrorCode::Arg, where_,
           std::string(name) + " takes a Python callable or class, which a recipe cannot express");
  }
  // An argument the architecture's builder sets itself (vit_b_16 sets patch_size=16): passing it
  // is PyTorch's "got multiple values for keyword argument" TypeError.
  void fixed_by(const char* name, const std::string& builder) {
    if (get(name))
      fail(ErrorCode::Arg, where_,
           builder + " sets " + name + " itself (got multiple values for keyword argument '" +
               name + "')");
  }
  void finish() const {
    for (const auto& [name, value] : values_) {
      (void)value;
      if (std::find(known_.begin(), known_.end(), name) == known_.end())
        fail(ErrorCode::Arg, where_,
             "unknown argument '" + name + "' (arguments: " + join(known_) + ")");
    }
  }

 private:
  const ojson* get(const char* name) {
    known_.emplace_back(name);
    const auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }
  [[noreturn]] void type_error(const char* name, const char* want, const ojson& got) const {
    fail(ErrorCode::Arg, where_,
         std::string(name) + " must be " + want + ", got " + type_of(got) + " " + got.dump());
  }

  std::string where_;
  std::map<std::string, ojson> values_;
  std::vector<std::string> known_;
};

// E_CONSTRAINT unless `ok`, with PyTorch's reason.
void require(bool ok, const Config& c, const std::string& why) {
  if (!ok) fail(ErrorCode::Constraint, c.where(), why);
}
void require_positive(int64_t v, const char* name, const Config& c) {
  require(v >= 1, c, std::string(name) + "=" + str(v) + " must be >= 1");
}
// nn.Dropout's ValueError.
void require_probability(double p, const char* name, const Config& c) {
  require(
      p >= 0.0 && p <= 1.0, c,
      std::string(name) + "=" + py_float(p) + ": dropout probability has to be between 0 and 1");
}

// The network file under construction.
class Net {
 public:
  Net() {
    json_["dtype"] = "float32";
    json_["inputs"] = ojson::object();
    json_["nodes"] = ojson::array();
    json_["outputs"] = ojson::object();
  }
  void input(const std::string& name, ojson shape, const char* dtype = nullptr) {
    json_["inputs"][name] = dtype ? ojson{{"shape", std::move(shape)}, {"dtype", dtype}} : shape;
  }
  // Adds a node and returns its name (the source of its first output).
  std::string node(const std::string& name, const char* op, ojson args, ojson inputs) {
    json_["nodes"].push_back(
        {{"name", name}, {"op", op}, {"args", std::move(args)}, {"inputs", std::move(inputs)}});
    return name;
  }
  void output(const std::string& name, const std::string& source) {
    json_["outputs"][name] = source;
  }
  ojson take() { return std::move(json_); }

 private:
  ojson json_;
};

std::string dotted(const std::string& a, const std::string& b) {
  std::string s = a;
  s += '.';
  s += b;
  return s;
}

// ---------------------------------------------------------------- VisionTransformer

struct VitShape {
  int64_t patch_size, num_layers, num_heads, hidden_dim, mlp_dim;
};

const std::map<std::string, VitShape>& vit_presets() {
  // torchvision 0.14 vision_transformer.py: vit_b_16 ... vit_h_14.
  static const std::map<std::string, VitShape> presets = {
      {"vit_b_16", {16, 12, 12, 768, 3072}},  {"vit_b_32", {32, 12, 12, 768, 3072}},
      {"vit_l_16", {16, 24, 16, 1024, 4096}}, {"vit_l_32", {32, 24, 16, 1024, 4096}},
      {"vit_h_14", {14, 32, 16, 1280, 5120}},
  };
  return presets;
}

// VisionTransformer.forward: conv_proj patches -> [B, N, D] tokens, the class token in front,
// + encoder.pos_embedding, the encoder blocks (pre-norm, LayerNorm eps 1e-6), encoder.ln, the
// class token's row, the heads.
ojson vit_network(Config& c, const std::string& arch) {
  VitShape s{};
  int64_t image_size;
  const auto preset = vit_presets().find(arch);
  if (preset != vit_presets().end()) {
    s = preset->second;
    for (const char* name : {"patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim"})
      c.fixed_by(name, arch);
    image_size = c.integer("image_size", 224);
    (void)c.boolean("progress", true);  // download progress: nothing is downloaded
    c.callable("weights");              // a WeightsEnum: pass its state_dict with --weights
  } else {
    image_size = c.integer("image_size", std::nullopt);
    s.patch_size = c.integer("patch_size", std::nullopt);
    s.num_layers = c.integer("num_layers", std::nullopt);
    s.num_heads = c.integer("num_heads", std::nullopt);
    s.hidden_dim = c.integer("hidden_dim", std::nullopt);
    s.mlp_dim = c.integer("mlp_dim", std::nullopt);
  }
  const double dropout = c.number("dropout", 0.0);
  const double attention_dropout = c.number("attention_dropout", 0.0);
  const int64_t num_classes = c.integer("num_classes", 1000);
  const std::optional<int64_t> representation_size = c.optional_integer("representation_size");
  c.callable("norm_layer");
  c.callable("conv_stem_configs");
  c.finish();

  require_positive(image_size, "image_size", c);
  require_positive(s.patch_size, "patch_size", c);
  require(s.num_layers >= 0, c, "num_layers=" + str(s.num_layers) + " must be >= 0");
  require_positive(s.num_heads, "num_heads", c);
  require_positive(s.hidden_dim, "hidden_dim", c);
  require_positive(s.mlp_dim, "mlp_dim", c);
  require_positive(num_classes, "num_classes", c);
  if (representation_size) require_positive(*representation_size, "representation_size", c);
  require_probability(dropout, "dropout", c);
  require_probability(attention_dropout, "attention_dropout", c);
  require(image_size % s.patch_size == 0, c,
          "Input shape indivisible by patch size! (image_size=" + str(image_size) +
              ", patch_size=" + str(s.patch_size) + ")");
  require(s.hidden_dim % s.num_heads == 0, c,
          "embed_dim must be divisible by num_heads (hidden_dim=" + str(s.hidden_dim) +
              ", num_heads=" + str(s.num_heads) + ")");

  const int64_t grid = image_size / s.patch_size;
  const int64_t seq = grid * grid + 1;
  const int64_t D = s.hidden_dim;
  Net net;
  net.input("x", ojson::array({"B", 3, image_size, image_size}));
  const std::string cls =
      net.node("class_token", "parameter", {{"shape", {1, 1, D}}}, ojson::object());
  const std::string pos = net.node("encoder.pos_embedding", "parameter",
                                   {{"shape", {1, seq, D}}, {"std", 0.02}}, ojson::object());
  // _process_input: conv_proj, reshape(n, D, n_h * n_w), permute(0, 2, 1).
  net.node("conv_proj", "conv2d",
           {{"in_channels", 3}, {"out_channels", D}, {"kernel_size", s.patch_size},
            {"stride", s.patch_size}},
           {{"x", "x"}});
  net.node("patches", "flatten", {{"start_dim", 2}}, {{"x", "conv_proj"}});
  net.node("tokens", "permute", {{"dims", {0, 2, 1}}}, {{"x", "patches"}});
  net.node("class_tokens", "expand", {{"sizes", {"B", -1, -1}}}, {{"x", cls}});
  net.node("sequence", "concat", {{"dim", 1}}, {{"x0", "class_tokens"}, {"x1", "tokens"}});
  std::string x =
      net.node("encoder.input", "add", ojson::object(), {{"a", "sequence"}, {"b", pos}});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string L = "encoder.layers.encoder_layer_" + str(i);
    net.node(dotted(L, "ln_1"), "layer_norm", {{"eps", 1e-6}}, {{"x", x}});
    net.node(dotted(L, "self_attention"), "multihead_attention",
             {{"embed_dim", D}, {"num_heads", s.num_heads}, {"dropout", attention_dropout},
              {"batch_first", true}, {"need_weights", false}},
             {{"query", dotted(L, "ln_1")}});
    net.node(dotted(L, "residual_1"), "add", ojson::object(),
             {{"a", dotted(L, "self_attention")}, {"b", x}});
    net.node(dotted(L, "ln_2"), "layer_norm", {{"eps", 1e-6}}, {{"x", dotted(L, "residual_1")}});
    net.node(dotted(L, "mlp.0"), "linear", {{"out_features", s.mlp_dim}},
             {{"x", dotted(L, "ln_2")}});
    net.node(dotted(L, "mlp.1"), "gelu", ojson::object(), {{"x", dotted(L, "mlp.0")}});
    net.node(dotted(L, "mlp.3"), "linear", {{"out_features", D}}, {{"x", dotted(L, "mlp.1")}});
    x = net.node(dotted(L, "residual_2"), "add", ojson::object(),
                 {{"a", dotted(L, "residual_1")}, {"b", dotted(L, "mlp.3")}});
  }
  net.node("encoder.ln", "layer_norm", {{"eps", 1e-6}}, {{"x", x}});
  x = net.node("class_output", "select", {{"dim", 1}, {"index", 0}}, {{"x", "encoder.ln"}});
  if (representation_size) {
    net.node("heads.pre_logits", "linear", {{"out_features", *representation_size}}, {{"x", x}});
    x = net.node("heads.act", "tanh", ojson::object(), {{"x", "heads.pre_logits"}});
  }
  net.node("heads.head", "linear", {{"out_features", num_classes}}, {{"x", x}});
  net.output("y", "heads.head");
  return net.take();
}

// ---------------------------------------------------------------- SwinTransformer (v1)

struct SwinShape {
  int64_t embed_dim;
  std::vector<int64_t> depths, num_heads;
  double stochastic_depth_prob;
};

const std::map<std::string, SwinShape>& swin_presets() {
  // torchvision 0.14 swin_transformer.py: swin_t, swin_s, swin_b (patch 4, window 7).
  static const std::map<std::string, SwinShape> presets = {
      {"swin_t", {96, {2, 2, 6, 2}, {3, 6, 12, 24}, 0.2}},
      {"swin_s", {96, {2, 2, 18, 2}, {3, 6, 12, 24}, 0.3}},
      {"swin_b", {128, {2, 2, 18, 2}, {4, 8, 16, 32}, 0.5}},
  };
  return presets;
}

// A list of ints (a JSON array, or one int for both of a pair when `pair`).
std::vector<int64_t> int_list(Config& c, const char* name, std::optional<std::vector<int64_t>> def,
                              const ojson* v) {
  if (!v) {
    if (!def) fail(ErrorCode::Arg, c.where(), std::string("missing required argument ") + name);
    return *def;
  }
  std::vector<int64_t> out;
  if (!v->is_array())
    fail(ErrorCode::Arg, c.where(), std::string(name) + " must be a list of integers, got " +
                                        type_of(*v) + " " + v->dump());
  for (const auto& e : *v) {
    if (!e.is_number_integer())
      fail(ErrorCode::Arg, c.where(),
           std::string(name) + " must be a list of integers, got " + v->dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// SwinTransformer.forward: features.0 (4x4 patches: conv, permute to [B, H, W, C], LayerNorm),
// then per stage i features.{1+2i} (blocks alternating shift 0 and window/2) and, between stages,
// features.{2+2i} (PatchMerging: pad to even, the four stride-2 phases, LayerNorm, a linear to 2C),
// norm, avgpool over H and W, head. Blocks: x + attn(norm1(x)), x + mlp(norm2(x)) (stochastic
// depth is the identity in eval).
ojson swin_network(Config& c, const std::string& arch) {
  SwinShape s{};
  std::vector<int64_t> patch, window;
  const auto preset = swin_presets().find(arch);
  if (preset != swin_presets().end()) {
    s = preset->second;
    for (const char* name : {"patch_size", "embed_dim", "depths", "num_heads", "window_size",
                             "stochastic_depth_prob"})
      c.fixed_by(name, arch);
    patch = {4, 4};
    window = {7, 7};
    (void)c.boolean("progress", true);
    c.callable("weights");
  } else {
    patch = int_list(c, "patch_size", std::nullopt, c.raw("patch_size"));
    s.embed_dim = c.integer("embed_dim", std::nullopt);
    s.depths = int_list(c, "depths", std::nullopt, c.raw("depths"));
    s.num_heads = int_list(c, "num_heads", std::nullopt, c.raw("num_heads"));
    window = int_list(c, "window_size", std::nullopt, c.raw("window_size"));
    s.stochastic_depth_prob = c.number("stochastic_depth_prob", 0.1);
  }
  const double mlp_ratio = c.number("mlp_ratio", 4.0);
  const double dropout = c.number("dropout", 0.0);
  const double attention_dropout = c.number("attention_dropout", 0.0);
  const int64_t num_classes = c.integer("num_classes", 1000);
  c.callable("norm_layer");
  c.callable("block");
  c.callable("downsample_layer");
  c.finish();

  require(patch.size() == 2, c, "patch_size must have 2 entries");
  require(window.size() == 2, c, "window_size and shift_size must be of length 2");
  for (int64_t v : patch) require_positive(v, "patch_size", c);
  for (int64_t v : window) require_positive(v, "window_size", c);
  require_positive(s.embed_dim, "embed_dim", c);
  require(!s.depths.empty(), c, "depths must not be empty");
  require(s.num_heads.size() >= s.depths.size(), c,
          "num_heads needs one entry per stage (list index out of range)");
  int64_t total_blocks = 0;
  for (int64_t d : s.depths) {
    require(d >= 0, c, "depths entries must be >= 0");
    total_blocks += d;
  }
  // stochastic_depth_prob * id / (total_stage_blocks - 1): ZeroDivisionError with one block.
  require(total_blocks != 1, c, "float division by zero (sum(depths) == 1)");
  require(mlp_ratio > 0.0, c, "mlp_ratio=" + py_float(mlp_ratio) + " must be > 0");
  require_probability(dropout, "dropout", c);
  require_probability(attention_dropout, "attention_dropout", c);
  require_probability(s.stochastic_depth_prob, "stochastic_depth_prob", c);
  require_positive(num_classes, "num_classes", c);

  Net net;
  net.input("x", ojson::array({"B", 3, "H", "W"}));
  net.node("features.0.0", "conv2d",
           {{"in_channels", 3}, {"out_channels", s.embed_dim}, {"kernel_size", patch},
            {"stride", patch}},
           {{"x", "x"}});
  net.node("features.0.1", "permute", {{"dims", {0, 2, 3, 1}}}, {{"x", "features.0.0"}});
  std::string x = net.node("features.0.2", "layer_norm", {{"eps", 1e-5}}, {{"x", "features.0.1"}});
  int64_t dim = s.embed_dim;
  for (size_t stage = 0; stage < s.depths.size(); ++stage) {
    const int64_t heads = s.num_heads[stage];
    require_positive(heads, "num_heads", c);
    require(dim % heads == 0, c,
            "num_heads[" + str(static_cast<int64_t>(stage)) + "]=" + str(heads) +
                " must divide the stage width " + str(dim));
    const std::string S = "features." + str(static_cast<int64_t>(1 + 2 * stage));
    const int64_t hidden = static_cast<int64_t>(static_cast<double>(dim) * mlp_ratio);  // int()
    require_positive(hidden, "int(dim * mlp_ratio)", c);
    for (int64_t j = 0; j < s.depths[stage]; ++j) {
      const std::string L = dotted(S, str(j));
      const ojson shift = j % 2 == 0 ? ojson::array({0, 0})
                                     : ojson::array({window[0] / 2, window[1] / 2});
      net.node(dotted(L, "norm1"), "layer_norm", {{"eps", 1e-5}}, {{"x", x}});
      net.node(dotted(L, "attn"), "shifted_window_attention",
               {{"dim", dim}, {"window_size", window}, {"shift_size", shift}, {"num_heads", heads},
                {"attention_dropout", attention_dropout}, {"dropout", dropout}},
               {{"x", dotted(L, "norm1")}});
      net.node(dotted(L, "residual1"), "add", ojson::object(),
               {{"a", x}, {"b", dotted(L, "attn")}});
      net.node(dotted(L, "norm2"), "layer_norm", {{"eps", 1e-5}}, {{"x", dotted(L, "residual1")}});
      net.node(dotted(L, "mlp.0"), "linear", {{"out_features", hidden}},
               {{"x", dotted(L, "norm2")}});
      net.node(dotted(L, "mlp.1"), "gelu", ojson::object(), {{"x", dotted(L, "mlp.0")}});
      net.node(dotted(L, "mlp.3"), "linear", {{"out_features", dim}}, {{"x", dotted(L, "mlp.1")}});
      x = net.node(dotted(L, "residual2"), "add", ojson::object(),
                   {{"a", dotted(L, "residual1")}, {"b", dotted(L, "mlp.3")}});
    }
    if (stage + 1 < s.depths.size()) {
      const std::string M = "features." + str(static_cast<int64_t>(2 + 2 * stage));
      net.node(dotted(M, "merge"), "patch_merging_pad", ojson::object(), {{"x", x}});
      net.node(dotted(M, "norm"), "layer_norm", {{"eps", 1e-5}}, {{"x", dotted(M, "merge")}});
      x = net.node(dotted(M, "reduction"), "linear", {{"out_features", 2 * dim}, {"bias", false}},
                   {{"x", dotted(M, "norm")}});
      dim *= 2;
    }
  }
  net.node("norm", "layer_norm", {{"eps", 1e-5}}, {{"x", x}});
  net.node("permute", "permute", {{"dims", {0, 3, 1, 2}}}, {{"x", "norm"}});
  net.node("avgpool", "adaptive_avg_pool2d", {{"output_size", 1}}, {{"x", "permute"}});
  net.node("flatten", "flatten", {{"start_dim", 1}}, {{"x", "avgpool"}});
  net.node("head", "linear", {{"out_features", num_classes}}, {{"x", "flatten"}});
  net.output("y", "head");
  return net.take();
}

// ---------------------------------------------------------------- torch.nn.Transformer

// The feed-forward half of an encoder or decoder layer: linear2(dropout(act(linear1(x)))).
std::string feed_forward(Net& net, const std::string& L, const std::string& x, int64_t ff,
                         int64_t d_model, const std::string& activation) {
  net.node(dotted(L, "linear1"), "linear", {{"out_features", ff}}, {{"x", x}});
  net.node(dotted(L, "activation"), activation.c_str(), ojson::object(),
           {{"x", dotted(L, "linear1")}});
  return net.node(dotted(L, "linear2"), "linear", {{"out_features", d_model}},
                  {{"x", dotted(L, "activation")}});
}

ojson mha_args(int64_t d_model, int64_t nhead, double dropout, bool causal) {
  ojson a = {{"embed_dim", d_model}, {"num_heads", nhead}, {"dropout", dropout},
             {"batch_first", true}, {"need_weights", false}};
  if (causal) a["is_causal"] = true;
  return a;
}

// nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (torch 1.13): `norm_first` puts each
// LayerNorm before its sublayer (x + f(norm(x))), otherwise after the residual (norm(x + f(x))).
// Each sublayer is given as a function of its input and returns its output node.
struct Sublayer {
  std::string norm;  // the LayerNorm node name
  std::function<std::string(const std::string&)> run;
  std::string residual;  // the residual add's node name
};

std::string residual_block(Net& net, const std::string& x, const Sublayer& s, bool norm_first,
                           double eps) {
  if (norm_first) {
    net.node(s.norm, "layer_norm", {{"eps", eps}}, {{"x", x}});
    const std::string y = s.run(s.norm);
    return net.node(s.residual, "add", ojson::object(), {{"a", x}, {"b", y}});
  }
  const std::string y = s.run(x);
  net.node(s.residual, "add", ojson::object(), {{"a", x}, {"b", y}});
  return net.node(s.norm, "layer_norm", {{"eps", eps}}, {{"x", s.residual}});
}

ojson transformer_network(Config& c) {
  c.fixed_by("batch_first", "the transformer recipe (torch.nn.Transformer(batch_first=True))");
  const int64_t d_model = c.integer("d_model", 512);
  const int64_t nhead = c.integer("nhead", 8);
  const int64_t enc_layers = c.integer("num_encoder_layers", 6);
  const int64_t dec_layers = c.integer("num_decoder_layers", 6);
  const int64_t ff = c.integer("dim_feedforward", 2048);
  const double dropout = c.number("dropout", 0.1);
  const std::string activation = c.string("activation", "relu");
  c.callable("custom_encoder");
  c.callable("custom_decoder");
  const double eps = c.number("layer_norm_eps", 1e-5);
  const bool norm_first = c.boolean("norm_first", false);
  c.callable("device");
  c.callable("dtype");
  c.finish();
  require_positive(d_model, "d_model", c);
  require_positive(nhead, "nhead", c);
  require(enc_layers >= 0, c, "num_encoder_layers=" + str(enc_layers) + " must be >= 0");
  require(dec_layers >= 0, c, "num_decoder_layers=" + str(dec_layers) + " must be >= 0");
  require_positive(ff, "dim_feedforward", c);
  require_probability(dropout, "dropout", c);
  require(eps > 0.0, c, "layer_norm_eps=" + py_float(eps) + " must be > 0");
  require(activation == "relu" || activation == "gelu", c,
          "activation should be relu/gelu, not " + activation);
  require(d_model % nhead == 0, c,
          "embed_dim must be divisible by num_heads (d_model=" + str(d_model) +
              ", nhead=" + str(nhead) + ")");

  Net net;
  net.input("src", ojson::array({"B", "S", d_model}));
  net.input("tgt", ojson::array({"B", "T", d_model}));
  std::string x = "src";
  for (int64_t i = 0; i < enc_layers; ++i) {
    const std::string L = "encoder.layers." + str(i);
    x = residual_block(net, x,
                       {dotted(L, "norm1"),
                        [&](const std::string& in) {
                          return net.node(dotted(L, "self_attn"), "multihead_attention",
                                          mha_args(d_model, nhead, dropout, false),
                                          {{"query", in}});
                        },
                        dotted(L, "residual1")},
                       norm_first, eps);
    x = residual_block(net, x,
                       {dotted(L, "norm2"),
                        [&](const std::string& in) {
                          return feed_forward(net, L, in, ff, d_model, activation);
                        },
                        dotted(L, "residual2")},
                       norm_first, eps);
  }
  const std::string memory = net.node("encoder.norm", "layer_norm", {{"eps", eps}}, {{"x", x}});
  x = "tgt";
  for (int64_t i = 0; i < dec_layers; ++i) {
    const std::string L = "decoder.layers." + str(i);
    x = residual_block(net, x,
                       {dotted(L, "norm1"),
                        [&](const std::string& in) {
                          return net.node(dotted(L, "self_attn"), "multihead_attention",
                                          mha_args(d_model, nhead, dropout, true), {{"query", in}});
                        },
                        dotted(L, "residual1")},
                       norm_first, eps);
    x = residual_block(net, x,
                       {dotted(L, "norm2"),
                        [&](const std::string& in) {
                          return net.node(dotted(L, "multihead_attn"), "multihead_attention",
                                          mha_args(d_model, nhead, dropout, false),
                                          {{"query", in}, {"key", memory}});
                        },
                        dotted(L, "residual2")},
                       norm_first, eps);
    x = residual_block(net, x,
                       {dotted(L, "norm3"),
                        [&](const std::string& in) {
                          return feed_forward(net, L, in, ff, d_model, activation);
                        },
                        dotted(L, "residual3")},
                       norm_first, eps);
  }
  net.node("decoder.norm", "layer_norm", {{"eps", eps}}, {{"x", x}});
  net.output("y", "decoder.norm");
  return net.take();
}

// ---------------------------------------------------------------- gpt

// GPT.forward of shared/reference/gpt_reference.py: tok(ids) + pos(arange(T)), pre-norm causal
// encoder layers with GELU, ln_f, logits = h @ tok.weight.t() (the head reads tok.weight).
ojson gpt_network(Config& c) {
  const int64_t vocab = c.integer("vocab_size", 50257);
  const int64_t context = c.integer("context", 1024);
  const int64_t d_model = c.integer("d_model", 768);
  const int64_t nhead = c.integer("nhead", 12);
  const int64_t layers = c.integer("num_layers", 12);
  const int64_t ff = c.integer("dim_feedforward", 3072);
  const double eps = c.number("layer_norm_eps", 1e-5);
  c.finish();
  require_positive(vocab, "vocab_size", c);
  require_positive(context, "context", c);
  require_positive(d_model, "d_model", c);
  require_positive(nhead, "nhead", c);
  require(layers >= 0, c, "num_layers=" + str(layers) + " must be >= 0");
  require_positive(ff, "dim_feedforward", c);
  require(eps > 0.0, c, "layer_norm_eps=" + py_float(eps) + " must be > 0");
  require(d_model % nhead == 0, c,
          "embed_dim must be divisible by num_heads (d_model=" + str(d_model) +
              ", nhead=" + str(nhead) + ")");

  Net net;
  net.input("ids", ojson::array({"B", "T"}), "int64");
  net.node("tok", "embedding", {{"num_embeddings", vocab}, {"embedding_dim", d_model}},
           {{"x", "ids"}});
  net.node("positions", "arange", {{"dim", 1}}, {{"like", "ids"}});
  net.node("pos", "embedding", {{"num_embeddings", context}, {"embedding_dim", d_model}},
           {{"x", "positions"}});
  std::string x = net.node("embedded", "add", ojson::object(), {{"a", "tok"}, {"b", "pos"}});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string L = "blocks.layers." + str(i);
    x = residual_block(net, x,
                       {dotted(L, "norm1"),
                        [&](const std::string& in) {
                          return net.node(dotted(L, "self_attn"), "multihead_attention",
                                          mha_args(d_model, nhead, 0.0, true), {{"query", in}});
                        },
                        dotted(L, "residual1")},
                       true, eps);
    x = residual_block(net, x,
                       {dotted(L, "norm2"),
                        [&](const std::string& in) {
                          return feed_forward(net, L, in, ff, d_model, "gelu");
                        },
                        dotted(L, "residual2")},
                       true, eps);
  }
  net.node("ln_f", "layer_norm", {{"eps", eps}}, {{"x", x}});
  net.node("logits", "linear", {{"out_features", vocab}, {"bias", false}},
           {{"x", "ln_f"}, {"weight", "tok.weight"}});
  net.output("logits", "logits");
  return net.take();
}

}  // namespace

std::string recipe_text(const ojson& network) {
  std::string s = "{\n";
  bool first_key = true;
  for (const auto& [key, value] : network.items()) {
    s += first_key ? " " : ",\n ";
    first_key = false;
    s += ojson(key).dump() + ": ";
    if (!value.is_structured() || value.empty()) {
      s += value.dump();
      continue;
    }
    const bool array = value.is_array();
    s += array ? "[\n" : "{\n";
    bool first = true;
    for (const auto& [k, v] : value.items()) {
      s += first ? "  " : ",\n  ";
      first = false;
      if (!array) s += ojson(k).dump() + ": ";
      s += v.dump();
    }
    s += array ? "\n ]" : "\n }";
  }
  return s + "\n}\n";
}

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> names = {
      "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "vision_transformer",
      "swin_t",   "swin_s",   "swin_b",   "swin_transformer", "transformer", "gpt"};
  return names;
}

ojson make_recipe(const std::string& arch, const std::vector<RecipeSetting>& settings) {
  const auto& names = recipe_names();
  if (std::find(names.begin(), names.end(), arch) == names.end())
    fail(ErrorCode::Arg, "recipe",
         "unknown architecture '" + arch + "' (architectures: " + join(names) + ")");
  Config c(arch, settings);
  if (arch == "transformer") return transformer_network(c);
  if (arch == "gpt") return gpt_network(c);
  if (arch.starts_with("swin")) return swin_network(c, arch);
  return vit_network(c, arch);
}

}  // namespace tessera
