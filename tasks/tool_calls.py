"""The tool-call world of Skill Self-Play (skill_selfplay.py --family tool): tasks, checker, validators, BFCL.

A task is {"tools": [schema], "dialogue": [{"role", "content"}], "call": {"name", "arguments"}}: x = tools +
dialogue (what the solver sees, tool_messages), c = call (the hidden contract). Here:
- the solver's prompt (tool_messages) and the reply format (<tool_call>{json}</tool_call>, TOOL_FORMAT);
- the checker: the global schema check of Eq. 4 (tool_schema_error), the call parser and the one call equality
  of Eq. 4 and Eq. 14 (parse_tool_calls, call_key);
- the package validator language ν (TOOL_VALIDATOR_KEYS, tool_contract_error), a package's integrity on its
  own example (tool_package_error) and the ν derived from an inducing record (derive_tool_validator);
- the proposal format: its text for the proposer (TOOL_TASK_SPEC) and its JSON schema (TOOL_TASK_SCHEMA,
  --proposer-grammar);
- the scripted tasks of the solver warm-up (scripted_tool_tasks);
- the held-out BFCL categories (bfcl-eval package) with BFCL's own AST checker (load_bfcl ... score_bfcl), the
  held-out evaluation (evaluate_bfcl) and its per-category intervals (bfcl_by_category, print_bfcl_intervals).
Model output is hostile input: no JSON value makes a checker here raise.
"""
import collections
import copy
import json
import math
import os
import random
import re
import sys

import numpy as np

from plumbing import gather_objects, read_items, tag_blocks, usable_value
from stats import compare, wilson_ci

# ----- the solver's prompt and the reply format -----

# a filled-in call, not placeholders: SmolLM2-135M copies "<argument name>: <value>" literally
TOOL_FORMAT = ("Reply with exactly one tool call: the tool's name and its arguments as JSON inside "
               '<tool_call> tags. For example, for a tool "get_weather" with a string parameter '
               '"city":\n'
               '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')


def tool_messages(tools, dialogue):
    """Chat messages the solver sees for a tool task (x): system = tools, user = dialogue."""
    system = ("You are a function-calling assistant. Available tools (JSON schemas):\n"
              + "\n".join(json.dumps(t) for t in tools) + "\n" + TOOL_FORMAT)
    turns = "\n".join(f"<{d['role']}> {d['content']}" for d in dialogue)
    return [{"role": "system", "content": system},
            {"role": "user",
             "content": turns + "\nBased on the conversation above, make exactly one tool call."}]

# ----- checker: global schema (Eq. 4) and call equality (Eq. 4, 14) -----

TOOL_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
              "array": list, "object": dict}


def parse_tool_calls(text):
    """All parseable <tool_call>{"name", "arguments"}</tool_call> blocks in text (plumbing.usable_value: JSON
    that would break the code reading it does not parse)."""
    calls = []
    for body in (m.group(1) for m in tag_blocks(text, "tool_call")):  # not quadratic in a flood of tags
        try:
            obj = json.loads(body.strip())
        except (ValueError, RecursionError):
            continue
        if (isinstance(obj, dict) and usable_value(obj) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("arguments", {}), dict)):
            calls.append({"name": obj["name"], "arguments": obj.get("arguments", {})})
    return calls


