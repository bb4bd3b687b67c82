"""The step time model: each overlap rule against a hand-worked timeline, and the scenarios'
unit plans (which collective, which group, which scope, which stream) against the strategies'
layouts. Torch-free, in-process; the numbers in each docstring are the arithmetic the test checks."""

import dataclasses

import pytest

from vit_scale.distributed.deepspeed import DeepSpeedConfig
from vit_scale.distributed.fsdp import FSDPConfig
from vit_scale.planning import communication
from vit_scale.planning.alpha_beta import Link, Network
from vit_scale.planning.scenario import Scenario, layout
from vit_scale.planning.step_time import (
    Coll,
    Compute,
    Unit,
    _buckets,
    _ds_buckets,
    _unit_plan,
    forward_flops_per_image,
    predict_curve,
    predict_step,
    timeline,
    train_flops_per_image,
)

# simple figures so that hand arithmetic is easy: 1 GB/s, no latency, inside and across nodes alike
FLAT = Network(Link(0.0, 1.0), Link(0.0, 1.0), source="test")
SLOW_INTER = Network(Link(0.0, 100.0), Link(0.0, 1.0), source="test")


def parts(b):
    return (
        round(b.forward_s, 6),
        round(b.backward_s, 6),
        round(b.exposed_intra_s, 6),
        round(b.exposed_inter_s, 6),
        round(b.step_s, 6),
    )


# ---------------------------------------------------------------- DDP


def test_ddp_three_buckets_last_one_exposed():
    """DDP, 3 units (forward 1 s, backward 2 s each), a bucket completing with each unit's backward
    (A with unit 2, the first in backward; B with unit 1; C with unit 0), all-reduce 1.5 s each.
      forward 0-3. backward: unit 2 3-5, A 5-6.5; unit 1 5-7, B 7-8.5; unit 0 7-9, C 9-10.5.
      The optimizer (0.5 s) waits for C: 1.5 s exposed, the last bucket's all-reduce; step 11.
    With 2.5 s all-reduces the stream falls behind: A 5-7.5, B 7.5-10, C 10-12.5, so 3.5 s exposed
    (more than the last bucket: the overlap is bounded by the backward)."""

    def units(ar):
        return [
            Unit(1, 2, after_backward=(Coll(ar, "inter", "world", "C"),)),
            Unit(1, 2, after_backward=(Coll(ar, "inter", "world", "B"),)),
            Unit(1, 2, after_backward=(Coll(ar, "inter", "world", "A"),)),
        ]

    b = timeline(units(1.5), optimizer_s=0.5)
    assert parts(b) == (3, 6, 0, 1.5, 11)
    assert b.communication_s["inter"] == pytest.approx(4.5)
    assert parts(timeline(units(2.5), optimizer_s=0.5)) == (3, 6, 0, 3.5, 13)


def test_ddp_buckets_follow_torch_bucket_caps():
    """vit_micro (206,376 parameters, fp32 gradients: 825,504 B). With a 1 MiB first bucket every
    gradient fits in it: one bucket, completed by the stem's backward (unit 0, the last). With
    0.2 MiB caps (209,715 B), buckets close once they reach the cap, in reverse parameter order:
    head and norm first (unit L+1 = 5), the stem last; their sizes add up to all the gradients."""
    sc = Scenario(model="vit_micro", strategy="DDP")
    shape = sc.shape
    assert _buckets(sc, shape, 4, 1 << 20, 25 << 20) == [(0, 4 * shape.params)]
    cap = 0.2 * (1 << 20)
    buckets = _buckets(sc, shape, 4, cap, cap)
    assert len(buckets) >= 3
    assert sum(s for _, s in buckets) == 4 * shape.params
    assert all(s >= cap for _, s in buckets[:-1])
    assert [u for u, _ in buckets] == sorted((u for u, _ in buckets), reverse=True) and buckets[-1][0] == 0


def test_ddp_scenario_across_nodes_charges_inter():
    """DDP over 2 nodes: the world group spans nodes, so every bucket runs at the across-nodes rate and
    any exposed time is inter-node; on 1 node the same step is all intra-node, and faster."""
    sc = Scenario(model="vit_small", strategy="DDP", nodes=1, gpus_per_node=4, device_memory_gib=None)
    comp = Compute.measured(0.3, 0.01, "test")
    one, two = predict_curve(sc, [1, 2], SLOW_INTER, comp)
    assert one.breakdown.exposed_inter_s == 0 and one.breakdown.exposed_intra_s > 0
    assert two.breakdown.exposed_intra_s == 0 and two.breakdown.exposed_inter_s > one.breakdown.exposed_intra_s
    assert one.scaling_efficiency == 1.0 and 0 < two.scaling_efficiency < 1
    assert two.images_per_s == pytest.approx(two.images_per_s_per_gpu * 8)
    assert two.images_per_s_per_gpu == pytest.approx(sc.batch_size / two.breakdown.step_s)


