#!/usr/bin/env python3
"""fuzz/jinja-seeds.py OUT_DIR [JSON...]: seeds for fuzz-jinja: the built-in
templates (from src/tokenizer/chat-template.c), every "chat_template" /
"tokenizer.chat_template" string in the JSON files given (tokenizer_config.json,
GGUF metadata dumps), a few small templates, and messages JSON for the odd
modes. Each seed is the mode byte followed by the text."""
import json, os, re, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
n = 0
def put(mode, text):
    global n
    with open(os.path.join(out, "seed-%03d" % n), "wb") as f:
        f.write(bytes([mode]) + text.encode())
    n += 1

src = open(os.path.join(os.path.dirname(__file__), "..", "src/tokenizer/chat-template.c")).read()
# the built-ins are C string literals, adjacent pieces concatenated
for m in re.finditer(r'\{\s*"(\w+)",\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\}', src):
    body = "".join(json.loads('"' + p + '"') for p in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2)))
    if "{%" in body or "{{" in body: put(0, body)

def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k.endswith("chat_template") and isinstance(x, str): put(0, x)
            elif k.endswith("chat_template") and isinstance(x, list):
                for t in x:
                    if isinstance(t, dict) and isinstance(t.get("template"), str): put(0, t["template"])
            else: walk(x)
    elif isinstance(v, list):
        for x in v: walk(x)
for p in sys.argv[2:]:
    try: walk(json.load(open(p)))
    except (OSError, ValueError): pass

for t in ["{% for i in range(3) %}{{ loop.index }}{% if loop.last %}!{% endif %}{% endfor %}",
          "{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = ns.x + 1 %}{% endfor %}{{ ns.x }}",
          "{% macro f(a, b=2) %}{{ a ~ b }}{{ caller() if caller is defined }}{% endmacro %}{% call f(1) %}c{% endcall %}",
          "{{ messages | map(attribute='role') | join(',') | upper }}{{ (messages | length) * 'ab' }}",
          "{% for k, v in {'a': [1, 2.5, none], 'b': 'x'} | dictsort %}{{ k }}={{ v | tojson }}{% endfor %}",
          "{{ 'a,b,c'.split(',')[1:] }}{{ '%s-%d' % ('x', 3) }}{{ raise_exception('no') if false }}",
          "{% filter upper %}{% with a = 1 %}{{ a }}{% endwith %}{% endfilter %}{%- if x is not defined -%} y {%+ endif %}",
          "{% for m in messages recursive %}{{ loop.depth }}{% if m is mapping and m.children %}{{ loop(m.children) }}{% endif %}{% endfor %}"]:
    put(0, t)
for mode in (1, 3, 5, 7, 9, 11, 13, 15):
    put(mode, '[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]')
put(1, '{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"t"}]}],"tools":[{"a":1}]}')
put(15, '[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\\"x\\": [1, 2]}"}}]},{"role":"tool","content":"\\u00e9"}]')
print("jinja seeds:", n)
