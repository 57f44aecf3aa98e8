//! A Redis failover that loses the last writes: vq never contradicts what it told a buyer.
//!
//! Real processes: a primary and its replica (`redis-server --replicaof`), two `vq serve`
//! reaching Redis through a relay (what a failover moves: a virtual IP, a DNS name), and the
//! replica's replication stream through another relay. Buyers enter and poll; then the
//! replication relay drops the stream (the replica falls behind, its link still open: what a
//! lagging replica looks like to the primary) while buyers go on entering, being admitted and
//! given tokens; then the primary is killed, the replica promoted (`REPLICAOF NO ONE`) and the
//! vq relay pointed at it, and buyers go on. (`SIGSTOP` of the replica would not lose the
//! writes: the stream waits in its socket buffer and is read after `SIGCONT`.)
//!
//! Checked over every answer: no position (seq) told to two users, no user told two different
//! tokens (DIRECT_ADMITTED fail-open tokens aside, as documented), no user told ADMITTED and
//! later WAITING or NOT_IN_QUEUE. Each buyer polls the instance they entered through (a token
//! remembered by one instance is not known to the other: docs/deploy.md). Bounded in time; no
//! timing is asserted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use redis::AsyncCommands;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{RedisServer, Relay, VqProcess, flag_on};

const TARGET: &str = "limited-drop/31";
const NEW_PER_ROUND: u64 = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Told {
    Waiting(u64),
    Admitted(String),
    Direct,
    NotInQueue,
    Other(u16),
}

/// One request for `user` through `addr`: an enter (POST) or a poll (GET).
pub(crate) async fn ask(client: reqwest::Client, addr: String, user: u64, enter: bool) -> Told {
    let url = if enter {
        format!("{addr}/virtual-queues/{TARGET}/entries")
    } else {
        format!("{addr}/virtual-queues/{TARGET}/entries/me")
    };
    let req = if enter { client.post(url) } else { client.get(url) };
    let Ok(resp) = req.header("X-User-Id", user.to_string()).timeout(Duration::from_secs(10)).send().await else {
        return Told::Other(0);
    };
    let code = resp.status().as_u16();
    if code == 404 {
        return Told::NotInQueue;
    }
    if code != 200 {
        return Told::Other(code);
    }
    let Ok(body) = resp.json::<serde_json::Value>().await else { return Told::Other(0) };
    match body["status"].as_str() {
        Some("WAITING") => Told::Waiting(body["position"].as_u64().expect("position")),
        Some("ADMITTED") => Told::Admitted(body["entryToken"].as_str().expect("token").to_owned()),
        Some("DIRECT_ADMITTED") => Told::Direct,
        _ => Told::Other(code),
    }
}

