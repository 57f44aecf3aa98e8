//! Coalescing: jobs that arrive while earlier ones are in flight go out together.
//!
//! A [`Coalescer`] hands jobs to one runner task. The runner takes everything queued (up to
//! [`MAX_JOBS`]), groups it by key in arrival order, and gives each group to the executor as
//! one call; at most [`IN_FLIGHT`] drains are being executed at a time, so under load the
//! queue fills while Redis works and the next call carries many jobs.
//!
//! Between idle and loaded lies a stretch where jobs come faster than one a millisecond but
//! Redis answers before the next one is queued, so each call carries one or two: a call's
//! fixed cost in Redis (the script's arguments, its `redis.call`s, a one-user `enter.lua` is
//! ~85 % fixed) is then paid per job. There the runner waits a little ([`Coalescer::spawn`]'s
//! `wait`, `redis.coalesce_wait_ms`) for the jobs it expects: only when the drain is smaller
//! than [`SHARE`] and the recent rate brings at least [`EXPECTED`] more within the wait. When
//! jobs come slower than that, or a drain is already large (a closed loop of clients that all
//! wait), a job goes at once, as when idle.
//!
//! A key may be one of several lanes that share what would otherwise be one key's jobs: a
//! target spread over N shards is N keys, each given a shard's part of the target's users, so
//! each call would carry an N-th of what the whole target's call carries and pay its fixed
//! cost N times as often. A drain holding such a key ([`Coalescer::spawn_lanes`]) waits for
//! [`SHARE`] jobs per lane, at most `wait` per lane (and at most [`MAX_SPREAD`] lanes): each
//! lane's call then carries about what the one call would.
//!
//! The rate cannot tell buyers arriving on their own from a closed loop: a few clients that
//! each send their next request as soon as the last is answered (a backend with a small
//! connection pool, `wrk -c8`). Fewer of them than [`SHARE`] all sit in the drain while it
//! waits for jobs none of them can send, and every request pays the whole wait (eight clients:
//! an eighth of the enters without it). So on the buyers' lanes ([`Coalescer::spawn_lanes`]) a
//! wait that ends short with nothing come in its second half makes the next drains go at once,
//! 1, 3, 7 … up to 63 of them as it keeps failing, and a wait that fills resets it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::StoreError;

/// Most jobs taken from the queue at once (and so the largest group).
pub const MAX_JOBS: usize = 128;
/// Drains being executed at the same time: while Redis runs one call, the next is on its way.
/// (Measured with wrk at 64 connections: with 1, Redis sat idle between calls; 2, 3, 4 and 16
/// were within this machine's run-to-run noise of each other, and 2 makes the largest calls,
/// ~15 users, so Redis' per-call cost is shared most.)
pub const IN_FLIGHT: usize = 2;
/// A drain this large goes at once: the call's fixed cost is shared enough.
pub const SHARE: usize = 16;
/// The runner waits only when the recent rate brings at least this many more jobs within the
/// wait.
pub const EXPECTED: f64 = 2.0;

pub struct Coalescer<K, J> {
    tx: mpsc::UnboundedSender<(K, J)>,
}

