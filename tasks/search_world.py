"""The world of TalentRL (talentrl.py): an offline stand-in for Search7, the seven QA benchmarks the paper
searches with Search-R1's protocol. A seeded fictional encyclopedia (people, works, towns, organisations,
events, hamlets), one passage per entity, seven question types mixed into seven splits named after Search7's,
a dense retriever (MiniLM), the SkillBank and talent catalog in SkillRL's JSON formats, the search
environment (`<search>`, `<information>`, `<answer>`, exact-match reward), phase I's scripted teacher, the
question templates (`template_of`), the SFT/RL pools with templates held out (`split_pools`), and the routers
that need no training with a scorer of any router against the teacher's c* (`no_training_routers`,
`routing_accuracy`).

    W = World(args, load_embedder())            # corpus, retriever, questions, SkillBank 𝒮, talents 𝒯
    ep = new_episode(W.questions["nq"]["test"][0])
    env_reply(ep, "<search>Velm</search>", W.search, 4)   # the observation, or None when the episode ends
    episode_return(ep, 0.0)                     # R(τ): exact match minus a penalty per invalid action

Every fact is invented, so a policy cannot answer from memory and has to search.
"""
import collections
import json
import random
import re
import string
import warnings
import zlib
from pathlib import Path

import torch

from grpo import Rollout
from plumbing import tag_blocks

DATA = Path(__file__).resolve().parent.parent / "data" / "talentrl"


# --- rewards: SQuAD / Search-R1 exact match and F1 ---
def normalize_answer(s):
    """SQuAD / Search-R1 normalisation: lower case, no punctuation, no articles."""
    s = s.lower()
    s = s.translate(str.maketrans("", "", string.punctuation))  # a set rebuilt per character: slow on 1 MB
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(pred, gold):
    return float(pred is not None and normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred, gold):
    p, g = normalize_answer(pred or "").split(), normalize_answer(gold).split()
    common = sum((collections.Counter(p) & collections.Counter(g)).values())  # p.count(w) per w was quadratic
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def episode_return(ep, invalid_penalty):
    """R(τ): exact match of the normalised answer minus a penalty per invalid action."""
    return exact_match(ep["pred"], ep["task"]["answer"]) - invalid_penalty * ep["n_invalid"]


# --- the search environment (Search-R1's protocol) ---
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
INVALID_MSG = ("\nMy previous action is invalid. If I want to search, I should put the query "
               "between <search> and </search>. If I want to give the final answer, I should "
               "put the answer between <answer> and </answer>. Let me try again.\n")


def parse_action(text):
    """First `<search>q</search>` or `<answer>a</answer>` in a turn (Search-R1), else (None, None):
    ACTION_RE's first match, found as the first block of each tag (plumbing.tag_blocks: ACTION_RE retried
    every opening tag to the end of the text, quadratic in a flood of them)."""
    text = text or ""
    firsts = [(m.start(), tag, m.group(1)) for tag in ("search", "answer")
              if (m := next(tag_blocks(text, tag), None))]
    if not firsts:
        return None, None
    _, action, content = min(firsts)
    return (action, content.strip()) if content.strip() else (None, None)


def new_episode(task):
    return dict(task=task, turns=0, n_search=0, n_invalid=0, pred=None, done=False)


def env_reply(ep, text, search_fn, max_steps):
    """One environment step of the search protocol: returns the observation to
    insert (environment tokens, masked out of the loss) or None when the episode
    ends (an answer, or the step budget is spent). Malformed actions are
    penalised through n_invalid, never fatal."""
    ep["turns"] += 1
    action, content = parse_action(text)
    if action == "answer":
        ep["pred"], ep["done"] = content, True
        return None
    if action == "search":
        ep["n_search"] += 1
        docs = search_fn(content)
        obs = ("\n<information>" + " ".join(f"Doc {i + 1}: {d['text']}" for i, d in enumerate(docs))
               + "</information>\n")
    else:
        ep["n_invalid"] += 1
        obs = INVALID_MSG
    if ep["turns"] >= max_steps:
        ep["done"] = True
        return None
    return obs


# --- the world: a seeded fictional encyclopedia ---
# A seeded fictional encyclopedia. Every fact is invented, so the policy cannot
# answer from memory and has to search (Search7's corpora are not offline).

COUNTRIES = ["Dalmiria", "Ostrevia", "Kelvany", "Murosia", "Tessaly", "Varnholt"]
OCCUPATIONS = {"novelist": "novel", "director": "film", "composer": "album",
               "painter": "painting", "architect": "building", "poet": "poem collection"}
SYL = ["bra", "vel", "or", "quen", "tal", "mir", "dro", "sa", "lin", "kor", "ev",
       "an", "thi", "zu", "pel", "ros", "ka", "nor", "ith", "gal", "ume", "fen",
       "ost", "ray", "dun", "cel", "ia", "mo", "res", "vik"]
PLACE_SUFFIX = ["worth", "holm", "ford", "mere", "ton", "gard", "wick", "stead"]
TITLE_ADJ = ["Amber", "Silent", "Hollow", "Crimson", "Northern", "Glass", "Iron",
             "Distant", "Pale", "Winter", "Quiet", "Burning", "Seventh", "Lost"]
TITLE_NOUN = ["Lantern", "Harbour", "Orchard", "Meridian", "Choir", "Atlas",
              "Bridge", "Tide", "Garden", "Compass", "Archive", "Falcon", "Vessel"]
