//! enter.lua and status.lua called directly with one batch holding every kind of user at once
//! (new, waiting, admitted, holding a stored or used token, unknown, full, twice in the call):
//! each must get the answer it would get alone. The coalescer makes such batches under load;
//! here they are built by hand so that every case is certain to be in one call.

use redis::aio::MultiplexedConnection;

use vq::store::layout::{self, EnterArgs, LeaveArgs, ScriptArgs, StatusArgs, TokenClaimArgs};

use crate::support::{RedisServer, lua_as_sent};

const P: &str = "queue:{LIMITED_DROP:1}:";

/// The script's reply as strings: `[mark, batch, then code, a, b per user]`. Its target keys
/// (`names`) and its arguments (`head`) are vq's declarations (`store::layout`), which its tests
/// check against the script's header.
async fn call(
    c: &mut MultiplexedConnection,
    script: &str,
    names: &[&str],
    head: &[Vec<u8>],
    users: &[u64],
) -> Vec<String> {
    call_with_tail(c, script, names, head, users, &[]).await
}

/// [`call`], with `tail` after the users.
async fn call_with_tail(
    c: &mut MultiplexedConnection,
    script: &str,
    names: &[&str],
    head: &[Vec<u8>],
    users: &[u64],
    tail: &[Vec<u8>],
) -> Vec<String> {
    let script = redis::Script::new(script);
    let mut inv = script.prepare_invoke();
    for name in names {
        inv.key(format!("{P}{name}"));
    }
    for u in users {
        inv.key(format!("{P}token:{u}"));
    }
    for a in head {
        inv.arg(a);
    }
    for u in users {
        inv.arg(u);
    }
    for a in tail {
        inv.arg(a);
    }
    let reply: Vec<redis::Value> = inv.invoke_async(c).await.expect("script call");
    reply
        .into_iter()
        .map(|v| match v {
            redis::Value::Int(n) => n.to_string(),
            redis::Value::BulkString(b) => String::from_utf8(b).expect("utf-8"),
            other => panic!("unexpected reply item {other:?}"),
        })
        .collect()
}

async fn enter(c: &mut MultiplexedConnection, max: u64, users: &[u64]) -> Vec<String> {
    enter_fenced(c, max, Fence::default(), users).await
}

/// What an instance has seen of the target (`store/redis/fence.rs`): the highest seq given,
/// what the counter jumps to when found below it, the highest mark.
#[derive(Default)]
struct Fence {
    seq_seen: u64,
    seq_to: u64,
    mark: u64,
}

async fn enter_fenced(c: &mut MultiplexedConnection, max: u64, f: Fence, users: &[u64]) -> Vec<String> {
    let args = EnterArgs {
        capacity: max,
        key_ttl_s: 1800,
        seq_seen: f.seq_seen,
        seq_to: f.seq_to,
        mark_seen: f.mark,
        tick_ms: 1000,
        record_ttl_s: 86_400,
        hold_max: 0,
        hold_target: "",
        hold_generation: 0,
        hold_generation_ms: 0,
    };
    call(c, &lua_as_sent(include_str!("../../lua/enter.lua")), layout::ENTER_KEYS, &args.argv(), users).await
}

async fn status(c: &mut MultiplexedConnection, users: &[u64]) -> Vec<String> {
    status_fenced(c, 0, users).await
}

/// A poll of `users`, each with the token `issued-<user>` to store if the call finds them
/// admitted.
async fn status_fenced(c: &mut MultiplexedConnection, mark: u64, users: &[u64]) -> Vec<String> {
    let args = StatusArgs {
        mark_seen: mark,
        key_ttl_s: 1800,
        token_ttl_s: 300,
        record_ttl_s: 86_400,
        hold_target: "",
        hold_generation: 0,
        hold_generation_ms: 0,
    };
    let head = args.argv();
    // call() sends the head, then the users; the tokens go after the users.
    let tokens: Vec<Vec<u8>> = users.iter().map(|u| format!("issued-{u}").into_bytes()).collect();
    call_with_tail(c, &lua_as_sent(include_str!("../../lua/status.lua")), layout::STATUS_KEYS, &head, users, &tokens)
        .await
}

/// Redis' clock, epoch ms: the scripts keep times by it, never by the caller's.
async fn redis_ms(c: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(c).await.unwrap();
    s * 1000 + us / 1000
}

