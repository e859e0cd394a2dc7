"""Writes a tiny llama-architecture GGUF with random weights.

Usage: tiny-gguf.py GGUF_PY_DIR VOCAB.gguf OUT.gguf

The vocabulary (a real SentencePiece one) comes from llama.cpp's
vocabulary-only test files; the weights are random, so the answers are
gibberish, but every code path of the server (tokenizer, chat template,
slots, streaming, usage, metrics) is the real one. About 17 MB.
"""
import sys

sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402
import gguf  # noqa: E402

vocab_path, out_path = sys.argv[2], sys.argv[3]
reader = gguf.GGUFReader(vocab_path)


def field(name):
    f = reader.get_field(name)
    return None if f is None else f.contents()


tokens = field("tokenizer.ggml.tokens")
scores = field("tokenizer.ggml.scores")
types = field("tokenizer.ggml.token_type")
n_vocab = len(tokens)
n_embd, n_layer, n_head, n_ff, n_ctx = 64, 2, 4, 128, 2048

w = gguf.GGUFWriter(out_path, "llama")
w.add_name("llmgw-tiny")
w.add_context_length(n_ctx)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(n_embd // n_head)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
for key, add in [
    ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
    ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
    ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
]:
    v = field(key)
    if v is not None:
        add(int(v))
w.add_chat_template(
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

rng = np.random.default_rng(7)


def t(name, *shape):
    w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))


t("token_embd.weight", n_vocab, n_embd)
w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
t("output.weight", n_vocab, n_embd)
for i in range(n_layer):
    w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for x in ("attn_q", "attn_k", "attn_v", "attn_output"):
        t(f"blk.{i}.{x}.weight", n_embd, n_embd)
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
    t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
    t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out_path)