ORG_KIND = ["Institute", "Society", "Company", "Guild", "Academy", "Foundation"]
EVENT_KIND = ["Accord", "Exhibition", "Congress", "Regatta", "Games", "Summit"]
RIVERS = ["Osk", "Velm", "Turra", "Brenn", "Iselle", "Quor", "Maddow", "Fenn"]


def _word(rng, n_syl):
    return "".join(rng.choice(SYL) for _ in range(n_syl)).capitalize()


def build_world(seed, n_people=40, n_places=16, n_orgs=10, n_events=8,
                n_hamlets=10, n_shared=4):
    """Entities as plain dicts keyed by id; names are unique except for the
    `n_shared` deliberate name collisions (people with the same name and a
    different occupation), which the disambiguation questions use."""
    rng = random.Random(seed)
    used = set()

    def fresh(make):
        for _ in range(1000):
            name = make()
            if name.lower() not in used:
                used.add(name.lower())
                return name
        raise RuntimeError("name space exhausted; lower the world size")

    places = [dict(id=f"place{i}", type="place",
                   name=fresh(lambda: _word(rng, 2) + rng.choice(PLACE_SUFFIX)),
                   country=rng.choice(COUNTRIES), founded=rng.randint(800, 1850),
                   population=rng.randint(2000, 900000)) for i in range(n_places)]
    people = []
    for i in range(n_people):
        occ = rng.choice(sorted(OCCUPATIONS))
        people.append(dict(id=f"person{i}", type="person",
                           name=fresh(lambda: f"{_word(rng, 2)} {_word(rng, 2)}"),
                           occupation=occ, born=rng.randint(1820, 1980),
                           birthplace=rng.choice(places)["id"], shared=False))
    # deliberate homonyms: same name, different occupation, year and birthplace
    for j in range(n_shared):
        src = people[j]
        src["shared"] = True
        occ = rng.choice(sorted(set(OCCUPATIONS) - {src["occupation"]}))
        born = rng.choice([y for y in range(1820, 1981) if abs(y - src["born"]) > 5])
        bp = rng.choice([p["id"] for p in places if p["id"] != src["birthplace"]])
        people.append(dict(id=f"person{n_people + j}", type="person", name=src["name"],
                           occupation=occ, born=born, birthplace=bp, shared=True))
    works = []
    for p in people:
        years = rng.sample(range(p["born"] + 20, p["born"] + 75), rng.randint(1, 3))
        for y in sorted(years):
            works.append(dict(id=f"work{len(works)}", type="work",
                              name=fresh(lambda: f"The {rng.choice(TITLE_ADJ)} {rng.choice(TITLE_NOUN)}"
                                         if rng.random() < 0.5 else
                                         f"The {rng.choice(TITLE_NOUN)} of {_word(rng, 2)}"),
                              kind=OCCUPATIONS[p["occupation"]], year=y, creator=p["id"]))
    orgs = [dict(id=f"org{i}", type="org",
                 name=fresh(lambda: f"{_word(rng, 2)} {rng.choice(ORG_KIND)}"),
                 founded=rng.randint(1850, 2010), hq=rng.choice(places)["id"],
                 founder=rng.choice([p["id"] for p in people if not p["shared"]]))
            for i in range(n_orgs)]
    events = [dict(id=f"event{i}", type="event",
                   name=fresh(lambda: f"{_word(rng, 2)} {rng.choice(EVENT_KIND)}"),
                   year=rng.randint(1850, 2020), location=rng.choice(places)["id"])
              for i in range(n_events)]
    # long-tail entities: mentioned in exactly one passage, with rare attributes
    hamlets = [dict(id=f"hamlet{i}", type="hamlet",
                    name=fresh(lambda: _word(rng, 3)), near=rng.choice(places)["id"],
                    river=rng.choice(RIVERS), elevation=rng.randint(40, 2400))
               for i in range(n_hamlets)]
    return {e["id"]: e for e in places + people + works + orgs + events + hamlets}


def render_passages(world):
    """One short encyclopedia passage per entity, `Title. text` (Search-R1 style)."""
    W, out = world, []
    for e in world.values():
        t = e["type"]
        if t == "person":
            bp = W[e["birthplace"]]
            made = [w["name"] for w in world.values() if w["type"] == "work" and w["creator"] == e["id"]]
            art = "an" if e["occupation"][0] in "aeiou" else "a"
            text = (f"{e['name']} ({e['occupation']}). {e['name']} was {art} {e['occupation']} born in "
                    f"{e['born']} in {bp['name']}, {bp['country']}. Known works: {', '.join(made)}.")
        elif t == "work":
            c = W[e["creator"]]
            text = (f"{e['name']}. {e['name']} is {'an' if e['kind'][0] in 'aeiou' else 'a'} {e['kind']} "
                    f"released in {e['year']} by the {c['occupation']} {c['name']}.")
        elif t == "place":
            text = (f"{e['name']}. {e['name']} is a town in {e['country']}, founded in {e['founded']}. "
                    f"It has a population of {e['population']}.")
        elif t == "org":
            text = (f"{e['name']}. The {e['name']} was founded in {e['founded']} by "
                    f"{W[e['founder']]['name']} and is headquartered in {W[e['hq']]['name']}.")
        elif t == "event":
            text = f"{e['name']}. The {e['name']} took place in {e['year']} in {W[e['location']]['name']}."
        else:
            text = (f"{e['name']}. {e['name']} is a small hamlet near {W[e['near']]['name']} on the "
                    f"{e['river']} river, at an elevation of {e['elevation']} metres.")
        out.append(dict(id=e["id"], text=text))
    return out