/// Redis' clock in ms, once its heartbeat slot is later than that of `after`: a window that
/// starts here shares no slot with one that ended at `after`, so a heartbeat lies in at most
/// one of them.
async fn redis_ms_after(c: &mut MultiplexedConnection, after: u64) -> u64 {
    let last = crate::support::beat_tag(c, after).await;
    loop {
        let now = redis_ms(c).await;
        if crate::support::beat_tag(c, now).await != last {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// The heartbeats of `seqs`, each with whether its time lies in `[from, to]` (to the beats'
/// resolution: `redis_ms_after` starts windows in slots of their own).
async fn beats_within(c: &mut MultiplexedConnection, seqs: &[u64], from: u64, to: u64) -> Vec<(u64, bool)> {
    let (from, to) = (crate::support::beat_tag(c, from).await, crate::support::beat_tag(c, to).await);
    let tags = crate::support::beat_tags(c, P, seqs).await;
    seqs.iter().zip(tags).map(|(s, t)| (*s, (from..=to).contains(&t))).collect()
}

/// A reply: mark, batch, the users' answers, then the seq counter (enter.lua; 0 from
/// status.lua) and the fences raised (bits: 1 seq, 2 mark).
fn answers(mark: u64, batch: u64, each: &[(u8, &str, u64)], seq: u64, fenced: u64) -> Vec<String> {
    let mut out = vec![mark.to_string(), batch.to_string()];
    for (code, a, b) in each {
        out.extend([code.to_string(), (*a).to_owned(), b.to_string()]);
    }
    out.extend([seq.to_string(), fenced.to_string()]);
    out
}

#[tokio::test]
async fn one_script_call_answers_every_kind_of_user_as_if_alone() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let cmd = |args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd
    };

    // New users, one of them twice: consecutive seqs, the duplicate gets the same one.
    let first_from = redis_ms(&mut c).await;
    let got = enter(&mut c, 100, &[1, 2, 2, 3]).await;
    let first_to = redis_ms(&mut c).await;
    assert_eq!(got, answers(0, 0, &[(1, "1", 0), (1, "2", 1), (1, "2", 1), (1, "3", 2)], 3, 0));

    // Mark 1 (user 1 admitted, no token yet); user 2 left; users 4 and 5 were admitted
    // earlier and hold tokens, 5's already used at the gate; a runtime batch size is set.
    for args in [
        &["SET", &format!("{P}admitted_count"), "1"][..],
        &["SET", &format!("{P}batch_size"), "7"],
        &["ZREM", &format!("{P}waiting"), "2"],
        &["ZREM", &format!("{P}heartbeat"), "2"],
        &["ZADD", &format!("{P}departed"), "2", "2"],
        &["SET", &format!("{P}token:4"), "tok-4"],
        &["SET", &format!("{P}token:5"), "used:tok-5"],
    ] {
        let _: redis::Value = cmd(args).query_async(&mut c).await.unwrap();
    }
    let second_from = redis_ms_after(&mut c, first_to).await;
    let got = enter(&mut c, 100, &[3, 1, 4, 5, 6, 6, 3]).await;
    let second_to = redis_ms(&mut c).await;
    let want = [(1, "3", 0), (5, "1", 0), (2, "tok-4", 0), (2, "tok-5", 0), (1, "4", 1), (1, "4", 1), (1, "3", 0)];
    assert_eq!(got, answers(1, 7, &want, 4, 0), "the departed seq 2 is not ahead of anyone");
    let seq: u64 = cmd(&["GET", &format!("{P}seq")]).query_async(&mut c).await.unwrap();
    assert_eq!(seq, 4, "only user 6 took a seq");
    // Seqs: user 1 → 1 (admitted), user 2 → 2 (left), user 3 → 3, user 6 → 4.
    let beats = beats_within(&mut c, &[1, 2, 3, 4], second_from, second_to).await;
    let want = [(1, false), (2, false), (3, true), (4, true)];
    assert_eq!(beats, want, "heartbeats (Redis' time) of the waiting above the mark, refreshed by this call");
    let times: Vec<String> = cmd(&["ZRANGE", &format!("{P}entry_times"), "0", "-1"]).query_async(&mut c).await.unwrap();
    let entered = |entry: &str, seqs: &str, from: u64, to: u64| {
        entry.strip_prefix(seqs).and_then(|t| t.parse::<u64>().ok()).is_some_and(|t| (from..=to).contains(&t))
    };
    assert_eq!(times.len(), 2, "one entry time per call that gave seqs: {times:?}");
    assert!(entered(&times[0], "1-3:", first_from, first_to), "{times:?}");
    assert!(entered(&times[1], "4-4:", second_from, second_to), "{times:?}");

    // Two users wait above the mark (seqs 3 and 4): with room for two, newcomers are full,
    // while those already in or admitted are answered as before.
    let got = enter(&mut c, 2, &[7, 3, 8, 4]).await;
    assert_eq!(got, answers(1, 7, &[(3, "0", 0), (1, "3", 0), (3, "0", 0), (2, "tok-4", 0)], 4, 0));
    let seq: u64 = cmd(&["GET", &format!("{P}seq")]).query_async(&mut c).await.unwrap();
    assert_eq!(seq, 4, "a full queue gives no seq");

    // Polls: waiting, admitted without a token (given the one the call carries for them, in
    // the same call), holding a token, unknown, twice in the call.
    let poll_from = redis_ms_after(&mut c, second_to).await;
    let got = status(&mut c, &[3, 1, 4, 9, 3, 6, 2]).await;
    let poll_to = redis_ms(&mut c).await;
    let want = [(1, "3", 0), (2, "issued-1", 1), (2, "tok-4", 0), (4, "0", 0), (1, "3", 0), (1, "4", 1), (4, "0", 0)];
    assert_eq!(got, answers(1, 7, &want, 0, 0));
    let (token, waiting, issued): (Option<String>, Option<f64>, Option<u64>) = redis::pipe()
        .get(format!("{P}token:1"))
        .zscore(format!("{P}waiting"), "1")
        .hget(format!("{P}waits"), "tokens_issued")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        (token.as_deref(), waiting, issued),
        (Some("issued-1"), None, Some(1)),
        "stored, out of the queue, counted"
    );
    // Polled again: the token stored, not the one the new call carries.
    let got = status(&mut c, &[1]).await;
    assert_eq!(got, answers(1, 7, &[(2, "issued-1", 0)], 0, 0));
    let beats = beats_within(&mut c, &[1, 2, 3, 4], poll_from, poll_to).await;
    let want = [(1, false), (2, false), (3, true), (4, true)];
    assert_eq!(beats, want, "a poll refreshes the waiting above the mark");
    let beats = beats_within(&mut c, &[1, 2], first_from, first_to).await;
    assert_eq!(beats, [(1, true), (2, true)], "users 1 (admitted) and 2 (left) kept the heartbeat of the first enter");
    let none: u64 = cmd(&["EXISTS", &format!("{P}heartbeat")]).query_async(&mut c).await.unwrap();
    assert_eq!(none, 0, "users with a seq keep no entry in the heartbeat ZSET");

    // Mark 4: users 3 and 6 (seqs 3 and 4) found admitted in one call, user 3 twice, beside
    // user 1 who holds a token: both tokens stored, both out of the queue, counted once each,
    // each among the unused tokens. User 6's token key holds the used mark of the very token
    // this call carries (the same string handed out outside the queue and bought with): it
    // stays used.
    let _: () = cmd(&["SET", &format!("{P}admitted_count"), "4"]).query_async(&mut c).await.unwrap();
    let _: () = cmd(&["SET", &format!("{P}token:6"), "used:issued-6", "EX", "300"]).query_async(&mut c).await.unwrap();
    let got = status(&mut c, &[3, 6, 3, 1]).await;
    let want = [(2, "issued-3", 1), (2, "issued-6", 1), (2, "issued-3", 1), (2, "issued-1", 0)];
    assert_eq!(got, answers(4, 7, &want, 0, 0));
    let (t3, t6, ttl6, waiting, issued, ti, unused): (String, String, i64, u64, u64, u64, Vec<String>) = redis::pipe()
        .get(format!("{P}token:3"))
        .get(format!("{P}token:6"))
        .ttl(format!("{P}token:6"))
        .zcard(format!("{P}waiting"))
        .hget(format!("{P}waits"), "tokens_issued")
        .hget(format!("{P}record"), "ti")
        .zrange(format!("{P}unused"), 0, -1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((t3.as_str(), t6.as_str(), waiting, issued, ti), ("issued-3", "used:issued-6", 0, 3, 3));
    assert!(ttl6 > 0, "the mark keeps its ttl: {ttl6}");
    assert_eq!(unused, ["1", "3"], "every token issued and not used yet: 6's bought already");
}

/// After a failover that lost writes, Redis holds a seq counter and a mark below what an
/// instance saw: the instance's fences raise them back, so the seqs it saw given are never
/// given again (the counter jumps past them by the margin sent) and a user the lost mark
/// admitted is admitted, not WAITING. Without a fence (0) the script changes nothing.
#[tokio::test]
async fn fences_raise_counters_redis_lost_and_never_lower_them() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    // Redis as the replica had it: seqs 1..3 given, nobody admitted.
    let got = enter(&mut c, 100, &[1, 2, 3]).await;
    assert_eq!(got, answers(0, 0, &[(1, "1", 0), (1, "2", 1), (1, "3", 2)], 3, 0));

    // The instance saw seq 10 given and mark 2: a new user gets 10 + margin + 1, never 4..10;
    // user 2 (seq 2) is admitted by the mark raised back.
    let fence = Fence { seq_seen: 10, seq_to: 15, mark: 2 };
    let got = enter_fenced(&mut c, 100, fence, &[4, 2]).await;
    assert_eq!(got, answers(2, 0, &[(1, "16", 13), (5, "2", 0)], 16, 3), "seq and mark raised");
    let got = status_fenced(&mut c, 2, &[2, 3]).await;
    assert_eq!(got, answers(2, 0, &[(2, "issued-2", 1), (1, "3", 0)], 0, 0), "already raised: nothing to do");

    // Fences below what Redis holds change nothing.
    let got = enter_fenced(&mut c, 100, Fence { seq_seen: 5, seq_to: 9, mark: 1 }, &[5]).await;
    assert_eq!(got, answers(2, 0, &[(1, "17", 14)], 17, 0));
    // A poll through an instance that saw a higher mark raises it (user 3 admitted).
    let got = status_fenced(&mut c, 3, &[3]).await;
    assert_eq!(got, answers(3, 0, &[(2, "issued-3", 1)], 0, 2));
    let ttl: i64 = redis::cmd("TTL").arg(format!("{P}admitted_count")).query_async(&mut c).await.unwrap();
    assert!(ttl > 0, "a raised key keeps the sliding TTL: {ttl}");
}

