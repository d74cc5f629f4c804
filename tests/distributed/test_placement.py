"""Where the rollout workers go once the trainer's ranks are placed (distributed/placement.py), on made-up
clusters: the decision is a pure function of what each node has, so no Ray cluster is needed."""

from rlpost.distributed.placement import PIN, alive, pinned, worker_nodes

GPU_NODE = {"CPU": 16.0, "GPU": 8.0}
CPU_NODE = {"CPU": 32.0}


def cluster(*kinds: dict) -> list[dict]:
    return [{"ip": f"10.0.0.{i + 1}", **k} for i, k in enumerate(kinds)]


def test_gpu_trainer_and_gpu_workers_go_to_different_gpu_nodes():
    nodes = cluster(GPU_NODE, GPU_NODE, CPU_NODE)
    # the trainer's 8 ranks fill the first GPU node; 4 GPU workers go to the second, none to the CPU node
    got = worker_nodes(nodes, ["10.0.0.1"] * 8, {"CPU": 2.0, "GPU": 1.0}, 4)
    assert got == ["10.0.0.2"] * 4


def test_cpu_workers_beside_a_gpu_trainer_take_the_cpu_only_nodes_first_then_spread():
    nodes = cluster(GPU_NODE, CPU_NODE, GPU_NODE, CPU_NODE)
    got = worker_nodes(nodes, ["10.0.0.1"], {"CPU": 4.0}, 5)
    # in turn over the trainer-free nodes, CPU-only first: .2, .4, .3, then round again
    assert got == ["10.0.0.2", "10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.4"]


def test_a_node_takes_workers_only_while_what_is_left_holds_the_bundle():
    nodes = cluster({"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 1.0})
    # 0.75 CPU each: node 2 holds two (1.5 of 2), node 3 one (0.75 of 1); a fourth fits nowhere away from .1
    assert worker_nodes(nodes, ["10.0.0.1"], {"CPU": 0.75}, 3) == ["10.0.0.2", "10.0.0.3", "10.0.0.2"]
    assert worker_nodes(nodes, ["10.0.0.1"], {"CPU": 0.75}, 4) is None


def test_none_where_every_node_holds_a_trainer_rank_or_no_gpu_node_is_free():
    two = cluster({"CPU": 2.0}, {"CPU": 2.0})
    assert worker_nodes(two, ["10.0.0.1", "10.0.0.2"], {"CPU": 0.5}, 2) is None  # ranks spread over both
    assert worker_nodes(cluster({"CPU": 2.0}), ["10.0.0.1"], {"CPU": 0.5}, 1) is None  # one host
    # GPU workers never go to a CPU-only node, however many CPUs it has
    assert worker_nodes(cluster(GPU_NODE, CPU_NODE), ["10.0.0.1"], {"CPU": 1.0, "GPU": 1.0}, 1) is None
    assert worker_nodes(two, ["10.0.0.1"], {"CPU": 0.5}, 0) == []


def test_the_two_namespace_benchmark_puts_its_worker_across_the_link():
    # benchmarks/multinode.py: two 2-CPU hosts, the trainer rank on one; its one worker must cross the veth
    hosts = cluster({"CPU": 2.0}, {"CPU": 2.0})
    assert worker_nodes(hosts, ["10.0.0.2"], {"CPU": 1.0}, 1) == ["10.0.0.1"]


def test_alive_nodes_and_a_pinned_bundle_in_rays_terms():
    ray_nodes = [{"NodeManagerAddress": "10.78.0.1", "Alive": True, "Resources": {"CPU": 2.0, "node:10.78.0.1": 1.0}},
                 {"NodeManagerAddress": "10.78.0.2", "Alive": False, "Resources": {"CPU": 2.0}}]
    assert alive(ray_nodes) == [{"ip": "10.78.0.1", "CPU": 2.0, "node:10.78.0.1": 1.0}]
    assert pinned({"CPU": 0.5}, "10.78.0.2") == {"CPU": 0.5, "node:10.78.0.2": PIN}
    assert 1 / PIN >= 1000  # a node's own resource is 1.0: a thousand workers may share it
