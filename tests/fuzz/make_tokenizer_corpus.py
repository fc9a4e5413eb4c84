#!/usr/bin/env python3
"""Seeds of fuzz_tokenizer (tests/fuzz/fuzz_tokenizer.cpp): each test tokenizer of
tests/data/llm/tokenizers, a 0 byte, and a text with what the tokenizers split on (spaces,
contractions, digits, accents, CJK, emoji, an added token, a bad UTF-8 byte).

    python3 tests/fuzz/make_tokenizer_corpus.py      # writes tests/fuzz/tokenizer_corpus
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "data", "llm", "tokenizers")
OUT = os.path.join(HERE, "tokenizer_corpus")
TEXT = ("Hello world! I'll say DON'T 12345 times:\n\n\ttabs  and   spaces "
        "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 <|endoftext|> end ").encode() + b"\xff\xc3"

os.makedirs(OUT, exist_ok=True)
for name in sorted(os.listdir(SOURCE)):
    if not name.endswith(".json") or name == "cases.json":
        continue
    with open(os.path.join(SOURCE, name), "rb") as f:
        json = f.read()
    with open(os.path.join(OUT, name[:-5]), "wb") as f:
        f.write(json + b"\0" + TEXT)
