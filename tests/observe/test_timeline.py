"""The planner's step as lanes (observe/timeline.py): what crosses the link between nodes, the rollout
workers' weight load, where each topology waits for it, the straggler term (a batch's decode steps from its
lengths and slots, observe/cost.py) and the text Gantt chart. Every figure is arithmetic, worked by hand."""

import json
from dataclasses import replace

import pytest

from rlpost import config
from rlpost.observe import planner
from rlpost.observe.cost import decode_schedule, row_lengths
from rlpost.observe.planner import CPU_AVX512 as CPU
from rlpost.observe.planner import EMBEDDED, GPUS, TINY, Shape, Workload
from rlpost.observe.timeline import LOAD_GBS, gantt, step_of, timeline

# A push of the embedded model in bf16: its 134,515,008 parameters once (the tied head, 49,152 x 576, is the
# embedding's tensor and goes once), 269,030,016 bytes; 1 Gbit/s = 125 MB/s. The worker's load: those bytes at
# 1.22 GB/s.
SENT_1GBIT = 269_030_016 / 125e6  # 2.152240128 s
LOAD = 269_030_016 / 1.22e9  # 0.2205 s


def plan_t(w: Workload = Workload(), dev=CPU, gpus: int = 1, **net) -> dict:
    return planner.plan(EMBEDDED, w, dev, gpus, net=planner.Net(**net))["time_s"]


# --- across nodes -----------------------------------------------------------------------------


def test_the_weight_push_is_the_state_dicts_bytes_over_the_link():
    assert planner.sync_bytes(EMBEDDED, Workload()) == 269_030_016
    t = plan_t(nodes=2, gbps=1.0, topology="disaggregated")
    assert t["sync_link"] == pytest.approx(SENT_1GBIT)
    assert "fsdp_link" not in t  # one trainer rank: nothing of FSDP crosses the link
    # fp32 sampler: twice the bytes; 10 Gbit/s: a tenth of the time; an untied head goes once
    assert plan_t(Workload(sampler_bf16=False), nodes=2, gbps=1.0)["sync_link"] == pytest.approx(2 * SENT_1GBIT)
    assert plan_t(nodes=2, gbps=10.0)["sync_link"] == pytest.approx(SENT_1GBIT / 10)
    untied = replace(EMBEDDED, tied=False)
    assert planner.sync_bytes(untied, Workload()) == 2 * untied.params
    # one node, colocated: nothing crosses, no worker loads anything
    assert set(plan_t()) == {"gen", "update", "sync", "step"}
    # a GPU plan with rollout workers of their own says the load is a CPU figure; one without says nothing of it
    gpu = planner.plan(EMBEDDED, Workload(), GPUS["h100"], 1, net=planner.Net(2, 100.0, "disaggregated"))
    assert planner.GPU_LOAD in gpu["caveats"] and planner.GPU_LOAD not in planner.plan(EMBEDDED, Workload(),
                                                                                       GPUS["h100"])["caveats"]


def test_disaggregated_charges_the_workers_load_in_series_with_everything_else():
    t = plan_t(nodes=2, gbps=1.0, topology="disaggregated")
    assert LOAD_GBS == 1.22 and t["load"] == pytest.approx(LOAD)
    assert t["step"] == pytest.approx(t["gen"] + t["update"] + t["sync"] + SENT_1GBIT + LOAD)
    # the load is a pass over the pushed bytes: an fp32 sampler's push takes twice as long to load
    fp32 = plan_t(Workload(sampler_bf16=False), nodes=2, gbps=1.0, topology="disaggregated")
    assert fp32["load"] == pytest.approx(2 * LOAD)
    # a disaggregated run on one node has its own workers too: they load, nothing crosses a link
    one = plan_t(nodes=1, topology="disaggregated")
    assert one["load"] == pytest.approx(LOAD) and "sync_link" not in one
    assert one["step"] == pytest.approx(one["gen"] + one["update"] + one["sync"] + LOAD)


