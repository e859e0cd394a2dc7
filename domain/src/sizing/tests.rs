//! Checked against published figures: the configs and index sizes of
//! Llama 3.1 8B and 70B (Hugging Face), and the memory drivers report for
//! an H100 80 GB (81559 MiB), an RTX 4090 (24564 MiB) and an L4
//! (23034 MiB).

use serde_json::json;

use super::*;

fn llama_70b() -> Value {
    json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
           "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": false,
           "torch_dtype": "bfloat16"})
}

fn llama_8b() -> Value {
    json!({"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16"})
}

const LLAMA_70B_BYTES: u64 = 141_107_412_992;
const LLAMA_8B_BYTES: u64 = 16_060_522_496;

fn class(name: &str, memory_mb: u64, per_node: u32, nodes: u32) -> GpuClass {
    GpuClass {
        class: name.into(),
        memory_mb,
        per_node,
        nodes,
    }
}

#[test]
fn the_index_makes_the_parameter_count_exact() {
    let s = ModelShape::from_config(&llama_70b(), Some(LLAMA_70B_BYTES)).unwrap();
    assert_eq!(s.params, 70_553_706_496);
    assert!(s.params_exact);
    assert_eq!((s.kv_heads, s.head_dim, s.layers), (8, 128, 80));
    // 70.6 B parameters in bf16 are 141 GB (131 GiB) of weights.
    assert_eq!(s.weight_bytes(Dtype::Bf16), LLAMA_70B_BYTES);
    assert_eq!(s.weight_bytes(Dtype::Fp8), LLAMA_70B_BYTES / 2);
}

#[test]
fn without_an_index_the_count_is_estimated_within_a_percent() {
    for (config, exact) in [
        (llama_70b(), 70_553_706_496u64),
        (llama_8b(), 8_030_261_248),
    ] {
        let s = ModelShape::from_config(&config, None).unwrap();
        assert!(!s.params_exact);
        let off = s.params.abs_diff(exact) as f64 / exact as f64;
        assert!(off < 0.01, "{} vs {exact}", s.params);
    }
}

#[test]
fn the_kv_cache_of_a_token_splits_over_heads_and_stages() {
    let s = ModelShape::from_config(&llama_70b(), Some(LLAMA_70B_BYTES)).unwrap();
    // 2 (K and V) x 80 layers x 8 heads x 128 x 2 bytes = 320 KiB.
    assert_eq!(s.kv_bytes_per_token(Dtype::Bf16, 1, 1), 327_680);
    assert_eq!(s.kv_bytes_per_token(Dtype::Bf16, 2, 1), 163_840);
    assert_eq!(s.kv_bytes_per_token(Dtype::Bf16, 1, 2), 163_840);
    // Eight KV heads do not split over sixteen ranks: each keeps one.
    assert_eq!(s.kv_bytes_per_token(Dtype::Bf16, 16, 1), 40_960);
}

#[test]
fn a_70b_bf16_model_fits_two_80gb_cards_and_not_one() {
    let s = ModelShape::from_config(&llama_70b(), Some(LLAMA_70B_BYTES)).unwrap();
    let h100 = class("h100-80g", 81_559, 8, 1);
    let room = Headroom::default();
    assert!(!check(&s, Dtype::Bf16, &h100, &room, 1, 1).fits);
    let split = smallest_split(&s, Dtype::Bf16, &h100, &room).unwrap();
    assert_eq!((split.tp, split.pp), (2, 1));
    assert_eq!(split.usable_mb, 73_403);
    // 65.7 GiB of weights a card, 1 GiB overhead, 1.25 GiB of KV cache.
    assert_eq!(split.needed_mb, 67_286 + 1_024 + 1_280);
    assert!(
        split.kv_tokens > 8192 && split.kv_tokens < 40_000,
        "{split:?}"
    );
    // In fp8 one card holds it.
    let fp8 = smallest_split(&s, Dtype::Fp8, &h100, &room).unwrap();
    assert_eq!((fp8.tp, fp8.pp), (1, 1));
}

#[test]
fn an_8b_bf16_model_fits_one_24gb_card() {
    let s = ModelShape::from_config(&llama_8b(), Some(LLAMA_8B_BYTES)).unwrap();
    let room = Headroom::default();
    for card in [
        class("rtx4090-24g", 24_564, 1, 1),
        class("l4-22g", 23_034, 4, 1),
    ] {
        let split = smallest_split(&s, Dtype::Bf16, &card, &room).unwrap();
        assert_eq!((split.tp, split.pp), (1, 1), "{}", card.class);
    }
    // A 16 GB card does not hold 15 GiB of weights and their headroom.
    assert_eq!(
        smallest_split(&s, Dtype::Bf16, &class("t4-15g", 15_360, 1, 1), &room),
        None
    );
}

#[test]
fn past_a_nodes_cards_the_split_adds_pipeline_stages() {
    let s = ModelShape::from_config(&llama_70b(), Some(LLAMA_70B_BYTES)).unwrap();
    let room = Headroom::default();
    // 131 GiB over 24 GB cards: eight of them, as four per node on two
    // nodes when a node has four.
    let eight = class("l4-22g", 23_034, 8, 1);
    let split = smallest_split(&s, Dtype::Bf16, &eight, &room).unwrap();
    assert_eq!((split.tp, split.pp), (8, 1));
    let four_by_two = class("l4-22g", 23_034, 4, 2);
    let split = smallest_split(&s, Dtype::Bf16, &four_by_two, &room).unwrap();
    assert_eq!((split.tp, split.pp), (4, 2));
    assert_eq!(
        smallest_split(&s, Dtype::Bf16, &class("l4-22g", 23_034, 4, 1), &room),
        None
    );
}

#[test]
fn tensor_parallelism_divides_the_attention_heads() {
    let mut config = llama_8b();
    config["num_attention_heads"] = json!(28);
    config["num_key_value_heads"] = json!(4);
    config["head_dim"] = json!(128);
    let s = ModelShape::from_config(&config, Some(LLAMA_8B_BYTES)).unwrap();
    // 28 heads: TP 1, 2 or 4, never 8.
    let small = class("small-8g", 8_192, 8, 1);
    let split = smallest_split(&s, Dtype::Bf16, &small, &Headroom::default()).unwrap();
    assert_eq!(split.tp, 4);
    let tiny = class("tiny-4g", 4_096, 8, 1);
    assert_eq!(
        smallest_split(&s, Dtype::Bf16, &tiny, &Headroom::default()),
        None
    );
}

#[test]
fn dtypes_are_read_as_configs_and_people_write_them() {
    assert_eq!(Dtype::parse("bfloat16"), Some(Dtype::Bf16));
    assert_eq!(Dtype::parse("float8_e4m3fn"), Some(Dtype::Fp8));
    assert_eq!(Dtype::parse("FP16"), Some(Dtype::F16));
    assert_eq!(Dtype::parse("q4_k_m"), None);
    let mut awq = llama_8b();
    awq["quantization_config"] = json!({"quant_method": "awq", "bits": 4});
    assert_eq!(
        ModelShape::from_config(&awq, None).unwrap().dtype,
        Dtype::Int4
    );
    let e = ModelShape::from_config(&json!({"hidden_size": 8}), None).unwrap_err();
    assert!(e.0.contains("num_hidden_layers"), "{e}");
}
