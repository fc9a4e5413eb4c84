"""kiln.llm on the tiny checkpoints of tests/data/llm (made with transformers by
tests/data/llm/make_models.py, their outputs stored beside them), kiln's tokenizer against the
`tokenizers` package on fresh random text, and kiln's safetensors reader against the
`safetensors` package's writer."""
import os

import numpy as np
import pytest

import kiln
from conftest import cuda_available


DATA = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "llm")
MODELS = ["llama", "llama3_scaled", "llama_linear", "mistral", "mistral_window", "qwen2_window",
          "qwen2", "gpt2"]
DEVICES = ["cpu"] + (["cuda"] if cuda_available() else [])


def goldens(name):
    return kiln.safetensors.load(os.path.join(DATA, name, "goldens.safetensors"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_greedy_tokens_and_logits_match_transformers(name, device):
    g = goldens(name)
    lm = kiln.llm.load(os.path.join(DATA, name), device=device, dtype=kiln.f32, max_length=128)
    prompt = [int(t) for t in g["prompt_a"]]
    logits = lm.model.logits(prompt)
    ref = g["logits_a"]
    assert np.linalg.norm(logits - ref) <= 2e-5 * np.linalg.norm(ref)
    out = lm.generate(prompt, max_new_tokens=len(g["greedy_a"]), stop_tokens=[-1])
    assert out == [int(t) for t in g["greedy_a"]]
    assert lm.last_stats["new_tokens"] == len(g["greedy_a"])


def test_a_batch_of_prompts_of_different_lengths():
    g = goldens("qwen2")
    lm = kiln.llm.load(os.path.join(DATA, "qwen2"), max_batch=2, max_length=128)
    a, b = ([int(t) for t in g[k]] for k in ("prompt_a", "prompt_b"))
    streamed = {0: [], 1: []}
    out = lm.generate([a, b], max_new_tokens=16, stop_tokens=[-1],
                      stream=lambda seq, tok: streamed[seq].append(tok))
    assert out == g["batch"].tolist()
    assert [streamed[0], streamed[1]] == out


def test_text_in_and_out_with_streaming():
    tokenizers = pytest.importorskip("tokenizers")
    d = os.path.join(DATA, "gpt2")
    lm = kiln.llm.load(d)
    hf = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    prompt = "The quick brown fox"
    pieces = []
    text = lm.generate(prompt, max_new_tokens=12, stop_tokens=[-1],
                       stream=lambda seq, piece: pieces.append(piece))
    ids = lm.generate(hf.encode(prompt).ids, max_new_tokens=12, stop_tokens=[-1])
    assert text == hf.decode(ids)
    assert "".join(pieces) == text
    # kiln's own tokenizer.json reader gives the same ids
    mine = kiln.llm.Tokenizer.load(os.path.join(d, "tokenizer.json"))
    assert mine.encode(prompt) == hf.encode(prompt).ids
    assert mine.decode(ids) == text


def test_seeded_sampling_is_reproducible_and_stops_on_request():
    lm = kiln.llm.load(os.path.join(DATA, "llama"), max_length=128)
    kw = dict(max_new_tokens=20, temperature=0.8, top_k=50, top_p=0.9, seed=11, stop_tokens=[-1])
    a = lm.generate([5, 6, 7], **kw)
    assert a == lm.generate([5, 6, 7], **kw)
    assert a != lm.generate([5, 6, 7], **dict(kw, seed=12))
    # temperature 1.0 given is sampling too, not greedy
    t1 = dict(max_new_tokens=20, temperature=1.0, stop_tokens=[-1])
    assert lm.generate([5, 6, 7], seed=1, **t1) != lm.generate([5, 6, 7], seed=2, **t1)
    got = []
    lm.generate([5, 6, 7], max_new_tokens=20, stream=lambda s, t: got.append(t) or len(got) < 3)
    assert len(got) == 3


def random_text(rng, n):
    alphabets = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
                 " ", "  ", "\n", "\t", "'s", "'LL", ".,;!?-()\"", "éèàüößçñ", "日本語中文",
                 "😀🚀", "<|endoftext|>"]
    return "".join(rng.choice(list(rng.choice(alphabets))) if rng.random() < 0.7
                   else str(rng.choice(alphabets)) for _ in range(n))


@pytest.mark.parametrize("path", sorted(
    os.path.join(DATA, "tokenizers", f) for f in os.listdir(os.path.join(DATA, "tokenizers"))
    if f.endswith(".json") and f != "cases.json") if os.path.isdir(os.path.join(DATA, "tokenizers"))
    else [])
def test_tokenizer_matches_tokenizers_on_random_text(path, rng):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(path)
    mine = kiln.llm.Tokenizer.load(path)
    for _ in range(200):
        text = random_text(rng, int(rng.integers(0, 40)))
        for special in (True, False):
            want = hf.encode(text, add_special_tokens=special).ids
            assert mine.encode(text, special) == want, (text, special)
        assert mine.decode(want) == hf.decode(want), text


def test_safetensors_files_written_by_the_safetensors_package(tmp_path, rng):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {"a": rng.standard_normal((3, 4)).astype(np.float32),
              "b.weight": rng.standard_normal(7).astype(np.float16),
              "c": rng.integers(-9, 9, (2, 2, 2)).astype(np.int64),
              "d": rng.standard_normal(()).astype(np.float64),
              "e": rng.random(5) < 0.5, "f": rng.integers(0, 255, 6).astype(np.uint8),
              "empty": np.zeros((0, 3), np.float32)}
    path = str(tmp_path / "x.safetensors")
    safetensors_numpy.save_file(arrays, path, metadata={"format": "np"})
    got = kiln.safetensors.load(path)
    assert sorted(got) == sorted(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        np.testing.assert_array_equal(got[k], v)
    assert kiln.safetensors.metadata(path) == {"format": "np"}
    assert kiln.safetensors.checkpoint_names(os.path.join(DATA, "llama_linear"))[0] == \
        "lm_head.weight"


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(kiln.IoError):
        kiln.llm.load(str(tmp_path))
    lm = kiln.llm.load(os.path.join(DATA, "gpt2"), max_length=64)
    with pytest.raises(kiln.ValueError, match="token 320"):
        lm.generate([1, 320])
    with pytest.raises(kiln.ValueError, match="temperature"):
        lm.generate([1, 2], max_new_tokens=4, greedy=False, temperature=0.0)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(kiln.FormatError):
        kiln.safetensors.load(str(bad))