def test_async_is_the_longer_lane_and_broadcast_holds_the_trainer_for_the_link():
    t = plan_t(nodes=2, gbps=1.0, topology="async")
    rollout, trainer = t["gen"] + SENT_1GBIT + LOAD, t["update"] + t["sync"]
    assert t["step"] == pytest.approx(max(rollout, trainer))
    b = plan_t(nodes=2, gbps=1.0, topology="async", weight_sync="broadcast")
    assert b["step"] == pytest.approx(max(rollout, trainer + SENT_1GBIT)) and b["step"] > t["step"]
    # on a fast link generation is the longer lane (the CPU's update is the longer of the two phases here)
    fast = plan_t(nodes=2, gbps=1000.0, topology="async")
    assert fast["step"] == pytest.approx(max(fast["gen"] + fast["sync_link"] + LOAD, fast["update"] + fast["sync"]))


def test_fsdp_across_nodes_is_three_gathers_per_micro_batch_at_g_minus_1_over_g():
    # 16 x 8 = 128 rows over 4 ranks = 32 each, micro-batch 8: 4 micro-batches, each gathers 4P bytes (fp32) for
    # the forward and again for the backward and reduce-scatters 4P: 4 x 3 x 4P = 48P bytes; a ring of 4 moves 3/4
    # of them through each link. P = 134,515,008 -> 48 x 134,515,008 x 0.75 / 12.5e9 (100 Gbit/s) = 0.3874 s
    w = Workload(micro_batch=8)
    t = plan_t(w, GPUS["h100"], 4, nodes=2, gbps=100.0, topology="disaggregated")
    assert t["fsdp_link"] == pytest.approx(48 * 134_515_008 * 0.75 / 12.5e9)
    # a reference adds one forward pass: 4 more gathers of 4P
    ref = plan_t(replace(w, reference=True), GPUS["h100"], 4, nodes=2, gbps=100.0, topology="async")
    assert ref["fsdp_link"] == pytest.approx(64 * 134_515_008 * 0.75 / 12.5e9)


def test_timeline_bars_by_hand():
    p = {"gen": 3.0, "update": 5.0, "sync": 1.0, "sync_link": 2.0, "load": 1.0}
    # in turn: the trainer after generation, the weights after the trainer
    assert timeline(p, "disaggregated") == [("rollout", "gen", 0, 3), ("trainer", "update", 3, 8),
                                            ("trainer", "sync", 8, 9), ("rollout", "sync_link", 9, 11),
                                            ("rollout", "load", 11, 12)]
    # async: both lanes from 0, each on its own batch; broadcast: the trainer sends as long as the link carries
    bars = timeline(p, "async", "broadcast")
    assert bars == [("rollout", "gen", 0, 3), ("trainer", "update", 0, 5), ("trainer", "sync", 5, 6),
                    ("rollout", "sync_link", 3, 5), ("trainer", "sync_link", 6, 8), ("rollout", "load", 5, 6)]
    assert step_of(bars) == 8 and step_of(timeline(p, "async")) == 6 and step_of(timeline(p, "colocated")) == 12


def test_gantt_golden():
    p = {"gen": 3.0, "update": 5.0, "sync": 1.0, "sync_link": 2.0, "load": 1.0}
    assert gantt(timeline(p, "disaggregated"), {}, width=24) == [
        "  rollout |GGGGGG............NNNNLL|",
        "  trainer |......UUUUUUUUUUSS......|",
        "          0                       12 s",
        "  G gen, 3 s", "  U update, 5 s", "  S sync, 1 s", "  N sync_link, 2 s", "  L load, 1 s"]
    assert gantt(timeline(p, "async", "broadcast"), planner.LABELS, width=16)[:3] == [
        "  rollout |GGGGGGNNNNLL....|",
        "  trainer |UUUUUUUUUUSSNNNN|",
        "          0               8 s"]
    assert gantt([], {}) == []