def _canon_arg(v):
    """An argument value up to JSON spelling: integral floats as integers (1.0 ≡ 1); booleans stay
    booleans."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list):
        return [_canon_arg(x) for x in v]
    if isinstance(v, dict):
        return {k: _canon_arg(x) for k, x in v.items()}
    return v


def call_key(call):
    """Canonical string of a call: the one equality used by ExactCall (Eq. 14) and by the probes' majority
    vote (Eq. 4). Argument order is ignored, 1 ≡ 1.0, but True ≢ 1 and "1" ≢ 1 (Python's == would say True ==
    1.0)."""
    return None if call is None else json.dumps([call["name"], _canon_arg(call["arguments"])], sort_keys=True)


def type_ok(value, typ):
    if typ not in TOOL_TYPES:
        return False
    if typ in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TOOL_TYPES[typ])


def tool_schema_error(task):
    """Global schema compliance of a proposed tool task (first part of Eq. 4)."""
    if not isinstance(task, dict):
        return "task is not a JSON object"
    tools, dialogue, call = task.get("tools"), task.get("dialogue"), task.get("call")
    if not isinstance(tools, list) or not tools:
        return "tools must be a non-empty list"
    by_name = {}
    for t in tools:
        if (not isinstance(t, dict) or not isinstance(t.get("name"), str)
                or not re.fullmatch(r"[A-Za-z_][\w.\-]{0,63}", t["name"])):
            return f"bad tool {str(t)[:80]}"
        params = t.get("parameters", {})
        props = params.get("properties", {}) if isinstance(params, dict) else None
        if not isinstance(props, dict) or not all(
                isinstance(s, dict) and isinstance(s.get("type"), str) and s["type"] in TOOL_TYPES
                and isinstance(s.get("enum", []), list) for s in props.values()):
            return f"tool {t['name']} has bad parameters"
        required = params.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) and r in props for r in required):
            return f"tool {t['name']} requires unknown parameters"
        if t["name"] in by_name:
            return f"tool {t['name']} listed twice"
        by_name[t["name"]] = t
    if not isinstance(dialogue, list) or not dialogue or not all(
            isinstance(d, dict) and d.get("role") in ("user", "assistant", "observation")
            and isinstance(d.get("content"), str) and d["content"].strip() for d in dialogue):
        return "dialogue must be a non-empty list of {role: user|assistant|observation, content}"
    if dialogue[0]["role"] != "user":
        return "dialogue must start with the user"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or call["name"] not in by_name \
            or not isinstance(call.get("arguments"), dict):
        return "call must name a listed tool and give an arguments object"
    params = by_name[call["name"]].get("parameters", {})
    props = params.get("properties", {})
    for arg, value in call["arguments"].items():
        if arg not in props:
            return f"argument {arg!r} is not in the schema"
        if not type_ok(value, props[arg]["type"]):
            return f"argument {arg!r} is not of type {props[arg]['type']}"
        if "enum" in props[arg] and value not in props[arg]["enum"]:
            return f"argument {arg!r} is not one of its enum values"
    missing = [r for r in params.get("required", []) if r not in call["arguments"]]
    return f"missing required arguments {missing}" if missing else None

# ----- package validators ν -----

TOOL_FORMATS = {"date": r"\d{4}-\d{2}-\d{2}", "time": r"\d{2}:\d{2}",
                "datetime": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?", "email": r"[^@\s]+@[^@\s]+\.\w+"}


TOOL_VALIDATOR_KEYS = {"tool_name": (str, list), "min_tools": int, "min_turns": int, "require_roles": list,
                       "min_args": int, "max_args": int, "arg_formats": dict, "arg_types": dict,
                       "args": dict, "grounded": (str, list), "omitted_optional": int}


def tool_contract_error(task, nu):
    """Package validator ν of a tool package on a schema-valid task (second part of Eq. 4)."""
    call, tools, dialogue = task["call"], task["tools"], task["dialogue"]
    schema = next(t for t in tools if t["name"] == call["name"]).get("parameters", {})
    props, args = schema.get("properties", {}), call["arguments"]
    names = [nu["tool_name"]] if isinstance(nu.get("tool_name"), str) else nu.get("tool_name")
    if names and call["name"] not in names:
        return f"tool must be one of {names}"
    if len(tools) < nu.get("min_tools", 1):
        return f"needs at least {nu['min_tools']} listed tools (distractors)"
    if len(dialogue) < nu.get("min_turns", 1):
        return f"needs at least {nu['min_turns']} dialogue turns"
    roles = {d["role"] for d in dialogue}
    for role in nu.get("require_roles", []):
        if role not in roles:
            return f"dialogue needs a {role} turn"
    if not nu.get("min_args", 0) <= len(args) <= nu.get("max_args", 99):
        return "wrong number of arguments"
    for fmt, k in nu.get("arg_formats", {}).items():
        if fmt not in TOOL_FORMATS:
            return f"unknown format {fmt}"
        if sum(isinstance(v, str) and re.fullmatch(TOOL_FORMATS[fmt], v) is not None
               for v in args.values()) < k:
            return f"needs {k} argument(s) in {fmt} format"
    for typ, k in nu.get("arg_types", {}).items():
        if sum(props.get(a, {}).get("type") == typ for a in args) < k:
            return f"needs {k} argument(s) of type {typ}"
    for a, spec in nu.get("args", {}).items():
        if a not in args:
            return f"argument {a} is required by the package"
        v = args[a]
        if "type" in spec and not type_ok(v, spec["type"]):
            return f"argument {a} must be {spec['type']}"
        if "format" in spec and not (isinstance(v, str) and spec["format"] in TOOL_FORMATS
                                     and re.fullmatch(TOOL_FORMATS[spec["format"]], v)):
            return f"argument {a} must use format {spec['format']}"
        if "min" in spec and not (type_ok(v, "number") and v >= spec["min"]):
            return f"argument {a} must be at least {spec['min']}"
        if "enum" in spec and v not in spec["enum"]:
            return f"argument {a} must be one of {spec['enum']}"
    optional = [p for p in props if p not in schema.get("required", []) and p not in args]
    if len(optional) < nu.get("omitted_optional", 0):
        return f"needs {nu['omitted_optional']} unused optional parameter(s)"
    grounded = nu.get("grounded")
    if grounded:
        text = " ".join(d["content"] for d in dialogue).lower()
        check = [a for a, v in args.items() if isinstance(v, str)] if grounded == "strings" else grounded
        for a in check:
            if a in args and str(args[a]).lower() not in text:
                return f"argument {a} value is not grounded in the dialogue"
    return None


def gate_tool_task(task, nu):
    """The gate of Eq. 4 before the probes, on a proposed tool task: the global schema, then (nu given: the
    skill stream) the package's validator ν. Returns (contract, the gate that rejected it or None, why)."""
    err = tool_schema_error(task)
    if err:
        return None, "schema", err
    err = tool_contract_error(task, nu) if nu is not None else None
    return task["call"], ("contract" if err else None), err or ""