# Question generators by type. Each returns (question, answer, support ids) or
# None when the sampled entities cannot give a question with a unique answer.
def _of(world, t, rng, cond=lambda e: True):
    pool = [e for e in world.values() if e["type"] == t and cond(e)]
    return rng.choice(pool) if pool else None


def q_single(world, rng):
    kind = rng.choice(["born", "birthplace", "creator", "hq", "country", "event"])
    if kind in ("born", "birthplace"):
        p = _of(world, "person", rng, lambda e: not e["shared"])
        if kind == "born":
            return f"In what year was {p['name']} born?", str(p["born"]), [p["id"]]
        return f"Where was {p['name']} born?", world[p["birthplace"]]["name"], [p["id"]]
    if kind == "creator":
        w = _of(world, "work", rng)
        return f"Who created the {w['kind']} {w['name']}?", world[w["creator"]]["name"], [w["id"]]
    if kind == "hq":
        o = _of(world, "org", rng)
        return f"Where is the {o['name']} headquartered?", world[o["hq"]]["name"], [o["id"]]
    if kind == "country":
        p = _of(world, "place", rng)
        return f"In which country is the town of {p['name']}?", p["country"], [p["id"]]
    e = _of(world, "event", rng)
    return f"Where did the {e['name']} take place?", world[e["location"]]["name"], [e["id"]]


def q_constrained(world, rng):
    # the constraint (year) selects one of several works of the same creator
    works = [w for w in world.values() if w["type"] == "work"]
    by = {}
    for w in works:
        by.setdefault(w["creator"], []).append(w)
    cands = [ws for c, ws in by.items() if len(ws) >= 2 and not world[c]["shared"]]
    if not cands:
        return None
    ws = rng.choice(cands)
    w = rng.choice(ws)
    c = world[w["creator"]]
    return (f"Which {w['kind']} by {c['name']} was released in {w['year']}?", w["name"],
            [c["id"], w["id"]])


def q_bridge(world, rng):
    kind = rng.choice(["creator_birthplace", "founder_born", "event_country"])
    if kind == "creator_birthplace":
        w = _of(world, "work", rng, lambda e: not world[e["creator"]]["shared"])
        c = world[w["creator"]]
        return (f"Where was the creator of the {w['kind']} {w['name']} born?",
                world[c["birthplace"]]["name"], [w["id"], c["id"]])
    if kind == "founder_born":
        o = _of(world, "org", rng)
        f = world[o["founder"]]
        return f"In what year was the founder of the {o['name']} born?", str(f["born"]), [o["id"], f["id"]]
    e = _of(world, "event", rng)
    loc = world[e["location"]]
    return f"In which country did the {e['name']} take place?", loc["country"], [e["id"], loc["id"]]


def q_comparison(world, rng):
    kind = rng.choice(["born", "founded", "population"])
    t, key = {"born": ("person", "born"), "founded": ("org", "founded"),
              "population": ("place", "population")}[kind]
    if rng.random() < 0.25:  # through a bridge on each side (2Wiki's compositional comparisons)
        ws = [w for w in world.values() if w["type"] == "work" and not world[w["creator"]]["shared"]]
        a, b = rng.sample(ws, 2)
        ca, cb = world[a["creator"]], world[b["creator"]]
        if ca["born"] == cb["born"]:
            return None
        return (f"Whose creator was born first, {a['name']} or {b['name']}?",
                (a if ca["born"] < cb["born"] else b)["name"],
                [a["id"], b["id"], ca["id"], cb["id"]])
    pool = [e for e in world.values() if e["type"] == t and not e.get("shared")]
    a, b = rng.sample(pool, 2)
    if a[key] == b[key]:
        return None
    if kind == "born":
        q, win = f"Who was born first, {a['name']} or {b['name']}?", min(a, b, key=lambda e: e[key])
    elif kind == "founded":
        q, win = (f"Which was founded earlier, the {a['name']} or the {b['name']}?",
                  min(a, b, key=lambda e: e[key]))
    else:
        q, win = (f"Which town has the larger population, {a['name']} or {b['name']}?",
                  max(a, b, key=lambda e: e[key]))
    return q, win["name"], [a["id"], b["id"]]


def q_temporal(world, rng):
    kind = rng.choice(["age", "gap", "population"])
    if kind == "age":
        w = _of(world, "work", rng, lambda e: not world[e["creator"]]["shared"])
        c = world[w["creator"]]
        return (f"How old was the creator of {w['name']} in the year it was released?",
                str(w["year"] - c["born"]), [w["id"], c["id"]])
    if kind == "gap":
        o = _of(world, "org", rng)
        return (f"How many years after the founding of its headquarters town was the {o['name']} founded?",
                str(o["founded"] - world[o["hq"]]["founded"]), [o["id"], o["hq"]])
    p = _of(world, "place", rng)
    return f"What is the population of {p['name']}?", str(p["population"]), [p["id"]]


def q_disambiguation(world, rng):
    p = _of(world, "person", rng, lambda e: e["shared"])
    if p is None:
        return None
    if rng.random() < 0.5:
        return (f"In what year was {p['name']}, the {p['occupation']}, born?", str(p["born"]), [p["id"]])
    return (f"Where was {p['name']}, the {p['occupation']}, born?", world[p["birthplace"]]["name"], [p["id"]])


def q_longtail(world, rng):
    h = _of(world, "hamlet", rng)
    if rng.random() < 0.5:
        return f"Which river flows past the hamlet of {h['name']}?", h["river"], [h["id"]]
    return f"At what elevation, in metres, lies the hamlet of {h['name']}?", str(h["elevation"]), [h["id"]]


