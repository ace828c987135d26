#!/usr/bin/env python3
"""fuzz-serve.py: mutation fuzzing of a running `toy serve` (src/serve/) over
loopback: valid completion, chat, streaming and embedding bodies with fields
replaced by values of the wrong type or range, fields removed or added, and
bytes damaged. Every answer must be a 2xx or a 4xx; a 5xx or a dropped
connection fails (exit 1). Run under ASan to catch memory errors:

    build-asan/toy serve -m model.gguf --port 8080 --ctx 256 &
    python3 fuzz/fuzz-serve.py 8080 SEED COUNT

tests/test-serve.c runs a bounded session of it.
"""
import json, random, sys, urllib.error, urllib.request
port = int(sys.argv[1]); random.seed(int(sys.argv[2]))
base = [
 {"prompt": "hello", "max_tokens": 3},
 {"prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 2, "stream": True},
 {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
 {"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": None}], "max_tokens": 2, "logprobs": True, "top_logprobs": 3},
 {"input": ["a", "b"], "encoding_format": "base64"},
]
paths = ["/v1/completions", "/v1/completions", "/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings"]
vals = [None, True, False, 0, -1, 1e308, -1e308, 2**63, -2**63, 1.5, "", "x"*1000, [], {}, [[]], [None], {"a": 1}, "\u0000", "\ud7ff", [1]*50, ["a"]*5]
def mutate(o, depth=0):
    if isinstance(o, dict):
        o = dict(o)
        r = random.random()
        if o and r < 0.4:
            k = random.choice(list(o)); o[k] = mutate(o[k], depth+1) if random.random() < 0.5 else random.choice(vals)
        elif r < 0.6:
            o[random.choice(["temperature","top_p","top_k","min_p","seed","stop","n","logit_bias","max_tokens","stream","model","input","prompt","messages","frequency_penalty","dimensions","normalize","stream_options","top_logprobs","logprobs"])] = random.choice(vals)
        elif o and r < 0.7:
            del o[random.choice(list(o))]
        return o
    if isinstance(o, list):
        o = list(o)
        if o and random.random() < 0.5: i = random.randrange(len(o)); o[i] = mutate(o[i], depth+1)
        else: o.append(random.choice(vals))
        return o
    return random.choice(vals)
codes = {}
for i in range(int(sys.argv[3])):
    k = random.randrange(len(base)); body = json.dumps(mutate(base[k]))
    if random.random() < 0.1:  # byte-level damage
        b = bytearray(body.encode())
        for _ in range(3):
            b[random.randrange(len(b))] = random.randrange(256)
        data = bytes(b)
    else: data = body.encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{paths[k]}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            c = r.status
    except urllib.error.HTTPError as e:
        c = e.code
        e.read()
    except Exception as e:  # a dropped connection, a timeout
        print("no answer:", e, data[:300])
        sys.exit(1)
    codes[c] = codes.get(c, 0) + 1
    if c >= 500:
        print("5xx:", c, data[:300])
        sys.exit(1)
print(json.dumps(codes))