def tool_package_error(pkg):
    """Integrity of a tool package past its keys: known formats, and its own example passes the global schema
    (tool_schema_error) and its validator ν (tool_contract_error)."""
    bad = [k for k in pkg["validator"].get("arg_formats", {}) if k not in TOOL_FORMATS]
    if bad:
        return f"unknown formats {bad}"
    err = tool_schema_error(pkg.get("example")) or tool_contract_error(pkg["example"], pkg["validator"])
    return f"example: {err}" if err else None


def derive_tool_validator(task):
    """ν of a package induced from this task (Eq. 10; difference 7): its tool, at least its tools and turns,
    its non-user roles, and the type of every argument it calls. Returns (ν, None): a tool package has no
    compiler."""
    tool = next(t for t in task["tools"] if t["name"] == task["call"]["name"])
    props = tool["parameters"].get("properties", {})
    return {"tool_name": task["call"]["name"], "min_tools": len(task["tools"]),
            "min_turns": len(task["dialogue"]),
            "require_roles": sorted({d["role"] for d in task["dialogue"]} - {"user"}),
            "args": {a: {"type": props[a]["type"]} for a in task["call"]["arguments"]}}, None

# ----- the proposal format (the proposer's spec, and its JSON schema for --proposer-grammar) -----

TOOL_TASK_SPEC = ('A task is one JSON object with keys "tools" (a list of tool schemas {"name", '
                  '"description", "parameters": {"type": "object", "properties": {arg: {"type": '
                  'string|integer|number|boolean|array|object}}, "required": [...]}}), "dialogue" (a '
                  'list of {"role": "user"|"assistant"|"observation", "content"}, starting with the '
                  'user) and "call" ({"name", "arguments"}: the one correct next tool call).')


