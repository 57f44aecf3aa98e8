//! Numbers both stores obey, written once (re-exported as `store::…` where callers outside the
//! stores need them). The scripts never hold them as literals: the Redis store sends those a
//! script needs as its arguments (see the script headers), and the embedded store reads the
//! same constant.

/// Ledger rows kept per target (newest first): a sale of 100k users at 100 per tick needs 1000.
/// Sent to every script that writes a row; the embedded store's ledger keeps as many.
pub const LEDGER_MAX_ROWS: u64 = 10_000;

/// Ticks kept in a target's admissions list (`queue:{T}:admissions`, newest first): the last
/// minute at the default tick, which `vq stats` turns into the admission rate. Used by
/// `admit.lua` (ARGV[12]) and the embedded store's admit.
pub(crate) const ADMISSIONS_KEPT: u64 = 60;

/// `enter.lua` refreshes the target's key TTLs when a new seq is the first or one past a
/// multiple of this (ARGV[8]), so keys written before any pump runs still expire; the pump's
/// ticks refresh them otherwise. Used by `enter.lua` and the embedded store's enter.
pub(crate) const TTL_REFRESH_EVERY: u64 = 64;

/// The gate's pacing never reserves a tick that starts within this many ms (by the store's
/// clock): a purchase reserved in a tick must have the time to be forwarded and reach the
/// purchase API inside that tick, so that it is counted in the tick it arrives in. Sent to
/// `gate_pace.lua`; the embedded store's pacing and the gate's forwarding margin read it.
pub const PACE_GUARD_MS: u64 = 50;

/// How long an instance whose acknowledgement expired stays listed (silent) in
/// [`super::FlagOps::flag_acks`]: long enough for an operator to see that a frozen or cut-off
/// instance never applied the last change. An instance that shuts down withdraws its own.
/// Sent to `flag_ack.lua` and `flag_acks.lua`; the embedded store keeps acknowledgements as long.
pub const FLAG_ACK_KEEP_MS: u64 = 10 * 60 * 1000;

/// How long an expired fleet report stays stored before a reader drops it (a report rewritten
/// meanwhile is never dropped: only one expired that long). Both stores' readers apply it.
pub const FLEET_KEEP_MS: u64 = 60_000;

/// The lowest version a flag change may get: one above the highest version any listed
/// instance acknowledged (live or silent), so that a flag written again after its hash was
/// lost (FLUSHALL, a restart without persistence) never reuses a version an instance already
/// applied. `flag_set.lua` takes it as ARGV[3]; the embedded store's flag write uses it too.
pub(crate) fn flag_version_floor(acknowledged: impl IntoIterator<Item = u64>) -> u64 {
    acknowledged.into_iter().map(|v| v + 1).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_is_one_above_the_highest_acknowledged_version() {
        assert_eq!(flag_version_floor([]), 0);
        assert_eq!(flag_version_floor([3, 7, 5]), 8);
        assert_eq!(flag_version_floor([0]), 1);
    }
}
