#pragma once
// The `model:` section of an experiment file and the attention choices it names (head mixing, execution path,
// router), declared beside the attention that uses them (experiments/experiment_config.h holds the whole file).
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"

namespace moh {

/// Largest model.img_size accepted (a sanity bound; memory is checked against the machine separately).
constexpr int64_t kMaxImageSize = 8192;

/// How heads are mixed in an attention layer.
enum class AttentionMode { mha, moh, moa };
const config::EnumTable<AttentionMode>& enum_table(AttentionMode);

/// Execution path of MoH attention: `dense` computes every head then gates (the official code, the reference);
/// `sparse` computes only the selected (token, head) pairs; `automatic` ("auto", the default) lets each layer pick
/// the faster of the two from its active-head ratio and sequence length (vision/nn/attention_core.h:
/// choose_attention_path).
enum class AttentionPath { dense, sparse, automatic };
const config::EnumTable<AttentionPath>& enum_table(AttentionPath);

/// How a MoH layer chooses its routed heads: `learned` (the official router `wg`/`wg_0`/`wg_1`, Eq. 5 of the paper)
/// or `query_norm` (no parameters, as the released continue-tuned MoH-LLaMA3: per token the L2 norms of the routed
/// heads' query projections, divided by their standard deviation, softmax, top-K; selected heads and shared heads
/// get weight 1, the others 0, so a dense model's output distribution is kept).
enum class RouterKind { learned, query_norm };
const config::EnumTable<RouterKind>& enum_table(RouterKind);

/// Normalisation of a transformer block: LayerNorm (DiT; no affine in adaLN blocks) or RMSNorm (LightningDiT, with a
/// learned scale); `automatic` ("auto") in a config = the variant's own.
enum class NormKind { automatic, layernorm, rmsnorm };
const config::EnumTable<NormKind>& enum_table(NormKind);

/// Feed-forward of a transformer block: GELU MLP (fc1, fc2) or SwiGLU (LightningDiT's w12, w3; hidden 2/3 of the
/// MLP's); `automatic` = the variant's own.
enum class MlpKind { automatic, gelu, swiglu };
const config::EnumTable<MlpKind>& enum_table(MlpKind);

/// Positions: the fixed 2-D sin-cos embedding added to the tokens (DiT), or that plus 2-D rotary embedding of queries
/// and keys in every attention layer (rope2d, LightningDiT's VisionRotaryEmbeddingFast); `automatic` = the variant's.
enum class PosKind { automatic, sincos, rope2d };
const config::EnumTable<PosKind>& enum_table(PosKind);

/// Whether the blocks run the fused operations (vision/nn/fused_ops.h: LayerNorm + modulate, gate + residual,
/// bias + GELU, the MoH router, the head gates in the projection's layout): `on`, `off` (the official op sequence),
/// or `automatic` ("auto", the default: where a measurement showed them faster, use_fused_ops).
enum class FusedMode { automatic, on, off };
const config::EnumTable<FusedMode>& enum_table(FusedMode);

/// `model:` — which network and how its attention runs.
struct ModelConfig {
  std::string name;                      ///< registry name, e.g. "MoH-ViT-S-75" (`moh info --list`)
  std::vector<AttentionMode> attention;  ///< per-stage override of the head mixing; empty = variant default
  AttentionPath attention_path = AttentionPath::automatic;
  RouterKind router = RouterKind::learned;  ///< how MoH layers choose their routed heads
  std::vector<int64_t> shared_heads;        ///< MoH split override: h_s per stage (classifier) or layer (DiT)
  std::vector<int64_t> topk;                ///< with shared_heads: K per stage / layer (0 = all heads weighted)
  int64_t num_classes = 0;                  ///< 0 = variant default
  int64_t img_size = 0;                     ///< 0 = variant default
  double drop_path = -1.0;                  ///< < 0 = variant default
  std::string weights;                      ///< initialise from this file (safetensors or torch.save)
  std::string weights_key;                  ///< key inside a nested checkpoint (ema|model|state_dict)
  bool weights_allow_missing = false;       ///< tolerate tensors the weights file lacks (e.g. pos_embed)
  NormKind norm = NormKind::automatic;      ///< DiT blocks (LightningDiT: rmsnorm); auto = the variant's
  MlpKind mlp = MlpKind::automatic;         ///< DiT blocks (LightningDiT: swiglu)
  PosKind pos = PosKind::automatic;         ///< DiT (LightningDiT: rope2d)
  bool qk_norm = false;                     ///< DiT: normalise queries and keys per head (RMSNorm or LayerNorm)
  bool overlap_output = false;              ///< DiT: overlapping output windows (no patch seams)
  FusedMode fused = FusedMode::automatic;   ///< fused block operations (on / off / auto)