# ---------------------------------------------------------------- FSDP


def _sharded(ag=0.5, rs=0.5):
    return [
        Unit(
            1,
            2,
            gather_forward=Coll(ag, "intra", "shard"),
            gather_backward=Coll(ag, "intra", "shard"),
            after_backward=(Coll(rs, "intra", "shard"),),
        )
        for _ in range(3)
    ]


def test_full_shard_forward_one_unit_ahead():
    """FULL_SHARD, 3 units (forward 1, backward 2), all-gathers and reduce-scatters 0.5 s on one stream,
    forward all-gathers one unit ahead (the limiter's two in flight):
      AG0 0-0.5 exposed; unit 0 0.5-1.5; AG1 issued when unit 0 starts: 0.5-1.0; unit 1 1.5-2.5;
      AG2 1.5-2.0; unit 2 2.5-3.5. Only the first all-gather, 0.5 s, is exposed in the forward.
    With forward_ahead 0 (issued when due, the host in step with the device) each is exposed: 1.5 s."""
    b = timeline(_sharded(), forward_ahead=1, backward_prefetch="pre")
    assert b.forward_s == 3
    fwd_only = [dataclasses.replace(u, gather_backward=None, after_backward=()) for u in _sharded()]
    assert timeline(fwd_only, forward_ahead=1).exposed_intra_s == pytest.approx(0.5)
    assert timeline(fwd_only, forward_ahead=0).exposed_intra_s == pytest.approx(1.5)


def test_compute_and_a_collective_beside_it_slow_each_other():
    """Two units (forward 1 s, backward 2 s), forward all-gathers of 1 s one unit ahead, compute 1.5x as slow
    while a collective is in flight (compute_slowdown 0.5):
      AG0 0-1 exposed; AG1 issued when unit 0 starts, 1-2; unit 0's forward runs beside it at 2/3 of its pace
      until 2 (2/3 s done), then the last 1/3 s alone: 1-7/3, 1/3 s longer; unit 1 7/3-10/3; backward 4 s:
      step 1 + 2 + 1/3 + 4 = 22/3.
    The collective also 1.5x as slow beside compute (collective_slowdown 0.5), over the first walk's compute
    (the forwards, 1-7/3 and 7/3-10/3): AG1 does 8/9 s by 7/3 and its last 1/9 s takes 1/6 s: it ends at 5/2;
    unit 0's forward, beside it 1-5/2, does exactly its 1 s by then: unit 1 5/2-7/2: step 7/2 + 4 = 7.5.
    Blocking collectives (gloo) never run beside compute: nothing is slowed."""
    units = [Unit(1, 2, gather_forward=Coll(1.0, "inter", "world")) for _ in range(2)]
    plain = timeline(units, forward_ahead=1)
    assert plain.step_s == pytest.approx(7) and plain.overlap_s == 0
    slowed = timeline(units, forward_ahead=1, compute_slowdown=0.5)
    assert slowed.overlap_s == pytest.approx(1 / 3)
    assert (slowed.forward_s, slowed.exposed_inter_s) == (2, pytest.approx(1))
    assert slowed.step_s == pytest.approx(22 / 3)
    both = timeline(units, forward_ahead=1, compute_slowdown=0.5, collective_slowdown=0.5)
    assert both.step_s == pytest.approx(7.5) and both.overlap_s == pytest.approx(0.5)
    assert both.communication_s["inter"] == pytest.approx(1 + 1.5)
    blocking = timeline(units, forward_ahead=1, blocking=True, compute_slowdown=0.5, collective_slowdown=0.5)
    assert blocking.step_s == pytest.approx(timeline(units, forward_ahead=1, blocking=True).step_s)
    assert blocking.overlap_s == 0


