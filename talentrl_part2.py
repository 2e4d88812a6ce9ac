

def load_talents(path, bank):
    """The talent catalog 𝒯: per talent c its id, description d_c, guidance g_c
    and associated skill ids ℳ(c). Associations to skills missing from the bank
    are dropped (a SkillBank from elsewhere may lack them)."""
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
        out.append(dict(t, skills=[s for s in t["skills"] if s in ids]))
    return out


def load_skillbank(path):
    """A SkillBank in SkillRL's JSON format, flattened to a list of skills
    {skill_id, title, principle, when_to_apply, category}. The common mistakes
    are kept (written back on save) but not retrieved."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"SkillBank {path}: {e}") from e
    if not isinstance(raw, dict) or not ("general_skills" in raw or "task_specific_skills" in raw):
        raise ValueError(f"SkillBank {path}: expected general_skills / task_specific_skills keys")
    bank = [dict(s, category="general") for s in raw.get("general_skills", [])]
    for cat, skills in (raw.get("task_specific_skills") or {}).items():
        bank += [dict(s, category=cat) for s in skills]
    for s in bank:
        missing = [k for k in ("skill_id", "title", "principle") if not s.get(k)]
        if missing:
            raise ValueError(f"SkillBank {path}: skill {s.get('skill_id', '?')} lacks {missing}")
        s.setdefault("when_to_apply", "")
    return bank, raw.get("common_mistakes", [])


def save_skillbank(path, bank, mistakes):
    """Write the bank back in SkillRL's format."""
    out = {"general_skills": [], "task_specific_skills": {}, "common_mistakes": mistakes}
    for s in bank:
        item = {k: s[k] for k in ("skill_id", "title", "principle", "when_to_apply")}
        if s["category"] == "general":
            out["general_skills"].append(item)
        else:
            out["task_specific_skills"].setdefault(s["category"], []).append(item)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))


def skill_text(s):
    return f"{s['title']}. {s['principle']} {s['when_to_apply']}"  # SkillRL's embedded text


