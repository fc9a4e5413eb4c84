#!/usr/bin/env python3
"""Tiny random-weight checkpoints of every model family kiln builds, with their outputs from
Hugging Face transformers, as test data for kiln::llm (tests/llm/test_models.cpp).

    python make_models.py OUT_DIR        # e.g. tests/data/llm

Needs torch, transformers, safetensors and tokenizers. For every model below it writes
OUT_DIR/<name>/ with what save_pretrained writes (config.json, model.safetensors or shards with
model.safetensors.index.json, generation_config.json), a tokenizer.json for some, and
goldens.safetensors:

    prompt_a (La,) i64, prompt_b (Lb,) i64     two prompts of random token ids
    logits_a (La, V) f32                       the model's logits over prompt_a, in float32
    greedy_a (64,) i64                         generate(prompt_a, greedy, 64 new tokens)
    batch (2, 16) i64                          generate([prompt_a, prompt_b] left-padded,
                                               greedy, 16 new tokens)

Outputs are computed in float32 (a bf16 checkpoint is loaded as float32: the same values), so
kiln's float32 runs match them to rounding. Every greedy step's winning logit leads the runner-up
by at least MARGIN, so that rounding cannot change a token; a seed that breaks this is skipped.

Greedy tokens come from the model's forward over the whole sequence at every step (no cache;
left-padded rows with an attention mask and positions counted from each row's first token, as
generate does). generate() with its KV cache is run too and should agree; where it does not, the
script says so and keeps the forward's tokens: with transformers 5.25, Qwen2 with sliding-window
layers after full ones (qwen2_window) departs from its own forward after a few cached tokens.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

MARGIN = 2e-3
NEW_TOKENS = 64
V = 320

COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, initializer_range=0.3,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
MODELS = {
    # name: (config class, config kwargs, save dtype, shard size)
    "llama": ("LlamaConfig", dict(COMMON, num_key_value_heads=2, rms_norm_eps=1e-5), "float32",
              None),
    "llama3_scaled": ("LlamaConfig", dict(COMMON, num_key_value_heads=1, head_dim=32,
                                          tie_word_embeddings=True, rope_theta=500000.0,
                                          rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                            low_freq_factor=1.0,
                                                            high_freq_factor=4.0,
                                                            original_max_position_embeddings=32)),
                      "bfloat16", None),
    "llama_linear": ("LlamaConfig", dict(COMMON, num_key_value_heads=4,
                                         rope_scaling=dict(rope_type="linear", factor=4.0)),
                     "float16", "100KB"),
    "mistral": ("MistralConfig", dict(COMMON, num_key_value_heads=2, sliding_window=None),
                "float32", None),
    "mistral_window": ("MistralConfig", dict(COMMON, num_key_value_heads=2, sliding_window=6),
                       "float32", None),
    "qwen2_window": ("Qwen2Config", dict(COMMON, num_key_value_heads=2, use_sliding_window=True,
                                         sliding_window=5, max_window_layers=1), "float32", None),
    "qwen2": ("Qwen2Config", dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True,
                                  rope_theta=1000000.0, use_sliding_window=False), "float32",
              None),
    "gpt2": ("GPT2Config", dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                initializer_range=0.3, bos_token_id=1, eos_token_id=2),
             "float32", None),
}


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def greedy(model, prompts, new_tokens):
    """Greedy continuation of left-padded prompts by full forwards, and the smallest lead of a
    winner over the runner-up."""
    ids, mask = left_padded(prompts)
    width, lead = ids.shape[1], float("inf")
    for _ in range(new_tokens):
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                       use_cache=False).logits[:, -1]
        top = logits.topk(2).values
        lead = min(lead, float((top[:, 0] - top[:, 1]).min()))
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return ids[:, width:], lead


def cached_generate(model, prompts, new_tokens):
    """transformers' generate (greedy, with its KV cache) on the same left-padded prompts."""
    ids, mask = left_padded(prompts)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return out[:, ids.shape[1]:]


def make(name, out_dir):
    cls, kwargs, dtype, shard = MODELS[name]
    for seed in range(100):
        torch.manual_seed(seed)
        config = getattr(transformers, cls)(**kwargs)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        # bias and norm weights are 0 and 1 at init: make them random so a misplaced one shows
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("bias") or "norm" in n or "ln_" in n:
                    p.add_(0.2 * torch.randn_like(p))
            # the values a bf16/f16 file holds (parameters only: RoPE's inv_freq buffer stays
            # float32, as from_pretrained computes it)
            for p in model.parameters():
                p.copy_(p.to(getattr(torch, dtype)).float())
        g = torch.Generator().manual_seed(seed)
        prompt_a = torch.randint(3, V, (9,), generator=g).tolist()
        prompt_b = torch.randint(3, V, (5,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt_a])).logits[0].float()
            greedy_a, lead_a = greedy(model, [prompt_a], NEW_TOKENS)
            batch, lead_b = greedy(model, [prompt_a, prompt_b], 16)
        if min(lead_a, lead_b) >= MARGIN:
            break
        print(f"{name}: seed {seed} has a greedy lead of {min(lead_a, lead_b):.2e}, next seed")
    with torch.no_grad():
        for got, prompts in ((greedy_a, [prompt_a]), (batch, [prompt_a, prompt_b])):
            cached = cached_generate(model, prompts, got.shape[1])
            if not torch.equal(cached, got):
                first = int((cached != got).nonzero()[0, 1])
                print(f"{name}: generate with its cache departs from the forward at new token "
                      f"{first} of {len(prompts)} prompt(s); the forward's tokens are kept")
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):  # the weights of an earlier run (tokenizer.json stays)
        if f.startswith("model") and "safetensors" in f:
            os.remove(os.path.join(d, f))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(d, max_shard_size=shard or "1GB")
    save_file({"prompt_a": torch.tensor(prompt_a), "prompt_b": torch.tensor(prompt_b),
               "logits_a": logits.contiguous(), "greedy_a": greedy_a[0].contiguous(),
               "batch": batch.contiguous()}, os.path.join(d, "goldens.safetensors"))
    print(f"{name}: seed {seed}, {sum(p.numel() for p in model.parameters())} parameters, "
          f"{dtype}, greedy lead >= {min(lead_a, lead_b):.2e}")


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name in MODELS:
        make(name, out)