# --proposer-grammar: proposals are decoded under a JSON schema (vLLM structured outputs). It fixes the syntax
# and the key layout only; every semantic check of Eq. 4 (tool names, required arguments, distinct values,
# uniqueness, ν, probes) is still skill_selfplay's check_proposal and probe_records.
_TEXT = lambda n: {"type": "string", "minLength": 1, "maxLength": n}


def json_object(required, /, **props):
    """A JSON-schema object with exactly these properties (a property may itself be called "required")."""
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


_PARAM = json_object(["type"], type={"enum": ["string", "integer", "number", "boolean", "array"]},
                     description=_TEXT(80),
                     items=json_object([], type={"enum": ["string", "integer", "number"]}),
                     enum={"type": "array", "items": _TEXT(30), "maxItems": 6})


_TOOL = json_object(["name", "description", "parameters"],
                    name={"type": "string", "pattern": "^[a-z][a-z_]{1,30}$"}, description=_TEXT(60),
                    parameters=json_object(["type", "properties", "required"], type={"const": "object"},
                                           properties={"type": "object", "maxProperties": 4,
                                                       "additionalProperties": _PARAM},
                                           required={"type": "array", "items": _TEXT(30), "maxItems": 4}))


_TURN = json_object(["role", "content"], role={"enum": ["user", "assistant", "observation"]},
                    content=_TEXT(160))


_ARG_VALUE = {"anyOf": [{"type": ["string", "integer", "number", "boolean"]},
                        {"type": "array", "maxItems": 6, "items": {"type": ["string", "integer", "number"]}}]}


_CALL = json_object(["name", "arguments"], name=_TEXT(40),
                    arguments={"type": "object", "maxProperties": 4, "additionalProperties": _ARG_VALUE})


TOOL_TASK_SCHEMA = json_object(["tools", "dialogue", "call"],
                               tools={"type": "array", "minItems": 1, "maxItems": 4, "items": _TOOL},
                               dialogue={"type": "array", "minItems": 1, "maxItems": 5, "items": _TURN},
                               call=_CALL)

# ----- scripted tool tasks of the solver warm-up -----

# --solver-sft-steps (difference 14): a small bank of tools, each with a request template that states every
# argument literally, so the reference call copies the values.
def _tool(name, description, props, required):
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}


_S, _I = {"type": "string"}, {"type": "integer"}