/// Runs `body` after the prelude, as every script runs (`lua_as_sent`), with `keys` and
/// `args`; the reply as integers.
async fn prelude_eval(c: &mut MultiplexedConnection, body: &str, keys: &[String], args: &[String]) -> Vec<i64> {
    let script = redis::Script::new(&lua_as_sent(body));
    let mut inv = script.prepare_invoke();
    for k in keys {
        inv.key(k);
    }
    for a in args {
        inv.arg(a);
    }
    inv.invoke_async(c).await.expect("prelude call")
}

/// The wait buckets have one home in Rust (`domain::WAIT_BUCKETS`), sent to the prelude's
/// `wait_bucket` as admit.lua's argument: every second of a wait up to past the last edge
/// lands in the same bucket on both sides.
#[tokio::test]
async fn wait_buckets_of_the_prelude_are_the_domains() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let edges: Vec<String> = vq::domain::WAIT_BUCKETS.iter().map(|(below, width)| format!("{below}:{width}")).collect();
    let body = "local e, out = wait_bucket_edges(ARGV[1]), {}\n\
                for s = 0, tonumber(ARGV[2]) do out[#out + 1] = wait_bucket(s, e) end\n\
                return out";
    let lua = prelude_eval(&mut c, body, &[], &[edges.join(" "), "4000".into()]).await;
    let rust: Vec<i64> = (0..=4000).map(|s| vq::domain::wait_bucket(s) as i64).collect();
    assert_eq!(lua.len(), rust.len());
    for (s, (l, r)) in lua.iter().zip(&rust).enumerate() {
        assert_eq!(l, r, "a wait of {s} s: prelude bucket {l}, domain bucket {r}");
    }
}

