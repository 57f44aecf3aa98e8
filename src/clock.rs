//! Wall-clock time in epoch milliseconds, the one definition every module uses (admission
//! ticks, token expiry and Lua arguments compare it with Redis' clock on the same hosts).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 if the system clock is before it.
pub fn now_epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
