"""`rlpost plan --from RUN --fit`: the efficiencies that make a run's compute phases match it, carried to a plan of
another layout. Hand-made run folders (no model is loaded, nothing is timed); the reference CPU (cpu-avx512) so
the table is fixed: bf16 on it, update 0.42, prefill 0.45, decode 0.24, decode_bw 1.0, forward 0.32."""

import json

import pytest

from rlpost import config
from rlpost.observe import planner

CPU = "cpu-avx512"
DISAGG = ["model.name=tiny", "dist.topology=disaggregated", "dist.weight_sync=broadcast"]


def run_folder(path, overrides, metrics):
    path.mkdir(parents=True, exist_ok=True)
    config.save(config.load(None, overrides), path / "config.yaml")
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, **m}) + "\n" for i, m in enumerate(metrics)))
    return path


def table_plan(tmp_path, overrides=DISAGG):
    """The plan of the workload at the table's efficiencies: its seconds per phase."""
    run = run_folder(tmp_path / "probe", overrides, [{"timing_s/gen": 1.0}])
    return planner.calibrate(run, CPU)["plan"]["time_s"]


def by_hand(predicted: float, times: float) -> float:
    """The fitted update efficiency of a run whose update took ``times`` the table's ``predicted`` seconds."""
    adamw = 28 * planner.TINY.params / planner.CPU_AVX512.mem_bw
    return 0.42 * (predicted - adamw) / (times * predicted - adamw)


def test_update_is_fitted_as_table_times_predicted_over_measured(tmp_path):
    t = table_plan(tmp_path)
    # step 1 (the warm-up) is left out; steps 2-4: update 3x the table's prediction (median), generation 2x plus
    # the weight load it waited for
    steps = [{"timing_s/update": 100.0, "timing_s/gen": 100.0}]
    steps += [{"timing_s/update": t["update"] * x, "timing_s/gen": 2 * t["gen"] + 0.7,
               "timing_s/worker_weight_load": 0.7} for x in (2.9, 3.0, 3.1)]
    run = run_folder(tmp_path / "one_host", DISAGG, steps)
    f = planner.fit(run, CPU)
    assert f["phases"]["update"]["measured"] == pytest.approx(3 * t["update"])
    assert f["phases"]["gen"]["measured"] == pytest.approx(2 * t["gen"])  # the load taken off
    # update seconds are FLOPs / (peak x eff) + AdamW's 28 bytes a parameter / bandwidth, the second no efficiency
    # scales: eff = 0.42 x (predicted - adamw) / (measured - adamw)
    assert f["eff"]["update"] == pytest.approx(by_hand(t["update"], 3), rel=1e-6)
    assert f["eff"]["update"] < 0.42 / 3  # not 0.14: the AdamW seconds stay
    # generation has a per-layer overhead no efficiency scales: to take twice as long, its efficiencies fall by
    # more than half, all three by the same factor
    k = f["phases"]["gen"]["k"]
    assert k < 0.5 and not f["phases"]["gen"]["capped"]
    assert f["eff"]["prefill"] == pytest.approx(0.45 * k) and f["eff"]["decode"] == pytest.approx(0.24 * k)
    assert f["eff"]["decode_bw"] == pytest.approx(1.0 * k)
    assert "forward" not in f["eff"]  # no reference, no old log-probs in this run
    # and the plan at the fitted efficiencies gives back the measured phases
    again = planner.calibrate(run, CPU, eff=f["eff"])["plan"]["time_s"]
    assert again["update"] == pytest.approx(3 * t["update"], rel=1e-6)
    assert again["gen"] == pytest.approx(2 * t["gen"], rel=1e-6)


def test_the_fit_carries_to_a_two_node_plan_and_leaves_the_link_alone(tmp_path):
    t = table_plan(tmp_path)
    steps = [{"timing_s/update": t["update"] * 2, "timing_s/gen": t["gen"] * 3}] * 2
    f = planner.fit(run_folder(tmp_path / "one_host", DISAGG, steps), CPU)
    two = run_folder(tmp_path / "two_hosts", DISAGG, [{"timing_s/gen": 1.0}])
    net = planner.Net(2, 1.0)
    table = planner.calibrate(two, CPU, net=net)["plan"]["time_s"]
    fitted = planner.calibrate(two, CPU, eff=f["eff"], net=net)["plan"]["time_s"]
    assert fitted["update"] == pytest.approx(2 * t["update"], rel=1e-6)
    assert fitted["gen"] == pytest.approx(3 * t["gen"], rel=1e-6)
    for k in ("sync", "sync_link", "load"):  # bytes over a bandwidth: not the fit's
        assert fitted[k] == table[k]
    assert fitted["step"] == pytest.approx(table["step"] + t["update"] + 2 * t["gen"], rel=1e-6)


def test_reference_and_old_log_probs_fit_the_forward_efficiency_together(tmp_path):
    overrides = ["model.name=tiny", "algo.name=ppo", "algo.kl_coef=0.05"]
    t = table_plan(tmp_path, overrides)
    both = t["ref"] + t["old"]
    f = planner.fit(run_folder(tmp_path / "ppo", overrides, [{"timing_s/ref": t["ref"] * 2,
                                                             "timing_s/old": t["old"] * 2}]), CPU)
    assert set(f["phases"]) == {"ref+old"} and f["phases"]["ref+old"]["predicted"] == pytest.approx(both)
    assert f["eff"] == {"forward": pytest.approx(0.16, rel=1e-6)}  # 0.32 x predicted / measured


def test_a_run_faster_than_the_bound_stops_at_it(tmp_path):
    t = table_plan(tmp_path)
    f = planner.fit(run_folder(tmp_path / "fast", DISAGG, [{"timing_s/update": t["update"] / 100}]), CPU)
    assert f["phases"]["update"]["capped"] and f["eff"]["update"] == pytest.approx(planner.EFF_MAX, rel=1e-6)
    assert "at a bound" in planner.format_fit(f)


def test_fit_on_the_command_line_prints_eff_arguments_that_parse_back(tmp_path, capsys):
    t = table_plan(tmp_path)
    run = run_folder(tmp_path / "one_host", DISAGG, [{"timing_s/update": t["update"] * 3,
                                                      "timing_s/gen": t["gen"] * 2}])
    assert planner.main(["--from", str(run), "--device", CPU, "--fit"]) == 0
    out, err = capsys.readouterr()
    argv = out.split()
    assert argv[0::2] == ["--eff"] * 4 and "update" in err and "gen" in err
    parsed = planner.parse_eff(argv[1::2])
    fitted = planner.fit(run, CPU)["eff"]
    assert parsed == pytest.approx(fitted, rel=5e-3) and parsed["update"] == float(f"{by_hand(t['update'], 3):.3g}")
    assert planner.main(["--fit"]) == 2 and "--from" in capsys.readouterr().err
    assert planner.eff_args({"update": 0.000012345, "decode": 1.0}) == "--eff update=0.0000123 --eff decode=1"