def test_a_profiles_slowdowns_reach_the_step_and_its_costly_end():
    """Frontier's compute_slowdown (0, up to 0.4) and collective_slowdown (0, up to 1.0): the value is the step
    as before, the costly end's slowdowns reach the step (a FULL_SHARD step on 16 nodes, whose gathers run
    beside compute, is longer with compute slowed, and longer still with the collectives slowed too)."""
    from vit_scale.planning import alpha_beta, input_profile, spread

    net = alpha_beta.read_network(input_profile.profile_path("frontier"))
    assert (net.compute_slowdown, net.collective_slowdown) == (0.0, 0.0)
    cheap, costly = spread.ends(net)
    assert (cheap.compute_slowdown, cheap.collective_slowdown) == (0.0, 0.0)
    assert (costly.compute_slowdown, costly.collective_slowdown) == (0.4, 1.0)
    sc = Scenario(model="vit_base", strategy="FULL_SHARD", nodes=16)
    comp = Compute.measured(0.2, 0.0, "test")
    value = predict_step(sc, net, comp).breakdown
    assert value.overlap_s == 0
    slowed = predict_step(sc, dataclasses.replace(net, compute_slowdown=0.4), comp).breakdown
    assert slowed.overlap_s > 0 and slowed.step_s > value.step_s
    both = dataclasses.replace(net, compute_slowdown=0.4, collective_slowdown=1.0)
    assert predict_step(sc, both, comp).breakdown.step_s > slowed.step_s


def test_full_shard_backward_prefetch_pre_post_none():
    """The backward of _sharded() after the forward above (compute at 3.5):
    BACKWARD_PRE: unit 2's all-gather 3.5-4.0 (exposed 0.5); unit 1's issued as unit 2 starts,
      4.0-4.5; unit 2 4-6; RS2 6-6.5; unit 0's all-gather issued as unit 1 starts, 6.5-7.0 (behind
      RS2); unit 1 6-8; RS1 8-8.5; unit 0 8-10; RS0 10-10.5 exposed 0.5.
      Exposed 0.5 (forward) + 0.5 + 0.5 = 1.5; step 3 + 6 + 1.5 = 10.5.
    BACKWARD_POST: unit 2 4-6; unit 1's all-gather issued as unit 2 ends, 6-6.5, then RS2 6.5-7;
      unit 1 waits to 6.5 (0.5), runs 6.5-8.5; unit 0's all-gather 8.5-9 (the stream free since 7),
      RS1 9-9.5; unit 0 waits to 9 (0.5), runs 9-11; RS0 11-11.5 (0.5).
      Exposed 0.5 + 0.5 + 0.5 + 0.5 + 0.5 = 2.5; step 11.5.
    None: unit 2 4-6, RS2 6-6.5; unit 1's all-gather when it is due, behind RS2: 6.5-7 (exposed 1.0);
      unit 1 7-9, RS1 9-9.5; unit 0's 9.5-10 (1.0); unit 0 10-12; RS0 12-12.5 (0.5).
      Exposed 0.5 + 0.5 + 1.0 + 1.0 + 0.5 = 3.5; step 12.5."""
    assert parts(timeline(_sharded(), 1, "pre")) == (3, 6, 1.5, 0, 10.5)
    assert parts(timeline(_sharded(), 1, "post")) == (3, 6, 2.5, 0, 11.5)
    assert parts(timeline(_sharded(), 1, "none")) == (3, 6, 3.5, 0, 12.5)


def test_fsdp_options_choose_the_rules():
    """The scenario's FSDP options pick the rules: FSDP1 defaults (limit_all_gathers, no forward
    prefetch, BACKWARD_PRE) one unit ahead and pre; forward_prefetch two; without the limiter the same
    (not modelled for speed, and said so: never faster than with it); FSDP2 one ahead and pre whatever
    the FSDP1 options say; SHARD_GRAD_OP
    gathers no Block again in backward; the root is gathered once. And on the same network, none is
    slower than pre."""

    def plan(strategy="FULL_SHARD", **fsdp):
        sc = Scenario(
            model="vit_micro",
            strategy=strategy,
            nodes=1,
            gpus_per_node=4,
            device_memory_gib=None,
            fsdp=FSDPConfig(**fsdp),
        )
        return sc, _unit_plan(sc, layout(sc), FLAT, Compute.measured(0.03, 0.0, "test"))

    _, p = plan()
    assert (p.forward_ahead, p.backward_prefetch) == (1, "pre")
    assert p.units[0].gather_backward is None and all(u.gather_backward for u in p.units[1:-1])
    assert plan(forward_prefetch=True)[1].forward_ahead == 2
    unlimited = plan(limit_all_gathers=False)[1]
    assert unlimited.forward_ahead == 1
    assert any("limit_all_gathers=False: not modelled for speed" in r for r in unlimited.rules)
    assert plan(backward_prefetch="none")[1].backward_prefetch == "none"
    fsdp2 = plan(version=2, backward_prefetch="none")[1]
    assert (fsdp2.forward_ahead, fsdp2.backward_prefetch) == (1, "pre")
    assert all(u.gather_backward is None for u in plan("SHARD_GRAD_OP")[1].units)
    sc, _ = plan()
    comp = Compute.measured(0.03, 0.0, "test")
    pre = predict_step(sc, FLAT, comp).breakdown.step_s
    none = predict_step(dataclasses.replace(sc, fsdp=FSDPConfig(backward_prefetch="none")), FLAT, comp).breakdown.step_s
    assert none > pre


