//! A log line at most once per interval for events that may come by the thousand (a store
//! failing), with how many events each line stands for.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct LogEvery {
    every: Duration,
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl LogEvery {
    pub const fn new(every: Duration) -> Self {
        Self { every, last: Mutex::new(None), since: AtomicU64::new(0) }
    }

    /// Counts one event: the events since the last line (this one included) when a line is
    /// due now, none while the interval runs.
    pub fn due(&self) -> Option<u64> {
        let n = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        *last = Some(Instant::now());
        self.since.store(0, Ordering::Relaxed);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_events_it_stands_for() {
        let log = LogEvery::new(Duration::from_secs(3600));
        assert_eq!(log.due(), Some(1));
        assert_eq!((log.due(), log.due()), (None, None));
        *log.last.lock().unwrap() = Some(Instant::now() - Duration::from_secs(3601));
        assert_eq!(log.due(), Some(3), "the two held back and this one");
    }
}
