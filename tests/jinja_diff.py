#!/usr/bin/python3
"""Differential harness: toy's Jinja chat-template engine vs real Jinja2 (configured like HF transformers).

Run with the Python that has jinja2 (Debian's python3-jinja2 is for /usr/bin/python3), after building toy:
  make BUILD=build-jinja build-jinja/toy && /usr/bin/python3 tests/jinja_diff.py --toy build-jinja/toy [--family FILE]
It reads the templates in ../shared/testdata (the Llama-3 tokenizer_config.json, GGUF-carried ones), the
model-family templates of --family FILE (kept out of the tree), toy's built-ins, and small feature probes.
--family FILE is Python that fills the dict T, e.g. T['gpt_oss'] = open('/tmp/gpt-oss.jinja').read(); the
names the cases know (qwen3, qwen25, llama31, gpt_oss, ...) get extra message sets and variables.
strftime_now is pinned on both sides with SOURCE_DATE_EPOCH (set to 2025-08-05 unless given).

usage: /usr/bin/python3 diff.py [-v] [-k SUBSTR] [--toy PATH] [--list]
Prints each mismatch (name, template, jinja2 repr, toy repr) and a final summary line
"N cases, M mismatches".  Both sides raising an error counts as agreement.
"""
import json, os, sys, struct, subprocess, tempfile, datetime, argparse, concurrent.futures as cf
import jinja2, jinja2.sandbox, jinja2.ext
from jinja2.ext import Extension

# ---------------------------------------------------------------- GGUF metadata (for the templates GGUFs carry)
def read_kv(path):
    f = open(path, 'rb'); d = f.read(); f.close()
    o = 0
    def u(fmt):
        nonlocal o
        v = struct.unpack_from('<' + fmt, d, o); o += struct.calcsize('<' + fmt); return v[0]
    def s():
        nonlocal o
        n = u('Q'); v = d[o:o+n]; o += n; return v.decode('utf-8', 'replace')
    if d[:4] != b'GGUF': raise ValueError('not gguf')
    o = 4; ver = u('I'); nt = u('Q'); nkv = u('Q')
    F = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
    def val(t):
        if t in F: return u(F[t])
        if t == 8: return s()
        if t == 9:
            et = u('I'); n = u('Q'); return [val(et) for _ in range(n)]
        raise ValueError('type %d' % t)
    kv = {}
    for _ in range(nkv):
        k = s(); t = u('I'); kv[k] = val(t)
    return kv

# ---------------------------------------------------------------- model-family templates
# Chat templates of model families are other people's text, so they are not
# kept in the tree: --family FILE names a Python file that fills T = {name:
# template source}; without it, the cases that need them are skipped.
class _Family(dict):
    def __missing__(self, key):
        return None
T = _Family()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(REPO, 'build', 'toy')
SHARED = os.path.join(os.path.dirname(REPO), 'shared', 'testdata')
BOS, EOS = '<s>', '</s>'

# ---------------------------------------------------------------- oracle (HF's _compile_jinja_template)
class AssistantTracker(Extension):
    tags = {"generation"}
    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)
    def _render(self, caller):
        return caller()

def _raise(msg):
    raise jinja2.exceptions.TemplateError(msg)

def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def _strftime_now(fmt):
    # the date pinned on both sides: toy's strftime_now reads SOURCE_DATE_EPOCH (UTC) too
    sde = os.environ.get('SOURCE_DATE_EPOCH')
    if sde:
        return datetime.datetime.fromtimestamp(int(sde), datetime.timezone.utc).strftime(fmt)
    return datetime.datetime.now().strftime(fmt)

ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=[AssistantTracker, jinja2.ext.loopcontrols])
ENV.filters['tojson'] = _tojson
ENV.globals['raise_exception'] = _raise
ENV.globals['strftime_now'] = _strftime_now

def render_jinja(src, messages, gen, bos, eos, extra):
    try:
        t = ENV.from_string(src)
        kw = dict(tools=None, documents=None)  # as transformers' apply_chat_template
        kw.update(extra)
        kw.update(messages=messages, add_generation_prompt=gen, bos_token=bos, eos_token=eos)
        return ('OK', t.render(**kw))
    except Exception as e:
        return ('ERR', '%s: %s' % (type(e).__name__, e))

TMP = tempfile.mkdtemp(prefix='toyjinja.')
import atexit, shutil
atexit.register(shutil.rmtree, TMP, True)
def render_toy(idx, src, builtin, messages, gen, bos, eos, extra, model=None):
    tf = os.path.join(TMP, 'c%d.j' % idx)
    mf = os.path.join(TMP, 'c%d.json' % idx)
    if builtin is None:
        with open(tf, 'w', encoding='utf-8') as f: f.write(src)
    doc = dict(extra); doc['messages'] = messages
    with open(mf, 'w', encoding='utf-8') as f: json.dump(doc, f, ensure_ascii=False)
    cmd = [TOY, 'chat-template', '--template', builtin or tf, '--messages', mf, '--bos', bos, '--eos', eos]
    if model: cmd = [TOY, 'chat-template', '-m', model, '--messages', mf]
    if not gen: cmd.append('--no-generation-prompt')
    p = subprocess.run(cmd, capture_output=True, timeout=30)
    if p.returncode != 0:
        return ('ERR', p.stderr.decode('utf-8', 'replace').strip())
    return ('OK', p.stdout.decode('utf-8', 'surrogateescape'))

# ---------------------------------------------------------------- message fixtures
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "days": {"type": "integer", "description": "Forecast days"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels"},
        "opts": {"type": "object", "additionalProperties": {"type": "number"}},
        "either": {"type": ["string", "integer"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "description": "Does nothing \u00e9\u00e8 \"quoted\"",
                                      "parameters": {"type": "object", "properties": {}}}}]
TC_ARGS = {"city": "Paris", "days": 3, "unit": "celsius", "ratio": 0.5, "temp": 10.0, "flag": True, "none": None,
           "nested": {"a": [1, 2, {"b": "é\"\\"}]}}
TC = [{"type": "function", "id": "abc123XYZ", "function": {"name": "get_weather", "arguments": TC_ARGS}}]
TC_STR = [{"type": "function", "id": "abc123XYZ", "function": {"name": "get_weather", "arguments": json.dumps(TC_ARGS)}}]

