"""Causal language models from Hugging Face checkpoints: load a directory, generate text.

    import kiln
    lm = kiln.llm.load("path/to/checkpoint", device="cuda")
    print(lm.generate("Once upon a time", max_new_tokens=32))

A checkpoint directory holds config.json, model.safetensors (or shards with
model.safetensors.index.json) and, for text, tokenizer.json. Text goes through the `tokenizers`
package when it is installed, else through kiln's own tokenizer.json reader. See docs/llm.md.
"""
import os

from ._kiln.llm import Config, Model, Tokenizer, sample  # noqa: F401

__all__ = ["Config", "Model", "Tokenizer", "sample", "LanguageModel", "load"]


class _HfTokenizer:
    """The `tokenizers` package's Tokenizer with kiln's Tokenizer's methods."""

    def __init__(self, path):
        import tokenizers

        self._t = tokenizers.Tokenizer.from_file(path)

    def encode(self, text, add_special_tokens=True):
        return self._t.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=True):
        return self._t.decode(ids, skip_special_tokens=skip_special_tokens)


def _tokenizer(path):
    try:
        return _HfTokenizer(path)
    except ImportError:
        return Tokenizer.load(path)


class LanguageModel:
    """A kiln.llm.Model with its tokenizer (None when the directory has no tokenizer.json)."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    @property
    def config(self):
        return self.model.config

    def encode(self, text):
        if self.tokenizer is None:
            raise _value_error("this checkpoint has no tokenizer.json: pass token ids")
        return self.tokenizer.encode(text)

    def generate(self, prompt, max_new_tokens=128, *, greedy=None, temperature=None, top_k=None,
                 top_p=None, repetition_penalty=1.0, seed=0, stop_tokens=None, stream=None):
        """Continues `prompt`: a str, a list of str, a list of token ids or a list of such lists.
        Returns the new text (str prompts) or the new token ids, one per prompt when given a
        list of prompts. Sampling is greedy unless temperature, top_k or top_p is set (or
        greedy=False). `stream(seq, piece)` gets each prompt's new text as it comes (token ids
        for id prompts); returning False ends that sequence."""
        single = isinstance(prompt, str) or (
            isinstance(prompt, (list, tuple)) and (not prompt or isinstance(prompt[0], int)))
        prompts = [prompt] if single else list(prompt)
        text = bool(prompts) and isinstance(prompts[0], str)
        ids = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        if greedy is None:
            greedy = temperature is None and top_k is None and top_p is None
        temperature = 1.0 if temperature is None else temperature
        top_k = 0 if top_k is None else top_k
        top_p = 1.0 if top_p is None else top_p
        streamer = None if stream is None else _Streamer(stream, len(ids), text and self.tokenizer)
        out = self.model.generate(ids, max_new_tokens=max_new_tokens, greedy=greedy,
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  repetition_penalty=repetition_penalty, seed=seed,
                                  stop_tokens=list(stop_tokens or []),
                                  on_token=streamer and streamer.on_token)
        if streamer:
            streamer.flush()
        new = out["tokens"]
        if text:
            new = [self.tokenizer.decode(t) for t in new]
        self.last_stats = {k: v for k, v in out.items() if k != "tokens"}
        return new[0] if single else new


class _Streamer:
    """Passes each sequence's new text (or token ids, without a tokenizer) to stream(seq, x) as
    tokens come, holding back a character whose bytes are not all there yet."""

    def __init__(self, stream, n, tokenizer):
        self.stream, self.tokenizer = stream, tokenizer
        self.got = [[] for _ in range(n)]
        self.shown = [0] * n

    def on_token(self, seq, tok):
        if not self.tokenizer:
            return self.stream(seq, tok) is not False
        self.got[seq].append(tok)
        text = self.tokenizer.decode(self.got[seq])
        if text.endswith("\ufffd"):
            return True
        return self._show(seq, text)

    def _show(self, seq, text):
        piece, self.shown[seq] = text[self.shown[seq]:], len(text)
        return not piece or self.stream(seq, piece) is not False

    def flush(self):
        if self.tokenizer:
            for seq, ids in enumerate(self.got):
                text = self.tokenizer.decode(ids)
                if len(text) > self.shown[seq]:
                    self._show(seq, text)


def _value_error(message):
    from . import ValueError as KilnValueError

    return KilnValueError("[llm] " + message)


def load(path, device=None, dtype=None, max_batch=1, max_length=0):
    """Loads a checkpoint directory (and its tokenizer.json when it has one) as a
    LanguageModel. device: "cpu", "cuda", ... (default: kiln's default device); dtype: of the
    weights, cache and products (default: the checkpoint's); max_batch: prompts decoded
    together; max_length: positions the cache holds (0: the model's, at most 4096)."""
    model = Model.load(path, device=device, dtype=dtype, max_batch=max_batch,
                       max_length=max_length)
    tok = os.path.join(path, "tokenizer.json")
    return LanguageModel(model, _tokenizer(tok) if os.path.isfile(tok) else None)