SCRIPTED_TOOLS = [  # (tool, request template, value pools)
    (_tool("get_forecast", "Weather forecast for a city.",
           {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
     "What will the weather be in {city}? Give it in {unit}.",
     {"city": ["Lyon", "Osaka", "Quito", "Perth", "Bergen", "Austin"], "unit": ["celsius", "fahrenheit"]}),
    (_tool("text_friend", "Send a short text to a contact.", {"contact": _S, "text": _S},
           ["contact", "text"]),
     "Text {contact} that {text}.",
     {"contact": ["Ana", "Tomas", "Mei", "Omar", "Lena"],
      "text": ["dinner is at eight", "the train is late", "I found the keys"]}),
    (_tool("order_pizza", "Order pizzas for delivery.",
           {"size": {"type": "string", "enum": ["small", "medium", "large"]}, "count": _I},
           ["size", "count"]),
     "Order {count} {size} pizzas, please.", {"size": ["small", "medium", "large"], "count": [1, 2, 3, 5]}),
    (_tool("play_song", "Play a song by title.", {"title": _S}, ["title"]), "Play the song {title}.",
     {"title": ["Blue Sky", "River Road", "Night Owl", "Paper Moon"]}),
    (_tool("set_alarm", "Set an alarm clock.", {"time": _S}, ["time"]), "Wake me up at {time}.",
     {"time": ["06:30", "07:15", "05:45", "08:00"]}),
    (_tool("book_taxi", "Book a taxi ride.", {"pickup": _S, "dropoff": _S}, ["pickup", "dropoff"]),
     "Get me a taxi from {pickup} to {dropoff}.", {"pickup": ["the hotel", "Pine Street 4", "the museum"],
                                                  "dropoff": ["the airport", "Oak Avenue 9", "the stadium"]}),
    (_tool("lookup_word", "Dictionary definition of a word.", {"word": _S}, ["word"]),
     "What does the word {word} mean?",
     {"word": ["serendipity", "ephemeral", "laconic", "zenith"]}),
    (_tool("pay_bill", "Pay a bill from the user's account.", {"biller": _S, "amount": _I},
           ["biller", "amount"]),
     "Pay {amount} dollars to {biller}.",
     {"biller": ["City Water", "PowerCo", "NetFast"], "amount": [40, 75, 120, 300]}),
]


def scripted_tool_tasks(rng, n):
    """n tool tasks from SCRIPTED_TOOLS: one requested tool among 2-3 listed, the request naming every
    argument."""
    tasks = []
    for _ in range(n):
        picked = rng.sample(SCRIPTED_TOOLS, rng.randint(2, 3))
        tool, template, pools = picked[0]
        args = {k: rng.choice(v) for k, v in pools.items()}
        tools = [t for t, _, _ in picked]
        rng.shuffle(tools)
        tasks.append({"tools": tools, "dialogue": [{"role": "user", "content": template.format(**args)}],
                      "call": {"name": tool["name"], "arguments": args}})
    return tasks

# ----- BFCL held-out data (bfcl-eval package) and BFCL's own AST checker -----

BFCL_CATEGORIES = ["simple_python", "simple_java", "simple_javascript", "live_simple"]


def bfcl_data_dir():
    import importlib.util
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bfcl-eval is not installed: pip install --no-deps bfcl-eval "
                         "(see requirements-nodeps.txt)")
    return os.path.join(spec.submodule_search_locations[0], "data")


def load_bfcl(category, n=0, seed=None):
    """[(entry, ground_truth)] for a BFCL category; n > 0 keeps n of them: the first n, or with a seed n drawn
    at random in file order (so two runs with one seed score the same items, and seeds draw other items)."""
    d = bfcl_data_dir()
    with open(os.path.join(d, f"BFCL_v4_{category}.json")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(d, "possible_answer", f"BFCL_v4_{category}.json")) as f:
        answers = {a["id"]: a["ground_truth"] for a in map(json.loads, filter(str.strip, f))}
    items = [(e, answers[e["id"]]) for e in entries if e["id"] in answers]
    if n and seed is not None and n < len(items):
        keep = sorted(random.Random(f"bfcl-{category}-{seed}").sample(range(len(items)), n))
        return [items[i] for i in keep]
    return items[:n] if n else items


def bfcl_language(category):
    if category.endswith("_java"):
        return "java"
    return "javascript" if category.endswith("javascript") else "python"


def bfcl_messages(entry, category):
    """BFCL prompt in our tool format, with BFCL's language-specific doc hints (bfcl_eval/utils.py:
    _func_doc_language_specific_pre_processing)."""
    lang, tools = bfcl_language(category), copy.deepcopy(entry["function"])
    hint = {"java": " Note that the provided function is in Java 8 SDK syntax.",
            "javascript": " Note that the provided function is in JavaScript syntax."}.get(
        lang, " Note that the provided function is in Python 3 syntax.")
    for t in tools:
        t["description"] = t.get("description", "") + hint
        if lang != "python":
            for name, spec in t["parameters"]["properties"].items():
                what = "Java" if lang == "java" else "JavaScript"
                spec["description"] = spec.get("description", "") + (
                    f" This parameter can be of any type of {what} object in string representation."
                    if spec["type"] == "any" else
                    f" This is {what} {spec['type']} type parameter in string representation.")
                spec["type"] = "string"
    dialogue = [m for m in entry["question"][0] if m["role"] in ("user", "system")]
    system = ("You are a function-calling assistant. Available tools (JSON schemas):\n"
              + "\n".join(json.dumps(t) for t in tools) + "\n" + TOOL_FORMAT)
    sys_extra = "\n".join(m["content"] for m in dialogue if m["role"] == "system")
    user = "\n".join(m["content"] for m in dialogue if m["role"] == "user")
    return [{"role": "system", "content": system + ("\n" + sys_extra if sys_extra else "")},
            {"role": "user", "content": user}]


def bfcl_official_checker():
    """BFCL's own AST checker module (bfcl_eval/eval_checker/ast_eval/ast_checker.py), used as is.

    Shim: that module imports MODEL_CONFIG_MAPPING from bfcl_eval.constants.model_config, which imports every
    vendor SDK (bfcl-eval is installed with --no-deps, so they are absent). The checker reads the mapping only
    in convert_func_name, to rename "." to "_" in function names for models whose API forbids dots; our
    answers keep the names as given. So a stand-in module holding only that mapping is registered before the
    import (unless the real module is already loaded), and the checker's mapping answers "no renaming" for any
    model."""
    import importlib
    import types
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].MODEL_CONFIG_MAPPING = {}
    checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    no_renaming = lambda: types.SimpleNamespace(underscore_to_dot=False)
    checker.MODEL_CONFIG_MAPPING = collections.defaultdict(no_renaming)
    return checker