impl<K, J> Coalescer<K, J>
where
    K: Copy + Eq + Send + 'static,
    J: Send + 'static,
{
    /// Spawns the runner on the current Tokio runtime. It ends when the coalescer is dropped.
    /// `wait` is the longest a small drain waits for more jobs (zero: never; see the module's
    /// doc).
    pub fn spawn<F, Fut>(wait: Duration, exec: F) -> Self
    where
        F: Fn(K, Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::start(wait, |_| 1, false, exec)
    }

    /// [`Self::spawn`] for the lanes a buyer's own request waits on (enters, polls, the counts
    /// of queues before an enter), whose jobs come as a steady stream: a key may be one of
    /// `spread(key)` lanes sharing one stream of jobs, and a drain holding it waits as if it were
    /// that many drains (see the module's doc); and after a wait the jobs it waited for did not
    /// come to, the next drains go without one (the module's doc: a closed loop). Purchases come
    /// in bursts after each admission, which that rule would take for a closed loop, so their
    /// claims use [`Self::spawn`].
    pub fn spawn_lanes<F, Fut>(wait: Duration, spread: fn(&K) -> usize, exec: F) -> Self
    where
        F: Fn(K, Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::start(wait, spread, true, exec)
    }

    fn start<F, Fut>(wait: Duration, spread: fn(&K) -> usize, back_off: bool, exec: F) -> Self
    where
        F: Fn(K, Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, wait, spread, back_off, Arc::new(exec)));
        Self { tx }
    }

    /// Queues a job; gives it back if the runner is gone (its runtime shut down).
    pub fn submit(&self, key: K, job: J) -> Result<(), J> {
        self.tx.send((key, job)).map_err(|e| e.0.1)
    }

    /// Queues the job `make` builds around its reply and waits for that reply: an error when
    /// the runner is gone or the call dropped the job unanswered.
    pub async fn ask<T>(
        &self,
        key: K,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> J,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.submit(key, make(reply)).is_err() {
            return Err(StoreError::Reply { what: "coalescer", detail: "its runtime has shut down".into() });
        }
        answer.await.unwrap_or_else(|_| Err(StoreError::Reply { what: "coalescer", detail: "call dropped".into() }))
    }
}

/// The most lanes a drain waits for: a drain never waits past this many times `wait`, nor
/// holds more than [`MAX_JOBS`].
const MAX_SPREAD: usize = MAX_JOBS / SHARE;

/// The most drains in a row that go without a wait after waits that brought nothing:
/// 2^MAX_BACKOFF − 1.
const MAX_BACKOFF: u32 = 6;

/// How fast the rate forgets: the weight of what it measured falls by e every `RATE_MEMORY`.
const RATE_MEMORY: Duration = Duration::from_millis(20);

/// The rate jobs arrive at, smoothed over the last [`RATE_MEMORY`] or so.
struct Rate {
    per_s: f64,
    last: Instant,
}

impl Rate {
    /// Counts a drain of `n` jobs: the jobs since the last drain over the time since, given the
    /// weight of that time (after a pause the old rate is forgotten at once; drains close
    /// together each move it a little).
    fn drained(&mut self, n: usize, now: Instant) {
        let secs = now.duration_since(self.last).as_secs_f64().max(1e-6);
        let kept = (-secs / RATE_MEMORY.as_secs_f64()).exp();
        self.per_s = kept * self.per_s + (1.0 - kept) * (n as f64 / secs);
        self.last = now;
    }

    /// How long a drain of `n` jobs feeding lanes of `spread` waits for more: none when it is
    /// large enough (`SHARE` a lane), no wait is allowed, or the rate does not bring
    /// [`EXPECTED`] more within `wait`; otherwise until the rate should have filled it, at most
    /// `wait` a lane.
    fn wait_for(&self, n: usize, wait: Duration, spread: usize) -> Option<Duration> {
        let share = SHARE * spread;
        if n >= share || wait.is_zero() || self.per_s * wait.as_secs_f64() < EXPECTED {
            return None;
        }
        Some((wait * spread as u32).min(Duration::from_secs_f64((share - n) as f64 / self.per_s)))
    }
}