# ----- rewards -----
def normalize_answer(s):
    """SQuAD / Search-R1 normalisation: lower case, no punctuation, no articles."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(pred, gold):
    return float(pred is not None and normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred, gold):
    p, g = normalize_answer(pred or "").split(), normalize_answer(gold).split()
    common = sum(min(p.count(w), g.count(w)) for w in set(p))
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
INVALID_MSG = ("\nMy previous action is invalid. If I want to search, I should put the query "
               "between <search> and </search>. If I want to give the final answer, I should "
               "put the answer between <answer> and </answer>. Let me try again.\n")


def parse_action(text):
    """First `<search>q</search>` or `<answer>a</answer>` in a turn (Search-R1), else (None, None)."""
    m = ACTION_RE.search(text or "")
    if m is None or not m.group(2).strip():
        return None, None
    return m.group(1), m.group(2).strip()


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
        obs = "\n<information>" + " ".join(f"Doc {i + 1}: {d['text']}" for i, d in enumerate(docs)) + "</information>\n"
    else:
        ep["n_invalid"] += 1
        obs = INVALID_MSG
    if ep["turns"] >= max_steps:
        ep["done"] = True
        return None
    return obs


def episode_return(ep, invalid_penalty):
    """R(τ): exact match of the normalised answer minus a penalty per invalid action."""
    return exact_match(ep["pred"], ep["task"]["answer"]) - invalid_penalty * ep["n_invalid"]


# ----- rollout -----
# Eq. (4): c ~ π_θ(· | x, 𝒯): the routing response is `<think>…</think><talent>id</talent>`
ROUTE_RE = re.compile(r"^\s*<think>(.+?)</think>\s*<talent>\s*([A-Za-z0-9_]+)\s*</talent>\s*$", re.S)


def parse_route(text, talent_ids):
    """Strict parse of the routing response; None (fall back to no talent) when
    the format is broken or the id is not in the catalog."""
    m = ROUTE_RE.match(text or "")
    if m is None or not m.group(1).strip() or m.group(2) not in talent_ids:
        return None
    return m.group(2)


def retrieve_skills(sims, assoc, K, recall, threshold, lam):
    """Indices of the skills given to execution.
    sims: (S,) cosine similarities q(x, s); assoc: set of skill indices ℳ(c)
    (empty for no talent, which gives the similarity-only Eq. (1))."""
    # candidate pool ℛ(x): the `recall` most similar skills above the threshold
    order = sorted(range(len(sims)), key=lambda i: -float(sims[i]))[:recall]
    pool = [i for i in order if float(sims[i]) >= threshold]
    # Eq. (5): q̃(x, s | c) = q(x, s) + λ·𝕀[s ∈ ℳ(c)],  s ∈ ℛ(x)
    q_tilde = {i: float(sims[i]) + lam * (i in assoc) for i in pool}
    # Eq. (6): 𝒮_K(x, c) = TopK_{s ∈ ℛ(x)} q̃(x, s | c); without a talent this is Eq. (1): TopK q(x, s)
    return sorted(pool, key=lambda i: -q_tilde[i])[:K]


def routing_prompt(task, talents):
    catalog = "\n".join(f"- {t['talent_id']}: {t['description']}" for t in talents)
    return (f"Question: {task['question']}\n\nBefore answering, choose the talent (strategy) that "
            f"fits this question best:\n{catalog}\n\nReply with a short reason in <think>...</think> "
            f"followed by the talent id in <talent>...</talent>.")


def execution_context(task, talent, skills, route_given):
    """The execution context of Eq. (7): guidance g_c and skills 𝒮_K(x, c). With
    `route_given` it follows the routing turn in the same conversation."""
    lines = []
    if talent is not None:
        lines.append(f"Talent guidance: {talent['guidance']}")
    if skills:
        lines.append("Relevant skills:\n" + "\n".join(f"- {s['title']}: {s['principle']}" for s in skills))
    lines.append("Answer the question using the search engine. Each turn, write at most one short "
                 "sentence of reasoning, then exactly one action: <search>query</search> to search, "
                 "or <answer>final answer</answer> once the documents contain the answer. The "
                 "answer must be a short name, place or number.")
    if not route_given:
        lines.append(f"Question: {task['question']}")
    return "\n\n".join(lines)


def route_target(talent):
    """SFT routing target: a short rationale in <think> and the talent id."""
    return f"<think>{talent['rationale']}</think><talent>{talent['talent_id']}</talent>"


# ----- advantages (Eq. 8, 10-14) -----
def talent_utilities(R_talent, R_ref):
    """Eq. (8) per rollout and its mean over the n repeats.
    R_talent: (T, n) returns per talent; R_ref: (n,) reference returns."""
    # Eq. (8): u_{c,r}(x) = R(τ_{c,r}) − R(τ_{∅,r})
    u = R_talent - R_ref[None, :]  # (T, n)
    return u, u.mean(dim=1)  # (T, n), (T,): ū_c(x) = 1/n Σ_r u_{c,r}(x)


def dead_zone(z, eta):
    # Eq. (11): D_η(z) = 0 if |z| < η else z
    return torch.where(z.abs() < eta, torch.zeros_like(z), z)


def routing_advantage(R_a, R_controls, weights, alpha, kappa, eta):
    """R_controls: (3,) returns of the no-skill, reduced-context and no-prior
    controls (ℓ = skill, budget, talent); weights: (3,) summing to 1."""
    # Eq. (12): δ_ℓ = D_η(R_a − R_ℓ),  ℓ ∈ {skill, budget, talent}
    delta = dead_zone(R_a - R_controls, eta)  # (3,)
    # Eq. (13): Â_talent = clip(α Σ_ℓ w_ℓ δ_ℓ, −κ, κ)
    return float((alpha * (weights * delta).sum()).clamp(-kappa, kappa)), delta


def token_advantages(mask, n_route, anchor, in_P, A_talent, A_exec):
    """Eq. (14) for one rollout's completion tokens.
    mask: per-token 1 (policy) / 0 (environment); the first n_route tokens are
    the routing response (ℐ_route), later policy tokens are execution (ℐ_exec)."""
    adv = []
    for t, m in enumerate(mask):
        if not m:
            adv.append(0.0)  # environment tokens: masked out of Eq. (15) anyway
        elif t < n_route:
            adv.append(A_talent if anchor else 0.0)  # Â_talent, i = i_a, t ∈ ℐ_route
        else:
            adv.append(A_exec if in_P else 0.0)  # Â_exec_i, i ∈ 𝒫, t ∈ ℐ_exec
    return adv  # 0 otherwise (controls, ordinary routing tokens)