/// `int_run` (the prelude's strings of a call's new seqs, counted up one at a time) writes each
/// number as Rust does, across the tens, hundreds and larger powers it crosses, from runs that
/// start anywhere.
#[tokio::test]
async fn seq_runs_of_the_prelude_are_decimal() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let runs: [(u64, u64); 6] = [(0, 25), (1, 130), (95, 12), (998, 15), (99_999_990, 21), (4_503_599_627_370_490, 20)];
    let body = "local out = {}\n\
                for r = 1, #ARGV, 2 do\n\
                  local run, from = int_run(), tonumber(ARGV[r])\n\
                  for n = from, from + tonumber(ARGV[r + 1]) - 1 do out[#out + 1] = run(n) end\n\
                end\n\
                return out";
    let script = redis::Script::new(&lua_as_sent(body));
    let mut inv = script.prepare_invoke();
    for (from, count) in runs {
        inv.arg(from).arg(count);
    }
    let lua: Vec<String> = inv.invoke_async(&mut c).await.expect("prelude call");
    let rust: Vec<String> =
        runs.iter().flat_map(|&(from, count)| (from..from + count).map(|n| n.to_string())).collect();
    assert_eq!(lua, rust);
}

/// One sale state: the hash fields the scripts write, and the time it is read at.
#[derive(Debug, Default, Clone, Copy)]
struct SaleCase {
    opens: Option<u64>,
    prequeue: Option<u64>,
    closes: Option<u64>,
    paused: bool,
    closed: bool,
    frozen: Option<u64>,
    opened: Option<u64>,
}

impl SaleCase {
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = Vec::new();
        for (name, v) in [
            ("opens_at", self.opens),
            ("prequeue_from", self.prequeue),
            ("closes_at", self.closes),
            ("frozen", self.frozen),
            ("opened_at", self.opened),
        ] {
            if let Some(v) = v {
                f.push((name, v.to_string()));
            }
        }
        if self.paused {
            f.push(("paused", "1".into()));
        }
        if self.closed {
            f.push(("closed", "1".into()));
        }
        f
    }

    fn record(&self) -> vq::domain::SaleRecord {
        vq::domain::SaleRecord {
            opens_at_ms: self.opens,
            prequeue_from_ms: self.prequeue,
            closes_at_ms: self.closes,
            paused: self.paused,
            closed: self.closed,
            prequeued: self.frozen,
            opened_at_ms: self.opened,
            ..Default::default()
        }
    }
}