/// Every answer in order: (user, phase, what they were told).
type Log = Vec<(u64, &'static str, Told)>;

/// The buyers: user `u` enters and polls through instance `u % 2`.
struct Buyers {
    addrs: Vec<String>,
    client: reqwest::Client,
    users: Vec<u64>,
    last: HashMap<u64, Told>,
    log: Log,
}

impl Buyers {
    /// Rounds for `secs`: each enters [`NEW_PER_ROUND`] new users and polls every user once; a
    /// user told NOT_IN_QUEUE enters again (as the waiting page does).
    async fn run(&mut self, phase: &'static str, secs: u64) {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            let mut set = JoinSet::new();
            let first = self.users.len() as u64 + 1;
            self.users.extend(first..first + NEW_PER_ROUND);
            for (i, &u) in self.users.iter().enumerate() {
                let enter = i as u64 + 1 >= first || matches!(self.last.get(&u), Some(Told::NotInQueue));
                let (c, addr) = (self.client.clone(), self.addrs[(u % 2) as usize].clone());
                set.spawn(async move { (u, ask(c, addr, u, enter).await) });
            }
            while let Some(done) = set.join_next().await {
                let (u, told) = done.expect("request task");
                self.last.insert(u, told.clone());
                self.log.push((u, phase, told));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Positions → the users told them, users → their tokens, users sent back (kept only where
/// two or more).
type Contradictions = (BTreeMap<u64, BTreeSet<u64>>, BTreeMap<u64, BTreeSet<String>>, BTreeSet<u64>);

/// The contradictions in a log: positions told to two users, users told two tokens, users
/// told ADMITTED and then WAITING or NOT_IN_QUEUE.
fn contradictions(log: &Log) -> Contradictions {
    let mut by_position: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut tokens: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut admitted = BTreeSet::new();
    let mut sent_back = BTreeSet::new();
    for (u, _, told) in log {
        match told {
            Told::Waiting(p) => {
                by_position.entry(*p).or_default().insert(*u);
                if admitted.contains(u) {
                    sent_back.insert(*u);
                }
            }
            Told::NotInQueue if admitted.contains(u) => {
                sent_back.insert(*u);
            }
            Told::Admitted(t) => {
                tokens.entry(*u).or_default().insert(t.clone());
                admitted.insert(*u);
            }
            _ => {}
        }
    }
    by_position.retain(|_, users| users.len() > 1);
    tokens.retain(|_, t| t.len() > 1);
    (by_position, tokens, sent_back)
}

pub(crate) async fn seq_counter(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    let seq: Option<u64> = c.get("queue:{LIMITED_DROP:31}:seq").await.expect("GET seq");
    seq.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_writes_never_contradicts_what_buyers_were_told() {
    let mut primary = RedisServer::spawn();
    let link = Relay::start(primary.port);
    let replica = RedisServer::spawn_replica_of(link.port);
    let front = Relay::start(primary.port);
    let envs = [
        ("VQ_REDIS__URL", format!("redis://127.0.0.1:{}", front.port)),
        ("VQ_REDIS__TIMEOUT_MS", crate::support::TEST_REDIS_TIMEOUT_MS.to_string()),
        ("VQ_QUEUE__TICK_MS", "250".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "6".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let procs = [VqProcess::serve_env(&envs).await, VqProcess::serve_env(&envs).await];
    let addrs: Vec<String> = procs.iter().map(|p| p.addr.clone()).collect();
    flag_on(&primary).await;

    let mut buyers =
        Buyers { addrs, client: reqwest::Client::new(), users: Vec::new(), last: HashMap::new(), log: Log::new() };
    buyers.run("in sync", 2).await;

    // The replica falls behind: everything from here on is lost by the failover.
    link.freeze();
    let kept = seq_counter(&replica).await;
    buyers.run("replica behind", 3).await;
    let told_before_failover = seq_counter(&primary).await;

    primary.kill();
    let mut c = replica.conn().await;
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut c).await.expect("promote");
    front.retarget(replica.port);
    assert!(
        seq_counter(&replica).await < told_before_failover,
        "the failover lost no seq ({kept} kept of {told_before_failover}): the test proves nothing"
    );
    buyers.run("after failover", 5).await;

    let (users, log) = (buyers.users, buyers.log);
    let (positions, tokens, sent_back) = contradictions(&log);
    let count = |phase: &str, f: fn(&Told) -> bool| log.iter().filter(|(_, p, t)| *p == phase && f(t)).count();
    let admitted_after = count("after failover", |t| matches!(t, Told::Admitted(_)));
    let summary = format!(
        "{} users, {} answers; seq counter {kept} kept of {told_before_failover}; after the failover: \
         {admitted_after} ADMITTED, {} DIRECT_ADMITTED, {} NOT_IN_QUEUE; \
         {} positions told to two users, {} users told two tokens, {} admitted users sent back",
        users.len(),
        log.len(),
        count("after failover", |t| matches!(t, Told::Direct)),
        count("after failover", |t| matches!(t, Told::NotInQueue)),
        positions.len(),
        tokens.len(),
        sent_back.len(),
    );
    eprintln!("{summary}");
    let firsts = |m: &BTreeMap<u64, _>| m.keys().take(5).copied().collect::<Vec<_>>();
    assert!(positions.is_empty(), "{summary}; e.g. positions {:?}", positions.iter().take(5).collect::<Vec<_>>());
    assert!(tokens.is_empty(), "{summary}; e.g. users {:?}", firsts(&tokens));
    assert!(sent_back.is_empty(), "{summary}; e.g. users {:?}", sent_back.iter().take(5).collect::<Vec<_>>());
    assert!(admitted_after > 0, "the queue admits again after the failover: {summary}");

    // The lost writes were detected and counted.
    let mut fenced = 0.0;
    for p in &procs {
        let text = reqwest::get(format!("{}/metrics", p.addr)).await.expect("metrics").text().await.expect("text");
        fenced += text
            .lines()
            .filter(|l| l.starts_with("virtual_queue_failover_fenced_total{counter=\"seq\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    assert!(fenced >= 1.0, "no instance counted a fenced seq: {summary}");
}