def bfcl_decode(text):
    """The calls of a reply as BFCL's checker takes them ([{name: arguments}]), or None when a <tool_call>
    block does not decode (a BFCL handler's decode failure: the item is wrong, the block is not silently
    dropped)."""
    blocks = list(tag_blocks(text, "tool_call"))
    calls = parse_tool_calls(text)
    return [{c["name"]: c["arguments"]} for c in calls] if calls and len(calls) == len(blocks) else None


def bfcl_check(calls, func, ground_truth, category):
    """BFCL's verdict on decoded calls (bfcl_decode) for a simple-category item: (ok, reason). The official
    checker decides (simple_function_checker: exactly one call, names, required and unexpected parameters,
    Python types with BFCL's variable rule, Java/JS values through its converters, accepted value lists with
    its string standardisation). A model value it cannot handle makes it raise; that is a wrong answer."""
    if not calls:
        return False, "no decodable call"
    A = bfcl_official_checker()
    from bfcl_eval.constants.enums import Language
    lang = {"java": Language.JAVA, "javascript": Language.JAVASCRIPT}.get(bfcl_language(category),
                                                                         Language.PYTHON)
    try:
        out = A.ast_checker([func], calls, ground_truth, lang, category, "nanoskill")
    except Exception as e:  # e.g. a Java/JS string its converter cannot parse
        return False, f"BFCL's checker raised {type(e).__name__}"
    return bool(out["valid"]), "ok" if out["valid"] else str(out.get("error_type"))


def bfcl_gold_call(ground_truth):
    """A reference call of a BFCL item ({"name", "arguments"}): each argument's first accepted value (a dict's
    own arguments likewise), optional ones (first accepted value "") left out."""
    def first(accepted):
        v = accepted[0]
        return {k: first(a) for k, a in v.items() if a and a[0] != ""} if isinstance(v, dict) else v
    (name, args), = ground_truth[0].items()
    return {"name": name, "arguments": {k: first(a) for k, a in args.items() if a and a[0] != ""}}


def call_budget(tok, calls, floor):
    """Token budget of a tool-call answer: `floor`, raised until the longest reference call among `calls` fits
    as <tool_call>{json}</tool_call>, plus a quarter for other tokenisations and EOS (as grid_budget)."""
    text = lambda c: "<tool_call>" + json.dumps(c) + "</tool_call>"
    longest = max(len(tok.encode(text(c), add_special_tokens=False)) for c in calls)
    return max(floor, math.ceil(1.25 * longest) + 1)


def score_bfcl(data, replies, category):
    """The held-out instrument (Table 1): BFCL's verdict on every reply (replies[i]: the replies to item i of
    data, load_bfcl's). Returns (the category's accuracy over all replies = avg@k, per-item records)."""
    hits, items = [], []
    for i, (e, gt) in enumerate(data):
        ok = [bfcl_check(bfcl_decode(text), e["function"][0], gt, category)[0] for text in replies[i]]
        items.append({"category": category, "id": e["id"], "hits": sum(ok), "n": len(ok),
                      "answers": replies[i]})
        hits += ok
    return float(np.mean(hits)) if hits else 0.0, items