/// The sale's phase and whether it holds admission have one home in Rust
/// (`SaleRecord::phase`, `holds_admission`): the prelude's `sale_phase` and
/// `sale_holds_admission`, which every script uses, answer the same for a grid of sale states
/// (no sale, a pause alone, scheduled, pre-queue, opening, frozen, open, paused, closed,
/// `closes_at` passed) at times around each of the sale's instants.
#[tokio::test]
async fn sale_phase_of_the_prelude_is_the_domains() {
    use strum::VariantArray;
    use vq::domain::SalePhase;
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let (pre, opens, closes) = (1_000, 2_000, 5_000);
    let scheduled = SaleCase { opens: Some(opens), prequeue: Some(pre), ..Default::default() };
    let mut cases = vec![
        SaleCase::default(),
        SaleCase { paused: true, ..Default::default() },
        SaleCase { closed: true, ..Default::default() },
        SaleCase { closes: Some(closes), ..Default::default() },
        SaleCase { opens: Some(opens), ..Default::default() },
        scheduled,
        SaleCase { frozen: Some(3), ..scheduled },
        SaleCase { frozen: Some(3), opened: Some(opens + 1), ..scheduled },
        SaleCase { closes: Some(closes), opened: Some(opens + 1), ..scheduled },
    ];
    for base in cases.clone() {
        cases.push(SaleCase { paused: true, ..base });
        cases.push(SaleCase { closed: true, ..base });
    }
    let times = [0, pre - 1, pre, opens - 1, opens, opens + 1, closes - 1, closes, closes + 1];
    let lua_phase = |n: i64| match n {
        0 => None,
        // The prelude numbers the phases in the enum's order, from 1.
        n => Some(*SalePhase::VARIANTS.get(n as usize - 1).unwrap_or_else(|| panic!("the prelude names no phase {n}"))),
    };
    let key = format!("{P}sale");
    let body = "local out = {}\n\
                for i = 1, #ARGV do\n\
                  local phase, sale = sale_phase(KEYS[1], tonumber(ARGV[i]))\n\
                  out[#out + 1] = phase\n\
                  out[#out + 1] = sale_holds_admission(phase, sale) and 1 or 0\n\
                end\n\
                return out";
    for case in cases {
        let _: () = redis::cmd("DEL").arg(&key).query_async(&mut c).await.unwrap();
        let fields = case.fields();
        if !fields.is_empty() {
            let _: () = redis::cmd("HSET").arg(&key).arg(fields).query_async(&mut c).await.unwrap();
        }
        let args: Vec<String> = times.iter().map(u64::to_string).collect();
        let got = prelude_eval(&mut c, body, std::slice::from_ref(&key), &args).await;
        let record = case.record();
        for (t, pair) in times.iter().zip(got.chunks_exact(2)) {
            assert_eq!(lua_phase(pair[0]), record.phase(*t), "phase of {case:?} at {t}");
            assert_eq!(pair[1] == 1, record.holds_admission(*t), "admission held by {case:?} at {t}");
        }
    }
}

/// The users ahead of a waiting user are counted by the prelude's `ahead_counter` (enter.lua,
/// status.lua) and, for polls answered from an instance's copy, by `TargetView::ahead`: the
/// same arithmetic (seqs between the mark and theirs, less the departed), checked on a grid.
#[tokio::test]
async fn users_ahead_of_the_prelude_are_the_views() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let departed = [3u64, 4, 9, 15];
    let key = format!("{P}departed");
    for d in departed {
        let _: () = redis::cmd("ZADD").arg(&key).arg(d).arg(d).query_async(&mut c).await.unwrap();
    }
    let body = "local ahead, out = ahead_counter(KEYS[1], tonumber(ARGV[1])), {}\n\
                for seq = tonumber(ARGV[1]) + 1, tonumber(ARGV[2]) do out[#out + 1] = ahead(seq) end\n\
                return out";
    for mark in [0u64, 2, 4, 10] {
        let got = prelude_eval(&mut c, body, std::slice::from_ref(&key), &[mark.to_string(), "20".into()]).await;
        let view = vq::store::TargetView {
            mark,
            departed: departed.iter().copied().filter(|&d| d > mark).collect(),
            ..Default::default()
        };
        let want: Vec<i64> = (mark + 1..=20).map(|seq| view.ahead(seq) as i64).collect();
        assert_eq!(got, want, "users ahead above mark {mark}");
    }
}

/// The prelude's `sale_read` gives the scripts the sale's hash by the names Rust's codec decodes
/// (`vq::store::SALE_FIELDS`, one list): each of those fields set in Redis comes back under its
/// own name, and a field the list does not hold does not.
#[tokio::test]
async fn sale_read_of_the_prelude_names_the_codecs_fields() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let key = format!("{P}sale");
    let mut fields: Vec<(String, String)> =
        vq::store::SALE_FIELDS.iter().zip(1..).map(|(f, i)| (f.to_string(), (100 + i).to_string())).collect();
    let _: () = redis::cmd("HSET").arg(&key).arg(&fields).arg("base").arg(7).query_async(&mut c).await.unwrap();
    let body = "local sale, out = sale_read(KEYS[1]), {}\n\
                for i = 1, #ARGV do out[i] = tonumber(sale[ARGV[i]] or '0') end\n\
                out[#out + 1] = sale.base == nil and 1 or 0\n\
                return out";
    let names: Vec<String> = fields.iter().map(|(f, _)| f.clone()).collect();
    let got = prelude_eval(&mut c, body, std::slice::from_ref(&key), &names).await;
    let mut want: Vec<i64> = fields.iter().map(|(_, v)| v.parse().unwrap()).collect();
    want.push(1);
    assert_eq!(got, want, "sale_read's fields by name, then whether `base` (not listed) is nil");
    // Absent fields are nil in the table, not false: `sale.frozen` reads as unset.
    fields.truncate(1);
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut c).await.unwrap();
    let _: () = redis::cmd("HSET").arg(&key).arg(&fields).query_async(&mut c).await.unwrap();
    let got = prelude_eval(&mut c, body, std::slice::from_ref(&key), &names[..1]).await;
    assert_eq!(got, [101, 1]);
}