def test_fsdp2_root_is_gathered_again_with_the_head_at_the_start_of_the_backward():
    """FSDP2 reshards the root after forward (the trainer passes reshard_after_forward), and the root
    holds the head, whose backward runs first: the root's backward all-gather is tied to the head unit
    (units[L+1]), not the stem; its reduce-scatter stays after the stem's backward (the last).
    Hand timeline, stem, one Block, head (forward 1, backward 2 each; no forward gathers): the root's
    gather (0.75) at the start of the backward, 3-3.75, exposed; the Block's (0.5) prefetched 3.75-4.25
    under the head's backward 3.75-5.75; Block 5.75-7.75, stem 7.75-9.75: exposed 0.75, step 9.75."""
    sc = Scenario(model="vit_micro", strategy="FULL_SHARD", nodes=1, gpus_per_node=4, device_memory_gib=None)
    sc = dataclasses.replace(sc, fsdp=FSDPConfig(version=2))
    p = _unit_plan(sc, layout(sc), FLAT, Compute.measured(0.03, 0.0, "test"))
    root = communication.per_unit(sc, layout(sc))["units"][0]
    assert p.units[0].gather_backward is None and p.units[-1].gather_backward is not None
    assert p.units[-1].gather_backward.seconds == pytest.approx(root["gather_backward"] * 3 / 4 / 1e9)
    assert p.units[0].after_backward and not p.units[-1].after_backward
    units = [Unit(1, 2), Unit(1, 2, gather_backward=Coll(0.5, "intra", "shard")), Unit(1, 2)]
    units[2].gather_backward = Coll(0.75, "intra", "shard")
    assert parts(timeline(units, 1, "pre")) == (3, 6, 0.75, 0, 9.75)


def test_fsdp2_keeps_one_reduce_scatter_in_flight():
    """FSDP2's post_backward (reduce_scatter_max_input_buffers = 1): before a unit's reduce the compute
    stream waits for the previous reduce-scatter. 3 units (forward 1, backward 2), the head's RS 4 s,
    the others 0.5: backward unit 2 3-5, RS2 5-9; unit 1 5-7, then waits for RS2 until 9 (2 exposed),
    RS1 9-9.5; unit 0 9-11, RS0 11-11.5, the optimizer waits 0.5: exposed 2.5, step 11.5. Without the
    rule unit 0 runs 7-9 and only RS1 and RS0 (9-10) trail it: exposed 1, step 10. FSDP1 has no such
    wait."""
    units = [Unit(1, 2, after_backward=(Coll(0.5, "intra", "shard"),)) for _ in range(3)]
    units[2].after_backward = (Coll(4.0, "intra", "shard"),)
    assert parts(timeline(units, 1, "pre", one_reduce_in_flight=True)) == (3, 6, 2.5, 0, 11.5)
    assert parts(timeline(units, 1, "pre")) == (3, 6, 1.0, 0, 10)
    sc = Scenario(model="vit_micro", strategy="FULL_SHARD", nodes=1, gpus_per_node=4, device_memory_gib=None)
    v2 = dataclasses.replace(sc, fsdp=FSDPConfig(version=2))
    assert _unit_plan(v2, layout(v2), FLAT, Compute.measured(0.03, 0.0, "t")).one_reduce_in_flight
    assert not _unit_plan(sc, layout(sc), FLAT, Compute.measured(0.03, 0.0, "t")).one_reduce_in_flight


