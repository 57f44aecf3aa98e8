//! How many replicas must hold a write before vq answers for it (`redis.wait_replicas`): the
//! token handed to a buyer and a purchase's claim are the writes a failover must not lose.
//! Backend-neutral words; the Redis store waits with `WAIT` (`redis/durable.rs`), the embedded
//! store has no replicas.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `redis.wait_replicas`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaWait {
    /// Every replica the primary holding the target has connected (none connected: no wait).
    #[default]
    Auto,
    /// This many replicas, connected or not (0: never wait).
    Count(u64),
}

impl Serialize for ReplicaWait {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ReplicaWait::Auto => s.serialize_str("auto"),
            ReplicaWait::Count(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for ReplicaWait {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => Ok(ReplicaWait::Count(n)),
            Raw::Word(w) if w == "auto" => Ok(ReplicaWait::Auto),
            Raw::Word(w) => w.parse().map(ReplicaWait::Count).map_err(|_| {
                serde::de::Error::custom(format!("expected \"auto\" or a number of replicas, found {w:?}"))
            }),
        }
    }
}

/// What the store waits for before it answers with a token or lets a purchase through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableWrites {
    pub replicas: ReplicaWait,
    /// The longest a write waits for its replicas; past it the answer is 503, nothing lost.
    pub timeout_ms: u64,
}

impl Default for DurableWrites {
    fn default() -> Self {
        Self { replicas: ReplicaWait::Auto, timeout_ms: 500 }
    }
}
