//! How a Redis client error becomes a [`StoreError`]: what it says about the store
//! ([`StoreErrorKind`]), whether the command may have run, and the text to log.

use redis::{ErrorKind as K, RedisError, ServerErrorKind as S};

use crate::store::{BackendError, StoreError, StoreErrorKind};

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        StoreError::Backend(BackendError {
            kind: kind(&e),
            timeout: e.is_timeout(),
            // A script's write refused inside the script, or a MULTI's (its commands' errors
            // inside "Transaction aborted"), carries Redis' text rather than the code.
            out_of_memory: e.code() == Some("OOM") || e.to_string().contains("command not allowed when used memory"),
            invalid_config: e.kind() == K::InvalidClientConfig,
            message: format!("redis: {}", describe(&e)),
        })
    }
}

/// The client's text, except for a reply that is not the Redis protocol at all, which the
/// client reports as a byte it did not expect ("Parse error at 1 Unexpected `84`"): that is the
/// address of something else, most often an HTTP port.
fn describe(e: &RedisError) -> String {
    let text = e.to_string();
    if e.kind() == K::Parse && text.contains("Parse error at") {
        return "what answers at this address does not speak the Redis protocol: is it an HTTP port, such as \
                vq's own listen address? Point redis.url (VQ_REDIS__URL) at redis-server"
            .to_owned();
    }
    text
}

fn kind(e: &RedisError) -> StoreErrorKind {
    let unavailable = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            K::Server(
                S::BusyLoading
                    | S::ClusterDown
                    | S::MasterDown
                    | S::TryAgain
                    | S::ReadOnly
                    | S::NoPerm
                    // A redirection the cluster client still met after its retries: the slot's
                    // node is unreachable (gone, its slots not yet moved) or moving.
                    | S::Moved
                    | S::Ask
            ) | K::ClusterConnectionNotFound
                | K::AuthenticationFailed
        )
        // Codes redis-rs has no kind for: a script running too long, no auth,
        // persistence failing. (`OOM` is not one: it refuses that write, not the store.)
        || matches!(e.code(), Some("BUSY" | "NOAUTH" | "MISCONF" | "WRONGPASS"));
    if unavailable { StoreErrorKind::Unavailable } else { StoreErrorKind::Data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_store_counts_as_unavailable() {
        let io = |kind| StoreError::from(RedisError::from(std::io::Error::new(kind, "x")));
        assert_eq!(io(std::io::ErrorKind::ConnectionRefused).kind(), StoreErrorKind::Unavailable);
        assert_eq!(io(std::io::ErrorKind::ConnectionReset).kind(), StoreErrorKind::Unavailable);
        assert_eq!(io(std::io::ErrorKind::TimedOut).kind(), StoreErrorKind::Unavailable);
        assert_eq!(StoreError::Timeout.kind(), StoreErrorKind::Unavailable);
        let moved = RedisError::from((K::Server(S::Moved), "moved", "1079 127.0.0.1:7001".to_owned()));
        assert_eq!(StoreError::from(moved).kind(), StoreErrorKind::Unavailable);
        let reply = StoreError::Reply { what: "enter.lua", detail: "[]".into() };
        assert_eq!(reply.kind(), StoreErrorKind::Data);
    }
}
