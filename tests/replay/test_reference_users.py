"""The MLPerf reference's synthetic users (--request-model reference, the default): a user's context, answer and
think time are drawn once from its profile's ranges; each request then draws from [C/4, C], [A/4, A] and
[0.8T, 1.2T]. kvtier's own request model draws every request from the profile's whole range."""

from __future__ import annotations

from bench_helpers import prepared, run

from replay.synthetic.config import DEFAULT_USER_TEMPLATES
from replay.synthetic.request import REFERENCE_PREFILL_ONLY_TOKENS

# The spec's profiles (the bench helpers' own are small and think 0 s)
PROFILES = {name: t.model_dump(exclude={"weight"}) for name, t in DEFAULT_USER_TEMPLATES.items()}


def users(tmp_path, request_model):
    return prepared(tmp_path, user_templates=PROFILES, request_model=request_model)


def requests_of(bench, users=30, sessions_each=20):
    """Per user: its (context, answer) pairs and think times, over `sessions_each` conversations."""
    out = []
    for i in range(users):
        user = bench.workload.new_user(i)
        pairs = [
            (t.input_tokens, t.output_tokens)
            for _ in range(sessions_each)
            for t in bench.workload.next_session(user).conversation.turns
        ]
        thinks = [user.think_time(False) for _ in range(50)]
        out.append((user, pairs, thinks))
    return out


def test_each_user_keeps_its_own_sizes_and_requests_vary_below_them(tmp_path):
    per_user = requests_of(users(tmp_path, "reference"))
    tops = set()
    for user, pairs, thinks in per_user:
        lo, hi = user.template.context_tokens
        c_max = max(c for c, _ in pairs)
        a_max = max(a for _, a in pairs)
        assert hi // 4 <= min(c for c, _ in pairs) and c_max <= hi and lo == max(1, hi // 4)
        assert a_max <= user.template.generate_tokens[1]
        t_lo, t_hi = user.template.think_time_s
        assert abs(t_hi / t_lo - 1.5) < 1e-9 and all(t_lo <= t <= t_hi for t in thinks)
        tops.add(hi)
    assert len(tops) == len(per_user)  # C differs from user to user


def test_fewer_requests_are_prefill_only_than_under_kvtiers_model(tmp_path):
    """The effect that matters: under the profile's whole range most coding and document requests reach the
    reference's 10,000-token prefill-only rule (written, never decoded); under the reference's users far fewer do."""

    def prefill_only_share(request_model):
        pairs = [p for _, ps, _ in requests_of(users(tmp_path, request_model), users=60, sessions_each=5) for p in ps]
        return sum(c >= REFERENCE_PREFILL_ONLY_TOKENS for c, _ in pairs) / len(pairs)

    reference = prefill_only_share("reference")
    kvtier = prefill_only_share("kvtier")
    # Expected with the default profiles (one third each): about 0.17 for the reference's users, 0.41 for the
    # whole ranges (coding 0.72, document 0.52, chatbot 0).
    assert reference < 0.27 < 0.33 < kvtier


def test_users_do_not_wait_for_their_answers_and_the_queue_decides_what_runs(tmp_path):
    """The reference's users put a request on the queue and go on (request_queue.py): with three request workers
    and users that hardly think, requests pile up, the highest class runs first and the batch class waits, and a
    turn can be taken while the turn it re-reads is still being written (a miss). kvtier's closed loop has none of
    that."""
    kw = {"num_users": 6, "io_workers": 3, "duration": 2, "qos_distribution": {"interactive": 1, "batch": 1}}
    kw["conversation"] = {"end_probability": 0.0, "max_turns": 50}
    ref = run(tmp_path, request_model="reference", **kw)["summary"]
    queue = ref["window"]["request_queue"]
    assert queue["workers"] == 3 and queue["max_depth"] > 6 and queue["not_run_at_end"] > 0
    by_class = {c: m["requests"] for c, m in ref["qos_metrics"].items()}
    assert by_class["interactive"] > 0 and by_class["batch"] == 0, by_class
    assert ref["multi_turn_stats"]["previous_turn_misses"] > 0
    ours = run(tmp_path, **kw)["summary"]
    assert "request_queue" not in ours["window"] and ours["multi_turn_stats"]["previous_turn_misses"] == 0


def test_the_reference_never_stores_a_system_prompt(tmp_path):
    """The reference looks a system prompt's entry up and never stores it, so every look-up misses; kvtier's model
    stores it on the first miss and the later conversations hit it."""
    kw = {"prefix_cache": {"probability": 1.0}, "num_users": 2, "duration": 1.5, "disable_prefix_caching": False}
    ref = run(tmp_path, request_model="reference", **kw)["summary"]["prefix_cache_stats"]
    ours = run(tmp_path, **kw)["summary"]["prefix_cache_stats"]
    assert ref["misses"] > 0 and ref["hits"] == 0, ref
    assert ours["hits"] > 0, ours
