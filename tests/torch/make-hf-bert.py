#!/usr/bin/python3
"""make-hf-bert.py OUT: a small random sentence-transformers BERT folder for
tests/test-bert.c, laid out as Hugging Face writes one: config.json
(BertModel), model.safetensors (float32, with the pooler and the int64
embeddings.position_ids buffer, which converters leave out), 1_Pooling/
config.json (mean pooling) and a tokenizer.json with a WordPiece model
(BertNormalizer, BertPreTokenizer, [CLS] ... [SEP]).

It also writes expected.json: for each text of TEXTS, the ids Hugging
Face's BertTokenizer rules give (lowercase, accents stripped, punctuation
split off, greedy longest-match WordPiece with "##" continuations, [UNK]
for a word with no cover), and the hidden states of those ids computed in
float64 from the safetensors weights the Hugging Face way, with GELU's tanh
form (toy's and llama.cpp's); "cos_erf" is the cosine of the mean-pooled
vectors under the tanh and the exact (erf) form. Exits 77 without torch.
"""
import json
import math
import os
import struct
import sys
import unicodedata

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "sat", "on", "mat", "un", "##aff", "##able", "hello", "world", ",", ".", "!", "a", "##s",
         "dog", "caf", "##e", "play", "##ing", "is", "not", "##n", "'", "t", "it", "runs", "run", "##ner", "new",
         "york", "?", "-", "to", "be"]
VOCAB = SPECIALS + WORDS
TEXTS = ["Hello, world! The cat sat on the mat.", "Unaffable dogs; CAFÉ playing", "It isn't a runner-up?",
         "xyzzy to be"]
E, L, H, FF, C, TYPES = 64, 2, 4, 128, 40, 2


def save_safetensors(path, tensors):
    dt = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": dt[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def bert_ids(text):
    """Hugging Face's BertTokenizer (uncased) rules, written out: [CLS] pieces [SEP]"""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    words, cur = [], ""
    for ch in text:
        if ch.isspace():
            if cur:
                words.append(cur)
            cur = ""
        elif is_punct(ch):
            if cur:
                words.append(cur)
            words.append(ch)
            cur = ""
        else:
            cur += ch
    if cur:
        words.append(cur)
    ids = [VOCAB.index("[CLS]")]
    for w in words:
        pieces, start = [], 0
        while start < len(w):
            end, found = len(w), None
            while start < end:
                sub = w[start:end] if start == 0 else "##" + w[start:end]
                if sub in VOCAB:
                    found = sub
                    break
                end -= 1
            if found is None:
                pieces = ["[UNK]"]
                break
            pieces.append(found)
            start = end
        ids += [VOCAB.index(p) for p in pieces]
    return ids + [VOCAB.index("[SEP]")]


def forward(w, ids, approximate):
    T = len(ids)
    hd = E // H
    ln = lambda x, n: F.layer_norm(x, (E,), w[n + ".weight"], w[n + ".bias"], 1e-12)
    lin = lambda x, n: x @ w[n + ".weight"].T + w[n + ".bias"]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    for l in range(L):
        p = f"encoder.layer.{l}."
        q, k, v = (lin(x, p + "attention.self." + n).view(T, H, hd).transpose(0, 1) for n in ("query", "key", "value"))
        a = (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v).transpose(0, 1).reshape(T, E)
        x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        f = F.gelu(lin(x, p + "intermediate.dense"), approximate=approximate)
        x = ln(x + lin(f, p + "output.dense"), p + "output.LayerNorm")
    return x


def main():
    out = os.path.join(sys.argv[1], "bert")
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    torch.manual_seed(4321)
    V = len(VOCAB)
    rnd = lambda *s: torch.randn(*s) * 0.2
    w = {"embeddings.word_embeddings.weight": rnd(V, E), "embeddings.position_embeddings.weight": rnd(C, E),
         "embeddings.token_type_embeddings.weight": rnd(TYPES, E),
         "embeddings.LayerNorm.weight": 1 + 0.1 * torch.randn(E), "embeddings.LayerNorm.bias": rnd(E)}
    for l in range(L):
        p = f"encoder.layer.{l}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            w[p + n + ".weight"], w[p + n + ".bias"] = rnd(E, E), rnd(E)
        w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"] = rnd(FF, E), rnd(FF)
        w[p + "output.dense.weight"], w[p + "output.dense.bias"] = rnd(E, FF), rnd(E)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + n + ".weight"], w[p + n + ".bias"] = 1 + 0.1 * torch.randn(E), rnd(E)
    w["pooler.dense.weight"], w["pooler.dense.bias"] = rnd(E, E), rnd(E)
    st = dict(w)
    st["embeddings.position_ids"] = torch.arange(C, dtype=torch.int64).view(1, C)
    save_safetensors(os.path.join(out, "model.safetensors"), st)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": E, "num_hidden_layers": L,
           "num_attention_heads": H, "intermediate_size": FF, "hidden_act": "gelu", "max_position_embeddings": C,
           "type_vocab_size": TYPES, "vocab_size": V, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
           "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
           "pad_token_id": 0}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump({"word_embedding_dimension": E, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False},
              open(os.path.join(out, "1_Pooling", "config.json"), "w"), indent=2)
    special = lambda i, t: {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [special(i, t) for i, t in enumerate(SPECIALS)],
           "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                          "strip_accents": None, "lowercase": True},
           "pre_tokenizer": {"type": "BertPreTokenizer"},
           "post_processor": {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}},
                                         {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                              "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                                       {"Sequence": {"id": "B", "type_id": 1}},
                                       {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
                              "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                                 "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
           "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(VOCAB)}}}
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), indent=1, ensure_ascii=False)
    json.dump({"do_lower_case": True, "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]",
               "pad_token": "[PAD]", "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer",
               "model_max_length": C}, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    w64 = {n: t.double() for n, t in w.items()}
    cases = []
    with torch.no_grad():
        for text in TEXTS:
            ids = bert_ids(text)
            h = forward(w64, ids, "tanh")
            e = forward(w64, ids, "none")
            cos = F.cosine_similarity(h.mean(0), e.mean(0), dim=0).item()
            cases.append({"text": text, "ids": ids, "hidden": h.flatten().tolist(), "cos_erf": cos})
    json.dump({"dim": E, "cases": cases}, open(os.path.join(out, "expected.json"), "w"))


if __name__ == "__main__":
    main()
