#!/usr/bin/env python3
"""Tiny tokenizer.json files of the styles real checkpoints use, trained with Hugging Face
`tokenizers` on a small built-in English corpus, and what `tokenizers` makes of a set of texts
with each, as test data for kiln::llm::Tokenizer (tests/llm/test_tokenizer.cpp).

    python make_tokenizers.py OUT_DIR        # e.g. tests/data/llm

Needs tokenizers (0.20 or newer: BPE ignore_merges, merges saved as pairs). Writes:

    OUT_DIR/tokenizers/<name>.json   the tokenizers of main():
        gpt2               ByteLevel pre-tokenizer (GPT-2 regex), BPE, ByteLevel decoder and
                           post-processor; merges written as "a b" strings; one non-special
                           added token
        gpt2_prefix_space  the same with add_prefix_space and no post-processor
        llama3             Split(Llama 3 regex) + ByteLevel, BPE with ignore_merges, a
                           TemplateProcessing that adds <|begin_of_text|>
        qwen2              NFC, Split(Qwen2 regex) + ByteLevel, ByteLevel post-processor
        sentencepiece      Llama 2: Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, BPE with
                           byte_fallback and <unk>, decoder Replace/ByteFallback/Fuse/Strip, <s>
        metaspace          the same model with a Metaspace pre-tokenizer (prepend_scheme
                           "first", split) and decoder ByteFallback, Fuse, Metaspace
        metaspace_always   prepend_scheme "always", no split; decoder Metaspace alone
        added_tokens       qwen2 with added tokens of every flag (lstrip, rstrip, single_word,
                           normalized, special or not)
        sentencepiece_added  sentencepiece with normalized and non-normalized added tokens
        gpt2_splits, llama3_splits, qwen2_splits
                           probes of the pre-tokenizers of gpt2, llama3 and qwen2 for random
                           texts: their vocabulary is the byte-level alphabet and every piece,
                           so that the ids show the pieces
        nfc                a probe of NFC: the ids are the bytes of the normalized random texts
        bpe_unk            hand-made: no pre-tokenizer or decoder, ignore_merges, unk_token not
                           fused, a merge listed twice
        bpe_affixes        hand-made: continuing_subword_prefix "##", end_of_word_suffix
                           "</w>", fused unk
    OUT_DIR/gpt2/tokenizer.json      the gpt2 tokenizer (320 ids, as the gpt2 checkpoint's vocab)
    OUT_DIR/llama/tokenizer.json     the sentencepiece tokenizer (320 ids: 3 specials, 256 byte
                                     tokens <0x00>..<0xFF>, characters and merges)
    OUT_DIR/tokenizers/cases.json    {name: [{"text", "ids" (encode with special tokens),
                                     "ids_plain" (without), "decoded" (decode of "ids" skipping
                                     special tokens), "decoded_special" (keeping them)}, ...,
                                     then decode-only cases of random ids: {"ids", "decoded",
                                     "decoded_special"}]}
"""
import collections
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
MAX_IDS = 320  # vocab_size of the tiny gpt2 and llama checkpoints

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog did not move; it was asleep in the sun.
I'll tell you a story about a small town by the river, where the people were kind and the
bread was warm every morning. They've lived there for 120 years, and they're proud of it.
We'd like to think that it's the water, but maybe it's just the bread.
Once upon a time there was a little girl who lived near the forest. She walked to school
every day, and on the way she counted the trees: one, two, three, 4, 5, 6, 7, 8, 9, 10.
"Don't go into the woods after dark," her mother said. "You'll get lost, and we'll worry."
The teacher wrote 2 + 2 = 4 on the board, then 12 * 12 = 144, and asked who could do 1000 / 8.
Weather report: sunny in the morning, with clouds in the afternoon and light rain at night.
Temperatures will reach 21 degrees; winds from the west at 15 km/h.
Programming is fun: for i in range(10): print(i * i)  # squares
def add(a, b):
    return a + b