  template <class V>
  void visit(V& v) {
    v.field("name", name, "model variant from the registry (`moh info --list`)", config::Need::required);
    v.field("attention", attention, "per-stage head mixing override (mha|moh|moa); empty = the variant's own");
    v.field("attention_path", attention_path,
            "MoH execution path of the attention layers (DiT and classifier): auto (per layer, the faster path for its "
            "active ratio and length), dense (official, gates all heads) or sparse (selected pairs only)");
    v.field("router", router,
            "MoH head router: learned (official, wg / wg_0 / wg_1) or query_norm (parameter-free: top-K of the routed "
            "heads' query norms, selected and shared heads weighted 1; for dense checkpoints turned into MoH)");
    v.field("shared_heads", shared_heads,
            "MoH split on the variant's own heads (a dense model becomes MoH: `moh convert --to-moh`): shared heads "
            "h_s per stage (classifiers, 4 values) or per layer (DiT: depth values, or one for every layer)",
            config::Range{0, 4096});
    v.field("topk", topk,
            "with model.shared_heads: routed heads per token K of each stage / layer (same length; 0 = every head "
            "on, softmax-weighted, needs shared = heads)",
            config::Range{0, 4096});
    v.field("num_classes", num_classes, "classifier outputs / DiT label classes; 0 = variant default",
            config::Range{0, 1e6});
    v.field("img_size", img_size, "input resolution in pixels; 0 = variant default", config::Range{0, 8192});
    v.field("drop_path", drop_path, "stochastic-depth rate at the last block; negative = variant default",
            config::Range{-1, 1});
    v.field("weights", weights, "initialise from this weights file (.safetensors or torch.save .pt/.pth)");
    v.field("weights_key", weights_key, "entry inside a nested checkpoint to load (ema, model, state_dict)");
    v.field("weights_allow_missing", weights_allow_missing,
            "keep initialised values for tensors the weights file lacks");
    v.field("norm", norm, "DiT block normalisation: layernorm (DiT) or rmsnorm (LightningDiT); auto = the variant's");
    v.field("mlp", mlp, "DiT block feed-forward: gelu (DiT) or swiglu (LightningDiT); auto = the variant's");
    v.field("pos", pos,
            "DiT positions: sincos (DiT) or rope2d (sincos + 2-D rotary queries/keys, LightningDiT); auto = the "
            "variant's");
    v.field("qk_norm", qk_norm, "DiT: normalise queries and keys per head with model.norm (LightningDiT's qk_norm)");
    v.field("overlap_output", overlap_output,
            "DiT: each token predicts a window twice its patch's side, tent-weighted and overlap-added, so that "
            "neighbouring patches blend instead of meeting at a seam (pixel-space models with large patches)");
    v.field(
        "fused", fused,
        "fused block operations (LayerNorm + modulate, gate + residual, bias + GELU, the MoH router, head gates): "
        "on, off (the official op sequence) or auto (the rule measured per device: docs/BENCHMARKS.md, Fused block)");
  }
  /// Rules of model: alone (a family's own rules: its validate hook).
  void validate(const config::RuleError& bad) const;
};

/// Why h_s always-on heads and top-K of the remaining h − h_s do not fit a layer of h heads, or "" when they do:
/// 0 ≤ h_s ≤ h, 0 ≤ K ≤ h − h_s, and K = 0 (every head weighted) only with h_s = h. The one rule behind
/// model.shared_heads / model.topk and each MoH layer's options.
std::string head_split_error(int64_t heads, int64_t shared, int64_t topk);

/// UserError on model.router when query_norm is asked of a model without MoH layers (it routes their heads; a dense
/// checkpoint runs as MoH by loading it into a MoH variant). `variant` names the family's MoH variants for the hint.
void check_router(RouterKind router, bool has_moh_layers, const std::string& variant);

/// One layer's (or stage's) MoH split from model.shared_heads / model.topk.
struct HeadSplit {
  int64_t shared = 0, topk = 0;
};
/// The split model.shared_heads / model.topk gives to `heads.size()` layers (stages) with heads[i] heads each; one
/// value for all of them when `one_for_all` allows it. Empty when neither key is set; UserErrors naming the key for
/// a missing partner, a wrong length or a value outside 0 ≤ h_s ≤ h, 0 ≤ K ≤ h − h_s (K = 0 needs h_s = h).
std::vector<HeadSplit> moh_split(const ModelConfig& model, const std::vector<int64_t>& heads, bool one_for_all,
                                 const std::string& unit);

/// The seed of module (or parameter) `name`'s initial weights when a model draws them by name (train.paired): seed and
/// name mixed (FNV-1a of the name, SplitMix64's finaliser), the same whatever other modules the model has.
uint64_t module_seed(int64_t seed, const std::string& name);
/// Seeds the global generator for `name` when seed >= 0; does nothing for seed < 0 (one stream in module order).
void seed_for_module(int64_t seed, const std::string& name);

}  // namespace moh