def test_hybrid_over_two_nodes():
    """HYBRID_2GPU on 2 nodes x 2 GPUs: shards inside a node (ranks 0-1, 2-3: intra), replicas across
    (0 with 2, 1 with 3: inter). Its unit plan has intra all-gathers and reduce-scatters on the shard
    stream and an inter all-reduce chained after each reduce-scatter on its own stream.
    Hand timeline, 2 units (forward 1, backward 2), AG and RS 0.5 intra, all-reduce 1.0 inter:
      forward AG0 0-0.5 (exposed), unit 0 0.5-1.5, AG1 0.5-1.0, unit 1 1.5-2.5;
      backward: AG1 2.5-3.0 (exposed 0.5 intra), AG0 prefetched 3.0-3.5, unit 1 3-5, RS1 5-5.5,
      AR1 5.5-6.5 (replicate stream); unit 0 5-7, RS0 7-7.5, AR0 7.5-8.5: the optimizer waits 1.5,
      charged to the last one, the inter-node all-reduce.
      intra 0.5 + 0.5 = 1.0, inter 1.5, step 2 + 4 + 2.5 = 8.5."""
    sc = Scenario(model="vit_micro", strategy="HYBRID_2GPU", nodes=2, gpus_per_node=2, device_memory_gib=None)
    p = _unit_plan(sc, layout(sc), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    block = p.units[1]
    assert (block.gather_forward.scope, block.gather_forward.stream) == ("intra", "shard")
    rs, ar = block.after_backward
    assert (rs.scope, rs.stream, ar.scope, ar.stream, ar.chained) == ("intra", "shard", "inter", "replicate", True)
    units = [
        Unit(
            1,
            2,
            Coll(0.5, "intra", "shard"),
            Coll(0.5, "intra", "shard"),
            (Coll(0.5, "intra", "shard"), Coll(1.0, "inter", "replicate", chained=True)),
        )
        for _ in range(2)
    ]
    assert parts(timeline(units, 1, "pre")) == (2, 4, 1.0, 1.5, 8.5)


def test_spanning_groups_get_their_ranks_per_node_share_of_the_nics():
    """Across-nodes bandwidth 1 GB/s a rank, within a node 100 GB/s. HYBRID_4GPU on 2 nodes x 4 GPUs:
    the replicas (0 with 4, ...) hold one rank a node, so their all-reduce runs at 1 GB/s; FULL_SHARD on
    the same 8 ranks is a ring over all 4 of each node's ranks, 4 NICs: 4 GB/s. vit_micro, bf16: a
    Block's all-gather is 2 x 33,472 B = 66,944 B, x 7/8 / 4 GB/s; the replicas' all-reduce of a Block's
    shard (16,736 B) x 2 x 1/2 / 1 GB/s."""
    hy = Scenario(model="vit_micro", strategy="HYBRID_4GPU", nodes=2, gpus_per_node=4, device_memory_gib=None)
    fs = dataclasses.replace(hy, strategy="FULL_SHARD")
    assert communication.ranks_per_node(hy, 2, "strided", 4) == 1 and communication.ranks_per_node(fs, 8) == 4
    p = _unit_plan(hy, layout(hy), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    q = _unit_plan(fs, layout(fs), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    c = 4 if hy.precision == "fp32" else 2
    block = c * hy.shape.block_params
    assert p.units[1].after_backward[1].seconds == pytest.approx(block / 4 * 2 * 1 / 2 / 1e9)
    assert q.units[1].gather_forward.seconds == pytest.approx(block * 7 / 8 / 4e9)


# ---------------------------------------------------------------- ZeRO


def test_zero3_prefetch_and_one_gradient_bucket():
    """ZeRO-3, 3 units (forward 1, backward 2), all-gathers 0.75 s, prefetched two units ahead; the
    gradients of a model under reduce_bucket_size fill one bucket, reduce-scattered (1.5 s) after the
    last backward (the stem's):
      forward: AG0 0-0.75 (exposed), unit 0 0.75-1.75; AG1 issued at the start 0.75-1.5; AG2 issued as
      unit 0 starts, 1.5-2.25; unit 1 1.75-2.75, unit 2 2.75-3.75.
      backward: AG2 3.75-4.5 (exposed 0.75), AG1 prefetched 4.5-5.25, unit 2 4.5-6.5; AG0 6.5-7.25,
      unit 1 6.5-8.5; unit 0 8.5-10.5; RS 10.5-12 exposed 1.5.
      Exposed 0.75 + 0.75 + 1.5 = 3.0; step 9 + 3 = 12."""
    units = [Unit(1, 2, Coll(0.75, "inter", "world"), Coll(0.75, "inter", "world")) for _ in range(3)]
    units[0].after_backward = (Coll(1.5, "inter", "world"),)
    assert parts(timeline(units, 2, "pre")) == (3, 6, 0, 3.0, 12)
    # the scenario: vit_micro's Blocks (33,472 parameters) are prefetched 50M elements ahead, so every
    # one; its gradients fill one bucket, at the stem. Threshold 0: no parameter stays gathered
    sc = Scenario(
        model="vit_micro",
        strategy="ZERO3",
        nodes=2,
        gpus_per_node=2,
        device_memory_gib=None,
        deepspeed=DeepSpeedConfig(param_persistence_threshold=0),
    )
    p = _unit_plan(sc, layout(sc), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    assert p.forward_ahead > sc.shape.L and p.backward_prefetch == "pre"
    assert [bool(u.after_backward) for u in p.units] == [True] + [False] * (sc.shape.L + 1)
    # vit_micro's parameters stay gathered from forward to backward (DeepSpeed's stage3_max_reuse_distance
    # reaches across the whole trace); vit_3b releases all but its last Blocks' and gathers them again
    assert p.units[1].gather_forward.scope == "inter" and p.units[1].gather_backward is None
    big = dataclasses.replace(sc, model="vit_3b")
    q = _unit_plan(big, layout(big), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    assert q.units[1].gather_backward.stream == "world" and q.units[big.shape.L].gather_backward is None


def test_zero3_backward_prefetches_as_far_ahead_as_the_forward():
    """ZeRO-3's coordinator prefetches up to stage3_prefetch_bucket_size elements in backward too
    (fetch_sub_module, BACKWARD_PREFETCH_SUBMIT). 3 units (forward 1, backward 1, no forward gathers),
    backward all-gathers: unit 1 0.25 s, unit 0 2.0 s. One ahead: unit 2 3-4 prefetches unit 1
    (3-3.25); unit 1 4-5 prefetches unit 0 (4-6); unit 0 waits 1, 6-7: step 7. Two ahead: unit 2 issues
    both at 3 (3-3.25, 3.25-5.25); unit 1 4-5; unit 0 waits 0.25: step 6.25. The scenario's plan uses
    the forward's lookahead in backward."""
    units = [Unit(1, 1, gather_backward=Coll(2.0, "inter", "world")), Unit(1, 1), Unit(1, 1)]
    units[1].gather_backward = Coll(0.25, "inter", "world")
    assert parts(timeline(units, 1, "pre")) == (3, 3, 0, 1.0, 7)
    assert parts(timeline(units, 1, "pre", backward_ahead=2)) == (3, 3, 0, 0.25, 6.25)
    sc = Scenario(model="vit_micro", strategy="ZERO3", nodes=2, gpus_per_node=2, device_memory_gib=None)
    p = _unit_plan(sc, layout(sc), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    assert p.backward_ahead == p.forward_ahead > 1


def test_zeropp_hpz_moves_the_backward_gather_inside_the_node():
    """ZeRO++ hpZ on 2 nodes x 2 GPUs: the forward all-gather spans the world (inter, qwZ int8: 1 B a
    parameter), the backward one stays in the 2-rank secondary partition of each node (intra, its own
    group), gradients reduce-scattered across nodes with qgZ (0.5 B a parameter).
    Hand timeline, 2 units (forward 1, backward 2), forward AG 0.5 inter, backward AG 0.25 intra on
    the hpZ stream, the gradient bucket 1.0 inter after the last backward:
      forward AG0 0-0.5 (exposed, inter), unit 0 0.5-1.5, AG1 0.5-1.0, unit 1 1.5-2.5;
      backward AG1 2.5-2.75 (exposed 0.25 intra), AG0 2.75-3.0, unit 1 2.75-4.75, unit 0 4.75-6.75,
      RS 6.75-7.75 (exposed 1.0 inter). intra 0.25, inter 1.5, step 6 + 1.75 = 7.75.
    ZeRO-3 with its backward gathers over the world instead (0.5 inter): AG1 2.5-3.0 (0.5 inter):
      intra 0, inter 2.0, step 8.0."""

    def units(back):
        us = [Unit(1, 2, Coll(0.5, "inter", "world"), back) for _ in range(2)]
        us[0].after_backward = (Coll(1.0, "inter", "world"),)
        return us

    assert parts(timeline(units(Coll(0.25, "intra", "hpz")), 1, "pre")) == (2, 4, 0.25, 1.5, 7.75)
    assert parts(timeline(units(Coll(0.5, "inter", "world")), 1, "pre")) == (2, 4, 0, 2.0, 8.0)
    # vit_3b: its first Blocks are released after the forward (vit_micro's stay gathered)
    sc = Scenario(
        model="vit_3b",
        strategy="ZEROPP",
        nodes=2,
        gpus_per_node=2,
        device_memory_gib=None,
        precision="bf16",
        deepspeed=DeepSpeedConfig(param_persistence_threshold=0),
    )
    p = _unit_plan(sc, layout(sc), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    block = p.units[1]
    assert (block.gather_forward.scope, block.gather_backward.scope, block.gather_backward.stream) == (
        "inter",
        "intra",
        "hpz",
    )
    plain = dataclasses.replace(sc, strategy="ZERO3")
    q = _unit_plan(plain, layout(plain), SLOW_INTER, Compute.measured(0.03, 0.0, "test"))
    # qwZ halves the forward gather (1 B vs bf16's 2), qgZ quarters the gradients (0.5 B vs 2)
    assert block.gather_forward.seconds == pytest.approx(q.units[1].gather_forward.seconds / 2)
    assert p.units[0].after_backward[0].seconds == pytest.approx(q.units[0].after_backward[0].seconds / 4)
    # qgZ is timed as a reduce-scatter, not DeepSpeed's two all-to-alls: the rules say it is an approximation
    assert any("qgZ approximated" in r and "all_to_all_quant_reduce" in r for r in p.rules), p.rules
    assert (
        predict_step(sc, SLOW_INTER, Compute.measured(0.03, 0.0, "t")).breakdown.step_s
        < predict_step(plain, SLOW_INTER, Compute.measured(0.03, 0.0, "t")).breakdown.step_s
    )


def test_zero2_gathers_parameters_after_the_step():
    """ZeRO-1/2: bucketed gradient reduction during the backward, then the updated parameters'
    all-gather after the optimizer, exposed whole: its step is at least compute + that gather."""
    sc = Scenario(model="vit_micro", strategy="ZERO2", nodes=1, gpus_per_node=4, device_memory_gib=None)
    p = _unit_plan(sc, layout(sc), FLAT, Compute.measured(0.03, 0.01, "test"))
    assert len(p.after_step) == 1
    b = predict_step(sc, FLAT, Compute.measured(0.03, 0.01, "test")).breakdown
    assert b.step_s >= 0.04 + p.after_step[0].seconds - 1e-12


@pytest.mark.parametrize("strategy", ["ZERO1", "ZERO2"])
def test_zero12_all_reduce_each_bucket(strategy):
    """ZeRO-1/2 with the trainer's reduce_scatter=True and DeepSpeed's default
    use_multi_rank_bucket_allreduce: each bucket goes average_tensor -> allreduce_and_scatter ->
    allreduce_bucket, a full all-reduce over the 4 ranks: S x 2 x 3/4 / 1 GB/s per bucket, and the plan's
    bytes count 2 x 3/4 x 2 B x P of all-reduce, no reduce-scatter."""
    sc = Scenario(model="vit_micro", strategy=strategy, nodes=1, gpus_per_node=4, device_memory_gib=None)
    p = _unit_plan(sc, layout(sc), FLAT, Compute.measured(0.03, 0.01, "test"))
    buckets = _ds_buckets(sc.shape, 2, sc.deepspeed.reduce_bucket_size)
    colls = [c for u in p.units for c in u.after_backward]
    assert sorted(c.seconds for c in colls) == pytest.approx(sorted(s * 2 * 3 / 4 / 1e9 for _, s in buckets))
    got = communication.predict(sc, layout(sc))
    assert got["reduce_scatter"] == {"intra": 0, "inter": 0}
    assert got["all_reduce"]["intra"] == round(2 * 3 / 4 * 2 * sc.shape.params)


def test_deepspeed_bucket_empties_before_the_gradient_that_overflows_it():
    """DeepSpeed's rule (stage_1_and_2.py / stage3.py reduce_independent_p_g_buckets_and_remove_grads:
    `if bucket.elements + param.numel() > reduce_bucket_size` reduce, then add): vit_micro, 40,000-element
    buckets, 2 B gradients, reverse parameter order. The head's bias (1,000) is reduced alone when the
    head's weight (64,000) arrives, by that weight's hook (the head, unit L+1 = 5); the weight, over the
    cap, alone when the final norm's weight arrives (still unit 5). torch's rule (close once the cap is
    reached) would put bias and weight in one 130,000 B bucket instead."""
    sc = Scenario(model="vit_micro", strategy="ZERO2")
    buckets = _ds_buckets(sc.shape, 2, 40_000)
    assert buckets[:2] == [(5, 2_000), (5, 128_000)]
    assert sum(b for _, b in buckets) == 2 * sc.shape.params
    assert buckets[-1][0] == 0 and all(b <= 2 * 40_000 for _, b in buckets[2:])
    assert _buckets(sc, sc.shape, 2, 80_000, 80_000)[0] == (5, 130_000)


# ---------------------------------------------------------------- the prediction as a whole


def test_per_unit_sizes_add_up_to_the_plans_bytes():
    """communication.per_unit (what the timeline times) sums, through the same ledger, to the bytes
    `vit-scale plan` reports per strategy: the two cannot drift."""
    for strategy, nodes in (
        ("FULL_SHARD", 2),
        ("SHARD_GRAD_OP", 2),
        ("HYBRID_2GPU", 2),
        ("ZERO3", 2),
        ("ZEROPP", 2),
        ("CAI_GEMINI", 1),
    ):
        sc = Scenario(model="vit_small", strategy=strategy, nodes=nodes, gpus_per_node=2, device_memory_gib=None)
        lay = layout(sc)
        colls = communication.per_unit(sc, lay)
        ledger = communication.Ledger(sc)
        for e in colls["units"]:
            ledger.add("all_gather", e["gather_forward"], *colls["gather"])
            ledger.add("all_gather", e["gather_backward"], *colls.get("gather_backward", colls["gather"]))
            ledger.add("reduce_scatter", e["reduce_scatter"], *colls["reduce"])
            ledger.add("all_reduce", e["all_reduce"], *colls["replicate"])
        ledger.add("all_gather", colls.get("after_step", 0), *colls["gather"])  # ZeRO-3's persistent parameters
        got, want = ledger.result(), communication.predict(sc, lay)
        for key in ("all_gather", "reduce_scatter", "all_reduce"):
            for scope in ("intra", "inter"):
                assert got[key][scope] == pytest.approx(want[key][scope], abs=2), (strategy, key, scope)


def test_not_fitting_is_predicted_as_not_fitting():
    """vit_3b under DDP on a 64 GiB GCD does not fit (docs/plan.md): no speed, a rule that says why."""
    sc = Scenario(model="vit_3b", strategy="DDP", nodes=1, gpus_per_node=8, device_memory_gib=64.0)
    p = predict_step(sc, FLAT, Compute.measured(1.0, 0.1, "test"))
    assert p.fits is False and p.breakdown is None and p.images_per_s is None
    assert "does not fit" in p.rules[0]
    assert p.as_dict()["step"] is None


def test_compute_from_flops_and_blocking_collectives():
    """Compute from FLOPs: a step's FLOPs = batch x 3 x forward FLOPs (backward twice the forward),
    over peak x efficiency, split 1:2. On a CPU with blocking collectives FULL_SHARD hides nothing:
    its step is compute + every collective's time; DDP's reducer stays asynchronous."""
    sc = Scenario(model="vit_micro", strategy="FULL_SHARD", nodes=1, gpus_per_node=2, device_memory_gib=None)
    comp = Compute.from_flops(sc, peak_tflops=1.0, efficiency=0.5)
    total = sc.batch_size * train_flops_per_image(sc.shape) / 0.5e12
    assert comp.forward_s + comp.backward_s == pytest.approx(total)
    assert comp.backward_s == pytest.approx(2 * comp.forward_s)
    b = predict_step(sc, FLAT, comp, blocking=True).breakdown
    assert b.step_s == pytest.approx(comp.forward_s + comp.backward_s + sum(b.communication_s.values()))
    assert predict_step(sc, FLAT, comp).breakdown.step_s < b.step_s
    ddp = dataclasses.replace(sc, strategy="DDP")
    assert predict_step(ddp, FLAT, comp, blocking=True).rules == predict_step(ddp, FLAT, comp).rules
    with pytest.raises(ValueError, match="efficiency"):
        Compute.from_flops(sc, 1.0, 1.5)


def test_an_mfu_under_checkpointing_gives_back_its_step():
    """A recorded MFU counts model FLOPs without the recompute (vit_scale.models.flops_per_image): a run
    of 1.0 s at MFU m under activation checkpointing did 3F of model FLOPs and 4F of work. Applied back, the
    step is 1.0 s, not 4/3 s, split as the executed FLOPs are: forward 1/4, backward (recompute in) 3/4."""
    sc = Scenario(model="vit_base", strategy="DDP", nodes=1, gpus_per_node=1, activation_checkpointing=True)
    model_flops = sc.batch_size * train_flops_per_image(sc.shape)
    mfu = model_flops / (1.0 * 191.5e12)
    comp = Compute.from_flops(sc, 191.5, mfu)
    assert comp.forward_s + comp.backward_s == pytest.approx(1.0)
    f = forward_flops_per_image(sc.shape)
    fwd = f["stem"] + sc.shape.L * f["block"] + f["head"]
    assert comp.forward_s == pytest.approx(fwd / train_flops_per_image(sc.shape, True))
    assert "recompute inside" in comp.source