Questions? Answers! Some people say hello, others say hi, and a few just wave their hands.
The meeting starts at 9:30 and ends at 11:45. Please bring your notes, pens and laptops.
She said: I'm going home now. He replied: I'd rather stay here for a while longer.
In the end, everything was fine, and the story ended where it began: by the river.
"""

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "I'll go. DON'T stop: we've, they're, I'd, you'RE, it's, SHE'LL, 'm",
    "it'ſ a long s, 'S and 'T, it'ſx 'ſſ 'SS",
    "12345 and 3.14159, 1,000,000 or 123456789",
    "  leading and trailing spaces  ",
    "multiple     spaces\tand\ttabs\t\t",
    "line one\nline two\n\nline four\r\nend\n",
    "\n\n",
    " ",
    "   ",
    "\t\t indented\n   code\n  \n  x",
    "café naïve résumé Ångström façade",
    "e\u0301te\u0301 A\u030a \u212b \u1100\u1161\u11a8 o\u0323\u0302",
    "日本語のテキスト 中文 한국어",
    "emoji 😀👍🏽 ok 🇫🇷",
    "Привет мир, Γειά σου",
    "مَرْحَبًا",
    "Ⅻ ½ ² ٣",
    "\u00a0nbsp\u3000ideographic\u2028line\u2009thin",
    "hello\u200dworld",
    "x = [1, 2, 3]; y = {'k': 'v'}  # code",
    "?!?! ... --- *** ''''",
    "The quick brown fox jumps over the lazy dog.",
    "the bread was warm",
    "zzz qqq xylophone",
]


def special_texts(special):
    return [f"{special}", f"{special} inside {special}text", f"a{special}b",
            f"Hello {special}\n{special}  world", f" {special} "]


def byte_level_trainer(vocab_size, specials):
    return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def train(tokenizer, trainer, corpus=CORPUS):
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return json.loads(tokenizer.to_str())


def gpt2():
    specials = ["<|padding|>", "<|startoftext|>", "<|endoftext|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    j = train(tok, byte_level_trainer(MAX_IDS - 1, specials))
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens([AddedToken(" kiln", normalized=False)])
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]  # the older format
    return j


def gpt2_prefix_space(base):
    j = json.loads(json.dumps(base))
    j["pre_tokenizer"]["add_prefix_space"] = True
    j["post_processor"] = None
    return j


def llama3():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, byte_level_trainer(400, specials))
    tok = Tokenizer.from_str(json.dumps(j))
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{specials[0]} $A", pair=f"{specials[0]} $A $B:1",
                                      special_tokens=[(specials[0], bos)])])
    return json.loads(tok.to_str())


def qwen2():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return train(tok, byte_level_trainer(420, specials))


def added_tokens(base):
    tok = Tokenizer.from_str(json.dumps(base))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False),
                            AddedToken("<sep>", rstrip=True)])
    tok.add_tokens([AddedToken("wordy", single_word=True),
                    AddedToken("e\u0301clair", normalized=True),  # NFC: "éclair"
                    AddedToken("hello world", normalized=False),
                    AddedToken("hello", normalized=True, lstrip=True, rstrip=True)])
    return json.loads(tok.to_str())


def sentencepiece():
    """Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then characters and merges."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    free = MAX_IDS - len(specials) - len(bytes_)
    # The most frequent characters (the rest, left to the byte tokens, out of the corpus: the
    # trainer's limit_alphabet would break ties at random)
    counts = collections.Counter(CORPUS.replace(" ", "▁"))
    alphabet = sorted(counts, key=lambda c: (-counts[c], c))[:free - 24]
    corpus = "".join(c for c in CORPUS if c in alphabet or c == " ")
    trainer = trainers.BpeTrainer(vocab_size=len(specials) + free, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    j = train(tok, trainer, corpus)
    learned = sorted((i, t) for t, i in j["model"]["vocab"].items() if t not in specials)
    vocab = {t: i for i, t in enumerate(specials + bytes_ + [t for _, t in learned])}
    assert len(vocab) <= MAX_IDS, len(vocab)
    j["model"]["vocab"] = vocab
    j["model"]["ignore_merges"] = False
    for t in j["added_tokens"]:
        t["id"] = vocab[t["content"]]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])])
    return json.loads(tok.to_str())


def metaspace(base, prepend_scheme, split, byte_fallback):
    j = json.loads(json.dumps(base))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁",
                          "prepend_scheme": prepend_scheme, "split": split}
    j["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme,
                    "split": split}
    if byte_fallback:
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Fuse"}, j["decoder"]]}
    return j


