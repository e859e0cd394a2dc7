//! Whether a model fits a GPU class, and the smallest split that does: the
//! arithmetic behind `llmgw ctl plan`. Pure: the model's `config.json` and
//! its safetensors index come in as values, the fleet's GPU classes as
//! numbers.
//!
//! Memory per GPU = its share of the weights + a fixed overhead (CUDA
//! context, activations) + its share of the KV cache for the headroom's
//! tokens, against the card's memory times the utilisation an engine is
//! given (vLLM's `gpu_memory_utilization`, 0.9 by default). The weights
//! split evenly over TP × PP ranks; the KV cache splits its layers over PP
//! and its KV heads over TP, a head never splitting (TP beyond the KV
//! heads replicates them).

use serde_json::Value;

/// A number format weights (or the KV cache) are held in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    Fp8,
    Int8,
    Int4,
}

impl Dtype {
    /// Bytes per value, in eighths (int4 is half a byte).
    fn eighths(self) -> u64 {
        match self {
            Dtype::F32 => 32,
            Dtype::Bf16 | Dtype::F16 => 16,
            Dtype::Fp8 | Dtype::Int8 => 8,
            Dtype::Int4 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::Fp8 => "fp8",
            Dtype::Int8 => "int8",
            Dtype::Int4 => "int4",
        }
    }

    /// `bfloat16`, `bf16`, `float16`, `fp8`, `float8_e4m3fn` …, as
    /// `config.json` and people write them.
    pub fn parse(s: &str) -> Option<Dtype> {
        let s = s.trim().to_ascii_lowercase();
        Some(match s.as_str() {
            "float32" | "fp32" | "f32" => Dtype::F32,
            "bfloat16" | "bf16" => Dtype::Bf16,
            "float16" | "fp16" | "f16" | "half" => Dtype::F16,
            "int8" | "i8" => Dtype::Int8,
            "int4" | "i4" => Dtype::Int4,
            _ if s.starts_with("float8") || s.starts_with("fp8") => Dtype::Fp8,
            _ => return None,
        })
    }

    /// The bytes `n` values take, rounded up.
    pub fn bytes(self, n: u64) -> u64 {
        (n * self.eighths()).div_ceil(8)
    }
}

/// What the arithmetic needs to know of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    pub params: u64,
    /// The format its weights are stored in.
    pub dtype: Dtype,
    pub layers: u32,
    pub attention_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// `max_position_embeddings`, when given.
    pub max_context: Option<u32>,
    /// Whether `params` was read from the weight index (exact) or counted
    /// from the architecture (an estimate).
    pub params_exact: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SizingError(pub String);

fn field(c: &Value, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|n| c.get(*n).and_then(Value::as_u64))
}

impl ModelShape {
    /// From a Hugging Face `config.json` and, when there is one, the
    /// `total_size` (bytes) of `model.safetensors.index.json`, which makes
    /// the parameter count exact; without it the count is estimated from
    /// the architecture (a decoder with gated MLPs, as Llama, Qwen and
    /// Mistral are).
    pub fn from_config(config: &Value, index_bytes: Option<u64>) -> Result<Self, SizingError> {
        // Multimodal configs keep the language model's shape apart.
        let c = config
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(config);
        let need = |names: &[&str]| {
            field(c, names)
                .ok_or_else(|| SizingError(format!("config.json has no {} (an integer)", names[0])))
        };
        let hidden = need(&["hidden_size", "n_embd", "d_model"])?;
        let layers = need(&["num_hidden_layers", "n_layer", "num_layers"])?;
        let heads = need(&["num_attention_heads", "n_head"])?;
        let kv_heads = field(c, &["num_key_value_heads"]).unwrap_or(heads);
        let head_dim = field(c, &["head_dim"]).unwrap_or(hidden / heads.max(1));
        let dtype_name = [config, c]
            .iter()
            .find_map(|v| {
                v.get("torch_dtype")
                    .or_else(|| v.get("dtype"))
                    .and_then(Value::as_str)
            })
            .unwrap_or("bfloat16");
        let mut dtype = Dtype::parse(dtype_name).ok_or_else(|| {
            SizingError(format!(
                "config.json's dtype {dtype_name:?} is not one llmgw knows"
            ))
        })?;
        // Quantised checkpoints say so apart from torch_dtype, which then
        // names the unquantised parts' format.
        if let Some(q) = config.get("quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
            let bits = q.get("bits").and_then(Value::as_u64);
            dtype = match (method, bits) {
                ("fp8", _) => Dtype::Fp8,
                (_, Some(4)) => Dtype::Int4,
                (_, Some(8)) => Dtype::Int8,
                _ => dtype,
            };
        }
        let (params, exact) = match index_bytes {
            Some(bytes) if bytes > 0 => ((bytes * 8).div_ceil(dtype.eighths()), true),
            _ => (
                estimate_params(c, hidden, layers, heads, kv_heads, head_dim),
                false,
            ),
        };
        let narrow = |v: u64, what: &str| {
            u32::try_from(v).map_err(|_| SizingError(format!("config.json's {what} is too large")))
        };
        Ok(ModelShape {
            params,
            dtype,
            layers: narrow(layers, "num_hidden_layers")?,
            attention_heads: narrow(heads, "num_attention_heads")?,
            kv_heads: narrow(kv_heads, "num_key_value_heads")?,
            head_dim: narrow(head_dim, "head_dim")?,
            max_context: field(c, &["max_position_embeddings"]).and_then(|v| u32::try_from(v).ok()),
            params_exact: exact,
        })
    }