QTYPES = {"single": q_single, "constrained": q_constrained, "bridge": q_bridge,
          "comparison": q_comparison, "temporal": q_temporal,
          "disambiguation": q_disambiguation, "longtail": q_longtail}
# Seven splits mirroring Search7's single-hop (NQ, TriviaQA, PopQA) / multi-hop
# (HotpotQA, 2Wiki, MuSiQue, Bamboogle) mix: split -> {question type: weight}.
SPLITS = {
    "nq": {"single": 0.5, "temporal": 0.3, "constrained": 0.2},
    "triviaqa": {"single": 0.5, "constrained": 0.5},
    "popqa": {"longtail": 0.7, "single": 0.3},
    "hotpotqa": {"bridge": 0.6, "comparison": 0.4},
    "2wiki": {"comparison": 0.5, "bridge": 0.3, "temporal": 0.2},
    "musique": {"bridge": 0.8, "disambiguation": 0.2},
    "bamboogle": {"bridge": 0.6, "disambiguation": 0.4},
}
SINGLE_HOP = ["nq", "triviaqa", "popqa"]
MULTI_HOP = ["hotpotqa", "2wiki", "musique", "bamboogle"]
TRAIN_SPLITS = ["nq", "hotpotqa"]  # the paper trains RL on NQ + HotpotQA


def split_pools(train, n_sft, unseen=()):
    """𝒟_sft and 𝒟_rl of Algorithm 1 from the shuffled train questions of every split but those of the
    `unseen` templates: 𝒟_sft takes n_sft of them round-robin over the question types, so phase I sees every
    type the evaluation uses; 𝒟_rl is the rest of the RL splits' questions (NQ + HotpotQA)."""
    train, queues = [q for q in train if template_of(q["question"]) not in set(unseen)], {}
    for q in train:
        queues.setdefault(q["qtype"], []).append(q)
    sft, queues = [], [queues[k] for k in sorted(queues)]
    while len(sft) < n_sft and any(queues):
        for qu in queues:
            if qu and len(sft) < n_sft:
                sft.append(qu.pop(0))
    taken = {q["question"] for q in sft}
    rl = [q for q in train if q["split"] in TRAIN_SPLITS and q["question"] not in taken]
    if n_sft <= 0 or len(sft) < n_sft or not rl:
        raise ValueError(f"--sft-tasks {n_sft} leaves no disjoint RL pool: the train splits hold "
                         f"{len(train)} questions ({len(rl)} left for RL); lower --sft-tasks or raise "
                         f"--n-train")
    return sft, rl


def build_questions(world, seed, n_train, n_test):
    """{split: {"train": [...], "test": [...]}}; a question text is never in two sets. The test sets are
    drawn first, so a small world's rare types (homonyms, hamlets) are not used up by training."""
    rng, seen, out = random.Random(seed + 1), set(), {split: {} for split in SPLITS}
    for part, n in (("test", n_test), ("train", n_train)):
        for split, mix in SPLITS.items():
            qs, tries = [], 0
            while len(qs) < n and tries < 200 * (n + 1):
                tries += 1
                qtype = rng.choices(list(mix), weights=list(mix.values()))[0]
                got = QTYPES[qtype](world, rng)
                if got is None or got[0] in seen:
                    continue
                seen.add(got[0])
                qs.append(dict(question=got[0], answer=got[1], support=got[2],
                               qtype=qtype, split=split))
            out[split][part] = qs
    return out


# --- retriever, SkillBank and talent catalog ---
def embed(embedder, texts):
    """L2-normalised MiniLM embeddings, so a dot product is a cosine similarity."""
    return torch.as_tensor(embedder.encode(list(texts), normalize_embeddings=True,
                                           convert_to_numpy=True))  # (n, 384)


def search_corpus(query, passages, P_emb, embedder, topk):
    """Dense retrieval: the top-k passages by cosine similarity to the query."""
    q = embed(embedder, [query])  # (1, 384)
    sims = (P_emb @ q.T).squeeze(1)  # (n_passages,)
    idx = sims.topk(min(topk, len(passages))).indices.tolist()
    return [passages[i] for i in idx]


def load_talents(path, bank):
    """The talent catalog 𝒯: per talent c its id, description d_c, guidance g_c
    and associated skill ids ℳ(c). A link to a skill missing from the bank (a
    SkillBank from elsewhere) is dropped with a warning that names it."""
    try:
        talents = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"talent file {path}: {e}") from e
    ids = {s["skill_id"] for s in bank}
    out = []
    for t in talents:
        missing = [k for k in ("talent_id", "description", "guidance", "skills") if k not in t]
        if missing:
            raise ValueError(f"talent file {path}: talent {t.get('talent_id', '?')} lacks {missing}")
        if dropped := [s for s in t["skills"] if s not in ids]:
            warnings.warn(f"talent {t['talent_id']}: links to {dropped} dropped (not in the SkillBank)")
        out.append(dict(t, skills=[s for s in t["skills"] if s in ids]))
    return out


# SkillRL keeps per-type skills under `task_specific_skills` (its ALFWorld bank)
# or `query_type_skills` (its search bank); both are read and written back.
SKILL_SECTIONS = ("task_specific_skills", "query_type_skills")