# ----- the held-out evaluation: BFCL accuracy by category (Table 1) -----

def evaluate_bfcl(sampler, prompt_of, budget_of, args, dist, prefix="", stop=None):
    """BFCL accuracy per category (avg@k, score_bfcl) and their unweighted mean; items sharded over ranks,
    replies gathered. prompt_of(messages), budget_of(reference calls), prefix, stop: the solver's decoding.
    Returns (res, items)."""
    res, items = {}, []
    for cat in BFCL_CATEGORIES:
        data = load_bfcl(cat, args.eval_n, args.data_seed)  # --eval-n items per category, drawn per data seed
        mine = list(range(dist.rank, len(data), dist.world))
        prompts = [prompt_of(bfcl_messages(data[i][0], cat)) for i in mine]
        budget = budget_of([bfcl_gold_call(gt) for _, gt in data]) if data else args.max_new_tokens
        outs = sampler.generate(prompts, args.eval_samples, budget, args.eval_temperature,
                                stop=stop) if prompts else []
        replies = dict(gather_objects([(i, [prefix + s.text for s in samples])
                                       for i, samples in zip(mine, outs)], dist))
        res[f"bfcl_{cat}"], cat_items = score_bfcl(data, replies, cat)  # BFCL's own AST checker, avg@k
        items += cat_items
    res["bfcl_avg"] = float(np.mean([res[f"bfcl_{c}"] for c in BFCL_CATEGORIES]))
    return res, items


def bfcl_by_category(items):
    """A row's BFCL accuracy per category from its saved items: acc, hits, n and the Wilson 95 % interval."""
    out = {}
    for cat in BFCL_CATEGORIES:
        k, n = sum(it["hits"] for it in items if it["category"] == cat), sum(
            it["n"] for it in items if it["category"] == cat)
        out[cat] = {"acc": k / n if n else None, "hits": k, "n": n,
                    "ci95": wilson_ci(k, n) if n else None}
    return out


def print_bfcl_intervals(results):
    """BFCL accuracy per category and row with its Wilson 95 % interval."""
    if results.get("bfcl"):
        print("BFCL per category, % [Wilson 95 % CI] (hits/n)")
    for name, cats in results.get("bfcl", {}).items():
        print(name.ljust(12) + "  ".join(
            f"{c.replace('simple_', '')}: {100 * v['acc']:.1f} [{100 * v['ci95'][0]:.1f}, "
            f"{100 * v['ci95'][1]:.1f}] ({v['hits']}/{v['n']})" for c, v in cats.items() if v["n"]))


def bfcl_headline(run_dir, rows, arm, results):
    """skill_selfplay's held-out comparisons, paired over BFCL items: the warm-up ("solver SFT") and the last
    row (rows[-1]) vs base, all items (the headline), then each category. Fills results' bfcl (per row and
    category), final_items and final_ids; returns the entries."""
    last, headline = rows[-1], []
    results["bfcl"] = {name: bfcl_by_category(read_items(run_dir, name)) for name in rows}
    final = [it for it in read_items(run_dir, last) if it["n"]]
    results["final_items"] = {"BFCL simple": [it["hits"] / it["n"] for it in final]}
    results["final_ids"], base = [it["id"] for it in final], read_items(run_dir, "base")
    for name in [h for h in rows[1:] if h in ("solver SFT", last)]:
        items, which = read_items(run_dir, name), "last iteration" if name == last else "warm-up"
        for cat in ["simple"] + BFCL_CATEGORIES:
            keep = lambda its: [it for it in its if it["n"] and cat in ("simple", it["category"])]
            acc = lambda its: [it["hits"] / it["n"] for it in keep(its)]
            headline.append(compare(f"BFCL {cat}, {arm}: {which} vs base", f"{arm} {name}", "base",
                                    acc(items), acc(base), item_ids=[it["id"] for it in keep(items)],
                                    primary=name == last and cat == "simple"))
    return headline
