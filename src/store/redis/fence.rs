//! Fences against lost writes: what this instance has seen of each target's counters (the seq
//! counter, the admission mark, the last tick advanced), sent with every `enter.lua`,
//! `status.lua` and `admit.lua` call, so that Redis never hands out a seq again or takes an
//! admission back after a failover that lost the last writes (see `fence` in `lua/prelude.lua`).
//!
//! Each instance knows only what its own calls returned: the counter after each of its enters
//! (which counts every instance's seqs up to then), the mark of every reply, the ticks its pump
//! advanced. Seqs another instance gave since this one last looked are covered by a margin:
//! when Redis is found below the fence, the counter jumps past it by as many seqs as this
//! instance saw given in a second (and at least [`MIN_MARGIN`]). The seqs skipped are never
//! given; `aheadCount` counts them as ahead until the mark passes them, as it counts the seqs of
//! users whose entry the failover lost.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::domain::QueueTarget;

/// The least margin of the seq counter's jump after a lost write.
const MIN_MARGIN: u64 = 100;
/// The window over which the growth of the seq counter is measured for the margin.
const GROWTH_WINDOW: Duration = Duration::from_secs(1);
/// At most one warning per target this often; every raise is counted in the metric.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What a script call sends: the values seen and what a counter found below them is raised to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Fence {
    pub seq_seen: u64,
    pub seq_to: u64,
    pub mark: u64,
    pub tick: u64,
}

/// Which fences a reply says were raised (the scripts' `fenced` bits).
pub(super) const SEQ_RAISED: u64 = 1;
pub(super) const MARK_RAISED: u64 = 2;
pub(super) const TICK_RAISED: u64 = 4;

#[derive(Debug, Default)]
struct Seen {
    seq: u64,
    mark: u64,
    tick: u64,
    /// The seq counter at the start of the current growth window.
    window: Option<(Instant, u64)>,
    /// Seqs given in the last full window.
    growth: u64,
    /// When this target was last observed: forgotten after `forget_after` (its keys expire).
    at: Option<Instant>,
    warned: Option<Instant>,
}

pub(super) struct Fences {
    targets: Mutex<HashMap<QueueTarget, Seen>>,
    /// Past this without a reply about the target, its keys may have expired (the sliding key
    /// TTL): what was seen is forgotten rather than raised against a fresh queue.
    forget_after: Duration,
    /// Whether writes can be lost at all: not in the embedded store, which has no failover
    /// (and whose clock tests step, which this host's `Instant`s would not follow).
    on: bool,
}

impl Fences {
    pub(super) fn new(key_ttl_s: u64) -> Self {
        Self { targets: Mutex::default(), forget_after: Duration::from_secs(key_ttl_s), on: true }
    }

    /// No fences: every call sends the empty one.
    pub(super) fn off() -> Self {
        Self { on: false, ..Self::new(0) }
    }

    /// The fence to send with a call about `target`.
    pub(super) fn fence(&self, target: QueueTarget) -> Fence {
        if !self.on {
            return Fence::default();
        }
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(seen) = targets.get(&target) else { return Fence::default() };
        if seen.at.is_some_and(|at| at.elapsed() > self.forget_after) {
            targets.remove(&target);
            return Fence::default();
        }
        // The mark never exceeds the seq counter: a seen mark fences the counter too.
        let seq_seen = seen.seq.max(seen.mark);
        let current = seen.window.map_or(0, |(_, from)| seen.seq.saturating_sub(from));
        let margin = seen.growth.max(current).max(MIN_MARGIN);
        Fence { seq_seen, seq_to: seq_seen + margin, mark: seen.mark, tick: seen.tick }
    }

    /// The target's keys expired (the pump found them gone and forgot the target): what was
    /// seen belongs to a queue that ended, not to writes a failover lost, and must not bring
    /// its counters back.
    pub(super) fn forget(&self, target: QueueTarget) {
        self.targets.lock().unwrap_or_else(|e| e.into_inner()).remove(&target);
    }

    /// What a reply said: the seq counter (enter.lua), the mark, the tick advanced (admit.lua),
    /// and the fences it raised (logged and counted). `by_pump`: an admit.lua reply, which does
    /// not keep what was seen from being forgotten (the pump ticks over idle targets too).
    pub(super) fn observe(
        &self,
        target: QueueTarget,
        seq: Option<u64>,
        mark: u64,
        tick: Option<u64>,
        raised: u64,
        by_pump: bool,
    ) {
        let now = Instant::now();
        {
            let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
            let seen = targets.entry(target).or_default();
            if !by_pump || seen.at.is_none() {
                seen.at = Some(now);
            }
            seen.mark = seen.mark.max(mark);
            if let Some(tick) = tick {
                seen.tick = seen.tick.max(tick);
            }
            if let Some(seq) = seq {
                seen.seq = seen.seq.max(seq);
                match seen.window {
                    Some((from, start)) if now.duration_since(from) >= GROWTH_WINDOW => {
                        seen.growth = seen.seq.saturating_sub(start);
                        seen.window = Some((now, seen.seq));
                    }
                    Some(_) => {}
                    None => seen.window = Some((now, seen.seq)),
                }
            }
            if raised == 0 {
                return;
            }
            if seen.warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                seen.warned = Some(now);
                tracing::warn!(
                    target_queue = %target,
                    seq_raised = raised & SEQ_RAISED != 0,
                    mark_raised = raised & MARK_RAISED != 0,
                    tick_raised = raised & TICK_RAISED != 0,
                    seq = seen.seq,
                    mark = seen.mark,
                    "redis lost writes this instance saw (a failover?): counters raised back to what was seen"
                );
            }
        }
        for (bit, what) in [(SEQ_RAISED, "seq"), (MARK_RAISED, "mark"), (TICK_RAISED, "tick")] {
            if raised & bit != 0 {
                crate::metrics::failover_fenced(what);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueTargetType;

    fn target() -> QueueTarget {
        QueueTarget::new(QueueTargetType::LIMITED_DROP, 1)
    }

    #[test]
    fn a_target_never_seen_sends_no_fence() {
        assert_eq!(Fences::new(1800).fence(target()), Fence::default());
    }

    #[test]
    fn the_fence_is_the_highest_value_seen_and_never_goes_back() {
        let f = Fences::new(1800);
        f.observe(target(), Some(40), 10, None, 0, false);
        f.observe(target(), Some(30), 5, Some(7), 0, false);
        let fence = f.fence(target());
        assert_eq!((fence.seq_seen, fence.mark, fence.tick), (40, 10, 7));
        assert_eq!(fence.seq_to, 40 + MIN_MARGIN, "no growth measured yet: the least margin");
    }

    #[test]
    fn a_mark_seen_fences_the_seq_counter_too() {
        let f = Fences::new(1800);
        f.observe(target(), None, 25, None, 0, false);
        assert_eq!(f.fence(target()).seq_seen, 25);
    }

    #[test]
    fn the_margin_covers_a_second_of_seqs_seen_given() {
        let f = Fences::new(1800);
        f.observe(target(), Some(100), 0, None, 0, false);
        f.observe(target(), Some(600), 0, None, 0, false);
        assert_eq!(f.fence(target()).seq_to, 600 + 500, "500 seqs given in the current window");
    }

    #[test]
    fn a_target_unseen_for_the_key_ttl_is_forgotten() {
        let f = Fences::new(0);
        f.observe(target(), Some(40), 10, None, 0, false);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(f.fence(target()), Fence::default());
    }
}