def load_skillbank(path):
    """A SkillBank in SkillRL's JSON format, flattened to a list of skills
    {skill_id, title, principle, when_to_apply?, …, category, section}, and the
    whole JSON (common mistakes, metadata and any other field), which
    save_skillbank writes back unchanged. Mistakes are kept, not retrieved."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"SkillBank {path}: {e}") from e
    if not isinstance(raw, dict) or not {"general_skills", *SKILL_SECTIONS} & set(raw):
        raise ValueError(f"SkillBank {path}: expected general_skills / {' / '.join(SKILL_SECTIONS)} keys")
    bank = [dict(s, category="general", section="general_skills") for s in raw.get("general_skills") or []]
    for key in SKILL_SECTIONS:
        if not isinstance(raw.get(key) or {}, dict):
            raise ValueError(f"SkillBank {path}: {key} must map a category to a list of skills")
        for cat, skills in (raw.get(key) or {}).items():
            bank += [dict(s, category=cat, section=key) for s in skills]
    for s in bank:
        missing = [k for k in ("skill_id", "title", "principle") if not s.get(k)]
        if missing:
            raise ValueError(f"SkillBank {path}: skill {s.get('skill_id', '?')} lacks {missing}")
    return bank, raw


def save_skillbank(path, bank, raw):
    """Write the bank back in the layout it was loaded from: every top-level field
    of `raw` kept, skills in their section; new skills join the bank's per-type section."""
    out = {k: (v if k not in ("general_skills", *SKILL_SECTIONS) else {c: [] for c in v}
               if isinstance(v, dict) else []) for k, v in raw.items()}
    per_type = next((k for k in SKILL_SECTIONS if k in raw), SKILL_SECTIONS[0])
    for s in bank:
        item = {k: v for k, v in s.items() if k not in ("category", "section")}
        if s["category"] == "general":
            out.setdefault("general_skills", []).append(item)
        else:
            out.setdefault(s.get("section", per_type), {}).setdefault(s["category"], []).append(item)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))


def skill_text(s):
    return f"{s['title']}. {s['principle']} {s.get('when_to_apply', '')}"  # SkillRL's embedded text


class World:
    """Everything an episode needs that is not the model: corpus, retriever, questions, SkillBank, talents
    and the flags, with the look-ups (talentrl.skills_for retrieves the skills of Eq. (5)-(6) from it)."""

    def __init__(self, args, embedder):
        self.args, self.embedder = args, embedder
        self.world = build_world(args.seed, args.n_people, args.n_places, args.n_orgs, args.n_events,
                                 args.n_hamlets, args.n_shared)
        self.passages = render_passages(self.world)
        self.P_emb = embed(embedder, [p["text"] for p in self.passages])  # (n_passages, 384)
        self.questions = build_questions(self.world, args.seed, args.n_train,  # talentrl's routing-only eval
                                         max(args.eval_n, args.route_eval_n))
        self.set_bank(*load_skillbank(args.skillbank))
        self.cache, self.q_emb = {}, {}
        self.set_talents(load_talents(args.talents, self.bank))

    def set_bank(self, bank, raw):
        self.bank, self.bank_raw = bank, raw
        self.S_emb = embed(self.embedder, [skill_text(s) for s in bank])  # (S, 384)

    def set_talents(self, talents):
        self.talents, self.by_id = talents, {t["talent_id"]: t for t in talents}
        self.D_emb = embed(self.embedder, [t["description"] for t in talents])  # (T, 384)

    def description_similarity(self, task):
        return (self.D_emb @ self.question_embedding(task["question"]).T).squeeze(1)  # (T,): cos(x, d_c)

    def question_embedding(self, q):
        if q not in self.q_emb:
            self.q_emb[q] = embed(self.embedder, [q])  # (1, 384)
        return self.q_emb[q]

    def search(self, query):
        if query not in self.cache:  # the same query recurs across a group's rollouts
            self.cache[query] = search_corpus(query, self.passages, self.P_emb, self.embedder,
                                              self.args.topk_docs)
        return self.cache[query]



# --- the scripted teacher of phase I ---
# A stronger teacher for phase I (the paper uses GPT-5.5 or an SFT student): a
# scripted search agent that executes the strategy of its talent literally and
# answers only from the documents it retrieved. It knows the passage templates,
# not the answers. Without a talent it is naive: it searches the question once
# and reads the first passage of the right kind. Each talent adds the one move
# that its questions need, so Eq. (8) finds a positive utility for every talent
# on the questions it is meant for (bridge hop, one search per compared entity,
# the stated condition, the clarifier, arithmetic, the exact rare name, the
# name check) and none elsewhere.
TEACHER = {  # talent → (moves, least number of searches before answering)
    "talent_decomposition": ({"follow", "compare", "arith", "check"}, 3),  # one search per sub-question
    "talent_bridge_entity": ({"follow"}, 1),
    "talent_disambiguation": ({"clarify"}, 1),
    "talent_constraint": ({"condition"}, 1),
    "talent_comparison": ({"compare", "split"}, 1),
    "talent_longtail": ({"exact"}, 1),  # the exact-name search and the name check, for rare entities
    "talent_temporal_numeric": ({"arith", "follow"}, 1),
    "talent_verification": ({"check"}, 1),
}
FACT_RES = [
    (r"(?P<name>[A-Z][\w ]*?) was an? (?P<occupation>[\w ]+?) born in (?P<born>\d+) in (?P<birthplace>\w+), "
     r"(?P<country>\w+)\.", "person"),
    (r"(?P<name>The [\w ]+?) is an? (?P<kind>[\w ]+?) released in (?P<year>\d+) by the (?P<occupation>\w+) "
     r"(?P<creator>[A-Z][\w ]*?)\.", "work"),
    (r"(?P<name>\w+) is a town in (?P<country>\w+), founded in (?P<founded>\d+)\. It has a population of "
     r"(?P<population>\d+)\.", "place"),
    (r"The (?P<name>[A-Z][\w ]*?) was founded in (?P<founded>\d+) by (?P<founder>[A-Z][\w ]*?) and is "
     r"headquartered in (?P<hq>\w+)\.", "org"),
    (r"The (?P<name>[A-Z][\w ]*?) took place in (?P<year>\d+) in (?P<location>\w+)\.", "event"),
    (r"(?P<name>\w+) is a small hamlet near (?P<near>\w+) on the (?P<river>\w+) river, at an elevation of "
     r"(?P<elevation>\d+) metres\.", "hamlet"),
]