MSGS = {
    'user': [{"role": "user", "content": "Hello"}],
    'sys_user': [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    'multi': [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "What is 2+2?"},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    'multi_noprompt': [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                       {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
    'empty': [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": " "}],
    'unicode': [{"role": "user", "content": "h\u00e9llo \u4e16\u754c \U0001F389 \u2014 na\u00efve \u00dfstra\u00dfe \u0130"},
                {"role": "assistant", "content": "\U0001F44D\U0001F3FD ok \u00c9t\u00e9"}, {"role": "user", "content": "\u00e9"}],
    'quotes': [{"role": "system", "content": "He said \"hi\" and it's C:\\path\\n {{ not_a_tag }} {% raw %}"},
               {"role": "user", "content": "'single' \"double\" \\ back \\\\ two"}],
    'newlines': [{"role": "user", "content": "  line1\nline2\n\n  "}, {"role": "assistant", "content": "\n\nanswer\t\n"},
                 {"role": "user", "content": "\r\nwin\r\n"}],
    'parts': [{"role": "system", "content": [{"type": "text", "text": "Sys part"}]},
              {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": " what?"}]}],
    'tool_calls': [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": None, "tool_calls": TC},
                   {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "{\"temp\": 21}"},
                   {"role": "assistant", "content": "It is 21C."}, {"role": "user", "content": "Thanks"}],
    'tool_calls_str': [{"role": "user", "content": "Weather?"},
                       {"role": "assistant", "content": "", "tool_calls": TC_STR},
                       {"role": "tool", "tool_call_id": "abc123XYZ", "content": "sunny"},
                       {"role": "tool", "tool_call_id": "abc123XYZ", "content": "warm"}],
    'ipython': [{"role": "user", "content": "Run it"},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "ipython", "content": {"temp": -3.5, "ok": True}},
                {"role": "tool", "content": [1, 2]}],
    'think': [{"role": "user", "content": "Why?"},
              {"role": "assistant", "content": "<think>\nbecause\n</think>\n\nBecause."},
              {"role": "user", "content": "Sure?"},
              {"role": "assistant", "content": "Yes", "reasoning_content": "checked"}],
    'unicode_ws': [{"role": "system", "content": "\u00a0Sys\u2003"}, {"role": "user", "content": "\u3000Hello\u00a0\n"}],
    'alternation_bad': [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    'system_only': [{"role": "system", "content": "only sys"}],
}
MSG_EXTRA = {'tool_calls': {'tools': TOOLS}, 'tool_calls_str': {'tools': TOOLS}, 'ipython': {'tools': TOOLS}}

# gpt-oss ("harmony", --family T['gpt_oss']): developer/thinking/tool-call turns, JSON-schema tool
# definitions of every shape its TypeScript rendering distinguishes, and its kwargs
SCHEMA_TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the catalogue \u2014 caf\u00e9s too",
     "parameters": {"type": "object", "required": ["query", "filters"], "properties": {
        "query": {"type": "string", "description": "What to look for"},
        "mode": {"type": "string", "enum": ["fast", "exact", "fuzzy"], "default": "fast", "description": "Match mode"},
        "limit": {"type": "integer", "default": 10},
        "ratio": {"type": "number", "default": 0.5, "description": "Weight"},
        "scale": {"type": "number", "default": 10.0},
        "strict": {"type": "boolean", "default": False},
        "tags": {"type": "array", "items": {"type": "string"}, "default": ["a", "b"]},
        "ids": {"type": "array", "items": {"type": "integer"}, "nullable": True},
        "scores": {"type": "array", "items": {"type": "number"}},
        "flags": {"type": "array", "items": {"type": "boolean"}},
        "anything": {"type": "array"},
        "maybe_list": {"type": "array", "nullable": True},
        "points": {"type": "array", "items": {"type": "object", "properties": {
            "x": {"type": "number"}, "y": {"type": "number"}, "label": {"type": "string", "nullable": True}},
            "required": ["x"]}},
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "wide": {"type": "array", "items": {"type": "object", "properties": {
            "a_long_property_name": {"type": "string"}, "another_long_property": {"type": "integer"},
            "third_long_property_name": {"type": "boolean"}}}},
        "blobs": {"type": "array", "items": {"type": ["object", "object"]}},
        "filters": {"type": "object", "properties": {
            "lang": {"type": "string", "enum": ["en", "fr"]},
            "since": {"type": "string", "nullable": True, "description": "ISO date"},
            "nested": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "required": ["deep"]}},
            "required": ["lang"]},
        "meta": {"type": "object"},
        "union": {"type": ["string", "integer", "null"]},
        "single": {"type": ["string"]},
        "choice": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "integer", "default": 3}],
                   "default": "x"},
        "shape": {"oneOf": [{"type": "object", "properties": {"r": {"type": "number"}}}, {"type": "string"}]},
        "lone": {"oneOf": [{"type": "object"}]},
        "untyped": {"description": "no type at all"},
        "enum_nullable": {"type": "string", "nullable": True},
        "empty_enum": {"type": "string", "enum": []}}}}},
    {"type": "function", "function": {"name": "ping", "description": "No parameters"}},
    {"type": "function", "function": {"name": "noop", "description": "Empty properties",
                                      "parameters": {"type": "object", "properties": {}}}},
]
OSS_TC = [{"type": "function", "id": "c1", "function": {"name": "search", "arguments": {"query": "caf\u00e9", "limit": 3,
                                                                                        "ratio": 1.0, "tags": ["x"]}}}]