/// enter.lua counting the queues each user holds (`queue.max_queues_per_user`, a single
/// server): a user given a place is counted in the same call; one at the limit gets TOO_MANY
/// naming their queues and no place; one refused for capacity is not counted; a user the queue
/// knows is not counted again; a count found in the previous generation moves to the current
/// one.
#[tokio::test]
async fn enter_counts_the_queues_of_the_users_it_gives_a_place() {
    use redis::AsyncCommands;
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let len = 3_600_000;
    let g = redis_ms(&mut c).await / len;
    let hk = |g: u64| format!("queue:holds:{{h0}}:{g}");
    // User 2 holds two other queues, counted in the previous generation; user 3 one, now.
    let _: () = c.hset(hk(g - 1), "2", "TICKETING_EVENT:1=5 TICKETING_EVENT:2=6").await.unwrap();
    let _: () = c.hset(hk(g), "3", "TICKETING_EVENT:3=7").await.unwrap();
    let enter = async |c: &mut MultiplexedConnection, users: &[u64]| {
        let script = redis::Script::new(&lua_as_sent(include_str!("../../lua/enter.lua")));
        let mut inv = script.prepare_invoke();
        for name in layout::ENTER_KEYS {
            inv.key(format!("{P}{name}"));
        }
        for u in users {
            inv.key(format!("{P}token:{u}"));
        }
        for name in layout::SALE_KEYS {
            inv.key(format!("{P}{name}"));
        }
        for g in [g - 1, g, g + 1] {
            inv.key(hk(g));
        }
        let args = EnterArgs {
            capacity: 3,
            key_ttl_s: 1800,
            seq_seen: 0,
            seq_to: 0,
            mark_seen: 0,
            tick_ms: 1000,
            record_ttl_s: 86_400,
            hold_max: 2,
            hold_target: "LIMITED_DROP:1",
            hold_generation: g,
            hold_generation_ms: len,
        };
        for a in args.argv() {
            inv.arg(a);
        }
        for u in users {
            inv.arg(u);
        }
        let reply: Vec<redis::Value> = inv.invoke_async(c).await.expect("script call");
        reply
            .into_iter()
            .map(|v| match v {
                redis::Value::Int(n) => n.to_string(),
                redis::Value::BulkString(b) => String::from_utf8(b).expect("utf-8"),
                other => panic!("unexpected reply item {other:?}"),
            })
            .collect::<Vec<_>>()
    };
    let r = enter(&mut c, &[1, 2, 3, 4, 5]).await;
    let answer = |r: &[String], i: usize| (r[2 + 3 * i].clone(), r[3 + 3 * i].clone());
    assert_eq!(answer(&r, 0), ("1".into(), "1".into()), "user 1 waits, seq 1: {r:?}");
    let (code, held) = answer(&r, 1);
    assert_eq!(code, "9", "user 2 holds the most already: TOO_MANY");
    assert!(held.starts_with("TICKETING_EVENT:1=") && held.contains(" TICKETING_EVENT:2="), "{held}");
    assert_eq!(answer(&r, 2), ("1".into(), "2".into()), "user 3 waits, seq 2");
    assert_eq!(answer(&r, 3), ("1".into(), "3".into()), "user 4 waits, seq 3");
    assert_eq!(answer(&r, 4).0, "3", "user 5: FULL");

    let now: Vec<Option<String>> =
        redis::cmd("HMGET").arg(hk(g)).arg(&["1", "2", "3", "4", "5"]).query_async(&mut c).await.unwrap();
    assert!(now[0].as_deref().is_some_and(|v| v.starts_with("LIMITED_DROP:1=")), "{now:?}");
    assert_eq!(now[1].as_deref(), Some("TICKETING_EVENT:1=5 TICKETING_EVENT:2=6"), "moved, unchanged");
    assert!(now[2].as_deref().is_some_and(|v| v.starts_with("TICKETING_EVENT:3=7 LIMITED_DROP:1=")), "{now:?}");
    assert!(now[3].is_some(), "{now:?}");
    assert_eq!(now[4], None, "refused for capacity: not counted");
    let before: Option<String> = c.hget(hk(g - 1), "2").await.unwrap();
    assert_eq!(before, None, "the previous generation's field moved");
    let waiting: u64 = c.zcard(format!("{P}waiting")).await.unwrap();
    assert_eq!(waiting, 3, "TOO_MANY and FULL give no place");

    // Entering again: the same place, the count unchanged.
    let r = enter(&mut c, &[1]).await;
    assert_eq!(answer(&r, 0), ("1".into(), "1".into()));
    let again: Option<String> = c.hget(hk(g), "1").await.unwrap();
    assert_eq!(again, now[0]);

    // The generation's first write here gave it its mark and its expiry (the test's own HSET
    // of user 3 made the key without either). Every user's field dropped, the mark keeps the
    // key and its expiry; an enter that finds the mark counts its user and sets no expiry
    // (a distinct one set here stays).
    let (mark, ttl): (Option<String>, i64) =
        redis::pipe().hget(hk(g), "").pttl(hk(g)).query_async(&mut c).await.unwrap();
    assert_eq!(mark.as_deref(), Some("1"));
    assert!(ttl > 0 && ttl <= 2 * len as i64, "kept through the next generation: {ttl}");
    let _: () = c.hdel(hk(g), &["1", "2", "3", "4"]).await.unwrap();
    let _: () = c.pexpire(hk(g), 123_456_789).await.unwrap();
    // User 4 leaves (as leave.lua does), so user 6 has room.
    let _: () = c.zrem(format!("{P}waiting"), "4").await.unwrap();
    let _: () = c.zadd(format!("{P}departed"), 3, 3).await.unwrap();
    let r = enter(&mut c, &[6]).await;
    assert_eq!(answer(&r, 0), ("1".into(), "4".into()), "user 6 waits, seq 4: {r:?}");
    let (six, ttl): (Option<String>, i64) =
        redis::pipe().hget(hk(g), "6").pttl(hk(g)).query_async(&mut c).await.unwrap();
    assert!(six.is_some_and(|v| v.starts_with("LIMITED_DROP:1=")));
    assert!(ttl > 123_000_000, "the expiry set before stays: {ttl}");

    // A call mixing a user the queue knows, one whose count is in the previous generation and a
    // new one twice: only the unknown are read, the moved count gains the target, and the one
    // refused for capacity (and its copy) is not counted.
    let _: () = c.zrem(format!("{P}waiting"), "3").await.unwrap();
    let _: () = c.zadd(format!("{P}departed"), 2, 2).await.unwrap();
    let _: () = c.hset(hk(g - 1), "9", "TICKETING_EVENT:5=9").await.unwrap();
    let six_before: Option<String> = c.hget(hk(g), "6").await.unwrap();
    let r = enter(&mut c, &[6, 9, 8, 8]).await;
    assert_eq!(answer(&r, 0), ("1".into(), "4".into()), "user 6 keeps seq 4: {r:?}");
    assert_eq!(answer(&r, 1), ("1".into(), "5".into()), "user 9 waits, seq 5: {r:?}");
    assert_eq!((answer(&r, 2).0.as_str(), answer(&r, 3).0.as_str()), ("3", "3"), "user 8: FULL, twice: {r:?}");
    let fields: Vec<Option<String>> =
        redis::cmd("HMGET").arg(hk(g)).arg(&["6", "9", "8"]).query_async(&mut c).await.unwrap();
    assert_eq!(fields[0], six_before, "a user the queue knows is not counted again");
    assert!(fields[1].as_deref().is_some_and(|v| v.starts_with("TICKETING_EVENT:5=9 LIMITED_DROP:1=")), "{fields:?}");
    assert_eq!(fields[2], None, "refused for capacity: not counted");
    let moved: Option<String> = c.hget(hk(g - 1), "9").await.unwrap();
    assert_eq!(moved, None, "the previous generation's field moved");
}

