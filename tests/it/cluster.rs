//! Redis Cluster mode against a real 3-primary cluster on loopback: targets whose slots live
//! on different nodes are entered, admitted one batch per tick, polled and gated; the function
//! library is loaded on whichever node lacks it; `vq flag off` is confirmed through the cluster; the
//! per-user count of queues spreads over the nodes and holds its limit.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::Value;
use vq::domain::{QueueTarget, UserId};
use vq::store::prelude::*;
use vq::store::{EnterOutcome, StatusOutcome};

use crate::support::{
    RedisCluster, VqProcess, cluster_flag_on, cluster_settings, function_libraries, open_store, spawn_app, vq_command,
};

/// Targets whose keys live on every one of the three primaries, two per node.
async fn targets_on_every_node(cluster: &RedisCluster) -> Vec<(QueueTarget, u16)> {
    let mut per_node: BTreeMap<u16, usize> = BTreeMap::new();
    let mut picked = Vec::new();
    for id in 1..=200u64 {
        let kind = if id % 2 == 0 { "LIMITED_DROP" } else { "TICKETING_EVENT" };
        let target: QueueTarget = format!("{kind}:{id}").parse().unwrap();
        let node = cluster.node_of(&format!("queue:{{{target}}}:seq")).await;
        let n = per_node.entry(node).or_default();
        if *n < 2 {
            *n += 1;
            picked.push((target, node));
        }
        if picked.len() == 6 {
            break;
        }
    }
    let nodes: HashSet<u16> = picked.iter().map(|(_, n)| *n).collect();
    assert_eq!(nodes.len(), 3, "targets spread over the three primaries: {picked:?}");
    picked
}

fn api_path(target: QueueTarget) -> String {
    let s = target.to_string();
    let (kind, id) = s.split_once(':').unwrap();
    let slug = if kind == "LIMITED_DROP" { "limited-drop" } else { "ticketing-event" };
    format!("{slug}/{id}")
}

fn purchase_path(target: QueueTarget) -> String {
    let s = target.to_string();
    let (kind, id) = s.split_once(':').unwrap();
    if kind == "LIMITED_DROP" { format!("/limited-drops/{id}/orders") } else { format!("/events/{id}/seats/select") }
}