OSS_MSGS = {
    'plain': ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "Bye"}], None),
    'plain_last_assistant': ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], None),
    'system': ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None),
    'developer': ([{"role": "developer", "content": "Answer in French.\nAlways."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Salut"}], None),
    'thinking': ([{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4", "thinking": "Add them."},
                  {"role": "user", "content": "3+3?"},
                  {"role": "assistant", "content": "6", "thinking": "Also add: 3 and 3."}], None),
    'tools': ([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Find caf\u00e9s"}],
              {'tools': SCHEMA_TOOLS}),
    'tools_no_dev': ([{"role": "user", "content": "Find"}], {'tools': SCHEMA_TOOLS[1:]}),
    'tool_call_flow': ([{"role": "user", "content": "Find caf\u00e9s"},
                        {"role": "assistant", "thinking": "I should search.", "tool_calls": OSS_TC},
                        {"role": "tool", "content": "{\"hits\": 2}"},
                        {"role": "assistant", "content": "Two caf\u00e9s.", "thinking": "Summarise."}],
                       {'tools': SCHEMA_TOOLS}),
    'tool_call_pending': ([{"role": "user", "content": "Find"},
                           {"role": "assistant", "content": "Let me search.", "tool_calls": OSS_TC},
                           {"role": "tool", "content": {"hits": [1, 2], "ok": True}}],
                          {'tools': SCHEMA_TOOLS}),
    'tool_call_thinking_pending': ([{"role": "user", "content": "Find"},
                                    {"role": "assistant", "thinking": "Searching.", "tool_calls":
                                     [{"name": "ping", "arguments": "{\"a\": 1}", "content_type": "code"}]},
                                    {"role": "tool", "content": "pong"}],
                                   {'tools': SCHEMA_TOOLS}),
    'tool_call_str_args': ([{"role": "user", "content": "Weather?"},
                            {"role": "assistant", "tool_calls": TC_STR},
                            {"role": "tool", "content": "sunny"},
                            {"role": "assistant", "content": "Sunny."}], {'tools': TOOLS}),
    'kwargs': ([{"role": "user", "content": "Hi"}],
               {'reasoning_effort': 'high', 'model_identity': 'You are Toy.', 'builtin_tools': ['browser', 'python']}),
    'kwargs_python': ([{"role": "user", "content": "Hi"}], {'builtin_tools': ['python'], 'tools': TOOLS}),
    'kwargs_empty_builtin': ([{"role": "user", "content": "Hi"}], {'builtin_tools': [], 'reasoning_effort': 'low'}),
    'two_tool_rounds': ([{"role": "developer", "content": "Dev."}, {"role": "user", "content": "Go"},
                         {"role": "assistant", "content": "", "thinking": "first", "tool_calls": OSS_TC + TC},
                         {"role": "tool", "content": "r1"},
                         {"role": "assistant", "content": "Checking weather.", "tool_calls": TC},
                         {"role": "tool", "content": [1, 2.5, None, "\u00e9"]},
                         {"role": "user", "content": "And?"}], {'tools': SCHEMA_TOOLS}),
    'tool_args_numbers': ([{"role": "user", "content": "n"},
                           {"role": "assistant", "tool_calls": [{"function": {"name": "ping", "arguments": {
                               "f": [1e-07, 1e20, 3.141592653589793, -0.0, 100.0, 1e16, 123456.789, 2.5e-5],
                               "s": "\u2028</script>\t\u0001", "b": [True, False, None], "e": {}, "l": []}}}]},
                           {"role": "tool", "content": ""}], {'tools': SCHEMA_TOOLS[1:]}),
    'items_named_props': ([{"role": "user", "content": "cart"}],
                          {'tools': [{"type": "function", "function": {"name": "cart", "description": "Cart", "parameters": {
                              "type": "object", "required": ["items"], "properties": {
                                  "items": {"type": "array", "items": {"type": "object", "properties": {
                                      "items": {"type": "integer"}, "keys": {"type": "string"}, "values": {"type": "number"}}}},
                                  "keys": {"type": "array", "items": {}},
                                  "get": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}},
                                  "type": {"type": "string", "enum": ["a"]}}}}}]}),
    'builtin_tools_string': ([{"role": "user", "content": "Hi"}], {'builtin_tools': 'browser'}),
    'empty_tools': ([{"role": "user", "content": "Hi"}], {'tools': []}),
    'err_empty_messages': ([], None),
    'err_empty_tool_calls': ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": []}], None),
    'err_none_effort': ([{"role": "user", "content": "x"}], {'reasoning_effort': None}),
    'err_user_none': ([{"role": "user", "content": None}], None),
    'err_both': ([{"role": "user", "content": "x"},
                  {"role": "assistant", "content": "c", "thinking": "t", "tool_calls": OSS_TC}], {'tools': SCHEMA_TOOLS}),
    'err_channel_tag': ([{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "<|channel|>final<|message|>hi"}], None),
    'err_channel_thinking': ([{"role": "user", "content": "x"},
                              {"role": "assistant", "content": "a", "thinking": "<|channel|>analysis<|message|>t"}], None),
    'err_orphan_tool': ([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], None),
    'err_default_concat': ([{"role": "user", "content": "x"}],
                           {'tools': [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
                               "type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2], "default": 1}}}}}]}),
}

# ---------------------------------------------------------------- feature probes: (name, template, extra vars)
V = {'s': '  Hello World  ', 'n': 7, 'f': 2.5, 'l': [3, 1, 2], 'names': ['b', 'A', 'a', 'B'],
     'd': {'b': 2, 'a': 1, 'C': 3}, 'u': 'h\u00e9llo \u00e9t\u00e9 \u00df', 'e': '',
     'people': [{'name': 'Ann', 'age': 30, 'tags': ['x']}, {'name': 'bob', 'age': 25}, {'name': 'Cy', 'age': None}],
     'nested': {'a': {'b': [1, {'c': 'deep'}]}}, 'html': '<a href="x">&</a>', 'multi': 'a\nb\n\nc\n',
     'big': 10 ** 12, 'neg': -7, 'tf': True, 'nul': None, 'fl': [1.0, 10.0, 100.0, 0.1, 1e16, 1e-5, 123456.789]}

P = []
def probe(name, tpl, **extra):
    ev = dict(V); ev.update(extra)
    P.append((name, tpl, ev))

# filters
for nm, t in [
    ('trim', '[{{ s|trim }}]'), ('trim_chars', "[{{ 'xxhixx'|trim('x') }}]"), ('upper', '{{ s|upper }}'), ('lower', '{{ s|lower }}'),
    ('upper_unicode', '{{ u|upper }}'), ('lower_unicode', "{{ '\u00c9T\u00c9 \u0130'|lower }}"),
    ('title', "{{ \"they're 1st-class o'neil hello_world\"|title }}"), ('title_method', "{{ \"they're 1st-class o'neil\".title() }}"),
    ('capitalize', "{{ 'hELLO wORLD'|capitalize }}"), ('length_str', '{{ u|length }}'), ('length_list', '{{ l|length }}'),
    ('length_dict', '{{ d|length }}'), ('count', '{{ l|count }}'), ('join', "{{ l|join(', ') }}"), ('join_nosep', '{{ l|join }}'),
    ('join_attr', "{{ people|join(', ', attribute='name') }}"), ('replace', "{{ s|replace('l', 'L') }}"),
    ('replace_count', "{{ 'aaaa'|replace('a', 'b', 2) }}"), ('replace_empty', "{{ 'abc'|replace('', '-') }}"),
    ('default_undef', "{{ missing|default('dflt') }}"), ('default_none', "{{ nul|default('dflt') }}"),
    ('default_empty_true', "{{ e|default('dflt', true) }}"), ('default_empty', "[{{ e|default('dflt') }}]"),
    ('default_kw', "{{ e|default('x', boolean=true) }}"), ('d_alias', "{{ missing|d('y') }}"),
    ('first_last', '{{ l|first }} {{ l|last }} {{ s|first }}|{{ s|last }}|'), ('first_empty', '[{{ []|first }}]'),
    ('map_attr', "{{ people|map(attribute='name')|join(',') }}"), ('map_attr_missing', "{{ people|map(attribute='tags')|list }}"),
    ('map_attr_missing_join', "{{ people|map(attribute='zzz')|join(',') }}"), ('map_attr_default', "{{ people|map(attribute='zzz', default='?')|join(',') }}"),
    ('map_filter', "{{ names|map('upper')|join(',') }}"), ('map_nested_attr', "{{ [nested]|map(attribute='a.b.1.c')|first }}"),
    ('selectattr_eq', "{{ people|selectattr('name', 'equalto', 'bob')|map(attribute='age')|first }}"),
    ('selectattr_truthy', "{{ people|selectattr('age')|map(attribute='name')|join(',') }}"),
    ('rejectattr_none', "{{ people|rejectattr('age', 'none')|map(attribute='name')|join(',') }}"),
    ('selectattr_defined', "{{ people|selectattr('tags', 'defined')|map(attribute='name')|join(',') }}"),
    ('selectattr_undefined', "{{ people|selectattr('tags', 'undefined')|list|length }}"),
    ('selectattr_eqop', "{{ people|selectattr('age', '==', 25)|map(attribute='name')|join(',') }}"),
    ('selectattr_gt', "{{ people|selectattr('name', 'ne', 'bob')|map(attribute='name')|join(',') }}"),
    ('selectattr_in', "{{ people|selectattr('name', 'in', ['Ann', 'Cy'])|map(attribute='name')|join(',') }}"),
    ('select_test', "{{ [1, 2, 3, 4]|select('odd')|join(',') }}"), ('reject_test', "{{ [1, 'a', 2]|reject('string')|join(',') }}"),
    ('select_gt', "{{ [1, 2, 3, 4]|select('gt', 2)|join(',') }}"), ('select_ge_op', "{{ [1, 2, 3, 4]|select('>=', 3)|join(',') }}"),
    ('list_str', '{{ "abc"|list }}'), ('list_dict', '{{ d|list }}'), ('string', '{{ l|string }}|{{ nul|string }}|{{ tf|string }}'),
    ('int', "{{ '42'|int }} {{ '3.7'|int }} {{ 3.9|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ -3.9|int }}"),
    ('int_base', "{{ '0x1A'|int(0, 16) }} {{ '1_000'|int }}"), ('float', "{{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }}"),
    ('round', '{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 2.4|round(0, "ceil") }} {{ 2.6|round(method="floor") }}'),
    ('round_int_result', '{{ (7/2)|round|int }}'), ('abs', '{{ neg|abs }} {{ -2.5|abs }}'),
    ('indent', "{{ multi|indent }}|"), ('indent_first', "{{ multi|indent(2, true) }}|"),
    ('indent_blank', "{{ multi|indent(2, blank=true) }}|"), ('indent_str', "{{ multi|indent('> ') }}|"),
    ('indent_first_blank_line', "{{ '\\nx'|indent(2, true) }}|"), ('indent_empty_first', "[{{ ''|indent(2, true) }}]"),
    ('items', "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}"), ('dictsort', "{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %}"),
    ('dictsort_cs', "{% for k, v in d|dictsort(true) %}{{ k }};{% endfor %}"), ('dictsort_value', "{% for k, v in d|dictsort(by='value') %}{{ k }};{% endfor %}"),
    ('unique', "{{ [1, 2, 1, 3, 2]|unique|list }}"), ('unique_case', "{{ names|unique|list }}"),
    ('reverse_list', '{{ l|reverse|list }}'), ('reverse_str', '{{ u|reverse }}'), ('sort', '{{ l|sort }}'),
    ('sort_reverse', '{{ l|sort(reverse=true) }}'), ('sort_case', '{{ names|sort }}'), ('sort_attr', "{{ people|sort(attribute='name')|map(attribute='name')|join(',') }}"),
    ('sort_stable', "{{ [[2,'a'],[1,'b'],[2,'c'],[1,'d']]|sort(attribute='0')|map('last')|join }}"),
    ('tojson_str', '{{ u|tojson }}'), ('tojson_list', '{{ l|tojson }}'), ('tojson_dict', '{{ d|tojson }}'),
    ('tojson_indent', '{{ nested|tojson(indent=2) }}'), ('tojson_indent_pos', '{{ people|tojson(2) }}'),
    ('tojson_nonascii', "{{ {'k': 'é\u4e16\U0001F389\\u2028', 'q': 'a\"b\\\\c\\n\\t\\u0001\\u007f'}|tojson }}"),
    ('tojson_scalars', '{{ nul|tojson }} {{ tf|tojson }} {{ n|tojson }} {{ f|tojson }} {{ 1.0|tojson }} {{ 1e20|tojson }}'),
    ('tojson_floats', '{{ fl|tojson }}'), ('tojson_empty', '{{ [[], {}]|tojson(indent=2) }}'),
    ('tojson_sort_keys', '{{ d|tojson(sort_keys=true) }}'), ('tojson_separators', "{{ d|tojson(separators=(',', ':')) }}"),
    ('tojson_undefined', '{{ missing|tojson }}'),
    ('safe', '{{ html|safe }}'), ('escape', '{{ html|escape }}'), ('e_alias', '{{ html|e }}'), ('forceescape', '{{ html|forceescape }}'),
    ('wordcount', "{{ 'a  b\\nc'|wordcount }}"), ('center', "[{{ 'ab'|center(6) }}]"), ('truncate', "{{ 'hello world foo'|truncate(9) }}"),
    ('sum', '{{ l|sum }}'), ('sum_attr', "{{ people|selectattr('age')|sum(attribute='age') }}"), ('max_min', '{{ l|max }} {{ l|min }}'),
    ('batch', '{{ [1,2,3,4,5]|batch(2)|list }}'), ('slice_filter', '{{ [1,2,3,4,5]|slice(2)|list }}'),
    ('format_filter', "{{ '%s-%d'|format('a', 3) }}"), ('attr_filter', "{{ nested|attr('a') }}"),
    ('groupby', "{% for g in people|groupby('age') %}{{ g.grouper }}:{{ g.list|length }};{% endfor %}"),
    ('striptags', "{{ html|striptags }}"), ('wordwrap', "{{ 'aaa bbb ccc'|wordwrap(5) }}"),
    ('filter_chain_precedence', "{{ 'a' ~ 'b'|upper }}"), ('neg_filter', '{{ -3|abs }}'),
    ('filter_block', "{% filter upper %}hi {{ 'x' }}{% endfilter %}"),
    ('pprint', '{{ d|pprint }}'), ('urlencode', "{{ 'a b&c'|urlencode }}"),
    ]:
    probe('f_' + nm, t)

# tests
for nm, t in [
    ('defined', '{{ n is defined }} {{ missing is defined }} {{ missing is undefined }} {{ nul is defined }}'),
    ('none', '{{ nul is none }} {{ missing is none }} {{ 0 is none }}'),
    ('string', "{{ 'a' is string }} {{ 1 is string }} {{ l is string }}"),
    ('mapping', '{{ d is mapping }} {{ l is mapping }} {{ people[0] is mapping }}'),
    ('iterable', "{{ l is iterable }} {{ 'a' is iterable }} {{ d is iterable }} {{ 1 is iterable }} {{ missing is iterable }}"),
    ('sequence', "{{ l is sequence }} {{ 'a' is sequence }} {{ d is sequence }} {{ 1 is sequence }}"),
    ('number', '{{ 1 is number }} {{ 1.5 is number }} {{ "1" is number }} {{ true is number }}'),
    ('integer_float', '{{ 1 is integer }} {{ 1.0 is integer }} {{ 1.0 is float }} {{ true is integer }}'),
    ('boolean', '{{ true is boolean }} {{ 1 is boolean }} {{ tf is true }} {{ 0 is false }}'),
    ('equalto', "{{ 2 is equalto 2 }} {{ 2 is equalto(3) }} {{ 'a' is eq 'a' }} {{ 1 == 1.0 }} {{ 1 == true }}"),
    ('in_test', "{{ 2 is in l }} {{ 'a' is in 'cat' }}"),
    ('even_odd', '{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}'),
    ('is_not', "{{ nul is not none }} {{ n is not string }} {{ not n is string }}"),
    ('lower_upper_test', "{{ 'abc' is lower }} {{ 'ABC' is upper }}"),
    ('gt_lt_test', "{{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 3 is ge 3 }} {{ 3 is le 2 }}"),
    ('sameas', "{{ nul is sameas none }} {{ tf is sameas true }}"),
    ('callable', "{% macro m() %}{% endmacro %}{{ m is callable }} {{ 1 is callable }}"),
    ('is_test_precedence', "{{ 1 + 1 is number }}"),
    ('is_test_precedence2', "{{ 'a' ~ 'b' is string }}"),
    ('test_filter_test', "{{ 'x'|upper is string }}"),
    ('escaped', "{{ 'x' is escaped }}"), ('filter_test', "{{ 'upper' is filter }}"),
    ]:
    probe('t_' + nm, t)

# loops
for nm, t in [
    ('loop_vars', "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}"),
    ('prev_next', "{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}"),
    ('prev_defined', "{% for x in l %}{{ loop.previtem is defined }}{% endfor %}"),
    ('cycle', "{% for x in l %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
    ('changed', "{% for x in [1,1,2] %}{{ loop.changed(x) }}{% endfor %}"),
    ('depth', "{% for x in l %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}"),
    ('loop_else', "{% for x in [] %}x{% else %}empty{% endfor %}"), ('loop_else_nonempty', "{% for x in [1] %}x{% else %}empty{% endfor %}"),
    ('loop_else_filtered', "{% for x in l if x > 5 %}x{% else %}none-kept{% endfor %}"),
    ('loop_if_filter', "{% for x in l if x != 1 %}{{ loop.index }}:{{ x }}{{ loop.last }};{% endfor %}"),
    ('break', "{% for x in l %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
    ('continue', "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
    ('break_else', "{% for x in l %}{% break %}{% else %}E{% endfor %}done"),
    ('nested_loop', "{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }}|{% endfor %}"),
    ('loop_unpack', "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}"),
    ('loop_dict', "{% for k in d %}{{ k }}{% endfor %}"), ('loop_dict_items', "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}"),
    ('loop_string', "{% for c in 'h\u00e9\U0001F389' %}[{{ c }}]{% endfor %}"),
    ('loop_undefined', "{% for x in missing %}x{% else %}E{% endfor %}"),
    ('loop_none', "{% for x in nul %}x{% endfor %}"),
    ('loop_int', "{% for x in 3 %}x{% endfor %}"),
    ('range', "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}{{ range(5, 0, -2)|list }}"),
    ('loop_scope_leak', "{% set x = 'outer' %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}"),
    ('loop_scope_persist', "{% for i in l %}{% if loop.first %}{% set y = 'set' %}{% endif %}[{{ y }}]{% endfor %}"),
    ('loop_scope_outer_read', "{% set x = 1 %}{% for i in l %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}"),
    ('loop_var_after', "{% for i in l %}{% endfor %}[{{ i }}]"),
    ('loop_reassign_var', "{% for i in l %}{% set i = i * 2 %}{{ i }}{% endfor %}"),
    ('if_scope', "{% if true %}{% set z = 5 %}{% endif %}{{ z }}"),
    ('loop_recursive', "{% for x in [[1, [2]], 3] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}{% endfor %}"),
    ('loop_tuple_iter', "{% for x in 1, 2 %}{{ x }}{% endfor %}"),
    ]:
    probe('l_' + nm, t)

# assignment, namespace, macros
for nm, t in [
    ('namespace', "{% set ns = namespace(a=1, b='x') %}{% for i in l %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}"),
    ('namespace_print', "{% set ns = namespace(a=1) %}{{ ns }}"),
    ('namespace_dict_arg', "{% set ns = namespace({'k': 2}, j=3) %}{{ ns.k }}{{ ns.j }}"),
    ('set_attr_non_ns', "{% set dd = {'a': 1} %}{% set dd.a = 2 %}{{ dd.a }}"),
    ('set_block', "{% set blk %}  x {{ n }} {% endset %}[{{ blk }}]"),
    ('set_block_filter', "{% set blk | upper %}abc{% endset %}{{ blk }}"),
    ('set_multi', "{% set a, b = 1, 2 %}{{ a }}{{ b }}"), ('set_tuple_print', "{% set t = (1, 2) %}{{ t }}"),
    ('macro_defaults', "{% macro m(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}|{{ m(a=4) }}"),
    ('macro_missing_arg', "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}"),
    ('macro_default_refs_param', "{% macro m(a, b=a) %}{{ a }}{{ b }}{% endmacro %}{{ m(5) }}"),
    ('macro_extra_args', "{% macro m(a) %}{{ a }}{{ varargs }}{% endmacro %}{{ m(1, 2, 3) }}"),
    ('macro_kwargs', "{% macro m(a) %}{{ a }}{{ kwargs }}{% endmacro %}{{ m(1, z=2) }}"),
    ('macro_caller', "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}inner {{ n }}{% endcall %}"),
    ('macro_caller_args', "{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(a, b) m() %}{{ a + b }}{% endcall %}"),
    ('macro_globals', "{% set top = 'T' %}{% macro m() %}{{ top }}{{ n }}{% endmacro %}{{ m() }}"),
    ('macro_sees_later_set', "{% macro m() %}[{{ late }}]{% endmacro %}{% set late = 'L' %}{{ m() }}"),
    ('macro_no_caller_locals', "{% macro m() %}[{{ i }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}"),
    ('macro_recursion', "{% macro f(x) %}{% if x > 0 %}{{ x }}{{ f(x - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"),
    ('macro_whitespace', "{% macro m(x) %}\n  {{ x }}\n{% endmacro %}[{{ m(1) }}]"),
    ('macro_as_value', "{% macro m() %}M{% endmacro %}{% set f = m %}{{ f() }}"),
    ('macro_in_filter', "{% macro m() %} m {% endmacro %}[{{ m()|trim }}]"),
    ]:
    probe('a_' + nm, t)

# whitespace control / lexer
for nm, t in [
    ('trim_blocks', "{% if true %}\nyes\n{% endif %}\nend"),
    ('lstrip_blocks', "  {% if true %}\n  x\n  {% endif %}\n"),
    ('lstrip_not_var', "  {{ 'v' }}\n  {% if true %}y{% endif %}"),
    ('lstrip_midline', "a  {% if true %}b{% endif %}"),
    ('strip_minus', "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c"),
    ('var_minus', "a \n {{- 'x' -}} \n b"),
    ('plus_modifier', "  {%+ if true %}x{% endif %}"),
    ('plus_end', "{% if true +%}\nx{% endif %}"),
    ('comment', "a{# comment #}b\n{# c2 #}\nc"), ('comment_strip', "a  {#- c -#}  b"),
    ('comment_lstrip', "x\n    {# indented comment #}\ny"),
    ('raw', "{% raw %}{{ not evaluated }}{% endraw %}"), ('raw_ws', "{% raw %}\n  {{ x }}\n{% endraw %}\nz"),
    ('crlf', "{% if true %}\r\nA\r\n{% endif %}\r\nB"),
    ('tab_lstrip', "\t{% if true %}T{% endif %}"),
    ('lstrip_after_var', "{{ 'a' }}   {% if true %}b{% endif %}"),
    ('endif_trailing_space', "{% if true %}x{% endif %}   \nnext"),
    ('dict_in_tag', "{{ {'a': {'b': 1}}['a']['b'] }}"),
    ('string_with_close', "{{ '}}' }}{{ '%}' }}"),
    ('escapes', r"{{ 'a\nb\tc\\d\'e\"f' }}"), ('escape_unicode', r"{{ '\u00e9\x41\U0001F389' }}"),
    ('escape_unknown', r"{{ '\d\s\w' }}"), ('escape_octal', r"{{ '\101\0' ~ 'x' }}"),
    ('adjacent_strings', "{{ 'a' 'b' \"c\" }}"), ('literal_newline_in_str', "{{ 'a\nb' }}"),
    ('unicode_text', "h\u00e9 \U0001F389 {{ '\u4e16' }}"),
    ]:
    probe('w_' + nm, t)

# expressions
for nm, t in [
    ('str_methods', "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'xyaxy'.lstrip('xy') }}|{{ 'ayx'.rstrip('xy') }}"),
    ('split', "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.split(None, 1) }}"),
    ('rsplit', "{{ 'a,b,c'.rsplit(',', 1) }}"), ('splitlines', "{{ 'a\\nb\\r\\nc'.splitlines() }}"),
    ('startswith', "{{ s.startswith('  H') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }}"),
    ('case_methods', "{{ 'aB'.upper() }}{{ 'aB'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}"),
    ('replace_method', "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }}"),
    ('format_method', "{{ '{} is {}'.format('x', 1) }}"), ('percent_format', "{{ '%s=%d' % ('a', 3) }}"),
    ('find_count', "{{ 'h\u00e9llo'.find('l') }} {{ 'banana'.count('a') }} {{ 'banana'.rfind('a') }}"),
    ('join_method', "{{ '-'.join(['a', 'b']) }} {{ ', '.join(l|map('string')) }}"),
    ('isdigit', "{{ '123'.isdigit() }} {{ 'ab'.isalpha() }} {{ ''.isdigit() }} {{ 'Ab'.isupper() }}"),
    ('zfill_center', "{{ '7'.zfill(3) }}"),
    ('slicing', "{{ 'abcdef'[::-1] }} {{ 'abcdef'[1:] }} {{ 'abcdef'[:-2] }} {{ l[::2] }} {{ l[-1] }} {{ 'abc'[-1] }} {{ l[5:] }} {{ 'h\u00e9\U0001F389'[1:] }}"),
    ('slice_step_neg', "{{ [1,2,3,4,5][3:0:-1] }} {{ [1,2,3][-10:10] }}"),
    ('index_oob', "[{{ l[10] }}][{{ 'ab'[5] }}]"),
    ('dict_access', "{{ d.a }} {{ d['b'] }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ nested.a.b[1].c }} {{ people[0]['tags'][0] }}"),
    ('dict_methods', "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}"),
    ('dict_items_print', "{{ d.items() }}"), ('dict_keys_print', "{{ d.keys() }}"),
    ('attr_shadow_method', "{% set x = {'items': [1], 'keys': 'k', 'get': 'g'} %}{{ x.items }}|{{ x['items'] }}|{{ x.keys }}"),
    ('in_ops', "{{ 'ell' in 'hello' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ 1 in d }}"),
    ('concat', "{{ 'a' ~ 1 ~ none ~ true ~ 2.5 ~ l }}"), ('concat_undef', "[{{ 'a' ~ missing ~ 'b' }}]"),
    ('plus_str', "{{ 'a' + 'b' }}"), ('plus_str_int', "{{ 'a' + 1 }}"), ('plus_list', "{{ [1] + [2] }}"),
    ('arith', "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 7.5 // 2 }} {{ 1 + 2 * 3 - 4 }}"),
    ('arith_float_print', "{{ 20 / 2 }} {{ 10.0 }} {{ 100.0 }} {{ 1e5 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 123456789.0 }}"),
    ('float_list_print', "{{ fl }}"),
    ('pow_assoc', "{{ 2 ** 3 ** 2 }}"), ('unary_minus_pow', "{{ -2 ** 2 }}"),
    ('str_mul', "{{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ '=' * 0 }}"), ('list_mul', "{{ [0] * 3 }}"),
    ('compare_chain', "{{ 1 < 2 < 3 }} {{ 3 > 2 > 1 }} {{ 2 == 2 == 2 }} {{ 1 < 3 > 2 }}"),
    ('compare_str', "{{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ [1] == [1.0] }}"),
    ('compare_mixed_err', "{{ 1 < 'a' }}"), ('compare_none_err', "{{ none < 1 }}"),
    ('inline_if', "[{{ 'y' if true }}][{{ 'y' if false }}][{{ 'a' if n > 5 else 'b' }}]"),
    ('inline_if_undef_attr', "[{{ ('y' if false).x }}]"),
    ('and_or_values', "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or none }} {{ not 0 }} {{ not 'a' }}"),
    ('literals', "{{ none }} {{ None }} {{ true }} {{ True }} {{ false }} {{ False }} {{ 1_000 }} {{ [1, 'a', none, true] }} {{ {'a': none} }}"),
    ('repr_quotes', "{{ [\"it's\", 'say \"hi\"', 'both \\'\"', 'back\\\\slash', 'nl\\n', '\u00e9', '\\u00a0', '\\u200b', '\\x7f'] }}"),
    ('dict_literal', "{{ {'a': 1, 'b': [2]} }} {{ {1: 'x'} }}"),
    ('dict_int_key_lookup', "{% set m = {1: 'one'} %}{{ m[1] }}"),
    ('tuple_print', "{{ (1, 2) }} {{ (1,) }} {{ () }}"),
    ('undefined_print', "[{{ missing }}]"), ('undefined_attr', "[{{ missing.attr }}]"), ('undefined_item', "[{{ missing['k'] }}]"),
    ('defined_attr_missing', "[{{ d.zz }}][{{ d.zz.yy }}]"), ('undefined_attr_of_missing_key', "[{{ people[0].zz.yy }}]"),
    ('undefined_call', "{{ missing() }}"), ('undefined_method', "{{ missing.strip() }}"),
    ('undefined_arith', "{{ missing + 1 }}"), ('undefined_compare', "{{ missing == none }} {{ missing == missing2 }}"),
    ('undefined_length', "{{ missing|length }}"), ('undefined_in', "{{ 'a' in missing }}"),
    ('undefined_upper', "[{{ missing|upper }}]"), ('undefined_trim', "[{{ missing|trim }}]"),
    ('none_attr', "[{{ nul.x }}]"), ('none_in', "{{ 'a' in nul }}"),
    ('list_append', "{% set xs = [] %}{% set _ = xs.append(1) %}{{ xs }}"), ('dict_update', "{% set dd = {} %}{% set _ = dd.update({'a': 1}) %}{{ dd }}"),
    ('list_pop', "{% set xs = [1, 2] %}{{ xs.pop() }}{{ xs }}"),
    ('list_index_method', "{{ [1, 2, 3].index(2) }} {{ [1, 2, 2].count(2) }}"),
    ('raise', "{{ raise_exception('boom') }}"), ('raise_in_if_false', "{% if false %}{{ raise_exception('boom') }}{% endif %}ok"),
    ('strftime', "{{ strftime_now('%Y') }}"),
    ('big_int', "{{ big * big }}"), ('int_overflow', "{{ 9223372036854775807 + 1 }}"),
    ('neg_index_str', "{{ 'hello'[-2:] }}"),
    ('ternary_nested', "{{ 'a' if false else 'b' if false else 'c' }}"),
    ('not_precedence', "{{ not 1 == 2 }} {{ not true and false }}"),
    ('tilde_vs_plus', "{{ 1 + 2 ~ 3 }}"), ('minus_tilde', "{{ 'a' ~ 5 - 3 }}"),
    ('div_zero', "{{ 1 / 0 }}"), ('mod_str_err', "{{ 'a' % 2 }}"),
    ('unknown_filter', "{{ 1|nonexistent }}"), ('unknown_tag', "{% foo %}"), ('unclosed', "{% if true %}x"),
    ('bad_syntax', "{{ 1 + }}"), ('endfor_mismatch', "{% for x in l %}{% endif %}"),
    ('set_global_shadow', "{% set messages = messages[:0] %}{{ messages|length }}"),
    ('messages_attr', "{{ messages[0].role }}:{{ messages[0]['content'] }}:{{ messages|length }}"),
    ('gen_block', "{% generation %}gen{% endgeneration %}!"),
    ('do_tag', "{% do l.append(1) %}"), ('with_tag', "{% with a = 1 %}{{ a }}{% endwith %}"),
    ('include_tag', "{% include 'x' %}"), ('lipsum_cycler', "{{ cycler('a','b').next() }}"),
    ('joiner', "{% set j = joiner(',') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}"),
    ('dict_global', "{{ dict(a=1, b=2) }}"), ('dict_get_none_default', "[{{ d.get('zz', none) }}]"),
    ('string_iter_unicode_len', "{{ 'h\u00e9\U0001F389'|length }} {{ '\U0001F44D\U0001F3FD'|list|length }}"),
    ('bool_arith', "{{ true + 1 }} {{ true + true }}"),
    ('content_list_print', "{{ messages[0].content }}"),
    ('float_str_roundtrip', "{{ 0.1 }} {{ 2.50 }} {{ -0.0 }} {{ 1.0e2 }}"),
    ('int_div_float', "{{ (10 / 4)|int }} {{ 10 // 4.0 }}"),
    ('string_compare_unicode', "{{ '\u00e9' > 'z' }}"),
    ('nested_data_mutation', "{% set ns = namespace(l=[]) %}{% set ns.l = ns.l + [1] %}{% set ns.l = ns.l + [2] %}{{ ns.l }}"),
    ('list_in_list', "{{ [1, 2] in [[1, 2]] }}"),
    ('attr_on_string', "[{{ 'abc'.foo }}]"),
    ('getattr_index_list', "{{ l.0 }} {{ l.1 }}"),
    ]:
    probe('e_' + nm, t)

# realistic patterns behind the mismatches above
for nm, t in [
    ('loop_set_carry_sys', "{% for m in messages %}{% if m.role == 'system' %}{% set sys_msg = m.content %}{% endif %}{% if loop.last %}[{{ sys_msg }}]{% endif %}{% endfor %}"),
    ('loop_counter_set', "{% set count = 0 %}{% for m in messages %}{% set count = count + 1 %}{{ count }}{% endfor %}|{{ count }}"),
    ('loop_set_nested', "{% for a in [1, 2] %}{% set v = a %}{% for b in [1] %}{{ v }}{% set v = 'inner' %}{% endfor %}{{ v }};{% endfor %}"),
    ('caller_in_loop', "{% macro m() %}<{{ caller() }}>{% endmacro %}{% for x in [1, 2] %}{% call m() %}{{ x }}{% endcall %}{% endfor %}"),
    ('caller_sees_set_in_loop', "{% macro m() %}<{{ caller() }}>{% endmacro %}{% for x in [1] %}{% set y = 'Y' %}{% call m() %}{{ y }}{% endcall %}{% endfor %}"),
    ('caller_inside_macro', "{% macro inner() %}[{{ caller() }}]{% endmacro %}{% macro outer(a) %}{% call inner() %}{{ a }}{% endcall %}{% endmacro %}{{ outer('A') }}"),
    ('continue_else', "{% for x in [1, 2] %}{% continue %}{% else %}E{% endfor %}done"),
    ('macro_before_def', "{{ m() }}{% macro m() %}M{% endmacro %}"),
    ('trim_unicode_ws', "[{{ '\u00a0\u2003hi\u3000\u0085'|trim }}][{{ '\u00a0x\u00a0'.strip() }}][{{ '\x1fx'|trim }}][{{ '\u200bx'|trim }}]"),
    ('split_unicode_ws', "{{ 'a\u00a0b\u3000c'.split() }}"),
    ('tojson_ensure_ascii', "{{ 'é'|tojson(ensure_ascii=true) }}"),
    ('tojson_float_schema', "{{ {'minimum': 0.0, 'maximum': 100.0, 'default': 10.0, 'step': 0.5, 'big': 1500.0}|tojson }}"),
    ('string_float', "{{ 250.0|string }} {{ 3600.0 ~ 's' }} {{ [2.0, 20.0] }}"),
    ('items_filter_generator', "{% set x = {'a': 1}|items %}{{ x is iterable }} {{ x.type is defined }}"),
    ('undefined_iterable_chain', "{% set x = {'a': 1} %}{{ x.type is iterable }} {% for c in x.type %}c{% endfor %}"),
    ('message_attr_items', "{% set spec = {'type': 'array', 'items': {'type': 'string'}} %}{{ spec.items.type is defined }}|{{ spec['items'].type }}"),
    ('none_str_concat', "{{ 'x' ~ none }}"),
    ('content_none_trim', "[{{ none|trim }}][{{ none|string }}]"),
    ('bool_str_filters', "{{ true|lower }} {{ none|upper }}"),
    ('selectattr_nested_path', "{{ [{'f': {'n': 'a'}}, {'f': {'n': 'b'}}]|selectattr('f.n', 'equalto', 'b')|list|length }}"),
    ('map_attr_index', "{{ [[1, 2], [3, 4]]|map(attribute=1)|list }}"),
    ('map_first_positional_attr', "{{ [{'a': 1}]|map(attribute='a')|list }}"),
    ('join_none_items', "{{ [1, none, 'x']|join('-') }}"),
    ('strip_chars_multibyte', "[{{ 'éaé'.strip('é') }}][{{ 'xé'.rstrip('é') }}]"),
    ('upper_method_unicode', "{{ 'é'.upper() }} {{ 'ÉA'.lower() }}"),
    ('trailing_newline', "{{ 'x' -}}  z|{{ 'y' }}\n"), ('trailing_newlines', "{{ 'x' }}\n\n"),
    ('trailing_crlf', "{% if true %}a{% endif %}b\r\n"),
    ('macro_defaults', "{% macro m(a, b=false, c='x') %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(c=1, a=2) }}"),
    ('macro_varargs_kwargs', "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, a=3, x=4) }}"),
    ('macro_nested_varargs', "{% macro m(a) %}{% macro n() %}{{ varargs }}{% endmacro %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
    ('macro_too_many_args', "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
    ('macro_unknown_kwarg', "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}"),
    ('macro_kwarg_given_twice', "{% macro m(a, b) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}"),
    ('macro_call_without_caller', "{% macro m() %}M{% endmacro %}{% call m() %}x{% endcall %}"),
    ('caller_too_many_args', "{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(x) m() %}{{ x }}{% endcall %}"),
    ('macro_sees_later_root_set', "{% macro m() %}<{{ tools }}>{% endmacro %}{{ m() }}{% set tools = [1] %}{{ m() }}"),
    ]:
    probe('r_' + nm, t)

# HF driver behaviour: transformers passes tools=None / documents=None when absent (template sees them defined)
HF_DRIVER = [('drv_tools_defined_default', "{{ tools is defined }}|{{ tools is none }}|{{ documents is defined }}")]

# ---------------------------------------------------------------- case list
def case_list():
    cases = []
    def add(name, src, msgs, gen=True, extra=None, builtin=None, bos=BOS, eos=EOS, jextra=None, model=None):
        if src is None and builtin is None: return  # a family template not loaded (--family)
        extra = extra or {}
        cases.append(dict(name=name, src=src, msgs=msgs, gen=gen, extra=extra, builtin=builtin, bos=bos, eos=eos, model=model,
                          jextra=jextra if jextra is not None else extra))
    # (1) llama3 tokenizer_config.json
    cfg = json.load(open(os.path.join(SHARED, 'tokenizer-llama3/tokenizer_config.json')))
    tmpls = {'cfg_llama3': cfg['chat_template']}
    # (2) GGUF-carried templates
    import glob
    for p in sorted(glob.glob(SHARED + '/gguf-testvectors/valid/*.gguf') + glob.glob(SHARED + '/llamacpp-vocab-gguf/*.gguf')
                    + glob.glob(SHARED + '/*/*.gguf')):
        try:
            kv = read_kv(p)
        except Exception:
            continue
        ct = kv.get('tokenizer.chat_template')
        if isinstance(ct, str) and ct:
            tmpls['gguf_' + os.path.basename(p).replace('.gguf', '')] = ct
    # (3) model families written from memory
    for k, v in T.items():
        tmpls['model_' + k] = v
    for tname, src in tmpls.items():
        for mname, msgs in MSGS.items():
            for gen in (True, False):
                add('%s/%s/gen=%d' % (tname, mname, gen), src, msgs, gen, MSG_EXTRA.get(mname))
    # extra variables some templates read
    add('model_qwen3/think_off', T['qwen3'], MSGS['multi'], True, {'enable_thinking': False})
    add('model_llama31/builtin_tools', T['llama31'], MSGS['ipython'], True,
        {'builtin_tools': ['get_weather', 'code_interpreter'], 'tools': TOOLS})
    add('model_llama31/tools_in_system', T['llama31'], MSGS['tool_calls'], True,
        {'tools_in_user_message': False, 'tools': TOOLS, 'date_string': '01 Jan 2025'})
    add('model_llama31/no_tools', T['llama31'], MSGS['multi'], True)
    for mname, (msgs, extra) in OSS_MSGS.items():
        for gen in (True, False):
            add('model_gpt_oss/%s/gen=%d' % (mname, gen), T['gpt_oss'], msgs, gen, extra)
    # the same templates loaded through -m (template + BOS/EOS text from the model files)
    for mname in ['multi', 'unicode', 'newlines']:
        add('model_load/llama3_dir/%s' % mname, cfg['chat_template'], MSGS[mname], True,
            bos=cfg.get('bos_token') if isinstance(cfg.get('bos_token'), str) else cfg['bos_token']['content'],
            eos=cfg.get('eos_token') if isinstance(cfg.get('eos_token'), str) else cfg['eos_token']['content'],
            model=os.path.join(SHARED, 'tokenizer-llama3'))
        if 'gguf_ggml-vocab-phi-3' in tmpls:
            add('model_load/phi3_gguf/%s' % mname, tmpls['gguf_ggml-vocab-phi-3'], MSGS[mname], True, bos='<s>', eos='<|endoftext|>',
                model=os.path.join(SHARED, 'llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf'))
    # one-offs: a NUL character in content (valid JSON, fine for HF)
    add('model_qwen25/nul_char', T['qwen25'], [{"role": "user", "content": "a\u0000b"}], True)
    # toy's built-ins, rendered by name, against their printed source in jinja2
    for b in ['chatml', 'smollm2', 'llama3', 'llama2', 'mistral', 'gemma', 'phi3']:
        src = subprocess.run([TOY, 'chat-template', '--template', b, '--print-template'], capture_output=True).stdout.decode()
        src = src[:-1] if src.endswith('\n') else src
        for mname in ['user', 'sys_user', 'multi', 'multi_noprompt', 'unicode', 'newlines', 'quotes', 'empty', 'alternation_bad']:
            for gen in (True, False):
                add('builtin_%s/%s/gen=%d' % (b, mname, gen), src, MSGS[mname], gen, builtin=b)
    # feature probes
    for name, tpl, ev in P:
        add('probe/' + name, tpl, MSGS['parts'] if name == 'e_content_list_print' else MSGS['multi'] if name.startswith('r_loop') else MSGS['user'], True, ev)
    for name, tpl in HF_DRIVER:
        add('probe/' + name, tpl, MSGS['user'], True, {}, jextra={'tools': None, 'documents': None})
    return cases

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('-v', action='store_true', help='print every case')
    ap.add_argument('-k', default=None, help='only cases whose name contains this')
    ap.add_argument('--toy', default=TOY)
    ap.add_argument('--list', action='store_true')
    ap.add_argument('--family', default=None, help='a Python file defining T = {name: chat template} (model families)')
    ap.add_argument('--json', default=None, help='write results to this JSON file')
    a = ap.parse_args()
    globals()['TOY'] = a.toy
    os.environ.setdefault('SOURCE_DATE_EPOCH', '1754400000')  # 2025-08-05 13:20 UTC, for strftime_now
    if a.family:
        scope = {'T': T}
        exec(compile(open(a.family, encoding='utf-8').read(), a.family, 'exec'), scope)
        T.update(scope['T'])
    cases = case_list()
    if a.k: cases = [c for c in cases if a.k in c['name']]
    if a.list:
        for c in cases: print(c['name'])
        return
    def run(ic):
        i, c = ic
        j = render_jinja(c['src'], c['msgs'], c['gen'], c['bos'], c['eos'], c['jextra'])
        t = render_toy(i, c['src'], c['builtin'], c['msgs'], c['gen'], c['bos'], c['eos'], c['extra'], c.get('model'))
        return i, j, t
    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as ex:
        res = sorted(ex.map(run, enumerate(cases)))
    mism = 0; both_err = 0; out = []
    for i, j, t in res:
        c = cases[i]
        if j[0] == 'ERR' and t[0] == 'ERR':
            kind = 'both-error'; both_err += 1
        elif j == t:
            kind = 'match'
        elif j[0] == 'ERR':
            kind = 'TOY-ACCEPTS-JINJA-ERRORS'
        elif t[0] == 'ERR':
            kind = 'TOY-ERRORS'
        else:
            kind = 'OUTPUT-DIFFERS'
        bad = kind not in ('match', 'both-error')
        mism += bad
        out.append(dict(name=c['name'], kind=kind, jinja=j, toy=t, template=c['src'] if c['name'].startswith('probe/') else None))
        if bad or a.v:
            print('=== %s [%s]' % (c['name'], kind))
            if c['name'].startswith('probe/'): print('  template: %r' % c['src'])
            if j[0] == 'OK' and t[0] == 'OK' and j != t and len(j[1]) + len(t[1]) > 400:
                # show first difference only
                k = next((x for x in range(min(len(j[1]), len(t[1]))) if j[1][x] != t[1][x]), min(len(j[1]), len(t[1])))
                print('  first diff at %d' % k)
                print('  jinja2: ...%r' % j[1][max(0, k - 80):k + 120])
                print('  toy   : ...%r' % t[1][max(0, k - 80):k + 120])
            else:
                print('  jinja2: %s %r' % j)
                print('  toy   : %s %r' % t)
    if a.json:
        json.dump(out, open(a.json, 'w'), indent=1, ensure_ascii=False)
    print('%d cases, %d mismatches (%d both-error agreements)' % (len(cases), mism, both_err))

if __name__ == '__main__':
    main()