def test_rlpost_plan_prints_the_chart_of_its_own_timeline(capsys):
    assert planner.main(["--device", "cpu-avx512", "--nodes", "2", "--net-gbps", "1"]) == 0
    out = capsys.readouterr().out
    assert planner.main(["--device", "cpu-avx512", "--nodes", "2", "--net-gbps", "1", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert "\n".join(gantt([tuple(b) for b in p["timeline"]], planner.LABELS)) in out
    assert "timeline of a step (disaggregated: in turn" in out and p["weight_sync"] == "object_store"


# --- the straggler term -----------------------------------------------------------------------


def test_row_lengths_are_the_most_long_tailed_spread_of_min_mean_and_max():
    # 8 rows, cap 9, mean 3, shortest 1: a share (3 - 1) / (9 - 1) = 1/4 at the cap, one in every 4 rows
    w = Workload(prompts=2, group=4, new_tokens=9, mean_response_len=3, min_response_len=1)
    assert row_lengths(w, 8) == [1, 1, 1, 9, 1, 1, 1, 9]
    # the short rows keep the mean where the long share rounds: 6 rows, mean 4, min 2 -> 6 x 2/7 = 1.7 -> 2 long,
    # 4 short of (24 - 18) / 4 = 1.5 (the total tokens, which the rollout's time follows, before the minimum)
    assert row_lengths(replace(w, prompts=3, group=2, mean_response_len=4, min_response_len=2), 6) == [
        1.5, 1.5, 9, 1.5, 1.5, 9]
    assert row_lengths(Workload(new_tokens=5), 3) == [5, 5, 5]  # no mean: every row to the cap
    assert row_lengths(Workload(new_tokens=16, mean_response_len=5, min_response_len=5), 3) == [5, 5, 5]  # no spread


def test_decode_steps_run_to_the_longest_row_or_total_tokens_over_the_slots():
    rows = [1, 1, 1, 9, 1, 1, 1, 9]
    assert decode_schedule(rows, 0) == (8, 16)  # all at once: the longest row's 9 - 1 steps
    assert decode_schedule(rows, 2) == (8, 16)  # 16 row-steps on 2 slots: 8, and no row waits past the longest
    assert decode_schedule([9] * 8, 2) == (32, 64)  # 4 rows a slot, one after another: total / slots
    assert decode_schedule([9] * 8, 0) == (8, 64)
    # a long row entering last pays its own length after the rest: 2 + 2 steps on its slot, then 8
    assert decode_schedule([3, 3, 3, 3, 9], 2) == (12, 16)


def test_the_schedule_counts_the_engines_own_decode_steps_on_the_long_tail_batch():
    # benchmarks/long_tail.py (2026-12-06, Intel AMX): 16 prompts x 4 samples, <= 64 new tokens, each arm's
    # completion lengths in row order and the decode steps the engine counted (rollout/decode_steps)
    continuous = [7, 64, 7, 25, 64, 64, 64, 64, 11, 11, 11, 11, 43, 7, 25, 46, 10, 11, 11, 10, 64, 64, 64, 64, 64, 64,
                  18, 17, 64, 18, 11, 31, 64, 21, 64, 10, 64, 64, 64, 64, 64, 10, 31, 11, 44, 37, 10, 10, 19, 11, 11,
                  19, 64, 64, 64, 64, 11, 8, 11, 10, 41, 18, 64, 10]
    waves = [7, 64, 7, 25, 64, 64, 64, 64, 11, 11, 11, 11, 43, 7, 25, 46, 10, 8, 11, 56, 64, 64, 64, 64, 64, 10, 25, 23,
             26, 11, 11, 11, 10, 8, 3, 8, 64, 64, 64, 64, 64, 13, 8, 10, 64, 10, 10, 63, 64, 11, 11, 11, 64, 64, 64, 64,
             11, 17, 28, 37, 53, 19, 64, 27]
    assert decode_schedule(continuous, 16)[0] == 172
    assert sum(decode_schedule(waves[i:i + 16], 0)[0] for i in range(0, 64, 16)) == 252  # four calls of 16 rows
    # from its min, mean and max alone the planner draws 164.7 steps: 0.96x of the 172 counted
    w = Workload(prompts=16, group=4, new_tokens=64, mean_response_len=sum(continuous) / 64, min_response_len=7)
    assert decode_schedule(row_lengths(w, 64), 16)[0] == pytest.approx(164.73, abs=0.01)


def test_rollout_on_slots_by_hand():
    # test_planner's hand-worked rollout (trunk 160, lm_head 40, N = 212; fp32; 1000 FLOP/s, 1000 bytes/s), 6 rows
    # of cap 4 and mean 2.5 -> lengths [1, 4, 1, 4, 1, 4]. On 2 slots: rows 1-4 take 0, 3, 0, 3 steps, rows 5 and
    # 6 wait for a slot until step 3: 6 steps, 9 row-steps, 9 / 6 = 1.5 live rows a step.
    s = Shape(layers=1, hidden=4, intermediate=8, heads=1, kv_heads=1, vocab=10, tied=True)
    w = Workload(prompts=2, group=3, prompt_len=2, new_tokens=5, response_len=4, sampler_bf16=False,
                 mean_response_len=2.5, slots=2)
    dev = planner.Device("test", 0, 2e3, 1e3, 1e3, 0, 0, cpu=True)
    eff = {"prefill": 0.5, "decode": 0.25, "decode_bw": 1.0}
    parts = planner.rollout_parts(s, w, dev, eff=eff)
    # a step: 1.5 x 400 + 4 x 4 x 4 x 1.5 = 696 FLOPs -> 2.784 s; bytes 212 x 4 + KV 2 x 4 x 4 x 1.5 x 4 = 1040
    oh = planner.decode_overhead(dev, bf16=False)
    assert parts["steps"] == 6 and parts["step_flops"] == 696
    assert parts["total"] == pytest.approx(3.008 + 6 * (2.784 + 1.04 + oh))
    # the same batch all at once: 3 steps of 3 live rows (test_planner's figure)
    assert planner.rollout_parts(s, replace(w, slots=0), dev, eff=eff)["steps"] == 3
    # `generate` has no slots: every row to the end, whatever rollout.slots says
    assert planner.rollout_parts(s, replace(w, engine="hf"), dev, eff=eff)["steps"] == 3
    # the KV cache holds a row a slot: 2 of 6
    full, slotted = (planner.memory(s, replace(w, slots=k), dev)["kv_cache"] for k in (0, 2))
    assert slotted == pytest.approx(full * 2 / 6)


def test_a_worker_streaming_its_chunks_pays_its_total_tokens_not_its_longest_row(tmp_path, capsys):
    # the hand-worked batch above, lengths [1, 4, 1, 4, 1, 4], 9 row-steps: all at once 3 steps of 3 live rows;
    # streamed (partial rollouts on the CPU engine), the next chunk's rows take the freed slots: 9 / 6 = 1.5 steps
    # of all 6 rows, 6 x 400 + 4 x 4 x 4 x 6 = 2784 FLOPs a step
    s = Shape(layers=1, hidden=4, intermediate=8, heads=1, kv_heads=1, vocab=10, tied=True)
    w = Workload(prompts=2, group=3, prompt_len=2, new_tokens=5, response_len=4, sampler_bf16=False,
                 mean_response_len=2.5, stream=True)
    dev = planner.Device("test", 0, 2e3, 1e3, 1e3, 0, 0, cpu=True)
    parts = planner.rollout_parts(s, w, dev, eff={"prefill": 0.5, "decode": 0.25, "decode_bw": 1.0})
    assert (parts["steps"], parts["step_flops"]) == (1.5, 2784)
    # a run's config says so on a CPU; the CUDA engine (on a GPU) decodes a worker's chunks in turn
    cfg = config.load(None, ["model.name=tiny", "dist.topology=async", "dist.partial_rollouts=true"])
    assert planner.workload_from_run(cfg, {}, CPU).stream
    assert not planner.workload_from_run(cfg, {}, GPUS["h100"]).stream
    assert not planner.workload_from_run(config.load(None, ["dist.topology=async"]), {}, CPU).stream
    argv = ["--new-tokens", "64", "--mean-len", "16", "--min-len", "4", "--topology", "async", "--device", "cpu-avx512",
            "--json"]  # the reference machine, not this one: the prefill's and a step's shares depend on the CPU kind
    assert planner.main(argv) == 0
    by_chunk = json.loads(capsys.readouterr().out)
    assert planner.main([*argv, "--partial-rollouts"]) == 0
    streamed = json.loads(capsys.readouterr().out)
    # 32 rows of mean 16 and cap 64 (6 at the cap): 480 row-steps, 15 steps of 32 rows against 63 of 7.6 live rows
    # on average; a step of 32 rows costs more FLOPs than one of 7.6 (the weights' bytes the same): 0.745x in all
    assert streamed["workload"]["stream"] and streamed["time_s"]["gen"] < 0.8 * by_chunk["time_s"]["gen"]
    assert planner.main(["--partial-rollouts"]) == 2
    assert capsys.readouterr().err.startswith("rlpost: error: --partial-rollouts: weights change mid-chunk only")


def test_a_runs_lengths_and_slots_and_topology_reach_the_plan(tmp_path):
    cfg = config.load(None, ["model.name=tiny", "rollout.slots=8", "dist.topology=disaggregated",
                             "dist.weight_sync=broadcast"])
    config.save(cfg, tmp_path / "config.yaml")
    line = {"step": 1, "response_length/min": 2, "response_length/mean": 5.0, "response_length/max": 16,
            "timing_s/gen": 1.0, "timing_s/worker_weight_load": 0.7}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    cal = planner.calibrate(tmp_path, "cpu-avx512", net=planner.Net(2, 1.0))
    w, t = cal["plan"]["workload"], cal["plan"]["time_s"]
    assert (w["slots"], w["min_response_len"], w["mean_response_len"]) == (8, 2, 5.0)
    assert (cal["plan"]["topology"], cal["plan"]["weight_sync"]) == ("disaggregated", "broadcast")
    # the tiny model's 78,912 parameters (its tied head among them once) in bf16: 157,824 bytes at 125 MB/s
    assert TINY.params == 78_912 and t["sync_link"] == pytest.approx(157_824 / 125e6)
    row = {r["name"]: r for r in cal["rows"]}["timing_s/worker_weight_load"]
    # under broadcast the worker's load is timed from the trainer's cast, across the link, into its sampler
    assert row["predicted"] == pytest.approx(t["sync"] + t["sync_link"] + 157_824 / 1.22e9) and row["measured"] == 0.7


def test_each_actors_phases_are_priced_at_the_threads_it_computes_on(tmp_path):
    from rlpost.observe.devices import PARALLEL, at_threads, thread_factor

    # Amdahl with p = 0.65 (generation): 1 thread against 2 is (0.35 + 0.65) / (0.35 + 0.325) = 1 / 0.675 = 1.4815;
    # the update's p = 0.69: 1 / (0.31 + 0.345) = 1.5267 (benchmarks/threads.py measured 1.48 and 1.53)
    assert PARALLEL == {"gen": 0.65, "update": 0.69}
    assert thread_factor("gen", 1, 2) == pytest.approx(1 / 0.675)
    assert thread_factor("update", 1, 2) == pytest.approx(1 / 0.655)
    assert thread_factor("update", 2, 2) == 1.0 and thread_factor("gen", 4, 2) == pytest.approx(0.5125 / 0.675)
    t = {"gen": 1.0, "ref": 0.5, "update": 2.0, "sync": 0.1, "step": 3.6}
    one = at_threads(t, CPU, trainer=1, rollout=2)  # the trainer's phases on 1 thread, generation on both cores
    assert one["gen"] == 1.0 and one["sync"] == 0.1  # the sync is bandwidth, not threads
    assert one["ref"] == pytest.approx(0.5 / 0.655) and one["update"] == pytest.approx(2 / 0.655)
    assert one["step"] == pytest.approx(1.1 + 2.5 / 0.655)
    assert at_threads(t, GPUS["h100"], 1, 1) == t and at_threads(t, CPU) == t  # a GPU; no threads given
    # what a run gives each actor on 2 cores: colocated run.threads (0: both), disaggregated every core each (they
    # take turns), async half each; never more than the cores
    for topo, threads, want in (("colocated", 1, (1, 1)), ("colocated", 0, (2, 2)), ("disaggregated", 0, (2, 2)),
                                ("async", 0, (1, 1)), ("disaggregated", 8, (2, 2))):
        assert planner.actor_threads(config.load(None, [f"dist.topology={topo}"]).dist, threads, 2) == want, topo
    # calibrate reads them from the run: async on the 2-core reference machine, 1 thread each
    cfg = config.load(None, ["model.name=tiny", "dist.topology=async"])
    config.save(cfg, tmp_path / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/gen": 1.0}) + "\n")
    got = planner.calibrate(tmp_path, "cpu-avx512")["plan"]["time_s"]
    base = planner.plan(TINY, planner.workload_from_run(cfg, {}, CPU), CPU, net=planner.Net(topology="async"))
    assert got["gen"] == pytest.approx(base["time_s"]["gen"] / 0.675)
    assert got["update"] == pytest.approx(base["time_s"]["update"] / 0.655)


def test_straggler_flags_in_one_line_when_bad(capsys):
    p = planner.main(["--new-tokens", "64", "--mean-len", "16", "--min-len", "4", "--slots", "32", "--json"])
    w = json.loads(capsys.readouterr().out)["workload"]
    assert p == 0 and (w["mean_response_len"], w["min_response_len"], w["slots"]) == (16, 4, 32)
    for argv, word in ((["--mean-len", "65", "--new-tokens", "64"], "--mean-len"), (["--min-len", "-1"], "--min-len"),
                       (["--slots", "-2"], "--slots"), (["--nodes", "0"], "--nodes"),
                       (["--net-gbps", "0"], "--net-gbps"),
                       (["--nodes", "2", "--topology", "colocated"], "--topology")):
        assert planner.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"rlpost: error: {word}") and "\n" not in err, (argv, err)


# --- the run report's picture -----------------------------------------------------------------


def test_the_report_lays_out_a_runs_medians_as_its_topology_orders_them(tmp_path, monkeypatch):
    from rlpost.observe import report

    history = [{"step": i + 1, "timing_s/gen": g, "timing_s/update": u, "timing_s/sync": 0.5, "timing_s/eval": 9.0}
               for i, (g, u) in enumerate(((1.0, 2.0), (3.0, 4.0), (2.0, 9.0)))]
    # medians gen 2, update 4, sync 0.5; the held-out pass (some steps only) is not a phase of the step
    assert report.step_bars(history, "disaggregated") == [("rollout", "gen", 0, 2.0), ("trainer", "update", 2.0, 6.0),
                                                          ("trainer", "sync", 6.0, 6.5)]
    assert step_of(report.step_bars(history, "async")) == 4.5
    assert report.step_bars([{"step": 1, "actor/loss": 1.0}], "colocated") == []  # sft: no rollout, no chart
    assert report.timeline_plot(history, "async").startswith("<svg")
    config.save(config.load(None, ["dist.topology=async"]), tmp_path / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    seen = []  # the page draws it from the run's own config: its topology and weight sync
    monkeypatch.setattr(report, "timeline_plot", lambda h, *how: seen.append(how) or "<svg>chart</svg>")
    assert "<svg>chart</svg>" in report.build_html(tmp_path) and seen == [("async", "object_store")]