def read_facts(text):
    """Facts of the passages in `text`, in retrieval order."""
    facts = []
    for doc in re.split(r"Doc \d+: ", text or ""):
        for rx, t in FACT_RES:
            facts += [dict(m.groupdict(), type=t) for m in re.finditer(rx, doc)]
    return facts


def _find(facts, t, **kw):
    return [f for f in facts if f["type"] == t and all(f.get(k) == v for k, v in kw.items())]


def _one(xs, key):
    return xs[0][key] if xs else None


BRIDGE_QS = (  # (question, bridge type, link field, target type, attribute)
    (r"In what year was the founder of the (.+) born\?", "org", "founder", "person", "born"),
    (r"Where was the creator of the [\w ]+? (The .+) born\?", "work", "creator", "person", "birthplace"),
    (r"In which country did the (.+) take place\?", "event", "location", "place", "country"),
)
SINGLE_QS = (  # (question, type, attribute)
    (r"In what year was (.+) born\?", "person", "born"),
    (r"Where was (.+) born\?", "person", "birthplace"),
    (r"Who created the [\w ]+? (The .+)\?", "work", "creator"),
    (r"Where is the (.+) headquartered\?", "org", "hq"),
    (r"In which country is the town of (.+)\?", "place", "country"),
    (r"Where did the (.+) take place\?", "event", "location"),
    (r"What is the population of (.+)\?", "place", "population"),
    (r"Which river flows past the hamlet of (.+)\?", "hamlet", "river"),
    (r"At what elevation, in metres, lies the hamlet of (.+)\?", "hamlet", "elevation"),
)
COMPARE_QS = ((r"Who was born first, (.+) or (.+)\?", "person", "born", min),
              (r"Which was founded earlier, the (.+) or the (.+)\?", "org", "founded", min),
              (r"Which town has the larger population, (.+) or (.+)\?", "place", "population", max))


def scripted_answer(q, facts, moves=frozenset()):
    """Answer a question from the facts read so far with the given moves; None
    when they do not suffice. Without a move the teacher reads naively: the
    first passage of the asked kind, ignoring clarifiers and conditions."""
    m = re.match(r"(In what year|Where) was (.+?), the (\w+), born\?", q)
    if m:  # disambiguation: only the clarifier tells the homonyms apart
        xs = _find(facts, "person", name=m.group(2))
        if "clarify" in moves:
            xs = [x for x in xs if x["occupation"] == m.group(3)]
        return _one(xs, "born" if m.group(1) == "In what year" else "birthplace")
    if m := re.match(r"Whose creator was born first, (.+) or (.+)\?", q):  # a bridge on each side, compare
        ws = [_find(facts, "work", name=m.group(j)) for j in (1, 2)]
        if not {"follow", "compare"} <= moves:
            return next((w[0]["name"] for w in ws if w), None)
        cs = [_find(facts, "person", name=w[0]["creator"]) if w else [] for w in ws]
        return min(zip(ws, cs), key=lambda wc: int(wc[1][0]["born"]))[0][0]["name"] if all(cs) else None
    for rx, t, link, t2, attr in BRIDGE_QS:
        if m := re.match(rx, q):  # bridge: the answer is an attribute of the linked entity
            if not {"follow"} & moves:
                return _one(_find(facts, t2), attr)  # naive: any entity of the answer's kind
            return _one(_find(facts, t2, name=_one(_find(facts, t, name=m.group(1)), link)), attr)
    if m := re.match(r"How old was the creator of (.+) in the year it was released\?", q):
        w = _find(facts, "work", name=m.group(1))
        p = _find(facts, "person", name=w[0]["creator"]) if w else []
        if "arith" not in moves:
            return _one(w, "year")  # naive: copies a year instead of computing the age
        return str(int(w[0]["year"]) - int(p[0]["born"])) if w and p else None
    if m := re.match(r"How many years after the founding of its headquarters town was the (.+) founded\?", q):
        o = _find(facts, "org", name=m.group(1))
        p = _find(facts, "place", name=o[0]["hq"]) if o else []
        if "arith" not in moves:
            return _one(o, "founded")
        return str(int(o[0]["founded"]) - int(p[0]["founded"])) if o and p else None
    for rx, t, key, pick in COMPARE_QS:
        if m := re.match(rx, q):
            xs = [_find(facts, t, name=m.group(j)) for j in (1, 2)]
            if "compare" not in moves:  # naive: the first of the two it read about
                return next((x[0]["name"] for x in xs if x), None)
            return pick(xs, key=lambda x: int(x[0][key]))[0]["name"] if all(xs) else None
    if m := re.match(r"Which ([\w ]+?) by (.+) was released in (\d+)\?", q):
        cond = dict(year=m.group(3)) if "condition" in moves else {}
        return _one(_find(facts, "work", creator=m.group(2), **cond), "name")
    for rx, t, attr in SINGLE_QS:
        if m := re.match(rx, q):  # naive: the first passage of the kind, about whichever entity
            check = "check" in moves or ("exact" in moves and t == "hamlet")
            return _one(_find(facts, t, **({"name": m.group(1)} if check else {})), attr)
    return None