/// `leave.lua` on a single server drops the target from the user's count of queues in the same
/// call (`hold_drop` in the prelude, which `issue.lua` shares): the other targets stay, a field
/// left empty goes, one found in the previous generation moves to the current one without the
/// target, and a call without a hold target touches no count.
#[tokio::test]
async fn leave_drops_the_target_from_the_users_queues_in_the_same_call() {
    use redis::AsyncCommands;
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let len = 3_600_000;
    let g = redis_ms(&mut c).await / len;
    let hk = |g: u64| format!("queue:holds:{{h0}}:{g}");
    let _: () = c.hset(hk(g), "1", "TICKETING_EVENT:1=5 LIMITED_DROP:1=6").await.unwrap();
    let _: () = c.hset(hk(g), "2", "LIMITED_DROP:1=6").await.unwrap();
    let _: () = c.hset(hk(g - 1), "3", "LIMITED_DROP:1=6 TICKETING_EVENT:2=7").await.unwrap();
    let _: () = c.hset(hk(g), "4", "LIMITED_DROP:1=6").await.unwrap();
    let leave = async |c: &mut MultiplexedConnection, user: &str, hold_target: &str| {
        let script = redis::Script::new(&lua_as_sent(include_str!("../../lua/leave.lua")));
        let mut inv = script.prepare_invoke();
        for name in layout::LEAVE_KEYS {
            inv.key(format!("{P}{name}"));
        }
        for g in [g - 1, g, g + 1] {
            inv.key(hk(g));
        }
        let args = LeaveArgs {
            user,
            key_ttl_s: 1800,
            record_ttl_s: 86_400,
            hold_target,
            hold_generation: g,
            hold_generation_ms: len,
        };
        for a in args.argv() {
            inv.arg(a);
        }
        let _: u64 = inv.invoke_async(c).await.expect("script call");
    };
    for user in ["1", "2", "3"] {
        leave(&mut c, user, "LIMITED_DROP:1").await;
    }
    leave(&mut c, "4", "").await;
    let now: Vec<Option<String>> =
        redis::cmd("HMGET").arg(hk(g)).arg(&["1", "2", "3", "4"]).query_async(&mut c).await.unwrap();
    assert_eq!(now[0].as_deref(), Some("TICKETING_EVENT:1=5"), "the other queue stays");
    assert_eq!(now[1], None, "no queue left: the field goes");
    assert_eq!(now[2].as_deref(), Some("TICKETING_EVENT:2=7"), "moved to the current generation, without the target");
    assert_eq!(now[3].as_deref(), Some("LIMITED_DROP:1=6"), "no hold target: untouched");
    let before: Option<String> = c.hget(hk(g - 1), "3").await.unwrap();
    assert_eq!(before, None, "the previous generation's field moved");
    let ttl: i64 = c.pttl(hk(g)).await.unwrap();
    assert!(ttl > 0, "the current generation expires: {ttl}");
}

