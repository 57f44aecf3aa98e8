//! What a store failure is, in words every backend can use: the caller decides how far
//! fail-open reaches from [`StoreError::kind`] and whether a write may have landed from
//! [`StoreError::is_timeout`]. Turning a client's own error into these words is the backend's
//! job (`redis/error.rs`); nothing here knows a Redis error.

use std::time::Duration;

/// The longest a request waits for a store that is answering other calls of its instance
/// (an instance busier than `redis.timeout_ms` allows, see `QueueService::bounded`); also each
/// Redis command's own response timeout, so a command that queued behind others is not cut
/// short while its request still waits.
pub const BUSY_WAIT_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend's client failed; classified by the backend when it was converted.
    #[error("{0}")]
    Backend(BackendError),
    #[error("redis command timed out")]
    Timeout,
    /// Redis answers (its liveness probe does), but this instance did not get through its
    /// work within [`BUSY_WAIT_MAX`]: the instance is overloaded, the store is not down.
    #[error("this instance is overloaded: its redis work did not finish in time while redis answers")]
    Busy,
    /// The write was made, but fewer replicas than wanted acknowledged it in time
    /// (`redis.wait_replicas`): a failover now could lose it, so nothing is answered for it.
    #[error("only {acked} of {wanted} redis replicas acknowledged the write in time")]
    NotReplicated { acked: u64, wanted: u64 },
    #[error("unexpected reply from {what}: {detail}")]
    Reply { what: &'static str, detail: String },
}

/// A backend client's failure, as the backend classified it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    pub kind: StoreErrorKind,
    /// The command may have reached the store and run there after the client stopped waiting.
    pub timeout: bool,
    /// The store refused a write for lack of memory (reads still work).
    pub out_of_memory: bool,
    /// The client refused its own configuration (an address it cannot parse) before reaching
    /// any store.
    pub invalid_config: bool,
    /// What to log, prefixed with the backend's name.
    pub message: String,
}

/// What a store failure says about the store, which decides how far fail-open reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The store cannot serve anyone now: connection refused, reset or timed out, loading,
    /// busy with a long script, cluster down, read-only after a failover, refused
    /// credentials. Every target would fail alike.
    Unavailable,
    /// The store answered, but this call failed on what it touched: a key of the wrong type
    /// (a corrupt key), a script error, a reply of the wrong shape, a write refused for lack
    /// of memory (`OOM`: reads, and writes that free memory, still work). Other calls are
    /// asked of the store as usual.
    Data,
}

impl StoreErrorKind {
    pub const ALL: [StoreErrorKind; 2] = [StoreErrorKind::Unavailable, StoreErrorKind::Data];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Data => "data",
        }
    }
}

impl StoreError {
    /// The command may have reached the store and run there after the caller stopped waiting.
    pub fn is_timeout(&self) -> bool {
        match self {
            StoreError::Timeout | StoreError::Busy => true,
            StoreError::Backend(e) => e.timeout,
            StoreError::Reply { .. } | StoreError::NotReplicated { .. } => false,
        }
    }

    /// The store refused a write for lack of memory (`maxmemory` reached with `noeviction`).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, StoreError::Backend(e) if e.out_of_memory)
    }

    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Backend(e) => e.kind,
            StoreError::Timeout | StoreError::NotReplicated { .. } => StoreErrorKind::Unavailable,
            StoreError::Busy | StoreError::Reply { .. } => StoreErrorKind::Data,
        }
    }
}