def single_attribute(q):
    """A question about one attribute of one named entity (no bridge, no clarifier)."""
    return (any(re.match(rx, q) for rx, _, _ in SINGLE_QS) and not any(re.match(b[0], q) for b in BRIDGE_QS)
            and not re.search(r", the \w+, born\?$", q))


def scripted_queries(q, facts, tid):
    """The search queries of the strategy of talent `tid` (None: no talent) given the facts so far."""
    moves = TEACHER[tid][0] if tid else set()
    if "split" in moves and (m := re.search(r", (?:the )?(.+) or (?:the )?(.+)\?", q)):
        return [m.group(1), m.group(2)]  # one search per compared entity
    if "exact" in moves and (m := re.search(r"hamlet of (\w+)", q)):
        return [m.group(1), f"{m.group(1)} hamlet river elevation"]  # the rare name, then expanded
    if "clarify" in moves and (m := re.match(r"(?:In what year|Where) was (.+?), the (\w+), born\?", q)):
        return [f"{m.group(1)} ({m.group(2)})"]  # the clarifier in the query
    if "clarify" not in moves:
        q = re.sub(r", the \w+, born\?$", " born?", q)  # the clarifier is dropped from the query
    plan = [q]
    if "follow" in moves or TEACHER.get(tid, (0, 1))[1] > 1:
        # sub-questions: the entities named in the documents that the question's entity links to
        named = [f for f in facts if f["name"] in q]
        plan += [x for f in named
                 for x in (f.get("creator"), f.get("founder"), f.get("location"), f.get("hq")) if x]
        if TEACHER.get(tid, (0, 1))[1] > 1:  # decomposition: each named entity is a sub-question too
            plan += [f["name"] for f in named]
        if "compare" in moves and (m := re.search(r", (?:the )?(.+) or (?:the )?(.+)\?", q)):
            plan += [m.group(1), m.group(2)]
    return list(dict.fromkeys(plan))


def scripted_rollouts(tok, W, eps, info, args):
    """The teacher's trajectories in the same shape as multi_turn_rollouts (ids, mask)."""
    out = []
    for ep, inf in zip(eps, info):
        tid, facts, ids, mask, done_q = inf["talent"], [], [], [], 0
        moves, min_searches = TEACHER[tid] if tid else (set(), 1)
        q = ep["task"]["question"]
        # without verification's habit of searching first, a third of the single-attribute questions
        # (a hash of the question decides) are answered from memory: wrong in a fictional world
        searches_first = "check" in moves or ("exact" in moves and "hamlet" in q)
        from_memory = not searches_first and single_attribute(q) and zlib.crc32(q.encode()) % 3 == 0
        while not ep["done"]:
            plan = scripted_queries(q, facts, tid)
            if from_memory:
                plan = []
            ans = scripted_answer(q, facts, moves) if done_q >= min_searches else None
            if ans is not None or done_q >= len(plan) or ep["turns"] + 1 >= args.max_steps:
                ans = ans or scripted_answer(q, facts, moves) or (facts[0]["name"] if facts else "unknown")
                text = f"The documents give the answer.<answer>{ans}</answer>"
            else:
                text = f"I search for the next fact.<search>{plan[done_q]}</search>"
                done_q += 1
            t_ids = tok.encode(text, add_special_tokens=False)
            ids, mask = ids + t_ids, mask + [1] * len(t_ids)
            reply = env_reply(ep, text, W.search, args.max_steps)
            if reply is not None:
                facts += read_facts(reply)
                o = tok.encode(reply, add_special_tokens=False)
                ids, mask = ids + o, mask + [0] * len(o)
        out.append(Rollout([], ids + [tok.eos_token_id], mask + [1], text=""))
    return out