async fn run<K, J, F, Fut>(
    mut rx: mpsc::UnboundedReceiver<(K, J)>,
    wait: Duration,
    spread: fn(&K) -> usize,
    back_off: bool,
    exec: Arc<F>,
) where
    K: Copy + Eq + Send + 'static,
    J: Send + 'static,
    F: Fn(K, Vec<J>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut queued = Vec::with_capacity(MAX_JOBS);
    let mut rate = Rate { per_s: 0.0, last: Instant::now() };
    // After a wait that brought nothing in its second half, the next drains go without one
    // (1, 3, 7 … up to 2^MAX_BACKOFF − 1 of them): see `fruitless` below.
    let (mut skip, mut backoff) = (0u32, 0u32);
    loop {
        // Wait for a free slot first: what arrives meanwhile joins the next call.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        if rx.recv_many(&mut queued, MAX_JOBS).await == 0 {
            return;
        }
        let lanes = queued.iter().map(|(key, _)| spread(key)).max().unwrap_or(1).clamp(1, MAX_SPREAD);
        let waits = rate.wait_for(queued.len(), wait, lanes);
        if skip > 0 && waits.is_some() {
            skip -= 1;
        } else if let Some(more) = waits {
            let start = Instant::now();
            let until = start + more;
            let mut last = start;
            while queued.len() < SHARE * lanes {
                let room = MAX_JOBS - queued.len();
                match tokio::time::timeout_at(until, rx.recv_many(&mut queued, room)).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => last = Instant::now(),
                }
            }
            // The jobs the rate promised did not come: nothing arrived in the wait's second half
            // and the drain is still short. A steady stream (buyers arriving on their own) keeps
            // bringing jobs; a closed loop of fewer clients than a share, each waiting for its
            // answer, brings none until this drain is answered, so each wait only delays them
            // all. Back off from waiting, further each time it fails; one that pays resets it.
            let fruitless = back_off && queued.len() < SHARE * lanes && last < start + more / 2;
            backoff = if fruitless { (backoff + 1).min(MAX_BACKOFF) } else { 0 };
            skip = (1 << backoff) - 1;
        }
        rate.drained(queued.len(), Instant::now());
        let mut groups: Vec<(K, Vec<J>)> = Vec::new();
        for (key, job) in queued.drain(..) {
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, jobs)) => jobs.push(job),
                None => groups.push((key, vec![job])),
            }
        }
        let slot = Arc::new(slot);
        for (key, jobs) in groups {
            let (exec, slot) = (exec.clone(), slot.clone());
            tokio::spawn(async move {
                exec(key, jobs).await;
                drop(slot);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    #[test]
    fn a_small_drain_waits_only_while_jobs_come_fast_enough_to_fill_it() {
        let now = Instant::now();
        let wait = Duration::from_millis(2);
        // 2,000 jobs a second: one job a drain, every half millisecond.
        let mut rate = Rate { per_s: 0.0, last: now };
        for i in 1..=400 {
            rate.drained(1, now + Duration::from_micros(500 * i));
        }
        assert!((rate.per_s - 2000.0).abs() < 50.0, "{}", rate.per_s);
        assert_eq!(rate.wait_for(1, wait, 1), Some(wait), "4 more expected within 2 ms");
        assert_eq!(rate.wait_for(SHARE, wait, 1), None, "large enough");
        assert_eq!(rate.wait_for(1, Duration::ZERO, 1), None, "waiting is off");
        // Fast enough to fill the drain before the wait is up: waits only that long.
        let fast = Rate { per_s: 20_000.0, last: now };
        assert_eq!(fast.wait_for(4, wait, 1), Some(Duration::from_micros(600)));
        // 500 a second brings one more in 2 ms: not worth a wait.
        let slow = Rate { per_s: 500.0, last: now };
        assert_eq!(slow.wait_for(1, wait, 1), None);
        // A drain feeding three lanes (a target over three shards) waits for a share in each,
        // up to the wait once per lane.
        assert_eq!(rate.wait_for(1, wait, 3), Some(3 * wait), "each lane's call fills as one would");
        assert_eq!(rate.wait_for(SHARE, wait, 3), Some(3 * wait), "a share for one lane, not for three");
        assert_eq!(rate.wait_for(3 * SHARE, wait, 3), None, "a share for each lane");
        assert_eq!(fast.wait_for(4, wait, 3), Some(Duration::from_micros(2200)));
        assert_eq!(slow.wait_for(1, wait, 3), None, "the rate decides as for one lane");
        // After a pause the rate falls at once and the next job goes alone.
        rate.drained(1, now + Duration::from_secs(60));
        assert_eq!(rate.wait_for(1, wait, 1), None, "{}", rate.per_s);
    }

    /// The key and size of each call, in the order they ran.
    type CallSizes = Arc<Mutex<Vec<(u8, usize)>>>;

    /// A coalescer on buyers' lanes whose calls take 100 µs each and answer every job with its
    /// number; the key and size of each call, in the order they ran.
    fn answering_in_100_us(wait: Duration, spread: fn(&u8) -> usize) -> (Arc<Coalescer<u8, Job>>, CallSizes) {
        let calls: CallSizes = Arc::default();
        let seen = calls.clone();
        let c = Coalescer::spawn_lanes(wait, spread, move |key: u8, jobs: Vec<Job>| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_micros(100)).await;
                seen.lock().unwrap().push((key, jobs.len()));
                for (n, reply) in jobs {
                    let _ = reply.send(n);
                }
            }
        });
        (Arc::new(c), calls)
    }

    /// 600 jobs at 2,000 a second (two every millisecond, the timer's step) for `keys` keys
    /// taken in turn, each answered with its own number.
    async fn steady_jobs(c: &Coalescer<u8, Job>, keys: u8) {
        let mut answers = Vec::new();
        for n in 0..600u32 {
            let (tx, rx) = oneshot::channel();
            c.submit((n % u32::from(keys)) as u8, (n, tx)).map_err(|_| "runner gone").unwrap();
            answers.push(rx);
            if n % 2 == 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        for (n, rx) in answers.into_iter().enumerate() {
            assert_eq!(rx.await.unwrap(), n as u32);
        }
    }

    /// The users each call carried when [`steady_jobs`] come for `keys` keys, the runner told
    /// each key is one of `spread` lanes.
    async fn calls_at_2000_a_second(keys: u8, spread: fn(&u8) -> usize) -> Vec<usize> {
        let (c, calls) = answering_in_100_us(Duration::from_millis(2), spread);
        steady_jobs(&c, keys).await;
        calls.lock().unwrap().iter().map(|(_, n)| *n).collect()
    }

    fn mean(sizes: &[usize]) -> f64 {
        sizes.iter().sum::<usize>() as f64 / sizes.len() as f64
    }

    #[tokio::test(start_paused = true)]
    async fn each_lane_of_a_spread_target_carries_what_the_one_lane_of_a_whole_one_does() {
        let whole = mean(&calls_at_2000_a_second(1, |_| 1).await);
        let shards = mean(&calls_at_2000_a_second(3, |_| 3).await);
        let unspread = mean(&calls_at_2000_a_second(3, |_| 1).await);
        // The wait fills a whole target's calls: 2 ms at 2,000 a second, about 6 a call.
        assert!(whole >= 4.5, "whole target: {whole:.2} a call");
        // Three shards told apart wait three times as long: each shard's call carries about as
        // many (the two a drain starts with are not spread: 0.73 of them on the paused clock).
        assert!(shards >= 0.65 * whole, "3 shards: {shards:.2} a call against {whole:.2}");
        // Not told, each shard's call carries a third.
        assert!(unspread <= 0.5 * whole, "3 shards, not spread: {unspread:.2} a call against {whole:.2}");
    }

    /// The jobs answered in 200 ms of a closed loop: `clients` clients each sending its next
    /// job as soon as the last is answered, each call taking 100 µs, with `wait`.
    async fn closed_loop(clients: u32, wait: Duration) -> u32 {
        let (c, _) = answering_in_100_us(wait, |_| 1);
        let end = Instant::now() + Duration::from_millis(200);
        let mut tasks = Vec::new();
        for client in 0..clients {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut answered = 0;
                while Instant::now() < end {
                    let (tx, rx) = oneshot::channel();
                    c.submit(0, (client, tx)).map_err(|_| "runner gone").unwrap();
                    assert_eq!(rx.await.unwrap(), client);
                    answered += 1;
                }
                answered
            }));
        }
        let mut answered = 0;
        for t in tasks {
            answered += t.await.unwrap();
        }
        answered
    }

    #[tokio::test(start_paused = true)]
    async fn closed_loops_of_four_and_twelve_clients_are_not_held_back_either() {
        for clients in [4, 12] {
            let without = closed_loop(clients, Duration::ZERO).await;
            let with = closed_loop(clients, Duration::from_millis(2)).await;
            assert!(with * 10 >= without * 7, "{clients} clients: {with} answered with the wait, {without} without");
        }
    }

    /// A client's closed loop beside a steady stream of other buyers' jobs on the same lanes
    /// does not switch the waits off for them: the stream keeps each wait fruitful.
    #[tokio::test(start_paused = true)]
    async fn a_closed_loop_beside_a_steady_stream_does_not_stop_its_calls_from_filling() {
        let alone = mean(&calls_at_2000_a_second(1, |_| 1).await);
        let (c, calls) = answering_in_100_us(Duration::from_millis(2), |_| 1);
        let end = Instant::now() + Duration::from_millis(300);
        let mut loops = Vec::new();
        for client in 0..8u32 {
            let c = c.clone();
            loops.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let (tx, rx) = oneshot::channel();
                    c.submit(1, (client, tx)).map_err(|_| "runner gone").unwrap();
                    rx.await.unwrap();
                }
            }));
        }
        steady_jobs(&c, 1).await;
        for l in loops {
            l.await.unwrap();
        }
        let stream: Vec<usize> = calls.lock().unwrap().iter().filter(|(k, _)| *k == 0).map(|(_, n)| *n).collect();
        let beside = mean(&stream);
        assert!(beside >= 0.8 * alone, "the stream's calls carry {beside:.2} beside the loop, {alone:.2} alone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_loop_of_fewer_clients_than_a_share_is_not_held_back_by_the_wait() {
        // Eight clients that each wait for their answer: no wait brings a ninth job, so a drain
        // that waits for one only delays all eight.
        let without = closed_loop(8, Duration::ZERO).await;
        let with = closed_loop(8, Duration::from_millis(2)).await;
        assert!(with * 10 >= without * 7, "{with} jobs answered with the wait, {without} without");
    }

    type Job = (u32, oneshot::Sender<u32>);
    /// Each call the executor saw: its key and its jobs' numbers.
    type Calls = Arc<Mutex<Vec<(u8, Vec<u32>)>>>;

    #[tokio::test]
    async fn a_lone_job_runs_at_once_and_queued_jobs_share_one_call_per_key() {
        let calls: Calls = Arc::default();
        // Calls for key 9 hold their slot until the test lets them go.
        let hold = Arc::new(Semaphore::new(0));
        let (seen, held) = (calls.clone(), hold.clone());
        let c = Coalescer::spawn(Duration::ZERO, move |key: u8, jobs: Vec<Job>| {
            let (seen, held) = (seen.clone(), held.clone());
            async move {
                seen.lock().unwrap().push((key, jobs.iter().map(|j| j.0).collect()));
                if key == 9 {
                    held.acquire().await.unwrap().forget();
                }
                for (n, reply) in jobs {
                    let _ = reply.send(n * 10);
                }
            }
        });
        let submit = |key: u8, n: u32| {
            let (tx, rx) = oneshot::channel();
            c.submit(key, (n, tx)).map_err(|_| "runner gone").unwrap();
            rx
        };
        assert_eq!(submit(1, 7).await.unwrap(), 70);
        assert_eq!(calls.lock().unwrap().as_slice(), &[(1, vec![7])]);

        // Occupy every slot with a call of its own, then queue 20 jobs over two keys.
        let mut waits = Vec::new();
        for n in 0..IN_FLIGHT as u32 {
            waits.push(submit(9, n));
            for _ in 0..500 {
                if calls.lock().unwrap().len() == n as usize + 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let late = IN_FLIGHT as u32..IN_FLIGHT as u32 + 20;
        for n in late.clone() {
            waits.push(submit((n % 2) as u8, n));
        }
        hold.add_permits(IN_FLIGHT);
        for (n, rx) in waits.into_iter().enumerate() {
            assert_eq!(rx.await.unwrap(), n as u32 * 10);
        }
        let calls = calls.lock().unwrap();
        assert_eq!(calls.iter().filter(|(k, _)| *k == 9).count(), IN_FLIGHT, "{calls:?}");
        let rest: Vec<_> = calls[1..].iter().filter(|(k, _)| *k != 9).collect();
        let evens: Vec<u32> = late.clone().filter(|n| n % 2 == 0).collect();
        let odds: Vec<u32> = late.filter(|n| n % 2 == 1).collect();
        assert_eq!(rest, [&(0, evens), &(1, odds)], "one call per key, in arrival order");
    }
}