    /// The weights' bytes held in `dtype` (the stored format, unless the
    /// engine is told to quantise).
    pub fn weight_bytes(&self, dtype: Dtype) -> u64 {
        dtype.bytes(self.params)
    }

    /// KV-cache bytes one token takes on one of `tp × pp` ranks.
    pub fn kv_bytes_per_token(&self, kv: Dtype, tp: u32, pp: u32) -> u64 {
        let layers = u64::from(self.layers.div_ceil(pp.max(1)));
        let heads = u64::from(self.kv_heads.div_ceil(tp.max(1)).max(1));
        kv.bytes(2 * layers * heads * u64::from(self.head_dim))
    }
}

/// Parameters of a decoder with gated MLPs (and, for mixtures of experts,
/// every expert's), from its config: embeddings, attention, MLP, norms.
fn estimate_params(
    c: &Value,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
) -> u64 {
    let vocab = field(c, &["vocab_size"]).unwrap_or(32_000);
    let inter = field(c, &["intermediate_size", "n_inner"]).unwrap_or(4 * hidden);
    let experts = field(c, &["num_local_experts", "n_routed_experts", "num_experts"]).unwrap_or(1);
    let expert_inter = field(c, &["moe_intermediate_size"]).unwrap_or(inter);
    let attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2;
    let mlp = if experts > 1 {
        3 * hidden * expert_inter * experts + hidden * experts
    } else {
        3 * hidden * inter
    };
    let per_layer = attention + mlp + 2 * hidden;
    let tied = c
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let embeddings = vocab * hidden * if tied { 1 } else { 2 };
    embeddings + layers * per_layer + hidden
}

/// A kind of GPU in the fleet and how many of it one node has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuClass {
    pub class: String,
    /// Per card, as the driver reports it.
    pub memory_mb: u64,
    /// The most cards of this class on one node.
    pub per_node: u32,
    /// Nodes with this class.
    pub nodes: u32,
}

/// What must fit beside the weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    /// The share of a card the engine may use.
    pub utilization: f64,
    /// MiB per GPU for the CUDA context and activations.
    pub overhead_mb: u64,
    /// Tokens of KV cache that must fit (over all requests together).
    pub kv_tokens: u64,
    /// The KV cache's format.
    pub kv_dtype: Dtype,
}

impl Default for Headroom {
    fn default() -> Self {
        Headroom {
            utilization: 0.9,
            overhead_mb: 1024,
            kv_tokens: 8192,
            kv_dtype: Dtype::Bf16,
        }
    }
}

/// One split of a model over a class's cards, worked out.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub tp: u32,
    pub pp: u32,
    /// MiB each GPU needs: weights, overhead and the headroom's KV cache.
    pub needed_mb: u64,
    /// MiB each GPU offers the engine.
    pub usable_mb: u64,
    /// Tokens of KV cache the room left after weights and overhead holds.
    pub kv_tokens: u64,
    pub fits: bool,
}

const MIB: u64 = 1 << 20;

/// The arithmetic for one split (`tp` GPUs per stage, `pp` stages).
pub fn check(
    shape: &ModelShape,
    weights: Dtype,
    class: &GpuClass,
    room: &Headroom,
    tp: u32,
    pp: u32,
) -> Split {
    let ranks = u64::from(tp.max(1)) * u64::from(pp.max(1));
    let weights_mb = shape.weight_bytes(weights).div_ceil(ranks).div_ceil(MIB);
    let kv_per_token = shape.kv_bytes_per_token(room.kv_dtype, tp, pp).max(1);
    let kv_mb = (room.kv_tokens * kv_per_token).div_ceil(MIB);
    let usable_mb = (class.memory_mb as f64 * room.utilization).floor() as u64;
    let needed_mb = weights_mb + room.overhead_mb + kv_mb;
    let free_bytes = usable_mb.saturating_sub(weights_mb + room.overhead_mb) * MIB;
    Split {
        tp,
        pp,
        needed_mb,
        usable_mb,
        kv_tokens: free_bytes / kv_per_token,
        fits: needed_mb <= usable_mb,
    }
}

/// The smallest split that fits on `class`: tensor parallelism within a
/// node first (1, 2, 4, 8 … cards, each dividing the attention heads, up
/// to the node's cards), then pipeline stages across its nodes. None when
/// even every card of the class would not hold it.
pub fn smallest_split(
    shape: &ModelShape,
    weights: Dtype,
    class: &GpuClass,
    room: &Headroom,
) -> Option<Split> {
    let tps: Vec<u32> = std::iter::successors(Some(1u32), |t| t.checked_mul(2))
        .take_while(|t| *t <= class.per_node.max(1))
        .filter(|t| shape.attention_heads.is_multiple_of(*t))
        .collect();
    (1..=class.nodes.max(1)).find_map(|pp| {
        // More stages than layers cannot be.
        if pp > shape.layers.max(1) {
            return None;
        }
        tps.iter()
            .map(|&tp| check(shape, weights, class, room, tp, pp))
            .find(|s| s.fits)
    })
}

#[cfg(test)]
mod tests;