GISTS = (  # (template, question pattern, what the routing rationale says it asks), first match wins
    ("disamb_year", r"In what year was (.+?), the (\w+), born\?",
     "asks when {0}, the {1}, was born: a name several people may share"),
    ("disamb_place", r"Where was (.+?), the (\w+), born\?",
     "asks where {0}, the {1}, was born: a name several people may share"),
    ("creators_compare", r"Whose creator was born first, (.+) or (.+)\?",
     "compares the creators of {0} and {1}"),
    ("founder_born", r"In what year was the founder of the (.+) born\?",
     "asks about the founder of the {0}, not about the {0} itself"),
    ("creator_birthplace", r"Where was the creator of the [\w ]+? (The .+) born\?",
     "asks about the creator of {0}, not about {0} itself"),
    ("event_country", r"In which country did the (.+) take place\?",
     "asks about the town where the {0} took place"),
    ("age", r"How old was the creator of (.+) in the year it was released\?",
     "asks for an age: the year of {0} minus its creator's birth year"),
    ("founding_gap", r"How many years after .+ was the (.+) founded\?",
     "asks for a difference of two founding years, of the {0} and its town"),
    ("born_first", r"Who was born first, (.+) or (.+)\?", "compares when {0} and {1} were born"),
    ("founded_earlier", r"Which was founded earlier, the (.+) or the (.+)\?",
     "compares when the {0} and the {1} were founded"),
    ("larger_population", r"Which town has the larger population, (.+) or (.+)\?",
     "compares the populations of {0} and {1}"),
    ("work_by_year", r"Which ([\w ]+?) by (.+) was released in (\d+)\?",
     "asks for the {0} by {1} with a condition, released in {2}"),
    ("population", r"What is the population of (.+)\?", "asks for a number, the population of {0}"),
    ("hamlet_river", r"Which river flows past the hamlet of (.+)\?",
     "asks for the river of the hamlet of {0}, a rare name"),
    ("hamlet_elevation", r"At what elevation, in metres, lies the hamlet of (.+)\?",
     "asks for the elevation of the hamlet of {0}, a rare name"),
    ("born_year", r"In what year was (.+) born\?", "asks for one fact, the birth year of {0}"),
    ("birthplace", r"Where was (.+) born\?", "asks for one fact, the birthplace of {0}"),
    ("creator", r"Who created the ([\w ]+?) (The .+)\?", "asks for one fact, who created the {0} {1}"),
    ("hq", r"Where is the (.+) headquartered\?", "asks for one fact, where the {0} is headquartered"),
    ("town_country", r"In which country is the town of (.+)\?", "asks for one fact, the country of {0}"),
    ("event_place", r"Where did the (.+) take place\?", "asks for one fact, where the {0} took place"),
)


def rationale(question, talent):
    """App. C's task-grounded routing rationale: what this question asks (from its own words), then the
    move of the talent. A fixed sentence per talent left the choice to 1-3 ungrounded tokens (issue #28)."""
    for _, rx, gist in GISTS:
        if m := re.fullmatch(rx, question):
            return f"The question {gist.format(*m.groups())}, so {talent['rationale']}."
    return f"The question asks: {question} So {talent['rationale']}."


# --- routers that need no training, and any router scored against the teacher's c* ---
TEMPLATES = [name for name, _, _ in GISTS]  # the question templates, one per pattern of GISTS


def template_of(question):
    """The template of a question: the name of GISTS' first pattern it matches in full, else "other"."""
    return next((name for name, rx, _ in GISTS if re.fullmatch(rx, question or "")), "other")


def _majority(labels):
    """The most frequent c* of labels (ties: the first talent id in sorted order); None for no label."""
    counts = collections.Counter(lab["talent"] for lab in labels)
    return max(sorted(counts), key=counts.get) if counts else None


def label_stats(n_tasks, labels, n_original):
    """Phase I counts: kept tasks, original rows, c* overall and per question type, and the labels."""
    chosen, by_qtype = {}, {}
    for l in labels:
        chosen[l["talent"]] = chosen.get(l["talent"], 0) + 1
        by = by_qtype.setdefault(l["qtype"], {})
        by[l["talent"]] = by.get(l["talent"], 0) + 1
    return dict(tasks=n_tasks, kept=len(labels), original_rows=n_original, chosen=chosen,
                chosen_by_qtype=by_qtype, labels=labels)


def no_training_routers(labels, similarity, talent_ids):
    """The routers that need no training, each a function task → talent id, built from phase I's c* labels
    (dicts with question, qtype, talent) alone, so a template without a label is one they never saw:
      majority             the most frequent c*;
      qtype-majority       the most frequent c* of the task's question type (else majority);
      template-lookup      one rule per template: its most frequent c*; a template no label has (an unseen
                           one) falls back to qtype-majority, its question type's seen templates;
      nearest-description  the talent whose description d_c is closest to the question (similarity(task):
                           (T,) MiniLM cosines, World.description_similarity); uses no label at all."""
    maj = _majority(labels)
    by = lambda key: {k: _majority([lab for lab in labels if key(lab) == k]) for k in set(map(key, labels))}
    per_qtype, per_template = by(lambda lab: lab["qtype"]), by(lambda lab: template_of(lab["question"]))
    qtype_majority = lambda t: per_qtype.get(t["qtype"], maj)
    return {"majority": lambda t: maj, "qtype-majority": qtype_majority,
            "template-lookup": lambda t: per_template.get(template_of(t["question"])) or qtype_majority(t),
            "nearest-description": lambda t: talent_ids[int(similarity(t).argmax())]}


def routing_parts(labels, unseen):
    """Indices of the labels in each part: all, seen and unseen templates (unseen: names of TEMPLATES)."""
    new = [template_of(lab["question"]) in set(unseen) for lab in labels]
    return {"all": list(range(len(labels))), "seen": [i for i, u in enumerate(new) if not u],
            "unseen": [i for i, u in enumerate(new) if u]}


def routing_accuracy(labels, routes, unseen):
    """A router's routes ({question: talent id}, "none" for an invalid route; a question it did not route
    counts as "none") scored against c*: per part, its accuracy (fraction), n and the 0/1 hits in label
    order, and over all labels the confusion matrix {routed talent: {c*: count}}."""
    got = [routes.get(lab["question"], "none") for lab in labels]
    hits = [float(g == lab["talent"]) for g, lab in zip(got, labels)]
    out = {part: dict(acc=sum(hits[i] for i in idx) / len(idx) if idx else None, n=len(idx),
                      hits=[hits[i] for i in idx])
           for part, idx in routing_parts(labels, unseen).items()}
    confusion = {}
    for g, lab in zip(got, labels):
        row = confusion.setdefault(g, {})
        row[lab["talent"]] = row.get(lab["talent"], 0) + 1
    return dict(out, confusion=confusion)
