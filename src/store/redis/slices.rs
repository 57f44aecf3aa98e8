//! How many users one script call walks, for the scripts whose work grows with the queue: each
//! bound keeps one call at about a millisecond of Redis time or less with a million users
//! waiting in one target (per call, measured with `scripts/bench.sh slices`, users picked at
//! random: docs/benchmarks.md), so the commands of other targets and the hot path never wait
//! long behind one. The caller repeats the call until the work is done; what a script keeps
//! across its calls is in its header.
//!
//! Eviction's and the opening's placement slices are the pump's (`pump::EVICT_SLICE`,
//! `pump::OPENING_CHUNK`): they are what the pump asks of any store.

/// Most users one `admit.lua` call admits (~0.35 ms for 500): a bigger batch takes several
/// calls in its tick.
pub const ADMIT_SLICE: u64 = 500;

/// Most users whose heartbeats one `view.lua` call writes (each a 16-bit field of the
/// target's beats, found by the user's seq).
pub const VIEW_USERS_PER_CALL: usize = 150;

/// Most seqs one `evict.lua` call's sweep reads (four bytes of the beats each, one `GETRANGE`):
/// a sweep walks every waiting seq once per quarter of the heartbeat timeout, so a million
/// waiting take about 490 calls a sweep.
pub const SWEEP_SEQS: u64 = 2048;

/// Most departed seqs above the mark one `view.lua` call returns: an instance's copy knows the
/// departed up to the last of them, and polls of users behind it go to `status.lua`.
pub const VIEW_DEPARTED_MAX: usize = 4000;

/// Most members of the frozen pre-queue one read of the opening returns (~0.2 ms).
pub const OPENING_READ_SLICE: u64 = 5000;

/// Most expired tokens one `tokens_expire.lua` call counts and removes (one
/// `ZREMRANGEBYRANK` of the earliest).
pub const TOKENS_EXPIRE_SLICE: u64 = 1000;