/// token_claim.lua with one call carrying a purchase's claims of every kind (the coalescer
/// makes such calls under load; here built by hand): a token twice in the call is one purchase
/// and a token used up; a token used before, a user at their limit and a key of the wrong type
/// are refused (the last with its error, alone), each giving its place in the tick back; the
/// claims after them are made as if alone.
#[tokio::test]
async fn one_claim_call_makes_each_claim_as_if_alone() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    let script = redis::Script::new(&lua_as_sent(include_str!("../../lua/token_claim.lua")));
    // Two purchases a tick: the first two claims made take them, the third goes a tick later.
    let args = TokenClaimArgs {
        per_admission: 1,
        per_user: 1,
        key_ttl_s: 1800,
        pace_tick_ms: 60_000,
        pace_budget: 2,
        pace_ahead: 3,
    };
    let claim = |c: &mut MultiplexedConnection, claims: &'static [(&'static str, &'static str)]| {
        let mut inv = script.prepare_invoke();
        inv.key(format!("{P}bought")).key(format!("{P}forwarded")).key(format!("{P}batch_size"));
        for (user, _) in claims {
            inv.key(format!("{P}token:{user}")).key(format!("{P}used:{user}")).key(format!("{P}uses:{user}"));
        }
        for a in args.argv() {
            inv.arg(a);
        }
        for (user, token) in claims {
            inv.arg(*token).arg(300).arg(*user);
        }
        let mut c = c.clone();
        async move {
            let reply: Vec<redis::Value> = inv.invoke_async(&mut c).await.expect("token_claim.lua");
            reply
                .chunks(4)
                .map(|a| {
                    let text = |v: &redis::Value| match v {
                        redis::Value::Int(n) => n.to_string(),
                        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => panic!("{other:?}"),
                    };
                    (text(&a[0]), text(&a[1]), !text(&a[2]).is_empty())
                })
                .collect::<Vec<_>>()
        }
    };
    for args in [
        &["SET", &format!("{P}token:b"), "used:tb"][..],
        &["SET", &format!("{P}token:a"), "ta"],
        &["HSET", &format!("{P}bought"), "d", "1"],
        &["HSET", &format!("{P}token:e"), "f", "v"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: redis::Value = cmd.query_async(&mut c).await.unwrap();
    }
    let got =
        claim(&mut c, &[("a", "ta"), ("a", "ta"), ("b", "tb"), ("d", "td"), ("e", "te"), ("f", "tf"), ("g", "tg")])
            .await;
    let codes: Vec<(&str, &str, bool)> = got.iter().map(|(c, p, s)| (c.as_str(), p.as_str(), *s)).collect();
    assert_eq!(&codes[..4], [("1", "ta", true), ("0", "", false), ("0", "", false), ("2", "", false)], "{got:?}");
    assert_eq!(codes[4].0, "4", "a key of the wrong type fails that claim alone: {got:?}");
    assert!(codes[4].1.contains("WRONGTYPE"), "{got:?}");
    assert_eq!(&codes[5..], [("1", "", true), ("1", "", true)], "{got:?}");
    for (user, want) in
        [("a", Some("used:ta")), ("b", Some("used:tb")), ("d", None), ("f", Some("used:tf")), ("g", Some("used:tg"))]
    {
        let v: Option<String> = redis::cmd("GET").arg(format!("{P}token:{user}")).query_async(&mut c).await.unwrap();
        assert_eq!(v.as_deref(), want, "{user}'s token key");
    }
    // Three claims made, two a tick: the refused and failed ones gave their places back.
    let forwarded: Vec<u64> = redis::cmd("HVALS").arg(format!("{P}forwarded")).query_async(&mut c).await.unwrap();
    assert_eq!(forwarded.iter().sum::<u64>(), 3, "{forwarded:?}");
    assert_eq!(forwarded.iter().max(), Some(&2), "{forwarded:?}");
    let bought: Vec<String> = redis::cmd("HGETALL").arg(format!("{P}bought")).query_async(&mut c).await.unwrap();
    assert_eq!(bought, ["d", "1", "a", "1", "f", "1", "g", "1"], "each user counted once: {bought:?}");
}
