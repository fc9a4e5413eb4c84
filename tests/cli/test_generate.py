"""`kiln generate` on the tiny checkpoints of tests/data/llm: the ids it prints are transformers'
greedy continuation (stored in goldens.safetensors, read here with a reader of its own), text goes
through tokenizer.json, and bad invocations end with one error line."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

KILN = os.environ.get("KILN", "kiln")
DATA = os.path.join(os.path.dirname(__file__), "..", "data", "llm")
ENV = dict(os.environ, KILN_DEVICE=os.environ.get("KILN_DEVICE", "cpu"))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    types = {"I64": np.int64, "F32": np.float32}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             types[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def kiln(*args):
    return subprocess.run([KILN, "generate", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2"])
def test_prompt_ids_print_the_greedy_continuation(name):
    g = read_safetensors(os.path.join(DATA, name, "goldens.safetensors"))
    ids = ",".join(str(t) for t in g["prompt_a"])
    r = kiln(os.path.join(DATA, name), "--prompt-ids", ids, "--max-tokens", "24", "--ignore-eos",
             "--dtype", "f32")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    assert [int(t) for t in lines[0].split(",")] == g["greedy_a"][:24].tolist()
    assert lines[-1].startswith("prefill: 9 tokens in ") and "decode: 23 tokens in" in lines[-1]


def test_text_prompt_and_sampling_with_a_seed():
    d = os.path.join(DATA, "gpt2")
    args = [d, "--prompt", "The quick brown fox", "--max-tokens", "10", "--temperature", "0.9",
            "--top-k", "40", "--seed", "5", "--ignore-eos"]
    a, b = kiln(*args), kiln(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout.split("\n")[0] == b.stdout.split("\n")[0]
    assert "prefill:" in a.stdout.strip().split("\n")[-1]
    # --temperature 1 samples (it is not the greedy default): seeds give different ids
    ids = [os.path.join(DATA, "llama"), "--prompt-ids", "5,6,7", "--max-tokens", "20",
           "--ignore-eos", "--temperature", "1"]
    one, two = kiln(*ids, "--seed", "1"), kiln(*ids, "--seed", "2")
    assert one.returncode == 0 and two.returncode == 0
    assert one.stdout.split("\n")[0] != two.stdout.split("\n")[0]


def test_bad_invocations_fail_with_one_line(tmp_path):
    no_tok = tmp_path / "no_tok"
    shutil.copytree(os.path.join(DATA, "mistral"), no_tok)
    trunc = tmp_path / "trunc"
    shutil.copytree(os.path.join(DATA, "llama"), trunc)
    with open(trunc / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    bad_json = tmp_path / "bad_json"
    shutil.copytree(os.path.join(DATA, "llama"), bad_json)
    (bad_json / "config.json").write_text("{not json")
    llama = os.path.join(DATA, "llama")
    cases = [
        ([str(tmp_path / "missing"), "--prompt-ids", "1,2"], "config.json"),
        ([str(no_tok), "--prompt", "hi"], "tokenizer.json"),
        ([str(trunc), "--prompt-ids", "1,2"], "model.safetensors"),
        ([str(bad_json), "--prompt-ids", "1,2"], "not a JSON object"),
        ([llama, "--prompt-ids", "1,x"], "'x' is not a token id"),
        ([llama, "--prompt-ids", "1,,2"], "not a token id"),
        ([llama, "--prompt-ids", "1,99999"], "token 99999"),
        ([llama, "--prompt-ids", "1", "--max-tokens", "0"], "max_new_tokens 0"),
        ([llama, "--prompt-ids", "1", "--max-tokens", "100000"], "max_length"),
        ([llama, "--prompt-ids", "1", "--temperature", "-1"], "temperature -1"),
        ([llama, "--prompt-ids", "1", "--top-p", "2"], "top_p 2"),
        ([llama, "--prompt-ids", "1", "--dtype", "i32"], "i32"),
        ([llama, "--prompt-ids", "1", "--device", "tpu:0"], "tpu"),
        ([llama, "--prompt-ids", "1", "--greedy", "--temperature", "0.5"], "excludes"),
        ([llama, "--prompt", "a", "--prompt-ids", "1"], "excludes"),
        ([llama], "--prompt"),
    ]
    for args, words in cases:
        r = kiln(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        err = r.stderr.strip().split("\n")
        assert len(err) == 1 and err[0].startswith("error:"), (args, r.stderr)
        assert words in err[0], (args, err[0])