#[tokio::test]
async fn targets_on_different_nodes_are_admitted_one_batch_per_tick_polled_and_gated() {
    let cluster = RedisCluster::spawn();
    let targets = targets_on_every_node(&cluster).await;
    let mut s = cluster_settings(&cluster);
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    // Not fail-open on a loaded machine: this is about admission across nodes.
    s.redis.timeout_ms = 5000;
    let (batch, users) = (10u64, 25u64);
    let app = spawn_app(s, true).await;
    cluster_flag_on(&cluster).await;

    // Users named as shops name them: integers, UUIDs, strings (each id is a field in one of
    // the per-user queue count's buckets, and a member in the target's slot).
    let id = |u: u64| match u % 3 {
        0 => u.to_string(),
        1 => format!("3f2a9c1e-7b4d-4c1e-9a8f-{u:012}"),
        _ => format!("buyer_{u}@shop.example"),
    };
    for (t, _) in &targets {
        for u in 1..=users {
            let v = app.json(app.enter(&api_path(*t), id(u)).await).await;
            assert_eq!(v["status"], "WAITING", "{t} user {u}: {v}");
            assert_eq!(v["position"], u, "{t}: positions in order");
        }
    }

    // Poll everyone (heartbeats) until every user of every target holds a token.
    let mut tokens: BTreeMap<(String, u64), String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while tokens.len() < targets.len() * users as usize {
        assert!(Instant::now() < deadline, "only {} admitted", tokens.len());
        for (t, _) in &targets {
            for u in 1..=users {
                if tokens.contains_key(&(t.to_string(), u)) {
                    continue;
                }
                let v = app.json(app.poll(&api_path(*t), id(u)).await).await;
                if v["status"] == "ADMITTED" {
                    tokens.insert((t.to_string(), u), v["entryToken"].as_str().unwrap().to_owned());
                } else {
                    assert_eq!(v["status"], "WAITING", "{t} user {u}: {v}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // admit.lua's log of each target (on that target's node): one batch at most per tick.
    let mut c = cluster.conn().await;
    for (t, node) in &targets {
        let log: Vec<String> = c.lrange(format!("queue:{{{t}}}:admissions"), 0, -1).await.unwrap();
        let mut ticks = HashSet::new();
        let mut total = 0;
        for entry in &log {
            let (tick, n) = entry.split_once(':').unwrap();
            assert!(ticks.insert(tick.to_owned()), "{t}: tick {tick} advanced twice");
            let n: u64 = n.parse().unwrap();
            assert!(n <= batch, "{t}: {n} admitted in one tick");
            total += n;
        }
        assert_eq!(total, users, "{t} (node {node}): {log:?}");
        assert!(log.iter().filter(|e| !e.ends_with(":0")).count() >= 3, "{t}: 25 users need 3 ticks of 10: {log:?}");
    }

    // The gate, per target: the user's own token passes once; no token, another target's
    // token, or a used token is refused.
    for (i, (t, _)) in targets.iter().enumerate() {
        let (other, _) = targets[(i + 1) % targets.len()];
        let path = app.url(&purchase_path(*t));
        let own = &tokens[&(t.to_string(), 1)];
        let foreign = &tokens[&(other.to_string(), 1)];
        let post = |token: Option<&str>| {
            let mut r = app.client.post(&path).header("X-User-Id", id(1));
            if let Some(tok) = token {
                r = r.header("X-Entry-Token", tok);
            }
            r.send()
        };
        assert_eq!(post(None).await.unwrap().status(), 403, "{t}: no token");
        assert_eq!(post(Some(foreign)).await.unwrap().status(), 403, "{t}: token of {other}");
        let ok = post(Some(own)).await.unwrap();
        assert_eq!(ok.status(), 200, "{t}: own token");
        let echoed: Value = ok.json().await.unwrap();
        assert_eq!(echoed["path"], purchase_path(*t));
        assert_eq!(post(Some(own)).await.unwrap().status(), 403, "{t}: used token");
    }
    app.stop().await;
}

/// A fresh cluster holds no function: the library is loaded on each node the first call for
/// one of its keys lands on. A node that loses it (`FUNCTION FLUSH`, as a node added to the
/// cluster or a replica promoted without it) gets it again with its next call, while the
/// others keep theirs.
#[tokio::test]
async fn the_library_is_loaded_on_each_node_that_lacks_it() {
    let cluster = RedisCluster::spawn();
    let targets = targets_on_every_node(&cluster).await;
    let store = open_store(&cluster_settings(&cluster));
    for (t, _) in &targets {
        assert!(
            matches!(store.enter(*t, UserId::from(1), &"tok").await.unwrap(), EnterOutcome::Waiting(w) if w.seq == 1)
        );
    }
    for port in &cluster.ports {
        assert_eq!(libraries(&cluster, *port).await.len(), 1, "node {port}");
    }
    let flushed = targets[0].1;
    let mut c = cluster.node_conn(flushed).await;
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut c).await.unwrap();
    let kept = libraries(&cluster, targets.iter().find(|(_, n)| *n != flushed).unwrap().1).await;
    for (t, _) in &targets {
        assert!(
            matches!(store.enter(*t, UserId::from(2), &"tok").await.unwrap(), EnterOutcome::Waiting(w) if w.seq == 2)
        );
        assert!(
            matches!(store.status(*t, UserId::from(1), &"tok").await.unwrap(), StatusOutcome::Waiting(w) if w.seq == 1)
        );
    }
    // Every node holds the one library again, the same everywhere; no script went as EVALSHA.
    for port in &cluster.ports {
        assert_eq!(libraries(&cluster, *port).await, kept, "node {port}");
        let mut c = cluster.node_conn(*port).await;
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
        assert!(info.contains("cmdstat_fcall:"), "node {port}: {info}");
        assert!(!info.contains("cmdstat_evalsha:"), "node {port}: {info}");
    }
}

/// The names of the function libraries a node holds.
async fn libraries(cluster: &RedisCluster, port: u16) -> Vec<String> {
    function_libraries(&mut cluster.node_conn(port).await).await
}

/// Two `vq serve` processes in cluster mode acknowledge flag changes; `vq flag on` and
/// `vq flag off` (also in cluster mode) name both as having applied them.
#[tokio::test]
async fn flag_off_is_confirmed_by_every_instance_on_the_cluster() {
    let cluster = RedisCluster::spawn();
    let mut procs = Vec::new();
    for name in ["vq-c1", "vq-c2"] {
        let envs = [
            ("VQ_REDIS__CLUSTER_NODES", cluster.nodes()),
            ("VQ_INSTANCE_ID", name.to_owned()),
            ("VQ_FLAG__REFRESH_MS", "200".to_owned()),
        ];
        procs.push(VqProcess::serve_env(&envs).await);
    }
    let vq = |args: &[&str]| {
        vq_command().args(args).env("VQ_REDIS__CLUSTER_NODES", cluster.nodes()).output().expect("run vq")
    };
    let on = vq(&["flag", "on"]);
    assert!(on.status.success(), "{}", String::from_utf8_lossy(&on.stderr));
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/virtual-queues/limited-drop/5/entries", procs[1].addr))
        .header("X-User-Id", "4")
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "WAITING");
    let off = vq(&["flag", "off"]);
    let out = String::from_utf8_lossy(&off.stdout);
    assert!(off.status.success(), "{out}\n{}", String::from_utf8_lossy(&off.stderr));
    for name in ["vq-c1", "vq-c2"] {
        assert!(out.lines().any(|l| l.contains(name) && l.contains("applied")), "{name} missing in:\n{out}");
    }
}

/// In cluster mode `vq stats` names the cluster's nodes, never `redis.url` (unused there, and
/// by default `redis://127.0.0.1:6379`, a server that may not even exist).
#[tokio::test]
async fn vq_stats_on_a_cluster_names_its_nodes_not_the_unused_url() {
    let cluster = RedisCluster::spawn();
    let vq = |args: &[&str]| {
        vq_command().args(args).env("VQ_REDIS__CLUSTER_NODES", cluster.nodes()).output().expect("run vq")
    };
    let text = vq(&["stats"]);
    let header = String::from_utf8_lossy(&text.stdout).lines().next().unwrap_or_default().to_owned();
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    assert!(header.contains(&format!("redis cluster {} ok", cluster.nodes())), "{header}");
    assert!(!header.contains(":6379"), "{header}");
    let json = vq(&["stats", "--json"]);
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let v: Value = serde_json::from_slice(&json.stdout).expect("json");
    let nodes: Vec<String> = cluster.nodes().split(',').map(str::to_owned).collect();
    assert_eq!(v["redis"]["clusterNodes"], serde_json::json!(nodes));
    assert!(v["redis"].get("url").is_none(), "{v}");
}

/// The per-user count of queues (`queue.max_queues_per_user`) on a cluster: its buckets live on
/// every primary, and 300 users each racing into three targets at once (their counts gathered
/// into shared calls per bucket, written ahead without a script once Redis' clock is known)
/// are each counted in exactly the limit's two; a drop frees one.
#[tokio::test]
async fn users_counts_of_queues_spread_over_the_nodes_and_keep_the_limit() {
    let cluster = RedisCluster::spawn();
    let mut s = cluster_settings(&cluster);
    s.redis.timeout_ms = 5000;
    let store = open_store(&s);
    wait_clock_known(&store).await;
    let tt = |id: u64| QueueTarget::new("LIMITED_DROP:1".parse::<QueueTarget>().unwrap().kind, id);
    let mut tasks = tokio::task::JoinSet::new();
    for u in 1..=300u64 {
        for id in 1..=3 {
            let store = store.clone();
            tasks.spawn(async move { (u, store.hold_queue(UserId::from(u), tt(id), 2).await.unwrap().is_empty()) });
        }
    }
    let mut counted: BTreeMap<u64, u32> = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        let (u, ok) = r.unwrap();
        *counted.entry(u).or_default() += u32::from(ok);
    }
    assert!(counted.values().all(|n| *n == 2), "each user counted in exactly two: {counted:?}");
    store.release_queues(UserId::from(7), &[tt(1), tt(2), tt(3)]).await.unwrap();
    assert!(store.hold_queue(UserId::from(7), tt(4), 2).await.unwrap().is_empty(), "dropped: a place is free");

    let mut c = cluster.conn().await;
    let mut nodes = HashSet::new();
    for b in 0..16 {
        let keys: Vec<String> = c.keys(format!("queue:holds:{{h{b}}}:*")).await.unwrap();
        assert!(!keys.is_empty(), "bucket {b} holds users");
        nodes.insert(cluster.node_of(&keys[0]).await);
    }
    assert_eq!(nodes.len(), 3, "the buckets spread over the three primaries");
}

/// A node gone that holds some users' counts of queues but not the target: those users still
/// wait in the target's queue, given their place uncounted, rather than being let past it
/// (`DIRECT_ADMITTED`) or refused (`on_store_failure = "closed"`) for a node their place does
/// not live on. Users counted before, fresh users, both failure settings, and a node that
/// stalls (stopped, its connections open) as well as one that dies. (The node gone
/// holds none of the keys every instance shares, such as the flag, and the test ends before
/// the cluster's node timeout, 15 s, after which the cluster itself refuses every command.)
#[tokio::test]
async fn a_node_holding_users_counts_gone_leaves_them_queueing_in_a_target_that_answers() {
    for (closed, stalled) in [(false, false), (true, false), (false, true)] {
        let mut cluster = RedisCluster::spawn();
        let targets = targets_on_every_node(&cluster).await;
        let mut shared = HashSet::new();
        for key in ["queue:active", "queue:targets", "virtual-queue:flag", "virtual-queue:acks"] {
            shared.insert(cluster.node_of(key).await);
        }
        let gone = *cluster.ports.iter().find(|p| !shared.contains(p)).expect("a node without shared keys");
        let mut live = targets.iter().filter(|(_, n)| *n != gone).map(|(t, _)| *t);
        let (first, other) = (live.next().unwrap(), live.next().unwrap());
        let mut s = cluster_settings(&cluster);
        s.redis.timeout_ms = 1000;
        if closed {
            s.queue.on_store_failure = vq::config::OnStoreFailure::Closed;
        }
        let app = spawn_app(s, false).await;
        cluster_flag_on(&cluster).await;
        let user = |u: u64| format!("buyer-{u}");
        for u in 1..=30 {
            let v = app.json(app.enter(&api_path(first), user(u)).await).await;
            assert_eq!(v["status"], "WAITING", "user {u}: {v}");
        }
        // Which node holds each user's count: the field of their bucket's HASH.
        let mut c = cluster.conn().await;
        let mut node_of_count: BTreeMap<String, u16> = BTreeMap::new();
        for b in 0..16 {
            let keys: Vec<String> = c.keys(format!("queue:holds:{{h{b}}}:*")).await.unwrap();
            for key in keys {
                let node = cluster.node_of(&key).await;
                let fields: Vec<String> = c.hkeys(&key).await.unwrap();
                node_of_count.extend(fields.into_iter().map(|f| (f, node)));
            }
        }
        let on_gone: Vec<u64> = (1..=30).filter(|u| node_of_count.get(&user(*u)) == Some(&gone)).collect();
        assert!(!on_gone.is_empty(), "some users are counted on node {gone}: {node_of_count:?}");
        if stalled {
            cluster.stall_node(gone);
        } else {
            cluster.kill_node(gone);
        }
        app.wait_silent(gone).await;
        // Users counted on the gone node enter another target, on a node that answers.
        for u in &on_gone {
            let v = app.json(app.enter(&api_path(other), user(*u)).await).await;
            assert_eq!(v["status"], "WAITING", "user {u}, counted on the gone node, enters {other}: {v}");
        }
        // Fresh users, whatever node their count would live on.
        for u in 100..130 {
            let v = app.json(app.enter(&api_path(other), user(u)).await).await;
            assert_eq!(v["status"], "WAITING", "fresh user {u} enters {other}: {v}");
        }
        app.stop().await;
    }
}

/// Waits (10 s at most) until the store's probe has read Redis' clock.
async fn wait_clock_known(store: &vq::store::AnyStore) {
    let start = Instant::now();
    while store.clock_offset_ms().is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "the probe never read Redis' clock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Script calls that ran and `HSETNX`s, over every node of the cluster.
async fn hold_work(cluster: &RedisCluster) -> (u64, u64) {
    let (mut scripts, mut written) = (0, 0);
    for port in &cluster.ports {
        let info: String =
            redis::cmd("INFO").arg("commandstats").query_async(&mut cluster.node_conn(*port).await).await.unwrap();
        // Calls that ran: a call that found the library missing (then loaded) failed.
        let calls = |c: &str| -> u64 {
            let Some(row) = info.lines().find_map(|l| l.strip_prefix(&format!("cmdstat_{c}:"))) else { return 0 };
            let field = |name: &str| -> u64 {
                row.split(',')
                    .find_map(|f| f.strip_prefix(&format!("{name}=")))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            field("calls") - field("failed_calls")
        };
        scripts += calls("fcall") + calls("evalsha");
        written += calls("hsetnx");
    }
    (scripts, written)
}

/// On a cluster a new user's count of queues takes no script call (`holds.rs`' pipeline writes
/// the field), nor does a user's count of a target they hold already or one refused at the
/// limit; a user holding another queue is counted by the script. A user the previous
/// generation holds is checked by the script after the count was written ahead: refused and
/// the count taken back at the limit, kept below it, the two generations merged either way.
#[tokio::test]
async fn a_new_users_count_takes_no_script_and_the_script_checks_what_the_fields_cannot_say() {
    let cluster = RedisCluster::spawn();
    let mut s = cluster_settings(&cluster);
    s.redis.timeout_ms = 5000;
    s.queue.key_ttl_s = 86_400;
    let gen_ms = s.queue.key_ttl_s * 1000;
    let store = open_store(&s);
    let tt = |id: u64| QueueTarget::new("LIMITED_DROP:1".parse::<QueueTarget>().unwrap().kind, id);
    // Counts are written ahead once Redis' clock is known, away from a generation's edge.
    wait_clock_known(&store).await;
    let now = || vq::clock::now_epoch_ms();
    while now() % gen_ms < 3000 || gen_ms - now() % gen_ms < 3000 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = hold_work(&cluster).await;
    let users: Vec<UserId> = (1_000..1_040u64).map(UserId::from).collect();
    for u in &users {
        assert!(store.hold_queue(u.clone(), tt(1), 2).await.unwrap().is_empty(), "{u} counted");
        assert!(store.hold_queue(u.clone(), tt(1), 2).await.unwrap().is_empty(), "{u} counted there already");
    }
    let after = hold_work(&cluster).await;
    assert_eq!(after.0 - before.0, 0, "no script for new users or a target counted already");
    assert_eq!(after.1 - before.1, 80, "one HSETNX a count");
    // A second target: the script appends it. A third at the limit of 2: refused by the fields.
    assert!(store.hold_queue(users[0].clone(), tt(2), 2).await.unwrap().is_empty());
    let scripted = hold_work(&cluster).await.0;
    assert_eq!(scripted - after.0, 1, "the script counts a user holding another queue");
    let held = store.hold_queue(users[0].clone(), tt(3), 2).await.unwrap();
    let mut names: Vec<QueueTarget> = held.iter().map(|(t, _)| *t).collect();
    names.sort();
    assert_eq!(names, vec![tt(1), tt(2)], "refused with the two held: {held:?}");
    assert_eq!(hold_work(&cluster).await.0, scripted, "a refusal at the limit takes no script");

    // Users the previous generation holds (as after an hour's turn): checked by the script.
    let mut c = cluster.conn().await;
    let g = now() / gen_ms;
    let previous = |u: &UserId| {
        let h = u.as_str().bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193)) % 16;
        (format!("queue:holds:{{h{h}}}:{}", g - 1), format!("queue:holds:{{h{h}}}:{g}"))
    };
    let (at_limit, below) = (UserId::from(2_001), UserId::from(2_002));
    let t0 = now() - 60_000;
    let (old, cur) = previous(&at_limit);
    let _: () = c.hset(&old, at_limit.as_str(), format!("{}={t0} {}={t0}", tt(1), tt(2))).await.unwrap();
    let held = store.hold_queue(at_limit.clone(), tt(3), 2).await.unwrap();
    assert_eq!(held.len(), 2, "the previous generation's two count: refused {held:?}");
    let field: Option<String> = c.hget(&cur, at_limit.as_str()).await.unwrap();
    assert_eq!(
        field,
        Some(format!("{}={t0} {}={t0}", tt(1), tt(2))),
        "the count written ahead taken back, the two moved"
    );
    let gone: Option<String> = c.hget(&old, at_limit.as_str()).await.unwrap();
    assert_eq!(gone, None, "moved out of the previous generation");

    let (old, cur) = previous(&below);
    let _: () = c.hset(&old, below.as_str(), format!("{}={t0}", tt(1))).await.unwrap();
    assert!(store.hold_queue(below.clone(), tt(2), 2).await.unwrap().is_empty(), "one held before: counted");
    let field: String = c.hget(&cur, below.as_str()).await.unwrap();
    let targets: Vec<&str> = field.split(' ').filter_map(|e| e.split('=').next()).collect();
    assert_eq!(targets, vec![tt(1).to_string(), tt(2).to_string()], "merged in counted order: {field}");
    assert!(!store.hold_queue(below.clone(), tt(3), 2).await.unwrap().is_empty(), "two held now: refused");

    // A count written ahead that no check has merged yet (another instance's, in flight): a
    // count of another target still sees the previous generation's.
    let racing = UserId::from(2_003);
    let (old, cur) = previous(&racing);
    let _: () = c.hset(&old, racing.as_str(), format!("{}={t0}", tt(4))).await.unwrap();
    let _: () = c.hset(&cur, racing.as_str(), format!("{}={}", tt(5), now())).await.unwrap();
    let held = store.hold_queue(racing.clone(), tt(6), 2).await.unwrap();
    let mut names: Vec<QueueTarget> = held.iter().map(|(t, _)| *t).collect();
    names.sort();
    assert_eq!(names, vec![tt(4), tt(5)], "both generations count: refused {held:?}");
}