def sentencepiece_added(base):
    tok = Tokenizer.from_str(json.dumps(base))
    tok.add_special_tokens([AddedToken("<tool>", normalized=False),
                            AddedToken("<sys>", normalized=True, special=True)])
    tok.add_tokens([AddedToken("bread", normalized=True), AddedToken("the river", normalized=True),
                    AddedToken("fox ", normalized=False)])
    return json.loads(tok.to_str())


def hand_made(model, special):
    """A tokenizer with only a BPE model (no normalizer, pre-tokenizer or decoder) and one special
    token, written as given (`tokenizers` would drop a repeated merge when saving)."""
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": model["vocab"][special], "content": special,
                              "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": dict({"type": "BPE", "dropout": None, "fuse_unk": False,
                           "byte_fallback": False, "ignore_merges": False, "unk_token": None,
                           "continuing_subword_prefix": None, "end_of_word_suffix": None},
                          **model)}


def bpe_unk():
    vocab = {t: i for i, t in enumerate(
        ["[UNK]", "[CLS]", "a", "b", "c", "d", " ", "ab", "bc", "abc", "cd", "bcd", "abcd"])}
    # "abcd" is in the vocabulary but no merge makes it: only ignore_merges finds it
    merges = [["b", "c"], ["a", "b"], ["c", "d"], ["a", "bc"], ["b", "cd"], ["a", "b"]]
    return hand_made({"vocab": vocab, "merges": merges, "unk_token": "[UNK]",
                      "ignore_merges": True}, "[CLS]")


def bpe_affixes():
    tokens = ["<unk>", "<eos>", "a", "b", "c", "##a", "##b", "##c", "a</w>", "b</w>", "c</w>",
              "##a</w>", "##b</w>", "##c</w>", "ab", "##bc", "##bc</w>", "abc</w>", "ba", "##ab"]
    merges = [["a", "##b"], ["##b", "##c</w>"], ["##b", "##c"], ["ab", "##c</w>"], ["b", "##a"],
              ["##a", "##b"]]
    return hand_made({"vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges,
                      "unk_token": "<unk>", "fuse_unk": True,
                      "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"},
                     "<eos>")


# Pieces of random texts: letters of several scripts, digits and other numbers, spaces of every
# kind, line breaks, contractions in both cases (and the long s, which folds to s), punctuation,
# marks, emoji; and, for NFC, bases with marks in every order, Hangul jamo and singletons.
SPLIT_PIECES = ["a", "Zq", "é", "ſ", "ß", "日本", "Ж", "ا", "1", "42", "٣", "½", "Ⅻ", " ", "  ",
                "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\u200d", "'", "'s",
                "'S", "'ll", "'LL", "'Re", "'ve", "'T", "'d", "'M", "'x", "'ſ", "!", ".", "--",
                "😀", "\u0301", "_", "$"]
NFC_PIECES = ["a", "e", "o", "A", "u", "ω", "\u0301", "\u0300", "\u0323", "\u0302", "\u0308",
              "\u0345", "\u0313", "\u031b", "\u1100", "\u1161", "\u11a8", "\uac00", "\u212b",
              "\u0958", "\u0928", "\u093c", "\u0b47", "\u0b3e", "\u0344", " ", "x"]


def random_texts(pieces, count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def split_probe(pre_tokenizer, texts, normalizer=None):
    """A tokenizer whose ids show how `pre_tokenizer` splits `texts`: its vocabulary is the 256
    byte-level characters and every piece of the texts, with ignore_merges and no merges, so a
    piece is one id and anything else its bytes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.normalizer = normalizer
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab = {c: i for i, c in enumerate(sorted(vocab))}
    for text in texts:
        normalized = normalizer.normalize_str(text) if normalizer else text
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(normalized):
            vocab.setdefault(piece, len(vocab))
    tok.model = models.BPE(vocab, [], ignore_merges=True)
    tok.decoder = decoders.ByteLevel()
    return json.loads(tok.to_str())


def cases(j, texts, seed):
    """The texts' cases, then those of random id lists (decode only; half of the ids <0xNN>
    tokens where there are such)."""
    tok = Tokenizer.from_str(json.dumps(j))
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        out.append({"text": text, "ids": ids,
                    "ids_plain": tok.encode(text, add_special_tokens=False).ids,
                    "decoded": tok.decode(ids, skip_special_tokens=True),
                    "decoded_special": tok.decode(ids, skip_special_tokens=False)})
    rng = random.Random(seed)
    all_ids = sorted(set(j["model"]["vocab"].values()) | {t["id"] for t in j["added_tokens"]})
    byte_ids = [i for t, i in j["model"]["vocab"].items() if len(t) == 6 and t.startswith("<0x")]
    for _ in range(20):
        ids = [rng.choice(byte_ids if byte_ids and rng.random() < 0.5 else all_ids)
               for _ in range(rng.randint(1, 10))]
        out.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True),
                    "decoded_special": tok.decode(ids, skip_special_tokens=False)})
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    g, sp = gpt2(), sentencepiece()
    q = qwen2()
    split_texts = random_texts(SPLIT_PIECES, 200, seed=1)
    nfc_texts = random_texts(NFC_PIECES, 200, seed=2)
    tokenizers = {  # name: (tokenizer.json, extra texts)
        "gpt2": (g, special_texts("<|endoftext|>") + ["a kiln, kilns", " kiln"]),
        "gpt2_prefix_space": (gpt2_prefix_space(g), special_texts("<|endoftext|>")),
        "llama3": (llama3(), special_texts("<|eot_id|>")),
        "qwen2": (q, special_texts("<|im_start|>")),
        "sentencepiece": (sp, special_texts("</s>") + ["<s>x", "a\u0000b\u0085"]),
        "metaspace": (metaspace(sp, "first", True, True), special_texts("</s>")),
        "metaspace_always": (metaspace(sp, "always", False, False), special_texts("</s>")),
        "added_tokens": (added_tokens(q), [
            "a <mask> b", "a   <mask>", "<mask>", "x<sep>  y", "<sep>\n\nz", "wordy", "a wordy b",
            "awordy", "wordy!", "wordy_x", "un éclair", "une\u0301clair", "hello world!",
            " hello  there", "sayhello", "hello\u0301", "<mask><sep>hello<mask>"]),
        "sentencepiece_added": (sentencepiece_added(sp), [
            "fresh bread", "by the river bank", "the fox jumps", "fox", "a<tool>b", "<tool> x",
            "breadbread", "the  river", "<sys>", "a <sys> b"]),
        "gpt2_splits": (split_probe(pre_tokenizers.ByteLevel(add_prefix_space=False), split_texts),
                        []),
        "llama3_splits": (split_probe(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), split_texts), []),
        "qwen2_splits": (split_probe(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), split_texts), []),
        "nfc": (split_probe(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                            nfc_texts, normalizers.NFC()), []),
        "bpe_unk": (bpe_unk(), ["abcd", "abc", "abcda", "xabcd", "aaxy", "ab cd", "[CLS]abcd",
                                "bcbc", "e", ""]),
        "bpe_affixes": (bpe_affixes(), ["abc", "a", "ab", "abab", "bab", "xyz", "axby", "cab",
                                         "<eos>ba", "c"]),
    }
    os.makedirs(os.path.join(out, "tokenizers"), exist_ok=True)
    all_cases = {}
    for name, (j, extra) in tokenizers.items():
        ids = list(j["model"]["vocab"].values()) + [t["id"] for t in j["added_tokens"]]
        with open(os.path.join(out, "tokenizers", name + ".json"), "w") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
        texts = {"gpt2_splits": split_texts, "llama3_splits": split_texts,
                 "qwen2_splits": split_texts, "nfc": nfc_texts}.get(name, TEXTS)
        all_cases[name] = cases(j, (texts if not name.startswith("bpe_") else []) + extra,
                                seed=len(all_cases))
        print(f"{name}: {len(j['model']['vocab'])} tokens, {len(j['model']['merges'])} merges, "
              f"{len(j['added_tokens'])} added, ids < {max(ids) + 1}")
    for name, folder in (("gpt2", "gpt2"), ("sentencepiece", "llama")):
        j = tokenizers[name][0]
        ids = list(j["model"]["vocab"].values()) + [t["id"] for t in j["added_tokens"]]
        assert max(ids) < MAX_IDS, (name, max(ids))
        with open(os.path.join(out, folder, "tokenizer.json"), "w") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "tokenizers", "cases.json"), "w") as f:  # a case a line
        f.write("{\n" + ",\n".join(
            f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cs)
            + "\n]" for name, cs in all_cases.items()) + "\n}\n")


if __name__ == "__main__":
    main()
